//! Times the batched engine's attention as Qwen2.5-0.5B serves (14 query heads sharing 2 kv
//! heads of 64, f16 pages of 16 positions): `SEQS` sequences decoding one row each after
//! `CTX` cached positions, or with `PROMPT` > 1 one prompt chunk of that many rows each, on
//! 2 compute threads unless `T` says otherwise. Prints the median and best of 40 calls: the
//! figure to compare when changing the row kernels or the task split.
//!
//! ```text
//! cargo run --release -p loupe-tensor --example paged_attention
//! SEQS=1 PROMPT=128 CTX=0 HEADS=9 KV_HEADS=3 cargo run --release -p loupe-tensor --example paged_attention
//! ```

use std::time::Instant;

use half::f16;
use loupe_tensor::ops::{paged_attention, AttentionShape, AttentionVariant, KvBlocks, PagedSpan};

fn env(name: &str, default: usize) -> usize {
    match std::env::var(name) {
        Ok(v) => v.parse().unwrap_or_else(|_| panic!("{name}={v} is not a whole number")),
        Err(_) => default,
    }
}

fn main() {
    let (threads, seqs, ctx, prompt) = (env("T", 2), env("SEQS", 8), env("CTX", 600), env("PROMPT", 1).max(1));
    let (heads, kv_heads, head_dim) = (env("HEADS", 14), env("KV_HEADS", 2), env("HEAD_DIM", 64));
    loupe_tensor::pool::init_global(threads).expect("compute pool");
    let shape = AttentionShape::new(heads, kv_heads, head_dim, (head_dim as f32).powf(-0.5));
    let block_size = 16;
    let blocks_per_seq = (ctx + prompt).div_ceil(block_size);
    let mut state = 7u32;
    let mut next = || {
        state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
        (state >> 8) as f32 / (1u32 << 24) as f32 * 4.0 - 2.0
    };
    let rows = seqs * prompt;
    let q: Vec<f32> = (0..rows * heads * head_dim).map(|_| next()).collect();
    let cache = seqs * blocks_per_seq * block_size * kv_heads * head_dim;
    let k: Vec<f16> = (0..cache).map(|_| f16::from_f32(next())).collect();
    let v: Vec<f16> = (0..cache).map(|_| f16::from_f32(next())).collect();
    // Every sequence's blocks interleaved with the others', as a block manager hands them out.
    let tables: Vec<Vec<u32>> =
        (0..seqs).map(|s| (0..blocks_per_seq).map(|b| (b * seqs + s) as u32).collect()).collect();
    let spans: Vec<PagedSpan<'_>> = tables
        .iter()
        .enumerate()
        .map(|(s, blocks)| PagedSpan { rows: s * prompt..(s + 1) * prompt, past: ctx, blocks })
        .collect();
    let mut out = vec![0f32; q.len()];
    let mut times = Vec::new();
    for i in 0..45 {
        let start = Instant::now();
        paged_attention(
            shape,
            AttentionVariant::default(),
            &q,
            KvBlocks::F16(&k),
            KvBlocks::F16(&v),
            block_size,
            &spans,
            &mut out,
            None,
        )
        .expect("paged attention");
        if i >= 5 {
            times.push(start.elapsed().as_secs_f64() * 1e3);
        }
    }
    times.sort_by(f64::total_cmp);
    println!(
        "paged attention, {seqs} x {prompt} rows after {ctx}, {heads}/{kv_heads} heads of {head_dim}, {threads} threads ({}): median {:.3} ms, best {:.3} ms",
        loupe_tensor::quant::Isa::active(),
        times[times.len() / 2],
        times[0]
    );
}
