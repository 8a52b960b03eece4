//! The one writer of the dump layout (docs/dump-format.md; the same layout as the
//! Python reference's `dumpfmt.DumpWriter`): `step<k>/<name>.npy` (or `.bin`, `.max`) per
//! tensor and `manifest.json` listing each with its step, execution order, file, dtype,
//! shape, axes and stats. `loupe dump`, the tests and any Rust producer write through it;
//! [`crate::source::TensorSource`] reads what it writes.
//!
//! Writing is atomic: tensors go into a hidden staging directory beside the target
//! (`.NAME.partial-…`), and only [`DumpWriter::finish`] writes the manifest and renames the
//! staging directory into place (replacing an earlier dump there). A dump that fails or is
//! dropped before `finish` leaves nothing behind, so no half-written directory ever looks
//! like a complete dump.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use loupe_formats::max_file::{sanitize_label, write_max};
use loupe_formats::npy::write_npy;

use crate::error::ParityError;
use crate::manifest::{Manifest, ManifestTensor, Producer, Stats, DUMP_FORMAT, DUMP_VERSION};

/// File style of a dump.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DumpStyle {
    /// `.npy` per tensor (the default).
    Npy,
    /// Raw little-endian f32 bytes (`.bin`); dtype and shape in the manifest only.
    Binary,
    /// MAX `.max` files.
    Max,
}

impl DumpStyle {
    /// The tensor files' extension, with its dot.
    pub fn ext(self) -> &'static str {
        match self {
            DumpStyle::Npy => ".npy",
            DumpStyle::Binary => ".bin",
            DumpStyle::Max => ".max",
        }
    }
}

/// One computed value to write: under its name and under each alias (a value that is the
/// output of two modules, like `…self_attn` and `…self_attn.o_proj`, is listed once per
/// name, each with its own file, so either side of a comparison finds it).
#[derive(Debug, Clone, Copy)]
pub struct Capture<'a> {
    pub name: &'a str,
    pub aliases: &'a [String],
    /// 0 = prefill, k = decode step k.
    pub step: u32,
    pub shape: &'a [usize],
    /// One meaning per dimension (`["token", "hidden"]`).
    pub axes: &'a [&'a str],
    pub data: &'a [f32],
}

/// Writes a dump directory of f32 tensors plus `manifest.json`, atomically.
///
/// Entries get their execution order from the order of the calls (counted over the whole
/// dump, so it is unique and increases with the step). A name written twice at one step is
/// recorded as `name(1)`, `name(2)`… (a module called twice), never overwritten.
#[derive(Debug)]
pub struct DumpWriter {
    target: PathBuf,
    staging: PathBuf,
    style: DumpStyle,
    /// The manifest so far: set its header fields (prompt, tokens, model…) before `finish`.
    pub manifest: Manifest,
    next_order: u64,
    calls: HashMap<(u32, String), usize>,
    files: HashSet<String>,
    steps: HashSet<u32>,
    finished: bool,
}

/// Makes staging names unique within a process (several writers at once, e.g. in tests).
static STAGING_SEQ: AtomicU64 = AtomicU64::new(0);

/// Whether `dir` may be (re)written as a dump: absent, empty, or an earlier dump.
fn check_target(dir: &Path) -> Result<(), ParityError> {
    let Ok(meta) = std::fs::symlink_metadata(dir) else { return Ok(()) };
    if !meta.is_dir() {
        return Err(ParityError::input(dir, "exists and is not a directory"));
    }
    let empty = std::fs::read_dir(dir).map_err(|e| ParityError::io(dir, e))?.next().is_none();
    if !empty && !dir.join("manifest.json").is_file() {
        return Err(ParityError::input(dir, "exists and is not a loupe dump; choose another output directory"));
    }
    Ok(())
}

/// A fresh hidden directory beside `target`: `.NAME.<what>-PID-N`.
fn sibling_dir(target: &Path, what: &str) -> Result<PathBuf, ParityError> {
    let parent = target.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let name = target.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "dump".into());
    loop {
        let n = STAGING_SEQ.fetch_add(1, Ordering::Relaxed);
        let dir = parent.join(format!(".{name}.{what}-{}-{n}", std::process::id()));
        match std::fs::create_dir(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(ParityError::io(&dir, e)),
        }
    }
}

impl DumpWriter {
    /// Starts a dump that [`finish`](Self::finish) will put at `dir`; `engine` names the
    /// producer. `dir` may be new, empty, or an earlier dump (replaced at `finish`); its
    /// parents are created.
    pub fn create(dir: impl Into<PathBuf>, engine: &str, style: DumpStyle) -> Result<DumpWriter, ParityError> {
        let target: PathBuf = dir.into();
        check_target(&target)?;
        if let Some(parent) = target.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent).map_err(|e| ParityError::io(parent, e))?;
        }
        let staging = sibling_dir(&target, "partial")?;
        let manifest = Manifest {
            format: DUMP_FORMAT.into(),
            version: DUMP_VERSION,
            producer: Some(Producer { engine: engine.into(), version: Some(env!("CARGO_PKG_VERSION").into()) }),
            model: None,
            prompt: None,
            chat: Some(false),
            system: None,
            prompt_tokens: None,
            generated_tokens: None,
            precision: Some("f32".into()),
            layers: None,
            faults: None,
            tensors: Vec::new(),
        };
        Ok(DumpWriter {
            target,
            staging,
            style,
            manifest,
            next_order: 0,
            calls: HashMap::new(),
            files: HashSet::new(),
            steps: HashSet::new(),
            finished: false,
        })
    }

    /// Where the dump will be once finished.
    pub fn target(&self) -> &Path {
        &self.target
    }

    /// The staging directory tensors are written into until `finish`.
    pub fn staging(&self) -> &Path {
        &self.staging
    }

    /// Writes one tensor at `step` with no aliases; axes `[token, feature]` for rank 2
    /// (activations), none otherwise. Returns the name it was listed under.
    pub fn add(&mut self, name: &str, step: u32, shape: &[usize], data: &[f32]) -> Result<String, ParityError> {
        let axes: &[&str] = if shape.len() == 2 { &["token", "feature"] } else { &[] };
        let mut labels = self.capture(&Capture { name, aliases: &[], step, shape, axes, data })?;
        Ok(labels.remove(0))
    }

    /// Writes a value under its name and each alias, in that order; returns the names it was
    /// listed under (with a `(k)` suffix for a repeated call).
    pub fn capture(&mut self, c: &Capture<'_>) -> Result<Vec<String>, ParityError> {
        let n = c.shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
        if n != Some(c.data.len()) {
            return Err(ParityError::input(
                &self.target,
                format!("tensor '{}': shape {:?} does not hold {} values", c.name, c.shape, c.data.len()),
            ));
        }
        let stats = Stats::of(c.data);
        let axes = (!c.axes.is_empty()).then(|| c.axes.iter().map(|a| a.to_string()).collect::<Vec<_>>());
        let mut labels = Vec::with_capacity(1 + c.aliases.len());
        for name in std::iter::once(c.name).chain(c.aliases.iter().map(String::as_str)) {
            let count = self.calls.entry((c.step, name.to_string())).or_insert(0);
            let label = if *count == 0 { name.to_string() } else { format!("{name}({count})") };
            *count += 1;
            let file = self.write_file(&label, c.step, c.shape, c.data)?;
            self.manifest.tensors.push(ManifestTensor {
                name: label.clone(),
                step: c.step,
                order: Some(self.next_order),
                file,
                dtype: "f32".into(),
                shape: c.shape.to_vec(),
                axes: axes.clone(),
                stats: Some(stats.clone()),
            });
            self.next_order += 1;
            labels.push(label);
        }
        Ok(labels)
    }

    /// Writes `label`'s file into the staging directory; returns its path relative to the
    /// dump (`step<k>/<sanitized label><ext>`, `/` separators).
    fn write_file(&mut self, label: &str, step: u32, shape: &[usize], data: &[f32]) -> Result<String, ParityError> {
        let stem = sanitize_label(label);
        let file = format!("step{step}/{stem}{}", self.style.ext());
        if !self.files.insert(file.clone()) {
            return Err(ParityError::input(
                &self.target,
                format!("two tensors map to the same file {file} ('{label}')"),
            ));
        }
        if self.steps.insert(step) {
            let sub = self.staging.join(format!("step{step}"));
            std::fs::create_dir_all(&sub).map_err(|e| ParityError::io(&sub, e))?;
        }
        let path = self.staging.join(&file);
        match self.style {
            DumpStyle::Npy => write_npy(&path, shape, data)?,
            DumpStyle::Max => write_max(&path, &stem, shape, data)?,
            DumpStyle::Binary => {
                let raw: Vec<u8> = data.iter().flat_map(|v| v.to_le_bytes()).collect();
                std::fs::write(&path, raw).map_err(|e| ParityError::io(&path, e))?;
            }
        }
        Ok(file)
    }

    /// Writes `manifest.json` and moves the dump into place (an earlier dump there is
    /// replaced only now); returns the dump directory.
    pub fn finish(mut self) -> Result<PathBuf, ParityError> {
        self.manifest.tensors.sort_by_key(|t| t.order);
        let path = self.staging.join("manifest.json");
        let mut text = serde_json::to_vec_pretty(&self.manifest)
            .map_err(|e| ParityError::Manifest { path: path.clone(), reason: e.to_string() })?;
        text.push(b'\n');
        std::fs::write(&path, text).map_err(|e| ParityError::io(&path, e))?;
        self.commit()?;
        self.finished = true;
        Ok(self.target.clone())
    }

    /// Renames the staging directory to the target, moving an earlier dump aside first and
    /// removing it after (restoring it if the rename fails).
    fn commit(&self) -> Result<(), ParityError> {
        check_target(&self.target)?;
        let old = if std::fs::symlink_metadata(&self.target).is_ok() {
            let holder = sibling_dir(&self.target, "old")?;
            let aside = holder.join("d");
            std::fs::rename(&self.target, &aside)
                .map_err(|e| ParityError::input(&self.target, format!("cannot replace the old dump: {e}")))?;
            Some((holder, aside))
        } else {
            None
        };
        if let Err(e) = std::fs::rename(&self.staging, &self.target) {
            if let Some((holder, aside)) = &old {
                let _ = std::fs::rename(aside, &self.target);
                let _ = std::fs::remove_dir_all(holder);
            }
            return Err(ParityError::input(&self.target, format!("cannot move the dump into place: {e}")));
        }
        if let Some((holder, _)) = old {
            let _ = std::fs::remove_dir_all(holder);
        }
        Ok(())
    }

    /// Removes everything written so far (also what dropping an unfinished writer does).
    pub fn abort(self) {}
}

impl Drop for DumpWriter {
    fn drop(&mut self) {
        if !self.finished {
            let _ = std::fs::remove_dir_all(&self.staging);
        }
    }
}
