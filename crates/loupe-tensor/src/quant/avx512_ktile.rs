//! AVX-512 BW + VNNI register-tiled dot products of Q4_K and Q6_K weights against Q8_K
//! activations (the K-quants' arithmetic under `--precision q8` and `auto`): up to 4 weight
//! rows x 2 activation rows per call, the same tile contract as `avx512_tile`.
//!
//! The arithmetic is `avx2_klanes`'s lane contract, with its two 256-bit halves as one
//! 512-bit register: per super-block and (weight row, activation row) pair,
//! * the codes as unsigned bytes, 64 per vector (Q4_K: the low or high nibbles of 64
//!   `qs` bytes; Q6_K: 4 low bits of `ql` or'ed with 2 bits of `qh`, 0..=63);
//! * `vpmaddubsw` against the int8 activations gives i16 pairs, and `vpdpwssd` with the
//!   sub-block scales as i16 lanes (spread by `vpshufb`) accumulates `scale * pair` into the
//!   16 i32 lanes, exactly;
//! * Q6_K's bias folded into lanes 0-7 in integers, one conversion and one FMA into the f32
//!   accumulator; Q4_K's mins term an FMA on lanes 0-7 (a masked FMA);
//! * one horizontal sum per output, when its row ends.
//!
//! So each output has the bits of the AVX2 `vec_dot` on its row (`avx2_klanes`), whatever
//! the tile shape (decode's 4 x 1 tiles, a batch's 4 x 2): every path that multiplies a row
//! agrees.
//!
//! Activation vectors are assembled once per super-block and activation row, then reused
//! by the tile's weight rows; a weight row's codes and scales once per super-block, then
//! reused by the tile's activation rows. Q4_K pairs `qs[64k..64k + 64]`'s low nibbles
//! (elements `128k + 0..32` and `128k + 64..96`) and high nibbles (`128k + 32..64`,
//! `128k + 96..128`) with activation vectors gathered the same way; Q6_K's codes of one
//! 128-element half come out in element order, so its activations load as they lie.
//!
//! Safety: every `unsafe fn` requires AVX-512 F/BW/VL + VNNI + AVX2/FMA/F16C and the
//! pointer contract of [`TileFn`]; they are reachable only through [`super::tile_fn`],
//! which checks the CPU.

use std::arch::x86_64::*;
use std::ptr::read_unaligned;

use loupe_core::GgmlType;

use super::avx2_klanes::{f16_at, finish, pick16, q4k_mins_pairs, q4k_scales_mins, A_BSUMS, A_QS, A_SIZE};
use super::blocks::QK_K;
use super::TileFn;

/// Largest tile: weight rows x activation rows (as `avx512_tile`).
pub(super) const MAX_RW: usize = 4;
pub(super) const MAX_CA: usize = 2;

/// Weight rows ahead to prefetch into L2, in tiles (see `avx512_tile::PREFETCH_TILES`).
const PREFETCH_TILES: usize = 2;

pub(super) fn tile_fn(ty: GgmlType) -> Option<TileFn> {
    Some(match ty {
        GgmlType::Q4K => dispatch::<Q4K>,
        GgmlType::Q6K => dispatch::<Q6K>,
        _ => return None,
    })
}

/// One weight row's super-block, unpacked once for every activation row of the tile.
struct WeightBlock {
    /// The four 64-byte code vectors.
    codes: [__m512i; 4],
    /// Each code vector's sub-block scales, one per i16 lane pair.
    scales: [__m512i; 4],
    /// Q4_K: the mins as `vpmaddwd` pairs (`avx2_klanes::q4k_mins_pairs`); Q6_K: the 16
    /// scales as i16, for the bias.
    side: __m256i,
    /// `d` (and Q4_K's `dmin`) of the super-block.
    d: f32,
    dmin: f32,
}

/// A K-quant weight format: its super-block and how it meets the activations.
trait KFmt {
    /// Bytes per super-block.
    const WS: usize;
    /// The four activation vectors of a super-block in the order [`KFmt::weights`] pairs
    /// them with codes.
    unsafe fn activations(y: *const u8) -> [__m512i; 4];
    /// The weight super-block at `x`.
    unsafe fn weights(x: *const u8) -> WeightBlock;
    /// `acc` plus the super-block's term for one activation row (`bsums`, `ad`: its
    /// 16-element sums and scale).
    unsafe fn accumulate(w: &WeightBlock, av: &[__m512i; 4], bsums: __m256i, ad: f32, acc: __m512) -> __m512;
}

struct Q4K;
struct Q6K;

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn join(lo: *const u8, hi: *const u8) -> __m512i {
    _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256(lo.cast())), _mm256_loadu_si256(hi.cast()), 1)
}

/// `vpshufb` control for the 4 128-bit lanes: i16 lane `s[t]` of lane `t` in every i16 lane.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn pick16x4(s: [i16; 4]) -> __m512i {
    let lo = _mm256_set_m128i(pick16(s[1]), pick16(s[0]));
    let hi = _mm256_set_m128i(pick16(s[3]), pick16(s[2]));
    _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1)
}

/// The integer part shared by both formats: `sum_k scale_k * maddubs(code_k, av_k)`.
#[inline(always)]
unsafe fn isum(w: &WeightBlock, av: &[__m512i; 4]) -> __m512i {
    let mut s = _mm512_setzero_si512();
    for ((code, a), scale) in w.codes.iter().zip(av).zip(&w.scales) {
        s = _mm512_dpwssd_epi32(s, _mm512_maddubs_epi16(*code, *a), *scale);
    }
    s
}

impl KFmt for Q4K {
    const WS: usize = 144;

    #[inline(always)]
    unsafe fn activations(y: *const u8) -> [__m512i; 4] {
        let q = y.add(A_QS);
        [join(q, q.add(64)), join(q.add(32), q.add(96)), join(q.add(128), q.add(192)), join(q.add(160), q.add(224))]
    }

    #[inline(always)]
    unsafe fn weights(x: *const u8) -> WeightBlock {
        let sm = q4k_scales_mins(x);
        let sc = _mm512_broadcast_i32x4(_mm_cvtepu8_epi16(sm));
        let m4 = _mm512_set1_epi8(0x0F);
        let v0 = _mm512_loadu_si512(x.add(16).cast());
        let v1 = _mm512_loadu_si512(x.add(80).cast());
        // Low nibbles of qs[64k..]: sub-blocks 4k (bytes 0..32) and 4k + 2; high: 4k + 1, 4k + 3.
        let codes = [
            _mm512_and_si512(v0, m4),
            _mm512_and_si512(_mm512_srli_epi16::<4>(v0), m4),
            _mm512_and_si512(v1, m4),
            _mm512_and_si512(_mm512_srli_epi16::<4>(v1), m4),
        ];
        let scales = [
            _mm512_shuffle_epi8(sc, pick16x4([0, 0, 2, 2])),
            _mm512_shuffle_epi8(sc, pick16x4([1, 1, 3, 3])),
            _mm512_shuffle_epi8(sc, pick16x4([4, 4, 6, 6])),
            _mm512_shuffle_epi8(sc, pick16x4([5, 5, 7, 7])),
        ];
        WeightBlock { codes, scales, side: q4k_mins_pairs(sm), d: f16_at(x), dmin: f16_at(x.add(2)) }
    }

    #[inline(always)]
    unsafe fn accumulate(w: &WeightBlock, av: &[__m512i; 4], bsums: __m256i, ad: f32, acc: __m512) -> __m512 {
        let acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum(w, av)), _mm512_set1_ps(ad * w.d), acc);
        let corr = _mm512_cvtepi32_ps(_mm512_zextsi256_si512(_mm256_madd_epi16(bsums, w.side)));
        _mm512_mask3_fnmadd_ps(corr, _mm512_set1_ps(ad * w.dmin), acc, 0x00FF)
    }
}

impl KFmt for Q6K {
    const WS: usize = 210;

    #[inline(always)]
    unsafe fn activations(y: *const u8) -> [__m512i; 4] {
        let q = y.add(A_QS);
        [
            _mm512_loadu_si512(q.cast()),
            _mm512_loadu_si512(q.add(64).cast()),
            _mm512_loadu_si512(q.add(128).cast()),
            _mm512_loadu_si512(q.add(192).cast()),
        ]
    }

    #[inline(always)]
    unsafe fn weights(x: *const u8) -> WeightBlock {
        let sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(x.add(192).cast()));
        let m4 = _mm512_set1_epi8(0x0F);
        let m3 = _mm512_set1_epi8(0x03);
        let mut codes = [_mm512_setzero_si512(); 4];
        let mut scales = [_mm512_setzero_si512(); 4];
        for h in 0..2 {
            // ggml's dequantize_row_q6_K, one 128-element half: element l + 32s (l < 32)
            // takes nibble s / 2 of ql[l + 32 (s % 2)] and bits 2s..2s + 2 of qh[l].
            let ql = _mm512_loadu_si512(x.add(64 * h).cast());
            let qh = _mm256_loadu_si256(x.add(128 + 32 * h).cast());
            let qh2 = _mm512_inserti64x4(_mm512_castsi256_si512(qh), qh, 1);
            // 64-bit shifts: the bits they pull across byte boundaries are masked off.
            let h01 = _mm512_and_si512(_mm512_srlv_epi64(qh2, _mm512_set_epi64(2, 2, 2, 2, 0, 0, 0, 0)), m3);
            let h23 = _mm512_and_si512(_mm512_srlv_epi64(qh2, _mm512_set_epi64(6, 6, 6, 6, 4, 4, 4, 4)), m3);
            codes[2 * h] = _mm512_or_si512(_mm512_and_si512(ql, m4), _mm512_slli_epi16::<4>(h01));
            codes[2 * h + 1] =
                _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16::<4>(ql), m4), _mm512_slli_epi16::<4>(h23));
            // The half's 8 scales in every 128-bit lane; 16-element group t of a code vector.
            let half = _mm512_broadcast_i32x4(if h == 0 {
                _mm256_castsi256_si128(sc16)
            } else {
                _mm256_extracti128_si256::<1>(sc16)
            });
            scales[2 * h] = _mm512_shuffle_epi8(half, pick16x4([0, 1, 2, 3]));
            scales[2 * h + 1] = _mm512_shuffle_epi8(half, pick16x4([4, 5, 6, 7]));
        }
        let d = f16_at(x.add(208));
        WeightBlock { codes, scales, side: sc16, d, dmin: d }
    }

    #[inline(always)]
    unsafe fn accumulate(w: &WeightBlock, av: &[__m512i; 4], bsums: __m256i, ad: f32, acc: __m512) -> __m512 {
        // The -32 of every code: 32 * sum_g sc_g * bsums[g], exact in i32, on lanes 0-7.
        let bias = _mm256_slli_epi32::<5>(_mm256_madd_epi16(w.side, bsums));
        let total = _mm512_sub_epi32(isum(w, av), _mm512_zextsi256_si512(bias));
        _mm512_fmadd_ps(_mm512_cvtepi32_ps(total), _mm512_set1_ps(ad * w.d), acc)
    }
}

tile_dispatch!(KFmt, tile, (4, 2), (3, 2), (2, 2), (1, 2), (4, 1), (3, 1), (2, 1), (1, 1));

// Index loops over the const-size register arrays keep the tile shape explicit.
#[allow(clippy::needless_range_loop)]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn tile<F: KFmt, const RW: usize, const CA: usize>(args: super::TileArgs) {
    let (w, w_stride, a, a_stride, n, out, out_stride) = args;
    let mut acc = [[_mm512_setzero_ps(); CA]; RW];
    for i in 0..n / QK_K {
        let mut av = [[_mm512_setzero_si512(); 4]; CA];
        let mut bs = [_mm256_setzero_si256(); CA];
        let mut ad = [0f32; CA];
        for c in 0..CA {
            let y = a.add(c * a_stride + i * A_SIZE);
            av[c] = F::activations(y);
            bs[c] = _mm256_loadu_si256(y.add(A_BSUMS).cast());
            ad[c] = read_unaligned(y.cast::<f32>());
        }
        for r in 0..RW {
            let x = w.add(r * w_stride + i * F::WS);
            let ahead = x.wrapping_add(PREFETCH_TILES * MAX_RW * w_stride);
            _mm_prefetch::<_MM_HINT_T1>(ahead.cast());
            _mm_prefetch::<_MM_HINT_T1>(ahead.wrapping_add(64).cast());
            _mm_prefetch::<_MM_HINT_T1>(ahead.wrapping_add(128).cast());
            if F::WS > 192 {
                _mm_prefetch::<_MM_HINT_T1>(ahead.wrapping_add(192).cast());
            }
            let wb = F::weights(x);
            for c in 0..CA {
                acc[r][c] = F::accumulate(&wb, &av[c], bs[c], ad[c], acc[r][c]);
            }
        }
    }
    for r in 0..RW {
        for c in 0..CA {
            let v = acc[r][c];
            *out.add(c * out_stride + r) =
                finish(_mm512_castps512_ps256(v), _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v))));
        }
    }
}
