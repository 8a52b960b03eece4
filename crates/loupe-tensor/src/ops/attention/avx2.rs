//! The row kernels on AVX2 + FMA: 8 lanes.

use std::arch::x86_64::*;

use half::f16;

use crate::reduce::avx2::hsum;

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
