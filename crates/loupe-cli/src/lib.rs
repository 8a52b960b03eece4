//! The `loupe` command line as a library: argument parsing (clap) and printing over the
//! engine's library crates. `main.rs` only calls [`main`].
//!
//! Shared pieces: [`args`] (flags that mean one thing in every command), [`load`] (loading
//! a model through `loupe_runtime::Engine` with a progress bar), [`debug_setup`] (the
//! `LOUPE_DEBUG` sources, crash handlers, error reports), [`output`] (files written besides
//! stdout). Each `cmd_*` module is one
//! command; no command imports another.
//!
//! Exit codes: 0 success; 1 divergence found (compare/parity); 2 bad usage or bad input,
//! reported as one line on stderr naming the file or field.

pub mod args;
pub mod bandwidth;
pub mod bench_batch;
pub mod bench_common;
pub mod cmd_bench;
pub mod cmd_bench_serve;
pub mod cmd_bisect;
pub mod cmd_compare;
pub mod cmd_dump;
pub mod cmd_embed;
pub mod cmd_explain;
pub mod cmd_generate;
pub mod cmd_inspect;
pub mod cmd_ir;
pub mod cmd_parity;
pub mod cmd_print;
pub mod cmd_quantize;
pub mod cmd_serve;
pub mod debug_setup;
pub mod load;
pub mod output;
pub mod reference;
pub mod taps;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "loupe", version, about = "An LLM inference engine you can see into")]
struct Cli {
    /// Set a LOUPE_DEBUG option (`--debug nan-check --debug nan-check-stride=1`, or a comma
    /// list); overrides LOUPE_DEBUG, LOUPE_DEBUG_<KEY> and loupe.toml. See docs/debugging.md.
    #[arg(long = "debug", global = true, value_name = "KEY[=VALUE]")]
    debug: Vec<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Generate text from a prompt.
    Generate(cmd_generate::GenerateArgs),
    /// Sentence embeddings from an encoder model (BERT; all-MiniLM-L6-v2 by default).
    Embed(cmd_embed::EmbedArgs),
    /// Capture named intermediate tensors (taps) into a dump directory, or print them.
    Dump(cmd_dump::DumpArgs),
    /// Compare two dumps (or tensor files): metrics per tensor, first divergence, likely cause.
    Compare(cmd_compare::CompareArgs),
    /// Print tensor files (.max .npy .npz .pt .safetensors .gguf, dump directories) as MAX
    /// prints them (COMPACT or FULL), to diff against MAX's own stdout.
    Print(cmd_print::PrintArgs),
    /// Dump loupe and the PyTorch reference on one prompt, compare, and give one verdict.
    Parity(cmd_parity::ParityArgs),
    /// The bisect ladder: reference, teacher-forced, incremental, batched, speculative and
    /// served rungs on one prompt; names the first subsystem that diverges.
    Bisect(cmd_bisect::BisectArgs),
    /// Test fix hypotheses for one divergent tensor on the reference's inputs of its op.
    Explain(cmd_explain::ExplainArgs),
    /// List a GGUF or safetensors file's metadata and tensors.
    Inspect(cmd_inspect::InspectArgs),
    /// Write a GGUF with its weight matrices in another type (q4_0 .. q8_0, f16, bf16, f32).
    Quantize(cmd_quantize::QuantizeArgs),
    /// Measure prefill and decode tokens/s like llama-bench (pp<N>, tg<N>; mean ± stddev, peak RSS).
    Bench(cmd_bench::BenchArgs),
    /// Serve the model over an OpenAI-compatible HTTP API (chat, completions, streaming, metrics).
    Serve(cmd_serve::ServeArgs),
    /// Measure a running OpenAI-compatible server (or a `loupe serve` it starts): TTFT, TPOT, ITL, throughput, multi-turn KV retention.
    BenchServe(cmd_bench_serve::BenchServeArgs),
    /// Download a model into the cache and print its path: the default (SmolLM2-135M-Instruct Q4_1) or one of `scripts/fetch-model --list`.
    FetchModel {
        /// smollm2 (the default), qwen2.5-coder-0.5b (Qwen2.5-Coder-0.5B-Instruct, GGUF, 491 MB), gemma3-270m (Gemma 3 270M base, GGUF Q4_K_M, 253 MB) or all-minilm-l6-v2 (sentence-transformers' all-MiniLM-L6-v2, a BERT encoder directory, 91 MB; for `loupe embed`).
        #[arg(default_value = "smollm2")]
        name: String,
    },
    /// Print the model's graph IR after a lowering pass (`--list-passes` lists them).
    Ir(cmd_ir::IrArgs),
    /// List the LOUPE_DEBUG options in effect and where each value came from.
    DebugOptions,
    /// Crash on purpose (segv, abort, ill, fpe, bus): tests stack-trace-on-crash.
    #[command(name = "__crash", hide = true)]
    Crash { kind: String },
}

/// An error the user caused (bad flag, bad file): exit code 2.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct UsageError(pub String);

/// Runs the command line of this process; the exit code follows the rules above.
pub fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let code = if e.use_stderr() { 2 } else { 0 };
            let _ = e.print();
            return ExitCode::from(code);
        }
    };
    let debug = match debug_setup::configure(&cli.debug) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("loupe: error: {}", one_line(&e));
            return ExitCode::from(2);
        }
    };
    let result = match cli.command {
        Command::Ir(args) => cmd_ir::run(args, &debug).map(|()| 0),
        Command::DebugOptions => {
            print!("{}", debug.listing());
            Ok(0)
        }
        Command::Crash { kind } => debug_setup::crash::crash(&kind).map(|()| 0),
        Command::Generate(args) => cmd_generate::run(args, &debug).map(|()| 0),
        Command::Embed(args) => cmd_embed::run(args, &debug).map(|()| 0),
        Command::Inspect(args) => cmd_inspect::run(args).map(|()| 0),
        Command::Quantize(args) => cmd_quantize::run(args).map(|()| 0),
        Command::Dump(args) => cmd_dump::run(args, &debug).map(|()| 0),
        Command::Compare(args) => cmd_compare::run(args),
        Command::Print(args) => cmd_print::run(args).map(|()| 0),
        Command::Parity(args) => cmd_parity::run(args, &debug),
        Command::Bisect(args) => cmd_bisect::run(args, &debug),
        Command::Explain(args) => cmd_explain::run(args),
        Command::Bench(args) => cmd_bench::run(args, &debug).map(|()| 0),
        Command::Serve(args) => cmd_serve::run(args, &debug).map(|()| 0),
        Command::BenchServe(args) => cmd_bench_serve::run(args).map(|()| 0),
        Command::FetchModel { name } => loupe_runtime::fetch_model(&name).map_err(anyhow::Error::from).map(|p| {
            println!("{}", p.display());
            0
        }),
    };
    match result {
        Ok(code) => ExitCode::from(code),
        Err(e) if e.downcast_ref::<load::StoppedAfter>().is_some() => {
            eprintln!("loupe: {e}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            debug_setup::report_error(&e, &one_line(&e), &debug);
            ExitCode::from(2)
        }
    }
}

/// The error and its causes on one line, without repeating a cause the message already holds.
pub(crate) fn one_line(e: &anyhow::Error) -> String {
    let mut out = e.to_string();
    for cause in e.chain().skip(1) {
        let c = cause.to_string();
        if !out.contains(&c) {
            out.push_str(": ");
            out.push_str(&c);
        }
    }
    out.replace('\n', " ")
}
