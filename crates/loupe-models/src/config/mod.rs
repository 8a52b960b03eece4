//! The configuration of a decoder ([`DecoderConfig`]), read from GGUF metadata (`<arch>.*`
//! keys, `gguf.rs`) or from a Hugging Face `config.json` (`hf.rs`, its RoPE keys in
//! `rope.rs`), so both sources build the same graph. What differs between families is read from their descriptors
//! ([`crate::family::FamilySpec`]); BERT encoders have their own config
//! ([`crate::bert::BertConfig`]).

mod gguf;
mod hf;
mod rope;
#[cfg(test)]
mod tests;

pub use hf::{hf_family, read_config_json};

use std::path::Path;

use loupe_tensor::ops::{AttentionShape, RopeScaling, Router};

use crate::error::ModelError;
use crate::family::{Family, HiddenAct, MoeRouting};
use crate::roles::{MoeWiring, Wiring, MAX_MOE_LAYERS};

/// A Mixture-of-Experts MLP's configuration (Qwen3-MoE, GLM-4-MoE, Hunyuan-MoE).
#[derive(Debug, Clone, PartialEq)]
pub struct MoeConfig {
    /// The router's arithmetic (scoring, experts, top-k, groups, renormalization, scaling).
    pub router: Router,
    /// Each routed expert's hidden width (`moe_intermediate_size`; Hunyuan: `intermediate_size`).
    pub moe_intermediate_size: usize,
    /// The shared experts' MLP width (`moe_intermediate_size * n_shared_experts`; Hunyuan's
    /// shared MLP: `intermediate_size`), run on
    /// every token and added to the routed output; `None`: no shared experts.
    pub shared_intermediate_size: Option<usize>,
    /// Whether the router has an `e_score_correction_bias` (sigmoid routers).
    pub correction_bias: bool,
    /// Per decoder layer, whether its MLP is sparse (the others are the dense MLP of
    /// `intermediate_size`).
    pub sparse_layers: Vec<bool>,
}

/// Hyper-parameters of a decoder (every family [`crate::decoder::build_decoder`] builds).
#[derive(Debug, Clone, PartialEq)]
pub struct DecoderConfig {
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

/// A soft-cap must be a positive finite number.
fn valid_softcap(cap: f32) -> bool {
    cap.is_finite() && cap > 0.0
}

impl DecoderConfig {
    /// What the builder emits: the family's layer wiring, and the final soft-cap's value
    /// when the config has one.
    pub fn wiring(&self) -> Wiring {
        let hunyuan_modules = self.family.spec().moe == Some(MoeRouting::SoftmaxSharedMlp);
        let moe = self.moe.as_ref().map(|m| MoeWiring {
            sparse_layers: m
                .sparse_layers
                .iter()
                .enumerate()
                .filter(|&(l, &s)| s && l < MAX_MOE_LAYERS)
                .fold(0u128, |bits, (l, _)| bits | 1u128 << l),
            shared_experts: m.shared_intermediate_size.is_some(),
            // Hunyuan's module names: the gate's linear `mlp.gate.wg`, the shared expert
            // `mlp.shared_mlp` (`HunYuanMoEV1Gate`, `HunYuanMoEV1Moe`).
            shared_mlp: hunyuan_modules,
            router_wg: hunyuan_modules,
        });
        Wiring { final_softcap: self.final_logit_softcap.is_some(), qk_norm: self.qk_norm, moe, ..self.family.wiring() }
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

    /// Every layer's window (`layer_windows`) is empty or has one entry per layer.
    fn validate(self, path: &Path) -> Result<DecoderConfig, ModelError> {
        let bad = |field: &str, reason: String| {
            Err(ModelError::InvalidConfig { source_file: path.to_path_buf(), field: field.into(), reason })
        };
        if self.num_key_value_heads == 0 || !self.num_attention_heads.is_multiple_of(self.num_key_value_heads) {
            return bad(
                "num_key_value_heads",
                format!("{} kv heads do not divide {} heads", self.num_key_value_heads, self.num_attention_heads),
            );
        }
        if self.head_dim == 0 || !self.head_dim.is_multiple_of(2) {
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
        if self.rotary_dim == 0 || !self.rotary_dim.is_multiple_of(2) || self.rotary_dim > self.head_dim {
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

/// Layer types of a windowing pattern: every `pattern`-th layer global, the others windowed
/// (`Gemma3TextConfig.__post_init__`'s and `Gemma2Config.__post_init__`'s `layer_types`).
fn pattern_windows(layers: usize, pattern: usize, window: usize) -> Vec<Option<usize>> {
    (0..layers).map(|l| ((l + 1) % pattern != 0).then_some(window)).collect()
}
