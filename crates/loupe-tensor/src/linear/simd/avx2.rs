//! What the AVX2 (+FMA, F16C) kernels of every layer share: the horizontal sum, whose
//! fixed lane order the bit-identity of decode, GEMV and batch rests on; f16 loads; and
//! the Act16 types' weight blocks unpacked to 16-bit lanes (per block `b` of 32: two
//! vectors of 16 i16, exact, ready for `vpmaddwd` against 16-bit activations).
//! AVX2 (+FMA, F16C) kernels: the single-row Act16 dots that `decode::dot_row_act16`
//! runs at [`crate::quant::Isa::Avx2`] (and, for Q5_0, Q6_K and Q4_K, at `Avx512` too), and their
//! multi-row twins, which repeat the single-row arithmetic per activation row.
//!
//! Per block `b` of 32: the 32 weights widened to two vectors of 16 i16, each
//! `vpmaddwd`'d with 16 activations and the two i32 vectors added (exact: at most
//! 4 products of |w| <= 128 and |q| <= 32767 per lane, < 2^24 so the f32
//! conversion is exact too; Q6_K's weights carry their sub-block scale, |w| <= 4096,
//! lanes < 2^29 exact in i32 and rounded once by the conversion, see [`q6_k`]), converted, and FMA'd with `d * scale` broadcast into
//! accumulator `b % 2` (Q6_K / Q4_K: a super-block of 8 blocks per iteration, same
//! order); Q4_1's (Q4_K's `-(dmin * m)`) `m * sum` is added to a scalar offset from +0.0 block
//! by block. Result: `hsum(acc0 + acc1) (+ offset)`.

use std::arch::x86_64::*;

use crate::linear::dispatch::MAX_STACK_BLOCKS;
use crate::linear::kinds::*;
pub(crate) use crate::reduce::avx2::hsum;

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn f16_at(p: *const u8) -> f32 {
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(std::ptr::read_unaligned(p as *const u16) as i32)))
}

/// `vpmovzxbw` of the 16 bytes at `p` (one load and one shuffle), written out because,
/// given the intrinsic followed by the nibble masks, LLVM moves the masks before the
/// widening and widens twice: two shuffles per block, the port that limited the decode
/// GEMV on an AMD EPYC (Zen 3). With this the hot Q4_1 GEMV ran ~1.45x faster there.
#[inline]
#[target_feature(enable = "avx2")]
pub(crate) unsafe fn widen_u8(p: *const u8) -> __m256i {
    let v: __m256i;
    std::arch::asm!("vpmovzxbw {v}, xmmword ptr [{p}]", v = out(ymm_reg) v, p = in(reg) p, options(pure, readonly, nostack, preserves_flags));
    v
}

/// Q4_1 block at `blk`: elements 0..16 (low nibbles) and 16..32 (high nibbles) as i16.
/// Byte `i` widened to word `i` holds element `i` in its low nibble and `i + 16` in its
/// high one.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn nibbles(blk: *const u8) -> (__m256i, __m256i) {
    let w16 = widen_u8(blk.add(4));
    (_mm256_and_si256(w16, _mm256_set1_epi16(0x0F)), _mm256_srli_epi16::<4>(w16))
}

/// Q8_0 block at `blk` as two vectors of 16 i16.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn bytes(blk: *const u8) -> (__m256i, __m256i) {
    let a = _mm_loadu_si128(blk.add(2) as *const __m128i);
    let b = _mm_loadu_si128(blk.add(18) as *const __m128i);
    (_mm256_cvtepi8_epi16(a), _mm256_cvtepi8_epi16(b))
}

/// Q5_0 block at `blk` (`f16 d; u8 qh[4]; u8 qs[16]`): elements 0..16 and 16..32 as
/// i16 `q - 16` (-16..=15). Element `j`'s low 4 bits are the low (`j < 16`) or high
/// nibble of `qs[j % 16]`, its fifth bit is bit `j` of the little-endian `qh`. Word `j`
/// of the low vector tests bit `j` of `qh`'s low half (broadcast to every word), of the
/// high vector bit `j` of its high half; where the bit is clear, `0xFFF0` is or'ed over
/// the nibble, which makes it `nibble - 16` (set: `nibble + 16 - 16`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn q5_0(blk: *const u8) -> (__m256i, __m256i) {
    let w16 = widen_u8(blk.add(6));
    let bit = _mm256_setr_epi16(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, i16::MIN);
    let neg = _mm256_set1_epi16(0xFFF0_u16 as i16);
    let hl = _mm256_set1_epi16(std::ptr::read_unaligned(blk.add(2) as *const i16));
    let hh = _mm256_set1_epi16(std::ptr::read_unaligned(blk.add(4) as *const i16));
    let set_lo = _mm256_cmpeq_epi16(_mm256_and_si256(hl, bit), bit);
    let set_hi = _mm256_cmpeq_epi16(_mm256_and_si256(hh, bit), bit);
    let lo = _mm256_or_si256(_mm256_and_si256(w16, _mm256_set1_epi16(0x0F)), _mm256_andnot_si256(set_lo, neg));
    let hi = _mm256_or_si256(_mm256_srli_epi16::<4>(w16), _mm256_andnot_si256(set_hi, neg));
    (lo, hi)
}

/// Q4_0 block at `blk` (`f16 d; u8 qs[16]`): elements 0..16 (low nibbles) and 16..32 (high
/// nibbles) as i16 `q - 8` (-8..=7, ggml's `dequantize_row_q4_0`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn q4_0(blk: *const u8) -> (__m256i, __m256i) {
    let w16 = widen_u8(blk.add(2));
    let eight = _mm256_set1_epi16(8);
    (
        _mm256_sub_epi16(_mm256_and_si256(w16, _mm256_set1_epi16(0x0F)), eight),
        _mm256_sub_epi16(_mm256_srli_epi16::<4>(w16), eight),
    )
}

/// Q6_K's 32-element Act16 block `b` of a row at `w` (`block_q6_K { u8 ql[128]; u8
/// qh[64]; i8 scales[16]; f16 d }`, 210 bytes per 256 elements): elements 0..16 and
/// 16..32 as i16 `(q - 32) * scale`, each half one 16-element sub-block with its own
/// i8 scale. Block `b` is quarter `j = b % 4` of half `h = b / 4 % 2` of super-block
/// `b / 8`: element `l` takes its low 4 bits from nibble `j / 2` of `ql[64h + 32 (j %
/// 2) + l]`, its top 2 from bits `2j..2j + 2` of `qh[32h + l]`, and its scale from
/// `scales[8h + 2j + l / 16]` (ggml's `dequantize_row_q6_K`). `|(q - 32) * scale| <=
/// 32 * 128 = 4096` fits i16 exactly, so `vpmaddwd` against 16-bit activations
/// (|x| <= 32767) is exact per lane: 4 products per lane of [`block_dot`] are at most
/// 4 * 4096 * 32767 < 2^29, so the i32 lanes are `sc0 * isum0 + sc1 * isum1` split
/// over 8 lanes, exact; their conversion to f32 may round (above 2^24), identically
/// in every AVX2 path.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn q6_k(w: *const u8, b: usize) -> (__m256i, __m256i) {
    let sb = w.add(b / 8 * 210);
    let (h, j) = (b / 4 % 2, b % 4);
    let l = _mm256_loadu_si256(sb.add(64 * h + 32 * (j % 2)) as *const __m256i);
    let hb = _mm256_loadu_si256(sb.add(128 + 32 * h) as *const __m256i);
    // 16-bit shifts move bits across the byte boundary only into bits the masks clear:
    // after the right shift by 2j <= 6, bits 0-1 of each byte are its bits 2j, 2j + 1,
    // and the left shift by 4 puts them at bits 4-5 of the same byte.
    let low = _mm256_and_si256(_mm256_srl_epi16(l, _mm_cvtsi32_si128(4 * (j / 2) as i32)), _mm256_set1_epi8(0x0F));
    let high = _mm256_and_si256(
        _mm256_slli_epi16::<4>(_mm256_srl_epi16(hb, _mm_cvtsi32_si128(2 * j as i32))),
        _mm256_set1_epi8(0x30),
    );
    let code = _mm256_sub_epi8(_mm256_or_si256(low, high), _mm256_set1_epi8(32));
    let sc = sb.add(192 + 8 * h + 2 * j);
    let (sc0, sc1) = (_mm256_set1_epi16(*sc as i8 as i16), _mm256_set1_epi16(*sc.add(1) as i8 as i16));
    let lo = _mm256_cvtepi8_epi16(_mm256_castsi256_si128(code));
    let hi = _mm256_cvtepi8_epi16(_mm256_extracti128_si256::<1>(code));
    (_mm256_mullo_epi16(lo, sc0), _mm256_mullo_epi16(hi, sc1))
}

/// Q6_K (`$kind`): the blocks of whole super-blocks in the order of the pair loop
/// (even blocks into `$acc0`, odd into `$acc1`), a super-block per iteration with `b = 8
/// s + i`, `i` constant, so [`q6_k`]'s shifts and offsets fold to constants. Evaluates
/// to the first block left (0 for the other kinds).
macro_rules! super_blocks {
    ($kind:expr, $blocks:expr, $step:ident, $acc0:ident, $acc1:ident) => {{
        if is_k($kind) {
            for s in 0..$blocks / 8 {
                let b8 = 8 * s;
                $step!(b8, $acc0);
                $step!(b8 + 1, $acc1);
                $step!(b8 + 2, $acc0);
                $step!(b8 + 3, $acc1);
                $step!(b8 + 4, $acc0);
                $step!(b8 + 5, $acc1);
                $step!(b8 + 6, $acc0);
                $step!(b8 + 7, $acc1);
            }
            $blocks / 8 * 8
        } else {
            0
        }
    }};
}
pub(crate) use super_blocks;

/// Q4_K's 32-element Act16 block `b` of a row at `w` (`block_q4_K { f16 d; f16 dmin;
/// u8 scales[12]; u8 qs[128] }`, 144 bytes per 256 elements): sub-block `j = b % 8` of
/// super-block `b / 8`, its 4-bit codes `q` (0..=15, unscaled) from the low (`j`
/// even) or high nibbles of `qs[32 (j / 2)..][..32]`, as i16 (elements 0..16, 16..32).
/// The integer lanes of [`block_dot`] are then exact in f32 (< 2^24); the sub-block's
/// scale and min are applied in f32 ([`q4_k_dm`]).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn q4_k(w: *const u8, b: usize) -> (__m256i, __m256i) {
    widen_bytes(k_nibbles(w.add(b / 8 * 144 + 16), b % 8))
}

/// Sub-block `j`'s 32 nibbles (0..=15, as bytes) of the 128 code bytes at `qs` of a Q4_K /
/// Q5_K super-block: the low (`j` even) or high nibbles of `qs[32 (j / 2)..][..32]`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn k_nibbles(qs: *const u8, j: usize) -> __m256i {
    let v = _mm256_loadu_si256(qs.add(32 * (j / 2)) as *const __m256i);
    _mm256_and_si256(_mm256_srl_epi16(v, _mm_cvtsi32_si128(4 * (j % 2) as i32)), _mm256_set1_epi8(0x0F))
}

/// 32 unsigned bytes as i16, elements 0..16 and 16..32.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn widen_bytes(q: __m256i) -> (__m256i, __m256i) {
    (_mm256_cvtepu8_epi16(_mm256_castsi256_si128(q)), _mm256_cvtepu8_epi16(_mm256_extracti128_si256::<1>(q)))
}

/// Q5_K's 32-element Act16 block `b` of a row at `w` (`block_q5_K { f16 d; f16 dmin;
/// u8 scales[12]; u8 qh[32]; u8 qs[128] }`, 176 bytes per 256 elements): [`q4_k`]'s nibble
/// of sub-block `j = b % 8` from `qs[32 (j / 2)..][..32]`, plus 16 where bit `j` of `qh[l]`
/// is set (ggml's `dequantize_row_q5_K`): codes 0..=31, unscaled, as i16. The integer
/// lanes of [`block_dot`] stay exact in f32 (4 * 31 * 32767 < 2^24).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn q5_k(w: *const u8, b: usize) -> (__m256i, __m256i) {
    let (j, sb) = (b % 8, w.add(b / 8 * 176));
    // Bit j of each qh byte to bit 0 (a 16-bit shift by j < 8 brings no bit of the high byte
    // into bit 0 of the low one), then to bit 4 (inside its byte).
    let qh = _mm256_loadu_si256(sb.add(16) as *const __m256i);
    let bit = _mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(j as i32)), _mm256_set1_epi8(1));
    widen_bytes(_mm256_or_si256(k_nibbles(sb.add(48), j), _mm256_slli_epi16::<4>(bit)))
}

/// Block `b` of a row at `w` of `KIND`, elements 0..16 and 16..32 as i16 (the
/// unpacking every AVX2 Act16 kernel uses; the integer lanes of [`block_dot`] depend
/// only on it).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn unpack<const KIND: u8>(w: *const u8, b: usize) -> (__m256i, __m256i) {
    let blk = w.add(b * block_bytes(KIND));
    match KIND {
        Q4_1 => nibbles(blk),
        Q5_0 => q5_0(blk),
        Q4_0 => q4_0(blk),
        Q6_K => q6_k(w, b),
        Q4_K => q4_k(w, b),
        Q5_K => q5_k(w, b),
        _ => bytes(blk),
    }
}

/// The exact integer dot of one block's weights with 32 activations at `q`, as 8 i32
/// lanes converted to f32.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn block_dot(w: (__m256i, __m256i), q: *const i16) -> __m256 {
    let lo = _mm256_madd_epi16(w.0, _mm256_loadu_si256(q as *const __m256i));
    let hi = _mm256_madd_epi16(w.1, _mm256_loadu_si256(q.add(16) as *const __m256i));
    _mm256_cvtepi32_ps(_mm256_add_epi32(lo, hi))
}

/// Block `b`'s `(d, m)` of an offset kind: Q4_1's two halves; Q4_K's (Q5_K's) `d * sc` and
/// `-(dmin * m)` ([`q4_k_dm`]).
#[inline(always)]
pub(crate) unsafe fn dm_at<const KIND: u8>(w: *const u8, b: usize) -> (f32, f32) {
    if has_k_scales(KIND) {
        q4_k_dm(w.add(b / 8 * k_super_bytes(KIND)), b % 8)
    } else {
        let blk = w.add(b * 20);
        (f16_at(blk), f16_at(blk.add(2)))
    }
}

/// Sub-block `j`'s `(d * sc, -(dmin * m))` of the Q4_K (or Q5_K: the same first 16 bytes)
/// super-block at `sb` (ggml's
/// `get_scale_min_k4`; both products of an f16 and a 6-bit integer, exact in f32, and
/// the negation exact: the value `d sc q - dmin m` is `d' q + m'`).
#[inline(always)]
pub(crate) unsafe fn q4_k_dm(sb: *const u8, j: usize) -> (f32, f32) {
    let sc = |i: usize| *sb.add(4 + i);
    let (s, m) = if j < 4 {
        (sc(j) & 63, sc(j + 4) & 63)
    } else {
        ((sc(j + 4) & 0x0F) | ((sc(j - 4) >> 6) << 4), (sc(j + 4) >> 4) | ((sc(j) >> 6) << 4))
    };
    let (d, dmin) = (f16_at(sb), f16_at(sb.add(2)));
    (d * s as f32, -(dmin * m as f32))
}

/// All 8 sub-blocks' `(d * sc, -(dmin * m))` of the Q4_K super-block at `sb`, the
/// values of [`q4_k_dm`] bit for bit (each an exact product, whatever computes it),
/// with the scales unpacked 8 at a time.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn q4_k_dms(sb: *const u8) -> ([f32; 8], [f32; 8]) {
    let (sc, mn) = scales_mins_q4k(sb.add(4));
    let (mut d, mut m) = ([0f32; 8], [0f32; 8]);
    _mm256_storeu_ps(d.as_mut_ptr(), _mm256_mul_ps(_mm256_set1_ps(f16_at(sb)), sc));
    _mm256_storeu_ps(m.as_mut_ptr(), _mm256_mul_ps(_mm256_set1_ps(-f16_at(sb.add(2))), mn));
    (d, m)
}

/// Every Act16 block's `(d', m')` ([`q4_k_dms`]) of one Q4_K / Q5_K weight row, decoded once
/// for the multi-row kernels' per-row `prepare` of every ISA.
pub(crate) struct KDms([[f32; 8]; 2 * MAX_STACK_BLOCKS / 8]);

impl KDms {
    /// The table of the row at `row` of `kind` with `blocks` Act16 blocks (at most
    /// [`MAX_STACK_BLOCKS`]); all zeros for a kind without K scales ([`has_k_scales`]).
    ///
    /// # Safety
    /// AVX2, FMA, F16C; `row` holds `blocks / 8` whole super-blocks of `kind`.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn of_row(row: *const u8, kind: u8, blocks: usize) -> KDms {
        let mut t = [[0f32; 8]; 2 * MAX_STACK_BLOCKS / 8];
        if has_k_scales(kind) {
            for s in 0..blocks / 8 {
                (t[2 * s], t[2 * s + 1]) = q4_k_dms(row.add(s * k_super_bytes(kind)));
            }
        }
        KDms(t)
    }

    /// Block `b`'s `(d', m')`.
    #[inline(always)]
    pub(crate) fn at(&self, b: usize) -> (f32, f32) {
        (self.0[b / 8 * 2][b % 8], self.0[b / 8 * 2 + 1][b % 8])
    }
}

/// The 8 six-bit scales and 8 mins of a Q4_K block as f32 lanes
/// ([`scale_min_k4_words`](crate::quant::blocks::scale_min_k4_words), equal to the byte-wise
/// `scale_min_k4` for every input: `q4k_scale_unpacking_matches_scale_min_k4`).
///
/// # Safety
/// AVX2; 12 readable bytes at `p`.
#[inline]
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn scales_mins_q4k(p: *const u8) -> (__m256, __m256) {
    let [s0, s1, m0, m1] = crate::quant::blocks::scale_min_k4_words(&std::ptr::read_unaligned(p.cast()));
    let v = _mm_set_epi32(m1 as i32, m0 as i32, s1 as i32, s0 as i32);
    let widen = |v: __m128i| _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v));
    (widen(v), widen(_mm_srli_si128::<8>(v)))
}
