//! Block layouts (ggml-common.h): `block_q4_1 { f16 d; f16 m; u8 qs[16] }`, element `j`
//! in the low nibble of `qs[j]` and element `j + 16` in the high nibble, value
//! `d * q + m`; `block_q8_0 { f16 d; i8 qs[32] }`, value `d * q`.
use std::arch::x86_64::*;

use half::f16;

use crate::linear::simd::avx512::hsum;
use crate::{GgmlType, TensorError};

fn f16_at(b: &[u8], i: usize) -> f32 {
    f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
}

fn check(w: &[u8], x: &[f32], bytes: usize) -> Result<usize, TensorError> {
    let blocks = x.len() / 32;
    if !x.len().is_multiple_of(32) || w.len() != blocks * bytes {
        return Err(TensorError::Shape {
            op: "dot_row",
            detail: format!("{} weight bytes against {} activations", w.len(), x.len()),
        });
    }
    Ok(blocks)
}

/// The 32 nibbles of a Q4_1 block as two vectors of 16 f32.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn nibbles(qs: *const u8) -> (__m512, __m512) {
    let raw = _mm_loadu_si128(qs as *const __m128i);
    let lo = _mm_and_si128(raw, _mm_set1_epi8(0x0F));
    let hi = _mm_and_si128(_mm_srli_epi16(raw, 4), _mm_set1_epi8(0x0F));
    (_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(lo)), _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(hi)))
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn bytes_i8(qs: *const u8) -> (__m512, __m512) {
    let a = _mm_loadu_si128(qs as *const __m128i);
    let b = _mm_loadu_si128(qs.add(16) as *const __m128i);
    (_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(a)), _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b)))
}

/// An f16 at `p` (unaligned), converted with F16C.
#[inline]
#[target_feature(enable = "f16c")]
unsafe fn f16_ptr(p: *const u8) -> f32 {
    let bits = std::ptr::read_unaligned(p as *const u16);
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32)))
}

/// `sum_b d_b * (q_b . x_b) + m_b * sum(x_b)`. Two accumulators hide FMA latency.
#[target_feature(enable = "avx512f,avx512bw,f16c")]
pub unsafe fn dot_q4_1(w: &[u8], x: &[f32], sums: &[f32]) -> Result<f32, TensorError> {
    let blocks = check(w, x, 20)?;
    if sums.len() != blocks {
        return Err(TensorError::Shape {
            op: "dot_row",
            detail: format!("{} block sums for {blocks} blocks", sums.len()),
        });
    }
    let (wp, xp, sp) = (w.as_ptr(), x.as_ptr(), sums.as_ptr());
    let block = |b: usize, acc: __m512| {
        let blk = wp.add(b * 20);
        let (lo, hi) = nibbles(blk.add(4));
        let xb = xp.add(b * 32);
        let s = _mm512_fmadd_ps(lo, _mm512_loadu_ps(xb), _mm512_mul_ps(hi, _mm512_loadu_ps(xb.add(16))));
        (_mm512_fmadd_ps(_mm512_set1_ps(f16_ptr(blk)), s, acc), f16_ptr(blk.add(2)) * *sp.add(b))
    };
    let (mut acc0, mut acc1) = (_mm512_setzero_ps(), _mm512_setzero_ps());
    let (mut off0, mut off1) = (0f32, 0f32);
    let mut b = 0;
    while b + 2 <= blocks {
        let (a, o) = block(b, acc0);
        acc0 = a;
        off0 += o;
        let (a, o) = block(b + 1, acc1);
        acc1 = a;
        off1 += o;
        b += 2;
    }
    if b < blocks {
        let (a, o) = block(b, acc0);
        acc0 = a;
        off0 += o;
    }
    Ok(_mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1)) + (off0 + off1))
}

#[target_feature(enable = "avx512f,avx512bw,f16c")]
pub unsafe fn dot_q8_0(w: &[u8], x: &[f32]) -> Result<f32, TensorError> {
    let blocks = check(w, x, 34)?;
    let (wp, xp) = (w.as_ptr(), x.as_ptr());
    let block = |b: usize, acc: __m512| {
        let blk = wp.add(b * 34);
        let (a, c) = bytes_i8(blk.add(2));
        let xb = xp.add(b * 32);
        let s = _mm512_fmadd_ps(a, _mm512_loadu_ps(xb), _mm512_mul_ps(c, _mm512_loadu_ps(xb.add(16))));
        _mm512_fmadd_ps(_mm512_set1_ps(f16_ptr(blk)), s, acc)
    };
    let (mut acc0, mut acc1) = (_mm512_setzero_ps(), _mm512_setzero_ps());
    let mut b = 0;
    while b + 2 <= blocks {
        acc0 = block(b, acc0);
        acc1 = block(b + 1, acc1);
        b += 2;
    }
    if b < blocks {
        acc0 = block(b, acc0);
    }
    Ok(_mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1)))
}

/// Q4_1 row x 16-bit activations: per block, the 32 nibbles widened to i16 and
/// multiplied pairwise with `vpmaddwd` (exact in i32), converted once, scaled by
/// `d * scale`; `m * sum` accumulates in lane 1 of an xmm register. Lengths are
/// checked by the caller (`q.len() == 32 * blocks`, `w.len() == 20 * blocks`,
/// `ss.len() == 2 * blocks`).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
pub unsafe fn dot_q4_1_act16(w: &[u8], q: &[i16], ss: &[f32]) -> f32 {
    let blocks = q.len() / 32;
    let (wp, qp, sp) = (w.as_ptr(), q.as_ptr(), ss.as_ptr());
    let mask = _mm256_set1_epi8(0x0F);
    // The 16 bytes go to both halves of a ymm; the low half keeps the low nibbles
    // (elements 0..16), the high half shifts to the high ones (16..32).
    let shifts = _mm256_set_epi16(4, 4, 4, 4, 4, 4, 4, 4, 0, 0, 0, 0, 0, 0, 0, 0);
    let block = |b: usize, acc: __m512, off: __m128| {
        let blk = wp.add(b * 20);
        let both = _mm256_broadcastsi128_si256(_mm_loadu_si128(blk.add(4) as *const __m128i));
        let w16 = _mm512_cvtepu8_epi16(_mm256_and_si256(_mm256_srlv_epi16(both, shifts), mask));
        let dot = _mm512_madd_epi16(w16, _mm512_loadu_si512(qp.add(b * 32) as *const _));
        let dm = _mm_cvtph_ps(_mm_cvtsi32_si128(std::ptr::read_unaligned(blk as *const i32)));
        let scale_sum = _mm_castpd_ps(_mm_load_sd(sp.add(2 * b) as *const f64));
        let prod = _mm_mul_ps(dm, scale_sum); // [d * scale, m * sum, 0, 0]
        (_mm512_fmadd_ps(_mm512_broadcastss_ps(prod), _mm512_cvtepi32_ps(dot), acc), _mm_add_ps(off, prod))
    };
    let (mut acc0, mut acc1) = (_mm512_setzero_ps(), _mm512_setzero_ps());
    let mut off = _mm_setzero_ps();
    let mut b = 0;
    while b + 2 <= blocks {
        (acc0, off) = block(b, acc0, off);
        (acc1, off) = block(b + 1, acc1, off);
        b += 2;
    }
    if b < blocks {
        (acc0, off) = block(b, acc0, off);
    }
    // The fixed-order sum the multi-row kernels (crate::linear::invariant) repeat per row.
    hsum(_mm512_add_ps(acc0, acc1)) + _mm_cvtss_f32(_mm_movehdup_ps(off))
}

/// Q8_0 row x 16-bit activations (see [`dot_q4_1_act16`]; no offset term).
#[target_feature(enable = "avx512f,avx512bw,f16c")]
pub unsafe fn dot_q8_0_act16(w: &[u8], q: &[i16], ss: &[f32]) -> f32 {
    let blocks = q.len() / 32;
    let (wp, qp, sp) = (w.as_ptr(), q.as_ptr(), ss.as_ptr());
    let block = |b: usize, acc: __m512| {
        let blk = wp.add(b * 34);
        let w16 = _mm512_cvtepi8_epi16(_mm256_loadu_si256(blk.add(2) as *const __m256i));
        let dot = _mm512_madd_epi16(w16, _mm512_loadu_si512(qp.add(b * 32) as *const _));
        let d = f16_ptr(blk);
        _mm512_fmadd_ps(_mm512_set1_ps(d * *sp.add(2 * b)), _mm512_cvtepi32_ps(dot), acc)
    };
    let (mut acc0, mut acc1) = (_mm512_setzero_ps(), _mm512_setzero_ps());
    let mut b = 0;
    while b + 2 <= blocks {
        acc0 = block(b, acc0);
        acc1 = block(b + 1, acc1);
        b += 2;
    }
    if b < blocks {
        acc0 = block(b, acc0);
    }
    hsum(_mm512_add_ps(acc0, acc1))
}

/// Dequantizes a Q4_1, Q5_0 or Q8_0 row; lengths checked by the caller. The value is
/// formed as a separate multiply and add (`d * q + m`, no FMA), as gguf-py's numpy code
/// does, so the f32 weights equal those the PyTorch reference computes with.
#[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
pub unsafe fn dequant(ty: GgmlType, src: &[u8], dst: &mut [f32]) {
    let blocks = dst.len() / 32;
    for b in 0..blocks {
        let out = dst.as_mut_ptr().add(b * 32);
        match ty {
            GgmlType::Q5_0 => {
                // The codes `q - 16` as i16 (the Act16 kernels' unpacking), then `d * (q - 16)`.
                let blk = src.as_ptr().add(b * 22);
                let (lo, hi) = crate::linear::simd::avx2::q5_0(blk);
                let d = _mm512_set1_ps(f16_at(&src[b * 22..b * 22 + 2], 0));
                _mm512_storeu_ps(out, _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi16_epi32(lo))));
                _mm512_storeu_ps(out.add(16), _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi16_epi32(hi))));
            }
            GgmlType::Q4_1 => {
                let blk = &src[b * 20..b * 20 + 20];
                let (lo, hi) = nibbles(blk.as_ptr().add(4));
                let d = _mm512_set1_ps(f16_at(blk, 0));
                let m = _mm512_set1_ps(f16_at(blk, 2));
                _mm512_storeu_ps(out, _mm512_add_ps(_mm512_mul_ps(d, lo), m));
                _mm512_storeu_ps(out.add(16), _mm512_add_ps(_mm512_mul_ps(d, hi), m));
            }
            _ => {
                let blk = &src[b * 34..b * 34 + 34];
                let (a, c) = bytes_i8(blk.as_ptr().add(2));
                let d = _mm512_set1_ps(f16_at(blk, 0));
                _mm512_storeu_ps(out, _mm512_mul_ps(d, a));
                _mm512_storeu_ps(out.add(16), _mm512_mul_ps(d, c));
            }
        }
    }
}
