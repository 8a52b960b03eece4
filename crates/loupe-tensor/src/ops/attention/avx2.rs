//! The row kernels on AVX2 + FMA: 8 lanes.

use std::arch::x86_64::*;

use half::f16;

use super::lanes::{dot_axpy, row_kernels, Widen};

#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn load_f32(p: *const f32) -> __m256 {
    _mm256_loadu_ps(p)
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn load_f16(p: *const f16) -> __m256 {
    _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i))
}

/// Lanes summed as ((0+4) + (2+6)) + ((1+5) + (3+7)): high half onto low, then pairs.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn hsum(v: __m256) -> f32 {
    let x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    _mm_cvtss_f32(_mm_add_ss(x, _mm_shuffle_ps(x, x, 1)))
}

dot_axpy!(
    "avx2,fma,f16c",
    8,
    __m256,
    _mm256_setzero_ps,
    _mm256_fmadd_ps,
    _mm256_add_ps,
    _mm256_loadu_ps,
    _mm256_storeu_ps,
    _mm256_set1_ps,
    hsum,
    dot_f32,
    axpy_f32,
    f32,
    load_f32
);
dot_axpy!(
    "avx2,fma,f16c",
    8,
    __m256,
    _mm256_setzero_ps,
    _mm256_fmadd_ps,
    _mm256_add_ps,
    _mm256_loadu_ps,
    _mm256_storeu_ps,
    _mm256_set1_ps,
    hsum,
    dot_f16,
    axpy_f16,
    f16,
    load_f16
);
row_kernels!(
    "avx2,fma,f16c",
    8,
    __m256,
    _mm256_setzero_ps,
    _mm256_fmadd_ps,
    _mm256_add_ps,
    _mm256_loadu_ps,
    _mm256_storeu_ps,
    _mm256_set1_ps,
    hsum,
    load_f16
);
