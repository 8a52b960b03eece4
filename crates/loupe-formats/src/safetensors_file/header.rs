//! Our own pass over a safetensors JSON header, run before the `safetensors` crate's parse.
//!
//! It exists for what the crate does not do or does not say:
//! - duplicate JSON keys: the crate deserializes into a `HashMap`, which keeps the last of
//!   two equal keys silently, so two readers could disagree on a file's contents; we refuse
//!   duplicates at every level (tensor names, `__metadata__` keys, entry fields);
//! - error messages that name the tensor: the crate's `TensorInvalidInfo` names none.
//!
//! It checks each entry's dtype, shape (checked product) and byte length, then the
//! entries' ranges: no overlap, no gap, starting at 0 and covering the data section
//! exactly (the crate requires the same contiguity).

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::path::Path;

use safetensors::Dtype;
use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::Value;

use crate::FormatError;

/// One tensor entry of the header, validated.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Entry {
    pub name: String,
    pub dtype: Dtype,
    pub shape: Vec<usize>,
    /// Byte range within the data section.
    pub start: usize,
    pub end: usize,
}

/// Parses and validates a header; returns entries in data order and `__metadata__`.
pub(super) fn validate(
    path: &Path,
    json: &[u8],
    data_len: usize,
) -> Result<(Vec<Entry>, BTreeMap<String, String>), FormatError> {
    let invalid = |field: &str, reason: String| FormatError::invalid(path, field, reason);
    let UniqueKeys(root) = serde_json::from_slice(json).map_err(|e| invalid("header JSON", e.to_string()))?;
    let Value::Object(root) = root else {
        return Err(invalid("header JSON", "top level is not an object".into()));
    };
    let mut metadata = BTreeMap::new();
    let mut entries = Vec::with_capacity(root.len());
    for (name, value) in root {
        if name == "__metadata__" {
            let Value::Object(map) = value else {
                return Err(invalid("__metadata__", "is not an object".into()));
            };
            for (k, v) in map {
                let Value::String(s) = v else {
                    return Err(invalid(&format!("__metadata__ '{k}'"), "value is not a string".into()));
                };
                metadata.insert(k, s);
            }
            continue;
        }
        entries.push(entry(path, name, value)?);
    }
    check_ranges(path, &mut entries, data_len)?;
    Ok((entries, metadata))
}

fn entry(path: &Path, name: String, value: Value) -> Result<Entry, FormatError> {
    let field = |what: &str| format!("tensor '{name}' {what}");
    let err = |what: &str, reason: String| FormatError::invalid(path, field(what), reason);
    let Value::Object(map) = value else {
        return Err(err("entry", "is not an object".into()));
    };
    let get = |key: &str| map.get(key).ok_or_else(|| err(key, "is missing".into()));
    let dtype: Dtype = serde_json::from_value(get("dtype")?.clone()).map_err(|e| {
        err("dtype", format!("{e} (value {})", map.get("dtype").map_or(String::new(), |v| v.to_string())))
    })?;
    let usizes = |key: &str| -> Result<Vec<usize>, FormatError> {
        let Value::Array(items) = get(key)? else {
            return Err(err(key, "is not an array".into()));
        };
        items
            .iter()
            .map(|v| {
                v.as_u64()
                    .and_then(|n| usize::try_from(n).ok())
                    .ok_or_else(|| err(key, format!("element {v} is not a non-negative integer")))
            })
            .collect()
    };
    let shape = usizes("shape")?;
    let offsets = usizes("data_offsets")?;
    let [start, end] = offsets[..] else {
        return Err(err("data_offsets", format!("has {} values, not 2", offsets.len())));
    };
    if end < start {
        return Err(err("data_offsets", format!("end {end} is before start {start}")));
    }
    let n_elements = shape
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| err("shape", format!("{shape:?} element count overflows")))?;
    let bits = n_elements
        .checked_mul(dtype.bitsize())
        .ok_or_else(|| err("shape", format!("{shape:?} x {dtype} bit count overflows")))?;
    if bits % 8 != 0 {
        return Err(err("shape", format!("{shape:?} x {dtype} is not a whole number of bytes")));
    }
    let expected = bits / 8;
    if end - start != expected {
        return Err(err(
            "data_offsets",
            format!("[{start}, {end}) spans {} bytes but shape {shape:?} x {dtype} needs {expected}", end - start),
        ));
    }
    Ok(Entry { name, dtype, shape, start, end })
}

fn check_ranges(path: &Path, entries: &mut [Entry], data_len: usize) -> Result<(), FormatError> {
    entries.sort_by(|a, b| (a.start, a.end, &a.name).cmp(&(b.start, b.end, &b.name)));
    let mut covered = 0usize;
    let mut prev: Option<&Entry> = None;
    for e in entries.iter() {
        let field = format!("tensor '{}' data_offsets", e.name);
        if e.start < covered {
            let other = prev.map_or(String::from("?"), |p| format!("'{}' [{}, {})", p.name, p.start, p.end));
            return Err(FormatError::invalid(path, field, format!("[{}, {}) overlaps tensor {other}", e.start, e.end)));
        }
        if e.start > covered {
            return Err(FormatError::invalid(
                path,
                field,
                format!("leaves a gap: starts at {} but the previous data ends at {covered}", e.start),
            ));
        }
        covered = e.end;
        prev = Some(e);
    }
    if covered != data_len {
        return Err(FormatError::invalid(
            path,
            "data section",
            format!("is {data_len} bytes but the tensors cover {covered}"),
        ));
    }
    Ok(())
}

/// A JSON value deserialized with a duplicate-key check on every object.
pub(super) struct UniqueKeys(pub(super) Value);

impl<'de> Deserialize<'de> for UniqueKeys {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(UniqueKeysVisitor).map(UniqueKeys)
    }
}

struct UniqueKeysVisitor;

impl<'de> Visitor<'de> for UniqueKeysVisitor {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(v.into())
    }
    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(v.into())
    }
    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(serde_json::Number::from_f64(v).map_or(Value::Null, Value::Number))
    }
    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }
    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        while let Some(UniqueKeys(v)) = seq.next_element()? {
            items.push(v);
        }
        Ok(Value::Array(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut seen = HashSet::new();
        let mut out = serde_json::Map::new();
        while let Some(key) = map.next_key::<String>()? {
            if !seen.insert(key.clone()) {
                return Err(de::Error::custom(format!("duplicate key \"{key}\"")));
            }
            let UniqueKeys(v) = map.next_value()?;
            out.insert(key, v);
        }
        Ok(Value::Object(out))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(json: &str, data_len: usize) -> Result<Vec<Entry>, String> {
        validate(Path::new("t.safetensors"), json.as_bytes(), data_len).map(|(e, _)| e).map_err(|e| e.to_string())
    }

    #[test]
    fn accepts_contiguous_entries_in_any_order() {
        let json = r#"{"b":{"dtype":"F16","shape":[2],"data_offsets":[8,12]},
                       "a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},
                       "__metadata__":{"format":"pt"}}"#;
        let entries = check(json, 12).expect("valid");
        assert_eq!(entries.iter().map(|e| e.name.as_str()).collect::<Vec<_>>(), ["a", "b"]);
    }

    #[test]
    fn rejects_duplicates_at_any_level() {
        let dup = r#"{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},
                      "a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}"#;
        assert!(check(dup, 4).unwrap_err().contains("duplicate key \"a\""));
        let dup_meta = r#"{"__metadata__":{"k":"1","k":"2"}}"#;
        assert!(check(dup_meta, 0).unwrap_err().contains("duplicate key \"k\""));
        let dup_field = r#"{"a":{"dtype":"F32","dtype":"F16","shape":[1],"data_offsets":[0,4]}}"#;
        assert!(check(dup_field, 4).unwrap_err().contains("duplicate key \"dtype\""));
    }

    #[test]
    fn names_the_tensor_and_field() {
        let bad_len = r#"{"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}"#;
        let e = check(bad_len, 8).unwrap_err();
        assert!(e.contains("tensor 'w' data_offsets") && e.contains("needs 12"), "{e}");
        let overflow = r#"{"w":{"dtype":"F32","shape":[18446744073709551615,2],"data_offsets":[0,0]}}"#;
        assert!(check(overflow, 0).unwrap_err().contains("tensor 'w' shape"));
        let bad_dtype = r#"{"w":{"dtype":"Q4","shape":[1],"data_offsets":[0,1]}}"#;
        assert!(check(bad_dtype, 1).unwrap_err().contains("tensor 'w' dtype"));
        let gap = r#"{"w":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}"#;
        assert!(check(gap, 2).unwrap_err().contains("gap"));
        let short = r#"{"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}}"#;
        assert!(check(short, 2).unwrap_err().contains("cover 1"));
    }
}
