//! Hypotheses that need no model (residual adds, the activation, bf16) on synthetic dumps
//! written with loupe-parity's writer: the dumps are read back with its reader, and the op
//! behind each name comes from loupe-models' roles.

use std::path::{Path, PathBuf};

use loupe_explain::{explain, Verdict};
use loupe_parity::{DumpStyle, DumpWriter};
use loupe_tensor::ops::{gelu, silu};

const T: usize = 3;
const D: usize = 8;

fn vals(seed: u32, n: usize) -> Vec<f32> {
    (0..n).map(|i| (((i as u32 * 2654435761u32) ^ seed.wrapping_mul(40503)) % 1000) as f32 / 250.0 - 2.0).collect()
}

fn write(dir: &Path, tensors: &[(&str, Vec<f32>)]) -> PathBuf {
    let mut w = DumpWriter::create(dir, "test", DumpStyle::Npy).unwrap();
    w.manifest.prompt_tokens = Some(vec![1, 2, 3]);
    for (name, data) in tensors {
        w.add(name, 0, &[T, data.len() / T], data).unwrap();
    }
    w.finish().unwrap()
}

fn no_model() -> PathBuf {
    PathBuf::from("/nonexistent/model.gguf")
}

#[test]
fn a_missing_residual_is_named() {
    let tmp = tempfile::tempdir().unwrap();
    let x = vals(1, T * D);
    let o = vals(2, T * D);
    let sum: Vec<f32> = x.iter().zip(&o).map(|(a, b)| a + b).collect();
    // The reference dumped the attention block's output under its alias only.
    let a = write(
        &tmp.path().join("a"),
        &[
            ("model.embed_tokens", x.clone()),
            ("model.layers.0.self_attn", o.clone()),
            ("model.layers.0.attn_residual", sum.clone()),
        ],
    );
    let b =
        write(&tmp.path().join("b"), &[("model.embed_tokens", x.clone()), ("model.layers.0.attn_residual", o.clone())]);
    let e = explain(&a, &b, "model.layers.0.attn_residual", 0, no_model()).unwrap();
    assert_eq!(e.verdict, Verdict::Hypothesis("missing-residual"), "{}", e.conclusion);
    assert_eq!(
        e.inputs.iter().map(|i| i.name.as_str()).collect::<Vec<_>>(),
        ["model.embed_tokens", "model.layers.0.self_attn"]
    );
    // The same target holding the sum: the op is not at fault.
    let c = write(&tmp.path().join("c"), &[("model.layers.0.attn_residual", sum)]);
    assert_eq!(explain(&a, &c, "model.layers.0.attn_residual", 0, no_model()).unwrap().verdict, Verdict::Correct);
}

#[test]
fn the_activation_and_a_layer_output() {
    let tmp = tempfile::tempdir().unwrap();
    let gate = vals(3, T * 12);
    let mut act = gate.clone();
    silu(&mut act);
    let mut wrong = gate.clone();
    gelu(&mut wrong, true);
    let a = write(
        &tmp.path().join("a"),
        &[("model.layers.2.mlp.gate_proj", gate.clone()), ("model.layers.2.mlp.act_fn", act)],
    );
    let b =
        write(&tmp.path().join("b"), &[("model.layers.2.mlp.gate_proj", gate), ("model.layers.2.mlp.act_fn", wrong)]);
    let e = explain(&a, &b, "model.layers.2.mlp.act_fn", 0, no_model()).unwrap();
    assert_eq!(e.verdict, Verdict::Hypothesis("gelu-tanh"), "{}", e.conclusion);
    assert_eq!(e.op, "activation of `model.layers.2.mlp.gate_proj`");

    // model.layers.1 = attn_residual + mlp.down_proj (here dumped as down_proj).
    let r = vals(4, T * D);
    let down = vals(5, T * D);
    let out: Vec<f32> = r.iter().zip(&down).map(|(a, b)| a + b).collect();
    let a = write(
        &tmp.path().join("c"),
        &[("model.layers.1.attn_residual", r), ("model.layers.1.mlp.down_proj", down), ("model.layers.1", out.clone())],
    );
    let e = explain(&a, &a, "model.layers.1", 0, no_model()).unwrap();
    assert_eq!(e.verdict, Verdict::Correct, "{}", e.conclusion);
    assert!(e.op.contains("`model.layers.1.attn_residual` and `model.layers.1.mlp.down_proj`"), "{}", e.op);
}

#[test]
fn bad_input_names_what_is_missing() {
    let tmp = tempfile::tempdir().unwrap();
    let a = write(&tmp.path().join("a"), &[("model.embed_tokens", vals(1, T * D))]);
    let e = explain(&a, &a, "model.layers.0.attn_residual", 0, no_model()).err().unwrap().to_string();
    assert!(e.contains("no tensor 'model.layers.0.attn_residual' at step 0"), "{e}");
    let e = explain(&tmp.path().join("none"), &a, "model.embed_tokens", 0, no_model()).err().unwrap().to_string();
    assert!(e.contains("manifest.json"), "{e}");
    // No op model for the embedding: value-level hypotheses only, and the value matches.
    let e = explain(&a, &a, "model.embed_tokens", 0, no_model()).unwrap();
    assert_eq!(e.verdict, Verdict::Correct);
}

/// A norm that multiplies by `1 + weight` in a model whose RMSNorm multiplies by `weight`
/// (Gemma's convention applied to a Llama, or the reverse) is named: the weights come from a
/// tiny generated GGUF, the values from the RMSNorm kernel.
#[test]
fn a_norm_weight_convention_mixup_is_named() {
    use loupe_graph::WeightData;
    use loupe_models::tiny::{write_tiny_llama_gguf, TinyLlama};
    use loupe_tensor::ops::rms_norm;
    let tmp = tempfile::tempdir().unwrap();
    let spec = TinyLlama::default();
    let model_path = tmp.path().join("tiny.gguf");
    write_tiny_llama_gguf(&model_path, &spec).unwrap();
    let model = loupe_models::load(
        &model_path,
        loupe_models::LoadOptions { precision: loupe_models::Precision::F32, layers: Some(1), ..Default::default() },
    )
    .unwrap();
    let w = match &model.graph.weights.iter().find(|w| w.name == "model.layers.0.input_layernorm.weight").unwrap().data
    {
        WeightData::F32(d) => d.as_ref().clone(),
        WeightData::Quant(_) => panic!("an f32 norm weight expected"),
    };
    let d = spec.hidden;
    let x = vals(9, T * d);
    let norm = |w: &[f32]| {
        let mut out = vec![0.0f32; x.len()];
        rms_norm(&x, w, spec.rms_eps, &mut out).unwrap();
        out
    };
    let plus_one: Vec<f32> = w.iter().map(|v| v + 1.0).collect();
    let a = write(
        &tmp.path().join("a"),
        &[("model.embed_tokens", x.clone()), ("model.layers.0.input_layernorm", norm(&w))],
    );
    let b = write(
        &tmp.path().join("b"),
        &[("model.embed_tokens", x.clone()), ("model.layers.0.input_layernorm", norm(&plus_one))],
    );
    let e = explain(&a, &b, "model.layers.0.input_layernorm", 0, model_path.clone()).unwrap();
    assert_eq!(e.verdict, Verdict::Hypothesis("norm-weight-offset"), "{}", e.conclusion);
    assert!(e.conclusion.contains("1 + weight"), "{}", e.conclusion);
    assert_eq!(explain(&a, &a, "model.layers.0.input_layernorm", 0, model_path).unwrap().verdict, Verdict::Correct);
}
