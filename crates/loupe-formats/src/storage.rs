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

    /// Advises the whole mapping into transparent huge pages (`MADV_HUGEPAGE`), to be done
    /// before its pages are first touched through it. Where the page cache holds 2 MiB folios
    /// of the file (Linux 6.x filesystems with large folios: ext4 from 6.16, xfs, tmpfs), a
    /// fault then maps 2 MiB with one page-table entry, and a cold read fills the cache in
    /// 2 MiB folios. Returns whether the advice was taken (Linux, a mapped file).
    pub fn advise_huge_pages(&self) -> bool {
        #[cfg(target_os = "linux")]
        if let Backing::Mapped(map) = &*self.0 {
            // Advice only: a failure (a kernel without file THP) leaves 4 KiB pages.
            return map.advise(memmap2::Advice::HugePage).is_ok();
        }
        false
    }

    /// Maps `range` of a mapped file into this process's page tables now, reading what the
    /// page cache lacks from disk (`MADV_POPULATE_READ`, Linux 5.14), so that the first pass
    /// over it takes no page faults. Returns whether it was done; where it was not (owned
    /// bytes, an older kernel, another OS, a range out of bounds) the pages fault in on
    /// first use, as before.
    pub fn populate(&self, range: Range<usize>) -> bool {
        #[cfg(target_os = "linux")]
        if let (Backing::Mapped(map), Some(r)) = (&*self.0, page_interior(range, self.len(), false)) {
            // SAFETY: r lies inside the mapping (page_interior checked it against the
            // length; the mapping starts page-aligned); MADV_POPULATE_READ only faults pages
            // in for reading, changing no contents and no protection.
            let rc = unsafe {
                libc::madvise(map.as_ptr().add(r.start) as *mut libc::c_void, r.len(), libc::MADV_POPULATE_READ)
            };
            return rc == 0;
        }
        false
    }

    /// The address of the first byte: a mapped file's 2 MiB-aligned offsets land on
    /// 2 MiB-aligned addresses (as huge page-table entries need) when this is a multiple of
    /// 2 MiB.
    pub fn address(&self) -> usize {
        self.as_slice().as_ptr() as usize
    }

    /// How many bytes of this mapping are mapped by 2 MiB page-table entries now (the
    /// `FilePmdMapped` lines of `/proc/self/smaps` for the mapping's address range); `None`
    /// for owned bytes, elsewhere than Linux, or when smaps cannot be read.
    pub fn huge_mapped_bytes(&self) -> Option<u64> {
        if !self.is_mapped() || !cfg!(target_os = "linux") {
            return None;
        }
        let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
        let (lo, hi) = (self.address() as u64, (self.address() + self.len()) as u64);
        Some(pmd_mapped_within(&smaps, lo, hi))
    }

    /// The bytes as a slice.
    pub fn as_slice(&self) -> &[u8] {
        match &*self.0 {
            Backing::Mapped(m) => m,
            Backing::Owned(v) => v,
        }
    }
}

/// The sum of the `FilePmdMapped` fields (kB) of the areas of `smaps` (the text of
/// `/proc/<pid>/smaps`) that start inside addresses `lo..hi`, in bytes (an area ends on a
/// page boundary, past a file's last byte). Malformed lines count nothing.
fn pmd_mapped_within(smaps: &str, lo: u64, hi: u64) -> u64 {
    let mut inside = false;
    let mut bytes = 0u64;
    for line in smaps.lines() {
        let first = line.split_whitespace().next().unwrap_or("");
        if let Some((a, b)) = first.split_once('-').filter(|_| !first.ends_with(':')) {
            inside = match (u64::from_str_radix(a, 16), u64::from_str_radix(b, 16)) {
                (Ok(a), Ok(b)) => a >= lo && a < hi && a < b,
                _ => false,
            };
        } else if inside {
            if let Some(kb) = line.strip_prefix("FilePmdMapped:") {
                let kb: u64 = kb.trim().trim_end_matches("kB").trim().parse().unwrap_or(0);
                bytes = bytes.saturating_add(kb.saturating_mul(1024));
            }
        }
    }
    bytes
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
    fn pmd_mapped_sums_the_areas_inside_the_range() {
        let smaps = "\
7f0000000000-7f0000400000 r--s 00000000 fd:00 12 /m/model.gguf
Size:               4096 kB
FilePmdMapped:      2048 kB
VmFlags: rd sh mr mw me ms hg
7f0000400000-7f0000600000 r--s 00400000 fd:00 12 /m/model.gguf
FilePmdMapped:      2048 kB
7f0000600000-7f0000800000 rw-p 00000000 00:00 0
FilePmdMapped:      2048 kB
FilePmdMapped:    garbage
";
        let lo = 0x7f00_0000_0000;
        assert_eq!(pmd_mapped_within(smaps, lo, lo + 0x60_0000), 4 << 20, "both file areas, not the third");
        assert_eq!(pmd_mapped_within(smaps, lo, lo + 0x5f_f000), 4 << 20, "a file's last area ends past its bytes");
        assert_eq!(pmd_mapped_within(smaps, lo, lo + 0x40_0000), 2 << 20);
        assert_eq!(pmd_mapped_within(smaps, lo + 0x80_0000, lo + 0x90_0000), 0, "nothing there");
        assert_eq!(pmd_mapped_within("", lo, lo + 1), 0);
    }

    #[test]
    fn populated_huge_advised_bytes_read_the_same() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("bytes.bin");
        let data: Vec<u8> = (0..(4 << 20) + 321).map(|i| (i * 13 % 251) as u8).collect();
        std::fs::write(&path, &data).unwrap();
        let bytes = SharedBytes::map_file(&path).unwrap();
        assert_eq!(bytes.advise_huge_pages(), cfg!(target_os = "linux"));
        assert_eq!(bytes.populate(0..data.len()), cfg!(target_os = "linux"));
        assert!(!bytes.populate(0..data.len() + 1), "out of bounds: nothing");
        assert_eq!(&bytes[..], &data[..]);
        let mapped = bytes.huge_mapped_bytes();
        assert_eq!(mapped.is_some(), cfg!(target_os = "linux"));
        assert!(mapped.unwrap_or(0) <= data.len() as u64);
        let owned = SharedBytes::from_vec(data.clone());
        assert!(!owned.advise_huge_pages() && !owned.populate(0..10));
        assert_eq!(owned.huge_mapped_bytes(), None);
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
