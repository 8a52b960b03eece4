//! Weight-only quantization: `y = x @ W^T` with `W` kept in GGML blocks and `x` in f32.
//!
//! Unlike [`crate::linear::q8::matmul_q`], which quantizes activations to 8-bit blocks as
//! llama.cpp does, these kernels dequantize weights in registers and multiply by the f32
//! activations. The weight bytes read per token are the same (the memory-bound decode
//! costs the same), but no activation rounding is added: on SmolLM2 Q4_1, teacher-forced
//! argmax agreement with the f32 PyTorch reference is ~100% instead of ~96% with 8-bit
//! activations (see BENCHMARKS.md / the engine issue's closing note).
//!
//! * decode (`m == 1`): a fused dequantize-and-dot per weight row, rows split over threads;
//!   for Q4_1/Q8_0/Q5_0/Q6_K/Q4_K the activation row is first quantized to 16-bit blocks ([`Act16`]),
//!   exact integer products with error under 2^-16 of each block's largest activation
//!   (100% argmax agreement on the goldens through the decode path, see
//!   `tests/native_agreement.rs`), for half the vector work of widening weights to f32;
//! * prefill (`m > 1`): each task dequantizes a tile of weight rows into an L2-sized f32
//!   buffer and multiplies it with all of `x` through `gemm`.
//!   Not batch invariant (gemm's reduction order depends on `m`): a continuous-batching
//!   decode step uses [`matmul_wq_invariant`] (`crate::linear::invariant`), whose `m == 1` path is the
//!   decode path here, and whose rows are bit-identical to it for any `m`.

use std::cell::RefCell;

use super::decode::dequantize_row_fast;
use super::f32::gemm_x_wt;
use super::invariant::matmul_wq_invariant_with;
use super::qmatrix::QMatrix;
use crate::pool;
use crate::pool::OutPtr;
use crate::quant::Isa;
use crate::TensorError;

/// Weight rows per prefill task: 64 rows x 1536 columns of f32 is 384 KiB, inside a
/// 1-2 MiB L2 (Zen 4: 1 MiB, Sapphire Rapids: 2 MiB), next to the activations it is
/// multiplied with.
const PREFILL_TILE_ROWS: usize = 64;

thread_local! {
    static SCRATCH: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// y[m, n] = x[m, k] @ W^T for a block-quantized `W` (`n = w.rows`, `k = w.cols`), with f32
/// activations.
pub fn matmul_wq(x: &[f32], w: &QMatrix, y: &mut [f32], m: usize) -> Result<(), TensorError> {
    let (n, k) = (w.rows, w.cols);
    if x.len() != m * k || y.len() != m * n {
        return Err(TensorError::Shape {
            op: "matmul_wq",
            detail: format!("x has {} elements and y {}, expected {m}x{k} and {m}x{n}", x.len(), y.len()),
        });
    }
    if m == 0 || n == 0 {
        return Ok(());
    }
    if m == 1 {
        // Decode: the batch-invariant kernels' single-row path (one fused dot per weight
        // row), so a sequence decoded alone and one decoded in a batch get the same bits.
        return matmul_wq_invariant_with(Isa::active(), x, w, y, 1);
    }
    if Isa::active() >= Isa::Amx && super::amx::can_take(w, m) {
        // Q4_1 / Q8_0 / Q5_0 on AMX tiles: 16-bit activation blocks, the arithmetic of
        // dot_row_act16_scalar (crate::linear::amx).
        return matmul_wq_prefill_group(x, &[w], &mut [y], m);
    }
    let tiles = n.div_ceil(PREFILL_TILE_ROWS);
    let out = OutPtr(y.as_mut_ptr());
    pool::try_run(tiles, &|t| {
        let j0 = t * PREFILL_TILE_ROWS;
        let rows = PREFILL_TILE_ROWS.min(n - j0);
        SCRATCH.with(|s| {
            let mut s = s.borrow_mut();
            s.resize(PREFILL_TILE_ROWS * k, 0.0);
            for r in 0..rows {
                dequantize_row_fast(w.ty, w.row(j0 + r), &mut s[r * k..(r + 1) * k])?;
            }
            // SAFETY: x is m x k; the tile holds `rows` dequantized rows of k; the
            // destination is columns j0..j0+rows of y (m x n), disjoint between tasks.
            unsafe { gemm_x_wt(m, rows, k, out.get().add(j0), n, x.as_ptr(), k, s.as_ptr(), k) };
            Ok(())
        })
    })?;
    w.apply_tensor_scale(y);
    Ok(())
}

/// Whether prefill of `m` rows through `w` (against `k` activations) can join a grouped
/// [`matmul_wq_prefill_group`]: Q4_1 / Q8_0 / Q5_0 on AMX tiles ([`crate::linear::amx`]).
pub fn can_group_prefill(w: &QMatrix, k: usize, m: usize) -> bool {
    w.cols == k && Isa::active() >= Isa::Amx && super::amx::can_take(w, m)
}

/// Prefill (`m` rows of `x`) through several matrices that share it (q/k/v, gate/up), each
/// taken by [`can_group_prefill`]: the activations are quantized once and all matrices run
/// as one fork-join. Each output is bit-identical to [`matmul_wq`] on its matrix alone.
pub fn matmul_wq_prefill_group(x: &[f32], ws: &[&QMatrix], ys: &mut [&mut [f32]], m: usize) -> Result<(), TensorError> {
    super::amx::matmul_wq_amx_group(x, ws, ys, m)?;
    for (w, y) in ws.iter().zip(ys.iter_mut()) {
        w.apply_tensor_scale(y);
    }
    Ok(())
}
