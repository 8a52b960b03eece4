//! A small GGUF v3 writer, for tests, fuzzing and tiny test models built by other crates.
//!
//! It writes the layout described in `gguf/mod.rs`: header, metadata in insertion order,
//! tensor infos in insertion order, zero padding to the alignment, then each tensor's bytes
//! padded to the alignment (as gguf-py and ggml lay files out). It validates its input
//! with the reader's rules, so anything it writes, `GgufFile` reads back.

use std::collections::HashSet;
use std::io::Write;
use std::path::{Path, PathBuf};

use super::limits::{DEFAULT_ALIGNMENT, MAX_ALIGNMENT, MAX_ARRAY_DEPTH, MAX_DIMS, MAX_TENSOR_NAME_LEN};
use super::{GgufValue, GGUF_MAGIC};
use crate::{FormatError, GgmlType};

/// The version this writer emits.
pub const WRITER_VERSION: u32 = 3;

/// One tensor to be written.
#[derive(Debug, Clone)]
struct PendingTensor {
    name: String,
    dims: Vec<u64>,
    ggml_type: GgmlType,
    data: Vec<u8>,
}

/// Builds a GGUF file in memory. Errors are reported by [`GgufWriter::to_bytes`] with the
/// label given to [`GgufWriter::with_label`] (default `<gguf writer>`).
#[derive(Debug, Clone)]
pub struct GgufWriter {
    label: PathBuf,
    metadata: Vec<(String, GgufValue)>,
    tensors: Vec<PendingTensor>,
}

impl Default for GgufWriter {
    fn default() -> Self {
        GgufWriter::new()
    }
}

impl GgufWriter {
    pub fn new() -> GgufWriter {
        GgufWriter { label: PathBuf::from("<gguf writer>"), metadata: Vec::new(), tensors: Vec::new() }
    }

    /// Names the output in error messages.
    pub fn with_label(mut self, label: impl Into<PathBuf>) -> GgufWriter {
        self.label = label.into();
        self
    }

    /// Adds a metadata pair (kept in insertion order; checked when writing).
    pub fn add(&mut self, key: impl Into<String>, value: GgufValue) -> &mut GgufWriter {
        self.metadata.push((key.into(), value));
        self
    }

    /// Sets `general.alignment`, replacing an earlier value.
    pub fn set_alignment(&mut self, alignment: u32) -> &mut GgufWriter {
        self.metadata.retain(|(k, _)| k != "general.alignment");
        self.add("general.alignment", GgufValue::U32(alignment))
    }

    /// Adds a tensor. `dims` are in ggml order (`dims[0]` innermost); `data` must hold
    /// exactly the bytes ggml expects for that shape and type (checked when writing).
    pub fn add_tensor(
        &mut self,
        name: impl Into<String>,
        dims: &[u64],
        ggml_type: GgmlType,
        data: Vec<u8>,
    ) -> &mut GgufWriter {
        self.tensors.push(PendingTensor { name: name.into(), dims: dims.to_vec(), ggml_type, data });
        self
    }

    /// Adds an f32 tensor from values (dims in ggml order).
    pub fn add_f32_tensor(&mut self, name: impl Into<String>, dims: &[u64], values: &[f32]) -> &mut GgufWriter {
        let data = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.add_tensor(name, dims, GgmlType::F32, data)
    }

    fn invalid(&self, field: impl Into<String>, reason: impl Into<String>) -> FormatError {
        FormatError::invalid(&self.label, field, reason)
    }

    fn alignment(&self) -> Result<u64, FormatError> {
        match self.metadata.iter().find(|(k, _)| k == "general.alignment") {
            None => Ok(DEFAULT_ALIGNMENT),
            Some((_, GgufValue::U32(a))) => {
                let a = u64::from(*a);
                if a == 0 || !a.is_power_of_two() || a > MAX_ALIGNMENT {
                    Err(self.invalid("general.alignment", format!("{a} is not a power of two in 1..={MAX_ALIGNMENT}")))
                } else {
                    Ok(a)
                }
            }
            Some((_, v)) => {
                Err(self.invalid("general.alignment", format!("must be a u32, found {}", v.type_description())))
            }
        }
    }

    fn check(&self) -> Result<(), FormatError> {
        let mut keys = HashSet::new();
        for (key, value) in &self.metadata {
            if key.is_empty() || !keys.insert(key.as_str()) {
                return Err(self.invalid(format!("metadata '{key}'"), "empty or duplicate key"));
            }
            check_value(value, 0).map_err(|reason| self.invalid(format!("metadata '{key}'"), reason))?;
        }
        let mut names = HashSet::new();
        for t in &self.tensors {
            let field = || format!("tensor '{}'", t.name);
            if t.name.is_empty() || t.name.len() as u64 > MAX_TENSOR_NAME_LEN {
                return Err(self.invalid(field(), format!("name must be 1..={MAX_TENSOR_NAME_LEN} bytes")));
            }
            if !names.insert(t.name.as_str()) {
                return Err(self.invalid(field(), "duplicate tensor name"));
            }
            if t.dims.is_empty() || t.dims.len() > MAX_DIMS as usize || t.dims.contains(&0) {
                return Err(self.invalid(field(), format!("dims {:?} must be 1..=4 values >= 1", t.dims)));
            }
            let block = t.ggml_type.block_size() as u64;
            let expected = t
                .dims
                .iter()
                .try_fold(1u64, |acc, &d| acc.checked_mul(d))
                .filter(|_| t.dims.first().is_some_and(|d0| d0 % block == 0))
                .and_then(|n| t.ggml_type.bytes_for(n));
            match expected {
                Some(n) if n == t.data.len() as u64 => {}
                Some(n) => {
                    return Err(self.invalid(
                        field(),
                        format!("{} data bytes given, {} x {:?} needs {n}", t.data.len(), t.ggml_type, t.dims),
                    ))
                }
                None => {
                    return Err(self.invalid(
                        field(),
                        format!("dims {:?} overflow or dims[0] is not a multiple of {block}", t.dims),
                    ))
                }
            }
        }
        Ok(())
    }

    /// Serializes the file.
    pub fn to_bytes(&self) -> Result<Vec<u8>, FormatError> {
        self.check()?;
        let alignment = self.alignment()?;
        let mut out = Vec::new();
        out.extend_from_slice(&GGUF_MAGIC);
        out.extend_from_slice(&WRITER_VERSION.to_le_bytes());
        out.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        out.extend_from_slice(&(self.metadata.len() as u64).to_le_bytes());
        for (key, value) in &self.metadata {
            put_string(&mut out, key);
            out.extend_from_slice(&value.value_type().id().to_le_bytes());
            put_value(&mut out, value);
        }
        let mut offset = 0u64;
        for t in &self.tensors {
            put_string(&mut out, &t.name);
            out.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
            for d in &t.dims {
                out.extend_from_slice(&d.to_le_bytes());
            }
            out.extend_from_slice(&t.ggml_type.id().to_le_bytes());
            out.extend_from_slice(&offset.to_le_bytes());
            offset = align_up(offset + t.data.len() as u64, alignment);
        }
        pad_to(&mut out, alignment);
        for t in &self.tensors {
            out.extend_from_slice(&t.data);
            pad_to(&mut out, alignment);
        }
        Ok(out)
    }

    /// Serializes the file to `w`.
    pub fn write_to(&self, w: &mut impl Write) -> Result<(), FormatError> {
        let bytes = self.to_bytes()?;
        w.write_all(&bytes).map_err(|source| FormatError::Io { path: self.label.clone(), source })
    }

    /// Serializes the file to `path` (created or truncated).
    pub fn write_to_path(&self, path: impl AsRef<Path>) -> Result<(), FormatError> {
        let path = path.as_ref();
        let bytes = self.to_bytes()?;
        std::fs::write(path, bytes).map_err(|source| FormatError::Io { path: path.to_path_buf(), source })
    }
}

/// Checks that arrays hold only their declared element type and respect the depth cap.
fn check_value(value: &GgufValue, depth: usize) -> Result<(), String> {
    if let GgufValue::Array(elem, items) = value {
        if depth + 1 > MAX_ARRAY_DEPTH {
            return Err(format!("arrays nest deeper than {MAX_ARRAY_DEPTH}"));
        }
        for (i, item) in items.iter().enumerate() {
            if item.value_type() != *elem {
                return Err(format!("array declared as {elem} holds a {} at [{i}]", item.value_type()));
            }
            check_value(item, depth + 1)?;
        }
    }
    Ok(())
}

fn align_up(n: u64, alignment: u64) -> u64 {
    n.div_ceil(alignment) * alignment
}

fn pad_to(out: &mut Vec<u8>, alignment: u64) {
    let len = out.len() as u64;
    out.resize(align_up(len, alignment) as usize, 0);
}

fn put_string(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn put_value(out: &mut Vec<u8>, value: &GgufValue) {
    match value {
        GgufValue::U8(v) => out.push(*v),
        GgufValue::I8(v) => out.extend_from_slice(&v.to_le_bytes()),
        GgufValue::U16(v) => out.extend_from_slice(&v.to_le_bytes()),
        GgufValue::I16(v) => out.extend_from_slice(&v.to_le_bytes()),
        GgufValue::U32(v) => out.extend_from_slice(&v.to_le_bytes()),
        GgufValue::I32(v) => out.extend_from_slice(&v.to_le_bytes()),
        GgufValue::U64(v) => out.extend_from_slice(&v.to_le_bytes()),
        GgufValue::I64(v) => out.extend_from_slice(&v.to_le_bytes()),
        GgufValue::F32(v) => out.extend_from_slice(&v.to_le_bytes()),
        GgufValue::F64(v) => out.extend_from_slice(&v.to_le_bytes()),
        GgufValue::Bool(v) => out.push(u8::from(*v)),
        GgufValue::String(s) => put_string(out, s),
        GgufValue::Array(elem, items) => {
            out.extend_from_slice(&elem.id().to_le_bytes());
            out.extend_from_slice(&(items.len() as u64).to_le_bytes());
            for item in items {
                put_value(out, item);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::{GgufFile, GgufValueType};

    #[test]
    fn round_trip_with_tensors_and_alignment() {
        let mut w = GgufWriter::new();
        w.set_alignment(64);
        w.add("general.architecture", GgufValue::String("llama".into()));
        w.add(
            "nested",
            GgufValue::Array(
                GgufValueType::Array,
                vec![GgufValue::Array(GgufValueType::I16, vec![GgufValue::I16(-3)])],
            ),
        );
        w.add_f32_tensor("a", &[3], &[1.0, 2.0, 3.0]);
        w.add_tensor("q", &[32, 2], GgmlType::Q8_0, vec![7; 68]);
        let bytes = w.to_bytes().expect("writes");
        let f = GgufFile::from_bytes("rt.gguf", bytes).expect("reads");
        assert_eq!(f.version, 3);
        assert_eq!(f.alignment, 64);
        assert_eq!(f.data_offset % 64, 0);
        assert_eq!(f.tensors.len(), 2);
        let q = f.tensor("q").expect("q");
        assert_eq!((q.offset, q.size_bytes), (64, 68));
        assert_eq!(f.tensor_data(q), &[7u8; 68][..]);
        assert_eq!(f.tensor_bytes("a").ok(), Some(&[0, 0, 128, 63, 0, 0, 0, 64, 0, 0, 64, 64][..]));
        assert_eq!(f.get("nested"), w.metadata.get(2).map(|(_, v)| v));
    }

    #[test]
    fn rejects_bad_input() {
        let mut w = GgufWriter::new().with_label("out.gguf");
        w.add_tensor("t", &[3], GgmlType::F32, vec![0; 11]);
        let err = w.to_bytes().unwrap_err().to_string();
        assert!(err.contains("out.gguf") && err.contains("tensor 't'") && err.contains("needs 12"), "{err}");

        let mut w = GgufWriter::new();
        w.add("a", GgufValue::Array(GgufValueType::U8, vec![GgufValue::I8(1)]));
        assert!(w.to_bytes().unwrap_err().to_string().contains("holds a i8"));

        let mut w = GgufWriter::new();
        w.set_alignment(3);
        assert!(w.to_bytes().is_err());
    }
}
