//! Speculation's observability on the tiny random-weight Llama: the per-step JSON-lines log
//! (`BatchConfig::speculation_log`) accounts for every produced token and every counter, and
//! a profiled engine splits its steps into drafting, verifying and plain phases.

mod common;
use common::tiny_file;

use std::collections::BTreeMap;

use loupe_graph::Profiler;
use loupe_runtime::{
    BatchConfig, BatchEngine, Engine, LoadOptions, RuntimeError, SamplingParams, SeqRequest, SpeculationConfig,
    PHASE_DECODE, PHASE_DRAFT, PHASE_PROMPT, PHASE_VERIFY,
};

fn engine(profiler: Option<Profiler>) -> Engine {
    let path = tiny_file(&loupe_models::tiny::TinyLlama::default());
    Engine::load(path, LoadOptions { profiler, ..LoadOptions::default() }).expect("loading the tiny model")
}

/// Greedy requests whose prompts repeat a short pattern, so prompt lookup drafts (and the
/// random model sometimes continues the pattern, sometimes not).
fn requests() -> Vec<SeqRequest> {
    (0..6)
        .map(|i| {
            let pattern: Vec<u32> = (0..3 + i % 3).map(|j| 5 + (11 * i + 3 * j) as u32 % 300).collect();
            let prompt = pattern.iter().copied().cycle().take(10 + 4 * i).collect();
            SeqRequest::new(prompt, 30, SamplingParams::default(), vec![])
        })
        .collect()
}

#[test]
fn the_log_accounts_for_every_token_and_counter_and_the_profile_splits_the_steps() {
    let profiler = Profiler::new();
    let engine = engine(Some(profiler.clone()));
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("spec.jsonl");
    let config = BatchConfig {
        prefix_cache: false,
        max_batch_tokens: 40,
        speculation: Some(SpeculationConfig::default()),
        speculation_log: Some(log.clone()),
        ..BatchConfig::default()
    };
    let mut batch = BatchEngine::new(&engine, config).unwrap();
    let done = batch.run_all(requests()).unwrap();
    let stats = batch.stats();
    drop(batch);

    let text = std::fs::read_to_string(&log).unwrap();
    let ids = |v: &serde_json::Value| -> Vec<u32> {
        v.as_array().unwrap().iter().map(|t| t.as_u64().unwrap() as u32).collect()
    };
    let mut produced: BTreeMap<u64, Vec<u32>> = BTreeMap::new();
    let (mut last_step, mut proposals, mut drafted, mut accepted_sum) = (0, 0, 0, 0);
    for line in text.lines() {
        let r: serde_json::Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
        let step = r["step"].as_u64().unwrap();
        assert!(step >= last_step, "records in step order: {line}");
        last_step = step;
        let (proposed, got) = (ids(&r["proposed"]), ids(&r["produced"]));
        let accepted = r["accepted"].as_u64().unwrap() as usize;
        assert!(accepted <= proposed.len() && accepted <= got.len(), "{line}");
        assert_eq!(got[..accepted], proposed[..accepted], "accepted drafts are the first produced: {line}");
        assert!(r["proposed_text"].is_string() && r["produced_text"].is_string(), "{line}");
        let id = r["seq"].as_u64().unwrap();
        let seq = produced.entry(id).or_default();
        assert_eq!(r["position"].as_u64().unwrap() as usize, prompt_len(&done, id) + seq.len(), "{line}");
        seq.extend(&got);
        if !proposed.is_empty() {
            proposals += 1;
            drafted += proposed.len() as u64;
            accepted_sum += accepted as u64;
        }
    }
    for c in &done {
        assert_eq!(produced[&c.id], c.tokens, "the log's produced tokens are sequence {}'s output", c.id);
    }
    assert!(proposals > 0 && accepted_sum > 0, "the test drafts and accepts something: {:?}", stats.spec);
    assert_eq!(
        (proposals, drafted, accepted_sum),
        (stats.spec.verify_steps, stats.spec.draft_tokens, stats.spec.accepted_tokens)
    );

    let phases = profiler.snapshot().phases;
    let calls = |name: &str| phases.iter().find(|p| p.name == name).map_or(0, |p| p.calls);
    assert!(calls(PHASE_VERIFY) > 0 && calls(PHASE_PROMPT) > 0, "{phases:?}");
    assert!(calls(PHASE_DRAFT) >= stats.spec.verify_steps, "every verification was drafted: {phases:?}");
    assert_eq!(calls(PHASE_VERIFY) + calls(PHASE_DECODE) + calls(PHASE_PROMPT), stats.steps, "{phases:?}");
    assert!(phases.iter().all(|p| p.nanos > 0), "{phases:?}");
}

/// The prompt length of sequence `id` (its usage).
fn prompt_len(done: &[loupe_runtime::Completion], id: u64) -> usize {
    done.iter().find(|c| c.id == id).map(|c| c.usage.prompt_tokens).unwrap()
}

#[test]
fn a_log_without_speculation_or_in_a_missing_directory_is_refused() {
    let engine = engine(None);
    let dir = tempfile::tempdir().unwrap();
    let no_spec = BatchConfig { speculation_log: Some(dir.path().join("a.jsonl")), ..BatchConfig::default() };
    assert!(matches!(BatchEngine::new(&engine, no_spec), Err(RuntimeError::InvalidRequest(_))));
    let missing = BatchConfig {
        speculation: Some(SpeculationConfig::default()),
        speculation_log: Some(dir.path().join("no/such/dir/a.jsonl")),
        ..BatchConfig::default()
    };
    let err = BatchEngine::new(&engine, missing).err().expect("a log in a missing directory fails");
    assert!(matches!(err, RuntimeError::SpeculationLog { .. }), "{err}");
    assert!(err.to_string().contains("no/such/dir/a.jsonl"), "{err}");
}
