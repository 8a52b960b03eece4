//! The batched engine on the real model (SmolLM2-135M-Instruct Q4_1) and the nine golden
//! prompts (tests/golden/smollm2-q4_1): every request's tokens are bit-identical alone, all
//! nine in one batch, among 32 neighbours, in shuffled arrival behind a shared system
//! prompt served from the prefix cache, and under a KV budget that forces preemption —
//! greedy and seeded sampling.

mod common;

use loupe_runtime::{BatchConfig, BatchEngine, Engine, LoadOptions, Prompt, SamplingParams, SeqRequest};

fn real_engine() -> Engine {
    let path = loupe_models::real_model_path();
    assert!(
        path.is_file(),
        "needs the real model at {} (missing): run scripts/fetch-model or set LOUPE_MODEL",
        path.display()
    );
    Engine::load(&path, LoadOptions::default()).expect("loading the real model")
}

struct Golden {
    name: String,
    prompt: String,
    prompt_tokens: Vec<u32>,
    max_tokens: usize,
    eos: Vec<u32>,
    tokens: Vec<u32>,
}

fn goldens() -> Vec<Golden> {
    use common::ids;
    common::golden_files("smollm2-q4_1")
        .iter()
        .map(|v| Golden {
            name: v["name"].as_str().unwrap().to_string(),
            prompt: v["prompt"].as_str().unwrap().to_string(),
            prompt_tokens: ids(&v["prompt_tokens"]),
            max_tokens: v["max_tokens"].as_u64().unwrap() as usize,
            eos: ids(&v["eos_token_ids"]),
            tokens: ids(&v["tokens"]),
        })
        .collect()
}

fn request(prompt: Vec<u32>, g: &Golden, sampling: &SamplingParams) -> SeqRequest {
    SeqRequest {
        prompt,
        max_tokens: g.max_tokens,
        sampling: sampling.clone(),
        stop_ids: g.eos.clone(),
        logprobs: None,
        grammar: None,
        fast_forward: false,
        speculate: true,
    }
}

fn alone(engine: &Engine, reqs: &[SeqRequest]) -> Vec<Vec<u32>> {
    reqs.iter()
        .map(|r| {
            let mut b =
                BatchEngine::new(engine, BatchConfig { prefix_cache: false, ..BatchConfig::default() }).unwrap();
            b.run_all(vec![r.clone()]).unwrap().remove(0).tokens
        })
        .collect()
}

#[test]
#[ignore = "needs the real model (scripts/test fetches it)"]
fn golden_prompts_give_identical_tokens_in_any_batch() {
    let engine = real_engine();
    let goldens = goldens();
    assert_eq!(goldens.len(), 9, "the nine golden prompts");
    let greedy = SamplingParams::default();
    let seeded = SamplingParams { temperature: 0.8, top_p: 0.95, seed: 7, ..SamplingParams::default() };
    for sampling in [greedy.clone(), seeded] {
        let reqs: Vec<SeqRequest> = goldens.iter().map(|g| request(g.prompt_tokens.clone(), g, &sampling)).collect();
        let want = alone(&engine, &reqs);
        if sampling.temperature == 0.0 {
            let agree = goldens.iter().zip(&want).filter(|(g, w)| g.tokens == **w).count();
            eprintln!("batched engine alone (native weights, f16 KV) reproduces {agree}/9 golden greedy continuations of the f32 reference");
        }
        // All nine in one batch.
        let mut b = BatchEngine::new(&engine, BatchConfig::default()).unwrap();
        let got: Vec<Vec<u32>> = b.run_all(reqs.clone()).unwrap().into_iter().map(|c| c.tokens).collect();
        for ((g, w), t) in goldens.iter().zip(&want).zip(&got) {
            assert_eq!(t, w, "{} in a batch of nine ({sampling:?})", g.name);
        }
        // Among 32: the nine plus 23 neighbours (the same prompts with other lengths), arriving
        // in shuffled order, with chunked prefill.
        let mut batch: Vec<(Option<usize>, SeqRequest)> =
            reqs.iter().cloned().enumerate().map(|(i, r)| (Some(i), r)).collect();
        for k in 0..23 {
            let g = &goldens[k % 9];
            let mut r = request(g.prompt_tokens[..g.prompt_tokens.len() - 1 - k % 3].to_vec(), g, &sampling);
            r.max_tokens = 8 + k;
            batch.push((None, r));
        }
        let order: Vec<usize> = (0..32).map(|i| (i * 13 + 5) % 32).collect();
        let mut b = BatchEngine::new(&engine, BatchConfig { max_batch_tokens: 96, ..BatchConfig::default() }).unwrap();
        let done = b.run_all(order.iter().map(|&i| batch[i].1.clone()).collect()).unwrap();
        assert_eq!(done.len(), 32);
        for (c, &i) in done.iter().zip(&order) {
            if let Some(g) = batch[i].0 {
                assert_eq!(c.tokens, want[g], "{} among 32 ({sampling:?})", goldens[g].name);
            }
        }
        // Under a KV budget too small for all of them at once: preemption and recompute.
        let mut b = BatchEngine::new(&engine, BatchConfig { kv_blocks: Some(24), ..BatchConfig::default() }).unwrap();
        let got: Vec<Vec<u32>> = b.run_all(reqs.clone()).unwrap().into_iter().map(|c| c.tokens).collect();
        assert!(b.stats().preemptions > 0, "{:?}", b.stats());
        assert_eq!(got, want, "under preemption ({sampling:?})");
        assert_eq!(b.stats().blocks_in_use, 0);
    }
}

/// A prompt sent again is served from the cache down to its last token, which is then
/// computed alone in its step: it must still take the prompt rows' arithmetic (a step of one
/// row once ran decode's grouped kernels on it, and the answer changed).
#[test]
#[ignore = "needs the real model (scripts/test fetches it)"]
fn a_repeated_prompt_gives_the_same_tokens_from_the_cache() {
    let engine = real_engine();
    let mut b = BatchEngine::new(&engine, BatchConfig::default()).unwrap();
    let mut repeated = 0;
    for g in goldens() {
        // A whole number of blocks and one token, so the repeat computes exactly one row.
        let len = (g.prompt_tokens.len() - 1) / 16 * 16 + 1;
        if len < 17 {
            continue;
        }
        repeated += 1;
        let req = request(g.prompt_tokens[..len].to_vec(), &g, &SamplingParams::default());
        let want = alone(&engine, std::slice::from_ref(&req));
        let first = b.run_all(vec![req.clone()]).unwrap();
        let again = b.run_all(vec![req]).unwrap();
        assert_eq!(again[0].usage.cached_tokens, len - 1, "{}: all but the last token cached", g.name);
        assert_eq!(first[0].tokens, want[0], "{}: first run", g.name);
        assert_eq!(again[0].tokens, want[0], "{}: from the cache", g.name);
    }
    assert!(repeated > 0, "no golden prompt is a block and a token long");
}

#[test]
#[ignore = "needs the real model (scripts/test fetches it)"]
fn shared_system_prompt_is_served_from_the_prefix_cache() {
    let engine = real_engine();
    let goldens = goldens();
    let system = "You are a careful, friendly assistant. Answer in one or two sentences, plainly, without lists, and say so when you do not know.";
    for sampling in
        [SamplingParams::default(), SamplingParams { temperature: 0.7, seed: 11, ..SamplingParams::default() }]
    {
        let reqs: Vec<SeqRequest> = goldens
            .iter()
            .map(|g| {
                request(engine.prompt_tokens(&Prompt::chat(&g.prompt).with_system(Some(system))).unwrap(), g, &sampling)
            })
            .collect();
        let want = alone(&engine, &reqs);
        let mut b = BatchEngine::new(&engine, BatchConfig::default()).unwrap();
        // Warm the cache with another question behind the same system prompt.
        let warm = engine.prompt_tokens(&Prompt::chat("Hello!").with_system(Some(system))).unwrap();
        b.run_all(vec![request(warm, &goldens[0], &sampling)]).unwrap();
        let order = [4, 0, 7, 2, 8, 5, 1, 6, 3];
        let done = b.run_all(order.iter().map(|&i| reqs[i].clone()).collect()).unwrap();
        let shared = reqs
            .iter()
            .map(|r| r.prompt.iter().zip(&reqs[0].prompt).take_while(|(a, b)| a == b).count())
            .min()
            .unwrap();
        for (c, &i) in done.iter().zip(&order) {
            assert_eq!(c.tokens, want[i], "{} behind a cached system prompt ({sampling:?})", goldens[i].name);
            assert_eq!(
                c.usage.cached_tokens,
                shared / 16 * 16,
                "{}: the shared prompt's full blocks came from the cache",
                goldens[i].name
            );
        }
        let stats = b.stats();
        assert!(stats.prefix.hit_blocks >= 9 * (shared / 16) as u64, "{stats:?}");
    }
}

/// Speculative decoding (prompt lookup) on the real model: every golden's greedy tokens are
/// the same with and without it, each alone and all nine among 16-way concurrency (the nine
/// and seven repeats), and the drafter has prompts to copy from (a request that repeats its
/// prompt back).
#[test]
#[ignore = "needs the real model (scripts/test fetches it)"]
fn speculation_keeps_every_goldens_greedy_tokens() {
    let engine = real_engine();
    let goldens = goldens();
    let greedy = SamplingParams::default();
    let mut reqs: Vec<SeqRequest> = goldens.iter().map(|g| request(g.prompt_tokens.clone(), g, &greedy)).collect();
    // A copying request: the model is asked to repeat a passage.
    let passage = "The lighthouse keeper climbed the stairs at dusk, lit the lamp, wound the clockwork, and watched the beam sweep across the dark water until dawn.";
    let copy = engine
        .prompt_tokens(&Prompt::chat(&format!("Repeat this sentence exactly, word for word:\n\n{passage}")))
        .unwrap();
    reqs.push(request(copy, &goldens[0], &greedy));
    reqs.last_mut().unwrap().max_tokens = 48;
    let want = alone(&engine, &reqs);
    let spec = BatchConfig { speculation: Some(loupe_runtime::SpeculationConfig::default()), ..BatchConfig::default() };
    for (r, w) in reqs.iter().zip(&want) {
        let mut b = BatchEngine::new(&engine, BatchConfig { prefix_cache: false, ..spec.clone() }).unwrap();
        assert_eq!(&b.run_all(vec![r.clone()]).unwrap()[0].tokens, w, "alone, with speculation");
    }
    let mut b = BatchEngine::new(&engine, spec).unwrap();
    let sixteen: Vec<SeqRequest> = (0..16).map(|k| reqs[k % reqs.len()].clone()).collect();
    let got = b.run_all(sixteen).unwrap();
    for (k, c) in got.iter().enumerate() {
        assert_eq!(c.tokens, want[k % reqs.len()], "request {k} among 16, with speculation");
    }
    let s = b.stats().spec;
    eprintln!(
        "speculation among 16: {s:?}, acceptance {:.2}, {:.2} tokens per verification",
        s.acceptance_rate(),
        s.tokens_per_verify_step()
    );
    assert!(s.accepted_tokens > 0, "no draft was accepted: {s:?}");
}
