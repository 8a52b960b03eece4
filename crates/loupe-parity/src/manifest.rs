//! The dump manifest (`manifest.json`, format `loupe-dump` version 1): the contract
//! between `loupe dump`, the Python reference dumper and this comparator
//! (docs/dump-format.md). Unknown fields are ignored so that producers can add some; the fields
//! read here are validated when a dump is opened (`source.rs`). Also a small writer,
//! [`DumpWriter`], used by tests, the benchmark and any Rust producer.

use std::path::{Component, Path, PathBuf};

use loupe_formats::elem::ElemType;
use loupe_formats::max_file::{sanitize_label, write_max};
use loupe_formats::npy::write_npy;
use serde::{Deserialize, Serialize};

use crate::error::ParityError;

/// The `format` value of a dump manifest.
pub const DUMP_FORMAT: &str = "loupe-dump";
/// The manifest version this crate reads and writes.
pub const DUMP_VERSION: u32 = 1;
/// Largest manifest read: 256 MiB (10^5 tensors take ~30 MB).
pub const MAX_MANIFEST_BYTES: u64 = 256 << 20;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    pub format: String,
    pub version: u32,
    #[serde(default)]
    pub producer: Option<Producer>,
    #[serde(default)]
    pub model: Option<ModelInfo>,
    #[serde(default)]
    pub prompt: Option<String>,
    #[serde(default)]
    pub chat: Option<bool>,
    #[serde(default)]
    pub prompt_tokens: Option<Vec<i64>>,
    #[serde(default)]
    pub precision: Option<String>,
    pub tensors: Vec<ManifestTensor>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Producer {
    pub engine: String,
    #[serde(default)]
    pub version: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelInfo {
    #[serde(default)]
    pub path: Option<String>,
    #[serde(default)]
    pub sha256: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ManifestTensor {
    pub name: String,
    /// 0 = prefill, k = decode step k.
    #[serde(default)]
    pub step: u32,
    /// Execution order (manifest order when absent).
    #[serde(default)]
    pub order: Option<u64>,
    /// Path relative to the dump directory.
    pub file: String,
    pub dtype: String,
    pub shape: Vec<usize>,
    #[serde(default)]
    pub axes: Option<Vec<String>>,
    #[serde(default)]
    pub stats: Option<Stats>,
}

/// Summary statistics; `null` where a value is not finite.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Stats {
    pub min: Option<f64>,
    pub max: Option<f64>,
    pub mean: Option<f64>,
    pub std: Option<f64>,
    pub nan: u64,
    pub inf: u64,
}

impl Stats {
    /// Statistics of `data` (over finite values; NaN and Inf counted apart).
    pub fn of(data: &[f32]) -> Stats {
        let (mut n, mut sum, mut sq, mut nan, mut inf) = (0u64, 0f64, 0f64, 0u64, 0u64);
        let (mut lo, mut hi) = (f64::INFINITY, f64::NEG_INFINITY);
        for &v in data {
            if v.is_nan() {
                nan += 1;
            } else if v.is_infinite() {
                inf += 1;
            } else {
                let x = f64::from(v);
                n += 1;
                sum += x;
                sq += x * x;
                lo = lo.min(x);
                hi = hi.max(x);
            }
        }
        let finite = |x: f64| x.is_finite().then_some(x);
        let mean = (n > 0).then(|| sum / n as f64);
        let std = mean.map(|m| (sq / n as f64 - m * m).max(0.0).sqrt());
        Stats { min: finite(lo), max: finite(hi), mean, std, nan, inf }
    }
}

impl Manifest {
    /// Reads and validates `dir/manifest.json`.
    pub fn read(dir: &Path) -> Result<Manifest, ParityError> {
        let path = dir.join("manifest.json");
        let err = |reason: String| ParityError::Manifest { path: path.clone(), reason };
        let len = std::fs::metadata(&path).map_err(|e| ParityError::io(&path, e))?.len();
        if len > MAX_MANIFEST_BYTES {
            return Err(err(format!("{len} bytes, over the limit of {MAX_MANIFEST_BYTES}")));
        }
        let text = std::fs::read_to_string(&path).map_err(|e| ParityError::io(&path, e))?;
        let m: Manifest = serde_json::from_str(&text).map_err(|e| err(e.to_string()))?;
        if m.format != DUMP_FORMAT {
            return Err(err(format!("format '{}' (expected '{DUMP_FORMAT}')", m.format)));
        }
        if m.version != DUMP_VERSION {
            return Err(err(format!("version {} (this loupe reads {DUMP_VERSION})", m.version)));
        }
        let mut seen = std::collections::HashSet::new();
        for t in &m.tensors {
            let at = |r: String| err(format!("tensor '{}' (step {}): {r}", t.name, t.step));
            if !seen.insert((t.step, t.name.as_str())) {
                return Err(at("listed twice".into()));
            }
            if ElemType::from_name(&t.dtype).is_none() {
                return Err(at(format!("unknown dtype '{}'", t.dtype)));
            }
            if !is_inside(&t.file) {
                return Err(at(format!("file '{}' is not a relative path inside the dump", t.file)));
            }
        }
        Ok(m)
    }
}

/// Whether `file` is a relative path made only of normal components (no `..`, no root).
pub(crate) fn is_inside(file: &str) -> bool {
    let p = Path::new(file);
    p.components().any(|c| matches!(c, Component::Normal(_)))
        && p.components().all(|c| matches!(c, Component::Normal(_) | Component::CurDir))
}

/// File style of a dump written by [`DumpWriter`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DumpStyle {
    /// `.npy` per tensor (the default).
    Npy,
    /// Raw little-endian f32 bytes; dtype and shape in the manifest only.
    Binary,
    /// MAX `.max` files.
    Max,
}

/// Writes a dump directory: f32 tensors plus `manifest.json`.
#[derive(Debug)]
pub struct DumpWriter {
    dir: PathBuf,
    style: DumpStyle,
    pub manifest: Manifest,
}

impl DumpWriter {
    /// Creates `dir` (and parents); `engine` names the producer.
    pub fn create(dir: impl Into<PathBuf>, engine: &str, style: DumpStyle) -> Result<DumpWriter, ParityError> {
        let dir = dir.into();
        std::fs::create_dir_all(&dir).map_err(|e| ParityError::io(&dir, e))?;
        let manifest = Manifest {
            format: DUMP_FORMAT.into(),
            version: DUMP_VERSION,
            producer: Some(Producer { engine: engine.into(), version: Some(env!("CARGO_PKG_VERSION").into()) }),
            model: None,
            prompt: None,
            chat: Some(false),
            prompt_tokens: None,
            precision: Some("f32".into()),
            tensors: Vec::new(),
        };
        Ok(DumpWriter { dir, style, manifest })
    }

    /// Writes one tensor (`shape` as `[tokens, features]` for activations) at `step`.
    pub fn add(&mut self, name: &str, step: u32, shape: &[usize], data: &[f32]) -> Result<(), ParityError> {
        let sub = format!("step{step}");
        let stem = sanitize_label(name);
        let file = match self.style {
            DumpStyle::Npy => format!("{sub}/{stem}.npy"),
            DumpStyle::Binary => format!("{sub}/{stem}.bin"),
            DumpStyle::Max => format!("{sub}/{stem}.max"),
        };
        let dir = self.dir.join(&sub);
        std::fs::create_dir_all(&dir).map_err(|e| ParityError::io(&dir, e))?;
        let path = self.dir.join(&file);
        match self.style {
            DumpStyle::Npy => write_npy(&path, shape, data)?,
            DumpStyle::Max => write_max(&path, name, shape, data)?,
            DumpStyle::Binary => {
                let raw: Vec<u8> = data.iter().flat_map(|v| v.to_le_bytes()).collect();
                std::fs::write(&path, raw).map_err(|e| ParityError::io(&path, e))?;
            }
        }
        let axes = (shape.len() == 2).then(|| vec!["token".to_string(), "feature".to_string()]);
        let order = self.manifest.tensors.len() as u64;
        self.manifest.tensors.push(ManifestTensor {
            name: name.into(),
            step,
            order: Some(order),
            file,
            dtype: "f32".into(),
            shape: shape.to_vec(),
            axes,
            stats: Some(Stats::of(data)),
        });
        Ok(())
    }

    /// Writes `manifest.json`; returns the dump directory.
    pub fn finish(self) -> Result<PathBuf, ParityError> {
        let path = self.dir.join("manifest.json");
        let text = serde_json::to_string_pretty(&self.manifest).map_err(|e| ParityError::Manifest { path: path.clone(), reason: e.to_string() })?;
        std::fs::write(&path, text).map_err(|e| ParityError::io(&path, e))?;
        Ok(self.dir)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_must_stay_inside_the_dump() {
        assert!(is_inside("step0/a.npy") && is_inside("./a.npy"));
        for bad in ["", ".", "/etc/passwd", "../x.npy", "step0/../../x"] {
            assert!(!is_inside(bad), "{bad}");
        }
    }

    #[test]
    fn stats_skip_non_finite_values() {
        let s = Stats::of(&[1.0, 3.0, f32::NAN, f32::INFINITY]);
        assert_eq!((s.min, s.max, s.mean, s.nan, s.inf), (Some(1.0), Some(3.0), Some(2.0), 1, 1));
        assert_eq!(s.std, Some(1.0));
    }
}
