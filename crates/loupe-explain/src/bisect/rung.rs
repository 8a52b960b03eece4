//! One rung's outcome ([`Rung`]) and how a rung is judged against the one above it: token by
//! token, with flips at a near tie told apart from divergences. A leaf of `bisect`: the rungs'
//! modules and the ladder read it.

use loupe_runtime::argmax;
use serde::Serialize;

/// One rung's outcome against the rung above it.
#[derive(Debug, Clone, Serialize)]
pub struct Rung {
    pub name: &'static str,
    /// What a divergence here implicates.
    pub subsystem: &'static str,
    /// `match`, `diverged`, `near_tie` (a flip at a near tie: later steps not compared),
    /// `skipped`.
    pub status: &'static str,
    /// The first step (0 = the token after the prompt) that differs from the rung above.
    pub first_mismatch: Option<usize>,
    /// Steps where the two disagree at a near tie.
    pub near_ties: Vec<usize>,
    pub detail: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tokens: Option<Vec<u32>>,
    /// The largest logit-level difference from the rung above over the steps where the two
    /// agree on the token, measured as `logit_measure` says (reported, not judged: tokens
    /// and near ties decide the verdict).
    pub max_logit_diff: Option<f64>,
    pub logit_measure: Option<&'static str>,
}

impl Rung {
    pub fn new(name: &'static str, subsystem: &'static str) -> Rung {
        Rung {
            name,
            subsystem,
            status: "match",
            first_mismatch: None,
            near_ties: Vec::new(),
            detail: String::new(),
            tokens: None,
            max_logit_diff: None,
            logit_measure: None,
        }
    }

    /// Records the largest `|mine − above|` over the steps where both have the same token.
    pub fn logit_diff(&mut self, measure: &'static str, tokens: (&[u32], &[u32]), values: (&[f64], &[f64])) {
        let d = tokens
            .0
            .iter()
            .zip(tokens.1)
            .zip(values.0.iter().zip(values.1))
            .filter(|((a, b), _)| a == b)
            .map(|(_, (x, y))| (x - y).abs())
            .fold(None, |m: Option<f64>, d| Some(m.map_or(d, |m| m.max(d))));
        self.max_logit_diff = d;
        self.logit_measure = Some(measure);
    }
    pub fn skipped(mut self, why: impl Into<String>) -> Rung {
        self.status = "skipped";
        self.detail = why.into();
        self
    }
}

/// Log-probability of `tokens[i]` under row `i` of `logits` (`vocab` wide).
pub fn logprobs_of(logits: &[f32], vocab: usize, tokens: &[u32]) -> Vec<f64> {
    logits
        .chunks(vocab)
        .zip(tokens)
        .map(|(row, &t)| f64::from(loupe_runtime::TokenLogprobs::from_logits(row, t, 0).logprob))
        .collect()
}

/// Argmax and top-1/top-2 gap of each row of `logits` (`vocab` wide).
pub fn argmax_margins(logits: &[f32], vocab: usize) -> (Vec<u32>, Vec<f64>) {
    logits
        .chunks(vocab)
        .map(|row| {
            let best = argmax(row) as usize;
            let second =
                row.iter().enumerate().filter(|(i, _)| *i != best).map(|(_, v)| *v).fold(f32::NEG_INFINITY, f32::max);
            (best as u32, f64::from(row[best]) - f64::from(second))
        })
        .unzip()
}

/// Compares `other` with `base` step by step; `margins` are the deciding side's gaps. A
/// flip at a near tie is noted; `cascades` (greedy rungs) stops at the first flip.
pub fn judge(rung: &mut Rung, base: &[u32], other: &[u32], margins: &[f64], tie: f64, cascades: bool) {
    for (k, (a, b)) in base.iter().zip(other).enumerate() {
        if a == b {
            continue;
        }
        let gap = margins.get(k).copied().unwrap_or(f64::INFINITY);
        if gap < tie {
            rung.near_ties.push(k);
            if cascades {
                rung.status = "near_tie";
                rung.first_mismatch = Some(k);
                rung.detail = format!("step {k}: {b} instead of {a} at a near tie (gap {gap:.2e}): the sequences part there, later steps are not comparable");
                return;
            }
            continue;
        }
        rung.status = "diverged";
        rung.first_mismatch = Some(k);
        rung.detail =
            format!("step {k}: token {b} instead of {a} (top-1/top-2 gap {gap:.3} above the tie threshold {tie})");
        return;
    }
    if other.len() < base.len() {
        rung.status = "diverged";
        rung.first_mismatch = Some(other.len());
        rung.detail = format!("stopped after {} of {} tokens", other.len(), base.len());
        return;
    }
    if rung.detail.is_empty() {
        rung.detail = if rung.near_ties.is_empty() {
            format!("{} steps identical", base.len())
        } else {
            format!("identical except near ties at steps {:?}", rung.near_ties)
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn judging_rungs() {
        let mut r = Rung::new("x", "y");
        judge(&mut r, &[1, 2, 3], &[1, 2, 3], &[1.0; 3], 0.1, false);
        assert_eq!((r.status, r.first_mismatch), ("match", None));
        // A flip at a near tie is noted, not a divergence; a later real flip is.
        let mut r = Rung::new("x", "y");
        judge(&mut r, &[1, 2, 3, 4], &[1, 9, 3, 8], &[1.0, 0.01, 1.0, 1.0], 0.1, false);
        assert_eq!((r.status, r.first_mismatch, r.near_ties.clone()), ("diverged", Some(3), vec![1]));
        // Greedy rungs stop at a near-tie flip: the sequences part there.
        let mut r = Rung::new("x", "y");
        judge(&mut r, &[1, 2, 3], &[1, 9, 7], &[1.0, 0.01, 1.0], 0.1, true);
        assert_eq!((r.status, r.first_mismatch), ("near_tie", Some(1)));
        let mut r = Rung::new("x", "y");
        judge(&mut r, &[1, 2, 3], &[1, 2], &[1.0; 3], 0.1, true);
        assert_eq!((r.status, r.first_mismatch), ("diverged", Some(2)));
    }

    #[test]
    fn margins_are_top1_minus_top2() {
        let (a, m) = argmax_margins(&[0.0, 3.0, 2.5, -1.0, 1.0, 1.0], 3);
        assert_eq!(a, vec![1, 1]);
        assert_eq!(m, vec![0.5, 0.0]);
    }
}
