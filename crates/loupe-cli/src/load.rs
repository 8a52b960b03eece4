//! Loading a model for a command: resolves `--model` (or fetches the default), shows a
//! progress bar, calls [`loupe_runtime::Engine::load`], and turns its errors into what the
//! CLI reports (a usage error for bad input, [`StoppedAfter`] for `stop-after`).

use std::path::{Path, PathBuf};

use indicatif::{ProgressBar, ProgressStyle};
use loupe_graph::debug::DebugOptions;
use loupe_graph::passes::LowerError;
use loupe_graph::Fault;
use loupe_models::Precision;
use loupe_runtime::{Engine, EngineError, LoadOptions, Lowering};

use crate::args::ModelArgs;
use crate::UsageError;

/// Lowering stopped early on purpose (`stop-after`): the command exits 0 with this message.
#[derive(Debug, thiserror::Error)]
#[error("stopped after lowering pass '{pass}' (LOUPE_DEBUG stop-after){where_}")]
pub struct StoppedAfter {
    pub pass: String,
    pub where_: String,
}

/// What a command loads beyond `--model`/`--threads`.
pub struct Load {
    pub precision: Precision,
    pub layers: Option<usize>,
    pub faults: Vec<Fault>,
    pub lowering: Lowering,
    /// `--profile`: every session of the engine reports here.
    pub profiler: Option<loupe_graph::Profiler>,
}

impl Load {
    /// Every layer, no faults, fully lowered.
    pub fn new(precision: Precision) -> Load {
        Load { precision, layers: None, faults: Vec::new(), lowering: Lowering::Full, profiler: None }
    }
}

/// `--model` if given (which must exist), else the default model (fetched if not cached).
pub fn model_path(model: Option<&Path>) -> anyhow::Result<PathBuf> {
    match model {
        Some(p) if !p.exists() => Err(UsageError(format!("{}: no such file or directory", p.display())).into()),
        Some(p) => Ok(p.to_path_buf()),
        None => Ok(loupe_runtime::default_model()?),
    }
}

/// Loads the model of `args` with a progress bar on stderr.
pub fn load(args: &ModelArgs, what: Load, debug: &DebugOptions) -> anyhow::Result<Engine> {
    // Flags first, then files: a bad flag is reported even when the model is missing too.
    if args.threads == Some(0) {
        return Err(UsageError("--threads must be at least 1".into()).into());
    }
    let path = model_path(args.model.as_deref())?;
    let bar = ProgressBar::new(0);
    bar.set_style(
        ProgressStyle::with_template("loading {msg} [{bar:30}] {bytes}/{total_bytes}")
            .map(|s| s.progress_chars("=> "))
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar.set_message(path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default());
    let progress = |done: u64, total: u64| {
        bar.set_length(total);
        bar.set_position(done);
    };
    let options = LoadOptions {
        precision: what.precision,
        threads: args.threads,
        debug: debug.clone(),
        faults: what.faults,
        lowering: what.lowering,
        layers: what.layers,
        progress: Some(&progress),
        kv_dtype: args.kv_dtype,
        profiler: what.profiler,
        weights: args.weights.into(),
    };
    let engine = Engine::load(&path, options);
    bar.finish_and_clear();
    let engine = engine.map_err(cli_error)?;
    if let Some(dir) = &debug.ir_output_dir {
        eprintln!("loupe: wrote {} IR files to {}", engine.ir_files().len(), dir.display());
    }
    Ok(engine)
}

/// How the CLI reports an engine error: bad input is a usage error (exit 2 with one line);
/// `stop-after` prints the IR (unless it went to `ir-output-dir`) and ends the command.
pub fn cli_error(e: EngineError) -> anyhow::Error {
    match e {
        EngineError::StoppedAfter { pass, ir, ir_output_dir } => {
            let where_ = match ir_output_dir {
                Some(dir) => format!("; IR written to {}", dir.display()),
                None => {
                    print!("{ir}");
                    "; IR printed above".to_string()
                }
            };
            StoppedAfter { pass, where_ }.into()
        }
        EngineError::Lower(LowerError::UnknownPass(_)) => UsageError(e.to_string()).into(),
        EngineError::Lower(other) => anyhow::Error::from(other),
        EngineError::NoChatTemplate { .. } => UsageError(format!("{e}; drop --chat")).into(),
        EngineError::DefaultModel(_) => anyhow::Error::from(e),
        other => UsageError(other.to_string()).into(),
    }
}

/// The draft model this process loaded (`--speculate draft`): `loupe bench --batch` asks
/// for the engine's configuration once per round, and loads it once.
static DRAFT_MODEL: std::sync::Mutex<Option<(PathBuf, loupe_runtime::DraftModel)>> = std::sync::Mutex::new(None);

/// The draft model of `--speculate draft` (after checking the speculation flags), loaded as
/// `model` loads the target but from `--draft-model` (once per process); `None` for the
/// other drafters.
pub fn draft_model(
    speculation: &crate::args::SpeculationArgs,
    model: &ModelArgs,
) -> anyhow::Result<Option<loupe_runtime::DraftModel>> {
    speculation.check()?;
    let (crate::args::SpeculateArg::Draft, Some(path)) = (speculation.speculate, &speculation.draft_model) else {
        return Ok(None);
    };
    let mut loaded = DRAFT_MODEL.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((p, draft)) = loaded.as_ref() {
        if p == path {
            return Ok(Some(draft.clone()));
        }
    }
    if !path.exists() {
        return Err(UsageError(format!("--draft-model {}: no such file or directory", path.display())).into());
    }
    let args = ModelArgs { model: Some(path.clone()), ..model.clone() };
    let engine = load(&args, Load::new(speculation.draft_precision()), &DebugOptions::default())?;
    let draft = loupe_runtime::DraftModel::new(engine);
    *loaded = Some((path.clone(), draft.clone()));
    Ok(Some(draft))
}
