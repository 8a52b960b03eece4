//! AVX2 dots of Q4_K, Q5_K and Q6_K weight rows against Q8_K activations (the K-quants'
//! arithmetic under `--precision q8` and `auto`), in the lane arithmetic that the AVX-512
//! tiles (`avx512_ktile`) repeat bit for bit, so a row has the same bits on either ISA and
//! in any tile shape.
//!
//! # The lane contract
//! Each super-block of 256 weights gives 8 i32 lanes of exact integer sums. A super-block
//! is read as 64-byte code vectors (Q4_K: the low or high nibbles of `qs[64k..64k + 64]`;
//! Q5_K: the same with each element's fifth bit from `qh` as bit 4, 0..=31; Q6_K: one
//! 64-element quarter-pair of a half, in element order); lane `j` sums byte
//! columns `4j..4j + 4` of both 32-byte halves of every code vector, the products
//! `code * activation * sub-block scale` as `vpmaddubsw` + `vpmaddwd` pair them. (Here the
//! two halves are two 256-bit registers added at the end; the AVX-512 tiles hold them in
//! one register and fold it.)
//! * Q6_K subtracts its `-32` bias in integers: lane `j` minus
//!   `32 * (sc_2j bsum_2j + sc_2j+1 bsum_2j+1)` (`bsums`: the activations' 16-element sums).
//! * The f32 accumulator (8 lanes) takes, per super-block, `acc = fma(f32(isum), d_a * d_w,
//!   acc)`; Q4_K's (and Q5_K's) mins accumulator (8 lanes) `mins = fma(f32(corr), d_a * dmin_w, mins)`,
//!   where lane `j` of `corr` is `m_j * (bsum_2j + bsum_2j+1)`, the sub-block min times its
//!   activation sum (Q6_K's stays zero).
//! * The row's value is `hsum(acc - mins)` in `reduce::avx2::hsum`'s order.
//!
//! Integers are exact (no i16 step saturates: `2 * 63 * 128` at most; an i32 lane holds at
//! most 16 products of 63 x 128 x 128 plus a bias of the same size). Only the f32 steps
//! round, and they are the same operations in the same order on every path. Per super-block
//! that is one conversion and one FMA (two for Q4_K) on 8 lanes; no horizontal sum until
//! the row ends.
//!
//! The multi-row forms (`q4k_rows`, `q6k_rows`) unpack a weight row once per super-block for
//! up to 4 activation rows, each dot the single-row arithmetic: the AVX2 tile kernel of
//! `--precision q8`'s matmul (prefill, batches).
//!
//! Safety: every `unsafe fn` requires AVX2, FMA and F16C and rows of the lengths
//! [`super::check_dot`] verifies (the tile, the [`TileFn`] contract); they are reachable
//! only through [`super::vec_dot_fn`] and [`super::tile_fn`], which check the CPU.

use std::arch::x86_64::*;
use std::ptr::read_unaligned;

use crate::reduce::avx2::hsum;

use loupe_core::GgmlType;

use super::blocks::{scale_min_k4_words, QK_K};
use super::TileFn;

// `block_q8_K { f32 d; i8 qs[256]; i16 bsums[16] }`.
pub(super) const A_SIZE: usize = 292;
pub(super) const A_QS: usize = 4;
pub(super) const A_BSUMS: usize = 4 + QK_K;

/// The f16 at `p` as f32.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn f16_at(p: *const u8) -> f32 {
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(read_unaligned(p.cast::<u16>()) as i32)))
}

/// Q4_K's 8 scales (low 8 bytes) and 8 mins (high 8 bytes) of the super-block at `x`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q4k_scales_mins(x: *const u8) -> __m128i {
    let [s0, s1, m0, m1] = scale_min_k4_words(&read_unaligned(x.add(4).cast()));
    _mm_set_epi32(m1 as i32, m0 as i32, s1 as i32, s0 as i32)
}

/// The 16 i16 lanes `[m0, m0, m1, m1, .., m7, m7]` of a `q4k_scales_mins` vector: a
/// `vpmaddwd` multiplier that gives `m_j * (bsum_2j + bsum_2j+1)` in i32 lane `j`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q4k_mins_pairs(sm: __m128i) -> __m256i {
    let m = _mm_cvtepu8_epi16(_mm_srli_si128::<8>(sm));
    _mm256_set_m128i(_mm_unpackhi_epi16(m, m), _mm_unpacklo_epi16(m, m))
}

/// A `vpshufb` control whose every i16 lane reads i16 lane `s` of its 128-bit lane.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn pick16(s: i16) -> __m128i {
    _mm_set1_epi16(((2 * s + 1) << 8) | (2 * s))
}

/// The f32 accumulator less the mins accumulator, summed in the contract's order.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn finish(acc: __m256, mins: __m256) -> f32 {
    hsum(_mm256_sub_ps(acc, mins))
}

/// Dot of a Q4_K row with a Q8_K row.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn dot_q4k(w: *const u8, a: *const u8, n: usize) -> f32 {
    q4k_rows::<1, false>(w, a, 0, n)[0]
}

/// Dot of a Q5_K row with a Q8_K row.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn dot_q5k(w: *const u8, a: *const u8, n: usize) -> f32 {
    q4k_rows::<1, true>(w, a, 0, n)[0]
}

/// Dot of a Q6_K row with a Q8_K row.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn dot_q6k(w: *const u8, a: *const u8, n: usize) -> f32 {
    q6k_rows::<1>(w, a, 0, n)[0]
}

/// Dots of one Q4_K row (with `Q5`, Q5_K) with `CA` Q8_K rows (`a_stride` bytes apart): the
/// weight row's codes and scales unpacked once per super-block for all of them, each dot the
/// single-row arithmetic (the contract above), so each has [`dot_q4k`]'s ([`dot_q5k`]'s)
/// bits.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4k_rows<const CA: usize, const Q5: bool>(
    w: *const u8,
    a: *const u8,
    a_stride: usize,
    n: usize,
) -> [f32; CA] {
    let m4 = _mm256_set1_epi8(0x0F);
    let m1 = _mm256_set1_epi8(0x01);
    // Q5_K: 32 bytes of fifth bits between the scales and the nibbles.
    let (block_bytes, qs) = if Q5 { (176, 48) } else { (144, 16) };
    let mut acc = [_mm256_setzero_ps(); CA];
    let mut mins = [_mm256_setzero_ps(); CA];
    for i in 0..n / QK_K {
        let x = w.add(i * block_bytes);
        // Bit j of qh[l] is element 32 j + l's fifth bit (ggml's dequantize_row_q5_K).
        let qh = if Q5 { _mm256_loadu_si256(x.add(16).cast()) } else { _mm256_setzero_si256() };
        let fifth = |j: i32| _mm256_slli_epi16::<4>(_mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(j)), m1));
        let y = |r: usize| a.add(r * a_stride + i * A_SIZE);
        let sm = q4k_scales_mins(x);
        let sc = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(sm));
        let mut isum = [[_mm256_setzero_si256(); 2]; CA];
        // Chunk c (`qs[32c..32c + 32]`): low nibbles are sub-block 2c, high 2c + 1; chunks
        // 0 and 2 are the first 32 bytes of the contract's code vectors.
        for c in 0..4 {
            let q = _mm256_loadu_si256(x.add(qs + 32 * c).cast());
            let (mut lo, mut hi) = (_mm256_and_si256(q, m4), _mm256_and_si256(_mm256_srli_epi16::<4>(q), m4));
            if Q5 {
                lo = _mm256_or_si256(lo, fifth(2 * c as i32));
                hi = _mm256_or_si256(hi, fifth(2 * c as i32 + 1));
            }
            let s0 = _mm256_shuffle_epi8(sc, _mm256_broadcastsi128_si256(pick16(2 * c as i16)));
            let s1 = _mm256_shuffle_epi8(sc, _mm256_broadcastsi128_si256(pick16(2 * c as i16 + 1)));
            for (r, sums) in isum.iter_mut().enumerate() {
                let a0 = _mm256_loadu_si256(y(r).add(A_QS + 64 * c).cast());
                let a1 = _mm256_loadu_si256(y(r).add(A_QS + 64 * c + 32).cast());
                let p0 = _mm256_madd_epi16(_mm256_maddubs_epi16(lo, a0), s0);
                let p1 = _mm256_madd_epi16(_mm256_maddubs_epi16(hi, a1), s1);
                sums[c % 2] = _mm256_add_epi32(sums[c % 2], _mm256_add_epi32(p0, p1));
            }
        }
        let pairs = q4k_mins_pairs(sm);
        let (d, dmin) = (f16_at(x), f16_at(x.add(2)));
        for r in 0..CA {
            let corr = _mm256_madd_epi16(_mm256_loadu_si256(y(r).add(A_BSUMS).cast()), pairs);
            let ad = read_unaligned(y(r).cast::<f32>());
            let total = _mm256_add_epi32(isum[r][0], isum[r][1]);
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(total), _mm256_set1_ps(ad * d), acc[r]);
            mins[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(corr), _mm256_set1_ps(ad * dmin), mins[r]);
        }
    }
    std::array::from_fn(|r| finish(acc[r], mins[r]))
}

/// [`q4k_rows`] for Q6_K: each dot has [`dot_q6k`]'s bits.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q6k_rows<const CA: usize>(w: *const u8, a: *const u8, a_stride: usize, n: usize) -> [f32; CA] {
    let m4 = _mm256_set1_epi8(0x0F);
    let m3 = _mm256_set1_epi8(0x03);
    let mut acc = [_mm256_setzero_ps(); CA];
    for i in 0..n / QK_K {
        let x = w.add(i * 210);
        let y = |r: usize| a.add(r * a_stride + i * A_SIZE);
        let sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(x.add(192).cast()));
        let mut isum = [[_mm256_setzero_si256(); 2]; CA];
        for h in 0..2 {
            // ggml's dequantize_row_q6_K, one 128-element half: element l + 32s (l < 32)
            // takes nibble s / 2 of ql[l + 32 (s % 2)] and bits 2s..2s + 2 of qh[l].
            let ql0 = _mm256_loadu_si256(x.add(64 * h).cast());
            let ql1 = _mm256_loadu_si256(x.add(64 * h + 32).cast());
            let qh = _mm256_loadu_si256(x.add(128 + 32 * h).cast());
            let high =
                |s: i32| _mm256_slli_epi16::<4>(_mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(2 * s)), m3));
            // Quarters s = 0, 2 (first 32 bytes of the code vectors); 1, 3 (second 32).
            let codes = [
                _mm256_or_si256(_mm256_and_si256(ql0, m4), high(0)),
                _mm256_or_si256(_mm256_and_si256(ql1, m4), high(1)),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(ql0), m4), high(2)),
                _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16::<4>(ql1), m4), high(3)),
            ];
            // The half's 8 scales in both 128-bit lanes; quarter s's 16-element groups are
            // 2s and 2s + 1 of the half.
            let half = if h == 0 {
                _mm256_permute2x128_si256::<0x00>(sc16, sc16)
            } else {
                _mm256_permute2x128_si256::<0x11>(sc16, sc16)
            };
            for (s, code) in codes.iter().enumerate() {
                let ctl = _mm256_set_m128i(pick16(2 * s as i16 + 1), pick16(2 * s as i16));
                let scale = _mm256_shuffle_epi8(half, ctl);
                for (r, sums) in isum.iter_mut().enumerate() {
                    let av = _mm256_loadu_si256(y(r).add(A_QS + 128 * h + 32 * s).cast());
                    let p = _mm256_madd_epi16(_mm256_maddubs_epi16(*code, av), scale);
                    sums[s % 2] = _mm256_add_epi32(sums[s % 2], p);
                }
            }
        }
        let d = f16_at(x.add(208));
        for r in 0..CA {
            let bias = _mm256_slli_epi32::<5>(_mm256_madd_epi16(sc16, _mm256_loadu_si256(y(r).add(A_BSUMS).cast())));
            let total = _mm256_sub_epi32(_mm256_add_epi32(isum[r][0], isum[r][1]), bias);
            let s = _mm256_set1_ps(read_unaligned(y(r).cast::<f32>()) * d);
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(total), s, acc[r]);
        }
    }
    std::array::from_fn(|r| finish(acc[r], _mm256_setzero_ps()))
}

/// Largest tile of [`tile_fn`]'s kernels: weight rows (one at a time) x activation rows.
pub(super) const MAX_RW: usize = 4;
pub(super) const MAX_CA: usize = 4;

/// The tile kernels' formats (`tile`'s const parameter).
const Q4K: u8 = 0;
const Q5K: u8 = 1;
const Q6K: u8 = 2;

/// The AVX2 tile kernel of `ty` (Q4_K, Q5_K, Q6_K): each weight row unpacked once per
/// super-block for up to [`MAX_CA`] activation rows.
pub(super) fn tile_fn(ty: GgmlType) -> Option<TileFn> {
    Some(match ty {
        GgmlType::Q4K => tile::<Q4K>,
        GgmlType::Q5K => tile::<Q5K>,
        GgmlType::Q6K => tile::<Q6K>,
        _ => return None,
    })
}

/// The [`TileFn`] over [`q4k_rows`] / [`q6k_rows`]: `nw` weight rows one after the other.
#[allow(clippy::too_many_arguments)] // the TileFn signature
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tile<const FMT: u8>(
    w: *const u8,
    w_stride: usize,
    nw: usize,
    a: *const u8,
    a_stride: usize,
    na: usize,
    n: usize,
    out: *mut f32,
    out_stride: usize,
) {
    for r in 0..nw {
        let x = w.add(r * w_stride);
        let put = |vals: &[f32]| {
            for (c, v) in vals.iter().enumerate() {
                *out.add(c * out_stride + r) = *v;
            }
        };
        match (FMT, na) {
            (Q4K, 1) => put(&q4k_rows::<1, false>(x, a, a_stride, n)),
            (Q4K, 2) => put(&q4k_rows::<2, false>(x, a, a_stride, n)),
            (Q4K, 3) => put(&q4k_rows::<3, false>(x, a, a_stride, n)),
            (Q4K, 4) => put(&q4k_rows::<4, false>(x, a, a_stride, n)),
            (Q5K, 1) => put(&q4k_rows::<1, true>(x, a, a_stride, n)),
            (Q5K, 2) => put(&q4k_rows::<2, true>(x, a, a_stride, n)),
            (Q5K, 3) => put(&q4k_rows::<3, true>(x, a, a_stride, n)),
            (Q5K, 4) => put(&q4k_rows::<4, true>(x, a, a_stride, n)),
            (Q6K, 1) => put(&q6k_rows::<1>(x, a, a_stride, n)),
            (Q6K, 2) => put(&q6k_rows::<2>(x, a, a_stride, n)),
            (Q6K, 3) => put(&q6k_rows::<3>(x, a, a_stride, n)),
            (Q6K, 4) => put(&q6k_rows::<4>(x, a, a_stride, n)),
            _ => unreachable!("tile {nw} x {na} exceeds {MAX_RW} x {MAX_CA} (checked by the caller)"),
        }
    }
}
