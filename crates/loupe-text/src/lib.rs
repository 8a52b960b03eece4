//! loupe-text: tokenizers and chat templates that match Hugging Face transformers exactly.
//!
//! The contract is token-for-token parity with transformers 5.x (not with llama.cpp): for a GGUF
//! file, the ids of `AutoTokenizer.from_pretrained(dir, gguf_file=name)`; for a checkpoint, those
//! of its `tokenizer.json` + `tokenizer_config.json`; and the strings of `apply_chat_template`.
//!
//! Data flows in this order:
//! - [`spec`]: [`TokenizerSpec`], the GGUF `tokenizer.ggml.*` metadata, filled by the caller (this
//!   crate does not parse GGUF) or read from a JSON dump keyed by GGUF key names.
//! - `gguf_build`: the `tokenizers` pipeline transformers builds from that metadata.
//! - [`Tokenizer`]: encode/decode, special tokens, and the two ways HF encodes prompts:
//!   [`Tokenizer::encode_prompt`] (raw text, `add_special_tokens=True`: BOS only if the model's
//!   `add_bos_token` says so; SmolLM2's GGUF says no) and [`Tokenizer::encode_chat`] (a rendered
//!   chat, `add_special_tokens=False`).
//! - [`StreamDecoder`]: incremental detokenization whose chunks concatenate to the full decode.
//! - [`ChatTemplate`]: minijinja set up as transformers sets up Jinja2.
//!
//! ```no_run
//! # fn main() -> Result<(), loupe_text::TextError> {
//! # let spec = loupe_text::TokenizerSpec::default();
//! use loupe_text::{ChatMessage, Tokenizer};
//! let tok = Tokenizer::from_spec(&spec)?;
//! let ids = tok.chat_ids(&[ChatMessage::user("What is the capital of France?")], true)?;
//! let mut stream = tok.stream_decoder(true);
//! for id in ids {
//!     print!("{}", stream.push(id)?);
//! }
//! print!("{}", stream.finish()?);
//! # Ok(()) }
//! ```

mod backend;
mod chat;
mod compact_bpe;
mod error;
/// The `compact_bpe` fuzz target's body (`fuzz/`), also run by tests/fuzz_smoke.rs.
pub mod fuzzing;
mod gguf_build;
mod hf_config;
mod pyjson;
pub mod sections;
pub mod spec;
mod stream;
mod strftime;
mod token_bytes;
mod tokenizer;

pub use backend::{Backend, TokenModel};
pub use chat::{ChatMessage, ChatTemplate};
pub use compact_bpe::CompactBpe;
pub use error::{Result, TextError};
/// GPT-2's byte-to-unicode table, for writers of byte-level BPE vocabularies.
pub use gguf_build::{bytes_to_unicode, GGUF_PRE_SPLITS};
pub use hf_config::TokenizerConfig;
pub use sections::{Section, SectionMarkers, SectionSplitter, REASONING_PARSERS};
pub use spec::TokenizerSpec;
pub use stream::StreamDecoder;
pub use token_bytes::TokenBytes;
pub use tokenizer::{Tokenizer, END_OF_GENERATION_TOKENS};
