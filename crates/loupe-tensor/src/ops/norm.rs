//! RMSNorm, as `LlamaRMSNorm.forward` computes it:
//! `weight * (x * rsqrt(mean(x^2) + eps))`, everything in f32; and LayerNorm, as
//! `torch.nn.LayerNorm` computes it on CPU (BERT's norms).

use crate::TensorError;

/// Normalizes each row of `x` (`[rows, dim]`) into `out`.
///
/// The mean of squares is accumulated in f64 and rounded once: PyTorch's f32
/// reduction is pairwise/vectorized, so a plain sequential f32 sum would drift
/// further from it than the correctly rounded value does.
pub fn rms_norm(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) -> Result<(), TensorError> {
    let dim = weight.len();
    if dim == 0 || !x.len().is_multiple_of(dim) || out.len() != x.len() {
        return Err(TensorError::Shape {
            op: "rms_norm",
            detail: format!("x has {} elements, weight {}, out {}", x.len(), dim, out.len()),
        });
    }
    // Rows are independent: a prefill's rows run on the compute pool, each as on the caller.
    super::par_chunks_mut(out, dim, &|r, out| {
        for (row, out_row) in x[r].chunks_exact(dim).zip(out.chunks_exact_mut(dim)) {
            let sum_sq: f64 = row.iter().map(|&v| (v as f64) * (v as f64)).sum();
            let variance = (sum_sq / dim as f64) as f32;
            let inv = 1.0 / (variance + eps).sqrt();
            for ((o, &v), &w) in out_row.iter_mut().zip(row).zip(weight) {
                *o = w * (v * inv);
            }
        }
    });
    Ok(())
}

/// LayerNorm of each row of `x` (`[rows, dim]`) into `out`: `(x - mean) / sqrt(var + eps)
/// * weight + bias`, the biased variance, as `torch.nn.LayerNorm` with an affine transform.
///
/// PyTorch's CPU kernel (`aten/src/ATen/native/cpu/layer_norm_kernel.cpp`,
/// `LayerNormKernelImplInternal`) forms `scale = rstd` and `shift = -mean * rstd` once per
/// row and writes `(x * scale + shift) * weight + bias`; the same order is used here. Its
/// moments come from a vectorized Welford pass; here mean and variance are accumulated in
/// f64 (two passes) and rounded once, which is at least as close to the exact value.
pub fn layer_norm(x: &[f32], weight: &[f32], bias: &[f32], eps: f32, out: &mut [f32]) -> Result<(), TensorError> {
    let dim = weight.len();
    if dim == 0 || bias.len() != dim || !x.len().is_multiple_of(dim) || out.len() != x.len() {
        return Err(TensorError::Shape {
            op: "layer_norm",
            detail: format!("x has {} elements, weight {}, bias {}, out {}", x.len(), dim, bias.len(), out.len()),
        });
    }
    for (row, out_row) in x.chunks_exact(dim).zip(out.chunks_exact_mut(dim)) {
        let mean = row.iter().map(|&v| v as f64).sum::<f64>() / dim as f64;
        let var = row.iter().map(|&v| (v as f64 - mean) * (v as f64 - mean)).sum::<f64>() / dim as f64;
        let rstd = (1.0 / (var + eps as f64).sqrt()) as f32;
        let shift = -(mean as f32) * rstd;
        for (((o, &v), &w), &b) in out_row.iter_mut().zip(row).zip(weight).zip(bias) {
            *o = (v * rstd + shift) * w + b;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layer_norm_centres_and_scales_each_row() {
        let x = [1.0f32, 2.0, 3.0, 4.0, -10.0, 0.0, 10.0, 20.0];
        let mut out = [0.0; 8];
        layer_norm(&x, &[1.0; 4], &[0.0; 4], 0.0, &mut out).unwrap();
        for row in out.chunks_exact(4) {
            let mean = row.iter().sum::<f32>() / 4.0;
            let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f32>() / 4.0;
            assert!(mean.abs() < 1e-6, "{row:?}");
            assert!((var - 1.0).abs() < 1e-5, "{row:?}");
        }
        // (1 - 2.5) / sqrt(1.25)
        assert!((out[0] + 1.5 / 1.25f32.sqrt()).abs() < 1e-6);
        // weight and bias apply after normalizing; eps enters under the root.
        let mut affine = [0.0; 4];
        layer_norm(&x[..4], &[2.0; 4], &[0.5; 4], 0.75, &mut affine).unwrap();
        assert!((affine[3] - (2.0 * 1.5 / 2.0f32.sqrt() + 0.5)).abs() < 1e-6, "{affine:?}");
    }

    #[test]
    fn layer_norm_of_a_constant_row_is_its_bias() {
        let mut out = [9.0; 3];
        layer_norm(&[7.0; 3], &[3.0; 3], &[0.25, -1.0, 0.0], 1e-12, &mut out).unwrap();
        assert_eq!(out, [0.25, -1.0, 0.0]);
    }

    #[test]
    fn layer_norm_rejects_mismatched_shapes() {
        let mut out = [0.0; 4];
        assert!(layer_norm(&[1.0; 4], &[1.0; 2], &[0.0; 3], 1e-5, &mut out).is_err());
        assert!(layer_norm(&[1.0; 3], &[1.0; 2], &[0.0; 2], 1e-5, &mut out[..3]).is_err());
    }

    #[test]
    fn unit_weight_normalizes_to_unit_rms() {
        let x = [3.0f32, 4.0, 0.0, 0.0];
        let mut out = [0.0; 4];
        rms_norm(&x, &[1.0; 4], 0.0, &mut out).unwrap();
        let rms = (out.iter().map(|v| v * v).sum::<f32>() / 4.0).sqrt();
        assert!((rms - 1.0).abs() < 1e-6);
        assert!((out[0] - 3.0 / 2.5).abs() < 1e-6);
    }

    #[test]
    fn rejects_mismatched_shapes() {
        let mut out = [0.0; 3];
        assert!(rms_norm(&[1.0; 3], &[1.0; 2], 1e-5, &mut out).is_err());
    }
}
