use super::*;
use crate::linear::matmul_q_with;
use crate::linear::panel_tasks::{line_bytes, Line};
use crate::quant::blocks::QK_K;
use crate::testing::{activations, quant_matrix as matrix};

const TYPES: [GgmlType; 3] = [GgmlType::Q4K, GgmlType::Q5K, GgmlType::Q6K];

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// The SIMD kernel gives the scalar reference's bits on every ISA that runs it: panels
/// short of 16 rows, row counts past and under a tile, one to three super-blocks.
#[test]
fn simd_panels_give_the_reference_bits() {
    for (ty, n, k) in TYPES.iter().flat_map(|&t| [(t, 37, 256), (t, 16, 512), (t, 5, 768), (t, 48, 256)]) {
        let (w, _) = matrix(ty, n, k, 7 + n as u32);
        for m in [1, 2, 5, 6, 7, 12, 13] {
            let x = activations(m * k, 11 + m as u32);
            let mut want = vec![f32::NAN; m * n];
            matmul_q_prompt_scalar(&x, &w, &mut want, m, &mut Vec::new()).unwrap();
            assert!(want.iter().all(|v| v.is_finite()), "{ty} reference not finite at n {n} k {k} m {m}");
            for isa in Isa::available().into_iter().filter(|&i| has_q8_panels(i, ty)) {
                let mut y = vec![f32::NAN; m * n];
                matmul_q_prompt_with(isa, &x, &w, &mut y, m, &mut Vec::new()).unwrap();
                assert_eq!(bits(&y), bits(&want), "{ty} at {isa}: n {n} k {k} m {m} differs from the reference");
            }
        }
    }
}

/// A row's outputs do not depend on the rows beside it, nor on the thread count (the
/// batched engine's prompt rows rely on it).
#[test]
fn a_rows_bits_do_not_depend_on_its_batch() {
    let (n, k, m) = (70, 512, 29);
    for ty in TYPES {
        let (w, _) = matrix(ty, n, k, 3);
        let x = activations(m * k, 5);
        let mut all = vec![0f32; m * n];
        matmul_q_prompt(&x, &w, &mut all, m, &mut Vec::new()).unwrap();
        let mut serial = vec![0f32; m * n];
        crate::pool::run_serially(|| matmul_q_prompt(&x, &w, &mut serial, m, &mut Vec::new())).unwrap();
        assert_eq!(bits(&all), bits(&serial));
        for i in [0, 5, 6, 28] {
            let mut one = vec![0f32; n];
            matmul_q_prompt(&x[i * k..(i + 1) * k], &w, &mut one, 1, &mut Vec::new()).unwrap();
            assert_eq!(
                bits(&one),
                bits(&all[i * n..(i + 1) * n]),
                "{ty}: row {i} alone differs from row {i} among {m}"
            );
        }
    }
}

/// The panels compute the product of the Q4_K weights and the Q8_0-rounded activations to
/// f32 rounding, and the f32 product to the activations' 8-bit rounding.
#[test]
fn outputs_are_the_8_bit_product() {
    let (n, k, m) = (33, 1024, 4);
    for ty in TYPES {
        let (w, deq) = matrix(ty, n, k, 9);
        let x = activations(m * k, 2);
        let mut panel = vec![0f32; m * n];
        matmul_q_prompt_scalar(&x, &w, &mut panel, m, &mut Vec::new()).unwrap();
        let mut q8 = vec![0u8; k / 32 * Q8_0_BYTES];
        let mut xq = vec![0f32; k];
        for i in 0..m {
            quant::quantize_row(GgmlType::Q8_0, &x[i * k..(i + 1) * k], &mut q8).unwrap();
            quant::dequantize_row(GgmlType::Q8_0, &q8, &mut xq).unwrap();
            for j in 0..n {
                let w = &deq[j * k..(j + 1) * k];
                let scale: f64 = w.iter().zip(&xq).map(|(&a, &b)| (a as f64 * b as f64).abs()).sum();
                let rounded: f64 = w.iter().zip(&xq).map(|(&a, &b)| a as f64 * b as f64).sum();
                let exact: f64 = w.iter().zip(&x[i * k..]).map(|(&a, &b)| a as f64 * b as f64).sum();
                let p = panel[i * n + j] as f64;
                assert!(
                    (p - rounded).abs() <= 1e-5 * scale,
                    "{ty} ({i}, {j}): panel {p} vs rounded activations {rounded}"
                );
                assert!((p - exact).abs() <= 1e-2 * scale, "{ty} ({i}, {j}): panel {p} vs exact {exact}");
            }
        }
    }
}

/// Types and ISAs without panels take `matmul_q`, the dot's bits.
#[test]
fn other_types_and_isas_take_the_dot() {
    let (n, k, m) = (9, 256, 3);
    for (ty, isa) in [(GgmlType::Q6K, Isa::Scalar), (GgmlType::Q4K, Isa::Avx2), (GgmlType::Q8_0, Isa::active())] {
        if !isa.is_supported() {
            continue;
        }
        let (w, _) = matrix(ty, n, k, 4);
        let x = activations(m * k, 8);
        let (mut a, mut b) = (vec![0f32; m * n], vec![0f32; m * n]);
        matmul_q_prompt_with(isa, &x, &w, &mut a, m, &mut Vec::new()).unwrap();
        matmul_q_with(isa, &x, &w, &mut b, m, &mut Vec::new()).unwrap();
        assert_eq!(bits(&a), bits(&b), "{ty} at {isa}");
    }
}

#[test]
fn mismatched_shapes_are_errors() {
    let (w, _) = matrix(GgmlType::Q4K, 4, 256, 1);
    let mut y = vec![0f32; 8];
    assert!(matmul_q_prompt(&[0.0; 100], &w, &mut y, 2, &mut Vec::new()).is_err());
    assert!(matmul_q_prompt(&[0.0; 512], &w, &mut y[..7], 2, &mut Vec::new()).is_err());
    assert!(matmul_q_prompt_scalar(&[0.0; 100], &w, &mut y, 2, &mut Vec::new()).is_err());
    assert!(matmul_q_prompt(&[], &w, &mut [], 0, &mut Vec::new()).is_ok());
    let (q8, _) = matrix(GgmlType::Q8_0, 4, 256, 1);
    assert!(matmul_q_prompt_scalar(&[0.0; 512], &q8, &mut y, 2, &mut Vec::new()).is_err());
}

/// The AVX-512 packers write the reference packer's bytes, full and short panels.
#[test]
fn simd_packing_gives_the_reference_bytes() {
    let (n, k) = (21, 768);
    let sbs = k / QK_K;
    for ty in TYPES {
        let (w, _) = matrix(ty, n, k, 13);
        let fmt = Format::of(ty).unwrap();
        for isa in Isa::available().into_iter().filter(|&i| has_q8_panels(i, ty)) {
            for (j0, cols) in [(0, 16), (16, 5), (3, 1)] {
                let bytes = sbs * fmt.sb_bytes();
                let (mut want, mut got) = (vec![0xAAu8; bytes], vec![Line([0x55; 64]); bytes / 64]);
                pack(Isa::Scalar, true, fmt, &w, j0, cols, &mut want);
                let got = line_bytes(&mut got);
                pack(isa, false, fmt, &w, j0, cols, got);
                assert!(got == want.as_slice(), "{ty} at {isa}: panel at row {j0} of {cols} rows differs");
            }
        }
    }
}
