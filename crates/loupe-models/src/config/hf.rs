//! [`DecoderConfig`] from a Hugging Face `config.json`, read as the family's transformers
//! config class reads it (its defaults for absent keys); what loupe does not build is
//! refused by name, never ignored.

use std::path::Path;

use loupe_tensor::ops::{RopeScaling, Router, RouterScoring};
use serde_json::Value;

use super::rope::{longrope_scaling, ntk_alpha_rope, rope_scaling_of, rotary_dim_of};
use super::{pattern_windows, valid_softcap, DecoderConfig, HiddenAct, MoeConfig};
use crate::error::ModelError;
use crate::family::{
    AttentionScale, Bias, Builder, Family, MoeRouting, PartialRotary, QkNorm, RopeScalingRule, Softcap, Windows,
};
use crate::roles::MAX_MOE_LAYERS;

/// Reads and parses a `config.json`; errors name the file.
pub fn read_config_json(path: &Path) -> Result<Value, ModelError> {
    let text = std::fs::read_to_string(path).map_err(|e| ModelError::Io { path: path.to_path_buf(), source: e })?;
    serde_json::from_str(&text).map_err(|e| ModelError::InvalidConfig {
        source_file: path.to_path_buf(),
        field: "config.json".into(),
        reason: e.to_string(),
    })
}

/// The family a parsed config.json (read from `path`) names ([`Family::from_hf_json`]);
/// a family loupe does not build is refused, listing those it does.
pub fn hf_family(v: &Value, path: &Path) -> Result<Family, ModelError> {
    Family::from_hf_json(v).map_err(|found| ModelError::UnsupportedArchitecture {
        path: path.to_path_buf(),
        arch: found,
        supported: Family::supported_hf_archs(),
    })
}

/// The `architectures` entries [`DecoderConfig::from_hf_config`] reads (for messages).
fn decoder_hf_archs() -> String {
    Family::ALL
        .iter()
        .filter(|f| f.spec().builder == Builder::Decoder)
        .flat_map(|f| f.spec().hf_archs.iter().copied())
        .collect::<Vec<_>>()
        .join(", ")
}

impl DecoderConfig {
    /// Reads a Hugging Face `config.json`.
    pub fn from_hf_config(path: &Path) -> Result<DecoderConfig, ModelError> {
        DecoderConfig::from_hf_json(&read_config_json(path)?, path)
    }

    /// Reads a parsed `config.json` (`path` names it in errors).
    pub fn from_hf_json(v: &Value, path: &Path) -> Result<DecoderConfig, ModelError> {
        let bad = |field: &str, reason: String| ModelError::InvalidConfig {
            source_file: path.to_path_buf(),
            field: field.to_string(),
            reason,
        };
        let family = hf_family(v, path)?;
        let spec = family.spec();
        match spec.builder {
            Builder::Decoder => {}
            Builder::BertEncoder => {
                return Err(ModelError::UnsupportedArchitecture {
                    path: path.to_path_buf(),
                    arch: format!("{} (an encoder, read as bert::BertConfig)", family.name()),
                    supported: decoder_hf_archs(),
                })
            }
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
        // Features the decoder graph does not build are refused by name, never ignored.
        // Gemma names the key `hidden_activation`; its `hidden_act` (if any) is unused.
        let act_key = spec.act_key;
        let hidden_act = match v.get(act_key).and_then(Value::as_str) {
            None => spec.default_act,
            Some("silu") => HiddenAct::Silu,
            Some("gelu_pytorch_tanh") => HiddenAct::GeluTanh,
            Some(other) => {
                return Err(bad(
                    act_key,
                    format!("'{other}' is not supported (loupe builds silu and gelu_pytorch_tanh)"),
                ))
            }
        };
        // Soft-capping: families that have it (Gemma 2 and 3) apply it when the key is a
        // number, not when it is null; an absent key takes the config class's default
        // (Gemma2Config: 50 and 30; Gemma3TextConfig: none). Other families' transformers
        // code has no soft-capping.
        let (caps, attn_default, final_default) = match spec.softcap {
            Softcap::Optional { attn_default, final_default } => (true, attn_default, final_default),
            Softcap::Refused => (false, None, None),
        };
        let softcap = |k: &str, default: Option<f32>| -> Result<Option<f32>, ModelError> {
            match v.get(k) {
                None => Ok(default),
                Some(Value::Null) => Ok(None),
                Some(_) if !caps => {
                    Err(bad(k, format!("logit soft-capping is not part of the {} family", family.name())))
                }
                Some(x) => match x.as_f64().map(|c| c as f32) {
                    Some(c) if valid_softcap(c) => Ok(Some(c)),
                    _ => Err(bad(k, format!("{x} is not a positive number or null"))),
                },
            }
        };
        let attn_logit_softcap = softcap("attn_logit_softcapping", attn_default)?;
        let final_logit_softcap = softcap("final_logit_softcapping", final_default)?;
        if let Some(key) = spec.causal_only_key {
            if v.get(key).and_then(Value::as_bool) == Some(true) {
                return Err(bad(key, "true is not supported (loupe builds causal decoders)".into()));
            }
        }
        if v.get("mlp_bias").and_then(Value::as_bool) == Some(true) {
            return Err(bad("mlp_bias", "true is not supported (loupe's Llama MLP has no biases)".into()));
        }
        let layers = usize_field("num_hidden_layers")?;
        let layer_windows = hf_layer_windows(v, family, layers).map_err(|(field, reason)| bad(field, reason))?;
        let bias = |rule: Bias| match rule {
            Bias::Never => false,
            Bias::Always => true,
            Bias::Config { key, default } => v.get(key).and_then(Value::as_bool).unwrap_or(default),
        };
        let hidden_size = usize_field("hidden_size")?;
        let num_attention_heads = usize_field("num_attention_heads")?;
        if num_attention_heads == 0 || hidden_size % num_attention_heads != 0 {
            return Err(bad(
                "num_attention_heads",
                format!("{num_attention_heads} heads do not divide hidden size {hidden_size}"),
            ));
        }
        // transformers 5 moves rope_theta/rope_scaling into `rope_parameters`; a family with a
        // local RoPE base (Gemma 3) keeps one entry per layer type there (`full_attention`,
        // `sliding_attention`).
        let rope_params = v.get("rope_parameters").or_else(|| v.get("rope_scaling")).filter(|x| !x.is_null());
        let (global_params, local_params) = match rope_params {
            Some(p)
                if spec.rope.local_theta.is_some()
                    && (p.get("full_attention").is_some() || p.get("sliding_attention").is_some()) =>
            {
                (p.get("full_attention").filter(|x| !x.is_null()), p.get("sliding_attention").filter(|x| !x.is_null()))
            }
            p => (p, None),
        };
        let default_theta = spec.rope.hf_default_theta;
        let rope_theta = match global_params.and_then(|p| p.get("rope_theta")).and_then(Value::as_f64) {
            Some(t) => t as f32,
            None => f32_field("rope_theta", default_theta)?,
        };
        let head_dim =
            opt_usize("head_dim")?.unwrap_or(spec.default_head_dim.unwrap_or(hidden_size / num_attention_heads));
        let max_position_embeddings = opt_usize("max_position_embeddings")?.unwrap_or(spec.default_max_positions);
        let moe = hf_moe(v, family, layers).map_err(|(field, reason)| bad(&field, reason))?;
        if let PartialRotary::WholeOnly { default } = spec.rope.partial {
            // The family rotates only the first `partial_rotary_factor` of each head by default
            // (GLM-4-MoE: 0.5, `Glm4MoeConfig.__post_init__`); loupe builds that for
            // `PartialRotary::Supported` families only so far, so it is refused before the
            // generic check below.
            let factor = match rope_params
                .and_then(|p| p.get("partial_rotary_factor"))
                .or_else(|| v.get("partial_rotary_factor"))
            {
                None | Some(Value::Null) => default,
                Some(x) => x.as_f64().ok_or_else(|| bad("partial_rotary_factor", format!("{x} is not a number")))?,
            };
            if factor != 1.0 {
                return Err(bad(
                    "partial_rotary_factor",
                    format!(
                        "{factor} is not supported (loupe rotates whole heads: only 1.0; {}'s default is {default})",
                        spec.display
                    ),
                ));
            }
        }
        let qk_norm = match spec.qk_norm {
            QkNorm::Never => false,
            QkNorm::Always => true,
            QkNorm::ConfigFlag(key) => v.get(key).and_then(Value::as_bool) == Some(true),
            // Norms after RoPE are the family's wiring (`Family::wiring`), not these.
            QkNorm::AfterRope => false,
        };
        let rotary_dim = rotary_dim_of(v, global_params, head_dim, family).map_err(|(k, reason)| bad(&k, reason))?;
        let (rope_scaling, rope_theta) = match (global_params, spec.rope.scaling) {
            (None, _) => (RopeScaling::None, rope_theta),
            (Some(p), RopeScalingRule::LongRope { default_original }) => (
                longrope_scaling(v, p, rotary_dim, max_position_embeddings, default_original)
                    .map_err(|(k, reason)| bad(&k, reason))?,
                rope_theta,
            ),
            (Some(p), RopeScalingRule::Standard) => {
                (rope_scaling_of(p).map_err(|(k, reason)| bad(&k, reason))?, rope_theta)
            }
            (Some(p), RopeScalingRule::NtkAlpha) => {
                ntk_alpha_rope(p, rope_theta, head_dim).map_err(|(k, reason)| bad(&k, reason))?
            }
        };
        let rope_local_theta = if let Some(default_local) = spec.rope.local_theta {
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
        let cfg = DecoderConfig {
            family,
            vocab_size: usize_field("vocab_size")?,
            hidden_size,
            intermediate_size: usize_field("intermediate_size")?,
            num_hidden_layers: usize_field("num_hidden_layers")?,
            num_attention_heads,
            num_key_value_heads: opt_usize("num_key_value_heads")?.unwrap_or(num_attention_heads),
            head_dim,
            rotary_dim,
            // The config class's default eps (save_pretrained leaves defaults out).
            rms_norm_eps: f32_field("rms_norm_eps", spec.default_rms_norm_eps)?,
            rope_theta,
            rope_scaling,
            max_position_embeddings,
            tie_word_embeddings: v.get("tie_word_embeddings").and_then(Value::as_bool).unwrap_or(false),
            qkv_bias: bias(spec.qkv_bias),
            o_bias: bias(spec.o_bias),
            layer_windows,
            hidden_act,
            attention_scale: match spec.attention_scale {
                AttentionScale::QueryPreAttnScalar { default, .. } => {
                    (f32_field("query_pre_attn_scalar", default)? as f64).powf(-0.5) as f32
                }
                AttentionScale::HeadDim => (head_dim as f32).powf(-0.5),
            },
            rope_local_theta,
            attn_logit_softcap,
            final_logit_softcap,
            qk_norm,
            moe,
        };
        cfg.validate(path)
    }
}

/// The MoE MLPs a config.json describes, as transformers reads it for the family's routing
/// ([`MoeRouting`]: `Qwen3MoeConfig`, `Glm4MoeConfig`, `HunYuanMoEV1Config` defaults for
/// absent keys); errors name the key. `None` for dense families.
fn hf_moe(v: &Value, family: Family, layers: usize) -> Result<Option<MoeConfig>, (String, String)> {
    let Some(routing) = family.spec().moe else { return Ok(None) };
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
    // Qwen3-MoE's and GLM's top-k and expert width (Hunyuan reads neither key).
    let top_k_and_width = || -> Result<(usize, usize), (String, String)> {
        let inter = int("moe_intermediate_size", None)?;
        if inter == 0 {
            return Err(("moe_intermediate_size".into(), "must be non-zero".into()));
        }
        Ok((int("num_experts_per_tok", Some(8))?, inter))
    };
    let mut top_k_key = "num_experts_per_tok";
    let (router, moe_intermediate_size, shared, bias, sparse_layers) = match routing {
        MoeRouting::SoftmaxTopK => {
            let (top_k, inter) = top_k_and_width()?;
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
            (router, inter, None, false, sparse)
        }
        MoeRouting::GroupedSigmoid => {
            let (top_k, moe_intermediate_size) = top_k_and_width()?;
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
                moe_intermediate_size,
                (shared > 0).then_some(moe_intermediate_size * shared),
                true,
                (0..layers).map(|l| l >= first).collect(),
            )
        }
        MoeRouting::SoftmaxSharedMlp => {
            let (n, top_k) = hunyuan_experts(v, layers)?;
            top_k_key = "moe_topk";
            // `HunYuanMoEV1Experts` and `HunYuanMoEV1MLP` (the shared expert) are both
            // `intermediate_size` wide; a `moe_intermediate_size` key is not read.
            let inter = int("intermediate_size", None)?;
            // `HunYuanMoEV1Gate.forward`: softmax, top-k, always renormalized.
            let router = Router {
                scoring: RouterScoring::Softmax,
                n_experts: n,
                top_k,
                n_group: 1,
                topk_group: 1,
                norm_topk_prob: true,
                scaling: 1.0,
            };
            // `HunYuanMoEV1DecoderLayer`: every layer's MLP is `HunYuanMoEV1Moe`.
            (router, inter, Some(inter), false, vec![true; layers])
        }
    };
    if sparse_layers.len() > MAX_MOE_LAYERS {
        return Err((
            "num_hidden_layers".into(),
            format!("{} layers; loupe's MoE wiring covers at most {}", sparse_layers.len(), MAX_MOE_LAYERS),
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
            top_k_key
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

/// Hunyuan's expert count and top-k (`HunYuanMoEV1Config`: `num_experts` / `moe_topk`, or
/// their attribute-map names `num_local_experts` / `num_experts_per_tok`; default 1 each).
/// `HunYuanMoEV1Gate` reads a list as one value per layer, but `HunYuanMoEV1Experts` builds
/// `num_experts` experts from a number only, so a list of expert counts is refused; a top-k
/// list is read when its entries for the model's layers are one value (loupe's router is the
/// same on every layer).
fn hunyuan_experts(v: &Value, layers: usize) -> Result<(usize, usize), (String, String)> {
    let read = |keys: [&str; 2], list_ok: bool| -> Result<usize, (String, String)> {
        let key = if v.get(keys[0]).is_some() { keys[0] } else { keys[1] };
        let one = |x: &Value| {
            x.as_u64()
                .map(|n| n as usize)
                .ok_or_else(|| (key.to_string(), format!("{x} is not a non-negative integer")))
        };
        match v.get(key) {
            None | Some(Value::Null) => Ok(1),
            Some(Value::Array(a)) if list_ok => {
                let per_layer = a
                    .get(..layers)
                    .ok_or_else(|| (key.to_string(), format!("{} entries for {layers} layers", a.len())))?;
                let values = per_layer.iter().map(one).collect::<Result<Vec<_>, _>>()?;
                let k = values.first().copied().unwrap_or(1);
                if values.iter().any(|&r| r != k) {
                    return Err((
                        key.to_string(),
                        format!("{values:?}: a top-k that differs between layers is not supported"),
                    ));
                }
                Ok(k)
            }
            Some(Value::Array(_)) => Err((
                key.to_string(),
                "a per-layer list is not supported (HunYuanMoEV1Experts builds one number of experts)".into(),
            )),
            Some(x) => one(x),
        }
    };
    Ok((read(["num_experts", "num_local_experts"], false)?, read(["moe_topk", "num_experts_per_tok"], true)?))
}

/// Each layer's attention window from a config.json, as transformers decides it for the
/// family's rule ([`Windows`]):
/// * `EveryLayer` (Mistral, Phi-3): `sliding_window` (an integer, or null for none) on every
///   layer;
/// * `OptIn` (Qwen2, Qwen3, Qwen3-MoE): only with `use_sliding_window`, on the layers
///   `layer_types` marks `sliding_attention` (transformers' default: layers from
///   `max_window_layers` on);
/// * `Pattern` (Gemma 2 and 3): always, on the layers `layer_types` marks, by default those
///   of the family's pattern (its `pattern_key`, Gemma 3's `sliding_window_pattern`,
///   overrides it), with a window of `sliding_window` (the family's default when absent);
/// * `Never` (Llama, GLM-4-MoE): none.
fn hf_layer_windows(v: &Value, family: Family, layers: usize) -> Result<Vec<Option<usize>>, (&'static str, String)> {
    let rule = family.spec().windows;
    let window = || -> Result<Option<usize>, (&'static str, String)> {
        match v.get("sliding_window") {
            None => Ok(match rule {
                Windows::Pattern { default_window, .. } => Some(default_window),
                Windows::Never | Windows::EveryLayer | Windows::OptIn => None,
            }),
            Some(Value::Null) => Ok(None),
            Some(w) => match w.as_u64() {
                Some(n) if n > 0 => Ok(Some(n as usize)),
                _ => Err(("sliding_window", format!("{w} is not a positive integer"))),
            },
        }
    };
    match rule {
        Windows::Never => Ok(Vec::new()),
        Windows::EveryLayer => Ok(match window()? {
            Some(w) => vec![Some(w); layers],
            None => Vec::new(),
        }),
        Windows::OptIn | Windows::Pattern { .. } => {
            let opt_in = rule == Windows::OptIn;
            if opt_in && v.get("use_sliding_window").and_then(Value::as_bool) != Some(true) {
                return Ok(Vec::new());
            }
            let Some(w) = window()? else {
                let why = if opt_in {
                    "null, but use_sliding_window is true"
                } else {
                    "null, but the family has sliding-window layers"
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
                None => match rule {
                    Windows::Pattern { every, pattern_key, .. } => {
                        let pattern = pattern_key
                            .and_then(|k| v.get(k))
                            .and_then(Value::as_u64)
                            .map_or(every, |p| p.max(1) as usize);
                        Ok(pattern_windows(layers, pattern, w))
                    }
                    Windows::Never | Windows::EveryLayer | Windows::OptIn => {
                        let from = v.get("max_window_layers").and_then(Value::as_u64).unwrap_or(layers as u64) as usize;
                        Ok((0..layers).map(|l| (l >= from).then_some(w)).collect())
                    }
                },
            }
        }
    }
}
