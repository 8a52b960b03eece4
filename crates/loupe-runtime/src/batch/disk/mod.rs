//! The prefix cache's disk tier (KV offloading): cached blocks evicted from memory are
//! written to a directory, one file per block named by its chain key, and read back into a
//! fresh block when a later prompt's prefix continues past what memory still holds
//! (docs/batching.md, "Disk tier").
//!
//! The engine thread only copies a block's rows into a buffer ([`DiskTier::spill`]); a
//! writer thread checksums and writes it ([`writer`]). Restores read on the engine thread
//! (one block file, a few hundred KiB for small models). Files are trusted for nothing:
//! [`format`] refuses any file whose identity, geometry, tokens or checksum differ, and the
//! tier deletes it and counts it. An I/O error never fails a request: the tier logs it once
//! and turns itself off, and the engine carries on with its memory cache alone.

mod error;
mod format;
#[cfg(test)]
mod tests;
mod writer;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::Read;
use std::path::{Path, PathBuf};

use loupe_graph::PagedKvCache;

pub use error::DiskError;
pub use format::{fuzz_block_file, BlockFile, BlockFileError, BlockKey, CacheIdentity, HEADER_LEN, MAGIC, VERSION};
use writer::{Done, Job, Writer};

/// Where the disk tier keeps its files and how many bytes of them it may keep.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiskCacheConfig {
    /// One engine per directory: the tier indexes the directory at start and assumes it is
    /// the only writer.
    pub dir: PathBuf,
    /// Files beyond this are deleted, least recently used first.
    pub max_bytes: u64,
}

/// Counters of the disk tier (all zero when it is off).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DiskStats {
    /// Configured and not turned off by an I/O error.
    pub enabled: bool,
    /// Evicted blocks written to disk.
    pub written_blocks: u64,
    /// Blocks read back into memory on a prefix hit.
    pub restored_blocks: u64,
    /// Files refused (truncated, corrupt, another model's or geometry's, other tokens) and deleted.
    pub invalid_files: u64,
    /// Files deleted to stay under the size cap.
    pub evicted_files: u64,
    /// Evicted blocks not written because the writer was more than [`MAX_PENDING_BYTES`] behind.
    pub skipped_writes: u64,
    /// Files in the directory's index now, and their bytes.
    pub files: usize,
    pub bytes: u64,
    /// Time the engine thread spent copying evicted blocks out, and restoring blocks
    /// (reading, checking and copying in), in nanoseconds.
    pub spill_ns: u64,
    pub restore_ns: u64,
}

/// Bytes of evicted blocks handed to the writer and not yet written, beyond which further
/// evictions are not written (counted in [`DiskStats::skipped_writes`]): the engine never
/// waits for the disk to make room in memory.
pub const MAX_PENDING_BYTES: u64 = 64 << 20;
/// File buffers kept for reuse once written.
const SPARE_BUFFERS: usize = 8;

struct Entry {
    bytes: u64,
    used: u64,
}

/// The index of one directory of block files and the writer behind it.
pub(crate) struct DiskTier {
    dir: PathBuf,
    max_bytes: u64,
    identity: CacheIdentity,
    files: HashMap<u64, Entry>,
    /// Files by last use (write or restore), oldest first.
    lru: BTreeMap<u64, u64>,
    clock: u64,
    bytes: u64,
    /// Keys handed to the writer and not yet confirmed.
    pending: HashSet<u64>,
    /// `None` once an I/O error turned the tier off.
    writer: Option<Writer>,
    spare: Vec<Vec<u8>>,
    read_buf: Vec<u8>,
    stats: DiskStats,
}

fn io<'a>(path: &'a Path, op: &'static str) -> impl FnOnce(std::io::Error) -> DiskError + 'a {
    move |source| DiskError::Io { path: path.to_path_buf(), op, source }
}

/// The key a block file's name spells (`{key:016x}.kvb`), if it is one.
fn key_of(name: &str) -> Option<u64> {
    let hex = name.strip_suffix(".kvb")?;
    (hex.len() == 16 && hex.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()))
        .then(|| u64::from_str_radix(hex, 16).ok())
        .flatten()
}

/// Creates `dir` if needed and checks that files can be written and deleted there (what a
/// command line checks before loading a model).
pub fn prepare_dir(dir: &Path) -> Result<(), DiskError> {
    std::fs::create_dir_all(dir).map_err(io(dir, "create"))?;
    let probe = dir.join(format!(".loupe-probe-{}", std::process::id()));
    std::fs::write(&probe, b"").map_err(io(&probe, "write to"))?;
    std::fs::remove_file(&probe).map_err(io(&probe, "delete"))
}

impl DiskTier {
    /// Opens (creating it if needed) `config.dir` for a cache of `identity`: checks it is
    /// writable, indexes the block files already there (by modification time: the oldest are
    /// deleted first), deletes temporary files a crash left, and trims to the cap.
    pub fn open(config: &DiskCacheConfig, identity: CacheIdentity) -> Result<DiskTier, DiskError> {
        let dir = config.dir.clone();
        if config.max_bytes < identity.file_bytes() {
            return Err(DiskError::Budget { max: config.max_bytes, file: identity.file_bytes() });
        }
        prepare_dir(&dir)?;
        let mut found = Vec::new();
        for entry in std::fs::read_dir(&dir).map_err(io(&dir, "list"))? {
            let entry = entry.map_err(io(&dir, "list"))?;
            let name = entry.file_name();
            let Some(name) = name.to_str() else { continue };
            if name.ends_with(".kvb.tmp") {
                let _ = std::fs::remove_file(entry.path());
                continue;
            }
            let (Some(key), Ok(meta)) = (key_of(name), entry.metadata()) else { continue };
            if meta.is_file() {
                found.push((meta.modified().ok(), key, meta.len()));
            }
        }
        found.sort();
        let mut tier = DiskTier {
            dir,
            max_bytes: config.max_bytes,
            identity,
            files: HashMap::new(),
            lru: BTreeMap::new(),
            clock: 0,
            bytes: 0,
            pending: HashSet::new(),
            writer: Some(Writer::start(&config.dir)?),
            spare: Vec::new(),
            read_buf: Vec::new(),
            stats: DiskStats { enabled: true, ..DiskStats::default() },
        };
        for (_, key, bytes) in found {
            tier.index(key, bytes);
        }
        tier.trim();
        Ok(tier)
    }

    fn path(&self, key: u64) -> PathBuf {
        self.dir.join(format!("{key:016x}.kvb"))
    }

    pub fn stats(&self) -> DiskStats {
        DiskStats { files: self.files.len(), bytes: self.bytes, ..self.stats }
    }

    pub fn add_spill_time(&mut self, t: std::time::Duration) {
        self.stats.spill_ns += t.as_nanos() as u64;
    }

    pub fn add_restore_time(&mut self, t: std::time::Duration) {
        self.stats.restore_ns += t.as_nanos() as u64;
    }

    fn touch(&mut self, key: u64) {
        if let Some(e) = self.files.get_mut(&key) {
            self.lru.remove(&e.used);
            self.clock += 1;
            e.used = self.clock;
            self.lru.insert(self.clock, key);
        }
    }

    fn index(&mut self, key: u64, bytes: u64) {
        self.clock += 1;
        if let Some(old) = self.files.insert(key, Entry { bytes, used: self.clock }) {
            self.lru.remove(&old.used);
            self.bytes -= old.bytes;
        }
        self.lru.insert(self.clock, key);
        self.bytes += bytes;
    }

    /// Forgets `key`'s file and has the writer delete it.
    fn forget(&mut self, key: u64) {
        if let Some(e) = self.files.remove(&key) {
            self.lru.remove(&e.used);
            self.bytes -= e.bytes;
            let path = self.path(key);
            if let Some(w) = &self.writer {
                w.send(Job::Delete { path });
            }
        }
    }

    /// Deletes the least recently used files until the index fits the cap.
    fn trim(&mut self) {
        while self.bytes > self.max_bytes {
            let Some((_, key)) = self.lru.pop_first() else { break };
            self.forget(key);
            self.stats.evicted_files += 1;
        }
    }

    /// Logs `error` (the first one only: the tier is off afterwards) and stops the tier;
    /// the engine goes on without it.
    fn fail(&mut self, error: &DiskError) {
        if self.writer.take().is_some() {
            eprintln!("loupe: warning: the prefix cache's disk tier is off from now on: {error}");
        }
        self.stats.enabled = false;
        self.files.clear();
        self.lru.clear();
        self.pending.clear();
        self.bytes = 0;
    }

    fn on_done(&mut self, done: Done) {
        match done {
            Done::Written { key, bytes, buf } => {
                self.pending.remove(&key);
                self.stats.written_blocks += 1;
                self.index(key, bytes);
                if self.spare.len() < SPARE_BUFFERS {
                    self.spare.push(buf);
                }
                self.trim();
            }
            Done::Failed { error, .. } => self.fail(&error),
        }
    }

    /// Takes in what the writer finished.
    fn poll(&mut self) {
        while let Some(done) = self.writer.as_ref().and_then(Writer::try_done) {
            self.on_done(done);
        }
    }

    /// Whether a file for `key` is (or is being) written; polls the writer first.
    pub fn contains(&mut self, key: u64) -> bool {
        self.poll();
        self.files.contains_key(&key) || self.pending.contains(&key)
    }

    /// Copies block `block` of `kv`, the block `id` names, into a buffer for the writer,
    /// unless its file exists already (then it only counts as used) or the writer is too far
    /// behind. Called after the block was evicted and before anything overwrites it.
    pub fn spill(&mut self, kv: &PagedKvCache, block: u32, id: &BlockKey<'_>) {
        if self.writer.is_none() || self.pending.contains(&id.key) {
            return;
        }
        self.poll();
        if self.files.contains_key(&id.key) {
            self.touch(id.key);
            return;
        }
        let file = self.identity.file_bytes();
        if (self.pending.len() as u64 + 1).saturating_mul(file) > MAX_PENDING_BYTES.max(file) {
            self.stats.skipped_writes += 1;
            return;
        }
        let mut buf = self.spare.pop().unwrap_or_default();
        format::begin(&mut buf, &self.identity, id);
        if kv.read_block(block, &mut buf).is_err() {
            return;
        }
        let path = self.path(id.key);
        if self.writer.as_ref().is_some_and(|w| w.send(Job::Write { key: id.key, path, buf })) {
            self.pending.insert(id.key);
        }
    }

    /// Reads `want`'s file into block `block` of `kv`; false (nothing trusted, the block's
    /// contents unspecified) if there is none, or it is refused (then it is deleted and
    /// counted), or the disk fails (then the tier turns off). A file still being written is
    /// waited for: its block would otherwise be computed again.
    pub fn restore(&mut self, kv: &mut PagedKvCache, block: u32, want: &BlockKey<'_>) -> bool {
        while self.pending.contains(&want.key) {
            match self.writer.as_ref().and_then(Writer::wait_done) {
                Some(done) => self.on_done(done),
                None => return false,
            }
        }
        if !self.files.contains_key(&want.key) {
            return false;
        }
        match self.read(kv, block, want) {
            Ok(()) => {
                self.touch(want.key);
                self.stats.restored_blocks += 1;
                true
            }
            Err(ReadError::Missing) => {
                // Deleted behind our back: forget it (nothing to delete).
                if let Some(e) = self.files.remove(&want.key) {
                    self.lru.remove(&e.used);
                    self.bytes -= e.bytes;
                }
                false
            }
            Err(ReadError::Invalid(e)) => {
                self.stats.invalid_files += 1;
                if self.stats.invalid_files == 1 {
                    eprintln!(
                        "loupe: warning: prefix cache file {} refused and deleted: {e} (later ones are only counted)",
                        self.path(want.key).display()
                    );
                }
                self.forget(want.key);
                false
            }
            Err(ReadError::Io(e)) => {
                self.fail(&e);
                false
            }
        }
    }

    fn read(&mut self, kv: &mut PagedKvCache, block: u32, want: &BlockKey<'_>) -> Result<(), ReadError> {
        let path = self.path(want.key);
        let mut file = match std::fs::File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(ReadError::Missing),
            Err(e) => return Err(ReadError::Io(io(&path, "open")(e))),
        };
        let len = file.metadata().map_err(|e| ReadError::Io(io(&path, "stat")(e)))?.len();
        let expected = self.identity.file_bytes();
        if len != expected {
            // Not read at all: its length alone says it is not this cache's block.
            return Err(ReadError::Invalid(BlockFileError::Length { len, expected }));
        }
        self.read_buf.resize(expected as usize, 0);
        file.read_exact(&mut self.read_buf).map_err(|e| match e.kind() {
            std::io::ErrorKind::UnexpectedEof => ReadError::Invalid(BlockFileError::Truncated { len, need: expected }),
            _ => ReadError::Io(io(&path, "read")(e)),
        })?;
        let parsed = BlockFile::parse(&self.read_buf).map_err(ReadError::Invalid)?;
        parsed.check(&self.identity, want).map_err(ReadError::Invalid)?;
        kv.write_block(block, parsed.payload).map_err(|_| {
            ReadError::Invalid(BlockFileError::Payload { declared: parsed.payload.len() as u64, computed: expected })
        })?;
        // Best effort: the modification time orders the files by use at the next start.
        let _ = file.set_modified(std::time::SystemTime::now());
        Ok(())
    }

    /// Waits until the writer has written everything handed to it.
    fn flush(&mut self) {
        while !self.pending.is_empty() {
            match self.writer.as_ref().and_then(Writer::wait_done) {
                Some(done) => self.on_done(done),
                None => return,
            }
        }
    }

    /// Deletes every file of the index (the operator's reset of the prefix cache), after
    /// the writes in flight.
    pub fn clear(&mut self) -> usize {
        self.flush();
        let keys: Vec<u64> = self.files.keys().copied().collect();
        for &k in &keys {
            self.forget(k);
        }
        keys.len()
    }
}

enum ReadError {
    Missing,
    Invalid(BlockFileError),
    Io(DiskError),
}
