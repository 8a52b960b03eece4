//! The prefix cache's disk tier on a real model with sliding-window layers: Gemma 3 270M
//! (Q4_K_M; five layers in six attend through a 512-token window, the others globally) and
//! its ~810-token golden prompt. The prompt's blocks are evicted by another long prompt
//! under a small KV budget, written to disk, and restored for the prompt's second run,
//! whose greedy tokens must equal the first run's and those of an engine without a cache.
//!
//! Ignored by default; scripts/test fetches the model (`scripts/fetch-model gemma3-270m`)
//! and runs it with `--include-ignored`. Without the model it fails, naming how to get it.

mod common;

use std::path::PathBuf;

use loupe_runtime::{BatchConfig, BatchEngine, DiskCacheConfig, Engine, LoadOptions, SamplingParams, SeqRequest};

/// Gemma 3 270M: `$LOUPE_GEMMA_MODEL`, else where `scripts/fetch-model gemma3-270m` puts it.
fn gemma_model() -> PathBuf {
    common::real_gguf("LOUPE_GEMMA_MODEL", "gemma-3-270m-q4_k_m.gguf", "gemma3-270m")
}

/// The golden prompt longer than `min` tokens (tests/golden/gemma3-270m).
fn long_prompt(min: usize) -> Vec<u32> {
    let best = common::golden_files("gemma3-270m")
        .iter()
        .map(|v| common::ids(&v["prompt_tokens"]))
        .max_by_key(Vec::len)
        .unwrap_or_default();
    assert!(best.len() > min, "no Gemma 3 golden prompt is longer than {min} tokens (longest: {})", best.len());
    best
}

#[test]
#[ignore = "needs Gemma 3 270M (scripts/test fetches it)"]
fn gemma3_prefix_past_the_sliding_window_comes_back_from_disk_with_identical_tokens() {
    let engine = Engine::load(gemma_model(), LoadOptions::default()).expect("loading Gemma 3 270M");
    let config = engine.config().decoder().expect("a decoder");
    let windows: Vec<usize> = (0..config.num_hidden_layers).filter_map(|l| config.window(l)).collect();
    let window = windows.iter().copied().max().expect("Gemma 3 has sliding-window layers");
    assert!(windows.len() < config.num_hidden_layers, "and global layers too");
    let prompt = long_prompt(window);
    let n = prompt.len();
    let greedy = SamplingParams::default();
    let req = |p: Vec<u32>| SeqRequest::new(p, 16, greedy.clone(), vec![]);

    let mut plain = BatchEngine::new(&engine, BatchConfig { prefix_cache: false, ..BatchConfig::default() }).unwrap();
    let want = plain.run_all(vec![req(prompt.clone())]).unwrap().remove(0).tokens;
    drop(plain);

    // Room for one of the long prompts and a few blocks more: the second evicts the first.
    let per_seq = (n + 16).div_ceil(16);
    let dir = tempfile::tempdir().unwrap();
    let disk = DiskCacheConfig { dir: dir.path().to_path_buf(), max_bytes: 1 << 30 };
    let mut b = BatchEngine::new(
        &engine,
        BatchConfig { kv_blocks: Some(per_seq + 4), prefix_cache_disk: Some(disk), ..BatchConfig::default() },
    )
    .unwrap();
    let first = b.run_all(vec![req(prompt.clone())]).unwrap().remove(0);
    assert_eq!(first.tokens, want, "first run");
    // Another prompt as long: the same tokens after <bos>, reversed.
    let mut other = prompt.clone();
    other[1..].reverse();
    b.run_all(vec![req(other)]).unwrap();
    assert!(b.stats().prefix.evictions as usize * 16 > window, "more than a window evicted: {:?}", b.stats());
    let again = b.run_all(vec![req(prompt.clone())]).unwrap().remove(0);
    let s = b.stats();
    eprintln!(
        "gemma3 disk tier: prompt {n} tokens, window {window}; {} blocks written, {} restored; {} KiB per file; engine thread {:.1} us per block written, {:.1} us per block restored",
        s.disk.written_blocks,
        s.disk.restored_blocks,
        s.disk.bytes / s.disk.files.max(1) as u64 / 1024,
        s.disk.spill_ns as f64 / 1e3 / s.disk.written_blocks.max(1) as f64,
        s.disk.restore_ns as f64 / 1e3 / s.disk.restored_blocks.max(1) as f64,
    );
    assert!(s.disk.restored_blocks > 0, "the prefix came back from disk: {s:?}");
    assert!(
        again.usage.cached_tokens > window,
        "{} cached tokens: past the window from disk and memory",
        again.usage.cached_tokens
    );
    assert_eq!(s.disk.invalid_files, 0);
    assert_eq!(again.tokens, want, "from disk, past the sliding window");
}
