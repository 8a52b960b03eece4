//! The scheduler of the batched engine: which sequences a step runs, how many tokens each
//! (prefill chunks under the token budget, a generating sequence's token and its drafts),
//! preempting the newest when blocks run out, admitting queued requests in order.

use std::time::Instant;

use super::{speculate, BatchEngine, SeqEvent};
use crate::FinishReason;

impl BatchEngine<'_> {
    /// `f`'s result, with its time on the step's clock (when there is one) as drafting
    /// where it did something (`Some`).
    fn timed_drafting<T>(&mut self, f: impl FnOnce(&mut Self) -> Option<T>) -> Option<T> {
        let since = self.clock.is_some().then(Instant::now);
        let out = f(self)?;
        if let (Some(clock), Some(since)) = (self.clock.as_mut(), since) {
            clock.drafted(since);
        }
        Some(out)
    }

    /// The draft running sequence `i` verifies this step, within `budget` step tokens: none
    /// unless speculation is on and the sequence generates (its last token is not a prompt
    /// token); every step produces one token, drafts are the ones beyond. The drafter's
    /// time goes on the step's clock when there is one.
    fn draft_for(&mut self, i: usize, budget: usize) -> Vec<u32> {
        self.timed_drafting(|engine| engine.consult_drafter(i, budget)).unwrap_or_default()
    }

    /// Runs running sequence `i`'s prompt through the draft model, when there is one and
    /// the sequence's prompt runs this step ([`DraftModel::prefill`]; a no-op once the draft
    /// cache holds the prompt, as on a long prompt's later chunks): its time goes on the
    /// step's clock as drafting.
    ///
    /// [`DraftModel::prefill`]: super::draft_model::DraftModel::prefill
    fn prefill_draft(&mut self, i: usize) {
        self.timed_drafting(|engine| {
            let (Some(config), seq) = (engine.config.speculation.as_ref(), &mut engine.running[i]) else { return None };
            let speculate::Drafter::Model(model) = &config.drafter else { return None };
            if !seq.speculate || seq.generated() != 0 {
                return None;
            }
            model.prefill(&mut seq.draft_cache, &seq.tokens);
            Some(())
        });
    }

    /// [`Self::draft_for`]'s draft, `None` where the drafter is not asked.
    fn consult_drafter(&mut self, i: usize, budget: usize) -> Option<Vec<u32>> {
        let (Some(config), seq) = (self.config.speculation.as_ref(), &mut self.running[i]) else { return None };
        // A grammar that fast-forwards appends forced tokens after the sampled one, which a
        // draft's rows cannot know of: no drafts there.
        if !seq.speculate || (seq.constraint.is_some() && seq.fast_forward) || seq.generated() == 0 {
            return None;
        }
        let k = seq
            .spec
            .limit
            .min(seq.max_tokens.saturating_sub(seq.generated() + 1))
            .min(self.graph.context_length.saturating_sub(seq.tokens.len() + 1))
            .min(budget.saturating_sub(1));
        Some(speculate::draft(config, &mut seq.draft_cache, &seq.tokens, k))
    }

    /// Plans one step: which sequences run how many tokens. Running sequences go first
    /// (oldest first), preempting the newest when blocks run out; then queued ones join in
    /// order while the token budget, `max_seqs` and the blocks allow.
    pub(super) fn schedule(&mut self, events: &mut Vec<SeqEvent>) -> Vec<usize> {
        let mut budget = self.config.max_batch_tokens;
        let mut plan: Vec<usize> = Vec::new(); // tokens per running sequence, by index
        let mut i = 0;
        while i < self.running.len() {
            let want = self.running[i].tokens.len() - self.running[i].computed;
            // A generating sequence's one token, and the drafts that follow it.
            let draft = if want == 1 { self.draft_for(i, budget) } else { Vec::new() };
            if want > 1 {
                self.prefill_draft(i);
            }
            let n = (want + draft.len()).min(budget);
            self.running[i].draft = draft;
            if n == 0 {
                plan.push(0);
                i += 1;
                continue;
            }
            let positions = self.running[i].computed + n;
            loop {
                if Self::grow(&mut self.blocks, &mut self.running[i], positions) {
                    plan.push(n);
                    budget -= n;
                    i += 1;
                    break;
                }
                if self.preempt_newest(i) {
                    continue;
                }
                if i > 0 {
                    // It is the newest itself: older sequences keep their blocks, it waits.
                    self.preempt_newest(i - 1);
                    break;
                }
                {
                    // Alone and still too big: the cache is full for this sequence.
                    let seq = self.running.remove(i);
                    events.push(SeqEvent::Finished { id: seq.id, reason: FinishReason::Length, usage: seq.usage() });
                    self.release(seq);
                    break;
                }
            }
        }
        while budget > 0 && self.running.len() < self.config.max_seqs {
            let Some(mut seq) = self.waiting.pop_front() else { break };
            if seq.blocks.is_empty() && seq.computed == 0 {
                // At least the last token is computed, for its logits.
                let max_blocks = (seq.tokens.len() - 1) / self.config.block_size;
                self.claim_cached_prefix(&mut seq, max_blocks);
            }
            let n = (seq.tokens.len() - seq.computed).min(budget);
            let positions = seq.computed + n;
            if !Self::grow(&mut self.blocks, &mut seq, positions) {
                // FIFO: nobody overtakes it. It gives back what it claimed (the blocks stay
                // cached) so the running sequences can use the room, and waits.
                Self::give_back(&mut self.blocks, &mut seq);
                self.waiting.push_front(seq);
                break;
            }
            if seq.cached_tokens.is_none() {
                let hits = seq.computed / self.config.block_size;
                let looked_up =
                    if self.config.prefix_cache { (seq.tokens.len() - 1) / self.config.block_size } else { 0 };
                self.blocks.record_lookup(hits, looked_up - hits.min(looked_up));
                seq.cached_tokens = Some(seq.computed.min(seq.prompt_len));
            }
            budget -= n;
            self.running.push(seq);
            plan.push(n);
            self.prefill_draft(self.running.len() - 1);
        }
        plan
    }
}
