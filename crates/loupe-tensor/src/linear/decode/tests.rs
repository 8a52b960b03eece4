use super::*;
use crate::linear::invariant::matmul_wq_invariant_with;
use crate::linear::prefill::matmul_wq;
use crate::linear::qmatrix::QMatrix;
use crate::quant::quantize_row;
use crate::testing::{raw_bytes, raw_kquant_row, signed};

fn qmatrix(ty: GgmlType, rows: usize, cols: usize) -> (QMatrix, Vec<f32>) {
    let w = signed(rows * cols, 7);
    let row_bytes = cols / ty.block_size() * ty.type_size();
    let mut bytes = vec![0u8; rows * row_bytes];
    for (r, chunk) in bytes.chunks_mut(row_bytes).enumerate() {
        quantize_row(ty, &w[r * cols..(r + 1) * cols], chunk).unwrap();
    }
    let mut deq = vec![0f32; rows * cols];
    for (r, chunk) in bytes.chunks(row_bytes).enumerate() {
        dequantize_row(ty, chunk, &mut deq[r * cols..(r + 1) * cols]).unwrap();
    }
    (QMatrix::new(ty, rows, cols, bytes).unwrap(), deq)
}

#[test]
fn simd_dequant_equals_reference_bit_for_bit() {
    for ty in [GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q8_0] {
        let (q, deq) = qmatrix(ty, 3, 128);
        let mut fast = vec![0f32; 128];
        for r in 0..3 {
            dequantize_row_fast(ty, q.row(r), &mut fast).unwrap();
            assert_eq!(fast, deq[r * 128..(r + 1) * 128], "{ty} row {r}");
        }
    }
}

/// F16 and BF16 rows widen to the reference's bits for every 16-bit pattern (zeros, subnormals,
/// infinities, NaNs), whole vectors and a tail, aligned or not.
#[test]
fn f16_and_bf16_fast_dequant_equal_reference_for_every_pattern() {
    let bytes: Vec<u8> = (0..=u16::MAX).chain(0..7).flat_map(|h| h.to_le_bytes()).collect();
    let n = bytes.len() / 2;
    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
    for ty in [GgmlType::F16, GgmlType::BF16] {
        let mut want = vec![0f32; n];
        dequantize_row(ty, &bytes, &mut want).unwrap();
        let mut got = vec![f32::NAN; n];
        dequantize_row_fast(ty, &bytes, &mut got).unwrap();
        let first = bits(&got).iter().zip(bits(&want)).position(|(g, w)| *g != w);
        assert_eq!(first, None, "{ty}: first differing pattern");
        let shifted = [&[0u8][..], &bytes[..64]].concat();
        let mut unaligned = vec![f32::NAN; 32];
        dequantize_row_fast(ty, &shifted[1..], &mut unaligned).unwrap();
        assert_eq!(bits(&unaligned), bits(&want[..32]), "{ty}");
        assert!(dequantize_row_fast(ty, &bytes[..63], &mut [0f32; 32]).is_err(), "{ty}");
    }
}

/// Q4_K, Q6_K and Q5_K rows of raw random bytes (every f16 bit pattern for the scales: zero,
/// subnormal, infinite, NaN) and of small finite scales: the AVX2 dequantizer writes
/// exactly the scalar one's bits, through `dequantize_row_fast` and called directly
/// (so the comparison runs under `LOUPE_ISA=scalar` too).
#[test]
fn kquant_simd_dequant_equals_reference_bit_for_bit() {
    let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
    for ty in [GgmlType::Q4K, GgmlType::Q6K, GgmlType::Q5K] {
        for (k, seed) in [(256, 1), (512, 2), (4864, 3), (4864, 4)] {
            // Seed 4: any f16 pattern in the scale fields, NaN and infinity included.
            let row = raw_kquant_row(ty, k, seed, seed != 4);
            let mut want = vec![0f32; k];
            dequantize_row(ty, &row, &mut want).unwrap();
            let mut got = vec![f32::NAN; k];
            dequantize_row_fast(ty, &row, &mut got).unwrap();
            assert_eq!(bits(&got), bits(&want), "{ty} k={k} seed {seed}");
            #[cfg(target_arch = "x86_64")]
            if Isa::detected() >= Isa::Avx2 {
                let mut direct = vec![f32::NAN; k];
                // SAFETY: AVX2 and FMA checked above; `row` is k / 256 whole super-blocks.
                unsafe {
                    match ty {
                        GgmlType::Q4K => avx2_kquant::dequant_q4_k(&row, &mut direct),
                        GgmlType::Q5K => avx2_kquant::dequant_q5_k(&row, &mut direct),
                        _ => avx2_kquant::dequant_q6_k(&row, &mut direct),
                    }
                }
                assert_eq!(bits(&direct), bits(&want), "{ty} k={k} seed {seed}, AVX2 kernel");
            }
        }
        // Not whole super-blocks: an error, as from dequantize_row, never a partial write.
        let row = raw_kquant_row(ty, 512, 5, true);
        assert!(dequantize_row_fast(ty, &row[..row.len() - 1], &mut vec![0f32; 512]).is_err());
        assert!(dequantize_row_fast(ty, &row, &mut vec![0f32; 256]).is_err());
        assert!(dequantize_row_fast(ty, &row[..9], &mut [0f32; 16]).is_err());
    }
}

/// The AVX2 dot's word-wise unpacking of Q4_K's packed 6-bit scales and mins equals
/// the byte-wise `scale_min_k4` that the scalar dequantizer uses.
#[test]
fn q4k_scale_unpacking_matches_scale_min_k4() {
    #[cfg(target_arch = "x86_64")]
    if Isa::detected() >= Isa::Avx2 {
        let row = raw_kquant_row(GgmlType::Q8_0, 32 * 4096, 7, false);
        let mut cases: Vec<[u8; 12]> = row.chunks_exact(12).map(|c| c.try_into().unwrap()).collect();
        cases.extend([[0u8; 12], [0xFF; 12], [0xC0; 12], [0x3F; 12], [0xF0; 12], [0x0F; 12]]);
        for packed in cases {
            let (sc, mn) = crate::quant::blocks::scale_min_k4(&packed);
            let (mut got_sc, mut got_mn) = ([0f32; 8], [0f32; 8]);
            // SAFETY: AVX2 checked above; `packed` is 12 readable bytes.
            unsafe {
                use std::arch::x86_64::_mm256_storeu_ps;
                let (s, m) = crate::linear::simd::avx2::scales_mins_q4k(packed.as_ptr());
                _mm256_storeu_ps(got_sc.as_mut_ptr(), s);
                _mm256_storeu_ps(got_mn.as_mut_ptr(), m);
            }
            assert_eq!(got_sc, sc.map(f32::from), "scales of {packed:02x?}");
            assert_eq!(got_mn, mn.map(f32::from), "mins of {packed:02x?}");
        }
    }
}

/// Q4_K / Q6_K rows of raw random bytes (every 4- and 6-bit code, every 6-bit scale and
/// min, every signed 8-bit scale) at 1, 2 and 19 super-blocks: each ISA's dot stays
/// within f32 rounding of the super-block-by-super-block reference and of an f64 dot of
/// the dequantized row; bad lengths are errors.
#[test]
fn kquant_dots_of_raw_blocks_match_the_scalar_reference() {
    for ty in [GgmlType::Q4K, GgmlType::Q6K] {
        for (k, seed) in [(256, 1), (512, 2), (4864, 3), (4864, 4)] {
            let row = raw_kquant_row(ty, k, seed, true);
            let x = signed(k, 11 + seed);
            let sums: Vec<f32> = x.chunks(256).map(|c| c.iter().sum()).collect();
            let reference = dot_row_scalar(ty, &row, &x).unwrap();
            let mut deq = vec![0f32; k];
            dequantize_row(ty, &row, &mut deq).unwrap();
            let exact: f64 = deq.iter().zip(&x).map(|(&a, &b)| a as f64 * b as f64).sum();
            let magnitude: f32 = deq.iter().zip(&x).map(|(a, b)| (a * b).abs()).sum();
            assert!(
                (reference as f64 - exact).abs() <= 1e-5 * (1.0 + magnitude as f64),
                "{ty} k={k}: reference {reference} vs exact {exact}"
            );
            for isa in Isa::ALL.into_iter().filter(|&i| i <= Isa::detected()) {
                let got = dot_row(isa, ty, &row, &x, &sums).unwrap();
                assert!(
                    got.is_finite() && (got - reference).abs() <= 1e-5 * (1.0 + magnitude),
                    "{ty} k={k} {isa:?}: {got} vs {reference}"
                );
                assert!(
                    (got as f64 - exact).abs() <= 1e-5 * (1.0 + magnitude as f64),
                    "{ty} k={k} {isa:?}: {got} vs exact {exact}"
                );
            }
        }
        let row = raw_kquant_row(ty, 512, 6, true);
        let x = signed(512, 6);
        for isa in Isa::ALL.into_iter().filter(|&i| i <= Isa::detected()) {
            assert!(
                dot_row(isa, ty, &row[1..], &x[1..], &[]).is_err(),
                "{ty} {isa:?}: a partial super-block is an error"
            );
            assert!(dot_row(isa, ty, &row[..row.len() - 1], &x, &[]).is_err(), "{ty} {isa:?}: a short row is an error");
            assert!(dot_row(isa, ty, &row, &x[..256], &[]).is_err(), "{ty} {isa:?}: too few activations are an error");
            assert!(
                dot_row(isa, ty, &row[..ty.type_size()], &x, &[]).is_err(),
                "{ty} {isa:?}: too many activations are an error"
            );
            assert_eq!(dot_row(isa, ty, &[], &[], &[]).unwrap(), 0.0, "{ty} {isa:?}: an empty row");
        }
    }
}

/// An E4M3 NaN code (0x7f or 0xff) in a weight makes the row's dot NaN at every ISA, as
/// the reference's widening does (the AVX2 kernel's bit moves would otherwise read it
/// as 1.875 * 2^8).
#[test]
fn fp8_e4m3_nan_codes_give_nan_at_every_isa() {
    for nan in [0x7fu8, 0xff] {
        let mut row = vec![0u8; 2 * 34];
        for blk in row.chunks_exact_mut(34) {
            blk[..2].copy_from_slice(&half::f16::from_f32(0.5).to_le_bytes());
            for (j, c) in blk[2..].iter_mut().enumerate() {
                *c = (j as u8 * 7) % 0x70;
            }
        }
        row[34 + 2 + 9] = nan;
        let x = signed(64, 5);
        assert!(dot_row_scalar(GgmlType::Fp8E4M3, &row, &x).unwrap().is_nan());
        for isa in Isa::ALL.into_iter().filter(|&i| i <= Isa::detected()) {
            assert!(dot_row(isa, GgmlType::Fp8E4M3, &row, &x, &[]).unwrap().is_nan(), "code {nan:#x} {isa:?}");
        }
    }
}

#[test]
fn rows_that_are_not_whole_blocks_are_errors_even_when_the_counts_balance() {
    // 9 bytes against 16 values: 9 * 256 == 16 * 144 for Q4_K, 9 * 32 == 16 * 18 for
    // Q8_0 (34-byte blocks: no), so pick, per type, a byte count that balances.
    for ty in [GgmlType::Q4K, GgmlType::Q6K, GgmlType::Q4_1, GgmlType::Q8_0, GgmlType::Q5_0] {
        let (block, bytes) = (ty.block_size(), ty.type_size());
        // Half a block's bytes against half its values: the products balance.
        let (b, n) = if bytes % 2 == 0 && block % 2 == 0 { (bytes / 2, block / 2) } else { continue };
        assert_eq!(b * block, n * bytes);
        let row = vec![0x11u8; b];
        let x = vec![1f32; n];
        assert!(dot_row_scalar(ty, &row, &x).is_err(), "{ty}: {b} bytes against {n} values");
        for isa in Isa::ALL.into_iter().filter(|&i| i <= Isa::detected()) {
            assert!(dot_row(isa, ty, &row, &x, &[0.0; 1]).is_err(), "{ty} {isa:?}");
        }
        let mut dst = vec![7f32; n];
        assert!(
            dequantize_row_fast(ty, &row, &mut dst).is_err() || dst.iter().all(|&v| v != 7.0),
            "{ty}: neither an error nor written"
        );
    }
}

#[test]
fn every_isa_dot_matches_the_scalar_reference() {
    for ty in [
        GgmlType::Q4_1,
        GgmlType::Q8_0,
        GgmlType::Q4_0,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Mxfp4,
        GgmlType::Nvfp4,
        GgmlType::Fp8E4M3,
        GgmlType::Q4K,
        GgmlType::Q6K,
        GgmlType::F16,
        GgmlType::BF16,
    ] {
        let (q, _) = qmatrix_or_random(ty, 2, 256);
        let x = signed(256, 3);
        let sums: Vec<f32> = x.chunks(32).map(|c| c.iter().sum()).collect();
        let reference = dot_row_scalar(ty, q.row(1), &x).unwrap();
        for isa in Isa::ALL.into_iter().filter(|&i| i <= Isa::detected()) {
            let got = dot_row(isa, ty, q.row(1), &x, &sums).unwrap();
            assert!((got - reference).abs() <= 1e-4 * (1.0 + reference.abs()), "{ty} {isa:?}: {got} vs {reference}");
        }
    }
}

/// Q4_0 / Q5_0 / Q5_1 / MXFP4 / NVFP4 / FP8 E4M3 rows of raw random bytes (every nibble
/// and high bit, f16 scales and E8M0 exponents around 1, every UE4M3 byte including 0x00
/// and the NaN code 0x7F, every finite E4M3 code): each ISA's dot stays within f32
/// rounding of the block-by-block reference.
#[test]
fn small_block_dots_of_raw_blocks_match_the_scalar_reference() {
    let mut byte = raw_bytes(0);
    for (ty, blocks) in [
        (GgmlType::Mxfp4, 24),
        (GgmlType::Nvfp4, 12),
        (GgmlType::Fp8E4M3, 24),
        (GgmlType::Q4_0, 24),
        (GgmlType::Q5_0, 24),
        (GgmlType::Q5_1, 24),
    ] {
        let k = blocks * ty.block_size();
        let mut row = vec![0u8; blocks * ty.type_size()];
        for (i, b) in row.iter_mut().enumerate() {
            let at = i % ty.type_size();
            *b = match (ty, at) {
                // f16 scales (and Q5_1's minimum) near 1: exponent bits 0x3C +- 1.
                (GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q5_1 | GgmlType::Fp8E4M3, 1) | (GgmlType::Q5_1, 3) => {
                    (0x3B + byte() % 3) | (byte() & 0x80)
                }
                // Every E4M3 code but the two NaN codes (subnormals, zeros, +-448 included).
                (GgmlType::Fp8E4M3, 2..) => match byte() {
                    c if c & 0x7f == 0x7f => c ^ 1,
                    c => c,
                },
                (GgmlType::Mxfp4, 0) => 112 + byte() % 32,
                (GgmlType::Nvfp4, 0..=3) if i / ty.type_size() == 0 => [0x00, 0x7F, 0x01, 0x7E][at],
                (GgmlType::Nvfp4, 0..=3) => byte() & 0x7F,
                _ => byte(),
            };
        }
        let x = signed(k, 11);
        let sums: Vec<f32> = x.chunks(ty.block_size()).map(|c| c.iter().sum()).collect();
        let reference = dot_row_scalar(ty, &row, &x).unwrap();
        let magnitude: f32 = {
            let mut deq = vec![0f32; k];
            dequantize_row(ty, &row, &mut deq).unwrap();
            deq.iter().zip(&x).map(|(a, b)| (a * b).abs()).sum()
        };
        for isa in Isa::ALL.into_iter().filter(|&i| i <= Isa::detected()) {
            let got = dot_row(isa, ty, &row, &x, &sums).unwrap();
            assert!(
                got.is_finite() && (got - reference).abs() <= 1e-5 * (1.0 + magnitude),
                "{ty} {isa:?}: {got} vs {reference}"
            );
        }
        assert!(dot_row(Isa::detected(), ty, &row[1..], &x[1..], &sums).is_err(), "{ty}: a partial block is an error");
    }
}

#[test]
fn act16_dot_matches_scalar_reference_and_f32() {
    for ty in
        [GgmlType::Q4_1, GgmlType::Q8_0, GgmlType::Q5_0, GgmlType::Q6K, GgmlType::Q4K, GgmlType::Q4_0, GgmlType::Q5K]
    {
        let ks: &[usize] = if matches!(ty, GgmlType::Q6K | GgmlType::Q4K | GgmlType::Q5K) {
            &[256, 768, 1536]
        } else {
            &[32, 64, 576, 1536]
        };
        for &k in ks {
            let (q, deq) = qmatrix_or_random(ty, 3, k);
            let x = signed(k, 3);
            let (mut xq, mut ss) = (vec![0i16; k], vec![0f32; 2 * k / 32]);
            let act = Act16::quantize(&x, &mut xq, &mut ss);
            for r in 0..3 {
                let reference = dot_row_act16_scalar(ty, q.row(r), &act).unwrap();
                let exact: f64 = (0..k).map(|c| x[c] as f64 * deq[r * k + c] as f64).sum();
                let mag: f64 = (0..k).map(|c| (x[c] as f64 * deq[r * k + c] as f64).abs()).sum();
                // 16-bit activations: within ~2^-15 of the magnitude of the terms.
                assert!(
                    (reference as f64 - exact).abs() <= 4e-5 * mag,
                    "{ty} k={k} row {r}: {reference} vs exact {exact}"
                );
                for isa in Isa::available() {
                    let got = dot_row_act16(isa, ty, q.row(r), &act).unwrap();
                    assert!(
                        (got - reference).abs() <= 1e-5 * (1.0 + mag as f32),
                        "{ty} k={k} {isa:?}: {got} vs {reference}"
                    );
                }
            }
        }
    }
    // Mismatched lengths are an error, not a panic or an out-of-bounds read.
    let (q, _) = qmatrix(GgmlType::Q4_1, 1, 64);
    let (mut xq, mut ss) = (vec![0i16; 32], vec![0f32; 2]);
    let act = Act16::quantize(&signed(32, 1), &mut xq, &mut ss);
    assert!(dot_row_act16(Isa::active(), GgmlType::Q4_1, q.row(0), &act).is_err());
    // Q6_K / Q4_K / Q5_K: only whole super-blocks against exactly their activations.
    for ty in [GgmlType::Q6K, GgmlType::Q4K, GgmlType::Q5K] {
        let row = raw_kquant_row(ty, 1024, 3, true);
        for k in [896, 768, 1280, 32] {
            let (mut xq, mut ss) = (vec![0i16; k], vec![0f32; 2 * k / 32]);
            let act = Act16::quantize(&signed(k, 1), &mut xq, &mut ss);
            for isa in Isa::available() {
                assert!(dot_row_act16(isa, ty, &row, &act).is_err(), "{ty} row of 1024 against {k} at {isa}");
                assert!(
                    dot_row_act16(isa, ty, &row[..row.len() - 1], &act).is_err(),
                    "short {ty} row against {k} at {isa}"
                );
            }
        }
    }
}

/// The AVX2 unpacking of a Q6_K Act16 block (the one every AVX2 Act16 path uses) gives
/// exactly `(q - 32) * scale` for every element of raw random super-blocks (every code
/// and signed scale) with `d = 1` (dequantized exactly as `1 * scale * (q - 32)`).
#[test]
fn q6_k_unpacking_matches_dequantize() {
    #[cfg(target_arch = "x86_64")]
    if Isa::detected() >= Isa::Avx2 {
        let mut row = raw_kquant_row(GgmlType::Q6K, 256 * 64, 5, false);
        // Extreme scales and codes too.
        let mut extreme = vec![0xFFu8; 210];
        extreme[192..208].copy_from_slice(&[
            0x80, 0x7F, 0x80, 0x01, 0xFF, 0x00, 0x80, 0x80, 0x7F, 0x7F, 0x81, 0x80, 0x80, 0x7F, 0x02, 0x80,
        ]);
        row.extend(&extreme);
        row.extend(vec![0u8; 192]);
        row.extend([0x80u8; 16]);
        row.extend([0, 0]);
        for sb in row.chunks_exact_mut(210) {
            sb[208..].copy_from_slice(&half::f16::ONE.to_le_bytes());
            let mut want = [0f32; 256];
            dequantize_row(GgmlType::Q6K, sb, &mut want).unwrap();
            for b in 0..8 {
                let mut got = [0i16; 32];
                // SAFETY: AVX2 checked above; `sb` is one whole 210-byte super-block
                // holding blocks 0..8.
                unsafe {
                    use std::arch::x86_64::{__m256i, _mm256_storeu_si256};
                    let (lo, hi) = crate::linear::simd::avx2::q6_k(sb.as_ptr(), b);
                    _mm256_storeu_si256(got.as_mut_ptr() as *mut __m256i, lo);
                    _mm256_storeu_si256(got.as_mut_ptr().add(16) as *mut __m256i, hi);
                }
                assert_eq!(got.map(f32::from), want[32 * b..32 * b + 32], "block {b} of {sb:02x?}");
            }
        }
    }
}

/// The AVX2 unpacking of a Q4_K (Q5_K) Act16 block gives its 4-bit (5-bit: the nibble and
/// the fifth bit from `qh`) codes and [`q4_k_dm`] its `(d * sc, -(dmin * m))`: with them,
/// `d' q + m'` is the dequantized value bit for bit (`quant::dequant` rounds `d * sc`,
/// `dmin * m` (both exact), then `dl q - ml`), on raw random super-blocks (every code,
/// scale, min and fifth bit) and one of all-ones bytes.
#[test]
fn q4_k_and_q5_k_unpacking_matches_dequantize() {
    #[cfg(target_arch = "x86_64")]
    if Isa::detected() >= Isa::Avx2 {
        use crate::linear::simd::avx2::{q4_k, q4_k_dm, q4_k_dms, q5_k};
        type Unpack = unsafe fn(*const u8, usize) -> (std::arch::x86_64::__m256i, std::arch::x86_64::__m256i);
        for (ty, unpack, codes) in [(GgmlType::Q4K, q4_k as Unpack, 16), (GgmlType::Q5K, q5_k as Unpack, 32)] {
            let sb_bytes = ty.type_size();
            let mut row = raw_kquant_row(ty, 256 * 64, 7, true);
            row.extend(vec![0xFFu8; sb_bytes]);
            let last = row.len() - sb_bytes;
            row[last..last + 4].copy_from_slice(&[0x00, 0x3C, 0x00, 0xBC]);
            for sb in row.chunks_exact(sb_bytes) {
                let mut want = [0f32; 256];
                dequantize_row(ty, sb, &mut want).unwrap();
                for b in 0..8 {
                    let mut got = [0i16; 32];
                    // SAFETY: AVX2 checked above; `sb` is one whole super-block of `ty`
                    // holding blocks 0..8.
                    let (d, m) = unsafe {
                        use std::arch::x86_64::{__m256i, _mm256_storeu_si256};
                        let (lo, hi) = unpack(sb.as_ptr(), b);
                        _mm256_storeu_si256(got.as_mut_ptr() as *mut __m256i, lo);
                        _mm256_storeu_si256(got.as_mut_ptr().add(16) as *mut __m256i, hi);
                        let (ds, ms) = q4_k_dms(sb.as_ptr());
                        let dm = q4_k_dm(sb.as_ptr(), b);
                        assert_eq!(
                            (ds[b].to_bits(), ms[b].to_bits()),
                            (dm.0.to_bits(), dm.1.to_bits()),
                            "{ty} block {b}: q4_k_dms vs q4_k_dm"
                        );
                        dm
                    };
                    assert!(got.iter().all(|&q| (0..codes).contains(&q)), "{ty} block {b}: codes {got:?}");
                    let value: Vec<f32> = got.iter().map(|&q| d * q as f32 + m).collect();
                    assert_eq!(value, want[32 * b..32 * b + 32], "{ty} block {b} of {sb:02x?}");
                }
            }
        }
    }
}

/// Q4_K, Q6_K and Q5_K rows of raw random super-blocks (every code, every scale, `d` and
/// `dmin` near +-1) at 1, 3 and 19 super-blocks: the Act16 dot of every ISA is within
/// the 16-bit activation error of the f32 reference `dot_row_scalar` (and of an f64
/// dot), the decode and batched paths give its bits; a 896-wide matrix is refused.
#[test]
fn kquant_act16_dot_of_raw_blocks_matches_the_f32_reference() {
    for ty in [GgmlType::Q4K, GgmlType::Q6K, GgmlType::Q5K] {
        assert!(
            QMatrix::new(ty, 1, 896, vec![0u8; 896 / 256 * ty.type_size()]).is_err(),
            "{ty}: 896 columns are not whole super-blocks"
        );
        for (k, seed) in [(256, 1), (768, 2), (4864, 3)] {
            let n = 5;
            let w = QMatrix::new(ty, n, k, raw_kquant_row(ty, n * k, seed, true)).unwrap();
            check_act16_raw(&w, seed);
        }
    }
}

/// The body of the raw-block Act16 tests: `w` against three activation rows (the last
/// two with outliers) at every ISA.
fn check_act16_raw(w: &QMatrix, seed: u32) {
    let (ty, n, k) = (w.ty, w.rows, w.cols);
    let mut x = signed(3 * k, 20 + seed);
    for v in x[k..].iter_mut().step_by(61) {
        *v *= 40.0;
    }
    for (i, xi) in x.chunks(k).enumerate() {
        let (mut xq, mut ss) = (vec![0i16; k], vec![0f32; 2 * k / 32]);
        let act = Act16::quantize(xi, &mut xq, &mut ss);
        for isa in Isa::available() {
            let mut batched = vec![0f32; 3 * n];
            matmul_wq_invariant_with(isa, &x, w, &mut batched, 3).unwrap();
            let mut decode = vec![0f32; n];
            matmul_wq_invariant_with(isa, xi, w, &mut decode, 1).unwrap();
            for j in 0..n {
                let row = w.row(j);
                let mut deq = vec![0f32; k];
                dequantize_row(ty, row, &mut deq).unwrap();
                let exact: f64 = deq.iter().zip(xi).map(|(&a, &b)| a as f64 * b as f64).sum();
                let mag: f64 = deq.iter().zip(xi).map(|(&a, &b)| (a as f64 * b as f64).abs()).sum();
                let reference = dot_row_scalar(ty, row, xi).unwrap();
                let got = dot_row_act16(isa, ty, row, &act).unwrap();
                // Each activation is rounded to within half a code, 2^-16 of its block's
                // largest: the error is at most sum |w| * amax_b / 65534, plus f32
                // rounding (Q6_K's lanes past 2^24 round once more, 2^-24 relative).
                let act_err: f64 = deq
                    .chunks(32)
                    .zip(xi.chunks(32))
                    .map(|(wb, xb)| {
                        wb.iter().map(|v| v.abs() as f64).sum::<f64>()
                            * xb.iter().fold(0f64, |m, v| m.max(v.abs() as f64))
                            / 65534.0
                    })
                    .sum();
                let tol = if i == 0 { 4e-5 * mag } else { act_err + 1e-5 * mag };
                assert!(
                    got.is_finite() && (got as f64 - reference as f64).abs() <= tol,
                    "{ty} k={k} {isa} x{i} row {j}: {got} vs f32 {reference}"
                );
                assert!((got as f64 - exact).abs() <= tol, "{ty} k={k} {isa} x{i} row {j}: {got} vs exact {exact}");
                let scalar = dot_row_act16_scalar(ty, row, &act).unwrap();
                assert!(
                    (got - scalar).abs() <= 1e-5 * (1.0 + mag as f32),
                    "{ty} k={k} {isa} x{i} row {j}: {got} vs scalar Act16 {scalar}"
                );
                assert_eq!(
                    decode[j].to_bits(),
                    got.to_bits(),
                    "{ty} k={k} {isa} x{i} row {j}: decode vs the single-row dot"
                );
                assert_eq!(
                    batched[i * n + j].to_bits(),
                    got.to_bits(),
                    "{ty} k={k} {isa} x{i} row {j}: batched vs the single-row dot"
                );
            }
        }
    }
}

/// `rows` rows of `k` elements of a type whose blocks start with their f16 scale `d`
/// (Q5_0, Q4_0): raw random bytes (every nibble and `qh` bit), with `d` small and finite
/// (2^-5 .. 2^-3, either sign).
fn raw_d_first_rows(ty: GgmlType, rows: usize, k: usize, seed: u32) -> Vec<u8> {
    let bytes = ty.type_size();
    let mut byte = raw_bytes(seed);
    (0..rows * k / 32 * bytes)
        .map(|i| if i % bytes == 1 { (0x28 + byte() % 8) | (byte() & 0x80) } else { byte() })
        .collect()
}

/// The 32 i16 codes an AVX2 Act16 unpacker gives for the block at `blk`.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C; `blk` is one whole block of the unpacker's type.
#[cfg(target_arch = "x86_64")]
unsafe fn avx2_codes(
    unpack: unsafe fn(*const u8) -> (std::arch::x86_64::__m256i, std::arch::x86_64::__m256i),
    blk: &[u8],
) -> [i16; 32] {
    use std::arch::x86_64::{__m256i, _mm256_storeu_si256};
    let mut got = [0i16; 32];
    let (lo, hi) = unpack(blk.as_ptr());
    _mm256_storeu_si256(got.as_mut_ptr() as *mut __m256i, lo);
    _mm256_storeu_si256(got.as_mut_ptr().add(16) as *mut __m256i, hi);
    got
}

/// The AVX2 unpacking of a Q5_0 block (the one every AVX2 Act16 path uses) gives
/// exactly `q - 16` for every element, on raw random blocks and all-zero / all-one
/// bit patterns.
#[test]
fn q5_0_unpacking_matches_dequantize() {
    #[cfg(target_arch = "x86_64")]
    if Isa::detected() >= Isa::Avx2 {
        let mut blocks = raw_d_first_rows(GgmlType::Q5_0, 1, 32 * 256, 9);
        for fill in [0x00, 0xFF, 0xAA, 0x0F] {
            blocks.extend([0x00, 0x3C]);
            blocks.extend([fill; 20]);
        }
        for blk in blocks.chunks_exact_mut(22) {
            blk[..2].copy_from_slice(&half::f16::ONE.to_le_bytes());
            let mut want = [0f32; 32];
            dequantize_row(GgmlType::Q5_0, blk, &mut want).unwrap();
            // SAFETY: AVX2 checked above; `blk` is one whole 22-byte block.
            let got = unsafe { avx2_codes(crate::linear::simd::avx2::q5_0, blk) };
            assert_eq!(got.map(f32::from), want, "block {blk:02x?}");
        }
    }
}

/// Q5_0 rows of raw random blocks at Qwen2.5-0.5B's widths: the Act16 dot of every ISA
/// is within the 16-bit activation error of the f32 reference `dot_row_scalar` (and of
/// an f64 dot), and the decode and batched paths give its bits.
#[test]
fn q5_0_act16_dot_of_raw_blocks_matches_the_f32_reference() {
    for (k, seed) in [(896, 1), (4864, 2), (96, 3)] {
        let n = 5;
        let w = QMatrix::new(GgmlType::Q5_0, n, k, raw_d_first_rows(GgmlType::Q5_0, n, k, seed)).unwrap();
        check_act16_raw(&w, seed);
    }
}

#[test]
fn matmul_equals_dequantized_f32_matmul() {
    for (m, n, k) in [(1, 70, 64), (5, 130, 96), (17, 64, 32)] {
        for ty in [GgmlType::Q4_1, GgmlType::Q8_0, GgmlType::Q5_0, GgmlType::Q6K] {
            let k = if ty == GgmlType::Q6K { 256 } else { k };
            let (q, deq) = qmatrix_or_random(ty, n, k);
            let x = signed(m * k, 11);
            let mut y = vec![0f32; m * n];
            matmul_wq(&x, &q, &mut y, m).unwrap();
            for i in 0..m {
                let row = &x[i * k..(i + 1) * k];
                for j in 0..n {
                    let w = &deq[j * k..(j + 1) * k];
                    let want: f64 = (0..k).map(|c| row[c] as f64 * w[c] as f64).sum();
                    // Decode (m = 1) rounds each activation to a 16-bit code of its block of 32
                    // (at most half a step, max|x_b| / 32767 / 2, per element); both paths add
                    // f32 rounding, within 1e-5 of the sum of |products| at these lengths.
                    let act16: f64 = (0..k)
                        .map(|c| {
                            let b = c / 32 * 32;
                            let max = row[b..b + 32].iter().fold(0f32, |a, v| a.max(v.abs())) as f64;
                            w[c].abs() as f64 * max / 32767.0 / 2.0
                        })
                        .sum();
                    let magnitude: f64 = (0..k).map(|c| (row[c] as f64 * w[c] as f64).abs()).sum();
                    let bound = act16 + 1e-5 * magnitude + 1e-6;
                    let got = y[i * n + j] as f64;
                    assert!((got - want).abs() <= bound, "{ty} m={m} ({i},{j}): {got} vs {want} (bound {bound})");
                }
            }
        }
    }
}

/// Types without a quantizer get random bytes with sane f16 scales.
fn qmatrix_or_random(ty: GgmlType, rows: usize, cols: usize) -> (QMatrix, Vec<f32>) {
    if crate::quant::can_quantize(ty) {
        return qmatrix(ty, rows, cols);
    }
    let row_bytes = cols / ty.block_size() * ty.type_size();
    let mut bytes: Vec<u8> = signed(rows * row_bytes, 5).iter().map(|v| ((v + 1.0) * 127.0) as u8).collect();
    // Q6_K ends each block with an f16 scale, Q4_K and Q5_K start with `d` and `dmin`: make
    // them small and finite.
    for blk in bytes.chunks_mut(ty.type_size()) {
        let n = blk.len();
        if matches!(ty, GgmlType::Q4K | GgmlType::Q5K) {
            blk[..2].copy_from_slice(&half::f16::from_f32(0.01).to_le_bytes());
            blk[2..4].copy_from_slice(&half::f16::from_f32(0.003).to_le_bytes());
        } else {
            blk[n - 2..].copy_from_slice(&half::f16::from_f32(0.01).to_le_bytes());
        }
    }
    let mut deq = vec![0f32; rows * cols];
    for (r, chunk) in bytes.chunks(row_bytes).enumerate() {
        dequantize_row(ty, chunk, &mut deq[r * cols..(r + 1) * cols]).unwrap();
    }
    (QMatrix::new(ty, rows, cols, bytes).unwrap(), deq)
}

/// F16 and BF16 weights: every ISA's dot is the float kernel of `vec_dot_fn`, and a batch of
/// rows computes each row exactly as a one-row call does (decode and batch agree).
#[test]
fn float_weight_rows_are_batch_invariant_at_every_isa() {
    // Row counts 1..=9 cover every tile of the multi-row float kernels (up to 4 rows) and
    // their tails; k = 200 a tail past the vectors, 896 none.
    for ty in [GgmlType::F16, GgmlType::BF16] {
        for k in [200, 896] {
            let (q, deq) = qmatrix(ty, 5, k);
            let x = signed(9 * k, 11);
            for isa in Isa::available() {
                let dot = crate::quant::vec_dot_fn(isa, ty);
                for m in 1..=9 {
                    let mut batched = vec![0f32; m * 5];
                    matmul_wq_invariant_with(isa, &x[..m * k], &q, &mut batched, m).unwrap();
                    for (i, xi) in x[..m * k].chunks(k).enumerate() {
                        let mut one = vec![0f32; 5];
                        matmul_wq_invariant_with(isa, xi, &q, &mut one, 1).unwrap();
                        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                        assert_eq!(bits(&one), bits(&batched[i * 5..(i + 1) * 5]), "{ty} k={k} {isa:?} m={m} row {i}");
                        for (r, &v) in one.iter().enumerate() {
                            let alone = dot(q.row(r), crate::quant::f32_bytes(xi), k);
                            assert_eq!(v.to_bits(), alone.to_bits(), "{ty} k={k} {isa:?}: the decode dot");
                            let exact: f32 = deq[r * k..(r + 1) * k].iter().zip(xi).map(|(a, b)| a * b).sum();
                            assert!((v - exact).abs() <= 1e-4 * (1.0 + exact.abs()), "{ty} {isa:?}: {v} vs {exact}");
                        }
                    }
                }
            }
        }
    }
}

/// The AVX2 and AVX-512 unpackings of Q4_0 blocks (the ones every Act16 path uses) give
/// exactly `q - 8` for every element, on raw random blocks and fixed bit patterns.
#[test]
fn q4_0_unpacking_matches_dequantize() {
    #[cfg(target_arch = "x86_64")]
    if Isa::detected() >= Isa::Avx2 {
        let mut blocks = raw_d_first_rows(GgmlType::Q4_0, 1, 32 * 256, 4);
        for fill in [0x00, 0xFF, 0x88, 0x0F] {
            blocks.extend([0x00, 0x3C]);
            blocks.extend([fill; 16]);
        }
        for blk in blocks.chunks_exact_mut(18) {
            blk[..2].copy_from_slice(&half::f16::ONE.to_le_bytes());
        }
        for (i, blk) in blocks.chunks_exact(18).enumerate() {
            let mut want = [0f32; 32];
            dequantize_row(GgmlType::Q4_0, blk, &mut want).unwrap();
            // SAFETY: AVX2 checked above; `blk` is one whole 18-byte block.
            let got = unsafe { avx2_codes(crate::linear::simd::avx2::q4_0, blk) };
            assert_eq!(got.map(f32::from), want, "block {i}: {blk:02x?}");
            if Isa::detected() >= Isa::Avx512 && (i + 1) * 18 < blocks.len() {
                // The pair unpacking: this block in words 0..16 of each half, the next in 16..32.
                let mut next = [0f32; 32];
                dequantize_row(GgmlType::Q4_0, &blocks[(i + 1) * 18..(i + 2) * 18], &mut next).unwrap();
                let (mut lo, mut hi) = ([0i16; 32], [0i16; 32]);
                // SAFETY: AVX-512 checked above; two whole blocks from `blk` on.
                unsafe {
                    use std::arch::x86_64::_mm512_storeu_si512;
                    let (l, h) =
                        crate::linear::simd::avx512::unpack_pair::<{ crate::linear::kinds::Q4_0 }>(blk.as_ptr());
                    _mm512_storeu_si512(lo.as_mut_ptr().cast(), l);
                    _mm512_storeu_si512(hi.as_mut_ptr().cast(), h);
                }
                let joined = |a: &[f32], b: &[f32]| a.iter().chain(b).copied().collect::<Vec<f32>>();
                assert_eq!(lo.map(f32::from).to_vec(), joined(&want[..16], &next[..16]), "pair {i} low");
                assert_eq!(hi.map(f32::from).to_vec(), joined(&want[16..], &next[16..]), "pair {i} high");
            }
        }
    }
}

/// Q4_0 rows of raw random blocks at Qwen2.5-0.5B's and Llama's widths: the Act16 dot of
/// every ISA is within the 16-bit activation error of the f32 reference `dot_row_scalar`
/// (and of an f64 dot), and the decode and batched paths give its bits.
#[test]
fn q4_0_act16_dot_of_raw_blocks_matches_the_f32_reference() {
    for (k, seed) in [(896, 1), (4864, 2), (96, 3), (2048, 4)] {
        let n = 5;
        let w = QMatrix::new(GgmlType::Q4_0, n, k, raw_d_first_rows(GgmlType::Q4_0, n, k, seed)).unwrap();
        check_act16_raw(&w, seed);
    }
}
