//! Tokenizer and chat template from a model file: GGUF `tokenizer.ggml.*` metadata, or an
//! HF checkpoint's `tokenizer.json` + `tokenizer_config.json`.

use loupe_formats::{GgufFile, GgufValue, GgufValueType};
use loupe_text::TokenizerSpec;

use crate::error::ModelError;

/// Collects the `tokenizer.*` keys of a GGUF file into a [`TokenizerSpec`]. The vocabulary,
/// scores, token types and merges are moved out of `gguf`'s metadata (`take_*`), so they are
/// held once: read the file's tokenizer once, before anything else needs them.
pub fn spec_from_gguf(gguf: &mut GgufFile) -> Result<TokenizerSpec, ModelError> {
    let tokens = gguf.take_str_array("tokenizer.ggml.tokens")?.unwrap_or_default();
    let scores = gguf.take_f32_array("tokenizer.ggml.scores")?;
    let token_types = gguf.take_i32_array("tokenizer.ggml.token_type")?;
    let merges = gguf.take_str_array("tokenizer.ggml.merges")?.unwrap_or_default();
    let gguf = &*gguf;
    let id = |k: &str| -> Result<Option<u32>, ModelError> { Ok(gguf.opt_u32(k)?) };
    let flag = |k: &str| -> Result<Option<bool>, ModelError> { Ok(gguf.opt_bool(k)?) };
    Ok(TokenizerSpec {
        model: gguf.get_str("tokenizer.ggml.model")?.to_string(),
        pre: gguf.opt_str("tokenizer.ggml.pre")?.map(str::to_string),
        tokens,
        scores,
        token_types,
        merges,
        bos_id: id("tokenizer.ggml.bos_token_id")?,
        eos_id: id("tokenizer.ggml.eos_token_id")?,
        unk_id: id("tokenizer.ggml.unknown_token_id")?,
        pad_id: id("tokenizer.ggml.padding_token_id")?,
        add_bos: flag("tokenizer.ggml.add_bos_token")?,
        add_eos: flag("tokenizer.ggml.add_eos_token")?,
        add_space_prefix: flag("tokenizer.ggml.add_space_prefix")?,
        chat_template: gguf.opt_str("tokenizer.chat_template")?.map(str::to_string),
        architecture: gguf.opt_str("general.architecture")?.map(str::to_string),
    })
}

/// The GGUF metadata of a [`TokenizerSpec`] ([`spec_from_gguf`]'s inverse): the
/// `tokenizer.ggml.*` keys and `tokenizer.chat_template`, each only where the spec has it
/// (`general.architecture` is the model's, not written here).
pub fn spec_to_gguf(spec: &TokenizerSpec) -> Vec<(String, GgufValue)> {
    let strings = |v: &[String]| {
        GgufValue::Array(GgufValueType::String, v.iter().map(|s| GgufValue::String(s.clone())).collect())
    };
    let mut out = vec![("tokenizer.ggml.model".to_string(), GgufValue::String(spec.model.clone()))];
    let mut put = |k: &str, v: Option<GgufValue>| {
        if let Some(v) = v {
            out.push((k.to_string(), v));
        }
    };
    put("tokenizer.ggml.pre", spec.pre.clone().map(GgufValue::String));
    put("tokenizer.ggml.tokens", Some(strings(&spec.tokens)));
    put(
        "tokenizer.ggml.scores",
        spec.scores
            .as_ref()
            .map(|s| GgufValue::Array(GgufValueType::F32, s.iter().map(|v| GgufValue::F32(*v)).collect())),
    );
    put(
        "tokenizer.ggml.token_type",
        spec.token_types
            .as_ref()
            .map(|t| GgufValue::Array(GgufValueType::I32, t.iter().map(|v| GgufValue::I32(*v)).collect())),
    );
    put("tokenizer.ggml.merges", (!spec.merges.is_empty()).then(|| strings(&spec.merges)));
    put("tokenizer.ggml.bos_token_id", spec.bos_id.map(GgufValue::U32));
    put("tokenizer.ggml.eos_token_id", spec.eos_id.map(GgufValue::U32));
    put("tokenizer.ggml.unknown_token_id", spec.unk_id.map(GgufValue::U32));
    put("tokenizer.ggml.padding_token_id", spec.pad_id.map(GgufValue::U32));
    put("tokenizer.ggml.add_bos_token", spec.add_bos.map(GgufValue::Bool));
    put("tokenizer.ggml.add_eos_token", spec.add_eos.map(GgufValue::Bool));
    put("tokenizer.ggml.add_space_prefix", spec.add_space_prefix.map(GgufValue::Bool));
    put("tokenizer.chat_template", spec.chat_template.clone().map(GgufValue::String));
    out
}
