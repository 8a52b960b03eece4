//! AVX-512 BW + VNNI register-tiled dot products of Q4_K and Q6_K weights against Q8_K
//! activations (`--precision q8`'s arithmetic for the K-quants): up to 4 weight rows x 2
//! activation rows per call, the same tile contract as `avx512_tile`.
//!
//! Per super-block of 256 weights and one (weight row, activation row) pair:
//! * the codes as unsigned bytes, 64 per vector (Q4_K: the low or high nibbles of 64
//!   `qs` bytes; Q6_K: 4 low bits of `ql` or'ed with 2 bits of `qh`, 0..=63);
//! * `vpmaddubsw` against the int8 activations gives i16 pairs (at most 2 * 63 * 128 =
//!   16128, no saturation), and `vpdpwssd` with the sub-block scales as i16 lanes
//!   accumulates `scale * pair` into i32 lanes: the super-block's `sum_j sc_j * sum(q a)`
//!   exactly, whatever the order;
//! * Q4_K's mins (`dmin * m_j * sum(a)` over sub-block `j`) and Q6_K's bias
//!   (`32 * sc_g * sum(a)` over sub-block `g`) come from the activations' 16-element sums
//!   (`bsums`), also exactly in i32;
//! * both are summed to integers and combined in f32 with the super-block's `d_w * d_a`
//!   (and `dmin_w * d_a`), super-block after super-block, by exactly the f32 operations
//!   of the AVX2 `vec_dot` of these types (`quant::avx2::k4_block`, `dot_q6k`).
//!
//! So each output has the bits of the AVX2 `vec_dot` on its row, whatever the tile shape
//! (decode's 4 x 1 tiles, a batch's 4 x 2): every path that multiplies a row agrees.
//!
//! Activation vectors are assembled once per super-block and activation row, then reused
//! by the tile's weight rows. Q4_K pairs `qs[64k..64k + 64]`'s low nibbles (elements
//! `128k + 0..32` and `128k + 64..96`) and high nibbles (`128k + 32..64`, `128k + 96..128`)
//! with activation vectors gathered the same way; Q6_K's codes of one 128-element half
//! come out in element order, so its activations load as they lie.
//!
//! Safety: every `unsafe fn` requires AVX-512 F/BW/VL + VNNI + AVX2/FMA/F16C and the
//! pointer contract of [`TileFn`]; they are reachable only through [`super::tile_fn`],
//! which checks the CPU.

use std::arch::x86_64::*;
use std::ptr::read_unaligned;

use loupe_core::GgmlType;

use super::blocks::{scale_min_k4, K_SCALE_SIZE, QK_K};
use super::TileFn;

/// Largest tile: weight rows x activation rows (as `avx512_tile`).
pub(super) const MAX_RW: usize = 4;
pub(super) const MAX_CA: usize = 2;

/// Weight rows ahead to prefetch, in tiles (see `avx512_tile::PREFETCH_TILES`).
const PREFETCH_TILES: usize = 2;

// `block_q8_K { f32 d; i8 qs[256]; i16 bsums[16] }`.
const A_SIZE: usize = 292;
const A_QS: usize = 4;
const A_BSUMS: usize = 4 + QK_K;

pub(super) fn tile_fn(ty: GgmlType) -> Option<TileFn> {
    Some(match ty {
        GgmlType::Q4K => dispatch::<Q4K>,
        GgmlType::Q6K => dispatch::<Q6K>,
        _ => return None,
    })
}

/// A K-quant weight format: its super-block and how it meets the activations.
trait KFmt {
    /// Bytes per super-block.
    const WS: usize;
    /// Whether each super-block's correction is subtracted from its own term (Q4_K, as
    /// `quant::avx2::k4_block`) or summed apart and subtracted at the end (Q6_K, as
    /// `quant::avx2::dot_q6k`).
    const CORRECT_PER_BLOCK: bool;
    /// The four activation vectors of a super-block in the order [`KFmt::block`] pairs
    /// them with codes.
    unsafe fn activations(y: *const u8) -> [__m512i; 4];
    /// The super-block's exact `sum scale * q * a` (16 i32 lanes), its correction (Q4_K:
    /// `sum_j m_j * sum(a)`; Q6_K: `32 * sum_g sc_g * sum(a)`, 8 i32 lanes), and the weight
    /// scales of the two (Q4_K: `d`, `dmin`; Q6_K: `d` both).
    unsafe fn block(x: *const u8, av: &[__m512i; 4], bsums: __m256i) -> (__m512i, __m256i, f32, f32);
}

struct Q4K;
struct Q6K;

#[inline(always)]
unsafe fn f16_at(p: *const u8) -> f32 {
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(read_unaligned(p.cast::<u16>()) as i32)))
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn join(lo: *const u8, hi: *const u8) -> __m512i {
    _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256(lo.cast())), _mm256_loadu_si256(hi.cast()), 1)
}

/// i16 lane `t` of the result is lane `idx[t]` of `v` (`vpermw`).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn spread16(v: __m256i, idx: __m512i) -> __m512i {
    _mm512_permutexvar_epi16(idx, _mm512_castsi256_si512(v))
}

/// The i16 lane index vector whose 32 lanes read `[a; 16]` then `[b; 16]`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn halves(a: i16, b: i16) -> __m512i {
    _mm512_inserti64x4(_mm512_set1_epi16(a), _mm256_set1_epi16(b), 1)
}

/// The i16 lane index vector whose 32 lanes read `base + t / 8`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn quarters(base: i16) -> __m512i {
    let lo = _mm256_inserti128_si256(_mm256_set1_epi16(base), _mm_set1_epi16(base + 1), 1);
    let hi = _mm256_inserti128_si256(_mm256_set1_epi16(base + 2), _mm_set1_epi16(base + 3), 1);
    _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1)
}

impl KFmt for Q4K {
    const WS: usize = 144;
    const CORRECT_PER_BLOCK: bool = true;

    #[inline(always)]
    unsafe fn activations(y: *const u8) -> [__m512i; 4] {
        let q = y.add(A_QS);
        [join(q, q.add(64)), join(q.add(32), q.add(96)), join(q.add(128), q.add(192)), join(q.add(160), q.add(224))]
    }

    #[inline(always)]
    unsafe fn block(x: *const u8, av: &[__m512i; 4], bsums: __m256i) -> (__m512i, __m256i, f32, f32) {
        let (sc, mn) = scale_min_k4(&read_unaligned(x.add(4).cast::<[u8; K_SCALE_SIZE]>()));
        let sc16 = _mm256_castsi128_si256(_mm_cvtepu8_epi16(_mm_loadl_epi64(sc.as_ptr().cast())));
        let m4 = _mm512_set1_epi8(0x0F);
        let mut isum = _mm512_setzero_si512();
        for k in 0..2 {
            let v = _mm512_loadu_si512(x.add(16 + 64 * k).cast());
            let lo = _mm512_and_si512(v, m4);
            let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(v), m4);
            // Low nibbles: sub-blocks 4k (bytes 0..32) and 4k + 2; high: 4k + 1, 4k + 3.
            let j = 4 * k as i16;
            let s_lo = spread16(sc16, halves(j, j + 2));
            let s_hi = spread16(sc16, halves(j + 1, j + 3));
            isum = _mm512_dpwssd_epi32(isum, _mm512_maddubs_epi16(lo, av[2 * k]), s_lo);
            isum = _mm512_dpwssd_epi32(isum, _mm512_maddubs_epi16(hi, av[2 * k + 1]), s_hi);
        }
        // Sub-block j's activation sum is bsums[2j] + bsums[2j + 1] (lane j of the pairwise
        // madd), times its min m_j.
        let pair = _mm256_madd_epi16(bsums, _mm256_set1_epi16(1));
        let mins = _mm256_cvtepu8_epi32(_mm_loadl_epi64(mn.as_ptr().cast()));
        (isum, _mm256_mullo_epi32(pair, mins), f16_at(x), f16_at(x.add(2)))
    }
}

impl KFmt for Q6K {
    const WS: usize = 210;
    const CORRECT_PER_BLOCK: bool = false;

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
    unsafe fn block(x: *const u8, av: &[__m512i; 4], bsums: __m256i) -> (__m512i, __m256i, f32, f32) {
        let sc = _mm_loadu_si128(x.add(192).cast());
        let sc16 = _mm256_cvtepi8_epi16(sc);
        let m4 = _mm512_set1_epi8(0x0F);
        let m3 = _mm512_set1_epi8(0x03);
        let mut isum = _mm512_setzero_si512();
        for h in 0..2 {
            // ggml's dequantize_row_q6_K, one 128-element half: element l + 32s (l < 32)
            // takes nibble s / 2 of ql[l + 32 (s % 2)] and bits 2s..2s + 2 of qh[l].
            let ql = _mm512_loadu_si512(x.add(64 * h).cast());
            let qh = _mm256_loadu_si256(x.add(128 + 32 * h).cast());
            let qh2 = _mm512_inserti64x4(_mm512_castsi256_si512(qh), qh, 1);
            // 64-bit shifts: the bits they pull across byte boundaries are masked off.
            let h01 = _mm512_and_si512(_mm512_srlv_epi64(qh2, _mm512_set_epi64(2, 2, 2, 2, 0, 0, 0, 0)), m3);
            let h23 = _mm512_and_si512(_mm512_srlv_epi64(qh2, _mm512_set_epi64(6, 6, 6, 6, 4, 4, 4, 4)), m3);
            let c01 = _mm512_or_si512(_mm512_and_si512(ql, m4), _mm512_slli_epi16::<4>(h01));
            let c23 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16::<4>(ql), m4), _mm512_slli_epi16::<4>(h23));
            let base = 8 * h as i16;
            isum = _mm512_dpwssd_epi32(isum, _mm512_maddubs_epi16(c01, av[2 * h]), spread16(sc16, quarters(base)));
            isum =
                _mm512_dpwssd_epi32(isum, _mm512_maddubs_epi16(c23, av[2 * h + 1]), spread16(sc16, quarters(base + 4)));
        }
        // The -32 of every code: 32 * sum_g sc_g * bsums[g], exact in i32.
        let bias = _mm256_slli_epi32::<5>(_mm256_madd_epi16(sc16, bsums));
        let d = f16_at(x.add(208));
        (isum, bias, d, d)
    }
}

tile_dispatch!(KFmt, tile, (4, 2), (3, 2), (2, 2), (1, 2), (4, 1), (3, 1), (2, 1), (1, 1));

// Index loops over the const-size register arrays keep the tile shape explicit.
#[allow(clippy::needless_range_loop)]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn tile<F: KFmt, const RW: usize, const CA: usize>(args: super::TileArgs) {
    let (w, w_stride, a, a_stride, n, out, out_stride) = args;
    let nb = n / QK_K;
    let mut acc = [[0f32; CA]; RW];
    let mut corr = [[0f32; CA]; RW];
    for i in 0..nb {
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
            _mm_prefetch::<_MM_HINT_T0>(ahead.cast());
            _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(64).cast());
            _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(128).cast());
            if F::WS > 192 {
                _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(192).cast());
            }
            for c in 0..CA {
                let (isum, icorr, d, dcorr) = F::block(x, &av[c], bs[c]);
                // Exact integers, then the f32 operations of the AVX2 `vec_dot` of these
                // types in their order (`quant::avx2::k4_block`, `dot_q6k`), so a row
                // has the same bits through either kernel.
                let s = _mm512_reduce_add_epi32(isum) as f32;
                let k = hsum_i32_256(icorr) as f32;
                if F::CORRECT_PER_BLOCK {
                    acc[r][c] += ad[c] * d * s - ad[c] * dcorr * k;
                } else {
                    acc[r][c] += ad[c] * d * s;
                    corr[r][c] += ad[c] * dcorr * k;
                }
            }
        }
    }
    for r in 0..RW {
        for c in 0..CA {
            *out.add(c * out_stride + r) = acc[r][c] - corr[r][c];
        }
    }
}

/// The sum of the 8 i32 lanes (exact: callers' sums fit i32).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn hsum_i32_256(v: __m256i) -> i32 {
    let x = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
    let x = _mm_add_epi32(x, _mm_unpackhi_epi64(x, x));
    _mm_cvtsi128_si32(_mm_add_epi32(x, _mm_shuffle_epi32::<1>(x)))
}
