//! The prefix cache's disk tier on the tiny random-weight models (a Llama, and a Gemma 2
//! whose even layers attend through a sliding window of 8): blocks evicted under a small KV
//! budget are written out and restored on a later hit, in the same engine and in a new one
//! over the same directory, and the tokens are those of a run that never evicted anything.

mod common;
use common::tiny_file;

use std::path::PathBuf;

use loupe_core::SplitMix64;
use loupe_models::tiny::{TinyGemma2, TinyLlama};
use loupe_runtime::{BatchConfig, BatchEngine, DiskCacheConfig, Engine, LoadOptions, SamplingParams, SeqRequest};

fn prompt(seed: u64, len: usize) -> Vec<u32> {
    let mut rng = SplitMix64::new(seed);
    (0..len).map(|_| 3 + (rng.next_u64() % 400) as u32).collect()
}

fn request(prompt: Vec<u32>, sampling: &SamplingParams) -> SeqRequest {
    SeqRequest::new(prompt, 10, sampling.clone(), vec![])
}

fn disk_config(dir: &std::path::Path, kv_blocks: usize) -> BatchConfig {
    BatchConfig {
        kv_blocks: Some(kv_blocks),
        prefix_cache_disk: Some(DiskCacheConfig { dir: dir.to_path_buf(), max_bytes: 64 << 20 }),
        ..BatchConfig::default()
    }
}

fn models() -> Vec<(&'static str, PathBuf)> {
    let gemma = TinyLlama { gemma2: Some(TinyGemma2::default()), ..TinyLlama::default() };
    vec![("llama", tiny_file(&TinyLlama::default())), ("gemma2 (sliding window 8)", tiny_file(&gemma))]
}

#[test]
fn evicted_prefix_blocks_come_back_from_disk_with_identical_tokens() {
    let seeded = SamplingParams { temperature: 0.9, top_k: 40, seed: 5, ..SamplingParams::default() };
    for (name, model) in models() {
        let engine = Engine::load(&model, LoadOptions::default()).expect("loading the tiny model");
        for sampling in [SamplingParams::default(), seeded.clone()] {
            // 5 full blocks and a bit; the others push it out of a 12-block cache.
            let a = request(prompt(1, 90), &sampling);
            let others: Vec<SeqRequest> = (2..4).map(|s| request(prompt(s, 90), &sampling)).collect();
            let mut plain =
                BatchEngine::new(&engine, BatchConfig { prefix_cache: false, ..BatchConfig::default() }).unwrap();
            let want = plain.run_all(vec![a.clone()]).unwrap().remove(0).tokens;

            let dir = tempfile::tempdir().unwrap();
            let mut b = BatchEngine::new(&engine, disk_config(dir.path(), 12)).unwrap();
            assert_eq!(b.run_all(vec![a.clone()]).unwrap()[0].tokens, want, "{name}: first run");
            for r in &others {
                b.run_all(vec![r.clone()]).unwrap();
            }
            assert!(b.stats().prefix.evictions >= 5, "{name}: evicted: {:?}", b.stats());
            let again = b.run_all(vec![a.clone()]).unwrap().remove(0);
            let s = b.stats();
            // Written (counted once the writer confirms), then restored.
            assert!(s.disk.written_blocks >= 5 && s.disk.restored_blocks >= 5, "{name}: from disk: {s:?}");
            assert_eq!(again.usage.cached_tokens, 80, "{name}: the whole prefix came back");
            assert_eq!(again.tokens, want, "{name}: from disk ({sampling:?})");
            assert_eq!(s.disk.invalid_files, 0);
            drop(b);

            // A new engine over the same directory (a restarted server) finds it too.
            let mut c = BatchEngine::new(&engine, disk_config(dir.path(), 12)).unwrap();
            assert!(c.stats().disk.files >= 5, "{:?}", c.stats());
            let third = c.run_all(vec![a.clone()]).unwrap().remove(0);
            assert!(c.stats().disk.restored_blocks >= 5, "{name}: after a restart: {:?}", c.stats());
            assert!(third.usage.cached_tokens >= 80, "{name}");
            assert_eq!(third.tokens, want, "{name}: after a restart ({sampling:?})");
        }
    }
}

#[test]
fn many_sequences_under_a_tiny_budget_with_the_disk_tier_keep_their_tokens() {
    let engine = Engine::load(tiny_file(&TinyLlama::default()), LoadOptions::default()).unwrap();
    let sampling = SamplingParams::default();
    // Eight requests sharing a 48-token prefix, sent twice: preemption, eviction, restores.
    let shared = prompt(7, 48);
    let reqs: Vec<SeqRequest> = (0..8)
        .map(|i| {
            let mut p = shared.clone();
            p.extend(prompt(100 + i, 5 + 7 * i as usize));
            request(p, &sampling)
        })
        .collect();
    let mut plain = BatchEngine::new(&engine, BatchConfig { prefix_cache: false, ..BatchConfig::default() }).unwrap();
    let want: Vec<Vec<u32>> = reqs.iter().map(|r| plain.run_all(vec![r.clone()]).unwrap().remove(0).tokens).collect();
    let dir = tempfile::tempdir().unwrap();
    let mut b = BatchEngine::new(&engine, disk_config(dir.path(), 12)).unwrap();
    for round in 0..2 {
        let got: Vec<Vec<u32>> = b.run_all(reqs.clone()).unwrap().into_iter().map(|c| c.tokens).collect();
        assert_eq!(got, want, "round {round}");
    }
    let s = b.stats();
    assert!(s.disk.written_blocks > 0 && s.disk.restored_blocks > 0, "{s:?}");
    assert_eq!(s.blocks_in_use, 0);
    // The operator's reset empties the disk tier too.
    b.reset_prefix_cache();
    drop(b);
    let left = std::fs::read_dir(dir.path()).unwrap().count();
    assert_eq!(left, 0, "reset deletes the block files");
}

#[test]
fn a_corrupted_file_is_refused_and_the_prefix_computed_again() {
    let engine = Engine::load(tiny_file(&TinyLlama::default()), LoadOptions::default()).unwrap();
    let a = request(prompt(11, 70), &SamplingParams::default());
    let dir = tempfile::tempdir().unwrap();
    let mut b = BatchEngine::new(&engine, disk_config(dir.path(), 10)).unwrap();
    let want = b.run_all(vec![a.clone()]).unwrap().remove(0).tokens;
    b.run_all(vec![request(prompt(12, 140), &SamplingParams::default())]).unwrap();
    drop(b);
    // Flip a byte in the middle of every block file.
    let mut n = 0;
    for e in std::fs::read_dir(dir.path()).unwrap() {
        let path = e.unwrap().path();
        let mut bytes = std::fs::read(&path).unwrap();
        let mid = bytes.len() / 2;
        bytes[mid] ^= 0x40;
        std::fs::write(&path, bytes).unwrap();
        n += 1;
    }
    assert!(n >= 4, "{n} files");
    let mut c = BatchEngine::new(&engine, disk_config(dir.path(), 10)).unwrap();
    let again = c.run_all(vec![a]).unwrap().remove(0);
    assert_eq!(again.tokens, want);
    assert_eq!(again.usage.cached_tokens, 0, "nothing trusted");
    let s = c.stats();
    assert_eq!((s.disk.restored_blocks, s.disk.invalid_files), (0, 1), "the first refusal ends the lookup: {s:?}");
}

#[test]
fn the_disk_tier_needs_the_prefix_cache_and_a_usable_directory() {
    let engine = Engine::load(tiny_file(&TinyLlama::default()), LoadOptions::default()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let off = BatchConfig { prefix_cache: false, ..disk_config(dir.path(), 12) };
    assert!(BatchEngine::new(&engine, off).err().unwrap().to_string().contains("needs the prefix cache"));
    let file = dir.path().join("plain-file");
    std::fs::write(&file, b"").unwrap();
    let e = BatchEngine::new(&engine, disk_config(&file, 12)).err().unwrap().to_string();
    assert!(e.contains("prefix cache directory") && e.contains("plain-file"), "{e}");
}
