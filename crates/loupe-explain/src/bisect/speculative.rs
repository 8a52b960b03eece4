//! The speculative rung: the batched rung's setup (the prompt beside three neighbours, chunked
//! prefill) run twice through the batched engine, without speculation and with a drafter that
//! drafts at every step ([`eager_draft`]: prompt lookup from one token, else the last token
//! again), so that steps verify drafts, accept some and reject others.
//!
//! Speculation changes when tokens come, never which: a verified row is computed with a
//! one-token step's arithmetic, so the greedy tokens and their log-probs must be identical bit
//! for bit. Any difference, even at a near tie, is a divergence here (the verify step: its
//! attention mask, the drafts' positions, the KV cache after a rejection).

use loupe_runtime::{ngram_draft, BatchConfig, BatchEngine, Drafter, Engine, SpecStats, SpeculationConfig};

use super::batched::{greedy, neighbours, run_first};
use super::rung::{judge, Rung};

/// Up to 4 drafts a step from [`eager_draft`].
const EAGER: SpeculationConfig = SpeculationConfig { drafter: Drafter::Custom(eager_draft), max_draft: 4 };

/// Prompt lookup as eager as it gets (a repeated single token already proposes its
/// continuation); where nothing repeats, the last token twice more, which a model mostly
/// rejects: a step then verifies a rejection and the cache rolls back past it.
pub fn eager_draft(tokens: &[u32], k: usize) -> Vec<u32> {
    let draft = ngram_draft(tokens, 1, 4, k);
    if !draft.is_empty() {
        return draft;
    }
    tokens.last().map(|&t| vec![t; k.min(2)]).unwrap_or_default()
}

/// The speculative rung over `steps` greedy tokens of `prompt`; `margins` are the incremental
/// rung's top-1/top-2 gaps (reported with a flip, not used to excuse it).
pub fn speculative_rung(engine: &Engine, prompt: &[u32], steps: usize, margins: &[f64]) -> Rung {
    let mut rung = Rung::new("speculative", "speculative decoding (drafts verified in one step)");
    let neighbours = neighbours(engine);
    let run = |speculation: Option<SpeculationConfig>| -> Result<(Vec<u32>, Vec<f64>, SpecStats), String> {
        let config = BatchConfig {
            max_batch_tokens: 24,
            max_seqs: 8,
            block_size: 4,
            prefix_cache: false,
            speculation,
            ..BatchConfig::default()
        };
        let mut be = BatchEngine::new(engine, config).map_err(|e| e.to_string())?;
        let mut reqs = vec![greedy(prompt.to_vec(), steps)];
        reqs.extend(neighbours.iter().map(|p| greedy(p.clone(), steps)));
        let (tokens, logprobs, _) = run_first(&mut be, reqs)?;
        Ok((tokens, logprobs, be.stats().spec))
    };
    let (plain, spec) = match (run(None), run(Some(EAGER))) {
        (Ok(plain), Ok(spec)) => (plain, spec),
        (Err(e), _) | (_, Err(e)) => return rung.skipped(format!("the batched engine did not run: {e}")),
    };
    let ((base, base_lp, _), (tokens, logprobs, stats)) = (plain, spec);
    // A flip is a divergence at any gap: the two runs compute the same rows.
    judge(&mut rung, &base, &tokens, margins, 0.0, true);
    rung.logit_diff("log-prob of the step's token", (&tokens, &base), (&logprobs, &base_lp));
    let drafted = format!(
        "{} verify steps, {} drafts, {} accepted over the {} sequences",
        stats.verify_steps,
        stats.draft_tokens,
        stats.accepted_tokens,
        neighbours.len() + 1
    );
    if rung.status == "match" {
        let differs = |(a, b): (&f64, &f64)| a.to_bits() != b.to_bits();
        if let Some(step) = logprobs.iter().zip(&base_lp).position(differs) {
            rung.status = "diverged";
            rung.first_mismatch = Some(step);
            rung.detail = format!(
                "the tokens agree, but the log-probs differ by up to {:.3e} (first at step {step}) with speculation on ({drafted}): a verified row was not computed as a one-token step computes it",
                rung.max_logit_diff.unwrap_or(f64::NAN)
            );
        } else if stats.verify_steps == 0 {
            rung =
                rung.skipped("no step verified a draft (the sequences ended first), so speculation was not exercised");
        } else {
            rung.detail =
                format!("{} steps and their log-probs bit-identical with speculation on ({drafted})", base.len());
        }
    } else {
        rung.detail = format!("{} with speculation on ({drafted})", rung.detail);
    }
    rung.tokens = Some(tokens);
    rung
}

#[cfg(test)]
mod tests {
    use super::eager_draft;

    #[test]
    fn the_eager_drafter_always_proposes() {
        // The continuation of the last earlier " 7" (one-token lookup) ...
        assert_eq!(eager_draft(&[7, 1, 2, 3, 7], 2), vec![1, 2]);
        // ... or, with nothing repeated, the last token again.
        assert_eq!(eager_draft(&[4, 5, 6], 4), vec![6, 6]);
        assert_eq!(eager_draft(&[4, 5, 6], 1), vec![6]);
        assert!(eager_draft(&[], 4).is_empty());
    }
}
