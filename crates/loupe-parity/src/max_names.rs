//! MAX's `PrintHook` labels, recognized without a map file, so a MAX dump of a Llama-family
//! model pairs with a transformers or loupe dump.
//!
//! What MAX 26.7 names (tests/fixtures/max-26.7/hook, `max.nn.hooks.PrintHook` on a
//! `max.nn` model; the report of the Llama pipeline agrees):
//! - a `LayerList` holds its layers in `.layers`, so layer N is `model.layers.layers.N`;
//! - the head is `model.lm_head` (transformers: `lm_head`), and MAX's Llama runs `model.norm`
//!   and the head on the last token only (`[1, D]`, `[1, V]`);
//! - q, k and v are one fused `self_attn.qkv_proj` output, `[T, (H + 2 KV) * hd]`;
//! - the values a parity check needs that no MAX layer outputs are inputs of the next layer:
//!   `self_attn.o_proj-input_0` is the attention output (loupe's `self_attn.attn_output`)
//!   and `mlp.down_proj-input_0` the SwiGLU product (loupe's `mlp.act_mul`);
//! - the hook also prints the graph's inputs (`model-input_N`) and, in a pipeline, the
//!   sampler (`TopKSampler...`), which are not model values.

/// What one raw label is, for pairing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MaxLabel {
    /// Not a model value: left out of the pairing. The rule that says so.
    Ignored(&'static str),
    /// Known under `name` (a module path still carrying MAX's `-output` suffix, which the
    /// canonical form strips). `last_token`: MAX keeps only the last token's row.
    Renamed { name: String, last_token: bool, rules: Vec<&'static str> },
    /// The fused q/k/v projection of the attention module `attn` (`model.layers.N.self_attn`):
    /// split into `q_proj`, `k_proj`, `v_proj` by the other side's widths.
    FusedQkv { attn: String, rules: Vec<&'static str> },
}

pub const RULE_INPUTS: &str = "graph inputs `model-input_N` ignored";
pub const RULE_SAMPLER: &str = "sampler tensors `TopKSampler*` ignored";
pub const RULE_LAYER_LIST: &str = "`layers.layers.N` (a LayerList) is `layers.N`";
pub const RULE_HEAD: &str = "`model.lm_head` is `lm_head`";
pub const RULE_LAST_TOKEN: &str =
    "`model.norm` and `lm_head` hold the last token only: compared with the other side's last row";
pub const RULE_ATTN_OUT: &str = "`self_attn.o_proj-input_0` is the attention output `self_attn.attn_output`";
pub const RULE_ACT_MUL: &str = "`mlp.down_proj-input_0` is the SwiGLU product `mlp.act_mul`";
pub const RULE_QKV: &str = "`self_attn.qkv_proj` is split into `q_proj`, `k_proj`, `v_proj` by the other side's widths";

/// Classifies a raw name; `None` when no MAX rule applies.
pub fn classify(raw: &str) -> Option<MaxLabel> {
    if raw.starts_with("model-input_") {
        return Some(MaxLabel::Ignored(RULE_INPUTS));
    }
    if raw.starts_with("TopKSampler") {
        return Some(MaxLabel::Ignored(RULE_SAMPLER));
    }
    let mut rules = Vec::new();
    let mut name = raw.to_string();
    if name.contains("layers.layers.") {
        name = name.replacen("layers.layers.", "layers.", 1);
        rules.push(RULE_LAYER_LIST);
    }
    let (base, suffix) = match name.rfind(['-']) {
        Some(i) => (name[..i].to_string(), name[i..].to_string()),
        None => (name.clone(), String::new()),
    };
    let output = suffix == "-output" || suffix == "-output_0";
    if base.ends_with(".self_attn.qkv_proj") && output {
        rules.push(RULE_QKV);
        return Some(MaxLabel::FusedQkv { attn: base.trim_end_matches(".qkv_proj").to_string(), rules });
    }
    if suffix == "-input_0" {
        if let Some(attn) = base.strip_suffix(".o_proj").filter(|b| b.ends_with(".self_attn")) {
            rules.push(RULE_ATTN_OUT);
            return Some(MaxLabel::Renamed { name: format!("{attn}.attn_output"), last_token: false, rules });
        }
        if let Some(mlp) = base.strip_suffix(".down_proj").filter(|b| b.ends_with(".mlp")) {
            rules.push(RULE_ACT_MUL);
            return Some(MaxLabel::Renamed { name: format!("{mlp}.act_mul"), last_token: false, rules });
        }
    }
    let mut last_token = false;
    if output && base == "model.lm_head" {
        name = format!("lm_head{suffix}");
        rules.extend([RULE_HEAD, RULE_LAST_TOKEN]);
        last_token = true;
    } else if output && base == "model.norm" {
        rules.push(RULE_LAST_TOKEN);
        last_token = true;
    }
    (!rules.is_empty()).then_some(MaxLabel::Renamed { name, last_token, rules })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn renamed(raw: &str) -> (String, bool) {
        match classify(raw) {
            Some(MaxLabel::Renamed { name, last_token, .. }) => (name, last_token),
            other => panic!("{raw}: {other:?}"),
        }
    }

    #[test]
    fn maxs_llama_labels() {
        assert_eq!(renamed("model.layers.layers.3-output"), ("model.layers.3-output".into(), false));
        assert_eq!(renamed("model.layers.layers.3.mlp.down_proj-input_0").0, "model.layers.3.mlp.act_mul");
        assert_eq!(renamed("model.layers.layers.0.self_attn.o_proj-input_0").0, "model.layers.0.self_attn.attn_output");
        assert_eq!(renamed("model.lm_head-output"), ("lm_head-output".into(), true));
        assert_eq!(renamed("model.norm-output"), ("model.norm-output".into(), true));
        assert_eq!(
            classify("model.layers.layers.1.self_attn.qkv_proj-output"),
            Some(MaxLabel::FusedQkv {
                attn: "model.layers.1.self_attn".into(),
                rules: vec![RULE_LAYER_LIST, RULE_QKV]
            })
        );
        assert_eq!(classify("model-input_0"), Some(MaxLabel::Ignored(RULE_INPUTS)));
        assert_eq!(classify("TopKSampler-output_1"), Some(MaxLabel::Ignored(RULE_SAMPLER)));
        // Not MAX's: left to the other rules.
        assert_eq!(classify("model.layers.3.mlp"), None);
        assert_eq!(classify("model.norm"), None);
        assert_eq!(classify("model.layers.0-input_0"), None);
        assert_eq!(classify("model.ffn.down_proj-input_0"), None, "down_proj outside an mlp module");
    }
}
