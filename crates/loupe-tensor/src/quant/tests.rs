//! Hand-built blocks with closed-form expected values, one test per type.
//!
//! The patterns are chosen so the expected value of element `e` follows from `e`
//! directly (not by re-running the unpacking logic), which pins down the element
//! order of every packing: nibble halves, 2-bit fields, Q3_K's inverted high bit,
//! the 6-bit K-scales.

use half::{bf16, f16};

use super::blocks::*;
use super::{dequantize_row, quantize_row};
use crate::GgmlType;

fn h(x: f32) -> f16 {
    f16::from_f32(x)
}

fn deq(ty: GgmlType, bytes: &[u8], n: usize) -> Vec<f32> {
    let mut out = vec![f32::NAN; n];
    dequantize_row(ty, bytes, &mut out).unwrap();
    out
}

#[test]
fn floats() {
    let f32s: Vec<u8> = [1.5f32, -2.0, 0.1].iter().flat_map(|v| v.to_le_bytes()).collect();
    assert_eq!(deq(GgmlType::F32, &f32s, 3), [1.5, -2.0, 0.1]);
    let f16s = [0x00, 0x3C, 0x00, 0xC0, 0x01, 0x00]; // 1.0, -2.0, smallest subnormal
    assert_eq!(deq(GgmlType::F16, &f16s, 3), [1.0, -2.0, 2f32.powi(-24)]);
    let bf16s = [0x80, 0x3F, 0x40, 0xC0]; // 1.0, -3.0
    assert_eq!(deq(GgmlType::BF16, &bf16s, 2), [1.0, -3.0]);
    assert_eq!(bf16::from_f32(1.0).to_bits(), 0x3F80);
}

/// `qs[j] = j | (15 - j) << 4`: element `j` has code `j`, element `16 + j` code `15 - j`.
fn ramp_nibbles() -> [u8; 16] {
    std::array::from_fn(|j| j as u8 | ((15 - j as u8) << 4))
}

fn nibble_code(e: usize) -> i32 {
    if e < 16 {
        e as i32
    } else {
        15 - (e as i32 - 16)
    }
}

#[test]
fn q4_0() {
    let b = BlockQ4_0 { d: h(0.5), qs: ramp_nibbles() };
    let got = deq(GgmlType::Q4_0, as_bytes(&[b]), 32);
    for (e, v) in got.iter().enumerate() {
        assert_eq!(*v, 0.5 * (nibble_code(e) - 8) as f32, "element {e}");
    }
}

#[test]
fn q4_1() {
    let b = BlockQ4_1 { d: h(0.25), m: h(-1.0), qs: ramp_nibbles() };
    let got = deq(GgmlType::Q4_1, as_bytes(&[b]), 32);
    for (e, v) in got.iter().enumerate() {
        assert_eq!(*v, 0.25 * nibble_code(e) as f32 - 1.0, "element {e}");
    }
}

/// `qh = 0xAAAA_AAAA`: odd elements have the 5th bit set.
#[test]
fn q5_0_and_q5_1() {
    let qh = 0xAAAA_AAAAu32.to_le_bytes();
    let code = |e: usize| nibble_code(e) + if e % 2 == 1 { 16 } else { 0 };
    let b0 = BlockQ5_0 { d: h(1.0), qh, qs: ramp_nibbles() };
    for (e, v) in deq(GgmlType::Q5_0, as_bytes(&[b0]), 32).iter().enumerate() {
        assert_eq!(*v, (code(e) - 16) as f32, "q5_0 element {e}");
    }
    let b1 = BlockQ5_1 { d: h(2.0), m: h(0.5), qh, qs: ramp_nibbles() };
    for (e, v) in deq(GgmlType::Q5_1, as_bytes(&[b1]), 32).iter().enumerate() {
        assert_eq!(*v, 2.0 * code(e) as f32 + 0.5, "q5_1 element {e}");
    }
}

#[test]
fn q8_0_q8_1_q8_k() {
    let b = BlockQ8_0 { d: h(0.125), qs: std::array::from_fn(|j| j as i8 - 16) };
    for (e, v) in deq(GgmlType::Q8_0, as_bytes(&[b]), 32).iter().enumerate() {
        assert_eq!(*v, (e as f32 - 16.0) / 8.0);
    }
    let b = BlockQ8_1 { d: h(0.5), s: h(123.0), qs: std::array::from_fn(|j| -(j as i8)) };
    for (e, v) in deq(GgmlType::Q8_1, as_bytes(&[b]), 32).iter().enumerate() {
        assert_eq!(*v, -0.5 * e as f32);
    }
    let b = BlockQ8K { d: 0.25, qs: std::array::from_fn(|j| ((j % 200) as i32 - 100) as i8), bsums: [0; 16] };
    for (e, v) in deq(GgmlType::Q8K, as_bytes(&[b]), 256).iter().enumerate() {
        assert_eq!(*v, 0.25 * ((e % 200) as f32 - 100.0));
    }
}

/// Every `qs` byte is `0b11_10_01_00`: the 2-bit field at shift `2s` is `s`, so
/// element `e` has low bits `(e % 128) / 32`.
const FIELDS_0123: u8 = 0b1110_0100;

#[test]
fn q2_k() {
    let scales: [u8; 16] = std::array::from_fn(|g| (1 + g as u8 % 3) | ((g as u8 % 2) << 4));
    let b = BlockQ2K { scales, qs: [FIELDS_0123; 64], d: h(1.0), dmin: h(0.5) };
    for (e, v) in deq(GgmlType::Q2K, as_bytes(&[b]), 256).iter().enumerate() {
        let g = e / 16;
        let want = (1 + g % 3) as f32 * ((e % 128) / 32) as f32 - 0.5 * (g % 2) as f32;
        assert_eq!(*v, want, "element {e}");
    }
}

/// Packs 16 biased 6-bit Q3_K scales (the inverse of `scales_q3k`, written from
/// ggml's description rather than from that function).
fn pack_q3k_scales(raw: [u8; 16]) -> [u8; 12] {
    let mut out = [0u8; 12];
    for (i, &s) in raw.iter().enumerate() {
        out[i % 8] |= (s & 0x0F) << (4 * (i / 8));
        out[8 + i % 4] |= (s >> 4) << (2 * (i / 4));
    }
    out
}

#[test]
fn q3_k() {
    // Scale of group g is g - 5 (raw 6-bit value g + 27), spanning negative,
    // zero and values needing the high bits.
    let scales = pack_q3k_scales(std::array::from_fn(|g| g as u8 + 27));
    // hmask bit c set for even chunks c = e / 32: those have no -4 offset.
    let b = BlockQ3K { hmask: [0x55; 32], qs: [FIELDS_0123; 64], scales, d: h(0.5) };
    for (e, v) in deq(GgmlType::Q3K, as_bytes(&[b]), 256).iter().enumerate() {
        let low = ((e % 128) / 32) as i32;
        let q = low - if (e / 32) % 2 == 1 { 4 } else { 0 };
        let want = 0.5 * ((e / 16) as i32 - 5) as f32 * q as f32;
        assert_eq!(*v, want, "element {e}");
    }
}

const SC: [u8; 8] = [1, 2, 3, 4, 17, 33, 50, 63];
const MN: [u8; 8] = [0, 5, 10, 15, 20, 40, 60, 63];

/// Packs Q4_K/Q5_K scales and mins per ggml-common.h's comment on `block_q4_K`.
fn pack_k4_scales(sc: [u8; 8], mn: [u8; 8]) -> [u8; 12] {
    let mut out = [0u8; 12];
    for j in 0..4 {
        out[j] = sc[j] | ((sc[j + 4] >> 4) << 6);
        out[j + 4] = mn[j] | ((mn[j + 4] >> 4) << 6);
        out[j + 8] = (sc[j + 4] & 0x0F) | ((mn[j + 4] & 0x0F) << 4);
    }
    out
}

/// `qs` bytes `b` with low nibble `b % 16` and high nibble `15 - b % 16`; element
/// `e` (sub-block `j = e / 32`, `l = e % 32`) has code `l % 16` for even `j`.
fn k4_code(e: usize) -> u8 {
    let l = (e % 32) as u8;
    if (e / 32).is_multiple_of(2) {
        l % 16
    } else {
        15 - l % 16
    }
}

#[test]
fn q4_k() {
    let qs: [u8; 128] = std::array::from_fn(|b| (b % 16) as u8 | ((15 - (b % 16) as u8) << 4));
    let b = BlockQ4K { d: h(0.5), dmin: h(0.25), scales: pack_k4_scales(SC, MN), qs };
    for (e, v) in deq(GgmlType::Q4K, as_bytes(&[b]), 256).iter().enumerate() {
        let j = e / 32;
        let want = 0.5 * SC[j] as f32 * k4_code(e) as f32 - 0.25 * MN[j] as f32;
        assert_eq!(*v, want, "element {e}");
    }
}

#[test]
fn q5_k() {
    let qs: [u8; 128] = std::array::from_fn(|b| (b % 16) as u8 | ((15 - (b % 16) as u8) << 4));
    // qh[l] = 0b1010_0101 for even l, 0 for odd l: sub-blocks 0, 2, 5, 7 get the
    // 5th bit on even elements.
    let qh: [u8; 32] = std::array::from_fn(|l| if l % 2 == 0 { 0b1010_0101 } else { 0 });
    let b = BlockQ5K { d: h(0.5), dmin: h(0.25), scales: pack_k4_scales(SC, MN), qh, qs };
    for (e, v) in deq(GgmlType::Q5K, as_bytes(&[b]), 256).iter().enumerate() {
        let j = e / 32;
        let high = if e % 2 == 0 && [0, 2, 5, 7].contains(&j) { 16 } else { 0 };
        let want = 0.5 * SC[j] as f32 * (k4_code(e) + high) as f32 - 0.25 * MN[j] as f32;
        assert_eq!(*v, want, "element {e}");
    }
}

#[test]
fn q6_k() {
    // ql = 0x21: low 4 bits are 1 in the first 64 of each half, 2 in the second;
    // qh fields at shift 2s are s, so element r of a half has high bits r / 32.
    let scales: [i8; 16] = std::array::from_fn(|g| g as i8 - 8);
    let b = BlockQ6K { ql: [0x21; 128], qh: [FIELDS_0123; 64], scales, d: h(0.5) };
    for (e, v) in deq(GgmlType::Q6K, as_bytes(&[b]), 256).iter().enumerate() {
        let r = e % 128;
        let q = if r < 64 { 1 } else { 2 } + 16 * (r / 32) as i32 - 32;
        let want = 0.5 * ((e / 16) as i32 - 8) as f32 * q as f32;
        assert_eq!(*v, want, "element {e}");
    }
}

#[test]
fn rejects_wrong_lengths_and_unaligned_ok() {
    let mut out = [0f32; 32];
    let err = dequantize_row(GgmlType::Q4_0, &[0u8; 17], &mut out).unwrap_err();
    assert!(err.to_string().contains("expected 18"), "{err}");
    let err = dequantize_row(GgmlType::Q4_0, &[0u8; 18], &mut out[..31]).unwrap_err();
    assert!(err.to_string().contains("multiple"), "{err}");
    // A block at an odd address reads the same as an aligned one.
    let b = BlockQ4_1 { d: h(0.25), m: h(-1.0), qs: ramp_nibbles() };
    let mut buf = [0u8; 21];
    buf[1..].copy_from_slice(as_bytes(&[b]));
    assert_eq!(deq(GgmlType::Q4_1, &buf[1..], 32), deq(GgmlType::Q4_1, as_bytes(&[b]), 32));
}

/// MXFP4 (ggml's `block_mxfp4`): a hand-made block decodes to the E2M1 grid times its
/// E8M0 scale; quantizing picks the nearest code under ggml's exponent rule; zero blocks
/// stay zero; the generic dot equals dequantize-then-multiply.
#[test]
fn mxfp4_blocks_decode_and_quantize_as_ggml_does() {
    // e = 127: the halved scale is 0.5, so the doubled values land on E2M1 itself.
    let mut block = vec![127u8];
    block.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
    let mut out = [0f32; 32];
    dequantize_row(GgmlType::Mxfp4, &block, &mut out).unwrap();
    let grid = [0.0f32, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0];
    for j in 0..16 {
        assert_eq!(out[j], grid[j], "low nibble {j}");
        assert_eq!(out[j + 16], grid[15 - j], "high nibble {j}");
    }
    // Representable values (max |x| = 6 gives e = floor(log2 6) - 2 + 127 = 127) round-trip.
    let mut back = [0f32; 32];
    let mut q = [0u8; 17];
    quantize_row(GgmlType::Mxfp4, &out, &mut q).unwrap();
    assert_eq!(q[0], 127);
    dequantize_row(GgmlType::Mxfp4, &q, &mut back).unwrap();
    assert_eq!(back, out, "representable values come back exactly");
    // Random blocks at several magnitudes: every value takes its nearest code.
    let mut rng = loupe_core::SplitMix64::new(5);
    for scale in [1e-3f32, 0.7, 37.0, 3e4] {
        let x: Vec<f32> =
            (0..64).map(|_| ((rng.next_u64() >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * scale).collect();
        let mut q = vec![0u8; 34];
        quantize_row(GgmlType::Mxfp4, &x, &mut q).unwrap();
        let mut y = vec![0f32; 64];
        dequantize_row(GgmlType::Mxfp4, &q, &mut y).unwrap();
        for (b, (xs, ys)) in x.chunks(32).zip(y.chunks(32)).enumerate() {
            let amax = xs.iter().fold(0f32, |m, v| m.max(v.abs()));
            assert_eq!(q[b * 17], (amax.log2().floor() - 2.0 + 127.0) as u8, "scale {scale}: block exponent");
            let d = f32::powi(2.0, i32::from(q[b * 17]) - 128);
            for (&xv, &yv) in xs.iter().zip(ys) {
                let nearest = [0.0f32, 1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0]
                    .iter()
                    .flat_map(|&k| [k * d, -k * d])
                    .map(|c| (c - xv).abs())
                    .fold(f32::INFINITY, f32::min);
                assert_eq!((yv - xv).abs(), nearest, "scale {scale}: {xv} became {yv}");
            }
        }
        let act: Vec<f32> = (0..64).map(|i| (i as f32 * 0.37).sin()).collect();
        let want: f32 =
            y.chunks(32).zip(act.chunks(32)).map(|(w, a)| w.iter().zip(a).map(|(p, q)| p * q).sum::<f32>()).sum();
        assert_eq!(crate::linear::dot_row_scalar(GgmlType::Mxfp4, &q, &act).unwrap(), want);
    }
    // An all-zero block: exponent 0, zero codes, zeros back.
    let mut q = [0xAAu8; 17];
    quantize_row(GgmlType::Mxfp4, &[0.0; 32], &mut q).unwrap();
    assert_eq!(q, [0u8; 17]);
}

/// NVFP4 (ggml's `block_nvfp4`): the UE4M3 sub-block scales decode as ggml's
/// `ggml_ue4m3_to_fp32` (halved, 0x00 and 0x7F give 0); a hand-made block decodes with each
/// sub-block's byte j holding elements j and j + 8; quantizing takes each sub-block's scale
/// from its own largest magnitude and every value its nearest code; the generic dot equals
/// dequantize-then-multiply; zero and NaN-scale sub-blocks give zeros, never NaN.
#[test]
fn nvfp4_blocks_decode_and_quantize_as_ggml_does() {
    use super::dequant::ue4m3_half;
    // Every scale code against E4M3FN's own decoding (bit 7 ignored, halved).
    for x in 0u8..=255 {
        let want =
            if x & 0x7f == 0 || x == 0x7f { 0.0 } else { loupe_core::fp8::Fp8Format::E4M3.decode(x & 0x7f) * 0.5 };
        if x == 0xff {
            // ggml decodes 0xFF as exponent 15, mantissa 7 (only 0x7F is its NaN): 240.
            assert_eq!(ue4m3_half(x), 240.0);
            continue;
        }
        assert_eq!(ue4m3_half(x), want, "scale code {x:#04x}");
    }
    // Sub-block scales 1.0, 0.5, 2.0 (as raw UE4M3 values, decoded halved), and 0x7F.
    let codes = [0x38u8, 0x30, 0x40, 0x7f];
    let mut block = codes.to_vec();
    for _ in 0..4 {
        block.extend((0..8u8).map(|j| j | ((15 - j) << 4)));
    }
    let mut out = [0f32; 64];
    dequantize_row(GgmlType::Nvfp4, &block, &mut out).unwrap();
    let grid = [0.0f32, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, 0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0];
    for (s, raw) in [1.0f32, 0.5, 2.0, 0.0].into_iter().enumerate() {
        for j in 0..8 {
            assert_eq!(out[16 * s + j], grid[j] * raw, "sub-block {s}, low nibble {j}");
            assert_eq!(out[16 * s + j + 8], grid[15 - j] * raw, "sub-block {s}, high nibble {j}");
        }
    }
    // Values on the grid with max |x| = 6 per sub-block round-trip exactly (scale 1.0).
    let x: Vec<f32> = (0..64).map(|i| grid[(i * 7) % 16] * if i % 16 == 0 { 0.0 } else { 1.0 }).collect();
    let mut x = x;
    for s in 0..4 {
        x[16 * s + 3] = 6.0;
    }
    let mut q = [0u8; 36];
    quantize_row(GgmlType::Nvfp4, &x, &mut q).unwrap();
    assert_eq!(&q[..4], &[0x38; 4], "max 6 -> raw scale 1.0");
    let mut back = [0f32; 64];
    dequantize_row(GgmlType::Nvfp4, &q, &mut back).unwrap();
    assert_eq!(back.to_vec(), x, "representable values come back exactly");
    // Random blocks at several magnitudes: nearest code at the sub-block's decoded scale.
    let mut rng = loupe_core::SplitMix64::new(9);
    for mag in [1e-3f32, 0.7, 37.0, 300.0] {
        let x: Vec<f32> = (0..128).map(|_| ((rng.next_u64() >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * mag).collect();
        let mut q = vec![0u8; 72];
        quantize_row(GgmlType::Nvfp4, &x, &mut q).unwrap();
        let mut y = vec![0f32; 128];
        dequantize_row(GgmlType::Nvfp4, &q, &mut y).unwrap();
        for (sb, (xs, ys)) in x.chunks(16).zip(y.chunks(16)).enumerate() {
            let amax = xs.iter().fold(0f32, |m, v| m.max(v.abs()));
            let code = q[(sb / 4) * 36 + sb % 4];
            assert_eq!(
                code,
                loupe_core::fp8::Fp8Format::E4M3.encode(amax / 6.0),
                "magnitude {mag}: sub-block {sb}'s scale"
            );
            let d = ue4m3_half(code);
            for (&xv, &yv) in xs.iter().zip(ys) {
                let nearest = [0.0f32, 1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 12.0]
                    .iter()
                    .flat_map(|&k| [k * d, -k * d])
                    .map(|c| (c - xv).abs())
                    .fold(f32::INFINITY, f32::min);
                assert_eq!((yv - xv).abs(), nearest, "magnitude {mag}: {xv} became {yv}");
            }
        }
        let act: Vec<f32> = (0..128).map(|i| (i as f32 * 0.37).sin()).collect();
        let want: f32 =
            y.chunks(64).zip(act.chunks(64)).map(|(w, a)| w.iter().zip(a).map(|(p, q)| p * q).sum::<f32>()).sum();
        assert_eq!(crate::linear::dot_row_scalar(GgmlType::Nvfp4, &q, &act).unwrap(), want);
        let mut out = [0f32; 1];
        let qm = crate::linear::QMatrix::new(GgmlType::Nvfp4, 1, 128, q.clone()).unwrap();
        crate::linear::matmul_wq(&act, &qm, &mut out, 1).unwrap();
        // The matmul runs the active ISA's row dot (AVX2 sums in another order than the
        // reference's block-by-block f32 loop), which stays within f32 rounding of it.
        let row_dot = crate::linear::dot_row(crate::quant::Isa::active(), GgmlType::Nvfp4, &q, &act, &[]).unwrap();
        assert_eq!(out[0], row_dot, "the matmul's generic path");
        assert!(
            (row_dot - want).abs() <= 1e-5 * (1.0 + want.abs()),
            "the active ISA's dot {row_dot} vs the reference {want}"
        );
        // A per-tensor scale multiplies the finished output (and the dequantized matrix).
        let qm = qm.with_tensor_scale(0.25);
        crate::linear::matmul_wq(&act, &qm, &mut out, 1).unwrap();
        assert_eq!(out[0], row_dot * 0.25, "the per-tensor scale");
        assert_eq!(qm.dequantize(), y.iter().map(|v| v * 0.25).collect::<Vec<_>>());
    }
    // All-zero and NaN sub-blocks: scale code 0 and zeros back (never NaN).
    let mut x = [0f32; 64];
    x[16..32].fill(f32::NAN);
    let mut q = [0xAAu8; 36];
    quantize_row(GgmlType::Nvfp4, &x, &mut q).unwrap();
    assert_eq!(&q[..2], &[0, 0]);
    let mut back = [1f32; 64];
    dequantize_row(GgmlType::Nvfp4, &q, &mut back).unwrap();
    assert!(back.iter().all(|v| *v == 0.0), "{back:?}");
}

/// Q4_K (ggml's `quantize_row_q4_K_ref`): on rows of several shapes and magnitudes the
/// reconstruction error is that of a 4-bit grid (relative RMS under 0.09 on uniform data)
/// and no worse than Q4_1's on the same values (the least-squares search beats its min-max
/// fit, even after the 6-bit scales); the scale bytes decode to 6-bit values; an all-zero
/// and a constant row come back exactly.
#[test]
fn q4_k_quantizes_near_a_4_bit_grid_and_no_worse_than_q4_1() {
    let mut rng = loupe_core::SplitMix64::new(21);
    let rms = |a: &[f32], b: &[f32]| {
        (a.iter().zip(b).map(|(x, y)| f64::from(x - y).powi(2)).sum::<f64>() / a.len() as f64).sqrt()
    };
    for mag in [1e-3f32, 0.05, 1.0, 40.0] {
        for offset in [0.0f32, 0.3] {
            let x: Vec<f32> = (0..512)
                .map(|_| (((rng.next_u64() >> 40) as f32 / (1u64 << 24) as f32 - 0.5) + offset) * mag)
                .collect();
            let mut q = vec![0u8; 2 * 144];
            quantize_row(GgmlType::Q4K, &x, &mut q).unwrap();
            let mut y = vec![0f32; 512];
            dequantize_row(GgmlType::Q4K, &q, &mut y).unwrap();
            let mut q41 = vec![0u8; 16 * 20];
            quantize_row(GgmlType::Q4_1, &x, &mut q41).unwrap();
            let mut y41 = vec![0f32; 512];
            dequantize_row(GgmlType::Q4_1, &q41, &mut y41).unwrap();
            let (e, e41) = (rms(&x, &y), rms(&x, &y41));
            let spread = rms(&x, &vec![offset * mag; 512]);
            assert!(e < 0.09 * spread, "magnitude {mag}, offset {offset}: relative RMS error {}", e / spread);
            assert!(e <= 1.05 * e41, "magnitude {mag}, offset {offset}: Q4_K error {e} against Q4_1's {e41}");
        }
    }
    for row in [[0.0f32; 256], [0.75f32; 256]] {
        let mut q = [0u8; 144];
        quantize_row(GgmlType::Q4K, &row, &mut q).unwrap();
        let mut y = [1f32; 256];
        dequantize_row(GgmlType::Q4K, &q, &mut y).unwrap();
        let tol = row[0].abs() * 2e-3;
        assert!(y.iter().all(|v| (v - row[0]).abs() <= tol), "{} came back as {:?}", row[0], &y[..4]);
    }
}

/// `GgmlType::Fp8E4M3`: the block layout (f16 `d`, then 32 codes), `d = f16(max|x| / 448)`,
/// codes round to nearest even against that `d` (representable values come back exactly),
/// and the guarded scale: zero, tiny (below what an f16 scale can hold) and huge blocks
/// never produce NaN, where the unguarded reciprocal writes NaN codes.
#[test]
fn fp8_e4m3_blocks_quantize_with_a_guarded_scale() {
    use crate::fp8::{decode_e4m3, encode_e4m3};
    // Values on the E4M3 grid times d = 0.5: they come back bit for bit.
    let grid: Vec<f32> =
        (0..32).map(|j| decode_e4m3(((j * 37) % 0x7f) as u8 ^ if j % 3 == 0 { 0x80 } else { 0 }) * 0.5).collect();
    let mut x = grid.clone();
    x[5] = 224.0; // 448 * 0.5: max|x| / 448 = 0.5 exactly
    let mut q = [0u8; 34];
    quantize_row(GgmlType::Fp8E4M3, &x, &mut q).unwrap();
    assert_eq!(f16::from_le_bytes([q[0], q[1]]), h(0.5));
    assert_eq!(q[2 + 5], 0x7e, "the largest value takes E4M3's largest code");
    assert_eq!(deq(GgmlType::Fp8E4M3, &q, 32), x, "representable values come back exactly");
    // Random blocks at several magnitudes: each code is the nearest-even E4M3 of x / d.
    let mut rng = loupe_core::SplitMix64::new(21);
    for mag in [3e-4f32, 0.05, 1.0, 900.0] {
        let x: Vec<f32> = (0..96).map(|_| ((rng.next_u64() >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * mag).collect();
        let mut q = vec![0u8; 3 * 34];
        quantize_row(GgmlType::Fp8E4M3, &x, &mut q).unwrap();
        let y = deq(GgmlType::Fp8E4M3, &q, 96);
        for (b, (xs, ys)) in x.chunks(32).zip(y.chunks(32)).enumerate() {
            let amax = xs.iter().fold(0f32, |m, v| m.max(v.abs()));
            let d = f16::from_le_bytes([q[34 * b], q[34 * b + 1]]);
            assert_eq!(d, h(amax / 448.0), "magnitude {mag}: block {b}'s scale");
            for (j, (&xv, &yv)) in xs.iter().zip(ys).enumerate() {
                assert_eq!(q[34 * b + 2 + j], encode_e4m3(xv * (1.0 / d.to_f32())), "magnitude {mag}: {xv}'s code");
                // E4M3 keeps 3 mantissa bits: half an ulp is 2^-4 relative, plus the
                // subnormal step (2^-9 * d) near zero.
                assert!(
                    (yv - xv).abs() <= xv.abs() / 16.0 + d.to_f32() / 512.0 + 1e-12,
                    "magnitude {mag}: {xv} became {yv}"
                );
            }
        }
    }
    // The guard: an all-zero block, a block whose scale is below f16's smallest subnormal
    // (max 1e-6: 1e-6 / 448 rounds to f16 zero), and a denormal f32 block all store d = 0 and
    // codes of +-0; the unguarded reciprocal (1 / 0 = inf, 0 * inf = NaN) writes NaN codes.
    for (label, v) in [("zero", 0.0f32), ("tiny", 1e-6), ("denormal", 1e-40)] {
        // With an exact zero among them (pruned weights): the unguarded 0 * inf.
        let x: Vec<f32> = (0..32)
            .map(|j| {
                if j % 4 == 3 {
                    0.0
                } else if j % 2 == 0 {
                    v
                } else {
                    -v * 0.5
                }
            })
            .collect();
        let mut q = [0xAAu8; 34];
        quantize_row(GgmlType::Fp8E4M3, &x, &mut q).unwrap();
        assert_eq!(&q[..2], &[0, 0], "{label} block: d = 0");
        assert!(q[2..].iter().all(|&c| c & 0x7f == 0), "{label} block: zero codes (the sign kept)");
        assert!(deq(GgmlType::Fp8E4M3, &q, 32).iter().all(|&y| y == 0.0), "{label} block dequantizes to zeros");
        let mut bad = [0u8; 34];
        super::quantize::fp8_e4m3_unguarded(&x, &mut bad);
        assert!(
            deq(GgmlType::Fp8E4M3, &bad, 32).iter().any(|y| y.is_nan()),
            "{label} block: the unguarded formula writes NaN"
        );
    }
    // A huge block: the scale clamps to f16's largest and the codes saturate, finite.
    let x: Vec<f32> = (0..32).map(|j| 1e30 * if j % 2 == 0 { 1.0 } else { -0.25 }).collect();
    quantize_row(GgmlType::Fp8E4M3, &x, &mut q).unwrap();
    assert_eq!(f16::from_le_bytes([q[0], q[1]]), f16::MAX);
    assert!(deq(GgmlType::Fp8E4M3, &q, 32).iter().all(|y| y.is_finite()));
}

/// The banded float kernels (segmented over long `k`) give every output the bits of the
/// one-weight-row kernel, on every ISA this CPU has: `k` past the segmented threshold with a
/// 16-wide and a scalar tail, more weight rows than one group and one call, 1..8 activation rows.
#[test]
fn float_rows_band_matches_float_rows_bit_for_bit() {
    use super::{float_rows, float_rows_band, Isa};
    for isa in Isa::available() {
        for ty in [GgmlType::F32, GgmlType::F16, GgmlType::BF16] {
            for (n, k) in [(70, 2100), (21, 4096), (5, 896)] {
                let wf = crate::testing::signed(n * k, 7);
                let w: Vec<u8> = match ty {
                    GgmlType::F32 => wf.iter().flat_map(|v| v.to_le_bytes()).collect(),
                    GgmlType::F16 => wf.iter().flat_map(|&v| f16::from_f32(v).to_le_bytes()).collect(),
                    _ => wf.iter().flat_map(|&v| bf16::from_f32(v).to_le_bytes()).collect(),
                };
                let row_bytes = w.len() / n;
                for m in 1..=8 {
                    let x = crate::testing::signed(m * k, 11 + m as u32);
                    let mut band = vec![f32::NAN; m * n];
                    float_rows_band(isa, ty, &w, &x, k, |i, j, v| band[i * n + j] = v);
                    for j in 0..n {
                        let mut one = vec![f32::NAN; m];
                        float_rows(isa, ty, &w[j * row_bytes..(j + 1) * row_bytes], &x, k, |i, v| one[i] = v);
                        for i in 0..m {
                            assert_eq!(
                                band[i * n + j].to_bits(),
                                one[i].to_bits(),
                                "{isa} {ty} {n}x{k} m={m} ({i}, {j})"
                            );
                        }
                    }
                }
            }
        }
    }
}
