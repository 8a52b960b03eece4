use super::*;
use crate::linear::panel_tasks::{line_bytes, Line};
use crate::testing::{activations, quant_matrix as matrix};

const TYPES: [GgmlType; 4] = [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q8_0];

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// The SIMD kernel gives the scalar reference's bits on every ISA that runs it: panels short
/// of 16 rows, row counts past and under a tile, one block and several.
#[test]
fn simd_panels_give_the_reference_bits() {
    for (ty, n, k) in TYPES.iter().flat_map(|&t| [(t, 37, 32), (t, 16, 576), (t, 5, 96), (t, 48, 896)]) {
        let (w, _) = matrix(ty, n, k, 7 + n as u32);
        for m in [1, 2, 7, 8, 9, 17] {
            let x = activations(m * k, 11 + m as u32);
            let mut want = vec![f32::NAN; m * n];
            matmul_wq_prompt_scalar(&x, &w, &mut want, m).unwrap();
            assert!(want.iter().all(|v| v.is_finite()), "{ty} reference not finite at n {n} k {k} m {m}");
            for isa in Isa::available().into_iter().filter(|&i| has_act16_panels(i, ty)) {
                let mut y = vec![f32::NAN; m * n];
                matmul_wq_prompt_with(isa, &x, &w, &mut y, m).unwrap();
                assert_eq!(bits(&y), bits(&want), "{ty} at {isa}: n {n} k {k} m {m} differs from the reference");
            }
        }
    }
}

/// The AVX-512 packer writes the reference packer's bytes, full and short panels.
#[test]
fn simd_packing_gives_the_reference_bytes() {
    let (n, k) = (21, 96);
    for ty in TYPES {
        let (w, _) = matrix(ty, n, k, 13);
        for isa in Isa::available().into_iter().filter(|&i| has_act16_panels(i, ty)) {
            for (j0, cols) in [(0, 16), (16, 5), (3, 1)] {
                let bytes = k / 32 * RECORD_BYTES;
                let (mut want, mut got) = (vec![0xAAu8; bytes], vec![Line([0x55; 64]); bytes / 64]);
                pack::pack(Isa::Scalar, true, &w, j0, cols, &mut want);
                let got = line_bytes(&mut got);
                pack::pack(isa, false, &w, j0, cols, got);
                assert!(got == want.as_slice(), "{ty} at {isa}: panel at row {j0} of {cols} rows differs");
            }
        }
    }
}

/// A row's outputs do not depend on the rows beside it, nor on the thread count.
#[test]
fn a_rows_bits_do_not_depend_on_its_batch() {
    let (n, k, m) = (70, 576, 29);
    for ty in TYPES {
        let (w, _) = matrix(ty, n, k, 3);
        let x = activations(m * k, 5);
        let mut all = vec![0f32; m * n];
        matmul_wq_prompt(&x, &w, &mut all, m).unwrap();
        let mut serial = vec![0f32; m * n];
        crate::pool::run_serially(|| matmul_wq_prompt(&x, &w, &mut serial, m)).unwrap();
        assert_eq!(bits(&all), bits(&serial));
        for i in [0, 7, 8, 28] {
            let mut one = vec![0f32; n];
            matmul_wq_prompt(&x[i * k..(i + 1) * k], &w, &mut one, 1).unwrap();
            assert_eq!(
                bits(&one),
                bits(&all[i * n..(i + 1) * n]),
                "{ty}: row {i} alone differs from row {i} among {m}"
            );
        }
    }
}

/// The panels compute the dequantized product to the 16-bit activation codes' rounding.
#[test]
fn outputs_are_the_dequantized_product() {
    let (n, k, m) = (33, 1024, 4);
    for ty in TYPES {
        let (w, deq) = matrix(ty, n, k, 9);
        let x = activations(m * k, 2);
        let mut y = vec![0f32; m * n];
        matmul_wq_prompt_scalar(&x, &w, &mut y, m).unwrap();
        for i in 0..m {
            for j in 0..n {
                let pairs = || deq[j * k..(j + 1) * k].iter().zip(&x[i * k..(i + 1) * k]);
                let exact: f64 = pairs().map(|(&a, &b)| a as f64 * b as f64).sum();
                let scale: f64 = pairs().map(|(&a, &b)| (a as f64 * b as f64).abs()).sum();
                let got = y[i * n + j] as f64;
                assert!((got - exact).abs() <= 1e-4 * scale, "{ty} ({i}, {j}): {got} vs {exact}");
            }
        }
    }
}

/// Types and ISAs without panels take the f32 chains, their bits.
#[test]
fn other_types_and_isas_take_the_chains() {
    let (n, k, m) = (9, 256, 3);
    for (ty, isa) in [(GgmlType::Q6K, Isa::active()), (GgmlType::Q4_1, Isa::Avx2), (GgmlType::Q8_0, Isa::Scalar)] {
        if !isa.is_supported() {
            continue;
        }
        let (w, _) = matrix(ty, n, k, 4);
        let x = activations(m * k, 8);
        let (mut a, mut b) = (vec![0f32; m * n], vec![0f32; m * n]);
        matmul_wq_prompt_with(isa, &x, &w, &mut a, m).unwrap();
        crate::linear::matmul_wq_chain_with(isa, &x, &w, &mut b, m).unwrap();
        assert_eq!(bits(&a), bits(&b), "{ty} at {isa}");
    }
}

#[test]
fn mismatched_shapes_are_errors() {
    let (w, _) = matrix(GgmlType::Q8_0, 4, 64, 1);
    let mut y = vec![0f32; 8];
    assert!(matmul_wq_prompt(&[0.0; 100], &w, &mut y, 2).is_err());
    assert!(matmul_wq_prompt(&[0.0; 128], &w, &mut y[..7], 2).is_err());
    assert!(matmul_wq_prompt_scalar(&[0.0; 100], &w, &mut y, 2).is_err());
    assert!(matmul_wq_prompt(&[], &w, &mut [], 0).is_ok());
    let (q6, _) = matrix(GgmlType::Q6K, 4, 256, 1);
    assert!(matmul_wq_prompt_scalar(&[0.0; 512], &q6, &mut [0.0; 8], 2).is_err());
}
