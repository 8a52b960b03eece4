//! `loupe dump`'s driver on the command line: flags into a [`DumpJob`], the model loaded with
//! its progress bar, and the run handed to [`loupe_explain::taps`] (which runs the model under
//! the taps and writes the dump or prints the tensors). `loupe parity` and `loupe bisect`
//! dump loupe's side through the same [`dump`].

use std::path::PathBuf;

use clap::ValueEnum;
use indicatif::{ProgressBar, ProgressStyle};
use loupe_explain::taps::{self, DumpInput, Output, PrintStyle, TapFilter, TapsError};
use loupe_graph::debug::DebugOptions;
use loupe_graph::Fault;
use loupe_parity::DumpStyle;

use crate::args::{ModelArgs, PrecisionArg, PromptArgs};
use crate::load::{cli_error, load, Load};
use crate::UsageError;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Style {
    /// One .npy per tensor (numpy / PyTorch read them), metadata in manifest.json.
    Npy,
    /// Raw little-endian f32 bytes per tensor; dtype and shape only in manifest.json.
    Binary,
    /// MAX `.max` checkpoint files.
    Max,
    /// Print MAX's COMPACT style to stdout (no files).
    Compact,
    /// Print every value to stdout (no files).
    Full,
    /// Print nothing (print-style=none): run the taps for their side effects only.
    None,
}

/// One dump: what to load, what to run, what to capture and where to put it.
pub struct DumpJob {
    pub model: ModelArgs,
    pub input: PromptArgs,
    pub layers: Option<usize>,
    /// Regexes on value names and aliases; empty captures every value.
    pub taps: Vec<String>,
    /// Decode steps after the prompt (step k = the k-th new token).
    pub steps: usize,
    /// Token ids fed at the decode steps instead of greedy choices.
    pub teacher_force: Option<Vec<u32>>,
    /// Output directory; without it tensors are printed.
    pub output: Option<PathBuf>,
    /// `None`: LOUPE_DEBUG's `print-style` when set, else npy files with an output
    /// directory and COMPACT prints without.
    pub style: Option<Style>,
    /// Digits after the point for `Style::Full`.
    pub digits: usize,
    pub inject: Vec<Fault>,
}

/// The style without `--style`: LOUPE_DEBUG's `print-style` when set, else npy files with
/// `-o` and COMPACT prints without.
fn default_style(to_files: bool, opts: &DebugOptions) -> Style {
    use loupe_graph::debug::PrintStyle as Debug;
    if !opts.sources.contains_key("print-style") {
        return if to_files { Style::Npy } else { Style::Compact };
    }
    match opts.print_style {
        Debug::Compact => Style::Compact,
        Debug::Full => Style::Full,
        Debug::Binary => Style::Binary,
        Debug::BinaryMaxCheckpoint => Style::Max,
        Debug::None => Style::None,
    }
}

/// How the CLI reports a dump error: bad input is a usage error (exit 2 with one line); a
/// failure while running keeps its type, so the graph error's source traceback still shows.
fn dump_error(e: TapsError) -> anyhow::Error {
    match e {
        TapsError::Run(r) => r.into(),
        TapsError::Dump(p) => p.into(),
        TapsError::Print(io) => io.into(),
        other => UsageError(other.to_string()).into(),
    }
}

/// A bar over the steps on stderr, cleared when the dump ends (shown only on a terminal, as
/// indicatif does, and only when there are decode steps to count).
fn step_bar(steps: usize) -> ProgressBar {
    if steps == 0 {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(steps as u64 + 1);
    bar.set_style(
        ProgressStyle::with_template("dumping step {pos}/{len} [{bar:30}]")
            .map(|s| s.progress_chars("=> "))
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar
}

/// Loads the model (f32 unless `--precision` says otherwise), runs the prompt and the decode
/// steps under the taps, and writes or prints what they captured.
pub fn dump(args: DumpJob, debug: &DebugOptions) -> anyhow::Result<()> {
    // Flags first, then the model: a bad flag is reported before a long load.
    let filter = TapFilter::new(&args.taps).map_err(dump_error)?;
    taps::check(args.steps, args.teacher_force.as_deref(), &args.inject).map_err(dump_error)?;
    let style = args.style.unwrap_or_else(|| default_style(args.output.is_some(), debug));
    let file_style = match style {
        Style::Npy => Some(DumpStyle::Npy),
        Style::Binary => Some(DumpStyle::Binary),
        Style::Max => Some(DumpStyle::Max),
        Style::Compact | Style::Full | Style::None => None,
    };
    if args.output.is_none() && file_style.is_some() {
        return Err(UsageError(format!("--style {style:?} writes files: give -o DIR")).into());
    }
    let what = Load {
        layers: args.layers,
        faults: args.inject.clone(),
        ..Load::new(args.model.precision_or(PrecisionArg::F32))
    };
    let engine = load(&args.model, what, debug)?;
    let tokens = engine.prompt_tokens(&args.input.prompt()).map_err(cli_error)?;
    let input = DumpInput {
        prompt: &args.input.prompt,
        chat: args.input.chat || args.input.system.is_some(),
        system: args.input.system.as_deref(),
        tokens: &tokens,
        steps: args.steps,
        teacher_force: args.teacher_force.as_deref(),
        faults: &args.inject,
    };
    let mut stdout = std::io::stdout();
    let output = match (&args.output, file_style) {
        (Some(dir), Some(style)) => Output::Files { dir, style },
        _ => {
            let style = match style {
                Style::Full => PrintStyle::Full { digits: args.digits },
                Style::None => PrintStyle::None,
                _ => PrintStyle::Compact,
            };
            Output::Print { style, out: &mut stdout }
        }
    };
    let bar = step_bar(args.steps);
    let done = taps::dump(&engine, filter, &input, output, &mut |done, _total| bar.set_position(done as u64));
    bar.finish_and_clear();
    let summary = done.map_err(dump_error)?;
    if let (Some(out), Some(_)) = (&args.output, file_style) {
        eprintln!("loupe: dumped {} tensors ({} steps) to {}", summary.tensors, args.steps + 1, out.display());
    }
    Ok(())
}
