use super::*;
use crate::testing::{quant_matrix as matrix, signed};
use loupe_core::GgmlType;

const TYPES: [GgmlType; 8] = [
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q8_0,
    GgmlType::Q4K,
    GgmlType::Q5K,
    GgmlType::Q6K,
    GgmlType::F16,
];

/// Every output is the FMA chain of its row and weight row, written out here, on every ISA
/// this CPU has; a last panel of 5 rows and row counts past and under a tile.
#[test]
fn every_isa_gives_each_output_its_chain_bits() {
    for (ty, k) in
        TYPES.iter().map(|&t| (t, 512)).chain([(GgmlType::Q5_0, 288), (GgmlType::Q8_0, 800), (GgmlType::Q8_0, 2080)])
    {
        // 288 and 800: one pass shorter than DEPTH; 2080: two passes of DEPTH and a 32-long
        // one, whose chains go on from the partial sums left in y.
        let n = 37;
        let (w, deq) = matrix(ty, n, k, 7);
        for m in [1, 5, 6, 12, 13, 31] {
            let x = signed(m * k, 11 + m as u32);
            let mut want = vec![0f32; m * n];
            for i in 0..m {
                for j in 0..n {
                    let mut acc = 0f32;
                    for kk in 0..k {
                        acc = deq[j * k + kk].mul_add(x[i * k + kk], acc);
                    }
                    want[i * n + j] = acc;
                }
            }
            for isa in Isa::available() {
                let mut y = vec![f32::NAN; m * n];
                matmul_wq_chain_with(isa, &x, &w, &mut y, m).unwrap();
                let same = y.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "{ty} on {isa}, {m} rows: outputs differ from their chains");
            }
        }
    }
}

/// A row's outputs do not depend on the rows beside it, nor on the thread count.
#[test]
fn a_rows_bits_do_not_depend_on_its_batch() {
    let (n, k, m) = (70, 256, 29);
    let (w, _) = matrix(GgmlType::Q5_0, n, k, 3);
    let x = signed(m * k, 5);
    let mut all = vec![0f32; m * n];
    matmul_wq_chain(&x, &w, &mut all, m).unwrap();
    let mut serial = vec![0f32; m * n];
    crate::pool::run_serially(|| matmul_wq_chain(&x, &w, &mut serial, m)).unwrap();
    assert_eq!(
        all.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
        serial.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
    );
    for i in [0, 11, 12, 28] {
        let mut one = vec![0f32; n];
        matmul_wq_chain(&x[i * k..(i + 1) * k], &w, &mut one, 1).unwrap();
        let same = one.iter().zip(&all[i * n..(i + 1) * n]).all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(same, "row {i} alone differs from row {i} among {m}");
    }
}

/// Close to the f64 product of the dequantized weights (the chain is f32's rounding only).
#[test]
fn outputs_are_the_dequantized_product() {
    let (n, k, m) = (16, 1024, 3);
    let (w, deq) = matrix(GgmlType::Q4K, n, k, 9);
    let x = signed(m * k, 2);
    let mut y = vec![0f32; m * n];
    matmul_wq_chain(&x, &w, &mut y, m).unwrap();
    for i in 0..m {
        for j in 0..n {
            let exact: f64 = (0..k).map(|kk| deq[j * k + kk] as f64 * x[i * k + kk] as f64).sum();
            let scale: f64 = (0..k).map(|kk| (deq[j * k + kk] as f64 * x[i * k + kk] as f64).abs()).sum();
            assert!((y[i * n + j] as f64 - exact).abs() <= 1e-5 * scale, "({i}, {j}): {} vs {exact}", y[i * n + j]);
        }
    }
}

#[test]
fn mismatched_shapes_are_errors() {
    let (w, _) = matrix(GgmlType::Q8_0, 4, 64, 1);
    let mut y = vec![0f32; 8];
    assert!(matmul_wq_chain(&[0.0; 100], &w, &mut y, 2).is_err());
    assert!(matmul_wq_chain(&[0.0; 128], &w, &mut y[..7], 2).is_err());
    assert!(matmul_wq_chain(&[], &w, &mut [], 0).is_ok());
}
