//! The AVX-512 panel kernel: one vector per activation row holds the 16 outputs of the
//! panel; [`TILE_ROWS`] activation rows at a time, so each code vector loaded feeds that many
//! `vpdpwssd`. Per block and row: 16 `vpdpwssd`, one conversion, one multiply and one FMA
//! (two for Q4_1): the module note's arithmetic, lane by lane. And the packer: each field of
//! the 16 rows gathered as one vector (row `r`'s dword at lane `r`).

use std::arch::x86_64::*;

use super::layout::{Rows, D, M, RECORD_BYTES};
use crate::linear::simd::avx512::RowGather;
use crate::GgmlType;

/// Activation rows per tile: 8 independent `vpdpwssd` chains and 8 accumulators leave room
/// for the code vector and the broadcasts.
pub(super) const TILE_ROWS: usize = 8;

/// `Rows::compute` on AVX-512.
///
/// # Safety
/// As `Rows::compute`, on a CPU with AVX-512 F/BW + VNNI.
pub(super) unsafe fn rows(run: &Rows<'_>, y: *mut f32, n: usize, cols: usize) {
    if run.ty == GgmlType::Q4_1 {
        rows_of::<true>(run, y, n, cols)
    } else {
        rows_of::<false>(run, y, n, cols)
    }
}

/// [`rows`] with or without Q4_1's `m * sum` term.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn rows_of<const MIN: bool>(run: &Rows<'_>, y: *mut f32, n: usize, cols: usize) {
    let mask = ((1u32 << cols) - 1) as __mmask16;
    let mut i = 0;
    while i + TILE_ROWS <= run.m {
        tile::<MIN, TILE_ROWS>(run, i, y.add(i * n), n, mask);
        i += TILE_ROWS;
    }
    macro_rules! tail {
        ($($r:literal)*) => {
            match run.m - i {
                $($r => tile::<MIN, $r>(run, i, y.add(i * n), n, mask),)*
                _ => {}
            }
        };
    }
    tail!(1 2 3 4 5 6 7);
}

/// Activation rows `i0..i0 + R` against the panel, written under `mask` at `y` (row stride
/// `n`).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn tile<const MIN: bool, const R: usize>(run: &Rows<'_>, i0: usize, y: *mut f32, n: usize, mask: __mmask16) {
    let k = run.blocks * 32;
    let panel = run.panel.as_ptr();
    let a = run.q.as_ptr().add(i0 * k);
    let ss = run.scale_sum.as_ptr().add(i0 * run.blocks * 2);
    let mut acc = [_mm512_setzero_ps(); R];
    for b in 0..run.blocks {
        let rec = panel.add(b * RECORD_BYTES);
        let mut dot = [_mm512_setzero_si512(); R];
        for p in 0..16 {
            let codes = _mm512_load_si512(rec.add(p * 64).cast());
            for (r, d) in dot.iter_mut().enumerate() {
                *d = dpwssd_broadcast(*d, codes, a.add(r * k + 32 * b + 2 * p).cast::<i32>());
            }
        }
        let d = _mm512_load_ps(rec.add(D).cast());
        let m = _mm512_load_ps(rec.add(M).cast());
        for (r, dot) in dot.into_iter().enumerate() {
            let at = ss.add(r * run.blocks * 2 + 2 * b);
            acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), _mm512_mul_ps(d, _mm512_set1_ps(*at)), acc[r]);
            if MIN {
                acc[r] = _mm512_fmadd_ps(m, _mm512_set1_ps(*at.add(1)), acc[r]);
            }
        }
    }
    for (r, v) in acc.into_iter().enumerate() {
        _mm512_mask_storeu_ps(y.add(r * n), mask, v);
    }
}

/// `acc + vpdpwssd(codes, the i16 pair at `pair` in every lane)`, as one `vpdpwssd` with an
/// embedded broadcast. Written as assembly because LLVM, tuning for a generic x86-64, splits
/// the intrinsic into `vpmaddwd` + `vpaddd` (twice the instructions) and broadcasts the pair
/// in a separate instruction; on the CPUs with AVX-512 VNNI the single instruction is as fast
/// as `vpmaddwd` alone.
///
/// # Safety
/// `pair` is readable for 4 bytes; the CPU has AVX-512 VNNI.
#[inline]
#[target_feature(enable = "avx512f,avx512vnni")]
unsafe fn dpwssd_broadcast(acc: __m512i, codes: __m512i, pair: *const i32) -> __m512i {
    let mut acc = acc;
    std::arch::asm!(
        "vpdpwssd {acc}, {codes}, dword ptr [{pair}]{{1to16}}",
        acc = inout(zmm_reg) acc,
        codes = in(zmm_reg) codes,
        pair = in(reg) pair,
        options(pure, readonly, nostack, preserves_flags),
    );
    acc
}

/// Two i16 pair vectors from 16 lanes of 4 codes each (byte `t` of lane `r` is code `t`,
/// already biased): `(c0, c1)` and `(c2, c3)` per lane.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn pairs_of_bytes(x: __m512i, signed: bool) -> (__m512i, __m512i) {
    // Bytes 0 and 2 into the low halves, 1 and 3 into the high halves of their i16 pairs.
    if signed {
        let even = _mm512_srai_epi16::<8>(_mm512_slli_epi16::<8>(x));
        let odd = _mm512_srai_epi16::<8>(x);
        // even: (c0, c2) in i16 lanes 0, 1 of each dword; odd: (c1, c3).
        (low_halves(even, odd), high_halves(even, odd))
    } else {
        let even = _mm512_and_si512(x, _mm512_set1_epi16(0x00FF));
        let odd = _mm512_srli_epi16::<8>(x);
        (low_halves(even, odd), high_halves(even, odd))
    }
}

/// Per dword lane: the low i16 of `a` and of `b` as `(a_lo, b_lo)`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn low_halves(a: __m512i, b: __m512i) -> __m512i {
    _mm512_or_si512(_mm512_and_si512(a, _mm512_set1_epi32(0xFFFF)), _mm512_slli_epi32::<16>(b))
}

/// Per dword lane: the high i16 of `a` and of `b` as `(a_hi, b_hi)`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn high_halves(a: __m512i, b: __m512i) -> __m512i {
    _mm512_or_si512(_mm512_srli_epi32::<16>(a), _mm512_and_si512(b, _mm512_set1_epi32(0xFFFF_0000u32 as i32)))
}

/// [`super::pack::pack`] on AVX-512, the same bytes.
///
/// # Safety
/// `w` holds `cols <= 16` rows of `row_bytes` each (`ty`: Q4_0, Q4_1, Q5_0 or Q8_0,
/// `blocks` blocks), `16 * row_bytes` fits an i32; `panel` is `blocks` records, 64-aligned;
/// the CPU has AVX-512 F/BW.
#[target_feature(enable = "avx512f,avx512bw,f16c")]
pub(super) unsafe fn pack(ty: GgmlType, w: *const u8, row_bytes: usize, cols: usize, blocks: usize, panel: *mut u8) {
    let rows = RowGather::new(row_bytes, cols);
    let (mask, gather) = (rows.mask, |at: *const u8| rows.at(at));
    let nib = _mm512_set1_epi32(0x0F0F_0F0F);
    let size = ty.type_size();
    for b in 0..blocks {
        let (blk, rec) = (w.add(b * size), panel.add(b * RECORD_BYTES));
        // Missing rows' lanes stay zero (the biases would make them -8 or -16).
        let put = |p: usize, v: __m512i| _mm512_store_si512(rec.add(p * 64).cast(), _mm512_maskz_mov_epi32(mask, v));
        // d (low half) and, for Q4_1, m (high half) of the first dword.
        let dm = gather(blk);
        _mm512_store_ps(rec.add(D).cast(), _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dm)));
        let m = if ty == GgmlType::Q4_1 {
            _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32::<16>(dm)))
        } else {
            _mm512_setzero_ps()
        };
        _mm512_store_ps(rec.add(M).cast(), m);
        match ty {
            GgmlType::Q8_0 => {
                for v in 0..8 {
                    let (lo, hi) = pairs_of_bytes(gather(blk.add(2 + 4 * v)), true);
                    put(2 * v, lo);
                    put(2 * v + 1, hi);
                }
            }
            _ => {
                // Dword v of qs holds elements 4 v .. 4 v + 4 (low nibbles) and 16 + 4 v ..
                // (high nibbles); Q5_0 adds bit e of qh as bit 4 of element e.
                let (qs, bias) = match ty {
                    GgmlType::Q4_1 => (4, 0),
                    GgmlType::Q5_0 => (6, 16),
                    _ => (2, 8),
                };
                let qh = if ty == GgmlType::Q5_0 { gather(blk.add(2)) } else { _mm512_setzero_si512() };
                let bias = _mm512_set1_epi16(bias);
                for v in 0..4 {
                    let q = gather(blk.add(qs + 4 * v));
                    for (half, codes) in [_mm512_and_si512(q, nib), _mm512_and_si512(_mm512_srli_epi32::<4>(q), nib)]
                        .into_iter()
                        .enumerate()
                    {
                        let e0 = 16 * half + 4 * v;
                        let (mut lo, mut hi) = pairs_of_bytes(codes, false);
                        if ty == GgmlType::Q5_0 {
                            // Bits e0 .. e0 + 4 of qh, each to bit 4 of its i16.
                            let bits = _mm512_srlv_epi32(qh, _mm512_set1_epi32(e0 as i32));
                            let bit = |t: u32| {
                                let one = _mm512_and_si512(
                                    _mm512_srlv_epi32(bits, _mm512_set1_epi32(t as i32)),
                                    _mm512_set1_epi32(1),
                                );
                                _mm512_slli_epi32::<4>(one)
                            };
                            lo = _mm512_or_si512(lo, _mm512_or_si512(bit(0), _mm512_slli_epi32::<16>(bit(1))));
                            hi = _mm512_or_si512(hi, _mm512_or_si512(bit(2), _mm512_slli_epi32::<16>(bit(3))));
                        }
                        put(e0 / 2, _mm512_sub_epi16(lo, bias));
                        put(e0 / 2 + 1, _mm512_sub_epi16(hi, bias));
                    }
                }
            }
        }
    }
}
