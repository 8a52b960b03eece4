//! The draft-model drafter (`--speculate draft --draft-model PATH`): a smaller model with the
//! target's tokenizer proposes a sequence's next tokens greedily, one single-token pass
//! each, on a KV cache of its own per sequence (the single-sequence engine's contiguous
//! cache, grown as the sequence grows). The target verifies the draft as it verifies prompt
//! lookup's (the speculate module): the draft changes how many tokens a step produces, never
//! which, so greedy output stays identical bit for bit and sampled output keeps its
//! distribution (a greedy draft is a proposal made with certainty, which exact rejection
//! sampling accepts with the target's own probability).
//!
//! Between steps the draft's cache keeps what it has seen; each call cuts it back to the
//! longest prefix it shares with the sequence's tokens (a rejected draft is cut there) and
//! runs the rest (the prompt on the first call, then the tokens the target produced).

use std::path::PathBuf;
use std::sync::Arc;

use loupe_graph::exec::RunOptions;
use loupe_graph::{Executor, KvCache};

use crate::sampling::argmax;
use crate::{Engine, RuntimeError};

/// A loaded draft model, shared by every sequence of a batched engine (each has its own
/// [`DraftState`]).
#[derive(Clone)]
pub struct DraftModel {
    engine: Arc<Engine>,
}

impl std::fmt::Debug for DraftModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DraftModel({})", self.engine.path().display())
    }
}

/// A sequence's draft cache: the tokens it holds keys and values for, in order.
pub(crate) struct DraftState {
    executor: Executor,
    kv: KvCache,
    fed: Vec<u32>,
}

impl DraftModel {
    /// Wraps a loaded model as a drafter. Whether it fits a target is checked when a
    /// batched engine over that target starts ([`DraftModel::check_fits`]).
    pub fn new(engine: Engine) -> DraftModel {
        DraftModel { engine: Arc::new(engine) }
    }

    /// The draft model's engine.
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// Refuses a draft model whose tokens mean other things than the target's: a different
    /// vocabulary (size, or any token's text), other special ids (BOS, EOS), or an
    /// embedding wider than the target's (its drafts could name ids the target has no row
    /// for). Names the first difference.
    pub fn check_fits(&self, target: &Engine) -> Result<(), RuntimeError> {
        let refuse = |reason: String| RuntimeError::DraftModel { path: self.path(), reason };
        let (draft_tok, target_tok) = (self.engine.tokenizer(), target.tokenizer());
        if draft_tok.vocab_size() != target_tok.vocab_size() {
            return Err(refuse(format!(
                "its vocabulary has {} tokens, the target's {}: a draft model needs the target's tokenizer",
                draft_tok.vocab_size(),
                target_tok.vocab_size()
            )));
        }
        for id in 0..draft_tok.vocab_size() as u32 {
            let (d, t) = (draft_tok.token_to_str(id), target_tok.token_to_str(id));
            if d != t {
                return Err(refuse(format!(
                    "token {id} is {} in the draft model and {} in the target: a draft model needs the target's tokenizer",
                    d.as_deref().map_or("missing".to_string(), |s| format!("{s:?}")),
                    t.as_deref().map_or("missing".to_string(), |s| format!("{s:?}"))
                )));
            }
        }
        if draft_tok.bos_id() != target_tok.bos_id() || draft_tok.eos_ids() != target_tok.eos_ids() {
            return Err(refuse(format!(
                "its special ids differ from the target's (BOS {:?} / EOS {:?}, target BOS {:?} / EOS {:?})",
                draft_tok.bos_id(),
                draft_tok.eos_ids(),
                target_tok.bos_id(),
                target_tok.eos_ids()
            )));
        }
        let (rows, target_rows) = (self.engine.config().vocab_size(), target.config().vocab_size());
        if rows > target_rows {
            return Err(refuse(format!(
                "its embedding has {rows} rows, more than the target's {target_rows}: its drafts could name tokens the target has none for"
            )));
        }
        Ok(())
    }

    fn path(&self) -> PathBuf {
        self.engine.path().to_path_buf()
    }

    /// Runs `tokens` (a sequence's prompt) into its draft cache, so that the first draft
    /// after the prompt costs the draft model one single-token pass rather than the whole
    /// prompt: the batched engine calls this in the step that starts the prompt, where the
    /// draft model's prefill joins the target's (time to first token) instead of the first
    /// decode step. A failed pass leaves the cache empty (the first draft then runs it all).
    pub(crate) fn prefill(&self, state: &mut Option<DraftState>, tokens: &[u32]) {
        if !tokens.is_empty() && tokens.len() <= self.engine.graph().context_length {
            let _ = self.catch_up(state, tokens, tokens.len());
        }
    }

    /// Up to `k` draft tokens to follow `tokens`, from the draft model's greedy choices,
    /// `state` holding (or, on the first call, made to hold) the sequence's draft cache. A
    /// draft stops short where the draft model's context ends or a pass fails (the step
    /// then verifies fewer tokens, or none).
    pub(crate) fn draft(&self, state: &mut Option<DraftState>, tokens: &[u32], k: usize) -> Vec<u32> {
        let graph = self.engine.graph();
        let room = graph.context_length.saturating_sub(tokens.len());
        let k = k.min(room);
        if k == 0 || tokens.is_empty() {
            return Vec::new();
        }
        // Keep the shared prefix, less one token when it is all of `tokens`: the pass
        // needs a token to run to have the next logits.
        let Some((state, first)) = self.catch_up(state, tokens, tokens.len() - 1) else { return Vec::new() };
        let mut draft = Vec::with_capacity(k);
        draft.push(first);
        let mut last = [first];
        while draft.len() < k {
            let run = state.executor.run(graph, &last, &mut state.kv, RunOptions { all_logits: false }, None);
            let Ok(logits) = run else {
                // The cache no longer matches `fed` past a failed pass: start over next time.
                state.kv.truncate(0);
                state.fed.clear();
                break;
            };
            let token = argmax(logits);
            state.fed.push(last[0]);
            draft.push(token);
            last[0] = token;
        }
        draft
    }

    /// Cuts `state`'s cache back to the prefix it shares with `tokens` (at most `keep`
    /// tokens of it) and runs the rest in one pass: the cache then holds all of `tokens`,
    /// and the draft model's greedy next token is returned. `None` where there is nothing
    /// to run (the cache untouched) or the pass fails (the cache emptied).
    fn catch_up<'s>(
        &self,
        state: &'s mut Option<DraftState>,
        tokens: &[u32],
        keep: usize,
    ) -> Option<(&'s mut DraftState, u32)> {
        let graph = self.engine.graph();
        let state = state.get_or_insert_with(|| DraftState {
            executor: Executor::new(graph, self.engine.debug()),
            kv: KvCache::with_dtype(graph.kv_layers, graph.kv_width, graph.context_length, graph.kv_dtype),
            fed: Vec::new(),
        });
        let shared = state.fed.iter().zip(tokens).take_while(|(a, b)| a == b).count().min(keep);
        state.kv.truncate(shared);
        state.fed.truncate(shared);
        let next = &tokens[shared..];
        if next.is_empty() {
            return None;
        }
        match state.executor.run(graph, next, &mut state.kv, RunOptions { all_logits: false }, None) {
            Ok(logits) => {
                let token = argmax(logits);
                state.fed.extend_from_slice(next);
                Some((state, token))
            }
            Err(_) => {
                state.kv.truncate(0);
                state.fed.clear();
                None
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::LoadOptions;
    use loupe_models::tiny::{write_tiny_llama_gguf, TinyLlama};

    fn tiny(dir: &std::path::Path, name: &str, spec: &TinyLlama) -> Engine {
        let path = dir.join(name);
        write_tiny_llama_gguf(&path, spec).unwrap();
        Engine::load(&path, LoadOptions::default()).unwrap()
    }

    #[test]
    fn drafts_are_the_draft_models_greedy_continuation_whatever_its_cache_held() {
        let dir = tempfile::tempdir().unwrap();
        let spec = TinyLlama::default();
        let model = DraftModel::new(tiny(dir.path(), "draft.gguf", &spec));
        let reference = tiny(dir.path(), "same.gguf", &spec);
        let prompt: Vec<u32> = vec![5, 17, 42, 9, 100, 3];
        // The greedy continuation, one token at a time from scratch.
        let mut expect = prompt.clone();
        for _ in 0..4 {
            let mut s = crate::Session::new(reference.graph(), 64, &Default::default());
            let logits = s.forward(&expect, false, None).unwrap();
            expect.push(argmax(logits));
        }
        let mut state = None;
        assert_eq!(model.draft(&mut state, &prompt, 4), expect[6..10]);
        // The target took two of the drafts and then its own token: the cache is cut back.
        let mut taken = expect[..8].to_vec();
        taken.push(7);
        let mut fresh = None;
        assert_eq!(model.draft(&mut state, &taken, 3), model.draft(&mut fresh, &taken, 3));
        // All drafts accepted (the cache holds all but the last draft): still the same.
        let mut fresh = None;
        assert_eq!(model.draft(&mut state, &expect[..10], 2), model.draft(&mut fresh, &expect[..10], 2));
        assert!(model.draft(&mut state, &[], 3).is_empty());
        assert!(model.draft(&mut state, &prompt, 0).is_empty());
        // A prompt run in ahead (the engine's prompt step) changes no draft.
        let mut primed = None;
        model.prefill(&mut primed, &prompt);
        assert_eq!(primed.as_ref().map(|s| s.fed.len()), Some(prompt.len()));
        let mut generated = prompt.clone();
        generated.push(expect[6]);
        assert_eq!(model.draft(&mut primed, &generated, 3), expect[7..10]);
    }

    #[test]
    fn a_draft_model_with_another_vocabulary_is_refused_by_its_difference() {
        let dir = tempfile::tempdir().unwrap();
        let target = tiny(dir.path(), "target.gguf", &TinyLlama::default());
        let same_vocab = DraftModel::new(tiny(dir.path(), "seed.gguf", &TinyLlama { seed: 7, ..TinyLlama::default() }));
        same_vocab.check_fits(&target).expect("other weights, the same tokenizer");
        let spec = TinyLlama { merges: TinyLlama::default().merges - 1, ..TinyLlama::default() };
        let other = DraftModel::new(tiny(dir.path(), "other.gguf", &spec));
        let err = other.check_fits(&target).unwrap_err().to_string();
        assert!(err.contains("other.gguf") && err.contains("vocabulary has"), "{err}");
    }
}
