//! AVX2 (+FMA, F16C) kernels: the single-row Act16 dots that `decode::dot_row_act16`
//! runs at [`crate::quant::Isa::Avx2`] (and, for Q5_0, Q6_K, Q4_K, Q4_0 and Q5_K, at `Avx512` too), and their
//! multi-row twins, which repeat the single-row arithmetic per activation row.
//!
//! Per block `b` of 32: the 32 weights widened to two vectors of 16 i16, each
//! `vpmaddwd`'d with 16 activations and the two i32 vectors added (exact: at most
//! 4 products of |w| <= 128 and |q| <= 32767 per lane, < 2^24 so the f32
//! conversion is exact too; Q6_K's weights carry their sub-block scale, |w| <= 4096,
//! lanes < 2^29 exact in i32 and rounded once by the conversion, see [`q6_k`]), converted, and FMA'd with `d * scale` broadcast into
//! accumulator `b % 2` (Q6_K / Q4_K / Q5_K: a super-block of 8 blocks per iteration, same
//! order); Q4_1's (Q4_K's and Q5_K's `-(dmin * m)`) `m * sum` is added to a scalar offset from +0.0 block
//! by block. Result: `hsum(acc0 + acc1) (+ offset)`.

use std::arch::x86_64::*;

use crate::linear::kinds::*;
use crate::linear::simd::avx2::*;

/// Q4_1 row x 16-bit activations (see the module doc). Lengths are checked by the
/// caller (`q.len() == 32 * blocks`, `w.len() == 20 * blocks`, `ss.len() == 2 * blocks`).
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_q4_1_act16(w: &[u8], q: &[i16], ss: &[f32]) -> f32 {
    dot_dm_act16::<Q4_1>(w, q, ss)
}

/// Q4_K row x 16-bit activations: [`dot_q4_1_act16`]'s arithmetic with block `b`'s
/// `d' = d * sc` and `m' = -(dmin * m)` of [`q4_k_dm`] and the codes of [`q4_k`].
/// Lengths are checked by the caller (`q.len()` a multiple of 256, `w.len() == 144 *
/// q.len() / 256`). Also the kernel of AVX-512 machines.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_q4_k_act16(w: &[u8], q: &[i16], ss: &[f32]) -> f32 {
    dot_dm_act16::<Q4_K>(w, q, ss)
}

/// Q5_K row x 16-bit activations: [`dot_q4_k_act16`]'s arithmetic on the 5-bit codes of
/// [`q5_k`] (`w.len() == 176 * q.len() / 256`). Also the kernel of AVX-512 machines.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_q5_k_act16(w: &[u8], q: &[i16], ss: &[f32]) -> f32 {
    dot_dm_act16::<Q5_K>(w, q, ss)
}

/// The offset formats (`value = d q + m`): per block `d * scale` FMA'd with the exact
/// integer dot into accumulator `b % 2`, `m * sum` added to a scalar offset from +0.0.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_dm_act16<const KIND: u8>(w: &[u8], q: &[i16], ss: &[f32]) -> f32 {
    let blocks = q.len() / 32;
    let (wp, qp, sp) = (w.as_ptr(), q.as_ptr(), ss.as_ptr());
    let (mut acc0, mut acc1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    let mut off = 0f32;
    // Q4_K / Q5_K: the super-block's 8 (d', m') pairs, decoded at its first block.
    let mut dms = ([0f32; 8], [0f32; 8]);
    macro_rules! step {
        ($b:expr, $acc:ident) => {{
            let b = $b;
            let (d, m) = if has_k_scales(KIND) {
                if b % 8 == 0 {
                    dms = q4_k_dms(wp.add(b / 8 * k_super_bytes(KIND)));
                }
                (dms.0[b % 8], dms.1[b % 8])
            } else {
                dm_at::<KIND>(wp, b)
            };
            let (scale, sum) = (*sp.add(2 * b), *sp.add(2 * b + 1));
            let dot = block_dot(unpack::<KIND>(wp, b), qp.add(b * 32));
            $acc = _mm256_fmadd_ps(_mm256_set1_ps(d * scale), dot, $acc);
            off += m * sum;
        }};
    }
    let mut b = super_blocks!(KIND, blocks, step, acc0, acc1);
    while b + 2 <= blocks {
        step!(b, acc0);
        step!(b + 1, acc1);
        b += 2;
    }
    if b < blocks {
        step!(b, acc0);
    }
    hsum(_mm256_add_ps(acc0, acc1)) + off
}

/// Q8_0 row x 16-bit activations (no offset term).
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_q8_0_act16(w: &[u8], q: &[i16], ss: &[f32]) -> f32 {
    dot_d_act16::<Q8_0>(w, q, ss)
}

/// Q5_0 row x 16-bit activations: [`dot_q8_0_act16`] with the weights `q - 16` of
/// [`q5_0`]. Lengths are checked by the caller (`w.len() == 22 * blocks`). Also the
/// kernel of AVX-512 machines (every Q5_0 path routes there, so decode and batch agree).
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_q5_0_act16(w: &[u8], q: &[i16], ss: &[f32]) -> f32 {
    dot_d_act16::<Q5_0>(w, q, ss)
}

/// Q4_0 row x 16-bit activations: [`dot_q8_0_act16`] with the weights `q - 8` of
/// [`q4_0`]. Lengths are checked by the caller (`w.len() == 18 * blocks`). Also the
/// kernel of AVX-512 machines (every Q4_0 path routes there, so decode and batch agree).
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_q4_0_act16(w: &[u8], q: &[i16], ss: &[f32]) -> f32 {
    dot_d_act16::<Q4_0>(w, q, ss)
}

/// Q6_K row x 16-bit activations: per 32-element block, the exact `sc0 * isum0 + sc1 *
/// isum1` lanes of [`q6_k`]'s scaled weights, FMA'd with `d * scale` (`d` the
/// super-block's). Lengths are checked by the caller (`q.len()` a multiple of 256,
/// `w.len() == 210 * q.len() / 256`). Also the kernel of AVX-512 machines.
#[target_feature(enable = "avx2,fma,f16c")]
pub unsafe fn dot_q6_k_act16(w: &[u8], q: &[i16], ss: &[f32]) -> f32 {
    dot_d_act16::<Q6_K>(w, q, ss)
}

/// The formats without an offset term (`value = d * q`): per block
/// `d * scale` FMA'd with the exact integer dot into accumulator `b % 2`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_d_act16<const KIND: u8>(w: &[u8], q: &[i16], ss: &[f32]) -> f32 {
    let blocks = q.len() / 32;
    let (wp, qp, sp) = (w.as_ptr(), q.as_ptr(), ss.as_ptr());
    let (mut acc0, mut acc1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    macro_rules! step {
        ($b:expr, $acc:ident) => {{
            let b = $b;
            let d = f16_at(wp.add(d_at(KIND, b)));
            let dot = block_dot(unpack::<KIND>(wp, b), qp.add(b * 32));
            $acc = _mm256_fmadd_ps(_mm256_set1_ps(d * *sp.add(2 * b)), dot, $acc);
        }};
    }
    let mut b = super_blocks!(KIND, blocks, step, acc0, acc1);
    while b + 2 <= blocks {
        step!(b, acc0);
        step!(b + 1, acc1);
        b += 2;
    }
    if b < blocks {
        step!(b, acc0);
    }
    hsum(_mm256_add_ps(acc0, acc1))
}
