//! The GGUF header parser. Reads untrusted bytes: every read is bounds-checked, every
//! count is capped (`limits.rs`) and checked against the bytes left before allocating,
//! and every size uses checked arithmetic. Errors name the file, the field (key, tensor,
//! array index) and the byte offset.

use std::collections::HashMap;
use std::path::Path;

use super::limits::*;
use super::{GgufTensorInfo, GgufValue, GgufValueType, GGUF_MAGIC};
use crate::{FormatError, GgmlType};

/// Fewest bytes of one metadata pair: u64 key length, u32 value type, a 1-byte value.
const MIN_KV_SIZE: u64 = 8 + 4 + 1;
/// Fewest bytes of one tensor info: u64 name length, u32 n_dims, one u64 dim, u32 type,
/// u64 offset.
const MIN_TENSOR_INFO_SIZE: u64 = 8 + 4 + 8 + 4 + 8;

/// The validated header of a GGUF file.
pub(super) struct Parsed {
    pub version: u32,
    pub metadata: Vec<(String, GgufValue)>,
    pub key_index: HashMap<String, usize>,
    pub tensors: Vec<GgufTensorInfo>,
    pub tensor_index: HashMap<String, usize>,
    pub alignment: u64,
    pub data_offset: u64,
}

/// Names the field being read, built only when an error needs it.
type Field<'f> = &'f dyn Fn() -> String;

/// Metadata in file order, and key -> position.
type Metadata = (Vec<(String, GgufValue)>, HashMap<String, usize>);

/// Parses and validates a whole GGUF image.
pub(super) fn parse(path: &Path, buf: &[u8]) -> Result<Parsed, FormatError> {
    let mut r = Reader { path, buf, pos: 0, values_left: MAX_METADATA_VALUES };
    let version = r.magic_and_version()?;

    let n_tensors = r.u64(&|| "tensor count".into())?;
    let n_kv = r.u64(&|| "metadata kv count".into())?;
    r.cap(n_tensors, MAX_TENSORS, &|| "tensor count".into())?;
    r.cap(n_kv, MAX_METADATA_KVS, &|| "metadata kv count".into())?;
    // Both counts are capped at 2^20, so this cannot saturate; saturating keeps it obvious.
    let needed = n_kv.saturating_mul(MIN_KV_SIZE).saturating_add(n_tensors.saturating_mul(MIN_TENSOR_INFO_SIZE));
    if needed > r.remaining() {
        return Err(r.truncated(format!(
            "header: {n_kv} metadata kvs and {n_tensors} tensor infos need at least {needed} \
             bytes, {} left",
            r.remaining()
        )));
    }

    let (metadata, key_index) = r.metadata(n_kv)?;
    let alignment = alignment(path, &metadata, &key_index)?;
    let (tensors, tensor_index) = r.tensor_infos(n_tensors)?;

    // The data section starts at the end of the header, padded up to the alignment
    // (gguf.h, step 4). `alignment` is a power of two <= 1 MiB, so this cannot wrap
    // unless the position is within 1 MiB of u64::MAX, which checked_add catches.
    let header_end = r.pos as u64;
    let data_offset = header_end
        .checked_add(alignment - 1)
        .map(|v| v & !(alignment - 1))
        .ok_or_else(|| FormatError::invalid(path, "data section offset", "overflows u64"))?;
    check_tensor_ranges(path, buf.len() as u64, data_offset, alignment, &tensors)?;

    Ok(Parsed { version, metadata, key_index, tensors, tensor_index, alignment, data_offset })
}

struct Reader<'a> {
    path: &'a Path,
    buf: &'a [u8],
    pos: usize,
    /// Budget of metadata values still allowed (`MAX_METADATA_VALUES`).
    values_left: u64,
}

impl<'a> Reader<'a> {
    fn remaining(&self) -> u64 {
        self.buf.len().saturating_sub(self.pos) as u64
    }

    fn truncated(&self, field: String) -> FormatError {
        FormatError::Truncated {
            path: self.path.to_path_buf(),
            field,
            offset: self.pos as u64,
            file_len: self.buf.len() as u64,
        }
    }

    fn invalid(&self, field: String, reason: impl Into<String>) -> FormatError {
        FormatError::Invalid {
            path: self.path.to_path_buf(),
            field,
            reason: format!("{} (at byte offset {})", reason.into(), self.pos),
        }
    }

    fn cap(&self, value: u64, limit: u64, field: Field) -> Result<(), FormatError> {
        if value > limit {
            return Err(FormatError::TooLarge { path: self.path.to_path_buf(), field: field(), value, limit });
        }
        Ok(())
    }

    fn take(&mut self, n: u64, field: Field) -> Result<&'a [u8], FormatError> {
        let slice = usize::try_from(n)
            .ok()
            .and_then(|n| Some((n, self.pos.checked_add(n)?)))
            .and_then(|(_, end)| self.buf.get(self.pos..end));
        match slice {
            Some(s) => {
                self.pos += s.len();
                Ok(s)
            }
            None => Err(self.truncated(field())),
        }
    }

    fn array<const N: usize>(&mut self, field: Field) -> Result<[u8; N], FormatError> {
        let start = self.pos;
        let bytes = self.take(N as u64, field)?;
        <[u8; N]>::try_from(bytes).map_err(|_| {
            self.pos = start;
            self.truncated(field())
        })
    }

    fn u32(&mut self, field: Field) -> Result<u32, FormatError> {
        self.array(field).map(u32::from_le_bytes)
    }

    fn u64(&mut self, field: Field) -> Result<u64, FormatError> {
        self.array(field).map(u64::from_le_bytes)
    }

    /// Reads the magic and version, rejecting v1 and big-endian files by name.
    fn magic_and_version(&mut self) -> Result<u32, FormatError> {
        let head = self.buf.get(..4).unwrap_or(self.buf);
        if head.len() < 4 && GGUF_MAGIC.starts_with(head) {
            return Err(self.truncated("magic".into()));
        }
        if head == b"FUGG" {
            return Err(
                self.unsupported("big-endian GGUF (magic is byte-swapped); loupe reads little-endian GGUF only")
            );
        }
        if head != GGUF_MAGIC {
            return Err(FormatError::BadMagic {
                path: self.path.to_path_buf(),
                format: "GGUF",
                found: format!("{head:02x?} {:?}{}", String::from_utf8_lossy(head), other_format_hint(self.buf)),
            });
        }
        self.pos = 4;
        let version = self.u32(&|| "version".into())?;
        match version {
            2 | 3 => Ok(version),
            1 => Err(self.unsupported(
                "GGUF version 1 (loupe reads versions 2 and 3; version 1 used 32-bit counts: \
                 re-convert the model with a current llama.cpp)",
            )),
            v if matches!(v.swap_bytes(), 1..=3) => Err(self.unsupported(format!(
                "big-endian GGUF (version field is {v:#010x}, version {} byte-swapped); \
                 loupe reads little-endian GGUF only",
                v.swap_bytes()
            ))),
            v => Err(self.unsupported(format!("GGUF version {v} (loupe reads versions 2 and 3)"))),
        }
    }

    fn unsupported(&self, what: impl Into<String>) -> FormatError {
        FormatError::Unsupported { path: self.path.to_path_buf(), what: what.into() }
    }

    /// Reads a u64-length-prefixed UTF-8 string of at most `cap` bytes.
    fn string(&mut self, cap: u64, field: Field) -> Result<String, FormatError> {
        let len = self.u64(&|| format!("{} string length", field()))?;
        self.cap(len, cap, &|| format!("{} string length", field()))?;
        let start = self.pos;
        let bytes = self.take(len, &|| format!("{} string bytes ({len} declared)", field()))?;
        match std::str::from_utf8(bytes) {
            Ok(s) => Ok(s.to_owned()),
            Err(e) => {
                self.pos = start + e.valid_up_to();
                Err(self.invalid(field(), "string is not valid UTF-8"))
            }
        }
    }

    fn value_type(&mut self, field: Field) -> Result<GgufValueType, FormatError> {
        let id = self.u32(field)?;
        GgufValueType::from_id(id)
            .ok_or_else(|| self.invalid(field(), format!("unknown value type id {id} (valid ids are 0..=12)")))
    }

    fn metadata(&mut self, n_kv: u64) -> Result<Metadata, FormatError> {
        // n_kv is capped and checked against the bytes left, so this allocation is bounded.
        let capacity = usize::try_from(n_kv).unwrap_or(0);
        let mut metadata = Vec::with_capacity(capacity);
        let mut index = HashMap::with_capacity(capacity);
        for i in 0..n_kv {
            let key_start = self.pos;
            let key = self.string(MAX_KEY_LEN, &|| format!("metadata kv #{i} key"))?;
            if key.is_empty() {
                self.pos = key_start;
                return Err(self.invalid(format!("metadata kv #{i} key"), "key is empty"));
            }
            if let Some(&first) = index.get(&key) {
                self.pos = key_start;
                return Err(
                    self.invalid(format!("metadata key '{key}'"), format!("duplicate key (kv #{first} and kv #{i})"))
                );
            }
            let field = || format!("metadata '{key}'");
            let ty = self.value_type(&|| format!("{} value type", field()))?;
            let value = self.value(ty, 0, &field)?;
            index.insert(key.clone(), metadata.len());
            metadata.push((key, value));
        }
        Ok((metadata, index))
    }

    /// Reads one value of type `ty`; `depth` counts the arrays enclosing it.
    fn value(&mut self, ty: GgufValueType, depth: usize, field: Field) -> Result<GgufValue, FormatError> {
        if depth == 0 {
            // Top-level values count against the budget here; array elements are counted
            // in bulk by their array.
            self.spend_values(1, field)?;
        }
        Ok(match ty {
            GgufValueType::U8 => GgufValue::U8(u8::from_le_bytes(self.array(field)?)),
            GgufValueType::I8 => GgufValue::I8(i8::from_le_bytes(self.array(field)?)),
            GgufValueType::U16 => GgufValue::U16(u16::from_le_bytes(self.array(field)?)),
            GgufValueType::I16 => GgufValue::I16(i16::from_le_bytes(self.array(field)?)),
            GgufValueType::U32 => GgufValue::U32(u32::from_le_bytes(self.array(field)?)),
            GgufValueType::I32 => GgufValue::I32(i32::from_le_bytes(self.array(field)?)),
            GgufValueType::U64 => GgufValue::U64(u64::from_le_bytes(self.array(field)?)),
            GgufValueType::I64 => GgufValue::I64(i64::from_le_bytes(self.array(field)?)),
            GgufValueType::F32 => GgufValue::F32(f32::from_le_bytes(self.array(field)?)),
            GgufValueType::F64 => GgufValue::F64(f64::from_le_bytes(self.array(field)?)),
            GgufValueType::Bool => {
                let [b] = self.array(field)?;
                match b {
                    0 => GgufValue::Bool(false),
                    1 => GgufValue::Bool(true),
                    // The spec: "Anything else is invalid" (ggml/docs/gguf.md, GGUF_TYPE_BOOL).
                    other => {
                        self.pos = self.pos.saturating_sub(1);
                        return Err(self.invalid(field(), format!("bool byte is {other}, not 0 or 1")));
                    }
                }
            }
            GgufValueType::String => GgufValue::String(self.string(MAX_STRING_LEN, field)?),
            GgufValueType::Array => self.array_value(depth, field)?,
        })
    }

    fn spend_values(&mut self, n: u64, field: Field) -> Result<(), FormatError> {
        match self.values_left.checked_sub(n) {
            Some(left) => {
                self.values_left = left;
                Ok(())
            }
            None => Err(FormatError::TooLarge {
                path: self.path.to_path_buf(),
                field: format!("{} (metadata values in the file, counting array elements)", field()),
                value: (MAX_METADATA_VALUES - self.values_left).saturating_add(n),
                limit: MAX_METADATA_VALUES,
            }),
        }
    }

    fn array_value(&mut self, depth: usize, field: Field) -> Result<GgufValue, FormatError> {
        let depth = depth + 1;
        if depth > MAX_ARRAY_DEPTH {
            return Err(FormatError::TooLarge {
                path: self.path.to_path_buf(),
                field: format!("{} array nesting depth", field()),
                value: depth as u64,
                limit: MAX_ARRAY_DEPTH as u64,
            });
        }
        let elem = self.value_type(&|| format!("{} array element type", field()))?;
        let count = self.u64(&|| format!("{} array length", field()))?;
        self.cap(count, MAX_ARRAY_LEN, &|| format!("{} array length", field()))?;
        // count <= 2^24 and min size <= 12: no saturation in practice.
        let needed = count.saturating_mul(elem.min_encoded_size());
        if needed > self.remaining() {
            return Err(self.truncated(format!(
                "{}: array of {count} x {elem} needs at least {needed} bytes, {} left",
                field(),
                self.remaining()
            )));
        }
        self.spend_values(count, &|| format!("{} array length", field()))?;
        let mut items = Vec::with_capacity(usize::try_from(count).unwrap_or(0));
        for j in 0..count {
            let item_field = || format!("{}[{j}]", field());
            items.push(self.value(elem, depth, &item_field)?);
        }
        Ok(GgufValue::Array(elem, items))
    }

    fn tensor_infos(&mut self, n_tensors: u64) -> Result<(Vec<GgufTensorInfo>, HashMap<String, usize>), FormatError> {
        let capacity = usize::try_from(n_tensors).unwrap_or(0);
        let mut tensors = Vec::with_capacity(capacity);
        let mut index: HashMap<String, usize> = HashMap::with_capacity(capacity);
        for i in 0..n_tensors {
            let name_start = self.pos;
            let name = self.string(MAX_TENSOR_NAME_LEN, &|| format!("tensor #{i} name"))?;
            if name.is_empty() {
                self.pos = name_start;
                return Err(self.invalid(format!("tensor #{i} name"), "name is empty"));
            }
            if let Some(&first) = index.get(&name) {
                self.pos = name_start;
                return Err(self.invalid(
                    format!("tensor #{i} name"),
                    format!("duplicate tensor name '{name}' (also tensor #{first})"),
                ));
            }
            let info = self.tensor_info(&name)?;
            index.insert(name, tensors.len());
            tensors.push(info);
        }
        Ok((tensors, index))
    }

    fn tensor_info(&mut self, name: &str) -> Result<GgufTensorInfo, FormatError> {
        let n_dims = self.u32(&|| format!("tensor '{name}' n_dims"))?;
        if !(1..=MAX_DIMS).contains(&n_dims) {
            self.pos = self.pos.saturating_sub(4);
            return Err(self.invalid(
                format!("tensor '{name}' n_dims"),
                format!("{n_dims} dimensions; must be 1..={MAX_DIMS} (GGML_MAX_DIMS)"),
            ));
        }
        let mut dims = Vec::with_capacity(MAX_DIMS as usize);
        let mut n_elements: u64 = 1;
        for d in 0..n_dims {
            let field = || format!("tensor '{name}' dims[{d}]");
            let dim = self.u64(&field)?;
            if dim == 0 {
                self.pos = self.pos.saturating_sub(8);
                return Err(self.invalid(field(), "dimension is 0; every dimension must be >= 1"));
            }
            // ggml holds element counts in int64_t (`ne`), so the product must fit i64.
            n_elements = match n_elements.checked_mul(dim) {
                Some(n) if i64::try_from(n).is_ok() && usize::try_from(n).is_ok() => n,
                _ => {
                    return Err(self.invalid(field(), format!("element count overflows (dims so far {dims:?} x {dim})")))
                }
            };
            dims.push(dim);
        }
        let type_id = self.u32(&|| format!("tensor '{name}' type"))?;
        let ggml_type = GgmlType::from_id(type_id).ok_or_else(|| {
            self.unsupported(format!(
                "ggml type id {type_id} of tensor '{name}' (field type at byte offset {})",
                self.pos.saturating_sub(4)
            ))
        })?;
        // ggml quantizes rows, so the innermost dimension must hold whole blocks
        // (gguf.cpp checks `ne[0] % block_size`); this also makes the element count a
        // multiple of the block size.
        let block = ggml_type.block_size() as u64;
        let inner = dims.first().copied().unwrap_or(1);
        if inner % block != 0 {
            return Err(self.invalid(
                format!("tensor '{name}' dims[0]"),
                format!("{inner} is not a multiple of the {ggml_type} block size {block}"),
            ));
        }
        let size_bytes = ggml_type
            .bytes_for(n_elements)
            .ok_or_else(|| self.invalid(format!("tensor '{name}' size"), "byte size overflows u64"))?;
        let offset = self.u64(&|| format!("tensor '{name}' offset"))?;
        Ok(GgufTensorInfo { name: name.to_string(), dims, ggml_type, offset, size_bytes })
    }
}

/// Names the format a non-GGUF file seems to be, for the bad-magic message.
fn other_format_hint(buf: &[u8]) -> &'static str {
    // The pre-GGUF magics 'ggml', 'ggjt', 'ggmf' (llama.cpp's old LLAMA_FILE_MAGIC_*,
    // e.g. 0x67676a74) as written little-endian.
    const LEGACY_GGML: [&[u8]; 3] = [b"lmgg", b"tjgg", b"fmgg"];
    if buf.starts_with(b"PK\x03\x04") {
        "; a zip archive (a PyTorch .pt/.bin checkpoint?)"
    } else if buf.get(8) == Some(&b'{') {
        "; looks like safetensors (u64 header length, then JSON)"
    } else if LEGACY_GGML.iter().any(|m| buf.starts_with(m)) {
        "; a pre-GGUF GGML/GGJT/GGMF file (convert it to GGUF)"
    } else {
        ""
    }
}

/// Reads and validates `general.alignment` (ggml's gguf.cpp requires a u32 that is a
/// non-zero power of two; we also bound it, see `MAX_ALIGNMENT`).
fn alignment(
    path: &Path,
    metadata: &[(String, GgufValue)],
    index: &HashMap<String, usize>,
) -> Result<u64, FormatError> {
    const KEY: &str = "general.alignment";
    let Some(value) = index.get(KEY).and_then(|&i| metadata.get(i)).map(|(_, v)| v) else {
        return Ok(DEFAULT_ALIGNMENT);
    };
    let GgufValue::U32(a) = *value else {
        return Err(FormatError::invalid(path, KEY, format!("must be a u32, found {}", value.type_description())));
    };
    let a = u64::from(a);
    if a == 0 || !a.is_power_of_two() {
        return Err(FormatError::invalid(path, KEY, format!("{a} is not a non-zero power of two")));
    }
    if a > MAX_ALIGNMENT {
        return Err(FormatError::TooLarge {
            path: path.to_path_buf(),
            field: KEY.into(),
            value: a,
            limit: MAX_ALIGNMENT,
        });
    }
    Ok(a)
}

/// Checks each tensor's data range: aligned, inside the file, and disjoint from the others.
fn check_tensor_ranges(
    path: &Path,
    file_len: u64,
    data_offset: u64,
    alignment: u64,
    tensors: &[GgufTensorInfo],
) -> Result<(), FormatError> {
    let mut ranges = Vec::with_capacity(tensors.len());
    for (i, t) in tensors.iter().enumerate() {
        let field = || format!("tensor '{}' offset", t.name);
        if t.offset % alignment != 0 {
            return Err(FormatError::invalid(
                path,
                field(),
                format!("{} is not a multiple of the alignment {alignment}", t.offset),
            ));
        }
        let rel_end = t.offset.checked_add(t.size_bytes);
        let abs_end = rel_end.and_then(|e| data_offset.checked_add(e));
        match (rel_end, abs_end) {
            (Some(rel_end), Some(abs_end)) if abs_end <= file_len => ranges.push((t.offset, rel_end, i)),
            _ => {
                return Err(FormatError::Truncated {
                    path: path.to_path_buf(),
                    field: format!(
                        "data of tensor '{}' ({} bytes at data offset {}, file offset {})",
                        t.name,
                        t.size_bytes,
                        t.offset,
                        data_offset.saturating_add(t.offset)
                    ),
                    offset: data_offset.saturating_add(t.offset),
                    file_len,
                })
            }
        }
    }
    ranges.sort_unstable();
    for pair in ranges.windows(2) {
        if let [(s0, e0, i0), (s1, e1, i1)] = *pair {
            if e0 > s1 {
                let name = |i: usize| tensors.get(i).map_or("?", |t: &GgufTensorInfo| &t.name);
                return Err(FormatError::invalid(
                    path,
                    format!("tensor '{}' offset", name(i1)),
                    format!("data [{s1}, {e1}) overlaps tensor '{}' at [{s0}, {e0}) (data-section offsets)", name(i0)),
                ));
            }
        }
    }
    Ok(())
}
