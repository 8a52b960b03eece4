use super::*;
use crate::linear::decode::dot_row_act16;
use crate::linear::prefill::matmul_wq;
use crate::testing::{quant_matrix as matrix, signed};

/// Activations with a spread of magnitudes across rows and blocks (and an all-zero
/// row), so block scales differ and the offset terms matter.
fn acts(m: usize, k: usize, seed: u32) -> Vec<f32> {
    let mut x = signed(m * k, seed);
    for (i, row) in x.chunks_mut(k).enumerate() {
        let s = [1.0, 0.01, 30.0, 0.5, 0.0][i % 5];
        for (c, v) in row.iter_mut().enumerate() {
            *v *= s * (1.0 + (c / 32 % 3) as f32);
        }
    }
    x
}

const MS: [usize; 13] = [1, 2, 3, 4, 5, 7, 8, 9, 10, 11, 13, 32, 33];

/// (type, n, k) cases: odd block counts (the even/odd accumulator tail), SmolLM2's
/// widths, a K type, f32 with k not a multiple of the vector width, and a Q4_1 row
/// too long for the stack path.
fn cases() -> Vec<(GgmlType, usize, usize)> {
    vec![
        (GgmlType::Q4_1, 37, 96),
        (GgmlType::Q4_1, 19, 576),
        // More weight rows than a chunk of the few-rows GEMV path (GEMV_CHUNK_ROWS).
        (GgmlType::Q4_1, 150, 64),
        (GgmlType::Q8_0, 37, 96),
        (GgmlType::Q8_0, 19, 576),
        (GgmlType::Q5_0, 37, 96),
        (GgmlType::Q5_0, 19, 896),
        (GgmlType::Q6K, 9, 512),
        (GgmlType::Q6K, 6, 256),
        (GgmlType::Q6K, 7, 4864),
        (GgmlType::Q4K, 9, 512),
        (GgmlType::Q4K, 7, 4864),
        (GgmlType::Q5K, 9, 512),
        (GgmlType::Q5K, 7, 4864),
        (GgmlType::F32, 23, 100),
        (GgmlType::F32, 7, 576),
        (GgmlType::F16, 5, 64),
        (GgmlType::Q4_0, 5, 64),
        (GgmlType::Q4_0, 37, 96),
        (GgmlType::Q4_0, 19, 896),
    ]
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|f| f.to_bits()).collect()
}

#[test]
fn every_row_is_bit_identical_to_its_single_row_call() {
    for isa in Isa::available() {
        for (ty, n, k) in cases() {
            let (w, _) = matrix(ty, n, k, 3);
            for m in MS {
                let x = acts(m, k, 10 + m as u32);
                let mut y = vec![0f32; m * n];
                matmul_wq_invariant_with(isa, &x, &w, &mut y, m).unwrap();
                for i in 0..m {
                    let mut y1 = vec![0f32; n];
                    matmul_wq_invariant_with(isa, &x[i * k..(i + 1) * k], &w, &mut y1, 1).unwrap();
                    assert_eq!(bits(&y[i * n..(i + 1) * n]), bits(&y1), "{isa} {ty} {n}x{k} m={m} row {i}");
                }
            }
        }
    }
}

#[test]
fn a_row_keeps_its_bits_whatever_its_neighbours_and_position() {
    // The same request row at different positions of batches of different sizes
    // with different other rows, on the pool and serially.
    for isa in Isa::available() {
        for (ty, n, k) in [
            (GgmlType::Q4_1, 100, 576),
            (GgmlType::Q8_0, 100, 576),
            (GgmlType::Q5_0, 100, 896),
            (GgmlType::Q6K, 100, 768),
            (GgmlType::Q4K, 100, 768),
            (GgmlType::Q5K, 100, 768),
            (GgmlType::Q4_0, 100, 896),
            (GgmlType::F32, 50, 576),
        ] {
            let (w, _) = matrix(ty, n, k, 4);
            let probe = acts(1, k, 99);
            let mut want = vec![0f32; n];
            matmul_wq_invariant_with(isa, &probe, &w, &mut want, 1).unwrap();
            for (m, pos, seed) in [(2, 1, 1), (9, 4, 2), (32, 31, 3), (33, 0, 4), (17, 8, 5)] {
                let mut x = acts(m, k, seed);
                x[pos * k..(pos + 1) * k].copy_from_slice(&probe);
                let mut y = vec![0f32; m * n];
                matmul_wq_invariant_with(isa, &x, &w, &mut y, m).unwrap();
                assert_eq!(bits(&y[pos * n..(pos + 1) * n]), bits(&want), "{isa} {ty} m={m} pos={pos}");
                let mut ys = vec![0f32; m * n];
                pool::run_serially(|| matmul_wq_invariant_with(isa, &x, &w, &mut ys, m)).unwrap();
                assert_eq!(bits(&ys), bits(&y), "{isa} {ty} m={m}: serial vs pool");
            }
        }
    }
}

#[test]
fn single_row_equals_matmul_wq_and_the_decode_dot() {
    for (ty, n, k) in cases() {
        let (w, _) = matrix(ty, n, k, 5);
        let x = acts(1, k, 7);
        let (mut a, mut b) = (vec![0f32; n], vec![0f32; n]);
        matmul_wq_invariant(&x, &w, &mut a, 1).unwrap();
        matmul_wq(&x, &w, &mut b, 1).unwrap();
        assert_eq!(bits(&a), bits(&b), "{ty}");
        if matches!(
            ty,
            GgmlType::Q4_1
                | GgmlType::Q8_0
                | GgmlType::Q5_0
                | GgmlType::Q6K
                | GgmlType::Q4K
                | GgmlType::Q4_0
                | GgmlType::Q5K
        ) {
            // The single-row Act16 dot of the active ISA (today's decode kernel).
            let (mut q, mut ss) = (vec![0i16; k], vec![0f32; 2 * k / 32]);
            let act = Act16::quantize(&x, &mut q, &mut ss);
            for (j, &v) in a.iter().enumerate() {
                let d = dot_row_act16(Isa::active(), ty, w.row(j), &act).unwrap();
                assert_eq!(v.to_bits(), d.to_bits(), "{ty} row {j}");
            }
        }
    }
}

#[test]
fn every_isa_matches_scalar_and_the_f64_reference() {
    for (ty, n, k) in cases().into_iter().chain([
        (GgmlType::Q4_1, 3, 32 * (MAX_STACK_BLOCKS + 1)),
        (GgmlType::Q5_0, 3, 32 * (MAX_STACK_BLOCKS + 1)),
        (GgmlType::Q6K, 3, 256 * (MAX_STACK_BLOCKS / 8 + 1)),
        (GgmlType::Q4K, 3, 256 * (MAX_STACK_BLOCKS / 8 + 1)),
    ]) {
        let (w, deq) = matrix(ty, n, k, 6);
        for m in [1, 5, 32] {
            let x = acts(m, k, 20 + m as u32);
            let mut reference = vec![0f32; m * n];
            matmul_wq_invariant_with(Isa::Scalar, &x, &w, &mut reference, m).unwrap();
            // 16-bit activations round each to within 2^-16 of its block's largest.
            let tol = if matches!(ty, GgmlType::Q4_1 | GgmlType::Q8_0 | GgmlType::Q5_0 | GgmlType::Q6K | GgmlType::Q4K)
            {
                4e-5
            } else {
                1e-5
            };
            for i in 0..m {
                for j in 0..n {
                    let terms = (0..k).map(|c| x[i * k + c] as f64 * deq[j * k + c] as f64);
                    let exact: f64 = terms.clone().sum();
                    let mag: f64 = terms.map(f64::abs).sum();
                    let r = reference[i * n + j] as f64;
                    assert!(
                        (r - exact).abs() <= tol * mag + 1e-6,
                        "{ty} {n}x{k} m={m} ({i},{j}): scalar {r} vs exact {exact}"
                    );
                }
            }
            for isa in Isa::available() {
                let mut y = vec![0f32; m * n];
                matmul_wq_invariant_with(isa, &x, &w, &mut y, m).unwrap();
                for (e, (&a, &b)) in y.iter().zip(&reference).enumerate() {
                    let (i, j) = (e / n, e % n);
                    let mag: f32 = (0..k).map(|c| (x[i * k + c] * deq[j * k + c]).abs()).sum();
                    assert!(
                        (a - b).abs() <= 1e-5 * mag + 1e-6,
                        "{isa} {ty} {n}x{k} m={m} ({i},{j}): {a} vs scalar {b}"
                    );
                }
            }
        }
    }
}

#[test]
fn f32_invariant_is_invariant_and_accurate() {
    for isa in Isa::available() {
        for k in [1, 7, 8, 15, 16, 17, 33, 100, 576] {
            let n = 11;
            let w = signed(n * k, 1);
            for m in MS {
                let x = acts(m, k, m as u32);
                let mut y = vec![0f32; m * n];
                matmul_f32_invariant_with(isa, &x, &w, &mut y, m, k, n).unwrap();
                for i in 0..m {
                    let mut y1 = vec![0f32; n];
                    matmul_f32_invariant_with(isa, &x[i * k..(i + 1) * k], &w, &mut y1, 1, k, n).unwrap();
                    assert_eq!(bits(&y[i * n..(i + 1) * n]), bits(&y1), "{isa} k={k} m={m} row {i}");
                    for j in 0..n {
                        let terms = (0..k).map(|c| x[i * k + c] as f64 * w[j * k + c] as f64);
                        let exact: f64 = terms.clone().sum();
                        let mag: f64 = terms.map(f64::abs).sum();
                        assert!(
                            (y1[j] as f64 - exact).abs() <= 1e-6 * mag + 1e-30,
                            "{isa} k={k} ({i},{j}): {} vs {exact}",
                            y1[j]
                        );
                    }
                }
            }
        }
    }
}

/// One fork-join over q/k/v-shaped matrices (and a Q8_0 one) gives each output the bits
/// of its own decode matmul, on every ISA.
#[test]
fn a_group_equals_its_matrices_one_by_one() {
    let k = 576;
    let mats: Vec<QMatrix> = [
        (GgmlType::Q4_1, 576),
        (GgmlType::Q4_1, 192),
        (GgmlType::Q8_0, 190),
        (GgmlType::Q4_1, 5),
        (GgmlType::Q5_0, 67),
        (GgmlType::Q5_0, 576),
    ]
    .iter()
    .enumerate()
    .map(|(s, &(ty, n))| matrix(ty, n, k, 40 + s as u32).0)
    .collect();
    let x = acts(1, k, 9);
    for isa in Isa::available() {
        // The first four, then a group with Q5_0 ones mixed in.
        for group in [&mats[..4], &mats[2..]] {
            let mut outs: Vec<Vec<f32>> = group.iter().map(|w| vec![f32::NAN; w.rows]).collect();
            let ws: Vec<&QMatrix> = group.iter().collect();
            let mut ys: Vec<&mut [f32]> = outs.iter_mut().map(|v| v.as_mut_slice()).collect();
            matmul_wq_group_with(isa, &x, &ws, &mut ys).unwrap();
            for (w, got) in group.iter().zip(&outs) {
                let mut want = vec![0f32; w.rows];
                matmul_wq_invariant_with(isa, &x, w, &mut want, 1).unwrap();
                assert_eq!(bits(got), bits(&want), "{} {}x{} at {isa}", w.ty, w.rows, w.cols);
            }
        }
    }
    // Q6_K and Q4_K (whole super-blocks: k = 768) mixed with Q5_0 and Q8_0.
    let k6 = 768;
    let mats6: Vec<QMatrix> =
        [(GgmlType::Q6K, 67), (GgmlType::Q5_0, 100), (GgmlType::Q4K, 30), (GgmlType::Q6K, 256), (GgmlType::Q5K, 5)]
            .iter()
            .enumerate()
            .map(|(s, &(ty, n))| matrix(ty, n, k6, 60 + s as u32).0)
            .collect();
    let x6 = acts(1, k6, 19);
    for isa in Isa::available() {
        for group in [&mats6[..4], &mats6[1..], &mats6[..1], &mats6[4..]] {
            let mut outs: Vec<Vec<f32>> = group.iter().map(|w| vec![f32::NAN; w.rows]).collect();
            let ws: Vec<&QMatrix> = group.iter().collect();
            let mut ys: Vec<&mut [f32]> = outs.iter_mut().map(|v| v.as_mut_slice()).collect();
            matmul_wq_group_with(isa, &x6, &ws, &mut ys).unwrap();
            for (w, got) in group.iter().zip(&outs) {
                let mut want = vec![0f32; w.rows];
                matmul_wq_invariant_with(isa, &x6, w, &mut want, 1).unwrap();
                assert_eq!(bits(got), bits(&want), "{} {}x{} at {isa}", w.ty, w.rows, w.cols);
            }
        }
    }
    // Mismatched shapes are errors, not panics.
    let mut short = vec![0f32; 3];
    assert!(matmul_wq_group(&x, &[&mats[0]], &mut [short.as_mut_slice()]).is_err());
    assert!(matmul_wq_group(&x[..64], &[&mats[0]], &mut [vec![0f32; 576].as_mut_slice()]).is_err());
    assert!(matmul_wq_group(&x, &[&mats[0], &mats[1]], &mut [vec![0f32; 576].as_mut_slice()]).is_err());
    let five: Vec<&QMatrix> = std::iter::repeat_n(&mats[3], MAX_GROUP + 1).collect();
    let mut bufs = vec![vec![0f32; 5]; MAX_GROUP + 1];
    let mut ys: Vec<&mut [f32]> = bufs.iter_mut().map(|v| v.as_mut_slice()).collect();
    assert!(matmul_wq_group(&x, &five, &mut ys).is_err(), "more than MAX_GROUP matrices");
}

#[test]
fn shape_errors_are_errors() {
    let (w, _) = matrix(GgmlType::Q4_1, 4, 64, 1);
    let mut y = vec![0f32; 8];
    assert!(matmul_wq_invariant(&[0.0; 127], &w, &mut y, 2).is_err());
    assert!(matmul_wq_invariant(&[0.0; 128], &w, &mut y[..7], 2).is_err());
    assert!(matmul_wq_invariant(&[0.0; 128], &w, &mut y, usize::MAX).is_err());
    assert!(matmul_wq_invariant(&[], &w, &mut [], 0).is_ok());
    assert!(matmul_f32_invariant(&[0.0; 6], &[0.0; 6], &mut [0.0; 4], 2, 3, 2).is_ok());
    assert!(matmul_f32_invariant(&[0.0; 5], &[0.0; 6], &mut [0.0; 4], 2, 3, 2).is_err());
    assert!(matmul_f32_invariant(&[0.0; 6], &[0.0; 6], &mut [0.0; 4], 2, 3, 3).is_err());
    assert!(matmul_f32_invariant(&[0.0; 6], &[0.0; 6], &mut [0.0; 3], 2, 3, 2).is_err());
    assert!(matmul_f32_invariant(&[0.0; 6], &[0.0; 6], &mut [0.0; 4], usize::MAX, 3, 2).is_err());
}
