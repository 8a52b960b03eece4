//! AVX-512 BW + VNNI register-tiled dot products of Q4_K, Q5_K and Q6_K weights against Q8_K
//! activations (the K-quants' arithmetic under `--precision q8` and `auto`): up to 4 weight
//! rows x 2 activation rows per call, or 1 weight row x up to 8 activation rows (prefill: a
//! weight row's codes unpacked once serve 8 activation rows), the tile contract of
//! `avx512_tile`.
//!
//! The arithmetic is `avx2_klanes`'s lane contract, its two 256-bit halves of codes as one
//! 512-bit register: per super-block and (weight row, activation row) pair,
//! * the codes as unsigned bytes, 64 per vector (Q4_K: the low or high nibbles of 64
//!   `qs` bytes; Q5_K: those with the fifth bit from `qh` as bit 4; Q6_K: 4 low bits of `ql` or'ed with 2 bits of `qh`, 0..=63);
//! * `vpmaddubsw` against the int8 activations gives i16 pairs, and `vpdpwssd` with the
//!   sub-block scales as i16 lanes (spread by `vpshufb`) accumulates `scale * pair` into
//!   16 i32 lanes, exactly, folded to 8 (lane `j` plus lane `j + 8`);
//! * Q6_K's bias subtracted in integers, one conversion and one FMA into the 8-lane f32
//!   accumulator; Q4_K's mins term an FMA into an 8-lane accumulator of its own;
//! * one horizontal sum per output, when its row ends.
//!
//! So each output has the bits of the AVX2 `vec_dot` on its row (`avx2_klanes`), whatever
//! the tile shape (decode's 4 x 1 tiles, a batch's 4 x 2): every path that multiplies a row
//! agrees.
//!
//! A weight row's codes and scales are unpacked once per super-block, then reused by the
//! tile's activation rows; activation vectors are plain loads. Q4_K pairs
//! `qs[64k..64k + 64]`'s low nibbles (elements `128k + 0..32` and `128k + 64..96`) and high
//! nibbles (`128k + 32..64`, `128k + 96..128`) with activations in that order, which
//! [`arrange_fn`]'s pass puts them in once per matmul (it swaps two 32-byte chunks of every
//! 128); Q6_K's codes of one 128-element half come out in element order, so its activations
//! load as they lie.
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

/// Largest tiles: 4 weight rows x 2 activation rows, and 1 x 8. The driver asks for up to
/// `MAX_RW x MAX_CA`; [`dispatch`] runs more than 2 activation rows one weight row at a time.
pub(super) const MAX_RW: usize = 4;
pub(super) const MAX_CA: usize = 8;

/// Weight rows ahead to prefetch into L2, in tiles (see `avx512_tile::PREFETCH_TILES`).
const PREFETCH_TILES: usize = 2;

pub(super) fn tile_fn(ty: GgmlType) -> Option<TileFn> {
    Some(match ty {
        GgmlType::Q4K => dispatch::<K4<false>>,
        GgmlType::Q5K => dispatch::<K4<true>>,
        GgmlType::Q6K => dispatch::<Q6K>,
        _ => return None,
    })
}

/// The activation pass the tiles of `ty` expect (see the module note).
pub(super) fn arrange_fn(ty: GgmlType) -> Option<fn(&mut [u8])> {
    matches!(ty, GgmlType::Q4K | GgmlType::Q5K).then_some(arrange_q4k as fn(&mut [u8]))
}

/// Q8_K rows into the order the Q4_K and Q5_K tiles read: in every 128 activations of a block,
/// elements `32..64` and `64..96` trade places. `rows` is whole Q8_K blocks.
fn arrange_q4k(rows: &mut [u8]) {
    for block in rows.chunks_exact_mut(A_SIZE) {
        for half in block[A_QS..A_QS + QK_K].chunks_exact_mut(128) {
            let (a, b) = half[32..96].split_at_mut(32);
            a.swap_with_slice(b);
        }
    }
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
    /// `d` (and Q4_K's `dmin`) of the super-block, in every lane.
    d: __m256,
    dmin: __m256,
}

/// A K-quant weight format: its super-block and how it meets the activations.
trait KFmt {
    /// Bytes per super-block.
    const WS: usize;
    /// The weight super-block at `x`.
    unsafe fn weights(x: *const u8) -> WeightBlock;
    /// `acc` plus the super-block's term for one activation row (`bsums`, `ad`: its
    /// 16-element sums and its scale in every lane), and `mins` plus Q4_K's mins term.
    unsafe fn accumulate(
        w: &WeightBlock,
        av: &[__m512i; 4],
        bsums: __m256i,
        ad: __m256,
        acc: __m256,
        mins: __m256,
    ) -> (__m256, __m256);
}

/// Q4_K, and with `Q5` Q5_K (Q4_K's super-block with a fifth bit per code).
struct K4<const Q5: bool>;
struct Q6K;

/// The four activation vectors of the Q8_K block at `y`, in the order the codes pair with
/// them (Q4_K's after [`arrange_q4k`]).
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

/// `vpshufb` control for the 4 128-bit lanes: i16 lane `s[t]` of lane `t` in every i16 lane.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn pick16x4(s: [i16; 4]) -> __m512i {
    let lo = _mm256_set_m128i(pick16(s[1]), pick16(s[0]));
    let hi = _mm256_set_m128i(pick16(s[3]), pick16(s[2]));
    _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1)
}

/// The integer part shared by both formats: `sum_k scale_k * maddubs(code_k, av_k)`, its 16
/// lanes folded to the contract's 8 (lane `j` plus lane `j + 8`).
#[inline(always)]
unsafe fn isum(w: &WeightBlock, av: &[__m512i; 4]) -> __m256i {
    let mut s = _mm512_setzero_si512();
    for ((code, a), scale) in w.codes.iter().zip(av).zip(&w.scales) {
        s = _mm512_dpwssd_epi32(s, _mm512_maddubs_epi16(*code, *a), *scale);
    }
    _mm256_add_epi32(_mm512_castsi512_si256(s), _mm512_extracti64x4_epi64::<1>(s))
}

/// A Q4_K super-block (with `Q5`, a Q5_K one) at `x`, unpacked.
#[inline(always)]
unsafe fn q4k_weights<const Q5: bool>(x: *const u8) -> WeightBlock {
    let sm = q4k_scales_mins(x);
    let sc = _mm512_broadcast_i32x4(_mm_cvtepu8_epi16(sm));
    let m4 = _mm512_set1_epi8(0x0F);
    // Q5_K: 32 bytes of fifth bits between the scales and the nibbles.
    let qs = if Q5 { 48 } else { 16 };
    let v0 = _mm512_loadu_si512(x.add(qs).cast());
    let v1 = _mm512_loadu_si512(x.add(qs + 64).cast());
    // Low nibbles of qs[64k..]: sub-blocks 4k (bytes 0..32) and 4k + 2; high: 4k + 1, 4k + 3.
    let mut codes = [
        _mm512_and_si512(v0, m4),
        _mm512_and_si512(_mm512_srli_epi16::<4>(v0), m4),
        _mm512_and_si512(v1, m4),
        _mm512_and_si512(_mm512_srli_epi16::<4>(v1), m4),
    ];
    if Q5 {
        // Bit j of qh[l] is element 32 j + l's fifth bit (ggml's dequantize_row_q5_K): code
        // vector t holds sub-blocks (a, b) = (0, 2), (1, 3), (4, 6), (5, 7) in its halves, so
        // each half of qh shifts by its sub-block (64-bit shifts: the bits they pull across
        // byte boundaries are masked off).
        let qh = _mm256_loadu_si256(x.add(16).cast());
        let qh2 = _mm512_inserti64x4(_mm512_castsi256_si512(qh), qh, 1);
        let m1 = _mm512_set1_epi8(0x01);
        for (code, (a, b)) in codes.iter_mut().zip([(0, 2), (1, 3), (4, 6), (5, 7)]) {
            let bit = _mm512_and_si512(_mm512_srlv_epi64(qh2, _mm512_set_epi64(b, b, b, b, a, a, a, a)), m1);
            *code = _mm512_or_si512(*code, _mm512_slli_epi16::<4>(bit));
        }
    }
    let scales = [
        _mm512_shuffle_epi8(sc, pick16x4([0, 0, 2, 2])),
        _mm512_shuffle_epi8(sc, pick16x4([1, 1, 3, 3])),
        _mm512_shuffle_epi8(sc, pick16x4([4, 4, 6, 6])),
        _mm512_shuffle_epi8(sc, pick16x4([5, 5, 7, 7])),
    ];
    let (d, dmin) = (_mm256_set1_ps(f16_at(x)), _mm256_set1_ps(f16_at(x.add(2))));
    WeightBlock { codes, scales, side: q4k_mins_pairs(sm), d, dmin }
}

impl<const Q5: bool> KFmt for K4<Q5> {
    const WS: usize = if Q5 { 176 } else { 144 };

    #[inline(always)]
    unsafe fn weights(x: *const u8) -> WeightBlock {
        q4k_weights::<Q5>(x)
    }

    #[inline(always)]
    unsafe fn accumulate(
        w: &WeightBlock,
        av: &[__m512i; 4],
        bsums: __m256i,
        ad: __m256,
        acc: __m256,
        mins: __m256,
    ) -> (__m256, __m256) {
        let acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum(w, av)), _mm256_mul_ps(ad, w.d), acc);
        let corr = _mm256_cvtepi32_ps(_mm256_madd_epi16(bsums, w.side));
        (acc, _mm256_fmadd_ps(corr, _mm256_mul_ps(ad, w.dmin), mins))
    }
}

impl KFmt for Q6K {
    const WS: usize = 210;

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
        let d = _mm256_set1_ps(f16_at(x.add(208)));
        WeightBlock { codes, scales, side: sc16, d, dmin: d }
    }

    #[inline(always)]
    unsafe fn accumulate(
        w: &WeightBlock,
        av: &[__m512i; 4],
        bsums: __m256i,
        ad: __m256,
        acc: __m256,
        mins: __m256,
    ) -> (__m256, __m256) {
        // The -32 of every code: 32 * sum_g sc_g * bsums[g], exact in i32, on lanes 0-7.
        let bias = _mm256_slli_epi32::<5>(_mm256_madd_epi16(w.side, bsums));
        let total = _mm256_sub_epi32(isum(w, av), bias);
        (_mm256_fmadd_ps(_mm256_cvtepi32_ps(total), _mm256_mul_ps(ad, w.d), acc), mins)
    }
}

/// Picks the instantiation for an edge tile of `nw x na` (the [`TileFn`] of this file):
/// `4..1 x 2..1` as one call, wider activation blocks one weight row at a time.
#[allow(clippy::too_many_arguments)] // the TileFn signature
unsafe fn dispatch<F: KFmt>(
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
    let args =
        |r: usize| -> super::TileArgs { (w.add(r * w_stride), w_stride, a, a_stride, n, out.add(r), out_stride) };
    match (nw, na) {
        (4, 2) => tile::<F, 4, 2>(args(0)),
        (3, 2) => tile::<F, 3, 2>(args(0)),
        (2, 2) => tile::<F, 2, 2>(args(0)),
        (1, 2) => tile::<F, 1, 2>(args(0)),
        (4, 1) => tile::<F, 4, 1>(args(0)),
        (3, 1) => tile::<F, 3, 1>(args(0)),
        (2, 1) => tile::<F, 2, 1>(args(0)),
        (1, 1) => tile::<F, 1, 1>(args(0)),
        _ => {
            for r in 0..nw {
                match na {
                    3 => tile::<F, 1, 3>(args(r)),
                    4 => tile::<F, 1, 4>(args(r)),
                    5 => tile::<F, 1, 5>(args(r)),
                    6 => tile::<F, 1, 6>(args(r)),
                    7 => tile::<F, 1, 7>(args(r)),
                    8 => tile::<F, 1, 8>(args(r)),
                    _ => unreachable!("tile {nw} x {na} exceeds {MAX_RW} x {MAX_CA} (checked by the caller)"),
                }
            }
        }
    }
}

// Index loops over the const-size register arrays keep the tile shape explicit.
#[allow(clippy::needless_range_loop)]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn tile<F: KFmt, const RW: usize, const CA: usize>(args: super::TileArgs) {
    let (w, w_stride, a, a_stride, n, out, out_stride) = args;
    let mut acc = [[_mm256_setzero_ps(); CA]; RW];
    let mut mins = [[_mm256_setzero_ps(); CA]; RW];
    for i in 0..n / QK_K {
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
            // The activations are re-read per weight row, from L1: loads, not registers held
            // across the rows.
            for c in 0..CA {
                let y = a.add(c * a_stride + i * A_SIZE);
                let bsums = _mm256_loadu_si256(y.add(A_BSUMS).cast());
                let ad = _mm256_set1_ps(read_unaligned(y.cast::<f32>()));
                (acc[r][c], mins[r][c]) = F::accumulate(&wb, &activations(y), bsums, ad, acc[r][c], mins[r][c]);
            }
        }
    }
    for r in 0..RW {
        for c in 0..CA {
            *out.add(c * out_stride + r) = finish(acc[r][c], mins[r][c]);
        }
    }
}
