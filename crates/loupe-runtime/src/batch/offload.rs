//! Where the batched engine meets its disk tier ([`super::disk`]): evicted blocks are
//! handed to it before anything overwrites them, and a new sequence's cached prefix may
//! continue on disk after (or between) the blocks memory still holds.

use std::hash::{DefaultHasher, Hash, Hasher};
use std::time::Instant;

use loupe_graph::KvDtype;

use super::disk::{BlockKey, CacheIdentity, DiskTier};
use super::{BatchConfig, BatchEngine, Sequence};
use crate::{Engine, RuntimeError};

/// What a block's values depend on besides its tokens, for a file that outlives the
/// process: the model file (path, size, modification time) and the lowered graph as
/// `loupe ir` prints it (layers kept, weight types, each node's kernel and the ISA whose
/// arithmetic it runs, planted faults).
fn model_fingerprint(engine: &Engine) -> u64 {
    let mut h = DefaultHasher::new();
    engine.path().hash(&mut h);
    if let Ok(meta) = std::fs::metadata(engine.path()) {
        meta.len().hash(&mut h);
        meta.modified().ok().and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok()).hash(&mut h);
    }
    format!("{:?}", engine.precision()).hash(&mut h);
    loupe_graph::print::to_text(engine.graph()).hash(&mut h);
    h.finish()
}

/// The disk tier `config` asks for, opened, or `None`.
pub(super) fn open_disk(
    engine: &Engine,
    config: &BatchConfig,
    salt: u64,
    dtype: KvDtype,
) -> Result<Option<DiskTier>, RuntimeError> {
    let Some(disk) = &config.prefix_cache_disk else { return Ok(None) };
    if !config.prefix_cache {
        return Err(RuntimeError::InvalidRequest("the prefix cache's disk tier needs the prefix cache on".into()));
    }
    let graph = engine.graph();
    let too_big = |what: &str| RuntimeError::InvalidRequest(format!("the prefix cache's disk tier: {what} too large"));
    let identity = CacheIdentity {
        fingerprint: model_fingerprint(engine),
        salt,
        layers: u32::try_from(graph.kv_layers).map_err(|_| too_big("layers"))?,
        width: u32::try_from(graph.kv_width).map_err(|_| too_big("KV width"))?,
        block_size: u32::try_from(config.block_size).map_err(|_| too_big("block size"))?,
        dtype,
    };
    Ok(Some(DiskTier::open(disk, identity)?))
}

impl BatchEngine<'_> {
    /// Hands the blocks evicted since the last call to the disk tier (a copy of each).
    /// Called after anything that allocates and before anything writes the cache.
    pub(super) fn spill_evicted(&mut self) {
        let Some(disk) = self.disk.as_mut() else { return };
        let start = Instant::now();
        for e in self.blocks.take_evicted() {
            let id = BlockKey {
                key: e.key,
                parent: e.parent,
                prompt_positions: e.prompt_positions as u32,
                tokens: &e.tokens,
            };
            disk.spill(&self.kv, e.block, &id);
        }
        disk.add_spill_time(start.elapsed());
    }

    /// Claims the longest cached prefix of `seq`'s tokens, at most `max_blocks` full blocks:
    /// from memory, then, where memory has a gap, from disk into fresh blocks (registered
    /// as cached again), continuing in memory after it. Sets `seq`'s blocks, keys and
    /// computed positions.
    pub(super) fn claim_cached_prefix(&mut self, seq: &mut Sequence, max_blocks: usize) {
        let bs = self.config.block_size;
        let (mut blocks, mut keys) = self.blocks.claim_prefix(&seq.tokens, seq.prompt_len, max_blocks);
        let full = max_blocks.min(seq.tokens.len() / bs);
        if self.disk.is_some() && blocks.len() < full {
            // The keys of the rest, chained from the last block memory gave.
            let mut chain = Vec::with_capacity(full - blocks.len());
            let mut parent = keys.last().copied().unwrap_or(0);
            for i in blocks.len()..full {
                let prompt = self.blocks.prompt_positions(i, seq.prompt_len);
                let key = self.blocks.chain_hash(parent, &seq.tokens[i * bs..(i + 1) * bs], prompt);
                chain.push((key, parent, prompt));
                parent = key;
            }
            if self.disk.as_mut().is_some_and(|d| d.contains(chain[0].0)) {
                // Pin what memory holds of the rest first, so restoring the gaps cannot
                // evict it; then take blocks in order until one is in neither place.
                let first = blocks.len();
                let pinned: Vec<Option<u32>> = (first..full)
                    .zip(&chain)
                    .map(|(i, &(key, parent, prompt))| {
                        self.blocks.claim(key, parent, &seq.tokens[i * bs..(i + 1) * bs], prompt)
                    })
                    .collect();
                let mut whole = true;
                for ((i, &(key, parent, prompt)), pin) in (first..full).zip(&chain).zip(pinned) {
                    if !whole {
                        if let Some(b) = pin {
                            self.blocks.release(b);
                        }
                        continue;
                    }
                    let got =
                        pin.or_else(|| self.restore_block(key, parent, &seq.tokens[i * bs..(i + 1) * bs], prompt));
                    match got {
                        Some(b) => {
                            blocks.push(b);
                            keys.push(key);
                        }
                        None => whole = false,
                    }
                }
            }
        }
        seq.computed = blocks.len() * bs;
        seq.blocks = blocks;
        seq.keys = keys;
    }

    /// A fresh block holding the disk tier's file for `key`, registered in the prefix
    /// cache; `None` if there is no such file, no block to put it in, or it was refused.
    fn restore_block(&mut self, key: u64, parent: u64, tokens: &[u32], prompt_positions: usize) -> Option<u32> {
        if !self.disk.as_mut()?.contains(key) || self.blocks.available() == 0 {
            return None;
        }
        let block = self.blocks.allocate()?;
        // The allocation may have evicted a cached block: it is copied out before this one
        // is overwritten.
        self.spill_evicted();
        let start = Instant::now();
        let want = BlockKey { key, parent, prompt_positions: prompt_positions as u32, tokens };
        let disk = self.disk.as_mut()?;
        let restored = disk.restore(&mut self.kv, block, &want);
        disk.add_restore_time(start.elapsed());
        if restored {
            self.blocks.register(block, parent, tokens, prompt_positions);
            Some(block)
        } else {
            self.blocks.release(block);
            None
        }
    }
}
