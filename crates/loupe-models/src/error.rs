use std::path::PathBuf;

/// Errors loading a model; each names the file and the field or tensor at fault.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ModelError {
    #[error(transparent)]
    Format(#[from] loupe_formats::FormatError),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: unsupported architecture '{arch}' (supported: {supported})")]
    UnsupportedArchitecture { path: PathBuf, arch: String, supported: String },
    #[error("{source_file}: invalid {field}: {reason}")]
    InvalidConfig { source_file: PathBuf, field: String, reason: String },
    #[error("{path}: missing tensor '{name}'")]
    MissingWeight { path: PathBuf, name: String },
    #[error("{path}: tensor '{name}' has shape {found:?}, expected {expected:?}")]
    WeightShape { path: PathBuf, name: String, found: Vec<usize>, expected: Vec<usize> },
    /// A checkpoint tensor whose shape differs from the model's, named with both dtypes (a
    /// dtype alone is cast; a shape is never guessed).
    #[error("{path}: tensor '{name}' is {found_dtype} {found:?}, the model expects {expected_dtype} {expected:?}: the shapes differ, so it cannot be cast")]
    WeightMismatch {
        path: PathBuf,
        name: String,
        found: Vec<usize>,
        found_dtype: String,
        expected: Vec<usize>,
        expected_dtype: String,
    },
    #[error("{path}: tensor '{name}': {source}")]
    Tensor {
        path: PathBuf,
        name: String,
        #[source]
        source: loupe_tensor::TensorError,
    },
    #[error("{path}: tokenizer: {source}")]
    Tokenizer {
        path: PathBuf,
        #[source]
        source: loupe_text::TextError,
    },
    #[error(transparent)]
    Graph(#[from] loupe_graph::GraphError),
    #[error("{path}: {reason}")]
    NotAModel { path: PathBuf, reason: String },
}
