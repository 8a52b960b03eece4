//! Tensor sources: whatever `loupe compare` is given as A or B, listed as named entries in
//! execution order and loaded one at a time as f32.
//!
//! - a dump directory (`manifest.json`; files in the `npy`, `binary` or `max` style);
//! - a directory of tensor files: MAX's flat `DIR/<label>.max`, its PyTorch side's
//!   `DIR/<step>/<label>.pt` with `tensor_names.txt` (docs/dump-format.md, "Other inputs"), or any
//!   mix of `.npy`, `.pt`, `.max`, `.npz`, `.safetensors` files; a numeric first folder
//!   is the step, and a file holding one tensor is named by its stem;
//! - a single file: `.npy`, `.npz`, `.safetensors`, `.pt`, `.max`, `.gguf`.
//!
//! Order: the manifest's `order`; else `tensor_names.txt` (per folder); else the order
//! inside a `.pt`/`.npz`/`.gguf`; else natural sort (`layers.2` before `layers.10`).
//! Listing reads headers only; data stays memory-mapped until `load`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use loupe_formats::elem::ElemType;
use loupe_formats::max_file::sanitize_label;
use loupe_formats::raw::open_raw;
use loupe_formats::safetensors_file::Dtype;
use loupe_formats::{GgufFile, MaxFile, NpyFile, NpzFile, PtFile, SafetensorsFile, StoredTensor};

use crate::error::ParityError;
use crate::manifest::Manifest;
use crate::names::natural_cmp;
use crate::tensor::Tensor;

/// Most files listed in one directory tree, and the deepest folder nesting walked.
const MAX_FILES: usize = 200_000;
const MAX_DEPTH: usize = 8;

/// What kind of input a source is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SourceKind {
    Dump,
    /// A directory with `tensor_names.txt` files (MAX's PyTorch side).
    MaxTorchDir,
    Directory,
    Npy,
    Npz,
    Safetensors,
    Pt,
    Max,
    Gguf,
}

impl SourceKind {
    pub fn name(self) -> &'static str {
        match self {
            SourceKind::Dump => "dump",
            SourceKind::MaxTorchDir => "max-torch-dir",
            SourceKind::Directory => "directory",
            SourceKind::Npy => "npy",
            SourceKind::Npz => "npz",
            SourceKind::Safetensors => "safetensors",
            SourceKind::Pt => "pt",
            SourceKind::Max => "max",
            SourceKind::Gguf => "gguf",
        }
    }
}

/// One tensor a source offers.
#[derive(Debug, Clone)]
pub struct Entry {
    pub name: String,
    pub step: u32,
    /// Execution order within the source.
    pub order: u64,
    /// The shape, when the listing knows it.
    pub shape: Option<Vec<usize>>,
    /// Bytes the tensor occupies on disk (for progress).
    pub bytes: u64,
    loc: Loc,
}

#[derive(Debug, Clone)]
enum Loc {
    /// `.npy`; `dtype` is the manifest's element type (bf16 stored as `<u2`/`V2`).
    Npy {
        path: PathBuf,
        dtype: Option<ElemType>,
        shape: Option<Vec<usize>>,
    },
    Raw {
        path: PathBuf,
        dtype: ElemType,
        shape: Vec<usize>,
    },
    Max {
        path: PathBuf,
        shape: Option<Vec<usize>>,
    },
    /// A tensor of a `.pt`, `.npz` or `.safetensors` file in a directory.
    Member {
        path: PathBuf,
        kind: SourceKind,
        key: String,
    },
    /// A tensor of the single container this source was opened on.
    Own(String),
}

enum Container {
    Npz(NpzFile),
    Pt(PtFile),
    Safetensors(SafetensorsFile),
    Gguf(GgufFile),
}

/// An opened input.
pub struct TensorSource {
    pub path: PathBuf,
    pub kind: SourceKind,
    pub entries: Vec<Entry>,
    pub manifest: Option<Manifest>,
    /// Whether entry order is execution order (manifest, `tensor_names.txt`, the order
    /// inside a `.pt`/`.npz`/`.gguf`) rather than a natural sort of names.
    pub ordered: bool,
    container: Option<Container>,
}

impl std::fmt::Debug for TensorSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TensorSource")
            .field("path", &self.path)
            .field("kind", &self.kind)
            .field("entries", &self.entries.len())
            .finish()
    }
}

fn ext_of(path: &Path) -> String {
    path.extension().and_then(|e| e.to_str()).unwrap_or("").to_ascii_lowercase()
}

fn stem_of(path: &Path) -> String {
    path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default()
}

fn elem_of_safetensors(d: Dtype) -> Option<ElemType> {
    Some(match d {
        Dtype::BOOL => ElemType::Bool,
        Dtype::U8 => ElemType::U8,
        Dtype::I8 => ElemType::I8,
        Dtype::I16 => ElemType::I16,
        Dtype::U16 => ElemType::U16,
        Dtype::I32 => ElemType::I32,
        Dtype::U32 => ElemType::U32,
        Dtype::I64 => ElemType::I64,
        Dtype::U64 => ElemType::U64,
        Dtype::F16 => ElemType::F16,
        Dtype::BF16 => ElemType::BF16,
        Dtype::F32 => ElemType::F32,
        Dtype::F64 => ElemType::F64,
        Dtype::F8_E4M3 => ElemType::F8E4M3Fn,
        Dtype::F8_E5M2 => ElemType::F8E5M2,
        _ => return None,
    })
}

fn safetensors_tensor(f: &SafetensorsFile, name: &str) -> Result<StoredTensor, ParityError> {
    let info = f.require_tensor(name)?;
    let dtype = elem_of_safetensors(info.dtype).ok_or_else(|| {
        ParityError::input(&f.path, format!("tensor '{name}' has dtype {}, which loupe does not compare", info.dtype))
    })?;
    let (s, e) = info.data_offsets;
    let range = f.data_offset + s..f.data_offset + e;
    Ok(StoredTensor::contiguous(
        &f.path,
        &format!("tensor '{name}'"),
        dtype,
        info.shape.clone(),
        f.shared_bytes(),
        range,
        true,
    )?)
}

impl TensorSource {
    /// Opens a dump directory, a directory of tensor files, or a single file.
    pub fn open(path: impl AsRef<Path>) -> Result<TensorSource, ParityError> {
        let path = path.as_ref();
        let meta = std::fs::metadata(path).map_err(|e| ParityError::io(path, e))?;
        if meta.is_dir() {
            if path.join("manifest.json").is_file() {
                return TensorSource::open_dump(path);
            }
            return TensorSource::open_dir(path);
        }
        TensorSource::open_file(path)
    }

    /// Whether the source is one file holding one tensor (such sources pair directly).
    pub fn is_single_tensor_file(&self) -> bool {
        !matches!(self.kind, SourceKind::Dump | SourceKind::Directory | SourceKind::MaxTorchDir)
            && self.entries.len() == 1
    }

    fn open_dump(dir: &Path) -> Result<TensorSource, ParityError> {
        let manifest = Manifest::read(dir)?;
        let mut entries = Vec::with_capacity(manifest.tensors.len());
        for (i, t) in manifest.tensors.iter().enumerate() {
            let path = dir.join(&t.file);
            let dtype = ElemType::from_name(&t.dtype).unwrap_or(ElemType::F32);
            let n: u64 = t.shape.iter().map(|&d| d as u64).product();
            let loc = match ext_of(&path).as_str() {
                "npy" => Loc::Npy { path, dtype: Some(dtype), shape: Some(t.shape.clone()) },
                "max" => Loc::Max { path, shape: Some(t.shape.clone()) },
                _ => Loc::Raw { path, dtype, shape: t.shape.clone() },
            };
            entries.push(Entry {
                name: t.name.clone(),
                step: t.step,
                order: t.order.unwrap_or(i as u64),
                shape: Some(t.shape.clone()),
                bytes: n.saturating_mul(dtype.size() as u64),
                loc,
            });
        }
        entries.sort_by_key(|e| (e.step, e.order));
        Ok(TensorSource {
            path: dir.to_path_buf(),
            kind: SourceKind::Dump,
            entries,
            manifest: Some(manifest),
            ordered: true,
            container: None,
        })
    }

    fn open_dir(dir: &Path) -> Result<TensorSource, ParityError> {
        let mut files = Vec::new();
        walk(dir, dir, 0, &mut files)?;
        // tensor_names.txt per folder: label -> line index.
        let mut orders: HashMap<PathBuf, HashMap<String, u64>> = HashMap::new();
        for (rel, _) in &files {
            if rel.file_name().is_some_and(|n| n == "tensor_names.txt") {
                let p = dir.join(rel);
                let text = std::fs::read_to_string(&p).map_err(|e| ParityError::io(&p, e))?;
                let folder = rel.parent().map(Path::to_path_buf).unwrap_or_default();
                let map = text
                    .lines()
                    .map(str::trim)
                    .filter(|l| !l.is_empty())
                    .enumerate()
                    .map(|(i, l)| (sanitize_label(l), i as u64))
                    .collect();
                orders.insert(folder, map);
            }
        }
        let kind = if orders.is_empty() { SourceKind::Directory } else { SourceKind::MaxTorchDir };
        let mut entries: Vec<Entry> = Vec::new();
        let mut origin: HashMap<(u32, String), PathBuf> = HashMap::new();
        for (rel, size) in files {
            let path = dir.join(&rel);
            let step = rel
                .components()
                .next()
                .filter(|_| rel.components().count() > 1)
                .and_then(|c| c.as_os_str().to_str()?.parse::<u32>().ok())
                .unwrap_or(0);
            let stem = stem_of(&rel);
            let named: Vec<(String, Loc, Option<Vec<usize>>)> = match ext_of(&rel).as_str() {
                // Headers only (the files are memory-mapped): shapes let the pairing split a
                // fused projection by the other side's widths.
                "npy" => {
                    let shape = NpyFile::open(&path)?.shape;
                    vec![(stem.clone(), Loc::Npy { path: path.clone(), dtype: None, shape: None }, Some(shape))]
                }
                "max" => {
                    let shape = MaxFile::open(&path)?.tensor.shape;
                    vec![(stem.clone(), Loc::Max { path: path.clone(), shape: None }, Some(shape))]
                }
                "pt" => {
                    let f = PtFile::open(&path)?;
                    members(
                        &stem,
                        &path,
                        SourceKind::Pt,
                        f.tensors.iter().map(|(k, t)| (k.clone(), t.shape.clone())).collect(),
                    )
                }
                "npz" => {
                    let f = NpzFile::open(&path)?;
                    members(
                        &stem,
                        &path,
                        SourceKind::Npz,
                        f.arrays.iter().map(|(k, a)| (k.clone(), a.shape.clone())).collect(),
                    )
                }
                "safetensors" => {
                    let f = SafetensorsFile::open(&path)?;
                    let mut t: Vec<(String, Vec<usize>)> =
                        f.tensors.iter().map(|t| (t.name.clone(), t.shape.clone())).collect();
                    t.sort_by(|a, b| natural_cmp(&a.0, &b.0));
                    members(&stem, &path, SourceKind::Safetensors, t)
                }
                _ => continue,
            };
            let folder = rel.parent().map(Path::to_path_buf).unwrap_or_default();
            for (k, (name, loc, shape)) in named.into_iter().enumerate() {
                if let Some(first) = origin.insert((step, name.clone()), path.clone()) {
                    return Err(ParityError::input(
                        dir,
                        format!(
                            "tensor '{name}' (step {step}) comes from both {} and {}",
                            first.display(),
                            path.display()
                        ),
                    ));
                }
                // Listed labels first, in file order; others after, in natural order below.
                let order =
                    orders.get(&folder).and_then(|m| m.get(&name)).copied().map_or(u64::MAX, |o| o * 1024 + k as u64);
                entries.push(Entry { name, step, order, shape, bytes: size, loc });
            }
        }
        entries.sort_by(|a, b| (a.step, a.order).cmp(&(b.step, b.order)).then_with(|| natural_cmp(&a.name, &b.name)));
        for (i, e) in entries.iter_mut().enumerate() {
            e.order = i as u64;
        }
        if entries.is_empty() {
            return Err(ParityError::input(dir, "no manifest.json and no .npy/.pt/.max/.npz/.safetensors files"));
        }
        let ordered = kind == SourceKind::MaxTorchDir;
        Ok(TensorSource { path: dir.to_path_buf(), kind, entries, manifest: None, ordered, container: None })
    }

    fn open_file(path: &Path) -> Result<TensorSource, ParityError> {
        let stem = stem_of(path);
        let size = std::fs::metadata(path).map_err(|e| ParityError::io(path, e))?.len();
        let one = |kind, loc, shape| TensorSource {
            path: path.to_path_buf(),
            kind,
            entries: vec![Entry { name: stem.clone(), step: 0, order: 0, shape, bytes: size, loc }],
            manifest: None,
            ordered: true,
            container: None,
        };
        // (name, shape, bytes on disk or 0 when unknown) per tensor.
        type Listing = Vec<(String, Vec<usize>, u64)>;
        let (kind, container, list): (SourceKind, Container, Listing) = match ext_of(path).as_str() {
            "npy" => {
                let f = NpyFile::open(path)?;
                return Ok(one(
                    SourceKind::Npy,
                    Loc::Npy { path: path.to_path_buf(), dtype: None, shape: None },
                    Some(f.shape),
                ));
            }
            "max" => {
                let f = MaxFile::open(path)?;
                let mut s = one(
                    SourceKind::Max,
                    Loc::Max { path: path.to_path_buf(), shape: None },
                    Some(f.tensor.shape.clone()),
                );
                s.entries[0].name = f.key;
                return Ok(s);
            }
            "npz" => {
                let f = NpzFile::open(path)?;
                let l = f.arrays.iter().map(|(k, a)| (k.clone(), a.shape.clone(), 0)).collect();
                (SourceKind::Npz, Container::Npz(f), l)
            }
            "pt" | "pth" | "bin" if loupe_formats::zip_archive::looks_like_zip(&read_head(path)?) => {
                let f = PtFile::open(path)?;
                let l = f
                    .tensors
                    .iter()
                    .map(|(k, t)| (if k.is_empty() { stem.clone() } else { k.clone() }, t.shape.clone(), 0))
                    .collect();
                (SourceKind::Pt, Container::Pt(f), l)
            }
            "pt" | "pth" => {
                // Not a zip: let the reader say why (legacy format, bad magic).
                PtFile::open(path)?;
                return Err(ParityError::input(path, "not a torch.save archive"));
            }
            "safetensors" => {
                let f = SafetensorsFile::open(path)?;
                let mut l: Vec<(String, Vec<usize>, u64)> =
                    f.tensors.iter().map(|t| (t.name.clone(), t.shape.clone(), 0)).collect();
                l.sort_by(|a, b| natural_cmp(&a.0, &b.0));
                (SourceKind::Safetensors, Container::Safetensors(f), l)
            }
            "gguf" => {
                let f = GgufFile::open(path)?;
                let l = f.tensors.iter().map(|t| (t.name.clone(), t.shape(), t.size_bytes)).collect();
                (SourceKind::Gguf, Container::Gguf(f), l)
            }
            other => {
                return Err(ParityError::input(
                    path,
                    format!(
                        "unknown input type '.{other}' (a dump directory, or .npy .npz .pt .max .safetensors .gguf)"
                    ),
                ))
            }
        };
        let n = list.len().max(1) as u64;
        let entries = list
            .into_iter()
            .enumerate()
            .map(|(i, (name, shape, b))| {
                let key = match &container {
                    Container::Pt(f) => f.tensors.get(i).map(|t| t.0.clone()).unwrap_or_default(),
                    _ => name.clone(),
                };
                Entry {
                    name,
                    step: 0,
                    order: i as u64,
                    shape: Some(shape),
                    bytes: if b > 0 { b } else { size / n },
                    loc: Loc::Own(key),
                }
            })
            .collect();
        let ordered = kind != SourceKind::Safetensors;
        Ok(TensorSource {
            path: path.to_path_buf(),
            kind,
            entries,
            manifest: None,
            ordered,
            container: Some(container),
        })
    }

    /// Index of the entry named `name` at `step`.
    pub fn find(&self, name: &str, step: u32) -> Option<usize> {
        self.entries.iter().position(|e| e.step == step && e.name == name)
    }

    /// Loads `name` at `step`; `None` when the source does not hold it.
    pub fn load_named(&self, name: &str, step: u32) -> Result<Option<Tensor>, ParityError> {
        self.find(name, step).map(|i| self.load(i)).transpose()
    }

    /// The manifest's `prompt_tokens` (a dump's).
    pub fn prompt_tokens(&self) -> Option<&[i64]> {
        self.manifest.as_ref()?.prompt_tokens.as_deref()
    }

    /// Loads entry `i` as f32 (row-major).
    pub fn load(&self, i: usize) -> Result<Tensor, ParityError> {
        match self.load_stored(i)? {
            Loaded::Stored(stored) => Ok(Tensor::new(stored.shape.clone(), stored.to_f32()?)),
            Loaded::F32(t) => Ok(t),
        }
    }

    /// Loads entry `i` in its stored element type (a GGUF tensor comes dequantized, as f32).
    pub fn load_stored(&self, i: usize) -> Result<Loaded, ParityError> {
        let e = self.entries.get(i).ok_or_else(|| ParityError::input(&self.path, format!("no entry {i}")))?;
        let stored = match &e.loc {
            Loc::Npy { path, dtype, shape } => {
                let f = NpyFile::open(path)?;
                check_shape(path, &e.name, shape.as_deref(), &f.shape)?;
                match (dtype, f.dtype) {
                    (Some(ElemType::BF16), None | Some(ElemType::U16)) => f.tensor_as(ElemType::BF16)?,
                    _ => f.tensor()?,
                }
            }
            Loc::Raw { path, dtype, shape } => open_raw(path, *dtype, shape)?,
            Loc::Max { path, shape } => {
                let f = MaxFile::open(path)?;
                check_shape(path, &e.name, shape.as_deref(), &f.tensor.shape)?;
                f.tensor
            }
            Loc::Member { path, kind, key } => match kind {
                SourceKind::Pt => take_member(path, key, PtFile::open(path)?.tensors)?,
                SourceKind::Npz => {
                    let f = NpzFile::open(path)?;
                    f.array(key).ok_or_else(|| ParityError::input(path, format!("no array '{key}'")))?.tensor()?
                }
                _ => safetensors_tensor(&SafetensorsFile::open(path)?, key)?,
            },
            Loc::Own(key) => match &self.container {
                Some(Container::Npz(f)) => {
                    f.array(key).ok_or_else(|| ParityError::input(&self.path, format!("no array '{key}'")))?.tensor()?
                }
                Some(Container::Pt(f)) => f
                    .tensors
                    .iter()
                    .find(|(k, _)| k == key)
                    .map(|(_, t)| t.clone())
                    .ok_or_else(|| ParityError::input(&self.path, format!("no tensor '{key}'")))?,
                Some(Container::Safetensors(f)) => safetensors_tensor(f, key)?,
                Some(Container::Gguf(f)) => return Ok(Loaded::F32(gguf_tensor(f, key)?)),
                None => return Err(ParityError::input(&self.path, "source has no container")),
            },
        };
        Ok(Loaded::Stored(stored))
    }
}

/// A tensor as stored, or already converted to f32 (a dequantized GGUF tensor).
#[derive(Debug, Clone)]
pub enum Loaded {
    Stored(StoredTensor),
    F32(Tensor),
}

/// Names for the tensors of a container file in a directory: the stem for a lone tensor,
/// `stem.key` otherwise.
fn members(
    stem: &str,
    path: &Path,
    kind: SourceKind,
    list: Vec<(String, Vec<usize>)>,
) -> Vec<(String, Loc, Option<Vec<usize>>)> {
    let lone = list.len() == 1;
    list.into_iter()
        .map(|(key, shape)| {
            let name = if lone || key.is_empty() { stem.to_string() } else { format!("{stem}.{key}") };
            (name, Loc::Member { path: path.to_path_buf(), kind, key }, Some(shape))
        })
        .collect()
}

fn take_member(path: &Path, key: &str, tensors: Vec<(String, StoredTensor)>) -> Result<StoredTensor, ParityError> {
    tensors
        .into_iter()
        .find(|(k, _)| k == key)
        .map(|(_, t)| t)
        .ok_or_else(|| ParityError::input(path, format!("no tensor '{key}'")))
}

fn check_shape(path: &Path, name: &str, expected: Option<&[usize]>, got: &[usize]) -> Result<(), ParityError> {
    match expected {
        Some(e) if e != got => Err(ParityError::Manifest {
            path: path.to_path_buf(),
            reason: format!("tensor '{name}': the manifest says shape {e:?}, the file holds {got:?}"),
        }),
        _ => Ok(()),
    }
}

fn gguf_tensor(f: &GgufFile, name: &str) -> Result<Tensor, ParityError> {
    let info = f.require_tensor(name)?;
    let shape = info.shape();
    let n = usize::try_from(info.n_elements())
        .map_err(|_| ParityError::input(&f.path, format!("tensor '{name}' is too large")))?;
    let mut data: Vec<f32> = Vec::new();
    data.try_reserve_exact(n)
        .map_err(|_| ParityError::input(&f.path, format!("tensor '{name}': cannot allocate {n} f32")))?;
    data.resize(n, 0.0);
    loupe_tensor::quant::dequantize_row(info.ggml_type, f.tensor_data(info), &mut data)
        .map_err(|e| ParityError::input(&f.path, format!("tensor '{name}': {e}")))?;
    Ok(Tensor::new(shape, data))
}

fn read_head(path: &Path) -> Result<Vec<u8>, ParityError> {
    use std::io::Read;
    let mut head = Vec::with_capacity(4);
    std::fs::File::open(path).and_then(|f| f.take(4).read_to_end(&mut head)).map_err(|e| ParityError::io(path, e))?;
    Ok(head)
}

/// Lists regular files under `dir` (relative paths and sizes), skipping hidden entries.
fn walk(root: &Path, dir: &Path, depth: usize, out: &mut Vec<(PathBuf, u64)>) -> Result<(), ParityError> {
    if depth > MAX_DEPTH {
        return Ok(());
    }
    let rd = std::fs::read_dir(dir).map_err(|e| ParityError::io(dir, e))?;
    let mut items: Vec<_> = rd.filter_map(Result::ok).collect();
    items.sort_by_key(|d| d.file_name());
    for item in items {
        let name = item.file_name();
        if name.to_string_lossy().starts_with('.') {
            continue;
        }
        let p = item.path();
        let ft = item.file_type().map_err(|e| ParityError::io(&p, e))?;
        if ft.is_dir() {
            walk(root, &p, depth + 1, out)?;
        } else if ft.is_file() {
            if out.len() >= MAX_FILES {
                return Err(ParityError::input(root, format!("more than {MAX_FILES} files")));
            }
            let size = item.metadata().map(|m| m.len()).unwrap_or(0);
            out.push((p.strip_prefix(root).unwrap_or(&p).to_path_buf(), size));
        }
    }
    Ok(())
}
