//! Property tests of the quantized kernels: every type, every ISA this CPU has.
//!
//! `vec_dot` is checked against the f64 dot of the dequantized rows (the quantity
//! it is defined to compute), and every SIMD kernel against the scalar reference.

mod common;

use common::*;
use half::f16;
use loupe_tensor::quant::{self, vec_dot_type, Isa};
use loupe_tensor::GgmlType;

/// Copies `bytes` to an odd address, so kernels are exercised on unaligned rows
/// as mmapped GGUF data gives them.
fn misaligned(bytes: &[u8], offset: usize) -> (Vec<u8>, usize) {
    let mut buf = vec![0u8; bytes.len() + offset];
    buf[offset..].copy_from_slice(bytes);
    (buf, offset)
}

#[test]
fn vec_dot_matches_dequantized_f64_on_every_isa() {
    let mut rng = Rng::new(1);
    for wty in all_types() {
        for n in lengths(wty) {
            for trial in 0..3 {
                let w = random_row(&mut rng, wty, n);
                let (_, act) = random_act(&mut rng, wty, n);
                let (exact, mag) = reference(wty, &w, &act, n);
                let (wb, wo) = misaligned(&w, 1 + trial);
                let (ab, ao) = misaligned(&act, 3 - trial);
                for isa in Isa::available() {
                    let got = quant::vec_dot_with(isa, wty, &wb[wo..], &ab[ao..], n) as f64;
                    let tol = 1e-5 * mag + 1e-30;
                    assert!(
                        (got - exact).abs() <= tol,
                        "{wty} n={n} trial {trial} isa {isa}: got {got}, f64 reference {exact} (tol {tol})"
                    );
                }
            }
        }
    }
}

#[test]
fn simd_kernels_match_scalar() {
    let mut rng = Rng::new(2);
    let isas = Isa::available();
    if isas.len() == 1 {
        eprintln!("note: this CPU has no SIMD level loupe uses; only the scalar path was tested");
    }
    for wty in all_types() {
        for n in lengths(wty) {
            for _ in 0..4 {
                let w = random_row(&mut rng, wty, n);
                let (_, act) = random_act(&mut rng, wty, n);
                let (_, mag) = reference(wty, &w, &act, n);
                let want = quant::vec_dot_with(Isa::Scalar, wty, &w, &act, n) as f64;
                for &isa in &isas[1..] {
                    let got = quant::vec_dot_with(isa, wty, &w, &act, n) as f64;
                    assert!((got - want).abs() <= 1e-5 * mag + 1e-30, "{wty} n={n} {isa}: {got} vs scalar {want}");
                }
            }
        }
    }
}

/// Activations at the extremes: all equal (every value rounds to +-127), a
/// single spike, and zeros.
#[test]
fn extreme_activations() {
    let mut rng = Rng::new(3);
    for wty in all_types() {
        let n = 2 * wty.block_size().max(32).max(if wty.block_size() == 256 { 256 } else { 0 });
        let n = n - n % wty.block_size();
        let w = random_row(&mut rng, wty, n);
        let cases: [Vec<f32>; 4] =
            [vec![1.0; n], vec![-3.0; n], (0..n).map(|i| if i == 5 { 100.0 } else { 0.01 }).collect(), vec![0.0; n]];
        for x in cases {
            let aty = vec_dot_type(wty);
            let mut act = vec![0u8; aty.bytes_for(n as u64).unwrap() as usize];
            quant::quantize_row(aty, &x, &mut act).unwrap();
            let (exact, mag) = reference(wty, &w, &act, n);
            for isa in Isa::available() {
                let got = quant::vec_dot_with(isa, wty, &w, &act, n) as f64;
                assert!((got - exact).abs() <= 1e-5 * mag + 1e-30, "{wty} {isa}: {got} vs {exact}");
            }
        }
    }
}

/// Round trip through each quantizer: the per-block error bound that the format
/// guarantees, and the overall relative RMS error one expects of it.
#[test]
fn quantize_dequantize_error_bounds() {
    let mut rng = Rng::new(4);
    let n = 4096;
    // (type, max error in a block, max NMSE over the row); NMSE limits are about
    // 1.5x what these 4-uniform-sum activations with outliers give.
    type Bound = fn(&[f32]) -> f32;
    let cases: [(GgmlType, Bound, f64); 9] = [
        (GgmlType::Q4_0, |b| amax(b) / 8.0 * 1.01, 3e-2),
        (GgmlType::Q4_1, |b| range(b) / 15.0 * 0.51 + amax(b) * 1e-3, 1.5e-2),
        (GgmlType::Q5_0, |b| amax(b) / 16.0 * 1.01, 8e-3),
        (GgmlType::Q5_1, |b| range(b) / 31.0 * 0.51 + amax(b) * 1e-3, 4e-3),
        (GgmlType::Q8_0, |b| amax(b) / 127.0 * 0.6, 1.5e-4),
        (GgmlType::Q8_1, |b| amax(b) / 127.0 * 0.6, 1.5e-4),
        (GgmlType::Q8K, |b| amax(b) / 127.0 * 0.501, 6e-4),
        (GgmlType::F16, |b| amax(b) * 2f32.powi(-11), 1e-6),
        (GgmlType::BF16, |b| amax(b) * 2f32.powi(-8), 1e-4),
    ];
    for (ty, bound, max_nmse) in cases {
        let x = rng.activations(n);
        let mut q = vec![0u8; ty.bytes_for(n as u64).unwrap() as usize];
        quant::quantize_row(ty, &x, &mut q).unwrap();
        let y = dequant(ty, &q, n);
        let bs = if ty.is_quantized() { ty.block_size() } else { 1 };
        for (b, (xb, yb)) in x.chunks(bs).zip(y.chunks(bs)).enumerate() {
            let lim = bound(xb);
            for (i, (u, v)) in xb.iter().zip(yb).enumerate() {
                assert!((u - v).abs() <= lim, "{ty} block {b} element {i}: {u} -> {v}, bound {lim}");
            }
        }
        let err: f64 = x.iter().zip(&y).map(|(u, v)| ((u - v) as f64).powi(2)).sum();
        let sig: f64 = x.iter().map(|u| (*u as f64).powi(2)).sum();
        eprintln!("{ty}: NMSE {:.3e}", err / sig);
        assert!(err / sig <= max_nmse, "{ty}: NMSE {} > {max_nmse}", err / sig);
    }
}

fn amax(b: &[f32]) -> f32 {
    b.iter().fold(0.0, |m, v| m.max(v.abs()))
}

fn range(b: &[f32]) -> f32 {
    let (lo, hi) = b.iter().fold((f32::MAX, f32::MIN), |(l, h), v| (l.min(*v), h.max(*v)));
    hi - lo
}

/// Q8_1's `s` and Q8_K's `bsums` are what the dot kernels trust for the offset
/// terms; they must agree with the quants.
#[test]
fn activation_side_sums() {
    let mut rng = Rng::new(5);
    let x = rng.activations(512);
    let mut q = vec![0u8; 36 * 16];
    quant::quantize_row(GgmlType::Q8_1, &x, &mut q).unwrap();
    for b in q.chunks(36) {
        let d = f16::from_le_bytes([b[0], b[1]]).to_f32();
        let s = f16::from_le_bytes([b[2], b[3]]).to_f32();
        let sum: i32 = b[4..].iter().map(|&v| v as i8 as i32).sum();
        assert!((s - d * sum as f32).abs() <= (d * sum as f32).abs() * 2e-3 + 1e-6);
        assert!(b[4..].iter().all(|&v| v as i8 != -128));
    }
    let mut q = vec![0u8; 292 * 2];
    quant::quantize_row(GgmlType::Q8K, &x, &mut q).unwrap();
    for b in q.chunks(292) {
        for g in 0..16 {
            let sum: i32 = b[4 + 16 * g..4 + 16 * g + 16].iter().map(|&v| v as i8 as i32).sum();
            let stored = i16::from_le_bytes([b[260 + 2 * g], b[261 + 2 * g]]) as i32;
            assert_eq!(sum, stored, "bsums[{g}]");
        }
        assert!(b[4..260].iter().all(|&v| v as i8 != -128));
    }
}

#[test]
fn vec_dot_types() {
    use loupe_tensor::quant::GgmlTypeExt;
    for (w, a) in [
        (GgmlType::F32, GgmlType::F32),
        (GgmlType::F16, GgmlType::F32),
        (GgmlType::BF16, GgmlType::F32),
        (GgmlType::Q4_0, GgmlType::Q8_0),
        (GgmlType::Q5_0, GgmlType::Q8_0),
        (GgmlType::Q8_0, GgmlType::Q8_0),
        (GgmlType::Q4_1, GgmlType::Q8_1),
        (GgmlType::Q5_1, GgmlType::Q8_1),
        (GgmlType::Q2K, GgmlType::Q8K),
        (GgmlType::Q3K, GgmlType::Q8K),
        (GgmlType::Q4K, GgmlType::Q8K),
        (GgmlType::Q5K, GgmlType::Q8K),
        (GgmlType::Q6K, GgmlType::Q8K),
    ] {
        assert_eq!(vec_dot_type(w), a, "{w}");
        assert_eq!(w.vec_dot_type(), a, "{w}");
    }
}

#[test]
fn quantize_rejects_bad_input() {
    let x = [0.5f32; 32];
    let mut out = vec![0u8; 33];
    assert!(quant::quantize_row(GgmlType::Q8_0, &x, &mut out).is_err());
    // A K-quant type without a quantizer.
    let mut out = vec![0u8; 210];
    assert!(quant::quantize_row(GgmlType::Q6K, &[0.0; 256], &mut out).is_err());
    assert!(quant::quantize_row(GgmlType::Q8_0, &x[..31], &mut [0u8; 34]).is_err());
}

#[test]
#[should_panic(expected = "not a multiple")]
fn vec_dot_rejects_partial_blocks() {
    quant::vec_dot(GgmlType::Q8_0, &[0u8; 34], &[0u8; 34], 31);
}

#[test]
#[should_panic(expected = "needs")]
fn vec_dot_rejects_short_rows() {
    quant::vec_dot(GgmlType::Q4_1, &[0u8; 40], &[0u8; 36], 64);
}

#[test]
fn isa_levels() {
    assert_eq!(Isa::parse("AVX2"), Some(Isa::Avx2));
    assert_eq!(Isa::parse("neon"), None);
    assert!(Isa::active() <= Isa::detected());
    assert_eq!(Isa::available()[0], Isa::Scalar);
    // Run with LOUPE_ISA=scalar (or avx2) to check the override end to end.
    if let Some(want) = std::env::var("LOUPE_ISA").ok().and_then(|v| Isa::parse(&v)) {
        assert_eq!(Isa::active(), want.min(Isa::detected()));
    }
    eprintln!("detected ISA: {}, active: {}", Isa::detected(), Isa::active());
}

/// The SIMD quantizers must produce exactly the scalar bytes, including the
/// halfway cases where `roundf` (away from zero) differs from round-to-even.
#[test]
fn quantizers_identical_on_every_isa() {
    let mut rng = Rng::new(6);
    let mut rows = vec![rng.activations(4096), vec![0.0; 64]];
    // amax 127 gives d = 1 exactly, so these land on k + 0.5 after scaling.
    let mut halfway: Vec<f32> = (0..32).map(|i| i as f32 - 15.5).collect();
    halfway[0] = 127.0;
    rows.push(halfway.repeat(2));
    for x in rows {
        for ty in [GgmlType::Q8_0, GgmlType::Q8_1, GgmlType::Q8K, GgmlType::Q4_1, GgmlType::F16] {
            if x.len() % ty.block_size() != 0 {
                continue;
            }
            let size = ty.bytes_for(x.len() as u64).unwrap() as usize;
            let mut want = vec![0u8; size];
            quant::quantize_row_with(Isa::Scalar, ty, &x, &mut want).unwrap();
            for isa in Isa::available() {
                let mut got = vec![0u8; size];
                quant::quantize_row_with(isa, ty, &x, &mut got).unwrap();
                assert!(got == want, "{ty} on {isa} differs from scalar");
            }
        }
    }
}

/// `--precision q8`'s matmul gives every output the bits of `vec_dot` on its row, whatever
/// the number of activation rows (the tiled kernels' shapes differ with it: 4 x 2 tiles, and
/// from 3 rows on AVX-512 the wide 2 x 10 tiles in balanced groups, prepared 64 rows at most
/// at a time): decode and any batch
/// agree. Every type, every ISA of this CPU; rows of random blocks; an even and an odd block
/// count (the one-block tail).
#[test]
fn matmul_q_outputs_are_vec_dot_bits_for_any_row_count() {
    use loupe_tensor::linear::{matmul_q_with, QMatrix};
    let mut rng = Rng::new(11);
    for (wty, k) in all_types().into_iter().flat_map(|ty| {
        let k = 2 * ty.block_size().max(256);
        [(ty, k), (ty, k + ty.block_size())]
    }) {
        if !loupe_tensor::linear::q8_rows_invariant(wty) {
            continue; // float weights: a GEMM from some row count on, not claimed invariant
        }
        let rows = 9;
        let w: Vec<u8> = (0..rows).flat_map(|_| random_row(&mut rng, wty, k)).collect();
        let qm = QMatrix::new(wty, rows, k, loupe_tensor::hugepages::WeightBytes::from(w.clone())).unwrap();
        let row_bytes = w.len() / rows;
        for isa in Isa::available() {
            for m in [1usize, 2, 3, 5, 9, 10, 11, 23, 130] {
                let acts: Vec<(Vec<f32>, Vec<u8>)> = (0..m).map(|_| random_act(&mut rng, wty, k)).collect();
                let x: Vec<f32> = acts.iter().flat_map(|(x, _)| x.iter().copied()).collect();
                let mut y = vec![0f32; m * rows];
                matmul_q_with(isa, &x, &qm, &mut y, m, &mut Vec::new()).unwrap();
                for (c, (_, act)) in acts.iter().enumerate() {
                    for r in 0..rows {
                        let want = quant::vec_dot_with(isa, wty, &w[r * row_bytes..(r + 1) * row_bytes], act, k);
                        assert_eq!(
                            y[c * rows + r].to_bits(),
                            want.to_bits(),
                            "{wty} {isa} m={m} row {r} act {c}: {} vs vec_dot {want}",
                            y[c * rows + r]
                        );
                    }
                }
            }
        }
    }
}

/// Q4_K, Q5_K and Q6_K against Q8_K keep one lane arithmetic on AVX2 and AVX-512 (`avx2_klanes`,
/// `avx512_ktile`): a row's output has the same bits on either ISA, through `vec_dot` and
/// through the tiled matmul, so a request decodes the same tokens on both kinds of CPU.
#[test]
fn k_quant_q8_dots_have_the_same_bits_on_avx2_and_avx512() {
    use loupe_tensor::linear::{matmul_q_with, QMatrix};
    let isas: Vec<Isa> = Isa::available().into_iter().filter(|&i| i >= Isa::Avx2).collect();
    if isas.len() < 2 {
        eprintln!("note: this CPU has {isas:?}; only each ISA's matmul against its own vec_dot is compared");
    }
    let mut rng = Rng::new(12);
    for wty in [GgmlType::Q4K, GgmlType::Q5K, GgmlType::Q6K] {
        let (k, rows, m) = (1024, 7, 3);
        let w: Vec<u8> = (0..rows).flat_map(|_| random_row(&mut rng, wty, k)).collect();
        let qm = QMatrix::new(wty, rows, k, loupe_tensor::hugepages::WeightBytes::from(w.clone())).unwrap();
        let acts: Vec<(Vec<f32>, Vec<u8>)> = (0..m).map(|_| random_act(&mut rng, wty, k)).collect();
        let x: Vec<f32> = acts.iter().flat_map(|(x, _)| x.iter().copied()).collect();
        let mut outputs: Vec<Vec<u32>> = Vec::new();
        for &isa in &isas {
            let mut y = vec![0f32; m * rows];
            matmul_q_with(isa, &x, &qm, &mut y, m, &mut Vec::new()).unwrap();
            let tiled: Vec<u32> = y.iter().map(|v| v.to_bits()).collect();
            // In the matmul's order: activation row c, then weight row r.
            let dots: Vec<u32> = acts
                .iter()
                .flat_map(|(_, a)| w.chunks(w.len() / rows).map(|r| quant::vec_dot_with(isa, wty, r, a, k).to_bits()))
                .collect();
            assert_eq!(tiled, dots, "{wty} {isa}: the tiled matmul differs from vec_dot");
            outputs.push(tiled);
        }
        for (isa, out) in isas.iter().zip(&outputs).skip(1) {
            assert_eq!(out, &outputs[0], "{wty}: {isa} differs from {}", isas[0]);
        }
    }
}
