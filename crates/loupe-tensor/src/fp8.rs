//! Dynamic FP8 quantization of activations: per tensor, per token (row) or per group of
//! consecutive elements, each with its own scale `max|x| / fp8_max`, the values stored as
//! `encode(x / scale)` in E4M3FN or E5M2 ([`loupe_core::fp8`]: round to nearest even,
//! saturating).
//!
//! The scale's reciprocal is **guarded**. The obvious formula `inv = 1 / (max|x| / fp8_max)`
//! breaks on a group that is all zeros or nearly so: the scale is zero or a denormal, its
//! reciprocal is infinite, and `0 · ∞ = NaN` poisons the activations and every KV-cache row
//! written from them, while the group's tiny non-zero values become ±inf, saturated to ±max:
//! garbage 448 times too large (the bug MAX fixed: docs of `../shared/spec/max-debugging.md`,
//! section 6). Here a group whose scale is not a normal f32 (so that its reciprocal could
//! overflow) quantizes to exact zeros with a scale of zero; every other group's reciprocal is
//! at most 1/f32::MIN_POSITIVE ≈ 8.5e37, finite. [`reciprocal_unguarded`] keeps the broken
//! formula so the test can show that it fails where this one does not.
//!
//! Non-finite inputs: the scale comes from the finite elements; NaN stays NaN, ±inf
//! saturates to ±max (E4M3FN has no infinity).

use loupe_core::fp8::Fp8Format;

use crate::TensorError;

/// How many elements share a scale.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Granularity {
    /// One scale for the whole tensor.
    PerTensor,
    /// One per row of `cols` elements (per token, for `[tokens, features]`).
    PerRow { cols: usize },
    /// One per `size` consecutive elements (within a row when rows are a multiple of it).
    PerGroup { size: usize },
}

/// Quantized values and their scales: element `i` is `decode(codes[i]) · scales[i / group]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Fp8Tensor {
    pub format: Fp8Format,
    pub codes: Vec<u8>,
    pub scales: Vec<f32>,
    /// Elements per scale.
    pub group: usize,
}

impl Fp8Tensor {
    /// Widens back to f32.
    pub fn dequantize(&self) -> Vec<f32> {
        self.codes.iter().enumerate().map(|(i, &c)| self.format.decode(c) * self.scales[i / self.group]).collect()
    }
}

/// The largest magnitude among the finite values of `x` (0 when there is none): what a
/// dynamic FP8 scale is fitted to, so a NaN or an infinity cannot set it.
pub fn max_abs_finite(x: &[f32]) -> f32 {
    x.iter().filter(|v| v.is_finite()).fold(0.0f32, |m, v| m.max(v.abs()))
}

/// `(scale, 1/scale)` of a group whose largest finite magnitude is `max_abs`, guarded: a
/// scale that is zero, denormal or not finite gives `(0, 0)`, so the group quantizes to zeros.
pub fn scale_and_reciprocal(max_abs: f32, format: Fp8Format) -> (f32, f32) {
    let scale = max_abs / format.max();
    if scale.is_normal() {
        (scale, 1.0 / scale)
    } else {
        (0.0, 0.0)
    }
}

/// The unguarded formula, `1 / (max_abs / fp8_max)`, kept only to show what it does to a
/// near-zero group (tests); never used to quantize.
pub fn reciprocal_unguarded(max_abs: f32, format: Fp8Format) -> f32 {
    1.0 / (max_abs / format.max())
}

/// Quantizes `x` with a scale per `granularity`, guarded (module docs).
pub fn quantize_dynamic(x: &[f32], format: Fp8Format, granularity: Granularity) -> Result<Fp8Tensor, TensorError> {
    let group = match granularity {
        Granularity::PerTensor => x.len().max(1),
        Granularity::PerRow { cols: n } | Granularity::PerGroup { size: n } => n,
    };
    if group == 0 || !x.len().is_multiple_of(group) {
        return Err(TensorError::Shape {
            op: "fp8 quantize",
            detail: format!("{} elements do not split into groups of {group}", x.len()),
        });
    }
    let mut codes = Vec::with_capacity(x.len());
    let mut scales = Vec::with_capacity(x.len() / group);
    for g in x.chunks(group) {
        let max_abs = max_abs_finite(g);
        let (scale, inv) = scale_and_reciprocal(max_abs, format);
        scales.push(scale);
        codes.extend(g.iter().map(|&v| {
            // A NaN stays NaN and an infinity saturates, whatever the scale.
            let scaled = if v.is_finite() { v * inv } else { v };
            format.encode(scaled)
        }));
    }
    Ok(Fp8Tensor { format, codes, scales, group })
}

/// Every E4M3FN code widened to f32, by code (exact; code 0x7f / 0xff is NaN).
pub fn e4m3_table() -> &'static [f32; 256] {
    static TABLE: std::sync::OnceLock<[f32; 256]> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| std::array::from_fn(|c| Fp8Format::E4M3.decode(c as u8)))
}

/// 2^120: an E4M3 code's magnitude bits placed at the top of an f32's mantissa and exponent
/// (`(c & 0x7f) << 20`) read as 2^-120 times the code's value, normals and subnormals
/// alike (E4M3's exponent bias is 7, f32's 127; its subnormals land on f32 subnormals).
const E4M3_REBIAS: f32 = 1.329_228e36;

/// [`Fp8Format::decode`] for E4M3 without a table or a branch (so loops over it vectorize):
/// the same value, bit for bit.
#[inline(always)]
pub fn decode_e4m3(c: u8) -> f32 {
    let c = u32::from(c);
    let magnitude = f32::from_bits((c & 0x7f) << 20) * E4M3_REBIAS;
    let v = f32::from_bits(magnitude.to_bits() | ((c & 0x80) << 24));
    if c & 0x7f == 0x7f {
        f32::NAN
    } else {
        v
    }
}

/// [`Fp8Format::encode`] for E4M3 on f32 bits: round to nearest even, saturating to ±448,
/// NaN to the NaN code; the same code for every input (tested against it).
#[inline]
pub fn encode_e4m3(x: f32) -> u8 {
    let bits = x.to_bits();
    let sign = ((bits >> 24) & 0x80) as u8;
    let a = f32::from_bits(bits & 0x7fff_ffff);
    if a.is_nan() {
        return sign | 0x7f;
    }
    if a >= 448.0 {
        return sign | 0x7e;
    }
    if a < 0.015_625 {
        // Below the smallest normal (2^-6): subnormal codes count units of 2^-9 (the scaling
        // is exact), up to code 8, which is the smallest normal.
        return sign | (a * 512.0).round_ties_even() as u8;
    }
    // Keep the exponent and the top 3 mantissa bits, rounding the 20 dropped bits to
    // nearest even; a carry moves into the exponent, as it should.
    let b = a.to_bits();
    let r = b + 0x7ffff + ((b >> 20) & 1);
    let code = ((((r >> 23) - 120) << 3) | ((r >> 20) & 7)).min(0x7e);
    sign | code as u8
}

/// Quantizes `rows` to E4M3 with one guarded scale per `width` consecutive elements (a row,
/// or a group within one), into `codes` (as many as `rows`) and `scales` (one per group):
/// the KV cache's FP8 rows.
pub fn quantize_rows_e4m3(rows: &[f32], width: usize, codes: &mut [u8], scales: &mut [f32]) -> Result<(), TensorError> {
    if width == 0
        || !rows.len().is_multiple_of(width)
        || codes.len() != rows.len()
        || scales.len() != rows.len() / width
    {
        return Err(TensorError::Shape {
            op: "fp8 rows",
            detail: format!(
                "{} values in rows of {width} into {} codes and {} scales",
                rows.len(),
                codes.len(),
                scales.len()
            ),
        });
    }
    let format = Fp8Format::E4M3;
    for ((row, out), scale) in rows.chunks_exact(width).zip(codes.chunks_exact_mut(width)).zip(scales.iter_mut()) {
        let max_abs = max_abs_finite(row);
        let (s, inv) = scale_and_reciprocal(max_abs, format);
        *scale = s;
        for (c, &v) in out.iter_mut().zip(row) {
            *c = encode_e4m3(if v.is_finite() { v * inv } else { v });
        }
    }
    Ok(())
}

/// `x` as FP8 E4M3 would hold it: quantized with one guarded scale per `width` consecutive
/// elements ([`quantize_rows_e4m3`]) and widened back. `--precision fp8` passes its
/// activations (per token) and weights (per output row) through this, so f32 kernels
/// compute exactly with the values an FP8 W8A8 GEMM multiplies.
pub fn round_trip_rows_e4m3(x: &[f32], width: usize) -> Result<Vec<f32>, TensorError> {
    let groups = x.len().checked_div(width).unwrap_or(0);
    let (mut codes, mut scales) = (vec![0u8; x.len()], vec![0f32; groups]);
    quantize_rows_e4m3(x, width, &mut codes, &mut scales)?;
    let mut out = vec![0f32; x.len()];
    for ((c, o), &s) in codes.chunks_exact(width).zip(out.chunks_exact_mut(width)).zip(&scales) {
        dequantize_e4m3(c, s, o);
    }
    Ok(out)
}

/// Widens E4M3 `codes` that share `scale` into `out` (as many).
#[inline]
pub fn dequantize_e4m3(codes: &[u8], scale: f32, out: &mut [f32]) {
    dequantize_e4m3_isa(crate::quant::Isa::active(), codes, scale, out)
}

/// [`dequantize_e4m3`] under `isa`: the same branch-free loop compiled for AVX2 or AVX-512
/// (the compiler vectorizes it there; the operations and so the bits are the scalar loop's).
pub fn dequantize_e4m3_isa(isa: crate::quant::Isa, codes: &[u8], scale: f32, out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        use crate::quant::Isa;
        if isa >= Isa::Avx512 {
            // SAFETY: Isa::Avx512 is only active where AVX-512 F/BW are available.
            return unsafe { dequantize_e4m3_avx512(codes, scale, out) };
        }
        if isa >= Isa::Avx2 {
            // SAFETY: Isa::Avx2 is only active where AVX2 is available.
            return unsafe { dequantize_e4m3_avx2(codes, scale, out) };
        }
    }
    let _ = isa;
    dequantize_e4m3_scalar(codes, scale, out)
}

#[inline(always)]
fn dequantize_e4m3_scalar(codes: &[u8], scale: f32, out: &mut [f32]) {
    for (o, &c) in out.iter_mut().zip(codes) {
        *o = decode_e4m3(c) * scale;
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn dequantize_e4m3_avx2(codes: &[u8], scale: f32, out: &mut [f32]) {
    dequantize_e4m3_scalar(codes, scale, out)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn dequantize_e4m3_avx512(codes: &[u8], scale: f32, out: &mut [f32]) {
    dequantize_e4m3_scalar(codes, scale, out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use loupe_core::SplitMix64;

    const FORMATS: [Fp8Format; 2] = [Fp8Format::E4M3, Fp8Format::E5M2];

    /// What the unguarded formula makes of a group: its codes widened back.
    fn unguarded(g: &[f32], f: Fp8Format) -> Vec<f32> {
        let max_abs = g.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let (scale, inv) = (max_abs / f.max(), reciprocal_unguarded(max_abs, f));
        g.iter().map(|&v| f.decode(f.encode(v * inv)) * scale).collect()
    }

    #[test]
    fn the_fast_e4m3_codec_equals_the_reference_one() {
        for c in 0..=255u8 {
            let (fast, reference) = (decode_e4m3(c), Fp8Format::E4M3.decode(c));
            assert!(
                fast.to_bits() == reference.to_bits() || (fast.is_nan() && reference.is_nan()),
                "code {c:#04x}: {fast} vs {reference}"
            );
            assert_eq!(e4m3_table()[c as usize].to_bits(), reference.to_bits());
        }
        // Every 509th f32 bit pattern (all exponents, signs, NaNs, infinities), every code's
        // value, and the midpoints between neighbouring codes (the ties).
        let mut inputs: Vec<f32> = (0..=u32::MAX / 509).map(|i| f32::from_bits(i * 509)).collect();
        for c in 0..0x7eu8 {
            let (lo, hi) = (Fp8Format::E4M3.decode(c), Fp8Format::E4M3.decode(c + 1));
            for v in [
                lo,
                (lo + hi) / 2.0,
                f32::from_bits(((lo + hi) / 2.0).to_bits() + 1),
                f32::from_bits(((lo + hi) / 2.0).to_bits().saturating_sub(1)),
            ] {
                inputs.extend([v, -v]);
            }
        }
        inputs.extend([
            448.0,
            464.0,
            463.99,
            1e30,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            0.0,
            -0.0,
            f32::MIN_POSITIVE,
            2f32.powi(-10),
            2f32.powi(-9) * 1.5,
        ]);
        for x in inputs {
            assert_eq!(encode_e4m3(x), Fp8Format::E4M3.encode(x), "x = {x:e} ({:#010x})", x.to_bits());
        }
    }

    #[test]
    fn every_isa_dequantizes_fp8_to_the_scalar_bits() {
        let codes: Vec<u8> = (0..=255u8).chain(0..=255u8).rev().collect();
        for scale in [1.0f32, 0.013, 3.5e-30, 0.0] {
            let mut want = vec![0f32; codes.len()];
            dequantize_e4m3_isa(crate::quant::Isa::Scalar, &codes, scale, &mut want);
            for isa in crate::quant::Isa::available() {
                // Odd lengths exercise the vector loops' tails.
                for n in [codes.len(), 37, 5] {
                    let mut got = vec![0f32; n];
                    dequantize_e4m3_isa(isa, &codes[..n], scale, &mut got);
                    let bits = |x: &[f32]| {
                        x.iter().map(|v| if v.is_nan() { u32::MAX } else { v.to_bits() }).collect::<Vec<_>>()
                    };
                    assert_eq!(bits(&got), bits(&want[..n]), "{isa:?}, scale {scale}, {n} codes");
                }
            }
        }
    }

    #[test]
    fn kv_rows_round_trip_through_the_table_with_a_guarded_scale_per_row() {
        let mut rng = SplitMix64::new(11);
        let width = 24;
        let mut rows: Vec<f32> =
            (0..3 * width).map(|_| ((rng.next_u64() >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 40.0).collect();
        rows[width..2 * width].iter_mut().for_each(|v| *v = 0.0); // an all-zero row
        rows[2 * width] = f32::from_bits(5); // a denormal beside ordinary values
        let (mut codes, mut scales) = (vec![0u8; rows.len()], vec![0f32; 3]);
        quantize_rows_e4m3(&rows, width, &mut codes, &mut scales).unwrap();
        let q = quantize_dynamic(&rows, Fp8Format::E4M3, Granularity::PerRow { cols: width }).unwrap();
        assert_eq!(
            (codes.clone(), scales.clone()),
            (q.codes.clone(), q.scales.clone()),
            "the same quantizer as quantize_dynamic per row"
        );
        let mut back = vec![0f32; rows.len()];
        for ((c, o), &s) in codes.chunks(width).zip(back.chunks_mut(width)).zip(&scales) {
            dequantize_e4m3(c, s, o);
        }
        assert_eq!(back, q.dequantize());
        assert!(back[width..2 * width].iter().all(|v| *v == 0.0));
        for (a, b) in rows.iter().zip(&back) {
            // E4M3 keeps 3 mantissa bits: relative error at most 2^-4 of the row's scale range.
            assert!(
                (a - b).abs() <= a.abs() / 16.0 + scales.iter().cloned().fold(0.0, f32::max) * 2f32.powi(-9),
                "{a} vs {b}"
            );
        }
        assert!(quantize_rows_e4m3(&rows, 7, &mut codes, &mut scales).is_err());
        assert!(e4m3_table()[0x7f].is_nan() && e4m3_table()[0x7e] == 448.0);
    }

    #[test]
    fn zero_and_near_zero_groups_quantize_to_exact_zeros_where_the_unguarded_formula_fails() {
        let tiny = f32::from_bits(3); // a denormal: max/448 underflows to 0
        let groups: [&[f32]; 3] =
            [&[0.0; 8], &[0.0, tiny, -tiny, 0.0, 0.0, 0.0, tiny, 0.0], &[1e-39, 0.0, -2e-39, 0.0, 0.0, 0.0, 0.0, 0.0]];
        for f in FORMATS {
            for g in groups {
                let q = quantize_dynamic(g, f, Granularity::PerGroup { size: 8 }).unwrap();
                assert_eq!(q.scales, vec![0.0], "{f:?} {g:?}");
                assert!(q.dequantize().iter().all(|v| *v == 0.0), "{f:?} {g:?}: {:?}", q.dequantize());
                // The unguarded formula: NaN (0 * inf) or values far off the input.
                let bad = unguarded(g, f);
                let broken = bad.iter().zip(g).any(|(b, x)| !b.is_finite() || (b - x).abs() > 1e-30);
                assert!(broken, "{f:?} {g:?}: the unguarded formula should fail here, gave {bad:?}");
            }
        }
    }

    #[test]
    fn a_tiny_but_normal_scale_is_kept() {
        // max|x| = 448 * f32::MIN_POSITIVE: the scale is the smallest normal, its reciprocal
        // finite, and the values come back.
        let m = 448.0 * f32::MIN_POSITIVE;
        let g = [m, -m / 2.0, 0.0, m / 4.0];
        let q = quantize_dynamic(&g, Fp8Format::E4M3, Granularity::PerTensor).unwrap();
        assert_eq!(q.scales, vec![f32::MIN_POSITIVE]);
        assert_eq!(q.dequantize(), g.to_vec());
    }

    #[test]
    fn huge_groups_round_within_half_a_unit_and_never_overflow() {
        let mut rng = SplitMix64::new(11);
        for f in FORMATS {
            // Half an ulp of the format's mantissa, relative to the group's largest value.
            let half_ulp = match f {
                Fp8Format::E4M3 => 1.0 / 16.0,
                Fp8Format::E5M2 => 1.0 / 8.0,
            };
            let g: Vec<f32> =
                (0..64).map(|_| (rng.next_u64() as f64 / u64::MAX as f64 * 2.0 - 1.0) as f32 * 3.0e38).collect();
            let q = quantize_dynamic(&g, f, Granularity::PerTensor).unwrap();
            let back = q.dequantize();
            let max = g.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            for (x, y) in g.iter().zip(&back) {
                assert!(y.is_finite(), "{f:?}");
                // Normal range: relative to the value; below it, absolute in the scale's units.
                let tol = (half_ulp * x.abs()).max(max / f.max() * 2f32.powi(-9));
                assert!((x - y).abs() <= tol * 1.0001, "{f:?}: {x} -> {y}");
            }
        }
    }

    #[test]
    fn per_row_and_per_group_scales_and_shape_errors() {
        let x: Vec<f32> = (0..12).map(|i| (i as f32 - 5.5) * if i < 6 { 1.0 } else { 100.0 }).collect();
        let rows = quantize_dynamic(&x, Fp8Format::E4M3, Granularity::PerRow { cols: 6 }).unwrap();
        assert_eq!(rows.scales, vec![5.5 / 448.0, 550.0 / 448.0]);
        assert_eq!(rows.codes[0], Fp8Format::E4M3.encode(-448.0), "each row's largest value maps to the format's max");
        let groups = quantize_dynamic(&x, Fp8Format::E5M2, Granularity::PerGroup { size: 3 }).unwrap();
        assert_eq!(groups.scales.len(), 4);
        let err = quantize_dynamic(&x, Fp8Format::E4M3, Granularity::PerGroup { size: 5 }).unwrap_err();
        assert!(err.to_string().contains("12 elements do not split into groups of 5"), "{err}");
        assert!(quantize_dynamic(&x, Fp8Format::E4M3, Granularity::PerRow { cols: 0 }).is_err());
    }

    /// `--precision fp8`'s rounding: the same values as the reference per-row quantizer
    /// widened back; an all-zero row stays exact zeros; bad widths are errors.
    #[test]
    fn round_trip_rows_match_the_reference_quantizer() {
        let mut x: Vec<f32> = (0..96).map(|i| ((i * 37 % 23) as f32 - 11.0) * 0.013).collect();
        x[64..96].fill(0.0);
        let got = round_trip_rows_e4m3(&x, 32).unwrap();
        let want = quantize_dynamic(&x, Fp8Format::E4M3, Granularity::PerRow { cols: 32 }).unwrap().dequantize();
        assert_eq!(got, want);
        assert!(got[64..].iter().all(|v| *v == 0.0 && v.is_sign_positive()));
        assert_ne!(got[..64], x[..64], "values were rounded");
        assert!(round_trip_rows_e4m3(&x, 5).is_err() && round_trip_rows_e4m3(&x, 0).is_err());
    }

    #[test]
    fn non_finite_inputs_do_not_poison_the_scale() {
        let x = [1.0, f32::NAN, f32::INFINITY, -2.0];
        let q = quantize_dynamic(&x, Fp8Format::E4M3, Granularity::PerTensor).unwrap();
        assert_eq!(q.scales, vec![2.0 / 448.0]);
        let back = q.dequantize();
        let close = |a: f32, b: f32| (a - b).abs() <= 1e-6 * b.abs();
        assert!(close(back[0], 1.0) && close(back[3], -2.0), "{back:?}");
        assert!(back[1].is_nan());
        assert!(close(back[2], 2.0), "+inf saturates to max, which is the scale's 2.0: {back:?}");
    }
}
