//! `DecoderConfig::from_hf_config` against config.json files written as transformers writes them.

use loupe_tensor::ops::{RopeScaling, RouterScoring};

use super::*;

fn hf(json: &str) -> Result<DecoderConfig, ModelError> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.json");
    std::fs::write(&path, json).unwrap();
    DecoderConfig::from_hf_config(&path)
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
    assert_eq!((g.layer_windows.clone(), g.rope_local_theta, g.rope_theta), (vec![Some(4096), None], None, 10000.0));
    assert_eq!(g.attention_scale, (24f64).powf(-0.5) as f32);
    assert!(
        g.family.sandwich_norms() && g.family.norm_unit_offset() && g.family.scales_embedding() && !g.family.qk_norm()
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
        let e = hf(&format!(r#"{{"architectures": ["Gemma2ForCausalLM"], "{key}": {value}, {BASE}}}"#)).unwrap_err();
        assert!(matches!(&e, ModelError::InvalidConfig { field, .. } if field == key), "{key}: {e}");
    }
    // Gemma 3 has none unless configured; Llama has no soft-capping at all.
    let g3 = hf(&format!(r#"{{"architectures": ["Gemma3ForCausalLM"], "sliding_window": 8, {BASE}}}"#)).unwrap();
    assert_eq!((g3.attn_logit_softcap, g3.final_logit_softcap), (None, None));
    let g3 = hf(&format!(
        r#"{{"architectures": ["Gemma3ForCausalLM"], "sliding_window": 8, "final_logit_softcapping": 30.0, {BASE}}}"#
    ))
    .unwrap();
    assert_eq!(g3.final_logit_softcap, Some(30.0));
    let e = hf(&format!(r#"{{"architectures": ["LlamaForCausalLM"], "attn_logit_softcapping": 50.0, {BASE}}}"#))
        .unwrap_err()
        .to_string();
    assert!(e.contains("attn_logit_softcapping"), "{e}");
    assert!(
        hf(&format!(r#"{{"architectures": ["LlamaForCausalLM"], "final_logit_softcapping": null, {BASE}}}"#)).is_ok()
    );
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
            (m.router.scoring, m.router.n_experts, m.router.top_k, m.router.norm_topk_prob, m.sparse_layers.clone()),
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
    let e =
        hf(&format!(r#"{{"architectures": ["Qwen3MoeForCausalLM"], "num_experts": 1, {MOE}, {BASE}}}"#)).unwrap_err();
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
        (long(r#", "rope_type": "linear""#).replacen(r#""rope_type": "longrope", "#, "", 1), "rope_scaling.rope_type"),
        (long("").replace(&six(4.0), "[4.0, 4.0]"), "rope_scaling.long_factor"),
        (long("").replace(&six(1.5), "[1, 1, 1, 1, 1, \"x\"]"), "rope_scaling.short_factor"),
        (long("").replace("0.75", "0.1"), "rope_parameters.partial_rotary_factor"),
        (long("").replace("0.75", "1.5"), "rope_parameters.partial_rotary_factor"),
        (
            long("").replace(r#""original_max_position_embeddings": 16"#, r#""original_max_position_embeddings": 1"#),
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

/// Seed-OSS as `SeedOssConfig` reads config.json: q/k/v biases unless `attention_bias` is
/// false, o_proj's only under `attention_out_bias`, head_dim 128 when absent.
#[test]
fn seed_oss_reads_its_bias_keys_and_head_dim() {
    let s = hf(&format!(r#"{{"architectures": ["SeedOssForCausalLM"], {BASE}}}"#)).unwrap();
    assert_eq!((s.family, s.qkv_bias, s.o_bias, s.head_dim), (Family::SeedOss, true, false, 128));
    let s = hf(&format!(
        r#"{{"model_type": "seed_oss", "attention_bias": false, "attention_out_bias": true, "head_dim": 16, {BASE}}}"#
    ))
    .unwrap();
    assert_eq!((s.qkv_bias, s.o_bias, s.head_dim), (false, true, 16));
}

/// Hunyuan-MoE as `HunYuanMoEV1Config` and its modules read config.json: every layer sparse,
/// one expert and top-1 by default, experts and the shared MLP `intermediate_size` wide, the
/// router always renormalized; `moe_topk` may be one value per layer; q/k norms after RoPE
/// (wiring, not `qk_norm`); `dynamic` RoPE with an `alpha` is a fixed base of
/// `rope_theta * alpha^(hd / (hd - 2))`; what transformers cannot build is refused by name.
#[test]
fn hunyuan_moe_reads_its_expert_and_rope_keys() {
    let hy = |extra: &str| {
        hf(&format!(r#"{{"architectures": ["HunYuanMoEV1ForCausalLM"], {extra} "head_dim": 16, {BASE}}}"#))
    };
    let c = hy("").unwrap();
    let moe = c.moe.clone().unwrap();
    assert_eq!((c.family, c.qk_norm, c.rms_norm_eps, c.rope_theta), (Family::HunyuanMoe, false, 1e-5, 10000.0));
    assert_eq!((moe.router.n_experts, moe.router.top_k, moe.router.norm_topk_prob), (1, 1, true));
    assert_eq!(
        (moe.moe_intermediate_size, moe.shared_intermediate_size, moe.sparse_layers),
        (128, Some(128), vec![true, true])
    );
    let w = c.wiring();
    assert!(
        w.qk_norm_after_rope && !w.qk_norm && w.moe.is_some_and(|m| m.shared_mlp && m.router_wg && m.shared_experts)
    );
    let c = hy(r#""num_experts": 8, "moe_topk": [2, 2, 3], "moe_intermediate_size": [7, 7], "rope_parameters": {"rope_type": "dynamic", "alpha": 1000.0, "factor": 1.0, "rope_theta": 10000.0},"#).unwrap();
    let moe = c.moe.clone().unwrap();
    assert_eq!((moe.router.n_experts, moe.router.top_k, moe.router.scoring), (8, 2, RouterScoring::Softmax));
    assert_eq!(c.rope_scaling, RopeScaling::None);
    assert_eq!(c.rope_theta, (10000.0 * 1000f64.powf(16.0 / 14.0)) as f32);
    // The attribute-map names, and Llama's RoPE types.
    let c = hy(r#""num_local_experts": 4, "num_experts_per_tok": 2, "rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0},"#).unwrap();
    assert_eq!(
        (c.moe.as_ref().unwrap().router.top_k, c.rope_scaling.clone()),
        (2, RopeScaling::Linear { factor: 2.0 })
    );
    for (extra, field) in [
        (r#""num_experts": [8, 8],"#, "num_experts"),
        (r#""num_experts": 8, "moe_topk": [2, 1],"#, "moe_topk"),
        (r#""num_experts": 8, "moe_topk": [2],"#, "moe_topk"),
        (r#""num_experts": 2, "moe_topk": 3,"#, "moe_topk"),
        (r#""rope_parameters": {"rope_type": "dynamic", "factor": 2.0},"#, "rope_scaling.rope_type"),
        (r#""rope_parameters": {"rope_type": "dynamic", "alpha": -1.0},"#, "rope_parameters.alpha"),
    ] {
        let e = hy(extra).unwrap_err();
        assert!(matches!(&e, ModelError::InvalidConfig { field: f, .. } if f == field), "{extra}: {e}");
    }
}

#[test]
fn unsupported_features_are_refused_by_name() {
    let e = hf(&format!(r#"{{"architectures": ["GPTNeoXForCausalLM"], {BASE}}}"#)).unwrap_err().to_string();
    assert!(e.contains("GPTNeoXForCausalLM") && e.contains("Qwen2ForCausalLM"), "{e}");
}
