//! `--speculate draft`: a draft model proposes, the target verifies. Greedy tokens are the
//! ones decoding without speculation gives, alone and under 16-way concurrency, whether the
//! draft model agrees with the target (the same weights: every draft accepted) or not (other
//! weights, the same tokenizer); a draft model with another vocabulary is refused by name.

mod common;
use common::tiny_file;

use loupe_core::SplitMix64;
use loupe_models::tiny::TinyLlama;
use loupe_runtime::{
    BatchConfig, BatchEngine, Completion, DraftModel, Drafter, Engine, LoadOptions, RuntimeError, SamplingParams,
    SeqRequest, SpeculationConfig,
};

fn load(spec: &TinyLlama) -> Engine {
    Engine::load(tiny_file(spec), LoadOptions::default()).expect("loading a tiny model")
}

fn requests(n: usize) -> Vec<SeqRequest> {
    let mut rng = SplitMix64::new(7);
    (0..n)
        .map(|i| {
            let len = 2 + (rng.next_u64() % 30) as usize;
            let prompt = (0..len).map(|_| 3 + (rng.next_u64() % 400) as u32).collect();
            SeqRequest::new(prompt, 10 + i % 9, SamplingParams::default(), vec![])
        })
        .collect()
}

fn tokens(c: &[Completion]) -> Vec<Vec<u32>> {
    c.iter().map(|c| c.tokens.clone()).collect()
}

fn with_draft(draft: &DraftModel, max_draft: usize) -> BatchConfig {
    BatchConfig {
        speculation: Some(SpeculationConfig { drafter: Drafter::Model(draft.clone()), max_draft }),
        max_seqs: 16,
        prefix_cache: false,
        ..BatchConfig::default()
    }
}

#[test]
fn greedy_tokens_are_the_targets_with_any_draft_model() {
    let target = load(&TinyLlama::default());
    let reqs = requests(16);
    let plain = BatchConfig { max_seqs: 16, prefix_cache: false, ..BatchConfig::default() };
    let want = tokens(&BatchEngine::new(&target, plain).unwrap().run_all(reqs.clone()).unwrap());
    let same = DraftModel::new(load(&TinyLlama::default()));
    let other = DraftModel::new(load(&TinyLlama { seed: 99, ..TinyLlama::default() }));
    for (name, draft) in [("the same weights", &same), ("other weights", &other)] {
        for max_draft in [1, 4] {
            let mut b = BatchEngine::new(&target, with_draft(draft, max_draft)).unwrap();
            assert_eq!(tokens(&b.run_all(reqs.clone()).unwrap()), want, "{name}, up to {max_draft} drafts, 16 at once");
            let s = b.stats().spec;
            assert!(s.verify_steps > 0 && s.draft_tokens >= s.verify_steps, "{name}: {s:?}");
            if std::ptr::eq(draft, &same) {
                // The target's own weights draft what it decodes, up to near-ties of the
                // random weights that the draft's multi-token catch-up passes (prefill
                // arithmetic) can tip the other way.
                assert!(s.accepted_tokens * 10 >= s.draft_tokens * 9, "the same weights: {s:?}");
            }
            assert_eq!(b.stats().blocks_in_use, 0);
            // One at a time too.
            for (r, w) in reqs.iter().zip(&want).take(3) {
                let mut b = BatchEngine::new(&target, with_draft(draft, max_draft)).unwrap();
                assert_eq!(&b.run_all(vec![r.clone()]).unwrap()[0].tokens, w, "{name}, alone");
            }
        }
    }
    let s = {
        let mut b = BatchEngine::new(&target, with_draft(&other, 4)).unwrap();
        b.run_all(reqs).unwrap();
        b.stats().spec
    };
    assert!(s.accepted_tokens < s.draft_tokens, "random other weights should miss sometimes: {s:?}");
}

#[test]
fn a_draft_model_with_another_tokenizer_is_refused() {
    let target = load(&TinyLlama::default());
    let spec = TinyLlama { merges: TinyLlama::default().merges / 2, ..TinyLlama::default() };
    let draft = DraftModel::new(load(&spec));
    match BatchEngine::new(&target, with_draft(&draft, 3)) {
        Err(e @ RuntimeError::DraftModel { .. }) => {
            let msg = e.to_string();
            assert!(msg.starts_with("draft model ") && msg.contains("the target's tokenizer"), "{msg}");
        }
        Err(e) => panic!("another error: {e}"),
        Ok(_) => panic!("a draft model with another vocabulary was accepted"),
    }
}
