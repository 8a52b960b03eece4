//! Packing weight rows into panel records, and the reference of the panels' arithmetic: the
//! scalar forms every SIMD path is tested against (same bytes, same bits).

use super::layout::{Rows, D, M, PANEL, RECORD_BYTES};
use crate::linear::qmatrix::QMatrix;
use crate::quant::Isa;
use crate::GgmlType;

/// Block `b` of a Q4_0 / Q4_1 / Q5_0 / Q8_0 row as signed codes, `d` and `m` (0 but Q4_1's):
/// the weights are `d * code + m` (ggml's dequantizers).
fn block_codes(ty: GgmlType, row: &[u8], b: usize) -> ([i16; 32], f32, f32) {
    let size = ty.type_size();
    let blk = &row[b * size..(b + 1) * size];
    let f16_at = |i: usize| half::f16::from_le_bytes([blk[i], blk[i + 1]]).to_f32();
    let mut c = [0i16; 32];
    match ty {
        GgmlType::Q8_0 => {
            for (e, v) in c.iter_mut().enumerate() {
                *v = blk[2 + e] as i8 as i16;
            }
            (c, f16_at(0), 0.0)
        }
        GgmlType::Q5_0 => {
            let qh = u32::from_le_bytes([blk[2], blk[3], blk[4], blk[5]]);
            for j in 0..16 {
                let (lo, hi) = (blk[6 + j] & 0x0F, blk[6 + j] >> 4);
                c[j] = (lo | (((qh >> j) & 1) as u8) << 4) as i16 - 16;
                c[j + 16] = (hi | (((qh >> (j + 16)) & 1) as u8) << 4) as i16 - 16;
            }
            (c, f16_at(0), 0.0)
        }
        _ => {
            // Q4_0 (bias 8) and Q4_1 (unsigned, with m): element j is qs[j]'s low nibble,
            // element j + 16 its high nibble.
            let (qs, bias, m) = if ty == GgmlType::Q4_1 { (4, 0, f16_at(2)) } else { (2, 8, 0.0) };
            for j in 0..16 {
                c[j] = (blk[qs + j] & 0x0F) as i16 - bias;
                c[j + 16] = (blk[qs + j] >> 4) as i16 - bias;
            }
            (c, f16_at(0), m)
        }
    }
}

/// Packs weight rows `j0..j0 + cols` of `w` into `panel` (see the module note); the lanes of
/// missing rows (a last panel under 16) are zero codes and factors. The AVX-512 packer writes
/// the same bytes (tested).
pub(super) fn pack(isa: Isa, scalar: bool, w: &QMatrix, j0: usize, cols: usize, panel: &mut [u8]) {
    let blocks = w.cols / 32;
    assert!(panel.len() == blocks * RECORD_BYTES && j0 + cols <= w.rows && cols <= PANEL);
    #[cfg(target_arch = "x86_64")]
    if !scalar && isa >= Isa::Avx512 && w.row_bytes().checked_mul(PANEL).is_some_and(|b| b <= i32::MAX as usize) {
        // SAFETY: rows j0..j0 + cols of w exist (asserted) and hold `blocks` blocks each, 16
        // rows' offsets fit an i32 (checked); the panel is `blocks` records (asserted),
        // 64-aligned (a buffer of lines); AVX-512 is available.
        unsafe { super::avx512::pack(w.ty, w.row(j0).as_ptr(), w.row_bytes(), cols, blocks, panel.as_mut_ptr()) };
        return;
    }
    let _ = (isa, scalar);
    for (b, rec) in panel.chunks_exact_mut(RECORD_BYTES).enumerate() {
        for r in 0..PANEL {
            let (c, d, m) = if r < cols { block_codes(w.ty, w.row(j0 + r), b) } else { ([0; 32], 0.0, 0.0) };
            for (e, v) in c.iter().enumerate() {
                let at = (e / 2) * 64 + 4 * r + 2 * (e % 2);
                rec[at..at + 2].copy_from_slice(&v.to_le_bytes());
            }
            rec[D + 4 * r..D + 4 * r + 4].copy_from_slice(&d.to_le_bytes());
            rec[M + 4 * r..M + 4 * r + 4].copy_from_slice(&m.to_le_bytes());
        }
    }
}

fn f32_at(b: &[u8], at: usize) -> f32 {
    f32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// The reference of the arithmetic in the module note, one output at a time.
///
/// # Safety
/// `y` writable at `i * n + j` for `i < m`, `j < cols <= PANEL`.
pub(super) unsafe fn rows_scalar(run: &Rows<'_>, y: *mut f32, n: usize, cols: usize) {
    let k = run.blocks * 32;
    for i in 0..run.m {
        let (a, ss) = (&run.q[i * k..(i + 1) * k], &run.scale_sum[i * run.blocks * 2..(i + 1) * run.blocks * 2]);
        for r in 0..cols {
            let mut acc = 0f32;
            for (b, rec) in run.panel.chunks_exact(RECORD_BYTES).take(run.blocks).enumerate() {
                let mut isum = 0i32;
                for e in 0..32 {
                    let at = (e / 2) * 64 + 4 * r + 2 * (e % 2);
                    isum += i16::from_le_bytes([rec[at], rec[at + 1]]) as i32 * a[32 * b + e] as i32;
                }
                acc = (isum as f32).mul_add(f32_at(rec, D + 4 * r) * ss[2 * b], acc);
                if run.ty == GgmlType::Q4_1 {
                    acc = f32_at(rec, M + 4 * r).mul_add(ss[2 * b + 1], acc);
                }
            }
            *y.add(i * n + r) = acc;
        }
    }
}
