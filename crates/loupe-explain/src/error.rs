//! [`ExplainError`]: what `loupe explain` refuses.

use std::path::PathBuf;

/// What can go wrong; every variant is bad input (exit code 2).
#[derive(Debug, thiserror::Error)]
pub enum ExplainError {
    #[error("{path}: {reason}")]
    Manifest { path: PathBuf, reason: String },
    #[error("{dump}: no tensor '{name}' at step {step} (dump it: loupe dump --taps, or the reference's --taps)")]
    MissingTensor { dump: PathBuf, name: String, step: usize },
    /// A dump or one of its tensor files could not be read.
    #[error(transparent)]
    Dump(#[from] loupe_parity::ParityError),
    #[error("shape mismatch: {what}")]
    Shape { what: String },
    #[error("--model {}: an encoder; explain rebuilds decoder ops", path.display())]
    Encoder { path: PathBuf },
    #[error("--model: {0}")]
    Model(#[from] loupe_models::ModelError),
    #[error("{0}")]
    Kernel(#[from] loupe_tensor::TensorError),
}
