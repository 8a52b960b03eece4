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
    #[error("{path}: tensor '{name}' is {} {:?}, the model expects {} {:?}: the shapes differ, so it cannot be cast", .tensors.found_dtype, .tensors.found, .tensors.expected_dtype, .tensors.expected)]
    WeightMismatch { path: PathBuf, name: String, tensors: Box<TensorMismatch> },
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

/// The two sides of a [`ModelError::WeightMismatch`] (boxed: they would make every
/// `Result<_, ModelError>` twice as large).
#[derive(Debug)]
pub struct TensorMismatch {
    pub found: Vec<usize>,
    pub found_dtype: String,
    pub expected: Vec<usize>,
    pub expected_dtype: String,
}
