//! The file of one prefix-cache block on disk, and its parser. The bytes are untrusted (the
//! directory may hold another model's files, a crash's torn write, or anything a user put
//! there): every read is bounds-checked, sizes are capped and computed with checked
//! arithmetic before anything is allocated, and the whole file is covered by a CRC-32.
//!
//! Layout, little-endian, [`HEADER_LEN`] bytes of header, then `block_size` token ids, then
//! the payload ([`loupe_graph::PagedKvCache::read_block`]'s bytes: per layer, keys then
//! values), then the CRC-32 (IEEE, as zlib's `crc32`) of everything before it:
//!
//! | offset | field |
//! |---:|---|
//! | 0 | magic `LOUPEKVB` |
//! | 8 | format version (u32, [`VERSION`]) |
//! | 12 | KV dtype (u8: 0 f16, 1 f32, 2 fp8_e4m3), 3 zero bytes |
//! | 16 | model fingerprint (u64: model path, size, mtime, precision) |
//! | 24 | the prefix cache's hash salt (u64) |
//! | 32 | layers, row width, block size (u32 each) |
//! | 44 | prompt positions of the block (u32) |
//! | 48 | the block's chain hash (u64; also the file name) |
//! | 56 | its parent's chain hash (u64, 0 for a first block) |
//! | 64 | payload bytes (u64) |

use loupe_graph::{KvDtype, PagedKvCache};

/// The first bytes of every block file.
pub const MAGIC: [u8; 8] = *b"LOUPEKVB";
/// Bumped when the layout changes; other versions are refused.
pub const VERSION: u32 = 1;
/// Bytes before the token ids.
pub const HEADER_LEN: usize = 72;
/// Caps on the geometry a header may declare, checked before any size is computed from it
/// (a real model is far below: Llama 3.1 405B has 126 layers and rows of 1,024).
const MAX_LAYERS: u32 = 4096;
const MAX_WIDTH: u32 = 1 << 20;
const MAX_BLOCK_SIZE: u32 = 1 << 16;
/// Largest file the parser accepts (1 GiB; a block of the largest models is a few MiB).
pub const MAX_FILE_BYTES: u64 = 1 << 30;

/// Why a block file was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BlockFileError {
    #[error("truncated: {len} bytes, at least {need} expected")]
    Truncated { len: u64, need: u64 },
    #[error("not a loupe KV block file (bad magic)")]
    Magic,
    #[error("format version {found}, this build reads {VERSION}")]
    Version { found: u32 },
    #[error("reserved header bytes are not zero")]
    Reserved,
    #[error("unknown KV dtype code {0}")]
    Dtype(u8),
    #[error("{field} {value} is over the limit of {max}")]
    TooLarge { field: &'static str, value: u64, max: u64 },
    #[error("the header declares {declared} payload bytes, its geometry {computed}")]
    Payload { declared: u64, computed: u64 },
    #[error("{len} bytes, but the header describes a file of {expected}")]
    Length { len: u64, expected: u64 },
    #[error("checksum mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    Checksum { stored: u32, computed: u32 },
    #[error("written for another cache: {field} is {found}, this engine's is {expected}")]
    Mismatch { field: &'static str, found: u64, expected: u64 },
    #[error("the block's {0} differ from the sequence's (a chain-hash collision)")]
    Contents(&'static str),
}

/// What a block file's values depend on besides its tokens: a file is restored only into a
/// cache whose identity is equal field for field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheIdentity {
    /// Model file path, size and modification time, weight precision.
    pub fingerprint: u64,
    /// The prefix cache's chain-hash salt.
    pub salt: u64,
    pub layers: u32,
    pub width: u32,
    pub block_size: u32,
    pub dtype: KvDtype,
}

impl CacheIdentity {
    /// Payload bytes of one block of this cache.
    pub fn payload_bytes(&self) -> u64 {
        PagedKvCache::bytes_per_block(self.layers as usize, self.width as usize, self.block_size as usize, self.dtype)
            as u64
    }

    /// Bytes of a whole file of this cache.
    pub fn file_bytes(&self) -> u64 {
        HEADER_LEN as u64 + 4 * u64::from(self.block_size) + self.payload_bytes() + 4
    }
}

/// Which block a file holds: the prefix cache's key and what the key was computed from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockKey<'a> {
    pub key: u64,
    pub parent: u64,
    pub prompt_positions: u32,
    pub tokens: &'a [u32],
}

/// A parsed file: its header fields, token ids and payload (borrowed from the bytes).
#[derive(Debug, Clone, PartialEq)]
pub struct BlockFile<'a> {
    pub identity: CacheIdentity,
    pub key: u64,
    pub parent: u64,
    pub prompt_positions: u32,
    pub tokens: Vec<u32>,
    pub payload: &'a [u8],
}

fn dtype_code(d: KvDtype) -> u8 {
    match d {
        KvDtype::F16 => 0,
        KvDtype::F32 => 1,
        KvDtype::Fp8E4M3 => 2,
    }
}

fn dtype_of(code: u8) -> Result<KvDtype, BlockFileError> {
    match code {
        0 => Ok(KvDtype::F16),
        1 => Ok(KvDtype::F32),
        2 => Ok(KvDtype::Fp8E4M3),
        other => Err(BlockFileError::Dtype(other)),
    }
}

/// Starts a file in `out` (cleared): header and token ids. The caller appends the payload
/// ([`loupe_graph::PagedKvCache::read_block`]), then [`finish`] appends the checksum.
pub fn begin(out: &mut Vec<u8>, id: &CacheIdentity, block: &BlockKey<'_>) {
    out.clear();
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&[dtype_code(id.dtype), 0, 0, 0]);
    out.extend_from_slice(&id.fingerprint.to_le_bytes());
    out.extend_from_slice(&id.salt.to_le_bytes());
    for v in [id.layers, id.width, id.block_size, block.prompt_positions] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    for v in [block.key, block.parent, id.payload_bytes()] {
        out.extend_from_slice(&v.to_le_bytes());
    }
    debug_assert_eq!(out.len(), HEADER_LEN);
    for t in block.tokens {
        out.extend_from_slice(&t.to_le_bytes());
    }
}

/// Appends the CRC-32 of everything in `out`.
pub fn finish(out: &mut Vec<u8>) {
    let crc = crc32fast::hash(out);
    out.extend_from_slice(&crc.to_le_bytes());
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut x = [0u8; 8];
    x.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(x)
}

fn capped(field: &'static str, value: u32, max: u32) -> Result<u32, BlockFileError> {
    if value == 0 || value > max {
        return Err(BlockFileError::TooLarge { field, value: value.into(), max: max.into() });
    }
    Ok(value)
}

impl<'a> BlockFile<'a> {
    /// Parses a whole file. Refuses anything short, long, unknown or whose checksum fails;
    /// says nothing yet about whether it fits this engine ([`BlockFile::check`]).
    pub fn parse(bytes: &'a [u8]) -> Result<BlockFile<'a>, BlockFileError> {
        let len = bytes.len() as u64;
        if len > MAX_FILE_BYTES {
            return Err(BlockFileError::TooLarge { field: "file size", value: len, max: MAX_FILE_BYTES });
        }
        if bytes.len() < HEADER_LEN + 4 {
            return Err(BlockFileError::Truncated { len, need: HEADER_LEN as u64 + 4 });
        }
        if bytes[..8] != MAGIC {
            return Err(BlockFileError::Magic);
        }
        let version = u32_at(bytes, 8);
        if version != VERSION {
            return Err(BlockFileError::Version { found: version });
        }
        let dtype = dtype_of(bytes[12])?;
        if bytes[13..16] != [0, 0, 0] {
            return Err(BlockFileError::Reserved);
        }
        let layers = capped("layers", u32_at(bytes, 32), MAX_LAYERS)?;
        let width = capped("width", u32_at(bytes, 36), MAX_WIDTH)?;
        let block_size = capped("block size", u32_at(bytes, 40), MAX_BLOCK_SIZE)?;
        let prompt_positions = u32_at(bytes, 44);
        if prompt_positions > block_size {
            return Err(BlockFileError::TooLarge {
                field: "prompt positions",
                value: prompt_positions.into(),
                max: block_size.into(),
            });
        }
        let identity =
            CacheIdentity { fingerprint: u64_at(bytes, 16), salt: u64_at(bytes, 24), layers, width, block_size, dtype };
        // The geometry's payload, in u64 with checks (layers x 2 x block x row bytes).
        let row = dtype.row_bytes(width as usize) as u64;
        let computed = u64::from(layers)
            .checked_mul(2)
            .and_then(|x| x.checked_mul(u64::from(block_size)))
            .and_then(|x| x.checked_mul(row))
            .filter(|&x| x <= MAX_FILE_BYTES)
            .ok_or(BlockFileError::TooLarge { field: "payload", value: u64::MAX, max: MAX_FILE_BYTES })?;
        let declared = u64_at(bytes, 64);
        if declared != computed {
            return Err(BlockFileError::Payload { declared, computed });
        }
        // All terms are capped above, so this sum cannot overflow a u64.
        let expected = HEADER_LEN as u64 + 4 * u64::from(block_size) + computed + 4;
        if len != expected {
            return Err(BlockFileError::Length { len, expected });
        }
        let body = bytes.len() - 4;
        let stored = u32_at(bytes, body);
        let computed_crc = crc32fast::hash(&bytes[..body]);
        if stored != computed_crc {
            return Err(BlockFileError::Checksum { stored, computed: computed_crc });
        }
        let tokens_end = HEADER_LEN + 4 * block_size as usize;
        let tokens = bytes[HEADER_LEN..tokens_end].chunks_exact(4).map(|c| u32_at(c, 0)).collect();
        Ok(BlockFile {
            identity,
            key: u64_at(bytes, 48),
            parent: u64_at(bytes, 56),
            prompt_positions,
            tokens,
            payload: &bytes[tokens_end..body],
        })
    }

    /// Whether this file holds `want` of a cache of identity `id`: every identity field, the
    /// key, the parent key, the prompt positions and the tokens must be equal.
    pub fn check(&self, id: &CacheIdentity, want: &BlockKey<'_>) -> Result<(), BlockFileError> {
        let dtype = |d: KvDtype| u64::from(dtype_code(d));
        for (field, found, expected) in [
            ("model fingerprint", self.identity.fingerprint, id.fingerprint),
            ("hash salt", self.identity.salt, id.salt),
            ("layers", self.identity.layers.into(), id.layers.into()),
            ("width", self.identity.width.into(), id.width.into()),
            ("block size", self.identity.block_size.into(), id.block_size.into()),
            ("KV dtype", dtype(self.identity.dtype), dtype(id.dtype)),
        ] {
            if found != expected {
                return Err(BlockFileError::Mismatch { field, found, expected });
            }
        }
        if self.key != want.key {
            return Err(BlockFileError::Contents("chain key"));
        }
        if self.parent != want.parent {
            return Err(BlockFileError::Contents("parent key"));
        }
        if self.prompt_positions != want.prompt_positions {
            return Err(BlockFileError::Contents("prompt positions"));
        }
        if self.tokens != want.tokens {
            return Err(BlockFileError::Contents("token ids"));
        }
        Ok(())
    }
}

/// The body of the `kv_block_parse` fuzz target (`fuzz/`) and of its seeded smoke test: any
/// bytes through the parser, which must answer, never panic; an accepted file passes its own
/// check and writes back to the same bytes.
pub fn fuzz_block_file(data: &[u8]) {
    let Ok(file) = BlockFile::parse(data) else { return };
    let key =
        BlockKey { key: file.key, parent: file.parent, prompt_positions: file.prompt_positions, tokens: &file.tokens };
    assert_eq!(file.check(&file.identity, &key), Ok(()));
    let mut out = Vec::new();
    begin(&mut out, &file.identity, &key);
    out.extend_from_slice(file.payload);
    finish(&mut out);
    assert_eq!(out, data, "an accepted file writes back to its own bytes");
}
