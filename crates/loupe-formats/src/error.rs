//! Typed errors of the format readers, each naming the file and the field at fault.

use std::path::PathBuf;

/// An error reading or writing a tensor container.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FormatError {
    /// The file could not be opened, mapped or read.
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The file does not start with the expected magic bytes.
    #[error("{path}: not a {format} file (magic {found})")]
    BadMagic { path: PathBuf, format: &'static str, found: String },
    /// The file ended before a field could be read.
    #[error("{path}: truncated while reading {field} at byte offset {offset} (file is {file_len} bytes)")]
    Truncated { path: PathBuf, field: String, offset: u64, file_len: u64 },
    /// A field holds a value the format does not allow.
    #[error("{path}: invalid {field}: {reason}")]
    Invalid { path: PathBuf, field: String, reason: String },
    /// A field exceeds a safety cap checked before allocating.
    #[error("{path}: {field} is {value}, over the limit of {limit}")]
    TooLarge { path: PathBuf, field: String, value: u64, limit: u64 },
    /// A well-formed file uses something loupe does not support.
    #[error("{path}: unsupported {what}")]
    Unsupported { path: PathBuf, what: String },
    /// A requested tensor or key is not in the file.
    #[error("{path}: no {what} named '{name}'")]
    Missing { path: PathBuf, what: &'static str, name: String },
}

impl FormatError {
    /// The file the error is about.
    pub fn path(&self) -> &std::path::Path {
        match self {
            FormatError::Io { path, .. }
            | FormatError::BadMagic { path, .. }
            | FormatError::Truncated { path, .. }
            | FormatError::Invalid { path, .. }
            | FormatError::TooLarge { path, .. }
            | FormatError::Unsupported { path, .. }
            | FormatError::Missing { path, .. } => path,
        }
    }

    /// Shorthand for [`FormatError::Invalid`].
    pub(crate) fn invalid(path: &std::path::Path, field: impl Into<String>, reason: impl Into<String>) -> FormatError {
        FormatError::Invalid { path: path.to_path_buf(), field: field.into(), reason: reason.into() }
    }
}
