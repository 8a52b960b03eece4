//! Tokenizer and chat template from a model file: GGUF `tokenizer.ggml.*` metadata, or an
//! HF checkpoint's `tokenizer.json` + `tokenizer_config.json`.

use loupe_formats::GgufFile;
use loupe_text::TokenizerSpec;

use crate::ModelError;

/// Collects the `tokenizer.*` keys of a GGUF file into a [`TokenizerSpec`].
pub fn spec_from_gguf(gguf: &GgufFile) -> Result<TokenizerSpec, ModelError> {
    let strings = |k: &str| -> Result<Option<Vec<String>>, ModelError> {
        Ok(match gguf.get(k) {
            None => None,
            Some(_) => Some(gguf.get_str_array(k)?.into_iter().map(str::to_string).collect()),
        })
    };
    let id = |k: &str| -> Result<Option<u32>, ModelError> { Ok(gguf.opt_u32(k)?) };
    let flag = |k: &str| -> Result<Option<bool>, ModelError> { Ok(gguf.opt_bool(k)?) };
    Ok(TokenizerSpec {
        model: gguf.get_str("tokenizer.ggml.model")?.to_string(),
        pre: gguf.opt_str("tokenizer.ggml.pre")?.map(str::to_string),
        tokens: strings("tokenizer.ggml.tokens")?.unwrap_or_default(),
        scores: match gguf.get("tokenizer.ggml.scores") {
            None => None,
            Some(_) => Some(gguf.get_f32_array("tokenizer.ggml.scores")?),
        },
        token_types: match gguf.get("tokenizer.ggml.token_type") {
            None => None,
            Some(_) => Some(gguf.get_i32_array("tokenizer.ggml.token_type")?),
        },
        merges: strings("tokenizer.ggml.merges")?.unwrap_or_default(),
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
