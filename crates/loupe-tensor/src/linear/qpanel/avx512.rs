//! The AVX-512 VNNI panel kernel: one vector per activation row holds the 16 outputs of the
//! panel; [`TILE_ROWS`] activation rows at a time, so each 64-byte code vector loaded feeds
//! that many `vpdpbusd`. Per sum group and row: a `vpdpbusd` per 4 elements, one conversion,
//! one multiply and two FMAs: the module note's arithmetic, lane by lane. And the packers:
//! each field of the 16 rows gathered as one vector (row `r`'s dword at lane `r`).

use std::arch::x86_64::*;
use std::ptr::read_unaligned;

use super::layout::{Format, Rows, CODES, Q4K_BYTES, Q5K_BYTES, Q6K_BYTES, Q8_0_BYTES, SIDE_BYTES};
use crate::linear::simd::avx512::RowGather;
use crate::GgmlType;

/// Activation rows per tile: 6 independent `vpdpbusd` chains cover its latency, and the
/// group sums and accumulators (12 vectors) leave room for the code vector and the
/// broadcasts.
pub(super) const TILE_ROWS: usize = 6;

/// `Rows::compute` on AVX-512.
///
/// # Safety
/// As `Rows::compute`, on a CPU with AVX-512 F/BW + VNNI.
pub(super) unsafe fn rows(run: &Rows<'_>, y: *mut f32, n: usize, cols: usize) {
    match run.fmt.groups {
        8 => rows_of::<8>(run, y, n, cols),
        _ => rows_of::<16>(run, y, n, cols),
    }
}

/// [`rows`] for a format of `G` sum groups per super-block.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn rows_of<const G: usize>(run: &Rows<'_>, y: *mut f32, n: usize, cols: usize) {
    let mask = ((1u32 << cols) - 1) as __mmask16;
    let mut i = 0;
    while i + TILE_ROWS <= run.m {
        tile::<G, TILE_ROWS>(run, i, y.add(i * n), n, mask);
        i += TILE_ROWS;
    }
    macro_rules! tail {
        ($($r:literal)*) => {
            match run.m - i {
                $($r => tile::<G, $r>(run, i, y.add(i * n), n, mask),)*
                _ => {}
            }
        };
    }
    tail!(1 2 3 4 5);
}

/// Activation rows `i0..i0 + R` against the panel, written under `mask` at `y` (row stride
/// `n`).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn tile<const G: usize, const R: usize>(run: &Rows<'_>, i0: usize, y: *mut f32, n: usize, mask: __mmask16) {
    let fmt = run.fmt;
    let (len, sb_bytes, scales, mins) = (fmt.group_len(), fmt.sb_bytes(), fmt.scales(), fmt.mins());
    let panel = run.panel.as_ptr();
    let act = run.act.as_ptr().add(i0 * run.act_row);
    let side = run.side.as_ptr().add(i0 * run.sbs * SIDE_BYTES);
    let side_row = run.sbs * SIDE_BYTES;
    let mut acc = [_mm512_setzero_ps(); R];
    for s in 0..run.sbs {
        let rec = panel.add(s * sb_bytes);
        for g in 0..G {
            let e0 = g * len;
            let blk = act.add((8 * s + e0 / 32) * Q8_0_BYTES + 2 + e0 % 32);
            let mut dot = [_mm512_setzero_si512(); R];
            for v in 0..len / 4 {
                let codes = _mm512_load_si512(rec.add(CODES + (e0 / 4 + v) * 64).cast());
                for (r, d) in dot.iter_mut().enumerate() {
                    let a = read_unaligned(blk.add(r * run.act_row + 4 * v).cast::<i32>());
                    *d = _mm512_dpbusd_epi32(*d, codes, _mm512_set1_epi32(a));
                }
            }
            let ws = _mm512_load_ps(rec.add(scales + g * 64).cast());
            let wm = _mm512_load_ps(rec.add(mins + g * 64).cast());
            for (r, d) in dot.into_iter().enumerate() {
                let at = side.add(r * side_row + s * SIDE_BYTES);
                let da = read_unaligned(at.add(4 * (e0 / 32)).cast::<f32>());
                let sa = read_unaligned(at.add(32 + 4 * g).cast::<f32>());
                acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(d), _mm512_mul_ps(ws, _mm512_set1_ps(da)), acc[r]);
                acc[r] = _mm512_fnmadd_ps(wm, _mm512_set1_ps(sa), acc[r]);
            }
        }
    }
    for (r, a) in acc.into_iter().enumerate() {
        _mm512_mask_storeu_ps(y.add(r * n), mask, a);
    }
}

/// The Q4_K packer, and with `Q5` the Q5_K one (`pack::pack`'s bytes).
///
/// # Safety
/// `w` holds `cols <= 16` rows of `row_bytes` each (Q4_K, or Q5_K with `Q5`, `sbs`
/// super-blocks), `16 * row_bytes` fits an i32; `panel` is `sbs` records, 64-aligned; the
/// CPU has AVX-512 F/BW.
#[target_feature(enable = "avx512f,avx512bw,f16c")]
pub(super) unsafe fn pack_q4k<const Q5: bool>(w: *const u8, row_bytes: usize, cols: usize, sbs: usize, panel: *mut u8) {
    let fmt = Format::of(if Q5 { GgmlType::Q5K } else { GgmlType::Q4K }).expect("Q4_K and Q5_K have panels");
    let (block_bytes, qs) = if Q5 { (Q5K_BYTES, 48) } else { (Q4K_BYTES, 16) };
    let rows = RowGather::new(row_bytes, cols);
    let gather = |at: *const u8| rows.at(at);
    let nib = _mm512_set1_epi32(0x0F0F_0F0F);
    let one = _mm512_set1_epi32(0x0101_0101);
    let byte = _mm512_set1_epi32(0xFF);
    for s in 0..sbs {
        let (blk, rec) = (w.add(s * block_bytes), panel.add(s * fmt.sb_bytes()));
        // Codes: qs bytes 32 p + 4 v .. + 4 hold dword v of sub-blocks 2 p (low nibbles) and
        // 2 p + 1 (high nibbles); Q5_K's fifth bit of sub-block j is bit j of the qh bytes
        // 4 v .. + 4.
        for v in 0..8 {
            let qh = if Q5 { gather(blk.add(16 + 4 * v)) } else { _mm512_setzero_si512() };
            let fifth = |j: i32| {
                let bit = _mm512_and_si512(_mm512_srlv_epi32(qh, _mm512_set1_epi32(j)), one);
                _mm512_slli_epi32::<4>(bit)
            };
            for p in 0..4 {
                let q = gather(blk.add(qs + 32 * p + 4 * v));
                let mut lo = _mm512_and_si512(q, nib);
                let mut hi = _mm512_and_si512(_mm512_srli_epi32::<4>(q), nib);
                if Q5 {
                    lo = _mm512_or_si512(lo, fifth(2 * p as i32));
                    hi = _mm512_or_si512(hi, fifth(2 * p as i32 + 1));
                }
                _mm512_store_si512(rec.add(CODES + (16 * p + v) * 64).cast(), lo);
                _mm512_store_si512(rec.add(CODES + (16 * p + 8 + v) * 64).cast(), hi);
            }
        }
        // d (low half) and dmin (high half) of the first dword.
        let dd = gather(blk);
        let d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(dd));
        let dmin = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32::<16>(dd)));
        // Scales and mins: `blocks::scale_min_k4_words` on 16 lanes, each byte times d or dmin.
        let (a, b, c) = (gather(blk.add(4)), gather(blk.add(8)), gather(blk.add(12)));
        let low6 = _mm512_set1_epi32(0x3F3F_3F3F);
        let low2 = _mm512_set1_epi32(0x0303_0303);
        let top2 = |x: __m512i| _mm512_slli_epi32::<4>(_mm512_and_si512(_mm512_srli_epi32::<6>(x), low2));
        let sc = [_mm512_and_si512(a, low6), _mm512_or_si512(_mm512_and_si512(c, nib), top2(a))];
        let mn =
            [_mm512_and_si512(b, low6), _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32::<4>(c), nib), top2(b))];
        let byte_of = |x: __m512i, i: usize| {
            _mm512_cvtepi32_ps(_mm512_and_si512(_mm512_srlv_epi32(x, _mm512_set1_epi32(8 * i as i32)), byte))
        };
        for j in 0..8 {
            _mm512_store_ps(rec.add(fmt.scales() + j * 64).cast(), _mm512_mul_ps(d, byte_of(sc[j / 4], j % 4)));
            _mm512_store_ps(rec.add(fmt.mins() + j * 64).cast(), _mm512_mul_ps(dmin, byte_of(mn[j / 4], j % 4)));
        }
    }
}

/// The Q6_K packer (`pack::pack`'s bytes).
///
/// # Safety
/// As [`pack_q4k`], for Q6_K rows.
#[target_feature(enable = "avx512f,avx512bw,f16c")]
pub(super) unsafe fn pack_q6k(w: *const u8, row_bytes: usize, cols: usize, sbs: usize, panel: *mut u8) {
    let fmt = Format::of(GgmlType::Q6K).expect("Q6_K has panels");
    let rows = RowGather::new(row_bytes, cols);
    let gather = |at: *const u8| rows.at(at);
    let nib = _mm512_set1_epi32(0x0F0F_0F0F);
    let two = _mm512_set1_epi32(0x0303_0303);
    for s in 0..sbs {
        let (blk, rec) = (w.add(s * Q6K_BYTES), panel.add(s * fmt.sb_bytes()));
        // Element 128 n + 32 qd + l: the low 4 bits in ql[64 n + 32 (qd % 2) + l] (low nibble
        // for qd < 2), the high 2 in bits 2 qd of qh[32 n + l] (ggml's dequantize_row_q6_K).
        for n in 0..2 {
            for v in 0..8 {
                let qh = gather(blk.add(128 + 32 * n + 4 * v));
                for half in 0..2 {
                    let ql = gather(blk.add(64 * n + 32 * half + 4 * v));
                    for upper in 0..2 {
                        let qd = half + 2 * upper;
                        let low = _mm512_and_si512(_mm512_srlv_epi32(ql, _mm512_set1_epi32(4 * upper as i32)), nib);
                        let high = _mm512_and_si512(_mm512_srlv_epi32(qh, _mm512_set1_epi32(2 * qd as i32)), two);
                        let code = _mm512_or_si512(low, _mm512_slli_epi32::<4>(high));
                        _mm512_store_si512(rec.add(CODES + (32 * n + 8 * qd + v) * 64).cast(), code);
                    }
                }
            }
        }
        // d: the high half of the dword at 206 (the block's last four bytes).
        let d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32::<16>(gather(blk.add(206)))));
        for q in 0..4 {
            let scales = gather(blk.add(192 + 4 * q));
            for i in 0..4 {
                // Byte i, sign-extended: shifted to the top, then arithmetically down.
                let top = _mm512_sllv_epi32(scales, _mm512_set1_epi32(24 - 8 * i as i32));
                let ws = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_srai_epi32::<24>(top)));
                let g = 4 * q + i;
                _mm512_store_ps(rec.add(fmt.scales() + g * 64).cast(), ws);
                _mm512_store_ps(rec.add(fmt.mins() + g * 64).cast(), _mm512_mul_ps(_mm512_set1_ps(32.0), ws));
            }
        }
    }
}
