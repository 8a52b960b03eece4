//! The dumper guard on the real model (docs/parity-protocol.md, step 1): `loupe parity` against
//! the live transformers reference finds identical prompt tokens, embedding cosine 1.0,
//! every layer at cosine >= 0.999, and exits 0.

mod common;
use common::*;

#[test]
#[ignore = "needs the real model and the Python reference stack (scripts/test installs both)"]
fn parity_against_live_reference_passes_the_dumper_guard() {
    let model = real_model();
    require_python_reference();
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("report.json");
    let out = run(loupe()
        .arg("parity")
        .arg("--model")
        .arg(&model)
        .args(["--prompt", "Name a planet with rings.", "--chat", "--json"])
        .arg(&json)
        .env("PYTHONPATH", repo_root().join("reference")));
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "loupe parity failed:\n{text}\n{}", stderr(&out));
    assert!(text.contains("verdict: MATCH"), "{text}");
    assert!(text.contains("dumper guard: prompt tokens identical") && text.contains("pass"), "{text}");
    let report: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(report["verdict"], "match");
    assert!(report["first_divergence"].is_null());
    let pairs = report["pairs"].as_array().unwrap();
    let cos = |name: &str| {
        pairs
            .iter()
            .find(|p| p["name"] == name)
            .and_then(|p| p["cosine"].as_f64())
            .unwrap_or_else(|| panic!("{name} not compared"))
    };
    assert!(cos("model.embed_tokens") >= 0.999_999);
    for l in 0..30 {
        let c = cos(&format!("model.layers.{l}"));
        assert!(c >= 0.999, "layer {l} cosine {c}");
    }
    assert!(pairs.len() > 500, "expected every module and sub-op compared, got {}", pairs.len());
}
