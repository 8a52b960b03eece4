//! GGUF reader (versions 2 and 3), memory-mapped and hardened, and a small writer.
//!
//! On-disk layout (little-endian; ggml/include/gguf.h, ggml/docs/gguf.md):
//! 1. magic `GGUF` (4 bytes), u32 version (2 or 3), u64 tensor_count, u64 metadata_kv_count
//!    (version 1 had u32 counts and is rejected; big-endian files, which gguf-py can write,
//!    keep the magic but byte-swap the version, and are rejected)
//! 2. metadata_kv_count key/value pairs: string key, u32 value type, value
//!    (strings are u64 length + UTF-8 bytes; arrays are u32 element type + u64 count +
//!    elements, and may nest)
//! 3. tensor_count tensor infos: string name, u32 n_dims, n_dims x u64 ne (ne[0] innermost),
//!    u32 ggml type, u64 offset relative to the data section
//! 4. padding to `general.alignment` (default 32), then the data section.
//!
//! Everything is validated when the file is opened (see `reader.rs` and `limits.rs`), so
//! accessors never fail on offsets. Strings, keys and names must be valid UTF-8: every
//! known writer (gguf-py, llama.cpp) emits UTF-8, so invalid bytes mean a corrupt file and
//! are rejected with the key and byte offset rather than replaced lossily.

mod access;
pub mod limits;
mod reader;
mod value;
pub mod writer;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use crate::storage::SharedBytes;
use crate::{FormatError, GgmlType};

pub use value::{GgufValue, GgufValueType};

/// The GGUF magic, the bytes `GGUF` (`GGUF_MAGIC` in gguf.h).
pub const GGUF_MAGIC: [u8; 4] = *b"GGUF";

/// One tensor's entry in the GGUF header.
#[derive(Debug, Clone, PartialEq)]
pub struct GgufTensorInfo {
    pub name: String,
    /// Dimensions in ggml order: `dims[0]` is the innermost (contiguous) one.
    /// A weight of Hugging Face shape `[out, in]` is stored as `dims = [in, out]`.
    pub dims: Vec<u64>,
    pub ggml_type: GgmlType,
    /// Offset of the tensor's bytes from the start of the data section.
    pub offset: u64,
    /// Bytes the tensor occupies (checked to lie inside the file).
    pub size_bytes: u64,
}

impl GgufTensorInfo {
    /// Number of elements (checked not to overflow when the file was opened).
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d)).unwrap_or(u64::MAX)
    }

    /// The shape in row-major (PyTorch) order: `dims` reversed. Each dim was checked at
    /// open to fit in `usize`.
    pub fn shape(&self) -> Vec<usize> {
        self.dims.iter().rev().map(|&d| usize::try_from(d).unwrap_or(usize::MAX)).collect()
    }
}

/// An opened, validated GGUF file, memory-mapped or held in memory.
#[derive(Debug)]
pub struct GgufFile {
    pub path: PathBuf,
    pub version: u32,
    /// Metadata in file order (keys are unique).
    pub metadata: Vec<(String, GgufValue)>,
    /// Tensor infos in file order (names are unique, ranges disjoint and inside the file).
    pub tensors: Vec<GgufTensorInfo>,
    pub alignment: u64,
    /// Absolute file offset of the data section.
    pub data_offset: u64,
    bytes: SharedBytes,
    key_index: HashMap<String, usize>,
    tensor_index: HashMap<String, usize>,
}

impl GgufFile {
    /// Memory-maps and validates the file at `path`.
    pub fn open(path: impl AsRef<Path>) -> Result<GgufFile, FormatError> {
        let path = path.as_ref();
        let bytes = SharedBytes::map_file(path)?;
        GgufFile::from_shared(path.to_path_buf(), bytes)
    }

    /// Validates an in-memory GGUF image; `label` names it in errors (a path or a tag).
    pub fn from_bytes(label: impl Into<PathBuf>, bytes: Vec<u8>) -> Result<GgufFile, FormatError> {
        GgufFile::from_shared(label.into(), SharedBytes::from_vec(bytes))
    }

    /// Validates bytes that are already shared (a mapping another container opened).
    pub fn from_shared(path: PathBuf, bytes: SharedBytes) -> Result<GgufFile, FormatError> {
        let parsed = reader::parse(&path, &bytes)?;
        Ok(GgufFile {
            path,
            version: parsed.version,
            metadata: parsed.metadata,
            tensors: parsed.tensors,
            alignment: parsed.alignment,
            data_offset: parsed.data_offset,
            bytes,
            key_index: parsed.key_index,
            tensor_index: parsed.tensor_index,
        })
    }

    /// The whole file's bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// A shareable handle on the file's bytes (for zero-copy tensors).
    pub fn shared_bytes(&self) -> SharedBytes {
        self.bytes.clone()
    }

    /// The metadata value under `key`.
    pub fn get(&self, key: &str) -> Option<&GgufValue> {
        let &i = self.key_index.get(key)?;
        self.metadata.get(i).map(|(_, v)| v)
    }

    /// Removes the metadata entry `key` and returns its value (`None` when absent): `get` no
    /// longer finds it and `metadata` no longer lists it. A loader that has converted a large
    /// array (a 262k-token vocabulary parses to ~30 MB of values) frees the parsed copy before
    /// it reads the tensors, so peak memory does not hold both.
    pub fn take_metadata(&mut self, key: &str) -> Option<GgufValue> {
        let i = self.key_index.remove(key)?;
        let (_, value) = self.metadata.remove(i);
        for at in self.key_index.values_mut() {
            if *at > i {
                *at -= 1;
            }
        }
        Some(value)
    }

    /// The tensor info named `name`.
    pub fn tensor(&self, name: &str) -> Option<&GgufTensorInfo> {
        let &i = self.tensor_index.get(name)?;
        self.tensors.get(i)
    }

    /// The tensor info named `name`, or an error naming the file and tensor.
    pub fn require_tensor(&self, name: &str) -> Result<&GgufTensorInfo, FormatError> {
        self.tensor(name).ok_or_else(|| FormatError::Missing {
            path: self.path.clone(),
            what: "tensor",
            name: name.to_string(),
        })
    }

    /// The bytes of a tensor of this file (a slice of the mapping; bounds were checked at
    /// open). An info that does not belong to this file yields an empty slice rather than
    /// a panic.
    pub fn tensor_data(&self, info: &GgufTensorInfo) -> &[u8] {
        self.tensor_range(info).and_then(|r| self.bytes.get(r)).unwrap_or_default()
    }

    /// Where `info`'s bytes lie in [`Self::shared_bytes`]: `None` for an info that does not
    /// belong to this file.
    pub fn tensor_bytes_range(&self, info: &GgufTensorInfo) -> Option<std::ops::Range<usize>> {
        self.tensor_range(info).filter(|r| r.end <= self.bytes.len())
    }

    /// Where `info`'s bytes lie in the file, checked against nothing but overflow
    /// (`tensor_data` and the mapping's methods check the bounds).
    fn tensor_range(&self, info: &GgufTensorInfo) -> Option<std::ops::Range<usize>> {
        let start = self.data_offset.checked_add(info.offset)?;
        let end = start.checked_add(info.size_bytes)?;
        Some(usize::try_from(start).ok()?..usize::try_from(end).ok()?)
    }

    /// Starts reading `info`'s bytes from disk ahead of their use ([`SharedBytes::prefetch`]).
    pub fn prefetch_tensor(&self, info: &GgufTensorInfo) {
        if let Some(r) = self.tensor_range(info) {
            self.bytes.prefetch(r);
        }
    }

    /// Drops `info`'s pages from the resident set once they have been copied elsewhere
    /// ([`SharedBytes::release`]); the bytes stay readable.
    pub fn release_tensor(&self, info: &GgufTensorInfo) {
        if let Some(r) = self.tensor_range(info) {
            self.bytes.release(r);
        }
    }

    /// [`Self::release_tensor`] for the bytes `part` of the tensor (offsets into its data).
    pub fn release_tensor_part(&self, info: &GgufTensorInfo, part: std::ops::Range<usize>) {
        if let Some(r) = self.tensor_range(info) {
            if let (Some(start), Some(end)) = (r.start.checked_add(part.start), r.start.checked_add(part.end)) {
                if end <= r.end {
                    self.bytes.release(start..end);
                }
            }
        }
    }

    /// The bytes of the tensor named `name`.
    pub fn tensor_bytes(&self, name: &str) -> Result<&[u8], FormatError> {
        Ok(self.tensor_data(self.require_tensor(name)?))
    }
}
