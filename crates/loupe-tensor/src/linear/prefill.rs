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
//!   for Q4_1/Q8_0/Q5_0/Q6_K/Q4_K/Q4_0/Q5_K the activation row is first quantized to 16-bit blocks ([`Act16`]),
//!   exact integer products with error under 2^-16 of each block's largest activation
//!   (100% argmax agreement on the goldens through the decode path, see
//!   `tests/native_agreement.rs`), for half the vector work of widening weights to f32;
//! * prefill (`m > 1`): AMX tiles where the CPU has them and the type is one they take;
//!   otherwise [`matmul_wq_prompt`]: on AVX-512, Q4_0 / Q4_1 / Q5_0 / Q8_0 through 16-bit
//!   activation panels (`vpdpwssd`, 16 output lanes per vector), every other case through
//!   [`crate::linear::matmul_wq_chain`] (16 weight rows dequantized into an f32 panel once,
//!   each output one FMA chain over `k`). That is also the batched engine's arithmetic for
//!   prompt rows, so a prompt's matmuls give the same bits alone and in a batch.

use super::invariant::matmul_wq_invariant_with;
use super::prompt16::matmul_wq_prompt;
use super::qmatrix::QMatrix;
use crate::quant::Isa;
use crate::TensorError;

/// y[m, n] = x[m, k] @ W^T for a block-quantized `W` (`n = w.rows`, `k = w.cols`), with f32
/// activations.
pub fn matmul_wq(x: &[f32], w: &QMatrix, y: &mut [f32], m: usize) -> Result<(), TensorError> {
    let n = w.rows;
    w.check_io("matmul_wq", x, y, m)?;
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
    matmul_wq_prompt(x, w, y, m)
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
