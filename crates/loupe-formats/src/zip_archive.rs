//! Zip archives as the npz and `torch.save` formats use them: the central directory is read
//! by the `zip` crate; members are then served as [`SharedBytes`].
//!
//! Stored (uncompressed) members, which is every member `torch.save` writes and every
//! member of `np.savez`, are served zero-copy as a range of the file's memory map, so a
//! multi-gigabyte `.pt` is never read into RAM. Deflated members (`np.savez_compressed`)
//! are inflated into a buffer whose size is the declared size, capped and reserved
//! fallibly, and the inflated length must equal the declared one (a zip bomb cannot make
//! us allocate more than it declares, nor more than [`MAX_MEMBER_BYTES`]).
//!
//! CRC-32s of deflated members are checked by the `zip` crate while inflating; stored
//! members served zero-copy are not checksummed (PyTorch's own reader does not check them
//! either: `caffe2/serialize/inline_container.cc` reads records directly).

use std::io::{Cursor, Read};
use std::path::{Path, PathBuf};

use zip::CompressionMethod;

use crate::storage::SharedBytes;
use crate::FormatError;

/// Most members in one archive. A state dict of a very large model has ~10^4 tensors.
pub const MAX_MEMBERS: usize = 1 << 20;

/// Largest inflated member: 16 GiB.
pub const MAX_MEMBER_BYTES: u64 = 1 << 34;

/// A member's bytes: a region of shared bytes (of the archive's map when stored, of an
/// inflated buffer otherwise).
#[derive(Debug, Clone)]
pub struct Region {
    pub bytes: SharedBytes,
    pub range: std::ops::Range<usize>,
}

impl Region {
    /// The region as a slice (empty if the range were ever out of bounds).
    pub fn as_slice(&self) -> &[u8] {
        self.bytes.get(self.range.clone()).unwrap_or_default()
    }
}

/// One member of an archive.
#[derive(Debug, Clone)]
pub struct Member {
    pub name: String,
    /// Uncompressed size as declared in the central directory.
    pub size: u64,
    stored: bool,
    /// For stored members: the absolute byte offset of the data.
    data_start: u64,
    index: usize,
}

/// An opened zip archive over shared bytes.
pub struct ZipArchive {
    pub path: PathBuf,
    pub members: Vec<Member>,
    bytes: SharedBytes,
    inner: zip::ZipArchive<Cursor<SharedBytes>>,
}

impl std::fmt::Debug for ZipArchive {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ZipArchive").field("path", &self.path).field("members", &self.members.len()).finish()
    }
}

fn zip_err(path: &Path, e: zip::result::ZipError) -> FormatError {
    FormatError::invalid(path, "zip archive", e.to_string())
}

/// Whether `bytes` start like a zip archive (a local file header, `PK\x03\x04`).
pub fn looks_like_zip(bytes: &[u8]) -> bool {
    bytes.starts_with(b"PK\x03\x04")
}

impl ZipArchive {
    /// Reads the central directory of `bytes`.
    pub fn new(path: PathBuf, bytes: SharedBytes) -> Result<ZipArchive, FormatError> {
        let mut inner = zip::ZipArchive::new(Cursor::new(bytes.clone())).map_err(|e| zip_err(&path, e))?;
        if inner.len() > MAX_MEMBERS {
            return Err(FormatError::TooLarge {
                path,
                field: "zip member count".into(),
                value: inner.len() as u64,
                limit: MAX_MEMBERS as u64,
            });
        }
        let mut members = Vec::with_capacity(inner.len());
        let mut seen = std::collections::HashSet::new();
        for index in 0..inner.len() {
            let f = inner.by_index_raw(index).map_err(|e| zip_err(&path, e))?;
            let name = f.name().to_string();
            if f.is_dir() {
                continue;
            }
            if !seen.insert(name.clone()) {
                return Err(FormatError::invalid(&path, format!("zip member '{name}'"), "appears twice"));
            }
            let stored = match f.compression() {
                CompressionMethod::Stored => true,
                CompressionMethod::Deflated => false,
                other => {
                    return Err(FormatError::Unsupported {
                        path: path.clone(),
                        what: format!("compression {other} of zip member '{name}' (stored and deflate only)"),
                    })
                }
            };
            if stored {
                let inside = matches!(f.data_start().checked_add(f.size()), Some(e) if e <= bytes.len() as u64);
                if f.compressed_size() != f.size() || !inside {
                    return Err(FormatError::invalid(
                        &path,
                        format!("zip member '{name}'"),
                        "stored data lies outside the file",
                    ));
                }
            }
            members.push(Member { name, size: f.size(), stored, data_start: f.data_start(), index });
        }
        Ok(ZipArchive { path, members, bytes, inner })
    }

    /// The member named `name`.
    pub fn member(&self, name: &str) -> Option<&Member> {
        self.members.iter().find(|m| m.name == name)
    }

    /// The member's bytes: a range of the map when stored, inflated otherwise.
    pub fn read(&mut self, member: &Member) -> Result<Region, FormatError> {
        let label = || format!("zip member '{}'", member.name);
        if member.stored {
            let range = usize::try_from(member.data_start)
                .ok()
                .zip(usize::try_from(member.size).ok())
                .and_then(|(s, n)| Some(s..s.checked_add(n)?));
            return range
                .filter(|r| r.end <= self.bytes.len())
                .map(|range| Region { bytes: self.bytes.clone(), range })
                .ok_or_else(|| FormatError::invalid(&self.path, label(), "stored data lies outside the file"));
        }
        if member.size > MAX_MEMBER_BYTES {
            return Err(FormatError::TooLarge {
                path: self.path.clone(),
                field: format!("{} inflated size", label()),
                value: member.size,
                limit: MAX_MEMBER_BYTES,
            });
        }
        let declared = usize::try_from(member.size)
            .map_err(|_| FormatError::invalid(&self.path, label(), "inflated size does not fit in memory"))?;
        let mut out = Vec::new();
        out.try_reserve_exact(declared).map_err(|_| FormatError::TooLarge {
            path: self.path.clone(),
            field: format!("{} inflated size (allocation failed)", label()),
            value: member.size,
            limit: MAX_MEMBER_BYTES,
        })?;
        let path = self.path.clone();
        let f = self.inner.by_index(member.index).map_err(|e| zip_err(&path, e))?;
        // Read one byte past the declared size to detect a member that inflates to more.
        f.take(member.size.saturating_add(1))
            .read_to_end(&mut out)
            .map_err(|e| FormatError::invalid(&path, label(), format!("inflating: {e}")))?;
        if out.len() != declared {
            return Err(FormatError::invalid(
                &path,
                label(),
                format!("inflates to {} bytes, {} declared", out.len(), member.size),
            ));
        }
        let range = 0..out.len();
        Ok(Region { bytes: SharedBytes::from_vec(out), range })
    }
}

/// Builds a zip archive of `(name, bytes, deflate)` members, for tests, fuzzing and
/// writers of npz files. Stored members are aligned to 64 bytes, as `torch.save` does.
pub fn write_zip(members: &[(&str, &[u8], bool)]) -> Result<Vec<u8>, FormatError> {
    use std::io::Write;
    let label = Path::new("<zip writer>");
    let werr = |e: zip::result::ZipError| FormatError::invalid(label, "zip archive", e.to_string());
    let mut w = zip::ZipWriter::new(Cursor::new(Vec::new()));
    for (name, bytes, deflate) in members {
        let opts = zip::write::SimpleFileOptions::default()
            .compression_method(if *deflate { CompressionMethod::Deflated } else { CompressionMethod::Stored })
            .with_alignment(if *deflate { 1 } else { 64 });
        w.start_file(*name, opts).map_err(werr)?;
        w.write_all(bytes).map_err(|e| FormatError::Io { path: label.to_path_buf(), source: e })?;
    }
    Ok(w.finish().map_err(werr)?.into_inner())
}
