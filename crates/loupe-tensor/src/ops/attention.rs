//! Causal scaled-dot-product attention with grouped-query heads, mirroring
//! transformers' `eager_attention_forward`: `softmax(q k^T * scale + mask) v`
//! with the softmax in f32, query head `h` reading kv head `h / (n_heads / n_kv_heads)`
//! (`repeat_kv`).
//!
//! [`AttentionVariant`] selects two other conventions that models (or porting bugs) use: a
//! query-to-kv head map by modulo, and no causal mask within the call (encoders, prefix-LM
//! prompts). The default is the Llama one; [`causal_attention`] takes it.

use rayon::prelude::*;

use crate::TensorError;

/// Head geometry of one attention call.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttentionShape {
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    /// Multiplier of `q k^T` (usually `head_dim^-0.5`).
    pub scale: f32,
}

/// Which kv head a query head reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HeadMap {
    /// `h / (n_heads / n_kv_heads)`: consecutive query heads share a kv head
    /// (transformers' `repeat_kv`, which repeats each kv head in place).
    #[default]
    Grouped,
    /// `h % n_kv_heads`: the kv heads cycle (what tiling the kv heads, `k.repeat(1, g, 1)`,
    /// instead of `repeat_interleave` gives).
    Modulo,
}

/// Which keys a query sees.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AttentionMask {
    /// Query `t` of the call sees the cache and the call's tokens up to itself.
    #[default]
    Causal,
    /// Every query sees the whole context, later tokens of the same call included.
    None,
}

/// Conventions of one attention call beyond its geometry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AttentionVariant {
    pub head_map: HeadMap,
    pub mask: AttentionMask,
}

impl AttentionVariant {
    pub fn is_default(&self) -> bool {
        *self == AttentionVariant::default()
    }
}

/// [`attention`] with the default variant: causal, grouped heads.
pub fn causal_attention(
    shape: AttentionShape,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    ctx: usize,
    out: &mut [f32],
    probs: Option<&mut [f32]>,
) -> Result<(), TensorError> {
    attention(shape, AttentionVariant::default(), q, k, v, ctx, out, probs)
}

/// Attention of `tokens` new queries over a context of `ctx` keys/values whose
/// last `tokens` rows belong to the queries themselves.
///
/// * `q`: `[tokens, n_heads * head_dim]` (after RoPE)
/// * `k`, `v`: `[ctx, n_kv_heads * head_dim]` (the cache, rows `0..ctx`)
/// * `out`: `[tokens, n_heads * head_dim]`
/// * `probs`: when given, receives the attention probabilities `[n_heads, tokens, ctx]`
///   (masked entries are 0), for taps.
#[allow(clippy::too_many_arguments)]
pub fn attention(
    shape: AttentionShape,
    variant: AttentionVariant,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    ctx: usize,
    out: &mut [f32],
    probs: Option<&mut [f32]>,
) -> Result<(), TensorError> {
    let AttentionShape { n_heads, n_kv_heads, head_dim, scale } = shape;
    let q_width = n_heads * head_dim;
    let kv_width = n_kv_heads * head_dim;
    if n_kv_heads == 0 || n_heads % n_kv_heads != 0 || q_width == 0 {
        return Err(TensorError::Shape {
            op: "attention",
            detail: format!("{n_heads} query heads cannot share {n_kv_heads} kv heads"),
        });
    }
    let tokens = q.len() / q_width;
    if q.len() % q_width != 0 || out.len() != q.len() || tokens > ctx || k.len() < ctx * kv_width || v.len() < ctx * kv_width {
        return Err(TensorError::Shape {
            op: "attention",
            detail: format!(
                "q {} elements, k {}, v {}, out {}, ctx {ctx}, head_dim {head_dim}",
                q.len(),
                k.len(),
                v.len(),
                out.len()
            ),
        });
    }
    if let Some(p) = &probs {
        if p.len() != n_heads * tokens * ctx {
            return Err(TensorError::Shape {
                op: "attention",
                detail: format!("probs has {} elements, expected {n_heads}x{tokens}x{ctx}", p.len()),
            });
        }
    }
    let past = ctx - tokens;
    let group = n_heads / n_kv_heads;

    // One task per head; each produces its [tokens, head_dim] slice and its probabilities.
    let per_head: Vec<(Vec<f32>, Vec<f32>)> = (0..n_heads)
        .into_par_iter()
        .map(|h| {
            let kv_h = match variant.head_map {
                HeadMap::Grouped => h / group,
                HeadMap::Modulo => h % n_kv_heads,
            };
            let mut head_out = vec![0.0f32; tokens * head_dim];
            let mut head_probs = vec![0.0f32; tokens * ctx];
            for t in 0..tokens {
                let q_row = &q[t * q_width + h * head_dim..][..head_dim];
                let visible = match variant.mask {
                    AttentionMask::Causal => past + t + 1,
                    AttentionMask::None => ctx,
                };
                let scores = &mut head_probs[t * ctx..t * ctx + visible];
                let mut max = f32::NEG_INFINITY;
                for (j, s) in scores.iter_mut().enumerate() {
                    let k_row = &k[j * kv_width + kv_h * head_dim..][..head_dim];
                    let dot: f32 = q_row.iter().zip(k_row).map(|(a, b)| a * b).sum();
                    *s = dot * scale;
                    max = max.max(*s);
                }
                let mut sum = 0.0f32;
                for s in scores.iter_mut() {
                    *s = (*s - max).exp();
                    sum += *s;
                }
                let inv = 1.0 / sum;
                let o = &mut head_out[t * head_dim..][..head_dim];
                for (j, s) in scores.iter_mut().enumerate() {
                    *s *= inv;
                    let v_row = &v[j * kv_width + kv_h * head_dim..][..head_dim];
                    for (acc, &x) in o.iter_mut().zip(v_row) {
                        *acc += *s * x;
                    }
                }
            }
            (head_out, head_probs)
        })
        .collect();

    for (h, (head_out, _)) in per_head.iter().enumerate() {
        for t in 0..tokens {
            out[t * q_width + h * head_dim..][..head_dim].copy_from_slice(&head_out[t * head_dim..][..head_dim]);
        }
    }
    if let Some(p) = probs {
        for (h, (_, head_probs)) in per_head.iter().enumerate() {
            p[h * tokens * ctx..][..tokens * ctx].copy_from_slice(head_probs);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_token_attends_only_to_itself() {
        // token-0 invariant: the output of token 0 is V[0] whatever q and k are.
        let shape = AttentionShape { n_heads: 2, n_kv_heads: 1, head_dim: 2, scale: 0.7 };
        let q = [1.0, 2.0, 3.0, 4.0, 0.5, 0.5, -1.0, 1.0];
        let k = [0.3, 0.1, 0.9, -0.2];
        let v = [5.0, 6.0, 7.0, 8.0];
        let mut out = [0.0; 8];
        let mut probs = [0.0; 2 * 2 * 2];
        causal_attention(shape, &q, &k, &v, 2, &mut out, Some(&mut probs)).unwrap();
        assert_eq!(&out[..4], &[5.0, 6.0, 5.0, 6.0]);
        assert_eq!(probs[1], 0.0); // masked
        for h in 0..2 {
            let row = &probs[h * 4 + 2..h * 4 + 4];
            assert!((row.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        }
    }

    #[test]
    fn variants_change_head_map_and_mask() {
        // 4 query heads over 2 kv heads of dim 1; two tokens. v of kv head 0 is 10+pos,
        // of kv head 1 is 20+pos; all scores equal, so outputs are means of visible v.
        let shape = AttentionShape { n_heads: 4, n_kv_heads: 2, head_dim: 1, scale: 1.0 };
        let q = [0.0; 8];
        let k = [0.0; 4];
        let v = [10.0, 20.0, 11.0, 21.0];
        let run = |variant: AttentionVariant| {
            let mut out = [0.0f32; 8];
            attention(shape, variant, &q, &k, &v, 2, &mut out, None).unwrap();
            out
        };
        let grouped = run(AttentionVariant::default());
        assert_eq!(&grouped[..4], &[10.0, 10.0, 20.0, 20.0]);
        let modulo = run(AttentionVariant { head_map: HeadMap::Modulo, ..Default::default() });
        assert_eq!(&modulo[..4], &[10.0, 20.0, 10.0, 20.0]);
        let open = run(AttentionVariant { mask: AttentionMask::None, ..Default::default() });
        // token 0 now also sees token 1
        assert_eq!(&open[..4], &[10.5, 10.5, 20.5, 20.5]);
        assert_eq!(&open[4..], &grouped[4..]);
    }

    #[test]
    fn rejects_bad_grouping() {
        let shape = AttentionShape { n_heads: 3, n_kv_heads: 2, head_dim: 2, scale: 1.0 };
        let mut out = [0.0; 6];
        assert!(causal_attention(shape, &[0.0; 6], &[0.0; 4], &[0.0; 4], 1, &mut out, None).is_err());
    }
}
