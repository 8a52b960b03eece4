//! Which kernel family a weight type takes on an ISA, decided in one place: the one-row
//! dot, the GEMV and the batch-invariant multi-row kernels all ask here, so decode and
//! batch run the same arithmetic (and so the same bits) for a type.

use super::kinds::act16_kind;
use super::qmatrix::QMatrix;
use crate::quant::Isa;
use crate::GgmlType;

/// Block sums for up to this many blocks live on the stack at `m == 1` (k <= 16384 at
/// 32 per block), so decode allocates nothing; longer rows take the generic path.
pub(crate) const MAX_STACK_BLOCKS: usize = 512;

/// Whether [`matmul_wq_group`] can take `w` against `k` activations: Q4_1, Q8_0, Q5_0,
/// Q6_K, Q4_K, Q4_0 or Q5_K rows of `k` columns, `k` a multiple of the block (32; the K types 256) with at most
/// [`MAX_STACK_BLOCKS`] blocks of 32 (the decode path of [`matmul_wq_invariant`]).
pub fn can_group(w: &QMatrix, k: usize) -> bool {
    act16_kind(w.ty).is_some()
        && w.cols == k
        && k.is_multiple_of(w.ty.block_size())
        && k.is_multiple_of(32)
        && k / 32 <= MAX_STACK_BLOCKS
}

/// Whether a type runs the AVX2 Act16 kernels at `isa` (at or above [`Isa::Avx512`]) too:
/// every path (single row, gemv, batch) asks this, so decode and batch agree. Q5_0, Q6_K,
/// Q4_K, Q4_0 and Q5_K have no AVX-512 ones. Q4_1 takes the AVX2 ones on AMX CPUs (Sapphire Rapids class),
/// where SmolLM2 decoded faster on them, while on AVX-512 CPUs without AMX the AVX-512 kernel
/// was slightly ahead (BENCHMARKS.md, "Measurements once in doc comments").
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(crate) fn avx2_kernels_at(isa: Isa, ty: GgmlType) -> bool {
    matches!(ty, GgmlType::Q5_0 | GgmlType::Q6K | GgmlType::Q4K | GgmlType::Q4_0 | GgmlType::Q5K)
        || (isa >= Isa::Amx && ty == GgmlType::Q4_1)
}

/// Most activation rows a multi-row call runs through the decode GEMV one row at a time
/// instead of the multi-row kernels, whose per-weight-row preparation (every block's scale
/// products for 16 lanes of rows, the offset chain) does not pay off on so few rows: `isa`'s
/// multi-row kernel for `ty` is the 512-bit one (8 rows per weight row) or the AVX2 one (4).
/// Both give the same bits, so this only chooses the faster. The thresholds are where the
/// multi-row kernels overtook the GEMV: on SmolLM2 with `loupe bench --batch` (Intel, 3 rows
/// at AVX-512); on AMD's AVX-512 cores (Zen 4: 512-bit vectors on 256-bit units), per type
/// with `stream_gemv PREC=batch` (BENCHMARKS.md, "2026-11-30 (afternoon)").
#[cfg(target_arch = "x86_64")]
pub(crate) fn gemv_max_rows(isa: Isa, ty: GgmlType) -> usize {
    if avx512_rows_kernel(isa, ty).is_none() {
        8
    } else if crate::quant::vendor_is_amd() {
        match ty {
            GgmlType::Q8_0 | GgmlType::Q4_1 => 9,
            GgmlType::Q4_0 => 7,
            GgmlType::Q5_0 => 4,
            _ => 3,
        }
    } else {
        3
    }
}

/// Which 512-bit multi-row kernel `ty` takes at `isa`: `Some(false)` its own AVX-512
/// arithmetic, `Some(true)` the AVX2 arithmetic two blocks per vector (the types that take
/// the AVX2 arithmetic at AVX-512 and have a pairs kernel: Q4_1 on AMX CPUs, Q5_0, Q6_K, Q4_K, Q4_0, Q5_K),
/// `None` the AVX2 multi-row kernel.
#[cfg(target_arch = "x86_64")]
pub(crate) fn avx512_rows_kernel(isa: Isa, ty: GgmlType) -> Option<bool> {
    if isa < Isa::Avx512 {
        None
    } else if !avx2_kernels_at(isa, ty) {
        Some(false)
    } else if matches!(
        ty,
        GgmlType::Q4_1 | GgmlType::Q5_0 | GgmlType::Q6K | GgmlType::Q4K | GgmlType::Q4_0 | GgmlType::Q5K
    ) {
        Some(true)
    } else {
        None
    }
}

/// The ISA whose arithmetic the f32-activation kernels (`matmul_wq`: the one-row dot, the
/// GEMV, the batch-invariant rows) run for `ty` at `isa`: [`Isa::Avx2`] where
/// `avx2_kernels_at` sends the type to the AVX2 Act16 kernels, else `isa`. What a kernel
/// selection records, so its label names the arithmetic that runs.
pub fn native_kernel_isa(isa: Isa, ty: GgmlType) -> Isa {
    if isa >= Isa::Avx512 && avx2_kernels_at(isa, ty) {
        Isa::Avx2
    } else {
        isa
    }
}
