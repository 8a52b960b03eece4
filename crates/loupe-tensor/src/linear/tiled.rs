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
/// and then served from L1/L2. From the wide tile's `min_ca` rows on, the activation rows
/// are first written in its prepared layout (on the calling thread, into a buffer it keeps),
/// and the tasks run the wide tile over them, at most [`PREPARED_ROWS`] rows at a time.
pub(crate) fn run(isa: Isa, w: Rows<'_>, act: &[u8], act_row: usize, m: usize, y: &mut [f32]) {
    let tile = quant::tile_fn(isa, w.ty);
    let Some(wt) = tile.and_then(|t| t.wide).filter(|wt| m >= wt.min_ca) else {
        return run_tasks(isa, w, act, act_row, m, y, tile, None);
    };
    let mut wide = |buf: &mut Vec<u8>| {
        // Balanced chunks, each of at least min_ca rows (m >= min_ca).
        let chunks = m.div_ceil(PREPARED_ROWS);
        let (mut i, mut rest) = (0, &mut y[..]);
        for c in 0..chunks {
            let rows = m / chunks + usize::from(c < m % chunks);
            let (yc, tail) = rest.split_at_mut(rows * w.n);
            let ac = &act[i * act_row..(i + rows) * act_row];
            run_tasks(isa, w, ac, act_row, rows, yc, tile, Some(prepare(wt, w.k, ac, act_row, rows, buf)));
            (i, rest) = (i + rows, tail);
        }
    };
    PREPARED.with(|cell| match cell.try_borrow_mut() {
        Ok(mut buf) => wide(&mut buf),
        // Re-entered on this thread (not done today): a buffer of its own.
        Err(_) => wide(&mut Vec::new()),
    })
}

/// Most activation rows prepared at once: the buffer stays within about a megabyte (64 rows
/// of a 4864-wide Q5_0 `down_proj` take 0.9 MiB, where 512 prompt rows took 7.3), and a
/// chunk's rows still amortize each weight tile over many calls.
const PREPARED_ROWS: usize = 64;

thread_local! {
    /// The calling thread's prepared activation rows for the wide tile (grows to the largest
    /// chunk seen, at most [`PREPARED_ROWS`] rows, then allocates nothing).
    static PREPARED: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Activation rows in a wide tile's prepared layout: the tile, the rows (64-byte aligned)
/// and the bytes from one row to the next.
#[derive(Clone, Copy)]
pub(crate) struct Prepared<'a> {
    tile: quant::WideTile,
    rows: &'a [u8],
    stride: usize,
}

/// Writes the `m` quantized rows of `act` in `wt`'s prepared layout into `buf`.
fn prepare<'a>(
    wt: quant::WideTile,
    k: usize,
    act: &[u8],
    act_row: usize,
    m: usize,
    buf: &'a mut Vec<u8>,
) -> Prepared<'a> {
    let stride = (wt.row_bytes)(k);
    let need = m * stride + 64;
    if buf.len() < need {
        buf.resize(need, 0);
    }
    let start = buf.as_ptr().align_offset(64);
    let rows = &mut buf[start..start + m * stride];
    for (i, dst) in rows.chunks_exact_mut(stride).enumerate() {
        let src = &act[i * act_row..(i + 1) * act_row];
        // SAFETY: `wt` came from `quant::tile_fn` for this CPU; `src` is one whole quantized
        // row of `k` elements and `dst` is `row_bytes(k)` bytes.
        unsafe { (wt.prepare)(src.as_ptr(), k, dst.as_mut_ptr()) };
    }
    Prepared { tile: wt, rows, stride }
}

#[allow(clippy::too_many_arguments)] // run's arguments and what it looked up
fn run_tasks(
    isa: Isa,
    w: Rows<'_>,
    act: &[u8],
    act_row: usize,
    m: usize,
    y: &mut [f32],
    tile: Option<quant::Tile>,
    prepared: Option<Prepared<'_>>,
) {
    let n = w.n;
    let step = tile.map_or(1, |t| t.max_rw);
    let per_task = tile_rows(n, w.row_bytes).next_multiple_of(step);
    let tasks = n.div_ceil(per_task);
    let out = OutPtr(y.as_mut_ptr());
    let task = |t: usize| {
        let cols = t * per_task..((t + 1) * per_task).min(n);
        match (tile, prepared) {
            // SAFETY: `y` has m * n elements (checked by the callers) and is exclusively
            // borrowed for this call; this task writes only columns in `cols`, which no other
            // task owns; `prepared` holds the same m rows as `act`.
            (Some(_), Some(p)) => unsafe { task_wide(w, p, m, cols, out) },
            // SAFETY: as above.
            (Some(tk), None) => unsafe { task_tiled(w, act, act_row, m, cols, tk, out) },
            (None, _) => {
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

/// One task of [`run`] with the wide tile: the `m` rows in balanced groups of at most
/// `max_ca` (9 rows: one group; 11: 6 and 5), each sweeping the task's weight rows
/// `max_rw` at a time. Every group has at least `min_ca` rows when `m` does (`max_ca >= 2 *
/// min_ca - 1`).
///
/// # Safety
/// As [`task_tiled`]; `p` holds `m` prepared rows.
unsafe fn task_wide(w: Rows<'_>, p: Prepared<'_>, m: usize, cols: std::ops::Range<usize>, out: OutPtr) {
    let wt = p.tile;
    let groups = m.div_ceil(wt.max_ca);
    let sizes = (0..groups).map(|g| m / groups + usize::from(g < m % groups));
    // SAFETY: the caller's contract; the groups cover 0..m with min_ca..=max_ca rows each.
    unsafe { sweep(wt.f, wt.max_rw, w, p.rows, p.stride, sizes, cols, out) }
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
    let sizes = (0..m.div_ceil(t.max_ca)).map(|g| t.max_ca.min(m - g * t.max_ca));
    // SAFETY: the caller's contract; the groups cover 0..m with 1..=max_ca rows each.
    unsafe { sweep(t.f, t.max_rw, w, act, act_row, sizes, cols, out) }
}

/// Runs `f` over groups of activation rows (of the sizes `sizes` gives, in order from row
/// 0, each within the tile's limits), each group sweeping weight rows `cols` `max_rw` at a
/// time.
///
/// # Safety
/// `out` points to `y[m, w.n]` with `m` the sum of `sizes`; `act` holds those rows, `stride`
/// bytes apart, in the layout `f` reads; no one else reads or writes columns `cols` of `y`.
#[allow(clippy::too_many_arguments)] // a tile call's operands
unsafe fn sweep(
    f: quant::TileFn,
    max_rw: usize,
    w: Rows<'_>,
    act: &[u8],
    stride: usize,
    sizes: impl Iterator<Item = usize>,
    cols: std::ops::Range<usize>,
    out: OutPtr,
) {
    let mut i = 0;
    for na in sizes {
        let mut j = cols.start;
        while j < cols.end {
            let nw = max_rw.min(cols.end - j);
            // SAFETY (TileFn contract): 1 <= nw <= max_rw and na within the tile's limits;
            // rows j..j + nw <= n of `w` and i..i + na <= m of `act` are in bounds (the
            // slices' lengths were checked by the callers); outputs (i + c) * n + j + r are
            // in `y` and in this task's columns.
            unsafe {
                f(
                    w.data.as_ptr().add(j * w.row_bytes),
                    w.row_bytes,
                    nw,
                    act.as_ptr().add(i * stride),
                    stride,
                    na,
                    w.k,
                    out.get().add(i * w.n + j),
                    w.n,
                )
            };
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
