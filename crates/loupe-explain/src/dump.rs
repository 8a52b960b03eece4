//! A dump as the hypotheses read it: loupe-parity's reader ([`TensorSource`], the one
//! reader of the dump layout) with the look-ups explain needs, and its errors in
//! explain's terms.

use std::path::{Path, PathBuf};

use loupe_models::Module;
use loupe_parity::{Tensor, TensorSource};

use crate::error::ExplainError;

/// One dump directory.
pub struct Dump {
    pub dir: PathBuf,
    /// `prompt_tokens` from the manifest, when present.
    pub prompt_len: Option<usize>,
    source: TensorSource,
}

impl Dump {
    pub fn open(dir: &Path) -> Result<Dump, ExplainError> {
        if !dir.join("manifest.json").is_file() {
            return Err(ExplainError::Manifest {
                path: dir.join("manifest.json"),
                reason: format!("no such file; is {} a dump directory?", dir.display()),
            });
        }
        let source = TensorSource::open(dir)?;
        let prompt_len = source.prompt_tokens().map(<[i64]>::len);
        Ok(Dump { dir: dir.to_path_buf(), prompt_len, source })
    }

    pub fn has(&self, name: &str, step: usize) -> bool {
        u32::try_from(step).is_ok_and(|s| self.source.find(name, s).is_some())
    }

    /// The first of `names` this dump holds at `step`.
    pub fn first_of<'n>(&self, names: &'n [String], step: usize) -> Option<&'n str> {
        names.iter().map(String::as_str).find(|n| self.has(n, step))
    }

    /// Highest decoder layer with a value at `step`.
    pub fn last_layer(&self, step: usize) -> Option<usize> {
        self.source
            .entries
            .iter()
            .filter(|e| e.step as usize == step)
            .filter_map(|e| Module::parse(&e.name))
            .filter(|m| m.role.in_layer())
            .map(|m| m.layer)
            .max()
    }

    /// Reads `name` at `step` as f32.
    pub fn tensor(&self, name: &str, step: usize) -> Result<Tensor, ExplainError> {
        let missing = || ExplainError::MissingTensor { dump: self.dir.clone(), name: name.to_string(), step };
        let s = u32::try_from(step).map_err(|_| missing())?;
        self.source.load_named(name, s)?.ok_or_else(missing)
    }

    /// `name` at steps `0..=step`, rows concatenated (the whole context a KV cache holds).
    pub fn rows_through(&self, name: &str, step: usize) -> Result<Tensor, ExplainError> {
        let mut out = self.tensor(name, 0)?;
        for s in 1..=step {
            let t = self.tensor(name, s)?;
            if t.shape.get(1..) != out.shape.get(1..) {
                return Err(ExplainError::Shape {
                    what: format!("'{name}' is {:?} at step {s} but {:?} at step 0", t.shape, out.shape),
                });
            }
            out.data.extend_from_slice(&t.data);
            if let (Some(r), Some(add)) = (out.shape.first_mut(), t.shape.first()) {
                *r += add;
            }
        }
        Ok(out)
    }
}
