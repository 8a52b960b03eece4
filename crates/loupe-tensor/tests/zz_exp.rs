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
        for (n, k) in [(576usize, 576usize), (1536, 576), (576, 1536), (49152, 576)] {
            let data: Vec<u8> = (0..n).flat_map(|_| random_row(&mut rng, ty, k)).collect();
            let w = QMatrix::new(ty, n, k, data).unwrap();
            for m in [1usize, 64] {
                let x = rng.activations(m * k);
                let mut y = vec![0f32; m * n];
                let mut s = Vec::new();
                pool.install(|| {
                    let it = if n * m > 1_000_000 { 5 } else { 50 };
                    let tile = min_time(|| matmul_q_with(Isa::Avx512, &x, &w, &mut y, m, &mut s).unwrap(), it);
                    let avx2 = min_time(|| matmul_q_with(Isa::Avx2, &x, &w, &mut y, m, &mut s).unwrap(), it);
                    // per-row avx512 vec_dot, single thread
                    let dot = quant::vec_dot_fn(Isa::Avx512, ty);
                    let aty = quant::vec_dot_type(ty);
                    let arb = aty.bytes_for(k as u64).unwrap() as usize;
                    let mut act = vec![0u8; m * arb];
                    for i in 0..m { quant::quantize_row(aty, &x[i*k..(i+1)*k], &mut act[i*arb..(i+1)*arb]).unwrap(); }
                    let rows = if n * m > 1_000_000 { f64::NAN } else { min_time(|| {
                        for i in 0..m { for j in 0..n { y[i*n+j] = dot(w.row(j), &act[i*arb..], k); } }
                    }, 20) };
                    let gb = |us: f64| w.data.len() as f64 / us / 1e3;
                    let gmac = |us: f64| (m * n * k) as f64 / us / 1e3;
                    eprintln!("{ty} {n}x{k} m={m} T={threads}: tile {tile:8.1} us ({:6.2} GB/s, {:6.1} GMAC/s) | avx2 {avx2:8.1} | per-row-512 1T {rows:8.1} ({:6.1} GMAC/s)", gb(tile), gmac(tile), gmac(rows));
                });
            }
        }
    }
}

#[test]
#[ignore]
fn quant_speed() {
    let mut rng = Rng::new(1);
    for k in [576usize, 1536] {
        let x = rng.activations(k);
        for ty in [GgmlType::Q8_0, GgmlType::Q8_1] {
            let mut q = vec![0u8; ty.bytes_for(k as u64).unwrap() as usize];
            let t = min_time(|| quant::quantize_row(ty, &x, &mut q).unwrap(), 200);
            eprintln!("quantize {ty} k={k}: {t:.2} us");
        }
    }
}

#[test]
#[ignore]
fn f32_gemv() {
    let threads: usize = std::env::var("T").ok().and_then(|v| v.parse().ok()).unwrap_or(1);
    let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
    let mut rng = Rng::new(1);
    for (n, k) in [(576usize, 576usize), (1536, 576), (576, 1536), (8192, 576)] {
        let w = rng.activations(n * k);
        for m in [1usize, 2, 4, 64] {
            let x = rng.activations(m * k);
            let mut y = vec![0f32; m * n];
            pool.install(|| {
                let ours = min_time(|| loupe_tensor::matmul::matmul_f32(&x, &w, &mut y, m, k, n).unwrap(), 30);
                let g = min_time(|| unsafe {
                    gemm::gemm(m, n, k, y.as_mut_ptr(), 1, n as isize, false, x.as_ptr(), 1, k as isize, w.as_ptr(), k as isize, 1, 0.0f32, 1.0f32, false, false, false,
                        if threads > 1 { gemm::Parallelism::Rayon(threads) } else { gemm::Parallelism::None })
                }, 30);
                let gb = |us: f64| (4 * n * k) as f64 / us / 1e3;
                eprintln!("f32 {n}x{k} m={m} T={threads}: matmul_f32 {ours:8.1} us ({:6.2} GB/s) | gemm {g:8.1} us ({:6.2} GB/s)", gb(ours), gb(g));
            });
        }
    }
}

#[test]
#[ignore]
fn lm_head() {
    let threads: usize = std::env::var("T").ok().and_then(|v| v.parse().ok()).unwrap_or(1);
    let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
    let mut rng = Rng::new(1);
    let n: usize = std::env::var("N").ok().and_then(|v| v.parse().ok()).unwrap_or(49152);
    let k = 576usize;
    for ty in [GgmlType::Q8_0, GgmlType::Q4_1] {
        let data: Vec<u8> = (0..n).flat_map(|_| random_row(&mut rng, ty, k)).collect();
        let w = QMatrix::new(ty, n, k, data).unwrap();
        let x = rng.activations(k);
        let mut y = vec![0f32; n];
        let mut s = Vec::new();
        pool.install(|| {
            for rep in 0..3 {
                for isa in [Isa::Avx512, Isa::Avx2] {
                    let t = min_time(|| matmul_q_with(isa, &x, &w, &mut y, 1, &mut s).unwrap(), 10);
                    eprintln!("{ty} lm_head m=1 T={threads} rep{rep} {isa}: {t:8.1} us ({:.2} GB/s)", w.data.len() as f64 / t / 1e3);
                }
            }
        });
    }
}
