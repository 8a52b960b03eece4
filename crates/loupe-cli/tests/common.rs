//! Shared helpers of the CLI integration tests.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The real model: `$LOUPE_MODEL`, else the default cache path. `None` (test skipped with a
/// note) when absent, except under CI (`CI` set), where its absence fails the test: CI's
/// `.ci/run` fetches it.
pub fn real_model() -> Option<PathBuf> {
    let path = std::env::var_os("LOUPE_MODEL").map(PathBuf::from).unwrap_or_else(|| {
        let base = std::env::var_os("LOUPE_CACHE_DIR")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("XDG_CACHE_HOME").map(|x| PathBuf::from(x).join("loupe")))
            .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/loupe"));
        base.join("models/SmolLM2-135M-Instruct.Q4_1.gguf")
    });
    if path.is_file() {
        return Some(path);
    }
    if std::env::var_os("CI").is_some() {
        panic!("the model {} is missing; .ci/run must fetch it (scripts/fetch-model)", path.display());
    }
    eprintln!("skipping: model {} not found (run scripts/fetch-model)", path.display());
    None
}

/// Whether the Python reference stack is importable; required under CI.
pub fn python_reference() -> bool {
    let ok = Command::new("python3").args(["-c", "import loupe_reference, torch, transformers, gguf"]).output().map(|o| o.status.success()).unwrap_or(false);
    if !ok {
        if std::env::var_os("CI").is_some() {
            panic!("python3 cannot import loupe_reference/torch/transformers/gguf; .ci/run must install them");
        }
        eprintln!("skipping: python reference stack not installed (pip install -e reference/)");
    }
    ok
}

pub fn loupe() -> Command {
    Command::new(env!("CARGO_BIN_EXE_loupe"))
}

pub fn run(cmd: &mut Command) -> Output {
    cmd.output().expect("cannot start loupe")
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// A clean usage/input failure: exit 2, no panic, exactly one `loupe: error:` line on
/// stderr that mentions `needle`, nothing on stdout.
pub fn assert_clean_failure(out: &Output, needle: &str) {
    let err = stderr(out);
    assert_eq!(out.status.code(), Some(2), "expected exit 2, got {:?}; stderr: {err}", out.status.code());
    assert!(!err.contains("panicked"), "panic: {err}");
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "expected one error line, got: {err}");
    assert!(lines[0].starts_with("loupe: error: "), "{err}");
    assert!(err.contains(needle), "error should mention '{needle}': {err}");
    assert!(stdout(out).is_empty(), "no output expected on stdout: {}", stdout(out));
}

pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap()
}

/// A golden file of `tests/golden/smollm2-q4_1/`.
#[derive(Debug, serde::Deserialize)]
pub struct Golden {
    pub name: String,
    pub prompt: String,
    pub chat: bool,
    pub system: Option<String>,
    pub max_tokens: usize,
    pub prompt_tokens: Vec<u32>,
    pub tokens: Vec<u32>,
    pub text: String,
    pub argmax: Vec<u32>,
    #[serde(default)]
    pub margins: Vec<f64>,
}

pub fn goldens() -> Vec<Golden> {
    let dir = repo_root().join("tests/golden/smollm2-q4_1");
    let mut out: Vec<Golden> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .map(|p| serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap_or_else(|e| panic!("{}: {e}", p.display())))
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    assert!(out.len() >= 6, "expected at least 6 goldens in {}", dir.display());
    out
}

/// `loupe generate` arguments reproducing a golden's prompt.
pub fn prompt_args(g: &Golden) -> Vec<String> {
    let mut a = vec![g.prompt.clone()];
    if g.chat {
        a.push("--chat".into());
    }
    if let Some(s) = &g.system {
        a.push("--system".into());
        a.push(s.clone());
    }
    a
}
