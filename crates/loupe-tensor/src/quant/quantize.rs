//! Scalar quantizers: the activation types (Q8_0, Q8_1, Q8_K) used on every
//! matmul, plus the legacy weight types and F16/BF16 for tests and test-model
//! writers.
//!
//! Each follows ggml's `quantize_row_*_ref` (ggml/src/ggml-quants.c) step for step,
//! including its rounding (`roundf` = half away from zero for Q8_0/Q8_1;
//! truncation after `+ 0.5`/`+ 8.5` for Q4/Q5; `nearest_int` = half to even for
//! Q8_K), so a model written here quantizes as ggml would write it. Of the K-quant weight
//! types, Q4_K is written (ggml's `quantize_row_q4_K_ref` with its iterative
//! `make_qkx2_quants` search for each sub-block's scale and min); the others are not.
//!
//! Callers (`quant::quantize_row`) have already checked the lengths.

use half::{bf16, f16};

use super::blocks::*;

pub(crate) fn f32_row(src: &[f32], dst: &mut [u8]) {
    for (x, o) in src.iter().zip(dst.chunks_exact_mut(4)) {
        o.copy_from_slice(&x.to_le_bytes());
    }
}

pub(crate) fn f16_row(src: &[f32], dst: &mut [u8]) {
    for (x, o) in src.iter().zip(dst.chunks_exact_mut(2)) {
        o.copy_from_slice(&f16::from_f32(*x).to_le_bytes());
    }
}

/// f32 -> bf16 as ggml's `ggml_compute_fp32_to_bf16`: NaNs are quieted (keeping
/// the sign), everything else rounds to nearest even (overflowing to inf).
pub(crate) fn to_bf16(x: f32) -> bf16 {
    let u = x.to_bits();
    if (u & 0x7fff_ffff) > 0x7f80_0000 {
        return bf16::from_bits(((u >> 16) | 64) as u16);
    }
    bf16::from_bits(((u as u64 + (0x7fff + ((u as u64 >> 16) & 1))) >> 16) as u16)
}

pub(crate) fn bf16_row(src: &[f32], dst: &mut [u8]) {
    for (x, o) in src.iter().zip(dst.chunks_exact_mut(2)) {
        o.copy_from_slice(&to_bf16(*x).to_le_bytes());
    }
}

/// C's `roundf`: halfway cases away from zero (not the ties-to-even of
/// `_mm_round_ps`), as ggml's reference Q8_0/Q8_1 quantizers use. For the
/// |x| <= 127.5 seen here; written with an int cast because `f32::round` is a libm
/// call on baseline x86-64 (no SSE4.1), which made quantizing a row cost as much
/// as 10% of the matmul after it.
#[inline(always)]
fn roundf(x: f32) -> i8 {
    let t = x as i32; // truncates toward zero
    let frac = x - t as f32; // exact
                             // Branch-free: the halfway test is data-dependent and mispredicts half the time.
    (t + (frac >= 0.5) as i32 - (frac <= -0.5) as i32) as i8
}

/// ggml's `nearest_int`: round half to even via the 1.5 * 2^23 trick (exact for
/// |x| < 2^22), avoiding a libm `rintf` call for the same reason as [`roundf`].
#[inline(always)]
fn nearest_int(x: f32) -> i32 {
    let v = x + 12_582_912.0;
    (v.to_bits() & 0x007f_ffff) as i32 - 0x0040_0000
}

/// The element of largest magnitude, with its sign (first one on ties), as the
/// symmetric quantizers pick their scale from it.
#[inline(always)]
fn signed_absmax(x: &[f32]) -> f32 {
    let (mut amax, mut max) = (0.0f32, 0.0f32);
    for &v in x {
        if amax < v.abs() {
            amax = v.abs();
            max = v;
        }
    }
    max
}

#[inline(always)]
fn absmax(x: &[f32]) -> f32 {
    x.iter().fold(0.0f32, |a, v| a.max(v.abs()))
}

#[inline(always)]
fn min_max(x: &[f32]) -> (f32, f32) {
    x.iter().fold((f32::MAX, -f32::MAX), |(lo, hi), &v| (lo.min(v), hi.max(v)))
}

#[inline(always)]
fn inv(d: f32) -> f32 {
    if d != 0.0 {
        1.0 / d
    } else {
        0.0
    }
}

pub(crate) fn q4_0(src: &[f32], dst: &mut [u8]) {
    for (i, x) in src.chunks_exact(QK).enumerate() {
        let d = signed_absmax(x) / -8.0;
        let id = inv(d);
        let mut b = BlockQ4_0 { d: f16::from_f32(d), qs: [0; QK / 2] };
        for j in 0..QK / 2 {
            let q0 = ((x[j] * id + 8.5) as i8).min(15) as u8;
            let q1 = ((x[j + QK / 2] * id + 8.5) as i8).min(15) as u8;
            b.qs[j] = q0 | (q1 << 4);
        }
        write(dst, i, &b);
    }
}

pub(crate) fn q4_1(src: &[f32], dst: &mut [u8]) {
    for (i, x) in src.chunks_exact(QK).enumerate() {
        let (min, max) = min_max(x);
        let d = (max - min) / 15.0;
        let id = inv(d);
        let mut b = BlockQ4_1 { d: f16::from_f32(d), m: f16::from_f32(min), qs: [0; QK / 2] };
        for j in 0..QK / 2 {
            let q0 = (((x[j] - min) * id + 0.5) as i8).min(15) as u8;
            let q1 = (((x[j + QK / 2] - min) * id + 0.5) as i8).min(15) as u8;
            b.qs[j] = q0 | (q1 << 4);
        }
        write(dst, i, &b);
    }
}

/// Packs 32 five-bit values into Q5's nibbles and high-bit word.
#[inline(always)]
fn pack_q5(q: &[u8; QK]) -> ([u8; 4], [u8; QK / 2]) {
    let mut qs = [0u8; QK / 2];
    let mut qh = 0u32;
    for j in 0..QK / 2 {
        qs[j] = (q[j] & 0x0F) | ((q[j + QK / 2] & 0x0F) << 4);
        qh |= ((q[j] >> 4) as u32 & 1) << j;
        qh |= ((q[j + QK / 2] >> 4) as u32 & 1) << (j + QK / 2);
    }
    (qh.to_le_bytes(), qs)
}

pub(crate) fn q5_0(src: &[f32], dst: &mut [u8]) {
    for (i, x) in src.chunks_exact(QK).enumerate() {
        let d = signed_absmax(x) / -16.0;
        let id = inv(d);
        let mut q = [0u8; QK];
        for (qj, &v) in q.iter_mut().zip(x) {
            *qj = ((v * id + 16.5) as i8).min(31) as u8;
        }
        let (qh, qs) = pack_q5(&q);
        write(dst, i, &BlockQ5_0 { d: f16::from_f32(d), qh, qs });
    }
}

pub(crate) fn q5_1(src: &[f32], dst: &mut [u8]) {
    for (i, x) in src.chunks_exact(QK).enumerate() {
        let (min, max) = min_max(x);
        let d = (max - min) / 31.0;
        let id = inv(d);
        let mut q = [0u8; QK];
        for (qj, &v) in q.iter_mut().zip(x) {
            *qj = (((v - min) * id + 0.5) as i8).min(31) as u8;
        }
        let (qh, qs) = pack_q5(&q);
        write(dst, i, &BlockQ5_1 { d: f16::from_f32(d), m: f16::from_f32(min), qh, qs });
    }
}

pub(crate) fn q8_0(src: &[f32], dst: &mut [u8]) {
    for (i, x) in src.chunks_exact(QK).enumerate() {
        let d = absmax(x) / 127.0;
        let id = inv(d);
        let mut b = BlockQ8_0 { d: f16::from_f32(d), qs: [0; QK] };
        for (q, &v) in b.qs.iter_mut().zip(x) {
            *q = roundf(v * id);
        }
        write(dst, i, &b);
    }
}

/// Q8_1: as Q8_0, plus `s = d * sum(q)` computed with the *unrounded* f32 `d`
/// before both are stored as f16 (ggml's `quantize_row_q8_1_ref`).
pub(crate) fn q8_1(src: &[f32], dst: &mut [u8]) {
    for (i, x) in src.chunks_exact(QK).enumerate() {
        let d = absmax(x) / 127.0;
        let id = inv(d);
        let mut b = BlockQ8_1 { d: f16::from_f32(d), s: f16::ZERO, qs: [0; QK] };
        let mut sum = 0i32;
        for (q, &v) in b.qs.iter_mut().zip(x) {
            *q = roundf(v * id);
            sum += *q as i32;
        }
        b.s = f16::from_f32(sum as f32 * d);
        write(dst, i, &b);
    }
}

/// Q8_K: the scale maps the signed extreme to -127 (`iscale = -127 / max`), values
/// round half to even (ggml's `nearest_int`), and `d = 1 / iscale` stays f32.
pub(crate) fn q8_k(src: &[f32], dst: &mut [u8]) {
    for (i, x) in src.chunks_exact(QK_K).enumerate() {
        let max = signed_absmax(x);
        let mut b = BlockQ8K { d: 0.0, qs: [0; QK_K], bsums: [0; QK_K / 16] };
        if max != 0.0 {
            let iscale = -127.0 / max;
            for (q, &v) in b.qs.iter_mut().zip(x) {
                *q = nearest_int(iscale * v).min(127) as i8;
            }
            for (s, g) in b.bsums.iter_mut().zip(b.qs.chunks_exact(16)) {
                *s = g.iter().map(|&q| q as i16).sum();
            }
            b.d = 1.0 / iscale;
        }
        write(dst, i, &b);
    }
}

/// The nearest of the 16 doubled E2M1 codes to `v` at scale `d` (the first one on a tie, as
/// ggml's `best_index_mxfp4` linear search picks).
fn nearest_e2m1(v: f32, d: f32) -> u8 {
    use super::dequant::MXFP4_VALUES;
    let mut best = (0u8, (f32::from(MXFP4_VALUES[0]) * d - v).abs());
    for (i, &k) in MXFP4_VALUES.iter().enumerate().skip(1) {
        let err = (f32::from(k) * d - v).abs();
        if err < best.1 {
            best = (i as u8, err);
        }
    }
    best.0
}

/// ggml's `quantize_row_nvfp4_ref`: each 16-element sub-block's scale is its largest
/// magnitude over 6 (the top E2M1 value), narrowed to UE4M3 (here: E4M3's nearest code, ties
/// to even, saturating at 448; a zero or non-finite block gets code 0); then each value
/// takes its nearest code at the decoded scale. A sub-block whose scale narrows to 0 decodes
/// to zeros.
pub(crate) fn nvfp4(src: &[f32], dst: &mut [u8]) {
    use super::dequant::ue4m3_half;
    use loupe_core::fp8::Fp8Format;
    for (x, b) in src.chunks_exact(64).zip(dst.chunks_exact_mut(36)) {
        for s in 0..4 {
            let xs = &x[16 * s..16 * s + 16];
            let amax = xs.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            let target = amax / 6.0;
            // `encode` saturates to 0x7E for large and infinite values; NaN (a NaN input)
            // would give 0x7F, which decodes to 0: write 0 for it explicitly.
            let ue = if target > 0.0 && !target.is_nan() { Fp8Format::E4M3.encode(target) & 0x7f } else { 0 };
            b[s] = ue;
            let d = ue4m3_half(ue);
            let qs = &mut b[4 + 8 * s..12 + 8 * s];
            for j in 0..8 {
                qs[j] = nearest_e2m1(xs[j], d) | (nearest_e2m1(xs[j + 8], d) << 4);
            }
        }
    }
}

/// ggml's `quantize_row_mxfp4_ref`: the block exponent puts the largest magnitude in
/// [4, 8) times the halved scale (so it lands on the top E2M1 values), then each value takes
/// the nearest of the 16 codes (the first one on a tie, as ggml's linear search does).
pub(crate) fn mxfp4(src: &[f32], dst: &mut [u8]) {
    use super::dequant::e8m0_half;
    for (x, b) in src.chunks_exact(32).zip(dst.chunks_exact_mut(17)) {
        let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        // ggml casts the float exponent to u8 directly; outside 0..=255 (|x| below 2^-125 or
        // from 2^130 up) that cast is undefined in C, so it is clamped here.
        let e = if amax > 0.0 { (amax.log2().floor() - 2.0 + 127.0).clamp(0.0, 255.0) as u8 } else { 0 };
        let d = e8m0_half(e);
        b[0] = e;
        for j in 0..16 {
            b[1 + j] = nearest_e2m1(x[j], d) | (nearest_e2m1(x[j + 16], d) << 4);
        }
    }
}

/// ggml's `make_qkx2_quants`: for `x` (one sub-block) with importance `weights`, the scale
/// and (non-positive) offset minimising the weighted squared error of `scale * L + min` with
/// `L` in `0..=nmax`. Starts from the min-max fit, then tries `nstep + 1` scales
/// `(nmax + rmin + rdelta * is) / (max - min)`, refitting scale and min by weighted least
/// squares for each and keeping the best. Returns the scale; `-min` goes to `the_min`.
/// `nearest_int(v)` clamped to the levels `0..=nmax`, as `u8`; `v` is first clamped to
/// |v| < 2^22, where `nearest_int` is exact (weights come from finite rows; this only guards).
fn nearest_level(v: f32, nmax: i32) -> u8 {
    nearest_int(v.clamp(-4_000_000.0, 4_000_000.0)).clamp(0, nmax) as u8
}

#[allow(clippy::too_many_arguments)]
fn make_qkx2_quants(
    nmax: i32,
    x: &[f32],
    weights: &[f32],
    l_out: &mut [u8],
    the_min: &mut f32,
    l_aux: &mut [u8],
    rmin: f32,
    rdelta: f32,
    nstep: i32,
) -> f32 {
    let mut min = x[0];
    let mut max = x[0];
    let mut sum_w = weights[0];
    let mut sum_x = sum_w * x[0];
    for i in 1..x.len() {
        min = min.min(x[i]);
        max = max.max(x[i]);
        sum_w += weights[i];
        sum_x += weights[i] * x[i];
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        l_out.fill(0);
        *the_min = -min;
        return 0.0;
    }
    let mut iscale = nmax as f32 / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best = 0.0f32;
    for i in 0..x.len() {
        let l = nearest_level(iscale * (x[i] - min), nmax);
        l_out[i] = l;
        let diff = scale * l as f32 + min - x[i];
        best += weights[i] * diff * diff;
    }
    for is in 0..=nstep {
        iscale = (rmin + rdelta * is as f32 + nmax as f32) / (max - min);
        let (mut sum_l, mut sum_l2, mut sum_xl) = (0.0f32, 0.0f32, 0.0f32);
        for i in 0..x.len() {
            let l = nearest_level(iscale * (x[i] - min), nmax);
            l_aux[i] = l;
            let w = weights[i];
            let lf = l as f32;
            sum_l += w * lf;
            sum_l2 += w * lf * lf;
            sum_xl += w * lf * x[i];
        }
        let det = sum_w * sum_l2 - sum_l * sum_l;
        if det > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let mut err = 0.0f32;
            for i in 0..x.len() {
                let diff = this_scale * l_aux[i] as f32 + this_min - x[i];
                err += weights[i] * diff * diff;
            }
            if err < best {
                l_out.copy_from_slice(l_aux);
                best = err;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    *the_min = -min;
    scale
}

/// ggml's `quantize_row_q4_K_ref`: per 32-element sub-block, [`make_qkx2_quants`] (values
/// weighted by `rms(sub-block) + |x|`, 20 steps of 0.1 from -1) gives a scale and a min;
/// both sets are quantized to 6 bits against the super-block's largest (`d = max_scale /
/// 63`, `dmin = max_min / 63`, as f16), then every value is re-rounded against its
/// sub-block's final 6-bit scale and min.
pub(crate) fn q4_k(src: &[f32], dst: &mut [u8]) {
    for (i, x) in src.chunks_exact(QK_K).enumerate() {
        let mut l = [0u8; QK_K];
        let mut l_aux = [0u8; 32];
        let mut weights = [0f32; 32];
        let (mut scales, mut mins) = ([0f32; 8], [0f32; 8]);
        let (mut max_scale, mut max_min) = (0f32, 0f32);
        for j in 0..8 {
            let xs = &x[32 * j..32 * j + 32];
            let av_x = (xs.iter().map(|v| v * v).sum::<f32>() / 32.0).sqrt();
            for (w, v) in weights.iter_mut().zip(xs) {
                *w = av_x + v.abs();
            }
            scales[j] = make_qkx2_quants(
                15,
                xs,
                &weights,
                &mut l[32 * j..32 * j + 32],
                &mut mins[j],
                &mut l_aux,
                -1.0,
                0.1,
                20,
            );
            max_scale = max_scale.max(scales[j]);
            max_min = max_min.max(mins[j]);
        }
        let inv_scale = if max_scale > 0.0 { 63.0 / max_scale } else { 0.0 };
        let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
        let mut packed = [0u8; K_SCALE_SIZE];
        for j in 0..8 {
            let ls = nearest_int(inv_scale * scales[j]).clamp(0, 63) as u8;
            let lm = nearest_int(inv_min * mins[j]).clamp(0, 63) as u8;
            if j < 4 {
                packed[j] = ls;
                packed[j + 4] = lm;
            } else {
                packed[j + 4] = (ls & 0x0F) | ((lm & 0x0F) << 4);
                packed[j - 4] |= (ls >> 4) << 6;
                packed[j] |= (lm >> 4) << 6;
            }
        }
        let d = f16::from_f32(max_scale / 63.0);
        let dmin = f16::from_f32(max_min / 63.0);
        let (sc, mn) = scale_min_k4(&packed);
        for j in 0..8 {
            let dl = d.to_f32() * sc[j] as f32;
            if dl == 0.0 {
                continue;
            }
            let dm = dmin.to_f32() * mn[j] as f32;
            for ii in 0..32 {
                l[32 * j + ii] = nearest_level((x[32 * j + ii] + dm) / dl, 15);
            }
        }
        let mut qs = [0u8; QK_K / 2];
        for (c, chunk) in qs.chunks_exact_mut(32).enumerate() {
            for (t, q) in chunk.iter_mut().enumerate() {
                *q = l[64 * c + t] | (l[64 * c + t + 32] << 4);
            }
        }
        write(dst, i, &BlockQ4K { d, dmin, scales: packed, qs });
    }
}

/// `GgmlType::Fp8E4M3`: per block of 32, the scale `d = max|x| / 448` (E4M3's largest
/// value) rounded to f16, and each value's code `e4m3(x / d)`, rounded to nearest even and
/// saturating at ±448 (a `d` that f16 rounded down can put the largest value just past it).
///
/// **The scale is guarded**, the bug the issue names: a block whose `max|x| / 448` is
/// below f16's smallest subnormal (2^-24; all-zero blocks and blocks under ~1e-5) rounds
/// `d` to 0, whose reciprocal is infinite, and `0 * inf` is NaN. Such a block is stored as
/// `d = 0` with zero codes: it dequantizes to exact zeros. A scale past f16's range is
/// clamped to its largest value (the codes then saturate). Non-finite inputs do not set
/// the scale; NaN stays NaN, infinities saturate.
pub(crate) fn fp8_e4m3(src: &[f32], dst: &mut [u8]) {
    use crate::fp8::encode_e4m3;
    for (x, b) in src.chunks_exact(32).zip(dst.chunks_exact_mut(34)) {
        let amax = crate::fp8::max_abs_finite(x);
        let d = f16::from_f32((amax / 448.0).min(f16::MAX.to_f32()));
        let df = d.to_f32();
        let (d, id) = if df > 0.0 { (d, 1.0 / df) } else { (f16::ZERO, 0.0) };
        b[..2].copy_from_slice(&d.to_le_bytes());
        for (q, &v) in b[2..].iter_mut().zip(x) {
            *q = encode_e4m3(if v.is_finite() { v * id } else { v });
        }
    }
}

/// The unguarded form of [`fp8_e4m3`]'s scale, `1 / f16(max|x| / 448)`, kept only so the
/// tests can show what it does to a near-zero block (NaN codes); never used to quantize.
#[cfg(test)]
pub(crate) fn fp8_e4m3_unguarded(src: &[f32], dst: &mut [u8]) {
    use crate::fp8::encode_e4m3;
    for (x, b) in src.chunks_exact(32).zip(dst.chunks_exact_mut(34)) {
        let amax = x.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let d = f16::from_f32(amax / 448.0);
        let id = 1.0 / d.to_f32();
        b[..2].copy_from_slice(&d.to_le_bytes());
        for (q, &v) in b[2..].iter_mut().zip(x) {
            *q = encode_e4m3(v * id);
        }
    }
}
