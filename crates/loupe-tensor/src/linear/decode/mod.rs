//! One activation row against weight rows: the dot products of decode, one weight row at a
//! time. Against 16-bit activation blocks ([`Act16`]) for Q4_1, Q8_0, Q5_0, Q6_K, Q4_K, Q4_0 and Q5_K
//! (exact integer products; `--precision native`'s 100% argmax agreement), against f32
//! activations for every other type. Dispatch by ISA here; each ISA's kernels in its file,
//! the portable references in `scalar`.

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx2_f32;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2_kquant;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512;
pub(crate) mod scalar;
#[cfg(test)]
mod tests;

pub use scalar::{dot_row_act16_scalar, dot_row_scalar};

use scalar::whole_blocks;

use super::act16::Act16;
use super::dispatch::avx2_kernels_at;
use crate::quant::{dequantize_row, Isa};
use crate::{GgmlType, TensorError};

/// Dot of one Q4_1, Q8_0, Q5_0, Q6_K, Q4_K, Q4_0 or Q5_K weight row with 16-bit activation blocks (the
/// K types: rows of whole 256-element super-blocks). Q5_0, Q6_K, Q4_K, Q4_0 and Q5_K have AVX2 kernels only: at
/// [`Isa::Avx512`] they run those, as the GEMV and the batch-invariant kernels do for them.
pub fn dot_row_act16(isa: Isa, ty: GgmlType, w_row: &[u8], act: &Act16<'_>) -> Result<f32, TensorError> {
    let blocks = act.q.len() / 32;
    let per = ty.block_size();
    let takes = per == 32 || matches!(ty, GgmlType::Q6K | GgmlType::Q4K | GgmlType::Q5K);
    if !act.q.len().is_multiple_of(32)
        || act.scale_sum.len() != 2 * blocks
        || !takes
        || !act.q.len().is_multiple_of(per)
        || w_row.len() != act.q.len() / per * ty.type_size()
    {
        return Err(TensorError::Shape {
            op: "dot_row_act16",
            detail: format!("{} bytes of {ty} against {} activations", w_row.len(), act.q.len()),
        });
    }
    #[cfg(target_arch = "x86_64")]
    if isa >= Isa::Avx512 {
        match ty {
            // On AMX CPUs the AVX2 kernel, as gemv and batch run it (`dispatch::avx2_kernels_at`).
            // SAFETY: Isa::Amx implies AVX2, FMA and F16C; lengths checked above.
            GgmlType::Q4_1 if avx2_kernels_at(isa, ty) => {
                return Ok(unsafe { avx2::dot_q4_1_act16(w_row, act.q, act.scale_sum) })
            }
            // SAFETY: the CPU supports AVX-512 F/BW and F16C (Isa::Avx512); lengths checked above.
            GgmlType::Q4_1 => return Ok(unsafe { avx512::dot_q4_1_act16(w_row, act.q, act.scale_sum) }),
            GgmlType::Q8_0 => return Ok(unsafe { avx512::dot_q8_0_act16(w_row, act.q, act.scale_sum) }),
            // SAFETY: Isa::Avx512 implies AVX2, FMA and F16C; lengths checked above.
            GgmlType::Q5_0 => return Ok(unsafe { avx2::dot_q5_0_act16(w_row, act.q, act.scale_sum) }),
            // SAFETY: as above (whole super-blocks checked above).
            GgmlType::Q6K => return Ok(unsafe { avx2::dot_q6_k_act16(w_row, act.q, act.scale_sum) }),
            // SAFETY: as above (whole super-blocks checked above).
            GgmlType::Q4K => return Ok(unsafe { avx2::dot_q4_k_act16(w_row, act.q, act.scale_sum) }),
            // SAFETY: as above (whole super-blocks checked above).
            GgmlType::Q5K => return Ok(unsafe { avx2::dot_q5_k_act16(w_row, act.q, act.scale_sum) }),
            // SAFETY: as above.
            GgmlType::Q4_0 => return Ok(unsafe { avx2::dot_q4_0_act16(w_row, act.q, act.scale_sum) }),
            _ => {}
        }
    } else if isa >= Isa::Avx2 {
        match ty {
            // SAFETY: the CPU supports AVX2, FMA and F16C (Isa::Avx2); lengths checked above.
            GgmlType::Q4_1 => return Ok(unsafe { avx2::dot_q4_1_act16(w_row, act.q, act.scale_sum) }),
            GgmlType::Q8_0 => return Ok(unsafe { avx2::dot_q8_0_act16(w_row, act.q, act.scale_sum) }),
            // SAFETY: as above.
            GgmlType::Q5_0 => return Ok(unsafe { avx2::dot_q5_0_act16(w_row, act.q, act.scale_sum) }),
            // SAFETY: as above (whole super-blocks checked above).
            GgmlType::Q6K => return Ok(unsafe { avx2::dot_q6_k_act16(w_row, act.q, act.scale_sum) }),
            // SAFETY: as above (whole super-blocks checked above).
            GgmlType::Q4K => return Ok(unsafe { avx2::dot_q4_k_act16(w_row, act.q, act.scale_sum) }),
            // SAFETY: as above (whole super-blocks checked above).
            GgmlType::Q5K => return Ok(unsafe { avx2::dot_q5_k_act16(w_row, act.q, act.scale_sum) }),
            // SAFETY: as above.
            GgmlType::Q4_0 => return Ok(unsafe { avx2::dot_q4_0_act16(w_row, act.q, act.scale_sum) }),
            _ => {}
        }
    }
    let _ = isa;
    dot_row_act16_scalar(ty, w_row, act)
}

/// Dot of one weight row with f32 `x`; `sums` holds the sum of `x` over each weight block
/// (used by types with an offset term, Q4_1/Q5_1).
pub fn dot_row(isa: Isa, ty: GgmlType, w_row: &[u8], x: &[f32], sums: &[f32]) -> Result<f32, TensorError> {
    // Float weights: the GGML float dots (F16C / AVX-512 conversion in registers, several
    // accumulators), not the block-by-block reference, whose blocks here are one element.
    if matches!(ty, GgmlType::F16 | GgmlType::BF16) {
        whole_blocks(ty, w_row.len(), x.len())?;
        return Ok(crate::quant::vec_dot_fn(isa, ty)(w_row, crate::linear::tiled::f32_bytes(x), x.len()));
    }
    #[cfg(target_arch = "x86_64")]
    if isa >= Isa::Avx512 {
        match ty {
            // SAFETY: the CPU supports AVX-512 F/BW (Isa::Avx512); lengths are checked inside.
            GgmlType::Q4_1 => return unsafe { avx512::dot_q4_1(w_row, x, sums) },
            GgmlType::Q8_0 => return unsafe { avx512::dot_q8_0(w_row, x) },
            _ => {}
        }
    }
    #[cfg(target_arch = "x86_64")]
    if isa >= Isa::Avx2
        && matches!(
            ty,
            GgmlType::Mxfp4
                | GgmlType::Nvfp4
                | GgmlType::Fp8E4M3
                | GgmlType::Q4_0
                | GgmlType::Q5_0
                | GgmlType::Q5_1
                | GgmlType::Q4K
                | GgmlType::Q6K
        )
    {
        let blocks = whole_blocks(ty, w_row.len(), x.len())?;
        if ty == GgmlType::Q5_1 && sums.len() != blocks {
            return Err(TensorError::Shape {
                op: "dot_row",
                detail: format!("{} block sums for {blocks} blocks", sums.len()),
            });
        }
        // SAFETY: the CPU supports AVX2, FMA and F16C (Isa::Avx2); `w_row` is whole blocks
        // (super-blocks for Q4_K/Q6_K) covering exactly `x`, and Q5_1 has one block sum per
        // block (checked just above).
        return Ok(unsafe {
            match ty {
                GgmlType::Mxfp4 => avx2_f32::dot_mxfp4(w_row, x),
                GgmlType::Nvfp4 => avx2_f32::dot_nvfp4(w_row, x),
                GgmlType::Fp8E4M3 => avx2_f32::dot_fp8_e4m3(w_row, x),
                GgmlType::Q4_0 => avx2_f32::dot_q4_0(w_row, x),
                GgmlType::Q5_0 => avx2_f32::dot_q5::<false>(w_row, x, sums),
                GgmlType::Q4K => avx2_kquant::dot_q4_k(w_row, x),
                GgmlType::Q6K => avx2_kquant::dot_q6_k(w_row, x),
                _ => avx2_f32::dot_q5::<true>(w_row, x, sums),
            }
        });
    }
    let _ = (isa, sums);
    dot_row_scalar(ty, w_row, x)
}

/// Dequantizes one row, with AVX-512 for Q4_1 / Q5_0 / Q8_0, AVX2 for Q4_K / Q5_K / Q6_K and
/// AVX2 (F16C) or AVX-512 for F16 and BF16;
/// bit-identical to [`dequantize_row`].
pub fn dequantize_row_fast(ty: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<(), TensorError> {
    #[cfg(target_arch = "x86_64")]
    if Isa::active() >= Isa::Avx512
        && matches!(ty, GgmlType::Q4_1 | GgmlType::Q5_0 | GgmlType::Q8_0)
        && whole_blocks(ty, src.len(), dst.len()).is_ok()
    {
        // SAFETY: AVX-512 is available; lengths were checked just above.
        unsafe { avx512::dequant(ty, src, dst) };
        return Ok(());
    }
    if matches!(ty, GgmlType::F16 | GgmlType::BF16) && src.len() == 2 * dst.len() && src.as_ptr().align_offset(2) == 0 {
        // F16C / AVX-512 widening (exact, as the reference's): the per-value conversion made
        // the prompt chains of f16 weights cost more than their FMAs (a 4-row prompt through a
        // 4864 x 896 matrix ran at 10 GFLOP/s).
        let (p, n) = (src.as_ptr(), dst.len());
        if ty == GgmlType::F16 {
            // SAFETY: `src` is 2-byte aligned (checked) and holds `n` f16; every bit pattern
            // is a valid f16.
            crate::f16_rows::widen_at(Isa::active(), unsafe { std::slice::from_raw_parts(p.cast(), n) }, dst);
        } else {
            // SAFETY: as above, `n` u16.
            crate::f16_rows::widen_bf16_at(Isa::active(), unsafe { std::slice::from_raw_parts(p.cast(), n) }, dst);
        }
        return Ok(());
    }
    #[cfg(target_arch = "x86_64")]
    if Isa::active() >= Isa::Avx2
        && matches!(ty, GgmlType::Q4K | GgmlType::Q5K | GgmlType::Q6K)
        && dst.len().is_multiple_of(ty.block_size())
        && src.len() == dst.len() / ty.block_size() * ty.type_size()
    {
        // SAFETY: the CPU supports AVX2 and FMA (Isa::Avx2); `src` is whole super-blocks,
        // exactly those of `dst` (checked just above).
        unsafe {
            match ty {
                GgmlType::Q4K => avx2_kquant::dequant_q4_k(src, dst),
                GgmlType::Q5K => avx2_kquant::dequant_q5_k(src, dst),
                _ => avx2_kquant::dequant_q6_k(src, dst),
            }
        }
        return Ok(());
    }
    dequantize_row(ty, src, dst)
}
