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
        return Err(TensorError::Shape { op: "fp8 quantize", detail: format!("{} elements do not split into groups of {group}", x.len()) });
    }
    let mut codes = Vec::with_capacity(x.len());
    let mut scales = Vec::with_capacity(x.len() / group);
    for g in x.chunks(group) {
        let max_abs = g.iter().filter(|v| v.is_finite()).fold(0.0f32, |m, v| m.max(v.abs()));
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
    fn zero_and_near_zero_groups_quantize_to_exact_zeros_where_the_unguarded_formula_fails() {
        let tiny = f32::from_bits(3); // a denormal: max/448 underflows to 0
        let groups: [&[f32]; 3] = [&[0.0; 8], &[0.0, tiny, -tiny, 0.0, 0.0, 0.0, tiny, 0.0], &[1e-39, 0.0, -2e-39, 0.0, 0.0, 0.0, 0.0, 0.0]];
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
            let g: Vec<f32> = (0..64).map(|_| (rng.next_u64() as f64 / u64::MAX as f64 * 2.0 - 1.0) as f32 * 3.0e38).collect();
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
