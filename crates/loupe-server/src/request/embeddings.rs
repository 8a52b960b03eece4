//! `POST /v1/embeddings`: its body, parsed and checked.

use serde_json::Value;

use super::fields::{kind_of, Fields};
use crate::error::ApiError;

/// How `/v1/embeddings` returns each vector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EncodingFormat {
    /// A JSON array of numbers.
    Float,
    /// The little-endian f32 bytes, base64 (what the `openai` Python client asks for by
    /// default and decodes itself).
    Base64,
}

/// A parsed `POST /v1/embeddings` body.
#[derive(Debug, Clone, PartialEq)]
pub struct EmbeddingsRequest {
    pub model: Option<String>,
    pub input: Vec<String>,
    pub encoding_format: EncodingFormat,
    /// `dimensions`, which loupe accepts only as the model's own width.
    pub dimensions: Option<usize>,
    pub dropped: Vec<String>,
}

/// At most this many inputs per embeddings request (OpenAI's limit is 2048).
pub const MAX_EMBEDDING_INPUTS: usize = 2048;

/// `POST /v1/embeddings`: `input` is a string or an array of strings. Token-id inputs are
/// refused (the text is what the checkpoint's pipeline tokenizes and cuts).
pub fn embeddings(body: &[u8], allow_extra: bool) -> Result<EmbeddingsRequest, ApiError> {
    let mut f = Fields::parse(body)?;
    let model = f.string("model")?;
    let bad = |m: &str| ApiError::invalid("input", m.to_string());
    let input = match f.take("input") {
        Some(Value::String(s)) => vec![s],
        Some(Value::Array(items)) if items.is_empty() => return Err(bad("'input' is an empty array.")),
        Some(Value::Array(items)) if items.len() > MAX_EMBEDDING_INPUTS => {
            return Err(bad(&format!(
                "'input' holds {} items; at most {MAX_EMBEDDING_INPUTS} per request.",
                items.len()
            )))
        }
        Some(Value::Array(items)) => items
            .into_iter()
            .map(|v| match v {
                Value::String(s) => Ok(s),
                Value::Number(_) | Value::Array(_) => Err(bad("token-id inputs are not supported; send text.")),
                other => Err(bad(&format!("'input' items must be strings, got {}.", kind_of(&other)))),
            })
            .collect::<Result<_, _>>()?,
        Some(other) => {
            return Err(bad(&format!("'input' must be a string or an array of strings, got {}.", kind_of(&other))))
        }
        None => return Err(bad("'input' is required: a string or an array of strings.")),
    };
    if input.iter().any(|s| s.is_empty()) {
        return Err(bad("'input' holds an empty string."));
    }
    let encoding_format = match f.string("encoding_format")?.as_deref() {
        None | Some("float") => EncodingFormat::Float,
        Some("base64") => EncodingFormat::Base64,
        Some(other) => {
            return Err(ApiError::invalid(
                "encoding_format",
                format!("'encoding_format' must be 'float' or 'base64', got '{other}'."),
            ))
        }
    };
    let dimensions = f.int_in("dimensions", 1, i64::from(u32::MAX))?.map(|d| d as usize);
    // `user` is an end-user id for abuse monitoring; it changes nothing here.
    let _ = f.take("user");
    let dropped = f.finish(allow_extra)?;
    Ok(EmbeddingsRequest { model, input, encoding_format, dimensions, dropped })
}
