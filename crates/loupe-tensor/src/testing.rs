//! The kernel unit tests' data, all from loupe-core's seeded [`SplitMix64`] (the one
//! generator of the workspace's tests, sampling and fuzz corpora), so every kernel test
//! draws from the same reproducible stream and no test carries its own generator.

use loupe_core::GgmlType;
pub(crate) use loupe_core::SplitMix64;

use crate::linear::QMatrix;
use crate::quant::{can_quantize, dequantize_row};

/// `n` values uniform in `[lo, hi)` from `seed`'s stream.
pub(crate) fn uniform(n: usize, seed: u64, lo: f32, hi: f32) -> Vec<f32> {
    let mut rng = SplitMix64::new(seed);
    (0..n).map(|_| rng.uniform_f32(lo, hi)).collect()
}

/// `n` values uniform in `[-1, 1)`: weights and activations of the kernel tests.
pub(crate) fn signed(n: usize, seed: u32) -> Vec<f32> {
    uniform(n, seed.into(), -1.0, 1.0)
}

/// `n` activation-like values: uniform in `[-0.5, 0.5)` with one in about 61 scaled by 40,
/// the outliers real hidden states have (they set a block's scale, so they exercise the
/// quantizers' range).
pub(crate) fn activations(n: usize, seed: u32) -> Vec<f32> {
    let mut rng = SplitMix64::new(seed.into());
    (0..n)
        .map(|_| {
            let u = rng.uniform_f32(-0.5, 0.5);
            if rng.below(61) == 0 {
                u * 40.0
            } else {
                u
            }
        })
        .collect()
}

/// A `rows x cols` matrix of `ty` and its dequantized f32 values. Types without a
/// quantizer (the K types) get random bytes whose trailing f16 scale is small and
/// finite (Q6_K's layout; Q4_K's and Q5_K's `d` and `dmin` lead the block; Q2_K and Q3_K
/// are not used here).
pub(crate) fn quant_matrix(ty: GgmlType, rows: usize, cols: usize, seed: u32) -> (QMatrix, Vec<f32>) {
    let w = signed(rows * cols, seed);
    let q = if can_quantize(ty) {
        QMatrix::quantize(ty, rows, cols, &w).unwrap()
    } else {
        let row_bytes = cols / ty.block_size() * ty.type_size();
        let mut bytes: Vec<u8> = signed(rows * row_bytes, seed + 1).iter().map(|v| ((v + 1.0) * 127.0) as u8).collect();
        for blk in bytes.chunks_mut(ty.type_size()) {
            let n = blk.len();
            if matches!(ty, GgmlType::Q4K | GgmlType::Q5K) {
                // Q4_K's and Q5_K's d and dmin lead the block.
                blk[..2].copy_from_slice(&half::f16::from_f32(0.01).to_le_bytes());
                blk[2..4].copy_from_slice(&half::f16::from_f32(0.003).to_le_bytes());
            } else {
                blk[n - 2..].copy_from_slice(&half::f16::from_f32(0.01).to_le_bytes());
            }
        }
        QMatrix::new(ty, rows, cols, bytes).unwrap()
    };
    let mut deq = vec![0f32; rows * cols];
    for (r, d) in deq.chunks_mut(cols).enumerate() {
        dequantize_row(ty, q.row(r), d).unwrap();
    }
    (q, deq)
}

/// A generator of raw random bytes (xorshift32 from `seed`) for blocks whose every bit
/// pattern a test must meet.
pub(crate) fn raw_bytes(seed: u32) -> impl FnMut() -> u8 {
    let mut s = 0x9e37_79b9u32 ^ seed.wrapping_mul(0x85eb_ca6b);
    move || {
        s ^= s << 13;
        s ^= s >> 17;
        s ^= s << 5;
        (s >> 8) as u8
    }
}

/// A Q4_K / Q5_K / Q6_K row of `k` elements of random bytes; with `sane_scales` its f16
/// scales (Q4_K's and Q5_K's `d` and `dmin`, Q6_K's `d`) are near +-1.
pub(crate) fn raw_kquant_row(ty: GgmlType, k: usize, seed: u32, sane_scales: bool) -> Vec<u8> {
    let mut byte = raw_bytes(seed);
    let bytes = ty.type_size();
    (0..k / ty.block_size() * bytes)
        .map(|i| match (ty, i % bytes) {
            (GgmlType::Q4K | GgmlType::Q5K, 1 | 3) | (GgmlType::Q6K, 209) if sane_scales => {
                (0x3B + byte() % 3) | (byte() & 0x80)
            }
            _ => byte(),
        })
        .collect()
}
