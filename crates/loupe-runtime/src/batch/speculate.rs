//! Speculative decoding in the batched engine: a drafter proposes the next tokens of a
//! generating sequence, and one step of the target verifies them all ([`BatchSpan::logits`]
//! rows of logits, each computed with a one-token decode's arithmetic). The tokens a
//! sequence gets are the ones it would get without speculation: greedy, bit for bit (every
//! verified row is the row a one-token step would have computed, from the same keys and
//! values); sampled, by exact rejection sampling ([`crate::Sampler::sample_or_accept`]).
//!
//! Drafter: prompt lookup ([`ngram_draft`]): the continuation of the most recent earlier
//! occurrence of the sequence's last n tokens (n from `max_ngram` down to `min_ngram`), in
//! the prompt or the output so far. No second model; it pays off when the answer copies the
//! prompt (code edits, retrieval answers, reformatting). How many tokens it may propose
//! adapts to what was accepted ([`SpecState`]).
//!
//! [`BatchSpan::logits`]: loupe_graph::BatchSpan::logits

use super::draft_model::{DraftModel, DraftState};
use crate::{Constraint, RuntimeError, Sampler, TokenLogprobs};

/// What proposes draft tokens.
#[derive(Debug, Clone)]
pub enum Drafter {
    /// Prompt lookup: n-grams of `min_ngram..=max_ngram` tokens.
    Ngram { min_ngram: usize, max_ngram: usize },
    /// A smaller model with the target's tokenizer, greedy ([`super::draft_model`]).
    Model(DraftModel),
    /// Any function of the tokens so far and the most it may propose (tests use one that
    /// proposes tokens a grammar forbids).
    Custom(fn(&[u32], usize) -> Vec<u32>),
}

impl Drafter {
    /// The most drafts a step verifies when the user does not say (`loupe --draft-tokens`'
    /// default): prompt lookup's cost nothing to propose and a copied run is accepted whole (on
    /// the code edit of `scripts/bench-speculation`, 7.2 tokens per verification at 8 against
    /// 4.6 at 5); a draft model pays a pass per proposal.
    pub const fn default_max_draft(free_drafts: bool) -> usize {
        if free_drafts {
            8
        } else {
            5
        }
    }

    /// Whether proposing a draft token costs nothing next to a step of the target (prompt
    /// lookup, a test's function), unlike a draft model's pass per token.
    pub fn drafts_are_free(&self) -> bool {
        !matches!(self, Drafter::Model(_))
    }

    /// Its name in flags, logs and reports: `ngram`, `draft`, `custom`.
    pub fn name(&self) -> &'static str {
        match self {
            Drafter::Ngram { .. } => "ngram",
            Drafter::Model(_) => "draft",
            Drafter::Custom(_) => "custom",
        }
    }
}

/// Speculative decoding's settings ([`crate::BatchConfig::speculation`]).
#[derive(Debug, Clone)]
pub struct SpeculationConfig {
    pub drafter: Drafter,
    /// The most draft tokens a sequence verifies in one step (vLLM's
    /// `num_speculative_tokens`); the number used adapts below it.
    pub max_draft: usize,
}

impl Default for SpeculationConfig {
    fn default() -> Self {
        // Prompt lookup as vLLM's `ngram` method sets it up by default (lookup of 1..=5
        // tokens would match single common tokens everywhere; 2..=4 keeps the drafts that
        // continue a real copy).
        let drafter = Drafter::Ngram { min_ngram: 2, max_ngram: 4 };
        SpeculationConfig { max_draft: Drafter::default_max_draft(drafter.drafts_are_free()), drafter }
    }
}

/// Counters of speculation over a batched engine's life ([`crate::BatchStats::spec`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SpecStats {
    /// Steps of a sequence that verified at least one draft token.
    pub verify_steps: u64,
    /// Draft tokens proposed and verified.
    pub draft_tokens: u64,
    /// Draft tokens accepted (tokens produced without a step of their own).
    pub accepted_tokens: u64,
}

impl SpecStats {
    /// Accepted draft tokens per draft token (0 before any).
    pub fn acceptance_rate(&self) -> f64 {
        if self.draft_tokens == 0 {
            0.0
        } else {
            self.accepted_tokens as f64 / self.draft_tokens as f64
        }
    }

    /// Tokens produced per verification step: the accepted drafts plus the one token every
    /// step produces.
    pub fn tokens_per_verify_step(&self) -> f64 {
        if self.verify_steps == 0 {
            0.0
        } else {
            (self.accepted_tokens + self.verify_steps) as f64 / self.verify_steps as f64
        }
    }
}

/// A sequence's speculation: how many tokens it may draft next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SpecState {
    pub(crate) limit: usize,
}

impl SpecState {
    pub(crate) fn new(config: &SpeculationConfig) -> SpecState {
        SpecState { limit: config.max_draft.clamp(1, 2) }
    }

    /// After a verification of `drafted` tokens of which `accepted` were: more next time when
    /// all were (twice as many where drafts cost nothing to propose, `free_drafts`: prompt
    /// lookup reaches a long copied run in a few steps; one more where each costs a pass of
    /// a draft model), else as many as were accepted plus one (at least 1).
    pub(crate) fn update(&mut self, drafted: usize, accepted: usize, max: usize, free_drafts: bool) {
        let grown = if free_drafts { self.limit * 2 } else { self.limit + 1 };
        self.limit = if accepted == drafted { grown.min(max) } else { (accepted + 1).min(max) }.max(1);
    }
}

/// The draft a generating sequence verifies next: up to `k` tokens (the caller's bound:
/// its adaptive limit, what `max_tokens`, the context and the step's budget leave);
/// `state` is the sequence's draft-model cache (unused by the other drafters).
pub(crate) fn draft(config: &SpeculationConfig, state: &mut Option<DraftState>, tokens: &[u32], k: usize) -> Vec<u32> {
    match &config.drafter {
        Drafter::Ngram { min_ngram, max_ngram } => ngram_draft(tokens, *min_ngram, *max_ngram, k),
        Drafter::Model(model) => model.draft(state, tokens, k),
        Drafter::Custom(f) => {
            let mut d = f(tokens, k);
            d.truncate(k);
            d
        }
    }
}

/// What [`verify`] samples with: a sequence's tokens so far, its grammar, sampler, stop
/// ids, and how many log-probabilities it reports.
pub(crate) struct Verifier<'s> {
    pub(crate) tokens: &'s [u32],
    pub(crate) constraint: Option<&'s mut Constraint>,
    pub(crate) sampler: &'s mut Sampler,
    pub(crate) stop_ids: &'s [u32],
    pub(crate) logprobs: Option<usize>,
}

/// Samples a sequence's tokens from its rows of logits (`draft.len() + 1` rows of
/// `vocab`): one per row while the drafts are accepted, so the accepted drafts and then the
/// token of the first row that did not accept (or, all accepted, of the last row). Stops
/// after a stop token. With a grammar, each row is masked by the grammar's state after the
/// tokens before it (the grammar consumes each accepted draft here, so a draft it forbids
/// is never accepted, and it stops when the grammar is complete); the last token, unless it
/// is an accepted draft, is left for the caller to consume. Returns the tokens (with
/// log-probabilities when asked) and how many drafts were accepted.
pub(crate) fn verify(
    v: Verifier<'_>,
    draft: &[u32],
    logits: &[f32],
    vocab: usize,
    row: &mut Vec<f32>,
) -> Result<Verified, RuntimeError> {
    let Verifier { tokens, mut constraint, sampler, stop_ids, logprobs } = v;
    let mut out = Vec::with_capacity(draft.len() + 1);
    // The context the sampler's penalties see: the tokens so far and the accepted drafts.
    let mut context = if draft.is_empty() { Vec::new() } else { tokens.to_vec() };
    for (j, raw) in logits.chunks_exact(vocab.max(1)).enumerate().take(draft.len() + 1) {
        row.clear();
        row.extend_from_slice(raw);
        if let Some(c) = constraint.as_deref_mut() {
            c.apply(row)?;
        }
        let ctx: &[u32] = if draft.is_empty() { tokens } else { &context };
        let token = match draft.get(j) {
            Some(&d) => sampler.sample_or_accept(row, ctx, d),
            None => sampler.sample(row, ctx),
        };
        out.push((token, logprobs.map(|n| TokenLogprobs::from_logits(raw, token, n))));
        if draft.get(j) != Some(&token) || stop_ids.contains(&token) {
            break;
        }
        if let Some(c) = constraint.as_deref_mut() {
            c.advance(token, false)?;
            if c.is_finished() {
                break;
            }
        }
        context.push(token);
    }
    let accepted = out.iter().zip(draft).take_while(|((t, _), d)| t == *d).count();
    Ok((out, accepted))
}

/// A sequence's token rows as [`verify`] samples them, with log-probabilities when asked,
/// and how many drafts were accepted.
pub(crate) type Verified = (Vec<(u32, Option<TokenLogprobs>)>, usize);

/// One sequence's share of a step's sampling: its verifier, its drafts and its logits rows.
pub(crate) struct SampleJob<'s> {
    pub(crate) verifier: Verifier<'s>,
    pub(crate) draft: Vec<u32>,
    pub(crate) logits: &'s [f32],
}

thread_local! {
    /// The row of logits [`verify`] masks and penalizes, per compute thread.
    static ROW: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// [`verify`] for every job, each on its own compute-pool task: a sampled row of a
/// 150k-token vocabulary costs about a millisecond, which one thread paid for every
/// sequence while the others waited (BENCHMARKS.md, "Serving"). Each sequence has its own
/// sampler and random state, so which thread samples it changes nothing. Returns each job's
/// drafts and result, in job order.
pub(crate) fn verify_all(jobs: Vec<SampleJob<'_>>, vocab: usize) -> Vec<(Vec<u32>, Result<Verified, RuntimeError>)> {
    type Slot<'s> = (Option<SampleJob<'s>>, Option<(Vec<u32>, Result<Verified, RuntimeError>)>);
    let slots: Vec<std::sync::Mutex<Slot<'_>>> =
        jobs.into_iter().map(|job| std::sync::Mutex::new((Some(job), None))).collect();
    let run = |t: usize| {
        let mut slot = slots[t].lock().unwrap_or_else(|e| e.into_inner());
        if let Some(SampleJob { verifier, draft, logits }) = slot.0.take() {
            let out = ROW.with(|row| verify(verifier, &draft, logits, vocab, &mut row.borrow_mut()));
            slot.1 = Some((draft, out));
        }
    };
    // (One job runs inline: the pool runs a single task on the calling thread.)
    loupe_tensor::pool::run(slots.len(), &run);
    slots
        .into_iter()
        .map(|slot| {
            let (_, done) = slot.into_inner().unwrap_or_else(|e| e.into_inner());
            done.unwrap_or_else(|| {
                (Vec::new(), Err(RuntimeError::InvalidRequest("a sampling task did not run".into())))
            })
        })
        .collect()
}

/// Prompt lookup: the `k` tokens that followed the most recent earlier occurrence of the
/// last `n` tokens of `tokens` (copied on past the end, so a repetition continues), trying
/// `n` from `max_ngram` down to `min_ngram`; empty when none occurs.
pub fn ngram_draft(tokens: &[u32], min_ngram: usize, max_ngram: usize, k: usize) -> Vec<u32> {
    let len = tokens.len();
    if k == 0 || min_ngram == 0 {
        return Vec::new();
    }
    for n in (min_ngram..=max_ngram).rev() {
        if len < n + 1 {
            continue;
        }
        let suffix = &tokens[len - n..];
        // The most recent occurrence that ends before the suffix starts to repeat itself.
        let found = (0..len - n).rev().find(|&s| &tokens[s..s + n] == suffix);
        if let Some(s) = found {
            // Copy what followed, overlapping past the end as LZ77 does: a match one
            // period back in a repeating stretch drafts the repetition further.
            let from = s + n;
            let mut draft = Vec::with_capacity(k);
            for j in 0..k {
                let at = from + j;
                draft.push(if at < len { tokens[at] } else { draft[at - len] });
            }
            return draft;
        }
    }
    Vec::new()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompt_lookup_continues_the_latest_match_of_the_longest_ngram() {
        // "a b c d e ... a b c" -> "d e"
        let t = [1, 2, 3, 4, 5, 9, 1, 2, 3];
        assert_eq!(ngram_draft(&t, 2, 4, 2), [4, 5]);
        // Past the end the copy overlaps itself: "... a b c" continues "d e 9 a b c d e".
        assert_eq!(ngram_draft(&t, 2, 4, 10), [4, 5, 9, 1, 2, 3, 4, 5, 9, 1]);
        // The most recent occurrence wins.
        let t = [7, 8, 1, 7, 8, 2, 7, 8];
        assert_eq!(ngram_draft(&t, 2, 2, 1), [2]);
        // A longer n-gram beats a more recent shorter one.
        let t = [5, 7, 8, 1, 6, 7, 8, 2, 5, 7, 8];
        assert_eq!(ngram_draft(&t, 2, 3, 1), [1]);
        // Nothing to continue.
        assert!(ngram_draft(&[1, 2, 3, 4], 2, 4, 3).is_empty());
        assert!(ngram_draft(&[1, 1], 2, 4, 3).is_empty());
        assert!(ngram_draft(&[], 2, 4, 3).is_empty());
        assert_eq!(ngram_draft(&[1, 1, 1], 2, 2, 3), [1, 1, 1]);
        assert_eq!(ngram_draft(&[4, 1, 2, 1, 2], 2, 2, 5), [1, 2, 1, 2, 1]);
        assert!(ngram_draft(&[1, 2, 1, 2], 2, 4, 0).is_empty());
    }

    #[test]
    fn the_draft_limit_follows_acceptance() {
        let config = SpeculationConfig { max_draft: 6, ..SpeculationConfig::default() };
        assert!(config.drafter.drafts_are_free());
        let mut s = SpecState::new(&config);
        assert_eq!(s.limit, 2);
        // (drafted, accepted, drafts free, the limit after), up to a most of 6, in sequence.
        let steps = [
            // All accepted: twice as many, up to the most.
            (2, 2, true, 4),
            (4, 4, true, 6),
            (6, 6, true, 6),
            // A draft cut short by what was left (the drafter found fewer) and all accepted.
            (3, 3, true, 6),
            // A rejection: what was accepted plus one.
            (6, 1, true, 2),
            (2, 0, true, 1),
            (1, 1, true, 2),
            // Drafts that cost a pass each: one more at a time.
            (2, 2, false, 3),
            (3, 3, false, 4),
            (4, 2, false, 3),
        ];
        for (i, (drafted, accepted, free, want)) in steps.into_iter().enumerate() {
            s.update(drafted, accepted, 6, free);
            assert_eq!(s.limit, want, "step {i}: {accepted} of {drafted} accepted, free drafts {free}");
        }
        let stats = SpecStats { verify_steps: 4, draft_tokens: 10, accepted_tokens: 6 };
        assert!((stats.acceptance_rate() - 0.6).abs() < 1e-12 && (stats.tokens_per_verify_step() - 2.5).abs() < 1e-12);
    }
}
