//! Rotary position embedding in Hugging Face's "split-half" convention
//! (`rotate_half` in transformers' `modeling_llama.py`): within each head, element
//! `i` is paired with element `i + head_dim/2`. The "interleaved" convention (GPT-J,
//! Meta's original Llama code, llama.cpp's `LLAMA_ROPE_TYPE_NORM`) pairs `2i` with `2i+1`
//! instead; it is here because applying one convention to weights laid out for the other is
//! a classic porting bug, and the parity tools plant and recognise it.
//!
//! GGUF files from llama.cpp's converter store q/k projection rows permuted for
//! its interleaved convention; the model loader undoes that permutation, so this
//! one kernel serves both GGUF and safetensors checkpoints and q/k values line
//! up with PyTorch's element for element.

use crate::TensorError;

/// How the base frequencies are adjusted for long context.
#[derive(Debug, Clone, PartialEq)]
pub enum RopeScaling {
    None,
    /// Positions divided by `factor` (transformers' `rope_type="linear"`).
    Linear { factor: f32 },
    /// Llama 3.1's frequency-dependent scaling (transformers'
    /// `_compute_llama3_parameters`).
    Llama3 {
        factor: f32,
        low_freq_factor: f32,
        high_freq_factor: f32,
        original_max_position_embeddings: f32,
    },
    /// Per-frequency divisors read from a GGUF `rope_freqs.weight` tensor
    /// (llama.cpp's encoding of the same Llama 3 scaling).
    FreqFactors(Vec<f32>),
}

/// Which elements of a head rotate together; pair `i` always turns at frequency `i`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RopeMode {
    /// `(i, i + head_dim/2)`: transformers' `rotate_half` (GPT-NeoX style).
    #[default]
    SplitHalf,
    /// `(2i, 2i + 1)`: GPT-J / original Llama style.
    Interleaved,
}

impl RopeMode {
    pub fn name(self) -> &'static str {
        match self {
            RopeMode::SplitHalf => "split-half",
            RopeMode::Interleaved => "interleaved",
        }
    }
}

/// Inverse frequencies for one head size, and the rotation they define.
#[derive(Debug, Clone)]
pub struct RopeTable {
    head_dim: usize,
    inv_freq: Vec<f32>,
    position_scale: f32,
}

impl RopeTable {
    /// `inv_freq[i] = 1 / theta^(2i / head_dim)`, computed in f32 as PyTorch does,
    /// then adjusted by `scaling`.
    pub fn new(head_dim: usize, theta: f32, scaling: &RopeScaling) -> Result<RopeTable, TensorError> {
        if head_dim == 0 || !head_dim.is_multiple_of(2) {
            return Err(TensorError::Shape {
                op: "rope",
                detail: format!("head_dim {head_dim} must be even and non-zero"),
            });
        }
        let half = head_dim / 2;
        let mut inv_freq: Vec<f32> = (0..half)
            .map(|i| 1.0 / theta.powf((2 * i) as f32 / head_dim as f32))
            .collect();
        let mut position_scale = 1.0;
        match scaling {
            RopeScaling::None => {}
            RopeScaling::Linear { factor } => position_scale = 1.0 / factor,
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings: old_ctx,
            } => {
                let low_freq_wavelen = old_ctx / low_freq_factor;
                let high_freq_wavelen = old_ctx / high_freq_factor;
                for f in inv_freq.iter_mut() {
                    let wavelen = 2.0 * std::f32::consts::PI / *f;
                    if wavelen > low_freq_wavelen {
                        *f /= factor;
                    } else if wavelen >= high_freq_wavelen {
                        let smooth = (old_ctx / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
                        *f = (1.0 - smooth) * *f / factor + smooth * *f;
                    }
                }
            }
            RopeScaling::FreqFactors(factors) => {
                if factors.len() != half {
                    return Err(TensorError::Shape {
                        op: "rope",
                        detail: format!("{} frequency factors for head_dim {head_dim} (expected {half})", factors.len()),
                    });
                }
                for (f, &d) in inv_freq.iter_mut().zip(factors) {
                    *f /= d;
                }
            }
        }
        Ok(RopeTable { head_dim, inv_freq, position_scale })
    }

    pub fn head_dim(&self) -> usize {
        self.head_dim
    }

    /// cos and sin of every frequency at `position` (each `head_dim / 2` long).
    pub fn cos_sin(&self, position: usize, cos: &mut [f32], sin: &mut [f32]) {
        let pos = position as f32 * self.position_scale;
        for ((c, s), &f) in cos.iter_mut().zip(sin.iter_mut()).zip(&self.inv_freq) {
            let angle = f * pos;
            *c = angle.cos();
            *s = angle.sin();
        }
    }

    /// Rotates `x` (`[tokens, n_heads * head_dim]`) in place in the split-half convention;
    /// row `t` is at position `first_position + t`.
    pub fn apply(&self, x: &mut [f32], n_heads: usize, first_position: usize) -> Result<(), TensorError> {
        self.apply_mode(x, n_heads, first_position, RopeMode::SplitHalf)
    }

    /// [`RopeTable::apply`] with the pairing of `mode`.
    pub fn apply_mode(&self, x: &mut [f32], n_heads: usize, first_position: usize, mode: RopeMode) -> Result<(), TensorError> {
        let width = n_heads * self.head_dim;
        if width == 0 || !x.len().is_multiple_of(width) {
            return Err(TensorError::Shape {
                op: "rope",
                detail: format!("{} elements is not a multiple of {n_heads} heads x {}", x.len(), self.head_dim),
            });
        }
        let half = self.head_dim / 2;
        // On the stack for head_dim <= 512 (every model we know), so decode allocates
        // nothing; the heap beyond.
        let (mut cos_stack, mut sin_stack) = ([0.0f32; 256], [0.0f32; 256]);
        let (mut cos_heap, mut sin_heap) = (Vec::new(), Vec::new());
        let (cos, sin): (&mut [f32], &mut [f32]) = if half <= 256 {
            (&mut cos_stack[..half], &mut sin_stack[..half])
        } else {
            cos_heap.resize(half, 0.0);
            sin_heap.resize(half, 0.0);
            (&mut cos_heap, &mut sin_heap)
        };
        for (t, row) in x.chunks_exact_mut(width).enumerate() {
            self.cos_sin(first_position + t, cos, sin);
            for head in row.chunks_exact_mut(self.head_dim) {
                match mode {
                    RopeMode::SplitHalf => {
                        let (lo, hi) = head.split_at_mut(half);
                        for i in 0..half {
                            let (a, b) = (lo[i], hi[i]);
                            // q*cos + rotate_half(q)*sin, rotate_half(q) = [-q2, q1]
                            lo[i] = a * cos[i] - b * sin[i];
                            hi[i] = b * cos[i] + a * sin[i];
                        }
                    }
                    RopeMode::Interleaved => {
                        for (i, pair) in head.chunks_exact_mut(2).enumerate() {
                            let (a, b) = (pair[0], pair[1]);
                            pair[0] = a * cos[i] - b * sin[i];
                            pair[1] = b * cos[i] + a * sin[i];
                        }
                    }
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn position_zero_is_identity() {
        let t = RopeTable::new(4, 10000.0, &RopeScaling::None).unwrap();
        let mut x = [1.0f32, 2.0, 3.0, 4.0];
        t.apply(&mut x, 1, 0).unwrap();
        assert_eq!(x, [1.0, 2.0, 3.0, 4.0]);
    }

    #[test]
    fn rotation_preserves_pair_norms_and_uses_split_half_pairs() {
        let t = RopeTable::new(4, 10000.0, &RopeScaling::None).unwrap();
        let mut x = [1.0f32, 0.0, 0.0, 0.0];
        t.apply(&mut x, 1, 1).unwrap();
        // frequency 0 is 1 rad/position: (1, 0) rotates to (cos 1, sin 1) across the halves
        assert!((x[0] - 1.0f32.cos()).abs() < 1e-6);
        assert!((x[2] - 1.0f32.sin()).abs() < 1e-6);
        assert_eq!(x[1], 0.0);
    }

    #[test]
    fn interleaved_pairs_adjacent_elements() {
        let t = RopeTable::new(4, 10000.0, &RopeScaling::None).unwrap();
        let mut x = [1.0f32, 0.0, 0.0, 0.0];
        t.apply_mode(&mut x, 1, 1, RopeMode::Interleaved).unwrap();
        // frequency 0 turns (x0, x1): (1, 0) -> (cos 1, sin 1); x2, x3 untouched
        assert!((x[0] - 1.0f32.cos()).abs() < 1e-6);
        assert!((x[1] - 1.0f32.sin()).abs() < 1e-6);
        assert_eq!(&x[2..], &[0.0, 0.0]);
    }

    #[test]
    fn interleaved_is_split_half_on_permuted_elements() {
        // Interleaved RoPE equals split-half RoPE applied after moving element 2i to i and
        // 2i+1 to i + hd/2 (the permutation llama.cpp's converter applies to q/k rows).
        let hd = 8;
        let t = RopeTable::new(hd, 10000.0, &RopeScaling::None).unwrap();
        let x: Vec<f32> = (0..hd).map(|i| (i as f32 * 0.37).sin()).collect();
        let mut inter = x.clone();
        t.apply_mode(&mut inter, 1, 5, RopeMode::Interleaved).unwrap();
        let mut perm = vec![0.0; hd];
        for i in 0..hd / 2 {
            perm[i] = x[2 * i];
            perm[i + hd / 2] = x[2 * i + 1];
        }
        t.apply(&mut perm, 1, 5).unwrap();
        for i in 0..hd / 2 {
            assert!((inter[2 * i] - perm[i]).abs() < 1e-6);
            assert!((inter[2 * i + 1] - perm[i + hd / 2]).abs() < 1e-6);
        }
    }

    #[test]
    fn llama3_scaling_leaves_high_frequencies_alone() {
        let s = RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 8192.0,
        };
        let plain = RopeTable::new(128, 500000.0, &RopeScaling::None).unwrap();
        let scaled = RopeTable::new(128, 500000.0, &s).unwrap();
        assert_eq!(plain.inv_freq[0], scaled.inv_freq[0]);
        assert!((scaled.inv_freq[63] - plain.inv_freq[63] / 8.0).abs() < 1e-12);
    }
}
