//! The disk tier's error type (a leaf: the tier and its writer thread both name it).

use std::path::PathBuf;

/// Why the disk tier could not start, or stopped.
#[derive(Debug, thiserror::Error)]
pub enum DiskError {
    #[error("prefix cache directory: cannot {op} {}: {source}", path.display())]
    Io {
        path: PathBuf,
        op: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("a prefix cache disk budget of {max} bytes holds no block ({file} bytes per block file)")]
    Budget { max: u64, file: u64 },
}
