//! Model families: one descriptor ([`FamilySpec`]) per family, the single table every
//! family-dependent decision reads (config readers, weight names, the graph builders, the
//! server's parser defaults).
//!
//! A family's traits are data here: its names (transformers' `model_type`, config.json
//! `architectures`, GGUF `general.architecture`), its norms, activation, RoPE rules,
//! attention variants (biases, q/k norms, windows, soft-capping, score scale), MoE routing
//! and parser defaults. What cannot be data (parsing a family's MoE keys, its window
//! rules) matches on the rule enums below, exhaustively, so a new rule must be handled
//! where it is read. [`Family::spec`] is an exhaustive match too: a new variant does not
//! compile until it has a descriptor.

use crate::roles::Wiring;

/// The model families loupe builds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Family {
    Llama,
    /// Llama with biases on q/k/v (not on o_proj; `modeling_qwen2.py`, `Qwen2Attention`) and,
    /// in GGUF, q/k rows stored unpermuted (llama.cpp runs Qwen2 with NeoX-style RoPE, so its
    /// converter does not apply `LlamaModel.permute`).
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
    /// absolute position embeddings; its own config ([`crate::bert::BertConfig`]) and
    /// builder ([`crate::bert::build_bert`]).
    Bert,
    /// Qwen3-MoE (`modeling_qwen3_moe.py`): Qwen3's attention (q/k norms) with sparse MoE
    /// MLPs: a softmax top-k router (`mlp.gate`) over `num_experts` SwiGLU experts, on the
    /// layers `decoder_sparse_step` / `mlp_only_layers` make sparse.
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
    /// Seed-OSS (`modeling_seed_oss.py`, ByteDance Seed): Llama with q/k/v biases on by default
    /// (`attention_bias`) and o_proj's bias under its own key (`attention_out_bias`), and a
    /// head_dim of 128 unless config.json says otherwise.
    SeedOss,
    /// Hunyuan's MoE decoder (`modeling_hunyuan_v1_moe.py`, `HunYuanMoEV1ForCausalLM`): Llama
    /// attention with per-head RMSNorms of q and k after RoPE (`query_layernorm`,
    /// `key_layernorm`), and a sparse MLP on every layer: a softmax top-k router
    /// (`mlp.gate.wg`) over `num_experts` experts plus a shared MLP (`mlp.shared_mlp`), all
    /// of `intermediate_size`; RoPE may stretch its base by a fixed NTK `alpha`.
    HunyuanMoe,
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

/// Which builder a family's graph comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Builder {
    /// [`crate::decoder::build_decoder`] from a [`crate::config::DecoderConfig`].
    Decoder,
    /// [`crate::bert::build_bert`] from a [`crate::bert::BertConfig`]: every token sees every
    /// other; the output is hidden states, not logits.
    BertEncoder,
}

/// How a family's norms scale.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Norm {
    /// RMSNorm times `weight` (Llama).
    Rms,
    /// RMSNorm times `1 + weight` (Gemma's `Gemma3RMSNorm`).
    RmsUnitOffset,
    /// LayerNorm with weight and bias (BERT).
    Layer,
}

/// Whether a projection has a bias in a config.json checkpoint (a GGUF has the tensor or not).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bias {
    Never,
    Always,
    /// As the boolean config.json `key` says; `default` when absent (the config class's
    /// default, which `save_pretrained` leaves out).
    Config {
        key: &'static str,
        default: bool,
    },
}

/// Llama's `attention_bias` (off by default), which most families read for their projections.
pub const ATTENTION_BIAS: Bias = Bias::Config { key: "attention_bias", default: false };

/// Whether q and k go through per-head RMSNorms, before RoPE unless said otherwise.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QkNorm {
    Never,
    Always,
    /// When this config.json key is `true` (GLM-4-MoE's `use_qk_norm`).
    ConfigFlag(&'static str),
    /// Always, after RoPE, as `self_attn.query_layernorm` / `key_layernorm`
    /// (`HunYuanMoEV1Attention.forward` norms the rotated q and k).
    AfterRope,
}

/// Which decoder layers attend through a sliding window, and how the sources say so.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Windows {
    /// Full causal attention on every layer.
    Never,
    /// `sliding_window` (an integer, or null/absent for none) on every layer (Mistral;
    /// Phi-3's `create_sliding_window_causal_mask`).
    EveryLayer,
    /// Only with `use_sliding_window`, on the layers `layer_types` marks
    /// `sliding_attention` (transformers' default: layers from `max_window_layers` on) (Qwen).
    OptIn,
    /// Always: every `every`-th layer global, the others windowed, unless `layer_types` says
    /// otherwise (Gemma); `sliding_window` defaults to `default_window`, and `pattern_key`
    /// (when the family has one) overrides `every`. A GGUF states the window as
    /// `<arch>.attention.sliding_window` and the pattern is assumed, as llama.cpp does.
    Pattern { every: usize, default_window: usize, pattern_key: Option<&'static str> },
}

/// Soft-capping of attention scores and final logits.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Softcap {
    /// The family's transformers code has none: a configured cap is refused by name.
    Refused,
    /// Read from `attn_logit_softcapping` / `final_logit_softcapping` (null: off); an absent
    /// key takes these defaults (`None`: off).
    Optional { attn_default: Option<f32>, final_default: Option<f32> },
}

/// The factor applied to q.k before the softmax.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum AttentionScale {
    /// head_dim^-0.5.
    HeadDim,
    /// `query_pre_attn_scalar`^-0.5 (Gemma; `default` when absent). A GGUF does not carry the
    /// key: llama.cpp uses head_dim, except for models of `gguf_hidden_per_head_layers`
    /// layers (Gemma 2 27B: 46), where it uses hidden_size / heads.
    QueryPreAttnScalar { default: f32, gguf_hidden_per_head_layers: Option<usize> },
}

/// Whether RoPE may turn only part of each head (`partial_rotary_factor`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum PartialRotary {
    /// A factor below 1 is refused by name.
    Refused,
    /// `int(head_dim * factor)` leading elements turn (Phi-3).
    Supported,
    /// The family's default is partial (`default`), which loupe does not build: only 1.0 is
    /// accepted (GLM-4-MoE).
    WholeOnly { default: f64 },
}

/// How config.json's RoPE scaling entry is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeScalingRule {
    /// `default`, `linear` or `llama3`.
    Standard,
    /// Phi-3's `default` or `longrope` (`su`, `yarn`: old names), switching at the top-level
    /// `original_max_position_embeddings` (`default_original` when absent).
    LongRope { default_original: usize },
    /// Standard, plus Hunyuan's NTK-alpha: `dynamic` with an `alpha` stretches the base to
    /// `rope_theta * alpha^(head_dim / (head_dim - 2))`, independent of the sequence length
    /// (`HunYuanMoEV1RotaryEmbedding.compute_ntk_alpha_rope_parameters`).
    NtkAlpha,
}

/// A family's RoPE.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RopeSpec {
    /// `rope_theta` when config.json has none (a GGUF without `rope.freq_base` takes 10000).
    pub hf_default_theta: f32,
    /// Sliding-window layers rotate with their own unscaled base, this one by default
    /// (Gemma 3's `rope_local_base_freq`; config.json may key `rope_parameters` by layer
    /// type, `full_attention` / `sliding_attention`); `None`: one base for every layer.
    pub local_theta: Option<f32>,
    pub partial: PartialRotary,
    pub scaling: RopeScalingRule,
}

/// The MoE routing a family's sparse layers use (which keys config.json has for it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MoeRouting {
    /// Qwen3-MoE: softmax top-k over `num_experts`, sparse every `decoder_sparse_step`-th
    /// layer except `mlp_only_layers`, no shared experts.
    SoftmaxTopK,
    /// GLM-4-MoE (DeepSeek-V3's router): grouped sigmoid scores with a correction bias,
    /// `n_shared_experts` shared experts, sparse from `first_k_dense_replace` on.
    GroupedSigmoid,
    /// Hunyuan (`HunYuanMoEV1Moe`): every layer sparse; a softmax top-k router, always
    /// renormalized, over `num_experts` experts of `intermediate_size` (one number: the
    /// experts module reads no list), top-k `moe_topk` (a number or one per layer), its linear
    /// at `mlp.gate.wg`; plus a shared MLP of `intermediate_size` at `mlp.shared_mlp`.
    SoftmaxSharedMlp,
}

/// How a family is stored in GGUF.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GgufSpec {
    /// `general.architecture` values read as this family (empty: none; loupe reads no GGUF
    /// of the family).
    pub archs: &'static [&'static str],
    /// Whether llama.cpp's converter permuted the rows of q/k (weights and biases) for its
    /// interleaved RoPE (convert_hf_to_gguf.py: `LlamaModel.permute`); NeoX-RoPE families
    /// (Qwen2) are stored as Hugging Face has them.
    pub permutes_qk: bool,
    /// Whether `loupe quantize` converts a config.json checkpoint of the family to GGUF
    /// ([`crate::convert`]), writing `archs[0]`.
    pub converted: bool,
}

/// Everything loupe knows about a family. One `const` per family below; [`Family::spec`]
/// maps each variant to its own.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FamilySpec {
    pub family: Family,
    /// transformers' `model_type` (config.json's fallback without `architectures`).
    pub model_type: &'static str,
    /// A human name for messages.
    pub display: &'static str,
    /// config.json `architectures` entries built as this family.
    pub hf_archs: &'static [&'static str],
    pub gguf: GgufSpec,
    pub builder: Builder,
    pub norm: Norm,
    /// Gemma's four norms per layer: `post_attention_layernorm` normalizes attention's
    /// output before the residual add, `pre_feedforward_layernorm` is the MLP's input norm
    /// and `post_feedforward_layernorm` normalizes the MLP's output.
    pub sandwich_norms: bool,
    /// Whether the embedding output is multiplied by sqrt(hidden_size)
    /// (`Gemma3TextScaledWordEmbedding`).
    pub scales_embedding: bool,
    /// config.json's key naming the MLP activation (Gemma: `hidden_activation`).
    pub act_key: &'static str,
    /// The MLP activation when the source names none (a GGUF never names it).
    pub default_act: HiddenAct,
    /// Biases of the q/k/v projections and of o_proj.
    pub qkv_bias: Bias,
    pub o_bias: Bias,
    pub qk_norm: QkNorm,
    /// Whether q/k/v are one fused `qkv_proj` matmul and gate/up one `gate_up_proj`, each
    /// split into its parts after the matmul (Phi-3).
    pub fused_projections: bool,
    pub windows: Windows,
    pub softcap: Softcap,
    pub attention_scale: AttentionScale,
    pub rope: RopeSpec,
    /// `None`: every MLP is dense.
    pub moe: Option<MoeRouting>,
    /// config.json defaults of the family's config class for keys `save_pretrained` may
    /// leave out.
    pub default_rms_norm_eps: f32,
    pub default_max_positions: usize,
    /// `head_dim` when absent; `None`: hidden_size / num_attention_heads.
    pub default_head_dim: Option<usize>,
    /// A config.json key whose `true` is refused as loupe builds causal decoders only
    /// (Gemma's `use_bidirectional_attention`).
    pub causal_only_key: Option<&'static str>,
    /// The reasoning parser `loupe serve` uses by default (one of
    /// `loupe_text::REASONING_PARSERS`): the thinking markers of the family's chat template.
    pub reasoning_parser: &'static str,
}

/// The traits most decoders share (Llama's); families state what differs.
const LLAMA: FamilySpec = FamilySpec {
    family: Family::Llama,
    model_type: "llama",
    display: "Llama",
    hf_archs: &["LlamaForCausalLM"],
    gguf: GgufSpec { archs: &["llama"], permutes_qk: true, converted: true },
    builder: Builder::Decoder,
    norm: Norm::Rms,
    sandwich_norms: false,
    scales_embedding: false,
    act_key: "hidden_act",
    default_act: HiddenAct::Silu,
    qkv_bias: ATTENTION_BIAS,
    o_bias: ATTENTION_BIAS,
    qk_norm: QkNorm::Never,
    fused_projections: false,
    windows: Windows::Never,
    softcap: Softcap::Refused,
    attention_scale: AttentionScale::HeadDim,
    rope: RopeSpec {
        hf_default_theta: 10000.0,
        local_theta: None,
        partial: PartialRotary::Refused,
        scaling: RopeScalingRule::Standard,
    },
    moe: None,
    default_rms_norm_eps: 1e-6,
    default_max_positions: 2048,
    default_head_dim: None,
    causal_only_key: None,
    reasoning_parser: "none",
};

const QWEN2: FamilySpec = FamilySpec {
    family: Family::Qwen2,
    model_type: "qwen2",
    display: "Qwen2",
    hf_archs: &["Qwen2ForCausalLM"],
    gguf: GgufSpec { archs: &["qwen2"], permutes_qk: false, converted: true },
    qkv_bias: Bias::Always,
    o_bias: Bias::Never,
    windows: Windows::OptIn,
    ..LLAMA
};

const MISTRAL: FamilySpec = FamilySpec {
    family: Family::Mistral,
    model_type: "mistral",
    display: "Mistral",
    hf_archs: &["MistralForCausalLM"],
    // llama.cpp stores Mistral as `llama`; loupe reads those files as Llama.
    gguf: GgufSpec { archs: &[], permutes_qk: true, converted: false },
    o_bias: Bias::Never,
    windows: Windows::EveryLayer,
    ..LLAMA
};

const QWEN3: FamilySpec = FamilySpec {
    family: Family::Qwen3,
    model_type: "qwen3",
    display: "Qwen3",
    hf_archs: &["Qwen3ForCausalLM"],
    gguf: GgufSpec { archs: &["qwen3"], permutes_qk: false, converted: true },
    qk_norm: QkNorm::Always,
    windows: Windows::OptIn,
    reasoning_parser: "qwen3",
    ..LLAMA
};

/// Gemma 2's and 3's shared traits.
const GEMMA: FamilySpec = FamilySpec {
    norm: Norm::RmsUnitOffset,
    sandwich_norms: true,
    scales_embedding: true,
    act_key: "hidden_activation",
    default_act: HiddenAct::GeluTanh,
    attention_scale: AttentionScale::QueryPreAttnScalar { default: 256.0, gguf_hidden_per_head_layers: None },
    causal_only_key: Some("use_bidirectional_attention"),
    ..LLAMA
};

/// `Gemma2Config`'s and `Gemma3TextConfig`'s `sliding_window` when config.json has none.
pub const GEMMA_DEFAULT_SLIDING_WINDOW: usize = 4096;

const GEMMA3: FamilySpec = FamilySpec {
    family: Family::Gemma3,
    model_type: "gemma3_text",
    display: "Gemma 3",
    hf_archs: &["Gemma3ForCausalLM"],
    gguf: GgufSpec { archs: &["gemma3"], permutes_qk: false, converted: false },
    qk_norm: QkNorm::Always,
    // Every sixth layer is global (`Gemma3TextConfig._sliding_window_pattern`; llama.cpp's
    // `set_swa_pattern(6)`).
    windows: Windows::Pattern {
        every: 6,
        default_window: GEMMA_DEFAULT_SLIDING_WINDOW,
        pattern_key: Some("sliding_window_pattern"),
    },
    softcap: Softcap::Optional { attn_default: None, final_default: None },
    rope: RopeSpec {
        hf_default_theta: 1_000_000.0,
        // `Gemma3TextConfig.default_theta["local"]`; llama.cpp hard-codes the same.
        local_theta: Some(10_000.0),
        partial: PartialRotary::Refused,
        scaling: RopeScalingRule::Standard,
    },
    ..GEMMA
};

const GEMMA2: FamilySpec = FamilySpec {
    family: Family::Gemma2,
    model_type: "gemma2",
    display: "Gemma 2",
    hf_archs: &["Gemma2ForCausalLM"],
    gguf: GgufSpec { archs: &["gemma2"], permutes_qk: false, converted: false },
    // Layers 0, 2, 4, ... slide (`Gemma2Config.__post_init__`; llama.cpp's `set_swa_pattern(2)`).
    windows: Windows::Pattern { every: 2, default_window: GEMMA_DEFAULT_SLIDING_WINDOW, pattern_key: None },
    // `Gemma2Config`'s defaults for absent keys (null turns each off).
    softcap: Softcap::Optional { attn_default: Some(50.0), final_default: Some(30.0) },
    attention_scale: AttentionScale::QueryPreAttnScalar { default: 256.0, gguf_hidden_per_head_layers: Some(46) },
    ..GEMMA
};

const BERT: FamilySpec = FamilySpec {
    family: Family::Bert,
    model_type: "bert",
    display: "BERT",
    hf_archs: &["BertModel"],
    gguf: GgufSpec { archs: &[], permutes_qk: false, converted: false },
    builder: Builder::BertEncoder,
    norm: Norm::Layer,
    default_act: HiddenAct::Gelu,
    qkv_bias: Bias::Always,
    o_bias: Bias::Always,
    default_rms_norm_eps: 1e-12,
    default_max_positions: 512,
    ..LLAMA
};

const QWEN3_MOE: FamilySpec = FamilySpec {
    family: Family::Qwen3Moe,
    model_type: "qwen3_moe",
    display: "Qwen3-MoE",
    hf_archs: &["Qwen3MoeForCausalLM"],
    gguf: GgufSpec { archs: &[], permutes_qk: false, converted: false },
    moe: Some(MoeRouting::SoftmaxTopK),
    // Qwen3-MoE checkpoints ship Qwen3's template and <think> markers.
    ..QWEN3
};

const GLM4_MOE: FamilySpec = FamilySpec {
    family: Family::Glm4Moe,
    model_type: "glm4_moe",
    display: "GLM-4-MoE",
    hf_archs: &["Glm4MoeForCausalLM"],
    gguf: GgufSpec { archs: &[], permutes_qk: false, converted: false },
    // `Glm4MoeAttention`: o_proj never has a bias.
    o_bias: Bias::Never,
    qk_norm: QkNorm::ConfigFlag("use_qk_norm"),
    rope: RopeSpec { partial: PartialRotary::WholeOnly { default: 0.5 }, ..LLAMA.rope },
    moe: Some(MoeRouting::GroupedSigmoid),
    ..LLAMA
};

const PHI3: FamilySpec = FamilySpec {
    family: Family::Phi3,
    model_type: "phi3",
    display: "Phi-3",
    hf_archs: &["Phi3ForCausalLM"],
    gguf: GgufSpec { archs: &[], permutes_qk: false, converted: false },
    // `Phi3Attention` ignores `attention_bias`.
    qkv_bias: Bias::Never,
    o_bias: Bias::Never,
    fused_projections: true,
    windows: Windows::EveryLayer,
    rope: RopeSpec {
        partial: PartialRotary::Supported,
        // transformers uses the config attribute (class default 4096), not a
        // `rope_scaling.original_max_position_embeddings`, for LongRoPE.
        scaling: RopeScalingRule::LongRope { default_original: 4096 },
        ..LLAMA.rope
    },
    // `Phi3Config`'s defaults.
    default_rms_norm_eps: 1e-5,
    default_max_positions: 4096,
    ..LLAMA
};

const SEED_OSS: FamilySpec = FamilySpec {
    family: Family::SeedOss,
    model_type: "seed_oss",
    display: "Seed-OSS",
    hf_archs: &["SeedOssForCausalLM"],
    gguf: GgufSpec { archs: &[], permutes_qk: false, converted: false },
    // `SeedOssConfig`'s defaults: q/k/v biases on, o_proj's off (`SeedOssAttention`).
    qkv_bias: Bias::Config { key: "attention_bias", default: true },
    o_bias: Bias::Config { key: "attention_out_bias", default: false },
    default_max_positions: 524_288,
    default_head_dim: Some(128),
    ..LLAMA
};

const HUNYUAN_MOE: FamilySpec = FamilySpec {
    family: Family::HunyuanMoe,
    model_type: "hunyuan_v1_moe",
    display: "Hunyuan-MoE",
    hf_archs: &["HunYuanMoEV1ForCausalLM"],
    gguf: GgufSpec { archs: &[], permutes_qk: false, converted: false },
    qk_norm: QkNorm::AfterRope,
    rope: RopeSpec { scaling: RopeScalingRule::NtkAlpha, ..LLAMA.rope },
    moe: Some(MoeRouting::SoftmaxSharedMlp),
    // `HunYuanMoEV1Config`'s defaults (attention_bias covers all four projections, as Llama's).
    default_rms_norm_eps: 1e-5,
    ..LLAMA
};

impl Family {
    /// Every family, in declaration order (the order of "supported" lists in messages).
    pub const ALL: [Family; 12] = [
        Family::Llama,
        Family::Qwen2,
        Family::Mistral,
        Family::Qwen3,
        Family::Gemma3,
        Family::Gemma2,
        Family::Bert,
        Family::Qwen3Moe,
        Family::Glm4Moe,
        Family::Phi3,
        Family::SeedOss,
        Family::HunyuanMoe,
    ];

    /// The family's descriptor.
    pub const fn spec(self) -> &'static FamilySpec {
        match self {
            Family::Llama => &LLAMA,
            Family::Qwen2 => &QWEN2,
            Family::Mistral => &MISTRAL,
            Family::Qwen3 => &QWEN3,
            Family::Gemma3 => &GEMMA3,
            Family::Gemma2 => &GEMMA2,
            Family::Bert => &BERT,
            Family::Qwen3Moe => &QWEN3_MOE,
            Family::Glm4Moe => &GLM4_MOE,
            Family::Phi3 => &PHI3,
            Family::SeedOss => &SEED_OSS,
            Family::HunyuanMoe => &HUNYUAN_MOE,
        }
    }

    /// The family of a GGUF `general.architecture`.
    pub fn from_gguf_arch(arch: &str) -> Option<Family> {
        Family::ALL.into_iter().find(|f| f.spec().gguf.archs.contains(&arch))
    }

    /// The GGUF `general.architecture` loupe writes and reads for the family, if any.
    pub fn gguf_arch(self) -> Option<&'static str> {
        self.spec().gguf.archs.first().copied()
    }

    /// The family of a config.json `architectures` entry.
    pub fn from_hf_arch(arch: &str) -> Option<Family> {
        Family::ALL.into_iter().find(|f| f.spec().hf_archs.contains(&arch))
    }

    /// The family of a config.json `model_type` (transformers' fallback without
    /// `architectures`).
    pub fn from_model_type(model_type: &str) -> Option<Family> {
        Family::ALL.into_iter().find(|f| f.spec().model_type == model_type)
    }

    /// The family a parsed config.json names: the first `architectures` entry loupe knows,
    /// else (no `architectures`) its `model_type`, as transformers loads it. `Err` carries
    /// what the config named, for the message.
    pub fn from_hf_json(v: &serde_json::Value) -> Result<Family, String> {
        use serde_json::Value;
        let archs: Vec<&str> = v
            .get("architectures")
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let model_type = v.get("model_type").and_then(Value::as_str);
        let family = if archs.is_empty() {
            model_type.and_then(Family::from_model_type)
        } else {
            archs.iter().find_map(|a| Family::from_hf_arch(a))
        };
        family
            .ok_or_else(|| if archs.is_empty() { model_type.unwrap_or("<none>").to_string() } else { archs.join(", ") })
    }

    /// Every config.json `architectures` entry loupe builds, comma-separated (for messages).
    pub fn supported_hf_archs() -> String {
        Family::ALL.iter().flat_map(|f| f.spec().hf_archs.iter().copied()).collect::<Vec<_>>().join(", ")
    }

    /// Every GGUF architecture loupe reads, comma-separated (for messages).
    pub fn supported_gguf_archs() -> String {
        Family::ALL.iter().flat_map(|f| f.spec().gguf.archs.iter().copied()).collect::<Vec<_>>().join(", ")
    }

    /// transformers' `model_type`.
    pub fn name(self) -> &'static str {
        self.spec().model_type
    }

    /// Whether the family is an encoder (every token sees every other; the output is hidden
    /// states, not logits).
    pub fn is_encoder(self) -> bool {
        self.spec().builder == Builder::BertEncoder
    }

    /// Whether q/k/v and gate/up are fused projections (Phi-3).
    pub fn fused_projections(self) -> bool {
        self.spec().fused_projections
    }

    /// Whether llama.cpp's converter permuted the rows of q/k for its interleaved RoPE.
    pub fn gguf_permutes_qk(self) -> bool {
        self.spec().gguf.permutes_qk
    }

    /// Whether q and k always go through per-head RMSNorms before RoPE (a family whose
    /// config decides, GLM-4-MoE's `use_qk_norm`, answers false: see
    /// [`crate::config::DecoderConfig::wiring`]).
    pub fn qk_norm(self) -> bool {
        self.spec().qk_norm == QkNorm::Always
    }

    /// Whether the family's config.json describes MoE MLPs.
    pub fn is_moe(self) -> bool {
        self.spec().moe.is_some()
    }

    /// Whether each layer has Gemma's four norms.
    pub fn sandwich_norms(self) -> bool {
        self.spec().sandwich_norms
    }

    /// Whether RMSNorms scale by `1 + weight` (Gemma's `Gemma3RMSNorm`) instead of `weight`.
    pub fn norm_unit_offset(self) -> bool {
        self.spec().norm == Norm::RmsUnitOffset
    }

    /// Whether the embedding output is multiplied by sqrt(hidden_size).
    pub fn scales_embedding(self) -> bool {
        self.spec().scales_embedding
    }

    /// The MLP activation when the source names none.
    pub fn default_hidden_act(self) -> HiddenAct {
        self.spec().default_act
    }

    /// Every how-many-th layer attends globally, the others through a sliding window, by
    /// default (Gemma); `None`: the family has no fixed pattern.
    pub fn window_pattern(self) -> Option<usize> {
        match self.spec().windows {
            Windows::Pattern { every, .. } => Some(every),
            Windows::Never | Windows::EveryLayer | Windows::OptIn => None,
        }
    }

    /// The reasoning parser `loupe serve` uses for the family unless told otherwise.
    pub fn default_reasoning_parser(self) -> &'static str {
        self.spec().reasoning_parser
    }

    /// What each decoder layer emits and how it is wired (without final soft-capping, which
    /// the config decides: [`crate::config::DecoderConfig::wiring`]).
    pub fn wiring(self) -> Wiring {
        Wiring {
            qk_norm: self.qk_norm(),
            qk_norm_after_rope: self.spec().qk_norm == QkNorm::AfterRope,
            sandwich_norms: self.sandwich_norms(),
            final_softcap: false,
            moe: None,
            fused_projections: self.fused_projections(),
        }
    }
}

impl std::fmt::Display for Family {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.spec().display)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `Family::ALL` lists every variant once, each descriptor is its own family's, and no
    /// name maps to two families. The match makes a new variant fail to compile here until
    /// it is placed in `ALL`.
    #[test]
    fn the_table_covers_every_family_once() {
        for (i, f) in Family::ALL.into_iter().enumerate() {
            let index = match f {
                Family::Llama => 0,
                Family::Qwen2 => 1,
                Family::Mistral => 2,
                Family::Qwen3 => 3,
                Family::Gemma3 => 4,
                Family::Gemma2 => 5,
                Family::Bert => 6,
                Family::Qwen3Moe => 7,
                Family::Glm4Moe => 8,
                Family::Phi3 => 9,
                Family::SeedOss => 10,
                Family::HunyuanMoe => 11,
            };
            assert_eq!(i, index, "{f:?} is out of place in Family::ALL");
            assert_eq!(f.spec().family, f);
            assert_eq!(Family::from_model_type(f.name()), Some(f));
            for a in f.spec().hf_archs {
                assert_eq!(Family::from_hf_arch(a), Some(f), "{a}");
            }
            for a in f.spec().gguf.archs {
                assert_eq!(Family::from_gguf_arch(a), Some(f), "{a}");
            }
            assert!(!f.spec().gguf.converted || f.gguf_arch().is_some(), "{f:?} is converted to no GGUF arch");
            assert!(loupe_text::REASONING_PARSERS.contains(&f.default_reasoning_parser()), "{f:?}");
        }
    }

    #[test]
    fn lookups_answer_as_the_old_tables() {
        assert_eq!(Family::supported_gguf_archs(), "llama, qwen2, qwen3, gemma3, gemma2");
        assert_eq!(Family::from_gguf_arch("mistral"), None);
        assert_eq!(Family::from_model_type("gemma3_text"), Some(Family::Gemma3));
        assert_eq!(Family::Qwen3Moe.default_reasoning_parser(), "qwen3");
        assert_eq!(Family::Phi3.default_reasoning_parser(), "none");
        assert!(Family::Mistral.gguf_permutes_qk() && !Family::Qwen3.gguf_permutes_qk());
        assert_eq!(Family::Gemma3.window_pattern(), Some(6));
        assert!(Family::Bert.is_encoder() && !Family::Llama.is_encoder());
    }
}
