//! `loupe quantize DIR OUT.gguf` from a Hugging Face checkpoint directory, without Python: the
//! tiny Llama of `loupe_models::tiny` (f32 weights) is exported as an HF directory
//! (config.json, model.safetensors under HF names and row order, tokenizer.json and
//! tokenizer_config.json from its tokenizer), converted back to GGUF, and must be the same
//! model: f32 logits bit-identical to the directory's and the original GGUF's, tokens encoded
//! alike; a Qwen2 variant (random q/k/v biases, q/k rows not permuted) likewise; q8_0 and q4_0
//! files near it, with the embedding rule.

mod common;
use common::{all_logits, argmax};
use std::path::{Path, PathBuf};

use loupe_core::SplitMix64;
use loupe_formats::{GgmlType, GgufFile};
use loupe_graph::WeightData;
use loupe_models::convert::quantize_hf_dir;
use loupe_models::quantize::TensorFate;
use loupe_models::tiny::{self, TinyLlama};
use loupe_models::{load, LoadOptions, Model, Precision};
use safetensors::tensor::TensorView;
use safetensors::Dtype;

const TOKENS: [u32; 12] = [1, 40, 300, 17, 256, 99, 2, 5, 77, 301, 128, 3];

fn load_at(path: &Path, precision: Precision) -> Model {
    load(path, LoadOptions { precision, ..Default::default() }).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The tiny GGUF (every matrix f32) and its model loaded at f32.
fn tiny_f32(dir: &Path) -> (PathBuf, Model) {
    let spec = TinyLlama {
        matrix_type: GgmlType::F32,
        matrix_type_alt: GgmlType::F32,
        embedding_type: GgmlType::F32,
        ..TinyLlama::default()
    };
    let path = dir.join("tiny.gguf");
    tiny::write_tiny_llama_gguf(&path, &spec).unwrap();
    let model = load_at(&path, Precision::F32);
    (path, model)
}

/// `model` exported as a Hugging Face directory of `architecture` (its graph's weights under
/// their HF names, plus `extra` tensors), tied embeddings, SmolLM2-style tokenizer files.
fn export(model: &Model, dir: &Path, architecture: &str, extra: &[(String, Vec<usize>, Vec<f32>)], dtype: Dtype) {
    std::fs::create_dir_all(dir).unwrap();
    let c = model.config.decoder().expect("a decoder");
    let config = serde_json::json!({
        "architectures": [architecture],
        "vocab_size": c.vocab_size, "hidden_size": c.hidden_size, "intermediate_size": c.intermediate_size,
        "num_hidden_layers": c.num_hidden_layers, "num_attention_heads": c.num_attention_heads,
        "num_key_value_heads": c.num_key_value_heads, "rms_norm_eps": c.rms_norm_eps, "rope_theta": c.rope_theta,
        "max_position_embeddings": c.max_position_embeddings, "tie_word_embeddings": true,
        "bos_token_id": tiny::BOS_ID, "eos_token_id": tiny::EOS_ID,
        "torch_dtype": if dtype == Dtype::BF16 { "bfloat16" } else { "float32" },
    });
    std::fs::write(dir.join("config.json"), serde_json::to_string_pretty(&config).unwrap()).unwrap();
    let mut tensors: Vec<(String, Vec<usize>, Vec<f32>)> = model
        .graph
        .weights
        .iter()
        .map(|w| {
            let WeightData::F32(v) = &w.data else { panic!("{} not f32", w.name) };
            (w.name.clone(), w.shape.clone(), v.to_vec())
        })
        .collect();
    tensors.extend(extra.iter().cloned());
    let bytes: Vec<(String, Vec<usize>, Vec<u8>)> = tensors
        .into_iter()
        .map(|(n, s, v)| {
            let b = match dtype {
                Dtype::BF16 => v.iter().flat_map(|x| half::bf16::from_f32(*x).to_le_bytes()).collect(),
                _ => v.iter().flat_map(|x| x.to_le_bytes()).collect(),
            };
            (n, s, b)
        })
        .collect();
    let views: Vec<(&str, TensorView<'_>)> =
        bytes.iter().map(|(n, s, b)| (n.as_str(), TensorView::new(dtype, s.clone(), b).unwrap())).collect();
    safetensors::serialize_to_file(views, None, &dir.join("model.safetensors")).unwrap();
    model.tokenizer.inner().save(dir.join("tokenizer.json"), false).unwrap();
    let tok_cfg = serde_json::json!({
        "bos_token": tiny::SPECIAL_TOKENS[tiny::BOS_ID as usize], "eos_token": tiny::SPECIAL_TOKENS[tiny::EOS_ID as usize],
        "unk_token": tiny::SPECIAL_TOKENS[0], "pad_token": tiny::SPECIAL_TOKENS[tiny::EOS_ID as usize],
        "add_bos_token": false, "chat_template": tiny::CHAT_TEMPLATE,
    });
    std::fs::write(dir.join("tokenizer_config.json"), tok_cfg.to_string()).unwrap();
}

fn convert(dir: &Path, out: &Path, target: GgmlType, keep_embeddings: bool) -> loupe_models::quantize::QuantizeReport {
    quantize_hf_dir(dir, out, target, keep_embeddings, |_, _| {})
        .unwrap_or_else(|e| panic!("quantize {}: {e}", dir.display()))
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| f64::from(*x) * f64::from(*y)).sum();
    let norm = |v: &[f32]| v.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
    dot / (norm(a) * norm(b))
}

/// Rows of `a` and `b` (vocab wide) whose argmax agree.
fn argmax_agreement(a: &[f32], b: &[f32], vocab: usize) -> usize {
    a.chunks(vocab).zip(b.chunks(vocab)).filter(|(x, y)| argmax(x) == argmax(y)).count()
}

#[test]
fn a_llama_directory_converts_to_the_same_model() {
    let tmp = tempfile::tempdir().unwrap();
    let (gguf, original) = tiny_f32(tmp.path());
    let dir = tmp.path().join("hf-llama");
    export(&original, &dir, "LlamaForCausalLM", &[], Dtype::F32);
    let want = all_logits(&original.graph, &TOKENS);
    assert_eq!(
        all_logits(&load_at(&dir, Precision::F32).graph, &TOKENS),
        want,
        "the exported directory is the tiny model"
    );

    let out = tmp.path().join("from-hf-f32.gguf");
    let report = convert(&dir, &out, GgmlType::F32, true);
    assert!(
        report.tensors.iter().all(|(_, f)| !matches!(f, TensorFate::Quantized { .. })),
        "f32 to f32 copies: {:?}",
        report.tensors
    );
    let converted = load_at(&out, Precision::F32);
    assert_eq!(converted.config, original.config, "the GGUF's config");
    assert_eq!(all_logits(&converted.graph, &TOKENS), want, "f32 logits of the converted GGUF");

    // Layout: llama.cpp's names, q/k rows permuted (loupe's loader undid them above, so the
    // file's rows are the tiny GGUF's own), no output.weight (tied), norms f32.
    let (a, b) = (GgufFile::open(&gguf).unwrap(), GgufFile::open(&out).unwrap());
    let names = |f: &GgufFile| {
        let mut n: Vec<String> = f.tensors.iter().map(|t| t.name.clone()).collect();
        n.sort();
        n
    };
    assert_eq!(names(&b), names(&a));
    assert_eq!(b.tensors[0].name, "token_embd.weight");
    for t in &a.tensors {
        assert_eq!(
            b.tensor_data(b.tensor(&t.name).unwrap()),
            a.tensor_data(t),
            "{}: bytes differ from the tiny GGUF's",
            t.name
        );
    }
    for key in [
        "general.architecture",
        "llama.context_length",
        "llama.embedding_length",
        "llama.block_count",
        "llama.feed_forward_length",
        "llama.attention.head_count",
        "llama.attention.head_count_kv",
        "llama.rope.freq_base",
        "llama.attention.layer_norm_rms_epsilon",
        "tokenizer.ggml.model",
        "tokenizer.ggml.bos_token_id",
        "tokenizer.ggml.eos_token_id",
        "tokenizer.ggml.add_bos_token",
        "tokenizer.chat_template",
    ] {
        assert_eq!(b.get(key).map(|v| v.to_string()), a.get(key).map(|v| v.to_string()), "{key}");
    }
    assert_eq!(b.get("general.file_type").map(|v| v.to_string()), Some("0".into()));
    assert_eq!(
        b.opt_str("tokenizer.ggml.pre").unwrap(),
        Some("gpt2"),
        "a plain ByteLevel pre-tokenizer is GPT-2's split"
    );

    // The tokenizer round trip: the GGUF's tokenizer encodes as tokenizer.json does.
    let hf = loupe_text::Tokenizer::from_file(&dir.join("tokenizer.json"), Some(&dir.join("tokenizer_config.json")))
        .unwrap();
    for text in
        ["The quick brown fox", "<|im_start|>user\nhéllo, wörld 🙂<|im_end|>\n", "  spaces  and\nnew lines 1234", ""]
    {
        assert_eq!(converted.tokenizer.encode(text, true).unwrap(), hf.encode(text, true).unwrap(), "{text:?}");
    }
    assert_eq!((converted.tokenizer.bos_id(), converted.tokenizer.eos_id()), (Some(tiny::BOS_ID), Some(tiny::EOS_ID)));
    assert!(converted.chat_template.is_some());

    // q8_0: every matrix q8_0 (the embedding too: the target has 8 bits), logits near f32's.
    let q8 = tmp.path().join("from-hf-q8_0.gguf");
    convert(&dir, &q8, GgmlType::Q8_0, true);
    let g = GgufFile::open(&q8).unwrap();
    assert!(g.tensors.iter().filter(|t| t.dims.len() == 2).all(|t| t.ggml_type == GgmlType::Q8_0));
    assert!(g.tensors.iter().filter(|t| t.dims.len() < 2).all(|t| t.ggml_type == GgmlType::F32));
    let vocab = original.config.vocab_size();
    for precision in [Precision::F32, Precision::Native] {
        let got = all_logits(&load_at(&q8, precision).graph, &TOKENS);
        let (cos, agree) = (cosine(&want, &got), argmax_agreement(&want, &got, vocab));
        eprintln!("q8_0 at {precision:?}: logits cosine {cos}, argmax {agree}/{}", TOKENS.len());
        assert!(cos > 0.999 && cos < 1.0, "q8_0 at {precision:?}: cosine {cos}");
        assert!(
            agree >= TOKENS.len() - 1,
            "q8_0 at {precision:?}: argmax agrees at {agree} of {} positions",
            TOKENS.len()
        );
    }

    // q4_0: the f32 embedding is written in q8_0, not q4_0 (or kept in f32); --all: q4_0.
    let q4 = tmp.path().join("from-hf-q4_0.gguf");
    let report = convert(&dir, &q4, GgmlType::Q4_0, true);
    assert!(
        report
            .tensors
            .contains(&("token_embd.weight".into(), TensorFate::Embedding { from: GgmlType::F32, to: GgmlType::Q8_0 })),
        "{:?}",
        report.tensors
    );
    let g = GgufFile::open(&q4).unwrap();
    assert_eq!(g.tensor("token_embd.weight").unwrap().ggml_type, GgmlType::Q8_0);
    assert_eq!(g.tensor("blk.0.attn_q.weight").unwrap().ggml_type, GgmlType::Q4_0);
    let q4_cos = cosine(&want, &all_logits(&load_at(&q4, Precision::F32).graph, &TOKENS));
    convert(&dir, &q4, GgmlType::Q4_0, false);
    assert_eq!(GgufFile::open(&q4).unwrap().tensor("token_embd.weight").unwrap().ggml_type, GgmlType::Q4_0);
    let q4_all_cos = cosine(&want, &all_logits(&load_at(&q4, Precision::F32).graph, &TOKENS));
    eprintln!("q4_0: logits cosine {q4_cos} (embedding q8_0), {q4_all_cos} (--all)");
    assert!(q4_cos > 0.8 && q4_all_cos < q4_cos, "q4_0 {q4_cos}, q4_0 --all {q4_all_cos}");
}

/// Qwen2: q/k/v biases (random: a converter that drops them changes the logits), q/k rows
/// stored as Hugging Face has them; from a bf16 checkpoint (vectors widened to f32 exactly).
#[test]
fn a_qwen2_directory_with_biases_converts_to_the_same_model() {
    let tmp = tempfile::tempdir().unwrap();
    let (_, original) = tiny_f32(tmp.path());
    let c = original.config.decoder().expect("a decoder");
    let mut rng = SplitMix64(7);
    let mut bias = |n: usize| {
        (0..n).map(|_| ((rng.next_u64() >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.5).collect::<Vec<f32>>()
    };
    let kv = c.num_key_value_heads * c.head_dim;
    let mut extra = Vec::new();
    for l in 0..c.num_hidden_layers {
        for (p, n) in [("q_proj", c.hidden_size), ("k_proj", kv), ("v_proj", kv)] {
            extra.push((format!("model.layers.{l}.self_attn.{p}.bias"), vec![n], bias(n)));
        }
    }
    let dir = tmp.path().join("hf-qwen2");
    export(&original, &dir, "Qwen2ForCausalLM", &extra, Dtype::BF16);
    let from_dir = load_at(&dir, Precision::F32);
    assert_eq!(from_dir.config.family(), loupe_models::Family::Qwen2);
    let want = all_logits(&from_dir.graph, &TOKENS);
    assert_ne!(want, all_logits(&original.graph, &TOKENS), "the biases change the logits");

    let out = tmp.path().join("qwen2-bf16.gguf");
    convert(&dir, &out, GgmlType::BF16, true);
    let g = GgufFile::open(&out).unwrap();
    assert_eq!(g.opt_str("general.architecture").unwrap(), Some("qwen2"));
    assert_eq!(g.tensor("blk.0.attn_q.bias").unwrap().ggml_type, GgmlType::F32);
    assert_eq!(g.tensor("blk.0.attn_q.weight").unwrap().ggml_type, GgmlType::BF16);
    let converted = load_at(&out, Precision::F32);
    assert_eq!(converted.config, from_dir.config);
    assert_eq!(all_logits(&converted.graph, &TOKENS), want, "f32 logits of the converted Qwen2");
}

/// Qwen3: per-head q/k RMSNorms (random weights), no biases, q/k rows not permuted.
#[test]
fn a_qwen3_directory_with_qk_norms_converts_to_the_same_model() {
    let tmp = tempfile::tempdir().unwrap();
    let (_, original) = tiny_f32(tmp.path());
    let c = original.config.decoder().expect("a decoder");
    let mut rng = SplitMix64(11);
    let mut norm = |n: usize| {
        (0..n).map(|_| 1.0 + ((rng.next_u64() >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.4).collect::<Vec<f32>>()
    };
    let extra: Vec<_> = (0..c.num_hidden_layers)
        .flat_map(|l| {
            ["q_norm", "k_norm"]
                .map(|p| (format!("model.layers.{l}.self_attn.{p}.weight"), vec![c.head_dim], norm(c.head_dim)))
        })
        .collect();
    let dir = tmp.path().join("hf-qwen3");
    export(&original, &dir, "Qwen3ForCausalLM", &extra, Dtype::F32);
    let from_dir = load_at(&dir, Precision::F32);
    assert_eq!(from_dir.config.family(), loupe_models::Family::Qwen3);
    let want = all_logits(&from_dir.graph, &TOKENS);
    let out = tmp.path().join("qwen3-f32.gguf");
    convert(&dir, &out, GgmlType::F32, true);
    let g = GgufFile::open(&out).unwrap();
    assert_eq!(g.opt_str("general.architecture").unwrap(), Some("qwen3"));
    assert!(g.tensor("blk.1.attn_k_norm.weight").is_some());
    let converted = load_at(&out, Precision::F32);
    assert_eq!(converted.config, from_dir.config);
    assert_eq!(all_logits(&converted.graph, &TOKENS), want, "f32 logits of the converted Qwen3");
}

fn error_of(dir: &Path) -> String {
    let out = dir.join("out.gguf");
    let e = quantize_hf_dir(dir, &out, GgmlType::Q8_0, true, |_, _| {})
        .err()
        .unwrap_or_else(|| panic!("{}: converted", dir.display()));
    assert!(!out.exists(), "no output written on error");
    e.to_string()
}

#[test]
fn unconvertible_directories_are_refused_naming_the_file_or_key() {
    let tmp = tempfile::tempdir().unwrap();
    let (_, original) = tiny_f32(tmp.path());
    let dir = tmp.path().join("hf");
    export(&original, &dir, "LlamaForCausalLM", &[], Dtype::F32);
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    let with_config = |name: &str, edit: &dyn Fn(&mut serde_json::Value)| {
        let d = tmp.path().join(name);
        std::fs::create_dir_all(&d).unwrap();
        for f in ["model.safetensors", "tokenizer.json", "tokenizer_config.json"] {
            std::fs::copy(dir.join(f), d.join(f)).unwrap();
        }
        let mut c = config.clone();
        edit(&mut c);
        std::fs::write(d.join("config.json"), c.to_string()).unwrap();
        d
    };
    let cases: Vec<(PathBuf, &str)> = vec![
        (
            with_config("gpt2", &|c| c["architectures"] = serde_json::json!(["GPT2LMHeadModel"])),
            "unsupported architecture 'GPT2LMHeadModel'",
        ),
        (
            with_config("phi3", &|c| c["architectures"] = serde_json::json!(["Phi3ForCausalLM"])),
            "'phi3 (not converted to GGUF)' (supported: llama, qwen2, qwen3)",
        ),
        (
            with_config("no-hidden", &|c| drop(c.as_object_mut().unwrap().remove("hidden_size"))),
            "invalid hidden_size: missing",
        ),
        (
            with_config("window", &|c| {
                c["architectures"] = serde_json::json!(["Qwen2ForCausalLM"]);
                c["use_sliding_window"] = serde_json::json!(true);
                c["sliding_window"] = serde_json::json!(8);
                c["max_window_layers"] = serde_json::json!(0);
            }),
            "invalid sliding_window",
        ),
        (with_config("gelu", &|c| c["hidden_act"] = serde_json::json!("gelu_pytorch_tanh")), "invalid hidden_act"),
    ];
    for (d, needle) in cases {
        let e = error_of(&d);
        assert!(e.contains(needle) && !e.contains('\n'), "{}: {e:?} should be one line naming {needle:?}", d.display());
    }
    let no_tok = with_config("no-tokenizer", &|_| {});
    std::fs::remove_file(no_tok.join("tokenizer.json")).unwrap();
    let e = error_of(&no_tok);
    assert!(e.contains("tokenizer.json: missing"), "{e}");
    let no_config = with_config("no-config", &|_| {});
    std::fs::remove_file(no_config.join("config.json")).unwrap();
    assert!(error_of(&no_config).contains("config.json: missing"));
    let no_weights = with_config("no-weights", &|_| {});
    std::fs::remove_file(no_weights.join("model.safetensors")).unwrap();
    assert!(error_of(&no_weights).contains("model.safetensors"), "{}", error_of(&no_weights));

    // A WordPiece tokenizer (BERT's) is refused naming it.
    let bert = tmp.path().join("bert");
    loupe_models::tiny_bert::write_tiny_bert(&bert, &Default::default()).unwrap();
    std::fs::write(bert.join("config.json"), config.to_string()).unwrap();
    let e = error_of(&bert);
    assert!(e.contains("tokenizer.json: a WordPiece tokenizer is not converted"), "{e}");
}
