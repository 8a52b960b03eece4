mod common;
use common::*;
use loupe_tensor::matmul::{matmul_q_with, QMatrix};
use loupe_tensor::quant::{self, Isa};
use loupe_tensor::GgmlType;
use std::time::Instant;

fn min_time(mut f: impl FnMut(), iters: usize) -> f64 {
    let mut best = f64::MAX;
    for _ in 0..iters {
        let t = Instant::now();
        f();
        best = best.min(t.elapsed().as_secs_f64());
    }
    best * 1e6
}

#[test]
#[ignore]
fn exp() {
    let threads: usize = std::env::var("T").ok().and_then(|v| v.parse().ok()).unwrap_or(1);
    let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
    let mut rng = Rng::new(1);
    for ty in [GgmlType::Q4_1, GgmlType::Q8_0] {
        for (n, k) in [(576usize, 576usize), (1536, 576), (576, 1536), (8192, 576)] {
            let data: Vec<u8> = (0..n).flat_map(|_| random_row(&mut rng, ty, k)).collect();
            let w = QMatrix::new(ty, n, k, data).unwrap();
            for m in [1usize, 64] {
                let x = rng.activations(m * k);
                let mut y = vec![0f32; m * n];
                let mut s = Vec::new();
                pool.install(|| {
                    let tile = min_time(|| matmul_q_with(Isa::Avx512, &x, &w, &mut y, m, &mut s).unwrap(), 50);
                    let avx2 = min_time(|| matmul_q_with(Isa::Avx2, &x, &w, &mut y, m, &mut s).unwrap(), 50);
                    // per-row avx512 vec_dot, single thread
                    let dot = quant::vec_dot_fn(Isa::Avx512, ty);
                    let aty = quant::vec_dot_type(ty);
                    let arb = aty.bytes_for(k as u64).unwrap() as usize;
                    let mut act = vec![0u8; m * arb];
                    for i in 0..m { quant::quantize_row(aty, &x[i*k..(i+1)*k], &mut act[i*arb..(i+1)*arb]).unwrap(); }
                    let rows = min_time(|| {
                        for i in 0..m { for j in 0..n { y[i*n+j] = dot(w.row(j), &act[i*arb..], k); } }
                    }, 20);
                    let gb = |us: f64| w.data.len() as f64 / us / 1e3;
                    let gmac = |us: f64| (m * n * k) as f64 / us / 1e3;
                    eprintln!("{ty} {n}x{k} m={m} T={threads}: tile {tile:8.1} us ({:6.2} GB/s, {:6.1} GMAC/s) | avx2 {avx2:8.1} | per-row-512 1T {rows:8.1} ({:6.1} GMAC/s)", gb(tile), gmac(tile), gmac(rows));
                });
            }
        }
    }
}
