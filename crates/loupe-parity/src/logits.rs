//! Logit metrics, per row (token): argmax agreement, top-k overlap and KL(ref ‖ target)
//! on softmax probabilities smoothed as MAX's logit comparison does,
//! `(1 - N·eps)·p + eps` (docs/max-debugging-options.md, "Comparing logits"), so that a zero probability on
//! either side cannot make the divergence infinite. MAX's docs do not state eps; we use
//! 1e-10 (and shrink it to 0.1/N for vocabularies where N·eps would reach 0.1).

use serde::Serialize;

use crate::tensor::Tensor;

/// Smoothing constant of the KL divergence.
pub const KL_EPS: f64 = 1e-10;

/// One row where the top-1 token differs.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ArgmaxMismatch {
    pub row: usize,
    pub reference_top: usize,
    pub target_top: usize,
    /// Reference logit gap between its top-1 and the target's top-1 token: a small gap is
    /// a near tie (docs/parity-protocol.md, signature `near_tie`).
    pub reference_gap: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LogitMetrics {
    pub rows: usize,
    pub vocab: usize,
    pub argmax_agreement: f64,
    pub top_k: usize,
    /// Mean over rows of |top-k(ref) ∩ top-k(target)| / k.
    pub top_k_overlap: f64,
    pub kl_mean: f64,
    pub kl_max: f64,
    pub kl_max_row: usize,
    /// Up to 16 rows whose argmax differs.
    pub argmax_mismatches: Vec<ArgmaxMismatch>,
    pub argmax_mismatch_count: usize,
}

fn top_k(row: &[f32], k: usize) -> Vec<usize> {
    let mut best: Vec<usize> = Vec::with_capacity(k + 1);
    for (i, &v) in row.iter().enumerate() {
        if v.is_nan() {
            continue;
        }
        let pos = best.iter().position(|&j| v > row[j]).unwrap_or(best.len());
        if pos < k {
            best.insert(pos, i);
            best.truncate(k);
        }
    }
    best
}

/// log-softmax in f64.
fn log_softmax(row: &[f32]) -> Vec<f64> {
    let m = row.iter().filter(|v| v.is_finite()).fold(f64::NEG_INFINITY, |m, &v| m.max(f64::from(v)));
    let lse = m + row.iter().map(|&v| (f64::from(v) - m).exp()).sum::<f64>().ln();
    row.iter().map(|&v| f64::from(v) - lse).collect()
}

/// Smoothed KL(p ‖ q) from logits.
pub fn kl_smoothed(p_logits: &[f32], q_logits: &[f32]) -> f64 {
    let n = p_logits.len().max(1) as f64;
    let eps = KL_EPS.min(0.1 / n);
    let (lp, lq) = (log_softmax(p_logits), log_softmax(q_logits));
    let mut kl = 0.0;
    for (a, b) in lp.iter().zip(&lq) {
        let p = (1.0 - n * eps) * a.exp() + eps;
        let q = (1.0 - n * eps) * b.exp() + eps;
        kl += p * (p / q).ln();
    }
    kl.max(0.0)
}

/// Logit metrics of reference `a` and target `b` (same shape; rows = tokens, last axis =
/// vocabulary). `None` for an empty tensor.
pub fn compute(a: &Tensor, b: &Tensor, k: usize) -> Option<LogitMetrics> {
    let vocab = *a.shape.last()?;
    if vocab == 0 || a.data.len() != b.data.len() {
        return None;
    }
    let rows = a.data.len() / vocab;
    let (mut agree, mut overlap, mut kl_sum, mut kl_max, mut kl_max_row) = (0usize, 0f64, 0f64, 0f64, 0usize);
    let mut mismatches = Vec::new();
    let mut count = 0usize;
    for r in 0..rows {
        let (ra, rb) = (&a.data[r * vocab..(r + 1) * vocab], &b.data[r * vocab..(r + 1) * vocab]);
        let (ta, tb) = (top_k(ra, k), top_k(rb, k));
        let common = ta.iter().filter(|i| tb.contains(i)).count();
        overlap += common as f64 / k.max(1) as f64;
        match (ta.first(), tb.first()) {
            (Some(&x), Some(&y)) if x == y => agree += 1,
            (Some(&x), Some(&y)) => {
                count += 1;
                if mismatches.len() < 16 {
                    mismatches.push(ArgmaxMismatch {
                        row: r,
                        reference_top: x,
                        target_top: y,
                        reference_gap: f64::from(ra[x]) - f64::from(ra[y]),
                    });
                }
            }
            _ => count += 1,
        }
        let kl = kl_smoothed(ra, rb);
        kl_sum += kl;
        if kl > kl_max {
            kl_max = kl;
            kl_max_row = r;
        }
    }
    let rows_f = rows.max(1) as f64;
    Some(LogitMetrics {
        rows,
        vocab,
        argmax_agreement: agree as f64 / rows_f,
        top_k: k,
        top_k_overlap: overlap / rows_f,
        kl_mean: kl_sum / rows_f,
        kl_max,
        kl_max_row,
        argmax_mismatches: mismatches,
        argmax_mismatch_count: count,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argmax_topk_and_kl() {
        let a = Tensor::new(vec![2, 4], vec![1., 5., 2., 0., 3., 2.9, 0., 0.]);
        let b = Tensor::new(vec![2, 4], vec![1., 5., 2., 0., 2.9, 3., 0., 0.]);
        let m = compute(&a, &b, 2).expect("metrics");
        assert_eq!(m.argmax_agreement, 0.5);
        assert_eq!(m.top_k_overlap, 1.0);
        assert_eq!(m.argmax_mismatches[0].row, 1);
        assert!((m.argmax_mismatches[0].reference_gap - 0.1).abs() < 1e-6);
        assert_eq!(m.kl_max_row, 1);
        assert!(m.kl_mean > 0.0 && kl_smoothed(&a.data[..4], &a.data[..4]).abs() < 1e-12);
        // KL of two-token distributions against the closed form: p = softmax([0, 0]),
        // q = softmax([0, ln 3]) = [1/4, 3/4]; KL = 0.5 ln 2 + 0.5 ln(2/3).
        let kl = kl_smoothed(&[0.0, 0.0], &[0.0, 3f32.ln()]);
        let exact = 0.5 * 2f64.ln() + 0.5 * (2.0f64 / 3.0).ln();
        assert!((kl - exact).abs() < 1e-6, "{kl} vs {exact}");
        assert_eq!(top_k(&[f32::NAN, 1.0, 3.0], 5), vec![2, 1]);
    }
}
