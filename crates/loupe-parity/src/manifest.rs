//! The dump manifest (`manifest.json`, format `loupe-dump` version 1): the contract
//! between `loupe dump`, the Python reference dumper and this comparator (docs/dump-format.md). Unknown fields are ignored so that producers can add some; the fields
//! read here are validated when a dump is opened (`source.rs`); [`crate::writer`] writes
//! them.

use std::path::{Component, Path};

use loupe_formats::elem::ElemType;
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
    /// The system message of a chat prompt.
    #[serde(default)]
    pub system: Option<String>,
    #[serde(default)]
    pub prompt_tokens: Option<Vec<i64>>,
    /// The token fed at each decode step 1..K.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generated_tokens: Option<Vec<i64>>,
    #[serde(default)]
    pub precision: Option<String>,
    /// Decoder layers the run kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layers: Option<usize>,
    /// Bugs planted on purpose (`loupe dump --inject`); absent in a normal dump.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub faults: Option<Vec<String>>,
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
