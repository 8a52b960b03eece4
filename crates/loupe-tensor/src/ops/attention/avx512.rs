//! The row kernels on AVX-512: 16 lanes.

use std::arch::x86_64::*;

use half::f16;

use crate::reduce::avx512::hsum;

use super::lanes::{dot_axpy, row_kernels, Widen};

#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn load_f32(p: *const f32) -> __m512 {
    _mm512_loadu_ps(p)
}

#[inline]
#[target_feature(enable = "avx512f,f16c")]
unsafe fn load_f16(p: *const f16) -> __m512 {
    _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i))
}

dot_axpy!(
    "avx512f,f16c",
    16,
    __m512,
    _mm512_setzero_ps,
    _mm512_fmadd_ps,
    _mm512_add_ps,
    _mm512_loadu_ps,
    _mm512_storeu_ps,
    _mm512_set1_ps,
    hsum,
    dot_f32,
    axpy_f32,
    f32,
    load_f32
);
dot_axpy!(
    "avx512f,f16c",
    16,
    __m512,
    _mm512_setzero_ps,
    _mm512_fmadd_ps,
    _mm512_add_ps,
    _mm512_loadu_ps,
    _mm512_storeu_ps,
    _mm512_set1_ps,
    hsum,
    dot_f16,
    axpy_f16,
    f16,
    load_f16
);
row_kernels!(
    "avx512f,f16c",
    16,
    __m512,
    _mm512_setzero_ps,
    _mm512_fmadd_ps,
    _mm512_add_ps,
    _mm512_loadu_ps,
    _mm512_storeu_ps,
    _mm512_set1_ps,
    hsum,
    load_f16
);
