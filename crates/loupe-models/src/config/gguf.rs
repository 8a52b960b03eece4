//! [`DecoderConfig`] from GGUF metadata: llama.cpp's `<arch>.*` keys, with what a GGUF does
//! not state taken from the family's descriptor.

use loupe_formats::GgufFile;
use loupe_tensor::ops::RopeScaling;

use super::{pattern_windows, valid_softcap, DecoderConfig};
use crate::error::ModelError;
use crate::family::{AttentionScale, Family, QkNorm, Softcap, Windows};

impl DecoderConfig {
    /// Reads the config from GGUF metadata. `vocab_size` falls back to the tokenizer's
    /// token count, as llama.cpp does.
    pub fn from_gguf(gguf: &GgufFile) -> Result<DecoderConfig, ModelError> {
        let arch = gguf.architecture()?;
        let Some(family) = Family::from_gguf_arch(arch) else {
            return Err(ModelError::UnsupportedArchitecture {
                path: gguf.path.clone(),
                arch: arch.to_string(),
                supported: Family::supported_gguf_archs(),
            });
        };
        let spec = family.spec();
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
        let (caps, attn_default, final_default) = match spec.softcap {
            Softcap::Optional { attn_default, final_default } => (true, attn_default, final_default),
            Softcap::Refused => (false, None, None),
        };
        let softcap = |k: &str, default: Option<f32>| -> Result<Option<f32>, ModelError> {
            let field = key(k);
            let cap = if caps { gguf.opt_f32(&field)?.or(default) } else { None };
            match cap {
                Some(c) if !valid_softcap(c) => Err(ModelError::InvalidConfig {
                    source_file: gguf.path.clone(),
                    field,
                    reason: format!("{c} is not a positive soft-cap"),
                }),
                c => Ok(c),
            }
        };
        let cfg = DecoderConfig {
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
            hidden_act: spec.default_act,
            // Gemma's `query_pre_attn_scalar` is not in the file; llama.cpp uses head_dim
            // except for the 27B models (Gemma 2 27B: 46 layers, hidden / heads = 144), and
            // transformers' default is 256, the head_dim of the other sizes.
            attention_scale: match spec.attention_scale {
                AttentionScale::QueryPreAttnScalar { gguf_hidden_per_head_layers: Some(n), .. }
                    if num_hidden_layers == n =>
                {
                    ((hidden_size / num_attention_heads) as f32).powf(-0.5)
                }
                AttentionScale::QueryPreAttnScalar { .. } | AttentionScale::HeadDim => (head_dim as f32).powf(-0.5),
            },
            rope_local_theta: spec.rope.local_theta,
            attn_logit_softcap: softcap("attn_logit_softcapping", attn_default)?,
            final_logit_softcap: softcap("final_logit_softcapping", final_default)?,
            // A GGUF states no `use_qk_norm`: only families that always have q/k norms.
            qk_norm: spec.qk_norm == QkNorm::Always,
            // No MoE family has a GGUF architecture here (`FamilySpec::gguf`).
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
}

/// Each layer's attention window from GGUF metadata: a family with a window pattern
/// ([`Windows::Pattern`], Gemma) has `<arch>.attention.sliding_window` on the layers of its
/// pattern (five of every six in Gemma 3, every other in Gemma 2), as llama.cpp and
/// transformers' GGUF loader both assume; the other GGUF families here use full attention.
fn gguf_layer_windows(gguf: &GgufFile, family: Family) -> Result<Vec<Option<usize>>, ModelError> {
    let pattern = match family.spec().windows {
        Windows::Pattern { every, .. } => every,
        Windows::Never | Windows::EveryLayer | Windows::OptIn => return Ok(Vec::new()),
    };
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
    Ok(pattern_windows(layers, pattern, window))
}
