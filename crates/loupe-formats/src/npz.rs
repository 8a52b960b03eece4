//! `.npz` files: a zip archive of `.npy` members (`numpy.savez` stores them,
//! `numpy.savez_compressed` deflates them; numpy `numpy/lib/_npyio_impl.py`). The array
//! name is the member name without `.npy`. Members that are not `.npy` files are refused
//! (numpy would only reach them as raw bytes), as are non-`.npy` pickled objects.

use std::path::{Path, PathBuf};

use crate::npy::NpyFile;
use crate::storage::SharedBytes;
use crate::zip_archive::ZipArchive;
use crate::FormatError;

/// An opened npz archive; members are parsed as npy on open (headers only: stored data
/// stays in the map, deflated data is inflated once).
#[derive(Debug)]
pub struct NpzFile {
    pub path: PathBuf,
    /// Arrays in archive order, named without the `.npy` suffix.
    pub arrays: Vec<(String, NpyFile)>,
}

impl NpzFile {
    /// Memory-maps and reads `path`.
    pub fn open(path: impl AsRef<Path>) -> Result<NpzFile, FormatError> {
        let path = path.as_ref();
        NpzFile::from_shared(path.to_path_buf(), SharedBytes::map_file(path)?)
    }

    /// Reads an in-memory archive; `label` names it in errors.
    pub fn from_bytes(label: impl Into<PathBuf>, bytes: Vec<u8>) -> Result<NpzFile, FormatError> {
        NpzFile::from_shared(label.into(), SharedBytes::from_vec(bytes))
    }

    pub fn from_shared(path: PathBuf, bytes: SharedBytes) -> Result<NpzFile, FormatError> {
        let mut archive = ZipArchive::new(path.clone(), bytes)?;
        let members = archive.members.clone();
        let mut arrays = Vec::with_capacity(members.len());
        for m in &members {
            let Some(name) = m.name.strip_suffix(".npy") else {
                return Err(FormatError::Unsupported {
                    path,
                    what: format!("npz member '{}' (only .npy members are read)", m.name),
                });
            };
            let region = archive.read(m)?;
            let label = PathBuf::from(format!("{}:{}", path.display(), m.name));
            arrays.push((name.to_string(), NpyFile::from_region(label, region)?));
        }
        Ok(NpzFile { path, arrays })
    }

    /// The array named `name`.
    pub fn array(&self, name: &str) -> Option<&NpyFile> {
        self.arrays.iter().find(|(n, _)| n == name).map(|(_, a)| a)
    }
}
