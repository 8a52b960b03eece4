//! Incremental detokenization for streaming generated text.
//!
//! Invariant (tested on random id sequences): the concatenation of everything [`StreamDecoder::push`]
//! and [`StreamDecoder::finish`] return equals `tokenizer.decode(all_ids, skip_special_tokens)`
//! without HF's optional space clean-up, and no chunk ends inside a UTF-8 character.
//!
//! Decoding one token at a time is wrong: decoders are not token-local (SentencePiece decoders
//! strip the text's first space; byte tokens only make characters together). So each step decodes
//! a short window twice, the tokens of the last emitted chunk with and without the new tokens, and
//! emits the difference (the method of text-generation-inference and vLLM). Text is held back
//! while it could still change:
//! - it ends in U+FFFD: a byte-level character may be incomplete;
//! - the last token the decoder sees is a byte-fallback token (`<0xE2>`): `ByteFallback` turns a
//!   whole run of byte tokens into U+FFFDs when the run as a whole is not UTF-8, so even complete
//!   characters in the run may still change.
//!
//! Tokens the decoder never sees (skipped special tokens, ids outside the vocabulary) are ignored
//! by those rules, since they do not end a byte run.

use crate::error::{Result, TextError};
use crate::tokenizer::Tokenizer;

/// Feeds token ids one at a time; returns newly completed text. Create with
/// [`Tokenizer::stream_decoder`].
pub struct StreamDecoder<'a> {
    tokenizer: &'a Tokenizer,
    skip_special_tokens: bool,
    ids: Vec<u32>,
    /// Start of the decode window: the first token of the last emitted chunk.
    prefix_offset: usize,
    /// End of the text already emitted (in tokens).
    read_offset: usize,
    /// Everything emitted so far, for the fallback when a window diff is not a prefix extension.
    emitted: String,
}

impl<'a> StreamDecoder<'a> {
    pub(crate) fn new(tokenizer: &'a Tokenizer, skip_special_tokens: bool) -> Self {
        Self {
            tokenizer,
            skip_special_tokens,
            ids: Vec::new(),
            prefix_offset: 0,
            read_offset: 0,
            emitted: String::new(),
        }
    }

    /// Adds one token; returns the text it completes (often empty, never a partial character).
    pub fn push(&mut self, id: u32) -> Result<String> {
        self.ids.push(id);
        if self.ends_in_byte_token() {
            return Ok(String::new());
        }
        self.step(false)
    }

    /// Ends the stream: returns whatever is still held back (a trailing incomplete character
    /// decodes to U+FFFD, as in a full decode).
    pub fn finish(mut self) -> Result<String> {
        self.step(true)
    }

    /// All ids pushed so far.
    pub fn ids(&self) -> &[u32] {
        &self.ids
    }

    /// All text returned by `push` so far.
    pub fn text(&self) -> &str {
        &self.emitted
    }

    fn step(&mut self, flush: bool) -> Result<String> {
        let tok = self.tokenizer;
        let prefix = tok.decode_raw(&self.ids[self.prefix_offset..self.read_offset], self.skip_special_tokens)?;
        let text = tok.decode_raw(&self.ids[self.prefix_offset..], self.skip_special_tokens)?;
        if !flush && (text.len() <= prefix.len() || text.ends_with('\u{FFFD}')) {
            return Ok(String::new());
        }
        let chunk = match text.strip_prefix(prefix.as_str()) {
            Some(chunk) => chunk.to_owned(),
            // Not expected with the decoders transformers builds; decode everything instead, which
            // is exact as long as what was emitted is still a prefix of the full text.
            None => {
                let full = tok.decode_raw(&self.ids, self.skip_special_tokens)?;
                full.strip_prefix(self.emitted.as_str())
                    .ok_or_else(|| TextError::Decode {
                        count: self.ids.len(),
                        message: format!(
                            "stream decoding diverged: text already emitted ({:?}) is not a prefix of the full decode",
                            self.emitted
                        ),
                    })?
                    .to_owned()
            }
        };
        if chunk.is_empty() {
            return Ok(chunk);
        }
        self.prefix_offset = self.read_offset;
        self.read_offset = self.ids.len();
        self.emitted.push_str(&chunk);
        Ok(chunk)
    }

    /// Whether the last token the decoder will see is a byte-fallback piece like `<0x0A>`.
    fn ends_in_byte_token(&self) -> bool {
        let tok = self.tokenizer;
        self.ids
            .iter()
            .rev()
            .find_map(|&id| {
                let token = tok.token_to_str(id)?;
                if self.skip_special_tokens && tok.is_special(id) {
                    return None;
                }
                Some(is_byte_token(&token))
            })
            .unwrap_or(false)
    }
}

fn is_byte_token(token: &str) -> bool {
    let b = token.as_bytes();
    b.len() == 6 && token.starts_with("<0x") && b[5] == b'>' && b[3].is_ascii_hexdigit() && b[4].is_ascii_hexdigit()
}

impl Tokenizer {
    /// An incremental decoder for streaming generated tokens (see [`StreamDecoder`]).
    pub fn stream_decoder(&self, skip_special_tokens: bool) -> StreamDecoder<'_> {
        StreamDecoder::new(self, skip_special_tokens)
    }
}

#[cfg(test)]
mod tests {
    use super::is_byte_token;

    #[test]
    fn byte_tokens() {
        assert!(is_byte_token("<0x0A>"));
        assert!(is_byte_token("<0xff>"));
        assert!(!is_byte_token("<0x0A"));
        assert!(!is_byte_token("<0xZZ>"));
        assert!(!is_byte_token("hello!"));
    }
}
