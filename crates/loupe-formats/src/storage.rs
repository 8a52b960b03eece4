//! The bytes behind an opened container: a read-only memory map of the file, or an owned
//! buffer (files built in memory by tests, fuzzers and writers).
//!
//! `SharedBytes` is cheap to clone, so tensors of other crates can keep borrowing the
//! mapping after the container's header structures are dropped.

use std::fmt;
use std::ops::{Deref, Range};
use std::path::Path;
use std::sync::Arc;

use crate::FormatError;

/// Immutable, shareable file contents.
#[derive(Clone)]
pub struct SharedBytes(Arc<Backing>);

enum Backing {
    Mapped(memmap2::Mmap),
    Owned(Vec<u8>),
}

impl SharedBytes {
    /// Memory-maps `path` read-only.
    pub fn map_file(path: &Path) -> Result<SharedBytes, FormatError> {
        let io = |source| FormatError::Io { path: path.to_path_buf(), source };
        let file = std::fs::File::open(path).map_err(io)?;
        let meta = file.metadata().map_err(io)?;
        if !meta.is_file() {
            return Err(io(std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a regular file")));
        }
        if meta.len() == 0 {
            // Some platforms refuse zero-length maps; an empty buffer behaves the same.
            return Ok(SharedBytes::from_vec(Vec::new()));
        }
        // SAFETY: the map is read-only. Memory-mapping is sound as long as no other process
        // truncates or rewrites the file while it is mapped; like every mmap-based model
        // loader (llama.cpp, candle, safetensors) we accept that contract, because reading
        // multi-gigabyte weights into RAM is the alternative. Every offset taken from the
        // file is still bounds-checked against the map's length before slicing.
        let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
        Ok(SharedBytes(Arc::new(Backing::Mapped(map))))
    }

    /// Wraps an owned buffer.
    pub fn from_vec(bytes: Vec<u8>) -> SharedBytes {
        SharedBytes(Arc::new(Backing::Owned(bytes)))
    }

    /// Whether the bytes come from a memory map (as opposed to an owned buffer).
    pub fn is_mapped(&self) -> bool {
        matches!(*self.0, Backing::Mapped(_))
    }

    /// Asks the kernel to read `range` of a mapped file ahead (`MADV_WILLNEED`), so that
    /// copying it out takes a few large reads instead of a page fault per readahead window
    /// on a cold page cache. Owned bytes, ranges out of bounds and non-Unix systems: nothing.
    pub fn prefetch(&self, range: Range<usize>) {
        #[cfg(unix)]
        if let (Backing::Mapped(map), Some(r)) = (&*self.0, page_interior(range, self.len(), false)) {
            // Advice only; a failure leaves the pages to be faulted in on demand.
            let _ = map.advise_range(memmap2::Advice::WillNeed, r.start, r.len());
        }
    }

    /// Drops the whole pages inside `range` of a mapped file from this process's resident
    /// set (`MADV_DONTNEED`) once their bytes have been copied elsewhere, so a model whose
    /// weights are copied into their own memory is not held twice (the file's pages stay in
    /// the page cache, shared, reclaimable). Owned bytes, ranges out of bounds and non-Unix
    /// systems: nothing.
    ///
    /// The bytes stay readable: the map is shared and read-only, so a later read faults the
    /// same file contents back in.
    pub fn release(&self, range: Range<usize>) {
        #[cfg(unix)]
        if let (Backing::Mapped(map), Some(r)) = (&*self.0, page_interior(range, self.len(), true)) {
            // SAFETY: MADV_DONTNEED on a MAP_SHARED, PROT_READ file mapping discards only
            // this process's page-table entries; a later access re-reads the unchanged file
            // from the page cache, so every outstanding borrow still reads the same bytes.
            // (memmap2 marks DontNeed unsafe for private writable maps, whose writes it drops.)
            let _ = unsafe { map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, r.start, r.len()) };
        }
    }

    /// The bytes as a slice.
    pub fn as_slice(&self) -> &[u8] {
        match &*self.0 {
            Backing::Mapped(m) => m,
            Backing::Owned(v) => v,
        }
    }
}

/// `range` (checked against `len`) shrunk to whole pages when `inner` (pages shared with the
/// neighbouring bytes are kept), or widened to them otherwise; `None` when nothing is left.
#[cfg(unix)]
fn page_interior(range: Range<usize>, len: usize, inner: bool) -> Option<Range<usize>> {
    // The mapping starts page-aligned (mmap's contract), so offsets align as addresses do.
    const PAGE: usize = 4096;
    if range.start >= range.end || range.end > len {
        return None;
    }
    let (start, end) = if inner {
        (range.start.checked_next_multiple_of(PAGE)?, range.end / PAGE * PAGE)
    } else {
        (range.start / PAGE * PAGE, range.end)
    };
    (start < end).then_some(start..end)
}

impl Deref for SharedBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl AsRef<[u8]> for SharedBytes {
    fn as_ref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl fmt::Debug for SharedBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = if self.is_mapped() { "mapped" } else { "owned" };
        write!(f, "SharedBytes({kind}, {} bytes)", self.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(unix)]
    #[test]
    fn page_interior_keeps_shared_pages_and_checks_bounds() {
        assert_eq!(page_interior(100..10_000, 20_000, true), Some(4096..8192));
        assert_eq!(page_interior(100..8000, 20_000, true), None, "no whole page inside");
        assert_eq!(page_interior(100..10_000, 20_000, false), Some(0..10_000));
        assert_eq!(page_interior(100..30_000, 20_000, true), None, "past the end");
        assert_eq!(page_interior(500..500, 20_000, false), None, "empty");
    }

    #[test]
    fn released_mapped_bytes_read_the_same() {
        let dir = std::env::temp_dir().join(format!("loupe-storage-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("bytes.bin");
        let data: Vec<u8> = (0..5 * 4096 + 123).map(|i| (i * 7 % 251) as u8).collect();
        std::fs::write(&path, &data).unwrap();
        let bytes = SharedBytes::map_file(&path).unwrap();
        assert_eq!(&bytes[..], &data[..]);
        bytes.prefetch(10..data.len());
        bytes.release(10..data.len() - 5);
        bytes.release(0..data.len() + 1); // out of bounds: nothing
        assert_eq!(&bytes[..], &data[..], "the pages fault back in with the file's bytes");
        let owned = SharedBytes::from_vec(data.clone());
        owned.release(0..data.len());
        assert_eq!(&owned[..], &data[..], "owned bytes are never discarded");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
