//! The BERT encoder on a tiny generated checkpoint (no download, no Python): every token's
//! last hidden state against a plain f64 forward written from `modeling_bert.py`, the
//! bidirectional mask, position embeddings, truncation, pooling, and the refusals.

use std::collections::HashMap;
use std::path::Path;

use loupe_models::tiny_bert::{tiny_bert_tensors, write_tiny_bert, TinyBert};
use loupe_runtime::{Engine, LoadOptions, Pooling};

fn load(dir: &Path) -> Engine {
    Engine::load(dir, LoadOptions { precision: loupe_models::Precision::F32, ..LoadOptions::default() })
        .expect("tiny BERT loads")
}

fn tiny() -> (tempfile::TempDir, TinyBert) {
    let dir = tempfile::tempdir().unwrap();
    let spec = TinyBert::default();
    write_tiny_bert(dir.path(), &spec).unwrap();
    (dir, spec)
}

/// Every token's last hidden state, `[tokens * hidden]`.
fn states(engine: &Engine, ids: &[u32]) -> Vec<f32> {
    let mut session = engine.session(ids.len());
    session.forward(ids, true, None).unwrap().to_vec()
}

/// erf to ~1e-7 (Abramowitz & Stegun 7.1.26), far below the f32 noise this test allows.
fn erf(x: f64) -> f64 {
    let t = 1.0 / (1.0 + 0.327_591_1 * x.abs());
    let y = 1.0
        - (((((1.061_405_429 * t - 1.453_152_027) * t) + 1.421_413_741) * t - 0.284_496_736) * t + 0.254_829_592)
            * t
            * (-x * x).exp();
    y.copysign(x)
}

/// `BertModel.forward` in f64, from the state dict: embeddings (word + type 0 + position,
/// LayerNorm), then per layer full self-attention, dense + residual + LayerNorm, GELU MLP,
/// dense + residual + LayerNorm.
fn reference(spec: &TinyBert, ids: &[u32]) -> Vec<Vec<f64>> {
    let w: HashMap<String, Vec<f64>> =
        tiny_bert_tensors(spec).into_iter().map(|(n, _, v)| (n, v.into_iter().map(f64::from).collect())).collect();
    let d = spec.hidden;
    let (h, hd) = (spec.heads, spec.hidden / spec.heads);
    let ln = |x: &[f64], name: &str| -> Vec<f64> {
        let mean = x.iter().sum::<f64>() / x.len() as f64;
        let var = x.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / x.len() as f64;
        let (g, b) = (&w[&format!("{name}.weight")], &w[&format!("{name}.bias")]);
        x.iter().enumerate().map(|(i, v)| (v - mean) / (var + 1e-12).sqrt() * g[i] + b[i]).collect()
    };
    let linear = |x: &[f64], name: &str| -> Vec<f64> {
        let (m, b) = (&w[&format!("{name}.weight")], &w[&format!("{name}.bias")]);
        let k = x.len();
        (0..b.len()).map(|o| b[o] + (0..k).map(|i| m[o * k + i] * x[i]).sum::<f64>()).collect()
    };
    let mut x: Vec<Vec<f64>> = ids
        .iter()
        .enumerate()
        .map(|(t, &id)| {
            let row = |name: &str, r: usize| w[name][r * d..(r + 1) * d].to_vec();
            let (word, ty, pos) = (
                row("embeddings.word_embeddings.weight", id as usize),
                row("embeddings.token_type_embeddings.weight", 0),
                row("embeddings.position_embeddings.weight", t),
            );
            let sum: Vec<f64> = (0..d).map(|i| word[i] + ty[i] + pos[i]).collect();
            ln(&sum, "embeddings.LayerNorm")
        })
        .collect();
    for l in 0..spec.layers {
        let p = format!("encoder.layer.{l}");
        let q: Vec<Vec<f64>> = x.iter().map(|r| linear(r, &format!("{p}.attention.self.query"))).collect();
        let k: Vec<Vec<f64>> = x.iter().map(|r| linear(r, &format!("{p}.attention.self.key"))).collect();
        let v: Vec<Vec<f64>> = x.iter().map(|r| linear(r, &format!("{p}.attention.self.value"))).collect();
        let n = x.len();
        let mut ctx = vec![vec![0.0; d]; n];
        for head in 0..h {
            let s = head * hd..(head + 1) * hd;
            for t in 0..n {
                // No mask: every query sees every key (an encoder).
                let scores: Vec<f64> =
                    (0..n).map(|u| s.clone().map(|i| q[t][i] * k[u][i]).sum::<f64>() / (hd as f64).sqrt()).collect();
                let max = scores.iter().cloned().fold(f64::MIN, f64::max);
                let e: Vec<f64> = scores.iter().map(|z| (z - max).exp()).collect();
                let total: f64 = e.iter().sum();
                for i in s.clone() {
                    ctx[t][i] = (0..n).map(|u| e[u] / total * v[u][i]).sum();
                }
            }
        }
        let attn: Vec<Vec<f64>> = (0..n)
            .map(|t| {
                let dense = linear(&ctx[t], &format!("{p}.attention.output.dense"));
                let sum: Vec<f64> = dense.iter().zip(&x[t]).map(|(a, b)| a + b).collect();
                ln(&sum, &format!("{p}.attention.output.LayerNorm"))
            })
            .collect();
        x = attn
            .iter()
            .map(|a| {
                let inter: Vec<f64> = linear(a, &format!("{p}.intermediate.dense"))
                    .into_iter()
                    .map(|z| 0.5 * z * (1.0 + erf(z / 2f64.sqrt())))
                    .collect();
                let out = linear(&inter, &format!("{p}.output.dense"));
                let sum: Vec<f64> = out.iter().zip(a).map(|(o, r)| o + r).collect();
                ln(&sum, &format!("{p}.output.LayerNorm"))
            })
            .collect();
    }
    x
}

#[test]
fn tiny_bert_states_match_a_scalar_reference() {
    let (dir, spec) = tiny();
    let engine = load(dir.path());
    assert!(engine.is_encoder());
    let ids = engine.tokenizer().encode("The cat sat on the mat, a dog ran.", true).unwrap();
    assert_eq!(ids.first(), Some(&2), "[CLS] first: {ids:?}");
    assert_eq!(ids.last(), Some(&3), "[SEP] last: {ids:?}");
    let ours = states(&engine, &ids);
    let want = reference(&spec, &ids);
    assert_eq!(ours.len(), ids.len() * spec.hidden);
    let mut worst = 0f64;
    for (t, row) in want.iter().enumerate() {
        for (i, &r) in row.iter().enumerate() {
            worst = worst.max((ours[t * spec.hidden + i] as f64 - r).abs());
        }
    }
    assert!(worst < 1e-4, "largest difference from the f64 reference: {worst}");
}

#[test]
fn every_token_sees_every_other() {
    let (dir, spec) = tiny();
    let engine = load(dir.path());
    let a = engine.tokenizer().encode("the cat sat", true).unwrap();
    let b = engine.tokenizer().encode("the cat ran", true).unwrap();
    assert_eq!(a.len(), b.len());
    let (sa, sb) = (states(&engine, &a), states(&engine, &b));
    // Under a causal mask [CLS]'s state could not depend on the last word; here it must.
    let first_diff = sa[..spec.hidden].iter().zip(&sb[..spec.hidden]).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
    assert!(first_diff > 1e-3, "[CLS] did not see the last word (max difference {first_diff})");
}

#[test]
fn embeddings_depend_on_word_order_and_are_unit_length() {
    let (dir, spec) = tiny();
    let engine = load(dir.path());
    let config = engine.embed_config().unwrap();
    assert_eq!((config.pooling, config.normalize, config.max_tokens), (Pooling::Mean, true, spec.max_positions / 2));
    let a = engine.embed("cat dog", &config).unwrap();
    let b = engine.embed("dog cat", &config).unwrap();
    assert_eq!(a.vector.len(), spec.hidden);
    assert_eq!(a.tokens, 4);
    let norm = a.vector.iter().map(|v| v * v).sum::<f32>().sqrt();
    assert!((norm - 1.0).abs() < 1e-5, "norm {norm}");
    // Mean pooling is order-blind; only the position embeddings tell these apart.
    let diff = a.vector.iter().zip(&b.vector).map(|(x, y)| (x - y).abs()).fold(0f32, f32::max);
    assert!(diff > 1e-3, "word order changed nothing (max difference {diff})");
    // One session for several inputs (a longer one first) gives each the vector it gets alone.
    let all = engine.embed_all(&["the dog sat on the mat", "cat dog", "dog cat"], &config).unwrap();
    assert_eq!((&all[1], &all[2]), (&a, &b));
    // Pooling by hand from the states gives the same vector.
    let ids = engine.tokenizer().encode("cat dog", true).unwrap();
    let mut mean = loupe_runtime::embed::pool(&states(&engine, &ids), spec.hidden, Pooling::Mean);
    loupe_runtime::embed::l2_normalize(&mut mean);
    assert_eq!(mean, a.vector);
}

#[test]
fn long_inputs_are_cut_at_max_seq_length_keeping_the_specials() {
    let (dir, spec) = tiny();
    let engine = load(dir.path());
    let config = engine.embed_config().unwrap();
    let text = "the cat sat on the mat ".repeat(10);
    let e = engine.embed(&text, &config).unwrap();
    assert_eq!((e.tokens, e.truncated), (spec.max_positions / 2, true));
    let (ids, full) = engine.tokenizer().encode_truncated(&text, config.max_tokens).unwrap();
    assert_eq!((ids.len(), full), (config.max_tokens, 62));
    assert_eq!((ids[0], *ids.last().unwrap()), (2, 3));
    let short = engine.embed("the cat", &config).unwrap();
    assert!(!short.truncated);
}

#[test]
fn bert_options_loupe_does_not_build_are_refused_by_name() {
    for (key, value) in [
        ("is_decoder", serde_json::json!(true)),
        ("position_embedding_type", serde_json::json!("relative_key")),
        ("hidden_act", serde_json::json!("relu")),
        ("type_vocab_size", serde_json::json!(0)),
    ] {
        let (dir, spec) = tiny();
        let mut config = loupe_models::tiny_bert::tiny_bert_config(&spec);
        config[key] = value;
        std::fs::write(dir.path().join("config.json"), config.to_string()).unwrap();
        let err = Engine::load(dir.path(), LoadOptions::default()).err().expect("refused").to_string();
        assert!(err.contains(key) && err.contains("config.json"), "{key}: {err}");
    }
}

#[test]
fn planted_faults_are_refused_for_encoders() {
    let (dir, _) = tiny();
    let fault: loupe_models::Fault = "o-proj-scale@0".parse().unwrap();
    let err = Engine::load(dir.path(), LoadOptions { faults: vec![fault], ..LoadOptions::default() })
        .err()
        .expect("refused")
        .to_string();
    assert!(err.contains("decoder families"), "{err}");
}
