//! Calibrated tolerances end to end (docs/parity-protocol.md, "Calibrated tolerances"):
//! `loupe parity --calibrated` runs the transformers reference twice (f32, and f64 for an
//! f32 target / f16 for native), passes a correct loupe with no hand-set threshold, and
//! `loupe compare --calibrate` on the kept dumps flags the scale-only faults (which the
//! default thresholds let through) at the node they were planted in.
//!
//! Needs the Python reference stack and the SmolLM2 GGUF (the tiny checkpoint borrows its
//! tokenizer): ignored by default; with `--include-ignored` (scripts/test) it fails with one
//! line when they are missing.

mod common;
use common::*;

use std::path::Path;

use serde_json::Value;

const PROMPT: &str = "The capital of France is Paris, and the capital of Germany is";

/// `loupe parity --calibrated` on `model`; returns the JSON report.
fn parity(model: &Path, out: &Path, extra: &[&str]) -> Value {
    let json = out.join("report.json");
    std::fs::create_dir_all(out).unwrap();
    let o = run(loupe()
        .arg("parity")
        .arg("-m")
        .arg(model)
        .args(["--prompt", PROMPT, "--calibrated", "-o"])
        .arg(out)
        .arg("--json")
        .arg(&json)
        .args(extra));
    assert_eq!(o.status.code(), Some(0), "loupe parity --calibrated {extra:?} failed:\n{}\n{}", stdout(&o), stderr(&o));
    let text = stdout(&o);
    assert!(text.contains("verdict: MATCH") && text.contains("calibrated: a tensor diverges when"), "{text}");
    serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap()
}

/// A faulty f32 dump of `model`.
fn faulty_dump(model: &Path, out: &Path, fault: &str) {
    let o = run(loupe()
        .args(["dump", "--precision", "f32", "--prompt", PROMPT, "--inject", fault, "-m"])
        .arg(model)
        .arg("-o")
        .arg(out));
    assert!(o.status.success(), "dump --inject {fault}: {}", stderr(&o));
}

/// `loupe compare REF TARGET [--calibrate HIGH LOW]` → (exit code, JSON report).
fn compare(reference: &Path, target: &Path, calibrate: Option<(&Path, &Path)>) -> (i32, Value) {
    let mut c = loupe();
    c.arg("compare").arg(reference).arg(target).args(["--json", "-"]);
    if let Some((h, l)) = calibrate {
        c.arg("--calibrate").arg(h).arg(l);
    }
    let o = run(&mut c);
    let code = o.status.code().unwrap_or(-1);
    assert!(code == 0 || code == 1, "compare failed: {}", stderr(&o));
    (code, serde_json::from_str(&stdout(&o)).expect("JSON report"))
}

/// Every compared tensor of a clean calibrated report has a floor and sits inside it.
fn check_clean(report: &Value, what: &str) {
    assert_eq!(report["verdict"], "match", "{what}");
    assert_eq!(report["calibration"]["factor"], 8.0, "{what}");
    let pairs = report["pairs"].as_array().unwrap();
    assert!(pairs.len() > 20, "{what}: {} pairs", pairs.len());
    let mut worst = (0.0f64, "");
    for p in pairs {
        let r = p["floor"]["error_over_floor"].as_f64().unwrap_or_else(|| panic!("{what}: {} has no floor", p["name"]));
        if r > worst.0 {
            worst = (r, p["name"].as_str().unwrap());
        }
    }
    eprintln!("{what}: worst error over floor {:.2}x at {}", worst.0, worst.1);
}

/// `loupe explain REF TARGET --tensor NAME` → the id of the hypothesis it concludes on
/// (`correct`, `unexplained`, or the hypothesis).
fn explain(model: &Path, reference: &Path, target: &Path, tensor: &str) -> String {
    let json = target.join("explain.json");
    let o = run(loupe()
        .arg("explain")
        .arg(reference)
        .arg(target)
        .args(["--tensor", tensor, "-m"])
        .arg(model)
        .arg("--json")
        .arg(&json));
    assert!(o.status.success(), "explain {tensor}: {}", stderr(&o));
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).expect("explain JSON");
    v["verdict"]["id"].as_str().or(v["verdict"]["kind"].as_str()).unwrap_or("").to_string()
}

/// The planted scale-only faults: every default threshold passes them, the floors do not,
/// and explain names them (a fitted constant multiplier; the epsilon that reproduces the
/// target).
fn check_faults(model: &Path, dir: &Path, layer: usize, floors: (&Path, &Path)) {
    let reference = dir.join("reference");
    for (class, node, hypothesis) in
        [("o-proj-scale", "self_attn.o_proj", "scale"), ("norm-eps-subtle", "input_layernorm", "norm-eps")]
    {
        let target = dir.join(class);
        faulty_dump(model, &target, &format!("{class}@{layer}"));
        let (code, plain) = compare(&reference, &target, None);
        let (ccode, cal) = compare(&reference, &target, Some(floors));
        let expected = format!("model.layers.{layer}.{node}");
        assert_eq!(cal["first_divergence"], expected.as_str(), "{class}: calibrated first divergence ({ccode})");
        let p = cal["pairs"].as_array().unwrap().iter().find(|p| p["name"] == expected.as_str()).unwrap();
        let over = p["floor"]["error_over_floor"].as_f64().unwrap();
        eprintln!(
            "{class}: default thresholds exit {code} ({}), calibrated {over:.1}x its floor, cosine {}",
            plain["verdict"], p["cosine"]
        );
        assert!(over > 8.0, "{class}: {over}");
        assert_eq!(explain(model, &reference, &target, &expected), hypothesis, "{class}: explain's verdict");
        if class == "o-proj-scale" {
            // 33/32 keeps the cosine at 1, the NMSE at 1e-3 and the norm 3% off: inside
            // every default threshold at the planted node (a random tiny model may still flip
            // a near-tie argmax at lm_head).
            let at = plain["pairs"].as_array().unwrap().iter().find(|p| p["name"] == expected.as_str()).unwrap();
            assert_eq!(at["status"], "match", "{class}: the default thresholds should not see a 3% scale: {at}");
            assert_eq!(cal["signature"]["id"], "scale", "{class}");
        }
    }
}

#[test]
#[ignore = "needs the Python reference stack and the real model's tokenizer (scripts/test installs both)"]
fn calibrated_parity_on_a_tiny_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let model = make_tiny_checkpoint(dir.path());
    let out = dir.path().join("parity");
    let report = parity(&model, &out, &[]);
    check_clean(&report, "tiny f32");
    check_faults(&model, &out, 1, (&out.join("reference-f64"), &out.join("reference")));
}

#[test]
#[ignore = "needs the real model and the Python reference stack (scripts/test installs both)"]
fn calibrated_parity_on_the_real_model() {
    let model = real_model();
    require_python_reference();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("f32");
    check_clean(&parity(&model, &out, &[]), "SmolLM2 f32 against f64/f32 floors");
    check_faults(&model, &out, 3, (&out.join("reference-f64"), &out.join("reference")));

    // Native precision against f32/f16 floors, reusing the f32 reference and giving the f16
    // run as a directory (the manifest says which side of the floor it is).
    let f16 = dir.path().join("reference-f16");
    let o = python(&["dump", "--gguf"])
        .arg(&model)
        .args(["--prompt", PROMPT, "--dtype", "f16", "-o"])
        .arg(&f16)
        .output()
        .expect("python3");
    assert!(o.status.success(), "reference dump --dtype f16: {}", stderr(&o));
    let native = dir.path().join("native");
    let reference = out.join("reference");
    let report = parity(
        &model,
        &native,
        &[
            "--precision",
            "native",
            "--reference",
            reference.to_str().unwrap(),
            "--calibration-reference",
            f16.to_str().unwrap(),
        ],
    );
    check_clean(&report, "SmolLM2 native against f32/f16 floors");
    assert!(report["calibration"]["low"].as_str().unwrap().ends_with("reference-f16"), "{}", report["calibration"]);
}

#[test]
fn calibration_flags_are_checked_before_any_work() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a");
    std::fs::create_dir_all(&a).unwrap();
    // A --reference directory with --calibrated needs the second run.
    let o = run(loupe()
        .args(["parity", "-m"])
        .arg(tiny_model())
        .args(["--prompt", "x", "--calibrated", "--reference"])
        .arg(&a));
    assert_clean_failure(&o, "no manifest.json");
    let d = dir.path().join("dump");
    let o = run(loupe().args(["dump", "--prompt", "x", "-m"]).arg(tiny_model()).arg("-o").arg(&d));
    assert!(o.status.success(), "{}", stderr(&o));
    let o = run(loupe()
        .args(["parity", "-m"])
        .arg(tiny_model())
        .args(["--prompt", "x", "--calibrated", "--reference"])
        .arg(&d));
    assert_clean_failure(&o, "needs --calibration-reference DIR");
    let o = run(loupe()
        .args(["compare"])
        .arg(&a)
        .arg(&a)
        .args(["--calibrate"])
        .arg(&a)
        .arg(&a)
        .args(["--calibration-factor", "0.5"]));
    assert_clean_failure(&o, "must be a number >= 1");
    let o = run(loupe().args(["compare"]).arg(&a).arg(&a).args(["--calibration-factor", "4"]));
    assert_eq!(o.status.code(), Some(2), "--calibration-factor without --calibrate: {}", stderr(&o));
}
