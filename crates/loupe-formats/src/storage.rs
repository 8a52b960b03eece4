//! The bytes behind an opened container: a read-only memory map of the file, or an owned
//! buffer (files built in memory by tests, fuzzers and writers).
//!
//! `SharedBytes` is cheap to clone, so tensors of other crates can keep borrowing the
//! mapping after the container's header structures are dropped.

use std::fmt;
use std::ops::Deref;
use std::path::Path;
use std::sync::Arc;

use crate::FormatError;

/// Immutable, shareable file contents.
#[derive(Clone)]
pub struct SharedBytes(Arc<Backing>);

enum Backing {
    Mapped(memmap2::Mmap),
    Owned(Vec<u8>),
}

impl SharedBytes {
    /// Memory-maps `path` read-only.
    pub fn map_file(path: &Path) -> Result<SharedBytes, FormatError> {
        let io = |source| FormatError::Io { path: path.to_path_buf(), source };
        let file = std::fs::File::open(path).map_err(io)?;
        let meta = file.metadata().map_err(io)?;
        if !meta.is_file() {
            return Err(io(std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a regular file")));
        }
        if meta.len() == 0 {
            // Some platforms refuse zero-length maps; an empty buffer behaves the same.
            return Ok(SharedBytes::from_vec(Vec::new()));
        }
        // SAFETY: the map is read-only. Memory-mapping is sound as long as no other process
        // truncates or rewrites the file while it is mapped; like every mmap-based model
        // loader (llama.cpp, candle, safetensors) we accept that contract, because reading
        // multi-gigabyte weights into RAM is the alternative. Every offset taken from the
        // file is still bounds-checked against the map's length before slicing.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
        Ok(SharedBytes(Arc::new(Backing::Mapped(map))))
    }

    /// Wraps an owned buffer.
    pub fn from_vec(bytes: Vec<u8>) -> SharedBytes {
        SharedBytes(Arc::new(Backing::Owned(bytes)))
    }

    /// Whether the bytes come from a memory map (as opposed to an owned buffer).
    pub fn is_mapped(&self) -> bool {
        matches!(*self.0, Backing::Mapped(_))
    }

    /// The bytes as a slice.
    pub fn as_slice(&self) -> &[u8] {
        match &*self.0 {
            Backing::Mapped(m) => m,
            Backing::Owned(v) => v,
        }
    }
}

impl Deref for SharedBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl AsRef<[u8]> for SharedBytes {
    fn as_ref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl fmt::Debug for SharedBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = if self.is_mapped() { "mapped" } else { "owned" };
        write!(f, "SharedBytes({kind}, {} bytes)", self.len())
    }
}
