//! The row-tiled driver of the `quant` room's tile kernels: tasks own tiles of weight rows
//! sized to the cache and run every activation row over them. It serves f32 matmuls below
//! `gemm`'s threshold ([`super::f32`]) and every 8-bit-activation matmul ([`super::q8`]).

use crate::pool;
use crate::pool::OutPtr;
use crate::quant::{self, Isa};
use crate::GgmlType;

/// Least estimated single-thread work (ns) worth a fork-join over the pool: with hot
/// workers a job costs about a microsecond to publish and join.
pub(crate) const SPLIT_MIN_NS: usize = 3_000;

/// Work estimates for the thresholds above (one core, cache-resident, measured
/// on the AVX-512 kernels): weight bytes streamed per ns by the dot kernels, and
/// ns per element to quantize activations.
pub(crate) const KERNEL_BYTES_PER_NS: usize = 16;

pub(crate) const QUANTIZE_NS_PER_ELEM: usize = 1;

/// Target bytes of weight rows per task: a band that fits in L1 (32-48 KiB) or
/// at worst L2 beside the activation rows, so the `m` passes over it hit cache.
pub(crate) const TILE_BYTES: usize = 32 << 10;

/// Tasks per thread to aim for, so uneven tiles still balance.
pub(crate) const TASKS_PER_THREAD: usize = 4;

/// A row-major weight matrix as bytes: `n` rows of `k` elements of `ty`.
#[derive(Clone, Copy)]
pub(crate) struct Rows<'a> {
    pub(crate) ty: GgmlType,
    pub(crate) data: &'a [u8],
    pub(crate) n: usize,
    pub(crate) k: usize,
    pub(crate) row_bytes: usize,
}

impl Rows<'_> {
    fn row(&self, j: usize) -> &[u8] {
        &self.data[j * self.row_bytes..(j + 1) * self.row_bytes]
    }
}

/// `y[i, j] = dot(w_j, act_i)` for `m` activation rows already in
/// `vec_dot_type(w.ty)` (`act_row` bytes each), with the tiled kernel when the ISA
/// has one for the type, else one `vec_dot` per output.
///
/// Work is split over tasks that each own a tile of weight rows (output columns)
/// and run every activation row over it, so the tile is fetched from memory once
/// and then served from L1/L2.
pub(crate) fn run(isa: Isa, w: Rows<'_>, act: &[u8], act_row: usize, m: usize, y: &mut [f32]) {
    let n = w.n;
    let tile = quant::tile_fn(isa, w.ty);
    let step = tile.map_or(1, |t| t.max_rw);
    let per_task = tile_rows(n, w.row_bytes).next_multiple_of(step);
    let tasks = n.div_ceil(per_task);
    let out = OutPtr(y.as_mut_ptr());
    let task = |t: usize| {
        let cols = t * per_task..((t + 1) * per_task).min(n);
        match tile {
            // SAFETY: `y` has m * n elements (checked by the callers) and is
            // exclusively borrowed for this call; this task writes only columns in
            // `cols`, which no other task owns.
            Some(tk) => unsafe { task_tiled(w, act, act_row, m, cols, tk, out) },
            None => {
                let dot = quant::vec_dot_fn(isa, w.ty);
                for i in 0..m {
                    let a = &act[i * act_row..(i + 1) * act_row];
                    for j in cols.clone() {
                        let v = dot(w.row(j), a, w.k);
                        // SAFETY: as above; i < m, j < n.
                        unsafe { out.get().add(i * n + j).write(v) };
                    }
                }
            }
        }
    };
    if worth_splitting(tasks, w.data.len().saturating_mul(m) / KERNEL_BYTES_PER_NS) {
        pool::run(tasks, &task);
    } else {
        (0..tasks).for_each(task);
    }
}

/// One task of [`run`] with the register-tiled microkernel: blocks of `max_ca`
/// activation rows sweep the task's weight rows `max_rw` at a time.
///
/// # Safety
/// `out` points to `y[m, w.n]`; no one else reads or writes columns `cols` of it
/// during the call.
pub(crate) unsafe fn task_tiled(
    w: Rows<'_>,
    act: &[u8],
    act_row: usize,
    m: usize,
    cols: std::ops::Range<usize>,
    t: quant::Tile,
    out: OutPtr,
) {
    let mut i = 0;
    while i < m {
        let na = t.max_ca.min(m - i);
        let mut j = cols.start;
        while j < cols.end {
            let nw = t.max_rw.min(cols.end - j);
            // SAFETY (TileFn contract): 1 <= nw <= max_rw, 1 <= na <= max_ca; rows
            // j..j + nw <= n of `w` and i..i + na <= m of `act` are in bounds (the
            // slices' lengths were checked by the callers); outputs
            // (i + c) * n + j + r are in `y` and in this task's columns.
            (t.f)(
                w.data.as_ptr().add(j * w.row_bytes),
                w.row_bytes,
                nw,
                act.as_ptr().add(i * act_row),
                act_row,
                na,
                w.k,
                out.get().add(i * w.n + j),
                w.n,
            );
            j += nw;
        }
        i += na;
    }
}

/// Whether to fan `tasks` out over the pool, given an estimate of the work in
/// single-thread nanoseconds.
pub(crate) fn worth_splitting(tasks: usize, work_ns: usize) -> bool {
    tasks > 1 && pool::threads() > 1 && work_ns >= SPLIT_MIN_NS
}

/// Rows per task: about [`TILE_BYTES`] of weights, but small enough that every
/// thread gets several tasks.
pub(crate) fn tile_rows(n: usize, row_bytes: usize) -> usize {
    let by_cache = (TILE_BYTES / row_bytes.max(1)).max(4);
    let threads = pool::threads();
    if threads <= 1 {
        return n.max(1);
    }
    let by_balance = n.div_ceil(threads * TASKS_PER_THREAD).max(4);
    by_cache.min(by_balance).max(1)
}

pub(crate) use crate::quant::f32_bytes;

/// `data` as f32s when it is 4-byte aligned (a `Vec<u8>` usually is, but nothing
/// promises it).
pub(crate) fn aligned_f32(data: &[u8]) -> Option<&[f32]> {
    if data.as_ptr().align_offset(4) != 0 || !data.len().is_multiple_of(4) {
        return None;
    }
    // SAFETY: aligned and sized as just checked; every bit pattern is a valid f32.
    Some(unsafe { std::slice::from_raw_parts(data.as_ptr().cast::<f32>(), data.len() / 4) })
}
