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
//! Qwen2.5-0.5B's), Q6_K, Q4_K, Q4_0 and Q5_K each activation row is quantized row-locally to 16-bit blocks ([`Act16`], exactly as the single-row decode
//! does), and multi-row kernels unpack each weight block once and `vpmaddwd` it against
//! up to 10 (AVX-512; Q5_0, Q6_K, Q4_K, Q4_0 and Q5_K take the AVX2 arithmetic in every path on
//! AVX-512 machines, two blocks per 512-bit vector) or 4 (AVX2) activation rows, each row keeping its own accumulators
//! in exactly the order of the single-row kernel ([`crate::linear::dot_row_act16`]). The
//! per-block scale products `d_w * scale_x` and the Q4_1 offset sums `sum_b m_w * sum(x_b)`
//! are computed vectorized across activation rows (lanes = rows, so each lane does the
//! same sequence of f32 operations as the single-row kernel), once per weight row. Tasks
//! own bands of weight rows and run all `m` activation rows over each weight row while it
//! is in L1, so every weight byte is read from memory once per call.
//!
//! `m == 1` is the decode path of [`crate::linear::matmul_wq`] (the same code), so a single
//! sequence keeps its numbers.

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
mod rows;
#[cfg(test)]
mod tests;

use std::cell::RefCell;
use std::mem::MaybeUninit;
use std::ops::Range;

use self::rows::*;
use super::act16::{zeroed_prefix, Act16};
use super::decode::{dot_row, dot_row_act16_scalar};
use super::dispatch::{avx512_rows_kernel, can_group, gemv_max_rows, MAX_STACK_BLOCKS};
use super::gemv::gemv_rows;
use super::qmatrix::QMatrix;
use crate::pool;
use crate::pool::OutPtr;
use crate::quant::Isa;
use crate::{GgmlType, TensorError};

/// Tasks per compute thread: several, so a thread that starts late (woken from sleep,
/// or preempted) is balanced by the others claiming more.
const TASKS_PER_THREAD: usize = 4;

/// Least work per task, in weight rows x activation rows (~1-3 µs on a 576-wide row), so
/// the claim and the cache-line traffic of the output stay negligible. At `m == 1` this
/// is 16 weight rows, the old decode split.
const MIN_TASK_ROW_DOTS: usize = 16;

/// Activation-side scratch of the calling thread (quantized rows, transposed scales).
#[derive(Default)]
struct BatchScratch {
    q: Vec<i16>,
    ss: Vec<f32>,
    st: Vec<f32>,
    su: Vec<f32>,
    sums: Vec<f32>,
    /// Float weights' activation rows moved to a 64-byte boundary ([`aligned64`]).
    aligned: Vec<f32>,
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
    w.check_io("matmul_wq_invariant", x, y, m)?;
    if m == 0 || n == 0 {
        return Ok(());
    }
    if can_group(w, k) {
        // Decode: a group of one matrix (the activation row quantized to Act16 on the stack,
        // then the GEMV, each row bit-identical to decode::dot_row_act16). Allocates nothing.
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

/// Most matrices one [`matmul_wq_group`] call takes (q/k/v need 3): the bookkeeping lives
/// in fixed arrays, so a decode step allocates nothing.
pub const MAX_GROUP: usize = 4;

/// Decode (one activation row `x`) through several weight matrices that share it, as one
/// fork-join: `ys[i] = x @ ws[i]^T`. `x` is quantized once and the rows of all matrices
/// are split into one set of tasks, so q/k/v (or gate/up) cost one synchronisation of the
/// compute threads instead of three (or two). Every output is bit-identical to
/// [`matmul_wq_invariant`] (and so to [`crate::linear::matmul_wq`]) on the same matrix: the
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
                unsafe { gemv_rows(isa, w, lo - starts[i]..hi - starts[i], &act, outs[i])? };
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
    // Transposed scales and block sums: st[lane_at(i, b, blocks)] is row i's scale of
    // block b; lanes past m stay zero.
    // (LANES of slack: a chunk starting at a multiple of CHUNK_ROWS reads a whole vector.)
    s.st.clear();
    s.st.resize(blocks * mp + LANES, 0.0);
    s.su.clear();
    s.su.resize(blocks * mp + LANES, 0.0);
    // Rows are quantized on the pool (each row alone, by the one-row quantizer, so which
    // thread does it cannot change a bit).
    let (qp, ssp, stp, sup) =
        (OutPtr(s.q.as_mut_ptr()), OutPtr(s.ss.as_mut_ptr()), OutPtr(s.st.as_mut_ptr()), OutPtr(s.su.as_mut_ptr()));
    // Which kernels this call runs, decided once: few rows go through the decode GEMV, more
    // through the multi-row kernels (`Some(pairs)`: the 512-bit ones). The pairs kernels read
    // each pair of blocks as it lies after `arrange_pairs`, the others as quantized.
    #[cfg(target_arch = "x86_64")]
    let (gemv, rows_kernel) = (isa >= Isa::Avx2 && m <= gemv_max_rows(isa, w.ty), avx512_rows_kernel(isa, w.ty));
    #[cfg(target_arch = "x86_64")]
    let arrange = !gemv && rows_kernel == Some(true);
    #[cfg(not(target_arch = "x86_64"))]
    let arrange = false;
    pool::run(m.div_ceil(QUANTIZE_ROWS_PER_TASK), &|t| {
        for i in t * QUANTIZE_ROWS_PER_TASK..((t + 1) * QUANTIZE_ROWS_PER_TASK).min(m) {
            // SAFETY: q holds m x k and ss m x 2*blocks elements (resized above), st and su
            // blocks x mp (+ slack) with i < m <= mp; row i's slices of q and ss and the
            // entries lane_at(i, b, blocks) of st and su are written by this task alone.
            unsafe {
                let q = std::slice::from_raw_parts_mut(qp.get().add(i * k), k);
                let ss = std::slice::from_raw_parts_mut(ssp.get().add(i * 2 * blocks), 2 * blocks);
                Act16::quantize(&x[i * k..(i + 1) * k], q, ss);
                if arrange {
                    arrange_pairs(q);
                }
                for b in 0..blocks {
                    *stp.get().add(lane_at(i, b, blocks)) = ss[2 * b];
                    *sup.get().add(lane_at(i, b, blocks)) = ss[2 * b + 1];
                }
            }
        }
    });
    let s = &*s;
    let act = ActBatch { q: &s.q, st: &s.st, su: &s.su, m, k, blocks };
    let out = OutPtr(y.as_mut_ptr());
    bands(n, m, &|rows| {
        #[cfg(target_arch = "x86_64")]
        if gemv {
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
                    unsafe { gemv_rows(isa, w, chunk.clone(), &a, OutPtr(out.get().add(i * n)))? };
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
                // Types that run the AVX2 kernels at AVX-512 (`avx2_kernels_at`: Q5_0, Q6_K,
                // Q4_K, Q4_0 and Q5_K everywhere, Q4_1 on AMX CPUs) do so in every path (single row,
                // gemv, here), so decode and batch agree there too.
                // At AVX-512, Q4_1, Q5_0, Q6_K, Q4_K, Q4_0 and Q5_K compute that AVX2 arithmetic two blocks per
                // 512-bit vector (`avx512::act16_rows` with `pairs`, the same bits).
                unsafe {
                    match rows_kernel {
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

/// `x` where it starts on a 64-byte boundary, else a copy in `buf` that does: the float
/// kernels load activations a vector of 16 at a time, and each misaligned one spans two
/// cache lines (two loads; with 5 activation rows per weight row, 30% slower, measured with
/// `examples/stream_gemv`'s `XALIGN`). Large allocations start 16 bytes past a page.
fn aligned64<'a>(x: &'a [f32], buf: &'a mut Vec<f32>) -> &'a [f32] {
    if (x.as_ptr() as usize).is_multiple_of(64) {
        return x;
    }
    buf.clear();
    buf.resize(x.len() + 16, 0.0);
    let skip = (64 - buf.as_ptr() as usize % 64) % 64 / 4;
    buf[skip..skip + x.len()].copy_from_slice(x);
    &buf[skip..skip + x.len()]
}

/// Every other type (and Q4_1 / Q8_0 / Q5_0 / Q6_K / Q4_K / Q4_0 rows too long for the stack
/// path): F16 / BF16 weight rows through `quant::float_rows_band`, a band of weight rows against all activation rows at once;
/// the rest one [`dot_row`] per output, each against its own row and its own block sums.
fn generic(isa: Isa, x: &[f32], w: &QMatrix, y: &mut [f32], m: usize) -> Result<(), TensorError> {
    let (n, k) = (w.rows, w.cols);
    if matches!(w.ty, GgmlType::F16 | GgmlType::BF16) && k > 0 {
        // Float weights: each weight row widened once for all activation rows, every
        // output the one-row dot's bits (`quant::float_rows`, the kernel `dot_row` runs).
        let out = OutPtr(y.as_mut_ptr());
        let run = |x: &[f32]| {
            bands(n, m, &|rows| {
                let row_bytes = w.row_bytes();
                let band = &w.data[rows.start * row_bytes..rows.end * row_bytes];
                crate::quant::float_rows_band(isa, w.ty, band, x, k, |i, j, v| {
                    // SAFETY: i < m and rows.start + j < rows.end <= n; the band's columns
                    // belong to this task alone.
                    unsafe { out.get().add(i * n + rows.start + j).write(v) }
                });
                Ok(())
            })
        };
        return BATCH.with(|cell| match cell.try_borrow_mut() {
            Ok(mut s) => run(aligned64(x, &mut s.aligned)),
            Err(_) => run(aligned64(x, &mut Vec::new())),
        });
    }
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
