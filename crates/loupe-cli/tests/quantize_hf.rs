//! `loupe quantize DIR OUT.gguf` on tiny Hugging Face checkpoints made by the Python
//! reference (`make-tiny`: config.json, f32 model.safetensors, SmolLM2's tokenizer files), for
//! Llama (untied; tied with Llama 3 RoPE scaling), Qwen2 (q/k/v biases) and Qwen3 (q/k norms):
//! * `--type f32`: `loupe generate` gives the same prompt ids and greedy tokens from the GGUF as
//!   from the directory, and `loupe dump`'s logits agree to f32 rounding (bit-identical where
//!   no RoPE scaling is involved); transformers loads the GGUF (`gguf_file=`) and its logits
//!   equal its own from the directory.
//! * `--type q8_0`: every matrix q8_0; loads and runs at native precision; the logits of every
//!   prompt position stay near f32's (cosine > 0.999, not 1: it is quantized), the argmax
//!   agrees at half the positions or more and everywhere else is among f32's top 5 (a random
//!   tiny model's logits are full of near ties, which q8_0's rounding flips; a file that ran but
//!   computed something else, a q/k permutation or a bias lost, fails at every position); and
//!   they equal, bit for bit, those of the f32 GGUF requantized to q8_0 (one code path).
//!
//! Needs the Python reference stack and the SmolLM2 GGUF (the tokenizer): ignored by default;
//! with `--include-ignored` it fails with one line when they are missing. The Python-free tests
//! of the conversion are `crates/loupe-models/tests/convert.rs`.

mod common;
use common::*;
use std::path::Path;
use std::sync::Mutex;

/// One Python run at a time (2 cores shared with builds).
static SERIAL: Mutex<()> = Mutex::new(());

#[derive(serde::Deserialize, Debug, PartialEq)]
struct JsonOut {
    prompt_tokens: Vec<u32>,
    tokens: Vec<u32>,
}

const PROMPT: &str = "The quick brown fox jumps over the lazy dog because";

fn make_tiny(dir: &Path, extra: &[&str]) {
    let tokenizer = real_model();
    require_python_reference();
    let o = python(&["make-tiny", "--seed", "0", "--out"])
        .arg(dir)
        .arg("--tokenizer-gguf")
        .arg(&tokenizer)
        .args(extra)
        .output()
        .expect("python3");
    assert!(o.status.success(), "make-tiny: {}", stderr(&o));
}

fn quantize(dir: &Path, out: &Path, ty: &str) {
    let o = run(loupe().arg("quantize").arg(dir).arg(out).args(["--type", ty]));
    assert!(o.status.success(), "quantize {} --type {ty}: {}", dir.display(), stderr(&o));
    assert!(stderr(&o).contains("loupe quantize: wrote"), "{}", stderr(&o));
}

fn generate(model: &Path, precision: &str, chat: bool) -> JsonOut {
    let mut c = loupe();
    c.args(["generate", "--precision", precision, "--json", "--max-tokens", "24", "--temperature", "0", "-m"])
        .arg(model);
    if chat {
        c.arg("--chat");
    }
    let o = run(c.arg(PROMPT));
    assert!(o.status.success(), "generate {}: {}", model.display(), stderr(&o));
    serde_json::from_str(stdout(&o).trim()).unwrap_or_else(|e| panic!("{e}: {}", stdout(&o)))
}

/// `lm_head` at every prompt position (one row per position).
fn logits(model: &Path, out: &Path, precision: &str) -> Vec<f32> {
    let o = run(loupe()
        .args(["dump", "--precision", precision, "--prompt", PROMPT, "--taps", "lm_head", "-o"])
        .arg(out)
        .arg("-m")
        .arg(model));
    assert!(o.status.success(), "dump: {}", stderr(&o));
    let f = std::fs::read_dir(out.join("step0"))
        .unwrap()
        .filter_map(Result::ok)
        .find(|e| e.file_name().to_string_lossy().starts_with("lm_head"))
        .expect("lm_head dumped")
        .path();
    loupe_formats::npy::NpyFile::open(&f).expect("npy").tensor().expect("tensor").to_f32().expect("f32")
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| f64::from(*x) * f64::from(*y)).sum();
    let norm = |v: &[f32]| v.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
    dot / (norm(a) * norm(b))
}

fn argmax(row: &[f32]) -> usize {
    row.iter().enumerate().fold(0, |best, (i, &x)| if x > row[best] { i } else { best })
}

/// transformers' logits from the directory and from the GGUF (its own GGUF loader), on the
/// same ids: the largest absolute difference and the largest logit.
fn transformers_gap(dir: &Path, gguf: &Path) -> (f64, f64) {
    const SCRIPT: &str = r#"
import json, os, sys, torch
from transformers import AutoModelForCausalLM
d, g = sys.argv[1], sys.argv[2]
a = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32)
b = AutoModelForCausalLM.from_pretrained(os.path.dirname(g), gguf_file=os.path.basename(g), dtype=torch.float32)
ids = torch.tensor([[504, 2365, 6354, 16438, 11, 905, 30, 2, 17, 42]])
with torch.no_grad():
    la, lb = a(ids).logits, b(ids).logits
print(json.dumps([(la - lb).abs().max().item(), la.abs().max().item()]))
"#;
    let o = std::process::Command::new("python3").args(["-c", SCRIPT]).arg(dir).arg(gguf).output().expect("python3");
    assert!(o.status.success(), "transformers on the GGUF: {}", stderr(&o));
    let v: Vec<f64> =
        serde_json::from_str(stdout(&o).lines().last().unwrap_or("")).unwrap_or_else(|e| panic!("{e}: {}", stdout(&o)));
    (v[0], v[1])
}

/// The whole check on one checkpoint; `exact`: f32 logits bit-identical (no RoPE scaling
/// table recomputed on the way), and (with `transformers`) transformers' GGUF logits compared.
fn check(name: &str, extra: &[&str], exact: bool, transformers: bool) {
    let _guard = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join(name);
    make_tiny(&dir, extra);
    let f32_gguf = tmp.path().join("f32").join("model.gguf");
    std::fs::create_dir_all(f32_gguf.parent().unwrap()).unwrap();
    quantize(&dir, &f32_gguf, "f32");

    for chat in [false, true] {
        assert_eq!(
            generate(&f32_gguf, "f32", chat),
            generate(&dir, "f32", chat),
            "{name}: greedy tokens (chat {chat}) from the GGUF and from the directory"
        );
    }
    let want = logits(&dir, &tmp.path().join("dump-dir"), "f32");
    let got = logits(&f32_gguf, &tmp.path().join("dump-f32"), "f32");
    assert_eq!(want.len(), got.len());
    let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
    let gap = want.iter().zip(&got).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
    eprintln!("{name}: f32 logits largest difference {gap} (largest logit {scale})");
    if exact {
        assert_eq!(got, want, "{name}: f32 logits of the GGUF and of the directory");
    }
    if exact && transformers {
        let (t_gap, t_scale) = transformers_gap(&dir, &f32_gguf);
        eprintln!("{name}: transformers, GGUF against directory: largest difference {t_gap} (largest logit {t_scale})");
        assert!(t_gap <= 1e-5 * t_scale, "{name}: transformers' logits from the GGUF differ by {t_gap}");
    }
    if !exact {
        assert!(gap <= 1e-4 * scale, "{name}: f32 logits differ by {gap} (largest {scale})");
    }

    let q8 = tmp.path().join("q8_0.gguf");
    quantize(&dir, &q8, "q8_0");
    let g = loupe_formats::GgufFile::open(&q8).unwrap();
    assert!(
        g.tensors.iter().filter(|t| t.dims.len() == 2).all(|t| t.ggml_type.name() == "q8_0"),
        "{name}: every matrix q8_0"
    );
    let q = logits(&q8, &tmp.path().join("dump-q8"), "native");
    // Run at native precision too; one logits row per prompt position in the dumps.
    let n_rows = generate(&q8, "native", false).prompt_tokens.len();
    let width = want.len() / n_rows;
    assert_eq!((width * n_rows, q.len()), (want.len(), want.len()), "{name}: {n_rows} rows of logits");
    let agree = want.chunks(width).zip(q.chunks(width)).filter(|(a, b)| argmax(a) == argmax(b)).count();
    // Where the argmax moves, q8_0's choice is a near tie of f32's: its rank among f32's logits.
    let ranks: Vec<usize> =
        want.chunks(width).zip(q.chunks(width)).map(|(a, b)| a.iter().filter(|&&x| x > a[argmax(b)]).count()).collect();
    let cos = cosine(&want, &q);
    eprintln!("{name}: q8_0 at native precision: logits cosine {cos}, argmax {agree}/{n_rows} positions, f32 rank of q8_0's argmax per position {ranks:?}");
    assert!(cos > 0.999 && cos < 1.0, "{name}: q8_0 logits cosine {cos}");
    assert!(
        n_rows >= 8 && 2 * agree >= n_rows && ranks.iter().all(|&r| r < 5),
        "{name}: q8_0 argmax agrees at {agree} of {n_rows} positions, ranks {ranks:?}"
    );
    // The directory's q8_0 file is the f32 GGUF's q8_0 requantization: the same code path.
    let requantized = tmp.path().join("f32-to-q8_0.gguf");
    let o = run(loupe().arg("quantize").arg(&f32_gguf).arg(&requantized).args(["--type", "q8_0"]));
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(
        logits(&requantized, &tmp.path().join("dump-requant"), "native"),
        q,
        "{name}: q8_0 from the directory and from its f32 GGUF"
    );
}

#[test]
#[ignore = "needs the real model and the Python reference stack (scripts/test installs both)"]
fn a_tiny_llama_directory_quantizes_to_the_same_model() {
    check("tiny-llama", &[], true, true);
}

#[test]
#[ignore = "needs the real model and the Python reference stack (scripts/test installs both)"]
fn a_tiny_tied_llama_with_llama3_rope_quantizes_to_the_same_model() {
    check("tiny-llama3", &["--tie", "--rope-scaling", "llama3"], false, false);
}

#[test]
#[ignore = "needs the real model and the Python reference stack (scripts/test installs both)"]
fn a_tiny_qwen2_directory_quantizes_to_the_same_model() {
    check("tiny-qwen2", &["--family", "qwen2"], true, true);
}

/// A directory loupe cannot convert fails with one line naming the file (no Python needed).
#[test]
fn a_directory_without_tokenizer_json_fails_with_one_line() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("config.json"), r#"{"architectures": ["LlamaForCausalLM"]}"#).unwrap();
    let o = run(loupe().arg("quantize").arg(tmp.path()).arg(tmp.path().join("o.gguf")).args(["--type", "q8_0"]));
    assert_clean_failure(&o, "tokenizer.json: missing");
    std::fs::write(tmp.path().join("tokenizer.json"), "{}").unwrap();
    std::fs::write(tmp.path().join("config.json"), r#"{"architectures": ["GPT2LMHeadModel"]}"#).unwrap();
    let o = run(loupe().arg("quantize").arg(tmp.path()).arg(tmp.path().join("o.gguf")).args(["--type", "q8_0"]));
    assert_clean_failure(&o, "unsupported architecture 'GPT2LMHeadModel'");
    assert!(!tmp.path().join("o.gguf").exists());
}

#[test]
#[ignore = "needs the real model and the Python reference stack (scripts/test installs both)"]
fn a_tiny_qwen3_directory_quantizes_to_the_same_model() {
    // Not transformers: its GGUF loader (5.23) maps no `qwen3.attention.key_length` and builds
    // Qwen3Config's default head_dim of 128, so it cannot load a tiny Qwen3 (head_dim 16) from
    // any GGUF, llama.cpp's included (real Qwen3 models have 128).
    check("tiny-qwen3", &["--family", "qwen3"], true, false);
}
