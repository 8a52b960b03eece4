//! The portable references of the one-row dots: every SIMD kernel is tested against these.

use crate::linear::act16::Act16;
use crate::quant::dequantize_row;
use crate::{GgmlType, TensorError};

/// Reference for [`dot_row_act16`]: exact integer dot per block, then
/// `d * scale * dot (+ m * sum)` in f32 (Q5_0's weights are `q - 16`, no offset term).
///
/// Q6_K: per 32-element Act16 block (two 16-element sub-blocks with i8 scales `sc0`,
/// `sc1`), the exact integer `sc0 * isum0 + sc1 * isum1` (at most 32 * 32 * 128 * 32767
/// < 2^32 in magnitude, so summed in i64) rounded once to f32, times `d * scale` with
/// `d` the super-block's. The AVX2 kernels compute the same integer split over 8 i32
/// lanes (each exact, < 2^29) and round each lane, so they agree within f32 rounding.
pub fn dot_row_act16_scalar(ty: GgmlType, w_row: &[u8], act: &Act16<'_>) -> Result<f32, TensorError> {
    if ty == GgmlType::Q6K {
        return Ok(dot_q6_k_act16_scalar(w_row, act));
    }
    if ty == GgmlType::Q4K || ty == GgmlType::Q5K {
        return Ok(dot_q4_k_act16_scalar(w_row, act, ty == GgmlType::Q5K));
    }
    let bytes = ty.type_size();
    let mut acc = 0f32;
    for (b, wb) in w_row.chunks_exact(bytes).enumerate() {
        let xq = &act.q[b * 32..(b + 1) * 32];
        let (scale, sum) = (act.scale_sum[2 * b], act.scale_sum[2 * b + 1]);
        let d = half::f16::from_le_bytes([wb[0], wb[1]]).to_f32();
        match ty {
            GgmlType::Q4_1 => {
                let m = half::f16::from_le_bytes([wb[2], wb[3]]).to_f32();
                let qs = &wb[4..20];
                let dot: i32 = (0..16)
                    .map(|i| (qs[i] & 0x0F) as i32 * xq[i] as i32 + (qs[i] >> 4) as i32 * xq[i + 16] as i32)
                    .sum();
                acc += d * scale * dot as f32 + m * sum;
            }
            GgmlType::Q8_0 => {
                let dot: i32 = wb[2..34].iter().zip(xq).map(|(&w, &x)| w as i8 as i32 * x as i32).sum();
                acc += d * scale * dot as f32;
            }
            GgmlType::Q5_0 => {
                let qh = u32::from_le_bytes([wb[2], wb[3], wb[4], wb[5]]);
                let qs = &wb[6..22];
                let w = |j: usize| {
                    let nibble = if j < 16 { qs[j] & 0x0F } else { qs[j - 16] >> 4 };
                    (nibble as i32 | ((qh >> j) as i32 & 1) << 4) - 16
                };
                let dot: i32 = (0..32).map(|j| w(j) * xq[j] as i32).sum();
                acc += d * scale * dot as f32;
            }
            GgmlType::Q4_0 => {
                let qs = &wb[2..18];
                let dot: i32 = (0..16)
                    .map(|i| ((qs[i] & 0x0F) as i32 - 8) * xq[i] as i32 + ((qs[i] >> 4) as i32 - 8) * xq[i + 16] as i32)
                    .sum();
                acc += d * scale * dot as f32;
            }
            _ => return Err(TensorError::UnsupportedType { op: "dot_row_act16", dtype: ty }),
        }
    }
    Ok(acc)
}

/// [`dot_row_act16_scalar`] for Q6_K (super-blocks of 210 bytes, see
/// `simd::avx2::q6_k` for the layout); extra activations past the row's super-blocks are
/// not read.
fn dot_q6_k_act16_scalar(w_row: &[u8], act: &Act16<'_>) -> f32 {
    let mut acc = 0f32;
    for (s, sb) in w_row.chunks_exact(210).enumerate() {
        let (ql, qh, sc) = (&sb[..128], &sb[128..192], &sb[192..208]);
        let d = half::f16::from_le_bytes([sb[208], sb[209]]).to_f32();
        for i in 0..8 {
            let b = 8 * s + i;
            let (h, j) = (i / 4, i % 4);
            let xq = &act.q[b * 32..(b + 1) * 32];
            let dot: i64 = (0..32)
                .map(|l| {
                    let low = (ql[64 * h + 32 * (j % 2) + l] >> (4 * (j / 2))) & 0x0F;
                    let high = (qh[32 * h + l] >> (2 * j)) & 3;
                    let q = (low | high << 4) as i64 - 32;
                    q * sc[8 * h + 2 * j + l / 16] as i8 as i64 * xq[l] as i64
                })
                .sum();
            acc += d * act.scale_sum[2 * b] * dot as f32;
        }
    }
    acc
}

/// [`dot_row_act16_scalar`] for Q4_K (super-blocks of 144 bytes) and, `five`, Q5_K (176
/// bytes: 32 bytes of fifth bits before the nibbles, bit `j` of `qh[l]` adding 16 to
/// element `l` of sub-block `j`): per 32-element sub-block `j`, `d' = d * sc` and
/// `m' = -(dmin * m)` (exact in f32), the exact integer dot of the codes, and
/// `acc += d' * scale * dot + m' * sum`, Q4_1's form.
fn dot_q4_k_act16_scalar(w_row: &[u8], act: &Act16<'_>, five: bool) -> f32 {
    let (sb_bytes, qs_at) = if five { (176, 48) } else { (144, 16) };
    let mut acc = 0f32;
    for (s, sb) in w_row.chunks_exact(sb_bytes).enumerate() {
        let d = half::f16::from_le_bytes([sb[0], sb[1]]).to_f32();
        let dmin = half::f16::from_le_bytes([sb[2], sb[3]]).to_f32();
        let (sc, mn) = crate::quant::blocks::scale_min_k4(sb[4..16].try_into().unwrap());
        for j in 0..8 {
            let b = 8 * s + j;
            let xq = &act.q[b * 32..(b + 1) * 32];
            let qs = &sb[qs_at + 32 * (j / 2)..qs_at + 32 * (j / 2) + 32];
            let code = |l: usize| {
                let fifth = if five { ((sb[16 + l] >> j) & 1) << 4 } else { 0 };
                (((qs[l] >> (4 * (j % 2))) & 0x0F) | fifth) as i32
            };
            let dot: i32 = (0..32).map(|l| code(l) * xq[l] as i32).sum();
            let (dp, mp) = (d * sc[j] as f32, -(dmin * mn[j] as f32));
            acc += dp * act.scale_sum[2 * b] * dot as f32 + mp * act.scale_sum[2 * b + 1];
        }
    }
    acc
}

/// Reference: dequantize block by block, multiply in f32.
pub fn dot_row_scalar(ty: GgmlType, w_row: &[u8], x: &[f32]) -> Result<f32, TensorError> {
    let (block, bytes) = (ty.block_size(), ty.type_size());
    whole_blocks(ty, w_row.len(), x.len())?;
    let mut buf = [0f32; 256];
    let mut acc = 0f32;
    for (wb, xb) in w_row.chunks_exact(bytes).zip(x.chunks_exact(block)) {
        let vals = &mut buf[..block];
        dequantize_row(ty, wb, vals)?;
        acc += vals.iter().zip(xb).map(|(a, b)| a * b).sum::<f32>();
    }
    Ok(acc)
}

/// The number of `ty` blocks in `w_bytes` when they are whole and cover exactly `n_values`
/// values. The product test `bytes * block == values * type_size` alone would accept a row
/// that is not whole blocks when the counts happen to balance (9 bytes of Q4_K, whose blocks
/// are 144 bytes of 256 values, against 16 values), and the dot would then be over nothing.
pub(crate) fn whole_blocks(ty: GgmlType, w_bytes: usize, n_values: usize) -> Result<usize, TensorError> {
    let (block, bytes) = (ty.block_size(), ty.type_size());
    if w_bytes.is_multiple_of(bytes) && (w_bytes / bytes).checked_mul(block) == Some(n_values) {
        Ok(w_bytes / bytes)
    } else {
        Err(TensorError::Shape { op: "dot_row", detail: format!("{w_bytes} bytes of {ty} against {n_values} activations (whole {bytes}-byte blocks of {block} values expected)") })
    }
}
