//! matmul_f32 against a naive f64 product; matmul_q against per-element
//! `vec_dot` (exact: same kernel, so any difference is a tiling/indexing bug) and
//! against dequantize + matmul_f32 (an error bound per type).

mod common;

use common::*;
use loupe_tensor::linear::{matmul_f32, matmul_q, matmul_q_with, QMatrix};
use loupe_tensor::quant::{self, vec_dot_type, Isa};
use loupe_tensor::GgmlType;

fn naive(x: &[f32], w: &[f32], m: usize, k: usize, n: usize) -> (Vec<f64>, Vec<f64>) {
    let mut y = vec![0f64; m * n];
    let mut mag = vec![0f64; m * n];
    for i in 0..m {
        for j in 0..n {
            for p in 0..k {
                let t = x[i * k + p] as f64 * w[j * k + p] as f64;
                y[i * n + j] += t;
                mag[i * n + j] += t.abs();
            }
        }
    }
    (y, mag)
}

#[test]
fn matmul_f32_matches_f64() {
    let mut rng = Rng::new(10);
    loupe_tensor::pool::init_global(2).unwrap();
    for &(m, k, n) in &[
        (1, 1, 1),
        (1, 7, 5),
        (1, 576, 130),
        (1, 100, 1000),
        (2, 64, 33),
        (3, 17, 9),
        (17, 576, 70),
        (64, 64, 64),
        (33, 130, 257),
    ] {
        let x = rng.activations(m * k);
        let w: Vec<f32> = rng.activations(n * k).iter().map(|v| v * 0.05).collect();
        let (want, mag) = naive(&x, &w, m, k, n);
        for pooled in [false, true] {
            let mut y = vec![f32::NAN; m * n];
            let mut run = || matmul_f32(&x, &w, &mut y, m, k, n).unwrap();
            if pooled {
                run();
            } else {
                loupe_tensor::pool::run_serially(run);
            }
            for i in 0..m * n {
                let err = (y[i] as f64 - want[i]).abs();
                // f32 accumulation: a few ulps of the sum of magnitudes.
                assert!(
                    err <= 2e-6 * mag[i] + 1e-30,
                    "m={m} k={k} n={n} pooled={pooled} [{i}]: {} vs {}",
                    y[i],
                    want[i]
                );
            }
        }
    }
}

#[test]
fn matmul_f32_rejects_bad_shapes_and_handles_empty() {
    let mut y = vec![0f32; 6];
    assert!(matmul_f32(&[0.0; 6], &[0.0; 9], &mut y, 2, 3, 3).is_ok());
    assert!(matmul_f32(&[0.0; 5], &[0.0; 9], &mut y, 2, 3, 3).is_err());
    assert!(matmul_f32(&[0.0; 6], &[0.0; 9], &mut y[..5], 2, 3, 3).is_err());
    let mut y = vec![1f32; 4];
    matmul_f32(&[], &[], &mut y, 2, 0, 2).unwrap();
    assert_eq!(y, [0.0; 4]);
}

fn random_matrix(rng: &mut Rng, ty: GgmlType, rows: usize, cols: usize) -> QMatrix {
    let data: Vec<u8> = (0..rows).flat_map(|_| random_row(rng, ty, cols)).collect();
    QMatrix::new(ty, rows, cols, data).unwrap()
}

/// Every output against the f64 dot of its dequantized weight and activation
/// rows, on every ISA: catches tiling and indexing slips (which are never small)
/// as well as kernel errors. Shapes cover partial tiles in both directions and an
/// odd block count (the one-block tail).
#[test]
fn matmul_q_every_output_on_every_isa() {
    let mut rng = Rng::new(11);
    loupe_tensor::pool::init_global(2).unwrap();
    for ty in all_types() {
        for k in match ty.block_size() {
            256 => [256, 512],
            32 => [64, 96],
            64 => [64, 192], // NVFP4
            _ => [70, 96],   // float types: a masked tail of 6
        } {
            for &(m, n) in &[(1, 1), (1, 300), (2, 7), (5, 130), (40, 517)] {
                let w = random_matrix(&mut rng, ty, n, k);
                let x = rng.activations(m * k);
                let aty = vec_dot_type(ty);
                let mut act = vec![0u8; aty.bytes_for(k as u64).unwrap() as usize];
                let mut want = vec![(0f64, 0f64); m * n];
                for i in 0..m {
                    quant::quantize_row(aty, &x[i * k..(i + 1) * k], &mut act).unwrap();
                    for j in 0..n {
                        want[i * n + j] = reference(ty, w.row(j), &act, k);
                    }
                }
                // On the 2-thread pool products above a few microseconds of work are
                // split over tasks, so the parallel paths are exercised too.
                for (isa, pooled) in Isa::available().into_iter().flat_map(|i| [(i, false), (i, true)]) {
                    let mut y = vec![f32::NAN; m * n];
                    let mut run = || matmul_q_with(isa, &x, &w, &mut y, m, &mut Vec::new()).unwrap();
                    if pooled {
                        run();
                    } else {
                        loupe_tensor::pool::run_serially(run);
                    }
                    for (idx, (&got, &(exact, mag))) in y.iter().zip(&want).enumerate() {
                        assert!(
                            (got as f64 - exact).abs() <= 1e-5 * mag + 1e-30,
                            "{ty} k={k} m={m} n={n} {isa} pooled={pooled}: y[{}, {}] = {got}, f64 reference {exact}",
                            idx / n,
                            idx % n
                        );
                    }
                }
            }
        }
    }
}

/// Against the f32 product of the dequantized weights: the only extra error is
/// the activation quantization (none for float weights).
#[test]
fn matmul_q_close_to_dequantized_f32() {
    let mut rng = Rng::new(12);
    for ty in all_types() {
        let (m, k, n) = (9, 512, 200);
        let w = random_matrix(&mut rng, ty, n, k);
        let wf = w.dequantize();
        let x = rng.activations(m * k);
        let mut y = vec![0f32; m * n];
        let mut y_ref = vec![0f32; m * n];
        matmul_q(&x, &w, &mut y, m, &mut Vec::new()).unwrap();
        matmul_f32(&x, &wf, &mut y_ref, m, k, n).unwrap();
        let err: f64 = y.iter().zip(&y_ref).map(|(a, b)| ((a - b) as f64).powi(2)).sum();
        let sig: f64 = y_ref.iter().map(|b| (*b as f64).powi(2)).sum();
        let nmse = err / sig;
        let limit = match vec_dot_type(ty) {
            GgmlType::F32 => 1e-10,
            _ => 1e-3, // 8-bit activations
        };
        assert!(nmse <= limit, "{ty}: NMSE {nmse:e} > {limit:e}");
    }
}

#[test]
fn matmul_q_reuses_scratch() {
    let mut rng = Rng::new(13);
    let (m, k, n) = (8, 256, 64);
    let w = random_matrix(&mut rng, GgmlType::Q4_1, n, k);
    let x = rng.activations(m * k);
    let mut y = vec![0f32; m * n];
    let mut scratch = Vec::new();
    matmul_q(&x, &w, &mut y, m, &mut scratch).unwrap();
    let (ptr, cap) = (scratch.as_ptr(), scratch.capacity());
    matmul_q(&x[..k], &w, &mut y[..n], 1, &mut scratch).unwrap();
    matmul_q(&x, &w, &mut y, m, &mut scratch).unwrap();
    assert_eq!((scratch.as_ptr(), scratch.capacity()), (ptr, cap), "scratch was reallocated");
}

#[test]
fn qmatrix_validates() {
    assert!(QMatrix::new(GgmlType::Q4_1, 2, 64, vec![0; 80]).is_ok());
    let e = QMatrix::new(GgmlType::Q4_1, 2, 64, vec![0; 79]).unwrap_err();
    assert!(e.to_string().contains("expected 80"), "{e}");
    assert!(QMatrix::new(GgmlType::Q4_1, 2, 48, vec![0; 60]).is_err());
    let w = QMatrix::new(GgmlType::Q4_1, 2, 64, (0..80).collect::<Vec<u8>>()).unwrap();
    assert_eq!(w.row(1), &(40..80).collect::<Vec<u8>>()[..]);
    let mut y = vec![0f32; 3];
    assert!(matmul_q(&[0.0; 64], &w, &mut y, 1, &mut Vec::new()).is_err());
}

#[test]
fn qmatrix_quantize_round_trip() {
    let mut rng = Rng::new(14);
    let src = rng.activations(4 * 64);
    let w = QMatrix::quantize(GgmlType::Q8_0, 4, 64, &src).unwrap();
    for (a, b) in src.iter().zip(w.dequantize()) {
        assert!((a - b).abs() < 0.05, "{a} vs {b}");
    }
}
