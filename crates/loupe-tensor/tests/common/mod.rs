//! Shared test helpers: a seeded RNG and random rows/blocks for every GGML type.
#![allow(dead_code)]

use half::{bf16, f16};
use loupe_tensor::quant::{self, vec_dot_type};
use loupe_tensor::GgmlType;

/// loupe_core's SplitMix64: tiny, seeded, reproducible across platforms.
pub struct Rng(loupe_core::SplitMix64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(loupe_core::SplitMix64(seed))
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }
    /// Uniform in [lo, hi).
    pub fn uniform(&mut self, lo: f32, hi: f32) -> f32 {
        self.0.uniform_f32(lo, hi)
    }
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next_u64() as u8).collect()
    }
    /// A row of activations: mostly N(0,1)-ish, with occasional outliers as real
    /// hidden states have.
    pub fn activations(&mut self, n: usize) -> Vec<f32> {
        (0..n)
            .map(|_| {
                let v: f32 = (0..4).map(|_| self.uniform(-1.0, 1.0)).sum();
                if self.next_u64().is_multiple_of(64) {
                    v * 8.0
                } else {
                    v
                }
            })
            .collect()
    }
}

/// A "sane" f16 scale: magnitude in [1e-3, 0.1], random sign unless `positive`.
fn scale(rng: &mut Rng, positive: bool) -> [u8; 2] {
    let mag = 10f32.powf(rng.uniform(-3.0, -1.0));
    let s = if positive || rng.next_u64().is_multiple_of(2) { mag } else { -mag };
    f16::from_f32(s).to_le_bytes()
}

/// Byte offsets of the f16 scale fields in each block type (from the `block_*`
/// structs), and whether ggml's quantizers only produce non-negative values there.
fn f16_fields(ty: GgmlType) -> &'static [(usize, bool)] {
    match ty {
        GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 => &[(0, false)],
        GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q8_1 => &[(0, false), (2, false)],
        GgmlType::Q2K => &[(80, true), (82, true)],
        GgmlType::Q3K => &[(108, false)],
        GgmlType::Q4K | GgmlType::Q5K => &[(0, true), (2, true)],
        GgmlType::Q6K => &[(208, false)],
        _ => &[],
    }
}

/// `n` elements of `ty` as bytes: random quants with sane scales (no NaN/Inf), or
/// random finite values for the float types.
pub fn random_row(rng: &mut Rng, ty: GgmlType, n: usize) -> Vec<u8> {
    match ty {
        GgmlType::F32 => rng.activations(n).iter().flat_map(|v| (v * 0.05).to_le_bytes()).collect(),
        GgmlType::F16 => rng.activations(n).iter().flat_map(|v| f16::from_f32(v * 0.05).to_le_bytes()).collect(),
        GgmlType::BF16 => rng.activations(n).iter().flat_map(|v| bf16::from_f32(v * 0.05).to_le_bytes()).collect(),
        GgmlType::Mxfp4 => {
            // The E8M0 exponent byte in a weight-like range (2^-10 .. 2^-4 for the halved
            // scale); the nibbles are any codes.
            let mut out = rng.bytes(n / 32 * 17);
            for blk in out.chunks_exact_mut(17) {
                blk[0] = 118 + blk[0] % 7;
            }
            out
        }
        GgmlType::Nvfp4 => {
            // UE4M3 sub-block scale bytes in a weight-like range (exponent field 1..4: halved
            // scales 2^-7 .. 2^-3); the nibbles are any codes.
            let mut out = rng.bytes(n / 64 * 36);
            for blk in out.chunks_exact_mut(36) {
                for s in &mut blk[..4] {
                    *s = 0x08 + *s % 32;
                }
            }
            out
        }
        GgmlType::Fp8E4M3 => {
            // A sane f16 scale; the codes any finite E4M3 code (the NaN codes 0x7f/0xff
            // are moved to their neighbours).
            let mut out = rng.bytes(n / 32 * 34);
            for blk in out.chunks_exact_mut(34) {
                blk[..2].copy_from_slice(&scale(rng, false));
                for c in &mut blk[2..] {
                    if *c & 0x7f == 0x7f {
                        *c ^= 1;
                    }
                }
            }
            out
        }
        GgmlType::Q8K => {
            // d is an f32 here; bsums only matter for activations (not used for weights).
            let mut out = Vec::new();
            for _ in 0..n / 256 {
                let mut b = rng.bytes(292);
                b[..4].copy_from_slice(&(rng.uniform(1e-4, 1e-2)).to_le_bytes());
                out.extend(b);
            }
            out
        }
        _ => {
            let ts = ty.type_size();
            let mut out = rng.bytes(n / ty.block_size() * ts);
            for blk in out.chunks_exact_mut(ts) {
                for &(off, positive) in f16_fields(ty) {
                    blk[off..off + 2].copy_from_slice(&scale(rng, positive));
                }
            }
            out
        }
    }
}

/// Random activations of `n` elements quantized to `vec_dot_type(wty)`, with the
/// f32 values they came from.
pub fn random_act(rng: &mut Rng, wty: GgmlType, n: usize) -> (Vec<f32>, Vec<u8>) {
    let x = rng.activations(n);
    let aty = vec_dot_type(wty);
    let mut q = vec![0u8; aty.bytes_for(n as u64).unwrap() as usize];
    quant::quantize_row(aty, &x, &mut q).unwrap();
    (x, q)
}

pub fn dequant(ty: GgmlType, bytes: &[u8], n: usize) -> Vec<f32> {
    let mut out = vec![0f32; n];
    quant::dequantize_row(ty, bytes, &mut out).unwrap();
    out
}

/// Every type a weight can have, i.e. every type with a dot kernel.
pub fn all_types() -> Vec<GgmlType> {
    GgmlType::ALL.to_vec()
}

/// Lengths to test for a type: 1, 2, 3 blocks, and SmolLM2-like sizes.
pub fn lengths(ty: GgmlType) -> Vec<usize> {
    let bs = ty.block_size();
    let mut v = vec![bs, 2 * bs, 3 * bs];
    for n in [576, 1536, 4096, 63, 129] {
        if n % bs == 0 && !v.contains(&n) {
            v.push(n);
        }
    }
    v
}

/// The exact value `vec_dot` approximates, in f64, and a scale for tolerances
/// (the sum of magnitudes of everything the kernel adds up).
///
/// For Q4_1/Q5_1 the kernel adds `m * s` with the Q8_1 block's stored `s`
/// (`f16(d_unrounded * sum(q))`), not the sum of the dequantized activations; the
/// reference does the same so that only f32 rounding separates the two.
pub fn reference(wty: GgmlType, w: &[u8], act: &[u8], n: usize) -> (f64, f64) {
    let aty = vec_dot_type(wty);
    let (wd, ad) = (dequant(wty, w, n), dequant(aty, act, n));
    let mut exact = 0f64;
    let mut mag = 0f64;
    for (x, y) in wd.iter().zip(&ad) {
        exact += *x as f64 * *y as f64;
        mag += (*x as f64 * *y as f64).abs();
    }
    let wmax = wd.iter().fold(0f64, |m, v| m.max(v.abs() as f64));
    mag += wmax * ad.iter().map(|v| v.abs() as f64).sum::<f64>();
    if matches!(wty, GgmlType::Q4_1 | GgmlType::Q5_1) {
        let (ws, as_) = (wty.type_size(), aty.type_size());
        for b in 0..n / 32 {
            let m = f16::from_le_bytes([w[b * ws + 2], w[b * ws + 3]]).to_f32() as f64;
            let s = f16::from_le_bytes([act[b * as_ + 2], act[b * as_ + 3]]).to_f32() as f64;
            let s_exact: f64 = ad[b * 32..(b + 1) * 32].iter().map(|v| *v as f64).sum();
            exact += m * (s - s_exact);
            mag += (m * s).abs();
        }
    }
    (exact, mag)
}
