//! Reading tensors from a dump directory (design.md, "The dump layout"): `manifest.json`
//! lists each tensor's name, step and file; files are `.npy` (the default style) or raw
//! little-endian `.bin` with dtype and shape in the manifest. Both loupe's and the Python
//! reference's dumps have this layout.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use loupe_formats::{ElemType, NpyFile};
use serde_json::Value;

use super::ExplainError;

/// A tensor read as f32, row-major.
#[derive(Debug, Clone)]
pub struct Tensor {
    pub shape: Vec<usize>,
    pub data: Vec<f32>,
}

impl Tensor {
    /// Rows of a `[rows, width]` tensor (the first dim; 1 for scalars).
    pub fn rows(&self) -> usize {
        self.shape.first().copied().unwrap_or(1)
    }
}

struct Entry {
    file: Option<String>,
    dtype: String,
    shape: Vec<usize>,
}

/// One dump directory.
pub struct Dump {
    pub dir: PathBuf,
    /// `prompt_tokens` from the manifest, when present.
    pub prompt_len: Option<usize>,
    entries: HashMap<(String, usize), Entry>,
}

impl Dump {
    pub fn open(dir: &Path) -> Result<Dump, ExplainError> {
        let path = dir.join("manifest.json");
        let bad = |reason: String| ExplainError::Manifest { path: path.clone(), reason };
        let text = std::fs::read_to_string(&path).map_err(|e| bad(format!("cannot read ({e}); is {} a dump directory?", dir.display())))?;
        let v: Value = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
        let tensors = v.get("tensors").and_then(Value::as_array).ok_or_else(|| bad("no 'tensors' list".into()))?;
        let mut entries = HashMap::new();
        for (i, t) in tensors.iter().enumerate() {
            let name = t.get("name").and_then(Value::as_str).ok_or_else(|| bad(format!("tensors[{i}] has no name")))?;
            let step = t.get("step").and_then(Value::as_u64).unwrap_or(0) as usize;
            let shape = match t.get("shape").and_then(Value::as_array) {
                Some(a) => a.iter().map(|d| d.as_u64().map(|d| d as usize).ok_or_else(|| bad(format!("tensors[{i}] ('{name}') has a bad shape")))).collect::<Result<Vec<_>, _>>()?,
                None => Vec::new(),
            };
            let entry = Entry {
                file: t.get("file").and_then(Value::as_str).map(str::to_string),
                dtype: t.get("dtype").and_then(Value::as_str).unwrap_or("f32").to_string(),
                shape,
            };
            // A name seen twice keeps its first entry: later calls are recorded as `name(k)`.
            entries.entry((name.to_string(), step)).or_insert(entry);
        }
        let prompt_len = v.get("prompt_tokens").and_then(Value::as_array).map(Vec::len);
        Ok(Dump { dir: dir.to_path_buf(), prompt_len, entries })
    }

    pub fn has(&self, name: &str, step: usize) -> bool {
        self.entries.contains_key(&(name.to_string(), step))
    }

    /// The first of `names` this dump holds at `step`.
    pub fn first_of<'n>(&self, names: &[&'n str], step: usize) -> Option<&'n str> {
        names.iter().copied().find(|n| self.has(n, step))
    }

    /// Highest `N` with `model.layers.N` at `step`.
    pub fn last_layer(&self, step: usize) -> Option<usize> {
        self.entries
            .keys()
            .filter(|(_, s)| *s == step)
            .filter_map(|(n, _)| n.strip_prefix("model.layers.").and_then(|r| r.parse::<usize>().ok()))
            .max()
    }

    /// Reads `name` at `step` as f32.
    pub fn tensor(&self, name: &str, step: usize) -> Result<Tensor, ExplainError> {
        let missing = || ExplainError::MissingTensor { dump: self.dir.clone(), name: name.to_string(), step };
        let e = self.entries.get(&(name.to_string(), step)).ok_or_else(missing)?;
        let file = e.file.as_deref().ok_or_else(|| ExplainError::Unsupported { path: self.dir.join("manifest.json"), what: format!("'{name}' has no file (a printed dump style)") })?;
        let path = self.dir.join(file);
        let dtype = ElemType::from_name(&e.dtype).ok_or_else(|| ExplainError::Unsupported { path: path.clone(), what: format!("dtype '{}'", e.dtype) })?;
        let ext = path.extension().and_then(|x| x.to_str()).unwrap_or("");
        let (shape, data) = match ext {
            "npy" => {
                let npy = NpyFile::open(&path)?;
                // bf16 has no numpy dtype: dumpers store its bits as <u2 / V2 and say bf16 in
                // the manifest.
                let t = match npy.tensor() {
                    Ok(t) if dtype != ElemType::BF16 => t,
                    _ => npy.tensor_as(dtype)?,
                };
                (t.shape.clone(), t.to_f32()?)
            }
            "bin" => {
                if dtype != ElemType::F32 {
                    return Err(ExplainError::Unsupported { path, what: format!("raw {} data (explain reads raw f32)", e.dtype) });
                }
                let bytes = std::fs::read(&path).map_err(|err| ExplainError::Io { path: path.clone(), source: err })?;
                let n: usize = e.shape.iter().product();
                if bytes.len() != n * 4 {
                    return Err(ExplainError::Shape { what: format!("{}: {} bytes for shape {:?} of f32", path.display(), bytes.len(), e.shape) });
                }
                (e.shape.clone(), bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect())
            }
            _ => return Err(ExplainError::Unsupported { path, what: "tensor files other than .npy and .bin".into() }),
        };
        Ok(Tensor { shape, data })
    }

    /// `name` at steps `0..=step`, rows concatenated (the whole context a KV cache holds).
    pub fn rows_through(&self, name: &str, step: usize) -> Result<Tensor, ExplainError> {
        let mut out = self.tensor(name, 0)?;
        for s in 1..=step {
            let t = self.tensor(name, s)?;
            if t.shape.get(1..) != out.shape.get(1..) {
                return Err(ExplainError::Shape { what: format!("'{name}' is {:?} at step {s} but {:?} at step 0", t.shape, out.shape) });
            }
            out.data.extend_from_slice(&t.data);
            if let Some(r) = out.shape.first_mut() {
                *r += t.rows();
            }
        }
        Ok(out)
    }
}
