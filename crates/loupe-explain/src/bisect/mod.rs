//! `loupe bisect`: the bisect ladder of docs/parity-protocol.md (step 5) as library code. The
//! same prompt runs on six rungs, each a subsystem more than the one before:
//!
//! | rung | what runs | a divergence from the rung above means |
//! | --- | --- | --- |
//! | reference | transformers, teacher-forced along loupe's tokens | (the truth) |
//! | teacher-forced | loupe, one forward pass over prompt + tokens | kernels / graph |
//! | incremental | loupe, prefill then one decode step per token (KV cache) | KV cache / positions |
//! | batched | loupe's batched engine, with neighbours, chunked prefill, a prefix-cache hit | batching / scheduler |
//! | speculative | the batched engine without and with speculative decoding (eager prompt lookup) | speculative decoding |
//! | served | `loupe serve` over HTTP, plain and streamed | serving layer (detokenizer, stream) |
//!
//! The tokens compared are loupe's own greedy continuation G (the incremental rung). The
//! reference and teacher-forced rungs are evaluated along G, so a mismatch at one step does
//! not cascade; the batched and served rungs generate greedily and must reproduce G (and
//! its text); the speculative rung must reproduce its own run without speculation bit for
//! bit (tokens and log-probs). A mismatch where the deciding side's top-1/top-2 logit gap is below the tie
//! threshold is a near tie, reported but not a divergence. The first rung that diverges
//! names the subsystem ([`Ladder::conclude`]).
//!
//! What runs outside this process is the caller's: the Python reference
//! ([`TeacherForced`] is its answer), the `loupe serve` child (the served rung gets an
//! [`loupe_client::HttpClient`] of it), and the per-tensor comparison at the divergent step.
//! Module order: [`rung`] is the leaf; [`batched`] and [`served`] read it; [`speculative`]
//! reads both `rung` and `batched`; this module reads all four.

pub mod batched;
pub mod rung;
pub mod served;
pub mod speculative;

use loupe_runtime::{Engine, RuntimeError};
use serde::Serialize;

pub use batched::batched_rung;
pub use rung::Rung;
use rung::{argmax_margins, judge, logprobs_of};
pub use served::served_rung;
pub use speculative::speculative_rung;

/// Why the engine rungs could not run.
#[derive(Debug, thiserror::Error)]
pub enum BisectError {
    #[error("nothing to bisect: {0}")]
    Input(&'static str),
    /// Boxed: a runtime error is large and this is the cold path.
    #[error("rung {rung}: {source}")]
    Engine {
        rung: &'static str,
        #[source]
        source: Box<RuntimeError>,
    },
}

/// The whole ladder (the JSON report).
#[derive(Debug, Serialize)]
pub struct Ladder {
    pub format: &'static str,
    pub prompt_tokens: Vec<u32>,
    pub steps: usize,
    pub precision: &'static str,
    pub rungs: Vec<Rung>,
    pub verdict: &'static str,
    pub first_divergent_rung: Option<&'static str>,
    pub subsystem: Option<&'static str>,
    pub next_step: Option<String>,
    /// The graph rung's per-tensor comparison at the divergent step, when it ran.
    pub first_divergent_tensor: Option<String>,
    pub likely_cause: Option<String>,
    /// The text of every token id the rungs hold, for reading them.
    pub pieces: std::collections::BTreeMap<u32, String>,
}

/// The reference's logits along `prompt + tokens`, teacher-forced: for each position, the
/// argmax and the gap between its top two logits (what `python -m loupe_reference
/// teacher-force --top-logits 2` prints).
#[derive(Debug, Clone)]
pub struct TeacherForced {
    pub prompt_tokens: Vec<u32>,
    pub argmax: Vec<u32>,
    pub margins: Vec<f64>,
    /// The top-1 logit of each position.
    pub top1: Vec<f64>,
}

/// The two single-sequence runs every other rung is measured against.
#[derive(Debug, Clone)]
pub struct EngineRuns {
    /// G: loupe's greedy continuation, prefill then one decode step per token.
    pub greedy: Vec<u32>,
    pub greedy_margins: Vec<f64>,
    /// Log-probability of each token of G at its decode step.
    pub greedy_logprobs: Vec<f64>,
    /// One forward pass over prompt + G[..k-1]: the argmax at each of the k positions.
    pub forced: Vec<u32>,
    pub forced_margins: Vec<f64>,
    /// Log-probability of each token of G in the one-pass logits.
    pub forced_logprobs: Vec<f64>,
    /// The top-1 logit at each position of the one pass.
    pub forced_top1: Vec<f64>,
}

/// Runs the incremental rung (G, `steps` greedy tokens) and the teacher-forced rung along G.
pub fn engine_runs(engine: &Engine, prompt: &[u32], steps: usize) -> Result<EngineRuns, BisectError> {
    if steps == 0 || prompt.is_empty() {
        return Err(BisectError::Input("an empty prompt or no steps"));
    }
    let k = steps;
    let vocab = engine.config().vocab_size();
    let fail = |rung| move |source| BisectError::Engine { rung, source: Box::new(source) };
    let mut session = engine.session(prompt.len() + k);
    let (mut g, mut greedy_margins, mut greedy_logprobs) =
        (Vec::with_capacity(k), Vec::with_capacity(k), Vec::with_capacity(k));
    let mut logits = session.forward(prompt, false, None).map_err(fail("incremental"))?.to_vec();
    for step in 0..k {
        let (t, m) = argmax_margins(&logits, vocab);
        g.push(t[0]);
        greedy_margins.push(m[0]);
        greedy_logprobs.extend(logprobs_of(&logits, vocab, &t));
        if step + 1 < k {
            logits = session.forward(&[t[0]], false, None).map_err(fail("incremental"))?.to_vec();
        }
    }
    // One pass over prompt + G[..k-1]; rows prompt-1 .. end predict G.
    session.reset();
    let mut all = prompt.to_vec();
    all.extend_from_slice(&g[..k - 1]);
    let tf_logits = session.forward(&all, true, None).map_err(fail("teacher-forced"))?;
    let rows = &tf_logits[(prompt.len() - 1) * vocab..];
    let (forced, forced_margins) = argmax_margins(rows, vocab);
    let forced_logprobs = logprobs_of(rows, vocab, &g);
    let forced_top1 = rows.chunks(vocab).zip(&forced).map(|(row, &t)| f64::from(row[t as usize])).collect();
    Ok(EngineRuns { greedy: g, greedy_margins, greedy_logprobs, forced, forced_margins, forced_logprobs, forced_top1 })
}

/// The reference and teacher-forced rungs: the one pass judged against transformers along G
/// (`None`: no reference was run, `skip_why` says why).
pub fn reference_rungs(
    reference: Option<&TeacherForced>,
    skip_why: &str,
    prompt: &[u32],
    runs: &EngineRuns,
    tie: f64,
) -> (Rung, Rung) {
    let mut rung = Rung::new("reference", "(the truth: transformers in f32)");
    let mut tf = Rung::new("teacher-forced", "kernels / graph");
    tf.tokens = Some(runs.forced.clone());
    let Some(r) = reference else {
        tf.detail = "not compared (no reference)".into();
        return (rung.skipped(skip_why), tf);
    };
    if r.prompt_tokens != prompt {
        rung.status = "diverged";
        rung.detail = format!("the reference tokenized the prompt differently: {:?} vs loupe's {:?} (fix the tokenizer or chat template first)", r.prompt_tokens, prompt);
        return (rung, tf);
    }
    let start = prompt.len().saturating_sub(1);
    let ref_argmax = r.argmax.get(start..).unwrap_or_default().to_vec();
    let ref_margins = r.margins.get(start..).unwrap_or_default().to_vec();
    rung.detail = "transformers' argmax along loupe's tokens".into();
    rung.tokens = Some(ref_argmax.clone());
    judge(&mut tf, &ref_argmax, &runs.forced, &ref_margins, tie, false);
    tf.logit_diff(
        "top-1 logit",
        (&runs.forced, &ref_argmax),
        (&runs.forced_top1, r.top1.get(start..).unwrap_or_default()),
    );
    (rung, tf)
}

/// The incremental rung against the one pass, and the noise between those two correct paths
/// (the batched rung's yardstick).
pub fn incremental_rung(runs: &EngineRuns, tie: f64) -> (Rung, f64) {
    let g = &runs.greedy;
    let mut inc = Rung::new("incremental", "KV cache / positions (decode state)");
    judge(&mut inc, &runs.forced, g, &runs.forced_margins, tie, false);
    // Along G on both sides: the same token's log-probability, one pass against step by step.
    inc.logit_diff("log-prob of the step's token", (g, g), (&runs.greedy_logprobs, &runs.forced_logprobs));
    inc.tokens = Some(g.clone());
    let path_noise = inc.max_logit_diff.unwrap_or(0.0).max(batched::MIN_PATH_NOISE);
    (inc, path_noise)
}

impl Ladder {
    /// The ladder of `rungs`, its verdict and next step decided ([`Ladder::conclude`]).
    pub fn new(engine: &Engine, prompt: &[u32], steps: usize, precision: &'static str, rungs: Vec<Rung>) -> Ladder {
        let pieces = rungs
            .iter()
            .filter_map(|r| r.tokens.as_ref())
            .flatten()
            .map(|&t| (t, engine.tokenizer().decode(&[t], false).unwrap_or_default()))
            .collect();
        let mut ladder = Ladder {
            format: "loupe-bisect",
            prompt_tokens: prompt.to_vec(),
            steps,
            precision,
            verdict: "match",
            first_divergent_rung: None,
            subsystem: None,
            next_step: None,
            first_divergent_tensor: None,
            likely_cause: None,
            pieces,
            rungs,
        };
        ladder.conclude();
        ladder
    }

    /// The first diverged rung names the subsystem and the next step to take.
    pub fn conclude(&mut self) {
        let Some(r) = self.rungs.iter().find(|r| r.status == "diverged") else { return };
        self.verdict = "divergence";
        self.first_divergent_rung = Some(r.name);
        self.subsystem = Some(r.subsystem);
        let step = r.first_mismatch.unwrap_or(0);
        self.next_step = Some(match r.name {
            "reference" => "fix the harness first (tokenizer, chat template): docs/parity-protocol.md step 0".into(),
            "teacher-forced" => format!("the per-tensor comparison at decode step {step} is above (first divergent tensor, likely cause); loupe explain REF TARGET --tensor NAME --step {step} on it tests fix hypotheses"),
            "incremental" => format!("the graph is right on one pass but not step by step: compare loupe dump --steps {} against one teacher-forced pass (KV-cache writes, positions, decode-only kernels)", step + 1),
            "batched" => "the batched engine disagrees with the single-sequence one: bench it alone (--max-seqs 1), without the prefix cache (--no-prefix-cache) and without chunking (a larger --max-batch-tokens) to find which one changes the tokens".into(),
            "speculative" => format!("the batched engine is right without speculation and wrong with it, from step {step}: the verify step is the suspect (the draft rows' attention mask, their positions, the KV cache after a rejected draft); loupe generate --speculate ngram against plain loupe generate reproduces it on a single sequence"),
            _ => "the engine is right and the server is not: compare the served token ids with the batched ones (detokenization, stop handling, stream framing)".into(),
        });
    }

    /// The step the graph rung's per-tensor comparison runs at, when the teacher-forced rung
    /// is the first to diverge.
    pub fn graph_step(&self) -> Option<usize> {
        (self.first_divergent_rung == Some("teacher-forced"))
            .then(|| self.rungs.iter().find(|r| r.name == "teacher-forced").and_then(|r| r.first_mismatch).unwrap_or(0))
    }
}
