//! safetensors files, memory-mapped, parsed by the `safetensors` crate and hardened.
//!
//! Layout (huggingface/safetensors README): u64 little-endian header length N, N bytes of
//! UTF-8 JSON `{name: {dtype, shape, data_offsets: [start, end]}, "__metadata__": {..}}`,
//! then the data section; offsets are relative to the data section.
//!
//! What we add to the crate (see `header.rs`): duplicate JSON keys are refused (the crate
//! keeps the last silently), and every error names the file, the tensor and the field.
//! The crate already rejects overflowing shapes, byte lengths that differ from shape x
//! dtype, and overlapping or gap-leaving offsets; our pass checks the same first so the
//! message can say which tensor.
//!
//! Header size cap: [`MAX_HEADER_LEN`], 100,000,000 bytes, the crate's own hard limit
//! (`MAX_HEADER_SIZE` in safetensors 0.8.0 `tensor.rs`). It is a trade-off
//! (docs/parsers-threat-model.md): checkpoints with tens of thousands of tensors can approach it,
//! and such a file is refused with a `TooLarge` error naming the limit rather than read
//! by a second, uncapped parser. The header is checked against the file length first, so
//! a huge declared length in a small file fails before anything is allocated.

mod checkpoint;
mod header;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

pub use checkpoint::SafetensorsCheckpoint;
pub use safetensors::Dtype;

use crate::storage::SharedBytes;
use crate::FormatError;

/// Longest JSON header accepted: the `safetensors` crate's `MAX_HEADER_SIZE`.
pub const MAX_HEADER_LEN: u64 = 100_000_000;

/// Bytes of the header-length prefix.
const LEN_PREFIX: usize = 8;

/// One tensor of a safetensors file.
#[derive(Debug, Clone, PartialEq)]
pub struct SafetensorsTensorInfo {
    pub name: String,
    pub dtype: Dtype,
    /// Row-major shape.
    pub shape: Vec<usize>,
    /// Byte range `[start, end)` within the data section (checked to lie inside the file).
    pub data_offsets: (usize, usize),
}

impl SafetensorsTensorInfo {
    /// Number of elements (checked not to overflow at open).
    pub fn n_elements(&self) -> usize {
        self.shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d)).unwrap_or(usize::MAX)
    }
}

/// An opened, validated safetensors file.
#[derive(Debug)]
pub struct SafetensorsFile {
    pub path: PathBuf,
    /// Tensors in data order.
    pub tensors: Vec<SafetensorsTensorInfo>,
    /// The `__metadata__` string map (empty when absent).
    pub metadata: BTreeMap<String, String>,
    /// Absolute file offset of the data section (8 + header length).
    pub data_offset: usize,
    bytes: SharedBytes,
    index: HashMap<String, usize>,
}

impl SafetensorsFile {
    /// Memory-maps and validates the file at `path`.
    pub fn open(path: impl AsRef<Path>) -> Result<SafetensorsFile, FormatError> {
        let path = path.as_ref();
        let bytes = SharedBytes::map_file(path)?;
        SafetensorsFile::from_shared(path.to_path_buf(), bytes)
    }

    /// Validates an in-memory safetensors image; `label` names it in errors.
    pub fn from_bytes(label: impl Into<PathBuf>, bytes: Vec<u8>) -> Result<SafetensorsFile, FormatError> {
        SafetensorsFile::from_shared(label.into(), SharedBytes::from_vec(bytes))
    }

    /// Validates bytes that are already shared.
    pub fn from_shared(path: PathBuf, bytes: SharedBytes) -> Result<SafetensorsFile, FormatError> {
        let file_len = bytes.len() as u64;
        let prefix: [u8; LEN_PREFIX] = bytes.get(..LEN_PREFIX).and_then(|b| b.try_into().ok()).ok_or_else(|| {
            FormatError::Truncated { path: path.clone(), field: "header length".into(), offset: 0, file_len }
        })?;
        let header_len = u64::from_le_bytes(prefix);
        if header_len > MAX_HEADER_LEN {
            return Err(FormatError::TooLarge {
                path,
                field: "header length".into(),
                value: header_len,
                limit: MAX_HEADER_LEN,
            });
        }
        // header_len <= 1e8, so neither the cast nor the sum can overflow.
        let data_offset = LEN_PREFIX + header_len as usize;
        let Some(json) = bytes.get(LEN_PREFIX..data_offset) else {
            return Err(FormatError::Truncated {
                path,
                field: format!("header ({header_len} bytes declared)"),
                offset: LEN_PREFIX as u64,
                file_len,
            });
        };
        let data_len = bytes.len().saturating_sub(data_offset);
        let (entries, metadata) = header::validate(&path, json, data_len)?;

        // The crate's parse, as the format's reference implementation: if it disagrees
        // with our pass, refuse the file rather than guess which one is right.
        let (_, crate_meta) = safetensors::SafeTensors::read_metadata(&bytes)
            .map_err(|e| FormatError::invalid(&path, "header", e.to_string()))?;
        let mut tensors = Vec::with_capacity(entries.len());
        let mut index = HashMap::with_capacity(entries.len());
        for e in entries {
            let agrees = crate_meta
                .info(&e.name)
                .is_some_and(|i| i.dtype == e.dtype && i.shape == e.shape && i.data_offsets == (e.start, e.end));
            if !agrees {
                return Err(FormatError::invalid(
                    &path,
                    format!("tensor '{}'", e.name),
                    "the safetensors crate reads this entry differently",
                ));
            }
            index.insert(e.name.clone(), tensors.len());
            tensors.push(SafetensorsTensorInfo {
                name: e.name,
                dtype: e.dtype,
                shape: e.shape,
                data_offsets: (e.start, e.end),
            });
        }
        Ok(SafetensorsFile { path, tensors, metadata, data_offset, bytes, index })
    }

    /// Tensor names in data order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tensors.iter().map(|t| t.name.as_str())
    }

    /// The tensor named `name`.
    pub fn tensor(&self, name: &str) -> Option<&SafetensorsTensorInfo> {
        self.index.get(name).and_then(|&i| self.tensors.get(i))
    }

    /// The tensor named `name`, or an error naming the file and tensor.
    pub fn require_tensor(&self, name: &str) -> Result<&SafetensorsTensorInfo, FormatError> {
        self.tensor(name).ok_or_else(|| FormatError::Missing {
            path: self.path.clone(),
            what: "tensor",
            name: name.to_string(),
        })
    }

    pub fn dtype(&self, name: &str) -> Result<Dtype, FormatError> {
        Ok(self.require_tensor(name)?.dtype)
    }

    pub fn shape(&self, name: &str) -> Result<&[usize], FormatError> {
        Ok(&self.require_tensor(name)?.shape)
    }

    /// The raw little-endian bytes of a tensor of this file (a slice of the mapping). An
    /// info from another file yields an empty slice rather than a panic.
    pub fn tensor_data(&self, info: &SafetensorsTensorInfo) -> &[u8] {
        self.tensor_range(info).and_then(|r| self.bytes.get(r)).unwrap_or_default()
    }

    /// Starts reading `info`'s bytes from disk ahead of their use ([`SharedBytes::prefetch`]).
    pub fn prefetch_tensor(&self, info: &SafetensorsTensorInfo) {
        if let Some(r) = self.tensor_range(info) {
            self.bytes.prefetch(r);
        }
    }

    /// Drops `info`'s pages from the resident set once they have been copied elsewhere
    /// ([`SharedBytes::release`]); the bytes stay readable.
    pub fn release_tensor(&self, info: &SafetensorsTensorInfo) {
        if let Some(r) = self.tensor_range(info) {
            self.bytes.release(r);
        }
    }

    /// [`Self::release_tensor`] for the bytes `part` of the tensor (offsets into its data).
    pub fn release_tensor_part(&self, info: &SafetensorsTensorInfo, part: std::ops::Range<usize>) {
        if let Some(r) = self.tensor_range(info) {
            if let (Some(start), Some(end)) = (r.start.checked_add(part.start), r.start.checked_add(part.end)) {
                if end <= r.end {
                    self.bytes.release(start..end);
                }
            }
        }
    }

    fn tensor_range(&self, info: &SafetensorsTensorInfo) -> Option<std::ops::Range<usize>> {
        let (s, e) = info.data_offsets;
        Some(self.data_offset.checked_add(s)?..self.data_offset.checked_add(e)?)
    }

    /// The raw bytes of the tensor named `name`.
    pub fn tensor_bytes(&self, name: &str) -> Result<&[u8], FormatError> {
        Ok(self.tensor_data(self.require_tensor(name)?))
    }

    /// The tensor's values converted to f32 (F32 copied, F16 and BF16 widened exactly).
    pub fn to_f32(&self, name: &str) -> Result<Vec<f32>, FormatError> {
        let info = self.require_tensor(name)?;
        decode_f32(&self.path, info, self.tensor_data(info))
    }

    /// A shareable handle on the file's bytes.
    pub fn shared_bytes(&self) -> SharedBytes {
        self.bytes.clone()
    }
}

/// Widens F32/F16/BF16 little-endian bytes to f32.
fn decode_f32(path: &Path, info: &SafetensorsTensorInfo, bytes: &[u8]) -> Result<Vec<f32>, FormatError> {
    fn words<const N: usize>(bytes: &[u8]) -> impl Iterator<Item = [u8; N]> + '_ {
        bytes.chunks_exact(N).filter_map(|c| c.try_into().ok())
    }
    fn pairs(bytes: &[u8]) -> impl Iterator<Item = u16> + '_ {
        words::<2>(bytes).map(u16::from_le_bytes)
    }
    let values: Vec<f32> = match info.dtype {
        Dtype::F32 => words::<4>(bytes).map(f32::from_le_bytes).collect(),
        Dtype::F16 => pairs(bytes).map(|b| half::f16::from_bits(b).to_f32()).collect(),
        Dtype::BF16 => pairs(bytes).map(|b| half::bf16::from_bits(b).to_f32()).collect(),
        other => {
            return Err(FormatError::Unsupported {
                path: path.to_path_buf(),
                what: format!("conversion to f32 of tensor '{}' with dtype {other} (F32, F16, BF16 only)", info.name),
            })
        }
    };
    // Lengths were validated at open; a mismatch means `info` came from another file.
    if values.len() != info.n_elements() {
        return Err(FormatError::invalid(
            path,
            format!("tensor '{}'", info.name),
            format!("{} values decoded, shape needs {}", values.len(), info.n_elements()),
        ));
    }
    Ok(values)
}

/// Parses sharded-checkpoint index JSON without opening shards (the fuzzing entry point).
#[cfg(feature = "fuzzing")]
pub(crate) fn checkpoint_index_for_fuzzing(bytes: &[u8]) -> bool {
    checkpoint::parse_index(Path::new("fuzz.index.json"), bytes).is_ok()
}

/// Serializes tensors into a safetensors image, for tests and fuzzing. Entries are
/// `(name, dtype, shape, bytes)` and are laid out in the order given.
pub fn write_safetensors(tensors: &[(&str, Dtype, &[usize], &[u8])], metadata: &BTreeMap<String, String>) -> Vec<u8> {
    let mut header = serde_json::Map::new();
    if !metadata.is_empty() {
        let meta = metadata.iter().map(|(k, v)| (k.clone(), v.clone().into())).collect();
        header.insert("__metadata__".into(), serde_json::Value::Object(meta));
    }
    let mut offset = 0usize;
    for (name, dtype, shape, bytes) in tensors {
        let end = offset + bytes.len();
        header.insert(
            (*name).to_string(),
            serde_json::json!({"dtype": dtype.to_string(), "shape": shape, "data_offsets": [offset, end]}),
        );
        offset = end;
    }
    let mut json = serde_json::Value::Object(header).to_string().into_bytes();
    // The format pads the header with spaces to an 8-byte multiple (safetensors README).
    while !json.len().is_multiple_of(8) {
        json.push(b' ');
    }
    let mut out = (json.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&json);
    for (_, _, _, bytes) in tensors {
        out.extend_from_slice(bytes);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_and_converts_float_types() {
        let f32s: Vec<u8> = [1.5f32, -2.0].iter().flat_map(|v| v.to_le_bytes()).collect();
        let f16s: Vec<u8> = [half::f16::from_f32(0.5)].iter().flat_map(|v| v.to_le_bytes()).collect();
        let bf16s: Vec<u8> =
            [half::bf16::from_f32(-3.0), half::bf16::from_f32(8.0)].iter().flat_map(|v| v.to_le_bytes()).collect();
        let meta = BTreeMap::from([("format".to_string(), "pt".to_string())]);
        let bytes = write_safetensors(
            &[
                ("a", Dtype::F32, &[2], &f32s),
                ("h", Dtype::F16, &[1, 1], &f16s),
                ("b", Dtype::BF16, &[2, 1], &bf16s),
                ("i", Dtype::I32, &[1], &[1, 0, 0, 0]),
            ],
            &meta,
        );
        let f = SafetensorsFile::from_bytes("m.safetensors", bytes).expect("valid");
        assert_eq!(f.names().collect::<Vec<_>>(), ["a", "h", "b", "i"]);
        assert_eq!(f.metadata, meta);
        assert_eq!(f.to_f32("a").ok(), Some(vec![1.5, -2.0]));
        assert_eq!(f.to_f32("h").ok(), Some(vec![0.5]));
        assert_eq!(f.to_f32("b").ok(), Some(vec![-3.0, 8.0]));
        assert_eq!(f.shape("b").ok(), Some(&[2usize, 1][..]));
        assert_eq!(f.dtype("i").ok(), Some(Dtype::I32));
        assert_eq!(f.tensor_bytes("i").ok(), Some(&[1u8, 0, 0, 0][..]));
        let err = f.to_f32("i").unwrap_err().to_string();
        assert!(err.contains("m.safetensors") && err.contains("tensor 'i'") && err.contains("I32"), "{err}");
        let err = f.to_f32("nope").unwrap_err().to_string();
        assert!(err.contains("no tensor named 'nope'"), "{err}");
    }

    #[test]
    fn empty_file_and_empty_header() {
        assert!(SafetensorsFile::from_bytes("e", vec![]).is_err());
        let ok = write_safetensors(&[], &BTreeMap::new());
        assert_eq!(SafetensorsFile::from_bytes("e", ok).map(|f| f.tensors.len()).ok(), Some(0));
    }
}
