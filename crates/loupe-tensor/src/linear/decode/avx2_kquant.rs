//! Q4_K and Q6_K rows against f32 activations (AVX2 + FMA + F16C), and their AVX2
//! dequantizers, in the style of `decode::avx2_f32`: the weights of each sub-block become
//! exact small integers as bytes, are widened to f32 and FMA'd with the activations, and
//! the sub-block's 8 partial sums are multiplied by its scale once (a broadcast FMA into
//! the row accumulator).
//!
//! Layouts (ggml-common.h, `quant::blocks`), 256 weights per super-block:
//! * `block_q4_K { f16 d; f16 dmin; u8 scales[12]; u8 qs[128] }` (144 bytes): chunk `j`
//!   (`qs[32j..32j + 32]`) holds elements `64j..64j + 32` in its low nibbles (sub-block
//!   `2j`) and `64j + 32..64j + 64` in its high nibbles (sub-block `2j + 1`); value
//!   `d * sc * q - dmin * m` with the 6-bit `sc`/`m` of [`scale_min_k4`]. The min term
//!   is `dmin * m` times the sub-block's activation sum, accumulated apart.
//! * `block_q6_K { u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d }` (210 bytes): see
//!   [`q6_codes`]; value `d * scales[e / 16] * (q - 32)`.
//!
//! Decode and batched decode run these types through the Act16 kernels instead
//! (`decode::dot_row_act16`, `simd::avx2::q6_k` / `q4_k`); the f32 dots here are left to rows
//! too long for them (over `dispatch::MAX_STACK_BLOCKS` blocks of 32) and to `dot_row` callers.
//!
//! The scalar reference (`decode::scalar::dot_row_scalar`) dequantizes each super-block through
//! `quant::dequant::q4_k` / `q6_k` and then dots in f32; it was ~75% of the decode time
//! of Qwen2.5-Coder 0.5B (Q4_K_M) on an AMD EPYC Zen 3.

use std::arch::x86_64::*;

use super::avx2_f32::{block32, fma8, nibbles};
use crate::linear::simd::avx2::{f16_at, hsum, scales_mins_q4k};
use crate::quant::blocks::{read, scale_min_k4, BlockQ4K, BlockQ5K, BlockQ6K, QK_K};

const Q4K_BYTES: usize = 144;
const Q5K_BYTES: usize = 176;
const Q6K_BYTES: usize = 210;
// Byte offsets inside `block_q4_K` / `block_q6_K`.
const Q4K_SCALES: usize = 4;
const Q4K_QS: usize = 16;
const Q6K_QH: usize = 128;
const Q6K_SCALES: usize = 192;
const Q6K_D: usize = 208;

/// The 32 floats at `x` summed to 8 lanes.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn sum32(x: *const f32) -> __m256 {
    let a = _mm256_add_ps(_mm256_loadu_ps(x), _mm256_loadu_ps(x.add(8)));
    let b = _mm256_add_ps(_mm256_loadu_ps(x.add(16)), _mm256_loadu_ps(x.add(24)));
    _mm256_add_ps(a, b)
}

/// The sixteen 6-bit codes minus 32 (-32..32, as i8) of elements `l0..l0 + 16` of each
/// quarter of one 128-element half of a Q6_K block, `l0` 0 or 16: with `ql`/`qh` the
/// half's 64 low-bit and 32 high-bit bytes, element `l + 32s` (`l < 32`) takes its low 4
/// bits from nibble `s / 2` of `ql[l + 32 (s % 2)]` and its top 2 from bits `2s..2s + 2`
/// of `qh[l]` (ggml's `dequantize_row_q6_K`). Returned in quarter order `s = 0..4`.
///
/// # Safety
/// AVX2; `ql + l0` has 48 readable bytes, `qh + l0` 16.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn q6_codes(ql: *const u8, qh: *const u8, l0: usize) -> [__m128i; 4] {
    let m4 = _mm_set1_epi8(0x0F);
    let m30 = _mm_set1_epi8(0x30);
    let bias = _mm_set1_epi8(32);
    let a = _mm_loadu_si128(ql.add(l0).cast());
    let c = _mm_loadu_si128(ql.add(32 + l0).cast());
    let h = _mm_loadu_si128(qh.add(l0).cast());
    // 16-bit shifts move bits across the byte boundary only into bits the masks clear.
    let code = |low: __m128i, high: __m128i| {
        _mm_sub_epi8(_mm_or_si128(_mm_and_si128(low, m4), _mm_and_si128(high, m30)), bias)
    };
    [
        code(a, _mm_slli_epi16::<4>(h)),
        code(c, _mm_slli_epi16::<2>(h)),
        code(_mm_srli_epi16::<4>(a), h),
        code(_mm_srli_epi16::<4>(c), _mm_srli_epi16::<2>(h)),
    ]
}

/// Dot of a Q4_K row with `x`.
///
/// # Safety
/// AVX2 + FMA + F16C; `w` whole 144-byte super-blocks, `x` 256 floats per super-block.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_q4_k(w: &[u8], x: &[f32]) -> f32 {
    let mut acc = _mm256_setzero_ps();
    let mut mins = _mm256_setzero_ps();
    for (b, blk) in w.chunks_exact(Q4K_BYTES).enumerate() {
        let p = blk.as_ptr();
        let (sc, mn) = scales_mins_q4k(p.add(Q4K_SCALES));
        let (mut dsc, mut dmn) = ([0f32; 8], [0f32; 8]);
        _mm256_storeu_ps(dsc.as_mut_ptr(), _mm256_mul_ps(_mm256_set1_ps(f16_at(p)), sc));
        _mm256_storeu_ps(dmn.as_mut_ptr(), _mm256_mul_ps(_mm256_set1_ps(f16_at(p.add(2))), mn));
        let xb = x.as_ptr().add(QK_K * b);
        for j in 0..4 {
            let q = p.add(Q4K_QS + 32 * j);
            let (lo0, hi0) = nibbles(_mm_loadu_si128(q.cast()));
            let (lo1, hi1) = nibbles(_mm_loadu_si128(q.add(16).cast()));
            let xs = xb.add(64 * j);
            acc = _mm256_fmadd_ps(_mm256_set1_ps(dsc[2 * j]), block32(lo0, lo1, xs), acc);
            acc = _mm256_fmadd_ps(_mm256_set1_ps(dsc[2 * j + 1]), block32(hi0, hi1, xs.add(32)), acc);
            mins = _mm256_fmadd_ps(_mm256_set1_ps(dmn[2 * j]), sum32(xs), mins);
            mins = _mm256_fmadd_ps(_mm256_set1_ps(dmn[2 * j + 1]), sum32(xs.add(32)), mins);
        }
    }
    hsum(acc) - hsum(mins)
}

/// Dot of a Q6_K row with `x`.
///
/// # Safety
/// AVX2 + FMA + F16C; `w` whole 210-byte super-blocks, `x` 256 floats per super-block.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_q6_k(w: &[u8], x: &[f32]) -> f32 {
    // One accumulator per quarter: four independent FMA chains.
    let mut acc = [_mm256_setzero_ps(); 4];
    for (b, blk) in w.chunks_exact(Q6K_BYTES).enumerate() {
        let p = blk.as_ptr();
        // d * scales[i] for the 16 sub-blocks of 16.
        let d = _mm256_set1_ps(f16_at(p.add(Q6K_D)));
        let sc = _mm_loadu_si128(p.add(Q6K_SCALES).cast());
        let mut ds = [0f32; 16];
        _mm256_storeu_ps(ds.as_mut_ptr(), _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc))));
        _mm256_storeu_ps(
            ds.as_mut_ptr().add(8),
            _mm256_mul_ps(d, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128::<8>(sc)))),
        );
        for h in 0..2 {
            let (ql, qh) = (p.add(64 * h), p.add(Q6K_QH + 32 * h));
            let xh = x.as_ptr().add(QK_K * b + 128 * h);
            for half in 0..2 {
                let l0 = 16 * half;
                for (s, v) in q6_codes(ql, qh, l0).into_iter().enumerate() {
                    // Elements 32s + l0 .. + 16 of the half: sub-block 8h + 2s + half.
                    let xs = xh.add(32 * s + l0);
                    let part = fma8(_mm_srli_si128::<8>(v), xs.add(8), fma8(v, xs, _mm256_setzero_ps()));
                    acc[s] = _mm256_fmadd_ps(_mm256_set1_ps(ds[8 * h + 2 * s + half]), part, acc[s]);
                }
            }
        }
    }
    hsum(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])))
}

/// Dequantizes a Q4_K row bit-identically to `quant::dequant::q4_k`: the same f32
/// roundings (`dl = d * sc`, `ml = dmin * m`, then `dl * q - ml`, never fused).
///
/// # Safety
/// AVX2 + FMA; `src` whole 144-byte super-blocks, `dst` 256 floats per super-block.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn dequant_q4_k(src: &[u8], dst: &mut [f32]) {
    for (blk, out) in src.chunks_exact(Q4K_BYTES).zip(dst.chunks_exact_mut(QK_K)) {
        let b: BlockQ4K = read(blk, 0);
        dequant_q45_k(b.d.to_f32(), b.dmin.to_f32(), &b.scales, &b.qs, None, out);
    }
}

/// Dequantizes a Q5_K row bit-identically to `quant::dequant::q5_k`: [`dequant_q4_k`]'s
/// arithmetic on the 5-bit codes (the nibble, plus 16 where bit `j` of `qh[l]` is set
/// for element `l` of sub-block `j`).
///
/// # Safety
/// AVX2 + FMA; `src` whole 176-byte super-blocks, `dst` 256 floats per super-block.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn dequant_q5_k(src: &[u8], dst: &mut [f32]) {
    for (blk, out) in src.chunks_exact(Q5K_BYTES).zip(dst.chunks_exact_mut(QK_K)) {
        let b: BlockQ5K = read(blk, 0);
        dequant_q45_k(b.d.to_f32(), b.dmin.to_f32(), &b.scales, &b.qs, Some(&b.qh), out);
    }
}

/// One Q4_K / Q5_K super-block (`qh`: Q5_K's fifth bits) into the 256 floats of `out`.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn dequant_q45_k(d: f32, dmin: f32, scales: &[u8; 12], qs: &[u8; 128], qh: Option<&[u8; 32]>, out: &mut [f32]) {
    let (sc, mn) = scale_min_k4(scales);
    let o = out.as_mut_ptr();
    // Bit `sub` of each of 16 `qh` bytes, moved to bit 4 (a 16-bit shift by sub < 8 brings
    // no bit of a high byte into a low one).
    let fifth = |h: __m128i, sub: usize| {
        _mm_slli_epi16::<4>(_mm_and_si128(_mm_srl_epi16(h, _mm_cvtsi32_si128(sub as i32)), _mm_set1_epi8(1)))
    };
    // Q5_K's fifth bits of elements 0..16 and 16..32, loaded once per super-block.
    let qh = qh.map(|h| (_mm_loadu_si128(h.as_ptr().cast()), _mm_loadu_si128(h.as_ptr().add(16).cast())));
    for j in 0..4 {
        let q = qs.as_ptr().add(32 * j);
        let (lo0, hi0) = nibbles(_mm_loadu_si128(q.cast()));
        let (lo1, hi1) = nibbles(_mm_loadu_si128(q.add(16).cast()));
        for (sub, mut lo, mut hi) in [(2 * j, lo0, lo1), (2 * j + 1, hi0, hi1)] {
            if let Some((h0, h1)) = qh {
                lo = _mm_or_si128(lo, fifth(h0, sub));
                hi = _mm_or_si128(hi, fifth(h1, sub));
            }
            let dl = _mm256_set1_ps(d * sc[sub] as f32);
            let ml = _mm256_set1_ps(dmin * mn[sub] as f32);
            let os = o.add(32 * sub);
            for (i, v) in [lo, _mm_srli_si128::<8>(lo), hi, _mm_srli_si128::<8>(hi)].into_iter().enumerate() {
                let qf = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v));
                _mm256_storeu_ps(os.add(8 * i), _mm256_sub_ps(_mm256_mul_ps(dl, qf), ml));
            }
        }
    }
}

/// Dequantizes a Q6_K row bit-identically to `quant::dequant::q6_k`
/// (`dl = d * scale`, then `dl * (q - 32)`).
///
/// # Safety
/// AVX2 + FMA; `src` whole 210-byte super-blocks, `dst` 256 floats per super-block.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn dequant_q6_k(src: &[u8], dst: &mut [f32]) {
    for (blk, out) in src.chunks_exact(Q6K_BYTES).zip(dst.chunks_exact_mut(QK_K)) {
        let b: BlockQ6K = read(blk, 0);
        let d = b.d.to_f32();
        let o = out.as_mut_ptr();
        for h in 0..2 {
            let (ql, qh) = (b.ql.as_ptr().add(64 * h), b.qh.as_ptr().add(32 * h));
            for half in 0..2 {
                let l0 = 16 * half;
                for (s, v) in q6_codes(ql, qh, l0).into_iter().enumerate() {
                    let dl = _mm256_set1_ps(d * b.scales[8 * h + 2 * s + half] as f32);
                    let os = o.add(128 * h + 32 * s + l0);
                    for (i, v) in [v, _mm_srli_si128::<8>(v)].into_iter().enumerate() {
                        let qf = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v));
                        _mm256_storeu_ps(os.add(8 * i), _mm256_mul_ps(dl, qf));
                    }
                }
            }
        }
    }
}
