//! The one error type of this crate.
//!
//! Every variant carries enough context (which field, which token index, which file) to act on
//! the message without a debugger. The `tokenizers` crate reports errors as
//! `Box<dyn Error + Send + Sync>`, which does not itself implement `Error`, so its messages are
//! kept as text.

use std::path::PathBuf;

/// Errors from building tokenizers, encoding, decoding and rendering chat templates.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TextError {
    /// A field of a [`crate::TokenizerSpec`] (or of a tokenizer file) is missing or inconsistent.
    #[error("invalid tokenizer spec: {field}: {reason}")]
    InvalidSpec {
        /// GGUF key (or JSON key) of the offending field.
        field: &'static str,
        reason: String,
    },

    /// The spec names a tokenizer family this crate does not build (yet).
    #[error("unsupported tokenizer: {what} (supported: {supported})")]
    Unsupported { what: String, supported: &'static str },

    /// The `tokenizers` crate refused to build a component.
    #[error("building tokenizer {component}: {message}")]
    Build { component: &'static str, message: String },

    /// Encoding text failed inside the `tokenizers` crate.
    #[error("encoding text (starts {preview:?}): {message}")]
    Encode { preview: String, message: String },

    /// Decoding ids failed inside the `tokenizers` crate.
    #[error("decoding {count} token ids: {message}")]
    Decode { count: usize, message: String },

    /// A file could not be read.
    #[error("reading {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// A file is not the JSON we expect.
    #[error("parsing {path}: {message}")]
    Parse { path: PathBuf, message: String },

    /// The chat template does not compile.
    #[error("chat template syntax: {message}")]
    TemplateSyntax { message: String },

    /// The chat template failed while rendering (undefined method, bad types, ...).
    #[error("chat template render: {message}")]
    TemplateRender { message: String },

    /// The chat template itself called `raise_exception(message)`, as HF templates do to reject
    /// conversations they cannot format (e.g. roles that do not alternate).
    #[error("chat template raised: {message}")]
    TemplateRaised { message: String },

    /// A token's true bytes cannot be derived (constrained decoding needs them).
    #[error("token bytes: {0}")]
    TokenBytes(String),

    /// No chat template is known for this tokenizer.
    #[error("no chat template: the model file / tokenizer_config.json carries none")]
    NoChatTemplate,
}

/// Shorthand used throughout the crate.
pub type Result<T, E = TextError> = std::result::Result<T, E>;

/// First characters of `text`, for error messages that must stay short.
pub(crate) fn preview(text: &str) -> String {
    text.chars().take(40).collect()
}
