//! `.pt` files written by `torch.save` (the zip format, the default since PyTorch 1.6).
//!
//! Layout (PyTorch `torch/serialization.py`, `_save`; `caffe2/serialize/inline_container.h`):
//! a zip archive (members stored, data aligned to 64 bytes) whose members share one
//! top-level folder `<prefix>/` (the file stem, or `archive`):
//! - `<prefix>/data.pkl`: the pickled object; tensors are `_rebuild_tensor_v2/v3` calls on
//!   storages named by persistent ids (see `pickle.rs`);
//! - `<prefix>/data/<key>`: each storage's raw bytes;
//! - `<prefix>/byteorder`: `little` or `big` (absent in files from before torch 1.13,
//!   which were little-endian);
//! - `<prefix>/version`, `.format_version`, `.storage_alignment`, `.data/serialization_id`:
//!   not needed to read tensors.
//!
//! The pickle is run by the allow-listed VM in `pickle.rs`; nothing in the file is ever
//! executed. The legacy (pre-1.6) format, a bare pickle stream, is refused with a remedy.
//! Storages are served zero-copy from the file's memory map.

use std::path::{Path, PathBuf};

use crate::elem::StoredTensor;
use crate::pickle::{unpickle, MAX_PICKLE_BYTES};
use crate::storage::SharedBytes;
use crate::zip_archive::{looks_like_zip, ZipArchive};
use crate::FormatError;

/// An opened `.pt` file: its tensors, named by their path in the pickled object.
#[derive(Debug)]
pub struct PtFile {
    pub path: PathBuf,
    /// The archive's top-level folder.
    pub prefix: String,
    /// Tensors in pickle order; a file holding one tensor has one entry named `""`.
    pub tensors: Vec<(String, StoredTensor)>,
}

impl PtFile {
    /// Memory-maps and reads `path`.
    pub fn open(path: impl AsRef<Path>) -> Result<PtFile, FormatError> {
        let path = path.as_ref();
        PtFile::from_shared(path.to_path_buf(), SharedBytes::map_file(path)?)
    }

    /// Reads an in-memory file; `label` names it in errors.
    pub fn from_bytes(label: impl Into<PathBuf>, bytes: Vec<u8>) -> Result<PtFile, FormatError> {
        PtFile::from_shared(label.into(), SharedBytes::from_vec(bytes))
    }

    pub fn from_shared(path: PathBuf, bytes: SharedBytes) -> Result<PtFile, FormatError> {
        if !looks_like_zip(&bytes) {
            if bytes.first() == Some(&0x80) {
                return Err(FormatError::Unsupported {
                    path,
                    what: "legacy (pre-1.6, non-zip) torch.save format; re-save it with a current torch.save".into(),
                });
            }
            return Err(FormatError::BadMagic {
                path,
                format: "torch zip (.pt)",
                found: format!("{:02x?}", bytes.get(..4).unwrap_or_default()),
            });
        }
        let mut archive = ZipArchive::new(path.clone(), bytes)?;
        let pkl: Vec<&str> = archive
            .members
            .iter()
            .map(|m| m.name.as_str())
            .filter(|n| n.ends_with("/data.pkl") && n.matches('/').count() == 1)
            .collect();
        let prefix = match pkl.as_slice() {
            [one] => one.trim_end_matches("/data.pkl").to_string(),
            [] => return Err(FormatError::invalid(&path, "torch archive", "no <folder>/data.pkl member")),
            _ => return Err(FormatError::invalid(&path, "torch archive", "several data.pkl members")),
        };
        let big_endian = match archive.member(&format!("{prefix}/byteorder")).cloned() {
            None => false,
            Some(m) => {
                let r = archive.read(&m)?;
                match r.as_slice() {
                    b"little" => false,
                    b"big" => true,
                    other => {
                        return Err(FormatError::invalid(
                            &path,
                            "byteorder",
                            format!(
                                "'{}' (little or big)",
                                String::from_utf8_lossy(other.get(..16.min(other.len())).unwrap_or_default())
                            ),
                        ))
                    }
                }
            }
        };
        let pkl_member = archive
            .member(&format!("{prefix}/data.pkl"))
            .cloned()
            .ok_or_else(|| FormatError::invalid(&path, "torch archive", "data.pkl vanished"))?;
        if pkl_member.size > MAX_PICKLE_BYTES {
            return Err(FormatError::TooLarge {
                path,
                field: "data.pkl size".into(),
                value: pkl_member.size,
                limit: MAX_PICKLE_BYTES,
            });
        }
        let pkl_region = archive.read(&pkl_member)?;
        let unpickled = unpickle(&path, pkl_region.as_slice())?;
        let refs = unpickled.tensors(&path)?;
        let mut tensors = Vec::with_capacity(refs.len());
        for (name, t) in refs {
            let field = if name.is_empty() { "tensor".to_string() } else { format!("tensor '{name}'") };
            let member = archive.member(&format!("{prefix}/data/{}", t.storage.key)).cloned().ok_or_else(|| {
                FormatError::Missing {
                    path: path.clone(),
                    what: "storage",
                    name: format!("{prefix}/data/{} (for {field})", t.storage.key),
                }
            })?;
            let region = archive.read(&member)?;
            let stored = StoredTensor::strided(
                &path,
                &field,
                t.dtype,
                t.shape,
                t.strides,
                t.offset,
                region.bytes,
                region.range,
            )?;
            tensors.push((name, stored.with_big_endian(big_endian)));
        }
        Ok(PtFile { path, prefix, tensors })
    }
}
