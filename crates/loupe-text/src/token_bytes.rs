//! The true bytes each token id stands for, as a grammar engine needs them.
//!
//! Constrained decoding masks tokens by the bytes they would add to the text, so every id
//! needs its bytes, not its vocabulary spelling: a byte-level vocabulary spells a space `Ġ`
//! and byte 0xE2 `â`; a SentencePiece vocabulary spells a space `▁` and stores bytes its
//! pieces miss as `<0xE2>`. Decoding each token alone does not give them either: decoders
//! strip a leading space, and a token holding half a UTF-8 character decodes to U+FFFD.
//!
//! The mapping is read from the tokenizer's own decoder, the part of `tokenizer.json` (or of
//! the tokenizer built from GGUF metadata) that says how spellings become text:
//! - `ByteLevel`: each character of the spelling is one byte through GPT-2's byte-to-unicode
//!   table ([`crate::bytes_to_unicode`]);
//! - `ByteFallback` with `Replace(▁ → " ")`: `<0xNN>` is byte NN; other spellings are UTF-8
//!   with `▁` read as a space.
//!
//! Special added tokens (`<|im_end|>`, `<eos>`) produce no text; they are returned as
//! [`TokenBytes::Special`] so a grammar can name them but never match them as text.
//! Invariant (tested): for ordinary tokens, the concatenated bytes decode to the text
//! `Tokenizer::decode` gives, up to the decoder's strip of one leading space.

use serde_json::Value;

use crate::error::{Result, TextError};
use crate::tokenizer::Tokenizer;

/// What one token id adds to the text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenBytes {
    /// Ordinary text: these bytes (possibly part of a UTF-8 character).
    Text(Vec<u8>),
    /// A special token (control marker), by its spelling; adds no text.
    Special(String),
}

/// How a decoder turns spellings into bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Spelling {
    /// GPT-2's byte-to-unicode characters.
    ByteLevel,
    /// SentencePiece: `<0xNN>` byte tokens, `space` for a space.
    ByteFallback { space: char },
}

/// GPT-2's `bytes_to_unicode`, inverted: the character that spells each byte → the byte.
fn byte_level_table() -> std::collections::HashMap<char, u8> {
    crate::bytes_to_unicode().iter().enumerate().map(|(b, &c)| (c, b as u8)).collect()
}

/// Reads the spelling rule from the decoder's JSON form (stable across `tokenizers`
/// versions, unlike its Rust types).
fn spelling_of(decoder: &Value) -> Option<Spelling> {
    let mut byte_level = false;
    let mut byte_fallback = false;
    let mut space = None;
    let mut stack = vec![decoder];
    while let Some(d) = stack.pop() {
        match d.get("type").and_then(Value::as_str) {
            Some("ByteLevel") => byte_level = true,
            Some("ByteFallback") => byte_fallback = true,
            Some("Metaspace") => space = d.get("replacement").and_then(Value::as_str).and_then(|s| s.chars().next()),
            Some("Replace") if d.get("content").and_then(Value::as_str) == Some(" ") => {
                let pattern = d.get("pattern").and_then(|p| p.get("String")).and_then(Value::as_str);
                if let Some(c) = pattern.and_then(|s| (s.chars().count() == 1).then(|| s.chars().next()).flatten()) {
                    space = Some(c);
                }
            }
            Some("Sequence") => stack.extend(d.get("decoders").and_then(Value::as_array).into_iter().flatten()),
            _ => {}
        }
    }
    if byte_level {
        Some(Spelling::ByteLevel)
    } else if byte_fallback {
        Some(Spelling::ByteFallback { space: space.unwrap_or(' ') })
    } else {
        None
    }
}

/// `<0xNN>` → NN.
fn fallback_byte(spelling: &str) -> Option<u8> {
    let hex = spelling.strip_prefix("<0x")?.strip_suffix('>')?;
    (hex.len() == 2).then(|| u8::from_str_radix(hex, 16).ok()).flatten()
}

impl Tokenizer {
    /// The bytes of every token id below `n_ids` (the model's logits width, which may exceed
    /// the vocabulary: ids past it are [`TokenBytes::Special`] placeholders named `<[id]>`).
    /// Fails for a decoder that is neither byte-level nor SentencePiece byte-fallback (a
    /// WordPiece encoder's, for instance), naming it.
    pub fn token_bytes(&self, n_ids: usize) -> Result<Vec<TokenBytes>> {
        let inner = self.inner();
        let decoder = inner
            .get_decoder()
            .map(serde_json::to_value)
            .transpose()
            .map_err(|e| TextError::TokenBytes(e.to_string()))?;
        let spelling = decoder.as_ref().and_then(spelling_of).ok_or_else(|| {
            TextError::TokenBytes(format!(
                "the tokenizer's decoder ({}) is neither byte-level nor SentencePiece byte-fallback, so its tokens' bytes are unknown",
                decoder.as_ref().and_then(|d| d.get("type")).and_then(Value::as_str).unwrap_or("none")
            ))
        })?;
        let table = byte_level_table();
        let added = inner.get_added_tokens_decoder();
        let mut out = Vec::with_capacity(n_ids);
        for id in 0..n_ids as u32 {
            if let Some(token) = added.get(&id) {
                out.push(if token.special {
                    TokenBytes::Special(token.content.clone())
                } else {
                    TokenBytes::Text(token.content.clone().into_bytes())
                });
                continue;
            }
            let Some(spelled) = inner.id_to_token(id) else {
                out.push(TokenBytes::Special(format!("<[{id}]>")));
                continue;
            };
            let bytes = match spelling {
                Spelling::ByteLevel => {
                    spelled.chars().map(|c| table.get(&c).copied()).collect::<Option<Vec<u8>>>().ok_or_else(|| {
                        TextError::TokenBytes(format!(
                            "token {id} ({spelled:?}) has a character outside the byte-level alphabet"
                        ))
                    })?
                }
                Spelling::ByteFallback { space } => match fallback_byte(&spelled) {
                    Some(b) => vec![b],
                    None => spelled.replace(space, " ").into_bytes(),
                },
            };
            out.push(TokenBytes::Text(bytes));
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_level_table_is_a_bijection_with_gpt2_spellings() {
        let t = byte_level_table();
        assert_eq!(t.len(), 256);
        let mut bytes: Vec<u8> = t.values().copied().collect();
        bytes.sort_unstable();
        bytes.dedup();
        assert_eq!(bytes.len(), 256);
        // GPT-2 spells a space Ġ (U+0120) and a newline Ċ (U+010A).
        assert_eq!(t[&'Ġ'], b' ');
        assert_eq!(t[&'Ċ'], b'\n');
        assert_eq!(t[&'a'], b'a');
    }

    #[test]
    fn spelling_is_read_from_decoder_json() {
        let sp: Value = serde_json::json!({"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "\u{2581}"}, "content": " "},
            {"type": "ByteFallback"}, {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]});
        assert_eq!(spelling_of(&sp), Some(Spelling::ByteFallback { space: '\u{2581}' }));
        assert_eq!(spelling_of(&serde_json::json!({"type": "ByteLevel"})), Some(Spelling::ByteLevel));
        assert_eq!(spelling_of(&serde_json::json!({"type": "WordPiece", "prefix": "##"})), None);
        assert_eq!(fallback_byte("<0xE2>"), Some(0xE2));
        assert_eq!(fallback_byte("<0xE2"), None);
        assert_eq!(fallback_byte("<0x1>"), None);
    }
}
