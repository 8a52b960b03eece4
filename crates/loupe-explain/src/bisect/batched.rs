//! The batched rung: the prompt through loupe's batched engine beside three neighbours, with
//! chunked prefill, then alone again with its prompt blocks from the prefix cache. It must
//! reproduce the incremental rung's tokens, and its log-probs must stay within
//! [`BATCHED_NOISE_FACTOR`] times the noise between two correct paths.

use loupe_runtime::{BatchConfig, BatchEngine, Engine, SamplingParams, SeqEvent, SeqRequest};

use super::rung::{judge, Rung};

/// The batched rung's log-probs may differ from the incremental rung's by this many times the
/// noise between two correct paths of the same engine (one pass against step by step: the
/// same arithmetic in another summation order) before the rung diverges with its tokens
/// still equal. Clean runs measure a ratio under 1 (SmolLM2 f32: 2.2e-6 against 1.4e-5); a
/// block table read one entry late at layer 3 measures 9,000 without flipping a token.
pub const BATCHED_NOISE_FACTOR: f64 = 100.0;
/// The noise is taken as at least this (about 8 f32 ulps of a log-prob near 1), so two paths
/// that happen to agree to the bit do not make the rule demand bit-equality.
pub const MIN_PATH_NOISE: f64 = 1e-6;

/// A greedy request for `n` tokens with their log-probabilities.
pub(super) fn greedy(prompt: Vec<u32>, n: usize) -> SeqRequest {
    SeqRequest {
        prompt,
        max_tokens: n,
        sampling: SamplingParams::default(),
        stop_ids: Vec::new(),
        logprobs: Some(0),
        grammar: None,
        fast_forward: false,
        speculate: true,
    }
}

/// The three prompts (5, 23 and 41 seeded random tokens) the rung's prompt runs beside.
pub(super) fn neighbours(engine: &Engine) -> Vec<Vec<u32>> {
    let vocab = engine.config().vocab_size() as u64;
    let mut rng = loupe_core::SplitMix64::new(0x6269_7365_6374); // "bisect"
    [5usize, 23, 41].iter().map(|&n| (0..n).map(|_| (rng.next_u64() % vocab) as u32).collect()).collect()
}

/// Steps `be` until every request of `reqs` is done: the first request's tokens, their
/// log-probs, and its prompt tokens served from the prefix cache.
pub(super) fn run_first(be: &mut BatchEngine, reqs: Vec<SeqRequest>) -> Result<(Vec<u32>, Vec<f64>, usize), String> {
    let ids = reqs.into_iter().map(|r| be.add(r)).collect::<Result<Vec<_>, _>>().map_err(|e| e.to_string())?;
    let (mut tokens, mut logprobs, mut cached) = (Vec::new(), Vec::new(), 0);
    while be.has_work() {
        for event in be.step().map_err(|e| e.to_string())? {
            match event {
                SeqEvent::Token { id, token, logprobs: lp } if id == ids[0] => {
                    tokens.push(token);
                    logprobs.push(lp.map_or(f64::NAN, |l| f64::from(l.logprob)));
                }
                SeqEvent::Finished { id, usage, .. } if id == ids[0] => cached = usage.cached_tokens,
                _ => {}
            }
        }
    }
    Ok((tokens, logprobs, cached))
}

/// The batched rung: the prompt among three neighbours with a small token budget per step
/// (so prefill is chunked), then once more alone, when its prompt blocks are cached.
pub fn batched_rung(
    engine: &Engine,
    prompt: &[u32],
    g: &[u32],
    margins: &[f64],
    inc_logprobs: &[f64],
    path_noise: f64,
    tie: f64,
) -> Rung {
    let mut rung = Rung::new("batched", "batching / scheduler (neighbours, chunked prefill, prefix cache)");
    let neighbours = neighbours(engine);
    // Blocks of 4 positions: even a short prompt leaves whole blocks for the prefix cache.
    let config =
        BatchConfig { max_batch_tokens: 24, max_seqs: 8, block_size: 4, prefix_cache: true, ..BatchConfig::default() };
    // (tokens beside neighbours, their log-probs), tokens again from the prefix cache, hits.
    type Runs = ((Vec<u32>, Vec<f64>), Vec<u32>, usize);
    let run = || -> Result<Runs, String> {
        let mut be = BatchEngine::new(engine, config.clone()).map_err(|e| e.to_string())?;
        let mut reqs = vec![greedy(prompt.to_vec(), g.len())];
        reqs.extend(neighbours.iter().map(|p| greedy(p.clone(), g.len())));
        let (first, first_lp, _) = run_first(&mut be, reqs)?;
        let (again, _, hits) = run_first(&mut be, vec![greedy(prompt.to_vec(), g.len())])?;
        Ok(((first, first_lp), again, hits))
    };
    match run() {
        Err(e) => rung.skipped(format!("the batched engine did not run: {e}")),
        Ok(((with_neighbours, logprobs), cached, hits)) => {
            judge(&mut rung, g, &with_neighbours, margins, tie, true);
            rung.logit_diff("log-prob of the step's token", (&with_neighbours, g), (&logprobs, inc_logprobs));
            let diff = rung.max_logit_diff.unwrap_or(0.0);
            // NaN is a fault too, hence not `<=`.
            let beyond = |d: f64| d.is_nan() || d > BATCHED_NOISE_FACTOR * path_noise;
            if rung.status == "match" && beyond(diff) {
                let step = with_neighbours
                    .iter()
                    .zip(g)
                    .zip(logprobs.iter().zip(inc_logprobs))
                    .position(|((a, b), (x, y))| a == b && beyond((x - y).abs()));
                rung.status = "diverged";
                rung.first_mismatch = step;
                rung.detail = format!(
                    "the tokens agree, but the log-probs differ by up to {diff:.3e} (first at step {}), {:.0}x the noise between one pass and step-by-step decode ({path_noise:.2e}); more than {BATCHED_NOISE_FACTOR}x is a fault",
                    step.unwrap_or(0),
                    diff / path_noise
                );
                rung.tokens = Some(with_neighbours);
                return rung;
            }
            if rung.status == "match" {
                let mut again = Rung::new("batched", "");
                judge(&mut again, g, &cached, margins, tie, true);
                if again.status != "match" {
                    rung.status = again.status;
                    rung.first_mismatch = again.first_mismatch;
                    rung.detail = format!("with {hits} prompt tokens from the prefix cache: {}", again.detail);
                } else {
                    rung.detail = format!("{} (beside 3 neighbours with chunked prefill, and again with {hits} prompt tokens from the prefix cache)", rung.detail);
                }
            }
            rung.tokens = Some(with_neighbours);
            rung
        }
    }
}
