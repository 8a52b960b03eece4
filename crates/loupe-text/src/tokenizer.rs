//! [`Tokenizer`]: the `tokenizers` crate's tokenizer plus the special-token facts that
//! transformers keeps beside it (BOS/EOS, whether BOS is added, the chat template).
//!
//! How transformers tokenizes, which the engine must mirror (measured on SmolLM2's GGUF with
//! transformers 5.23; see the crate docs and tests/hf_parity.rs):
//! - a raw prompt, `tokenizer(prompt)["input_ids"]`, uses `add_special_tokens=True`, which runs
//!   the post-processor: BOS only when `add_bos_token` (GGUF: `tokenizer.ggml.add_bos_token`,
//!   default true for "llama" files, false for "gpt2"). [`Tokenizer::encode_prompt`].
//! - a chat, `apply_chat_template(..., tokenize=True)`, renders the template (which writes its own
//!   special tokens) and encodes with `add_special_tokens=False`. [`Tokenizer::encode_chat`].
//! - special tokens inside text are always matched whole, in both cases.

use std::path::Path;

use crate::backend::{Backend, TokenModel};
use crate::chat::{ChatMessage, ChatTemplate};
use crate::error::{preview, Result, TextError};
use crate::gguf_build;
use crate::hf_config::TokenizerConfig;
use crate::spec::TokenizerSpec;

/// Tokens that end a turn or a document in common chat formats. [`Tokenizer::eos_ids`] adds any
/// of these that the vocabulary holds as a special token to the file's EOS.
pub const END_OF_GENERATION_TOKENS: &[&str] = &[
    "<|im_end|>",      // ChatML (SmolLM, Qwen)
    "<|eot_id|>",      // Llama 3 end of turn
    "<|eom_id|>",      // Llama 3.1 end of message (tool call)
    "<|end_of_text|>", // Llama 3 end of document
    "<|endoftext|>",   // GPT-2 family, SmolLM, Qwen, Phi
    "<|end|>",         // Phi-3
    "<end_of_turn>",   // Gemma
    "</s>",            // Llama 2, Mistral
];

/// A tokenizer whose ids equal transformers' for the same model.
#[derive(Clone)]
pub struct Tokenizer {
    inner: Backend,
    bos_token: Option<String>,
    eos_token: Option<String>,
    unk_token: Option<String>,
    pad_token: Option<String>,
    add_bos: bool,
    add_eos: bool,
    chat_template: Option<String>,
    /// HF's `clean_up_tokenization_spaces`, which transformers ignores for BPE models.
    clean_up_spaces: bool,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab_size", &self.vocab_size())
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .field("add_bos", &self.add_bos)
            .field("add_eos", &self.add_eos)
            .field("has_chat_template", &self.chat_template.is_some())
            .finish()
    }
}

impl Tokenizer {
    /// Builds the tokenizer transformers builds for a GGUF file with this metadata
    /// (`AutoTokenizer.from_pretrained(dir, gguf_file=name)`).
    pub fn from_spec(spec: &TokenizerSpec) -> Result<Self> {
        let built = gguf_build::build(spec)?;
        Ok(Self {
            inner: built.tokenizer,
            bos_token: built.bos_token,
            eos_token: built.eos_token,
            unk_token: built.unk_token,
            pad_token: built.pad_token,
            add_bos: built.add_bos,
            add_eos: built.add_eos,
            chat_template: spec.chat_template.clone(),
            clean_up_spaces: false,
        })
    }

    /// Loads a Hugging Face checkpoint's `tokenizer.json`, with its `tokenizer_config.json` for the
    /// chat template, the named special tokens and the BOS/EOS flags.
    ///
    /// Mirrors transformers' `TokenizersBackend` loading: when the config states `add_bos_token`
    /// or `add_eos_token`, the post-processor is replaced by `[bos] $A [eos]` per those flags (a
    /// missing one counts as false); otherwise tokenizer.json's post-processor is kept.
    pub fn from_file(tokenizer_json: &Path, tokenizer_config: Option<&Path>) -> Result<Self> {
        let mut inner = Backend::from_file(tokenizer_json)
            .map_err(|e| TextError::Parse { path: tokenizer_json.to_path_buf(), message: e.to_string() })?;
        // tokenizer.json may carry a padding and truncation setting (all-MiniLM-L6-v2's pads
        // every input to 128). transformers' `tokenizer(text)` turns both off for the call
        // (`PreTrainedTokenizerFast.set_truncation_and_padding` with DO_NOT_PAD and
        // DO_NOT_TRUNCATE), so ids are the text's own; callers that cut do so explicitly
        // ([`Tokenizer::encode_truncated`]).
        inner.with_padding(None);
        inner
            .with_truncation(None)
            .map_err(|e| TextError::Parse { path: tokenizer_json.to_path_buf(), message: e.to_string() })?;
        let config = match tokenizer_config {
            Some(path) => TokenizerConfig::from_file(path)?,
            None => TokenizerConfig::default(),
        };
        let named = [&config.bos_token, &config.eos_token, &config.unk_token, &config.pad_token];
        gguf_build::add_missing_specials(&mut inner, &named.into_iter().flatten().collect::<Vec<_>>());
        if config.split_special_tokens {
            inner.set_encode_special_tokens(true);
        }
        if config.add_bos_token.is_some() || config.add_eos_token.is_some() || inner.get_post_processor().is_none() {
            let add_bos = config.add_bos_token.unwrap_or(false) && config.bos_token.is_some();
            let add_eos = config.add_eos_token.unwrap_or(false) && config.eos_token.is_some();
            let post = gguf_build::bos_eos_post_processor(
                &inner,
                config.bos_token.as_deref(),
                config.eos_token.as_deref(),
                add_bos,
                add_eos,
            )?;
            inner.with_post_processor(Some(post));
        }
        let is_bpe =
            matches!(inner.get_model(), TokenModel::Hf(tokenizers::ModelWrapper::BPE(_)) | TokenModel::Compact(_));
        let mut tokenizer = Self {
            inner,
            bos_token: config.bos_token,
            eos_token: config.eos_token,
            unk_token: config.unk_token,
            pad_token: config.pad_token,
            add_bos: false,
            add_eos: false,
            chat_template: config.chat_template,
            clean_up_spaces: config.clean_up_tokenization_spaces && !is_bpe,
        };
        // Whatever the post-processor does is the truth; read the flags back from it.
        let empty = tokenizer.encode("", true)?;
        tokenizer.add_bos = tokenizer.bos_id().is_some() && empty.first().copied() == tokenizer.bos_id();
        tokenizer.add_eos = tokenizer.eos_id().is_some() && empty.last().copied() == tokenizer.eos_id();
        Ok(tokenizer)
    }

    /// Token ids of `text`. Special tokens written in the text (`<|im_start|>`) are always matched
    /// whole; `add_special_tokens` only decides whether the post-processor adds BOS/EOS.
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>> {
        self.inner
            .encode_fast(text, add_special_tokens)
            .map(|enc| enc.get_ids().to_vec())
            .map_err(|e| TextError::Encode { preview: preview(text), message: e.to_string() })
    }

    /// `text` with the tokenizer's special tokens, at most `max_tokens` long, as
    /// `tokenizer(text, truncation=True, max_length=max_tokens)` cuts it: the text's own
    /// tokens are cut from the end, then the post-processor adds its specials (BERT's
    /// `[CLS] ... [SEP]` stay). Returns the ids and the length before truncation.
    pub fn encode_truncated(&self, text: &str, max_tokens: usize) -> Result<(Vec<u32>, usize)> {
        use tokenizers::PostProcessor;
        let err = |e: tokenizers::Error| TextError::Encode { preview: preview(text), message: e.to_string() };
        let mut enc = self.inner.encode_fast(text, false).map_err(err)?;
        let added = self.inner.get_post_processor().map_or(0, |p| p.added_tokens(false));
        let full = enc.len() + added;
        if full > max_tokens {
            enc.truncate(max_tokens.saturating_sub(added), 0, tokenizers::TruncationDirection::Right);
        }
        let enc = self.inner.post_process(enc, None, true).map_err(err)?;
        Ok((enc.get_ids().to_vec(), full))
    }

    /// A raw prompt as `tokenizer(prompt)["input_ids"]` encodes it (HF's default
    /// `add_special_tokens=True`: BOS iff [`Self::add_bos_token`]).
    pub fn encode_prompt(&self, text: &str) -> Result<Vec<u32>> {
        self.encode(text, true)
    }

    /// A rendered chat as `apply_chat_template(..., tokenize=True)` encodes it: with
    /// `add_special_tokens=False`, because the template writes its own BOS if it wants one.
    pub fn encode_chat(&self, rendered: &str) -> Result<Vec<u32>> {
        self.encode(rendered, false)
    }

    /// Renders `messages` with the model's chat template and encodes the result as
    /// `apply_chat_template(messages, add_generation_prompt=..., tokenize=True)` does.
    pub fn chat_ids(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<Vec<u32>> {
        let rendered = self.chat_template()?.render(messages, add_generation_prompt)?;
        self.encode_chat(&rendered)
    }

    /// Text of `ids`, as `tokenizer.decode(ids, skip_special_tokens=...)`. Ids outside the
    /// vocabulary are dropped, as transformers (the `tokenizers` crate) drops them.
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String> {
        let text = self.decode_raw(ids, skip_special_tokens)?;
        Ok(if self.clean_up_spaces { clean_up_tokenization(&text) } else { text })
    }

    /// The backend's decode without HF's optional space clean-up (the stream decoder needs the
    /// prefix-stable form).
    pub(crate) fn decode_raw(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String> {
        self.inner
            .decode(ids, skip_special_tokens)
            .map_err(|e| TextError::Decode { count: ids.len(), message: e.to_string() })
    }

    /// `len(tokenizer)` in transformers: distinct tokens, the vocabulary plus added tokens.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// The token's spelling in the vocabulary (byte-level vocabularies spell a space "Ġ"), as
    /// `convert_ids_to_tokens`.
    pub fn token_to_str(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// The id of a token spelled as in the vocabulary (`convert_tokens_to_ids`).
    pub fn id_of(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// Whether `id` is a special added token (skipped by `skip_special_tokens`).
    pub fn is_special(&self, id: u32) -> bool {
        self.inner
            .get_added_vocabulary()
            .simple_id_to_token(id)
            .is_some_and(|t| self.inner.get_added_vocabulary().is_special_token(&t))
    }

    pub fn bos_token(&self) -> Option<&str> {
        self.bos_token.as_deref()
    }

    pub fn eos_token(&self) -> Option<&str> {
        self.eos_token.as_deref()
    }

    pub fn unk_token(&self) -> Option<&str> {
        self.unk_token.as_deref()
    }

    pub fn pad_token(&self) -> Option<&str> {
        self.pad_token.as_deref()
    }

    /// `tokenizer.bos_token_id`.
    pub fn bos_id(&self) -> Option<u32> {
        self.bos_token.as_deref().and_then(|t| self.id_of(t))
    }

    /// `tokenizer.eos_token_id`: the one EOS transformers' `generate` stops on for a GGUF.
    pub fn eos_id(&self) -> Option<u32> {
        self.eos_token.as_deref().and_then(|t| self.id_of(t))
    }

    /// Ids that should end generation: the EOS first, then every token of
    /// [`END_OF_GENERATION_TOKENS`] that this vocabulary holds as a *special* token, in that
    /// list's order, without duplicates. Chat models often end a turn with a marker other than
    /// their EOS (Llama 3's EOS is `<|end_of_text|>`, its turns end with `<|eot_id|>`). Requiring
    /// the token to be special keeps plain-text lookalikes out. transformers itself stops on
    /// [`Self::eos_id`] only for a GGUF; use that for token-exact parity with `generate`.
    pub fn eos_ids(&self) -> Vec<u32> {
        let mut ids: Vec<u32> = self.eos_id().into_iter().collect();
        for token in END_OF_GENERATION_TOKENS {
            if let Some(id) = self.id_of(token) {
                if self.is_special(id) && !ids.contains(&id) {
                    ids.push(id);
                }
            }
        }
        ids
    }

    /// Whether [`Self::encode_prompt`] puts BOS first.
    pub fn add_bos_token(&self) -> bool {
        self.add_bos
    }

    /// Whether [`Self::encode_prompt`] puts EOS last.
    pub fn add_eos_token(&self) -> bool {
        self.add_eos
    }

    /// The chat template source, if the model has one.
    pub fn chat_template_source(&self) -> Option<&str> {
        self.chat_template.as_deref()
    }

    /// The model's chat template, compiled, with the variables transformers passes
    /// (`special_tokens_map`: bos/eos/unk/pad tokens).
    pub fn chat_template(&self) -> Result<ChatTemplate> {
        let source = self.chat_template.as_deref().ok_or(TextError::NoChatTemplate)?;
        self.chat_template_from(source)
    }

    /// Another template (e.g. a user's override) with this tokenizer's special-token variables.
    pub fn chat_template_from(&self, source: &str) -> Result<ChatTemplate> {
        let mut template = ChatTemplate::new(
            source,
            self.bos_token.as_deref().unwrap_or(""),
            self.eos_token.as_deref().unwrap_or(""),
        )?;
        // Only the tokens the tokenizer has: an absent one is undefined in the template, as in HF.
        if let Some(unk) = &self.unk_token {
            template.set_var("unk_token", unk.as_str());
        }
        if let Some(pad) = &self.pad_token {
            template.set_var("pad_token", pad.as_str());
        }
        Ok(template)
    }

    /// The underlying `tokenizers` tokenizer, for what this wrapper does not expose.
    pub fn inner(&self) -> &Backend {
        &self.inner
    }
}

/// transformers' `clean_up_tokenization`: undo spaces that WordPiece-era decoders put before
/// punctuation and English contractions.
fn clean_up_tokenization(text: &str) -> String {
    [
        (" .", "."),
        (" ?", "?"),
        (" !", "!"),
        (" ,", ","),
        (" ' ", "'"),
        (" n't", "n't"),
        (" 'm", "'m"),
        (" 's", "'s"),
        (" 've", "'ve"),
        (" 're", "'re"),
    ]
    .iter()
    .fold(text.to_owned(), |acc, (from, to)| acc.replace(from, to))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cleanup_matches_transformers_rules() {
        assert_eq!(clean_up_tokenization("do n't , ok . it 's"), "don't, ok. it's");
    }
}
