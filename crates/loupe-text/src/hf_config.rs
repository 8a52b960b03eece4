//! The parts of a Hugging Face `tokenizer_config.json` that change tokenization or chat rendering.
//!
//! transformers 5.x keeps the chat template either in `tokenizer_config.json` (`chat_template`,
//! a string or a list of `{name, template}`) or, for checkpoints saved by v5, in a
//! `chat_template.jinja` file beside it; both are read here.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::error::{Result, TextError};

/// What we use from `tokenizer_config.json`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TokenizerConfig {
    pub bos_token: Option<String>,
    pub eos_token: Option<String>,
    pub unk_token: Option<String>,
    pub pad_token: Option<String>,
    /// `None` when the key is absent: then HF keeps tokenizer.json's post-processor.
    pub add_bos_token: Option<bool>,
    pub add_eos_token: Option<bool>,
    pub chat_template: Option<String>,
    pub clean_up_tokenization_spaces: bool,
    pub split_special_tokens: bool,
}

impl TokenizerConfig {
    /// Reads `path`, then `chat_template.jinja` beside it when the config has no template.
    pub fn from_file(path: &Path) -> Result<Self> {
        let text = read(path)?;
        let mut config =
            Self::from_json_str(&text).map_err(|message| TextError::Parse { path: path.to_path_buf(), message })?;
        if config.chat_template.is_none() {
            let jinja = path.with_file_name("chat_template.jinja");
            if jinja.is_file() {
                config.chat_template = Some(read(&jinja)?);
            }
        }
        Ok(config)
    }

    /// Parses the JSON text of a `tokenizer_config.json`.
    pub fn from_json_str(text: &str) -> std::result::Result<Self, String> {
        let value: Value = serde_json::from_str(text).map_err(|e| e.to_string())?;
        let Value::Object(map) = value else {
            return Err("expected a JSON object".into());
        };
        let token = |key: &str| -> std::result::Result<Option<String>, String> {
            match map.get(key) {
                None | Some(Value::Null) => Ok(None),
                Some(Value::String(s)) => Ok(Some(s.clone())),
                // An AddedToken serialized as {"content": ..., "lstrip": ..., ...}.
                Some(Value::Object(o)) => match o.get("content") {
                    Some(Value::String(s)) => Ok(Some(s.clone())),
                    _ => Err(format!("{key}: object without a string \"content\"")),
                },
                Some(other) => Err(format!("{key}: expected a string, got {other}")),
            }
        };
        let flag = |key: &str| -> std::result::Result<Option<bool>, String> {
            match map.get(key) {
                None | Some(Value::Null) => Ok(None),
                Some(Value::Bool(b)) => Ok(Some(*b)),
                Some(other) => Err(format!("{key}: expected a bool, got {other}")),
            }
        };
        Ok(Self {
            bos_token: token("bos_token")?,
            eos_token: token("eos_token")?,
            unk_token: token("unk_token")?,
            pad_token: token("pad_token")?,
            add_bos_token: flag("add_bos_token")?,
            add_eos_token: flag("add_eos_token")?,
            chat_template: chat_template(map.get("chat_template"))?,
            clean_up_tokenization_spaces: flag("clean_up_tokenization_spaces")?.unwrap_or(false),
            split_special_tokens: flag("split_special_tokens")?.unwrap_or(false),
        })
    }
}

/// A template string, or the one named "default" (else the first) of a list of named templates,
/// which is what `get_chat_template` picks when no tools are given.
fn chat_template(value: Option<&Value>) -> std::result::Result<Option<String>, String> {
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(Value::Array(items)) => {
            let named: Vec<(&str, &str)> = items
                .iter()
                .filter_map(|item| Some((item.get("name")?.as_str()?, item.get("template")?.as_str()?)))
                .collect();
            if named.len() != items.len() {
                return Err("chat_template: list items must be {\"name\": str, \"template\": str}".into());
            }
            Ok(named.iter().find(|(name, _)| *name == "default").or(named.first()).map(|(_, t)| (*t).to_owned()))
        }
        Some(other) => Err(format!("chat_template: expected a string or list, got {other}")),
    }
}

fn read(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).map_err(|source| TextError::Io { path: PathBuf::from(path), source })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_tokens_flags_and_named_templates() {
        let c = TokenizerConfig::from_json_str(
            r#"{"bos_token": {"content": "<s>", "lstrip": false}, "eos_token": "</s>",
                "add_bos_token": true, "chat_template": [{"name": "tool_use", "template": "T"},
                {"name": "default", "template": "D"}], "clean_up_tokenization_spaces": true}"#,
        )
        .unwrap();
        assert_eq!(c.bos_token.as_deref(), Some("<s>"));
        assert_eq!(c.eos_token.as_deref(), Some("</s>"));
        assert_eq!(c.add_bos_token, Some(true));
        assert_eq!(c.add_eos_token, None);
        assert_eq!(c.chat_template.as_deref(), Some("D"));
        assert!(c.clean_up_tokenization_spaces);
        assert!(TokenizerConfig::from_json_str(r#"{"add_bos_token": "yes"}"#).is_err());
        assert!(TokenizerConfig::from_json_str("[]").is_err());
    }
}
