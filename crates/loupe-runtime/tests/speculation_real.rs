//! Speculative decoding on Qwen2.5-Coder-0.5B and Gemma 3 270M under the default precision
//! (`auto`, whose verification rows run the 8-bit wide tiles on AVX-512 CPUs and the native
//! multi-row kernels elsewhere), with both drafters (prompt lookup, and a draft model: the
//! same file at 8-bit activations): every golden's greedy tokens, and those of a code edit
//! that drafts long accepted runs, are the same with and without speculation, each alone
//! (with their log-probabilities bit for bit) and all among 16-way concurrency.

mod common;

use std::path::PathBuf;

use loupe_runtime::{
    BatchConfig, BatchEngine, DraftModel, Drafter, Engine, LoadOptions, Prompt, SamplingParams, SeqEvent, SeqId,
    SeqRequest, SpeculationConfig,
};

/// A golden's prompt, length and stop ids (tests/golden/<model>/*.json).
fn golden_requests(dir: &str) -> Vec<SeqRequest> {
    use common::ids;
    let request_of = |v: &serde_json::Value| {
        request(ids(&v["prompt_tokens"]), v["max_tokens"].as_u64().unwrap() as usize, ids(&v["eos_token_ids"]))
    };
    common::golden_files(dir).iter().map(request_of).collect()
}

fn request(prompt: Vec<u32>, max_tokens: usize, stop_ids: Vec<u32>) -> SeqRequest {
    SeqRequest {
        prompt,
        max_tokens,
        sampling: SamplingParams::default(),
        stop_ids,
        logprobs: None,
        grammar: None,
        fast_forward: false,
        speculate: true,
    }
}

/// The goldens plus a code edit (return a function with one name changed; a model without
/// a chat template, Gemma 3 270M's GGUF, is asked in plain text to write it out again),
/// whose answer copies the prompt: drafts of up to 8 tokens accepted whole, so 9-row
/// verification steps.
fn requests(engine: &Engine, golden_dir: &str) -> Vec<SeqRequest> {
    let mut reqs = golden_requests(golden_dir);
    let stop_ids = reqs[0].stop_ids.clone();
    let function = "```python\ndef mean_price(items, tax=0.0):\n    total = 0.0\n    for item in items:\n        total += item[\"price\"] * (1.0 + tax)\n    return total / max(len(items), 1)\n```";
    let edit = format!("Here is a Python function:\n\n{function}\n\nRename the parameter `tax` to `rate` everywhere. Return the whole function with only that change, in a Python code block, and nothing else.");
    let prompt = match engine.prompt_tokens(&Prompt::chat(&edit)) {
        Ok(tokens) => tokens,
        Err(_) => engine
            .prompt_tokens(&Prompt::raw(&format!("{function}\n\nThe same function again, unchanged:\n\n```python\n")))
            .unwrap(),
    };
    reqs.push(request(prompt, 96, stop_ids));
    reqs
}

/// Each request's tokens with the bits of their log-probabilities (`u32::MAX` when not
/// asked for), stepping `engine` until all are done.
fn run(engine: &mut BatchEngine, reqs: &[SeqRequest]) -> Vec<Vec<(u32, u32)>> {
    let ids: Vec<SeqId> = reqs.iter().map(|r| engine.add(r.clone()).unwrap()).collect();
    let mut out = vec![Vec::new(); reqs.len()];
    while engine.has_work() {
        for event in engine.step().unwrap() {
            if let SeqEvent::Token { id, token, logprobs } = event {
                let k = ids.iter().position(|&i| i == id).unwrap();
                out[k].push((token, logprobs.map_or(u32::MAX, |l| l.logprob.to_bits())));
            }
        }
    }
    out
}

fn check(model: PathBuf, golden_dir: &str) {
    // The precision users get by default (`--precision auto`), whose verification rows take
    // the 8-bit wide tiles for Q5_0 on AVX-512 CPUs and the native multi-row tiles for the rest.
    let options = LoadOptions { precision: loupe_models::Precision::Auto, ..LoadOptions::default() };
    let engine = Engine::load(&model, options).expect("loading the model");
    let greedy = requests(&engine, golden_dir);
    // With log-probabilities every row's logits are computed in full, so their bits are
    // compared; without, the screened lm_head serves greedy rows, and tokens are compared.
    let with_lp: Vec<SeqRequest> = greedy.iter().map(|r| SeqRequest { logprobs: Some(0), ..r.clone() }).collect();
    let plain = BatchConfig { prefix_cache: false, ..BatchConfig::default() };
    let want: Vec<Vec<(u32, u32)>> = with_lp
        .iter()
        .map(|r| run(&mut BatchEngine::new(&engine, plain.clone()).unwrap(), std::slice::from_ref(r)).remove(0))
        .collect();
    // The draft model: the same file at `--precision q8` (`--draft-precision`'s default), whose
    // greedy choices differ from the target's now and then, so drafts are rejected too.
    let draft_options = LoadOptions { precision: loupe_models::Precision::Q8, ..LoadOptions::default() };
    let draft = DraftModel::new(Engine::load(&model, draft_options).expect("loading the draft model"));
    let drafters = [
        ("prompt lookup", SpeculationConfig::default()),
        (
            "a draft model",
            SpeculationConfig { drafter: Drafter::Model(draft), max_draft: Drafter::default_max_draft(false) },
        ),
    ];
    for (drafter, config) in drafters {
        let spec = BatchConfig { speculation: Some(config), ..BatchConfig::default() };
        for (k, (r, w)) in with_lp.iter().zip(&want).enumerate() {
            let mut b = BatchEngine::new(&engine, BatchConfig { prefix_cache: false, ..spec.clone() }).unwrap();
            let got = run(&mut b, std::slice::from_ref(r)).remove(0);
            assert_eq!(&got, w, "{golden_dir}: request {k} alone, with {drafter}: (token, log-prob bits)");
        }
        // Among 16: greedy (the screened lm_head), and with log-probs for prompt lookup (a
        // draft model's passes run one sequence at a time, so once is enough there).
        let runs: &[(&Vec<SeqRequest>, &str)] = if drafter == "prompt lookup" {
            &[(&with_lp, "with log-probs"), (&greedy, "greedy")]
        } else {
            &[(&greedy, "greedy")]
        };
        for &(reqs, what) in runs {
            let mut b = BatchEngine::new(&engine, spec.clone()).unwrap();
            let sixteen: Vec<SeqRequest> = (0..16).map(|k| reqs[k % reqs.len()].clone()).collect();
            let got = run(&mut b, &sixteen);
            for (k, g) in got.iter().enumerate() {
                let w = &want[k % reqs.len()];
                if what == "greedy" {
                    let tokens = |v: &[(u32, u32)]| v.iter().map(|p| p.0).collect::<Vec<u32>>();
                    assert_eq!(tokens(g), tokens(w), "{golden_dir}: request {k} among 16, {what}, with {drafter}");
                } else {
                    assert_eq!(g, w, "{golden_dir}: request {k} among 16, {what}, with {drafter}");
                }
            }
            let s = b.stats().spec;
            eprintln!(
                "{golden_dir} among 16, {what}, {drafter}: {s:?}, acceptance {:.2}, {:.2} tokens per verification",
                s.acceptance_rate(),
                s.tokens_per_verify_step()
            );
            assert!(
                s.tokens_per_verify_step() > 3.0,
                "{golden_dir}, {drafter}: drafts should be accepted in runs: {s:?}"
            );
        }
    }
}

#[test]
#[ignore = "needs Qwen2.5-Coder-0.5B-Instruct (scripts/test fetches it)"]
fn qwen_speculation_keeps_every_goldens_greedy_tokens() {
    let model = common::real_gguf("LOUPE_QWEN_MODEL", "Qwen2.5-Coder-0.5B-Instruct.gguf", "qwen2.5-coder-0.5b");
    check(model, "qwen2.5-coder-0.5b");
}

#[test]
#[ignore = "needs Gemma 3 270M (scripts/test fetches it)"]
fn gemma_speculation_keeps_every_goldens_greedy_tokens() {
    check(common::real_gguf("LOUPE_GEMMA_MODEL", "gemma-3-270m-q4_k_m.gguf", "gemma3-270m"), "gemma3-270m");
}
