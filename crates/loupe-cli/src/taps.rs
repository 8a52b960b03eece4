//! Running a model under taps into a dump: the work behind `loupe dump` and loupe's side of
//! `loupe parity` (both build a [`DumpJob`]). Values are chosen by regex on their names and
//! aliases, written through loupe-parity's `DumpWriter` (the dump layout of
//! docs/dump-format.md: manifest.json + one file per tensor, staged and renamed into place)
//! or printed in MAX's COMPACT / FULL styles.

use std::collections::HashMap;
use std::io::Write;
use std::path::PathBuf;

use clap::ValueEnum;
use loupe_graph::debug::DebugOptions;
use loupe_graph::{Fault, Observer, ValueInfo};
use loupe_parity::manifest::ModelInfo;
use loupe_parity::{Capture, DumpStyle, DumpWriter};
use loupe_runtime::{argmax, Engine};
use regex::Regex;

use crate::args::{precision_name, ModelArgs, PrecisionArg, PromptArgs};
use crate::load::{cli_error, load, Load};
use crate::{tensor_print, UsageError};

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

/// Chooses values by regex.
pub struct TapFilter(Vec<Regex>);

impl TapFilter {
    pub fn new(patterns: &[String]) -> anyhow::Result<TapFilter> {
        let res = patterns
            .iter()
            .map(|p| Regex::new(p).map_err(|e| UsageError(format!("--taps '{p}': {e}")).into()))
            .collect::<anyhow::Result<Vec<_>>>()?;
        Ok(TapFilter(res))
    }

    pub fn selects(&self, v: &ValueInfo) -> bool {
        self.0.is_empty() || std::iter::once(&v.name).chain(&v.aliases).any(|n| self.0.iter().any(|r| r.is_match(n)))
    }
}

/// Where captured tensors go: the dump writer (files), or stdout.
enum Sink {
    Files(Box<DumpWriter>),
    Print { style: Style, digits: usize },
}

/// The observer behind `loupe dump`: writes each selected value as the executor computes it.
struct DumpObserver {
    filter: TapFilter,
    sink: Sink,
    step: usize,
    /// Calls per (step, name) for the printed styles (the writer counts its own).
    seen: HashMap<(usize, String), usize>,
    error: Option<anyhow::Error>,
}

impl DumpObserver {
    fn write(&mut self, info: &ValueInfo, shape: &[usize], data: &[f32]) -> anyhow::Result<()> {
        let (style, digits) = match &mut self.sink {
            Sink::Files(w) => {
                let c = Capture {
                    name: &info.name,
                    aliases: &info.aliases,
                    step: self.step as u32,
                    shape,
                    axes: &info.axes,
                    data,
                };
                w.capture(&c)?;
                return Ok(());
            }
            Sink::Print { style: Style::None, .. } => return Ok(()),
            Sink::Print { style, digits } => (*style, *digits),
        };
        let mut out = std::io::stdout().lock();
        for name in std::iter::once(&info.name).chain(&info.aliases) {
            // A name seen twice in one step is printed as `name(1)`, `name(2)`..., as the
            // writer lists it.
            let count = self.seen.entry((self.step, name.to_string())).or_insert(0);
            let label = if *count == 0 { name.to_string() } else { format!("{name}({count})") };
            *count += 1;
            let line = match style {
                Style::Full => tensor_print::full(&label, shape, data, digits),
                _ => tensor_print::compact(&label, shape, data),
            };
            writeln!(out, "{line}")?;
        }
        Ok(())
    }
}

impl Observer for DumpObserver {
    fn wants(&mut self, value: &ValueInfo) -> bool {
        self.error.is_none() && self.filter.selects(value)
    }

    fn observe(&mut self, value: &ValueInfo, shape: &[usize], data: &[f32]) {
        if let Err(e) = self.write(value, shape, data) {
            self.error.get_or_insert(e);
        }
    }
}

/// The style without `--style`: LOUPE_DEBUG's `print-style` when set, else npy files with
/// `-o` and COMPACT prints without.
fn default_style(to_files: bool, opts: &DebugOptions) -> Style {
    use loupe_graph::debug::PrintStyle;
    if !opts.sources.contains_key("print-style") {
        return if to_files { Style::Npy } else { Style::Compact };
    }
    match opts.print_style {
        PrintStyle::Compact => Style::Compact,
        PrintStyle::Full => Style::Full,
        PrintStyle::Binary => Style::Binary,
        PrintStyle::BinaryMaxCheckpoint => Style::Max,
        PrintStyle::None => Style::None,
    }
}

/// Loads the model (f32 unless `--precision` says otherwise), runs the prompt and the decode
/// steps under the taps, and writes or prints what they captured.
pub fn dump(args: DumpJob, debug: &DebugOptions) -> anyhow::Result<()> {
    let filter = TapFilter::new(&args.taps)?;
    let forced = args.teacher_force.clone();
    if let Some(f) = &forced {
        if f.len() < args.steps {
            return Err(UsageError(format!("--teacher-force gives {} ids for --steps {}", f.len(), args.steps)).into());
        }
    }
    if let Some(f) = args.inject.iter().find(|f| f.class.subsystem() != loupe_graph::Subsystem::Graph) {
        return Err(UsageError(format!(
            "--inject {f}: that fault lives in the {}, which loupe dump does not run (loupe bisect and loupe serve plant it)",
            if f.class.subsystem() == loupe_graph::Subsystem::Server { "server" } else { "batched engine" }
        ))
        .into());
    }
    let layers = args.layers;
    let style = args.style.unwrap_or_else(|| default_style(args.output.is_some(), debug));
    let what = Load { layers, faults: args.inject.clone(), ..Load::new(args.model.precision_or(PrecisionArg::F32)) };
    let engine = load(&args.model, what, debug)?;
    let tokens = engine.prompt_tokens(&args.input.prompt()).map_err(cli_error)?;
    if engine.is_encoder() && (args.steps > 0 || args.input.chat || args.input.system.is_some()) {
        return Err(UsageError(format!(
            "{} is an encoder: it runs its input once (no --steps, no chat template)",
            engine.path().display()
        ))
        .into());
    }

    let file_style = match style {
        Style::Npy => Some(DumpStyle::Npy),
        Style::Binary => Some(DumpStyle::Binary),
        Style::Max => Some(DumpStyle::Max),
        Style::Compact | Style::Full | Style::None => None,
    };
    let sink = match (&args.output, file_style) {
        // Tensors go into a staging directory beside `out`; only `finish` puts the dump in
        // place, and dropping the writer on an error removes everything.
        (Some(out), Some(fs)) => {
            Sink::Files(Box::new(DumpWriter::create(out, "loupe", fs).map_err(|e| UsageError(e.to_string()))?))
        }
        (None, Some(_)) => return Err(UsageError(format!("--style {style:?} writes files: give -o DIR")).into()),
        (_, None) => Sink::Print { style, digits: args.digits },
    };
    let mut obs = DumpObserver { filter, sink, step: 0, seen: HashMap::new(), error: None };
    let generated = drive(&engine, &tokens, args.steps, forced.as_deref(), &mut obs)?;
    if let Some(e) = obs.error.take() {
        return Err(e);
    }
    if let (Sink::Files(mut w), Some(out)) = (obs.sink, &args.output) {
        let m = &mut w.manifest;
        m.model = Some(ModelInfo { path: Some(engine.path().display().to_string()), sha256: None });
        m.prompt = Some(args.input.prompt.clone());
        m.chat = Some(args.input.chat || args.input.system.is_some());
        m.system = args.input.system.clone();
        m.prompt_tokens = Some(tokens.iter().map(|&t| i64::from(t)).collect());
        m.generated_tokens = Some(generated.iter().map(|&t| i64::from(t)).collect());
        m.precision = Some(precision_name(engine.precision()).to_string());
        m.layers = Some(engine.graph().kv_layers);
        // Only a dump with planted faults says so: a normal manifest is unchanged.
        if !args.inject.is_empty() {
            m.faults = Some(args.inject.iter().map(|f| f.to_string()).collect());
        }
        let n = m.tensors.len();
        w.finish()?;
        eprintln!("loupe: dumped {n} tensors ({} steps) to {}", args.steps + 1, out.display());
    }
    Ok(())
}

/// Prefill (step 0), then `steps` decode steps; returns the tokens fed at the decode steps.
fn drive(
    engine: &Engine,
    prompt: &[u32],
    steps: usize,
    forced: Option<&[u32]>,
    obs: &mut DumpObserver,
) -> anyhow::Result<Vec<u32>> {
    let mut session = engine.session(prompt.len() + steps + 1);
    if prompt.len() + steps >= session.capacity() {
        return Err(UsageError(format!(
            "prompt: {} tokens + {steps} steps do not fit the context window of {}",
            prompt.len(),
            session.capacity()
        ))
        .into());
    }
    obs.step = 0;
    let mut next = argmax(
        session
            .forward(prompt, true, Some(obs as &mut dyn Observer))?
            .rchunks(engine.config().vocab_size)
            .next()
            .unwrap_or(&[]),
    );
    let mut fed = Vec::new();
    for k in 1..=steps {
        let tok = forced.map(|f| f[k - 1]).unwrap_or(next);
        fed.push(tok);
        obs.step = k;
        next = argmax(session.forward(&[tok], true, Some(obs as &mut dyn Observer))?);
    }
    Ok(fed)
}
