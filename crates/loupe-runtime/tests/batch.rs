//! The batched engine on the tiny random-weight Llama: batch-, chunk-, cache- and
//! preemption-invariant output, prefix-cache accounting, cancellation, limits, taps.

mod common;
use common::tiny_file;

use std::path::PathBuf;
use std::sync::OnceLock;

use loupe_core::SplitMix64;
use loupe_graph::{KvDtype, Observer, ValueInfo};
use loupe_runtime::batch::WholeStep;
use loupe_runtime::{
    BatchConfig, BatchEngine, Completion, Engine, LoadOptions, SamplingParams, SeqEvent, SeqRequest, SequenceTap,
};

fn tiny_model() -> PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| tiny_file(&loupe_models::tiny::TinyLlama::default())).clone()
}

fn engine() -> Engine {
    Engine::load(tiny_model(), LoadOptions::default()).expect("loading the tiny model")
}

/// `n` requests of varied prompt lengths; all share the first `shared` tokens.
fn requests(n: usize, shared: usize, sampling: &SamplingParams) -> Vec<SeqRequest> {
    let mut rng = SplitMix64::new(42);
    let prefix: Vec<u32> = (0..shared).map(|_| 3 + (rng.next_u64() % 400) as u32).collect();
    (0..n)
        .map(|i| {
            let len = 1 + (rng.next_u64() % 40) as usize;
            let mut prompt = prefix.clone();
            prompt.extend((0..len).map(|_| 3 + (rng.next_u64() % 400) as u32));
            let sampling = SamplingParams { seed: 1000 + i as u64, ..sampling.clone() };
            SeqRequest {
                prompt,
                max_tokens: 12 + i % 7,
                sampling,
                stop_ids: vec![],
                logprobs: None,
                grammar: None,
                fast_forward: false,
                speculate: true,
            }
        })
        .collect()
}

fn config() -> BatchConfig {
    BatchConfig { prefix_cache: false, ..BatchConfig::default() }
}

/// Each request in an engine of its own.
fn alone(engine: &Engine, reqs: &[SeqRequest], config: &BatchConfig) -> Vec<Vec<u32>> {
    reqs.iter()
        .map(|r| {
            let mut b = BatchEngine::new(engine, config.clone()).unwrap();
            b.run_all(vec![r.clone()]).unwrap().remove(0).tokens
        })
        .collect()
}

fn tokens(c: &[Completion]) -> Vec<Vec<u32>> {
    c.iter().map(|c| c.tokens.clone()).collect()
}

fn seeded() -> SamplingParams {
    SamplingParams { temperature: 0.9, top_k: 40, top_p: 0.95, ..SamplingParams::default() }
}

#[test]
fn batched_tokens_equal_each_request_alone_greedy_and_seeded() {
    let engine = engine();
    for (kv_dtype, sampling) in [
        (KvDtype::F16, SamplingParams::default()),
        (KvDtype::F32, seeded()),
        (KvDtype::F16, seeded()),
        (KvDtype::Fp8E4M3, SamplingParams::default()),
    ] {
        let config = BatchConfig { kv_dtype: Some(kv_dtype), ..config() };
        let reqs = requests(12, 0, &sampling);
        let want = alone(&engine, &reqs, &config);
        let mut b = BatchEngine::new(&engine, config.clone()).unwrap();
        let got = b.run_all(reqs.clone()).unwrap();
        assert_eq!(tokens(&got), want, "{kv_dtype} {sampling:?}");
        assert!(b.stats().steps < want.iter().map(|t| t.len() as u64 + 1).sum::<u64>(), "the requests shared steps");
        assert_eq!(b.stats().blocks_in_use, 0);
    }
}

/// The tiny Gemma 2 (attention scores and logits soft-capped, layers 0 and 2 sliding over 8
/// positions, prompts up to 40 tokens): the batched engine's tokens, all requests in one
/// batch and their prompts chunked, equal the single-sequence path's (`generate_tokens`:
/// contiguous cache, matrix-product prefill), greedy and seeded, f32 weights and cache in
/// both. The server runs the batched path, so a cap or window applied in one path only
/// would show here.
#[test]
fn tiny_gemma2_batched_tokens_equal_the_single_sequence_path() {
    use loupe_models::tiny::{TinyGemma2, TinyLlama};
    use loupe_runtime::GenerateRequest;
    let path = tiny_file(&TinyLlama { gemma2: Some(TinyGemma2::default()), ..TinyLlama::default() });
    let engine =
        Engine::load(path, LoadOptions { precision: loupe_models::Precision::F32, ..LoadOptions::default() }).unwrap();
    assert_eq!(engine.config().family(), loupe_models::Family::Gemma2);
    assert!(engine.graph().nodes.iter().any(|n| matches!(n.op, loupe_graph::Op::SoftCap { .. })));
    for sampling in [SamplingParams::default(), seeded()] {
        let reqs = requests(8, 0, &sampling);
        let single: Vec<Vec<u32>> = reqs
            .iter()
            .map(|r| {
                let g = GenerateRequest::new(r.prompt.clone(), r.max_tokens, r.sampling.clone(), vec![]);
                engine.generate_tokens(&g, &mut |_| {}).unwrap().tokens
            })
            .collect();
        for max_batch_tokens in [BatchConfig::default().max_batch_tokens, 5] {
            let mut b =
                BatchEngine::new(&engine, BatchConfig { kv_dtype: Some(KvDtype::F32), max_batch_tokens, ..config() })
                    .unwrap();
            assert_eq!(
                tokens(&b.run_all(reqs.clone()).unwrap()),
                single,
                "{sampling:?}, max_batch_tokens {max_batch_tokens}"
            );
        }
    }
}

#[test]
fn chunked_prefill_and_tiny_step_budgets_do_not_change_tokens() {
    let engine = engine();
    let reqs = requests(6, 0, &SamplingParams::default());
    let want = alone(&engine, &reqs, &config());
    for (max_batch_tokens, max_seqs) in [(1, 32), (3, 2), (7, 1), (64, 3)] {
        let mut b = BatchEngine::new(&engine, BatchConfig { max_batch_tokens, max_seqs, ..config() }).unwrap();
        let got = b.run_all(reqs.clone()).unwrap();
        assert_eq!(tokens(&got), want, "max_batch_tokens {max_batch_tokens}, max_seqs {max_seqs}");
    }
}

#[test]
fn prefix_cache_hits_skip_the_shared_prompt_and_keep_tokens() {
    let engine = engine();
    // 40 shared tokens: two full 16-position blocks.
    let reqs = requests(8, 40, &SamplingParams::default());
    let want = alone(&engine, &reqs, &config());
    let mut b = BatchEngine::new(&engine, BatchConfig { prefix_cache: true, ..BatchConfig::default() }).unwrap();
    // The first request fills the cache; the rest arrive after it, in shuffled order.
    let first = b.run_all(vec![reqs[0].clone()]).unwrap();
    assert_eq!(first[0].usage.cached_tokens, 0);
    let computed_before = b.stats().tokens_computed;
    let order = [5, 2, 7, 1, 4, 3, 6];
    let got = b.run_all(order.iter().map(|&i| reqs[i].clone()).collect()).unwrap();
    for (c, &i) in got.iter().zip(&order) {
        assert_eq!(c.tokens, want[i], "request {i}");
        assert_eq!(c.usage.cached_tokens, 32, "request {i}: two cached blocks");
        assert_eq!(c.usage.prompt_tokens, reqs[i].prompt.len());
    }
    let stats = b.stats();
    assert!(stats.prefix.hit_blocks >= 14, "{stats:?}");
    // The cached tokens were not computed again.
    let prompt_tokens: usize = order.iter().map(|&i| reqs[i].prompt.len()).sum();
    let generated: usize = got.iter().map(|c| c.tokens.len()).sum();
    assert_eq!(stats.tokens_computed - computed_before, (prompt_tokens - 7 * 32 + generated - 7) as u64, "{stats:?}");
    assert_eq!(stats.blocks_in_use, 0);
    assert!(stats.blocks_cached > 0);
}

#[test]
fn preemption_under_a_tiny_kv_budget_keeps_tokens() {
    let engine = engine();
    for sampling in [SamplingParams::default(), seeded()] {
        let reqs = requests(10, 0, &sampling);
        let want = alone(&engine, &reqs, &config());
        // 12 blocks of 16 positions: about three of these sequences at once.
        for prefix_cache in [false, true] {
            let mut b =
                BatchEngine::new(&engine, BatchConfig { kv_blocks: Some(12), prefix_cache, ..BatchConfig::default() })
                    .unwrap();
            let got = b.run_all(reqs.clone()).unwrap();
            assert_eq!(tokens(&got), want, "prefix cache {prefix_cache}");
            let stats = b.stats();
            assert!(stats.preemptions > 0, "the budget forced preemption: {stats:?}");
            assert_eq!(stats.blocks_in_use, 0);
            assert!(stats.peak_blocks_in_use <= 12);
        }
    }
}

#[test]
fn cancelled_sequences_return_every_block() {
    let engine = engine();
    let mut b = BatchEngine::new(&engine, BatchConfig { prefix_cache: true, ..BatchConfig::default() }).unwrap();
    let ids: Vec<_> = requests(6, 20, &SamplingParams::default()).into_iter().map(|r| b.add(r).unwrap()).collect();
    for _ in 0..3 {
        b.step().unwrap();
    }
    assert!(b.stats().blocks_in_use > 0);
    for id in &ids {
        assert!(b.cancel(*id), "sequence {id} was running or waiting");
    }
    assert!(!b.cancel(ids[0]), "already gone");
    let stats = b.stats();
    assert_eq!((stats.blocks_in_use, stats.running, stats.waiting), (0, 0, 0), "{stats:?}");
    assert!(!b.has_work());
    // The freed blocks serve new work.
    let got = b.run_all(requests(2, 0, &SamplingParams::default())).unwrap();
    assert_eq!(got.len(), 2);
}

#[test]
fn limits_and_bad_requests() {
    let engine = engine();
    let mut b = BatchEngine::new(&engine, BatchConfig { max_seqs: 2, kv_blocks: Some(4), ..config() }).unwrap();
    for r in requests(5, 0, &SamplingParams::default()) {
        b.add(r).unwrap();
    }
    while b.has_work() {
        b.step().unwrap();
        assert!(b.stats().running <= 2);
    }
    let empty = SeqRequest {
        prompt: vec![],
        max_tokens: 1,
        sampling: SamplingParams::default(),
        stop_ids: vec![],
        logprobs: None,
        grammar: None,
        fast_forward: false,
        speculate: true,
    };
    assert!(b.add(empty).is_err());
    let long = SeqRequest {
        prompt: vec![5; 100],
        max_tokens: 1,
        sampling: SamplingParams::default(),
        stop_ids: vec![],
        logprobs: None,
        grammar: None,
        fast_forward: false,
        speculate: true,
    };
    let err = b.add(long).unwrap_err().to_string();
    assert!(err.contains("KV blocks"), "{err}");
    let too_long = SeqRequest {
        prompt: vec![5; 300],
        max_tokens: 1,
        sampling: SamplingParams::default(),
        stop_ids: vec![],
        logprobs: None,
        grammar: None,
        fast_forward: false,
        speculate: true,
    };
    assert!(b.add(too_long).is_err());
    let bad_id = SeqRequest {
        prompt: vec![1 << 30],
        max_tokens: 1,
        sampling: SamplingParams::default(),
        stop_ids: vec![],
        logprobs: None,
        grammar: None,
        fast_forward: false,
        speculate: true,
    };
    assert!(b.add(bad_id).is_err());
    assert!(BatchEngine::new(&engine, BatchConfig { kv_blocks: Some(0), ..config() }).is_err());
}

#[test]
fn stop_ids_end_a_sequence_with_eos() {
    let engine = engine();
    let reqs = requests(1, 0, &SamplingParams::default());
    let free = alone(&engine, &reqs, &config()).remove(0);
    let stop = free[3];
    let first = free.iter().position(|&t| t == stop).unwrap();
    let mut b = BatchEngine::new(&engine, config()).unwrap();
    let got = b.run_all(vec![SeqRequest { stop_ids: vec![stop], ..reqs[0].clone() }]).unwrap().remove(0);
    assert_eq!(got.tokens, free[..=first]);
    assert_eq!(got.reason, loupe_runtime::FinishReason::Eos);
}

/// Records every value it is shown.
#[derive(Default)]
struct Record(Vec<(String, Vec<usize>, Vec<f32>)>);

impl Observer for Record {
    fn wants(&mut self, _: &ValueInfo) -> bool {
        true
    }
    fn observe(&mut self, value: &ValueInfo, shape: &[usize], data: &[f32]) {
        self.0.push((value.name.clone(), shape.to_vec(), data.to_vec()));
    }
}

#[test]
fn a_sequence_tap_in_a_batch_sees_what_the_sequence_alone_computes() {
    let engine = engine();
    let reqs = requests(4, 0, &SamplingParams::default());
    // Alone: the first step of request 2 (its whole prompt).
    let mut solo = BatchEngine::new(&engine, config()).unwrap();
    solo.add(reqs[2].clone()).unwrap();
    let mut alone = Record::default();
    solo.step_observed(Some(&mut WholeStep(&mut alone))).unwrap();
    // In a batch of four: request 2 is sequence 2.
    let mut b = BatchEngine::new(&engine, config()).unwrap();
    for r in &reqs {
        b.add(r.clone()).unwrap();
    }
    let mut batched = Record::default();
    let mut tap = SequenceTap::new(2, &mut batched);
    b.step_observed(Some(&mut tap)).unwrap();
    assert!(alone.0.len() > 30, "every value was shown");
    assert_eq!(alone.0.len(), batched.0.len());
    for (a, s) in alone.0.iter().zip(&batched.0) {
        assert_eq!((&a.0, &a.1), (&s.0, &s.1), "name and shape");
        let (a_bits, s_bits): (Vec<u32>, Vec<u32>) =
            (a.2.iter().map(|x| x.to_bits()).collect(), s.2.iter().map(|x| x.to_bits()).collect());
        if a.0.ends_with("attn_probs") || a.1.len() == 3 {
            // Probabilities are padded to the step's longest context: compare the visible part.
            continue;
        }
        assert_eq!(a_bits, s_bits, "{}", a.0);
    }
    // Events of a step name the sequences it advanced.
    let events = b.step().unwrap();
    assert!(events.iter().all(|e| matches!(e, SeqEvent::Token { .. } | SeqEvent::Finished { .. })));
}

#[test]
fn debug_checks_run_on_batched_steps() {
    // nan-check catches a planted NaN in a batched step, naming the value.
    let debug = loupe_graph::debug::DebugOptions::default()
        .with("nan-check", Some("true"))
        .unwrap()
        .with("nan-check-stride", Some("1"))
        .unwrap();
    let engine = Engine::load(
        tiny_model(),
        LoadOptions { debug, faults: vec!["nan@1".parse().unwrap()], ..LoadOptions::default() },
    )
    .unwrap();
    let mut b = BatchEngine::new(&engine, config()).unwrap();
    for r in requests(3, 0, &SamplingParams::default()) {
        b.add(r).unwrap();
    }
    let err = b.step().unwrap_err().to_string();
    assert!(
        err.contains("nan-check: op plant_nan computing 'model.layers.1.self_attn.o_proj'")
            && err.contains("produced 1 NaN and 1 Inf"),
        "{err}"
    );
    // The kv-write fault has no batched form: refused, not silently ignored.
    let engine = Engine::load(
        tiny_model(),
        LoadOptions { faults: vec!["kv-write@0".parse().unwrap()], ..LoadOptions::default() },
    )
    .unwrap();
    let mut b = BatchEngine::new(&engine, config()).unwrap();
    b.add(requests(1, 0, &SamplingParams::default()).remove(0)).unwrap();
    let err = b.step().unwrap_err().to_string();
    assert!(err.contains("kv-write"), "{err}");
}

/// Speculative decoding (prompt lookup) changes no token: greedy bit for bit (each verified
/// row is what a one-token step computes), seeded sampling by exact rejection sampling (the
/// same distribution, not the same draws, so only greedy is compared token for token).
/// Prompts repeat a pattern so the drafter has something to propose; the tiny model's own
/// loops give accepted drafts.
#[test]
fn speculation_keeps_greedy_tokens_alone_and_batched() {
    let engine = engine();
    let mut reqs = requests(10, 0, &SamplingParams::default());
    for (i, r) in reqs.iter_mut().enumerate() {
        let pattern: Vec<u32> = (0..3 + i % 4).map(|j| 5 + (7 * i + 3 * j) as u32 % 300).collect();
        r.prompt = pattern.iter().copied().cycle().take(12 + 5 * i).collect();
        r.max_tokens = 40;
    }
    let want = alone(&engine, &reqs, &config());
    for max_draft in [1, 3, 8] {
        for max_batch_tokens in [2048, 6] {
            let spec = BatchConfig {
                speculation: Some(loupe_runtime::SpeculationConfig {
                    max_draft,
                    ..loupe_runtime::SpeculationConfig::default()
                }),
                max_batch_tokens,
                ..config()
            };
            let mut b = BatchEngine::new(&engine, spec.clone()).unwrap();
            let got = b.run_all(reqs.clone()).unwrap();
            assert_eq!(tokens(&got), want, "max_draft {max_draft}, max_batch_tokens {max_batch_tokens}");
            let s = b.stats().spec;
            assert!(s.verify_steps > 0 && s.draft_tokens >= s.verify_steps, "{s:?}");
            assert!(s.accepted_tokens > 0, "no draft was ever accepted: {s:?}");
            assert_eq!(b.stats().blocks_in_use, 0, "rejected drafts' blocks came back");
            // Alone, too (and a request that opts out runs without drafts).
            assert_eq!(alone(&engine, &reqs[..3], &spec), want[..3]);
            let mut b = BatchEngine::new(&engine, spec).unwrap();
            let out: Vec<SeqRequest> = reqs.iter().map(|r| SeqRequest { speculate: false, ..r.clone() }).collect();
            assert_eq!(tokens(&b.run_all(out).unwrap()), want);
            assert_eq!(b.stats().spec.verify_steps, 0);
        }
    }
    // With the prefix cache on (blocks filled by accepted drafts are registered) and a tiny
    // KV budget (preemption recomputes a sequence whose drafts were accepted).
    for cfg in [BatchConfig { prefix_cache: true, ..config() }, BatchConfig { kv_blocks: Some(12), ..config() }] {
        let spec = BatchConfig { speculation: Some(loupe_runtime::SpeculationConfig::default()), ..cfg };
        let mut b = BatchEngine::new(&engine, spec).unwrap();
        let mut twice = reqs.clone();
        twice.extend(reqs.iter().cloned());
        let got = b.run_all(twice).unwrap();
        assert_eq!(tokens(&got)[..reqs.len()], want[..]);
        assert_eq!(tokens(&got)[reqs.len()..], want[..]);
    }
}

#[test]
fn speculation_with_seeded_sampling_is_reproducible_and_respects_limits() {
    let engine = engine();
    let mut reqs = requests(6, 0, &seeded());
    for (i, r) in reqs.iter_mut().enumerate() {
        r.prompt = [9u32, 10, 11, 12].iter().copied().cycle().take(10 + i).collect();
        r.max_tokens = 7 + i;
        r.stop_ids = vec![];
    }
    let spec = BatchConfig { speculation: Some(loupe_runtime::SpeculationConfig::default()), ..config() };
    let run = || BatchEngine::new(&engine, spec.clone()).unwrap().run_all(reqs.clone()).unwrap();
    let (a, b) = (run(), run());
    assert_eq!(tokens(&a), tokens(&b));
    for (c, r) in a.iter().zip(&reqs) {
        assert_eq!(c.tokens.len(), r.max_tokens, "max_tokens holds with drafts");
    }
}
