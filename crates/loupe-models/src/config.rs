//! The configuration of a Llama-style decoder, read from GGUF metadata (`<arch>.*` keys) or
//! from a Hugging Face `config.json`, so both sources build the same graph.
//!
//! Families built by this graph ([`Family`]) differ only in flags the builder reads: Qwen2
//! is Llama with biases on q/k/v (not on o_proj; `modeling_qwen2.py`, `Qwen2Attention`) and,
//! in GGUF, q/k rows stored unpermuted (llama.cpp runs Qwen2 with NeoX-style RoPE, so its
//! converter does not apply `LlamaModel.permute`).

use std::path::Path;

use loupe_formats::GgufFile;
use loupe_tensor::ops::{AttentionShape, RopeScaling, Router, RouterScoring};
use serde_json::Value;

use crate::ModelError;

/// The model families the Llama-style graph builds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    Llama,
    Qwen2,
    /// Llama with a sliding-window attention mask on every layer (`sliding_window`).
    Mistral,
    /// Llama with per-head RMSNorms of q and k before RoPE (`q_norm`, `k_norm`;
    /// `modeling_qwen3.py`), biases as `attention_bias` says, Qwen2's sliding-window rules.
    Qwen3,
    /// Gemma 3's text decoder (`modeling_gemma3.py`): RMSNorms scale by `1 + weight`, four
    /// norms per layer (attention and MLP outputs are normalized before their residual
    /// adds), q/k norms, embeddings scaled by sqrt(hidden_size), a GELU-tanh gated MLP, and
    /// sliding-window layers with their own RoPE base.
    Gemma3,
    /// Gemma 2 (`modeling_gemma2.py`): Gemma 3's norms, embedding scale and MLP without q/k
    /// norms, every other layer sliding (one RoPE base for all), and soft-capped attention
    /// scores and final logits (`attn_logit_softcapping`, `final_logit_softcapping`).
    Gemma2,
    /// A BERT encoder (`BertModel`, [`crate::bert`]): bidirectional attention, LayerNorms,
    /// absolute position embeddings; built by [`crate::bert::build_bert`], not the Llama
    /// builder.
    Bert,
    /// Qwen3-MoE (`modeling_qwen3_moe.py`): Qwen3's attention (q/k norms) with sparse MoE
    /// MLPs: a softmax top-k router (`mlp.gate`) over `num_experts` SwiGLU experts, on the
    /// layers `decoder_sparse_step` / `mlp_only_layers` make sparse ([`MoeConfig`]).
    Qwen3Moe,
    /// GLM-4.5's MoE decoder (`modeling_glm4_moe.py`, `Glm4MoeForCausalLM`): Llama attention
    /// (biases on q/k/v only under `attention_bias`, optional q/k norms `use_qk_norm`) and,
    /// from layer `first_k_dense_replace` on, DeepSeek-V3's grouped sigmoid router with a
    /// selection-only correction bias, routed experts plus `n_shared_experts` shared ones.
    Glm4Moe,
    /// Phi-3 (`modeling_phi3.py`): a Llama whose q/k/v projections are one fused
    /// `self_attn.qkv_proj` (rows q, then k, then v) and whose gate/up projections are one
    /// `mlp.gate_up_proj` (gate rows, then up: `chunk(2)`), with the activation module called
    /// `mlp.activation_fn`; RoPE may be partial (`partial_rotary_factor`) and LongRoPE-scaled.
    Phi3,
}

/// A Mixture-of-Experts MLP's configuration (Qwen3-MoE, GLM-4-MoE).
#[derive(Debug, Clone, PartialEq)]
pub struct MoeConfig {
    /// The router's arithmetic (scoring, experts, top-k, groups, renormalization, scaling).
    pub router: Router,
    /// Each routed expert's hidden width (`moe_intermediate_size`).
    pub moe_intermediate_size: usize,
    /// The shared experts' MLP width (`moe_intermediate_size * n_shared_experts`), run on
    /// every token and added to the routed output; `None`: no shared experts.
    pub shared_intermediate_size: Option<usize>,
    /// Whether the router has an `e_score_correction_bias` (sigmoid routers).
    pub correction_bias: bool,
    /// Per decoder layer, whether its MLP is sparse (the others are the dense MLP of
    /// `intermediate_size`).
    pub sparse_layers: Vec<bool>,
}

/// The activation of the gated MLP's gate (`hidden_act` / `hidden_activation`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HiddenAct {
    /// `silu` (Llama, Qwen, Mistral).
    Silu,
    /// `gelu_pytorch_tanh`: GELU with the tanh approximation (Gemma).
    GeluTanh,
    /// `gelu`: the exact GELU, `x * (1 + erf(x / sqrt 2)) / 2` (BERT).
    Gelu,
}

impl Family {
    /// The family of a GGUF `general.architecture`.
    pub fn from_gguf_arch(arch: &str) -> Option<Family> {
        match arch {
            "llama" => Some(Family::Llama),
            "qwen2" => Some(Family::Qwen2),
            "qwen3" => Some(Family::Qwen3),
            "gemma3" => Some(Family::Gemma3),
            "gemma2" => Some(Family::Gemma2),
            _ => None,
        }
    }

    /// The GGUF `general.architecture` of the family, where loupe reads one
    /// ([`Family::from_gguf_arch`]'s inverse).
    pub fn gguf_arch(self) -> Option<&'static str> {
        match self {
            Family::Llama => Some("llama"),
            Family::Qwen2 => Some("qwen2"),
            Family::Qwen3 => Some("qwen3"),
            Family::Gemma3 => Some("gemma3"),
            Family::Gemma2 => Some("gemma2"),
            Family::Mistral | Family::Bert | Family::Qwen3Moe | Family::Glm4Moe | Family::Phi3 => None,
        }
    }

    /// The family of a config.json `architectures` entry.
    pub fn from_hf_arch(arch: &str) -> Option<Family> {
        match arch {
            "LlamaForCausalLM" => Some(Family::Llama),
            "Qwen2ForCausalLM" => Some(Family::Qwen2),
            "MistralForCausalLM" => Some(Family::Mistral),
            "Qwen3ForCausalLM" => Some(Family::Qwen3),
            "Gemma3ForCausalLM" => Some(Family::Gemma3),
            "Gemma2ForCausalLM" => Some(Family::Gemma2),
            "BertModel" => Some(Family::Bert),
            "Qwen3MoeForCausalLM" => Some(Family::Qwen3Moe),
            "Glm4MoeForCausalLM" => Some(Family::Glm4Moe),
            "Phi3ForCausalLM" => Some(Family::Phi3),
            _ => None,
        }
    }

    /// The family of a config.json `model_type` (transformers' fallback without
    /// `architectures`).
    pub fn from_model_type(model_type: &str) -> Option<Family> {
        match model_type {
            "llama" => Some(Family::Llama),
            "qwen2" => Some(Family::Qwen2),
            "mistral" => Some(Family::Mistral),
            "qwen3" => Some(Family::Qwen3),
            "gemma3_text" => Some(Family::Gemma3),
            "gemma2" => Some(Family::Gemma2),
            "bert" => Some(Family::Bert),
            "qwen3_moe" => Some(Family::Qwen3Moe),
            "glm4_moe" => Some(Family::Glm4Moe),
            "phi3" => Some(Family::Phi3),
            _ => None,
        }
    }

    /// transformers' `model_type`.
    pub fn name(self) -> &'static str {
        match self {
            Family::Llama => "llama",
            Family::Qwen2 => "qwen2",
            Family::Mistral => "mistral",
            Family::Qwen3 => "qwen3",
            Family::Gemma3 => "gemma3_text",
            Family::Gemma2 => "gemma2",
            Family::Bert => "bert",
            Family::Qwen3Moe => "qwen3_moe",
            Family::Glm4Moe => "glm4_moe",
            Family::Phi3 => "phi3",
        }
    }

    /// Whether the family is an encoder (every token sees every other; the output is hidden
    /// states, not logits).
    pub fn is_encoder(self) -> bool {
        matches!(self, Family::Bert)
    }

    /// Whether q/k/v are one fused `qkv_proj` matmul and gate/up one `gate_up_proj`, each
    /// split into its parts after the matmul (Phi-3).
    pub fn fused_projections(self) -> bool {
        self == Family::Phi3
    }

    /// Gemma 2 or 3: the traits the two share (1 + w norms, sandwich norms, the embedding
    /// scale, GELU-tanh by default, `query_pre_attn_scalar`, `hidden_activation`, logit
    /// soft-capping when configured).
    pub fn is_gemma(self) -> bool {
        matches!(self, Family::Gemma2 | Family::Gemma3)
    }

    /// Whether llama.cpp's converter permuted the rows of q/k (weights and biases) for its
    /// interleaved RoPE (convert_hf_to_gguf.py: `LlamaModel.permute` for Llama; Qwen2 uses
    /// NeoX RoPE and is stored as Hugging Face has it).
    pub fn gguf_permutes_qk(self) -> bool {
        matches!(self, Family::Llama | Family::Mistral)
    }

    /// Whether q and k go through per-head RMSNorms before RoPE (GLM-4-MoE: when its config
    /// says `use_qk_norm`, see [`LlamaConfig::wiring`]).
    pub fn qk_norm(self) -> bool {
        matches!(self, Family::Qwen3 | Family::Gemma3 | Family::Qwen3Moe)
    }

    /// Whether the family's config.json describes MoE MLPs.
    pub fn is_moe(self) -> bool {
        matches!(self, Family::Qwen3Moe | Family::Glm4Moe)
    }

    /// Whether each layer has Gemma's four norms: `post_attention_layernorm` normalizes
    /// attention's output before the residual add, `pre_feedforward_layernorm` is the MLP's
    /// input norm and `post_feedforward_layernorm` normalizes the MLP's output.
    pub fn sandwich_norms(self) -> bool {
        self.is_gemma()
    }

    /// Whether RMSNorms scale by `1 + weight` (Gemma's `Gemma3RMSNorm`) instead of `weight`.
    pub fn norm_unit_offset(self) -> bool {
        self.is_gemma()
    }

    /// Whether the embedding output is multiplied by sqrt(hidden_size)
    /// (`Gemma3TextScaledWordEmbedding`).
    pub fn scales_embedding(self) -> bool {
        self.is_gemma()
    }

    /// The MLP activation when the source names none: GELU-tanh for Gemma (a GGUF never
    /// names it), SiLU otherwise.
    pub fn default_hidden_act(self) -> HiddenAct {
        if self.is_gemma() {
            HiddenAct::GeluTanh
        } else {
            HiddenAct::Silu
        }
    }

    /// Every how-many-th layer attends globally, the others through a sliding window, by
    /// default (Gemma); `None`: the family has no fixed pattern.
    pub fn window_pattern(self) -> Option<usize> {
        match self {
            Family::Gemma3 => Some(GEMMA3_SLIDING_WINDOW_PATTERN),
            Family::Gemma2 => Some(GEMMA2_SLIDING_WINDOW_PATTERN),
            Family::Llama
            | Family::Qwen2
            | Family::Mistral
            | Family::Qwen3
            | Family::Qwen3Moe
            | Family::Glm4Moe
            | Family::Bert
            | Family::Phi3 => None,
        }
    }

    /// What each decoder layer emits and how it is wired (without final soft-capping, which
    /// the config decides: [`LlamaConfig::wiring`]).
    pub fn wiring(self) -> crate::roles::Wiring {
        crate::roles::Wiring {
            qk_norm: self.qk_norm(),
            sandwich_norms: self.sandwich_norms(),
            final_softcap: false,
            moe: None,
            fused_projections: self.fused_projections(),
        }
    }
}

/// Hyper-parameters of a Llama-style decoder.
#[derive(Debug, Clone, PartialEq)]
pub struct LlamaConfig {
    pub family: Family,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    pub head_dim: usize,
    /// The leading elements of each head that RoPE turns (`head_dim` unless the config has a
    /// `partial_rotary_factor`: `int(head_dim * factor)`, as transformers' rope init).
    pub rotary_dim: usize,
    pub rms_norm_eps: f32,
    pub rope_theta: f32,
    pub rope_scaling: RopeScaling,
    pub max_position_embeddings: usize,
    pub tie_word_embeddings: bool,
    /// Bias on the q/k/v projections (Llama's `attention_bias`; always in Qwen2).
    pub qkv_bias: bool,
    /// Bias on o_proj (Llama's `attention_bias`; never in Qwen2).
    pub o_bias: bool,
    /// The sliding window of each decoder layer's attention (`None`: full causal attention).
    /// Empty when no layer has one.
    pub layer_windows: Vec<Option<usize>>,
    /// The gate's activation in the MLP.
    pub hidden_act: HiddenAct,
    /// The factor applied to q.k before the softmax: head_dim^-0.5, or Gemma's
    /// `query_pre_attn_scalar`^-0.5.
    pub attention_scale: f32,
    /// The RoPE base of sliding-window layers where it differs from `rope_theta` (Gemma 3's
    /// local base, unscaled); `None`: every layer uses `rope_theta` and `rope_scaling`.
    pub rope_local_theta: Option<f32>,
    /// Soft-capping of the scaled attention scores, `cap * tanh(s / cap)` before the mask
    /// (Gemma 2's `attn_logit_softcapping`); `None`: none.
    pub attn_logit_softcap: Option<f32>,
    /// Soft-capping of the logits (`final_logit_softcapping`); `None`: none.
    pub final_logit_softcap: Option<f32>,
    /// Per-head q/k RMSNorms (the family's, or GLM-4-MoE's `use_qk_norm`).
    pub qk_norm: bool,
    /// The sparse MLPs of MoE families; `None`: every layer's MLP is dense.
    pub moe: Option<MoeConfig>,
}

/// GGUF architectures read with the Llama graph (their tensors and keys follow `llama.*`
/// naming under their own prefix).
pub const GGUF_LLAMA_ARCHS: &[&str] = &["llama", "qwen2", "qwen3", "gemma3", "gemma2"];
/// `architectures` entries of config.json built with the Llama graph.
pub const HF_LLAMA_ARCHS: &[&str] = &[
    "LlamaForCausalLM",
    "Qwen2ForCausalLM",
    "MistralForCausalLM",
    "Qwen3ForCausalLM",
    "Gemma3ForCausalLM",
    "Gemma2ForCausalLM",
    "Qwen3MoeForCausalLM",
    "Glm4MoeForCausalLM",
    "Phi3ForCausalLM",
];
/// `Phi3Config.original_max_position_embeddings` when config.json has none. transformers
/// uses it (not a `rope_scaling.original_max_position_embeddings`) for LongRoPE:
/// `standardize_rope_params` gives the config attribute priority, and the class default
/// makes the attribute always present.
pub const PHI3_DEFAULT_ORIGINAL_MAX_POSITIONS: usize = 4096;
/// `Phi3Config.max_position_embeddings` when config.json has none.
pub const PHI3_DEFAULT_MAX_POSITIONS: usize = 4096;

/// Gemma 3's default pattern of sliding-window and global layers: every sixth layer is
/// global (`Gemma3TextConfig._sliding_window_pattern`; llama.cpp's `set_swa_pattern(6)`).
pub const GEMMA3_SLIDING_WINDOW_PATTERN: usize = 6;
/// Gemma 3's RoPE base on sliding-window layers when the source does not state one
/// (`Gemma3TextConfig.default_theta["local"]`; llama.cpp hard-codes the same for gemma3).
pub const GEMMA3_LOCAL_ROPE_THETA: f32 = 10_000.0;
/// Gemma 2's pattern: layers 0, 2, 4, ... slide, the odd ones are global
/// (`Gemma2Config.__post_init__`: sliding when `(i + 1) % 2`; llama.cpp's `set_swa_pattern(2)`).
pub const GEMMA2_SLIDING_WINDOW_PATTERN: usize = 2;
/// `Gemma2Config`'s and `Gemma3TextConfig`'s `sliding_window` when config.json has none.
pub const GEMMA_DEFAULT_SLIDING_WINDOW: usize = 4096;
/// `Gemma2Config`'s defaults for absent soft-capping keys (null turns each off).
pub const GEMMA2_DEFAULT_ATTN_SOFTCAP: f32 = 50.0;
pub const GEMMA2_DEFAULT_FINAL_SOFTCAP: f32 = 30.0;

/// A soft-cap must be a positive finite number.
fn valid_softcap(cap: f32) -> bool {
    cap.is_finite() && cap > 0.0
}

impl LlamaConfig {
    /// What the builder emits: the family's layer wiring, and the final soft-cap's value
    /// when the config has one.
    pub fn wiring(&self) -> crate::roles::Wiring {
        let moe = self.moe.as_ref().map(|m| crate::roles::MoeWiring {
            sparse_layers: m
                .sparse_layers
                .iter()
                .enumerate()
                .filter(|&(l, &s)| s && l < crate::roles::MAX_MOE_LAYERS)
                .fold(0u128, |bits, (l, _)| bits | 1u128 << l),
            shared_experts: m.shared_intermediate_size.is_some(),
        });
        crate::roles::Wiring {
            final_softcap: self.final_logit_softcap.is_some(),
            qk_norm: self.qk_norm,
            moe,
            ..self.family.wiring()
        }
    }

    /// Whether decoder layer `layer`'s MLP is a sparse MoE block.
    pub fn is_sparse(&self, layer: usize) -> bool {
        self.moe.as_ref().is_some_and(|m| m.sparse_layers.get(layer).copied().unwrap_or(false))
    }

    /// Every layer's attention geometry and score arithmetic (scale, soft-cap).
    pub fn attention_shape(&self) -> AttentionShape {
        AttentionShape {
            n_heads: self.num_attention_heads,
            n_kv_heads: self.num_key_value_heads,
            head_dim: self.head_dim,
            scale: self.attention_scale,
            softcap: self.attn_logit_softcap,
        }
    }

    /// The attention window of decoder layer `layer` (`None`: full causal attention).
    pub fn window(&self, layer: usize) -> Option<usize> {
        self.layer_windows.get(layer).copied().flatten()
    }

    /// Reads the config from GGUF metadata. `vocab_size` falls back to the tokenizer's
    /// token count, as llama.cpp does.
    pub fn from_gguf(gguf: &GgufFile) -> Result<LlamaConfig, ModelError> {
        let arch = gguf.architecture()?;
        let Some(family) = Family::from_gguf_arch(arch) else {
            return Err(ModelError::UnsupportedArchitecture {
                path: gguf.path.clone(),
                arch: arch.to_string(),
                supported: GGUF_LLAMA_ARCHS.join(", "),
            });
        };
        let key = |k: &str| format!("{arch}.{k}");
        let hidden_size = gguf.get_usize(&key("embedding_length"))?;
        let num_attention_heads = gguf.get_usize(&key("attention.head_count"))?;
        let num_key_value_heads = gguf.opt_usize(&key("attention.head_count_kv"))?.unwrap_or(num_attention_heads);
        if num_attention_heads == 0 || hidden_size % num_attention_heads != 0 {
            return Err(ModelError::InvalidConfig {
                source_file: gguf.path.clone(),
                field: key("attention.head_count"),
                reason: format!("{num_attention_heads} heads do not divide hidden size {hidden_size}"),
            });
        }
        let head_dim = gguf.opt_usize(&key("attention.key_length"))?.unwrap_or(hidden_size / num_attention_heads);
        let vocab_size = match gguf.opt_usize(&key("vocab_size"))? {
            Some(v) => v,
            None => gguf.get_str_array("tokenizer.ggml.tokens")?.len(),
        };
        let rope_scaling = match gguf.opt_str(&key("rope.scaling.type"))? {
            None | Some("none") => RopeScaling::None,
            Some("linear") => RopeScaling::Linear { factor: gguf.get_f32(&key("rope.scaling.factor"))? },
            Some(other) => {
                return Err(ModelError::InvalidConfig {
                    source_file: gguf.path.clone(),
                    field: key("rope.scaling.type"),
                    reason: format!("unsupported rope scaling '{other}'"),
                })
            }
        };
        let num_hidden_layers = gguf.get_usize(&key("block_count"))?;
        // Gemma 2's caps as llama.cpp reads them (its defaults when absent, as
        // Gemma2Config's); transformers' GGUF loader maps neither key and always takes
        // Gemma2Config's 50 and 30.
        let softcap = |k: &str, default: Option<f32>| -> Result<Option<f32>, ModelError> {
            let field = key(k);
            let cap = if family.is_gemma() {
                gguf.opt_f32(&field)?.or(if family == Family::Gemma2 { default } else { None })
            } else {
                None
            };
            match cap {
                Some(c) if !valid_softcap(c) => Err(ModelError::InvalidConfig {
                    source_file: gguf.path.clone(),
                    field,
                    reason: format!("{c} is not a positive soft-cap"),
                }),
                c => Ok(c),
            }
        };
        let cfg = LlamaConfig {
            family,
            vocab_size,
            hidden_size,
            intermediate_size: gguf.get_usize(&key("feed_forward_length"))?,
            num_hidden_layers,
            num_attention_heads,
            num_key_value_heads,
            head_dim,
            rotary_dim: head_dim,
            rms_norm_eps: gguf.get_f32(&key("attention.layer_norm_rms_epsilon"))?,
            rope_theta: gguf.opt_f32(&key("rope.freq_base"))?.unwrap_or(10000.0),
            rope_scaling,
            max_position_embeddings: gguf.get_usize(&key("context_length"))?,
            tie_word_embeddings: gguf.tensor("output.weight").is_none(),
            qkv_bias: gguf.tensor("blk.0.attn_q.bias").is_some(),
            o_bias: gguf.tensor("blk.0.attn_output.bias").is_some(),
            layer_windows: gguf_layer_windows(gguf, family)?,
            hidden_act: family.default_hidden_act(),
            // Gemma's `query_pre_attn_scalar` is not in the file; llama.cpp uses head_dim
            // except for the 27B models (Gemma 2 27B: 46 layers, hidden / heads = 144), and
            // transformers' default is 256, the head_dim of the other sizes.
            attention_scale: match family {
                Family::Gemma2 if num_hidden_layers == 46 => ((hidden_size / num_attention_heads) as f32).powf(-0.5),
                _ => (head_dim as f32).powf(-0.5),
            },
            rope_local_theta: (family == Family::Gemma3).then_some(GEMMA3_LOCAL_ROPE_THETA),
            attn_logit_softcap: softcap("attn_logit_softcapping", Some(GEMMA2_DEFAULT_ATTN_SOFTCAP))?,
            final_logit_softcap: softcap("final_logit_softcapping", Some(GEMMA2_DEFAULT_FINAL_SOFTCAP))?,
            qk_norm: family.qk_norm(),
            // No MoE family has a GGUF architecture here (see `Family::from_gguf_arch`).
            moe: None,
        };
        if let Some(rot) = gguf.opt_usize(&key("rope.dimension_count"))? {
            if rot != cfg.head_dim {
                return Err(ModelError::InvalidConfig {
                    source_file: gguf.path.clone(),
                    field: key("rope.dimension_count"),
                    reason: format!("partial rotary embedding ({rot} of {} dims) is not supported", cfg.head_dim),
                });
            }
        }
        cfg.validate(&gguf.path)
    }

    /// Reads a Hugging Face `config.json`.
    pub fn from_hf_config(path: &Path) -> Result<LlamaConfig, ModelError> {
        let text = std::fs::read_to_string(path).map_err(|e| ModelError::Io { path: path.to_path_buf(), source: e })?;
        let v: Value = serde_json::from_str(&text).map_err(|e| ModelError::InvalidConfig {
            source_file: path.to_path_buf(),
            field: "config.json".into(),
            reason: e.to_string(),
        })?;
        let bad = |field: &str, reason: String| ModelError::InvalidConfig {
            source_file: path.to_path_buf(),
            field: field.to_string(),
            reason,
        };
        let archs: Vec<&str> = v
            .get("architectures")
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        // transformers loads a config without `architectures` by its `model_type`.
        let model_type = v.get("model_type").and_then(Value::as_str);
        let family = if archs.is_empty() {
            model_type.and_then(Family::from_model_type)
        } else {
            archs.iter().find_map(|a| Family::from_hf_arch(a))
        };
        let Some(family) = family else {
            let found = if archs.is_empty() { model_type.unwrap_or("<none>").to_string() } else { archs.join(", ") };
            let supported =
                HF_LLAMA_ARCHS.iter().chain(crate::bert::HF_BERT_ARCHS).copied().collect::<Vec<_>>().join(", ");
            return Err(ModelError::UnsupportedArchitecture { path: path.to_path_buf(), arch: found, supported });
        };
        if family == Family::Bert {
            return Ok(crate::bert::BertConfig::from_json(&v, path)?.base);
        }
        let usize_field = |k: &str| -> Result<usize, ModelError> {
            v.get(k)
                .and_then(Value::as_u64)
                .map(|n| n as usize)
                .ok_or_else(|| bad(k, "missing or not a non-negative integer".into()))
        };
        let opt_usize = |k: &str| {
            v.get(k)
                .filter(|x| !x.is_null())
                .map(|x| x.as_u64().map(|n| n as usize).ok_or_else(|| bad(k, "not a non-negative integer".into())))
                .transpose()
        };
        let f32_field = |k: &str, default: f32| -> Result<f32, ModelError> {
            match v.get(k) {
                None | Some(Value::Null) => Ok(default),
                Some(x) => x.as_f64().map(|f| f as f32).ok_or_else(|| bad(k, "not a number".into())),
            }
        };
        // Features the Llama graph does not build are refused by name, never ignored.
        // Gemma names the key `hidden_activation`; its `hidden_act` (if any) is unused.
        let act_key = if family.is_gemma() { "hidden_activation" } else { "hidden_act" };
        let hidden_act = match v.get(act_key).and_then(Value::as_str) {
            None => family.default_hidden_act(),
            Some("silu") => HiddenAct::Silu,
            Some("gelu_pytorch_tanh") => HiddenAct::GeluTanh,
            Some(other) => {
                return Err(bad(
                    act_key,
                    format!("'{other}' is not supported (loupe builds silu and gelu_pytorch_tanh)"),
                ))
            }
        };
        // Soft-capping: Gemma 2 and 3 apply it when the key is a number, not when it is null;
        // an absent key takes the config class's default (Gemma2Config: 50 and 30;
        // Gemma3TextConfig: none). Other families' transformers code has no soft-capping.
        let softcap = |k: &str, gemma2_default: f32| -> Result<Option<f32>, ModelError> {
            match v.get(k) {
                None if family == Family::Gemma2 => Ok(Some(gemma2_default)),
                None | Some(Value::Null) => Ok(None),
                Some(_) if !family.is_gemma() => {
                    Err(bad(k, format!("logit soft-capping is not part of the {} family", family.name())))
                }
                Some(x) => match x.as_f64().map(|c| c as f32) {
                    Some(c) if valid_softcap(c) => Ok(Some(c)),
                    _ => Err(bad(k, format!("{x} is not a positive number or null"))),
                },
            }
        };
        let attn_logit_softcap = softcap("attn_logit_softcapping", GEMMA2_DEFAULT_ATTN_SOFTCAP)?;
        let final_logit_softcap = softcap("final_logit_softcapping", GEMMA2_DEFAULT_FINAL_SOFTCAP)?;
        if family.is_gemma() && v.get("use_bidirectional_attention").and_then(Value::as_bool) == Some(true) {
            return Err(bad(
                "use_bidirectional_attention",
                "true is not supported (loupe builds causal decoders)".into(),
            ));
        }
        if v.get("mlp_bias").and_then(Value::as_bool) == Some(true) {
            return Err(bad("mlp_bias", "true is not supported (loupe's Llama MLP has no biases)".into()));
        }
        let layers = usize_field("num_hidden_layers")?;
        let layer_windows = hf_layer_windows(&v, family, layers).map_err(|(field, reason)| bad(field, reason))?;
        let attention_bias = v.get("attention_bias").and_then(Value::as_bool).unwrap_or(false);
        let hidden_size = usize_field("hidden_size")?;
        let num_attention_heads = usize_field("num_attention_heads")?;
        if num_attention_heads == 0 || hidden_size % num_attention_heads != 0 {
            return Err(bad(
                "num_attention_heads",
                format!("{num_attention_heads} heads do not divide hidden size {hidden_size}"),
            ));
        }
        // transformers 5 moves rope_theta/rope_scaling into `rope_parameters`; Gemma 3 keeps
        // one entry per layer type there (`full_attention`, `sliding_attention`).
        let rope_params = v.get("rope_parameters").or_else(|| v.get("rope_scaling")).filter(|x| !x.is_null());
        let (global_params, local_params) = match rope_params {
            Some(p)
                if family == Family::Gemma3
                    && (p.get("full_attention").is_some() || p.get("sliding_attention").is_some()) =>
            {
                (p.get("full_attention").filter(|x| !x.is_null()), p.get("sliding_attention").filter(|x| !x.is_null()))
            }
            p => (p, None),
        };
        let (default_theta, default_local) =
            if family == Family::Gemma3 { (1_000_000.0, GEMMA3_LOCAL_ROPE_THETA) } else { (10000.0, 10000.0) };
        let rope_theta = match global_params.and_then(|p| p.get("rope_theta")).and_then(Value::as_f64) {
            Some(t) => t as f32,
            None => f32_field("rope_theta", default_theta)?,
        };
        let head_dim = opt_usize("head_dim")?.unwrap_or(hidden_size / num_attention_heads);
        let max_position_embeddings = opt_usize("max_position_embeddings")?.unwrap_or(if family == Family::Phi3 {
            PHI3_DEFAULT_MAX_POSITIONS
        } else {
            2048
        });
        let moe = hf_moe(&v, family, layers).map_err(|(field, reason)| bad(&field, reason))?;
        if family == Family::Glm4Moe {
            // GLM-4-MoE rotates only the first `partial_rotary_factor` of each head (default
            // 0.5: `Glm4MoeConfig.__post_init__`); loupe rotates part of a head for Phi-3 only so
            // far, so GLM's is refused before the generic check below.
            let factor = match rope_params
                .and_then(|p| p.get("partial_rotary_factor"))
                .or_else(|| v.get("partial_rotary_factor"))
            {
                None | Some(Value::Null) => 0.5,
                Some(x) => x.as_f64().ok_or_else(|| bad("partial_rotary_factor", format!("{x} is not a number")))?,
            };
            if factor != 1.0 {
                return Err(bad(
                    "partial_rotary_factor",
                    format!(
                        "{factor} is not supported (loupe rotates whole heads: only 1.0; GLM-4-MoE's default is 0.5)"
                    ),
                ));
            }
        }
        let qk_norm = family.qk_norm()
            || (family == Family::Glm4Moe && v.get("use_qk_norm").and_then(Value::as_bool) == Some(true));
        let rotary_dim = rotary_dim_of(&v, global_params, head_dim, family).map_err(|(k, reason)| bad(&k, reason))?;
        let rope_scaling = match global_params {
            None => RopeScaling::None,
            Some(p) if family == Family::Phi3 => {
                phi3_rope_scaling(&v, p, rotary_dim, max_position_embeddings).map_err(|(k, reason)| bad(&k, reason))?
            }
            Some(p) => rope_scaling_of(p).map_err(|(k, reason)| bad(&k, reason))?,
        };
        let rope_local_theta = if family == Family::Gemma3 {
            if let Some(p) = local_params {
                if rope_scaling_of(p).map_err(|(k, reason)| bad(&k, reason))? != RopeScaling::None {
                    return Err(bad(
                        "rope_parameters.sliding_attention",
                        "scaled RoPE on sliding-window layers is not supported".into(),
                    ));
                }
            }
            Some(match local_params.and_then(|p| p.get("rope_theta")).and_then(Value::as_f64) {
                Some(t) => t as f32,
                None => f32_field("rope_local_base_freq", default_local)?,
            })
        } else {
            None
        };
        let cfg = LlamaConfig {
            family,
            vocab_size: usize_field("vocab_size")?,
            hidden_size,
            intermediate_size: usize_field("intermediate_size")?,
            num_hidden_layers: usize_field("num_hidden_layers")?,
            num_attention_heads,
            num_key_value_heads: opt_usize("num_key_value_heads")?.unwrap_or(num_attention_heads),
            head_dim,
            rotary_dim,
            // Phi3Config's default eps is 1e-5 (and save_pretrained leaves defaults out).
            rms_norm_eps: f32_field("rms_norm_eps", if family == Family::Phi3 { 1e-5 } else { 1e-6 })?,
            rope_theta,
            rope_scaling,
            max_position_embeddings,
            tie_word_embeddings: v.get("tie_word_embeddings").and_then(Value::as_bool).unwrap_or(false),
            // Phi-3's projections have no biases (`Phi3Attention` ignores `attention_bias`).
            qkv_bias: (attention_bias && family != Family::Phi3) || family == Family::Qwen2,
            // GLM-4-MoE's o_proj never has a bias (`Glm4MoeAttention`); Qwen3-MoE's four
            // projections follow `attention_bias`.
            o_bias: attention_bias
                && matches!(family, Family::Llama | Family::Qwen3 | Family::Gemma3 | Family::Gemma2 | Family::Qwen3Moe),
            layer_windows,
            hidden_act,
            attention_scale: if family.is_gemma() {
                (f32_field("query_pre_attn_scalar", 256.0)? as f64).powf(-0.5) as f32
            } else {
                (head_dim as f32).powf(-0.5)
            },
            rope_local_theta,
            attn_logit_softcap,
            final_logit_softcap,
            qk_norm,
            moe,
        };
        cfg.validate(path)
    }

    /// Every layer's window (`layer_windows`) is empty or has one entry per layer.
    fn validate(self, path: &Path) -> Result<LlamaConfig, ModelError> {
        let bad = |field: &str, reason: String| {
            Err(ModelError::InvalidConfig { source_file: path.to_path_buf(), field: field.into(), reason })
        };
        if self.num_key_value_heads == 0 || self.num_attention_heads % self.num_key_value_heads != 0 {
            return bad(
                "num_key_value_heads",
                format!("{} kv heads do not divide {} heads", self.num_key_value_heads, self.num_attention_heads),
            );
        }
        if self.head_dim == 0 || self.head_dim % 2 != 0 {
            return bad("head_dim", format!("{} must be even and non-zero", self.head_dim));
        }
        for (field, v) in [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("max_position_embeddings", self.max_position_embeddings),
        ] {
            if v == 0 {
                return bad(field, "must be non-zero".into());
            }
        }
        if !self.layer_windows.is_empty() && self.layer_windows.len() != self.num_hidden_layers {
            return bad(
                "layer_types",
                format!("{} entries for {} layers", self.layer_windows.len(), self.num_hidden_layers),
            );
        }
        if self.rotary_dim == 0 || self.rotary_dim % 2 != 0 || self.rotary_dim > self.head_dim {
            return bad(
                "partial_rotary_factor",
                format!(
                    "{} rotary dims of a {}-wide head (must be even, non-zero, at most head_dim)",
                    self.rotary_dim, self.head_dim
                ),
            );
        }
        if !(self.rms_norm_eps.is_finite() && self.rms_norm_eps >= 0.0) {
            return bad("rms_norm_eps", format!("{} is not a valid epsilon", self.rms_norm_eps));
        }
        Ok(self)
    }
}

/// The MoE MLPs a config.json describes, as transformers reads it (`Qwen3MoeConfig`,
/// `Glm4MoeConfig` defaults for absent keys); errors name the key. `None` for dense families.
fn hf_moe(v: &Value, family: Family, layers: usize) -> Result<Option<MoeConfig>, (String, String)> {
    if !family.is_moe() {
        return Ok(None);
    }
    let int = |k: &str, default: Option<u64>| -> Result<usize, (String, String)> {
        match v.get(k) {
            None | Some(Value::Null) => {
                default.map(|d| d as usize).ok_or_else(|| (k.to_string(), "missing".to_string()))
            }
            Some(x) => x
                .as_u64()
                .map(|n| n as usize)
                .ok_or_else(|| (k.to_string(), format!("{x} is not a non-negative integer"))),
        }
    };
    let flag = |k: &str, default: bool| -> Result<bool, (String, String)> {
        match v.get(k) {
            None | Some(Value::Null) => Ok(default),
            Some(x) => x.as_bool().ok_or_else(|| (k.to_string(), format!("{x} is not a boolean"))),
        }
    };
    let top_k = int("num_experts_per_tok", Some(8))?;
    let moe_intermediate_size = int("moe_intermediate_size", None)?;
    if moe_intermediate_size == 0 {
        return Err(("moe_intermediate_size".into(), "must be non-zero".into()));
    }
    let (router, shared, bias, sparse_layers) = match family {
        Family::Qwen3Moe => {
            // `num_experts` is the attribute; transformers 5 writes it as `num_local_experts`
            // (`Qwen3MoeConfig.attribute_map`), released checkpoints as `num_experts`.
            let key = if v.get("num_experts").is_some() { "num_experts" } else { "num_local_experts" };
            let n = int(key, Some(128))?;
            let step = int("decoder_sparse_step", Some(1))?;
            if step == 0 {
                return Err(("decoder_sparse_step".into(), "must be positive".into()));
            }
            let dense: Vec<usize> = match v.get("mlp_only_layers") {
                None | Some(Value::Null) => Vec::new(),
                Some(Value::Array(a)) => a
                    .iter()
                    .map(|x| {
                        x.as_u64()
                            .map(|n| n as usize)
                            .ok_or_else(|| ("mlp_only_layers".to_string(), format!("{x} is not a layer index")))
                    })
                    .collect::<Result<_, _>>()?,
                Some(x) => return Err(("mlp_only_layers".into(), format!("{x} is not a list of layer indices"))),
            };
            // `Qwen3MoeDecoderLayer.__init__`: sparse unless listed in `mlp_only_layers`,
            // when experts exist and `(layer_idx + 1) % decoder_sparse_step == 0`.
            let sparse: Vec<bool> = (0..layers).map(|l| !dense.contains(&l) && n > 0 && (l + 1) % step == 0).collect();
            let router = Router {
                scoring: RouterScoring::Softmax,
                n_experts: n,
                top_k,
                n_group: 1,
                topk_group: 1,
                norm_topk_prob: flag("norm_topk_prob", false)?,
                scaling: 1.0,
            };
            (router, None, false, sparse)
        }
        Family::Glm4Moe => {
            let key = if v.get("n_routed_experts").is_some() { "n_routed_experts" } else { "num_local_experts" };
            let n = int(key, Some(128))?;
            let scaling = match v.get("routed_scaling_factor") {
                None | Some(Value::Null) => 1.0,
                Some(x) => x
                    .as_f64()
                    .filter(|f| f.is_finite())
                    .ok_or_else(|| ("routed_scaling_factor".to_string(), format!("{x} is not a number")))?
                    as f32,
            };
            let router = Router {
                scoring: RouterScoring::Sigmoid,
                n_experts: n,
                top_k,
                n_group: int("n_group", Some(1))?,
                topk_group: int("topk_group", Some(1))?,
                norm_topk_prob: flag("norm_topk_prob", true)?,
                scaling,
            };
            let shared = int("n_shared_experts", Some(1))?;
            // `Glm4MoeDecoderLayer.__init__`: sparse from `first_k_dense_replace` on.
            let first = int("first_k_dense_replace", Some(1))?;
            (
                router,
                (shared > 0).then_some(moe_intermediate_size * shared),
                true,
                (0..layers).map(|l| l >= first).collect(),
            )
        }
        Family::Llama
        | Family::Qwen2
        | Family::Mistral
        | Family::Qwen3
        | Family::Gemma3
        | Family::Gemma2
        | Family::Bert
        | Family::Phi3 => return Ok(None),
    };
    if sparse_layers.len() > crate::roles::MAX_MOE_LAYERS {
        return Err((
            "num_hidden_layers".into(),
            format!(
                "{} layers; loupe's MoE wiring covers at most {}",
                sparse_layers.len(),
                crate::roles::MAX_MOE_LAYERS
            ),
        ));
    }
    if let Err(e) = router.check() {
        let field = if router.n_group == 0
            || !router.n_experts.is_multiple_of(router.n_group)
            || (router.n_group > 1 && router.n_experts / router.n_group < 2)
        {
            "n_group"
        } else if router.topk_group == 0 || router.topk_group > router.n_group {
            "topk_group"
        } else {
            "num_experts_per_tok"
        };
        return Err((field.into(), e.to_string()));
    }
    Ok(Some(MoeConfig {
        router,
        moe_intermediate_size,
        shared_intermediate_size: shared,
        correction_bias: bias,
        sparse_layers,
    }))
}

/// The rotated part of each head: `int(head_dim * partial_rotary_factor)` (transformers'
/// rope init, in f64 then truncated), the factor read from `rope_parameters` first, then the
/// top level (`convert_rope_params_to_dict`'s priority). Only Phi-3's attention rotates part
/// of a head in loupe; other families refuse a factor below 1 by name.
fn rotary_dim_of(
    v: &Value,
    params: Option<&Value>,
    head_dim: usize,
    family: Family,
) -> Result<usize, (String, String)> {
    let (key, factor) = match params.and_then(|p| p.get("partial_rotary_factor")).filter(|x| !x.is_null()) {
        Some(x) => ("rope_parameters.partial_rotary_factor", Some(x)),
        None => ("partial_rotary_factor", v.get("partial_rotary_factor").filter(|x| !x.is_null())),
    };
    let Some(x) = factor else { return Ok(head_dim) };
    let f = x
        .as_f64()
        .filter(|f| *f > 0.0 && *f <= 1.0)
        .ok_or_else(|| (key.to_string(), format!("{x} is not a number in (0, 1]")))?;
    if f < 1.0 && family != Family::Phi3 {
        return Err((
            key.into(),
            format!("partial rotary embedding is not supported for the {} family", family.name()),
        ));
    }
    let dim = (head_dim as f64 * f) as usize;
    if dim == 0 || dim % 2 != 0 {
        return Err((
            key.into(),
            format!("head_dim {head_dim} x {f} gives {dim} rotary dims (must be even and non-zero)"),
        ));
    }
    Ok(dim)
}

/// Phi-3's RoPE scaling as `Phi3Config` and transformers' rope init read it: `default`, or
/// `longrope` (`su` and `yarn` are old names of it, `Phi3Config.convert_rope_params_to_dict`)
/// with `short_factor` and `long_factor` of rotary_dim / 2 numbers each
/// (`Phi3Config.validate_rope`); anything else is refused as transformers refuses it.
/// The switch length is the top-level `original_max_position_embeddings` (4096 when absent,
/// even if the scaling entry has its own: `standardize_rope_params` prefers the config
/// attribute); the attention factor is the entry's `attention_factor`, else, with `factor`
/// (the entry's, else max_position_embeddings / original), 1 when factor <= 1 and
/// sqrt(1 + ln(factor) / ln(original)) above (`_compute_longrope_parameters`).
fn phi3_rope_scaling(
    v: &Value,
    p: &Value,
    rotary_dim: usize,
    max_positions: usize,
) -> Result<RopeScaling, (String, String)> {
    let err = |k: &str, reason: String| (format!("rope_scaling.{k}"), reason);
    let rope_type = p.get("rope_type").or_else(|| p.get("type")).and_then(Value::as_str).unwrap_or("default");
    match rope_type {
        "default" => return Ok(RopeScaling::None),
        "longrope" | "su" | "yarn" => {}
        other => {
            return Err(err(
                "rope_type",
                format!("'{other}' is not a Phi-3 RoPE type (default or longrope, as Phi3Config.validate_rope)"),
            ))
        }
    }
    let factors = |k: &str| -> Result<Vec<f32>, (String, String)> {
        let list = p.get(k).and_then(Value::as_array).ok_or_else(|| err(k, "missing or not a list".into()))?;
        let f: Vec<f32> = list
            .iter()
            .map(|x| x.as_f64().filter(|f| f.is_finite() && *f > 0.0).map(|f| f as f32))
            .collect::<Option<_>>()
            .ok_or_else(|| err(k, "not a list of positive numbers".into()))?;
        if f.len() != rotary_dim / 2 {
            return Err(err(k, format!("{} entries, expected rotary_dim / 2 = {}", f.len(), rotary_dim / 2)));
        }
        Ok(f)
    };
    let (short_factor, long_factor) = (factors("short_factor")?, factors("long_factor")?);
    let original =
        match v.get("original_max_position_embeddings").filter(|x| !x.is_null()) {
            None => PHI3_DEFAULT_ORIGINAL_MAX_POSITIONS,
            Some(x) => x.as_u64().filter(|n| *n >= 2).ok_or_else(|| {
                ("original_max_position_embeddings".to_string(), format!("{x} is not an integer >= 2"))
            })? as usize,
        };
    let number = |k: &str| -> Result<Option<f64>, (String, String)> {
        match p.get(k).filter(|x| !x.is_null()) {
            None => Ok(None),
            Some(x) => x
                .as_f64()
                .filter(|f| f.is_finite() && *f > 0.0)
                .map(Some)
                .ok_or_else(|| err(k, format!("{x} is not a positive number"))),
        }
    };
    let factor = number("factor")?.unwrap_or(max_positions as f64 / original as f64);
    let attention_factor = match number("attention_factor")? {
        Some(a) => a,
        None if factor <= 1.0 => 1.0,
        None => (1.0 + factor.ln() / (original as f64).ln()).sqrt(),
    };
    Ok(RopeScaling::LongRope {
        short_factor,
        long_factor,
        original_max_position_embeddings: original,
        attention_factor: attention_factor as f32,
    })
}

/// The RoPE scaling one `rope_parameters` (or legacy `rope_scaling`) entry describes; errors
/// name the offending key.
fn rope_scaling_of(p: &Value) -> Result<RopeScaling, (String, String)> {
    let get = |k: &str| {
        p.get(k)
            .and_then(Value::as_f64)
            .map(|x| x as f32)
            .ok_or_else(|| (format!("rope_scaling.{k}"), "missing or not a number".to_string()))
    };
    Ok(match p.get("rope_type").or_else(|| p.get("type")).and_then(Value::as_str).unwrap_or("default") {
        "default" => RopeScaling::None,
        "linear" => RopeScaling::Linear { factor: get("factor")? },
        "llama3" => RopeScaling::Llama3 {
            factor: get("factor")?,
            low_freq_factor: get("low_freq_factor")?,
            high_freq_factor: get("high_freq_factor")?,
            original_max_position_embeddings: get("original_max_position_embeddings")?,
        },
        other => return Err(("rope_scaling.rope_type".into(), format!("unsupported rope type '{other}'"))),
    })
}

/// Each layer's attention window from GGUF metadata: Gemma has `<arch>.attention.sliding_window`
/// on the layers of its pattern ([`Family::window_pattern`]: five of every six in Gemma 3,
/// every other in Gemma 2), as llama.cpp and transformers' GGUF loader both assume; the
/// other GGUF families here use full attention.
fn gguf_layer_windows(gguf: &GgufFile, family: Family) -> Result<Vec<Option<usize>>, ModelError> {
    let Some(pattern) = family.window_pattern() else { return Ok(Vec::new()) };
    let arch = gguf.architecture()?;
    let key = format!("{arch}.attention.sliding_window");
    let window = gguf.get_usize(&key)?;
    if window == 0 {
        return Err(ModelError::InvalidConfig {
            source_file: gguf.path.clone(),
            field: key,
            reason: "must be positive".into(),
        });
    }
    let layers = gguf.get_usize(&format!("{arch}.block_count"))?;
    Ok(gemma_layer_windows(layers, pattern, window))
}

/// Gemma's layer types: every `pattern`-th layer global, the others windowed
/// (`Gemma3TextConfig.__post_init__`'s and `Gemma2Config.__post_init__`'s `layer_types`).
fn gemma_layer_windows(layers: usize, pattern: usize, window: usize) -> Vec<Option<usize>> {
    (0..layers).map(|l| ((l + 1) % pattern != 0).then_some(window)).collect()
}

/// Each layer's attention window from a config.json, as transformers decides it:
/// * Mistral: `sliding_window` (an integer, or null for none) on every layer;
/// * Qwen2, Qwen3: only with `use_sliding_window`, on the layers `layer_types` marks
///   `sliding_attention` (transformers' default: layers from `max_window_layers` on);
/// * Gemma 2 and 3: always, on the layers `layer_types` marks, by default those of the
///   family's pattern ([`Family::window_pattern`]; Gemma 3's `sliding_window_pattern` key
///   overrides it), with a window of `sliding_window` (4096 when absent, as their configs'
///   default);
/// * Llama: none.
fn hf_layer_windows(v: &Value, family: Family, layers: usize) -> Result<Vec<Option<usize>>, (&'static str, String)> {
    let window = || -> Result<Option<usize>, (&'static str, String)> {
        match v.get("sliding_window") {
            None if family.is_gemma() => Ok(Some(GEMMA_DEFAULT_SLIDING_WINDOW)),
            None | Some(Value::Null) => Ok(None),
            Some(w) => match w.as_u64() {
                Some(n) if n > 0 => Ok(Some(n as usize)),
                _ => Err(("sliding_window", format!("{w} is not a positive integer"))),
            },
        }
    };
    match family {
        Family::Llama | Family::Bert => Ok(Vec::new()),
        // Phi-3 masks every layer with `sliding_window` when it is not null
        // (`Phi3Model.forward`: create_sliding_window_causal_mask), as Mistral.
        Family::Mistral | Family::Phi3 => Ok(match window()? {
            Some(w) => vec![Some(w); layers],
            None => Vec::new(),
        }),
        // Qwen3-MoE reads Qwen2's keys (`Qwen3MoeAttention` passes `sliding_window` only with
        // `use_sliding_window`); GLM-4-MoE has no sliding window.
        Family::Glm4Moe => Ok(Vec::new()),
        Family::Qwen2 | Family::Qwen3 | Family::Qwen3Moe | Family::Gemma3 | Family::Gemma2 => {
            if !family.is_gemma() && v.get("use_sliding_window").and_then(Value::as_bool) != Some(true) {
                return Ok(Vec::new());
            }
            let Some(w) = window()? else {
                let why = if family.is_gemma() {
                    "null, but the family has sliding-window layers"
                } else {
                    "null, but use_sliding_window is true"
                };
                return Err(("sliding_window", why.into()));
            };
            match v.get("layer_types").filter(|x| !x.is_null()) {
                Some(Value::Array(types)) if types.len() == layers => types
                    .iter()
                    .map(|t| match t.as_str() {
                        Some("full_attention") => Ok(None),
                        Some("sliding_attention") => Ok(Some(w)),
                        _ => Err(("layer_types", format!("unsupported layer type {t}"))),
                    })
                    .collect(),
                Some(other) => Err(("layer_types", format!("expected {layers} layer types, found {other}"))),
                None => match family.window_pattern() {
                    Some(default) => {
                        let pattern = match family {
                            Family::Gemma3 => v
                                .get("sliding_window_pattern")
                                .and_then(Value::as_u64)
                                .map_or(default, |p| p.max(1) as usize),
                            _ => default,
                        };
                        Ok(gemma_layer_windows(layers, pattern, w))
                    }
                    None => {
                        let from = v.get("max_window_layers").and_then(Value::as_u64).unwrap_or(layers as u64) as usize;
                        Ok((0..layers).map(|l| (l >= from).then_some(w)).collect())
                    }
                },
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hf(json: &str) -> Result<LlamaConfig, ModelError> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.json");
        std::fs::write(&path, json).unwrap();
        LlamaConfig::from_hf_config(&path)
    }

    const BASE: &str = r#""hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 100"#;

    /// Qwen2 has q/k/v biases and no o_proj bias whatever `attention_bias` says (transformers'
    /// `Qwen2Attention`); Llama's `attention_bias` covers all four projections.
    #[test]
    fn families_set_their_attention_biases() {
        let q = hf(&format!(r#"{{"architectures": ["Qwen2ForCausalLM"], {BASE}}}"#)).unwrap();
        assert_eq!((q.family, q.qkv_bias, q.o_bias), (Family::Qwen2, true, false));
        let q = hf(&format!(r#"{{"model_type": "qwen2", {BASE}}}"#)).unwrap();
        assert_eq!(q.family, Family::Qwen2);
        let l = hf(&format!(r#"{{"architectures": ["LlamaForCausalLM"], "attention_bias": true, {BASE}}}"#)).unwrap();
        assert_eq!((l.family, l.qkv_bias, l.o_bias), (Family::Llama, true, true));
        let l = hf(&format!(r#"{{"model_type": "llama", {BASE}}}"#)).unwrap();
        assert_eq!((l.family, l.qkv_bias, l.o_bias), (Family::Llama, false, false));
        assert!(Family::Llama.gguf_permutes_qk() && !Family::Qwen2.gguf_permutes_qk());
    }

    /// Windows per layer as transformers sets them (2 layers in BASE).
    #[test]
    fn sliding_windows_follow_each_family() {
        let m = hf(&format!(r#"{{"architectures": ["MistralForCausalLM"], "sliding_window": 8, {BASE}}}"#)).unwrap();
        assert_eq!(
            (m.family, m.layer_windows.clone(), m.window(1), m.window(5)),
            (Family::Mistral, vec![Some(8), Some(8)], Some(8), None)
        );
        let m = hf(&format!(r#"{{"model_type": "mistral", "sliding_window": null, {BASE}}}"#)).unwrap();
        assert!(m.layer_windows.is_empty());
        let q = hf(&format!(r#"{{"architectures": ["Qwen2ForCausalLM"], "sliding_window": 8, {BASE}}}"#)).unwrap();
        assert!(q.layer_windows.is_empty(), "use_sliding_window is off by default");
        let q = hf(&format!(r#"{{"architectures": ["Qwen2ForCausalLM"], "use_sliding_window": true, "sliding_window": 8, "max_window_layers": 1, {BASE}}}"#)).unwrap();
        assert_eq!(q.layer_windows, vec![None, Some(8)]);
        let q = hf(&format!(r#"{{"architectures": ["Qwen2ForCausalLM"], "use_sliding_window": true, "sliding_window": 8, "layer_types": ["sliding_attention", "full_attention"], {BASE}}}"#)).unwrap();
        assert_eq!(q.layer_windows, vec![Some(8), None]);
        let e = hf(&format!(r#"{{"architectures": ["MistralForCausalLM"], "sliding_window": -1, {BASE}}}"#))
            .unwrap_err()
            .to_string();
        assert!(e.contains("sliding_window"), "{e}");
        let e = hf(&format!(r#"{{"architectures": ["Qwen2ForCausalLM"], "use_sliding_window": true, "sliding_window": 8, "layer_types": ["full_attention"], {BASE}}}"#)).unwrap_err().to_string();
        assert!(e.contains("layer_types"), "{e}");
    }

    /// Gemma 2 as `Gemma2Config` reads config.json: absent caps and window take the class's
    /// defaults (50, 30, 4096), null turns a cap off, layers 0, 2, ... slide, one RoPE base,
    /// `query_pre_attn_scalar` sets the scale; bad values are refused naming their key.
    #[test]
    fn gemma2_reads_soft_caps_windows_and_scale() {
        let g = hf(&format!(
            r#"{{"architectures": ["Gemma2ForCausalLM"], "head_dim": 16, "query_pre_attn_scalar": 24, {BASE}}}"#
        ))
        .unwrap();
        assert_eq!(
            (g.family, g.hidden_act, g.attn_logit_softcap, g.final_logit_softcap),
            (Family::Gemma2, HiddenAct::GeluTanh, Some(50.0), Some(30.0))
        );
        assert_eq!(
            (g.layer_windows.clone(), g.rope_local_theta, g.rope_theta),
            (vec![Some(4096), None], None, 10000.0)
        );
        assert_eq!(g.attention_scale, (24f64).powf(-0.5) as f32);
        assert!(
            g.family.sandwich_norms()
                && g.family.norm_unit_offset()
                && g.family.scales_embedding()
                && !g.family.qk_norm()
        );
        assert!(g.wiring().final_softcap && !Family::Gemma2.wiring().final_softcap);
        let g = hf(&format!(r#"{{"model_type": "gemma2", "attn_logit_softcapping": 7.5, "final_logit_softcapping": null, "sliding_window": 8, "layer_types": ["full_attention", "sliding_attention"], {BASE}}}"#)).unwrap();
        assert_eq!(
            (g.family, g.attn_logit_softcap, g.final_logit_softcap, g.layer_windows.clone()),
            (Family::Gemma2, Some(7.5), None, vec![None, Some(8)])
        );
        assert!(!g.wiring().final_softcap);
        for (key, value) in [
            ("attn_logit_softcapping", "0"),
            ("final_logit_softcapping", "-3"),
            ("final_logit_softcapping", "\"big\""),
            ("use_bidirectional_attention", "true"),
            ("sliding_window", "null"),
        ] {
            let e =
                hf(&format!(r#"{{"architectures": ["Gemma2ForCausalLM"], "{key}": {value}, {BASE}}}"#)).unwrap_err();
            assert!(matches!(&e, ModelError::InvalidConfig { field, .. } if field == key), "{key}: {e}");
        }
        // Gemma 3 has none unless configured; Llama has no soft-capping at all.
        let g3 = hf(&format!(r#"{{"architectures": ["Gemma3ForCausalLM"], "sliding_window": 8, {BASE}}}"#)).unwrap();
        assert_eq!((g3.attn_logit_softcap, g3.final_logit_softcap), (None, None));
        let g3 = hf(&format!(r#"{{"architectures": ["Gemma3ForCausalLM"], "sliding_window": 8, "final_logit_softcapping": 30.0, {BASE}}}"#)).unwrap();
        assert_eq!(g3.final_logit_softcap, Some(30.0));
        let e = hf(&format!(r#"{{"architectures": ["LlamaForCausalLM"], "attn_logit_softcapping": 50.0, {BASE}}}"#))
            .unwrap_err()
            .to_string();
        assert!(e.contains("attn_logit_softcapping"), "{e}");
        assert!(hf(&format!(r#"{{"architectures": ["LlamaForCausalLM"], "final_logit_softcapping": null, {BASE}}}"#))
            .is_ok());
    }

    /// Qwen3-MoE and GLM-4-MoE as their config classes read config.json: which layers are
    /// sparse, the router's arithmetic, the attention biases; GLM's partial RoPE (default
    /// 0.5) is refused naming `partial_rotary_factor`; bad MoE keys are refused by name.
    #[test]
    fn moe_configs_read_their_keys() {
        const MOE: &str = r#""moe_intermediate_size": 16, "num_experts_per_tok": 2"#;
        // transformers 5 writes num_experts as num_local_experts; released checkpoints say num_experts.
        for key in ["num_experts", "num_local_experts"] {
            let q = hf(&format!(r#"{{"architectures": ["Qwen3MoeForCausalLM"], "{key}": 8, "mlp_only_layers": [1], "attention_bias": true, {MOE}, {BASE}}}"#)).unwrap();
            let m = q.moe.clone().unwrap();
            assert_eq!((q.family, q.qk_norm, q.qkv_bias, q.o_bias), (Family::Qwen3Moe, true, true, true));
            assert_eq!(
                (
                    m.router.scoring,
                    m.router.n_experts,
                    m.router.top_k,
                    m.router.norm_topk_prob,
                    m.sparse_layers.clone()
                ),
                (RouterScoring::Softmax, 8, 2, false, vec![true, false])
            );
            assert_eq!((m.shared_intermediate_size, m.correction_bias, m.moe_intermediate_size), (None, false, 16));
            assert!(q.is_sparse(0) && !q.is_sparse(1) && q.wiring().sparse(0) && !q.wiring().sparse(1));
        }
        let q = hf(&format!(r#"{{"model_type": "qwen3_moe", "num_experts": 8, "decoder_sparse_step": 2, "norm_topk_prob": true, {MOE}, {BASE}}}"#)).unwrap();
        assert_eq!(
            (q.moe.as_ref().unwrap().sparse_layers.clone(), q.moe.as_ref().unwrap().router.norm_topk_prob),
            (vec![false, true], true)
        );
        let glm = |extra: &str| {
            hf(&format!(
                r#"{{"architectures": ["Glm4MoeForCausalLM"], "n_routed_experts": 8, "n_group": 4, "topk_group": 2, "routed_scaling_factor": 2.5, {extra} {MOE}, {BASE}}}"#
            ))
        };
        let g = glm(r#""partial_rotary_factor": 1.0, "use_qk_norm": true, "attention_bias": true,"#).unwrap();
        let m = g.moe.clone().unwrap();
        assert_eq!(
            (g.family, g.qk_norm, g.qkv_bias, g.o_bias, g.wiring().qk_norm),
            (Family::Glm4Moe, true, true, false, true)
        );
        assert_eq!(
            (m.router.scoring, m.router.n_group, m.router.topk_group, m.router.scaling, m.router.norm_topk_prob),
            (RouterScoring::Sigmoid, 4, 2, 2.5, true)
        );
        assert_eq!(
            (m.shared_intermediate_size, m.correction_bias, m.sparse_layers.clone()),
            (Some(16), true, vec![false, true])
        );
        assert!(glm(r#""rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 1.0}, "n_shared_experts": 0,"#).unwrap().moe.unwrap().shared_intermediate_size.is_none());
        assert!(!glm(r#""partial_rotary_factor": 1.0,"#).unwrap().qk_norm);
        for (extra, field) in [
            ("", "partial_rotary_factor"),
            (r#""partial_rotary_factor": 0.5,"#, "partial_rotary_factor"),
            (r#""partial_rotary_factor": 1.0, "n_group": 3,"#, "n_group"),
            (r#""partial_rotary_factor": 1.0, "topk_group": 5,"#, "topk_group"),
            (r#""partial_rotary_factor": 1.0, "routed_scaling_factor": "x","#, "routed_scaling_factor"),
        ] {
            let e = glm(extra).unwrap_err();
            assert!(matches!(&e, ModelError::InvalidConfig { field: f, .. } if f == field), "{extra}: {e}");
        }
        let e = hf(&format!(
            r#"{{"architectures": ["Qwen3MoeForCausalLM"], "num_experts": 8, "mlp_only_layers": "all", {MOE}, {BASE}}}"#
        ))
        .unwrap_err();
        assert!(matches!(&e, ModelError::InvalidConfig { field, .. } if field == "mlp_only_layers"), "{e}");
        let e = hf(&format!(r#"{{"architectures": ["Qwen3MoeForCausalLM"], "num_experts": 1, {MOE}, {BASE}}}"#))
            .unwrap_err();
        assert!(matches!(&e, ModelError::InvalidConfig { field, .. } if field == "num_experts_per_tok"), "{e}");
        let e = hf(&format!(r#"{{"architectures": ["Qwen3MoeForCausalLM"], "num_experts": 8, {BASE}}}"#)).unwrap_err();
        assert!(matches!(&e, ModelError::InvalidConfig { field, .. } if field == "moe_intermediate_size"), "{e}");
    }

    /// Phi-3 as Phi3Config and transformers' rope init read config.json: fused projections,
    /// no biases whatever `attention_bias` says, eps 1e-5 and 4096 positions by default;
    /// `partial_rotary_factor` from rope_parameters or the top level; LongRoPE (also under
    /// its old names) with the switch at the top-level `original_max_position_embeddings`
    /// (4096 when absent, whatever the scaling entry says) and the attention factor of
    /// `_compute_longrope_parameters`; what transformers refuses is refused by name.
    #[test]
    fn phi3_reads_partial_rotary_and_longrope() {
        let p = hf(&format!(r#"{{"architectures": ["Phi3ForCausalLM"], "attention_bias": true, {BASE}}}"#)).unwrap();
        assert_eq!(
            (p.family, p.qkv_bias, p.o_bias, p.rotary_dim, p.head_dim, p.rms_norm_eps, p.max_position_embeddings),
            (Family::Phi3, false, false, 16, 16, 1e-5, 4096)
        );
        assert_eq!((p.rope_scaling.clone(), p.layer_windows.clone()), (RopeScaling::None, vec![]));
        assert!(p.wiring().fused_projections && !Family::Llama.wiring().fused_projections);
        let six = |x: f32| format!("[{x}, {x}, {x}, {x}, {x}, {x}]");
        let long = |extra: &str| {
            format!(
                r#"{{"model_type": "phi3", "max_position_embeddings": 256, "original_max_position_embeddings": 16, "sliding_window": 8, "rope_parameters": {{"rope_type": "longrope", "partial_rotary_factor": 0.75, "short_factor": {}, "long_factor": {}{extra}}}, {BASE}}}"#,
                six(1.5),
                six(4.0)
            )
        };
        let p = hf(&long("")).unwrap();
        assert_eq!((p.rotary_dim, p.layer_windows.clone()), (12, vec![Some(8), Some(8)]));
        let want = RopeScaling::LongRope {
            short_factor: vec![1.5; 6],
            long_factor: vec![4.0; 6],
            original_max_position_embeddings: 16,
            attention_factor: (1.0 + (16f64).ln() / (16f64).ln()).sqrt() as f32,
        };
        assert_eq!(p.rope_scaling, want);
        let p = hf(&long(r#", "attention_factor": 1.1"#)).unwrap();
        assert!(matches!(p.rope_scaling, RopeScaling::LongRope { attention_factor, .. } if attention_factor == 1.1f32));
        // `factor` replaces max_position_embeddings / original in the default attention factor.
        let p = hf(&long(r#", "factor": 2.0"#)).unwrap();
        assert!(
            matches!(p.rope_scaling, RopeScaling::LongRope { attention_factor, .. } if attention_factor == (1.0 + (2f64).ln() / (16f64).ln()).sqrt() as f32)
        );
        // Old checkpoints: `rope_scaling` with type su and its own original length, which
        // transformers overrides with Phi3Config's default 4096 (so factor 256/4096 <= 1).
        let legacy = format!(
            r#"{{"architectures": ["Phi3ForCausalLM"], "max_position_embeddings": 256, "partial_rotary_factor": 0.5, "rope_scaling": {{"type": "su", "original_max_position_embeddings": 32, "short_factor": [1, 1, 1, 1], "long_factor": [2, 2, 2, 2]}}, {BASE}}}"#
        );
        let p = hf(&legacy).unwrap();
        assert_eq!(
            (p.rotary_dim, p.rope_scaling.clone()),
            (
                8,
                RopeScaling::LongRope {
                    short_factor: vec![1.0; 4],
                    long_factor: vec![2.0; 4],
                    original_max_position_embeddings: 4096,
                    attention_factor: 1.0
                }
            )
        );
        for (json, field) in [
            (
                long(r#", "rope_type": "linear""#).replacen(r#""rope_type": "longrope", "#, "", 1),
                "rope_scaling.rope_type",
            ),
            (long("").replace(&six(4.0), "[4.0, 4.0]"), "rope_scaling.long_factor"),
            (long("").replace(&six(1.5), "[1, 1, 1, 1, 1, \"x\"]"), "rope_scaling.short_factor"),
            (long("").replace("0.75", "0.1"), "rope_parameters.partial_rotary_factor"),
            (long("").replace("0.75", "1.5"), "rope_parameters.partial_rotary_factor"),
            (
                long("")
                    .replace(r#""original_max_position_embeddings": 16"#, r#""original_max_position_embeddings": 1"#),
                "original_max_position_embeddings",
            ),
            (long(r#", "attention_factor": -1"#), "rope_scaling.attention_factor"),
            (
                format!(r#"{{"architectures": ["LlamaForCausalLM"], "partial_rotary_factor": 0.5, {BASE}}}"#),
                "partial_rotary_factor",
            ),
        ] {
            let e = hf(&json).unwrap_err();
            assert!(matches!(&e, ModelError::InvalidConfig { field: f, .. } if f == field), "{field}: {e}");
        }
    }

    #[test]
    fn unsupported_features_are_refused_by_name() {
        let e = hf(&format!(r#"{{"architectures": ["GPTNeoXForCausalLM"], {BASE}}}"#)).unwrap_err().to_string();
        assert!(e.contains("GPTNeoXForCausalLM") && e.contains("Qwen2ForCausalLM"), "{e}");
    }
}
