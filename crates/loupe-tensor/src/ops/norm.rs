//! RMSNorm, as `LlamaRMSNorm.forward` computes it:
//! `weight * (x * rsqrt(mean(x^2) + eps))`, everything in f32.

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
    for (row, out_row) in x.chunks_exact(dim).zip(out.chunks_exact_mut(dim)) {
        let sum_sq: f64 = row.iter().map(|&v| (v as f64) * (v as f64)).sum();
        let variance = (sum_sq / dim as f64) as f32;
        let inv = 1.0 / (variance + eps).sqrt();
        for ((o, &v), &w) in out_row.iter_mut().zip(row).zip(weight) {
            *o = w * (v * inv);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

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
