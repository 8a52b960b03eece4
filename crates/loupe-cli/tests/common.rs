//! Shared helpers of the CLI integration tests.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

/// The tiny random-weight Llama GGUF (`loupe_models::tiny`, default spec): 4 layers, hidden
/// 64, a real byte-level BPE tokenizer and SmolLM2's chat template. Written once, named by a
/// hash of its bytes under Cargo's target tmpdir, so test binaries (and checkouts sharing the
/// target directory) running at the same time never see each other's half-written or
/// different file.
pub fn tiny_model() -> PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        let spec = tiny_spec();
        let bytes = loupe_models::tiny::tiny_llama_gguf_bytes(&spec).expect("building the tiny model");
        let hash = bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3));
        let path = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("loupe-tiny-llama-{hash:016x}.gguf"));
        if std::fs::read(&path).ok().as_deref() != Some(&bytes[..]) {
            std::fs::create_dir_all(env!("CARGO_TARGET_TMPDIR")).unwrap();
            loupe_models::tiny::write_tiny_llama_gguf(&path, &spec).expect("writing the tiny model");
        }
        path
    })
    .clone()
}

/// The spec of [`tiny_model`].
pub fn tiny_spec() -> loupe_models::tiny::TinyLlama {
    loupe_models::tiny::TinyLlama::default()
}

/// The real model (SmolLM2-135M-Instruct Q4_1): `$LOUPE_MODEL`, else the cache path of
/// `scripts/fetch-model` ([`loupe_models::real_model_path`]). Tests that call this are
/// `#[ignore = "needs the real model ..."]`; run with `--include-ignored` (scripts/test) and
/// without the model, they fail with one line saying how to get it.
pub fn real_model() -> PathBuf {
    let path = loupe_models::real_model_path();
    assert!(path.is_file(), "needs the real model at {} (missing): run scripts/fetch-model or set LOUPE_MODEL", path.display());
    path
}

/// Fails with one clear line unless `python3` (first on PATH) can import the reference stack.
/// Tests that call this are `#[ignore = "needs the Python reference stack ..."]`.
pub fn require_python_reference() {
    let out = Command::new("python3").args(["-c", "import loupe_reference, torch, transformers, gguf"]).output();
    let why = match &out {
        Ok(o) if o.status.success() => return,
        Ok(o) => String::from_utf8_lossy(&o.stderr).lines().last().unwrap_or("").to_string(),
        Err(e) => format!("cannot run python3: {e}"),
    };
    panic!("needs the Python reference stack (python3 -c 'import loupe_reference, torch, transformers, gguf' failed: {why}): run scripts/test, or pip install -e reference/ torch transformers gguf accelerate");
}

/// `python3 -m loupe_reference ARGS` with this checkout's `reference/` first on the path, so the
/// package under test is the one beside this test (not whichever copy pip installed last).
pub fn python(args: &[&str]) -> Command {
    let mut c = Command::new("python3");
    let mut path = std::ffi::OsString::from(repo_root().join("reference"));
    if let Some(old) = std::env::var_os("PYTHONPATH").filter(|p| !p.is_empty()) {
        path.push(":");
        path.push(old);
    }
    c.env("PYTHONPATH", path).args(["-m", "loupe_reference"]).args(args);
    c
}

/// A tiny random Llama checkpoint (`python -m loupe_reference make-tiny --seed 0`, SmolLM2's
/// tokenizer) in `dir`; needs the Python reference stack and the real model (for its
/// tokenizer), and fails with one line when either is missing.
pub fn make_tiny_checkpoint(dir: &Path) -> PathBuf {
    let tokenizer = real_model();
    require_python_reference();
    let model = dir.join("tiny");
    let o = python(&["make-tiny", "--seed", "0", "--out"]).arg(&model).arg("--tokenizer-gguf").arg(&tokenizer).output().expect("python3");
    assert!(o.status.success(), "make-tiny: {}", stderr(&o));
    model
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
