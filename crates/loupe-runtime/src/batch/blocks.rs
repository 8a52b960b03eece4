//! The block manager: which KV blocks are free, which sequences hold which, and the prefix
//! cache over full blocks.
//!
//! A block is *in use* while a sequence holds it (reference count > 0; a prefix block can
//! be held by many sequences at once), *cached* when no sequence holds it but its contents
//! are still registered under their hash (evictable, least recently released first), and
//! *free* otherwise. A block id is the same block in every layer's cache (and in every cache
//! of a model with several), so allocation, sharing and eviction act on all of them together.
//!
//! Prefix-cache keys form a hash chain: a full block's key hashes its parent block's key,
//! its token ids, how many of its positions are prompt tokens of the sequence that computed
//! it (prompt rows and generated rows run different arithmetic, see `BatchSpan::prompt_rows`),
//! and a salt naming everything else that changes the stored values (model file, weight
//! precision, KV dtype, block size). Two sequences whose first `n` blocks have the same
//! tokens, in the prompt alike, share those blocks; a block holding a sequence's generated
//! tokens serves that sequence's recomputation after preemption, not another request whose
//! prompt repeats them. Lookups compare the stored tokens, prompt positions and parent key
//! too, so a 64-bit collision cannot hand a sequence someone else's keys.

use std::collections::{BTreeMap, HashMap};
use std::hash::{DefaultHasher, Hash, Hasher};

/// Prefix-cache counters, in blocks.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PrefixStats {
    /// Full prompt blocks found in the cache (each skipped `block_size` tokens of work).
    pub hit_blocks: u64,
    /// Full prompt blocks looked up and not found.
    pub miss_blocks: u64,
    /// Cached blocks evicted to make room.
    pub evictions: u64,
}

#[derive(Debug)]
struct CachedBlock {
    block: u32,
    parent: u64,
    tokens: Box<[u32]>,
    prompt_positions: usize,
}

/// A cached block [`BlockManager::allocate`] took back, as the disk tier needs it: its
/// contents are still in the KV cache until its new owner writes there.
#[derive(Debug)]
pub struct Evicted {
    pub block: u32,
    pub key: u64,
    pub parent: u64,
    pub tokens: Box<[u32]>,
    pub prompt_positions: usize,
}

/// Allocation, reference counts and the prefix cache of `n_blocks` blocks.
#[derive(Debug)]
pub struct BlockManager {
    block_size: usize,
    refcount: Vec<u32>,
    /// Blocks holding nothing reusable.
    free: Vec<u32>,
    /// Prefix cache: chain hash -> block.
    cached: HashMap<u64, CachedBlock>,
    /// The hash each block is registered under, if any.
    hash_of: Vec<Option<u64>>,
    /// Cached blocks no sequence holds, by release time (oldest evicted first).
    lru: BTreeMap<u64, u32>,
    released_at: Vec<u64>,
    clock: u64,
    salt: u64,
    prefix_cache: bool,
    stats: PrefixStats,
    /// Evictions since the last [`BlockManager::take_evicted`], kept only when asked
    /// ([`BlockManager::keep_evicted`]; the disk tier).
    evicted: Vec<Evicted>,
    keep_evicted: bool,
}

impl BlockManager {
    /// `salt` names what else the cached values depend on (see the module docs).
    pub fn new(n_blocks: usize, block_size: usize, salt: u64, prefix_cache: bool) -> BlockManager {
        BlockManager {
            block_size,
            refcount: vec![0; n_blocks],
            // Popped from the end: block 0 first.
            free: (0..n_blocks as u32).rev().collect(),
            cached: HashMap::new(),
            hash_of: vec![None; n_blocks],
            lru: BTreeMap::new(),
            released_at: vec![0; n_blocks],
            clock: 0,
            salt,
            prefix_cache,
            stats: PrefixStats::default(),
            evicted: Vec::new(),
            keep_evicted: false,
        }
    }

    /// Keeps what each eviction took, for [`BlockManager::take_evicted`].
    pub fn keep_evicted(&mut self) {
        self.keep_evicted = true;
    }

    /// The blocks evicted since the last call, oldest first.
    pub fn take_evicted(&mut self) -> Vec<Evicted> {
        std::mem::take(&mut self.evicted)
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    pub fn total(&self) -> usize {
        self.refcount.len()
    }

    /// Blocks that can be handed out now (free, or cached and evictable).
    pub fn available(&self) -> usize {
        self.free.len() + self.lru.len()
    }

    /// Blocks some sequence holds.
    pub fn in_use(&self) -> usize {
        self.total() - self.available()
    }

    /// Blocks registered in the prefix cache (held or not).
    pub fn cached(&self) -> usize {
        self.cached.len()
    }

    pub fn stats(&self) -> PrefixStats {
        self.stats
    }

    /// Blocks needed to hold `positions` positions.
    pub fn blocks_for(&self, positions: usize) -> usize {
        positions.div_ceil(self.block_size)
    }

    /// The key of a full block of `tokens` after the block keyed `parent` (0 for the first),
    /// whose first `prompt_positions` positions are prompt tokens.
    pub fn chain_hash(&self, parent: u64, tokens: &[u32], prompt_positions: usize) -> u64 {
        let mut h = DefaultHasher::new();
        self.salt.hash(&mut h);
        parent.hash(&mut h);
        tokens.hash(&mut h);
        prompt_positions.hash(&mut h);
        h.finish()
    }

    /// How many positions of block `i` of a sequence are in its prompt of `prompt_len`.
    pub fn prompt_positions(&self, i: usize, prompt_len: usize) -> usize {
        prompt_len.saturating_sub(i * self.block_size).min(self.block_size)
    }

    /// A block for one sequence: a free one, else the least recently released cached one
    /// (dropping its cache entry). `None` when every block is in use.
    pub fn allocate(&mut self) -> Option<u32> {
        let block = match self.free.pop() {
            Some(b) => b,
            None => {
                let (_, b) = self.lru.pop_first()?;
                if let Some(h) = self.hash_of[b as usize].take() {
                    if let Some(c) = self.cached.remove(&h) {
                        if self.keep_evicted {
                            let CachedBlock { block, parent, tokens, prompt_positions } = c;
                            self.evicted.push(Evicted { block, key: h, parent, tokens, prompt_positions });
                        }
                    }
                }
                self.stats.evictions += 1;
                b
            }
        };
        self.refcount[block as usize] = 1;
        Some(block)
    }

    /// Drops one sequence's hold on `block`; a block nobody holds becomes cached (if it is
    /// registered) or free.
    pub fn release(&mut self, block: u32) {
        let b = block as usize;
        debug_assert!(self.refcount[b] > 0, "block {block} released more often than held");
        self.refcount[b] = self.refcount[b].saturating_sub(1);
        if self.refcount[b] == 0 {
            if self.hash_of[b].is_some() {
                self.clock += 1;
                self.released_at[b] = self.clock;
                self.lru.insert(self.clock, block);
            } else {
                self.free.push(block);
            }
        }
    }

    /// Counts a lookup's outcome (by the caller, once the claimed blocks are kept: a
    /// sequence that must wait gives them back and looks again later).
    pub fn record_lookup(&mut self, hit_blocks: usize, miss_blocks: usize) {
        self.stats.hit_blocks += hit_blocks as u64;
        self.stats.miss_blocks += miss_blocks as u64;
    }

    /// Claims the cached blocks of the longest cached prefix of `tokens` (of which the first
    /// `prompt_len` are the prompt), at most `max_blocks` full blocks; returns them with their
    /// chain keys. Counters are left to [`BlockManager::record_lookup`].
    pub fn claim_prefix(&mut self, tokens: &[u32], prompt_len: usize, max_blocks: usize) -> (Vec<u32>, Vec<u64>) {
        let (mut blocks, mut keys) = (Vec::new(), Vec::new());
        if !self.prefix_cache {
            return (blocks, keys);
        }
        let full = (tokens.len() / self.block_size).min(max_blocks);
        let mut parent = 0u64;
        for i in 0..full {
            let chunk = &tokens[i * self.block_size..(i + 1) * self.block_size];
            let prompt_positions = self.prompt_positions(i, prompt_len);
            let key = self.chain_hash(parent, chunk, prompt_positions);
            let Some(block) = self.claim(key, parent, chunk, prompt_positions) else { break };
            blocks.push(block);
            keys.push(key);
            parent = key;
        }
        (blocks, keys)
    }

    /// Claims the cached block registered under `key`, if it holds `tokens` after `parent`
    /// with `prompt_positions` prompt positions. Counters are left to the caller.
    pub fn claim(&mut self, key: u64, parent: u64, tokens: &[u32], prompt_positions: usize) -> Option<u32> {
        if !self.prefix_cache {
            return None;
        }
        let block = match self.cached.get(&key) {
            Some(c) if c.parent == parent && *c.tokens == *tokens && c.prompt_positions == prompt_positions => c.block,
            _ => return None,
        };
        let b = block as usize;
        if self.refcount[b] == 0 {
            self.lru.remove(&self.released_at[b]);
        }
        self.refcount[b] += 1;
        Some(block)
    }

    /// Empties the prefix cache of the blocks no sequence holds (they become free; blocks in
    /// use keep their registration, so running sequences and their sharers are unaffected);
    /// returns how many were dropped. What `POST /reset_prefix_cache` does, so an outside
    /// benchmark measures a cold cache.
    pub fn reset_prefix_cache(&mut self) -> usize {
        let dropped = std::mem::take(&mut self.lru);
        for &b in dropped.values() {
            if let Some(h) = self.hash_of[b as usize].take() {
                self.cached.remove(&h);
            }
            self.free.push(b);
        }
        dropped.len()
    }

    /// Registers a full, held block of `tokens` after the block keyed `parent`, whose first
    /// `prompt_positions` positions are prompt tokens; returns its key (for chaining the next
    /// block). A key already cached keeps its first block.
    pub fn register(&mut self, block: u32, parent: u64, tokens: &[u32], prompt_positions: usize) -> u64 {
        let key = self.chain_hash(parent, tokens, prompt_positions);
        if self.prefix_cache && self.hash_of[block as usize].is_none() && !self.cached.contains_key(&key) {
            self.cached.insert(key, CachedBlock { block, parent, tokens: tokens.into(), prompt_positions });
            self.hash_of[block as usize] = Some(key);
        }
        key
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocate_release_round_trip() {
        let mut m = BlockManager::new(3, 4, 0, true);
        let a = m.allocate().unwrap();
        let b = m.allocate().unwrap();
        let c = m.allocate().unwrap();
        assert_eq!(m.allocate(), None);
        assert_eq!(m.in_use(), 3);
        for x in [a, b, c] {
            m.release(x);
        }
        assert_eq!((m.in_use(), m.available()), (0, 3));
    }

    #[test]
    fn prefix_blocks_are_shared_then_cached_then_evicted_oldest_first() {
        let mut m = BlockManager::new(4, 2, 7, true);
        let prompt = [1, 2, 3, 4, 5];
        let (b0, b1) = (m.allocate().unwrap(), m.allocate().unwrap());
        let k0 = m.register(b0, 0, &prompt[0..2], 2);
        m.register(b1, k0, &prompt[2..4], 2);
        // A second sequence with the same first 4 tokens shares both blocks.
        let (blocks, _) = m.claim_prefix(&[1, 2, 3, 4, 9], 5, 2);
        assert_eq!(blocks, vec![b0, b1]);
        // A different second block: only the first is shared.
        let (blocks, _) = m.claim_prefix(&[1, 2, 8, 8], 4, 2);
        assert_eq!(blocks, vec![b0]);
        for b in [b0, b1, b0, b1, b0] {
            m.release(b);
        }
        assert_eq!(m.in_use(), 0);
        assert_eq!(m.cached(), 2);
        // Free blocks go first, then the cached ones, least recently released first.
        let _ = (m.allocate(), m.allocate());
        assert_eq!(m.allocate(), Some(b1));
        assert_eq!(m.cached(), 1);
        assert_eq!(m.stats().evictions, 1);
        // b1 is gone: a lookup finds b0 only.
        assert_eq!(m.claim_prefix(&prompt, prompt.len(), 2).0, vec![b0]);
    }

    #[test]
    fn salt_separates_caches_and_disabled_cache_never_hits() {
        let mut m = BlockManager::new(2, 2, 1, true);
        let other = BlockManager::new(2, 2, 2, true);
        assert_ne!(m.chain_hash(0, &[1, 2], 2), other.chain_hash(0, &[1, 2], 2));
        let b = m.allocate().unwrap();
        m.register(b, 0, &[1, 2], 2);
        let mut off = BlockManager::new(2, 2, 1, false);
        let b = off.allocate().unwrap();
        off.register(b, 0, &[1, 2], 2);
        assert!(off.claim_prefix(&[1, 2, 3], 3, 1).0.is_empty());
        assert_eq!(off.cached(), 0);
    }

    #[test]
    fn reset_drops_unheld_cached_blocks_only() {
        let mut m = BlockManager::new(4, 2, 7, true);
        let (a, b) = (m.allocate().unwrap(), m.allocate().unwrap());
        let ka = m.register(a, 0, &[1, 2], 2);
        m.register(b, ka, &[3, 4], 2);
        m.release(b); // b: cached, unheld; a: held
        assert_eq!((m.cached(), m.available()), (2, 3));
        assert_eq!(m.reset_prefix_cache(), 1);
        assert_eq!((m.cached(), m.available()), (1, 3), "a stays registered while held");
        let (claimed, _) = m.claim_prefix(&[1, 2, 3, 4], 4, 2);
        assert_eq!(claimed, vec![a], "b's entry is gone, a's is still found");
        m.release(a);
        m.release(a);
        assert_eq!(m.reset_prefix_cache(), 1);
        assert_eq!((m.cached(), m.available()), (0, 4));
        assert!(m.claim_prefix(&[1, 2], 2, 1).0.is_empty());
    }

    #[test]
    fn a_block_of_generated_tokens_does_not_serve_a_prompt_that_repeats_them() {
        let mut m = BlockManager::new(4, 2, 0, true);
        // A sequence with a 3-token prompt generated token 4: block 1 holds one prompt
        // position and one generated one.
        let (a, b) = (m.allocate().unwrap(), m.allocate().unwrap());
        let ka = m.register(a, 0, &[1, 2], m.prompt_positions(0, 3));
        m.register(b, ka, &[3, 4], m.prompt_positions(1, 3));
        m.release(a);
        m.release(b);
        // A new request whose prompt is 1 2 3 4 5 reuses the all-prompt block only.
        assert_eq!(m.claim_prefix(&[1, 2, 3, 4, 5], 5, 2).0, vec![a]);
        // The same sequence recomputed after preemption (prompt 3 long) gets both.
        assert_eq!(m.claim_prefix(&[1, 2, 3, 4, 5], 3, 2).0, vec![a, b]);
    }
}
