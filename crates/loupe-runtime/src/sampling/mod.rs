//! Token selection from logits, in the order Hugging Face's `generate` applies its logits
//! processors: repetition penalty, temperature, top-k, top-p, min-p, then a draw. OpenAI's
//! presence and frequency penalties (which transformers lacks) come first, with the
//! repetition penalty.

mod candidates;

use self::candidates::Candidates;

/// Sampling settings. `temperature == 0` means greedy (argmax).
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    pub temperature: f32,
    /// Keep the k most likely tokens (0 = off).
    pub top_k: usize,
    /// Keep the smallest set whose probability reaches p (1.0 = off).
    pub top_p: f32,
    /// Drop tokens less likely than `min_p` x the top probability (0 = off).
    pub min_p: f32,
    /// CTRL-style penalty on tokens already in the context (1.0 = off): positive logits
    /// are divided by it, negative ones multiplied (transformers'
    /// `RepetitionPenaltyLogitsProcessor`).
    pub repetition_penalty: f32,
    /// OpenAI's presence penalty: subtracted once from the logit of every token this
    /// sampler has already produced (0 = off; OpenAI allows -2..2).
    pub presence_penalty: f32,
    /// OpenAI's frequency penalty: subtracted from a produced token's logit once per time
    /// it was produced (0 = off; -2..2).
    pub frequency_penalty: f32,
    pub seed: u64,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            seed: 0,
        }
    }
}

impl SamplingParams {
    /// Checks ranges; the error names the parameter.
    pub fn validate(&self) -> Result<(), String> {
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return Err(format!("temperature must be >= 0, got {}", self.temperature));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(format!("top-p must be in (0, 1], got {}", self.top_p));
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return Err(format!("min-p must be in [0, 1], got {}", self.min_p));
        }
        if !(self.repetition_penalty.is_finite() && self.repetition_penalty > 0.0) {
            return Err(format!("repetition penalty must be > 0, got {}", self.repetition_penalty));
        }
        // OpenAI's documented range for both.
        if !(-2.0..=2.0).contains(&self.presence_penalty) {
            return Err(format!("presence penalty must be in [-2, 2], got {}", self.presence_penalty));
        }
        if !(-2.0..=2.0).contains(&self.frequency_penalty) {
            return Err(format!("frequency penalty must be in [-2, 2], got {}", self.frequency_penalty));
        }
        Ok(())
    }
}

/// xoshiro256** seeded through splitmix64 (Blackman & Vigna, "Scrambled linear
/// pseudorandom number generators", 2018): small, fast, and stable across versions, so
/// a seed reproduces the same text on every build.
#[derive(Debug, Clone)]
struct Rng([u64; 4]);

impl Rng {
    fn new(seed: u64) -> Rng {
        let mut z = loupe_core::SplitMix64(seed);
        Rng([z.next_u64(), z.next_u64(), z.next_u64(), z.next_u64()])
    }

    fn next_u64(&mut self) -> u64 {
        let s = &mut self.0;
        let result = s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        result
    }

    /// Uniform in [0, 1) with 53 bits.
    fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

/// Log-probabilities of one generated token and of the most likely alternatives, taken from
/// the model's own distribution: the log-softmax of the raw logits, before penalties,
/// temperature and truncation (what vLLM reports by default as `raw_logprobs`).
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprobs {
    pub logprob: f32,
    /// The `n` most likely tokens, most likely first (ties: lower id first).
    pub top: Vec<(u32, f32)>,
}

impl TokenLogprobs {
    /// From a row of logits: `token`'s log-probability and the `n` most likely tokens.
    pub fn from_logits(logits: &[f32], token: u32, n: usize) -> TokenLogprobs {
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
        let sum: f64 = logits.iter().map(|&l| (l as f64 - max).exp()).sum();
        let log_z = max + sum.ln();
        let lp = |t: u32| logits.get(t as usize).map_or(f32::NEG_INFINITY, |&l| (l as f64 - log_z) as f32);
        let n = n.min(logits.len());
        let mut top = Vec::with_capacity(n);
        if n > 0 {
            let mut ids: Vec<u32> = (0..logits.len() as u32).collect();
            let by_logit = |a: &u32, b: &u32| logits[*b as usize].total_cmp(&logits[*a as usize]).then(a.cmp(b));
            ids.select_nth_unstable_by(n - 1, by_logit);
            ids.truncate(n);
            ids.sort_unstable_by(by_logit);
            top.extend(ids.into_iter().map(|t| (t, lp(t))));
        }
        TokenLogprobs { logprob: lp(token), top }
    }
}

/// Picks tokens; holds the random state so a seeded run is reproducible.
#[derive(Debug, Clone)]
pub struct Sampler {
    params: SamplingParams,
    rng: Rng,
    /// How often this sampler produced each token, for the presence and frequency
    /// penalties (which, as in OpenAI's API, count generated tokens only).
    produced: std::collections::HashMap<u32, u32>,
}

/// Index of the largest value; the first one on ties (as `torch.argmax`).
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &v) in logits.iter().enumerate() {
        if v > logits[best] {
            best = i;
        }
    }
    best as u32
}

impl Sampler {
    pub fn new(params: SamplingParams) -> Sampler {
        let rng = Rng::new(params.seed);
        Sampler { params, rng, produced: std::collections::HashMap::new() }
    }

    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// Whether this sampler reads only the argmax of its logits: greedy, with no penalty
    /// that moves a logit first.
    pub fn is_plain_greedy(&self) -> bool {
        let p = &self.params;
        p.temperature == 0.0 && p.repetition_penalty == 1.0 && p.presence_penalty == 0.0 && p.frequency_penalty == 0.0
    }

    /// Chooses the next token from `logits` (modified in place by the penalty); `context`
    /// is every token so far (prompt and generated), for the repetition penalty.
    pub fn sample(&mut self, logits: &mut [f32], context: &[u32]) -> u32 {
        let token = self.choose(logits, context);
        if self.params.presence_penalty != 0.0 || self.params.frequency_penalty != 0.0 {
            *self.produced.entry(token).or_insert(0) += 1;
        }
        token
    }

    /// Speculative verification of a draft token `draft` proposed with certainty (prompt
    /// lookup): returns `draft` if it is accepted, else another token, so that the token
    /// returned has exactly the distribution [`Sampler::sample`] would draw from. Greedy:
    /// the argmax, accepted when it is the draft (no random state is used). Sampled: the
    /// draft is accepted with its probability p(draft) under the processed distribution
    /// (penalties, temperature, top-k, top-p, min-p); on rejection the token is drawn from
    /// that distribution without the draft, renormalized: P(t) = (1 - p(d)) p(t) / (1 - p(d)).
    pub fn sample_or_accept(&mut self, logits: &mut [f32], context: &[u32], draft: u32) -> u32 {
        let token = self.choose_with_draft(logits, context, Some(draft));
        if self.params.presence_penalty != 0.0 || self.params.frequency_penalty != 0.0 {
            *self.produced.entry(token).or_insert(0) += 1;
        }
        token
    }

    fn choose(&mut self, logits: &mut [f32], context: &[u32]) -> u32 {
        self.choose_with_draft(logits, context, None)
    }

    fn choose_with_draft(&mut self, logits: &mut [f32], context: &[u32], draft: Option<u32>) -> u32 {
        let p = &self.params;
        for (&t, &count) in &self.produced {
            if let Some(l) = logits.get_mut(t as usize) {
                *l -= p.presence_penalty + p.frequency_penalty * count as f32;
            }
        }
        if p.repetition_penalty != 1.0 {
            for &t in context {
                if let Some(l) = logits.get_mut(t as usize) {
                    *l = if *l > 0.0 { *l / p.repetition_penalty } else { *l * p.repetition_penalty };
                }
            }
        }
        if p.temperature == 0.0 {
            return argmax(logits);
        }
        let rng = &mut self.rng;
        candidates::with_candidates(logits, p.temperature, |c| draw(c, p, rng, draft))
    }
}

/// One draw from `c` under `p`'s top-k, top-p and min-p, verifying `draft` first when there
/// is one ([`Sampler::sample_or_accept`]).
fn draw(c: &mut Candidates<'_>, p: &SamplingParams, rng: &mut Rng, draft: Option<u32>) -> u32 {
    if p.top_k > 0 && p.top_k < c.len() {
        c.keep_top(p.top_k);
    }
    // Softmax over the survivors, in f64; top-p and min-p read the probabilities from
    // the most likely down (`c.prob(i)` sorts as far as they read).
    let mut keep = c.len();
    if p.top_p < 1.0 {
        let mut acc = 0.0;
        for i in 0..c.len() {
            acc += c.prob(i);
            if acc >= p.top_p as f64 {
                keep = i + 1;
                break;
            }
        }
    }
    if p.min_p > 0.0 {
        let floor = c.prob(0) * p.min_p as f64;
        let above = (0..keep).find(|&i| c.prob(i) < floor).unwrap_or(keep);
        keep = keep.min(above.max(1));
    }
    // The draw: a uniform number scaled by the kept mass, then a walk over the kept
    // candidates' unnormalized weights `exp(l - max)` until it is used up. A cut set
    // (top-k, top-p, min-p) is walked most likely first; the whole vocabulary is walked
    // in the order it lies (token order unless a cut sorted it), which draws from the
    // same distribution without sorting 150k tokens per draw.
    let mut total = c.kept_weight(keep);
    let mut rejected = None;
    if let Some(d) = draft {
        let q = c.weight_if_kept(d, keep);
        if rng.next_f64() * total < q {
            return d;
        }
        // Rejected: the residual max(0, p - 1[d]) is p without the draft.
        if q > 0.0 {
            total -= q;
            rejected = Some(d);
        }
        if total <= 0.0 {
            return d;
        }
    }
    c.walk(keep, rng.next_f64() * total, rejected)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_takes_first_maximum() {
        let mut s = Sampler::new(SamplingParams::default());
        assert_eq!(s.sample(&mut [0.1, 3.0, 3.0, -1.0], &[]), 1);
    }

    #[test]
    fn repetition_penalty_follows_transformers_sign_rule() {
        let mut s = Sampler::new(SamplingParams { repetition_penalty: 2.0, ..Default::default() });
        let mut logits = [4.0, 3.0, -1.0];
        assert_eq!(s.sample(&mut logits, &[0, 2]), 1);
        assert_eq!(logits, [2.0, 3.0, -2.0]);
    }

    #[test]
    fn presence_and_frequency_penalties_count_produced_tokens_only() {
        // Token 0 leads by 1.0; after it was produced once, a presence penalty of 1.5
        // hands the argmax to token 1. Prompt tokens (the context) are not counted.
        let mut s = Sampler::new(SamplingParams { presence_penalty: 1.5, ..Default::default() });
        assert_eq!(s.sample(&mut [2.0, 1.0, 0.0], &[0, 0, 0]), 0);
        assert_eq!(s.sample(&mut [2.0, 1.0, 0.0], &[0, 0, 0, 0]), 1);
        // Frequency: 0.4 per production; token 0 must be produced three times to lose.
        let mut s = Sampler::new(SamplingParams { frequency_penalty: 0.4, ..Default::default() });
        let picks: Vec<u32> = (0..4).map(|_| s.sample(&mut [2.0, 1.0, 0.0], &[])).collect();
        assert_eq!(picks, [0, 0, 0, 1]);
        assert!(SamplingParams { presence_penalty: 2.5, ..Default::default() }.validate().is_err());
    }

    #[test]
    fn logprobs_are_a_log_softmax_with_ordered_top() {
        let logits = [1.0f32, 3.0, 2.0, 3.0];
        let lp = TokenLogprobs::from_logits(&logits, 2, 3);
        let z: f64 = logits.iter().map(|&l| (l as f64).exp()).sum();
        assert!((lp.logprob as f64 - (2.0 - z.ln())).abs() < 1e-6);
        let ids: Vec<u32> = lp.top.iter().map(|t| t.0).collect();
        assert_eq!(ids, [1, 3, 2]);
        let total: f64 = (0..4).map(|t| (TokenLogprobs::from_logits(&logits, t, 0).logprob as f64).exp()).sum();
        assert!((total - 1.0).abs() < 1e-6);
    }

    #[test]
    fn seeded_sampling_is_reproducible_and_respects_top_k() {
        let params = SamplingParams { temperature: 1.0, top_k: 2, seed: 42, ..Default::default() };
        let logits = [1.0f32, 0.9, 0.8, 0.7];
        let draw = |params: &SamplingParams| {
            let mut s = Sampler::new(params.clone());
            (0..200).map(|_| s.sample(&mut logits.clone(), &[])).collect::<Vec<_>>()
        };
        let a = draw(&params);
        assert_eq!(a, draw(&params));
        assert!(a.iter().all(|&t| t < 2));
        assert!(a.contains(&0) && a.contains(&1));
    }

    /// The draw written plainly: every candidate sorted up front. A top-k, top-p or min-p
    /// setting walks the kept candidates most likely first; with none, the draw walks the
    /// whole vocabulary in token order. Weights are `exp(l - max)`, the mass they are drawn
    /// against summed in the order the sampler sums it (sorted under top-k, else token order).
    fn reference_draw(logits: &[f32], p: &SamplingParams, u: f64) -> u32 {
        let scaled: Vec<(u32, f32)> = logits.iter().enumerate().map(|(i, &l)| (i as u32, l / p.temperature)).collect();
        let mut c = scaled.clone();
        c.sort_unstable_by(candidates::by_logit);
        let top_k = p.top_k > 0 && p.top_k < c.len();
        if top_k {
            c.truncate(p.top_k);
        }
        let max = c[0].1 as f64;
        let weight = |l: f32| (l as f64 - max).exp();
        let sum: f64 =
            if top_k { c.iter().map(|x| weight(x.1)).sum() } else { scaled.iter().map(|x| weight(x.1)).sum() };
        let probs: Vec<f64> = c.iter().map(|x| weight(x.1) / sum).collect();
        let mut keep = probs.len();
        if p.top_p < 1.0 {
            let mut acc = 0.0;
            if let Some(i) = probs.iter().position(|q| {
                acc += q;
                acc >= p.top_p as f64
            }) {
                keep = i + 1;
            }
        }
        if p.min_p > 0.0 {
            let floor = probs[0] * p.min_p as f64;
            keep = keep.min(probs.iter().take_while(|&&q| q >= floor).count().max(1));
        }
        let cut = top_k || p.top_p < 1.0 || p.min_p > 0.0;
        let order: &[(u32, f32)] = if cut { &c[..keep] } else { &scaled };
        let total: f64 = if keep == c.len() { sum } else { order.iter().map(|x| weight(x.1)).sum() };
        let mut r = u * total;
        for &(t, l) in order {
            if r < weight(l) {
                return t;
            }
            r -= weight(l);
        }
        order[order.len() - 1].0
    }

    #[test]
    fn lazy_sorting_draws_what_the_plain_draw_draws() {
        // A 50k-token vocabulary with a peaked head and a long flat tail, as real logits.
        let mut rng = Rng::new(3);
        let logits: Vec<f32> = (0..50_000)
            .map(|i| {
                let u = rng.next_f64() as f32;
                if i % 997 == 0 {
                    8.0 + 4.0 * u
                } else {
                    6.0 * u - 3.0
                }
            })
            .collect();
        let settings = [
            SamplingParams { temperature: 1.0, ..Default::default() },
            SamplingParams { temperature: 0.7, top_p: 0.9, ..Default::default() },
            SamplingParams { temperature: 1.3, min_p: 0.05, ..Default::default() },
            SamplingParams { temperature: 0.8, top_k: 40, top_p: 0.95, min_p: 0.05, ..Default::default() },
            SamplingParams { temperature: 2.0, top_p: 0.5, ..Default::default() },
        ];
        for params in settings {
            for seed in 0..300 {
                let params = SamplingParams { seed, ..params.clone() };
                let mut s = Sampler::new(params.clone());
                let got = s.sample(&mut logits.clone(), &[]);
                let want = reference_draw(&logits, &params, Rng::new(seed).next_f64());
                assert_eq!(got, want, "{params:?}");
            }
        }
    }

    #[test]
    fn verifying_a_draft_keeps_the_distribution() {
        // Greedy: the argmax, whatever the draft.
        let mut g = Sampler::new(SamplingParams::default());
        assert_eq!(g.sample_or_accept(&mut [0.0, 2.0, 1.0], &[], 1), 1);
        assert_eq!(g.sample_or_accept(&mut [0.0, 2.0, 1.0], &[], 2), 1);
        // Sampled: the frequencies of accept-or-resample equal the target distribution,
        // for a likely draft, an unlikely one and one top-k cut away.
        let logits = [1.0f32, 0.0, -1.0, -3.0];
        let target: Vec<f64> = {
            let e: Vec<f64> = logits[..3].iter().map(|&l| (l as f64).exp()).collect();
            let z: f64 = e.iter().sum();
            e.iter().map(|x| x / z).collect()
        };
        for draft in [0u32, 2, 3] {
            let mut s = Sampler::new(SamplingParams { temperature: 1.0, top_k: 3, seed: 7, ..Default::default() });
            let n = 200_000;
            let mut counts = [0usize; 4];
            for _ in 0..n {
                counts[s.sample_or_accept(&mut logits.clone(), &[], draft) as usize] += 1;
            }
            assert_eq!(counts[3], 0, "draft {draft}: a token outside top-k was returned");
            for t in 0..3 {
                let f = counts[t] as f64 / n as f64;
                assert!((f - target[t]).abs() < 0.005, "draft {draft}: token {t} drawn {f}, target {}", target[t]);
            }
        }
    }

    #[test]
    fn uncut_draws_and_draft_checks_keep_the_distribution() {
        // No top-k, top-p or min-p: the draw walks the vocabulary in token order, and a
        // draft's check reads its weight by index; both must still give the softmax.
        let logits = [-1.0f32, 1.0, 0.0, -3.0, 0.5];
        let target: Vec<f64> = {
            let e: Vec<f64> = logits.iter().map(|&l| (l as f64).exp()).collect();
            let z: f64 = e.iter().sum();
            e.iter().map(|x| x / z).collect()
        };
        for draft in [None, Some(1u32), Some(3)] {
            let mut s = Sampler::new(SamplingParams { temperature: 1.0, seed: 11, ..Default::default() });
            let n = 200_000;
            let mut counts = [0usize; 5];
            for _ in 0..n {
                let t = match draft {
                    Some(d) => s.sample_or_accept(&mut logits.clone(), &[], d),
                    None => s.sample(&mut logits.clone(), &[]),
                };
                counts[t as usize] += 1;
            }
            for t in 0..5 {
                let f = counts[t] as f64 / n as f64;
                assert!((f - target[t]).abs() < 0.005, "draft {draft:?}: token {t} drawn {f}, target {}", target[t]);
            }
        }
    }

    #[test]
    fn a_draft_cut_by_top_p_is_never_returned() {
        // 200 tokens: token 0 holds 99.9% of the mass, so top-p 0.5 keeps it alone and a
        // draft of any other token must be rejected and resampled to token 0.
        let mut logits = vec![0.0f32; 200];
        logits[0] = 12.0;
        for seed in 0..200 {
            let mut s = Sampler::new(SamplingParams { temperature: 1.0, top_p: 0.5, seed, ..Default::default() });
            assert_eq!(s.sample_or_accept(&mut logits.clone(), &[], 1 + seed as u32 % 199), 0);
            assert_eq!(s.sample_or_accept(&mut logits.clone(), &[], 0), 0);
        }
    }

    #[test]
    fn top_p_and_min_p_cut_the_tail() {
        let logits = [5.0f32, 0.0, -5.0];
        let mut s = Sampler::new(SamplingParams { temperature: 1.0, top_p: 0.5, seed: 1, ..Default::default() });
        assert!((0..100).all(|_| s.sample(&mut logits.clone(), &[]) == 0));
        let mut s = Sampler::new(SamplingParams { temperature: 1.0, min_p: 0.1, seed: 1, ..Default::default() });
        assert!((0..100).all(|_| s.sample(&mut logits.clone(), &[]) == 0));
    }

    #[test]
    fn validation_names_the_parameter() {
        assert!(SamplingParams { top_p: 0.0, ..Default::default() }.validate().unwrap_err().contains("top-p"));
        assert!(SamplingParams { temperature: -1.0, ..Default::default() }
            .validate()
            .unwrap_err()
            .contains("temperature"));
    }
}
