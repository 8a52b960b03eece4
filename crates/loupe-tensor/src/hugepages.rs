//! Weight bytes in transparent huge pages.
//!
//! Decode streams every weight once per token. On 4 KiB pages that is a TLB miss and a
//! restart of the hardware prefetcher (which does not cross a page) every 4 KiB; on 2 MiB
//! pages, one per 2 MiB. Linux gives huge pages to anonymous memory only where asked
//! (`/sys/kernel/mm/transparent_hugepage/enabled` is `madvise` on most distributions,
//! including the machines of BENCHMARKS.md), so a model's weight matrices are copied into
//! a [`WeightArena`]: 2 MiB-aligned chunks advised `MADV_HUGEPAGE` before their pages are
//! first touched.
//!
//! Why: a GEMV streaming weights on 4 KiB pages takes a TLB miss and a hardware-prefetcher
//! restart every page; on huge pages both the streamed bandwidth and Gemma 3's decode were
//! measured faster (BENCHMARKS.md, "Measurements once in doc comments"; `examples/stream_gemv.rs` measures it).
//!
//! `LOUPE_HUGEPAGES=0` turns the advice off (to measure its effect); elsewhere than Linux
//! the chunks are plain allocations.
//!
//! The other way to huge pages is no copy at all: a GGUF's blocks read in place from the
//! file's mapping, where the page cache holds the file in 2 MiB folios
//! ([`WeightBytes::in_place`]; loupe-models' `placement` decides which way a load takes).

const HUGE_PAGE: usize = 2 << 20;

/// Whether huge pages are asked for (`LOUPE_HUGEPAGES` is not `0`).
pub fn enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("LOUPE_HUGEPAGES").map(|v| v.trim() != "0").unwrap_or(true))
}

/// Advises the 2 MiB-aligned interior of `len` bytes at `start` into huge pages (a buffer
/// not yet touched, as [`WeightArena`]'s chunks are; `loupe bench` measures its read
/// bandwidth ceiling on such a buffer, so the ceiling is read as the weights are). Returns
/// whether any of it was advised.
pub fn advise_interior(start: *const u8, len: usize) -> bool {
    let start = start as usize;
    let (lo, hi) = (start.next_multiple_of(HUGE_PAGE), start.saturating_add(len) / HUGE_PAGE * HUGE_PAGE);
    if !cfg!(target_os = "linux") || hi <= lo {
        return false;
    }
    advise(lo, hi - lo);
    true
}

#[cfg(target_os = "linux")]
fn advise(start: usize, len: usize) {
    // SAFETY: start..start + len lies in one allocation, 2 MiB-aligned; MADV_HUGEPAGE
    // changes no contents and no protection. Failure (EINVAL without THP support) leaves
    // ordinary pages, which is fine.
    unsafe { libc::madvise(start as *mut libc::c_void, len, libc::MADV_HUGEPAGE) };
}

#[cfg(not(target_os = "linux"))]
fn advise(_start: usize, _len: usize) {}

/// The pieces [`WeightArena::copy_in_pieces`] copies a matrix in: large enough that the
/// per-piece release costs nothing measurable, small enough to bound what is resident twice.
pub const COPY_PIECE_BYTES: usize = 4 << 20;

/// Least size of an arena chunk. Matrices are packed one after another; a matrix larger
/// than this gets a chunk of its own size, whose tail then takes the next ones. What a
/// chunk wastes when the next matrix does not fit: its untouched rest (address space, not
/// resident) and the unused part of its last touched 2 MiB page (resident once touched, as
/// a huge page is allocated whole), so at most 2 MiB per chunk: fewer, larger chunks waste
/// less (Llama-3.2-1B-shaped Q4_K_M: 50 MB resident when each matrix over 8 MiB had its own
/// chunk, measured in BENCHMARKS.md).
pub const CHUNK_BYTES: usize = 64 << 20;

/// Where a model's weight matrices live: 2 MiB-aligned chunks advised into huge pages
/// whole, each matrix copied in once and never moved, so a model whose matrices are each
/// far smaller than a huge page (SmolLM2's are 0.1-0.6 MB) still streams them from huge
/// pages. Matrices are appended while earlier ones are already in use; each keeps its
/// chunk alive ([`WeightBytes`]).
///
/// Cost: up to a chunk of address space per model load beyond the weights (never touched,
/// so not resident), and with huge pages the last touched 2 MiB page of each chunk.
pub struct WeightArena {
    current: std::sync::Mutex<Option<std::sync::Arc<Chunk>>>,
    huge: bool,
}

impl Default for WeightArena {
    fn default() -> Self {
        Self::new()
    }
}

impl WeightArena {
    /// An empty arena whose chunks are advised into huge pages unless `LOUPE_HUGEPAGES=0`.
    pub fn new() -> Self {
        Self::with_huge_pages(enabled())
    }

    /// An empty arena, its chunks advised into huge pages or not.
    pub fn with_huge_pages(huge: bool) -> Self {
        WeightArena { current: std::sync::Mutex::new(None), huge }
    }

    /// A copy of `bytes` in the arena (64-byte aligned).
    pub fn copy(&self, bytes: &[u8]) -> WeightBytes {
        self.copy_in_pieces(bytes, &mut |_| {})
    }

    /// [`WeightArena::copy`], calling `copied(range)` after each piece of `bytes` (at most
    /// [`COPY_PIECE_BYTES`]) is in place, so that a caller reading `bytes` from a mapped file
    /// can release the pages it has copied as it goes: a 30 MB embedding is then never
    /// resident twice.
    pub fn copy_in_pieces(&self, bytes: &[u8], copied: &mut dyn FnMut(std::ops::Range<usize>)) -> WeightBytes {
        if bytes.is_empty() {
            return WeightBytes::from(Vec::new());
        }
        let mut current = self.current.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(w) = current.as_ref().and_then(|c| c.append(bytes, copied)) {
            return w;
        }
        let chunk = Chunk::new(bytes.len().max(CHUNK_BYTES), self.huge);
        let w = chunk.append(bytes, copied).expect("a fresh chunk of at least the matrix's size holds it");
        *current = Some(chunk);
        w
    }
}

/// One allocation of the arena: `cap` bytes, 2 MiB-aligned, of which `0..used` are handed
/// out (never written again) and the rest not yet touched.
struct Chunk {
    ptr: std::ptr::NonNull<u8>,
    layout: std::alloc::Layout,
    used: std::sync::Mutex<usize>,
}

// SAFETY: the chunk's bytes are written only through `append`, under `used`'s lock, at
// offsets past every range handed out; handed-out ranges are only read.
unsafe impl Send for Chunk {}
unsafe impl Sync for Chunk {}

impl Chunk {
    fn new(bytes: usize, huge: bool) -> std::sync::Arc<Chunk> {
        let size = bytes.next_multiple_of(HUGE_PAGE);
        let layout =
            std::alloc::Layout::from_size_align(size, HUGE_PAGE).expect("a size rounded to 2 MiB is a valid layout");
        // SAFETY: the layout has a nonzero size (bytes > 0 by the callers).
        let raw = unsafe { std::alloc::alloc(layout) };
        let Some(ptr) = std::ptr::NonNull::new(raw) else { std::alloc::handle_alloc_error(layout) };
        if huge {
            advise(ptr.as_ptr() as usize, size);
        }
        std::sync::Arc::new(Chunk { ptr, layout, used: std::sync::Mutex::new(0) })
    }

    /// Copies `bytes` in after the last range handed out, piece by piece (`copied` after
    /// each), or `None` when they do not fit.
    fn append(
        self: &std::sync::Arc<Self>,
        bytes: &[u8],
        copied: &mut dyn FnMut(std::ops::Range<usize>),
    ) -> Option<WeightBytes> {
        let mut used = self.used.lock().unwrap_or_else(|e| e.into_inner());
        let start = used.next_multiple_of(64);
        let end = start.checked_add(bytes.len()).filter(|&e| e <= self.layout.size())?;
        for (i, piece) in bytes.chunks(COPY_PIECE_BYTES).enumerate() {
            let at = i * COPY_PIECE_BYTES;
            // SAFETY: start + at .. start + at + piece.len() lies inside start..end, inside
            // the allocation and past every range handed out, so no reference to these
            // bytes exists; the source is a separate slice.
            unsafe { copy_on_the_pool(piece, self.ptr.as_ptr().add(start + at)) };
            copied(at..at + piece.len());
        }
        *used = end;
        Some(WeightBytes(Storage::Arena { chunk: std::sync::Arc::clone(self), start, len: bytes.len() }))
    }
}

/// Below this a piece is copied on the calling thread (a pool job costs microseconds).
const PARALLEL_COPY_BYTES: usize = 256 << 10;

/// Copies `src` to `dst` split over the compute pool's threads. A chunk's first write to
/// each page faults it in, and the kernel zeroes it there (2 MiB at a time on huge pages);
/// spread over the threads, those faults and the copy proceed in parallel, which is most of
/// a model's load time once its file is in the page cache.
///
/// # Safety
/// `dst..dst + src.len()` is writable, referenced by nothing else, and does not overlap `src`.
unsafe fn copy_on_the_pool(src: &[u8], dst: *mut u8) {
    let threads = crate::pool::threads();
    if threads < 2 || src.len() < PARALLEL_COPY_BYTES {
        // SAFETY: the caller's contract.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst, src.len()) };
        return;
    }
    // Page-sized parts, one per thread.
    let part = src.len().div_ceil(threads).next_multiple_of(4096);
    let out = crate::pool::OutPtr(dst);
    crate::pool::run(src.len().div_ceil(part), &|j| {
        let from = j * part;
        let piece = &src[from..(from + part).min(src.len())];
        // SAFETY: the tasks' ranges are disjoint parts of the caller's destination.
        unsafe { std::ptr::copy_nonoverlapping(piece.as_ptr(), out.get().add(from), piece.len()) };
    });
}

impl Drop for Chunk {
    fn drop(&mut self) {
        // SAFETY: allocated in `Chunk::new` with this layout; no WeightBytes outlives it (each
        // holds an Arc).
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) };
    }
}

/// The bytes of a weight matrix: its own vector, a range of a [`WeightArena`] chunk, or bytes
/// used where they lie (a model file's mapping, [`WeightBytes::in_place`]). Reads as a `[u8]`.
#[derive(Clone)]
pub struct WeightBytes(Storage);

#[derive(Clone)]
enum Storage {
    Owned(Vec<u8>),
    Arena {
        chunk: std::sync::Arc<Chunk>,
        start: usize,
        len: usize,
    },
    /// `len` bytes at address `ptr`, valid while `_owner` (held for that alone) lives.
    InPlace {
        _owner: std::sync::Arc<dyn std::any::Any + Send + Sync>,
        ptr: usize,
        len: usize,
    },
}

impl WeightBytes {
    /// `bytes` used where they lie, nothing copied: a weight matrix read in place from a
    /// model file's read-only mapping, which `owner` keeps mapped.
    ///
    /// # Safety
    /// `bytes` must stay valid and unchanged for as long as `owner` (or any clone of the
    /// result) lives: memory that `owner` owns and never writes, such as a read-only file
    /// mapping it holds.
    pub unsafe fn in_place(owner: std::sync::Arc<dyn std::any::Any + Send + Sync>, bytes: &[u8]) -> WeightBytes {
        WeightBytes(Storage::InPlace { _owner: owner, ptr: bytes.as_ptr() as usize, len: bytes.len() })
    }

    /// Whether the bytes are used in place ([`WeightBytes::in_place`]) rather than copied.
    pub fn is_in_place(&self) -> bool {
        matches!(self.0, Storage::InPlace { .. })
    }
}

impl std::ops::Deref for WeightBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match &self.0 {
            Storage::Owned(v) => v,
            // SAFETY: start..start + len was written by `append` before this value existed and
            // is never written again; the Arc keeps the allocation alive.
            Storage::Arena { chunk, start, len } => unsafe {
                std::slice::from_raw_parts(chunk.ptr.as_ptr().add(*start), *len)
            },
            // SAFETY: `in_place`'s contract: ptr..ptr + len stays valid and unchanged while
            // `owner`, held here, lives.
            Storage::InPlace { ptr, len, .. } => unsafe { std::slice::from_raw_parts(*ptr as *const u8, *len) },
        }
    }
}

impl From<Vec<u8>> for WeightBytes {
    fn from(v: Vec<u8>) -> Self {
        WeightBytes(Storage::Owned(v))
    }
}

impl std::fmt::Debug for WeightBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let place = match self.0 {
            Storage::Owned(_) => "owned",
            Storage::Arena { .. } => "arena",
            Storage::InPlace { .. } => "in place",
        };
        write!(f, "WeightBytes({} bytes, {place})", self.len())
    }
}

impl PartialEq for WeightBytes {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The VmFlags of the mapping holding `addr` (Linux `/proc/self/smaps`).
    #[cfg(target_os = "linux")]
    fn vm_flags_at(addr: usize) -> String {
        let smaps = std::fs::read_to_string("/proc/self/smaps").expect("/proc/self/smaps");
        let mut inside = false;
        for line in smaps.lines() {
            let range = line
                .split_whitespace()
                .next()
                .and_then(|r| r.split_once('-'))
                .and_then(|(a, b)| Some((usize::from_str_radix(a, 16).ok()?, usize::from_str_radix(b, 16).ok()?)));
            if let Some((lo, hi)) = range {
                inside = (lo..hi).contains(&addr);
            } else if inside {
                if let Some(f) = line.strip_prefix("VmFlags:") {
                    return f.to_string();
                }
            }
        }
        panic!("no mapping holds {addr:#x}")
    }

    #[test]
    fn the_arena_keeps_every_matrix_exact_and_aligned() {
        let arena = WeightArena::new();
        let sizes = [1usize, 63, 64, 4096, 300_000, CHUNK_BYTES / 4, CHUNK_BYTES / 4 + 1, 5 << 20, 3 << 20, 17];
        let mats: Vec<(Vec<u8>, WeightBytes)> = sizes
            .iter()
            .enumerate()
            .map(|(i, &n)| {
                let src: Vec<u8> = (0..n).map(|j| ((j * 7 + i * 13) % 256) as u8).collect();
                let w = arena.copy(&src);
                (src, w)
            })
            .collect();
        for (src, w) in &mats {
            assert_eq!(&**w, &src[..], "{} bytes", src.len());
            assert_eq!(w.as_ptr() as usize % 64, 0, "{} bytes: not 64-byte aligned", src.len());
        }
        drop(arena);
        // The matrices outlive the arena (their chunks are shared).
        assert!(mats.iter().all(|(s, w)| **w == s[..]));
        assert!(WeightArena::new().copy(&[]).is_empty());
    }

    /// Matrices appended from several threads while earlier ones are read.
    #[test]
    fn in_place_bytes_read_as_their_owner_holds_them() {
        let owner: std::sync::Arc<Vec<u8>> = std::sync::Arc::new((0..1000u32).map(|i| (i % 251) as u8).collect());
        // SAFETY: the Vec is never written and the Arc keeps it alive.
        let w = unsafe { WeightBytes::in_place(owner.clone(), &owner[100..900]) };
        let copy = w.clone();
        drop(w);
        assert!(copy.is_in_place());
        assert_eq!(&copy[..], &owner[100..900]);
        assert_eq!(copy.as_ptr(), owner[100..].as_ptr(), "no copy");
        assert_eq!(format!("{copy:?}"), "WeightBytes(800 bytes, in place)");
        assert!(!WeightArena::new().copy(&owner).is_in_place());
    }

    #[test]
    fn appends_race_with_reads() {
        let arena = WeightArena::new();
        let first = arena.copy(&[9u8; 1000]);
        std::thread::scope(|s| {
            for t in 0..4u8 {
                let arena = &arena;
                let first = &first;
                s.spawn(move || {
                    for i in 0..200usize {
                        let src = vec![t ^ i as u8; 10_000 + i];
                        assert_eq!(&*arena.copy(&src), &src[..]);
                        assert!(first.iter().all(|&b| b == 9));
                    }
                });
            }
        });
    }

    #[test]
    #[cfg(target_os = "linux")]
    fn arena_chunks_are_advised_into_huge_pages() {
        let w = WeightArena::with_huge_pages(true).copy(&[1u8; 100_000]);
        assert!(vm_flags_at(w.as_ptr() as usize).split_whitespace().any(|f| f == "hg"), "arena chunk lacks hg");
        let w = WeightArena::with_huge_pages(false).copy(&[1u8; 100_000]);
        assert!(!vm_flags_at(w.as_ptr() as usize).split_whitespace().any(|f| f == "hg"), "unadvised chunk has hg");
    }
}
