//! Where a GGUF's weight blocks live once loaded: read in place from the file's mapping, or
//! copied into a [`loupe_tensor::hugepages::WeightArena`].
//!
//! Decode streams every weight once per token, so the weights want 2 MiB pages
//! ([`loupe_tensor::hugepages`] says why). There are two ways to have them:
//!
//! - **In place** ([`WeightPlacement::Mapped`]): the file's read-only mapping is advised
//!   `MADV_HUGEPAGE` and its tensors are used where they lie. Where the page cache holds the
//!   file in 2 MiB folios (Linux 6.x filesystems with large folios: ext4 from 6.16, xfs,
//!   tmpfs), each folio is mapped by one page-table entry, and a cold read fills the cache in
//!   2 MiB folios. Nothing is copied: loading is mapping the pages (and reading the file when
//!   it is not cached), the weights are held once (in the page cache, shared with any other
//!   process that maps the file), and, as with llama.cpp's mmap, the file must not be
//!   rewritten while a model is loaded from it.
//! - **Copied** ([`WeightPlacement::Copied`]): each matrix is copied into the arena's
//!   anonymous huge pages and its file pages released as it goes. Every 2 MiB of the arena
//!   is a page fault that the kernel fills with zeros first (and, on a VM that returns free
//!   memory to its host, that the host faults in too), which is most of the load time.
//!
//! [`WeightPlacement::Auto`], the default, takes the mapping when it gets 2 MiB entries (a
//! probe: populate 16 windows of 2 MiB spread over the file's data and read how much of the mapping
//! `/proc/self/smaps` reports PMD-mapped), and also where neither way can have huge pages
//! (`LOUPE_HUGEPAGES=0`, or not Linux); it copies when the page cache holds the file in
//! smaller folios, where only the copy gets huge pages. BENCHMARKS.md (Results,
//! "2026-11-29 (afternoon)") measures both ways.
//!
//! Matrices the loader must transform (llama.cpp's q/k row permutation undone, f32 or FP8
//! precision, 1-D tensors) are computed into memory of their own either way.

use loupe_formats::storage::SharedBytes;
use loupe_formats::GgufFile;

use crate::weights::Precision;

/// How a GGUF's kept weight blocks are placed (`--weights`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum WeightPlacement {
    /// In place when the file's mapping gets 2 MiB pages or huge pages are off; copied
    /// otherwise (module docs).
    #[default]
    Auto,
    /// Read in place from the file's mapping.
    Mapped,
    /// Copied into huge pages of the process's own.
    Copied,
}

const HUGE_PAGE: usize = 2 << 20;

/// Decides, for a GGUF about to be loaded at `precision`, whether its kept blocks are read in
/// place (`true`). Advises the mapping into huge pages when they are wanted; the probe of
/// `Auto` populates [`PROBE_WINDOWS`] windows of 2 MiB of the file.
pub(crate) fn in_place(gguf: &GgufFile, requested: WeightPlacement, precision: Precision) -> bool {
    let bytes = gguf.shared_bytes();
    // Owned bytes (files built in memory) have no mapping to use; f32 and FP8 compute from
    // values the loader makes, so nothing of the file is kept.
    if !bytes.is_mapped() || matches!(precision, Precision::F32 | Precision::Fp8) {
        return false;
    }
    let huge = loupe_tensor::hugepages::enabled();
    match requested {
        WeightPlacement::Copied => false,
        WeightPlacement::Mapped => {
            if huge {
                bytes.advise_huge_pages();
            }
            true
        }
        WeightPlacement::Auto if !huge || !cfg!(target_os = "linux") => true,
        WeightPlacement::Auto => {
            let data_start = usize::try_from(gguf.data_offset).unwrap_or(usize::MAX);
            bytes.address().is_multiple_of(HUGE_PAGE) && bytes.advise_huge_pages() && probe_is_huge(&bytes, data_start)
        }
    }
}

/// How many 2 MiB windows the probe populates, spread evenly over the data.
const PROBE_WINDOWS: usize = 16;

/// Populates [`PROBE_WINDOWS`] whole 2 MiB windows spread over the data of `bytes` (past
/// `data_start`, which the header's reads have touched) and says whether at least half of
/// them came out mapped by 2 MiB entries: the page cache may hold a file partly in smaller
/// folios (its last one, or what was written or read in small pieces), so one window could
/// mislead either way. A file too small to hold the windows says no.
fn probe_is_huge(bytes: &SharedBytes, data_start: usize) -> bool {
    let span = bytes.len().saturating_sub(data_start);
    let windows: Vec<usize> = (0..PROBE_WINDOWS)
        .map(|i| (data_start + span / PROBE_WINDOWS * i + span / PROBE_WINDOWS / 2) / HUGE_PAGE * HUGE_PAGE)
        .filter(|&w| w >= data_start && w + HUGE_PAGE <= bytes.len())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    if windows.len() < PROBE_WINDOWS {
        return false;
    }
    let before = bytes.huge_mapped_bytes().unwrap_or(0);
    if !windows.iter().all(|&w| bytes.populate(w..w + HUGE_PAGE)) {
        return false;
    }
    let grown = bytes.huge_mapped_bytes().unwrap_or(0).saturating_sub(before);
    grown >= (PROBE_WINDOWS / 2 * HUGE_PAGE) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_without_a_whole_huge_page_of_data_probes_no() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("small.bin");
        std::fs::write(&path, vec![7u8; 3 << 20]).unwrap();
        let bytes = SharedBytes::map_file(&path).unwrap();
        assert!(!probe_is_huge(&bytes, 1 << 20), "no room for the windows");
        assert!(!probe_is_huge(&SharedBytes::from_vec(vec![0; 8 << 20]), 0), "owned bytes populate nothing");
    }
}
