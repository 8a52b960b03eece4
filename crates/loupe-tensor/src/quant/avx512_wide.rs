//! AVX-512 VNNI wide tiles: up to 2 weight rows x 10 activation rows per call, for Q4_0,
//! Q5_0 and Q8_0 against Q8_0 activations, with `avx512_tile`'s arithmetic (so the same bits
//! per output).
//!
//! Why a second shape: a verification step of speculative decoding (or any batch of 3-10
//! rows at 8-bit activations) runs ~9 activation rows over every weight row. The 4 x 2 tile
//! decodes each weight block pair (Q5_0: nibbles and fifth bits, ~14 instructions) once per
//! 2 activation rows and prepares each activation pair (codes, spread scales, bias seed)
//! once per 4 weight rows: on Zen 4 that overhead held a 9-row Q5_0 matmul to ~115 GFLOP/s
//! (BENCHMARKS.md, "Wide 8-bit tiles"). Here an activation row is prepared once per matmul
//! ([`prepare`], the layout below), and each weight pair, decoded once, serves up to 10
//! activation rows: per output and block pair what remains is `avx512_tile`'s four
//! instructions (`vpdpbusd`, convert, scale product, FMA) and three loads from L1/L2.
//!
//! Prepared activation row (`row_bytes(k)` bytes, 64-byte aligned by the caller): per block
//! pair `p`, 192 bytes: the 64 int8 codes of blocks `2p, 2p + 1`, their scales spread
//! (lanes 0-7 `d_2p`, lanes 8-15 `d_2p+1`, f32), and the bias seed `-bias * sum(a)` per lane
//! (i32); then, for an odd block count, the last block as quantized (34 bytes in a 64-byte
//! slot), which the one-block tail reads.
//!
//! Per output the operations are `avx512_tile::tile`'s, in its order: the accumulator
//! takes `fma(cvt(dpbusd(seed, q, a)), d_w * d_a, acc)` per pair, then one
//! `_mm512_reduce_add_ps`, then the tail block's AVX2 dot. Tested bit for bit against
//! `vec_dot` for every row count (`tests/quant.rs`).
//!
//! Safety: every `unsafe fn` requires AVX-512 F/BW/VL + VNNI + AVX2/FMA/F16C and the pointer
//! contract of [`TileFn`] (activations in the prepared layout); they are reachable only
//! through [`super::tile_fn`], which checks the CPU.

use std::arch::x86_64::*;

use loupe_core::GgmlType;

use super::avx512_tile::{head, load2x32, spread, Fmt, PREFETCH_TILES, Q4_0, Q5_0, Q8_0};
use super::blocks::QK;
use super::{PrepareFn, TileFn};

/// Largest wide tile: weight rows x activation rows. 2 x 10 keeps 20 accumulators, the two
/// weight pairs' codes and scales and one activation pair in the 32 zmm registers.
pub(super) const MAX_RW: usize = 2;
pub(super) const MAX_CA: usize = 10;

/// Fewest activation rows worth preparing: below 3 the 4 x 2 tile decodes as little.
pub(super) const MIN_CA: usize = 3;

/// Bytes of one prepared block pair: codes, spread scales, seed.
const PAIR_BYTES: usize = 192;

/// Prefetch distance in weight rows: `avx512_tile`'s (8 tiles of 4 rows).
const PREFETCH_ROWS: usize = PREFETCH_TILES * 4;

/// Bytes of one prepared activation row of `k` elements (a multiple of 32).
pub(super) fn row_bytes(k: usize) -> usize {
    let nb = k / QK;
    (nb / 2) * PAIR_BYTES + (nb % 2) * 64
}

pub(super) fn tile_fn(ty: GgmlType) -> Option<(TileFn, PrepareFn)> {
    Some(match ty {
        GgmlType::Q4_0 => (dispatch::<Q4_0>, prepare::<Q4_0>),
        GgmlType::Q5_0 => (dispatch::<Q5_0>, prepare::<Q5_0>),
        GgmlType::Q8_0 => (dispatch::<Q8_0>, prepare::<Q8_0>),
        _ => return None,
    })
}

/// Writes the quantized activation row at `a` (`k / 32` blocks of `F::AS` bytes) in the
/// prepared layout at `dst` (`row_bytes(k)` bytes).
///
/// # Safety
/// The CPU has the features above; `a` is readable for the row and `dst` writable for
/// `row_bytes(k)` bytes.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn prepare<F: Fmt>(a: *const u8, k: usize, dst: *mut u8) {
    let nb = k / QK;
    let mut i = 0;
    while i + 2 <= nb {
        let y0 = a.add(i * F::AS);
        let y1 = y0.add(F::AS);
        let av = load2x32(y0.add(F::A_QS), y1.add(F::A_QS));
        let ad = spread(head(y0, y1, false));
        let zero = _mm512_setzero_si512();
        let seed = if F::BIAS != 0 {
            _mm512_sub_epi32(zero, _mm512_dpbusd_epi32(zero, _mm512_set1_epi8(F::BIAS as i8), av))
        } else {
            zero
        };
        let p = dst.add((i / 2) * PAIR_BYTES);
        _mm512_storeu_si512(p.cast(), av);
        _mm512_storeu_ps(p.add(64).cast(), ad);
        _mm512_storeu_si512(p.add(128).cast(), seed);
        i += 2;
    }
    if i < nb {
        std::ptr::copy_nonoverlapping(a.add(i * F::AS), dst.add((nb / 2) * PAIR_BYTES), F::AS);
    }
}

tile_dispatch!(
    Fmt,
    wide,
    (2, 3),
    (2, 4),
    (2, 5),
    (2, 6),
    (2, 7),
    (2, 8),
    (2, 9),
    (2, 10),
    (1, 3),
    (1, 4),
    (1, 5),
    (1, 6),
    (1, 7),
    (1, 8),
    (1, 9),
    (1, 10),
);

// Index loops over the const-size register arrays keep the tile shape explicit.
#[allow(clippy::needless_range_loop)]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn wide<F: Fmt, const RW: usize, const CA: usize>(args: super::TileArgs) {
    let (w, w_stride, a, a_stride, n, out, out_stride) = args;
    let nb = n / QK;
    let mut acc = [[_mm512_setzero_ps(); CA]; RW];
    let mut i = 0;
    while i + 2 <= nb {
        let mut q = [_mm512_setzero_si512(); RW];
        let mut wd = [_mm512_setzero_ps(); RW];
        for r in 0..RW {
            let x0 = w.add(r * w_stride + i * F::WS);
            let x1 = x0.add(F::WS);
            // As `avx512_tile`: the bytes this pair reads, further rows on (`wrapping_add`:
            // past the matrix a prefetch does not fault).
            let ahead = x0.wrapping_add(PREFETCH_ROWS * w_stride);
            _mm_prefetch::<_MM_HINT_T1>(ahead.cast());
            if 2 * F::WS > 64 {
                _mm_prefetch::<_MM_HINT_T1>(ahead.wrapping_add(64).cast());
            }
            q[r] = F::codes(x0, x1);
            wd[r] = spread(head(x0, x1, false));
        }
        let pair = (i / 2) * PAIR_BYTES;
        for c in 0..CA {
            let p = a.add(c * a_stride + pair);
            let av = _mm512_loadu_si512(p.cast());
            let ad = _mm512_loadu_ps(p.add(64).cast());
            let seed = _mm512_loadu_si512(p.add(128).cast());
            for r in 0..RW {
                let dp = _mm512_dpbusd_epi32(seed, q[r], av);
                acc[r][c] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dp), _mm512_mul_ps(wd[r], ad), acc[r][c]);
            }
        }
        i += 2;
    }
    for r in 0..RW {
        for c in 0..CA {
            let mut sum = _mm512_reduce_add_ps(acc[r][c]);
            if i < nb {
                sum += F::tail(w.add(r * w_stride + i * F::WS), a.add(c * a_stride + (nb / 2) * PAIR_BYTES));
            }
            *out.add(c * out_stride + r) = sum;
        }
    }
}
