//! Streams the decode GEMV (`matmul_wq` at m = 1, `--precision native`'s kernel) over
//! matrices too large to stay in cache, and prints the weight bytes read per second: what one
//! decode step's matmuls draw from memory, without the rest of the graph.
//!
//! ```text
//! cargo run --release -p loupe-tensor --example stream_gemv
//! T=2 TY=q4_1 N=1536 K=576 COUNT=200 cargo run --release -p loupe-tensor --example stream_gemv
//! TY=q4_k PREC=q8 N=8192 K=2048 COUNT=20 cargo run --release -p loupe-tensor --example stream_gemv
//! TY=q4_k PREC=q8 N=512 K=2048 M=64 cargo run --release -p loupe-tensor --example stream_gemv  # prefill
//! LOUPE_HUGEPAGES=0 cargo run --release -p loupe-tensor --example stream_gemv   # 4 KiB pages
//! ```
//!
//! `T` compute threads (default 1), `COUNT` matrices (default 1) of `N x K` (default
//! 262,144 x 640, Gemma 3's lm_head) of type `TY` (`q8_0`, default, `q4_1`, `q5_0`, `q4_0`, `q4_k`, `q5_k`, `q6_k`, `f16`;
//! `PREC=q8` multiplies through `matmul_q`, the 8-bit-activation kernels, `PREC=batch` through
//! `matmul_wq_invariant`, the batched engine's native kernels, `PREC=chain` through
//! `matmul_wq_chain`, its prompt rows' f32 chains, `PREC=prompt` through `matmul_q_prompt`, the
//! 8-bit prompt panels), copied into
//! a `WeightArena` as the model loader does (`ARENAS=n`: spread round-robin over n arenas, so
//! consecutive matrices are not neighbours in memory), deterministic random blocks with small
//! finite scales; `M` activation rows (default 1: decode; more, with a matrix that fits in
//! L2, measures the prefill kernels' arithmetic). Prints the median and best of 15 passes
//! (and the median's GFLOP/s) and the process's `AnonHugePages`.

use std::time::Instant;

use loupe_tensor::hugepages::WeightArena;
use loupe_tensor::linear::QMatrix;
use loupe_tensor::linear::{matmul_q, matmul_q_prompt, matmul_wq, matmul_wq_chain, matmul_wq_invariant};
use loupe_tensor::GgmlType;

fn env(name: &str, default: usize) -> usize {
    match std::env::var(name) {
        Ok(v) => v.parse().unwrap_or_else(|_| panic!("{name}={v} is not a whole number")),
        Err(_) => default,
    }
}

fn main() {
    let (n, k, count, threads) = (env("N", 262_144), env("K", 640), env("COUNT", 1), env("T", 1));
    let ty = match std::env::var("TY").as_deref() {
        Ok("q4_1") => GgmlType::Q4_1,
        Ok("q5_0") => GgmlType::Q5_0,
        Ok("q4_k") => GgmlType::Q4K,
        Ok("q5_k") => GgmlType::Q5K,
        Ok("q6_k") => GgmlType::Q6K,
        Ok("q4_0") => GgmlType::Q4_0,
        Ok("f16") => GgmlType::F16,
        Ok("q8_0") | Err(_) => GgmlType::Q8_0,
        Ok(other) => panic!("TY={other}: q8_0, q4_1, q5_0, q4_0, q4_k, q5_k, q6_k or f16"),
    };
    // `batch`: the batch-invariant native kernels (`matmul_wq_invariant`, what the batched
    // engine runs at `--precision native`).
    let prec = match std::env::var("PREC").as_deref() {
        Ok("q8") => "q8",
        Ok("batch") => "batch",
        Ok("chain") => "chain",
        Ok("prompt") => "prompt",
        Ok("native") | Err(_) => "native",
        Ok(other) => panic!("PREC={other}: native, batch, chain, q8 or prompt"),
    };
    assert!(k % ty.block_size() == 0, "K={k} is not a multiple of {}", ty.block_size());
    loupe_tensor::pool::init_global(threads).expect("compute pool");
    let len = n * k / ty.block_size() * ty.type_size();
    // Where each block keeps its f16 scales (overwritten with a small finite one).
    let scale_at: &[usize] = match ty {
        GgmlType::Q4_1 | GgmlType::Q4K | GgmlType::Q5K => &[0, 2],
        GgmlType::Q6K => &[208],
        // Every element is a scale-sized f16 (no subnormal products to slow the FMAs).
        GgmlType::F16 => &[0],
        _ => &[0],
    };
    let mut state = 0x1234_5678u32;
    let scale = half::f16::from_f32(0.01).to_le_bytes();
    let arenas: Vec<WeightArena> = (0..env("ARENAS", 1).max(1)).map(|_| WeightArena::new()).collect();
    let matrices: Vec<QMatrix> = (0..count)
        .map(|i| {
            let mut bytes: Vec<u8> = (0..len)
                .map(|_| {
                    state ^= state << 13;
                    state ^= state >> 17;
                    state ^= state << 5;
                    state as u8
                })
                .collect();
            for block in bytes.chunks_mut(ty.type_size()) {
                for &at in scale_at {
                    block[at..at + 2].copy_from_slice(&scale);
                }
            }
            QMatrix::new(ty, n, k, arenas[i % arenas.len()].copy(&bytes)).expect("matrix")
        })
        .collect();
    // `M` activation rows (default 1, decode; more measures the prefill kernels).
    let m = env("M", 1).max(1);
    // The activations at a 64-byte boundary (`XALIGN=0`: 4 bytes past one, as a plain
    // allocation may land): a misaligned zmm load spans two cache lines.
    let mut x_buf = vec![0f32; m * k + 32];
    let skip = (64 - x_buf.as_ptr() as usize % 64) % 64 / 4 + if env("XALIGN", 1) == 0 { 1 } else { 0 };
    let x = &mut x_buf[skip..skip + m * k];
    for (i, v) in x.iter_mut().enumerate() {
        *v = ((i * 7919) % 1000) as f32 / 1000.0 - 0.5;
    }
    let x = &*x;
    let mut y = vec![0f32; m * n];
    let mut scratch = Vec::new();
    let mut rates: Vec<f64> = (0..15)
        .map(|_| {
            let t = Instant::now();
            for w in &matrices {
                match prec {
                    "q8" => matmul_q(x, w, &mut y, m, &mut scratch).expect("matmul"),
                    "prompt" => matmul_q_prompt(x, w, &mut y, m, &mut scratch).expect("matmul"),
                    "batch" => matmul_wq_invariant(x, w, &mut y, m).expect("matmul"),
                    "chain" => matmul_wq_chain(x, w, &mut y, m).expect("matmul"),
                    _ => matmul_wq(x, w, &mut y, m).expect("matmul"),
                }
            }
            (len * count) as f64 / t.elapsed().as_secs_f64() / 1e9
        })
        .collect();
    rates.sort_by(f64::total_cmp);
    let huge = std::fs::read_to_string("/proc/self/smaps_rollup").ok().and_then(|s| {
        s.lines().find(|l| l.starts_with("AnonHugePages")).map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
    });
    // Multiply-adds times 2 per second, at the median rate.
    let gflops = rates[7] / (len * count) as f64 * (2 * m * n * k * count) as f64;
    println!(
        "{ty} {count} x {n}x{k}, m = {m} ({:.0} MB), {threads} threads: median {:.2} GB/s ({gflops:.0} GFLOP/s), best {:.2} ({})",
        (len * count) as f64 / 1e6,
        rates[7],
        rates[14],
        huge.unwrap_or_else(|| "AnonHugePages unknown".into())
    );
}
