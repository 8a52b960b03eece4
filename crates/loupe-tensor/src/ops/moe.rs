//! Mixture-of-Experts routing: which experts each token goes to, and with what weight.
//!
//! Two routers, as transformers computes them in f32:
//! * softmax top-k (`Qwen3MoeTopKRouter.forward`, `modeling_qwen3_moe.py`): probabilities
//!   `softmax(logits)` in f32, the `top_k` largest, divided by their sum when
//!   `norm_topk_prob`;
//! * DeepSeek-V3's grouped sigmoid router (`Glm4MoeTopkRouter.forward`,
//!   `modeling_glm4_moe.py`): scores `sigmoid(logits)`; the experts are *chosen* on
//!   `scores + e_score_correction_bias` within the `topk_group` groups (of `n_group`) whose
//!   two best biased scores sum highest, and *weighted* by the unbiased scores, divided by
//!   `sum + 1e-20` when `norm_topk_prob`, times `routed_scaling_factor`.
//!
//! Selection ([`router_select`]) and weighting ([`router_weights`]) are separate kernels so the
//! graph can show both values. The selected experts of a token are written in ascending expert
//! id: transformers' experts loop adds the experts' outputs in that order
//! (`Qwen3MoeExperts.forward` iterates `expert_hit`, ascending), and the order of its own
//! `top_k` indices carries no meaning (the GLM router asks `torch.topk(..., sorted=False)`,
//! whose order is the kernel's). Ties between equal scores go to the lower expert id; torch's
//! CPU `topk` promises no order among ties (it picks ids 1 and 5 of the three 2s in
//! `[1, 2, 2, 1, 3, 2]`), so an exact tie may choose differently; random router weights make
//! one vanishingly unlikely and the tests check none occurs.

use crate::TensorError;

/// How router logits become scores.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RouterScoring {
    /// `softmax(logits)` over the experts (Qwen3-MoE, Mixtral).
    Softmax,
    /// `sigmoid(logits)` per expert (DeepSeek-V3, GLM-4.5).
    Sigmoid,
}

/// A router's arithmetic (everything but its weights).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Router {
    pub scoring: RouterScoring,
    pub n_experts: usize,
    /// Experts per token (`num_experts_per_tok`).
    pub top_k: usize,
    /// Expert groups (`n_group`; 1: no grouping) and how many of them a token may use
    /// (`topk_group`).
    pub n_group: usize,
    pub topk_group: usize,
    /// Divide the chosen weights by their sum (`norm_topk_prob`).
    pub norm_topk_prob: bool,
    /// Factor on the final weights (`routed_scaling_factor`; 1 for softmax routers).
    pub scaling: f32,
}

impl Router {
    /// Checks the geometry once, so the kernels cannot index out of range.
    pub fn check(&self) -> Result<(), TensorError> {
        let bad = |detail: String| Err(TensorError::Shape { op: "moe_router", detail });
        if self.n_experts == 0 || self.top_k == 0 || self.top_k > self.n_experts {
            return bad(format!("top_k {} of {} experts", self.top_k, self.n_experts));
        }
        if self.n_group == 0 || !self.n_experts.is_multiple_of(self.n_group) {
            return bad(format!("{} groups do not divide {} experts", self.n_group, self.n_experts));
        }
        if self.topk_group == 0 || self.topk_group > self.n_group {
            return bad(format!("topk_group {} of {} groups", self.topk_group, self.n_group));
        }
        if self.n_group > 1 && self.n_experts / self.n_group < 2 {
            // The group score sums each group's two best experts.
            return bad(format!("groups of {} expert(s); group scoring needs 2", self.n_experts / self.n_group));
        }
        if self.n_group > 1 && self.top_k > self.topk_group * (self.n_experts / self.n_group) {
            return bad(format!(
                "top_k {} exceeds the {} experts of {} groups",
                self.top_k,
                self.topk_group * (self.n_experts / self.n_group),
                self.topk_group
            ));
        }
        Ok(())
    }

    /// One token's scores from its logits, into `scores`.
    fn scores(&self, logits: &[f32], scores: &mut [f32]) {
        match self.scoring {
            RouterScoring::Softmax => {
                // `nn.functional.softmax(x, dtype=torch.float)`: max-subtracted exponentials
                // over their sum.
                let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let mut sum = 0.0f32;
                for (s, &x) in scores.iter_mut().zip(logits) {
                    *s = (x - max).exp();
                    sum += *s;
                }
                scores.iter_mut().for_each(|s| *s /= sum);
            }
            RouterScoring::Sigmoid => {
                for (s, &x) in scores.iter_mut().zip(logits) {
                    *s = 1.0 / (1.0 + (-x).exp());
                }
            }
        }
    }
}

/// Indices of the `k` largest of `v` (ties: lower index first), not in any order.
fn top_k_into(v: &[f32], k: usize, order: &mut Vec<usize>) {
    order.clear();
    order.extend(0..v.len());
    // Descending by value, then ascending by index; NaN sorts last.
    order
        .sort_by(|&a, &b| v[b].partial_cmp(&v[a]).unwrap_or_else(|| v[a].is_nan().cmp(&v[b].is_nan())).then(a.cmp(&b)));
    order.truncate(k);
}

/// The experts each token goes to: `logits` is `[tokens, n_experts]`; `bias` the
/// selection-only correction (`e_score_correction_bias`, sigmoid routers); `out` gets
/// `[tokens, top_k]` expert ids as f32 (exact below 2^24), ascending per token.
pub fn router_select(
    router: &Router,
    logits: &[f32],
    bias: Option<&[f32]>,
    out: &mut [f32],
) -> Result<(), TensorError> {
    router.check()?;
    let (e, k) = (router.n_experts, router.top_k);
    if !logits.len().is_multiple_of(e) || out.len() != logits.len() / e * k || bias.is_some_and(|b| b.len() != e) {
        return Err(TensorError::Shape {
            op: "moe_router",
            detail: format!(
                "{} logits, {} outputs, bias {:?} for {e} experts and top_k {k}",
                logits.len(),
                out.len(),
                bias.map(<[f32]>::len)
            ),
        });
    }
    let mut scores = vec![0.0f32; e];
    let mut order = Vec::with_capacity(e);
    let mut groups = Vec::with_capacity(router.n_group);
    let mut group_order = Vec::with_capacity(router.n_group);
    for (row, dst) in logits.chunks_exact(e).zip(out.chunks_exact_mut(k)) {
        router.scores(row, &mut scores);
        if let Some(b) = bias {
            // `scores_for_choice = scores + e_score_correction_bias`.
            scores.iter_mut().zip(b).for_each(|(s, b)| *s += b);
        }
        if router.n_group > 1 {
            // Each group's score is the sum of its two best biased scores
            // (`.topk(2, dim=-1)[0].sum(dim=-1)`); experts outside the `topk_group` best
            // groups are masked to -inf.
            let per = e / router.n_group;
            groups.clear();
            for g in scores.chunks_exact(per) {
                top_k_into(g, 2, &mut order);
                groups.push(g[order[0]] + g[order[1]]);
            }
            top_k_into(&groups, router.topk_group, &mut group_order);
            for (gi, g) in scores.chunks_exact_mut(per).enumerate() {
                if !group_order.contains(&gi) {
                    g.iter_mut().for_each(|s| *s = f32::NEG_INFINITY);
                }
            }
        }
        top_k_into(&scores, k, &mut order);
        order.sort_unstable();
        for (d, &i) in dst.iter_mut().zip(order.iter()) {
            *d = i as f32;
        }
    }
    Ok(())
}

/// The weight of each chosen expert: the unbiased score at each index of `indices`
/// (`[tokens, top_k]`, from [`router_select`]), over the chosen scores' sum when
/// `norm_topk_prob` (plus 1e-20 for sigmoid routers, as `Glm4MoeTopkRouter` adds), times
/// the scaling factor (sigmoid routers; softmax routers never scale). `out` is
/// `[tokens, top_k]`.
pub fn router_weights(router: &Router, logits: &[f32], indices: &[f32], out: &mut [f32]) -> Result<(), TensorError> {
    router.check()?;
    let (e, k) = (router.n_experts, router.top_k);
    let tokens = logits.len() / e;
    if logits.len() != tokens * e || indices.len() != tokens * k || out.len() != tokens * k {
        return Err(TensorError::Shape {
            op: "moe_weights",
            detail: format!(
                "{} logits, {} indices, {} outputs for {e} experts and top_k {k}",
                logits.len(),
                indices.len(),
                out.len()
            ),
        });
    }
    let mut scores = vec![0.0f32; e];
    for ((row, idx), dst) in logits.chunks_exact(e).zip(indices.chunks_exact(k)).zip(out.chunks_exact_mut(k)) {
        router.scores(row, &mut scores);
        for (d, &i) in dst.iter_mut().zip(idx) {
            let i = expert_id(i, e)?;
            *d = scores[i];
        }
        if router.norm_topk_prob {
            // Summed in transformers' order: its top-k order, which for the softmax router
            // is descending probability (sorted top-k), for the sigmoid one torch's unsorted
            // order. Three or more addends could round differently in another order, so
            // the softmax sum follows the descending order; see the module docs for ties.
            let mut sum = match router.scoring {
                RouterScoring::Softmax => {
                    let mut v: Vec<f32> = dst.to_vec();
                    v.sort_by(|a, b| b.partial_cmp(a).unwrap_or(std::cmp::Ordering::Equal));
                    v.iter().sum::<f32>()
                }
                RouterScoring::Sigmoid => dst.iter().sum::<f32>(),
            };
            if router.scoring == RouterScoring::Sigmoid {
                sum += 1e-20;
            }
            dst.iter_mut().for_each(|d| *d /= sum);
        }
        if router.scoring == RouterScoring::Sigmoid {
            dst.iter_mut().for_each(|d| *d *= router.scaling);
        }
    }
    Ok(())
}

/// An expert id stored as f32, checked against the expert count.
pub fn expert_id(v: f32, n_experts: usize) -> Result<usize, TensorError> {
    if v >= 0.0 && v.fract() == 0.0 && (v as usize) < n_experts {
        Ok(v as usize)
    } else {
        Err(TensorError::Shape {
            op: "moe_experts",
            detail: format!("expert id {v} is not one of {n_experts} experts"),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn softmax_router(k: usize, norm: bool) -> Router {
        Router {
            scoring: RouterScoring::Softmax,
            n_experts: 4,
            top_k: k,
            n_group: 1,
            topk_group: 1,
            norm_topk_prob: norm,
            scaling: 1.0,
        }
    }

    /// Scalar f64 reference of the softmax router, written from the formula.
    fn softmax_ref(logits: &[f64], k: usize, norm: bool) -> Vec<(usize, f64)> {
        let m = logits.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let ex: Vec<f64> = logits.iter().map(|x| (x - m).exp()).collect();
        let s: f64 = ex.iter().sum();
        let mut idx: Vec<usize> = (0..logits.len()).collect();
        idx.sort_by(|&a, &b| ex[b].partial_cmp(&ex[a]).unwrap());
        idx.truncate(k);
        let tot: f64 = idx.iter().map(|&i| ex[i] / s).sum();
        let mut out: Vec<(usize, f64)> = idx.iter().map(|&i| (i, ex[i] / s / if norm { tot } else { 1.0 })).collect();
        out.sort_by_key(|p| p.0);
        out
    }

    #[test]
    fn softmax_router_matches_its_formula() {
        let logits = [0.3f32, -1.2, 2.0, 0.9, /* token 2 */ -0.5, 0.25, 0.1, 1.5];
        for norm in [false, true] {
            let r = softmax_router(2, norm);
            let mut idx = [0.0f32; 4];
            router_select(&r, &logits, None, &mut idx).unwrap();
            let mut w = [0.0f32; 4];
            router_weights(&r, &logits, &idx, &mut w).unwrap();
            for t in 0..2 {
                let want =
                    softmax_ref(&logits[t * 4..t * 4 + 4].iter().map(|&x| x as f64).collect::<Vec<_>>(), 2, norm);
                for j in 0..2 {
                    assert_eq!(idx[t * 2 + j] as usize, want[j].0, "token {t}");
                    assert!(
                        (w[t * 2 + j] as f64 - want[j].1).abs() < 1e-6,
                        "token {t}: {} vs {}",
                        w[t * 2 + j],
                        want[j].1
                    );
                }
            }
            // token 0 picks experts 2 and 3, written in id order
            assert_eq!(&idx[..2], &[2.0, 3.0]);
            let sum: f32 = w[..2].iter().sum();
            assert_eq!((sum - 1.0).abs() < 1e-6, norm, "renormalized iff norm_topk_prob: {sum}");
        }
    }

    /// The grouped sigmoid router, checked against a hand computation: the correction bias
    /// moves the choice but not the weights, and a group outside `topk_group` is never used
    /// even when it holds the single best expert.
    #[test]
    fn grouped_sigmoid_router_selects_with_bias_and_weights_without() {
        let r = Router {
            scoring: RouterScoring::Sigmoid,
            n_experts: 8,
            top_k: 2,
            n_group: 2,
            topk_group: 1,
            norm_topk_prob: true,
            scaling: 2.5,
        };
        // Group 0 (experts 0-3): best two 1.0 + 0.9; group 1 (4-7): 3.0 + -2 -> 0.95+0.12 in sigmoid.
        let logits = [1.0f32, 0.9, -1.0, -1.0, 3.0, -2.0, -3.0, -3.0];
        let sig = |x: f32| 1.0 / (1.0 + (-x).exp());
        let mut idx = [0.0f32; 2];
        router_select(&r, &logits, None, &mut idx).unwrap();
        // group scores: 0.731+0.711=1.442 vs 0.953+0.119=1.072 -> group 0 only, not expert 4
        assert_eq!(idx, [0.0, 1.0]);
        // A bias of +1 on expert 2 changes the choice to {0, 2}; its weight stays unbiased.
        let bias = [0.0f32, 0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0];
        router_select(&r, &logits, Some(&bias), &mut idx).unwrap();
        assert_eq!(idx, [0.0, 2.0]);
        let mut w = [0.0f32; 2];
        router_weights(&r, &logits, &idx, &mut w).unwrap();
        let (a, b) = (sig(1.0), sig(-1.0));
        let want = [a / (a + b + 1e-20) * 2.5, b / (a + b + 1e-20) * 2.5];
        for j in 0..2 {
            assert!((w[j] - want[j]).abs() < 1e-6, "{w:?} vs {want:?}");
        }
        // Without grouping the best expert overall (4) is taken.
        let flat = Router { n_group: 1, topk_group: 1, norm_topk_prob: false, scaling: 1.0, ..r };
        router_select(&flat, &logits, None, &mut idx).unwrap();
        assert_eq!(idx, [0.0, 4.0]);
        router_weights(&flat, &logits, &idx, &mut w).unwrap();
        assert_eq!(w, [sig(1.0), sig(3.0)]);
    }

    #[test]
    fn ties_go_to_the_lower_id_and_bad_geometry_is_an_error() {
        let r = softmax_router(2, false);
        let mut idx = [0.0f32; 2];
        router_select(&r, &[1.0, 2.0, 2.0, 2.0], None, &mut idx).unwrap();
        assert_eq!(idx, [1.0, 2.0]);
        assert!(router_select(&softmax_router(5, false), &[0.0; 4], None, &mut [0.0; 5]).is_err());
        assert!(router_select(&r, &[0.0; 5], None, &mut idx).is_err());
        let grouped = Router { n_group: 3, ..r };
        assert!(router_select(&grouped, &[0.0; 4], None, &mut idx).is_err());
        let mut w = [0.0f32; 2];
        let e = router_weights(&r, &[0.0; 4], &[0.0, 7.0], &mut w).unwrap_err();
        assert!(e.to_string().contains("expert id 7"), "{e}");
    }
}
