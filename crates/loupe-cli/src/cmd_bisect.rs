//! `loupe bisect`: the flags, the processes outside this one and the printing around the bisect
//! ladder of docs/parity-protocol.md (step 5), which is library code
//! ([`loupe_explain::bisect`]: the rungs, how each is judged, the verdict). Here: loading the
//! model, the transformers reference (Python), the served rung's `loupe serve` child
//! ([`loupe_client::spawn`]), the graph rung's per-tensor comparison at the divergent step
//! (both dumps and loupe-parity), the table, the JSON and the HTML page.

use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::Args;
use loupe_client::{ServeProcess, SpawnOptions};
use loupe_explain::bisect::{self, Ladder, Rung};
use loupe_graph::debug::DebugOptions;
use loupe_graph::Fault;
use loupe_parity::report::{render, RenderOptions};
use loupe_parity::{compare, CompareOptions, NoProgress};

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
    /// --inject`), batched-engine faults (`block-table@L`, `batch-reduction@L`,
    /// `spec-mask@L`) and the server's `stream-drop-last`; the served rung's `loupe serve`
    /// gets the same list.
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

pub fn run(args: BisectArgs, debug: &DebugOptions) -> anyhow::Result<u8> {
    check_args(&args)?;
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

    eprintln!("loupe: rung incremental: prefill {} tokens, {k} decode steps", prompt.len());
    eprintln!("loupe: rung teacher-forced: one forward pass over {} tokens", prompt.len() + k - 1);
    let runs = bisect::engine_runs(&engine, &prompt, k)?;
    let g = &runs.greedy;
    let reference = match args.reference.as_str() {
        "hf" => Some(crate::reference::teacher_force(&model, &args.input, &g[..k - 1])?),
        _ => None,
    };
    let (reference, tf) = bisect::reference_rungs(reference.as_ref(), "--reference none", &prompt, &runs, args.tie);
    let (inc, path_noise) = bisect::incremental_rung(&runs, args.tie);
    // Batched: neighbours, chunked prefill, then the same prompt again (prefix-cache hit).
    let batched =
        bisect::batched_rung(&engine, &prompt, g, &runs.greedy_margins, &runs.greedy_logprobs, path_noise, args.tie);
    eprintln!("loupe: rung speculative: the batched engine without and with speculation");
    let speculative = bisect::speculative_rung(&engine, &prompt, k, &runs.greedy_margins);
    // Served: compared with the batched engine (the server runs it), or with G without it.
    let above = batched.tokens.as_deref().filter(|_| batched.status != "skipped").unwrap_or(g);
    let text = engine.tokenizer().decode(above, true).unwrap_or_default();
    let served = if args.no_serve {
        Rung::new("served", "serving layer (detokenizer, stream)").skipped("--no-serve")
    } else {
        eprintln!("loupe: rung served: starting loupe serve on 127.0.0.1");
        match start_server(&model_args, &args.inject) {
            Ok(server) => bisect::served_rung(&server.client(), &prompt, k, &text),
            Err(e) => Rung::new("served", "serving layer (detokenizer, stream)")
                .skipped(format!("the server did not answer: {e:#}")),
        }
    };
    let rungs = vec![reference, tf, inc, batched, speculative, served];
    let mut ladder = Ladder::new(&engine, &prompt, k, precision_name(precision.into()), rungs);

    // The graph rung: the per-tensor comparison at the divergent step.
    let mut report = None;
    if let Some(step) = ladder.graph_step() {
        match graph_comparison(&args, &model, precision, g, step, debug) {
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

/// Refuses flag values before anything is loaded.
fn check_args(args: &BisectArgs) -> anyhow::Result<()> {
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
    Ok(())
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
