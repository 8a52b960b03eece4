//! Column slices of row-major activations: the split of a fused projection's output
//! (Phi-3's `qkv_proj` into q, k, v and `gate_up_proj` into gate and up; transformers slices
//! `qkv[..., a:b]` and `chunk(2, dim=-1)`), so the fused matmul stays one value named by its
//! module and each part is a value of its own.

use crate::TensorError;

/// Copies columns `start..start + len` of every `width`-wide row of `x` into `out`
/// (`rows * len` elements).
pub fn slice_columns(x: &[f32], width: usize, start: usize, len: usize, out: &mut [f32]) -> Result<(), TensorError> {
    let end = start.checked_add(len).filter(|&e| e <= width && len > 0);
    if end.is_none() || !x.len().is_multiple_of(width) || out.len() != x.len() / width * len {
        return Err(TensorError::Shape {
            op: "slice",
            detail: format!(
                "columns {start}..{start}+{len} of {} elements in rows of {width} into {} elements",
                x.len(),
                out.len()
            ),
        });
    }
    for (row, o) in x.chunks_exact(width).zip(out.chunks_exact_mut(len)) {
        o.copy_from_slice(&row[start..start + len]);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every element lands where the index formula says: out[r][c] = x[r][start + c].
    #[test]
    fn slices_match_the_index_formula_and_cover_the_row() {
        let (rows, width) = (3, 10);
        let x: Vec<f32> = (0..rows * width).map(|i| i as f32 * 0.5 - 3.0).collect();
        let mut joined = vec![Vec::new(); rows];
        for (start, len) in [(0, 4), (4, 2), (6, 4)] {
            let mut out = vec![f32::NAN; rows * len];
            slice_columns(&x, width, start, len, &mut out).unwrap();
            for r in 0..rows {
                for c in 0..len {
                    assert_eq!(out[r * len + c], x[r * width + start + c]);
                }
                joined[r].extend_from_slice(&out[r * len..(r + 1) * len]);
            }
        }
        // The three parts, side by side, are the input again.
        assert_eq!(joined.concat(), x);
    }

    #[test]
    fn out_of_range_or_mismatched_slices_are_errors() {
        let x = vec![0.0f32; 12];
        let mut out = vec![0.0f32; 6];
        for (width, start, len) in [(4, 3, 2), (4, 0, 0), (5, 0, 2), (4, usize::MAX, 2)] {
            assert!(slice_columns(&x, width, start, len, &mut out).is_err(), "{width} {start} {len}");
        }
        assert!(slice_columns(&x, 4, 1, 2, &mut out).is_ok());
        assert!(slice_columns(&x, 4, 1, 3, &mut out).is_err(), "output of the wrong size");
    }
}
