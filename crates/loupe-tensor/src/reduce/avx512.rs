//! The horizontal sum of a 512-bit vector, in one fixed lane order.

use std::arch::x86_64::*;

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
