//! Planted faults against the parity tools, on the tiny random-weight model (always) and on
//! the real model (ignored unless it is fetched): for every fault class,
//! a clean and a faulty `loupe dump` (3 layers, fault at layer 1) must first diverge at the
//! planted node, and `loupe explain` must rank the hypothesis naming the class first.

mod common;
use common::*;

use std::path::{Path, PathBuf};

use loupe_formats::NpyFile;
use serde_json::Value;

const PROMPT: &str = "The quick brown fox jumps over the lazy dog because it was";

/// Where each class must first show, in layer 1 (any of these names).
fn planted(class: &str) -> &'static [&'static str] {
    match class {
        "rope-interleaved" => &["model.layers.1.self_attn.q_rope"],
        "transposed-weight" | "bf16" => &["model.layers.1.self_attn.o_proj"],
        "norm-eps" => &["model.layers.1.input_layernorm"],
        "gelu-tanh" => &["model.layers.1.mlp.act_fn"],
        "missing-residual" => &["model.layers.1.attn_residual"],
        "softmax-scale" | "gqa-mapping" | "kv-write" | "mask" => {
            &["model.layers.1.self_attn.attn_probs", "model.layers.1.self_attn.attn_output"]
        }
        other => panic!("no expectation for {other}"),
    }
}

/// Classes too small for the 0.99 / 1e-2 thresholds: bf16 rounding (cosine ~0.999999) and
/// eps 0.1 against hidden states whose mean square is 2-9 at layer 1 (a 1-2% rescale).
/// They are located as the first tensor that differs at all, which is sound because two
/// clean runs are bit-identical (checked below).
fn subtle(class: &str) -> bool {
    matches!(class, "bf16" | "norm-eps")
}

const CLASSES: [&str; 10] = [
    "rope-interleaved",
    "transposed-weight",
    "norm-eps",
    "gelu-tanh",
    "softmax-scale",
    "gqa-mapping",
    "missing-residual",
    "bf16",
    "kv-write",
    "mask",
];

fn dump(model: &Path, out: &Path, extra: &[&str]) {
    let o = run(loupe()
        .args(["dump", "--layers", "3", "--steps", "1", "--mode", "f32", "--threads", "2", "--prompt", PROMPT, "-m"])
        .arg(model)
        .arg("-o")
        .arg(out)
        .args(extra));
    assert!(o.status.success(), "dump {extra:?} failed: {}", stderr(&o));
}

fn manifest(dir: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("manifest.json")).unwrap()).unwrap()
}

fn read(dir: &Path, file: &str) -> Vec<f32> {
    NpyFile::open(dir.join(file)).unwrap().tensor().unwrap().to_f32().unwrap()
}

/// (cosine, NMSE against `a`), in f64.
fn similarity(a: &[f32], b: &[f32]) -> (f64, f64) {
    let (mut dot, mut aa, mut bb, mut err) = (0f64, 0f64, 0f64, 0f64);
    for (&x, &y) in a.iter().zip(b) {
        let (x, y) = (x as f64, y as f64);
        dot += x * y;
        aa += x * x;
        bb += y * y;
        err += (x - y) * (x - y);
    }
    (dot / (aa.sqrt() * bb.sqrt() + 1e-20), err / aa.max(1e-30))
}

/// The first tensor of `b` (in execution order) that differs from `a`'s by more than the
/// thresholds: `(name, step, cos, nmse)`.
fn first_divergence(a: &Path, b: &Path, tight: bool) -> Option<(String, u64, f64, f64)> {
    let ma = manifest(a);
    let mb = manifest(b);
    let index: std::collections::HashMap<(String, u64), String> = ma["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            (
                (t["name"].as_str().unwrap().to_string(), t["step"].as_u64().unwrap()),
                t["file"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let mut entries: Vec<&Value> = mb["tensors"].as_array().unwrap().iter().collect();
    entries.sort_by_key(|t| (t["step"].as_u64().unwrap(), t["order"].as_u64().unwrap()));
    for t in entries {
        let key = (t["name"].as_str().unwrap().to_string(), t["step"].as_u64().unwrap());
        // Values only the faulty graph has (`o_proj.unrounded`) pair with nothing.
        let Some(file_a) = index.get(&key) else { continue };
        let (x, y) = (read(a, file_a), read(b, t["file"].as_str().unwrap()));
        assert_eq!(x.len(), y.len(), "{key:?}: sizes differ");
        let (cos, nmse) = similarity(&x, &y);
        let diverges = if tight { nmse > 1e-12 } else { cos < 0.99 || nmse > 1e-2 };
        if diverges {
            return Some((key.0, key.1, cos, nmse));
        }
    }
    None
}

fn explain(model: &Path, a: &Path, b: &Path, tensor: &str, step: u64, json: &Path) -> Value {
    let o = run(loupe()
        .arg("explain")
        .arg(a)
        .arg(b)
        .args(["--tensor", tensor, "--step", &step.to_string(), "-m"])
        .arg(model)
        .arg("--json")
        .arg(json));
    assert!(o.status.success(), "explain {tensor}: {}", stderr(&o));
    let v: Value = serde_json::from_str(&std::fs::read_to_string(json).unwrap()).unwrap();
    assert!(stdout(&o).contains(v["conclusion"].as_str().unwrap()), "the table ends with the conclusion");
    v
}

#[test]
fn every_planted_fault_is_located_and_explained() {
    faults_are_located_and_explained(&tiny_model());
}

#[test]
#[ignore = "needs the real model (scripts/test fetches it)"]
fn every_planted_fault_is_located_and_explained_on_the_real_model() {
    faults_are_located_and_explained(&real_model());
}

fn faults_are_located_and_explained(model: &Path) {
    let model = model.to_path_buf();
    let dir = tempfile::tempdir().unwrap();
    let clean = dir.path().join("clean");
    dump(&model, &clean, &[]);
    // Decode step 1 feeds the clean run's greedy token everywhere, so steps line up even
    // where a fault changes the argmax.
    let next = manifest(&clean)["generated_tokens"][0].as_u64().unwrap().to_string();
    let again = dir.path().join("clean-again");
    dump(&model, &again, &["--teacher-force", &next]);
    assert_eq!(
        first_divergence(&clean, &again, true),
        None,
        "two clean runs differ: loupe is not deterministic, so the tight threshold means nothing"
    );

    let mut failures = Vec::new();
    for class in CLASSES {
        let faulty: PathBuf = dir.path().join(class);
        dump(&model, &faulty, &["--teacher-force", &next, "--inject", &format!("{class}@1")]);
        assert_eq!(manifest(&faulty)["faults"], serde_json::json!([format!("{class}@1")]));
        let Some((name, step, cos, nmse)) = first_divergence(&clean, &faulty, subtle(class)) else {
            failures.push(format!("{class}: no tensor diverges"));
            continue;
        };
        eprintln!("{class}: first divergence {name} step {step} (cos {cos:.6}, NMSE {nmse:.2e})");
        if !planted(class).contains(&name.as_str()) || step != 0 {
            failures.push(format!(
                "{class}: first divergence is {name} at step {step}, expected one of {:?} at step 0",
                planted(class)
            ));
            continue;
        }
        let e = explain(&model, &clean, &faulty, &name, step, &dir.path().join(format!("{class}.json")));
        let top = &e["hypotheses"][0];
        eprintln!("  explain: {}", e["conclusion"].as_str().unwrap());
        if top["id"] != class || e["verdict"]["id"] != class {
            failures.push(format!("{class}: explain ranks '{}' first (verdict {})", top["label"], e["verdict"]));
        }
        if class == "norm-eps" && !top["label"].as_str().unwrap().contains("1e-1") {
            failures.push(format!("norm-eps: the best epsilon is '{}', not 1e-1", top["label"]));
        }
    }
    // The cache write also shows in decode: step 1's keys come from the cache rows of the
    // prompt plus one row carried over from it.
    let e = explain(
        &model,
        &clean,
        &dir.path().join("kv-write"),
        "model.layers.1.self_attn.attn_output",
        1,
        &dir.path().join("kv-step1.json"),
    );
    if e["verdict"]["id"] != "kv-write" {
        failures.push(format!("kv-write at step 1: {}", e["conclusion"]));
    }
    // On a clean pair the correct op wins.
    let e = explain(&model, &clean, &again, "model.layers.1.self_attn.q_rope", 0, &dir.path().join("clean.json"));
    if e["verdict"]["kind"] != "correct" {
        failures.push(format!("clean q_rope: {}", e["conclusion"]));
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The values a reference hooked on module outputs holds (MAX's torch-side hooks): no
/// q_rope / k_rope / attn_output / attn_probs / attn_residual / act_mul, which no module
/// returns.
const MODULE_OUTPUTS: &str = r"(embed_tokens|_layernorm|q_proj|k_proj|v_proj|o_proj|self_attn|gate_proj|up_proj|act_fn|down_proj|mlp|model\.layers\.\d+|model\.norm|lm_head)$";

#[test]
fn attention_core_faults_against_a_module_output_reference() {
    attention_core_faults_module_outputs(&tiny_model());
}

#[test]
#[ignore = "needs the real model (scripts/test fetches it)"]
fn attention_core_faults_against_a_module_output_reference_on_the_real_model() {
    attention_core_faults_module_outputs(&real_model());
}

/// Bugs inside the attention core, compared with a module-output-only reference: `compare`
/// stops at o_proj without claiming its (uncompared) input matched, and `explain` on o_proj
/// recomputes the block from the reference's q/k/v projections and names the bug.
fn attention_core_faults_module_outputs(model: &Path) {
    let dir = tempfile::tempdir().unwrap();
    // The reference as `.npy` files and as MAX `.max` files.
    let references = [("npy", dir.path().join("reference")), ("max", dir.path().join("reference-max"))];
    for (style, reference) in &references {
        dump(model, reference, &["--taps", MODULE_OUTPUTS, "--style", style]);
    }
    let names: Vec<String> = manifest(&references[0].1)["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap().to_string())
        .collect();
    assert!(
        names.iter().any(|n| n == "model.layers.1.self_attn.q_proj")
            && !names.iter().any(|n| n.ends_with("attn_output") || n.ends_with("q_rope")),
        "{names:?}"
    );
    let next = manifest(&references[0].1)["generated_tokens"][0].as_u64().unwrap().to_string();
    let mut failures = Vec::new();
    for class in ["rope-interleaved", "softmax-scale", "gqa-mapping", "mask", "kv-write"] {
        let faulty = dir.path().join(class);
        dump(model, &faulty, &["--teacher-force", &next, "--inject", &format!("{class}@1")]);
        for (style, reference) in &references {
            let json = dir.path().join(format!("{class}-{style}-compare.json"));
            let o = run(loupe().arg("compare").arg(reference).arg(&faulty).arg("--json").arg(&json));
            assert_eq!(o.status.code(), Some(1), "{class} ({style}): compare: {}", stderr(&o));
            let v: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
            // The verdict's fields sit at the top of the report.
            let first = v["first_divergence"].as_str().unwrap_or("");
            let cause = v["likely_cause"].as_str().unwrap_or("");
            eprintln!("{class} ({style}): compare: first divergence {first}: {cause}");
            if !first.starts_with("model.layers.1.self_attn") {
                failures.push(format!("{class} ({style}): first divergence {first}"));
                continue;
            }
            if cause.contains("(its input")
                || !cause.contains("attention core")
                || !cause.contains("self_attn.attn_output was not compared")
            {
                failures.push(format!(
                    "{class} ({style}): the cause cites evidence nobody compared or misses the attention core: {cause}"
                ));
            }
            let e = explain(
                model,
                reference,
                &faulty,
                "model.layers.1.self_attn.o_proj",
                0,
                &dir.path().join(format!("{class}-{style}.json")),
            );
            eprintln!("  explain: {}", e["conclusion"].as_str().unwrap());
            if e["verdict"]["id"] != class {
                failures.push(format!("{class} ({style}): explain from q/k/v: {}", e["conclusion"]));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn bad_faults_and_bad_explain_input_exit_2() {
    let o = run(loupe().args(["dump", "--prompt", "x", "--inject", "nope@1"]));
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("unknown class 'nope'"), "{}", stderr(&o));
    let o = run(loupe().args(["dump", "--prompt", "x", "--inject", "mask"]));
    assert_eq!(o.status.code(), Some(2));

    let dir = tempfile::tempdir().unwrap();
    let o = run(loupe()
        .arg("explain")
        .arg(dir.path().join("none"))
        .arg(dir.path())
        .args(["--tensor", "lm_head", "-m"])
        .arg(dir.path()));
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).starts_with("loupe: error: "), "{}", stderr(&o));

    let model = tiny_model();
    let o = run(loupe().args(["dump", "--layers", "2", "--prompt", "x", "--inject", "mask@2", "-m"]).arg(&model));
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("layer 2 does not exist"), "{}", stderr(&o));
    let d = dir.path().join("d");
    let o = run(loupe()
        .args(["dump", "--layers", "1", "--prompt", "Hello there", "--taps", "q_proj$", "-m"])
        .arg(&model)
        .arg("-o")
        .arg(&d));
    assert!(o.status.success(), "{}", stderr(&o));
    // q_rope's input is there but q_rope itself is not: a missing tensor names itself.
    let o = run(loupe()
        .arg("explain")
        .arg(&d)
        .arg(&d)
        .args(["--tensor", "model.layers.0.self_attn.q_rope", "-m"])
        .arg(&model));
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("no tensor 'model.layers.0.self_attn.q_rope' at step 0"), "{}", stderr(&o));
}
