//! Packing weight rows into panel records, and the reference of the panels' arithmetic: the
//! scalar forms every SIMD path is tested against (same bytes, same bits).

use super::layout::{Format, Rows, CODES, PANEL, Q4K_BYTES, Q5K_BYTES, Q6K_BYTES, Q8_0_BYTES, SIDE_BYTES};
use crate::linear::qmatrix::QMatrix;
use crate::quant::blocks::{scale_min_k4, QK_K};
use crate::quant::Isa;
use crate::GgmlType;

/// Packs weight rows `j0..j0 + cols` of `w` into `panel` (see the module note); the lanes of
/// missing rows (a last panel under 16) are zero codes and factors. The AVX-512 packers write
/// the same bytes as the scalar ones (tested).
pub(super) fn pack(isa: Isa, scalar: bool, fmt: Format, w: &QMatrix, j0: usize, cols: usize, panel: &mut [u8]) {
    let sbs = w.cols / QK_K;
    assert!(panel.len() == sbs * fmt.sb_bytes() && j0 + cols <= w.rows && cols <= PANEL && fmt.ty == w.ty);
    #[cfg(target_arch = "x86_64")]
    if !scalar && isa >= Isa::Avx512 && w.row_bytes().checked_mul(PANEL).is_some_and(|b| b <= i32::MAX as usize) {
        let (src, stride, dst) = (w.row(j0).as_ptr(), w.row_bytes(), panel.as_mut_ptr());
        // SAFETY: rows j0..j0 + cols of w exist (asserted) and hold sbs super-blocks each, 16
        // rows' offsets fit an i32 (checked); the panel is sbs records (asserted), 64-aligned
        // (a buffer of `Line`s); AVX-512 is available.
        unsafe {
            match fmt.ty {
                GgmlType::Q4K => super::avx512::pack_q4k::<false>(src, stride, cols, sbs, dst),
                GgmlType::Q5K => super::avx512::pack_q4k::<true>(src, stride, cols, sbs, dst),
                _ => super::avx512::pack_q6k(src, stride, cols, sbs, dst),
            }
        }
        return;
    }
    let _ = (isa, scalar);
    for (s, rec) in panel.chunks_exact_mut(fmt.sb_bytes()).enumerate() {
        for r in 0..PANEL {
            if r >= cols {
                for v in 0..fmt.sb_bytes() / 64 {
                    rec[v * 64 + 4 * r..][..4].fill(0);
                }
                continue;
            }
            let row = w.row(j0 + r);
            let mut put = |v: usize, x: f32| rec[v * 64 + 4 * r..][..4].copy_from_slice(&x.to_le_bytes());
            let mut codes = [0u8; QK_K];
            match fmt.ty {
                GgmlType::Q4K | GgmlType::Q5K => {
                    let q5 = fmt.ty == GgmlType::Q5K;
                    let bytes = if q5 { Q5K_BYTES } else { Q4K_BYTES };
                    let blk = &row[s * bytes..(s + 1) * bytes];
                    let (sc, mn) = scale_min_k4(blk[4..16].try_into().expect("12 bytes"));
                    let (d, dmin) = (f16_at(blk, 0), f16_at(blk, 2));
                    // Q5_K's 32 bytes of high bits sit between the scales and the nibbles.
                    let qs = if q5 { 48 } else { 16 };
                    for (e, c) in codes.iter_mut().enumerate() {
                        // The low nibbles of qs[32 (e / 64)..] for even sub-blocks, the high
                        // ones for odd (ggml's Q4_K order); Q5_K's fifth bit is bit e / 32 of
                        // qh[e % 32] (ggml's dequantize_row_q5_K).
                        let low = (blk[qs + 32 * (e / 64) + e % 32] >> (4 * ((e / 32) % 2))) & 0x0F;
                        let high = if q5 { (blk[16 + e % 32] >> (e / 32)) & 1 } else { 0 };
                        *c = low | high << 4;
                    }
                    for g in 0..8 {
                        put(fmt.scales() / 64 + g, d * sc[g] as f32);
                        put(fmt.mins() / 64 + g, dmin * mn[g] as f32);
                    }
                }
                _ => {
                    let blk = &row[s * Q6K_BYTES..(s + 1) * Q6K_BYTES];
                    let d = f16_at(blk, 208);
                    for (e, c) in codes.iter_mut().enumerate() {
                        // ggml's dequantize_row_q6_K: half n, quarter qd, position l.
                        let (n, qd, l) = (e / 128, (e % 128) / 32, e % 32);
                        let low = (blk[64 * n + 32 * (qd % 2) + l] >> (4 * (qd / 2))) & 0x0F;
                        let high = (blk[128 + 32 * n + l] >> (2 * qd)) & 3;
                        *c = low | high << 4;
                    }
                    for g in 0..16 {
                        let ws = d * blk[192 + g] as i8 as f32;
                        put(fmt.scales() / 64 + g, ws);
                        put(fmt.mins() / 64 + g, 32.0 * ws);
                    }
                }
            }
            for (e, &c) in codes.iter().enumerate() {
                rec[CODES + (e / 4) * 64 + 4 * r + e % 4] = c;
            }
        }
    }
}

fn f16_at(b: &[u8], at: usize) -> f32 {
    half::f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

fn f32_at(b: &[u8], at: usize) -> f32 {
    f32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// The reference of the arithmetic in the module note, one output at a time.
///
/// # Safety
/// As [`Rows::compute`].
pub(super) unsafe fn rows_scalar(run: &Rows<'_>, y: *mut f32, n: usize, cols: usize) {
    let (fmt, len) = (run.fmt, run.fmt.group_len());
    for i in 0..run.m {
        let a = &run.act[i * run.act_row..(i + 1) * run.act_row];
        let side = &run.side[i * run.sbs * SIDE_BYTES..(i + 1) * run.sbs * SIDE_BYTES];
        for r in 0..cols {
            let mut acc = 0f32;
            for (s, rec) in run.panel.chunks_exact(fmt.sb_bytes()).take(run.sbs).enumerate() {
                for g in 0..fmt.groups {
                    let mut dot = 0i32;
                    for e in g * len..(g + 1) * len {
                        let q = rec[CODES + (e / 4) * 64 + 4 * r + e % 4] as i32;
                        let blk = (8 * s + e / 32) * Q8_0_BYTES;
                        dot += q * a[blk + 2 + e % 32] as i8 as i32;
                    }
                    let side = &side[s * SIDE_BYTES..];
                    let (da, sa) = (f32_at(side, 4 * (g * len / 32)), f32_at(side, 32 + 4 * g));
                    let (ws, wm) =
                        (f32_at(rec, fmt.scales() + g * 64 + 4 * r), f32_at(rec, fmt.mins() + g * 64 + 4 * r));
                    acc = (dot as f32).mul_add(ws * da, acc);
                    acc = (-wm).mul_add(sa, acc);
                }
            }
            *y.add(i * n + r) = acc;
        }
    }
}
