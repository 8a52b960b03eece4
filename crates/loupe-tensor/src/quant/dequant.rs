//! Scalar dequantization, one function per type.
//!
//! The arithmetic is written in the same order, with the same f32 roundings, as
//! ggml's `dequantize_row_*` and gguf-py's `quants.py` (for Q4_1: `d * q` rounded,
//! then `+ m` rounded; never fused), so results are bit-identical to both; the
//! Python cross-check in `tests/python_crosscheck.rs` holds us to that.
//!
//! Callers (`quant::dequantize_row`) have already checked that `src` holds exactly
//! the blocks for `dst`.

use half::{bf16, f16};

use super::blocks::*;

pub(crate) fn f32_row(src: &[u8], dst: &mut [f32]) {
    for (o, b) in dst.iter_mut().zip(src.chunks_exact(4)) {
        *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    }
}

pub(crate) fn f16_row(src: &[u8], dst: &mut [f32]) {
    for (o, b) in dst.iter_mut().zip(src.chunks_exact(2)) {
        *o = f16::from_le_bytes([b[0], b[1]]).to_f32();
    }
}

pub(crate) fn bf16_row(src: &[u8], dst: &mut [f32]) {
    for (o, b) in dst.iter_mut().zip(src.chunks_exact(2)) {
        *o = bf16::from_le_bytes([b[0], b[1]]).to_f32();
    }
}

pub(crate) fn q4_0(src: &[u8], dst: &mut [f32]) {
    for (i, out) in dst.chunks_exact_mut(QK).enumerate() {
        let b: BlockQ4_0 = read(src, i);
        let d = b.d.to_f32();
        for j in 0..QK / 2 {
            out[j] = d * ((b.qs[j] & 0x0F) as i32 - 8) as f32;
            out[j + QK / 2] = d * ((b.qs[j] >> 4) as i32 - 8) as f32;
        }
    }
}

pub(crate) fn q4_1(src: &[u8], dst: &mut [f32]) {
    for (i, out) in dst.chunks_exact_mut(QK).enumerate() {
        let b: BlockQ4_1 = read(src, i);
        let (d, m) = (b.d.to_f32(), b.m.to_f32());
        for j in 0..QK / 2 {
            out[j] = d * (b.qs[j] & 0x0F) as f32 + m;
            out[j + QK / 2] = d * (b.qs[j] >> 4) as f32 + m;
        }
    }
}

/// The 32 five-bit values of a Q5_0/Q5_1 block, unbiased (0..=31).
#[inline(always)]
pub(crate) fn q5_values(qh: [u8; 4], qs: &[u8; QK / 2]) -> [u8; QK] {
    let qh = u32::from_le_bytes(qh);
    let mut q = [0u8; QK];
    for j in 0..QK / 2 {
        q[j] = (qs[j] & 0x0F) | ((((qh >> j) & 1) as u8) << 4);
        q[j + QK / 2] = (qs[j] >> 4) | ((((qh >> (j + QK / 2)) & 1) as u8) << 4);
    }
    q
}

pub(crate) fn q5_0(src: &[u8], dst: &mut [f32]) {
    for (i, out) in dst.chunks_exact_mut(QK).enumerate() {
        let b: BlockQ5_0 = read(src, i);
        let d = b.d.to_f32();
        for (o, q) in out.iter_mut().zip(q5_values(b.qh, &b.qs)) {
            *o = d * (q as i32 - 16) as f32;
        }
    }
}

pub(crate) fn q5_1(src: &[u8], dst: &mut [f32]) {
    for (i, out) in dst.chunks_exact_mut(QK).enumerate() {
        let b: BlockQ5_1 = read(src, i);
        let (d, m) = (b.d.to_f32(), b.m.to_f32());
        for (o, q) in out.iter_mut().zip(q5_values(b.qh, &b.qs)) {
            *o = d * q as f32 + m;
        }
    }
}

pub(crate) fn q8_0(src: &[u8], dst: &mut [f32]) {
    for (i, out) in dst.chunks_exact_mut(QK).enumerate() {
        let b: BlockQ8_0 = read(src, i);
        let d = b.d.to_f32();
        for (o, &q) in out.iter_mut().zip(&b.qs) {
            *o = q as f32 * d;
        }
    }
}

pub(crate) fn q8_1(src: &[u8], dst: &mut [f32]) {
    for (i, out) in dst.chunks_exact_mut(QK).enumerate() {
        let b: BlockQ8_1 = read(src, i);
        let d = b.d.to_f32();
        for (o, &q) in out.iter_mut().zip(&b.qs) {
            *o = q as f32 * d;
        }
    }
}

/// Q2_K element order: the block is two halves of 128; in half `h`, 2-bit field
/// `s` (bits `2s..2s+2`) of `qs[32h + l]` is element `128h + 32s + l`. The scale of
/// element `e` is `scales[e / 16]`.
pub(crate) fn q2_k(src: &[u8], dst: &mut [f32]) {
    for (i, out) in dst.chunks_exact_mut(QK_K).enumerate() {
        let b: BlockQ2K = read(src, i);
        let (d, dmin) = (b.d.to_f32(), b.dmin.to_f32());
        for (e, o) in out.iter_mut().enumerate() {
            let (h, s, l) = (e / 128, (e % 128) / 32, e % 32);
            let sc = b.scales[e / 16];
            let dl = d * (sc & 0x0F) as f32;
            let ml = dmin * (sc >> 4) as f32;
            let q = (b.qs[32 * h + l] >> (2 * s)) & 3;
            *o = dl * q as f32 - ml;
        }
    }
}

/// Q3_K: low bits placed as in Q2_K; the high bit of element `e` is bit `e / 32`
/// of `hmask[e % 32]`, and a *clear* bit subtracts 4.
pub(crate) fn q3_k(src: &[u8], dst: &mut [f32]) {
    for (i, out) in dst.chunks_exact_mut(QK_K).enumerate() {
        let b: BlockQ3K = read(src, i);
        let d = b.d.to_f32();
        let scales = scales_q3k(&b.scales);
        for (e, o) in out.iter_mut().enumerate() {
            let (h, s, l) = (e / 128, (e % 128) / 32, e % 32);
            let low = ((b.qs[32 * h + l] >> (2 * s)) & 3) as i32;
            let high = if b.hmask[l] & (1 << (e / 32)) != 0 { 0 } else { 4 };
            let dl = d * scales[e / 16] as f32;
            *o = dl * (low - high) as f32;
        }
    }
}

/// Q4_K: sub-block `j` (32 elements) is the low nibbles of `qs[32 (j/2) ..][..32]`
/// for even `j`, the high nibbles for odd `j`.
pub(crate) fn q4_k(src: &[u8], dst: &mut [f32]) {
    for (i, out) in dst.chunks_exact_mut(QK_K).enumerate() {
        let b: BlockQ4K = read(src, i);
        let (d, dmin) = (b.d.to_f32(), b.dmin.to_f32());
        let (sc, mn) = scale_min_k4(&b.scales);
        for (j, sub) in out.chunks_exact_mut(32).enumerate() {
            let dl = d * sc[j] as f32;
            let ml = dmin * mn[j] as f32;
            let shift = 4 * (j % 2);
            for (l, o) in sub.iter_mut().enumerate() {
                let q = (b.qs[32 * (j / 2) + l] >> shift) & 0x0F;
                *o = dl * q as f32 - ml;
            }
        }
    }
}

pub(crate) fn q5_k(src: &[u8], dst: &mut [f32]) {
    for (i, out) in dst.chunks_exact_mut(QK_K).enumerate() {
        let b: BlockQ5K = read(src, i);
        let (d, dmin) = (b.d.to_f32(), b.dmin.to_f32());
        let (sc, mn) = scale_min_k4(&b.scales);
        for (j, sub) in out.chunks_exact_mut(32).enumerate() {
            let dl = d * sc[j] as f32;
            let ml = dmin * mn[j] as f32;
            let shift = 4 * (j % 2);
            for (l, o) in sub.iter_mut().enumerate() {
                let q = ((b.qs[32 * (j / 2) + l] >> shift) & 0x0F) | (((b.qh[l] >> j) & 1) << 4);
                *o = dl * q as f32 - ml;
            }
        }
    }
}

/// The 6-bit value of Q6_K element `e` (0..=63, before the -32 bias): in half `h`
/// (128 elements, `r = e % 128`), low 4 bits from nibble `r / 64` of
/// `ql[64h + r % 64]`, high 2 bits from bits `2 (r / 32)` of `qh[32h + r % 32]`.
#[inline(always)]
pub(crate) fn q6_value(b: &BlockQ6K, e: usize) -> u8 {
    let (h, r) = (e / 128, e % 128);
    let low = (b.ql[64 * h + r % 64] >> (4 * (r / 64))) & 0x0F;
    let high = (b.qh[32 * h + r % 32] >> (2 * (r / 32))) & 3;
    low | (high << 4)
}

pub(crate) fn q6_k(src: &[u8], dst: &mut [f32]) {
    for (i, out) in dst.chunks_exact_mut(QK_K).enumerate() {
        let b: BlockQ6K = read(src, i);
        let d = b.d.to_f32();
        for (e, o) in out.iter_mut().enumerate() {
            let dl = d * b.scales[e / 16] as f32;
            *o = dl * (q6_value(&b, e) as i32 - 32) as f32;
        }
    }
}

pub(crate) fn q8_k(src: &[u8], dst: &mut [f32]) {
    for (i, out) in dst.chunks_exact_mut(QK_K).enumerate() {
        let b: BlockQ8K = read(src, i);
        for (o, &q) in out.iter_mut().zip(&b.qs) {
            *o = b.d * q as f32;
        }
    }
}

/// E2M1 values of the MXFP4 nibbles, doubled so they are integers (ggml's
/// `kvalues_mxfp4`); the block scale carries the missing halving.
pub(crate) const MXFP4_VALUES: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// An E8M0 block exponent as `2^(e - 127) / 2` (ggml's `GGML_E8M0_TO_FP32_HALF`): the scale
/// of the doubled [`MXFP4_VALUES`]. e = 0 and 1 give f32 subnormals.
pub(crate) fn e8m0_half(e: u8) -> f32 {
    if e < 2 {
        f32::from_bits(0x0020_0000 << e)
    } else {
        f32::from_bits(u32::from(e - 1) << 23)
    }
}

/// A UE4M3 sub-block scale of NVFP4 as ggml decodes it (`ggml_ue4m3_to_fp32`, ggml-impl.h):
/// 4 exponent bits (bias 7) and 3 mantissa bits, bit 7 ignored, times 1/2 for the doubled
/// [`MXFP4_VALUES`] grid; 0x00 and 0x7F (E4M3's NaN) decode to 0, so a broken scale byte
/// zeroes its sub-block instead of spreading NaN.
pub(crate) fn ue4m3_half(x: u8) -> f32 {
    // A table: the formula's `powi` calls cost more than the rest of an NVFP4 sub-block's
    // dot (decode ran at a third of MXFP4's speed with them).
    static TABLE: std::sync::LazyLock<[f32; 256]> =
        std::sync::LazyLock::new(|| std::array::from_fn(|i| ue4m3_half_formula(i as u8)));
    TABLE[usize::from(x)]
}

fn ue4m3_half_formula(x: u8) -> f32 {
    if x == 0 || x == 0x7f {
        return 0.0;
    }
    let exp = i32::from((x >> 3) & 0x0f);
    let man = f32::from(x & 0x07);
    // Both forms are exact in f32: man * 2^-9 (subnormal) and (8 + man) * 2^(exp - 10).
    let raw = if exp == 0 { man * f32::powi(2.0, -9) } else { (8.0 + man) * f32::powi(2.0, exp - 10) };
    raw * 0.5
}

/// ggml's `dequantize_row_nvfp4`: per 16-element sub-block s, byte j of its 8 holds element
/// j in the low nibble and element j + 8 in the high one.
pub(crate) fn nvfp4(src: &[u8], dst: &mut [f32]) {
    for (b, out) in src.chunks_exact(36).zip(dst.chunks_exact_mut(64)) {
        for s in 0..4 {
            let d = ue4m3_half(b[s]);
            let qs = &b[4 + 8 * s..12 + 8 * s];
            let o = &mut out[16 * s..16 * s + 16];
            for j in 0..8 {
                o[j] = f32::from(MXFP4_VALUES[(qs[j] & 0x0F) as usize]) * d;
                o[j + 8] = f32::from(MXFP4_VALUES[(qs[j] >> 4) as usize]) * d;
            }
        }
    }
}

pub(crate) fn mxfp4(src: &[u8], dst: &mut [f32]) {
    for (b, out) in src.chunks_exact(17).zip(dst.chunks_exact_mut(32)) {
        let d = e8m0_half(b[0]);
        for j in 0..16 {
            out[j] = f32::from(MXFP4_VALUES[(b[1 + j] & 0x0F) as usize]) * d;
            out[j + 16] = f32::from(MXFP4_VALUES[(b[1 + j] >> 4) as usize]) * d;
        }
    }
}

/// `GgmlType::Fp8E4M3` (34-byte blocks: f16 `d`, then 32 E4M3 codes): `e4m3(q) * d`, each
/// code widened exactly and multiplied once (one f32 rounding, as `q8_0`). The NaN codes
/// (0x7f, 0xff) stay NaN; loupe's quantizer never writes them.
pub(crate) fn fp8_e4m3(src: &[u8], dst: &mut [f32]) {
    for (b, out) in src.chunks_exact(34).zip(dst.chunks_exact_mut(32)) {
        let d = f16::from_le_bytes([b[0], b[1]]).to_f32();
        for (o, &q) in out.iter_mut().zip(&b[2..]) {
            *o = crate::fp8::decode_e4m3(q) * d;
        }
    }
}
