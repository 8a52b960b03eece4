//! Horizontal sums of 256-bit vectors, in one fixed lane order.

use std::arch::x86_64::*;

/// The horizontal sum of 8 lanes in a fixed order: halves, pairs, lane 0 + lane 1.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn hsum(v: __m256) -> f32 {
    let a = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let a = _mm_add_ps(a, _mm_movehl_ps(a, a));
    _mm_cvtss_f32(a) + _mm_cvtss_f32(_mm_movehdup_ps(a))
}
