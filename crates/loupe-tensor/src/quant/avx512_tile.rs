//! AVX-512 VNNI register-tiled dot products: up to 4 weight rows x 2 activation
//! rows per call (the matmul microkernel).
//!
//! Compared with one `vec_dot` per output, a tile decodes each weight block pair
//! once for all its activation rows and loads each activation pair once for all
//! its weight rows, keeps `RW * CA` independent accumulators in flight, and pays
//! the call and horizontal-sum overhead once per tile. Block pairs use the layout
//! of `avx512.rs`.
//!
//! Offsets without the sign trick: weights are fed to `vpdpbusd` as unsigned codes
//! `q + bias` (nibbles for Q4_0/Q5_0, `w ^ 0x80 = w + 128` for Q8_0), and each
//! activation pair's `-bias * sum(a)` (one vpdpbusd per activation row) seeds the
//! accumulation, so `dpbusd(seed, q + bias, a) = sum(q a)` exactly. Unlike the sign
//! trick this is exact for every int8 activation, including -128.
//!
//! Register budget (32 zmm): 4x2 keeps 8 accumulators, 8 `m s` accumulators (Q4_1,
//! Q5_1), 2 activation pairs with their scales, and the constants.
//!
//! Safety: every `unsafe fn` requires AVX-512 F/BW/VL + VNNI + AVX2/FMA/F16C and the
//! pointer contract of [`TileFn`]; they are reachable only through
//! [`super::tile_fn`], which checks the CPU.

use std::arch::x86_64::*;
use std::ptr::read_unaligned;

use loupe_core::GgmlType;

use super::avx2;
use super::blocks::QK;
use super::TileFn;

/// How many tiles of rows ahead to prefetch weights, into L2 (`T1`; see
/// `linear::gemv::x86::prefetch_pair` for why not L1). Rows are short (360 bytes for Q4_1,
/// 612 for Q8_0 at k = 576), and reading four of them side by side splits the sequential
/// stream into short ones the hardware prefetcher barely trains on. Eight tiles ahead
/// (BENCHMARKS.md, "Prefetching weights into L2").
pub(super) const PREFETCH_TILES: usize = 8;

/// Largest tile: weight rows x activation rows.
pub(super) const MAX_RW: usize = 4;
pub(super) const MAX_CA: usize = 2;

pub(super) fn tile_fn(ty: GgmlType) -> Option<TileFn> {
    Some(match ty {
        GgmlType::Q4_0 => dispatch::<Q4_0>,
        GgmlType::Q4_1 => dispatch::<Q4_1>,
        GgmlType::Q5_0 => dispatch::<Q5_0>,
        GgmlType::Q5_1 => dispatch::<Q5_1>,
        GgmlType::Q8_0 => dispatch::<Q8_0>,
        _ => return None,
    })
}

/// A block format paired with its activation format.
pub(super) trait Fmt {
    /// Bytes per weight / activation block.
    const WS: usize;
    const AS: usize;
    /// Offset of the int8 quants in the activation block (after `d` or `d, s`).
    const A_QS: usize;
    /// Whether the weights carry a min `m` (and the activations `s = d sum(q)`).
    const HAS_MIN: bool;
    /// Added to the weight codes to make them unsigned; subtracted via `sum(a)`.
    const BIAS: u8;
    /// The unsigned codes of a weight block pair, in pair layout.
    unsafe fn codes(x0: *const u8, x1: *const u8) -> __m512i;
    /// For a one-block tail: the AVX2 single-row kernel.
    unsafe fn tail(x: *const u8, y: *const u8) -> f32;
}

#[inline(always)]
unsafe fn rd_u16(p: *const u8) -> i32 {
    read_unaligned(p.cast::<u16>()) as i32
}

#[inline(always)]
unsafe fn rd_u32(p: *const u8) -> i32 {
    read_unaligned(p.cast::<u32>()) as i32
}

/// `[d0, m0, d1, m1]` of a block pair as f32 (`m = 0` for formats without one).
/// The same shape serves activations: `[d0, s0, d1, s1]`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn head(p0: *const u8, p1: *const u8, has_min: bool) -> __m128 {
    let h =
        if has_min { _mm_set_epi32(0, 0, rd_u32(p1), rd_u32(p0)) } else { _mm_set_epi32(0, 0, rd_u16(p1), rd_u16(p0)) };
    _mm_cvtph_ps(h)
}

/// Lanes 0-7 <- lane 0 of `v`, lanes 8-15 <- lane 2: the per-block scale of a pair.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn spread(v: __m128) -> __m512 {
    let idx = _mm512_set_epi32(2, 2, 2, 2, 2, 2, 2, 2, 0, 0, 0, 0, 0, 0, 0, 0);
    _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(v))
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn nibbles2(p0: *const u8, p1: *const u8) -> __m512i {
    let b0 = _mm256_broadcastsi128_si256(_mm_loadu_si128(p0.cast()));
    let b1 = _mm256_broadcastsi128_si256(_mm_loadu_si128(p1.cast()));
    let v = _mm512_inserti64x4(_mm512_castsi256_si512(b0), b1, 1);
    let v = _mm512_srlv_epi64(v, _mm512_set_epi64(4, 4, 0, 0, 4, 4, 0, 0));
    _mm512_and_si512(v, _mm512_set1_epi8(0x0F))
}

#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn load2x32(p0: *const u8, p1: *const u8) -> __m512i {
    let lo = _mm256_loadu_si256(p0.cast());
    _mm512_inserti64x4(_mm512_castsi256_si512(lo), _mm256_loadu_si256(p1.cast()), 1)
}

/// Q5 nibbles plus the 5th bits (`qh` words at `qh_off`) as a byte mask.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn q5_codes(x0: *const u8, x1: *const u8, qh_off: usize) -> __m512i {
    let k = rd_u32(x0.add(qh_off)) as u32 as u64 | (rd_u32(x1.add(qh_off)) as u32 as u64) << 32;
    let q = nibbles2(x0.add(qh_off + 4), x1.add(qh_off + 4));
    _mm512_mask_add_epi8(q, k, q, _mm512_set1_epi8(16))
}

pub(super) struct Q4_0;
pub(super) struct Q4_1;
pub(super) struct Q5_0;
pub(super) struct Q5_1;
pub(super) struct Q8_0;

impl Fmt for Q4_0 {
    const WS: usize = 18;
    const AS: usize = 34;
    const A_QS: usize = 2;
    const HAS_MIN: bool = false;
    const BIAS: u8 = 8;
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn codes(x0: *const u8, x1: *const u8) -> __m512i {
        nibbles2(x0.add(2), x1.add(2))
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn tail(x: *const u8, y: *const u8) -> f32 {
        avx2::dot_q4_0(x, y, QK)
    }
}

impl Fmt for Q4_1 {
    const WS: usize = 20;
    const AS: usize = 36;
    const A_QS: usize = 4;
    const HAS_MIN: bool = true;
    const BIAS: u8 = 0;
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn codes(x0: *const u8, x1: *const u8) -> __m512i {
        nibbles2(x0.add(4), x1.add(4))
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn tail(x: *const u8, y: *const u8) -> f32 {
        avx2::dot_q4_1(x, y, QK)
    }
}

impl Fmt for Q5_0 {
    const WS: usize = 22;
    const AS: usize = 34;
    const A_QS: usize = 2;
    const HAS_MIN: bool = false;
    const BIAS: u8 = 16;
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn codes(x0: *const u8, x1: *const u8) -> __m512i {
        q5_codes(x0, x1, 2)
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn tail(x: *const u8, y: *const u8) -> f32 {
        avx2::dot_q5_0(x, y, QK)
    }
}

impl Fmt for Q5_1 {
    const WS: usize = 24;
    const AS: usize = 36;
    const A_QS: usize = 4;
    const HAS_MIN: bool = true;
    const BIAS: u8 = 0;
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn codes(x0: *const u8, x1: *const u8) -> __m512i {
        q5_codes(x0, x1, 4)
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn tail(x: *const u8, y: *const u8) -> f32 {
        avx2::dot_q5_1(x, y, QK)
    }
}

impl Fmt for Q8_0 {
    const WS: usize = 34;
    const AS: usize = 34;
    const A_QS: usize = 2;
    const HAS_MIN: bool = false;
    const BIAS: u8 = 128;
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn codes(x0: *const u8, x1: *const u8) -> __m512i {
        _mm512_xor_si512(load2x32(x0.add(2), x1.add(2)), _mm512_set1_epi8(0x80u8 as i8))
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
    unsafe fn tail(x: *const u8, y: *const u8) -> f32 {
        avx2::dot_q8_0(x, y, QK)
    }
}

tile_dispatch!(Fmt, tile, (4, 2), (3, 2), (2, 2), (1, 2), (4, 1), (3, 1), (2, 1), (1, 1));

// Index loops over the const-size register arrays keep the tile shape explicit.
#[allow(clippy::needless_range_loop)]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn tile<F: Fmt, const RW: usize, const CA: usize>(args: super::TileArgs) {
    let (w, w_stride, a, a_stride, n, out, out_stride) = args;
    let nb = n / QK;
    let mut acc = [[_mm512_setzero_ps(); CA]; RW];
    let mut acc_m = [[_mm_setzero_ps(); CA]; RW];
    let mut i = 0;
    while i + 2 <= nb {
        let mut av = [_mm512_setzero_si512(); CA];
        let mut ah = [_mm_setzero_ps(); CA];
        let mut ad = [_mm512_setzero_ps(); CA];
        let mut seed = [_mm512_setzero_si512(); CA];
        for c in 0..CA {
            let y0 = a.add(c * a_stride + i * F::AS);
            let y1 = y0.add(F::AS);
            av[c] = load2x32(y0.add(F::A_QS), y1.add(F::A_QS));
            ah[c] = head(y0, y1, F::HAS_MIN);
            ad[c] = spread(ah[c]);
            if F::BIAS != 0 {
                let zero = _mm512_setzero_si512();
                let bias_sum = _mm512_dpbusd_epi32(zero, _mm512_set1_epi8(F::BIAS as i8), av[c]);
                seed[c] = _mm512_sub_epi32(zero, bias_sum);
            }
        }
        for r in 0..RW {
            let x0 = w.add(r * w_stride + i * F::WS);
            let x1 = x0.add(F::WS);
            // The bytes this pair reads, PREFETCH_TILES tiles (rows) further on: see
            // the module note. `wrapping_add`, as the address may lie past the matrix
            // (prefetches never fault).
            let ahead = x0.wrapping_add(PREFETCH_TILES * MAX_RW * w_stride);
            _mm_prefetch::<_MM_HINT_T1>(ahead.cast());
            if 2 * F::WS > 64 {
                _mm_prefetch::<_MM_HINT_T1>(ahead.wrapping_add(64).cast());
            }
            let q = F::codes(x0, x1);
            let wh = head(x0, x1, F::HAS_MIN);
            let wd = spread(wh);
            for c in 0..CA {
                let dp = _mm512_dpbusd_epi32(seed[c], q, av[c]);
                acc[r][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dp), _mm512_mul_ps(wd, ad[c]), acc[r][c]);
                if F::HAS_MIN {
                    // Lanes 1 and 3: m_w * s_a of the two blocks.
                    acc_m[r][c] = _mm_fmadd_ps(wh, ah[c], acc_m[r][c]);
                }
            }
        }
        i += 2;
    }
    for r in 0..RW {
        for c in 0..CA {
            let mut sum = _mm512_reduce_add_ps(acc[r][c]);
            if F::HAS_MIN {
                let v = acc_m[r][c];
                let t = _mm_add_ps(v, _mm_movehl_ps(v, v));
                sum += _mm_cvtss_f32(_mm_movehdup_ps(t));
            }
            if i < nb {
                sum += F::tail(w.add(r * w_stride + i * F::WS), a.add(c * a_stride + i * F::AS));
            }
            *out.add(c * out_stride + r) = sum;
        }
    }
}
