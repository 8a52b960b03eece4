//! Hugging Face checkpoints: one `model.safetensors`, or shards listed by
//! `model.safetensors.index.json` (`{"metadata": {...}, "weight_map": {tensor: shard}}`,
//! as transformers' `save_pretrained` writes it), behind one lookup by tensor name.
//!
//! The index is untrusted like the shards: it is size-capped, duplicate keys are refused,
//! shard names must be plain file names in the index's directory (no `/`, `\`, `..` or
//! absolute paths, so an index cannot make loupe open files elsewhere), and the index and
//! the shards must agree exactly: every listed tensor is in its shard, and every tensor of
//! a shard is listed for that shard (so a name found in two shards is refused).

use std::collections::{BTreeSet, HashMap};
use std::path::{Component, Path, PathBuf};

use serde_json::Value;

use super::header::UniqueKeys;
use super::{Dtype, SafetensorsFile, SafetensorsTensorInfo};
use crate::FormatError;

/// The index file name transformers writes (`SAFE_WEIGHTS_INDEX_NAME`).
pub const INDEX_FILE: &str = "model.safetensors.index.json";
/// The single-file checkpoint name transformers writes (`SAFE_WEIGHTS_NAME`).
pub const SINGLE_FILE: &str = "model.safetensors";
/// Largest index file read. Real indexes are well under 1 MiB (one line per tensor).
pub const MAX_INDEX_LEN: u64 = 64 << 20;

/// A safetensors checkpoint of one or more shards.
#[derive(Debug)]
pub struct SafetensorsCheckpoint {
    /// The index file, when the checkpoint is sharded.
    pub index_path: Option<PathBuf>,
    /// The shards, in shard-name order.
    pub shards: Vec<SafetensorsFile>,
    /// `metadata` of the index (e.g. `total_size`), as JSON; `Null` when absent.
    pub index_metadata: Value,
    /// Tensor name -> index into `shards`.
    lookup: HashMap<String, usize>,
}

impl SafetensorsCheckpoint {
    /// Opens a checkpoint from a directory (index file first, else `model.safetensors`),
    /// an index file, or a single `.safetensors` file.
    pub fn open(path: impl AsRef<Path>) -> Result<SafetensorsCheckpoint, FormatError> {
        let path = path.as_ref();
        if path.is_dir() {
            let index = path.join(INDEX_FILE);
            if index.is_file() {
                return SafetensorsCheckpoint::from_index(&index);
            }
            let single = path.join(SINGLE_FILE);
            if single.is_file() {
                return SafetensorsCheckpoint::from_file(SafetensorsFile::open(&single)?);
            }
            return Err(FormatError::Missing {
                path: path.to_path_buf(),
                what: "safetensors checkpoint file",
                name: format!("{INDEX_FILE} or {SINGLE_FILE}"),
            });
        }
        if path.to_string_lossy().ends_with(".index.json") {
            return SafetensorsCheckpoint::from_index(path);
        }
        SafetensorsCheckpoint::from_file(SafetensorsFile::open(path)?)
    }

    /// A checkpoint of one file.
    pub fn from_file(file: SafetensorsFile) -> Result<SafetensorsCheckpoint, FormatError> {
        let lookup = file.names().map(|n| (n.to_string(), 0)).collect();
        Ok(SafetensorsCheckpoint { index_path: None, shards: vec![file], index_metadata: Value::Null, lookup })
    }

    /// Opens the shards listed by an index file and checks that they agree with it.
    pub fn from_index(index_path: &Path) -> Result<SafetensorsCheckpoint, FormatError> {
        let invalid = |field: &str, reason: String| FormatError::invalid(index_path, field, reason);
        let (weight_map, index_metadata) = read_index(index_path)?;
        let dir = index_path.parent().unwrap_or(Path::new("."));

        let shard_names: BTreeSet<&str> = weight_map.values().map(String::as_str).collect();
        let mut shards = Vec::with_capacity(shard_names.len());
        let mut shard_of_name = HashMap::with_capacity(shard_names.len());
        for name in shard_names {
            check_shard_name(name).map_err(|reason| invalid(&format!("weight_map shard \"{name}\""), reason))?;
            shard_of_name.insert(name, shards.len());
            shards.push(SafetensorsFile::open(dir.join(name))?);
        }

        let mut lookup = HashMap::with_capacity(weight_map.len());
        for (tensor, shard) in &weight_map {
            let Some(&i) = shard_of_name.get(shard.as_str()) else {
                return Err(invalid(&format!("weight_map '{tensor}'"), "shard was not opened".into()));
            };
            if shards.get(i).and_then(|s| s.tensor(tensor)).is_none() {
                return Err(invalid(
                    &format!("weight_map '{tensor}'"),
                    format!("shard {shard} has no tensor of that name"),
                ));
            }
            lookup.insert(tensor.clone(), i);
        }
        for (i, shard) in shards.iter().enumerate() {
            for name in shard.names() {
                if lookup.get(name) != Some(&i) {
                    let listed = weight_map
                        .get(name)
                        .map_or("does not list it".to_string(), |s| format!("lists it in shard {s}"));
                    return Err(FormatError::invalid(
                        &shard.path,
                        format!("tensor '{name}'"),
                        format!("is in this shard but {} {listed}", index_path.display()),
                    ));
                }
            }
        }
        Ok(SafetensorsCheckpoint { index_path: Some(index_path.to_path_buf()), shards, index_metadata, lookup })
    }

    /// Number of tensors.
    pub fn len(&self) -> usize {
        self.lookup.len()
    }

    pub fn is_empty(&self) -> bool {
        self.lookup.is_empty()
    }

    /// Tensor names, shard by shard in data order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.shards.iter().flat_map(|s| s.names())
    }

    /// The shard holding `name` and the tensor's info.
    pub fn tensor(&self, name: &str) -> Option<(&SafetensorsFile, &SafetensorsTensorInfo)> {
        let shard = self.shards.get(*self.lookup.get(name)?)?;
        Some((shard, shard.tensor(name)?))
    }

    /// Like [`Self::tensor`], or an error naming the checkpoint and tensor.
    pub fn require_tensor(&self, name: &str) -> Result<(&SafetensorsFile, &SafetensorsTensorInfo), FormatError> {
        self.tensor(name).ok_or_else(|| FormatError::Missing {
            path: self.label(),
            what: "tensor",
            name: name.to_string(),
        })
    }

    pub fn dtype(&self, name: &str) -> Result<Dtype, FormatError> {
        Ok(self.require_tensor(name)?.1.dtype)
    }

    pub fn shape(&self, name: &str) -> Result<&[usize], FormatError> {
        Ok(&self.require_tensor(name)?.1.shape)
    }

    /// The raw bytes of the tensor named `name`.
    pub fn tensor_bytes(&self, name: &str) -> Result<&[u8], FormatError> {
        let (shard, info) = self.require_tensor(name)?;
        Ok(shard.tensor_data(info))
    }

    /// The tensor's values converted to f32 (F32, F16, BF16).
    pub fn to_f32(&self, name: &str) -> Result<Vec<f32>, FormatError> {
        self.require_tensor(name)?.0.to_f32(name)
    }

    /// The path errors should name: the index, or the single file.
    fn label(&self) -> PathBuf {
        match (&self.index_path, self.shards.first()) {
            (Some(p), _) => p.clone(),
            (None, Some(f)) => f.path.clone(),
            (None, None) => PathBuf::from("<empty checkpoint>"),
        }
    }
}

/// Reads `weight_map` (tensor -> shard file name) and `metadata` from an index file.
fn read_index(path: &Path) -> Result<(std::collections::BTreeMap<String, String>, Value), FormatError> {
    let io = |source| FormatError::Io { path: path.to_path_buf(), source };
    let len = std::fs::metadata(path).map_err(io)?.len();
    if len > MAX_INDEX_LEN {
        return Err(FormatError::TooLarge {
            path: path.to_path_buf(),
            field: "index file size".into(),
            value: len,
            limit: MAX_INDEX_LEN,
        });
    }
    let bytes = std::fs::read(path).map_err(io)?;
    parse_index(path, &bytes)
}

/// Parses index JSON (split out so tests and fuzzing need no file).
pub(crate) fn parse_index(
    path: &Path,
    bytes: &[u8],
) -> Result<(std::collections::BTreeMap<String, String>, Value), FormatError> {
    let invalid = |field: &str, reason: String| FormatError::invalid(path, field, reason);
    let UniqueKeys(root) = serde_json::from_slice(bytes).map_err(|e| invalid("index JSON", e.to_string()))?;
    let Value::Object(mut root) = root else {
        return Err(invalid("index JSON", "top level is not an object".into()));
    };
    let metadata = root.remove("metadata").unwrap_or(Value::Null);
    let Some(Value::Object(map)) = root.remove("weight_map") else {
        return Err(invalid("weight_map", "is missing or not an object".into()));
    };
    let mut weight_map = std::collections::BTreeMap::new();
    for (tensor, shard) in map {
        let Value::String(shard) = shard else {
            return Err(invalid(&format!("weight_map '{tensor}'"), "shard is not a string".into()));
        };
        weight_map.insert(tensor, shard);
    }
    Ok((weight_map, metadata))
}

/// A shard must be a plain file name: exactly one normal path component.
fn check_shard_name(name: &str) -> Result<(), String> {
    let mut components = Path::new(name).components();
    let plain = matches!(components.next(), Some(Component::Normal(_)))
        && components.next().is_none()
        && !name.contains(['/', '\\', '\0']);
    if plain {
        Ok(())
    } else {
        Err("is not a plain file name in the index's directory".into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shard_names_must_be_plain() {
        for ok in ["model-00001-of-00002.safetensors", "a.b", "..x"] {
            assert!(check_shard_name(ok).is_ok(), "{ok}");
        }
        for bad in ["", ".", "..", "../x.safetensors", "/etc/passwd", "a/b", "a\\b", "x\0y", "./x"] {
            assert!(check_shard_name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn index_json_is_checked() {
        let p = Path::new("i.json");
        let ok = br#"{"metadata":{"total_size":8},"weight_map":{"a":"s1","b":"s2"}}"#;
        let (map, meta) = parse_index(p, ok).expect("valid");
        assert_eq!(map.len(), 2);
        assert_eq!(meta["total_size"], 8);
        let dup = br#"{"weight_map":{"a":"s1","a":"s2"}}"#;
        assert!(parse_index(p, dup).unwrap_err().to_string().contains("duplicate key \"a\""));
        assert!(parse_index(p, br#"{"metadata":{}}"#).unwrap_err().to_string().contains("weight_map"));
        assert!(parse_index(p, br#"{"weight_map":{"a":1}}"#).unwrap_err().to_string().contains("'a'"));
        assert!(parse_index(p, b"[").is_err());
    }
}
