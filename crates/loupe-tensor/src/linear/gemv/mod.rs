//! The decode GEMV of `--precision native`: several Q4_1 / Q8_0 / Q5_0 / Q6_K / Q4_K / Q4_0 weight rows against
//! one activation row quantized to 16-bit blocks ([`Act16`]).
//!
//! **Why a kernel of its own.** One row at a time ([`crate::linear::dot_row_act16`]), a
//! 576-wide row is 18 blocks; every block waits on the scalar offset chain
//! (`off += m * sum`, one f32 add latency per block), the f16 scale conversion and the
//! broadcast of `d * scale`, and every row pays a call and a horizontal sum: decode was
//! compute-bound at half the memory bandwidth (BENCHMARKS.md, "Measurements once in doc comments"). Here `ROWS` weight rows go through the
//! blocks together: the scales of the group are converted in a first pass (`p[b][r]`,
//! each row's offset in its own register), then each block of activations is loaded
//! once and multiplied with the block of every row of the group, whose accumulators are
//! independent chains.
//!
//! **Bit for bit the single-row kernels.** Per output, the arithmetic is exactly that of
//! `dot_row_act16` at the same ISA: the same integer lanes per block (exact, so how the
//! weights are unpacked does not matter), the same conversion, the same FMA of
//! `d * scale` into the even- or odd-block accumulator, the same offset chain from +0.0,
//! the same horizontal sum. So decode keeps its numbers, and the batched engine's
//! multi-row kernels (`crate::linear::invariant`), which repeat that arithmetic per activation row,
//! stay bit-identical to it (tested in `tests.rs` and in `invariant`).
//!
//! Q5_0, Q6_K, Q4_K, Q4_0 and Q5_K have AVX2 arithmetic only (single-row, group, multi-row): an AVX-512
//! machine runs it for them in every path, so the agreement holds there as well. This decode
//! group computes Q5_0's, Q4_0's and Q6_K's AVX2 arithmetic with 512-bit vectors, two blocks per
//! vector, with the same bits (`avx512::group_avx512_pairs`; Q6_K's pair unpacked at once by
//! `simd::avx512::q6_k_pair`, on AMD CPUs); for Q4_K / Q5_K (two AVX2 unpackings joined) it
//! measured slower than their AVX2 group (BENCHMARKS.md, "Measurements once in doc comments"). On AMX CPUs Q4_1
//! takes the AVX2 arithmetic too, in every path (`dispatch::avx2_kernels_at`), where it
//! decoded faster than the AVX-512 group.

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(test)]
mod tests;
#[cfg(target_arch = "x86_64")]
mod x86;

use std::ops::Range;

use super::act16::Act16;
use super::decode::scalar::dot_row_act16_scalar;
use super::dispatch::avx2_kernels_at;
use super::kinds::act16_kind;
use super::qmatrix::QMatrix;
use crate::pool::OutPtr;
use crate::quant::Isa;
use crate::{GgmlType, TensorError};

/// Whether Q6_K rows take the pairs group at AVX-512: on AMD CPUs, where it read 9% more of
/// the memory bus than the AVX2 group (Zen 4, BENCHMARKS.md, "2026-11-30 (night)"). Intel CPUs
/// keep the AVX2 group: an earlier pairs kernel for Q6_K (two AVX2 unpackings joined) was slower
/// there, and this one has not been measured on them.
#[cfg(target_arch = "x86_64")]
fn q6_k_pairs(ty: GgmlType) -> bool {
    ty == GgmlType::Q6K && crate::quant::vendor_is_amd()
}

/// `y[j] = W[j] . x` for `j` in `rows`, `W` Q4_1, Q8_0, Q5_0, Q6_K, Q4_K, Q4_0 or Q5_K with `act` of `w.cols`
/// activations (checked by the caller, [`crate::linear::invariant`]).
///
/// # Safety
/// `isa` is supported by this CPU; `out` points to at least `w.rows` floats of which
/// this call alone writes those at `rows`; `w.cols == act.q.len()`, a multiple of 32
/// with at most [`crate::linear::dispatch::MAX_STACK_BLOCKS`] blocks, and `act.scale_sum` holds
/// two floats per block.
pub(crate) unsafe fn gemv_rows(
    isa: Isa,
    w: &QMatrix,
    rows: Range<usize>,
    act: &Act16<'_>,
    out: OutPtr,
) -> Result<(), TensorError> {
    #[cfg(target_arch = "x86_64")]
    if isa >= Isa::Avx2 && act16_kind(w.ty).is_some() {
        // Q5_0 / Q6_K / Q4_K / Q4_0 / Q5_K (and Q4_1 on AMX CPUs): the AVX2 kernels at AVX-512 too, as
        // `decode::dot_row_act16` and `batch` run (`dispatch::avx2_kernels_at`).
        if isa >= Isa::Avx512 && !avx2_kernels_at(isa, w.ty) {
            avx512::rows_avx512(w, rows, act, out);
        } else if isa >= Isa::Avx512 && (matches!(w.ty, GgmlType::Q5_0 | GgmlType::Q4_0) || q6_k_pairs(w.ty)) {
            // The AVX2 kernel's bits, two blocks per 512-bit vector.
            avx512::rows_avx512_pairs(w, rows, act, out);
        } else {
            avx2::rows_avx2(w, rows, act, out);
        }
        return Ok(());
    }
    let _ = isa;
    for j in rows {
        let v = dot_row_act16_scalar(w.ty, w.row(j), act)?;
        out.get().add(j).write(v);
    }
    Ok(())
}
