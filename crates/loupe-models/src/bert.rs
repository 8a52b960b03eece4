//! BERT encoders as a graph whose values carry `BertModel`'s module paths
//! (`transformers/models/bert/modeling_bert.py`): word + token-type + absolute position
//! embeddings and a LayerNorm, then N x (bidirectional self-attention with biased q/k/v,
//! `attention.output.dense`, residual, LayerNorm, `intermediate.dense`, GELU,
//! `output.dense`, residual, LayerNorm). The run returns every token's last hidden state
//! ([`loupe_graph::Graph::encoder`]); pooling into a sentence embedding is the runtime's
//! (`loupe_runtime::embed`), as sentence-transformers pools outside `BertModel`.
//!
//! `BertModel`'s own `pooler` (a dense + tanh of the first token, which sentence-transformers
//! does not use) is not built; its weights are left in the checkpoint.

use std::path::Path;

use loupe_graph::{Dim, Fault, Graph, GraphBuilder, KvWrite, Op, ValueId};
use loupe_tensor::ops::{AttentionMask, AttentionShape, AttentionVariant};
use serde_json::Value;

use crate::config::read_config_json;
use crate::error::ModelError;
use crate::family::HiddenAct;
use crate::weights::WeightSource;

/// A BERT encoder's hyper-parameters (`BertConfig`'s keys loupe builds).
#[derive(Debug, Clone, PartialEq)]
pub struct BertConfig {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    /// hidden_size / num_attention_heads (`BertSelfAttention.attention_head_size`).
    pub head_dim: usize,
    pub layer_norm_eps: f32,
    /// Rows of `position_embeddings` (absolute positions).
    pub max_position_embeddings: usize,
    pub hidden_act: HiddenAct,
    /// `BertSelfAttention.scaling = attention_head_size ** -0.5`.
    pub attention_scale: f32,
    /// Rows of `token_type_embeddings` (segment ids; loupe feeds type 0, one segment).
    pub type_vocab_size: usize,
}

impl BertConfig {
    /// Reads a `BertConfig` config.json (the keys `BertConfig` defines, with its defaults).
    /// Options loupe does not build (a decoder, cross-attention, relative position
    /// embeddings, an activation other than GELU) are refused by name.
    pub fn from_json(v: &Value, path: &Path) -> Result<BertConfig, ModelError> {
        let bad = |field: &str, reason: String| ModelError::InvalidConfig {
            source_file: path.to_path_buf(),
            field: field.to_string(),
            reason,
        };
        let usize_or = |k: &str, default: Option<usize>| -> Result<usize, ModelError> {
            match v.get(k) {
                None | Some(Value::Null) => default.ok_or_else(|| bad(k, "missing".into())),
                Some(x) => x.as_u64().map(|n| n as usize).ok_or_else(|| bad(k, "not a non-negative integer".into())),
            }
        };
        for key in ["is_decoder", "add_cross_attention"] {
            if v.get(key).and_then(Value::as_bool) == Some(true) {
                return Err(bad(key, "true is not supported (loupe builds BERT as an encoder)".into()));
            }
        }
        match v.get("position_embedding_type").and_then(Value::as_str) {
            None | Some("absolute") => {}
            Some(other) => {
                return Err(bad(
                    "position_embedding_type",
                    format!("'{other}' is not supported (loupe builds absolute position embeddings)"),
                ))
            }
        }
        // BertConfig's default is "gelu" (`ACT2FN["gelu"]`: the exact, erf form).
        let hidden_act = match v.get("hidden_act").and_then(Value::as_str) {
            None | Some("gelu") => HiddenAct::Gelu,
            Some("gelu_new" | "gelu_pytorch_tanh") => HiddenAct::GeluTanh,
            Some(other) => {
                return Err(bad(
                    "hidden_act",
                    format!("'{other}' is not supported (loupe builds gelu, gelu_new and gelu_pytorch_tanh for BERT)"),
                ))
            }
        };
        let hidden_size = usize_or("hidden_size", Some(768))?;
        let heads = usize_or("num_attention_heads", Some(12))?;
        if heads == 0 || hidden_size % heads != 0 {
            return Err(bad("num_attention_heads", format!("{heads} heads do not divide hidden size {hidden_size}")));
        }
        let head_dim = hidden_size / heads;
        let eps = match v.get("layer_norm_eps") {
            None | Some(Value::Null) => 1e-12,
            Some(x) => x.as_f64().ok_or_else(|| bad("layer_norm_eps", "not a number".into()))? as f32,
        };
        if !(eps.is_finite() && eps >= 0.0) {
            return Err(bad("layer_norm_eps", format!("{eps} is not a valid epsilon")));
        }
        let type_vocab_size = usize_or("type_vocab_size", Some(2))?;
        if type_vocab_size == 0 {
            return Err(bad("type_vocab_size", "must be non-zero (token type 0 is read)".into()));
        }
        let cfg = BertConfig {
            vocab_size: usize_or("vocab_size", Some(30522))?,
            hidden_size,
            intermediate_size: usize_or("intermediate_size", Some(3072))?,
            num_hidden_layers: usize_or("num_hidden_layers", Some(12))?,
            num_attention_heads: heads,
            head_dim,
            layer_norm_eps: eps,
            max_position_embeddings: usize_or("max_position_embeddings", Some(512))?,
            hidden_act,
            attention_scale: (head_dim as f32).powf(-0.5),
            type_vocab_size,
        };
        for (field, n) in [
            ("vocab_size", cfg.vocab_size),
            ("intermediate_size", cfg.intermediate_size),
            ("num_hidden_layers", cfg.num_hidden_layers),
            ("max_position_embeddings", cfg.max_position_embeddings),
        ] {
            if n == 0 {
                return Err(bad(field, "must be non-zero".into()));
            }
        }
        Ok(cfg)
    }

    /// Reads `config.json` at `path`.
    pub fn from_hf_config(path: &Path) -> Result<BertConfig, ModelError> {
        BertConfig::from_json(&read_config_json(path)?, path)
    }
}

/// Builds the encoder graph, loading weights from `source` (names as in `BertModel`'s
/// state dict: `embeddings.word_embeddings.weight`, `encoder.layer.0.attention.self.query.weight`,
/// ...). `layers` keeps the first N layers. Planted faults are built for decoder families
/// only, so any fault is refused.
pub fn build_bert(
    cfg: &BertConfig,
    source: &mut dyn WeightSource,
    layers: Option<usize>,
    quantize_activations: bool,
    faults: &[Fault],
) -> Result<Graph, ModelError> {
    let c = cfg;
    if let Some(f) = faults.first() {
        return Err(ModelError::InvalidConfig {
            source_file: source.path().to_path_buf(),
            field: "--inject".into(),
            reason: format!("fault '{}' is built for decoder families; BERT encoders take none", f.class.name()),
        });
    }
    let n_layers = layers.unwrap_or(c.num_hidden_layers).min(c.num_hidden_layers);
    let (d, h, hd) = (c.hidden_size, c.num_attention_heads, c.head_dim);
    let mut b = GraphBuilder::new();
    b.set_encoder(true);
    // The cache holds the one call's keys and values (an encoder runs each input once).
    b.set_kv(n_layers, h * hd, c.max_position_embeddings);
    b.set_quantize_activations(quantize_activations);
    let hidden = |n: usize| vec![Dim::Tokens, Dim::Fixed(n)];
    let axes = || vec!["token", "hidden"];
    let mut load = |name: &str, shape: &[usize]| source.load(name, shape);

    // `BertEmbeddings.forward`: (word + token_type) + position, then LayerNorm, in that order.
    let word = b.weight(load("embeddings.word_embeddings.weight", &[c.vocab_size, d])?);
    let word = b.node("embeddings.word_embeddings", Op::Embedding { table: word, scale: 1.0 }, &[], hidden(d), axes());
    let types = b.weight(load("embeddings.token_type_embeddings.weight", &[cfg.type_vocab_size, d])?);
    let types = b.node(
        "embeddings.token_type_embeddings",
        Op::ConstantEmbedding { table: types, row: 0 },
        &[],
        hidden(d),
        axes(),
    );
    let x = b.node("embeddings.add_token_type", Op::Add, &[word, types], hidden(d), axes());
    let pos = b.weight(load("embeddings.position_embeddings.weight", &[c.max_position_embeddings, d])?);
    let pos = b.node(
        "embeddings.position_embeddings",
        Op::PositionEmbedding { table: pos, offset: 0 },
        &[],
        hidden(d),
        axes(),
    );
    let x = b.node("embeddings.add_position", Op::Add, &[x, pos], hidden(d), axes());
    let mut x = layer_norm(&mut b, &mut load, "embeddings.LayerNorm", x, d, c.layer_norm_eps)?;
    // Dropout is the identity in inference: each dropout module's output is its input.
    b.alias(x, "embeddings.dropout");
    b.alias(x, "embeddings");

    let shape = AttentionShape::new(h, h, hd, c.attention_scale);
    let variant = AttentionVariant { mask: AttentionMask::None, ..AttentionVariant::default() };
    let act = match c.hidden_act {
        HiddenAct::Gelu => Op::Gelu { tanh: false },
        HiddenAct::GeluTanh => Op::Gelu { tanh: true },
        HiddenAct::Silu => Op::Silu,
    };
    for l in 0..n_layers {
        let p = format!("encoder.layer.{l}");
        let linear = |b: &mut GraphBuilder,
                      load: &mut LoadWeight<'_>,
                      name: &str,
                      input: ValueId,
                      n: usize,
                      k: usize|
         -> Result<ValueId, ModelError> {
            let w = b.weight(load(&format!("{name}.weight"), &[n, k])?);
            let bias = b.weight(load(&format!("{name}.bias"), &[n])?);
            Ok(b.node(name, Op::Linear { weight: w, bias: Some(bias) }, &[input], hidden(n), axes()))
        };
        let q = linear(&mut b, &mut load, &format!("{p}.attention.self.query"), x, h * hd, d)?;
        let k = linear(&mut b, &mut load, &format!("{p}.attention.self.key"), x, h * hd, d)?;
        let v = linear(&mut b, &mut load, &format!("{p}.attention.self.value"), x, h * hd, d)?;
        let core = b.node(
            format!("{p}.attention.self"),
            Op::Attention { layer: l, shape, variant, kv_write: KvWrite::InPlace },
            &[q, k, v],
            hidden(h * hd),
            axes(),
        );
        b.side_output(
            core,
            format!("{p}.attention.self.attn_probs"),
            vec![Dim::Fixed(h), Dim::Tokens, Dim::Context],
            vec!["head", "query", "key"],
        );
        let dense = linear(&mut b, &mut load, &format!("{p}.attention.output.dense"), core, d, h * hd)?;
        b.alias(dense, format!("{p}.attention.output.dropout"));
        // `BertSelfOutput.forward`: LayerNorm(dense + input).
        let sum = b.node(format!("{p}.attention.output.residual"), Op::Add, &[dense, x], hidden(d), axes());
        let attn = layer_norm(&mut b, &mut load, &format!("{p}.attention.output.LayerNorm"), sum, d, c.layer_norm_eps)?;
        b.alias(attn, format!("{p}.attention.output"));
        b.alias(attn, format!("{p}.attention"));
        let inter = linear(&mut b, &mut load, &format!("{p}.intermediate.dense"), attn, c.intermediate_size, d)?;
        let inter = b.node(
            format!("{p}.intermediate.intermediate_act_fn"),
            act.clone(),
            &[inter],
            hidden(c.intermediate_size),
            vec!["token", "intermediate"],
        );
        b.alias(inter, format!("{p}.intermediate"));
        let out = linear(&mut b, &mut load, &format!("{p}.output.dense"), inter, d, c.intermediate_size)?;
        b.alias(out, format!("{p}.output.dropout"));
        let sum = b.node(format!("{p}.output.residual"), Op::Add, &[out, attn], hidden(d), axes());
        x = layer_norm(&mut b, &mut load, &format!("{p}.output.LayerNorm"), sum, d, c.layer_norm_eps)?;
        b.alias(x, format!("{p}.output"));
        b.alias(x, p);
    }
    // `BertEncoder`'s output (`last_hidden_state`) is the last layer's; the reference's dump
    // cannot record it (a ModelOutput), so the encoder's own name is not given.
    b.set_logits(x);
    let graph = b.finish();
    loupe_graph::verify::verify(&graph)?;
    Ok(graph)
}

/// Loads one named weight of the given shape (the builder's view of a weight source).
type LoadWeight<'a> = dyn FnMut(&str, &[usize]) -> Result<loupe_graph::Weight, ModelError> + 'a;

#[track_caller]
fn layer_norm(
    b: &mut GraphBuilder,
    load: &mut LoadWeight<'_>,
    name: &str,
    input: ValueId,
    d: usize,
    eps: f32,
) -> Result<ValueId, ModelError> {
    let w = b.weight(load(&format!("{name}.weight"), &[d])?);
    let bias = b.weight(load(&format!("{name}.bias"), &[d])?);
    Ok(b.node(
        name,
        Op::LayerNorm { weight: w, bias, eps },
        &[input],
        vec![Dim::Tokens, Dim::Fixed(d)],
        vec!["token", "hidden"],
    ))
}
