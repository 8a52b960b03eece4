//! Batch-invariant matmuls for continuous batching: `y[m, n] = x[m, k] @ W^T` where
//! every output `y[i, j]` is computed by arithmetic that depends only on row `i` of `x`
//! and row `j` of `W`.
//!
//! **What invariance means.** The bits of `y[i, j]` are the same whatever `m` is, whatever
//! the other rows of `x` hold, and whatever the thread count or task split: a request's
//! logits (hence its sampled tokens) are bit-identical whether it decodes alone or in a
//! batch of 32 with other requests that come and go. A batched GEMM does not give that:
//! its reduction order over `k` (tiling, split-k, which micro-kernel handles an edge)
//! depends on `m`, so the last bits of a row change with the batch, and over hundreds of
//! tokens an argmax flips. Here the reduction order of one dot product is fixed by the
//! weight type and the [`Isa`] alone (the kernels of different ISAs are *not* bit-equal
//! to each other, each is to itself across `m`).
//!
//! **How it stays fast.** For Q4_1 and Q8_0 (SmolLM2's types), Q5_0 (most of
//! Qwen2.5-0.5B's), Q6_K and Q4_K each activation row is quantized row-locally to 16-bit blocks ([`Act16`], exactly as the single-row decode
//! does), and multi-row kernels unpack each weight block once and `vpmaddwd` it against
//! up to 8 (AVX-512; Q5_0, Q6_K and Q4_K have AVX2 kernels only, which AVX-512 machines run in every path)
//! or 4 (AVX2) activation rows, each row keeping its own accumulators
//! in exactly the order of the single-row kernel ([`crate::wq::dot_row_act16`]). The
//! per-block scale products `d_w * scale_x` and the Q4_1 offset sums `sum_b m_w * sum(x_b)`
//! are computed vectorized across activation rows (lanes = rows, so each lane does the
//! same sequence of f32 operations as the single-row kernel), once per weight row. Tasks
//! own bands of weight rows and run all `m` activation rows over each weight row while it
//! is in L1, so every weight byte is read from memory once per call.
//!
//! `m == 1` is the decode path of [`crate::wq::matmul_wq`] (the same code), so a single
//! sequence keeps its numbers.

use std::cell::RefCell;
use std::mem::MaybeUninit;
use std::ops::Range;

use crate::matmul::{OutPtr, QMatrix};
use crate::pool;
use crate::quant::Isa;
use crate::wq::{dot_row, dot_row_act16_scalar, Act16};
use crate::{GgmlType, TensorError};

/// Tasks per compute thread: several, so a thread that starts late (woken from sleep,
/// or preempted) is balanced by the others claiming more.
const TASKS_PER_THREAD: usize = 4;
/// Least work per task, in weight rows x activation rows (~1-3 µs on a 576-wide row), so
/// the claim and the cache-line traffic of the output stay negligible. At `m == 1` this
/// is 16 weight rows, the old decode split.
const MIN_TASK_ROW_DOTS: usize = 16;
/// Block sums for up to this many blocks live on the stack at `m == 1` (k <= 16384 at
/// 32 per block), so decode allocates nothing; longer rows take the generic path.
pub(crate) const MAX_STACK_BLOCKS: usize = 512;
/// Activation rows of `x` are laid out transposed (lanes = rows) in multiples of this,
/// one AVX-512 vector, so the vectorized per-weight-row preparation needs no tail.
const LANES: usize = 16;
/// Quantized activation rows up to this many bytes (`m * k * 2`; k = 576 at m = 32 is
/// 36 KiB, measured faster unchunked) stay in L1 (48 KiB on Sapphire Rapids) while every
/// weight row of a band passes over all of them; past it (SmolLM2's FFN down projection,
/// k = 1536, at m = 32 is 96 KiB) the rows are taken [`CHUNK_ROWS`] at a time and the
/// band's weight rows (in L2) pass over each chunk instead.
const ACT_L1_BYTES: usize = 40 << 10;
/// Activation rows per chunk when they do not all fit in L1 (one AVX-512 tile).
const CHUNK_ROWS: usize = 8;

/// Activation-side scratch of the calling thread (quantized rows, transposed scales).
#[derive(Default)]
struct BatchScratch {
    q: Vec<i16>,
    ss: Vec<f32>,
    st: Vec<f32>,
    su: Vec<f32>,
    sums: Vec<f32>,
}

/// Activation rows quantized per pool task (a 576-wide row takes ~0.3 µs).
const QUANTIZE_ROWS_PER_TASK: usize = 4;

thread_local! {
    static BATCH: RefCell<BatchScratch> = RefCell::new(BatchScratch::default());
    /// Per-task scratch: the `d * scale` products of one weight row against every
    /// activation row, and the Q4_1 offsets.
    static TASK: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// y[m, n] = x[m, k] @ W^T for a GGML-typed `W` (`n = w.rows`, `k = w.cols`), batch
/// invariant: row `i` of `y` is bit-identical to what an `m = 1` call on row `i` of `x`
/// returns (see the module doc). Runs the kernels of [`Isa::active`].
pub fn matmul_wq_invariant(x: &[f32], w: &QMatrix, y: &mut [f32], m: usize) -> Result<(), TensorError> {
    matmul_wq_invariant_with(Isa::active(), x, w, y, m)
}

/// [`matmul_wq_invariant`] on the kernels of a given ISA level (tests, bisecting).
///
/// # Panics
/// If this CPU does not support `isa`.
pub fn matmul_wq_invariant_with(isa: Isa, x: &[f32], w: &QMatrix, y: &mut [f32], m: usize) -> Result<(), TensorError> {
    assert!(isa.is_supported(), "matmul_wq_invariant_with: this CPU does not support {isa}");
    let (n, k) = (w.rows, w.cols);
    if m.checked_mul(k) != Some(x.len()) || m.checked_mul(n) != Some(y.len()) {
        return Err(TensorError::Shape {
            op: "matmul_wq_invariant",
            detail: format!("x has {} elements and y {}, expected {m}x{k} and {m}x{n}", x.len(), y.len()),
        });
    }
    if m == 0 || n == 0 {
        return Ok(());
    }
    if can_group(w, k) {
        // Decode: a group of one matrix (the activation row quantized to Act16 on the stack,
        // then crate::gemv, each row bit-identical to wq::dot_row_act16). Allocates nothing.
        // (The group applies the per-tensor scale itself.)
        if m == 1 {
            return matmul_wq_group_with(isa, x, &[w], &mut [y]);
        }
        batch_act16(isa, x, w, y, m)?;
    } else if w.ty == GgmlType::F32 {
        let wp = w.data.as_ptr().cast::<f32>();
        // SAFETY: QMatrix::new checked data.len() == 4 * n * k; the kernels read it with
        // unaligned loads only.
        unsafe { f32_bands(isa, x, wp, y, m, k, n) };
    } else {
        generic(isa, x, w, y, m)?;
    }
    w.apply_tensor_scale(y);
    Ok(())
}

/// Tasks and weight rows per task for `n` weight rows and `m` activation rows.
fn split(n: usize, m: usize) -> (usize, usize) {
    let min_rows = MIN_TASK_ROW_DOTS.div_ceil(m).max(1);
    let tasks = (pool::threads() * TASKS_PER_THREAD).min(n.div_ceil(min_rows)).max(1);
    (tasks, n.div_ceil(tasks))
}

/// Runs `band(rows)` over bands of weight rows on the pool.
fn bands(
    n: usize,
    m: usize,
    band: &(dyn Fn(Range<usize>) -> Result<(), TensorError> + Sync),
) -> Result<(), TensorError> {
    let (tasks, per) = split(n, m);
    pool::try_run(tasks, &|t| {
        let j0 = (t * per).min(n);
        band(j0..(j0 + per).min(n))
    })
}

/// The first `len` elements of a stack buffer, zeroed; the rest stays uninitialized. Decode
/// sizes its stack buffers for the widest row it takes ([`MAX_STACK_BLOCKS`]): zeroing all
/// 36 KiB of them on every call was ~2% of a SmolLM2 decode step, on the calling thread
/// while the other compute thread waited (perf, `loupe bench -p 0 -n 128`).
pub(crate) fn zeroed_prefix<T: Copy + Default, const N: usize>(buf: &mut [MaybeUninit<T>; N], len: usize) -> &mut [T] {
    let part = &mut buf[..len];
    for e in part.iter_mut() {
        e.write(T::default());
    }
    // SAFETY: the `len` elements of `part` were initialized just above, and MaybeUninit<T>
    // has the layout of T.
    unsafe { std::slice::from_raw_parts_mut(part.as_mut_ptr().cast::<T>(), len) }
}

/// Whether [`matmul_wq_group`] can take `w` against `k` activations: Q4_1, Q8_0, Q5_0,
/// Q6_K or Q4_K rows of `k` columns, `k` a multiple of the block (32; the K types 256) with at most
/// [`MAX_STACK_BLOCKS`] blocks of 32 (the decode path of [`matmul_wq_invariant`]).
pub fn can_group(w: &QMatrix, k: usize) -> bool {
    matches!(w.ty, GgmlType::Q4_1 | GgmlType::Q8_0 | GgmlType::Q5_0 | GgmlType::Q6K | GgmlType::Q4K)
        && w.cols == k
        && k.is_multiple_of(w.ty.block_size())
        && k.is_multiple_of(32)
        && k / 32 <= MAX_STACK_BLOCKS
}

/// Whether a type runs the AVX2 Act16 kernels at `isa` (at or above [`Isa::Avx512`]) too:
/// every path (single row, gemv, batch) asks this, so decode and batch agree. Q5_0, Q6_K and
/// Q4_K have no AVX-512 ones. Q4_1 takes the AVX2 ones on AMX CPUs (Sapphire Rapids class):
/// there SmolLM2's decode ran 8-11% faster on them (`LOUPE_ISA=avx2` against `avx512`, three
/// alternations of `loupe bench -p 0 -n 128`: 319-332 vs 295-307 t/s; `--profile`: the
/// Q4_1 linears 720 vs 806 ms, the Q8_0 lm_head alike), while on the AVX-512 Xeon without
/// AMX of 2026-11-24 (BENCHMARKS.md) the AVX-512 kernel was ~2% ahead.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(crate) fn avx2_kernels_at(isa: Isa, ty: GgmlType) -> bool {
    matches!(ty, GgmlType::Q5_0 | GgmlType::Q6K | GgmlType::Q4K) || (isa >= Isa::Amx && ty == GgmlType::Q4_1)
}

/// Most matrices one [`matmul_wq_group`] call takes (q/k/v need 3): the bookkeeping lives
/// in fixed arrays, so a decode step allocates nothing.
pub const MAX_GROUP: usize = 4;

/// Decode (one activation row `x`) through several weight matrices that share it, as one
/// fork-join: `ys[i] = x @ ws[i]^T`. `x` is quantized once and the rows of all matrices
/// are split into one set of tasks, so q/k/v (or gate/up) cost one synchronisation of the
/// compute threads instead of three (or two). Every output is bit-identical to
/// [`matmul_wq_invariant`] (and so to [`crate::wq::matmul_wq`]) on the same matrix: the
/// same quantization and the same per-row kernel.
pub fn matmul_wq_group(x: &[f32], ws: &[&QMatrix], ys: &mut [&mut [f32]]) -> Result<(), TensorError> {
    matmul_wq_group_with(Isa::active(), x, ws, ys)
}

/// [`matmul_wq_group`] on the kernels of a given ISA level.
///
/// # Panics
/// If this CPU does not support `isa`.
pub fn matmul_wq_group_with(isa: Isa, x: &[f32], ws: &[&QMatrix], ys: &mut [&mut [f32]]) -> Result<(), TensorError> {
    assert!(isa.is_supported(), "matmul_wq_group_with: this CPU does not support {isa}");
    let k = x.len();
    if ws.len() != ys.len() || ws.len() > MAX_GROUP {
        return Err(TensorError::Shape {
            op: "matmul_wq_group",
            detail: format!("{} matrices and {} outputs (equal, at most {MAX_GROUP})", ws.len(), ys.len()),
        });
    }
    for (w, y) in ws.iter().zip(ys.iter()) {
        if !can_group(w, k) || y.len() != w.rows {
            return Err(TensorError::Shape {
                op: "matmul_wq_group",
                detail: format!("{} x {} {} against {k} activations into {} outputs", w.rows, w.cols, w.ty, y.len()),
            });
        }
    }
    let blocks = k / 32;
    let mut q = [MaybeUninit::<i16>::uninit(); MAX_STACK_BLOCKS * 32];
    let mut scale_sum = [MaybeUninit::<f32>::uninit(); MAX_STACK_BLOCKS * 2];
    let act = Act16::quantize(x, zeroed_prefix(&mut q, k), zeroed_prefix(&mut scale_sum, 2 * blocks));
    // Global row r of the group is row r - starts[i] of matrix i.
    let mut starts = [0usize; MAX_GROUP + 1];
    let mut outs = [OutPtr(std::ptr::null_mut()); MAX_GROUP];
    for (i, (w, y)) in ws.iter().zip(ys.iter_mut()).enumerate() {
        starts[i + 1] = starts[i] + w.rows;
        outs[i] = OutPtr(y.as_mut_ptr());
    }
    let total = starts[ws.len()];
    bands(total, 1, &|rows| {
        for (i, w) in ws.iter().enumerate() {
            let (lo, hi) = (rows.start.max(starts[i]), rows.end.min(starts[i + 1]));
            if lo < hi {
                // SAFETY: the ISA is supported (asserted above); w was checked by can_group
                // against k = x.len(); outs[i] has w.rows floats (checked above) and rows
                // lo..hi of the group (local rows lo - starts[i]..) belong to this task alone.
                unsafe { crate::gemv::gemv_rows(isa, w, lo - starts[i]..hi - starts[i], &act, outs[i])? };
            }
        }
        Ok(())
    })?;
    for (w, y) in ws.iter().zip(ys.iter_mut()) {
        w.apply_tensor_scale(y);
    }
    Ok(())
}

/// `m > 1` rows of Q4_1 / Q8_0 / Q5_0 / Q6_K / Q4_K: every row quantized as [`matmul_wq_group`] does, then the
/// multi-row kernels of `isa`.
fn batch_act16(isa: Isa, x: &[f32], w: &QMatrix, y: &mut [f32], m: usize) -> Result<(), TensorError> {
    BATCH.with(|cell| match cell.try_borrow_mut() {
        Ok(mut s) => batch_act16_in(isa, x, w, y, m, &mut s),
        // Re-entered from a task on this thread: use a fresh buffer (never in practice).
        Err(_) => batch_act16_in(isa, x, w, y, m, &mut BatchScratch::default()),
    })
}

fn batch_act16_in(
    isa: Isa,
    x: &[f32],
    w: &QMatrix,
    y: &mut [f32],
    m: usize,
    s: &mut BatchScratch,
) -> Result<(), TensorError> {
    let (n, k) = (w.rows, w.cols);
    let blocks = k / 32;
    let mp = m.next_multiple_of(LANES);
    s.q.resize(m * k, 0);
    s.ss.resize(m * 2 * blocks, 0.0);
    // Transposed scales and block sums: st[b * mp + i] is row i's scale of block b;
    // lanes past m stay zero.
    // (LANES of slack: a chunk starting at a multiple of CHUNK_ROWS reads a whole vector.)
    s.st.clear();
    s.st.resize(blocks * mp + LANES, 0.0);
    s.su.clear();
    s.su.resize(blocks * mp + LANES, 0.0);
    // Rows are quantized on the pool (each row alone, by the one-row quantizer, so which
    // thread does it cannot change a bit).
    let (qp, ssp, stp, sup) =
        (OutPtr(s.q.as_mut_ptr()), OutPtr(s.ss.as_mut_ptr()), OutPtr(s.st.as_mut_ptr()), OutPtr(s.su.as_mut_ptr()));
    pool::run(m.div_ceil(QUANTIZE_ROWS_PER_TASK), &|t| {
        for i in t * QUANTIZE_ROWS_PER_TASK..((t + 1) * QUANTIZE_ROWS_PER_TASK).min(m) {
            // SAFETY: q holds m x k and ss m x 2*blocks elements (resized above), st and su
            // blocks x mp (+ slack) with i < m <= mp; row i's slices of q and ss and the
            // entries b * mp + i of st and su are written by this task alone.
            unsafe {
                let q = std::slice::from_raw_parts_mut(qp.get().add(i * k), k);
                let ss = std::slice::from_raw_parts_mut(ssp.get().add(i * 2 * blocks), 2 * blocks);
                Act16::quantize(&x[i * k..(i + 1) * k], q, ss);
                for b in 0..blocks {
                    *stp.get().add(b * mp + i) = ss[2 * b];
                    *sup.get().add(b * mp + i) = ss[2 * b + 1];
                }
            }
        }
    });
    let s = &*s;
    let act = ActBatch { q: &s.q, st: &s.st, su: &s.su, m, mp, k, blocks };
    let out = OutPtr(y.as_mut_ptr());
    bands(n, m, &|rows| {
        #[cfg(target_arch = "x86_64")]
        if isa >= Isa::Avx2 && m <= gemv_max_rows(isa, w.ty) {
            // Few rows: each through the decode GEMV (the one-row kernel's bits by
            // construction, as the multi-row kernels give them), a chunk of weight rows at a
            // time so the next activation row finds the chunk in cache.
            for c in rows.clone().step_by(GEMV_CHUNK_ROWS) {
                let chunk = c..(c + GEMV_CHUNK_ROWS).min(rows.end);
                for i in 0..m {
                    let a =
                        Act16 { q: &s.q[i * k..(i + 1) * k], scale_sum: &s.ss[i * 2 * blocks..(i + 1) * 2 * blocks] };
                    // SAFETY: the ISA is supported (asserted by the caller); k is a multiple
                    // of 32 with at most MAX_STACK_BLOCKS blocks (can_group); row i of y (m x
                    // n) starts at i * n and this task alone writes its columns `chunk`.
                    unsafe { crate::gemv::gemv_rows(isa, w, chunk.clone(), &a, OutPtr(out.get().add(i * n)))? };
                }
            }
            return Ok(());
        }
        #[cfg(target_arch = "x86_64")]
        if isa >= Isa::Avx2 {
            return TASK.with(|t| {
                let mut guard = t.try_borrow_mut();
                let mut local = Vec::new();
                let scratch: &mut Vec<f32> = match guard {
                    Ok(ref mut g) => g,
                    Err(_) => &mut local,
                };
                scratch.resize(blocks * mp + mp + 2 * LANES, 0.0);
                let (p, off) = scratch.split_at_mut(blocks * mp + LANES);
                // SAFETY: the ISA is supported (asserted by the caller); `act` describes
                // m rows of k quantized activations and mp-lane transposed scales; the
                // weight rows are whole rows of `w`; this task alone writes columns
                // `rows` of y (m x n).
                // Types that run the AVX2 kernels at AVX-512 (`avx2_kernels_at`: Q5_0, Q6_K
                // and Q4_K everywhere, Q4_1 on AMX CPUs) do so in every path (single row,
                // gemv, here), so decode and batch agree there too.
                // At AVX-512, Q4_1 and Q5_0 compute that AVX2 arithmetic two blocks per
                // 512-bit vector (`avx512::act16_rows` with `pairs`, the same bits).
                unsafe {
                    match avx512_rows_kernel(isa, w.ty) {
                        Some(pairs) => avx512::act16_rows(w, rows, &act, p, off, out, pairs),
                        None => avx2::act16_rows(w, rows, &act, p, off, out),
                    }
                }
                Ok(())
            });
        }
        let _ = isa;
        for j in rows {
            for i in 0..m {
                let ss = &s.ss[i * 2 * blocks..(i + 1) * 2 * blocks];
                let a = Act16 { q: &s.q[i * k..(i + 1) * k], scale_sum: ss };
                let v = dot_row_act16_scalar(w.ty, w.row(j), &a)?;
                // SAFETY: i < m, j < n; column j belongs to this task alone.
                unsafe { out.get().add(i * n + j).write(v) };
            }
        }
        Ok(())
    })
}

/// Weight rows ahead of the one being multiplied whose bytes the multi-row kernels prefetch.
/// At 2-8 activation rows a weight row's products take little longer than its bytes take to
/// arrive, and the preparation of its block scales stalled on them (perf: `vcvtph2ps` of
/// the row's first scales). SmolLM2, `loupe bench --batch 1,2,4,8 -p 64 -n 64`, Sapphire
/// Rapids class, two runs each: decode at 2 / 4 sequences 156-185 -> 201-202 and 244-246 ->
/// 282-290 t/s (AMX); at 4 / 8 under `LOUPE_ISA=avx2` 175-177 -> 193-194 and 222-225 ->
/// 259-261.
#[cfg(target_arch = "x86_64")]
const PREFETCH_ROWS: usize = 4;

/// Prefetches weight row `j` of `w` into L1 if `j < end` (the task's rows end there).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn prefetch_row(w: &QMatrix, j: usize, end: usize) {
    use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
    if j < end {
        for line in w.row(j).chunks(64) {
            // SAFETY: a prefetch of an address inside the row; SSE is baseline on x86_64.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(line.as_ptr().cast()) };
        }
    }
}

/// Most activation rows a multi-row call runs through the decode GEMV one row at a time
/// instead of the multi-row kernels, whose per-weight-row preparation (every block's scale
/// products for 16 lanes of rows, the offset chain) does not pay off on so few rows: `isa`'s
/// multi-row kernel for `ty` is the 512-bit one (8 rows per weight row) or the AVX2 one (4).
/// SmolLM2 (Q4_1, Q8_0 lm_head), `loupe bench --batch ... -p 64 -n 64 -t 2`, Sapphire Rapids
/// class, two runs each, decode t/s multi-row -> GEMV: AMX (the pairs kernel) at 2 / 3 / 4
/// sequences 209-213 -> 270-295, 246-264 -> 283-290, 302 -> 266-285; `LOUPE_ISA=avx512` at 4
/// / 8: 291-298 -> 267-268, 361-366 -> 258-267; `LOUPE_ISA=avx2` at 2 / 4 / 8 / 16: 118 ->
/// 281-286, 182-201 -> 272-278, 234-270 -> 285-289, 294-332 -> 311-312.
#[cfg(target_arch = "x86_64")]
fn gemv_max_rows(isa: Isa, ty: GgmlType) -> usize {
    if avx512_rows_kernel(isa, ty).is_some() {
        3
    } else {
        8
    }
}

/// Which 512-bit multi-row kernel `ty` takes at `isa`: `Some(false)` its own AVX-512
/// arithmetic, `Some(true)` the AVX2 arithmetic two blocks per vector (the types that take
/// the AVX2 arithmetic at AVX-512 and have a pairs kernel: Q4_1 on AMX CPUs, Q5_0), `None`
/// the AVX2 multi-row kernel.
#[cfg(target_arch = "x86_64")]
fn avx512_rows_kernel(isa: Isa, ty: GgmlType) -> Option<bool> {
    if isa < Isa::Avx512 {
        None
    } else if !avx2_kernels_at(isa, ty) {
        Some(false)
    } else if matches!(ty, GgmlType::Q4_1 | GgmlType::Q5_0) {
        Some(true)
    } else {
        None
    }
}

/// Weight rows per chunk of that path: 64 rows of k = 1536 Q4_1 are 60 KiB, in L2 for the
/// next activation row.
#[cfg(target_arch = "x86_64")]
const GEMV_CHUNK_ROWS: usize = 64;

/// The activation side of a multi-row Q4_1 / Q8_0 / Q5_0 / Q6_K / Q4_K call.
#[derive(Clone, Copy)]
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
struct ActBatch<'a> {
    /// Row `i` at `q[i * k..]`.
    q: &'a [i16],
    /// Block scales / block sums transposed: `[blocks][mp]`.
    st: &'a [f32],
    su: &'a [f32],
    m: usize,
    /// `m` rounded up to [`LANES`].
    mp: usize,
    k: usize,
    blocks: usize,
}

/// Every other type (and Q4_1 / Q8_0 / Q5_0 / Q6_K / Q4_K rows too long for the stack path): one
/// [`dot_row`] per output, each against its own row and its own block sums.
fn generic(isa: Isa, x: &[f32], w: &QMatrix, y: &mut [f32], m: usize) -> Result<(), TensorError> {
    let (n, k) = (w.rows, w.cols);
    let block = w.ty.block_size();
    let blocks = k / block.max(1);
    let out = OutPtr(y.as_mut_ptr());
    let run = |sums: &[f32]| {
        bands(n, m, &|rows| {
            for j in rows {
                for i in 0..m {
                    let v = dot_row(isa, w.ty, w.row(j), &x[i * k..(i + 1) * k], &sums[i * blocks..(i + 1) * blocks])?;
                    // SAFETY: i < m, j < n; column j belongs to this task alone.
                    unsafe { out.get().add(i * n + j).write(v) };
                }
            }
            Ok(())
        })
    };
    let fill = |sums: &mut [f32]| {
        for (s, c) in sums.iter_mut().zip(x.chunks(block.max(1))) {
            *s = c.iter().sum();
        }
    };
    // Block sums of each row (the offset term of Q4_1 / Q5_1), on the stack at m == 1.
    if m * blocks <= MAX_STACK_BLOCKS {
        let mut stack = [MaybeUninit::<f32>::uninit(); MAX_STACK_BLOCKS];
        let sums = zeroed_prefix(&mut stack, m * blocks);
        fill(sums);
        return run(sums);
    }
    BATCH.with(|cell| match cell.try_borrow_mut() {
        Ok(mut s) => {
            s.sums.resize(m * blocks, 0.0);
            fill(&mut s.sums);
            run(&s.sums)
        }
        Err(_) => {
            let mut sums = vec![0f32; m * blocks];
            fill(&mut sums);
            run(&sums)
        }
    })
}

/// y[m, n] = x[m, k] @ w[n, k]^T in f32, batch invariant: each output is one dot product
/// in a fixed order (per ISA), whatever `m` and the thread count. Row-major `w`
/// (out features x in features). Runs the kernels of [`Isa::active`].
pub fn matmul_f32_invariant(
    x: &[f32],
    w: &[f32],
    y: &mut [f32],
    m: usize,
    k: usize,
    n: usize,
) -> Result<(), TensorError> {
    matmul_f32_invariant_with(Isa::active(), x, w, y, m, k, n)
}

/// [`matmul_f32_invariant`] on the kernels of a given ISA level.
///
/// # Panics
/// If this CPU does not support `isa`.
pub fn matmul_f32_invariant_with(
    isa: Isa,
    x: &[f32],
    w: &[f32],
    y: &mut [f32],
    m: usize,
    k: usize,
    n: usize,
) -> Result<(), TensorError> {
    assert!(isa.is_supported(), "matmul_f32_invariant_with: this CPU does not support {isa}");
    for (what, got, rows, cols) in [("x", x.len(), m, k), ("w", w.len(), n, k), ("y", y.len(), m, n)] {
        if rows.checked_mul(cols) != Some(got) {
            return Err(TensorError::Shape {
                op: "matmul_f32_invariant",
                detail: format!("{what} has {got} elements, expected {rows} x {cols}"),
            });
        }
    }
    if m == 0 || n == 0 {
        return Ok(());
    }
    // SAFETY: lengths checked above.
    unsafe { f32_bands(isa, x, w.as_ptr(), y, m, k, n) };
    Ok(())
}

/// Bands of weight rows over the pool for f32 weights at `w` (`n x k`, any alignment).
///
/// # Safety
/// `w` must be readable for `n * k` f32 (unaligned is fine), `x.len() == m * k`,
/// `y.len() == m * n`, and `isa` supported.
unsafe fn f32_bands(isa: Isa, x: &[f32], w: *const f32, y: &mut [f32], m: usize, k: usize, n: usize) {
    let out = OutPtr(y.as_mut_ptr());
    let wp = OutPtr(w.cast_mut());
    let _ = bands(n, m, &|rows| {
        for j in rows {
            let wr = wp.get().cast_const().add(j * k);
            // SAFETY (all arms): row j of w is in bounds, x has m rows of k, and this task
            // alone writes column j of y.
            #[cfg(target_arch = "x86_64")]
            if isa >= Isa::Avx2 {
                if isa >= Isa::Avx512 {
                    avx512::f32_rows(wr, x.as_ptr(), k, m, out.get().add(j), n);
                } else {
                    avx2::f32_rows(wr, x.as_ptr(), k, m, out.get().add(j), n);
                }
                continue;
            }
            for i in 0..m {
                out.get().add(i * n + j).write(dot_f32_scalar(wr, x.as_ptr().add(i * k), k));
            }
        }
        Ok(())
    });
}

/// Reference f32 dot: one sequential sum (w may be unaligned).
///
/// # Safety
/// `w` and `x` readable for `k` f32.
unsafe fn dot_f32_scalar(w: *const f32, x: *const f32, k: usize) -> f32 {
    let mut acc = 0f32;
    for c in 0..k {
        acc += w.add(c).read_unaligned() * x.add(c).read();
    }
    acc
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512 {
    //! AVX-512 multi-row kernels. Each mirrors, per activation row, the single-row
    //! kernel in `wq::avx512` operation for operation (same accumulators, same order).
    use std::arch::x86_64::*;
    use std::ops::Range;

    use super::ActBatch;
    use crate::matmul::{OutPtr, QMatrix};
    use crate::GgmlType;

    /// The horizontal sum of 16 lanes in a fixed order (halves, then quarters, then
    /// pairs, then lane 0 + lane 1), written out so that no library change can reorder it.
    /// It is the order of `_mm512_reduce_add_ps` in Rust 1.95's stdarch.
    #[inline]
    #[target_feature(enable = "avx512f")]
    pub(crate) unsafe fn hsum(v: __m512) -> f32 {
        let lo = _mm512_castps512_ps256(v);
        let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v)));
        let a = _mm256_add_ps(lo, hi);
        let a = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps::<1>(a));
        let a = _mm_add_ps(a, _mm_movehl_ps(a, a));
        _mm_cvtss_f32(a) + _mm_cvtss_f32(_mm_movehdup_ps(a))
    }

    /// Q4_1 / Q8_0 weight rows `rows` against every activation row of `act`; writes
    /// `y[i, j]` through `out` (`y` is `act.m x w.rows`). `p` holds `blocks * mp` and
    /// `off` `mp` floats of scratch.
    ///
    /// `pairs`: the types that take the AVX2 arithmetic at AVX-512 (`super::avx2_kernels_at`),
    /// Q4_1 on AMX CPUs and Q5_0, bit for bit `super::avx2::act16_rows` (and so the decode
    /// dot) with half its vector instructions per block and 8 activation rows per weight row
    /// instead of 4 ([`tile_pairs`]). [`prepare`] computes the same f32 products and
    /// block-ordered offset sums as the AVX2 one.
    ///
    /// # Safety
    /// AVX-512 F/BW/VL, AVX2, FMA and F16C; `w.ty` is Q4_1 or Q8_0 (`pairs`: Q4_1 or Q5_0)
    /// with `w.cols == act.k`; the caller owns columns `rows` of `y`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c,avx2,fma")]
    pub(super) unsafe fn act16_rows(
        w: &QMatrix,
        rows: Range<usize>,
        act: &ActBatch<'_>,
        p: &mut [f32],
        off: &mut [f32],
        out: OutPtr,
        pairs: bool,
    ) {
        let (m, k) = (act.m, act.k);
        let chunk = if m * k * 2 <= super::ACT_L1_BYTES { m } else { super::CHUNK_ROWS };
        for c0 in (0..m).step_by(chunk) {
            let c1 = (c0 + chunk).min(m);
            for j in rows.clone() {
                super::prefetch_row(w, j + super::PREFETCH_ROWS, rows.end);
                // One instance per tile family, each small enough to be inlined here.
                if pairs {
                    chunk_rows::<true>(w, j, c0..c1, act, p, off, out);
                } else {
                    chunk_rows::<false>(w, j, c0..c1, act, p, off, out);
                }
            }
        }
    }

    /// A pair of consecutive Q4_1 or Q5_0 blocks at `blk` as the AVX2 kernel's two vectors
    /// of each, joined: words 0..16 of the first result are block `b`'s elements 0..16 and
    /// words 16..32 block `b + 1`'s; the second result holds elements 16..32 alike. The
    /// qs bytes widened to words give the low nibbles (elements 0..16) and high ones
    /// (16..32); for Q5_0, where an element's fifth bit (bit `j` of its block's `qh`) is
    /// clear, 16 is subtracted (`(nibble | bit << 4) - 16`, ggml's `dequantize_row_q5_0`).
    /// Used by this module's [`tile_pairs`] and the decode GEMV's `group_avx512_pairs`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2")]
    pub(crate) unsafe fn unpack_pair<const KIND: u8>(blk: *const u8) -> (__m512i, __m512i) {
        use super::avx2::{block_bytes, Q4_1};
        let (bytes, qs) = (block_bytes(KIND), if KIND == Q4_1 { 4 } else { 6 });
        let nxt = blk.add(bytes);
        let both = _mm256_inserti128_si256::<1>(
            _mm256_castsi128_si256(_mm_loadu_si128(blk.add(qs) as *const __m128i)),
            _mm_loadu_si128(nxt.add(qs) as *const __m128i),
        );
        let w16 = _mm512_cvtepu8_epi16(both);
        let (lo, hi) = (_mm512_and_si512(w16, _mm512_set1_epi16(0x0F)), _mm512_srli_epi16::<4>(w16));
        if KIND == Q4_1 {
            return (lo, hi);
        }
        let qh = |blk: *const u8| std::ptr::read_unaligned(blk.add(2) as *const u32);
        let (h0, h1) = (qh(blk), qh(nxt));
        // Bit j of a mask: word j's element has its fifth bit clear.
        let clear_lo: __mmask32 = !((h0 & 0xFFFF) | (h1 << 16));
        let clear_hi: __mmask32 = !((h0 >> 16) | (h1 & 0xFFFF_0000));
        let sixteen = _mm512_set1_epi16(16);
        (_mm512_mask_sub_epi16(lo, clear_lo, lo, sixteen), _mm512_mask_sub_epi16(hi, clear_hi, hi, sixteen))
    }

    /// One Q4_1 or Q5_0 weight row against `NA` activation rows (see [`tile_q4_1`] for the
    /// arguments), bit for bit `super::avx2::tile`: blocks `b` (even) and `b + 1` share one
    /// 512-bit vector, `b` in the low 256 bits and `b + 1` in the high ones. One
    /// `vpmaddwd` pair then gives in lanes 0..8 block `b`'s eight i32 lanes of the AVX2
    /// kernel (elements `2l, 2l + 1, 16 + 2l, 17 + 2l`) and in lanes 8..16 those of block
    /// `b + 1`; exact integers, so the same values however unpacked. One FMA with
    /// `[d_b s_b; 8] ++ [d_{b+1} s_{b+1}; 8]` into one accumulator does what AVX2 does to
    /// its even-block (the low half) and odd-block (the high half) accumulators, in the same
    /// order; an odd last block goes to the low half alone; the result is AVX2's `hsum(acc0 +
    /// acc1)`. (The decode GEMV's `group_avx512_pairs` is the same idea for one activation
    /// row.)
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c,avx2,fma")]
    #[allow(clippy::needless_range_loop)]
    unsafe fn tile_pairs<const NA: usize, const KIND: u8>(
        w: *const u8,
        blocks: usize,
        q: *const i16,
        k: usize,
        p: *const f32,
        mp: usize,
    ) -> [f32; NA] {
        use super::avx2::{self, block_bytes};
        let mut acc = [_mm512_setzero_ps(); NA];
        let mut b = 0;
        while b + 2 <= blocks {
            let (wlo, whi) = unpack_pair::<KIND>(w.add(b * block_bytes(KIND)));
            for a in 0..NA {
                // [x_b 0..16 | x_b+1 0..16] and [x_b 16..32 | x_b+1 16..32].
                let (xa, xb) = (
                    _mm512_loadu_si512(q.add(a * k + b * 32) as *const _),
                    _mm512_loadu_si512(q.add(a * k + b * 32 + 32) as *const _),
                );
                let (xlo, xhi) = (_mm512_shuffle_i64x2::<0x44>(xa, xb), _mm512_shuffle_i64x2::<0xEE>(xa, xb));
                let dot = _mm512_add_epi32(_mm512_madd_epi16(wlo, xlo), _mm512_madd_epi16(whi, xhi));
                let scale = _mm512_mask_broadcastss_ps(
                    _mm512_set1_ps(*p.add(b * mp + a)),
                    0xFF00,
                    _mm_load_ss(p.add((b + 1) * mp + a)),
                );
                acc[a] = _mm512_fmadd_ps(scale, _mm512_cvtepi32_ps(dot), acc[a]);
            }
            b += 2;
        }
        if b < blocks {
            // The odd last block, even-indexed: the AVX2 kernel's step into the low half.
            let (wlo, whi) = avx2::unpack::<KIND>(w, b);
            for a in 0..NA {
                let xq = q.add(a * k + b * 32);
                let dot = _mm256_add_epi32(
                    _mm256_madd_epi16(wlo, _mm256_loadu_si256(xq as *const __m256i)),
                    _mm256_madd_epi16(whi, _mm256_loadu_si256(xq.add(16) as *const __m256i)),
                );
                let lo = _mm256_fmadd_ps(
                    _mm256_set1_ps(*p.add(b * mp + a)),
                    _mm256_cvtepi32_ps(dot),
                    _mm512_castps512_ps256(acc[a]),
                );
                acc[a] = _mm512_castpd_ps(_mm512_insertf64x4::<0>(_mm512_castps_pd(acc[a]), _mm256_castps_pd(lo)));
            }
        }
        let mut r = [0f32; NA];
        for a in 0..NA {
            let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(acc[a])));
            r[a] = avx2::hsum(_mm256_add_ps(_mm512_castps512_ps256(acc[a]), hi));
        }
        r
    }

    /// Weight row `j` against activation rows `i_rows` (see [`act16_rows`]).
    #[allow(clippy::too_many_arguments)]
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c,avx2,fma")]
    unsafe fn chunk_rows<const PAIRS: bool>(
        w: &QMatrix,
        j: usize,
        i_rows: Range<usize>,
        act: &ActBatch<'_>,
        p: &mut [f32],
        off: &mut [f32],
        out: OutPtr,
    ) {
        use super::avx2::{Q4_1, Q5_0};
        let (mp, blocks, k, n) = (act.mp, act.blocks, act.k, w.rows);
        let q4_1 = w.ty == GgmlType::Q4_1;
        let row = w.row(j).as_ptr();
        // Q5_0's and Q8_0's d are their first two bytes.
        prepare(row, w.ty.type_size(), q4_1, act, i_rows.clone(), p.as_mut_ptr(), off.as_mut_ptr());
        let (pp, y) = (p.as_ptr(), out.get().add(j));
        let (mut i, m) = (i_rows.start, i_rows.end);
        while i < m {
            let na = (m - i).min(8);
            let (q, pi, yi) = (act.q.as_ptr().add(i * k), pp.add(i), y.add(i * n));
            // Q8_0 and Q5_0 add no offset (a null `off`, see `store`).
            let o = if q4_1 { off.as_ptr().add(i) } else { std::ptr::null() };
            macro_rules! run {
                ($tile:ident $(, $kind:ident)?) => {
                    match na {
                        8 => store($tile::<8 $(, $kind)?>(row, blocks, q, k, pi, mp), yi, n, o),
                        7 => store($tile::<7 $(, $kind)?>(row, blocks, q, k, pi, mp), yi, n, o),
                        6 => store($tile::<6 $(, $kind)?>(row, blocks, q, k, pi, mp), yi, n, o),
                        5 => store($tile::<5 $(, $kind)?>(row, blocks, q, k, pi, mp), yi, n, o),
                        4 => store($tile::<4 $(, $kind)?>(row, blocks, q, k, pi, mp), yi, n, o),
                        3 => store($tile::<3 $(, $kind)?>(row, blocks, q, k, pi, mp), yi, n, o),
                        2 => store($tile::<2 $(, $kind)?>(row, blocks, q, k, pi, mp), yi, n, o),
                        _ => store($tile::<1 $(, $kind)?>(row, blocks, q, k, pi, mp), yi, n, o),
                    }
                };
            }
            match (PAIRS, q4_1) {
                (true, true) => run!(tile_pairs, Q4_1),
                (true, false) => run!(tile_pairs, Q5_0),
                (false, true) => run!(tile_q4_1),
                (false, false) => run!(tile_q8_0),
            }
            i += na;
        }
    }

    /// Writes `r[a] (+ off[a])` to `y[a * n]`. Q8_0 and Q5_0 pass a null `off`: the
    /// single-row kernel adds no offset term, and adding 0.0 would turn a -0.0 into +0.0.
    #[inline(always)]
    unsafe fn store<const NA: usize>(r: [f32; NA], y: *mut f32, n: usize, off: *const f32) {
        for (a, v) in r.into_iter().enumerate() {
            let v = if off.is_null() { v } else { v + *off.add(a) };
            y.add(a * n).write(v);
        }
    }

    /// For one weight row: `p[b * mp + i] = d_b * scale_{i,b}` and (Q4_1)
    /// `off[i] = sum_b m_b * sum_{i,b}` accumulated block by block from +0.0, 16
    /// activation rows per vector, for `i` in `i_rows` (which starts at a multiple of 8;
    /// the last vector may spill up to 15 lanes past it, into the slack of `st`, `su`,
    /// `p`, `off` or into lanes of the next block that this chunk does not use). These
    /// are the exact f32 operations the single-row kernel performs per block
    /// (`[d, m] * [scale, sum]`, then `off += m * sum`).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
    unsafe fn prepare(
        row: *const u8,
        bytes: usize,
        q4_1: bool,
        act: &ActBatch<'_>,
        i_rows: Range<usize>,
        p: *mut f32,
        off: *mut f32,
    ) {
        let (mp, blocks) = (act.mp, act.blocks);
        let (st, su) = (act.st.as_ptr(), act.su.as_ptr());
        for c in i_rows.step_by(16) {
            let mut o = _mm512_setzero_ps();
            for b in 0..blocks {
                let blk = row.add(b * bytes);
                let at = b * mp + c;
                if q4_1 {
                    let dm = _mm_cvtph_ps(_mm_cvtsi32_si128(std::ptr::read_unaligned(blk as *const i32)));
                    let d = _mm512_broadcastss_ps(dm);
                    let mm = _mm512_broadcastss_ps(_mm_movehdup_ps(dm));
                    _mm512_storeu_ps(p.add(at), _mm512_mul_ps(d, _mm512_loadu_ps(st.add(at))));
                    o = _mm512_add_ps(o, _mm512_mul_ps(mm, _mm512_loadu_ps(su.add(at))));
                } else {
                    let d = _mm512_broadcastss_ps(_mm_cvtph_ps(_mm_cvtsi32_si128(std::ptr::read_unaligned(
                        blk as *const u16,
                    ) as i32)));
                    _mm512_storeu_ps(p.add(at), _mm512_mul_ps(d, _mm512_loadu_ps(st.add(at))));
                }
            }
            _mm512_storeu_ps(off.add(c), o);
        }
    }

    /// One Q4_1 weight row (`blocks` blocks at `w`) against `NA` activation rows at `q`
    /// (row stride `k`), with the block products at `p[b * mp + a]`. Per row: the same
    /// `vpmaddwd`, conversion and FMA into the even/odd-block accumulator as
    /// `wq::avx512::dot_q4_1_act16`, then the same horizontal sum.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
    unsafe fn tile_q4_1<const NA: usize>(
        w: *const u8,
        blocks: usize,
        q: *const i16,
        k: usize,
        p: *const f32,
        mp: usize,
    ) -> [f32; NA] {
        let mask = _mm256_set1_epi8(0x0F);
        let shifts = _mm256_set_epi16(4, 4, 4, 4, 4, 4, 4, 4, 0, 0, 0, 0, 0, 0, 0, 0);
        // Even blocks into acc0, odd into acc1, as the single-row kernel; two named
        // arrays (not acc[b & 1]) so that they live in registers.
        let (mut acc0, mut acc1) = ([_mm512_setzero_ps(); NA], [_mm512_setzero_ps(); NA]);
        macro_rules! step {
            ($b:expr, $acc:ident) => {{
                let b = $b;
                let blk = w.add(b * 20);
                let both = _mm256_broadcastsi128_si256(_mm_loadu_si128(blk.add(4) as *const __m128i));
                let w16 = _mm512_cvtepu8_epi16(_mm256_and_si256(_mm256_srlv_epi16(both, shifts), mask));
                for a in 0..NA {
                    let dot = _mm512_madd_epi16(w16, _mm512_loadu_si512(q.add(a * k + b * 32) as *const _));
                    $acc[a] = _mm512_fmadd_ps(_mm512_set1_ps(*p.add(b * mp + a)), _mm512_cvtepi32_ps(dot), $acc[a]);
                }
            }};
        }
        let mut b = 0;
        while b + 2 <= blocks {
            step!(b, acc0);
            step!(b + 1, acc1);
            b += 2;
        }
        if b < blocks {
            step!(b, acc0);
        }
        let mut r = [0f32; NA];
        for a in 0..NA {
            r[a] = hsum(_mm512_add_ps(acc0[a], acc1[a]));
        }
        r
    }

    /// [`tile_q4_1`] for Q8_0 (`wq::avx512::dot_q8_0_act16`).
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
    unsafe fn tile_q8_0<const NA: usize>(
        w: *const u8,
        blocks: usize,
        q: *const i16,
        k: usize,
        p: *const f32,
        mp: usize,
    ) -> [f32; NA] {
        let (mut acc0, mut acc1) = ([_mm512_setzero_ps(); NA], [_mm512_setzero_ps(); NA]);
        macro_rules! step {
            ($b:expr, $acc:ident) => {{
                let b = $b;
                let w16 = _mm512_cvtepi8_epi16(_mm256_loadu_si256(w.add(b * 34 + 2) as *const __m256i));
                for a in 0..NA {
                    let dot = _mm512_madd_epi16(w16, _mm512_loadu_si512(q.add(a * k + b * 32) as *const _));
                    $acc[a] = _mm512_fmadd_ps(_mm512_set1_ps(*p.add(b * mp + a)), _mm512_cvtepi32_ps(dot), $acc[a]);
                }
            }};
        }
        let mut b = 0;
        while b + 2 <= blocks {
            step!(b, acc0);
            step!(b + 1, acc1);
            b += 2;
        }
        if b < blocks {
            step!(b, acc0);
        }
        let mut r = [0f32; NA];
        for a in 0..NA {
            r[a] = hsum(_mm512_add_ps(acc0[a], acc1[a]));
        }
        r
    }

    /// One f32 weight row at `w` (any alignment) against all `m` rows of `x` (stride
    /// `k`), written to `y[i * n]`; 4 activation rows at a time, each with the arithmetic
    /// of [`dot_f32_rows::<1>`](dot_f32_rows).
    ///
    /// # Safety
    /// AVX-512 F; `w` readable for `k`, `x` for `m * k`, `y` writable at `i * n`, `i < m`.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn f32_rows(w: *const f32, x: *const f32, k: usize, m: usize, y: *mut f32, n: usize) {
        let mut i = 0;
        while i < m {
            let na = (m - i).min(4);
            let xi = x.add(i * k);
            let r: &[f32] = match na {
                4 => &dot_f32_rows::<4>(w, xi, k),
                3 => &dot_f32_rows::<3>(w, xi, k),
                2 => &dot_f32_rows::<2>(w, xi, k),
                _ => &dot_f32_rows::<1>(w, xi, k),
            };
            for (a, &v) in r.iter().enumerate() {
                y.add((i + a) * n).write(v);
            }
            i += na;
        }
    }

    /// `NA` f32 dots of one weight row: 16-wide chunks FMA'd into accumulator `c % 4`,
    /// the tail chunk masked (zeros add nothing), then `(a0 + a1) + (a2 + a3)` and
    /// [`hsum`].
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn dot_f32_rows<const NA: usize>(w: *const f32, x: *const f32, k: usize) -> [f32; NA] {
        // Accumulator c % 4 for chunk c; four named arrays so they stay in registers.
        let z = [_mm512_setzero_ps(); NA];
        let (mut a0, mut a1, mut a2, mut a3) = (z, z, z, z);
        let full = k / 16;
        let rest = k - full * 16;
        let mask: __mmask16 = (1u32 << rest).wrapping_sub(1) as __mmask16;
        macro_rules! step {
            ($c:expr, $acc:ident, $load:ident) => {{
                let c = $c;
                let wv = $load(w.add(c * 16));
                for a in 0..NA {
                    $acc[a] = _mm512_fmadd_ps(wv, $load(x.add(a * k + c * 16)), $acc[a]);
                }
            }};
        }
        // The tail: masked loads (zeros add nothing).
        let tail = |p: *const f32| _mm512_maskz_loadu_ps(mask, p);
        let mut c = 0;
        while c + 4 <= full {
            step!(c, a0, _mm512_loadu_ps);
            step!(c + 1, a1, _mm512_loadu_ps);
            step!(c + 2, a2, _mm512_loadu_ps);
            step!(c + 3, a3, _mm512_loadu_ps);
            c += 4;
        }
        // Up to three full chunks and the masked tail, still into accumulator c % 4.
        let left = full - c + usize::from(rest > 0);
        for i in 0..left {
            let masked = c + i == full;
            match (i, masked) {
                (0, false) => step!(c, a0, _mm512_loadu_ps),
                (1, false) => step!(c + 1, a1, _mm512_loadu_ps),
                (2, false) => step!(c + 2, a2, _mm512_loadu_ps),
                (0, true) => step!(c, a0, tail),
                (1, true) => step!(c + 1, a1, tail),
                (2, true) => step!(c + 2, a2, tail),
                _ => step!(c + 3, a3, tail),
            }
        }
        let mut r = [0f32; NA];
        for a in 0..NA {
            r[a] = hsum(_mm512_add_ps(_mm512_add_ps(a0[a], a1[a]), _mm512_add_ps(a2[a], a3[a])));
        }
        r
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2 {
    //! AVX2 (+FMA, F16C) kernels: the single-row Act16 dots that `wq::dot_row_act16`
    //! runs at [`crate::quant::Isa::Avx2`] (and, for Q5_0, Q6_K and Q4_K, at `Avx512` too), and their
    //! multi-row twins, which repeat the single-row arithmetic per activation row.
    //!
    //! Per block `b` of 32: the 32 weights widened to two vectors of 16 i16, each
    //! `vpmaddwd`'d with 16 activations and the two i32 vectors added (exact: at most
    //! 4 products of |w| <= 128 and |q| <= 32767 per lane, < 2^24 so the f32
    //! conversion is exact too; Q6_K's weights carry their sub-block scale, |w| <= 4096,
    //! lanes < 2^29 exact in i32 and rounded once by the conversion, see [`q6_k`]), converted, and FMA'd with `d * scale` broadcast into
    //! accumulator `b % 2` (Q6_K / Q4_K: a super-block of 8 blocks per iteration, same
    //! order); Q4_1's (Q4_K's `-(dmin * m)`) `m * sum` is added to a scalar offset from +0.0 block
    //! by block. Result: `hsum(acc0 + acc1) (+ offset)`.
    use std::arch::x86_64::*;
    use std::ops::Range;

    use super::ActBatch;
    use crate::matmul::{OutPtr, QMatrix};
    use crate::GgmlType;

    /// The horizontal sum of 8 lanes in a fixed order: halves, pairs, lane 0 + lane 1.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub(crate) unsafe fn hsum(v: __m256) -> f32 {
        let a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
        let a = _mm_add_ps(a, _mm_movehl_ps(a, a));
        _mm_cvtss_f32(a) + _mm_cvtss_f32(_mm_movehdup_ps(a))
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn f16_at(p: *const u8) -> f32 {
        _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(std::ptr::read_unaligned(p as *const u16) as i32)))
    }

    /// `vpmovzxbw` of the 16 bytes at `p` (one load and one shuffle), written out because,
    /// given the intrinsic followed by the nibble masks, LLVM moves the masks before the
    /// widening and widens twice: two shuffles per block, the port that limited the decode
    /// GEMV on an AMD EPYC (Zen 3). With this the hot Q4_1 GEMV ran ~1.45x faster there.
    #[inline]
    #[target_feature(enable = "avx2")]
    pub(crate) unsafe fn widen_u8(p: *const u8) -> __m256i {
        let v: __m256i;
        std::arch::asm!("vpmovzxbw {v}, xmmword ptr [{p}]", v = out(ymm_reg) v, p = in(reg) p, options(pure, readonly, nostack, preserves_flags));
        v
    }

    /// Q4_1 block at `blk`: elements 0..16 (low nibbles) and 16..32 (high nibbles) as i16.
    /// Byte `i` widened to word `i` holds element `i` in its low nibble and `i + 16` in its
    /// high one.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn nibbles(blk: *const u8) -> (__m256i, __m256i) {
        let w16 = widen_u8(blk.add(4));
        (_mm256_and_si256(w16, _mm256_set1_epi16(0x0F)), _mm256_srli_epi16::<4>(w16))
    }

    /// Q8_0 block at `blk` as two vectors of 16 i16.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn bytes(blk: *const u8) -> (__m256i, __m256i) {
        let a = _mm_loadu_si128(blk.add(2) as *const __m128i);
        let b = _mm_loadu_si128(blk.add(18) as *const __m128i);
        (_mm256_cvtepi8_epi16(a), _mm256_cvtepi8_epi16(b))
    }

    /// Q5_0 block at `blk` (`f16 d; u8 qh[4]; u8 qs[16]`): elements 0..16 and 16..32 as
    /// i16 `q - 16` (-16..=15). Element `j`'s low 4 bits are the low (`j < 16`) or high
    /// nibble of `qs[j % 16]`, its fifth bit is bit `j` of the little-endian `qh`. Word `j`
    /// of the low vector tests bit `j` of `qh`'s low half (broadcast to every word), of the
    /// high vector bit `j` of its high half; where the bit is clear, `0xFFF0` is or'ed over
    /// the nibble, which makes it `nibble - 16` (set: `nibble + 16 - 16`).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn q5_0(blk: *const u8) -> (__m256i, __m256i) {
        let w16 = widen_u8(blk.add(6));
        let bit = _mm256_setr_epi16(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, i16::MIN);
        let neg = _mm256_set1_epi16(0xFFF0_u16 as i16);
        let hl = _mm256_set1_epi16(std::ptr::read_unaligned(blk.add(2) as *const i16));
        let hh = _mm256_set1_epi16(std::ptr::read_unaligned(blk.add(4) as *const i16));
        let set_lo = _mm256_cmpeq_epi16(_mm256_and_si256(hl, bit), bit);
        let set_hi = _mm256_cmpeq_epi16(_mm256_and_si256(hh, bit), bit);
        let lo = _mm256_or_si256(_mm256_and_si256(w16, _mm256_set1_epi16(0x0F)), _mm256_andnot_si256(set_lo, neg));
        let hi = _mm256_or_si256(_mm256_srli_epi16::<4>(w16), _mm256_andnot_si256(set_hi, neg));
        (lo, hi)
    }

    /// Q6_K's 32-element Act16 block `b` of a row at `w` (`block_q6_K { u8 ql[128]; u8
    /// qh[64]; i8 scales[16]; f16 d }`, 210 bytes per 256 elements): elements 0..16 and
    /// 16..32 as i16 `(q - 32) * scale`, each half one 16-element sub-block with its own
    /// i8 scale. Block `b` is quarter `j = b % 4` of half `h = b / 4 % 2` of super-block
    /// `b / 8`: element `l` takes its low 4 bits from nibble `j / 2` of `ql[64h + 32 (j %
    /// 2) + l]`, its top 2 from bits `2j..2j + 2` of `qh[32h + l]`, and its scale from
    /// `scales[8h + 2j + l / 16]` (ggml's `dequantize_row_q6_K`). `|(q - 32) * scale| <=
    /// 32 * 128 = 4096` fits i16 exactly, so `vpmaddwd` against 16-bit activations
    /// (|x| <= 32767) is exact per lane: 4 products per lane of [`block_dot`] are at most
    /// 4 * 4096 * 32767 < 2^29, so the i32 lanes are `sc0 * isum0 + sc1 * isum1` split
    /// over 8 lanes, exact; their conversion to f32 may round (above 2^24), identically
    /// in every AVX2 path.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn q6_k(w: *const u8, b: usize) -> (__m256i, __m256i) {
        let sb = w.add(b / 8 * 210);
        let (h, j) = (b / 4 % 2, b % 4);
        let l = _mm256_loadu_si256(sb.add(64 * h + 32 * (j % 2)) as *const __m256i);
        let hb = _mm256_loadu_si256(sb.add(128 + 32 * h) as *const __m256i);
        // 16-bit shifts move bits across the byte boundary only into bits the masks clear:
        // after the right shift by 2j <= 6, bits 0-1 of each byte are its bits 2j, 2j + 1,
        // and the left shift by 4 puts them at bits 4-5 of the same byte.
        let low = _mm256_and_si256(_mm256_srl_epi16(l, _mm_cvtsi32_si128(4 * (j / 2) as i32)), _mm256_set1_epi8(0x0F));
        let high = _mm256_and_si256(
            _mm256_slli_epi16::<4>(_mm256_srl_epi16(hb, _mm_cvtsi32_si128(2 * j as i32))),
            _mm256_set1_epi8(0x30),
        );
        let code = _mm256_sub_epi8(_mm256_or_si256(low, high), _mm256_set1_epi8(32));
        let sc = sb.add(192 + 8 * h + 2 * j);
        let (sc0, sc1) = (_mm256_set1_epi16(*sc as i8 as i16), _mm256_set1_epi16(*sc.add(1) as i8 as i16));
        let lo = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(code));
        let hi = _mm256_cvtepi8_epi16(_mm256_extracti128_si256::<1>(code));
        (_mm256_mullo_epi16(lo, sc0), _mm256_mullo_epi16(hi, sc1))
    }

    /// Q6_K (`$kind`): the blocks of whole super-blocks in the order of the pair loop
    /// (even blocks into `$acc0`, odd into `$acc1`), a super-block per iteration with `b = 8
    /// s + i`, `i` constant, so [`q6_k`]'s shifts and offsets fold to constants. Evaluates
    /// to the first block left (0 for the other kinds).
    macro_rules! super_blocks {
        ($kind:expr, $blocks:expr, $step:ident, $acc0:ident, $acc1:ident) => {{
            if $kind == Q6_K || $kind == Q4_K {
                for s in 0..$blocks / 8 {
                    let b8 = 8 * s;
                    $step!(b8, $acc0);
                    $step!(b8 + 1, $acc1);
                    $step!(b8 + 2, $acc0);
                    $step!(b8 + 3, $acc1);
                    $step!(b8 + 4, $acc0);
                    $step!(b8 + 5, $acc1);
                    $step!(b8 + 6, $acc0);
                    $step!(b8 + 7, $acc1);
                }
                $blocks / 8 * 8
            } else {
                0
            }
        }};
    }

    /// The block formats of the AVX2 Act16 kernels, as a const parameter (`KIND`).
    pub(crate) const Q4_1: u8 = 0;
    pub(crate) const Q8_0: u8 = 1;
    pub(crate) const Q5_0: u8 = 2;
    pub(crate) const Q6_K: u8 = 3;
    pub(crate) const Q4_K: u8 = 4;

    /// Whether `KIND` adds an offset term (`m * sum` per block, Q4_1 and Q4_K).
    #[inline(always)]
    pub(crate) const fn has_offset(kind: u8) -> bool {
        kind == Q4_1 || kind == Q4_K
    }

    /// Q4_K's 32-element Act16 block `b` of a row at `w` (`block_q4_K { f16 d; f16 dmin;
    /// u8 scales[12]; u8 qs[128] }`, 144 bytes per 256 elements): sub-block `j = b % 8` of
    /// super-block `b / 8`, its 4-bit codes `q` (0..=15, unscaled) from the low (`j`
    /// even) or high nibbles of `qs[32 (j / 2)..][..32]`, as i16 (elements 0..16, 16..32).
    /// The integer lanes of [`block_dot`] are then exact in f32 (< 2^24); the sub-block's
    /// scale and min are applied in f32 ([`q4_k_dm`]).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn q4_k(w: *const u8, b: usize) -> (__m256i, __m256i) {
        let j = b % 8;
        let v = _mm256_loadu_si256(w.add(b / 8 * 144 + 16 + 32 * (j / 2)) as *const __m256i);
        let q = _mm256_and_si256(_mm256_srl_epi16(v, _mm_cvtsi32_si128(4 * (j % 2) as i32)), _mm256_set1_epi8(0x0F));
        (_mm256_cvtepu8_epi16(_mm256_castsi256_si128(q)), _mm256_cvtepu8_epi16(_mm256_extracti128_si256::<1>(q)))
    }

    /// The `KIND` of a type the Act16 kernels take (Q4_1, Q8_0, Q5_0, Q6_K or Q4_K).
    pub(crate) fn kind(ty: GgmlType) -> u8 {
        match ty {
            GgmlType::Q4_1 => Q4_1,
            GgmlType::Q5_0 => Q5_0,
            GgmlType::Q6K => Q6_K,
            GgmlType::Q4K => Q4_K,
            _ => Q8_0,
        }
    }

    /// Bytes per 32-element block of `KIND` (Q6_K: 26, its 210 bytes per 256 elements
    /// rounded down; only the prefetch distance uses it there, see [`block_at`]).
    #[inline(always)]
    pub(crate) const fn block_bytes(kind: u8) -> usize {
        match kind {
            Q4_1 => 20,
            Q5_0 => 22,
            Q6_K => 26,
            Q4_K => 18,
            _ => 34,
        }
    }

    /// Byte offset in a row of `KIND` of 32-element block `b`'s data (Q6_K: of the
    /// 1/8 of its super-block it falls at, for prefetching).
    #[inline(always)]
    pub(crate) const fn block_at(kind: u8, b: usize) -> usize {
        match kind {
            Q6_K => b * 210 / 8,
            _ => b * block_bytes(kind),
        }
    }

    /// Byte offset in a row of `KIND` of the f16 `d` that scales 32-element block `b`
    /// (Q6_K: its super-block's, at byte 208).
    #[inline(always)]
    pub(crate) const fn d_at(kind: u8, b: usize) -> usize {
        match kind {
            Q6_K => b / 8 * 210 + 208,
            _ => b * block_bytes(kind),
        }
    }

    /// Block `b` of a row at `w` of `KIND`, elements 0..16 and 16..32 as i16 (the
    /// unpacking every AVX2 Act16 kernel uses; the integer lanes of [`block_dot`] depend
    /// only on it).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn unpack<const KIND: u8>(w: *const u8, b: usize) -> (__m256i, __m256i) {
        let blk = w.add(b * block_bytes(KIND));
        match KIND {
            Q4_1 => nibbles(blk),
            Q5_0 => q5_0(blk),
            Q6_K => q6_k(w, b),
            Q4_K => q4_k(w, b),
            _ => bytes(blk),
        }
    }

    /// The exact integer dot of one block's weights with 32 activations at `q`, as 8 i32
    /// lanes converted to f32.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn block_dot(w: (__m256i, __m256i), q: *const i16) -> __m256 {
        let lo = _mm256_madd_epi16(w.0, _mm256_loadu_si256(q as *const __m256i));
        let hi = _mm256_madd_epi16(w.1, _mm256_loadu_si256(q.add(16) as *const __m256i));
        _mm256_cvtepi32_ps(_mm256_add_epi32(lo, hi))
    }

    /// Q4_1 row x 16-bit activations (see the module doc). Lengths are checked by the
    /// caller (`q.len() == 32 * blocks`, `w.len() == 20 * blocks`, `ss.len() == 2 * blocks`).
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn dot_q4_1_act16(w: &[u8], q: &[i16], ss: &[f32]) -> f32 {
        dot_dm_act16::<Q4_1>(w, q, ss)
    }

    /// Q4_K row x 16-bit activations: [`dot_q4_1_act16`]'s arithmetic with block `b`'s
    /// `d' = d * sc` and `m' = -(dmin * m)` of [`q4_k_dm`] and the codes of [`q4_k`].
    /// Lengths are checked by the caller (`q.len()` a multiple of 256, `w.len() == 144 *
    /// q.len() / 256`). Also the kernel of AVX-512 machines.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn dot_q4_k_act16(w: &[u8], q: &[i16], ss: &[f32]) -> f32 {
        dot_dm_act16::<Q4_K>(w, q, ss)
    }

    /// Block `b`'s `(d, m)` of an offset kind: Q4_1's two halves; Q4_K's `d * sc` and
    /// `-(dmin * m)` ([`q4_k_dm`]).
    #[inline(always)]
    pub(crate) unsafe fn dm_at<const KIND: u8>(w: *const u8, b: usize) -> (f32, f32) {
        if KIND == Q4_K {
            q4_k_dm(w.add(b / 8 * 144), b % 8)
        } else {
            let blk = w.add(b * 20);
            (f16_at(blk), f16_at(blk.add(2)))
        }
    }

    /// Sub-block `j`'s `(d * sc, -(dmin * m))` of the Q4_K super-block at `sb` (ggml's
    /// `get_scale_min_k4`; both products of an f16 and a 6-bit integer, exact in f32, and
    /// the negation exact: the value `d sc q - dmin m` is `d' q + m'`).
    #[inline(always)]
    pub(crate) unsafe fn q4_k_dm(sb: *const u8, j: usize) -> (f32, f32) {
        let sc = |i: usize| *sb.add(4 + i);
        let (s, m) = if j < 4 {
            (sc(j) & 63, sc(j + 4) & 63)
        } else {
            ((sc(j + 4) & 0x0F) | ((sc(j - 4) >> 6) << 4), (sc(j + 4) >> 4) | ((sc(j) >> 6) << 4))
        };
        let (d, dmin) = (f16_at(sb), f16_at(sb.add(2)));
        (d * s as f32, -(dmin * m as f32))
    }

    /// All 8 sub-blocks' `(d * sc, -(dmin * m))` of the Q4_K super-block at `sb`, the
    /// values of [`q4_k_dm`] bit for bit (each an exact product, whatever computes it),
    /// with the scales unpacked 8 at a time.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn q4_k_dms(sb: *const u8) -> ([f32; 8], [f32; 8]) {
        let (sc, mn) = crate::wq::kquant_avx2::scales_mins_q4k(sb.add(4));
        let (mut d, mut m) = ([0f32; 8], [0f32; 8]);
        _mm256_storeu_ps(d.as_mut_ptr(), _mm256_mul_ps(_mm256_set1_ps(f16_at(sb)), sc));
        _mm256_storeu_ps(m.as_mut_ptr(), _mm256_mul_ps(_mm256_set1_ps(-f16_at(sb.add(2))), mn));
        (d, m)
    }

    /// The offset formats (`value = d q + m`): per block `d * scale` FMA'd with the exact
    /// integer dot into accumulator `b % 2`, `m * sum` added to a scalar offset from +0.0.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn dot_dm_act16<const KIND: u8>(w: &[u8], q: &[i16], ss: &[f32]) -> f32 {
        let blocks = q.len() / 32;
        let (wp, qp, sp) = (w.as_ptr(), q.as_ptr(), ss.as_ptr());
        let (mut acc0, mut acc1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        let mut off = 0f32;
        // Q4_K: the super-block's 8 (d', m') pairs, decoded at its first block.
        let mut dms = ([0f32; 8], [0f32; 8]);
        macro_rules! step {
            ($b:expr, $acc:ident) => {{
                let b = $b;
                let (d, m) = if KIND == Q4_K {
                    if b % 8 == 0 {
                        dms = q4_k_dms(wp.add(b / 8 * 144));
                    }
                    (dms.0[b % 8], dms.1[b % 8])
                } else {
                    dm_at::<KIND>(wp, b)
                };
                let (scale, sum) = (*sp.add(2 * b), *sp.add(2 * b + 1));
                let dot = block_dot(unpack::<KIND>(wp, b), qp.add(b * 32));
                $acc = _mm256_fmadd_ps(_mm256_set1_ps(d * scale), dot, $acc);
                off += m * sum;
            }};
        }
        let mut b = super_blocks!(KIND, blocks, step, acc0, acc1);
        while b + 2 <= blocks {
            step!(b, acc0);
            step!(b + 1, acc1);
            b += 2;
        }
        if b < blocks {
            step!(b, acc0);
        }
        hsum(_mm256_add_ps(acc0, acc1)) + off
    }

    /// Q8_0 row x 16-bit activations (no offset term).
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn dot_q8_0_act16(w: &[u8], q: &[i16], ss: &[f32]) -> f32 {
        dot_d_act16::<Q8_0>(w, q, ss)
    }

    /// Q5_0 row x 16-bit activations: [`dot_q8_0_act16`] with the weights `q - 16` of
    /// [`q5_0`]. Lengths are checked by the caller (`w.len() == 22 * blocks`). Also the
    /// kernel of AVX-512 machines (every Q5_0 path routes there, so decode and batch agree).
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn dot_q5_0_act16(w: &[u8], q: &[i16], ss: &[f32]) -> f32 {
        dot_d_act16::<Q5_0>(w, q, ss)
    }

    /// Q6_K row x 16-bit activations: per 32-element block, the exact `sc0 * isum0 + sc1 *
    /// isum1` lanes of [`q6_k`]'s scaled weights, FMA'd with `d * scale` (`d` the
    /// super-block's). Lengths are checked by the caller (`q.len()` a multiple of 256,
    /// `w.len() == 210 * q.len() / 256`). Also the kernel of AVX-512 machines.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn dot_q6_k_act16(w: &[u8], q: &[i16], ss: &[f32]) -> f32 {
        dot_d_act16::<Q6_K>(w, q, ss)
    }

    /// The formats without an offset term (`value = d * q`): per block
    /// `d * scale` FMA'd with the exact integer dot into accumulator `b % 2`.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn dot_d_act16<const KIND: u8>(w: &[u8], q: &[i16], ss: &[f32]) -> f32 {
        let blocks = q.len() / 32;
        let (wp, qp, sp) = (w.as_ptr(), q.as_ptr(), ss.as_ptr());
        let (mut acc0, mut acc1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        macro_rules! step {
            ($b:expr, $acc:ident) => {{
                let b = $b;
                let d = f16_at(wp.add(d_at(KIND, b)));
                let dot = block_dot(unpack::<KIND>(wp, b), qp.add(b * 32));
                $acc = _mm256_fmadd_ps(_mm256_set1_ps(d * *sp.add(2 * b)), dot, $acc);
            }};
        }
        let mut b = super_blocks!(KIND, blocks, step, acc0, acc1);
        while b + 2 <= blocks {
            step!(b, acc0);
            step!(b + 1, acc1);
            b += 2;
        }
        if b < blocks {
            step!(b, acc0);
        }
        hsum(_mm256_add_ps(acc0, acc1))
    }

    /// Multi-row twin of the dots above: see `avx512::act16_rows` (same contract).
    ///
    /// # Safety
    /// AVX2, FMA, F16C; as `avx512::act16_rows`.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn act16_rows(
        w: &QMatrix,
        rows: Range<usize>,
        act: &ActBatch<'_>,
        p: &mut [f32],
        off: &mut [f32],
        out: OutPtr,
    ) {
        let (m, mp, blocks, k, n) = (act.m, act.mp, act.blocks, act.k, w.rows);
        let kind = kind(w.ty);
        let offset = has_offset(kind);
        for j in rows.clone() {
            let row = w.row(j).as_ptr();
            super::prefetch_row(w, j + super::PREFETCH_ROWS, rows.end);
            prepare(row, kind, act, p.as_mut_ptr(), off.as_mut_ptr());
            let (pp, y) = (p.as_ptr(), out.get().add(j));
            let mut i = 0;
            while i < m {
                let na = (m - i).min(4);
                let (q, pi, yi) = (act.q.as_ptr().add(i * k), pp.add(i), y.add(i * n));
                let r: &[f32] = match (kind, na) {
                    (Q4_1, 4) => &tile::<4, Q4_1>(row, blocks, q, k, pi, mp),
                    (Q4_1, 3) => &tile::<3, Q4_1>(row, blocks, q, k, pi, mp),
                    (Q4_1, 2) => &tile::<2, Q4_1>(row, blocks, q, k, pi, mp),
                    (Q4_1, _) => &tile::<1, Q4_1>(row, blocks, q, k, pi, mp),
                    (Q5_0, 4) => &tile::<4, Q5_0>(row, blocks, q, k, pi, mp),
                    (Q5_0, 3) => &tile::<3, Q5_0>(row, blocks, q, k, pi, mp),
                    (Q5_0, 2) => &tile::<2, Q5_0>(row, blocks, q, k, pi, mp),
                    (Q5_0, _) => &tile::<1, Q5_0>(row, blocks, q, k, pi, mp),
                    (Q6_K, 4) => &tile::<4, Q6_K>(row, blocks, q, k, pi, mp),
                    (Q6_K, 3) => &tile::<3, Q6_K>(row, blocks, q, k, pi, mp),
                    (Q6_K, 2) => &tile::<2, Q6_K>(row, blocks, q, k, pi, mp),
                    (Q6_K, _) => &tile::<1, Q6_K>(row, blocks, q, k, pi, mp),
                    (Q4_K, 4) => &tile::<4, Q4_K>(row, blocks, q, k, pi, mp),
                    (Q4_K, 3) => &tile::<3, Q4_K>(row, blocks, q, k, pi, mp),
                    (Q4_K, 2) => &tile::<2, Q4_K>(row, blocks, q, k, pi, mp),
                    (Q4_K, _) => &tile::<1, Q4_K>(row, blocks, q, k, pi, mp),
                    (_, 4) => &tile::<4, Q8_0>(row, blocks, q, k, pi, mp),
                    (_, 3) => &tile::<3, Q8_0>(row, blocks, q, k, pi, mp),
                    (_, 2) => &tile::<2, Q8_0>(row, blocks, q, k, pi, mp),
                    (_, _) => &tile::<1, Q8_0>(row, blocks, q, k, pi, mp),
                };
                for (a, &v) in r.iter().enumerate() {
                    // Q8_0 / Q5_0 / Q6_K add no offset (adding 0.0 would turn -0.0 into +0.0).
                    let v = if offset { v + off[i + a] } else { v };
                    yi.add(a * n).write(v);
                }
                i += na;
            }
        }
    }

    /// `p[b * mp + i] = d_b * scale_{i,b}`, `off[i] = sum_b m_b * sum_{i,b}` (Q4_1), 8
    /// activation rows per vector; the same f32 operations as the single-row kernels.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn prepare(row: *const u8, kind: u8, act: &ActBatch<'_>, p: *mut f32, off: *mut f32) {
        let (mp, blocks) = (act.mp, act.blocks);
        let offset = has_offset(kind);
        let (st, su) = (act.st.as_ptr(), act.su.as_ptr());
        // Q4_K: every block's (d', m') decoded once per weight row.
        let mut q4k = [[0f32; 8]; 2 * super::MAX_STACK_BLOCKS / 8];
        if kind == Q4_K {
            for s in 0..blocks / 8 {
                (q4k[2 * s], q4k[2 * s + 1]) = q4_k_dms(row.add(s * 144));
            }
        }
        for c in (0..mp).step_by(8) {
            let mut o = _mm256_setzero_ps();
            for b in 0..blocks {
                let at = b * mp + c;
                let (dv, mv) = match kind {
                    Q4_1 => dm_at::<Q4_1>(row, b),
                    Q4_K => (q4k[b / 8 * 2][b % 8], q4k[b / 8 * 2 + 1][b % 8]),
                    _ => (f16_at(row.add(d_at(kind, b))), 0.0),
                };
                let d = _mm256_set1_ps(dv);
                _mm256_storeu_ps(p.add(at), _mm256_mul_ps(d, _mm256_loadu_ps(st.add(at))));
                if offset {
                    let mm = _mm256_set1_ps(mv);
                    o = _mm256_add_ps(o, _mm256_mul_ps(mm, _mm256_loadu_ps(su.add(at))));
                }
            }
            _mm256_storeu_ps(off.add(c), o);
        }
    }

    /// One weight row against `NA <= 4` activation rows (8 accumulators: 16 ymm
    /// registers hold them, the two weight halves and the temporaries only barely).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn tile<const NA: usize, const KIND: u8>(
        w: *const u8,
        blocks: usize,
        q: *const i16,
        k: usize,
        p: *const f32,
        mp: usize,
    ) -> [f32; NA] {
        let (mut acc0, mut acc1) = ([_mm256_setzero_ps(); NA], [_mm256_setzero_ps(); NA]);
        macro_rules! step {
            ($b:expr, $acc:ident) => {{
                let b = $b;
                let wv = unpack::<KIND>(w, b);
                for a in 0..NA {
                    let dot = block_dot(wv, q.add(a * k + b * 32));
                    $acc[a] = _mm256_fmadd_ps(_mm256_set1_ps(*p.add(b * mp + a)), dot, $acc[a]);
                }
            }};
        }
        let mut b = super_blocks!(KIND, blocks, step, acc0, acc1);
        while b + 2 <= blocks {
            step!(b, acc0);
            step!(b + 1, acc1);
            b += 2;
        }
        if b < blocks {
            step!(b, acc0);
        }
        let mut r = [0f32; NA];
        for a in 0..NA {
            r[a] = hsum(_mm256_add_ps(acc0[a], acc1[a]));
        }
        r
    }

    /// f32 weight row against all `m` rows of `x`, 2 at a time (see `avx512::f32_rows`).
    ///
    /// # Safety
    /// AVX2 + FMA; as `avx512::f32_rows`.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn f32_rows(w: *const f32, x: *const f32, k: usize, m: usize, y: *mut f32, n: usize) {
        let mut i = 0;
        while i < m {
            let na = (m - i).min(2);
            let xi = x.add(i * k);
            let r: &[f32] = if na == 2 { &dot_f32_rows::<2>(w, xi, k) } else { &dot_f32_rows::<1>(w, xi, k) };
            for (a, &v) in r.iter().enumerate() {
                y.add((i + a) * n).write(v);
            }
            i += na;
        }
    }

    /// `NA` f32 dots: 8-wide chunks into accumulator `c % 4`, `(a0 + a1) + (a2 + a3)`,
    /// [`hsum`], then the `k % 8` tail added one product at a time.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn dot_f32_rows<const NA: usize>(w: *const f32, x: *const f32, k: usize) -> [f32; NA] {
        let z = [_mm256_setzero_ps(); NA];
        let (mut a0, mut a1, mut a2, mut a3) = (z, z, z, z);
        let full = k / 8;
        macro_rules! step {
            ($c:expr, $acc:ident) => {{
                let c = $c;
                let wv = _mm256_loadu_ps(w.add(c * 8));
                for a in 0..NA {
                    $acc[a] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x.add(a * k + c * 8)), $acc[a]);
                }
            }};
        }
        let mut c = 0;
        while c + 4 <= full {
            step!(c, a0);
            step!(c + 1, a1);
            step!(c + 2, a2);
            step!(c + 3, a3);
            c += 4;
        }
        if c < full {
            step!(c, a0);
        }
        if c + 1 < full {
            step!(c + 1, a1);
        }
        if c + 2 < full {
            step!(c + 2, a2);
        }
        let mut r = [0f32; NA];
        for a in 0..NA {
            let mut v = hsum(_mm256_add_ps(_mm256_add_ps(a0[a], a1[a]), _mm256_add_ps(a2[a], a3[a])));
            for c in full * 8..k {
                v += w.add(c).read_unaligned() * *x.add(a * k + c);
            }
            r[a] = v;
        }
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::{can_quantize, dequantize_row};
    use crate::wq::{dot_row_act16, matmul_wq};

    fn data(n: usize, seed: u32) -> Vec<f32> {
        let mut s = seed.wrapping_mul(2_654_435_761).wrapping_add(1);
        (0..n)
            .map(|_| {
                s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                ((s >> 8) as f32 / (1u32 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    }

    /// A `rows x cols` matrix of `ty` and its dequantized f32 values. Types without a
    /// quantizer (the K types) get random bytes whose trailing f16 scale is small and
    /// finite (Q6_K's layout; the other K types are not used here).
    fn matrix(ty: GgmlType, rows: usize, cols: usize, seed: u32) -> (QMatrix, Vec<f32>) {
        let w = data(rows * cols, seed);
        let q = if can_quantize(ty) {
            QMatrix::quantize(ty, rows, cols, &w).unwrap()
        } else {
            let row_bytes = cols / ty.block_size() * ty.type_size();
            let mut bytes: Vec<u8> =
                data(rows * row_bytes, seed + 1).iter().map(|v| ((v + 1.0) * 127.0) as u8).collect();
            for blk in bytes.chunks_mut(ty.type_size()) {
                let n = blk.len();
                if ty == GgmlType::Q4K {
                    // Q4_K's d and dmin lead the block.
                    blk[..2].copy_from_slice(&half::f16::from_f32(0.01).to_le_bytes());
                    blk[2..4].copy_from_slice(&half::f16::from_f32(0.003).to_le_bytes());
                } else {
                    blk[n - 2..].copy_from_slice(&half::f16::from_f32(0.01).to_le_bytes());
                }
            }
            QMatrix::new(ty, rows, cols, bytes).unwrap()
        };
        let mut deq = vec![0f32; rows * cols];
        for (r, d) in deq.chunks_mut(cols).enumerate() {
            dequantize_row(ty, q.row(r), d).unwrap();
        }
        (q, deq)
    }

    /// Activations with a spread of magnitudes across rows and blocks (and an all-zero
    /// row), so block scales differ and the offset terms matter.
    fn acts(m: usize, k: usize, seed: u32) -> Vec<f32> {
        let mut x = data(m * k, seed);
        for (i, row) in x.chunks_mut(k).enumerate() {
            let s = [1.0, 0.01, 30.0, 0.5, 0.0][i % 5];
            for (c, v) in row.iter_mut().enumerate() {
                *v *= s * (1.0 + (c / 32 % 3) as f32);
            }
        }
        x
    }

    const MS: [usize; 10] = [1, 2, 3, 4, 5, 7, 8, 13, 32, 33];

    /// (type, n, k) cases: odd block counts (the even/odd accumulator tail), SmolLM2's
    /// widths, a K type, f32 with k not a multiple of the vector width, and a Q4_1 row
    /// too long for the stack path.
    fn cases() -> Vec<(GgmlType, usize, usize)> {
        vec![
            (GgmlType::Q4_1, 37, 96),
            (GgmlType::Q4_1, 19, 576),
            // More weight rows than a chunk of the few-rows GEMV path (GEMV_CHUNK_ROWS).
            (GgmlType::Q4_1, 150, 64),
            (GgmlType::Q8_0, 37, 96),
            (GgmlType::Q8_0, 19, 576),
            (GgmlType::Q5_0, 37, 96),
            (GgmlType::Q5_0, 19, 896),
            (GgmlType::Q6K, 9, 512),
            (GgmlType::Q6K, 6, 256),
            (GgmlType::Q6K, 7, 4864),
            (GgmlType::Q4K, 9, 512),
            (GgmlType::Q4K, 7, 4864),
            (GgmlType::F32, 23, 100),
            (GgmlType::F32, 7, 576),
            (GgmlType::F16, 5, 64),
            (GgmlType::Q4_0, 5, 64),
        ]
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|f| f.to_bits()).collect()
    }

    #[test]
    fn every_row_is_bit_identical_to_its_single_row_call() {
        for isa in Isa::available() {
            for (ty, n, k) in cases() {
                let (w, _) = matrix(ty, n, k, 3);
                for m in MS {
                    let x = acts(m, k, 10 + m as u32);
                    let mut y = vec![0f32; m * n];
                    matmul_wq_invariant_with(isa, &x, &w, &mut y, m).unwrap();
                    for i in 0..m {
                        let mut y1 = vec![0f32; n];
                        matmul_wq_invariant_with(isa, &x[i * k..(i + 1) * k], &w, &mut y1, 1).unwrap();
                        assert_eq!(bits(&y[i * n..(i + 1) * n]), bits(&y1), "{isa} {ty} {n}x{k} m={m} row {i}");
                    }
                }
            }
        }
    }

    #[test]
    fn a_row_keeps_its_bits_whatever_its_neighbours_and_position() {
        // The same request row at different positions of batches of different sizes
        // with different other rows, on the pool and serially.
        for isa in Isa::available() {
            for (ty, n, k) in [
                (GgmlType::Q4_1, 100, 576),
                (GgmlType::Q8_0, 100, 576),
                (GgmlType::Q5_0, 100, 896),
                (GgmlType::Q6K, 100, 768),
                (GgmlType::Q4K, 100, 768),
                (GgmlType::F32, 50, 576),
            ] {
                let (w, _) = matrix(ty, n, k, 4);
                let probe = acts(1, k, 99);
                let mut want = vec![0f32; n];
                matmul_wq_invariant_with(isa, &probe, &w, &mut want, 1).unwrap();
                for (m, pos, seed) in [(2, 1, 1), (9, 4, 2), (32, 31, 3), (33, 0, 4), (17, 8, 5)] {
                    let mut x = acts(m, k, seed);
                    x[pos * k..(pos + 1) * k].copy_from_slice(&probe);
                    let mut y = vec![0f32; m * n];
                    matmul_wq_invariant_with(isa, &x, &w, &mut y, m).unwrap();
                    assert_eq!(bits(&y[pos * n..(pos + 1) * n]), bits(&want), "{isa} {ty} m={m} pos={pos}");
                    let mut ys = vec![0f32; m * n];
                    pool::run_serially(|| matmul_wq_invariant_with(isa, &x, &w, &mut ys, m)).unwrap();
                    assert_eq!(bits(&ys), bits(&y), "{isa} {ty} m={m}: serial vs pool");
                }
            }
        }
    }

    #[test]
    fn single_row_equals_matmul_wq_and_the_decode_dot() {
        for (ty, n, k) in cases() {
            let (w, _) = matrix(ty, n, k, 5);
            let x = acts(1, k, 7);
            let (mut a, mut b) = (vec![0f32; n], vec![0f32; n]);
            matmul_wq_invariant(&x, &w, &mut a, 1).unwrap();
            matmul_wq(&x, &w, &mut b, 1).unwrap();
            assert_eq!(bits(&a), bits(&b), "{ty}");
            if matches!(ty, GgmlType::Q4_1 | GgmlType::Q8_0 | GgmlType::Q5_0 | GgmlType::Q6K | GgmlType::Q4K) {
                // The single-row Act16 dot of the active ISA (today's decode kernel).
                let (mut q, mut ss) = (vec![0i16; k], vec![0f32; 2 * k / 32]);
                let act = Act16::quantize(&x, &mut q, &mut ss);
                for (j, &v) in a.iter().enumerate() {
                    let d = dot_row_act16(Isa::active(), ty, w.row(j), &act).unwrap();
                    assert_eq!(v.to_bits(), d.to_bits(), "{ty} row {j}");
                }
            }
        }
    }

    #[test]
    fn every_isa_matches_scalar_and_the_f64_reference() {
        for (ty, n, k) in cases().into_iter().chain([
            (GgmlType::Q4_1, 3, 32 * (MAX_STACK_BLOCKS + 1)),
            (GgmlType::Q5_0, 3, 32 * (MAX_STACK_BLOCKS + 1)),
            (GgmlType::Q6K, 3, 256 * (MAX_STACK_BLOCKS / 8 + 1)),
            (GgmlType::Q4K, 3, 256 * (MAX_STACK_BLOCKS / 8 + 1)),
        ]) {
            let (w, deq) = matrix(ty, n, k, 6);
            for m in [1, 5, 32] {
                let x = acts(m, k, 20 + m as u32);
                let mut reference = vec![0f32; m * n];
                matmul_wq_invariant_with(Isa::Scalar, &x, &w, &mut reference, m).unwrap();
                // 16-bit activations round each to within 2^-16 of its block's largest.
                let tol =
                    if matches!(ty, GgmlType::Q4_1 | GgmlType::Q8_0 | GgmlType::Q5_0 | GgmlType::Q6K | GgmlType::Q4K) {
                        4e-5
                    } else {
                        1e-5
                    };
                for i in 0..m {
                    for j in 0..n {
                        let terms = (0..k).map(|c| x[i * k + c] as f64 * deq[j * k + c] as f64);
                        let exact: f64 = terms.clone().sum();
                        let mag: f64 = terms.map(f64::abs).sum();
                        let r = reference[i * n + j] as f64;
                        assert!(
                            (r - exact).abs() <= tol * mag + 1e-6,
                            "{ty} {n}x{k} m={m} ({i},{j}): scalar {r} vs exact {exact}"
                        );
                    }
                }
                for isa in Isa::available() {
                    let mut y = vec![0f32; m * n];
                    matmul_wq_invariant_with(isa, &x, &w, &mut y, m).unwrap();
                    for (e, (&a, &b)) in y.iter().zip(&reference).enumerate() {
                        let (i, j) = (e / n, e % n);
                        let mag: f32 = (0..k).map(|c| (x[i * k + c] * deq[j * k + c]).abs()).sum();
                        assert!(
                            (a - b).abs() <= 1e-5 * mag + 1e-6,
                            "{isa} {ty} {n}x{k} m={m} ({i},{j}): {a} vs scalar {b}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn f32_invariant_is_invariant_and_accurate() {
        for isa in Isa::available() {
            for k in [1, 7, 8, 15, 16, 17, 33, 100, 576] {
                let n = 11;
                let w = data(n * k, 1);
                for m in MS {
                    let x = acts(m, k, m as u32);
                    let mut y = vec![0f32; m * n];
                    matmul_f32_invariant_with(isa, &x, &w, &mut y, m, k, n).unwrap();
                    for i in 0..m {
                        let mut y1 = vec![0f32; n];
                        matmul_f32_invariant_with(isa, &x[i * k..(i + 1) * k], &w, &mut y1, 1, k, n).unwrap();
                        assert_eq!(bits(&y[i * n..(i + 1) * n]), bits(&y1), "{isa} k={k} m={m} row {i}");
                        for j in 0..n {
                            let terms = (0..k).map(|c| x[i * k + c] as f64 * w[j * k + c] as f64);
                            let exact: f64 = terms.clone().sum();
                            let mag: f64 = terms.map(f64::abs).sum();
                            assert!(
                                (y1[j] as f64 - exact).abs() <= 1e-6 * mag + 1e-30,
                                "{isa} k={k} ({i},{j}): {} vs {exact}",
                                y1[j]
                            );
                        }
                    }
                }
            }
        }
    }

    /// One fork-join over q/k/v-shaped matrices (and a Q8_0 one) gives each output the bits
    /// of its own decode matmul, on every ISA.
    #[test]
    fn a_group_equals_its_matrices_one_by_one() {
        let k = 576;
        let mats: Vec<QMatrix> = [
            (GgmlType::Q4_1, 576),
            (GgmlType::Q4_1, 192),
            (GgmlType::Q8_0, 190),
            (GgmlType::Q4_1, 5),
            (GgmlType::Q5_0, 67),
            (GgmlType::Q5_0, 576),
        ]
        .iter()
        .enumerate()
        .map(|(s, &(ty, n))| matrix(ty, n, k, 40 + s as u32).0)
        .collect();
        let x = acts(1, k, 9);
        for isa in Isa::available() {
            // The first four, then a group with Q5_0 ones mixed in.
            for group in [&mats[..4], &mats[2..]] {
                let mut outs: Vec<Vec<f32>> = group.iter().map(|w| vec![f32::NAN; w.rows]).collect();
                let ws: Vec<&QMatrix> = group.iter().collect();
                let mut ys: Vec<&mut [f32]> = outs.iter_mut().map(|v| v.as_mut_slice()).collect();
                matmul_wq_group_with(isa, &x, &ws, &mut ys).unwrap();
                for (w, got) in group.iter().zip(&outs) {
                    let mut want = vec![0f32; w.rows];
                    matmul_wq_invariant_with(isa, &x, w, &mut want, 1).unwrap();
                    assert_eq!(bits(got), bits(&want), "{} {}x{} at {isa}", w.ty, w.rows, w.cols);
                }
            }
        }
        // Q6_K and Q4_K (whole super-blocks: k = 768) mixed with Q5_0 and Q8_0.
        let k6 = 768;
        let mats6: Vec<QMatrix> =
            [(GgmlType::Q6K, 67), (GgmlType::Q5_0, 100), (GgmlType::Q4K, 30), (GgmlType::Q6K, 256), (GgmlType::Q4K, 5)]
                .iter()
                .enumerate()
                .map(|(s, &(ty, n))| matrix(ty, n, k6, 60 + s as u32).0)
                .collect();
        let x6 = acts(1, k6, 19);
        for isa in Isa::available() {
            for group in [&mats6[..4], &mats6[1..], &mats6[..1], &mats6[4..]] {
                let mut outs: Vec<Vec<f32>> = group.iter().map(|w| vec![f32::NAN; w.rows]).collect();
                let ws: Vec<&QMatrix> = group.iter().collect();
                let mut ys: Vec<&mut [f32]> = outs.iter_mut().map(|v| v.as_mut_slice()).collect();
                matmul_wq_group_with(isa, &x6, &ws, &mut ys).unwrap();
                for (w, got) in group.iter().zip(&outs) {
                    let mut want = vec![0f32; w.rows];
                    matmul_wq_invariant_with(isa, &x6, w, &mut want, 1).unwrap();
                    assert_eq!(bits(got), bits(&want), "{} {}x{} at {isa}", w.ty, w.rows, w.cols);
                }
            }
        }
        // Mismatched shapes are errors, not panics.
        let mut short = vec![0f32; 3];
        assert!(matmul_wq_group(&x, &[&mats[0]], &mut [short.as_mut_slice()]).is_err());
        assert!(matmul_wq_group(&x[..64], &[&mats[0]], &mut [vec![0f32; 576].as_mut_slice()]).is_err());
        assert!(matmul_wq_group(&x, &[&mats[0], &mats[1]], &mut [vec![0f32; 576].as_mut_slice()]).is_err());
        let five: Vec<&QMatrix> = std::iter::repeat_n(&mats[3], MAX_GROUP + 1).collect();
        let mut bufs = vec![vec![0f32; 5]; MAX_GROUP + 1];
        let mut ys: Vec<&mut [f32]> = bufs.iter_mut().map(|v| v.as_mut_slice()).collect();
        assert!(matmul_wq_group(&x, &five, &mut ys).is_err(), "more than MAX_GROUP matrices");
    }

    #[test]
    fn shape_errors_are_errors() {
        let (w, _) = matrix(GgmlType::Q4_1, 4, 64, 1);
        let mut y = vec![0f32; 8];
        assert!(matmul_wq_invariant(&[0.0; 127], &w, &mut y, 2).is_err());
        assert!(matmul_wq_invariant(&[0.0; 128], &w, &mut y[..7], 2).is_err());
        assert!(matmul_wq_invariant(&[0.0; 128], &w, &mut y, usize::MAX).is_err());
        assert!(matmul_wq_invariant(&[], &w, &mut [], 0).is_ok());
        assert!(matmul_f32_invariant(&[0.0; 6], &[0.0; 6], &mut [0.0; 4], 2, 3, 2).is_ok());
        assert!(matmul_f32_invariant(&[0.0; 5], &[0.0; 6], &mut [0.0; 4], 2, 3, 2).is_err());
        assert!(matmul_f32_invariant(&[0.0; 6], &[0.0; 6], &mut [0.0; 4], 2, 3, 3).is_err());
        assert!(matmul_f32_invariant(&[0.0; 6], &[0.0; 6], &mut [0.0; 3], 2, 3, 2).is_err());
        assert!(matmul_f32_invariant(&[0.0; 6], &[0.0; 6], &mut [0.0; 4], usize::MAX, 3, 2).is_err());
    }
}
