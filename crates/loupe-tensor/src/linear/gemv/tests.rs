use super::*;
use crate::linear::decode::dot_row_act16;
use crate::testing::activations;

/// The Act16 types.
const KINDS: [GgmlType; 7] =
    [GgmlType::Q4_1, GgmlType::Q8_0, GgmlType::Q5_0, GgmlType::Q6K, GgmlType::Q4K, GgmlType::Q4_0, GgmlType::Q5K];

/// `n x k` of `ty`: quantized from [`data`], or for Q6_K / Q4_K / Q5_K (no quantizer) random
/// bytes with each super-block's f16 `d` (and Q4_K's / Q5_K's `dmin`) small and finite.
fn matrix(ty: GgmlType, n: usize, k: usize, seed: u32) -> QMatrix {
    if !matches!(ty, GgmlType::Q6K | GgmlType::Q4K | GgmlType::Q5K) {
        return QMatrix::quantize(ty, n, k, &activations(n * k, seed)).unwrap();
    }
    let bytes_per = ty.type_size();
    let mut bytes: Vec<u8> =
        activations(n * k / 256 * bytes_per, seed).iter().map(|v| ((v + 1.0) * 127.0) as u8).collect();
    let small = half::f16::from_f32(0.01).to_le_bytes();
    for sb in bytes.chunks_mut(bytes_per) {
        if ty == GgmlType::Q6K {
            sb[208..].copy_from_slice(&small);
        } else {
            sb[..2].copy_from_slice(&small);
            sb[2..4].copy_from_slice(&half::f16::from_f32(0.003).to_le_bytes());
        }
    }
    QMatrix::new(ty, n, k, bytes).unwrap()
}

/// Every row of every group size (1..=9 rows, so full groups and each tail) is
/// bit-identical to the single-row kernel of the same ISA, on every ISA this CPU has.
#[test]
#[allow(clippy::needless_range_loop)]
fn rows_are_bit_identical_to_the_single_row_dot() {
    for ty in KINDS {
        let shapes: &[(usize, usize)] = if matches!(ty, GgmlType::Q6K | GgmlType::Q4K | GgmlType::Q5K) {
            &[(9, 256), (7, 512), (13, 768), (5, 4864)]
        } else {
            &[(9, 32), (7, 64), (13, 576), (5, 1536), (4, 96), (6, 896)]
        };
        for &(n, k) in shapes {
            let w = matrix(ty, n, k, n as u32 * 7 + k as u32);
            let x = activations(k, 99 + k as u32);
            let mut q = vec![0i16; k];
            let mut ss = vec![0f32; 2 * (k / 32)];
            let act = Act16::quantize(&x, &mut q, &mut ss);
            for isa in Isa::available() {
                for start in 0..n.min(3) {
                    let mut y = vec![f32::NAN; n];
                    // SAFETY: isa is available; y holds n floats; shapes as documented.
                    unsafe { gemv_rows(isa, &w, start..n, &act, OutPtr(y.as_mut_ptr())).unwrap() };
                    for j in 0..n {
                        if j < start {
                            assert!(y[j].is_nan(), "{ty} {isa}: row {j} written outside the range");
                            continue;
                        }
                        let want = dot_row_act16(isa, ty, w.row(j), &act).unwrap();
                        assert_eq!(
                            y[j].to_bits(),
                            want.to_bits(),
                            "{ty} {n}x{k} {isa} rows {start}..{n}: row {j}: {} vs {want}",
                            y[j]
                        );
                    }
                }
            }
        }
    }
}

/// A zero activation row gives +0.0 for Q8_0 / Q5_0 and the exact offset-free zero for
/// Q4_1, as the single-row kernels do (the sign of zero is part of the bits).
#[test]
fn zero_activations_keep_the_single_row_zero() {
    for ty in KINDS {
        let (n, k) = (6, if matches!(ty, GgmlType::Q6K | GgmlType::Q4K | GgmlType::Q5K) { 256 } else { 64 });
        let w = matrix(ty, n, k, 5);
        let x = vec![0f32; k];
        let mut q = vec![0i16; k];
        let mut ss = vec![0f32; 2 * k / 32];
        let act = Act16::quantize(&x, &mut q, &mut ss);
        for isa in Isa::available() {
            let mut y = vec![1f32; n];
            // SAFETY: as above.
            unsafe { gemv_rows(isa, &w, 0..n, &act, OutPtr(y.as_mut_ptr())).unwrap() };
            for (j, v) in y.iter().enumerate() {
                assert_eq!(
                    v.to_bits(),
                    dot_row_act16(isa, ty, w.row(j), &act).unwrap().to_bits(),
                    "{ty} {isa} row {j}"
                );
            }
        }
    }
}
