//! The Hugging Face reference, produced once per test binary by tests/python/hf_reference.py.
//!
//! Needs python3 with transformers, gguf, accelerate (and torch) and the SmolLM2 GGUF
//! (`loupe_models::real_model_path`: `$LOUPE_MODEL`, else where scripts/fetch-model puts it).
//! The tests are ignored by default; run with `--include-ignored` (scripts/test installs
//! both) they fail with one line when either is missing.
//!
//! The Python run takes about a minute on two cores, so its output is cached under Cargo's
//! target tmpdir, keyed by a hash of the script, the request, the model file's size and mtime,
//! and the installed versions of transformers, tokenizers and gguf. `LOUPE_TEXT_NO_CACHE=1`
//! forces a fresh run.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use serde_json::{json, Value};

use super::cases;

pub struct Fixture {
    /// Parsed output of hf_reference.py.
    pub out: Value,
}

impl Fixture {
    pub fn model(&self, name: &str) -> &Value {
        &self.out["models"][name]
    }
}

/// The reference outputs; panics (in every test that asks, with one line) when Python, its
/// packages or the model are missing, or the script fails. Computed once, so a failure does
/// not re-run Python for every test.
pub fn fixture() -> &'static Fixture {
    static FIXTURE: OnceLock<Result<Fixture, String>> = OnceLock::new();
    match FIXTURE.get_or_init(produce) {
        Ok(f) => f,
        Err(why) => panic!("HF reference unavailable: {why}"),
    }
}

fn model_path() -> Result<PathBuf, String> {
    let path = loupe_models::real_model_path();
    if path.is_file() {
        Ok(path)
    } else {
        Err(format!("needs the real model at {} (missing): run scripts/fetch-model or set LOUPE_MODEL", path.display()))
    }
}

/// Versions of the Python packages, read without importing them (importing transformers alone
/// takes seconds). Fails when one is missing.
fn python_versions() -> Result<String, String> {
    let script = "import importlib.metadata as m\n\
                  print(' '.join(m.version(p) for p in ('transformers', 'tokenizers', 'gguf', 'accelerate', 'torch')))";
    let out = Command::new("python3").args(["-c", script]).output().map_err(|e| format!("cannot run python3: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "python3 lacks transformers/tokenizers/gguf/accelerate/torch: {}",
            String::from_utf8_lossy(&out.stderr).lines().last().unwrap_or("")
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

fn script_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/hf_reference.py")
}

/// FNV-1a, enough to key a cache.
fn fnv(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        for b in part.iter().chain(b"\x00") {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}

fn produce() -> Result<Fixture, String> {
    let model = model_path()?;
    let versions = python_versions()
        .map_err(|why| format!("needs the Python reference stack (scripts/test installs it): {why}"))?;
    let failed = |why: String| format!("the reference failed: {why}");
    let script = std::fs::read(script_path()).map_err(|e| failed(format!("reading the script: {e}")))?;
    let meta = std::fs::metadata(&model).map_err(|e| failed(e.to_string()))?;
    let mtime =
        meta.modified().ok().and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok()).map_or(0, |d| d.as_secs());
    let request_body = json!({
        "smollm2": model,
        "strings": cases::STRINGS,
        "chats": cases::chats(),
        "templates": cases::templates(),
    });
    let key = fnv(&[
        &script,
        request_body.to_string().as_bytes(),
        format!("{} {} {mtime} {versions}", model.display(), meta.len()).as_bytes(),
    ]);
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("loupe-text-hf-{key:016x}"));
    let out_path = dir.join("out.json");
    let fresh = std::env::var_os("LOUPE_TEXT_NO_CACHE").is_some();
    if fresh || !out_path.is_file() {
        run_python(&dir, &request_body).map_err(failed)?;
    }
    let text =
        std::fs::read_to_string(&out_path).map_err(|e| failed(format!("reading {}: {e}", out_path.display())))?;
    let out: Value = serde_json::from_str(&text).map_err(|e| failed(format!("parsing {}: {e}", out_path.display())))?;
    Ok(Fixture { out })
}

fn run_python(dir: &Path, request_body: &Value) -> Result<(), String> {
    // Outputs of older scripts or requests are dead weight (a few MB each): drop them, unless
    // recent enough to belong to a concurrent run.
    let stale = |e: &std::fs::DirEntry| {
        e.metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age.as_secs() > 3600)
    };
    if let Ok(entries) = std::fs::read_dir(env!("CARGO_TARGET_TMPDIR")) {
        for entry in entries.flatten() {
            if entry.file_name().to_string_lossy().starts_with("loupe-text-hf-") && stale(&entry) {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
    }
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
    let mut request = request_body.clone();
    request["workdir"] = json!(dir);
    let request_path = dir.join("request.json");
    std::fs::write(&request_path, request.to_string()).map_err(|e| e.to_string())?;
    let partial = dir.join("out.json.partial");
    let _ = writeln!(std::io::stderr(), "note: running {} (about a minute)", script_path().display());
    let status = Command::new("python3")
        .arg(script_path())
        .arg(&request_path)
        .arg(&partial)
        .status()
        .map_err(|e| format!("cannot run python3: {e}"))?;
    if !status.success() {
        // Python is there with its packages (checked before), so a failure here is a real error.
        return Err(format!("hf_reference.py failed with {status}; see its output above"));
    }
    // Renamed only when complete, so an interrupted run is never taken for a cache hit.
    std::fs::rename(&partial, dir.join("out.json")).map_err(|e| e.to_string())
}

/// `value` as a list of token ids.
pub fn ids(value: &Value) -> Vec<u32> {
    value
        .as_array()
        .unwrap_or_else(|| panic!("expected an id list, got {value}"))
        .iter()
        .map(|v| v.as_u64().and_then(|i| u32::try_from(i).ok()).unwrap_or_else(|| panic!("bad id {v}")))
        .collect()
}
