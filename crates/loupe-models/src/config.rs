//! The Llama-family configuration, read from GGUF metadata (`llama.*` keys) or from a
//! Hugging Face `config.json` (`LlamaConfig` fields), so both sources build the same graph.

use std::path::Path;

use loupe_formats::GgufFile;
use loupe_tensor::ops::RopeScaling;
use serde_json::Value;

use crate::ModelError;

/// Hyper-parameters of a Llama-style decoder.
#[derive(Debug, Clone, PartialEq)]
pub struct LlamaConfig {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub head_dim: usize,
    pub rms_norm_eps: f32,
    pub rope_theta: f32,
    pub rope_scaling: RopeScaling,
    pub max_position_embeddings: usize,
    pub tie_word_embeddings: bool,
    /// Bias on q/k/v/o projections (`attention_bias`).
    pub attention_bias: bool,
}

/// GGUF architectures read with the Llama graph (their tensors and keys follow `llama.*`
/// naming under their own prefix).
pub const GGUF_LLAMA_ARCHS: &[&str] = &["llama"];
/// `architectures` entries of config.json built with the Llama graph.
pub const HF_LLAMA_ARCHS: &[&str] = &["LlamaForCausalLM"];

impl LlamaConfig {
    /// Reads the config from GGUF metadata. `vocab_size` falls back to the tokenizer's
    /// token count, as llama.cpp does.
    pub fn from_gguf(gguf: &GgufFile) -> Result<LlamaConfig, ModelError> {
        let arch = gguf.architecture()?;
        if !GGUF_LLAMA_ARCHS.contains(&arch) {
            return Err(ModelError::UnsupportedArchitecture { path: gguf.path.clone(), arch: arch.to_string(), supported: GGUF_LLAMA_ARCHS.join(", ") });
        }
        let key = |k: &str| format!("{arch}.{k}");
        let hidden_size = gguf.get_usize(&key("embedding_length"))?;
        let num_attention_heads = gguf.get_usize(&key("attention.head_count"))?;
        let num_key_value_heads = gguf.opt_usize(&key("attention.head_count_kv"))?.unwrap_or(num_attention_heads);
        if num_attention_heads == 0 || hidden_size % num_attention_heads != 0 {
            return Err(ModelError::InvalidConfig { source_file: gguf.path.clone(), field: key("attention.head_count"), reason: format!("{num_attention_heads} heads do not divide hidden size {hidden_size}") });
        }
        let head_dim = gguf.opt_usize(&key("attention.key_length"))?.unwrap_or(hidden_size / num_attention_heads);
        let vocab_size = match gguf.opt_usize(&key("vocab_size"))? {
            Some(v) => v,
            None => gguf.get_str_array("tokenizer.ggml.tokens")?.len(),
        };
        let rope_scaling = match gguf.opt_str(&key("rope.scaling.type"))? {
            None | Some("none") => RopeScaling::None,
            Some("linear") => RopeScaling::Linear { factor: gguf.get_f32(&key("rope.scaling.factor"))? },
            Some(other) => return Err(ModelError::InvalidConfig { source_file: gguf.path.clone(), field: key("rope.scaling.type"), reason: format!("unsupported rope scaling '{other}'") }),
        };
        let cfg = LlamaConfig {
            vocab_size,
            hidden_size,
            intermediate_size: gguf.get_usize(&key("feed_forward_length"))?,
            num_hidden_layers: gguf.get_usize(&key("block_count"))?,
            num_attention_heads,
            num_key_value_heads,
            head_dim,
            rms_norm_eps: gguf.get_f32(&key("attention.layer_norm_rms_epsilon"))?,
            rope_theta: gguf.opt_f32(&key("rope.freq_base"))?.unwrap_or(10000.0),
            rope_scaling,
            max_position_embeddings: gguf.get_usize(&key("context_length"))?,
            tie_word_embeddings: gguf.tensor("output.weight").is_none(),
            attention_bias: gguf.tensor("blk.0.attn_q.bias").is_some(),
        };
        if let Some(rot) = gguf.opt_usize(&key("rope.dimension_count"))? {
            if rot != cfg.head_dim {
                return Err(ModelError::InvalidConfig { source_file: gguf.path.clone(), field: key("rope.dimension_count"), reason: format!("partial rotary embedding ({rot} of {} dims) is not supported", cfg.head_dim) });
            }
        }
        cfg.validate(&gguf.path)
    }

    /// Reads a Hugging Face `config.json`.
    pub fn from_hf_config(path: &Path) -> Result<LlamaConfig, ModelError> {
        let text = std::fs::read_to_string(path).map_err(|e| ModelError::Io { path: path.to_path_buf(), source: e })?;
        let v: Value = serde_json::from_str(&text).map_err(|e| ModelError::InvalidConfig { source_file: path.to_path_buf(), field: "config.json".into(), reason: e.to_string() })?;
        let bad = |field: &str, reason: String| ModelError::InvalidConfig { source_file: path.to_path_buf(), field: field.to_string(), reason };
        let archs: Vec<&str> = v.get("architectures").and_then(Value::as_array).map(|a| a.iter().filter_map(Value::as_str).collect()).unwrap_or_default();
        // transformers loads a config without `architectures` by its `model_type`.
        let llama_by_type = archs.is_empty() && v.get("model_type").and_then(Value::as_str) == Some("llama");
        if !llama_by_type && !archs.iter().any(|a| HF_LLAMA_ARCHS.contains(a)) {
            let found = if archs.is_empty() { v.get("model_type").and_then(Value::as_str).unwrap_or("<none>").to_string() } else { archs.join(", ") };
            return Err(ModelError::UnsupportedArchitecture { path: path.to_path_buf(), arch: found, supported: HF_LLAMA_ARCHS.join(", ") });
        }
        let usize_field = |k: &str| -> Result<usize, ModelError> {
            v.get(k).and_then(Value::as_u64).map(|n| n as usize).ok_or_else(|| bad(k, "missing or not a non-negative integer".into()))
        };
        let opt_usize = |k: &str| v.get(k).filter(|x| !x.is_null()).map(|x| x.as_u64().map(|n| n as usize).ok_or_else(|| bad(k, "not a non-negative integer".into()))).transpose();
        let f32_field = |k: &str, default: f32| -> Result<f32, ModelError> {
            match v.get(k) {
                None | Some(Value::Null) => Ok(default),
                Some(x) => x.as_f64().map(|f| f as f32).ok_or_else(|| bad(k, "not a number".into())),
            }
        };
        // Features the Llama graph does not build are refused by name, never ignored.
        match v.get("hidden_act").and_then(Value::as_str) {
            None | Some("silu") => {}
            Some(other) => return Err(bad("hidden_act", format!("'{other}' is not supported (loupe's Llama graph uses silu)"))),
        }
        if v.get("mlp_bias").and_then(Value::as_bool) == Some(true) {
            return Err(bad("mlp_bias", "true is not supported (loupe's Llama MLP has no biases)".into()));
        }
        let hidden_size = usize_field("hidden_size")?;
        let num_attention_heads = usize_field("num_attention_heads")?;
        if num_attention_heads == 0 || hidden_size % num_attention_heads != 0 {
            return Err(bad("num_attention_heads", format!("{num_attention_heads} heads do not divide hidden size {hidden_size}")));
        }
        // transformers 5 moves rope_theta/rope_scaling into `rope_parameters`.
        let rope_params = v.get("rope_parameters").or_else(|| v.get("rope_scaling")).filter(|x| !x.is_null());
        let rope_theta = match rope_params.and_then(|p| p.get("rope_theta")).and_then(Value::as_f64) {
            Some(t) => t as f32,
            None => f32_field("rope_theta", 10000.0)?,
        };
        let rope_scaling = match rope_params {
            None => RopeScaling::None,
            Some(p) => {
                let get = |k: &str| p.get(k).and_then(Value::as_f64).map(|x| x as f32).ok_or_else(|| bad(&format!("rope_scaling.{k}"), "missing or not a number".into()));
                match p.get("rope_type").or_else(|| p.get("type")).and_then(Value::as_str).unwrap_or("default") {
                    "default" => RopeScaling::None,
                    "linear" => RopeScaling::Linear { factor: get("factor")? },
                    "llama3" => RopeScaling::Llama3 {
                        factor: get("factor")?,
                        low_freq_factor: get("low_freq_factor")?,
                        high_freq_factor: get("high_freq_factor")?,
                        original_max_position_embeddings: get("original_max_position_embeddings")?,
                    },
                    other => return Err(bad("rope_scaling.rope_type", format!("unsupported rope type '{other}'"))),
                }
            }
        };
        let cfg = LlamaConfig {
            vocab_size: usize_field("vocab_size")?,
            hidden_size,
            intermediate_size: usize_field("intermediate_size")?,
            num_hidden_layers: usize_field("num_hidden_layers")?,
            num_attention_heads,
            num_key_value_heads: opt_usize("num_key_value_heads")?.unwrap_or(num_attention_heads),
            head_dim: opt_usize("head_dim")?.unwrap_or(hidden_size / num_attention_heads),
            rms_norm_eps: f32_field("rms_norm_eps", 1e-6)?,
            rope_theta,
            rope_scaling,
            max_position_embeddings: opt_usize("max_position_embeddings")?.unwrap_or(2048),
            tie_word_embeddings: v.get("tie_word_embeddings").and_then(Value::as_bool).unwrap_or(false),
            attention_bias: v.get("attention_bias").and_then(Value::as_bool).unwrap_or(false),
        };
        cfg.validate(path)
    }

    fn validate(self, path: &Path) -> Result<LlamaConfig, ModelError> {
        let bad = |field: &str, reason: String| Err(ModelError::InvalidConfig { source_file: path.to_path_buf(), field: field.into(), reason });
        if self.num_key_value_heads == 0 || self.num_attention_heads % self.num_key_value_heads != 0 {
            return bad("num_key_value_heads", format!("{} kv heads do not divide {} heads", self.num_key_value_heads, self.num_attention_heads));
        }
        if self.head_dim == 0 || self.head_dim % 2 != 0 {
            return bad("head_dim", format!("{} must be even and non-zero", self.head_dim));
        }
        for (field, v) in [("vocab_size", self.vocab_size), ("hidden_size", self.hidden_size), ("intermediate_size", self.intermediate_size), ("num_hidden_layers", self.num_hidden_layers), ("max_position_embeddings", self.max_position_embeddings)] {
            if v == 0 {
                return bad(field, "must be non-zero".into());
            }
        }
        if !(self.rms_norm_eps.is_finite() && self.rms_norm_eps >= 0.0) {
            return bad("rms_norm_eps", format!("{} is not a valid epsilon", self.rms_norm_eps));
        }
        Ok(self)
    }
}
