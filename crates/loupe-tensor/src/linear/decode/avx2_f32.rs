//! Q4_0, Q5_0, Q5_1, MXFP4 and NVFP4 rows against f32 activations, dequantized in
//! registers: each block's 32 (sub-block's 16) values become exact small integers as i8
//! (nibbles minus 8; nibbles with their fifth bit, minus 16 for Q5_0; MXFP4/NVFP4 nibbles
//! through `vpshufb` on ggml's doubled `kvalues_mxfp4`), are widened to f32 and FMA'd with
//! the activations, and each block's sum is multiplied by its scale once (Q5_1 adds `m`
//! times the block's activation sum). The scalar reference dequantizes block by block
//! through `dequantize_row` (one call per 32 or 64 weights), which decoded these formats at
//! 8-11 tokens/s on SmolLM2 (AMD EPYC Zen 3, 2 threads). Q5_0's decode and batched decode
//! run the Act16 kernels instead ([`dot_row_act16`]); its f32 dot here is left to rows too
//! long for them (over `dispatch::MAX_STACK_BLOCKS` blocks).

use std::arch::x86_64::*;

use crate::linear::simd::avx2::{f16_at, hsum};
use crate::quant::dequant::{e8m0_half, ue4m3_half, MXFP4_VALUES};

#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn table() -> __m128i {
    _mm_loadu_si128(MXFP4_VALUES.as_ptr().cast())
}

/// The i8 lanes 0..8 of `v` as f32, times the 8 floats at `x`, added to `acc`.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn fma8(v: __m128i, x: *const f32, acc: __m256) -> __m256 {
    _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v)), _mm256_loadu_ps(x), acc)
}

/// The low and high nibbles of the bytes of `q`, each as a byte (0..16).
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn nibbles(q: __m128i) -> (__m128i, __m128i) {
    let mask = _mm_set1_epi8(0x0F);
    (_mm_and_si128(q, mask), _mm_and_si128(_mm_srli_epi16::<4>(q), mask))
}

/// A 32-element block as i8 values, elements 0..16 in `lo` and 16..32 in `hi`, times
/// the 32 floats at `x`: 8 f32 partial sums.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn block32(lo: __m128i, hi: __m128i, x: *const f32) -> __m256 {
    let mut s = fma8(lo, x, _mm256_setzero_ps());
    s = fma8(_mm_srli_si128::<8>(lo), x.add(8), s);
    s = fma8(hi, x.add(16), s);
    fma8(_mm_srli_si128::<8>(hi), x.add(24), s)
}

/// `block_q4_0 { f16 d; u8 qs[16] }` (18 bytes): element `j` in the low nibble of
/// `qs[j]`, `j + 16` in the high one; value `d * (q - 8)`.
///
/// # Safety
/// AVX2 + FMA + F16C; `w` whole blocks, `x` 32 floats per block.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_q4_0(w: &[u8], x: &[f32]) -> f32 {
    let eight = _mm_set1_epi8(8);
    let mut acc = _mm256_setzero_ps();
    for (b, blk) in w.chunks_exact(18).enumerate() {
        let (lo, hi) = nibbles(_mm_loadu_si128(blk.as_ptr().add(2).cast()));
        let s = block32(_mm_sub_epi8(lo, eight), _mm_sub_epi8(hi, eight), x.as_ptr().add(32 * b));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(f16_at(blk.as_ptr())), s, acc);
    }
    hsum(acc)
}

/// `block_q5_0 { f16 d; u8 qh[4]; u8 qs[16] }` (22 bytes), value `d * (q - 16)`, and
/// `block_q5_1 { f16 d; f16 m; u8 qh[4]; u8 qs[16] }` (24 bytes), value `d * q + m`
/// (`OFFSET`, whose `m` multiplies the block's activation sum `sums[b]`, as Q4_1's does):
/// the low 4 bits of element `j` as in Q4_0, bit 4 is bit `j` of `qh`.
///
/// # Safety
/// AVX2 + FMA + F16C; `w` whole blocks, `x` 32 floats per block, and with `OFFSET`
/// `sums` one float per block.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_q5<const OFFSET: bool>(w: &[u8], x: &[f32], sums: &[f32]) -> f32 {
    let bytes = if OFFSET { 24 } else { 22 };
    let qh_at = if OFFSET { 4 } else { 2 };
    let sixteen = _mm_set1_epi8(16);
    // Byte j of a 16-byte vector tests bit j % 8 of its qh byte.
    let bit = _mm_set1_epi64x(0x8040_2010_0804_0201_u64 as i64);
    let mut acc = _mm256_setzero_ps();
    let mut offset = 0f32;
    for (b, blk) in w.chunks_exact(bytes).enumerate() {
        let p = blk.as_ptr();
        let qh = std::ptr::read_unaligned(p.add(qh_at) as *const u32);
        // Bits 0..16 (elements 0..16) and 16..32 (elements 16..32) spread one per byte:
        // byte j holds qh byte j / 8, then 0x10 where its bit j % 8 is set.
        let spread = |bits: u32| {
            let v = _mm_shuffle_epi8(_mm_cvtsi32_si128(bits as i32), _mm_set_epi64x(0x0101_0101_0101_0101, 0));
            _mm_and_si128(_mm_cmpeq_epi8(_mm_and_si128(v, bit), bit), sixteen)
        };
        let (lo4, hi4) = nibbles(_mm_loadu_si128(p.add(qh_at + 4).cast()));
        let mut lo = _mm_or_si128(lo4, spread(qh & 0xFFFF));
        let mut hi = _mm_or_si128(hi4, spread(qh >> 16));
        if !OFFSET {
            lo = _mm_sub_epi8(lo, sixteen);
            hi = _mm_sub_epi8(hi, sixteen);
        }
        let s = block32(lo, hi, x.as_ptr().add(32 * b));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(f16_at(p)), s, acc);
        if OFFSET {
            offset += f16_at(p.add(2)) * *sums.get_unchecked(b);
        }
    }
    hsum(acc) + offset
}

/// `block_mxfp4 { u8 e; u8 qs[16] }` (17 bytes, 32 weights): element `j` in the low
/// nibble of `qs[j]`, `j + 16` in the high one; value `kvalues[q] * e8m0_half(e)`.
///
/// # Safety
/// AVX2 + FMA; `w` whole blocks, `x` 32 floats per block.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn dot_mxfp4(w: &[u8], x: &[f32]) -> f32 {
    let kv = table();
    let mut acc = _mm256_setzero_ps();
    for (b, blk) in w.chunks_exact(17).enumerate() {
        let (lo, hi) = nibbles(_mm_loadu_si128(blk.as_ptr().add(1).cast()));
        let s = block32(_mm_shuffle_epi8(kv, lo), _mm_shuffle_epi8(kv, hi), x.as_ptr().add(32 * b));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(e8m0_half(blk[0])), s, acc);
    }
    hsum(acc)
}

/// `GgmlType::Fp8E4M3` (34 bytes: f16 `d`, then 32 E4M3 codes), value `d * e4m3(q)`.
/// Each code becomes the f16 of its value / 256 by moving bits (`(q & 0x7f) << 7` is
/// the magnitude, E4M3's exponent field landing in f16's, whose bias is 8 more, normals
/// and subnormals alike; the sign to bit 15; the NaN codes to an f16 NaN), F16C widens
/// it exactly, and the block's sum is multiplied by `256 * d` (a power-of-two scaling,
/// exact): the values of the scalar reference, summed in another order.
///
/// # Safety
/// AVX2 + FMA + F16C; `w` whole blocks, `x` 32 floats per block.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dot_fp8_e4m3(w: &[u8], x: &[f32]) -> f32 {
    let magnitude = _mm256_set1_epi16(0x7f);
    let sign = _mm256_set1_epi16(0x80);
    let nan = _mm256_set1_epi16(0x7e00);
    let mut acc = _mm256_setzero_ps();
    for (b, blk) in w.chunks_exact(34).enumerate() {
        let xp = x.as_ptr().add(32 * b);
        let mut s = _mm256_setzero_ps();
        for part in 0..2 {
            let c = _mm256_cvtepu8_epi16(_mm_loadu_si128(blk.as_ptr().add(2 + 16 * part).cast()));
            let m = _mm256_and_si256(c, magnitude);
            let h = _mm256_or_si256(_mm256_slli_epi16::<7>(m), _mm256_slli_epi16::<8>(_mm256_and_si256(c, sign)));
            let h = _mm256_blendv_epi8(h, nan, _mm256_cmpeq_epi16(m, magnitude));
            s = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm256_castsi256_si128(h)), _mm256_loadu_ps(xp.add(16 * part)), s);
            s = _mm256_fmadd_ps(
                _mm256_cvtph_ps(_mm256_extracti128_si256::<1>(h)),
                _mm256_loadu_ps(xp.add(16 * part + 8)),
                s,
            );
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(f16_at(blk.as_ptr()) * 256.0), s, acc);
    }
    hsum(acc)
}

/// `block_nvfp4 { u8 d[4]; u8 qs[32] }` (36 bytes, 64 weights): sub-block `s` is
/// `qs[8s..8s + 8]`, byte `j` holding element `16s + j` (low nibble) and `16s + j + 8`
/// (high); value `kvalues[q] * ue4m3_half(d[s])`. The per-tensor scale is applied by
/// the caller, as for every NVFP4 path.
///
/// # Safety
/// AVX2 + FMA; `w` whole blocks, `x` 64 floats per block.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn dot_nvfp4(w: &[u8], x: &[f32]) -> f32 {
    let kv = table();
    let mut acc = _mm256_setzero_ps();
    for (b, blk) in w.chunks_exact(36).enumerate() {
        for s in 0..4 {
            let xp = x.as_ptr().add(64 * b + 16 * s);
            let (lo, hi) = nibbles(_mm_loadl_epi64(blk.as_ptr().add(4 + 8 * s).cast()));
            let sum =
                fma8(_mm_shuffle_epi8(kv, hi), xp.add(8), fma8(_mm_shuffle_epi8(kv, lo), xp, _mm256_setzero_ps()));
            acc = _mm256_fmadd_ps(_mm256_set1_ps(ue4m3_half(blk[s])), sum, acc);
        }
    }
    hsum(acc)
}
