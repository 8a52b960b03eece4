//! Kernel benchmarks at SmolLM2-135M shapes (hidden 576, FFN 1536, vocab 49152).
//!
//! Groups: `vec_dot/<type>/k<k>/<isa>` (one row dot, bytes = weight row),
//! `matmul_wq/<type>/<n>x<k>/m<m>` (GGML weights x f32 activations, `--precision native`),
//! `matmul_q/<type>/<n>x<k>/m<m>` (8-bit activations, `--precision q8`) and
//! `invariant/<matmul_wq_invariant|matmul_wq|matmul_q>/<type>/<n>x<k>/m<m>` (continuous-batching
//! decode at 1, 8, 32 sequences, multiply-adds), `matmul_f32/<n>x<k>/m<m>` (bytes = weight matrix for m = 1, so criterion's GB/s is the
//! decode bandwidth; multiply-adds for m > 1), `gemm_m1/<n>x<k>` (the gemm crate on a
//! single row, the alternative the m = 1 GEMV in `matmul_f32` was chosen over), and the
//! f32 ops of a layer: `rms_norm/t<tokens>`, `rope/<q|k>/t<tokens>`,
//! `attention/t<tokens>/ctx<ctx>` (decode: t1; prefill: t = ctx).
//!
//! Threads: the kernels run on loupe-tensor's compute pool, started here with
//! `LOUPE_BENCH_THREADS` threads (default: all cores); the figures are for 2 threads:
//! `LOUPE_BENCH_THREADS=2 cargo bench ...`. The `gemm_m1` comparison runs on a rayon pool of
//! the same size.
//! Defaults are short (10 samples, 1 s each); `--sample-size`, `--measurement-time` raise them.
//!
//! The kernels are called from the bench thread, which takes part in each pool job as the
//! executor's thread does in a forward pass.
//!
//! Filter by name: `cargo bench -p loupe-tensor --bench kernels -- 'q4_1'`;
//! a quick check that everything runs: `cargo bench -p loupe-tensor --bench kernels -- --quick`.

#[path = "../tests/common/mod.rs"]
mod common;

use std::hint::black_box;
use std::time::{Duration, Instant};

use common::{random_act, random_row, Rng};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use loupe_tensor::linear::{matmul_f32, matmul_q, QMatrix};
use loupe_tensor::linear::{matmul_wq, matmul_wq_invariant};
use loupe_tensor::ops::{causal_attention, rms_norm, AttentionShape, RopeScaling, RopeTable};
use loupe_tensor::quant::{self, Isa};
use loupe_tensor::GgmlType;

/// SmolLM2 linear shapes as (n = out features, k = in features).
const SHAPES: [(usize, usize); 4] = [(576, 576), (1536, 576), (576, 1536), (49152, 576)];

fn vec_dot(c: &mut Criterion) {
    let mut rng = Rng::new(1);
    let mut g = c.benchmark_group("vec_dot");
    for ty in [GgmlType::Q4_1, GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q4K, GgmlType::Q6K] {
        for k in [576usize, 1536] {
            if k % ty.block_size() != 0 {
                continue;
            }
            let w = random_row(&mut rng, ty, k);
            let (_, a) = random_act(&mut rng, ty, k);
            g.throughput(Throughput::Bytes(w.len() as u64));
            for isa in Isa::available() {
                let dot = quant::vec_dot_fn(isa, ty);
                g.bench_function(format!("{ty}/k{k}/{isa}"), |b| b.iter(|| dot(black_box(&w), black_box(&a), k)));
            }
        }
    }
    g.finish();
}

/// Compute threads for the benches: `LOUPE_BENCH_THREADS`, else every core. Starts
/// loupe-tensor's global pool with that many threads (once).
fn bench_threads() -> usize {
    let threads = std::env::var("LOUPE_BENCH_THREADS")
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
        .filter(|&n| n > 0)
        .unwrap_or_else(|| std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1));
    loupe_tensor::pool::init_global(threads).expect("start the compute pool");
    threads
}

/// Times `iters` calls of `f` on a worker thread of a rayon `pool` (for the gemm crate,
/// whose parallelism is rayon's).
fn in_pool(pool: &rayon::ThreadPool, iters: u64, mut f: impl FnMut() + Send) -> Duration {
    pool.install(|| {
        let t = Instant::now();
        for _ in 0..iters {
            f();
        }
        t.elapsed()
    })
}

fn matrix(rng: &mut Rng, ty: GgmlType, n: usize, k: usize) -> QMatrix {
    let data: Vec<u8> = (0..n).flat_map(|_| random_row(rng, ty, k)).collect();
    QMatrix::new(ty, n, k, data).unwrap()
}

fn matmul_quantized(c: &mut Criterion) {
    let mut rng = Rng::new(2);
    bench_threads();
    let mut g = c.benchmark_group("matmul_q");
    for ty in [GgmlType::Q4_1, GgmlType::Q8_0] {
        for (n, k) in SHAPES {
            let w = matrix(&mut rng, ty, n, k);
            for m in [1usize, 64] {
                let x = rng.activations(m * k);
                let mut y = vec![0f32; m * n];
                let mut scratch = Vec::new();
                g.throughput(if m == 1 {
                    Throughput::Bytes(w.data.len() as u64)
                } else {
                    Throughput::Elements((m * n * k) as u64)
                });
                g.bench_function(format!("{ty}/{n}x{k}/m{m}"), |b| {
                    b.iter(|| matmul_q(black_box(&x), &w, &mut y, m, &mut scratch).unwrap())
                });
            }
        }
    }
    g.finish();
}

fn matmul_dense(c: &mut Criterion) {
    let mut rng = Rng::new(3);
    let threads = bench_threads();
    let mut g = c.benchmark_group("matmul_f32");
    for (n, k) in SHAPES {
        let w: Vec<f32> = rng.activations(n * k);
        for m in [1usize, 64] {
            let x = rng.activations(m * k);
            let mut y = vec![0f32; m * n];
            g.throughput(if m == 1 {
                Throughput::Bytes((4 * n * k) as u64)
            } else {
                Throughput::Elements((m * n * k) as u64)
            });
            g.bench_function(format!("{n}x{k}/m{m}"), |b| {
                b.iter(|| matmul_f32(black_box(&x), &w, &mut y, m, k, n).unwrap())
            });
        }
    }
    g.finish();

    // The alternative for m = 1: the gemm crate with the same strides as matmul_f32.
    let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
    let mut g = c.benchmark_group("gemm_m1");
    for (n, k) in SHAPES {
        let w: Vec<f32> = rng.activations(n * k);
        let x = rng.activations(k);
        let mut y = vec![0f32; n];
        g.throughput(Throughput::Bytes((4 * n * k) as u64));
        let yp = SendPtr(y.as_mut_ptr());
        g.bench_function(format!("{n}x{k}"), |b| {
            b.iter_custom(|iters| {
                in_pool(&pool, iters, || unsafe {
                    gemm::gemm(
                        1,
                        n,
                        k,
                        yp.get(),
                        1,
                        n as isize,
                        false,
                        x.as_ptr(),
                        1,
                        k as isize,
                        w.as_ptr(),
                        k as isize,
                        1,
                        0.0f32,
                        1.0f32,
                        false,
                        false,
                        false,
                        gemm::Parallelism::Rayon(rayon::current_num_threads()),
                    )
                })
            })
        });
    }
    g.finish();
}

/// `y`'s pointer for the gemm closure (which must be `Send`); only this thread
/// and gemm's own tasks touch `y`.
#[derive(Clone, Copy)]
struct SendPtr(*mut f32);
unsafe impl Send for SendPtr {}
unsafe impl Sync for SendPtr {}
impl SendPtr {
    fn get(self) -> *mut f32 {
        self.0
    }
}

/// `matmul_wq` (the `--precision native` path) at decode (m = 1) and prefill (m = 64, 512)
/// shapes. The lm_head (49152 x 576) is timed at m = 1 only: a forward pass computes the
/// logits of its last token alone, in prefill too.
fn matmul_weight_quantized(c: &mut Criterion) {
    let mut rng = Rng::new(4);
    bench_threads();
    let mut g = c.benchmark_group("matmul_wq");
    for ty in [GgmlType::Q4_1, GgmlType::Q8_0] {
        for (n, k) in SHAPES {
            let w = matrix(&mut rng, ty, n, k);
            let batch_sizes: &[usize] = if n == 49152 { &[1] } else { &[1, 64, 512] };
            for &m in batch_sizes {
                let x = rng.activations(m * k);
                let mut y = vec![0f32; m * n];
                g.throughput(if m == 1 {
                    Throughput::Bytes(w.data.len() as u64)
                } else {
                    Throughput::Elements((m * n * k) as u64)
                });
                g.bench_function(format!("{ty}/{n}x{k}/m{m}"), |b| {
                    b.iter(|| matmul_wq(black_box(&x), &w, &mut y, m).unwrap())
                });
            }
        }
    }
    // K-quants at the Qwen2.5-0.5B FFN-down shape: k = 4864 is 19 super-blocks (SmolLM2's
    // 576 and Qwen's 896 are not multiples of 256, so those tensors are never K-quants).
    for ty in [GgmlType::Q4K, GgmlType::Q6K] {
        let (n, k) = (896, 4864);
        let w = matrix(&mut rng, ty, n, k);
        for m in [1usize, 64] {
            let x = rng.activations(m * k);
            let mut y = vec![0f32; m * n];
            g.throughput(if m == 1 {
                Throughput::Bytes(w.data.len() as u64)
            } else {
                Throughput::Elements((m * n * k) as u64)
            });
            g.bench_function(format!("{ty}/{n}x{k}/m{m}"), |b| {
                b.iter(|| matmul_wq(black_box(&x), &w, &mut y, m).unwrap())
            });
        }
    }
    // Q5_0, most of Qwen2.5-Coder-0.5B's matrices: the FFN up/gate (4864 x 896) and down
    // (896 x 4864) shapes at decode.
    for (n, k) in [(896, 4864), (4864, 896)] {
        let ty = GgmlType::Q5_0;
        let w = matrix(&mut rng, ty, n, k);
        let x = rng.activations(k);
        let mut y = vec![0f32; n];
        g.throughput(Throughput::Bytes(w.data.len() as u64));
        g.bench_function(format!("{ty}/{n}x{k}/m1"), |b| b.iter(|| matmul_wq(black_box(&x), &w, &mut y, 1).unwrap()));
    }
    g.finish();
}

/// Continuous-batching decode: the batch-invariant `matmul_wq_invariant` at `m` = 1, 8, 32
/// concurrent sequences, next to `matmul_wq` (not invariant for m > 1: dequantized tiles
/// and gemm) and `matmul_q` (llama.cpp-style 8-bit activations) on the same weights.
/// Throughput is multiply-adds (`m * n * k`). Names: `invariant/<fn>/<type>/<n>x<k>/m<m>`.
fn matmul_batch_invariant(c: &mut Criterion) {
    let mut rng = Rng::new(6);
    bench_threads();
    let mut g = c.benchmark_group("invariant");
    for (ty, n, k) in [
        (GgmlType::Q4_1, 1536, 576),
        (GgmlType::Q4_1, 576, 1536),
        (GgmlType::Q4_1, 576, 576),
        (GgmlType::Q8_0, 49152, 576),
        // An f16 target's MLP at Qwen2.5-0.5B's width (speculative verification: 5 rows).
        (GgmlType::F16, 4864, 896),
    ] {
        let w = matrix(&mut rng, ty, n, k);
        let ms: &[usize] = if ty == GgmlType::F16 { &[1, 5, 8] } else { &[1, 8, 32] };
        for &m in ms {
            let x = rng.activations(m * k);
            let mut y = vec![0f32; m * n];
            let mut scratch = Vec::new();
            g.throughput(Throughput::Elements((m * n * k) as u64));
            g.bench_function(format!("matmul_wq_invariant/{ty}/{n}x{k}/m{m}"), |b| {
                b.iter(|| matmul_wq_invariant(black_box(&x), &w, &mut y, m).unwrap())
            });
            g.bench_function(format!("matmul_wq/{ty}/{n}x{k}/m{m}"), |b| {
                b.iter(|| matmul_wq(black_box(&x), &w, &mut y, m).unwrap())
            });
            g.bench_function(format!("matmul_q/{ty}/{n}x{k}/m{m}"), |b| {
                b.iter(|| matmul_q(black_box(&x), &w, &mut y, m, &mut scratch).unwrap())
            });
        }
    }
    g.finish();
}

/// SmolLM2-135M attention geometry: 9 query heads, 3 kv heads, head_dim 64, theta 1e5.
const N_HEADS: usize = 9;
const N_KV_HEADS: usize = 3;
const HEAD_DIM: usize = 64;
const HIDDEN: usize = N_HEADS * HEAD_DIM;

fn layer_ops(c: &mut Criterion) {
    let mut rng = Rng::new(5);
    bench_threads();

    let mut g = c.benchmark_group("rms_norm");
    let weight = rng.activations(HIDDEN);
    for tokens in [1usize, 512] {
        let x = rng.activations(tokens * HIDDEN);
        let mut out = vec![0f32; tokens * HIDDEN];
        g.throughput(Throughput::Bytes((4 * tokens * HIDDEN) as u64));
        g.bench_function(format!("t{tokens}"), |b| {
            b.iter(|| rms_norm(black_box(&x), &weight, 1e-5, &mut out).unwrap())
        });
    }
    g.finish();

    let mut g = c.benchmark_group("rope");
    let table = RopeTable::new(HEAD_DIM, 100_000.0, &RopeScaling::None).unwrap();
    for tokens in [1usize, 512] {
        for (label, heads) in [("q", N_HEADS), ("k", N_KV_HEADS)] {
            // Rotating the same buffer again and again keeps its norm: no drift to inf/NaN.
            let mut x = rng.activations(tokens * heads * HEAD_DIM);
            g.throughput(Throughput::Elements((tokens * heads * HEAD_DIM) as u64));
            g.bench_function(format!("{label}/t{tokens}"), |b| {
                b.iter(|| table.apply(black_box(&mut x), heads, 100).unwrap())
            });
        }
    }
    g.finish();

    let mut g = c.benchmark_group("attention");
    let shape = AttentionShape::new(N_HEADS, N_KV_HEADS, HEAD_DIM, (HEAD_DIM as f32).powf(-0.5));
    // Decode after a 128- and a 512-token context; prefill of 64 and 512 tokens.
    for (tokens, ctx) in [(1usize, 128usize), (1, 512), (64, 64), (512, 512)] {
        let q = rng.activations(tokens * HIDDEN);
        let k = rng.activations(ctx * N_KV_HEADS * HEAD_DIM);
        let v = rng.activations(ctx * N_KV_HEADS * HEAD_DIM);
        let mut out = vec![0f32; tokens * HIDDEN];
        g.throughput(Throughput::Elements(tokens as u64));
        g.bench_function(format!("t{tokens}/ctx{ctx}"), |b| {
            b.iter(|| causal_attention(shape, black_box(&q), &k, &v, ctx, &mut out, None).unwrap())
        });
    }
    g.finish();
}

criterion_group! {
    name = benches;
    // Short by default (a few seconds per group); raise with --sample-size / --measurement-time.
    config = Criterion::default().sample_size(10).warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(1));
    targets = vec_dot, matmul_weight_quantized, matmul_quantized, matmul_dense, matmul_batch_invariant, layer_ops
}
criterion_main!(benches);
