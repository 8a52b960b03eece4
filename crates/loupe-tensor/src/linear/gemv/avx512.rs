//! The GEMV's AVX-512 groups: Q4_1 / Q8_0 on their own arithmetic, Q5_0, Q4_0 and Q6_K (and Q4_1
//! on AMX CPUs' batch paths) on the AVX2 arithmetic two blocks per 512-bit vector.

use std::arch::x86_64::*;
use std::ops::Range;

use super::x86::*;
use crate::linear::act16::Act16;
use crate::linear::dispatch::MAX_STACK_BLOCKS;
use crate::linear::kinds::*;
use crate::linear::qmatrix::QMatrix;
use crate::linear::simd::avx2;
use crate::linear::simd::avx512::{pair_acts, pair_fma, q6_k_pair, unpack_pair};
use crate::pool::OutPtr;

/// AVX-512 driver (see [`super::gemv_rows`] for the contract), Q4_1 and Q8_0 only.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
pub(crate) unsafe fn rows_avx512(w: &QMatrix, rows: Range<usize>, act: &Act16<'_>, out: OutPtr) {
    drive!(w, rows, act, out, group_avx512, [Q4_1, Q8_0])
}

/// AVX-512 driver for Q5_0, Q4_0 and Q6_K (see [`super::gemv_rows`] for the contract): two blocks
/// per 512-bit vector with the AVX2 kernel's bits ([`group_avx512_pairs`]).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c,avx2,fma")]
pub(crate) unsafe fn rows_avx512_pairs(w: &QMatrix, rows: Range<usize>, act: &Act16<'_>, out: OutPtr) {
    drive!(w, rows, act, out, group_avx512_pairs, [Q5_0, Q4_0, Q6_K])
}

/// `R` consecutive weight rows at `w` against the activations: per row, the
/// arithmetic of `decode::avx512::dot_q{4_1,8_0}_act16` (16 i32 lanes per block from one
/// `vpmaddwd` of the 32 weights as i16, even blocks into `acc0`, odd into `acc1`).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
#[allow(clippy::too_many_arguments)]
unsafe fn group_avx512<const R: usize, const KIND: u8>(
    w: *const u8,
    row_bytes: usize,
    blocks: usize,
    q: *const i16,
    ss: *const f32,
    p: *mut f32,
    y: *mut f32,
) {
    let off = prepare::<R, KIND>(w, row_bytes, blocks, ss, p);
    let mask = _mm256_set1_epi8(0x0F);
    // Q4_1: the 16 bytes in both halves of a ymm; the low half keeps the low nibbles
    // (elements 0..16), the high half shifts to the high ones (16..32).
    let shifts = _mm256_set_epi16(4, 4, 4, 4, 4, 4, 4, 4, 0, 0, 0, 0, 0, 0, 0, 0);
    let (mut acc0, mut acc1) = ([_mm512_setzero_ps(); R], [_mm512_setzero_ps(); R]);
    macro_rules! step {
        ($b:expr, $acc:ident) => {{
            let b = $b;
            let x = _mm512_loadu_si512(q.add(b * 32) as *const _);
            for r in 0..R {
                let w16 = if KIND == Q4_1 {
                    let blk = w.add(r * row_bytes + b * 20);
                    let both = _mm256_broadcastsi128_si256(_mm_loadu_si128(blk.add(4) as *const __m128i));
                    _mm512_cvtepu8_epi16(_mm256_and_si256(_mm256_srlv_epi16(both, shifts), mask))
                } else {
                    _mm512_cvtepi8_epi16(_mm256_loadu_si256(w.add(r * row_bytes + b * 34 + 2) as *const __m256i))
                };
                let dot = _mm512_madd_epi16(w16, x);
                $acc[r] =
                    _mm512_fmadd_ps(_mm512_set1_ps(*p.add(p_at::<R, KIND>(b, r))), _mm512_cvtepi32_ps(dot), $acc[r]);
            }
        }};
    }
    block_pairs!(
        KIND,
        blocks,
        |b| prefetch_pair::<R, KIND>(w, row_bytes, b, PREFETCH_GROUPS * ROWS * row_bytes),
        step,
        acc0,
        acc1
    );
    for r in 0..R {
        let s = crate::linear::simd::avx512::hsum(_mm512_add_ps(acc0[r], acc1[r]));
        // Q8_0 adds no offset (adding 0.0 would turn -0.0 into +0.0).
        let v = if KIND == Q4_1 { s + off[r] } else { s };
        y.add(r).write(v);
    }
}

/// `R` consecutive Q5_0, Q4_0 or Q6_K weight rows at `w` against the activations, bit for bit
/// [`group_avx2`] (and so `decode::avx2::dot_q5_0_act16` / `dot_q4_0_act16`) with half its vector
/// instructions: blocks `b` (even) and `b + 1` share one 512-bit vector, block `b` in
/// the low 256 bits, `b + 1` in the high ones. Then one `vpmaddwd` pair gives, in lanes
/// 0..8, block `b`'s eight i32 lanes of the AVX2 kernel (elements `2i, 2i + 1` and
/// `16 + 2i, 17 + 2i`) and in lanes 8..16 those of block `b + 1`; exact integers, so
/// the same values however they were unpacked. One FMA with `[d_b * s_b; 8] ++
/// [d_{b+1} * s_{b+1}; 8]` into one accumulator then does what AVX2 does to its even-block
/// (`acc0`, the low half) and odd-block (`acc1`, the high half) accumulators, in the same
/// order; an odd last block goes to the low half alone; the sum is AVX2's
/// `hsum(acc0 + acc1)`.
///
/// The unpacking of a pair is `simd::avx512::unpack_pair` (Q6_K: `q6_k_pair`, a super-block
/// per iteration), which the batched kernel's pairs tile shares.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c,avx2,fma")]
#[allow(clippy::too_many_arguments, clippy::needless_range_loop)]
unsafe fn group_avx512_pairs<const R: usize, const KIND: u8>(
    w: *const u8,
    row_bytes: usize,
    blocks: usize,
    q: *const i16,
    ss: *const f32,
    p: *mut f32,
    y: *mut f32,
) {
    debug_assert!(KIND == Q5_0 || KIND == Q4_0 || KIND == Q6_K);
    let _ = prepare::<R, KIND>(w, row_bytes, blocks, ss, p);
    let mut acc = [_mm512_setzero_ps(); R];
    // Blocks `b` and `b + 1` of every row of the group; `$unpack(row, b)` gives the pair.
    macro_rules! pair {
        ($b:expr, $unpack:expr) => {{
            let b = $b;
            prefetch_pair::<R, KIND>(w, row_bytes, b, PREFETCH_GROUPS * ROWS * row_bytes);
            let x = pair_acts(q.add(b * 32));
            for r in 0..R {
                acc[r] =
                    pair_fma(acc[r], $unpack(w.add(r * row_bytes), b), x, p.add(b * R + r), p.add((b + 1) * R + r));
            }
        }};
    }
    let mut b = 0;
    if KIND == Q6_K {
        // A super-block per iteration: its activations once, then each row's four pairs in
        // order (pair `t`'s shifts and offsets are constants).
        for s in 0..blocks / 8 {
            let b8 = 8 * s;
            let mut x = [(_mm512_setzero_si512(), _mm512_setzero_si512()); 4];
            for (t, xt) in x.iter_mut().enumerate() {
                prefetch_pair::<R, KIND>(w, row_bytes, b8 + 2 * t, PREFETCH_GROUPS * ROWS * row_bytes);
                *xt = pair_acts(q.add((b8 + 2 * t) * 32));
            }
            for r in 0..R {
                let sb = w.add(r * row_bytes + block_at(KIND, b8));
                let pairs = [q6_k_pair::<0>(sb), q6_k_pair::<1>(sb), q6_k_pair::<2>(sb), q6_k_pair::<3>(sb)];
                for t in 0..4 {
                    let b = b8 + 2 * t;
                    acc[r] = pair_fma(acc[r], pairs[t], x[t], p.add(b * R + r), p.add((b + 1) * R + r));
                }
            }
        }
        b = blocks / 8 * 8;
    }
    while b + 2 <= blocks {
        pair!(b, |row: *const u8, b| unpack_pair::<KIND>(row.add(block_at(KIND, b))));
        b += 2;
    }
    if b < blocks {
        // The odd last block, even-indexed: the AVX2 kernel's step into the low half.
        let xlo = _mm256_loadu_si256(q.add(b * 32) as *const __m256i);
        let xhi = _mm256_loadu_si256(q.add(b * 32 + 16) as *const __m256i);
        for r in 0..R {
            let (wlo, whi) = avx2::unpack::<KIND>(w.add(r * row_bytes), b);
            let dot = _mm256_add_epi32(_mm256_madd_epi16(wlo, xlo), _mm256_madd_epi16(whi, xhi));
            let lo = _mm256_fmadd_ps(
                _mm256_set1_ps(*p.add(b * R + r)),
                _mm256_cvtepi32_ps(dot),
                _mm512_castps512_ps256(acc[r]),
            );
            acc[r] = _mm512_castpd_ps(_mm512_insertf64x4::<0>(_mm512_castps_pd(acc[r]), _mm256_castps_pd(lo)));
        }
    }
    for r in 0..R {
        let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(acc[r])));
        // Q5_0 and Q4_0 have no offset (adding 0.0 would turn -0.0 into +0.0).
        y.add(r).write(avx2::hsum(_mm256_add_ps(_mm512_castps512_ps256(acc[r]), hi)));
    }
}
