//! Tensor names across tools: canonical forms, natural order, and the name families the
//! verdict reasons about (layer outputs, attention, logits).
//!
//! loupe and its PyTorch reference name values by Hugging Face module path
//! (ARCHITECTURE.md, invariant 1). Other tools add suffixes: MAX labels are
//! `<layer>-output`, `-output_<i>`, `-input_<i>` (docs/max-debugging-options.md); the
//! transformers model-addition debugger writes `<module>_outputs` / `_inputs`
//! (docs/dump-format.md). A module called twice is labelled `name(k)` by MAX's hooks.

use std::cmp::Ordering;

/// How a raw name relates to the module path it canonicalizes to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Canonical {
    /// The module path to pair on.
    pub name: String,
    /// Whether the raw name was already the module path (preferred on collisions).
    pub exact: bool,
}

/// The canonical form of a raw name: `X-output` and `X-output_0` (MAX) and `X_outputs`
/// (transformers debugger) become `X`; inputs and further outputs (`-input_0`,
/// `-output_1`, `_inputs`) keep their raw name, so they only pair with the same label.
pub fn canonical(raw: &str) -> Canonical {
    for suffix in ["-output", "-output_0", "_outputs"] {
        if let Some(base) = raw.strip_suffix(suffix) {
            if !base.is_empty() {
                return Canonical { name: base.to_string(), exact: false };
            }
        }
    }
    Canonical { name: raw.to_string(), exact: true }
}

/// A name carrying a repeated-call marker `(k)` (a hook that fired twice).
pub fn repeat_call_base(raw: &str) -> Option<String> {
    let open = raw.find('(')?;
    let close = open + raw[open..].find(')')?;
    let k = &raw[open + 1..close];
    if k.is_empty() || !k.bytes().all(|c| c.is_ascii_digit()) {
        return None;
    }
    Some(format!("{}{}", &raw[..open], &raw[close + 1..]))
}

/// llama.cpp eval-callback names (`cb(cur, "name", il)` in `src/llama-model.cpp`, printed
/// as `name-il`) mapped to module paths: the optional `llama.cpp` preset. Names that
/// llama.cpp gives to several nodes (`Qcur`, `Kcur`, `Vcur`: before and after RoPE) are
/// left out on purpose, so they stay unpaired rather than pair wrongly.
pub fn llama_cpp_name(raw: &str) -> Option<String> {
    match raw {
        "inp_embd" => return Some("model.embed_tokens".into()),
        "result_norm" => return Some("model.norm".into()),
        "result_output" => return Some("lm_head".into()),
        _ => {}
    }
    let (base, layer) = raw.rsplit_once('-')?;
    if layer.is_empty() || !layer.bytes().all(|c| c.is_ascii_digit()) {
        return None;
    }
    let sub = match base {
        "attn_norm" => "input_layernorm",
        "kqv_out" => "self_attn.attn_output",
        "ffn_inp" => "attn_residual",
        "ffn_norm" => "post_attention_layernorm",
        "ffn_up" => "mlp.up_proj",
        "ffn_gate" => "mlp.gate_proj",
        "ffn_silu" => "mlp.act_fn",
        "ffn_gate_par" => "mlp.act_mul",
        "ffn_out" => "mlp.down_proj",
        "l_out" => return Some(format!("model.layers.{layer}")),
        _ => return None,
    };
    Some(format!("model.layers.{layer}.{sub}"))
}

/// Natural order: digit runs compare as numbers, so `layers.2` sorts before `layers.10`.
pub fn natural_cmp(a: &str, b: &str) -> Ordering {
    let (mut x, mut y) = (a.as_bytes(), b.as_bytes());
    loop {
        match (x.first(), y.first()) {
            (None, None) => return a.cmp(b),
            (None, _) => return Ordering::Less,
            (_, None) => return Ordering::Greater,
            (Some(c), Some(d)) if c.is_ascii_digit() && d.is_ascii_digit() => {
                let nx = x.iter().take_while(|c| c.is_ascii_digit()).count();
                let ny = y.iter().take_while(|c| c.is_ascii_digit()).count();
                let (dx, dy) = (trim_zeros(&x[..nx]), trim_zeros(&y[..ny]));
                let ord = dx.len().cmp(&dy.len()).then_with(|| dx.cmp(dy));
                if ord != Ordering::Equal {
                    return ord;
                }
                x = &x[nx..];
                y = &y[ny..];
            }
            (Some(c), Some(d)) => {
                if c != d {
                    return c.cmp(d);
                }
                x = &x[1..];
                y = &y[1..];
            }
        }
    }
}

fn trim_zeros(d: &[u8]) -> &[u8] {
    let z = d.iter().take_while(|&&c| c == b'0').count();
    &d[z.min(d.len().saturating_sub(1))..]
}

/// The decoder layer a module path belongs to: `model.layers.3.mlp` -> 3.
pub fn layer_index(name: &str) -> Option<usize> {
    // `model.layers.N...`, or a BERT encoder's `encoder.layer.N...`.
    let rest = name.split("layers.").nth(1).or_else(|| name.split("encoder.layer.").nth(1))?;
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

/// Whether `name` is a whole layer's output (`model.layers.N`; a BERT encoder's
/// `encoder.layer.N`).
pub fn is_layer_output(name: &str) -> bool {
    name.strip_prefix("model.layers.")
        .or_else(|| name.strip_prefix("encoder.layer."))
        .is_some_and(|r| !r.is_empty() && r.bytes().all(|c| c.is_ascii_digit()))
}

/// Whether `name` is the embedding output.
pub fn is_embedding(name: &str) -> bool {
    name == "model.embed_tokens"
        || name.ends_with(".embed_tokens")
        || name == "post_embed"
        || name == "embeddings.word_embeddings"
}

/// Whether `name` holds logits.
pub fn is_logits_name(name: &str) -> bool {
    matches!(name, "lm_head" | "logits" | "last_logits") || name.ends_with(".lm_head") || name.ends_with("logits")
}

/// Whether `name` is an attention output that the token-0 invariant speaks about
/// (docs/parity-protocol.md, "The token-0 invariant").
pub fn is_attention_output(name: &str) -> bool {
    name.ends_with(".self_attn") || name.ends_with(".self_attn.o_proj") || name.ends_with(".self_attn.attn_output")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn canonical_forms() {
        assert_eq!(canonical("model.layers.0-output").name, "model.layers.0");
        assert_eq!(canonical("model.layers.0-output_0").name, "model.layers.0");
        assert_eq!(canonical("model.layers.0.mlp_outputs").name, "model.layers.0.mlp");
        assert!(!canonical("model.layers.0_outputs").exact);
        assert_eq!(canonical("model.layers.0-output_1").name, "model.layers.0-output_1");
        assert_eq!(canonical("model.layers.0-input_0").name, "model.layers.0-input_0");
        assert!(canonical("lm_head").exact);
        assert_eq!(canonical("-output").name, "-output");
    }

    #[test]
    fn bert_layers_and_embeddings() {
        assert!(is_layer_output("encoder.layer.3"));
        assert!(!is_layer_output("encoder.layer.3.output"));
        assert!(!is_layer_output("encoder.layer."));
        assert_eq!(layer_index("encoder.layer.11.attention.self.query"), Some(11));
        assert_eq!(layer_index("model.layers.4.mlp"), Some(4));
        assert!(is_embedding("embeddings.word_embeddings"));
        assert!(!is_embedding("embeddings.position_embeddings"));
    }

    #[test]
    fn repeated_calls_and_llama_cpp() {
        assert_eq!(repeat_call_base("model.layers.0.mlp(1)-output").as_deref(), Some("model.layers.0.mlp-output"));
        assert_eq!(repeat_call_base("model.layers.0.mlp"), None);
        assert_eq!(repeat_call_base("f(x)"), None);
        assert_eq!(llama_cpp_name("l_out-12").as_deref(), Some("model.layers.12"));
        assert_eq!(llama_cpp_name("ffn_out-0").as_deref(), Some("model.layers.0.mlp.down_proj"));
        assert_eq!(llama_cpp_name("Qcur-0"), None);
        assert_eq!(llama_cpp_name("result_output").as_deref(), Some("lm_head"));
    }

    #[test]
    fn natural_order() {
        let mut v = vec![
            "model.layers.10",
            "model.layers.2",
            "model.layers.1.mlp",
            "model.layers.1",
            "lm_head",
            "model.layers.02",
        ];
        v.sort_by(|a, b| natural_cmp(a, b));
        assert_eq!(
            v,
            ["lm_head", "model.layers.1", "model.layers.1.mlp", "model.layers.02", "model.layers.2", "model.layers.10"]
        );
        assert_eq!(layer_index("model.layers.17.self_attn.q_proj"), Some(17));
        assert!(is_layer_output("model.layers.3") && !is_layer_output("model.layers.3.mlp"));
    }
}
