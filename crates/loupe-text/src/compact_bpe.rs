//! [`CompactBpe`]: `tokenizers`' BPE model, the same ids from a fraction of its memory and
//! build time, for the GGUF vocabularies whose tokenizer transformers builds as a BPE.
//!
//! `tokenizers`' BPE holds a vocabulary map and its reverse (owned strings), a pair map and,
//! while building, the merges as string pairs. For Gemma 3's 262,144 tokens transformers
//! derives 514,847 merges from the scores (`generate_merges`, below): building them took ~115
//! MB of heap and most of Gemma 3's load time. This model keeps the vocabulary once (one byte
//! arena and an open-addressing index of ids) and finds a pair's rank when the merge loop asks:
//! - **scored** (SentencePiece files without merges: Gemma, Llama 2): the pair `(l, r)` is a
//!   merge exactly when `l + r` is a token (both halves are tokens, being symbols), and its
//!   place in the derived list is given by that token's score, the halves' lengths and the
//!   token's first position; nothing is stored beyond the scores.
//! - **listed** (files with `tokenizer.ggml.merges`: GPT-2-style byte-level vocabularies such
//!   as SmolLM2's and Qwen's): an open-addressing table from a pair of ids to its rank and the
//!   merged id, 16 bytes a slot.
//!
//! The merge loop, byte fallback, unknown-token fusion and token offsets follow `tokenizers`'
//! `BPE::merge_word` and `Word::merge_all` (0.22) step for step, so the ids are the same; the
//! tests compare the two on random vocabularies and, with the real models, on Gemma 3's,
//! SmolLM2's and Qwen's.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::sync::Arc;

use tokenizers::models::bpe::{Vocab, BPE};

use crate::error::{Result, TextError};
use crate::spec::invalid;

/// A token id with no entry (an empty slot, a missing byte token).
const NONE: u32 = u32::MAX;

/// The vocabulary as `tokenizers`' BPE sees it: a Python-dict view (a later duplicate spelling
/// takes the id), plus each spelling's first id (the derived ranks need it).
#[derive(Debug)]
struct Vocabulary {
    /// Every id's spelling, concatenated; `ends[id]` is where id's spelling ends.
    text: Box<str>,
    ends: Box<[u32]>,
    /// Open addressing, linear probing, a power of two long: the id of each distinct spelling
    /// (the last id spelled so), or [`NONE`].
    slots: Box<[u32]>,
    /// The first id spelled as this (last) id is: Python's dict keeps a key's first position.
    first: Box<[u32]>,
    /// The ids of `<0x00>` .. `<0xFF>`, or [`NONE`].
    byte_ids: Box<[u32; 256]>,
    distinct: usize,
    hasher: ahash::RandomState,
}

/// Where a pair's rank comes from.
#[derive(Debug)]
enum Ranks {
    /// Derived from the merged token's score (one per id: the file's, or the position).
    Scored(Box<[f32]>),
    /// The file's merges: `[left, right, rank, merged]` per slot, open addressing on the pair,
    /// `left == NONE` for an empty slot.
    Listed(Box<[[u32; 4]]>),
}

/// `tokenizers`' BPE over a vocabulary held once, merges looked up (module docs).
#[derive(Clone, Debug)]
pub struct CompactBpe {
    vocab: Arc<Vocabulary>,
    ranks: Arc<Ranks>,
    unk: Option<String>,
}

/// A pair's place in the merge list, smaller first. Listed: `(rank, 0, 0, 0)`. Scored: the
/// token's score (higher first), the left then the right half's length in code points (longer
/// first), the token's first position; within one token the left length tells its splits
/// apart, so this is a total order equal to the stable sort in `generate_merges`.
type Rank = (u32, u32, u32, u32);

/// An `f32` as a `u32` whose ascending order is `f32::total_cmp`'s, inverted so that a higher
/// score comes first.
fn score_key(score: f32) -> u32 {
    let bits = score.to_bits();
    let ascending = if bits & 0x8000_0000 != 0 { !bits } else { bits | 0x8000_0000 };
    !ascending
}

/// `tokenizers`' `UnkTokenOutOfVocabulary`, raised when an unknown character needs it.
fn unknown_missing(unk: &str) -> TextError {
    TextError::Encode { preview: String::new(), message: format!("the unknown token {unk:?} is not in the vocabulary") }
}

fn chars(s: &str) -> u32 {
    // Token spellings are far below 2^32 code points (the builder caps the arena at u32).
    s.chars().count() as u32
}

/// The slot of a pair in a table of `mask + 1` slots (Fibonacci hashing of the two ids).
fn pair_slot(left: u32, right: u32, mask: usize) -> usize {
    let key = (u64::from(left) << 32) | u64::from(right);
    (key.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 32) as usize & mask
}

impl Vocabulary {
    fn build<T: AsRef<str>>(tokens: &[T]) -> Result<Self> {
        let n = tokens.len();
        let total: usize = tokens.iter().map(|t| t.as_ref().len()).sum();
        if u32::try_from(total).is_err() || n >= (1usize << 31) {
            return Err(invalid(
                "tokenizer.ggml.tokens",
                format!("{n} tokens of {total} bytes exceed the tokenizer's limits (4 GiB, 2^31 tokens)"),
            ));
        }
        let mut text = String::with_capacity(total);
        let mut ends = Vec::with_capacity(n);
        for token in tokens {
            text.push_str(token.as_ref());
            ends.push(text.len() as u32);
        }
        let capacity = (n.max(1) * 2).next_power_of_two();
        let mut vocab = Self {
            text: text.into_boxed_str(),
            ends: ends.into_boxed_slice(),
            slots: vec![NONE; capacity].into_boxed_slice(),
            first: (0..n as u32).collect(),
            byte_ids: Box::new([NONE; 256]),
            distinct: 0,
            // Fixed seeds: the layout, not the ids, depends on them; fixed keeps runs alike.
            hasher: ahash::RandomState::with_seeds(0x6c6f_7570, 0x655f_7370, 0x6d5f_6270, 0x655f_7631),
        };
        for id in 0..n as u32 {
            let slot = vocab.slot_of(vocab.spelling(id));
            match vocab.slots[slot] {
                NONE => {
                    vocab.slots[slot] = id;
                    vocab.distinct += 1;
                }
                earlier => {
                    vocab.first[id as usize] = vocab.first[earlier as usize];
                    vocab.slots[slot] = id;
                }
            }
        }
        for byte in 0..=255u8 {
            vocab.byte_ids[byte as usize] = vocab.id(&format!("<0x{byte:02X}>")).unwrap_or(NONE);
        }
        Ok(vocab)
    }

    fn spelling(&self, id: u32) -> &str {
        let end = self.ends[id as usize] as usize;
        let start = if id == 0 { 0 } else { self.ends[id as usize - 1] as usize };
        &self.text[start..end]
    }

    /// The slot holding `s`, or the empty slot where it would go.
    fn slot_of(&self, s: &str) -> usize {
        let mask = self.slots.len() - 1;
        let mut slot = self.hasher.hash_one(s) as usize & mask;
        loop {
            match self.slots[slot] {
                NONE => return slot,
                id if self.spelling(id) == s => return slot,
                _ => slot = (slot + 1) & mask,
            }
        }
    }

    fn id(&self, s: &str) -> Option<u32> {
        Some(self.slots[self.slot_of(s)]).filter(|&id| id != NONE)
    }
}

impl Ranks {
    /// `BpeBuilder::build`'s merge map from `tokenizer.ggml.merges` ("left right" each): a
    /// merge whose halves or result are not tokens is an error, and a repeated pair takes its
    /// later rank, as the map's insertion order gives.
    fn listed(vocab: &Vocabulary, merges: &[String]) -> Result<Self> {
        let capacity = (merges.len().max(1) * 2).next_power_of_two();
        let mut table = vec![[NONE; 4]; capacity].into_boxed_slice();
        let mask = capacity - 1;
        let mut joined = String::new();
        for (rank, merge) in merges.iter().enumerate() {
            let (l, r) = split_merge(rank, merge)?;
            let bad = |what: &str| invalid("tokenizer.ggml.merges", format!("merge {rank} ({merge:?}) {what}"));
            joined.clear();
            joined.push_str(l);
            joined.push_str(r);
            let (Some(left), Some(right)) = (vocab.id(l), vocab.id(r)) else {
                return Err(bad("names a token that is not in the vocabulary"));
            };
            let merged = vocab.id(&joined).ok_or_else(|| bad("makes a token that is not in the vocabulary"))?;
            let rank = u32::try_from(rank).map_err(|_| bad("is past 2^32 merges"))?;
            let mut slot = pair_slot(left, right, mask);
            while table[slot][0] != NONE && (table[slot][0], table[slot][1]) != (left, right) {
                slot = (slot + 1) & mask;
            }
            table[slot] = [left, right, rank, merged];
        }
        Ok(Self::Listed(table))
    }

    /// The merge of symbols `left` and `right`: its rank and the merged token's id.
    fn merge(&self, vocab: &Vocabulary, left: u32, right: u32, joined: &mut String) -> Option<(Rank, u32)> {
        match self {
            Self::Scored(scores) => {
                let (l, r) = (vocab.spelling(left), vocab.spelling(right));
                joined.clear();
                joined.push_str(l);
                joined.push_str(r);
                let piece = vocab.id(joined)? as usize;
                Some(((score_key(scores[piece]), !chars(l), !chars(r), vocab.first[piece]), piece as u32))
            }
            Self::Listed(table) => {
                let mask = table.len() - 1;
                let mut slot = pair_slot(left, right, mask);
                loop {
                    match table[slot] {
                        [NONE, ..] => return None,
                        [l, r, rank, merged] if (l, r) == (left, right) => return Some(((rank, 0, 0, 0), merged)),
                        _ => slot = (slot + 1) & mask,
                    }
                }
            }
        }
    }
}

/// One symbol of the word being merged (`tokenizers`' `Symbol`): `len` bytes of the word, 0
/// once merged into its left neighbour.
#[derive(Clone, Copy)]
struct Symbol {
    id: u32,
    prev: isize,
    next: isize,
    len: usize,
}

impl CompactBpe {
    /// SentencePiece BPE whose merges transformers derives from `scores` (one per token):
    /// `generate_merges(tokens, scores)`, byte fallback, `unk` as the unknown token (fused) when
    /// the tokenizer class names one.
    pub fn scored<T: AsRef<str>>(tokens: &[T], scores: &[f32], unk: Option<&str>) -> Result<Self> {
        let n = tokens.len();
        if scores.len() != n {
            return Err(invalid("tokenizer.ggml.scores", format!("{} scores for {n} tokens", scores.len())));
        }
        Ok(Self {
            vocab: Arc::new(Vocabulary::build(tokens)?),
            ranks: Arc::new(Ranks::Scored(scores.into())),
            unk: unk.map(str::to_owned),
        })
    }

    /// BPE with the file's merges ("left right" each, best first), no byte fallback and no
    /// unknown token (characters outside the vocabulary are dropped): `tokenizers`' BPE as
    /// transformers builds it for a byte-level GGUF vocabulary (`tokens` respelled in the
    /// byte alphabet).
    pub fn listed<T: AsRef<str>>(tokens: &[T], merges: &[String]) -> Result<Self> {
        let vocab = Vocabulary::build(tokens)?;
        let ranks = Ranks::listed(&vocab, merges)?;
        Ok(Self { vocab: Arc::new(vocab), ranks: Arc::new(ranks), unk: None })
    }

    /// The configuration as `tokenizers`' BPE builder takes it: every id's spelling (ids that
    /// a later duplicate shadows included) and the merges, listed (derived from the scores for
    /// a scored model, which builds the whole list: for saving, not for encoding).
    pub fn to_hf(&self) -> tokenizers::Result<BPE> {
        let v = &self.vocab;
        let tokens: Vec<String> = (0..v.ends.len() as u32).map(|id| v.spelling(id).to_owned()).collect();
        let merges = match &*self.ranks {
            Ranks::Scored(scores) => generate_merges(&tokens, scores),
            Ranks::Listed(table) => {
                let mut listed: Vec<&[u32; 4]> = table.iter().filter(|e| e[0] != NONE).collect();
                listed.sort_unstable_by_key(|e| e[2]);
                listed.iter().map(|e| (v.spelling(e[0]).to_owned(), v.spelling(e[1]).to_owned())).collect()
            }
        };
        tokenizers_bpe(&tokens, merges, !self.is_sentencepiece(), self.unk.as_deref())
    }

    /// Scored vocabularies are SentencePiece ones (byte fallback), listed ones byte-level.
    fn is_sentencepiece(&self) -> bool {
        matches!(*self.ranks, Ranks::Scored(_))
    }

    /// The spelling of an id that [`Self::tokenize`] returned (always its spelling's id).
    pub fn spelling(&self, id: u32) -> &str {
        self.vocab.spelling(id)
    }

    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.vocab.id(token)
    }

    /// The spelling of `id`, if `id` is the id of its spelling (a shadowed duplicate is not, as
    /// in `tokenizers`' reverse map).
    pub fn id_to_token(&self, id: u32) -> Option<&str> {
        let v = &self.vocab;
        ((id as usize) < v.ends.len()).then(|| v.spelling(id)).filter(|s| v.id(s) == Some(id))
    }

    pub fn get_vocab(&self) -> HashMap<String, u32> {
        let v = &self.vocab;
        v.slots.iter().filter(|&&id| id != NONE).map(|&id| (v.spelling(id).to_owned(), id)).collect()
    }

    /// Distinct spellings, as `tokenizers`' vocabulary map counts them.
    pub fn vocab_size(&self) -> usize {
        self.vocab.distinct
    }

    fn merge(&self, left: u32, right: u32, joined: &mut String) -> Option<(Rank, u32)> {
        self.ranks.merge(&self.vocab, left, right, joined)
    }

    /// `BPE::tokenize` of one pre-tokenized word: `(id, byte range in word)` per token.
    pub fn tokenize(&self, word: &str) -> Result<Vec<(u32, (usize, usize))>> {
        if word.is_empty() {
            return Ok(Vec::new());
        }
        let mut symbols = self.symbols_of(word)?;
        self.merge_all(&mut symbols);
        let mut at = 0;
        Ok(symbols
            .iter()
            .filter(|s| s.len != 0)
            .map(|s| {
                at += s.len;
                (s.id, (at - s.len, at))
            })
            .collect())
    }

    /// `BPE::merge_word` before its merges: a symbol per character in the vocabulary, else one
    /// per byte token, else the unknown token (consecutive unknowns fused).
    fn symbols_of(&self, word: &str) -> Result<Vec<Symbol>> {
        let v = &self.vocab;
        let mut symbols: Vec<Symbol> = Vec::with_capacity(word.len());
        let mut push = |id: u32, len: usize| {
            let n = symbols.len() as isize;
            if let Some(last) = symbols.last_mut() {
                last.next = n;
            }
            symbols.push(Symbol { id, prev: n - 1, next: -1, len });
        };
        let mut unk: Option<(u32, usize)> = None;
        let mut utf8 = [0u8; 4];
        for c in word.chars() {
            let s: &str = c.encode_utf8(&mut utf8);
            if let Some(id) = v.id(s) {
                if let Some((unk_id, unk_len)) = unk.take() {
                    push(unk_id, unk_len);
                }
                push(id, s.len());
                continue;
            }
            let bytes: Option<Vec<u32>> = self
                .is_sentencepiece()
                .then(|| s.bytes().map(|b| Some(v.byte_ids[b as usize]).filter(|&id| id != NONE)).collect())
                .flatten();
            if let Some(bytes) = bytes {
                for id in bytes {
                    push(id, 1);
                }
                continue;
            }
            if let Some(unk_token) = &self.unk {
                unk = Some(match unk {
                    Some((unk_id, unk_len)) => (unk_id, unk_len + s.len()),
                    None => (v.id(unk_token).ok_or_else(|| unknown_missing(unk_token))?, s.len()),
                });
            }
        }
        if let Some((unk_id, unk_len)) = unk {
            push(unk_id, unk_len);
        }
        Ok(symbols)
    }

    /// `Word::merge_all` without dropout: repeatedly merge the pair of lowest rank (leftmost
    /// among equals), skipping queue entries that earlier merges made stale.
    fn merge_all(&self, symbols: &mut [Symbol]) {
        let mut joined = String::new();
        let mut queue: BinaryHeap<Reverse<(Rank, usize, u32)>> = BinaryHeap::with_capacity(symbols.len());
        for pos in 0..symbols.len().saturating_sub(1) {
            if let Some((rank, id)) = self.merge(symbols[pos].id, symbols[pos + 1].id, &mut joined) {
                queue.push(Reverse((rank, pos, id)));
            }
        }
        while let Some(Reverse((_, pos, new_id))) = queue.pop() {
            if symbols[pos].len == 0 || symbols[pos].next == -1 {
                continue;
            }
            let next = symbols[pos].next as usize;
            let right = symbols[next];
            if self.merge(symbols[pos].id, right.id, &mut joined).is_none_or(|(_, id)| id != new_id) {
                continue;
            }
            symbols[pos].id = new_id;
            symbols[pos].len += right.len;
            symbols[pos].next = right.next;
            symbols[next].len = 0;
            if right.next > -1 && (right.next as usize) < symbols.len() {
                symbols[right.next as usize].prev = pos as isize;
            }
            let current = symbols[pos];
            if current.prev >= 0 {
                let prev = current.prev as usize;
                if let Some((rank, id)) = self.merge(symbols[prev].id, current.id, &mut joined) {
                    queue.push(Reverse((rank, prev, id)));
                }
            }
            if current.next >= 0 && (current.next as usize) < symbols.len() {
                if let Some((rank, id)) = self.merge(current.id, symbols[current.next as usize].id, &mut joined) {
                    queue.push(Reverse((rank, pos, id)));
                }
            }
        }
    }
}

/// `tokenizers`' BPE as transformers configures it for a GGUF vocabulary: `tokens` as a Python
/// dict (a later duplicate overwrites the id), and either byte-level (GPT-2: empty subword
/// prefix and suffix, unknowns not fused) or SentencePiece (byte fallback, fused unknowns,
/// `unk` when the tokenizer class names one). What [`CompactBpe`] stands for, the builder of
/// the vocabularies it does not hold, and the tests' reference.
pub(crate) fn tokenizers_bpe<T: AsRef<str>>(
    tokens: &[T],
    merges: Vec<(String, String)>,
    byte_level: bool,
    unk: Option<&str>,
) -> tokenizers::Result<BPE> {
    let mut vocab = Vocab::with_capacity(tokens.len());
    for (id, token) in tokens.iter().enumerate() {
        vocab.insert(token.as_ref().to_owned(), id as u32);
    }
    let builder = BPE::builder().vocab_and_merges(vocab, merges);
    let builder = if byte_level {
        builder.continuing_subword_prefix(String::new()).end_of_word_suffix(String::new()).fuse_unk(false)
    } else {
        builder.fuse_unk(true).byte_fallback(true)
    };
    match unk {
        Some(unk) => builder.unk_token(unk.to_owned()),
        None => builder,
    }
    .build()
}

/// `tokenizer.ggml.merges` as the owned pairs `tokenizers`' BPE builder takes ([`split_merge`]
/// each).
pub(crate) fn merge_pairs(merges: &[String]) -> Result<Vec<(String, String)>> {
    merges.iter().enumerate().map(|(i, m)| split_merge(i, m).map(|(l, r)| (l.to_owned(), r.to_owned()))).collect()
}

/// Merge `i` of `tokenizer.ggml.merges`, "left right" with exactly one space.
fn split_merge(i: usize, merge: &str) -> Result<(&str, &str)> {
    merge.split_once(' ').filter(|(_, r)| !r.contains(' ')).ok_or_else(|| {
        invalid("tokenizer.ggml.merges", format!("merge {i} ({merge:?}) is not two tokens separated by one space"))
    })
}

/// `generate_merges(vocab, vocab_scores)` of transformers: every split of every token into two
/// tokens of the vocabulary, best score first. Python dict semantics are kept: a duplicate token
/// keeps its first position in iteration but its last id and score.
///
/// Used where the merges must be listed (a tokenizer.json saved from a [`CompactBpe`], a
/// byte-level file without merges) and by the tests as the reference; built for large
/// vocabularies (Gemma 3's 262,144 tokens give 514,847 merges in ~1 s): one hash
/// lookup per half, with a fast hasher, and sort keys computed once per merge (ids, score,
/// lengths in code points) rather than in the comparators.
pub(crate) fn generate_merges(tokens: &[String], scores: &[f32]) -> Vec<(String, String)> {
    let mut id_of: ahash::AHashMap<&str, (u32, f32)> = ahash::AHashMap::with_capacity(tokens.len());
    let mut order: Vec<&str> = Vec::with_capacity(tokens.len());
    for (id, token) in tokens.iter().enumerate() {
        if id_of.insert(token, (id as u32, scores[id])).is_none() {
            order.push(token);
        }
    }
    struct Merge<'t> {
        left: &'t str,
        right: &'t str,
        score: f32,
        left_chars: u32,
        right_chars: u32,
    }
    let mut merges: Vec<Merge<'_>> = Vec::new();
    // (left id, right id, split byte offset, left length in code points) of one piece.
    let mut local: Vec<(u32, u32, usize, u32)> = Vec::new();
    for &piece in &order {
        let score = id_of[piece].1;
        local.clear();
        // Python slices by code point, so split at char boundaries.
        for (chars, (at, _)) in piece.char_indices().enumerate().skip(1) {
            let (l, r) = piece.split_at(at);
            if let (Some(&(li, _)), Some(&(ri, _))) = (id_of.get(l), id_of.get(r)) {
                local.push((li, ri, at, chars as u32));
            }
        }
        if local.is_empty() {
            continue;
        }
        let total_chars = piece.chars().count() as u32;
        // Stable, by (id of left, id of right): Python's sorted(key=...) on the pairs.
        local.sort_by_key(|&(li, ri, _, _)| (li, ri));
        merges.extend(local.iter().map(|&(_, _, at, lc)| Merge {
            left: &piece[..at],
            right: &piece[at..],
            score,
            left_chars: lc,
            right_chars: total_chars - lc,
        }));
    }
    // sorted(key=(score, len(l), len(r)), reverse=True) is stable: ties keep their order.
    merges.sort_by(|a, b| {
        b.score.total_cmp(&a.score).then_with(|| (b.left_chars, b.right_chars).cmp(&(a.left_chars, a.right_chars)))
    });
    merges.into_iter().map(|m| (m.left.to_owned(), m.right.to_owned())).collect()
}

#[cfg(test)]
#[path = "compact_bpe_tests.rs"]
mod tests;
