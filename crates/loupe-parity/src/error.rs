//! Typed errors of the parity toolkit. Each names the input (file, directory, mapping
//! rule) at fault; the CLI prints it on one line and exits 2.

use std::path::PathBuf;

use loupe_formats::FormatError;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ParityError {
    /// A tensor container could not be read.
    #[error(transparent)]
    Format(#[from] FormatError),
    /// A file or directory could not be listed or read.
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A dump manifest is malformed or disagrees with its files.
    #[error("{path}: {reason}")]
    Manifest { path: PathBuf, reason: String },
    /// An input is of no kind we read.
    #[error("{path}: {reason}")]
    Input { path: PathBuf, reason: String },
    /// A mapping file or one of its rules is invalid.
    #[error("mapping {path}: {reason}")]
    Mapping { path: PathBuf, reason: String },
    /// A mapping transform does not fit the tensor it was applied to.
    #[error("tensor '{name}': {reason}")]
    Transform { name: String, reason: String },
    /// A bad option value (a regex that does not compile, a zero threshold...).
    #[error("{0}")]
    Usage(String),
}

impl ParityError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> ParityError {
        ParityError::Io { path: path.into(), source }
    }
    pub(crate) fn input(path: impl Into<PathBuf>, reason: impl Into<String>) -> ParityError {
        ParityError::Input { path: path.into(), reason: reason.into() }
    }
}
