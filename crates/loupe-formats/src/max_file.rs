//! Modular MAX's `.max` tensor files (the `BINARY_MAX_CHECKPOINT` print style): one tensor
//! per file. Reader and writer, byte for byte as docs/dump-format.md, "The `.max` file":
//!
//! | offset | size | field |
//! | --- | --- | --- |
//! | 0 | 8 | magic `93 F0 9F 94 A5 2B 2B 93` |
//! | 8 | 4 | u32 major = 0 (readers reject > 0) |
//! | 12 | 4 | u32 minor = 1 |
//! | 16 | 8 | u64 metadata_size = 4 + keylen + 2 + 4*rank + 8 |
//! | 24 | 4 | u32 keylen |
//! | 28 | keylen | key (the sanitized label, no NUL) |
//! | then | 1 | u8 dtype code |
//! | then | 1 | u8 rank |
//! | then | 4*rank | u32 dims |
//! | then | 8 | u64 data offset = 24 + metadata_size |
//! | offset | rest | contiguous tensor data |
//!
//! Integers are in native byte order, little-endian on every machine MAX runs on; we read
//! and write little-endian. The metadata size and the data offset are redundant, and both
//! are checked: a file where they disagree is corrupt.

use std::path::{Path, PathBuf};

use crate::elem::{element_count, ElemType, StoredTensor, MAX_RANK};
use crate::storage::SharedBytes;
use crate::FormatError;

/// The magic bytes.
pub const MAX_MAGIC: [u8; 8] = [0x93, 0xF0, 0x9F, 0x94, 0xA5, 0x2B, 0x2B, 0x93];
/// The format version we write; readers reject a major version above 0.
pub const MAX_VERSION: (u32, u32) = (0, 1);
/// Longest key accepted: labels are module paths plus a suffix, well under 1 KiB.
pub const MAX_KEY_LEN: u32 = 64 * 1024;

/// MAX's dtype code for an element type (docs/dump-format.md, "The `.max` file").
pub fn max_dtype_code(t: ElemType) -> u8 {
    match t {
        ElemType::Bool => 1,
        ElemType::U8 => 134,
        ElemType::U16 => 136,
        ElemType::U32 => 138,
        ElemType::U64 => 140,
        ElemType::I8 => 135,
        ElemType::I16 => 137,
        ElemType::I32 => 139,
        ElemType::I64 => 141,
        ElemType::F16 => 79,
        ElemType::BF16 => 80,
        ElemType::F32 => 81,
        ElemType::F64 => 82,
        ElemType::F8E4M3Fn => 75,
        ElemType::F8E5M2 => 77,
    }
}

/// The element type of a MAX dtype code; `Err(name)` for types MAX has and we do not read.
fn elem_of_code(code: u8) -> Result<ElemType, Option<&'static str>> {
    Ok(match code {
        1 => ElemType::Bool,
        134 => ElemType::U8,
        136 => ElemType::U16,
        138 => ElemType::U32,
        140 => ElemType::U64,
        135 => ElemType::I8,
        137 => ElemType::I16,
        139 => ElemType::I32,
        141 => ElemType::I64,
        79 => ElemType::F16,
        80 => ElemType::BF16,
        81 => ElemType::F32,
        82 => ElemType::F64,
        75 => ElemType::F8E4M3Fn,
        77 => ElemType::F8E5M2,
        64 => return Err(Some("f4_e2m1fn")),
        65 => return Err(Some("f6_e2m3fn")),
        66 => return Err(Some("f6_e3m2fn")),
        73 => return Err(Some("f8_e8m0fnu")),
        76 => return Err(Some("f8_e4m3fnuz")),
        78 => return Err(Some("f8_e5m2fnuz")),
        _ => return Err(None),
    })
}

/// MAX's file-name sanitization of a label: `` \/:?"<>| `` and space become `_`.
pub fn sanitize_label(label: &str) -> String {
    label
        .chars()
        .map(|c| if matches!(c, '\\' | '/' | ':' | '?' | '"' | '<' | '>' | '|' | ' ') { '_' } else { c })
        .collect()
}

/// An opened `.max` file.
#[derive(Debug, Clone)]
pub struct MaxFile {
    pub path: PathBuf,
    pub version: (u32, u32),
    pub key: String,
    pub tensor: StoredTensor,
}

impl MaxFile {
    /// Memory-maps and validates `path`.
    pub fn open(path: impl AsRef<Path>) -> Result<MaxFile, FormatError> {
        let path = path.as_ref();
        MaxFile::from_shared(path.to_path_buf(), SharedBytes::map_file(path)?)
    }

    /// Validates an in-memory image; `label` names it in errors.
    pub fn from_bytes(label: impl Into<PathBuf>, bytes: Vec<u8>) -> Result<MaxFile, FormatError> {
        MaxFile::from_shared(label.into(), SharedBytes::from_vec(bytes))
    }

    pub fn from_shared(path: PathBuf, bytes: SharedBytes) -> Result<MaxFile, FormatError> {
        let mut r = Reader { path: &path, b: &bytes, pos: 0 };
        let magic = r.take(8, "magic")?;
        if magic != MAX_MAGIC {
            return Err(FormatError::BadMagic {
                path: path.clone(),
                format: "MAX .max",
                found: format!("{magic:02x?}"),
            });
        }
        let major = r.u32("major version")?;
        let minor = r.u32("minor version")?;
        if major > MAX_VERSION.0 {
            return Err(FormatError::Unsupported {
                path: path.clone(),
                what: format!(".max format version {major}.{minor} (major 0 is read)"),
            });
        }
        let metadata_size = r.u64("metadata size")?;
        let keylen = r.u32("key length")?;
        if keylen > MAX_KEY_LEN {
            return Err(FormatError::TooLarge {
                path: path.clone(),
                field: "key length".into(),
                value: u64::from(keylen),
                limit: u64::from(MAX_KEY_LEN),
            });
        }
        let key_bytes = r.take(keylen as usize, "key")?;
        let key =
            std::str::from_utf8(key_bytes).map_err(|_| FormatError::invalid(&path, "key", "not UTF-8"))?.to_string();
        let code = r.take(1, "dtype code")?.first().copied().unwrap_or(0);
        let dtype = elem_of_code(code).map_err(|name| FormatError::Unsupported {
            path: path.clone(),
            what: match name {
                Some(n) => format!("dtype {n} (code {code}) of tensor '{key}'"),
                None => format!("unknown dtype code {code} of tensor '{key}'"),
            },
        })?;
        let rank = usize::from(r.take(1, "rank")?.first().copied().unwrap_or(0));
        if rank > MAX_RANK {
            return Err(FormatError::TooLarge {
                path: path.clone(),
                field: "rank".into(),
                value: rank as u64,
                limit: MAX_RANK as u64,
            });
        }
        let mut shape = Vec::with_capacity(rank);
        for i in 0..rank {
            shape.push(r.u32(&format!("dim {i}"))? as usize);
        }
        let data_offset = r.u64("data offset")?;
        let expected_meta = 4 + u64::from(keylen) + 2 + 4 * rank as u64 + 8;
        if metadata_size != expected_meta {
            return Err(FormatError::invalid(
                &path,
                "metadata size",
                format!("{metadata_size}, but key and shape need {expected_meta}"),
            ));
        }
        if data_offset != 24 + metadata_size {
            return Err(FormatError::invalid(
                &path,
                "data offset",
                format!("{data_offset}, expected 24 + metadata size = {}", 24 + metadata_size),
            ));
        }
        element_count(&path, "tensor", &shape)?;
        // data_offset equals the bytes consumed so far, so it lies inside the file.
        let start = r.pos;
        let tensor = StoredTensor::contiguous(
            &path,
            &format!("tensor '{key}' data"),
            dtype,
            shape,
            bytes.clone(),
            start..bytes.len(),
            true,
        )?;
        Ok(MaxFile { path, version: (major, minor), key, tensor })
    }
}

struct Reader<'a> {
    path: &'a Path,
    b: &'a [u8],
    pos: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: usize, field: &str) -> Result<&[u8], FormatError> {
        let s =
            self.pos.checked_add(n).and_then(|e| self.b.get(self.pos..e)).ok_or_else(|| FormatError::Truncated {
                path: self.path.to_path_buf(),
                field: field.into(),
                offset: self.pos as u64,
                file_len: self.b.len() as u64,
            })?;
        self.pos += n;
        Ok(s)
    }
    fn u32(&mut self, field: &str) -> Result<u32, FormatError> {
        let s = self.take(4, field)?;
        Ok(u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
    }
    fn u64(&mut self, field: &str) -> Result<u64, FormatError> {
        let s = self.take(8, field)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(s);
        Ok(u64::from_le_bytes(a))
    }
}

/// The bytes of a `.max` file holding `data` (little-endian elements of `dtype`, row-major)
/// under `key` (written as given; use [`sanitize_label`] for labels).
pub fn max_bytes(key: &str, dtype: ElemType, shape: &[usize], data: &[u8]) -> Result<Vec<u8>, FormatError> {
    let label = Path::new("<.max writer>");
    let n = element_count(label, "tensor", shape)?;
    if shape.len() > 255 || shape.iter().any(|&d| d > u32::MAX as usize) {
        return Err(FormatError::invalid(
            label,
            "shape",
            format!("{shape:?} does not fit the format (rank <= 255, dims < 2^32)"),
        ));
    }
    if n.checked_mul(dtype.size() as u64) != Some(data.len() as u64) {
        return Err(FormatError::invalid(
            label,
            "data",
            format!("{} bytes for {n} {} elements", data.len(), dtype.name()),
        ));
    }
    let keylen = u32::try_from(key.len()).ok().filter(|&k| k <= MAX_KEY_LEN).ok_or_else(|| FormatError::TooLarge {
        path: label.to_path_buf(),
        field: "key length".into(),
        value: key.len() as u64,
        limit: u64::from(MAX_KEY_LEN),
    })?;
    let metadata_size = 4 + u64::from(keylen) + 2 + 4 * shape.len() as u64 + 8;
    let mut out = Vec::with_capacity(24 + metadata_size as usize + data.len());
    out.extend_from_slice(&MAX_MAGIC);
    out.extend_from_slice(&MAX_VERSION.0.to_le_bytes());
    out.extend_from_slice(&MAX_VERSION.1.to_le_bytes());
    out.extend_from_slice(&metadata_size.to_le_bytes());
    out.extend_from_slice(&keylen.to_le_bytes());
    out.extend_from_slice(key.as_bytes());
    out.push(max_dtype_code(dtype));
    out.push(shape.len() as u8);
    for &d in shape {
        out.extend_from_slice(&(d as u32).to_le_bytes());
    }
    out.extend_from_slice(&(24 + metadata_size).to_le_bytes());
    out.extend_from_slice(data);
    Ok(out)
}

/// Writes an f32 tensor as `path`, keyed by `key`.
pub fn write_max(path: impl AsRef<Path>, key: &str, shape: &[usize], data: &[f32]) -> Result<(), FormatError> {
    let path = path.as_ref();
    let raw: Vec<u8> = data.iter().flat_map(|v| v.to_le_bytes()).collect();
    let bytes =
        max_bytes(key, ElemType::F32, shape, &raw).map_err(|e| FormatError::invalid(path, "tensor", e.to_string()))?;
    std::fs::write(path, bytes).map_err(|source| FormatError::Io { path: path.to_path_buf(), source })
}
