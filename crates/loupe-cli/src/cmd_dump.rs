//! `loupe dump`: run the model and capture named values (taps) without touching model code,
//! into the dump layout of docs/dump-format.md (manifest.json + one file per tensor) or printed in
//! MAX's COMPACT / FULL styles.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::{Args, ValueEnum};
use loupe_graph::debug::DebugOptions;
use loupe_graph::{Observer, ValueInfo};
use loupe_runtime::{argmax, Engine};
use regex::Regex;
use serde_json::{json, Value};

use crate::args::{parse_ids, parse_layers, precision_name, ModelArgs, PrecisionArg, PromptArgs};
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

#[derive(Args, Debug)]
pub struct DumpArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub input: PromptArgs,
    /// Keep only the first N decoder layers (`all` keeps every layer).
    #[arg(long, default_value = "all")]
    pub layers: String,
    /// Capture only values whose name (or alias) matches one of these regexes (repeatable).
    #[arg(long = "taps")]
    pub taps: Vec<String>,
    /// Also run K decode steps after the prompt and dump each (step k = the k-th new token).
    #[arg(long, default_value_t = 0)]
    pub steps: usize,
    /// Comma-separated token ids fed at the decode steps instead of greedy choices.
    #[arg(long)]
    pub teacher_force: Option<String>,
    /// Output directory (written atomically). Without it, tensors are printed in COMPACT style.
    #[arg(short = 'o', long = "output")]
    pub output: Option<PathBuf>,
    #[arg(long, value_enum)]
    pub style: Option<Style>,
    /// Digits after the point for --style full.
    #[arg(long, default_value_t = 6)]
    pub digits: usize,
    /// Stored element type (loupe computes in f32, so both store f32).
    #[arg(long, default_value = "f32", value_parser = ["f32", "native"])]
    pub dtype: String,
    /// Plant a bug in loupe's own graph at decoder layer LAYER (repeatable), to test the
    /// parity tools against a known answer. CLASS: rope-interleaved, transposed-weight,
    /// norm-eps, gelu-tanh, softmax-scale, gqa-mapping, missing-residual, bf16, kv-write, mask.
    #[arg(long = "inject", value_name = "CLASS@LAYER")]
    pub inject: Vec<loupe_models::Fault>,
}

/// Chooses values by regex.
pub struct TapFilter(Vec<Regex>);

impl TapFilter {
    pub fn new(patterns: &[String]) -> anyhow::Result<TapFilter> {
        let res = patterns.iter().map(|p| Regex::new(p).map_err(|e| UsageError(format!("--taps '{p}': {e}")).into())).collect::<anyhow::Result<Vec<_>>>()?;
        Ok(TapFilter(res))
    }

    pub fn selects(&self, v: &ValueInfo) -> bool {
        self.0.is_empty() || std::iter::once(&v.name).chain(&v.aliases).any(|n| self.0.iter().any(|r| r.is_match(n)))
    }
}

/// Where captured tensors go.
enum Sink {
    Files { dir: PathBuf, style: Style },
    Print { style: Style, digits: usize },
}

/// The observer behind `loupe dump`: writes each selected value as the executor computes it.
struct DumpObserver {
    filter: TapFilter,
    sink: Sink,
    step: usize,
    order: usize,
    entries: Vec<Value>,
    seen: HashMap<(usize, String), usize>,
    error: Option<anyhow::Error>,
}

impl DumpObserver {
    fn write(&mut self, name: &str, info: &ValueInfo, shape: &[usize], data: &[f32]) -> anyhow::Result<()> {
        // A name seen twice in one step is recorded as `name(1)`, `name(2)`... never overwritten.
        let count = self.seen.entry((self.step, name.to_string())).or_insert(0);
        let label = if *count == 0 { name.to_string() } else { format!("{name}({count})") };
        *count += 1;
        match &self.sink {
            Sink::Print { style: Style::None, .. } => {}
            Sink::Print { style, digits } => {
                let line = match style {
                    Style::Full => tensor_print::full(&label, shape, data, *digits),
                    _ => tensor_print::compact(&label, shape, data),
                };
                let mut out = std::io::stdout().lock();
                writeln!(out, "{line}")?;
            }
            Sink::Files { dir, style } => {
                let sub = format!("step{}", self.step);
                std::fs::create_dir_all(dir.join(&sub))?;
                let file = match style {
                    Style::Max => {
                        let f = format!("{sub}/{}.max", loupe_formats::max_file::sanitize_label(&label));
                        loupe_formats::max_file::write_max(dir.join(&f), &loupe_formats::max_file::sanitize_label(&label), shape, data)?;
                        f
                    }
                    Style::Binary => {
                        let f = format!("{sub}/{label}.bin");
                        let bytes: Vec<u8> = data.iter().flat_map(|v| v.to_le_bytes()).collect();
                        std::fs::write(dir.join(&f), bytes)?;
                        f
                    }
                    _ => {
                        let f = format!("{sub}/{label}.npy");
                        loupe_formats::npy::write_npy(dir.join(&f), shape, data)?;
                        f
                    }
                };
                self.entries.push(json!({
                    "name": label, "step": self.step, "order": self.order, "file": file, "dtype": "f32",
                    "shape": shape, "axes": info.axes, "stats": loupe_parity::manifest::Stats::of(data),
                }));
            }
        }
        self.order += 1;
        Ok(())
    }
}

impl Observer for DumpObserver {
    fn wants(&mut self, value: &ValueInfo) -> bool {
        self.error.is_none() && self.filter.selects(value)
    }

    fn observe(&mut self, value: &ValueInfo, shape: &[usize], data: &[f32]) {
        for name in std::iter::once(&value.name).chain(&value.aliases) {
            if let Err(e) = self.write(name, value, shape, data) {
                self.error.get_or_insert(e);
            }
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

pub fn run(args: DumpArgs, debug: &DebugOptions) -> anyhow::Result<()> {
    let layers = parse_layers(&args.layers)?;
    let filter = TapFilter::new(&args.taps)?;
    let forced = args.teacher_force.as_deref().map(|s| parse_ids("--teacher-force", s)).transpose()?;
    if let Some(f) = &forced {
        if f.len() < args.steps {
            return Err(UsageError(format!("--teacher-force gives {} ids for --steps {}", f.len(), args.steps)).into());
        }
    }
    let style = args.style.unwrap_or_else(|| default_style(args.output.is_some(), debug));
    let what = Load { layers, faults: args.inject.clone(), ..Load::new(args.model.precision_or(PrecisionArg::F32)) };
    let engine = load(&args.model, what, debug)?;
    let tokens = engine.prompt_tokens(&args.input.prompt()).map_err(cli_error)?;

    let files = matches!(style, Style::Npy | Style::Binary | Style::Max);
    let (tmp, sink) = match (&args.output, files) {
        (Some(out), true) => {
            let tmp = staging_dir(out)?;
            (Some(tmp.clone()), Sink::Files { dir: tmp, style })
        }
        (None, true) => return Err(UsageError(format!("--style {style:?} writes files: give -o DIR")).into()),
        (_, false) => (None, Sink::Print { style, digits: args.digits }),
    };
    let mut obs = DumpObserver { filter, sink, step: 0, order: 0, entries: Vec::new(), seen: HashMap::new(), error: None };
    let result = drive(&engine, &tokens, args.steps, forced.as_deref(), &mut obs);
    let result = result.and_then(|generated| match obs.error.take() {
        Some(e) => Err(e),
        None => Ok(generated),
    });
    let generated = match result {
        Ok(g) => g,
        Err(e) => {
            if let Some(t) = &tmp {
                let _ = std::fs::remove_dir_all(t);
            }
            return Err(e);
        }
    };
    if let (Some(tmp), Some(out)) = (tmp, &args.output) {
        let mut manifest = json!({
            "format": "loupe-dump", "version": 1,
            "producer": {"engine": "loupe", "version": env!("CARGO_PKG_VERSION")},
            "model": {"path": engine.path(), "sha256": Value::Null},
            "prompt": args.input.prompt, "chat": args.input.chat || args.input.system.is_some(), "system": args.input.system,
            "prompt_tokens": tokens, "generated_tokens": generated,
            "precision": precision_name(engine.precision()),
            "layers": engine.graph().kv_layers,
            "tensors": obs.entries,
        });
        // Only a dump with planted faults says so: a normal manifest is unchanged.
        if !args.inject.is_empty() {
            manifest["faults"] = json!(args.inject.iter().map(|f| f.to_string()).collect::<Vec<_>>());
        }
        let finish = || -> anyhow::Result<()> {
            std::fs::write(tmp.join("manifest.json"), serde_json::to_vec_pretty(&manifest)?)?;
            if out.exists() {
                std::fs::remove_dir_all(out).with_context(|| format!("{}: cannot replace the old dump", out.display()))?;
            }
            std::fs::rename(&tmp, out).with_context(|| format!("{}: cannot move the dump into place", out.display()))
        };
        if let Err(e) = finish() {
            let _ = std::fs::remove_dir_all(&tmp);
            return Err(e);
        }
        eprintln!("loupe: dumped {} tensors ({} steps) to {}", manifest["tensors"].as_array().map_or(0, |a| a.len()), args.steps + 1, out.display());
    }
    Ok(())
}

/// A fresh directory beside `out` to write into; `out` itself may only be replaced if it is
/// an earlier dump (has a manifest.json) or empty.
fn staging_dir(out: &Path) -> anyhow::Result<PathBuf> {
    if out.exists() {
        let is_dump = out.join("manifest.json").is_file();
        let is_empty = std::fs::read_dir(out).map(|mut d| d.next().is_none()).unwrap_or(false);
        if !(is_dump || is_empty) {
            return Err(UsageError(format!("{}: exists and is not a loupe dump; choose another -o", out.display())).into());
        }
    }
    let parent = out.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    std::fs::create_dir_all(parent).map_err(|e| UsageError(format!("{}: {e}", parent.display())))?;
    let name = out.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "dump".into());
    let tmp = parent.join(format!(".{name}.partial-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).map_err(|e| UsageError(format!("{}: {e}", tmp.display())))?;
    Ok(tmp)
}

/// Prefill (step 0), then `steps` decode steps; returns the tokens fed at the decode steps.
fn drive(engine: &Engine, prompt: &[u32], steps: usize, forced: Option<&[u32]>, obs: &mut DumpObserver) -> anyhow::Result<Vec<u32>> {
    let mut session = engine.session(prompt.len() + steps + 1);
    if prompt.len() + steps >= session.capacity() {
        return Err(UsageError(format!("prompt: {} tokens + {steps} steps do not fit the context window of {}", prompt.len(), session.capacity())).into());
    }
    obs.step = 0;
    let mut next = argmax(session.forward(prompt, true, Some(obs as &mut dyn Observer))?.rchunks(engine.config().vocab_size).next().unwrap_or(&[]));
    let mut fed = Vec::new();
    for k in 1..=steps {
        let tok = forced.map(|f| f[k - 1]).unwrap_or(next);
        fed.push(tok);
        obs.step = k;
        next = argmax(session.forward(&[tok], true, Some(obs as &mut dyn Observer))?);
    }
    Ok(fed)
}
