//! Running a model under taps into a dump: the work behind `loupe dump` and loupe's side of
//! `loupe parity` and `loupe bisect`. Values are chosen by regex on their names and aliases,
//! written through loupe-parity's [`DumpWriter`] (the dump layout of docs/dump-format.md:
//! manifest.json + one file per tensor, staged and renamed into place) or printed in MAX's
//! COMPACT / FULL styles to a writer the caller gives.
//!
//! It sits here, above loupe-runtime (the engine that runs the model) and loupe-parity (the
//! writer and the print styles), because it needs both; the caller loads the engine (with
//! its own progress display) and tokenizes the prompt, so its errors stay the caller's.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use loupe_graph::{Fault, Observer, Subsystem, ValueInfo};
use loupe_parity::manifest::ModelInfo;
use loupe_parity::print;
use loupe_parity::regex::Regex;
use loupe_parity::{Capture, DumpStyle, DumpWriter, ParityError};
use loupe_runtime::{argmax, Engine, RuntimeError};

/// What a dump refuses or fails on. Every variant but [`TapsError::Run`], [`TapsError::Dump`]
/// and [`TapsError::Print`] is bad input.
#[derive(Debug, thiserror::Error)]
pub enum TapsError {
    #[error("--taps '{pattern}': {source}")]
    Pattern {
        pattern: String,
        #[source]
        source: loupe_parity::regex::Error,
    },
    #[error("--teacher-force gives {given} ids for --steps {steps}")]
    TeacherForce { given: usize, steps: usize },
    #[error(
        "--inject {fault}: that fault lives in the {subsystem}, which loupe dump does not run (loupe bisect and loupe serve plant it)"
    )]
    FaultOutsideGraph { fault: Fault, subsystem: &'static str },
    #[error("{} is an encoder: it runs its input once (no --steps, no chat template)", path.display())]
    Encoder { path: PathBuf },
    #[error("prompt: {prompt} tokens + {steps} steps do not fit the context window of {capacity}")]
    Context { prompt: usize, steps: usize, capacity: usize },
    /// The output directory cannot be created (exists, not writable...).
    #[error("{0}")]
    Output(ParityError),
    /// The model failed while running.
    #[error(transparent)]
    Run(#[from] RuntimeError),
    /// A tensor or the manifest could not be written.
    #[error(transparent)]
    Dump(#[from] ParityError),
    /// The printed tensors could not be written.
    #[error(transparent)]
    Print(#[from] std::io::Error),
}

/// Chooses values by regex.
pub struct TapFilter(Vec<Regex>);

impl TapFilter {
    /// Empty `patterns` select every value.
    pub fn new(patterns: &[String]) -> Result<TapFilter, TapsError> {
        let res = patterns
            .iter()
            .map(|p| Regex::new(p).map_err(|source| TapsError::Pattern { pattern: p.clone(), source }))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(TapFilter(res))
    }

    pub fn selects(&self, v: &ValueInfo) -> bool {
        self.0.is_empty() || std::iter::once(&v.name).chain(&v.aliases).any(|n| self.0.iter().any(|r| r.is_match(n)))
    }
}

/// How captured tensors are printed when they go to a writer instead of files.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PrintStyle {
    /// MAX's COMPACT style.
    Compact,
    /// Every value, `digits` digits after the point.
    Full { digits: usize },
    /// Nothing: the taps run for their side effects only.
    None,
}

/// Where a dump goes.
pub enum Output<'w> {
    /// A dump directory, written atomically.
    Files { dir: &'w Path, style: DumpStyle },
    /// Printed tensors, one per line (a name seen twice in one step as `name(1)`...).
    Print { style: PrintStyle, out: &'w mut dyn Write },
}

/// What to run and what the manifest records about it.
pub struct DumpInput<'a> {
    /// The prompt as given (the manifest records it; `tokens` is what runs).
    pub prompt: &'a str,
    /// Whether a chat template (or a system message) was applied.
    pub chat: bool,
    pub system: Option<&'a str>,
    pub tokens: &'a [u32],
    /// Decode steps after the prompt (step k = the k-th new token).
    pub steps: usize,
    /// Token ids fed at the decode steps instead of greedy choices.
    pub teacher_force: Option<&'a [u32]>,
    /// Faults planted in the engine's graph; a dump with any says so in its manifest.
    pub faults: &'a [Fault],
}

/// What a dump did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DumpSummary {
    /// Tensors in the manifest (0 when printed).
    pub tensors: usize,
    /// The tokens fed at the decode steps.
    pub generated: Vec<u32>,
}

/// Checks what can be checked before the model is loaded: enough teacher-forced ids for the
/// steps, and only faults of the graph (the batched engine's and the server's are planted
/// by `loupe bisect` and `loupe serve`).
pub fn check(steps: usize, teacher_force: Option<&[u32]>, faults: &[Fault]) -> Result<(), TapsError> {
    if let Some(f) = teacher_force {
        if f.len() < steps {
            return Err(TapsError::TeacherForce { given: f.len(), steps });
        }
    }
    if let Some(f) = faults.iter().find(|f| f.class.subsystem() != Subsystem::Graph) {
        let subsystem = if f.class.subsystem() == Subsystem::Server { "server" } else { "batched engine" };
        return Err(TapsError::FaultOutsideGraph { fault: *f, subsystem });
    }
    Ok(())
}

/// Runs the prompt (step 0) and the decode steps of `input` on `engine`, capturing the values
/// `filter` selects into `output`. `progress(done, total)` is called after each step.
pub fn dump(
    engine: &Engine,
    filter: TapFilter,
    input: &DumpInput<'_>,
    output: Output<'_>,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<DumpSummary, TapsError> {
    check(input.steps, input.teacher_force, input.faults)?;
    if engine.is_encoder() && (input.steps > 0 || input.chat) {
        return Err(TapsError::Encoder { path: engine.path().to_path_buf() });
    }
    let sink = match output {
        // Tensors go into a staging directory beside `dir`; only `finish` puts the dump in
        // place, and dropping the writer on an error removes everything.
        Output::Files { dir, style } => {
            Sink::Files(Box::new(DumpWriter::create(dir, "loupe", style).map_err(TapsError::Output)?))
        }
        Output::Print { style, out } => Sink::Print { style, out },
    };
    let mut obs = DumpObserver { filter, sink, step: 0, seen: HashMap::new(), error: None };
    let generated = drive(engine, input, &mut obs, progress)?;
    if let Some(e) = obs.error.take() {
        return Err(e);
    }
    let Sink::Files(mut w) = obs.sink else {
        return Ok(DumpSummary { tensors: 0, generated });
    };
    let m = &mut w.manifest;
    m.model = Some(ModelInfo { path: Some(engine.path().display().to_string()), sha256: None });
    m.prompt = Some(input.prompt.to_string());
    m.chat = Some(input.chat);
    m.system = input.system.map(str::to_string);
    m.prompt_tokens = Some(input.tokens.iter().map(|&t| i64::from(t)).collect());
    m.generated_tokens = Some(generated.iter().map(|&t| i64::from(t)).collect());
    m.precision = Some(engine.precision().name().to_string());
    m.layers = Some(engine.graph().kv_layers);
    // Only a dump with planted faults says so: a normal manifest is unchanged.
    if !input.faults.is_empty() {
        m.faults = Some(input.faults.iter().map(|f| f.to_string()).collect());
    }
    let tensors = m.tensors.len();
    w.finish()?;
    Ok(DumpSummary { tensors, generated })
}

/// Where captured tensors go: the dump writer (files), or a writer of text.
enum Sink<'w> {
    Files(Box<DumpWriter>),
    Print { style: PrintStyle, out: &'w mut dyn Write },
}

/// Writes each selected value as the executor computes it.
struct DumpObserver<'w> {
    filter: TapFilter,
    sink: Sink<'w>,
    step: usize,
    /// Calls per (step, name) for the printed styles (the writer counts its own).
    seen: HashMap<(usize, String), usize>,
    /// The first failure; the observer cannot return one, so the run stops selecting values
    /// and [`dump`] reports it after the forward pass.
    error: Option<TapsError>,
}

impl DumpObserver<'_> {
    fn write(&mut self, info: &ValueInfo, shape: &[usize], data: &[f32]) -> Result<(), TapsError> {
        let (style, out) = match &mut self.sink {
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
            Sink::Print { style: PrintStyle::None, .. } => return Ok(()),
            Sink::Print { style, out } => (*style, out),
        };
        for name in std::iter::once(&info.name).chain(&info.aliases) {
            // A name seen twice in one step is printed as `name(1)`, `name(2)`..., as the
            // writer lists it.
            let count = self.seen.entry((self.step, name.to_string())).or_insert(0);
            let label = if *count == 0 { name.to_string() } else { format!("{name}({count})") };
            *count += 1;
            let line = match style {
                PrintStyle::Full { digits } => print::full(&label, shape, data, digits),
                _ => print::compact(&label, shape, data),
            };
            writeln!(out, "{line}")?;
        }
        Ok(())
    }
}

impl Observer for DumpObserver<'_> {
    fn wants(&mut self, value: &ValueInfo) -> bool {
        self.error.is_none() && self.filter.selects(value)
    }

    fn observe(&mut self, value: &ValueInfo, shape: &[usize], data: &[f32]) {
        if let Err(e) = self.write(value, shape, data) {
            self.error.get_or_insert(e);
        }
    }
}

/// Prefill (step 0), then the decode steps; returns the tokens fed at the decode steps.
fn drive(
    engine: &Engine,
    input: &DumpInput<'_>,
    obs: &mut DumpObserver<'_>,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<Vec<u32>, TapsError> {
    let (prompt, steps) = (input.tokens, input.steps);
    let mut session = engine.session(prompt.len() + steps + 1);
    if prompt.len() + steps >= session.capacity() {
        return Err(TapsError::Context { prompt: prompt.len(), steps, capacity: session.capacity() });
    }
    obs.step = 0;
    let mut next = argmax(
        session
            .forward(prompt, true, Some(obs as &mut dyn Observer))?
            .rchunks(engine.config().vocab_size())
            .next()
            .unwrap_or(&[]),
    );
    progress(1, steps + 1);
    let mut fed = Vec::new();
    for k in 1..=steps {
        // `check` made sure a teacher-forced list covers every step.
        let tok = input.teacher_force.and_then(|f| f.get(k - 1).copied()).unwrap_or(next);
        fed.push(tok);
        obs.step = k;
        next = argmax(session.forward(&[tok], true, Some(obs as &mut dyn Observer))?);
        progress(k + 1, steps + 1);
    }
    Ok(fed)
}
