//! Taps have no observer effect, and `loupe dump` writes the documented layout: on the tiny
//! random-weight model (always), and the no-observer-effect check on the real model too.

mod common;
use common::*;
use loupe_graph::{Observer, ValueInfo};
use loupe_models::{LoadOptions, Precision};
use loupe_runtime::Session;

/// Wants every value (attention probabilities included) and touches every element.
struct TapAll {
    values: usize,
    checksum: f64,
}

impl Observer for TapAll {
    fn wants(&mut self, _: &ValueInfo) -> bool {
        true
    }
    fn observe(&mut self, _: &ValueInfo, shape: &[usize], data: &[f32]) {
        assert_eq!(shape.iter().product::<usize>(), data.len());
        self.values += 1;
        self.checksum += data.iter().map(|&v| v as f64).sum::<f64>();
    }
}

#[test]
fn logits_are_bit_identical_with_every_tap_on_and_with_none() {
    taps_change_nothing(&tiny_model(), tiny_spec().layers);
}

#[test]
#[ignore = "needs the real model (scripts/test fetches it)"]
fn logits_are_bit_identical_with_every_tap_on_and_with_none_on_the_real_model() {
    taps_change_nothing(&real_model(), 30);
}

fn taps_change_nothing(path: &std::path::Path, layers: usize) {
    for precision in [Precision::F32, Precision::Native] {
        let model = loupe_models::load(
            path,
            LoadOptions { precision, layers: None, progress: None, faults: Vec::new(), ..Default::default() },
        )
        .unwrap();
        // The graph as built and as lowered (fused, memory-planned): taps must not change
        // either, and lowering must not change the numbers.
        let lowered = loupe_graph::passes::lower(
            model.graph.clone(),
            &loupe_graph::passes::LowerOptions { verify_between: true, ..Default::default() },
        )
        .unwrap()
        .graph;
        let mut results = Vec::new();
        for graph in [&model.graph, &lowered] {
            let prompt = model.tokenizer.encode("The quick brown fox jumps over the lazy dog because", true).unwrap();
            let next = model.tokenizer.encode(" it", false).unwrap()[0];
            let run = |tap: Option<&mut TapAll>| {
                let mut s = Session::new(graph, 64, &Default::default());
                match tap {
                    None => {
                        let a = s.forward(&prompt, true, None).unwrap().to_vec();
                        (a, s.forward(&[next], true, None).unwrap().to_vec())
                    }
                    Some(t) => {
                        let a = s.forward(&prompt, true, Some(&mut *t)).unwrap().to_vec();
                        (a, s.forward(&[next], true, Some(t)).unwrap().to_vec())
                    }
                }
            };
            let plain = run(None);
            let mut tap = TapAll { values: 0, checksum: 0.0 };
            let tapped = run(Some(&mut tap));
            assert!(tap.values > layers * 15, "{precision:?}: only {} values observed", tap.values);
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&plain.0), bits(&tapped.0), "{precision:?}: prefill logits changed when tapped");
            assert_eq!(bits(&plain.1), bits(&tapped.1), "{precision:?}: decode logits changed when tapped");
            results.push((bits(&plain.0), bits(&plain.1), tap.values));
        }
        assert_eq!(results[0], results[1], "{precision:?}: lowering changed the logits or the observable values");
    }
}

#[test]
fn dump_writes_manifest_and_npy_files() {
    let model = tiny_model();
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().join("dump");
    let out = run(loupe()
        .arg("dump")
        .arg("--model")
        .arg(&model)
        .args([
            "--prompt",
            "Hello there",
            "--layers",
            "2",
            "--steps",
            "1",
            "--taps",
            r"^model\.layers\.1(\.|$)|^lm_head$|^model\.embed_tokens$",
            "-o",
        ])
        .arg(&out_dir));
    assert!(out.status.success(), "{}", stderr(&out));
    let m: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out_dir.join("manifest.json")).unwrap()).unwrap();
    assert_eq!(m["format"], "loupe-dump");
    assert_eq!(m["layers"], 2);
    let prompt_len = m["prompt_tokens"].as_array().unwrap().len();
    let tensors = m["tensors"].as_array().unwrap();
    let names: Vec<&str> = tensors.iter().map(|t| t["name"].as_str().unwrap()).collect();
    for want in [
        "model.embed_tokens",
        "model.layers.1.self_attn.q_rope",
        "model.layers.1.self_attn.attn_probs",
        "model.layers.1.self_attn",
        "model.layers.1.self_attn.o_proj",
        "model.layers.1",
        "lm_head",
    ] {
        assert!(names.contains(&want), "{want} missing from {names:?}");
    }
    assert!(!names.iter().any(|n| n.starts_with("model.layers.0.")), "layer 0 was not selected");
    let mut last_order = None;
    for t in tensors {
        let shape: Vec<usize> = t["shape"].as_array().unwrap().iter().map(|d| d.as_u64().unwrap() as usize).collect();
        let step = t["step"].as_u64().unwrap() as usize;
        let order = t["order"].as_u64().unwrap();
        assert!(last_order.is_none_or(|o| order > o), "execution order must increase");
        last_order = Some(order);
        let file = out_dir.join(t["file"].as_str().unwrap());
        let npy = loupe_formats::npy::NpyFile::open(&file).unwrap();
        let stored = npy.tensor().unwrap();
        assert_eq!(stored.shape, shape, "{}", t["name"]);
        let tokens = if step == 0 { prompt_len } else { 1 };
        if t["name"] == "model.layers.1.self_attn.attn_probs" {
            assert_eq!(shape, vec![tiny_spec().heads, tokens, prompt_len + step]);
        } else {
            assert_eq!(shape[0], tokens, "{}", t["name"]);
        }
    }
    assert!(tensors.iter().any(|t| t["step"] == 1));
}

#[test]
fn failed_dump_leaves_no_partial_output() {
    let model = tiny_model();
    let dir = tempfile::tempdir().unwrap();
    let out_dir = dir.path().join("dump");
    let out = run(loupe()
        .arg("dump")
        .arg("--model")
        .arg(&model)
        .args(["--prompt", "Hi", "--steps", "2", "--teacher-force", "5,x", "-o"])
        .arg(&out_dir));
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(std::fs::read_dir(dir.path()).unwrap().next().is_none(), "something was left behind");
    // a vocabulary-overflowing forced id fails mid-run: the staging directory is removed
    let out = run(loupe()
        .arg("dump")
        .arg("--model")
        .arg(&model)
        .args(["--prompt", "Hi", "--steps", "1", "--teacher-force", "999999", "-o"])
        .arg(&out_dir));
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(std::fs::read_dir(dir.path()).unwrap().next().is_none(), "partial output left behind");
}

#[test]
fn compact_print_without_output_dir() {
    let model = tiny_model();
    let out = run(loupe().arg("dump").arg("--model").arg(&model).args([
        "--prompt",
        "Hi",
        "--layers",
        "1",
        "--taps",
        "^model.norm$",
    ]));
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.starts_with("model.norm = tensor([["), "{text}");
    // One row per prompt token ("Hi" is 2 tokens in the tiny vocabulary).
    assert!(text.trim_end().ends_with(&format!("dtype=f32, shape=[2,{}])", tiny_spec().hidden)), "{text}");
    assert_eq!(text.trim_end().lines().count(), 2, "{text}");
}
