//! Scalar reference dot products, one per weight type.
//!
//! Each sums exact integer products per block (or sub-block) and applies the f32
//! scales once per block, in the same grouping as ggml's generic
//! `ggml_vec_dot_*_generic` (ggml/src/ggml-cpu/quants.c), so results agree with
//! ggml up to f32 summation order. These are the definitions the SIMD kernels are
//! tested against; they favour clarity over speed.

use half::{bf16, f16};
use loupe_core::GgmlType;

use super::blocks::*;
use super::dequant::{q5_values, q6_value};
use super::VecDotFn;

pub(super) fn dot_fn(ty: GgmlType) -> VecDotFn {
    match ty {
        GgmlType::F32 => f32_f32,
        GgmlType::F16 => f16_f32,
        GgmlType::BF16 => bf16_f32,
        GgmlType::Q4_0 => q4_0_q8_0,
        GgmlType::Q4_1 => q4_1_q8_1,
        GgmlType::Q5_0 => q5_0_q8_0,
        GgmlType::Q5_1 => q5_1_q8_1,
        GgmlType::Q8_0 => q8_0_q8_0,
        GgmlType::Q8_1 => q8_1_q8_1,
        GgmlType::Q2K => q2k_q8k,
        GgmlType::Q3K => q3k_q8k,
        GgmlType::Q4K => q4k_q8k,
        GgmlType::Q5K => q5k_q8k,
        GgmlType::Q6K => q6k_q8k,
        GgmlType::Q8K => q8k_q8k,
        GgmlType::Mxfp4 => mxfp4_f32,
        GgmlType::Nvfp4 => nvfp4_f32,
        GgmlType::Fp8E4M3 => fp8_e4m3_f32,
        other => panic!("vec_dot: no kernel for {other}"),
    }
}

#[inline(always)]
fn act_f32(a: &[u8], i: usize) -> f32 {
    f32::from_le_bytes([a[4 * i], a[4 * i + 1], a[4 * i + 2], a[4 * i + 3]])
}

/// Float weights: 8 running partial sums (which LLVM keeps in one vector register)
/// rather than one serial chain, for speed and a slightly smaller rounding error.
#[inline(always)]
fn float_dot(w: impl Fn(usize) -> f32, a: &[u8], n: usize) -> f32 {
    let mut acc = [0.0f32; 8];
    let main = n - n % 8;
    for i in (0..main).step_by(8) {
        for (l, s) in acc.iter_mut().enumerate() {
            *s += w(i + l) * act_f32(a, i + l);
        }
    }
    let mut sum: f32 = acc.iter().sum();
    for i in main..n {
        sum += w(i) * act_f32(a, i);
    }
    sum
}

pub(crate) fn f32_f32(w: &[u8], a: &[u8], n: usize) -> f32 {
    super::check_dot(GgmlType::F32, w, a, n);
    float_dot(|i| act_f32(w, i), a, n)
}

pub(crate) fn f16_f32(w: &[u8], a: &[u8], n: usize) -> f32 {
    super::check_dot(GgmlType::F16, w, a, n);
    float_dot(|i| f16::from_le_bytes([w[2 * i], w[2 * i + 1]]).to_f32(), a, n)
}

pub(crate) fn bf16_f32(w: &[u8], a: &[u8], n: usize) -> f32 {
    super::check_dot(GgmlType::BF16, w, a, n);
    float_dot(|i| bf16::from_le_bytes([w[2 * i], w[2 * i + 1]]).to_f32(), a, n)
}

/// MXFP4 against f32 activations (ggml multiplies them in f32 too, against its Q8_0
/// activations; loupe keeps the activations exact): each block's codes in the doubled E2M1
/// grid, times the block's halved E8M0 scale.
pub(crate) fn mxfp4_f32(w: &[u8], a: &[u8], n: usize) -> f32 {
    super::check_dot(GgmlType::Mxfp4, w, a, n);
    let mut vals = [0f32; QK];
    let mut acc = 0f32;
    for (b, block) in w[..n / QK * 17].chunks_exact(17).enumerate() {
        super::dequant::mxfp4(block, &mut vals);
        acc += vals.iter().enumerate().map(|(j, &v)| v * act_f32(a, b * QK + j)).sum::<f32>();
    }
    acc
}

/// NVFP4 against f32 activations, as [`mxfp4_f32`]: each 64-element block's codes in the
/// doubled E2M1 grid, times their sub-block's halved UE4M3 scale. The per-tensor scale, when
/// the tensor has one, multiplies the finished row (`QMatrix::tensor_scale`).
pub(crate) fn nvfp4_f32(w: &[u8], a: &[u8], n: usize) -> f32 {
    super::check_dot(GgmlType::Nvfp4, w, a, n);
    let mut vals = [0f32; 64];
    let mut acc = 0f32;
    for (b, block) in w[..n / 64 * 36].chunks_exact(36).enumerate() {
        super::dequant::nvfp4(block, &mut vals);
        acc += vals.iter().enumerate().map(|(j, &v)| v * act_f32(a, b * 64 + j)).sum::<f32>();
    }
    acc
}

/// FP8 E4M3 blocks against f32 activations, as [`mxfp4_f32`]: each block's codes widened
/// exactly, dotted with the activations, times the block's f16 scale.
pub(crate) fn fp8_e4m3_f32(w: &[u8], a: &[u8], n: usize) -> f32 {
    super::check_dot(GgmlType::Fp8E4M3, w, a, n);
    let mut acc = 0f32;
    for (b, block) in w[..n / QK * 34].chunks_exact(34).enumerate() {
        let d = f16::from_le_bytes([block[0], block[1]]).to_f32();
        let s: f32 =
            block[2..].iter().enumerate().map(|(j, &q)| crate::fp8::decode_e4m3(q) * act_f32(a, b * QK + j)).sum();
        acc += s * d;
    }
    acc
}

/// Sum of `q[j] * y[j]` over a block of 32.
#[inline(always)]
fn idot32(q: &[i32; QK], y: &[i8; QK]) -> i32 {
    q.iter().zip(y).map(|(&a, &b)| a * b as i32).sum()
}

#[inline(always)]
fn nibbles(qs: &[u8; QK / 2], bias: i32) -> [i32; QK] {
    let mut q = [0i32; QK];
    for j in 0..QK / 2 {
        q[j] = (qs[j] & 0x0F) as i32 - bias;
        q[j + QK / 2] = (qs[j] >> 4) as i32 - bias;
    }
    q
}

pub(crate) fn q4_0_q8_0(w: &[u8], a: &[u8], n: usize) -> f32 {
    super::check_dot(GgmlType::Q4_0, w, a, n);
    let mut sum = 0.0f32;
    for i in 0..n / QK {
        let (x, y): (BlockQ4_0, BlockQ8_0) = (read(w, i), read(a, i));
        let isum = idot32(&nibbles(&x.qs, 8), &y.qs);
        sum += isum as f32 * (x.d.to_f32() * y.d.to_f32());
    }
    sum
}

/// `sum (d_x q_x + m_x)(d_y q_y) = d_x d_y sum(q_x q_y) + m_x s_y`, with
/// `s_y = d_y sum(q_y)` read from the Q8_1 block.
pub(crate) fn q4_1_q8_1(w: &[u8], a: &[u8], n: usize) -> f32 {
    super::check_dot(GgmlType::Q4_1, w, a, n);
    let mut sum = 0.0f32;
    for i in 0..n / QK {
        let (x, y): (BlockQ4_1, BlockQ8_1) = (read(w, i), read(a, i));
        let isum = idot32(&nibbles(&x.qs, 0), &y.qs);
        sum += isum as f32 * (x.d.to_f32() * y.d.to_f32()) + x.m.to_f32() * y.s.to_f32();
    }
    sum
}

#[inline(always)]
fn q5(qh: [u8; 4], qs: &[u8; QK / 2], bias: i32) -> [i32; QK] {
    q5_values(qh, qs).map(|q| q as i32 - bias)
}

pub(crate) fn q5_0_q8_0(w: &[u8], a: &[u8], n: usize) -> f32 {
    super::check_dot(GgmlType::Q5_0, w, a, n);
    let mut sum = 0.0f32;
    for i in 0..n / QK {
        let (x, y): (BlockQ5_0, BlockQ8_0) = (read(w, i), read(a, i));
        let isum = idot32(&q5(x.qh, &x.qs, 16), &y.qs);
        sum += isum as f32 * (x.d.to_f32() * y.d.to_f32());
    }
    sum
}

pub(crate) fn q5_1_q8_1(w: &[u8], a: &[u8], n: usize) -> f32 {
    super::check_dot(GgmlType::Q5_1, w, a, n);
    let mut sum = 0.0f32;
    for i in 0..n / QK {
        let (x, y): (BlockQ5_1, BlockQ8_1) = (read(w, i), read(a, i));
        let isum = idot32(&q5(x.qh, &x.qs, 0), &y.qs);
        sum += isum as f32 * (x.d.to_f32() * y.d.to_f32()) + x.m.to_f32() * y.s.to_f32();
    }
    sum
}

pub(crate) fn q8_0_q8_0(w: &[u8], a: &[u8], n: usize) -> f32 {
    super::check_dot(GgmlType::Q8_0, w, a, n);
    let mut sum = 0.0f32;
    for i in 0..n / QK {
        let (x, y): (BlockQ8_0, BlockQ8_0) = (read(w, i), read(a, i));
        let isum = idot32(&x.qs.map(|q| q as i32), &y.qs);
        sum += isum as f32 * (x.d.to_f32() * y.d.to_f32());
    }
    sum
}

pub(crate) fn q8_1_q8_1(w: &[u8], a: &[u8], n: usize) -> f32 {
    super::check_dot(GgmlType::Q8_1, w, a, n);
    let mut sum = 0.0f32;
    for i in 0..n / QK {
        let (x, y): (BlockQ8_1, BlockQ8_1) = (read(w, i), read(a, i));
        let isum = idot32(&x.qs.map(|q| q as i32), &y.qs);
        sum += isum as f32 * (x.d.to_f32() * y.d.to_f32());
    }
    sum
}

/// Integer dot of 16 quants with 16 activations of group `g` of a Q8_K block.
#[inline(always)]
fn group16(q: impl Fn(usize) -> i32, y: &BlockQ8K, g: usize) -> i32 {
    (16 * g..16 * g + 16).map(|e| q(e) * y.qs[e] as i32).sum()
}

/// Q2_K: `x = d sc q - dmin m` per 16; the min part uses Q8_K's `bsums`:
/// `sum_g m_g * bsums[g]`.
pub(crate) fn q2k_q8k(w: &[u8], a: &[u8], n: usize) -> f32 {
    super::check_dot(GgmlType::Q2K, w, a, n);
    let mut sum = 0.0f32;
    for i in 0..n / QK_K {
        let (x, y): (BlockQ2K, BlockQ8K) = (read(w, i), read(a, i));
        let q = |e: usize| ((x.qs[32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3) as i32;
        let mut isum = 0i32;
        let mut summs = 0i32;
        for g in 0..16 {
            isum += (x.scales[g] & 0x0F) as i32 * group16(q, &y, g);
            summs += (x.scales[g] >> 4) as i32 * y.bsums[g] as i32;
        }
        let dall = y.d * x.d.to_f32();
        let dmin = y.d * x.dmin.to_f32();
        sum += dall * isum as f32 - dmin * summs as f32;
    }
    sum
}

pub(crate) fn q3k_q8k(w: &[u8], a: &[u8], n: usize) -> f32 {
    super::check_dot(GgmlType::Q3K, w, a, n);
    let mut sum = 0.0f32;
    for i in 0..n / QK_K {
        let (x, y): (BlockQ3K, BlockQ8K) = (read(w, i), read(a, i));
        let scales = scales_q3k(&x.scales);
        let q = |e: usize| {
            let low = ((x.qs[32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3) as i32;
            let high = if x.hmask[e % 32] & (1 << (e / 32)) != 0 { 0 } else { 4 };
            low - high
        };
        let isum: i32 = (0..16).map(|g| scales[g] as i32 * group16(q, &y, g)).sum();
        sum += x.d.to_f32() * y.d * isum as f32;
    }
    sum
}

/// Q4_K and Q5_K share the scale/min packing and the dot structure; `q(e)` is the
/// unsigned quant of element `e`.
#[inline(always)]
fn k4_style(d: f16, dmin: f16, scales: &[u8; K_SCALE_SIZE], q: impl Fn(usize) -> i32, y: &BlockQ8K) -> f32 {
    let (sc, mn) = scale_min_k4(scales);
    let mut isum = 0i32;
    let mut summs = 0i32;
    for j in 0..8 {
        let dot = group16(&q, y, 2 * j) + group16(&q, y, 2 * j + 1);
        isum += sc[j] as i32 * dot;
        summs += mn[j] as i32 * (y.bsums[2 * j] as i32 + y.bsums[2 * j + 1] as i32);
    }
    y.d * d.to_f32() * isum as f32 - y.d * dmin.to_f32() * summs as f32
}

pub(crate) fn q4k_q8k(w: &[u8], a: &[u8], n: usize) -> f32 {
    super::check_dot(GgmlType::Q4K, w, a, n);
    let mut sum = 0.0f32;
    for i in 0..n / QK_K {
        let (x, y): (BlockQ4K, BlockQ8K) = (read(w, i), read(a, i));
        let q = |e: usize| ((x.qs[32 * (e / 64) + e % 32] >> (4 * ((e / 32) % 2))) & 0x0F) as i32;
        sum += k4_style(x.d, x.dmin, &x.scales, q, &y);
    }
    sum
}

pub(crate) fn q5k_q8k(w: &[u8], a: &[u8], n: usize) -> f32 {
    super::check_dot(GgmlType::Q5K, w, a, n);
    let mut sum = 0.0f32;
    for i in 0..n / QK_K {
        let (x, y): (BlockQ5K, BlockQ8K) = (read(w, i), read(a, i));
        let q = |e: usize| {
            let low = (x.qs[32 * (e / 64) + e % 32] >> (4 * ((e / 32) % 2))) & 0x0F;
            let high = (x.qh[e % 32] >> (e / 32)) & 1;
            (low | (high << 4)) as i32
        };
        sum += k4_style(x.d, x.dmin, &x.scales, q, &y);
    }
    sum
}

pub(crate) fn q6k_q8k(w: &[u8], a: &[u8], n: usize) -> f32 {
    super::check_dot(GgmlType::Q6K, w, a, n);
    let mut sum = 0.0f32;
    for i in 0..n / QK_K {
        let (x, y): (BlockQ6K, BlockQ8K) = (read(w, i), read(a, i));
        let q = |e: usize| q6_value(&x, e) as i32 - 32;
        let isum: i32 = (0..16).map(|g| x.scales[g] as i32 * group16(q, &y, g)).sum();
        sum += x.d.to_f32() * y.d * isum as f32;
    }
    sum
}

pub(crate) fn q8k_q8k(w: &[u8], a: &[u8], n: usize) -> f32 {
    super::check_dot(GgmlType::Q8K, w, a, n);
    let mut sum = 0.0f32;
    for i in 0..n / QK_K {
        let (x, y): (BlockQ8K, BlockQ8K) = (read(w, i), read(a, i));
        let isum: i32 = x.qs.iter().zip(&y.qs).map(|(&p, &q)| p as i32 * q as i32).sum();
        sum += x.d * y.d * isum as f32;
    }
    sum
}
