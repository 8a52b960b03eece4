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
        let hash =
            bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3));
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
    assert!(
        path.is_file(),
        "needs the real model at {} (missing): run scripts/fetch-model or set LOUPE_MODEL",
        path.display()
    );
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
    let o = python(&["make-tiny", "--seed", "0", "--out"])
        .arg(&model)
        .arg("--tokenizer-gguf")
        .arg(&tokenizer)
        .output()
        .expect("python3");
    assert!(o.status.success(), "make-tiny: {}", stderr(&o));
    model
}

pub fn loupe() -> Command {
    Command::new(loupe_path())
}

/// The `loupe` binary under test.
pub fn loupe_path() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_loupe"))
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
    #[serde(default)]
    pub eos_token_ids: Vec<u32>,
}

/// The default model's goldens (tests/golden/smollm2-q4_1).
pub fn goldens() -> Vec<Golden> {
    goldens_of("smollm2-q4_1")
}

/// The goldens of one model (`tests/golden/<model_id>/`, written by
/// `scripts/regen-goldens --set <model_id>`), sorted by name.
pub fn goldens_of(model_id: &str) -> Vec<Golden> {
    let dir = repo_root().join("tests/golden").join(model_id);
    let mut out: Vec<Golden> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .map(|p| {
            serde_json::from_str(&std::fs::read_to_string(&p).unwrap())
                .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        })
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    assert!(out.len() >= 4, "expected at least 4 goldens in {}", dir.display());
    out
}

/// Qwen2.5-Coder-0.5B-Instruct (GGUF, architecture qwen2): `$LOUPE_QWEN_MODEL`, else where
/// `scripts/fetch-model qwen2.5-coder-0.5b` puts it. Tests that call this are ignored by
/// default; run with `--include-ignored` (scripts/test fetches it) and without the file, they
/// fail with one line saying how to get it.
pub fn qwen_model() -> PathBuf {
    cached_model(
        "LOUPE_QWEN_MODEL",
        "Qwen2.5-Coder-0.5B-Instruct.gguf",
        "Qwen2.5-Coder-0.5B-Instruct",
        "qwen2.5-coder-0.5b",
    )
}

/// Gemma 3 270M (`scripts/fetch-model gemma3-270m`), or `$LOUPE_GEMMA_MODEL`.
pub fn gemma_model() -> PathBuf {
    cached_model("LOUPE_GEMMA_MODEL", "gemma-3-270m-q4_k_m.gguf", "Gemma 3 270M", "gemma3-270m")
}

/// all-MiniLM-L6-v2, a BERT checkpoint directory (`scripts/fetch-model all-minilm-l6-v2`), or
/// `$LOUPE_MINILM_MODEL`.
pub fn minilm_model() -> PathBuf {
    let path = match std::env::var_os("LOUPE_MINILM_MODEL").filter(|p| !p.is_empty()) {
        Some(p) => PathBuf::from(p),
        None => loupe_models::cache_dir().join("models").join("all-MiniLM-L6-v2"),
    };
    assert!(
        path.join("config.json").is_file(),
        "needs all-MiniLM-L6-v2 at {} (missing): run scripts/fetch-model all-minilm-l6-v2 or set LOUPE_MINILM_MODEL",
        path.display()
    );
    path
}

/// `$env`, else `file` in the model cache; one clear failure naming how to fetch it.
fn cached_model(env: &str, file: &str, what: &str, fetch_name: &str) -> PathBuf {
    let path = match std::env::var_os(env).filter(|p| !p.is_empty()) {
        Some(p) => PathBuf::from(p),
        None => loupe_models::cache_dir().join("models").join(file),
    };
    assert!(
        path.is_file(),
        "needs {what} at {} (missing): run scripts/fetch-model {fetch_name} or set {env}",
        path.display()
    );
    path
}

/// The goldens themselves (checked in; no model needed), as tests/golden/README.md defines
/// them: each generation ran to `max_tokens` or stopped at one of the model's EOS tokens,
/// and the teacher-forced argmax has one entry per position and agrees with every
/// generated token.
pub fn check_goldens_complete(goldens: &[Golden]) {
    for g in goldens {
        assert!(!g.eos_token_ids.is_empty(), "{}: no eos_token_ids", g.name);
        let is_eos = |t: &u32| g.eos_token_ids.contains(t);
        assert!(
            g.tokens.len() == g.max_tokens || (g.tokens.len() < g.max_tokens && g.tokens.last().is_some_and(is_eos)),
            "{}: {} tokens of {} and no EOS {:?} at the end: golden truncated",
            g.name,
            g.tokens.len(),
            g.max_tokens,
            g.eos_token_ids
        );
        assert!(!g.tokens[..g.tokens.len() - 1].iter().any(is_eos), "{}: tokens go on after EOS", g.name);
        assert_eq!(g.argmax.len(), g.prompt_tokens.len() + g.tokens.len(), "{}: one argmax per position", g.name);
        // Greedy: the argmax after the prompt and after each generated token is the next token.
        let after_prompt = g.prompt_tokens.len() - 1;
        assert_eq!(
            &g.argmax[after_prompt..after_prompt + g.tokens.len()],
            &g.tokens[..],
            "{}: generated tokens are not the teacher-forced argmax",
            g.name
        );
        assert!(
            g.margins.is_empty() || g.margins.len() == g.tokens.len(),
            "{}: {} margins for {} tokens",
            g.name,
            g.margins.len(),
            g.tokens.len()
        );
    }
}

#[derive(serde::Deserialize)]
struct GenerateJson {
    prompt_tokens: Vec<u32>,
    tokens: Vec<u32>,
    text: String,
}

/// `loupe generate --precision f32` greedy on every golden of `model`: one line per golden
/// whose tokens differ from transformers' (the first differing step, both tokens and the
/// reference's margin there). Prompt ids and, for equal tokens, the text must match exactly.
pub fn f32_greedy_failures(model: &Path, goldens: &[Golden]) -> Vec<String> {
    let mut failures = Vec::new();
    for g in goldens {
        let out = run(loupe()
            .arg("generate")
            .arg("--model")
            .arg(model)
            .args(["--precision", "f32", "--temperature", "0", "--json", "--threads", "2"])
            .args(["--max-tokens", &g.max_tokens.to_string()])
            .args(prompt_args(g)));
        assert!(out.status.success(), "{}: loupe failed: {}", g.name, stderr(&out));
        let got: GenerateJson = serde_json::from_str(stdout(&out).trim())
            .unwrap_or_else(|e| panic!("{}: bad json {e}: {}", g.name, stdout(&out)));
        assert_eq!(got.prompt_tokens, g.prompt_tokens, "{}: prompt tokens differ from transformers'", g.name);
        if got.tokens != g.tokens {
            let at = got
                .tokens
                .iter()
                .zip(&g.tokens)
                .position(|(a, b)| a != b)
                .unwrap_or(got.tokens.len().min(g.tokens.len()));
            failures.push(format!(
                "{}: first differing token at step {at} (loupe {:?}, reference {:?}, reference margin there {:?})",
                g.name,
                got.tokens.get(at),
                g.tokens.get(at),
                g.margins.get(at)
            ));
        } else {
            assert_eq!(got.text, g.text, "{}: same tokens but different text", g.name);
        }
    }
    failures
}

/// Teacher-forced next-token argmax of `graph` on every golden sequence against the
/// reference's: (agreeing, total) over all positions, then over the generated positions;
/// printed under `label`.
pub fn teacher_forced_agreement(
    graph: &loupe_graph::Graph,
    goldens: &[Golden],
    label: &str,
) -> (usize, usize, usize, usize) {
    let (mut agree, mut total, mut gen_agree, mut gen_total) = (0, 0, 0, 0);
    for g in goldens {
        let mut seq = g.prompt_tokens.clone();
        seq.extend_from_slice(&g.tokens);
        seq.pop(); // the last token has no next token to predict in the golden
        let mut session = loupe_runtime::Session::new(graph, seq.len(), &Default::default());
        let ours = session.teacher_forced_argmax(&seq).expect("forward");
        assert_eq!(ours.len(), seq.len());
        for (i, (a, b)) in ours.iter().zip(&g.argmax).enumerate() {
            total += 1;
            agree += (a == b) as usize;
            if i + 1 >= g.prompt_tokens.len() {
                gen_total += 1;
                gen_agree += (a == b) as usize;
            }
        }
    }
    eprintln!("{label}: teacher-forced argmax agreement {agree}/{total} = {:.2}% (generated positions {gen_agree}/{gen_total} = {:.2}%)", 100.0 * agree as f64 / total as f64, 100.0 * gen_agree as f64 / gen_total as f64);
    (agree, total, gen_agree, gen_total)
}

/// Argmax agreement with the goldens through the decode path: each golden sequence fed one
/// token per step, as generation runs it (decode rows take other kernels than the
/// teacher-forced pass's prompt rows). Returns (agreeing, total) and prints them.
pub fn decode_path_agreement(graph: &loupe_graph::Graph, goldens: &[Golden], label: &str) -> (usize, usize) {
    let (mut agree, mut total) = (0, 0);
    for g in goldens {
        let mut seq = g.prompt_tokens.clone();
        seq.extend_from_slice(&g.tokens);
        seq.pop();
        let mut session = loupe_runtime::Session::new(graph, seq.len(), &Default::default());
        for (&token, &want) in seq.iter().zip(&g.argmax) {
            let got = loupe_runtime::argmax(session.forward(&[token], false, None).expect("decode step"));
            total += 1;
            agree += (got == want) as usize;
        }
    }
    eprintln!("{label}: decode-path argmax agreement {agree}/{total} = {:.2}%", 100.0 * agree as f64 / total as f64);
    (agree, total)
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

/// Texts whose ids or offsets differ between the model's tokenizer, whose BPE is
/// `loupe_text::CompactBpe`, and the same pipeline around `tokenizers`' BPE with the merges
/// listed: the goldens' prompts, a chat turn, code, whitespace runs and seeded text mixing
/// scripts, emoji and characters the vocabulary may lack.
pub fn compact_tokenizer_mismatches(model: &Path, goldens: &[Golden]) -> Vec<String> {
    use loupe_text::TokenModel;
    let mut gguf = loupe_formats::GgufFile::open(model).expect("open");
    let spec = loupe_models::tokenizer::spec_from_gguf(&mut gguf).expect("tokenizer spec");
    let tok = loupe_text::Tokenizer::from_spec(&spec).expect("tokenizer");
    assert!(matches!(tok.inner().get_model(), TokenModel::Compact(_)), "{}: not a CompactBpe", model.display());
    let mut listed = tok.inner().clone();
    listed.with_model(tok.inner().get_model().to_hf().expect("listed merges"));

    let mut texts: Vec<String> = goldens.iter().map(|g| g.prompt.clone()).collect();
    let pool: Vec<char> = "abcdefghijklmnopqrstuvwxyzABCXYZ0123456789 \n\t  ,.;:!?'\"()[]{}<>=+-*/_#@\\\
        éèçàßøñüÅ日本語の猫は可愛いです中文字符한국어русскийтекстالعربيةहिन्दी🙂🚀👩‍💻\u{0301}\u{200b}\u{7}"
        .chars()
        .collect();
    let mut rng = loupe_core::SplitMix64(0x2545_f491_4f6c_dd1d);
    for _ in 0..400 {
        let len = 1 + rng.below(120);
        texts.push((0..len).map(|_| pool[rng.below(pool.len())]).collect());
    }
    texts.push("fn main() {\n    let x = vec![1, 2, 3];\n\n\n        println!(\"{x:?}\");\n}\n".into());
    texts.push("   leading and trailing   ".into());
    if let Ok(chat) = tok.chat_ids(&[loupe_text::ChatMessage::user("Hi there, how are you?")], true) {
        texts.push(tok.decode(&chat, false).expect("decode"));
    }
    let mut bad = Vec::new();
    for text in &texts {
        let ours = tok.inner().encode_fast(text.as_str(), true).expect("encode");
        let theirs = listed.encode_fast(text.as_str(), true).expect("encode");
        if (ours.get_ids(), ours.get_offsets()) != (theirs.get_ids(), theirs.get_offsets()) {
            bad.push(format!("{text:?}: {:?} vs {:?}", ours.get_ids(), theirs.get_ids()));
        }
    }
    bad
}
