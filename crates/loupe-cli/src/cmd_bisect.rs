//! `loupe bisect`: the bisect ladder of docs/parity-protocol.md (step 5) as one command. The
//! same prompt runs on five rungs, each a subsystem more than the one before:
//!
//! | rung | what runs | a divergence from the rung above means |
//! | --- | --- | --- |
//! | reference | transformers, teacher-forced along loupe's tokens | (the truth) |
//! | teacher-forced | loupe, one forward pass over prompt + tokens | kernels / graph |
//! | incremental | loupe, prefill then one decode step per token (KV cache) | KV cache / positions |
//! | batched | loupe's batched engine, with neighbours, chunked prefill, a prefix-cache hit | batching / scheduler |
//! | served | `loupe serve` over HTTP, plain and streamed | serving layer (detokenizer, stream) |
//!
//! The tokens compared are loupe's own greedy continuation G (the incremental rung). The
//! reference and teacher-forced rungs are evaluated along G, so a mismatch at one step does
//! not cascade; the batched and served rungs generate greedily and must reproduce G (and
//! its text). A mismatch where the deciding side's top-1/top-2 logit gap is below `--tie`
//! is a near tie, reported but not a divergence. The first rung that diverges names the
//! subsystem; for the graph it then runs the per-tensor comparison at that step.

use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::Args;
use loupe_client::{ServeProcess, SpawnOptions};
use loupe_graph::debug::DebugOptions;
use loupe_graph::Fault;
use loupe_parity::report::{render, RenderOptions};
use loupe_parity::{compare, CompareOptions, NoProgress};
use loupe_runtime::{argmax, BatchConfig, BatchEngine, Engine, SamplingParams, SeqEvent, SeqRequest};
use serde::Serialize;

use crate::args::{precision_name, ModelArgs, PrecisionArg, PromptArgs};
use crate::load::{cli_error, load, model_path, Load};
use crate::taps::{dump, DumpJob, Style};
use crate::UsageError;

#[derive(Args, Debug)]
pub struct BisectArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub input: PromptArgs,
    /// Decode steps compared on every rung.
    #[arg(long, short = 'n', default_value_t = 16)]
    pub steps: usize,
    /// `hf` runs transformers teacher-forced along loupe's tokens; `none` skips that rung.
    #[arg(long, default_value = "hf")]
    pub reference: String,
    /// A flip where the deciding top-1/top-2 logit gap is below this is a near tie, not a
    /// divergence.
    #[arg(long, default_value_t = 1e-3)]
    pub tie: f64,
    /// Plant a fault on every rung that runs its subsystem: graph faults (as `loupe dump
    /// --inject`), batched-engine faults (`block-table@L`, `batch-reduction@L`) and the
    /// server's `stream-drop-last`; the served rung's `loupe serve` gets the same list.
    #[arg(long = "inject", value_name = "CLASS[@LAYER]")]
    pub inject: Vec<Fault>,
    /// Skip the served rung (no server is started).
    #[arg(long)]
    pub no_serve: bool,
    /// Keep the graph rung's dumps here (default: a temporary directory).
    #[arg(short = 'o', long = "output")]
    pub output: Option<PathBuf>,
    /// Write the ladder as JSON to FILE (`-` for stdout, which replaces the table).
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Write a self-contained HTML page: the ladder (verdict, rungs, tokens rung by rung),
    /// then the per-tensor comparison at the divergent step when the graph rung ran.
    #[arg(long, value_name = "FILE")]
    pub html: Option<PathBuf>,
}

/// One rung's outcome against the rung above it.
#[derive(Debug, Clone, Serialize)]
pub struct Rung {
    pub name: &'static str,
    /// What a divergence here implicates.
    pub subsystem: &'static str,
    /// `match`, `diverged`, `near_tie` (a flip at a near tie: later steps not compared),
    /// `skipped`.
    pub status: &'static str,
    /// The first step (0 = the token after the prompt) that differs from the rung above.
    pub first_mismatch: Option<usize>,
    /// Steps where the two disagree at a near tie.
    pub near_ties: Vec<usize>,
    pub detail: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tokens: Option<Vec<u32>>,
    /// The largest logit-level difference from the rung above over the steps where the two
    /// agree on the token, measured as `logit_measure` says (reported, not judged: tokens
    /// and near ties decide the verdict).
    pub max_logit_diff: Option<f64>,
    pub logit_measure: Option<&'static str>,
}

impl Rung {
    fn new(name: &'static str, subsystem: &'static str) -> Rung {
        Rung {
            name,
            subsystem,
            status: "match",
            first_mismatch: None,
            near_ties: Vec::new(),
            detail: String::new(),
            tokens: None,
            max_logit_diff: None,
            logit_measure: None,
        }
    }

    /// Records the largest `|mine − above|` over the steps where both have the same token.
    fn logit_diff(&mut self, measure: &'static str, tokens: (&[u32], &[u32]), values: (&[f64], &[f64])) {
        let d = tokens
            .0
            .iter()
            .zip(tokens.1)
            .zip(values.0.iter().zip(values.1))
            .filter(|((a, b), _)| a == b)
            .map(|(_, (x, y))| (x - y).abs())
            .fold(None, |m: Option<f64>, d| Some(m.map_or(d, |m| m.max(d))));
        self.max_logit_diff = d;
        self.logit_measure = Some(measure);
    }
    fn skipped(mut self, why: impl Into<String>) -> Rung {
        self.status = "skipped";
        self.detail = why.into();
        self
    }
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

/// The batched rung's log-probs may differ from the incremental rung's by this many times the
/// noise between two correct paths of the same engine (one pass against step by step: the
/// same arithmetic in another summation order) before the rung diverges with its tokens
/// still equal. Clean runs measure a ratio under 1 (SmolLM2 f32: 2.2e-6 against 1.4e-5); a
/// block table read one entry late at layer 3 measures 9,000 without flipping a token.
const BATCHED_NOISE_FACTOR: f64 = 100.0;
/// The noise is taken as at least this (about 8 f32 ulps of a log-prob near 1), so two paths
/// that happen to agree to the bit do not make the rule demand bit-equality.
const MIN_PATH_NOISE: f64 = 1e-6;

/// Log-probability of `tokens[i]` under row `i` of `logits` (`vocab` wide).
fn logprobs_of(logits: &[f32], vocab: usize, tokens: &[u32]) -> Vec<f64> {
    logits
        .chunks(vocab)
        .zip(tokens)
        .map(|(row, &t)| f64::from(loupe_runtime::TokenLogprobs::from_logits(row, t, 0).logprob))
        .collect()
}

/// Argmax and top-1/top-2 gap of each row of `logits` (`vocab` wide).
fn argmax_margins(logits: &[f32], vocab: usize) -> (Vec<u32>, Vec<f64>) {
    logits
        .chunks(vocab)
        .map(|row| {
            let best = argmax(row) as usize;
            let second =
                row.iter().enumerate().filter(|(i, _)| *i != best).map(|(_, v)| *v).fold(f32::NEG_INFINITY, f32::max);
            (best as u32, f64::from(row[best]) - f64::from(second))
        })
        .unzip()
}

/// Compares `other` with `base` step by step; `margins` are the deciding side's gaps. A
/// flip at a near tie is noted; `cascades` (greedy rungs) stops at the first flip.
fn judge(rung: &mut Rung, base: &[u32], other: &[u32], margins: &[f64], tie: f64, cascades: bool) {
    for (k, (a, b)) in base.iter().zip(other).enumerate() {
        if a == b {
            continue;
        }
        let gap = margins.get(k).copied().unwrap_or(f64::INFINITY);
        if gap < tie {
            rung.near_ties.push(k);
            if cascades {
                rung.status = "near_tie";
                rung.first_mismatch = Some(k);
                rung.detail = format!("step {k}: {b} instead of {a} at a near tie (gap {gap:.2e}): the sequences part there, later steps are not comparable");
                return;
            }
            continue;
        }
        rung.status = "diverged";
        rung.first_mismatch = Some(k);
        rung.detail =
            format!("step {k}: token {b} instead of {a} (top-1/top-2 gap {gap:.3} above the tie threshold {tie})");
        return;
    }
    if other.len() < base.len() {
        rung.status = "diverged";
        rung.first_mismatch = Some(other.len());
        rung.detail = format!("stopped after {} of {} tokens", other.len(), base.len());
        return;
    }
    if rung.detail.is_empty() {
        rung.detail = if rung.near_ties.is_empty() {
            format!("{} steps identical", base.len())
        } else {
            format!("identical except near ties at steps {:?}", rung.near_ties)
        };
    }
}

pub fn run(args: BisectArgs, debug: &DebugOptions) -> anyhow::Result<u8> {
    if args.steps == 0 {
        return Err(UsageError("--steps must be at least 1".into()).into());
    }
    if !matches!(args.reference.as_str(), "hf" | "none") {
        return Err(UsageError(format!("--reference {}: expected hf or none", args.reference)).into());
    }
    if !(args.tie.is_finite() && args.tie >= 0.0) {
        return Err(UsageError("--tie must be a non-negative number".into()).into());
    }
    if let Some(p) = &args.html {
        crate::output::check_output_file("--html", p)?;
    }
    let model = model_path(args.model.model.as_deref())?;
    let precision = args.model.precision.unwrap_or(PrecisionArg::F32);
    let model_args = ModelArgs { model: Some(model.clone()), precision: Some(precision), ..args.model.clone() };
    let engine = load(&model_args, Load { faults: args.inject.clone(), ..Load::new(precision.into()) }, debug)?;
    let prompt = engine.prompt_tokens(&args.input.prompt()).map_err(cli_error)?;
    let k = args.steps;
    if prompt.len() + k > engine.context_length() {
        return Err(UsageError(format!(
            "{} prompt tokens + {k} steps exceed the context window of {}",
            prompt.len(),
            engine.context_length()
        ))
        .into());
    }
    let vocab = engine.config().vocab_size;

    // Incremental (loupe's normal decode): G and its margins.
    eprintln!("loupe: rung incremental: prefill {} tokens, {k} decode steps", prompt.len());
    let mut session = engine.session(prompt.len() + k);
    let mut g = Vec::with_capacity(k);
    let mut inc_margins = Vec::with_capacity(k);
    let mut inc_logprobs = Vec::with_capacity(k);
    let mut logits = session.forward(&prompt, false, None)?.to_vec();
    for step in 0..k {
        let (t, m) = argmax_margins(&logits, vocab);
        g.push(t[0]);
        inc_margins.push(m[0]);
        inc_logprobs.extend(logprobs_of(&logits, vocab, &t));
        if step + 1 < k {
            logits = session.forward(&[t[0]], false, None)?.to_vec();
        }
    }
    // Teacher-forced: one pass over prompt + G[..k-1]; rows prompt-1 .. end predict G.
    eprintln!("loupe: rung teacher-forced: one forward pass over {} tokens", prompt.len() + k - 1);
    session.reset();
    let mut all: Vec<u32> = prompt.clone();
    all.extend_from_slice(&g[..k - 1]);
    let tf_logits = session.forward(&all, true, None)?;
    let tf_rows = &tf_logits[(prompt.len() - 1) * vocab..];
    let (tf_argmax, tf_margins) = argmax_margins(tf_rows, vocab);
    let tf_logprobs = logprobs_of(tf_rows, vocab, &g);
    let tf_top1: Vec<f64> = tf_rows.chunks(vocab).zip(&tf_argmax).map(|(row, &t)| f64::from(row[t as usize])).collect();
    drop(session);

    let mut rungs = Vec::new();
    // Reference along G.
    let mut reference = Rung::new("reference", "(the truth: transformers in f32)");
    let mut tf = Rung::new("teacher-forced", "kernels / graph");
    tf.tokens = Some(tf_argmax.clone());
    if args.reference == "hf" {
        let r = crate::reference::teacher_force(&model, &args.input, &g[..k - 1])?;
        if r.prompt_tokens != prompt {
            reference.status = "diverged";
            reference.detail = format!("the reference tokenized the prompt differently: {:?} vs loupe's {:?} (fix the tokenizer or chat template first)", r.prompt_tokens, prompt);
        } else {
            let start = prompt.len() - 1;
            let ref_argmax = r.argmax.get(start..).unwrap_or_default().to_vec();
            let ref_margins = r.margins.get(start..).unwrap_or_default().to_vec();
            reference.detail = "transformers' argmax along loupe's tokens".into();
            reference.tokens = Some(ref_argmax.clone());
            judge(&mut tf, &ref_argmax, &tf_argmax, &ref_margins, args.tie, false);
            tf.logit_diff(
                "top-1 logit",
                (&tf_argmax, &ref_argmax),
                (&tf_top1, r.top1.get(start..).unwrap_or_default()),
            );
        }
    } else {
        reference = reference.skipped("--reference none");
        tf.detail = "not compared (no reference)".into();
    }
    rungs.push(reference);
    rungs.push(tf);
    let mut inc = Rung::new("incremental", "KV cache / positions (decode state)");
    judge(&mut inc, &tf_argmax, &g, &tf_margins, args.tie, false);
    // Along G on both sides: the same token's log-probability, one pass against step by step.
    inc.logit_diff("log-prob of the step's token", (&g, &g), (&inc_logprobs, &tf_logprobs));
    inc.tokens = Some(g.clone());
    let path_noise = inc.max_logit_diff.unwrap_or(0.0).max(MIN_PATH_NOISE);
    rungs.push(inc);

    // Batched: neighbours, chunked prefill, then the same prompt again (prefix-cache hit).
    let batched = batched_rung(&engine, &prompt, &g, &inc_margins, &inc_logprobs, path_noise, args.tie);
    // Served: compared with the batched engine (the server runs it), or with G without it.
    let above = batched.tokens.as_deref().filter(|_| batched.status != "skipped").unwrap_or(&g);
    let text = engine.tokenizer().decode(above, true).unwrap_or_default();
    rungs.push(batched);
    let served = Rung::new("served", "serving layer (detokenizer, stream)");
    rungs.push(if args.no_serve {
        served.skipped("--no-serve")
    } else {
        served_rung(&model_args, &args.inject, &prompt, k, &text)
    });

    let mut ladder = Ladder {
        format: "loupe-bisect",
        prompt_tokens: prompt.clone(),
        steps: k,
        precision: precision_name(precision.into()),
        verdict: "match",
        first_divergent_rung: None,
        subsystem: None,
        next_step: None,
        first_divergent_tensor: None,
        likely_cause: None,
        pieces: rungs
            .iter()
            .filter_map(|r| r.tokens.as_ref())
            .flatten()
            .map(|&t| (t, engine.tokenizer().decode(&[t], false).unwrap_or_default()))
            .collect(),
        rungs,
    };
    if let Some(r) = ladder.rungs.iter().find(|r| r.status == "diverged") {
        ladder.verdict = "divergence";
        ladder.first_divergent_rung = Some(r.name);
        ladder.subsystem = Some(r.subsystem);
        let step = r.first_mismatch.unwrap_or(0);
        ladder.next_step = Some(match r.name {
            "reference" => "fix the harness first (tokenizer, chat template): docs/parity-protocol.md step 0".into(),
            "teacher-forced" => format!("the per-tensor comparison at decode step {step} is above (first divergent tensor, likely cause); loupe explain REF TARGET --tensor NAME --step {step} on it tests fix hypotheses"),
            "incremental" => format!("the graph is right on one pass but not step by step: compare loupe dump --steps {} against one teacher-forced pass (KV-cache writes, positions, decode-only kernels)", step + 1),
            "batched" => "the batched engine disagrees with the single-sequence one: bench it alone (--max-seqs 1), without the prefix cache (--no-prefix-cache) and without chunking (a larger --max-batch-tokens) to find which one changes the tokens".into(),
            _ => "the engine is right and the server is not: compare the served token ids with the batched ones (detokenization, stop handling, stream framing)".into(),
        });
    }
    // The graph rung: the per-tensor comparison at the divergent step.
    let mut report = None;
    if ladder.first_divergent_rung == Some("teacher-forced") {
        let step = ladder.rungs[1].first_mismatch.unwrap_or(0);
        match graph_comparison(&args, &model, precision, &g, step, debug) {
            Ok(r) => {
                ladder.first_divergent_tensor = r.verdict.first_divergence.clone();
                ladder.likely_cause = r.verdict.likely_cause.clone();
                report = Some(r);
            }
            Err(e) => eprintln!("loupe: the per-tensor comparison did not run: {e:#}"),
        }
    }
    print(&ladder, &args)?;
    if let Some(p) = &args.html {
        let page = loupe_parity::html::bisect_html(&serde_json::to_value(&ladder)?, report.as_ref());
        std::fs::write(p, page).map_err(|e| anyhow::anyhow!("--html {}: {e}", p.display()))?;
        eprintln!("loupe: wrote the HTML report to {}", p.display());
    }
    Ok(u8::from(ladder.verdict != "match"))
}

/// The batched rung: the prompt among three neighbours with a small token budget per step
/// (so prefill is chunked), then once more alone, when its prompt blocks are cached.
fn batched_rung(
    engine: &Engine,
    prompt: &[u32],
    g: &[u32],
    margins: &[f64],
    inc_logprobs: &[f64],
    path_noise: f64,
    tie: f64,
) -> Rung {
    let mut rung = Rung::new("batched", "batching / scheduler (neighbours, chunked prefill, prefix cache)");
    let greedy = |p: Vec<u32>, n: usize| SeqRequest {
        prompt: p,
        max_tokens: n,
        sampling: SamplingParams::default(),
        stop_ids: Vec::new(),
        logprobs: Some(0),
        grammar: None,
        fast_forward: false,
    };
    let vocab = engine.config().vocab_size as u64;
    let mut rng = loupe_core::SplitMix64::new(0x6269_7365_6374); // "bisect"
    let neighbours: Vec<Vec<u32>> =
        [5usize, 23, 41].iter().map(|&n| (0..n).map(|_| (rng.next_u64() % vocab) as u32).collect()).collect();
    // Blocks of 4 positions: even a short prompt leaves whole blocks for the prefix cache.
    let config =
        BatchConfig { max_batch_tokens: 24, max_seqs: 8, block_size: 4, prefix_cache: true, ..BatchConfig::default() };
    // Steps until every request is done; the first request's tokens, their log-probs, and
    // its prompt tokens served from the prefix cache.
    let run_first = |be: &mut BatchEngine, reqs: Vec<SeqRequest>| -> Result<(Vec<u32>, Vec<f64>, usize), String> {
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
    };
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

/// A `loupe serve` of the same model, precision, threads, KV dtype and faults as the other
/// rungs (the one rule of [`ModelArgs::serve_flags`], plus every `--inject`).
fn start_server(model: &ModelArgs, faults: &[Fault]) -> anyhow::Result<ServeProcess> {
    let exe = std::env::current_exe().context("cannot find the loupe binary")?;
    let mut flags = model.serve_flags();
    for f in faults {
        flags.extend(["--inject".into(), f.to_string().into()]);
    }
    Ok(ServeProcess::spawn(&SpawnOptions::new(exe, flags))?)
}

/// The served rung: the same prompt ids through `/v1/completions`, plain and streamed; both
/// texts must equal the incremental rung's text.
fn served_rung(model: &ModelArgs, faults: &[Fault], prompt: &[u32], k: usize, want: &str) -> Rung {
    let mut rung = Rung::new("served", "serving layer (detokenizer, stream)");
    let result = (|| -> anyhow::Result<(String, String)> {
        eprintln!("loupe: rung served: starting loupe serve on 127.0.0.1");
        let server = start_server(model, faults)?;
        let http = server.client();
        let models: serde_json::Value = serde_json::from_str(&http.ok("GET", "/v1/models", None)?)?;
        let id = models["data"][0]["id"].as_str().unwrap_or("").to_string();
        let req = |stream: bool| serde_json::json!({"model": id, "prompt": prompt, "max_tokens": k, "temperature": 0, "ignore_eos": true, "stream": stream});
        let plain: serde_json::Value = serde_json::from_str(&http.ok("POST", "/v1/completions", Some(&req(false)))?)?;
        let text = plain["choices"][0]["text"].as_str().unwrap_or("").to_string();
        let events =
            loupe_client::Response { status: 200, body: http.ok("POST", "/v1/completions", Some(&req(true)))? };
        let mut streamed = String::new();
        for data in events.sse_data().filter(|d| *d != "[DONE]") {
            let v: serde_json::Value = serde_json::from_str(data)?;
            streamed.push_str(v["choices"][0]["text"].as_str().unwrap_or(""));
        }
        Ok((text, streamed))
    })();
    match result {
        Err(e) => rung.skipped(format!("the server did not answer: {e:#}")),
        Ok((text, streamed)) => {
            if text != want {
                rung.status = "diverged";
                rung.detail = format!("the served text differs from the engine's: {text:?} vs {want:?}");
            } else if streamed != text {
                rung.status = "diverged";
                rung.detail = format!("the streamed text differs from the plain response: {streamed:?} vs {text:?}");
            } else {
                rung.detail = "plain and streamed text identical to the engine's".into();
            }
            rung
        }
    }
}

/// Dumps both sides teacher-forced through `step` and compares them there.
fn graph_comparison(
    args: &BisectArgs,
    model: &Path,
    precision: PrecisionArg,
    g: &[u32],
    step: usize,
    debug: &DebugOptions,
) -> anyhow::Result<loupe_parity::Report> {
    let tmp;
    let root = match &args.output {
        Some(d) => {
            std::fs::create_dir_all(d).with_context(|| d.display().to_string())?;
            d.clone()
        }
        None => {
            tmp = tempfile::tempdir()?;
            tmp.path().to_path_buf()
        }
    };
    let forced = &g[..step];
    let (ref_dir, our_dir) = (root.join("reference"), root.join("loupe"));
    let req = crate::reference::DumpRequest {
        layers: "all",
        taps: &[],
        steps: step,
        teacher_force: (step > 0).then_some(forced),
        dtype: None,
    };
    crate::reference::dump(model, &args.input, &req, &ref_dir)?;
    let job = DumpJob {
        model: ModelArgs { model: Some(model.to_path_buf()), precision: Some(precision), ..args.model.clone() },
        input: args.input.clone(),
        layers: None,
        taps: Vec::new(),
        steps: step,
        teacher_force: (step > 0).then(|| forced.to_vec()),
        output: Some(our_dir.clone()),
        style: Some(Style::Npy),
        digits: 6,
        inject: args.inject.iter().filter(|f| f.class.subsystem() == loupe_graph::Subsystem::Graph).copied().collect(),
    };
    dump(job, debug)?;
    // The page's heat map and per-dimension view need the per-token and per-dim cosines.
    let html = args.html.is_some();
    let opts = CompareOptions { step: Some(step as u32), per_token: html, per_dim: html, ..CompareOptions::default() };
    let report = compare(&ref_dir, &our_dir, &opts, &mut NoProgress)?;
    if args.json.as_deref().is_none_or(|p| p.as_os_str() != "-") {
        println!(
            "per-tensor comparison at decode step {step} (reference {} vs loupe {}):",
            ref_dir.display(),
            our_dir.display()
        );
        print!("{}", render(&report, RenderOptions::default()));
        println!();
    }
    Ok(report)
}

fn print(ladder: &Ladder, args: &BisectArgs) -> anyhow::Result<()> {
    let json = serde_json::to_string_pretty(ladder)?;
    match args.json.as_deref() {
        Some(p) if p.as_os_str() == "-" => {
            println!("{json}");
            return Ok(());
        }
        Some(p) => std::fs::write(p, json + "\n").with_context(|| p.display().to_string())?,
        None => {}
    }
    println!(
        "bisect ladder: {} prompt tokens, {} greedy steps, precision {}",
        ladder.prompt_tokens.len(),
        ladder.steps,
        ladder.precision
    );
    for (i, r) in ladder.rungs.iter().enumerate() {
        let mark = match r.status {
            "match" => "ok",
            "diverged" => "DIVERGED",
            "near_tie" => "near tie",
            _ => "skipped",
        };
        let logits = match (r.max_logit_diff, r.logit_measure) {
            (Some(d), Some(m)) => format!(" [max |Δ {m}| {d:.2e}]"),
            _ => String::new(),
        };
        println!("  {}. {:<15} {:<9} {}{logits}", i + 1, r.name, mark, r.detail);
    }
    match (ladder.first_divergent_rung, ladder.subsystem) {
        (Some(r), Some(s)) => {
            println!("verdict: DIVERGENCE at rung '{r}': {s}");
            if let Some(t) = &ladder.first_divergent_tensor {
                println!("first divergent tensor: {t}");
            }
            if let Some(c) = &ladder.likely_cause {
                println!("likely cause: {c}");
            }
        }
        _ => println!("verdict: MATCH on every rung that ran"),
    }
    if let Some(n) = &ladder.next_step {
        println!("next: {n}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn judging_rungs() {
        let mut r = Rung::new("x", "y");
        judge(&mut r, &[1, 2, 3], &[1, 2, 3], &[1.0; 3], 0.1, false);
        assert_eq!((r.status, r.first_mismatch), ("match", None));
        // A flip at a near tie is noted, not a divergence; a later real flip is.
        let mut r = Rung::new("x", "y");
        judge(&mut r, &[1, 2, 3, 4], &[1, 9, 3, 8], &[1.0, 0.01, 1.0, 1.0], 0.1, false);
        assert_eq!((r.status, r.first_mismatch, r.near_ties.clone()), ("diverged", Some(3), vec![1]));
        // Greedy rungs stop at a near-tie flip: the sequences part there.
        let mut r = Rung::new("x", "y");
        judge(&mut r, &[1, 2, 3], &[1, 9, 7], &[1.0, 0.01, 1.0], 0.1, true);
        assert_eq!((r.status, r.first_mismatch), ("near_tie", Some(1)));
        let mut r = Rung::new("x", "y");
        judge(&mut r, &[1, 2, 3], &[1, 2], &[1.0; 3], 0.1, true);
        assert_eq!((r.status, r.first_mismatch), ("diverged", Some(2)));
    }

    #[test]
    fn margins_are_top1_minus_top2() {
        let (a, m) = argmax_margins(&[0.0, 3.0, 2.5, -1.0, 1.0, 1.0], 3);
        assert_eq!(a, vec![1, 1]);
        assert_eq!(m, vec![0.5, 0.0]);
    }
}
