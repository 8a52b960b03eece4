//! A tiny random-weight BERT checkpoint directory for tests that need no download and no
//! Python: `config.json` (`BertModel`), `model.safetensors` (f32, seeded weights),
//! `tokenizer.json` (a lowercasing WordPiece over a few words and single letters, with
//! `[CLS] ... [SEP]`) and sentence-transformers' `modules.json` + mean `1_Pooling` +
//! `Normalize`, as all-MiniLM-L6-v2 ships them.

use std::collections::BTreeMap;
use std::path::Path;

use loupe_formats::safetensors_file::write_safetensors;
use safetensors::Dtype;
use serde_json::json;

use crate::error::ModelError;

/// The tiny BERT's shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TinyBert {
    pub hidden: usize,
    pub heads: usize,
    pub layers: usize,
    pub intermediate: usize,
    pub max_positions: usize,
    pub seed: u64,
}

impl Default for TinyBert {
    fn default() -> TinyBert {
        TinyBert { hidden: 32, heads: 4, layers: 2, intermediate: 64, max_positions: 64, seed: 7 }
    }
}

/// Specials first (their ids are BERT's order: `[PAD]` 0 ... `[MASK]` 4), then whole words,
/// single letters and `##` continuations, so every lowercase ASCII word tokenizes.
pub fn tiny_bert_vocab() -> Vec<String> {
    let mut v: Vec<String> = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"].iter().map(|s| s.to_string()).collect();
    v.extend(["the", "cat", "dog", "sat", "ran", "on", "mat", "a", ".", ","].iter().map(|s| s.to_string()));
    for c in 'a'..='z' {
        if !v.contains(&c.to_string()) {
            v.push(c.to_string());
        }
        v.push(format!("##{c}"));
    }
    v
}

/// Seeded weights: SplitMix64 into uniform values in `[-scale, scale)`.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> f32 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        (z >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0
    }

    fn fill(&mut self, n: usize, centre: f32, scale: f32) -> Vec<f32> {
        (0..n).map(|_| centre + scale * self.next()).collect()
    }
}

/// Every tensor of the tiny `BertModel` state dict (pooler included, which loupe ignores as
/// transformers' checkpoints carry it), in a fixed order.
pub fn tiny_bert_tensors(spec: &TinyBert) -> Vec<(String, Vec<usize>, Vec<f32>)> {
    let (d, f) = (spec.hidden, spec.intermediate);
    let vocab = tiny_bert_vocab().len();
    let mut rng = Rng(spec.seed);
    let mut t = Vec::new();
    let mut push = |name: String, shape: Vec<usize>, centre: f32, scale: f32, rng: &mut Rng| {
        let n = shape.iter().product();
        t.push((name, shape, rng.fill(n, centre, scale)));
    };
    push("embeddings.word_embeddings.weight".into(), vec![vocab, d], 0.0, 1.0, &mut rng);
    push("embeddings.position_embeddings.weight".into(), vec![spec.max_positions, d], 0.0, 0.5, &mut rng);
    push("embeddings.token_type_embeddings.weight".into(), vec![2, d], 0.0, 0.5, &mut rng);
    push("embeddings.LayerNorm.weight".into(), vec![d], 1.0, 0.2, &mut rng);
    push("embeddings.LayerNorm.bias".into(), vec![d], 0.0, 0.1, &mut rng);
    // Projections scaled so attention is far from uniform and the residual stream moves.
    let proj = 2.0 / (d as f32).sqrt();
    for l in 0..spec.layers {
        let p = format!("encoder.layer.{l}");
        for m in ["attention.self.query", "attention.self.key", "attention.self.value", "attention.output.dense"] {
            push(format!("{p}.{m}.weight"), vec![d, d], 0.0, proj, &mut rng);
            push(format!("{p}.{m}.bias"), vec![d], 0.0, 0.1, &mut rng);
        }
        push(format!("{p}.attention.output.LayerNorm.weight"), vec![d], 1.0, 0.2, &mut rng);
        push(format!("{p}.attention.output.LayerNorm.bias"), vec![d], 0.0, 0.1, &mut rng);
        push(format!("{p}.intermediate.dense.weight"), vec![f, d], 0.0, proj, &mut rng);
        push(format!("{p}.intermediate.dense.bias"), vec![f], 0.0, 0.1, &mut rng);
        push(format!("{p}.output.dense.weight"), vec![d, f], 0.0, 2.0 / (f as f32).sqrt(), &mut rng);
        push(format!("{p}.output.dense.bias"), vec![d], 0.0, 0.1, &mut rng);
        push(format!("{p}.output.LayerNorm.weight"), vec![d], 1.0, 0.2, &mut rng);
        push(format!("{p}.output.LayerNorm.bias"), vec![d], 0.0, 0.1, &mut rng);
    }
    push("pooler.dense.weight".into(), vec![d, d], 0.0, proj, &mut rng);
    push("pooler.dense.bias".into(), vec![d], 0.0, 0.1, &mut rng);
    t
}

/// The `config.json` of [`write_tiny_bert`].
pub fn tiny_bert_config(spec: &TinyBert) -> serde_json::Value {
    json!({
        "architectures": ["BertModel"],
        "model_type": "bert",
        "hidden_act": "gelu",
        "hidden_size": spec.hidden,
        "intermediate_size": spec.intermediate,
        "layer_norm_eps": 1e-12,
        "max_position_embeddings": spec.max_positions,
        "num_attention_heads": spec.heads,
        "num_hidden_layers": spec.layers,
        "pad_token_id": 0,
        "position_embedding_type": "absolute",
        "type_vocab_size": 2,
        "vocab_size": tiny_bert_vocab().len(),
    })
}

/// Writes the tiny checkpoint into `dir` (created if needed).
pub fn write_tiny_bert(dir: &Path, spec: &TinyBert) -> Result<(), ModelError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |e| ModelError::Io { path, source: e }
    };
    std::fs::create_dir_all(dir.join("1_Pooling")).map_err(io(dir))?;
    let write = |rel: &str, bytes: &[u8]| std::fs::write(dir.join(rel), bytes).map_err(io(&dir.join(rel)));
    write("config.json", tiny_bert_config(spec).to_string().as_bytes())?;
    let tensors = tiny_bert_tensors(spec);
    let bytes: Vec<Vec<u8>> =
        tensors.iter().map(|(_, _, v)| v.iter().flat_map(|x| x.to_le_bytes()).collect()).collect();
    let entries: Vec<(&str, Dtype, &[usize], &[u8])> =
        tensors.iter().zip(&bytes).map(|((n, s, _), b)| (n.as_str(), Dtype::F32, s.as_slice(), b.as_slice())).collect();
    write("model.safetensors", &write_safetensors(&entries, &BTreeMap::new()))?;
    let vocab: serde_json::Map<String, serde_json::Value> =
        tiny_bert_vocab().into_iter().enumerate().map(|(i, t)| (t, json!(i))).collect();
    let special = |id: usize, content: &str| json!({"id": id, "content": content, "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true});
    let tokenizer = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": [special(0, "[PAD]"), special(1, "[UNK]"), special(2, "[CLS]"), special(3, "[SEP]"), special(4, "[MASK]")],
        "normalizer": {"type": "BertNormalizer", "clean_text": true, "handle_chinese_chars": true, "strip_accents": null, "lowercase": true},
        "pre_tokenizer": {"type": "BertPreTokenizer"},
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "[CLS]", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}, {"SpecialToken": {"id": "[SEP]", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": "[CLS]", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}, {"SpecialToken": {"id": "[SEP]", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}, {"SpecialToken": {"id": "[SEP]", "type_id": 1}}],
            "special_tokens": {"[CLS]": {"id": "[CLS]", "ids": [2], "tokens": ["[CLS]"]}, "[SEP]": {"id": "[SEP]", "ids": [3], "tokens": ["[SEP]"]}}
        },
        "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": true},
        "model": {"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##", "max_input_chars_per_word": 100, "vocab": vocab}
    });
    write("tokenizer.json", tokenizer.to_string().as_bytes())?;
    let tokenizer_config = json!({"do_lower_case": true, "unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]", "cls_token": "[CLS]", "mask_token": "[MASK]", "tokenizer_class": "BertTokenizer", "model_max_length": spec.max_positions});
    write("tokenizer_config.json", tokenizer_config.to_string().as_bytes())?;
    let modules = json!([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}
    ]);
    write("modules.json", modules.to_string().as_bytes())?;
    write(
        "sentence_bert_config.json",
        json!({"max_seq_length": spec.max_positions / 2, "do_lower_case": false}).to_string().as_bytes(),
    )?;
    write("1_Pooling/config.json", json!({"word_embedding_dimension": spec.hidden, "pooling_mode_cls_token": false, "pooling_mode_mean_tokens": true, "pooling_mode_max_tokens": false, "pooling_mode_mean_sqrt_len_tokens": false}).to_string().as_bytes())?;
    Ok(())
}
