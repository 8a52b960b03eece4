//! Times the AMX prefill kernel (`amx::matmul_wq_amx`) on SmolLM2's three Q4_1 linear shapes
//! at 512 activation rows and prints nanoseconds per tile-block (16 activation rows x 16
//! weight rows x one block of 32, see the `amx` module doc) and multiply-adds per second: the
//! figure to compare when changing the kernel.
//!
//! ```text
//! cargo run --release -p loupe-tensor --example amx_tile_block
//! T=2 cargo run --release -p loupe-tensor --example amx_tile_block   # 2 compute threads
//! ```
//!
//! Deterministic random Q4_1 blocks and activations; best of 30 calls per shape. Exits with
//! a message on a CPU without usable AMX tiles.

use std::time::Instant;

use loupe_tensor::linear::QMatrix;
use loupe_tensor::GgmlType;

fn main() {
    let threads: usize = match std::env::var("T") {
        Ok(v) => v.parse().unwrap_or_else(|_| panic!("T={v} is not a whole number")),
        Err(_) => 1,
    };
    if loupe_tensor::quant::Isa::detected() < loupe_tensor::quant::Isa::Amx {
        eprintln!("amx_tile_block: this CPU ({}) has no usable AMX tiles", loupe_tensor::quant::Isa::detected());
        std::process::exit(1);
    }
    loupe_tensor::pool::init_global(threads).expect("compute pool");
    let m = 512;
    let mut state = 1u32;
    let mut next = || {
        state ^= state << 13;
        state ^= state >> 17;
        state ^= state << 5;
        state
    };
    // SmolLM2-135M: gate/up (1536 x 576), down (576 x 1536), q/o (576 x 576).
    for (n, k) in [(1536usize, 576usize), (576, 1536), (576, 576)] {
        let mut bytes: Vec<u8> = (0..n * k / 32 * 20).map(|_| next() as u8).collect();
        for block in bytes.chunks_mut(20) {
            block[..2].copy_from_slice(&half::f16::from_f32(0.01).to_le_bytes());
            block[2..4].copy_from_slice(&half::f16::from_f32(-0.02).to_le_bytes());
        }
        let w = QMatrix::new(GgmlType::Q4_1, n, k, bytes).expect("Q4_1 matrix");
        let x: Vec<f32> = (0..m * k).map(|_| (next() % 1000) as f32 / 500.0 - 1.0).collect();
        let mut y = vec![0f32; m * n];
        let mut best = f64::MAX;
        for _ in 0..30 {
            let t0 = Instant::now();
            loupe_tensor::linear::amx::matmul_wq_amx(&x, &w, &mut y, m).expect("AMX matmul");
            best = best.min(t0.elapsed().as_secs_f64());
        }
        let tile_blocks = (m / 16) * (n / 16) * (k / 32);
        println!(
            "{n} x {k} Q4_1, m = {m}, {threads} thread(s): {:.3} ms, {:.1} ns per tile-block per thread, {:.1} G multiply-adds/s",
            best * 1e3,
            best * 1e9 / tile_blocks as f64 * threads as f64,
            (m * n * k) as f64 / best / 1e9
        );
    }
}
