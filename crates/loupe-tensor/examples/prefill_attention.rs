//! Times prefill attention as SmolLM2's pp512 runs it (9 query heads sharing 3 kv heads of
//! 64, 512 causal rows from an empty f16 cache, 2 compute threads unless `T` says otherwise)
//! and prints the median and best of 40 calls: the figure to compare when changing the tile
//! kernels, the softmax or the key transposition.
//!
//! ```text
//! cargo run --release -p loupe-tensor --example prefill_attention
//! T=1 TOKENS=128 cargo run --release -p loupe-tensor --example prefill_attention
//! ```

use std::time::Instant;

use half::f16;
use loupe_tensor::ops::{attention_cached, AttentionShape, AttentionVariant, KvBlocks};

fn env(name: &str, default: usize) -> usize {
    match std::env::var(name) {
        Ok(v) => v.parse().unwrap_or_else(|_| panic!("{name}={v} is not a whole number")),
        Err(_) => default,
    }
}

fn main() {
    let (threads, tokens) = (env("T", 2), env("TOKENS", 512));
    loupe_tensor::pool::init_global(threads).expect("compute pool");
    let (heads, kv_heads, head_dim) = (9, 3, 64);
    let shape = AttentionShape::new(heads, kv_heads, head_dim, (head_dim as f32).powf(-0.5));
    let mut state = 7u32;
    let mut next = || {
        state = state.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
        (state >> 8) as f32 / (1u32 << 24) as f32 * 4.0 - 2.0
    };
    let q: Vec<f32> = (0..tokens * heads * head_dim).map(|_| next()).collect();
    let k: Vec<f16> = (0..tokens * kv_heads * head_dim).map(|_| f16::from_f32(next())).collect();
    let v: Vec<f16> = (0..tokens * kv_heads * head_dim).map(|_| f16::from_f32(next())).collect();
    let mut out = vec![0f32; q.len()];
    let mut times = Vec::new();
    for i in 0..45 {
        let start = Instant::now();
        attention_cached(
            shape,
            AttentionVariant::default(),
            &q,
            KvBlocks::F16(&k),
            KvBlocks::F16(&v),
            tokens,
            &mut out,
            None,
        )
        .expect("attention");
        if i >= 5 {
            times.push(start.elapsed().as_secs_f64() * 1e3);
        }
    }
    times.sort_by(f64::total_cmp);
    println!(
        "prefill attention, {tokens} rows, {threads} threads ({}): median {:.3} ms, best {:.3} ms",
        loupe_tensor::quant::Isa::active(),
        times[times.len() / 2],
        times[0]
    );
}
