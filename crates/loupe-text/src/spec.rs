//! A neutral description of a GGUF tokenizer.
//!
//! This crate must not depend on the GGUF parser, so the caller copies the `tokenizer.ggml.*`
//! metadata into a [`TokenizerSpec`]. The same values can also come from a JSON object whose keys
//! are the GGUF key names ([`TokenizerSpec::from_json_str`]); tests produce such a file from a
//! real model with the `gguf` Python package, and it is a handy debugging format.

use std::path::Path;

use serde_json::{Map, Value};

use crate::error::{Result, TextError};

/// GGUF token types (`tokenizer.ggml.token_type`), as llama.cpp defines them.
pub mod token_type {
    pub const NORMAL: i32 = 1;
    pub const UNKNOWN: i32 = 2;
    /// Special tokens such as `<|im_start|>`; HF adds them as special added tokens.
    pub const CONTROL: i32 = 3;
    /// Added but not special (`<think>`); HF adds them as plain added tokens.
    pub const USER_DEFINED: i32 = 4;
    pub const UNUSED: i32 = 5;
    /// `<0x0A>`-style byte-fallback pieces of SentencePiece vocabularies.
    pub const BYTE: i32 = 6;
}

/// The tokenizer metadata of a GGUF file. Field comments name the GGUF key each comes from.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TokenizerSpec {
    /// `tokenizer.ggml.model`: "gpt2" (byte-level BPE) or "llama" (SentencePiece-style vocab).
    pub model: String,
    /// `tokenizer.ggml.pre` (e.g. "smollm", "llama-bpe", "qwen2", "default").
    pub pre: Option<String>,
    /// `tokenizer.ggml.tokens`, indexed by token id.
    pub tokens: Vec<String>,
    /// `tokenizer.ggml.scores`.
    pub scores: Option<Vec<f32>>,
    /// `tokenizer.ggml.token_type` (see [`token_type`]).
    pub token_types: Option<Vec<i32>>,
    /// `tokenizer.ggml.merges`, each "left right".
    pub merges: Vec<String>,
    /// `tokenizer.ggml.bos_token_id`.
    pub bos_id: Option<u32>,
    /// `tokenizer.ggml.eos_token_id`.
    pub eos_id: Option<u32>,
    /// `tokenizer.ggml.unknown_token_id`.
    pub unk_id: Option<u32>,
    /// `tokenizer.ggml.padding_token_id`.
    pub pad_id: Option<u32>,
    /// `tokenizer.ggml.add_bos_token`.
    pub add_bos: Option<bool>,
    /// `tokenizer.ggml.add_eos_token`.
    pub add_eos: Option<bool>,
    /// `tokenizer.ggml.add_space_prefix`. Recorded but, like transformers, not used: HF builds
    /// SentencePiece-style GGUF tokenizers with a prefix space whatever this says.
    pub add_space_prefix: Option<bool>,
    /// `tokenizer.chat_template`.
    pub chat_template: Option<String>,
    /// `general.architecture`. Optional; transformers picks a different builder for a few
    /// SentencePiece architectures (gemma*, phi3), so it is needed to refuse or mirror those.
    pub architecture: Option<String>,
}

impl TokenizerSpec {
    /// Reads a JSON object keyed by GGUF metadata names (`"tokenizer.ggml.tokens"`, ...).
    pub fn from_json(path: &Path) -> Result<Self> {
        let text =
            std::fs::read_to_string(path).map_err(|source| TextError::Io { path: path.to_path_buf(), source })?;
        Self::from_json_str(&text).map_err(|err| match err {
            TextError::InvalidSpec { field, reason } => {
                TextError::InvalidSpec { field, reason: format!("{reason} (in {})", path.display()) }
            }
            other => other,
        })
    }

    /// Parses a JSON object keyed by GGUF metadata names. Unknown keys are ignored so that a
    /// full metadata dump can be passed as is.
    pub fn from_json_str(text: &str) -> Result<Self> {
        let value: Value = serde_json::from_str(text)
            .map_err(|e| TextError::InvalidSpec { field: "<json>", reason: e.to_string() })?;
        let Value::Object(map) = value else {
            return Err(invalid("<json>", "expected a JSON object keyed by GGUF key names"));
        };
        Ok(Self {
            model: get_string(&map, "tokenizer.ggml.model")?
                .ok_or_else(|| invalid("tokenizer.ggml.model", "missing"))?,
            pre: get_string(&map, "tokenizer.ggml.pre")?,
            tokens: get_strings(&map, "tokenizer.ggml.tokens")?
                .ok_or_else(|| invalid("tokenizer.ggml.tokens", "missing"))?,
            scores: get_array(&map, "tokenizer.ggml.scores", |v| v.as_f64().map(|f| f as f32))?,
            token_types: get_array(&map, "tokenizer.ggml.token_type", |v| {
                v.as_i64().and_then(|i| i32::try_from(i).ok())
            })?,
            merges: get_strings(&map, "tokenizer.ggml.merges")?.unwrap_or_default(),
            bos_id: get_u32(&map, "tokenizer.ggml.bos_token_id")?,
            eos_id: get_u32(&map, "tokenizer.ggml.eos_token_id")?,
            unk_id: get_u32(&map, "tokenizer.ggml.unknown_token_id")?,
            pad_id: get_u32(&map, "tokenizer.ggml.padding_token_id")?,
            add_bos: get_bool(&map, "tokenizer.ggml.add_bos_token")?,
            add_eos: get_bool(&map, "tokenizer.ggml.add_eos_token")?,
            add_space_prefix: get_bool(&map, "tokenizer.ggml.add_space_prefix")?,
            chat_template: get_string(&map, "tokenizer.chat_template")?,
            architecture: get_string(&map, "general.architecture")?,
        })
    }

    /// Checks the lengths and ids that every builder relies on.
    pub(crate) fn validate(&self) -> Result<()> {
        let n = self.tokens.len();
        if n == 0 {
            return Err(invalid("tokenizer.ggml.tokens", "empty vocabulary"));
        }
        if u32::try_from(n).is_err() {
            return Err(invalid("tokenizer.ggml.tokens", format!("{n} tokens overflow u32 ids")));
        }
        if let Some(scores) = &self.scores {
            if scores.len() != n {
                return Err(invalid("tokenizer.ggml.scores", format!("{} scores for {n} tokens", scores.len())));
            }
        }
        if let Some(types) = &self.token_types {
            if types.len() != n {
                return Err(invalid(
                    "tokenizer.ggml.token_type",
                    format!("{} token types for {n} tokens", types.len()),
                ));
            }
        }
        for (field, id) in [
            ("tokenizer.ggml.bos_token_id", self.bos_id),
            ("tokenizer.ggml.eos_token_id", self.eos_id),
            ("tokenizer.ggml.unknown_token_id", self.unk_id),
            ("tokenizer.ggml.padding_token_id", self.pad_id),
        ] {
            if let Some(id) = id {
                if id as usize >= n {
                    return Err(invalid(field, format!("id {id} is outside the {n}-token vocabulary")));
                }
            }
        }
        Ok(())
    }

    /// The token type of `id`, NORMAL when the file has no types.
    pub(crate) fn token_type(&self, id: usize) -> i32 {
        self.token_types.as_ref().and_then(|t| t.get(id).copied()).unwrap_or(token_type::NORMAL)
    }
}

pub(crate) fn invalid(field: &'static str, reason: impl Into<String>) -> TextError {
    TextError::InvalidSpec { field, reason: reason.into() }
}

fn get_string(map: &Map<String, Value>, key: &'static str) -> Result<Option<String>> {
    match map.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(other) => Err(invalid(key, format!("expected a string, got {}", kind(other)))),
    }
}

fn get_bool(map: &Map<String, Value>, key: &'static str) -> Result<Option<bool>> {
    match map.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(other) => Err(invalid(key, format!("expected a bool, got {}", kind(other)))),
    }
}

fn get_u32(map: &Map<String, Value>, key: &'static str) -> Result<Option<u32>> {
    match map.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_u64()
            .and_then(|i| u32::try_from(i).ok())
            .map(Some)
            .ok_or_else(|| invalid(key, format!("expected a u32, got {v}"))),
    }
}

fn get_strings(map: &Map<String, Value>, key: &'static str) -> Result<Option<Vec<String>>> {
    get_array(map, key, |v| v.as_str().map(str::to_owned))
}

fn get_array<T>(
    map: &Map<String, Value>,
    key: &'static str,
    convert: impl Fn(&Value) -> Option<T>,
) -> Result<Option<Vec<T>>> {
    match map.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Array(items)) => items
            .iter()
            .enumerate()
            .map(|(i, v)| convert(v).ok_or_else(|| invalid(key, format!("element {i} has the wrong type: {v}"))))
            .collect::<Result<Vec<T>>>()
            .map(Some),
        Some(other) => Err(invalid(key, format!("expected an array, got {}", kind(other)))),
    }
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a bool",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_gguf_keys() {
        let spec = TokenizerSpec::from_json_str(
            r#"{"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": ["a", "b"],
                "tokenizer.ggml.token_type": [1, 3], "tokenizer.ggml.merges": ["a b"],
                "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.add_bos_token": false,
                "general.architecture": "llama", "other.key": 3}"#,
        )
        .unwrap();
        assert_eq!(spec.model, "gpt2");
        assert_eq!(spec.tokens, ["a", "b"]);
        assert_eq!(spec.token_types, Some(vec![1, 3]));
        assert_eq!(spec.bos_id, Some(1));
        assert_eq!(spec.add_bos, Some(false));
        assert_eq!(spec.architecture.as_deref(), Some("llama"));
        spec.validate().unwrap();
    }

    #[test]
    fn rejects_bad_types_and_ids() {
        let err = TokenizerSpec::from_json_str(r#"{"tokenizer.ggml.model": 3}"#).unwrap_err();
        assert!(err.to_string().contains("tokenizer.ggml.model"), "{err}");
        let err =
            TokenizerSpec::from_json_str(r#"{"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": ["a", 7]}"#)
                .unwrap_err();
        assert!(err.to_string().contains("element 1"), "{err}");
        let spec =
            TokenizerSpec { model: "gpt2".into(), tokens: vec!["a".into()], eos_id: Some(5), ..Default::default() };
        let err = spec.validate().unwrap_err();
        assert!(err.to_string().contains("eos_token_id"), "{err}");
        let err = TokenizerSpec::from_json_str("[1]").unwrap_err();
        assert!(matches!(err, TextError::InvalidSpec { .. }));
    }
}
