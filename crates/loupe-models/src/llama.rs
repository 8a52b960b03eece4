//! The Llama-family decoder as a graph whose values carry Hugging Face module paths
//! (`transformers/models/llama/modeling_llama.py`): embedding, N x (RMSNorm, GQA
//! self-attention with RoPE, residual, RMSNorm, SwiGLU MLP, residual), final norm, lm_head.

use std::sync::Arc;

use loupe_graph::{Dim, Graph, GraphBuilder, Op, ValueId, WeightId};
use loupe_tensor::ops::{AttentionShape, RopeScaling, RopeTable};

use crate::config::LlamaConfig;
use crate::weights::WeightSource;
use crate::ModelError;

/// Builds the graph, loading weights from `source` as each module needs them.
/// `layers` keeps only the first N decoder layers (for layer-truncated parity runs).
pub fn build_llama(cfg: &LlamaConfig, source: &mut dyn WeightSource, layers: Option<usize>, quantize_activations: bool) -> Result<Graph, ModelError> {
    let n_layers = layers.unwrap_or(cfg.num_hidden_layers).min(cfg.num_hidden_layers);
    let d = cfg.hidden_size;
    let (h, kvh, hd) = (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim);
    let mut b = GraphBuilder::new();
    b.set_kv(n_layers, kvh * hd, cfg.max_position_embeddings);
    b.set_quantize_activations(quantize_activations);

    let rope_scaling = match source.rope_freq_factors()? {
        Some(f) => RopeScaling::FreqFactors(f),
        None => cfg.rope_scaling.clone(),
    };
    let rope = Arc::new(RopeTable::new(hd, cfg.rope_theta, &rope_scaling).map_err(|e| ModelError::Tensor { path: source.path().to_path_buf(), name: "rope".into(), source: e })?);
    let shape = AttentionShape { n_heads: h, n_kv_heads: kvh, head_dim: hd, scale: (hd as f32).powf(-0.5) };

    let hidden = |n: usize| vec![Dim::Tokens, Dim::Fixed(n)];
    let axes = || vec!["token", "hidden"];
    let mut load = |b: &mut GraphBuilder, name: &str, shape: &[usize]| -> Result<WeightId, ModelError> { Ok(b.weight(source.load(name, shape)?)) };

    let embed = load(&mut b, "model.embed_tokens.weight", &[cfg.vocab_size, d])?;
    let mut x = b.node("model.embed_tokens", Op::Embedding { table: embed }, &[], hidden(d), axes());

    for l in 0..n_layers {
        let p = format!("model.layers.{l}");
        let linear = |b: &mut GraphBuilder, load: &mut dyn FnMut(&mut GraphBuilder, &str, &[usize]) -> Result<WeightId, ModelError>, module: &str, input: ValueId, rows: usize, cols: usize, bias: bool| -> Result<ValueId, ModelError> {
            let weight = load(b, &format!("{module}.weight"), &[rows, cols])?;
            let bias = if bias { Some(load(b, &format!("{module}.bias"), &[rows])?) } else { None };
            Ok(b.node(module, Op::Linear { weight, bias }, &[input], vec![Dim::Tokens, Dim::Fixed(rows)], vec!["token", "feature"]))
        };

        let w = load(&mut b, &format!("{p}.input_layernorm.weight"), &[d])?;
        let normed = b.node(format!("{p}.input_layernorm"), Op::RmsNorm { weight: w, eps: cfg.rms_norm_eps }, &[x], hidden(d), axes());
        let q = linear(&mut b, &mut load, &format!("{p}.self_attn.q_proj"), normed, h * hd, d, cfg.attention_bias)?;
        let k = linear(&mut b, &mut load, &format!("{p}.self_attn.k_proj"), normed, kvh * hd, d, cfg.attention_bias)?;
        let v = linear(&mut b, &mut load, &format!("{p}.self_attn.v_proj"), normed, kvh * hd, d, cfg.attention_bias)?;
        let q = b.node(format!("{p}.self_attn.q_rope"), Op::Rope { n_heads: h, table: rope.clone() }, &[q], hidden(h * hd), vec!["token", "head*head_dim"]);
        let k = b.node(format!("{p}.self_attn.k_rope"), Op::Rope { n_heads: kvh, table: rope.clone() }, &[k], hidden(kvh * hd), vec!["token", "kv_head*head_dim"]);
        let attn = b.node(format!("{p}.self_attn.attn_output"), Op::Attention { layer: l, shape }, &[q, k, v], hidden(h * hd), vec!["token", "head*head_dim"]);
        b.side_output(attn, format!("{p}.self_attn.attn_probs"), vec![Dim::Fixed(h), Dim::Tokens, Dim::Context], vec!["head", "query", "key"]);
        let o = linear(&mut b, &mut load, &format!("{p}.self_attn.o_proj"), attn, d, h * hd, cfg.attention_bias)?;
        b.alias(o, format!("{p}.self_attn"));
        let resid = b.node(format!("{p}.attn_residual"), Op::Add, &[x, o], hidden(d), axes());

        let w = load(&mut b, &format!("{p}.post_attention_layernorm.weight"), &[d])?;
        let normed = b.node(format!("{p}.post_attention_layernorm"), Op::RmsNorm { weight: w, eps: cfg.rms_norm_eps }, &[resid], hidden(d), axes());
        let f = cfg.intermediate_size;
        let gate = linear(&mut b, &mut load, &format!("{p}.mlp.gate_proj"), normed, f, d, false)?;
        let up = linear(&mut b, &mut load, &format!("{p}.mlp.up_proj"), normed, f, d, false)?;
        let act = b.node(format!("{p}.mlp.act_fn"), Op::Silu, &[gate], hidden(f), vec!["token", "feature"]);
        let prod = b.node(format!("{p}.mlp.act_mul"), Op::Mul, &[act, up], hidden(f), vec!["token", "feature"]);
        let down = linear(&mut b, &mut load, &format!("{p}.mlp.down_proj"), prod, d, f, false)?;
        b.alias(down, format!("{p}.mlp"));
        x = b.node(p.clone(), Op::Add, &[resid, down], hidden(d), axes());
    }

    let w = load(&mut b, "model.norm.weight", &[d])?;
    let normed = b.node("model.norm", Op::RmsNorm { weight: w, eps: cfg.rms_norm_eps }, &[x], hidden(d), axes());
    let head = if cfg.tie_word_embeddings { embed } else { load(&mut b, "lm_head.weight", &[cfg.vocab_size, d])? };
    let logits = b.node("lm_head", Op::Linear { weight: head, bias: None }, &[normed], vec![Dim::Tokens, Dim::Fixed(cfg.vocab_size)], vec!["token", "vocab"]);
    b.set_logits(logits);
    let graph = b.finish();
    loupe_graph::verify::verify(&graph)?;
    Ok(graph)
}
