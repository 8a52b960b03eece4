//! AVX-512 multi-row kernels. Each mirrors, per activation row, the single-row
//! kernel in `decode::avx512` operation for operation (same accumulators, same order).

use std::arch::x86_64::*;
use std::ops::Range;

use super::rows::*;
use crate::linear::kinds::*;
use crate::linear::qmatrix::QMatrix;
use crate::linear::simd::avx2::KDms;
use crate::linear::simd::avx512::{hsum, pair_fma, q6_k_pair, unpack_pair};
use crate::pool::OutPtr;

/// Q4_1 / Q8_0 weight rows `rows` against every activation row of `act`; writes
/// `y[i, j]` through `out` (`y` is `act.m x w.rows`). `p` holds `blocks * mp` and
/// `off` `mp` floats of scratch (`mp`: `act.m` rounded up to [`LANES`]).
///
/// `pairs`: the types that take the AVX2 arithmetic at AVX-512 (`super::avx2_kernels_at`),
/// Q4_1 on AMX CPUs, Q5_0, Q6_K, Q4_K, Q4_0 and Q5_K, bit for bit `super::avx2::act16_rows` (and so the decode
/// dot) with half its vector instructions per block and up to 10 activation rows per weight row
/// instead of 4 ([`tile_pairs`]). [`prepare`] computes the same f32 products and
/// block-ordered offset sums as the AVX2 one.
///
/// # Safety
/// AVX-512 F/BW/VL, AVX2, FMA and F16C; `w.ty` is Q4_1 or Q8_0 (`pairs`: Q4_1, Q5_0, Q6_K, Q4_K, Q4_0 or Q5_K)
/// with `w.cols == act.k`; the caller owns columns `rows` of `y`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c,avx2,fma")]
pub(crate) unsafe fn act16_rows(
    w: &QMatrix,
    rows: Range<usize>,
    act: &ActBatch<'_>,
    p: &mut [f32],
    off: &mut [f32],
    out: OutPtr,
    pairs: bool,
) {
    let (m, k) = (act.m, act.k);
    // Up to MAX_TILE_ROWS rows go in one chunk even past L1: a weight row unpacked once for
    // all of them (a verification step's ~9 rows) beats two passes, the rows streaming from
    // L2 (Q6_K's 4864-wide down_proj at 9 rows: BENCHMARKS.md, "Wide 8-bit tiles").
    let chunk = if m * k * 2 <= ACT_L1_BYTES || m <= LANES { m } else { CHUNK_ROWS };
    for c0 in (0..m).step_by(chunk) {
        let c1 = (c0 + chunk).min(m);
        for j in rows.clone() {
            prefetch_row(w, j + PREFETCH_ROWS, rows.end);
            // One instance per tile family, each small enough to be inlined here.
            if pairs {
                chunk_rows::<true>(w, j, c0..c1, act, p, off, out);
            } else {
                chunk_rows::<false>(w, j, c0..c1, act, p, off, out);
            }
        }
    }
}

/// One Q4_1, Q5_0, Q6_K, Q4_K, Q4_0 or Q5_K weight row against `NA` activation rows (see [`tile_q4_1`] for the
/// arguments), bit for bit `super::avx2::tile`: blocks `b` (even) and `b + 1` share one
/// 512-bit vector, `b` in the low 256 bits and `b + 1` in the high ones. One
/// `vpmaddwd` pair then gives in lanes 0..8 block `b`'s eight i32 lanes of the AVX2
/// kernel (elements `2l, 2l + 1, 16 + 2l, 17 + 2l`) and in lanes 8..16 those of block
/// `b + 1`; exact integers, so the same values however unpacked. One FMA with
/// `[d_b s_b; 8] ++ [d_{b+1} s_{b+1}; 8]` into one accumulator does what AVX2 does to
/// its even-block (the low half) and odd-block (the high half) accumulators, in the same
/// order; an odd last block goes to the low half alone; the result is AVX2's `hsum(acc0 +
/// acc1)`. (The decode GEMV's `group_avx512_pairs` is the same idea for one activation
/// row.)
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c,avx2,fma")]
#[allow(clippy::needless_range_loop)]
unsafe fn tile_pairs<const NA: usize, const KIND: u8>(
    w: *const u8,
    blocks: usize,
    q: *const i16,
    k: usize,
    p: *const f32,
) -> [f32; NA] {
    use crate::linear::simd::avx2;
    let mut acc = [_mm512_setzero_ps(); NA];
    // Blocks `b` and `b + 1`, unpacked as `$w`, against every activation row.
    macro_rules! pair {
        ($b:expr, $w:expr) => {{
            let b = $b;
            let wv = $w;
            for a in 0..NA {
                // [x_b 0..16 | x_b+1 0..16] and [x_b 16..32 | x_b+1 16..32] (`arrange_pairs`).
                let at = q.add(a * k + b * 32);
                let x = (_mm512_loadu_si512(at as *const _), _mm512_loadu_si512(at.add(32) as *const _));
                acc[a] = pair_fma(acc[a], wv, x, p.add(b * LANES + a), p.add((b + 1) * LANES + a));
            }
        }};
    }
    let mut b = 0;
    if KIND == Q6_K {
        // A super-block per iteration, so each pair's shifts and offsets are constants.
        for s in 0..blocks / 8 {
            let sb = w.add(block_at(KIND, 8 * s));
            pair!(8 * s, q6_k_pair::<0>(sb));
            pair!(8 * s + 2, q6_k_pair::<1>(sb));
            pair!(8 * s + 4, q6_k_pair::<2>(sb));
            pair!(8 * s + 6, q6_k_pair::<3>(sb));
        }
        b = blocks / 8 * 8;
    }
    while b + 2 <= blocks {
        let wv = if is_k(KIND) {
            // Blocks b and b + 1 lie in one super-block (b is even, 8 blocks to one).
            let ((l0, h0), (l1, h1)) = (avx2::unpack::<KIND>(w, b), avx2::unpack::<KIND>(w, b + 1));
            (
                _mm512_inserti64x4::<1>(_mm512_castsi256_si512(l0), l1),
                _mm512_inserti64x4::<1>(_mm512_castsi256_si512(h0), h1),
            )
        } else {
            unpack_pair::<KIND>(w.add(b * block_bytes(KIND)))
        };
        pair!(b, wv);
        b += 2;
    }
    if b < blocks {
        // The odd last block, even-indexed: the AVX2 kernel's step into the low half.
        let (wlo, whi) = avx2::unpack::<KIND>(w, b);
        for a in 0..NA {
            let xq = q.add(a * k + b * 32);
            let dot = _mm256_add_epi32(
                _mm256_madd_epi16(wlo, _mm256_loadu_si256(xq as *const __m256i)),
                _mm256_madd_epi16(whi, _mm256_loadu_si256(xq.add(16) as *const __m256i)),
            );
            let lo = _mm256_fmadd_ps(
                _mm256_set1_ps(*p.add(b * LANES + a)),
                _mm256_cvtepi32_ps(dot),
                _mm512_castps512_ps256(acc[a]),
            );
            acc[a] = _mm512_castpd_ps(_mm512_insertf64x4::<0>(_mm512_castps_pd(acc[a]), _mm256_castps_pd(lo)));
        }
    }
    let mut r = [0f32; NA];
    for a in 0..NA {
        let hi = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(acc[a])));
        r[a] = avx2::hsum(_mm256_add_ps(_mm512_castps512_ps256(acc[a]), hi));
    }
    r
}

/// Weight row `j` against activation rows `i_rows` (see [`act16_rows`]).
#[allow(clippy::too_many_arguments)]
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c,avx2,fma")]
unsafe fn chunk_rows<const PAIRS: bool>(
    w: &QMatrix,
    j: usize,
    i_rows: Range<usize>,
    act: &ActBatch<'_>,
    p: &mut [f32],
    off: &mut [f32],
    out: OutPtr,
) {
    let (blocks, k, n) = (act.blocks, act.k, w.rows);
    let kind = kind(w.ty);
    let offset = has_offset(kind);
    let row = w.row(j).as_ptr();
    prepare(row, kind, act, i_rows.clone(), p.as_mut_ptr(), off.as_mut_ptr());
    let (pp, y) = (p.as_ptr(), out.get().add(j));
    let (mut i, m) = (i_rows.start, i_rows.end);
    // Tiles of at most MAX_TILE_ROWS rows, balanced within each group of LANES rows (a tile
    // reads its rows' products from one group's lanes): 9 rows, one tile; 16, two of 8; 13,
    // 7 and 6.
    let (mut seg_end, mut left) = (i, 0);
    while i < m {
        if i == seg_end {
            seg_end = ((i / LANES + 1) * LANES).min(m);
            left = (seg_end - i).div_ceil(MAX_TILE_ROWS);
        }
        let na = (seg_end - i).div_ceil(left);
        left -= 1;
        let (q, pi, yi) = (act.q.as_ptr().add(i * k), pp.add(lane_at(i, 0, blocks)), y.add(i * n));
        // Q8_0, Q5_0, Q6_K and Q4_0 add no offset (a null `off`, see `store`); Q4_1, Q4_K and Q5_K do.
        let o = if offset { off.as_ptr().add(i) } else { std::ptr::null() };
        macro_rules! run {
            ($tile:ident $(, $kind:ident)?) => {
                match na {
                    10 => store($tile::<10 $(, $kind)?>(row, blocks, q, k, pi), yi, n, o),
                    9 => store($tile::<9 $(, $kind)?>(row, blocks, q, k, pi), yi, n, o),
                    8 => store($tile::<8 $(, $kind)?>(row, blocks, q, k, pi), yi, n, o),
                    7 => store($tile::<7 $(, $kind)?>(row, blocks, q, k, pi), yi, n, o),
                    6 => store($tile::<6 $(, $kind)?>(row, blocks, q, k, pi), yi, n, o),
                    5 => store($tile::<5 $(, $kind)?>(row, blocks, q, k, pi), yi, n, o),
                    4 => store($tile::<4 $(, $kind)?>(row, blocks, q, k, pi), yi, n, o),
                    3 => store($tile::<3 $(, $kind)?>(row, blocks, q, k, pi), yi, n, o),
                    2 => store($tile::<2 $(, $kind)?>(row, blocks, q, k, pi), yi, n, o),
                    _ => store($tile::<1 $(, $kind)?>(row, blocks, q, k, pi), yi, n, o),
                }
            };
        }
        match (PAIRS, kind) {
            (true, Q4_1) => run!(tile_pairs, Q4_1),
            (true, Q6_K) => run!(tile_pairs, Q6_K),
            (true, Q4_K) => run!(tile_pairs, Q4_K),
            (true, Q5_K) => run!(tile_pairs, Q5_K),
            (true, Q4_0) => run!(tile_pairs, Q4_0),
            (true, _) => run!(tile_pairs, Q5_0),
            (false, Q4_1) => run!(tile_q4_1),
            (false, _) => run!(tile_q8_0),
        }
        i += na;
    }
}

/// Most activation rows one tile takes (the accumulators and a weight pair fit the 32
/// vector registers).
const MAX_TILE_ROWS: usize = 10;

/// Writes `r[a] (+ off[a])` to `y[a * n]`. Q8_0 and Q5_0 pass a null `off`: the
/// single-row kernel adds no offset term, and adding 0.0 would turn a -0.0 into +0.0.
#[inline(always)]
unsafe fn store<const NA: usize>(r: [f32; NA], y: *mut f32, n: usize, off: *const f32) {
    for (a, v) in r.into_iter().enumerate() {
        let v = if off.is_null() { v } else { v + *off.add(a) };
        y.add(a * n).write(v);
    }
}

/// For one weight row: `p[lane_at(i, b)] = d_b * scale_{i,b}` and (Q4_1)
/// `off[i] = sum_b m_b * sum_{i,b}` accumulated block by block from +0.0, 16
/// activation rows per vector, for `i` in `i_rows` (which starts at a multiple of 8;
/// `p[x]` is at [`lane_at`]; a vector that starts half-way into a group of rows spills 8
/// lanes into the next block's first lanes, rows this chunk does not use, which the next
/// block's vector does not overwrite; the last spills into the slack of `st`, `su`, `p`
/// and `off`). These
/// are the exact f32 operations the single-row kernel performs per block
/// (`[d, m] * [scale, sum]`, then `off += m * sum`).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c,avx2,fma")]
unsafe fn prepare(row: *const u8, kind: u8, act: &ActBatch<'_>, i_rows: Range<usize>, p: *mut f32, off: *mut f32) {
    let blocks = act.blocks;
    let (st, su) = (act.st.as_ptr(), act.su.as_ptr());
    let kdms = KDms::of_row(row, kind, blocks);
    for c in i_rows.step_by(16) {
        let mut o = _mm512_setzero_ps();
        for b in 0..blocks {
            let at = lane_at(c, b, blocks);
            if has_k_scales(kind) {
                let (dv, mv) = kdms.at(b);
                _mm512_storeu_ps(p.add(at), _mm512_mul_ps(_mm512_set1_ps(dv), _mm512_loadu_ps(st.add(at))));
                o = _mm512_add_ps(o, _mm512_mul_ps(_mm512_set1_ps(mv), _mm512_loadu_ps(su.add(at))));
                continue;
            }
            let blk = row.add(d_at(kind, b));
            if kind == Q4_1 {
                let dm = _mm_cvtph_ps(_mm_cvtsi32_si128(std::ptr::read_unaligned(blk as *const i32)));
                let d = _mm512_broadcastss_ps(dm);
                let mm = _mm512_broadcastss_ps(_mm_movehdup_ps(dm));
                _mm512_storeu_ps(p.add(at), _mm512_mul_ps(d, _mm512_loadu_ps(st.add(at))));
                o = _mm512_add_ps(o, _mm512_mul_ps(mm, _mm512_loadu_ps(su.add(at))));
            } else {
                let d = _mm512_broadcastss_ps(_mm_cvtph_ps(_mm_cvtsi32_si128(
                    std::ptr::read_unaligned(blk as *const u16) as i32,
                )));
                _mm512_storeu_ps(p.add(at), _mm512_mul_ps(d, _mm512_loadu_ps(st.add(at))));
            }
        }
        _mm512_storeu_ps(off.add(c), o);
    }
}

/// One Q4_1 weight row (`blocks` blocks at `w`) against `NA` activation rows at `q`
/// (row stride `k`), with the block products at `p[b * LANES + a]` (`p` at the tile's first row's [`lane_at`]). Per row: the same
/// `vpmaddwd`, conversion and FMA into the even/odd-block accumulator as
/// `decode::avx512::dot_q4_1_act16`, then the same horizontal sum.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
unsafe fn tile_q4_1<const NA: usize>(w: *const u8, blocks: usize, q: *const i16, k: usize, p: *const f32) -> [f32; NA] {
    let mask = _mm256_set1_epi8(0x0F);
    let shifts = _mm256_set_epi16(4, 4, 4, 4, 4, 4, 4, 4, 0, 0, 0, 0, 0, 0, 0, 0);
    // Even blocks into acc0, odd into acc1, as the single-row kernel; two named
    // arrays (not acc[b & 1]) so that they live in registers.
    let (mut acc0, mut acc1) = ([_mm512_setzero_ps(); NA], [_mm512_setzero_ps(); NA]);
    macro_rules! step {
        ($b:expr, $acc:ident) => {{
            let b = $b;
            let blk = w.add(b * 20);
            let both = _mm256_broadcastsi128_si256(_mm_loadu_si128(blk.add(4) as *const __m128i));
            let w16 = _mm512_cvtepu8_epi16(_mm256_and_si256(_mm256_srlv_epi16(both, shifts), mask));
            for a in 0..NA {
                let dot = _mm512_madd_epi16(w16, _mm512_loadu_si512(q.add(a * k + b * 32) as *const _));
                $acc[a] = _mm512_fmadd_ps(_mm512_set1_ps(*p.add(b * LANES + a)), _mm512_cvtepi32_ps(dot), $acc[a]);
            }
        }};
    }
    let mut b = 0;
    while b + 2 <= blocks {
        step!(b, acc0);
        step!(b + 1, acc1);
        b += 2;
    }
    if b < blocks {
        step!(b, acc0);
    }
    let mut r = [0f32; NA];
    for a in 0..NA {
        r[a] = hsum(_mm512_add_ps(acc0[a], acc1[a]));
    }
    r
}

/// [`tile_q4_1`] for Q8_0 (`decode::avx512::dot_q8_0_act16`).
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
unsafe fn tile_q8_0<const NA: usize>(w: *const u8, blocks: usize, q: *const i16, k: usize, p: *const f32) -> [f32; NA] {
    let (mut acc0, mut acc1) = ([_mm512_setzero_ps(); NA], [_mm512_setzero_ps(); NA]);
    macro_rules! step {
        ($b:expr, $acc:ident) => {{
            let b = $b;
            let w16 = _mm512_cvtepi8_epi16(_mm256_loadu_si256(w.add(b * 34 + 2) as *const __m256i));
            for a in 0..NA {
                let dot = _mm512_madd_epi16(w16, _mm512_loadu_si512(q.add(a * k + b * 32) as *const _));
                $acc[a] = _mm512_fmadd_ps(_mm512_set1_ps(*p.add(b * LANES + a)), _mm512_cvtepi32_ps(dot), $acc[a]);
            }
        }};
    }
    let mut b = 0;
    while b + 2 <= blocks {
        step!(b, acc0);
        step!(b + 1, acc1);
        b += 2;
    }
    if b < blocks {
        step!(b, acc0);
    }
    let mut r = [0f32; NA];
    for a in 0..NA {
        r[a] = hsum(_mm512_add_ps(acc0[a], acc1[a]));
    }
    r
}

/// One f32 weight row at `w` (any alignment) against all `m` rows of `x` (stride
/// `k`), written to `y[i * n]`; 4 activation rows at a time, each with the arithmetic
/// of [`dot_f32_rows::<1>`](dot_f32_rows).
///
/// # Safety
/// AVX-512 F; `w` readable for `k`, `x` for `m * k`, `y` writable at `i * n`, `i < m`.
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn f32_rows(w: *const f32, x: *const f32, k: usize, m: usize, y: *mut f32, n: usize) {
    let mut i = 0;
    while i < m {
        let na = (m - i).min(4);
        let xi = x.add(i * k);
        let r: &[f32] = match na {
            4 => &dot_f32_rows::<4>(w, xi, k),
            3 => &dot_f32_rows::<3>(w, xi, k),
            2 => &dot_f32_rows::<2>(w, xi, k),
            _ => &dot_f32_rows::<1>(w, xi, k),
        };
        for (a, &v) in r.iter().enumerate() {
            y.add((i + a) * n).write(v);
        }
        i += na;
    }
}

/// `NA` f32 dots of one weight row: 16-wide chunks FMA'd into accumulator `c % 4`,
/// the tail chunk masked (zeros add nothing), then `(a0 + a1) + (a2 + a3)` and
/// [`hsum`].
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn dot_f32_rows<const NA: usize>(w: *const f32, x: *const f32, k: usize) -> [f32; NA] {
    // Accumulator c % 4 for chunk c; four named arrays so they stay in registers.
    let z = [_mm512_setzero_ps(); NA];
    let (mut a0, mut a1, mut a2, mut a3) = (z, z, z, z);
    let full = k / 16;
    let rest = k - full * 16;
    let mask: __mmask16 = (1u32 << rest).wrapping_sub(1) as __mmask16;
    macro_rules! step {
        ($c:expr, $acc:ident, $load:ident) => {{
            let c = $c;
            let wv = $load(w.add(c * 16));
            for a in 0..NA {
                $acc[a] = _mm512_fmadd_ps(wv, $load(x.add(a * k + c * 16)), $acc[a]);
            }
        }};
    }
    // The tail: masked loads (zeros add nothing).
    let tail = |p: *const f32| _mm512_maskz_loadu_ps(mask, p);
    let mut c = 0;
    while c + 4 <= full {
        step!(c, a0, _mm512_loadu_ps);
        step!(c + 1, a1, _mm512_loadu_ps);
        step!(c + 2, a2, _mm512_loadu_ps);
        step!(c + 3, a3, _mm512_loadu_ps);
        c += 4;
    }
    // Up to three full chunks and the masked tail, still into accumulator c % 4.
    let left = full - c + usize::from(rest > 0);
    for i in 0..left {
        let masked = c + i == full;
        match (i, masked) {
            (0, false) => step!(c, a0, _mm512_loadu_ps),
            (1, false) => step!(c + 1, a1, _mm512_loadu_ps),
            (2, false) => step!(c + 2, a2, _mm512_loadu_ps),
            (0, true) => step!(c, a0, tail),
            (1, true) => step!(c + 1, a1, tail),
            (2, true) => step!(c + 2, a2, tail),
            _ => step!(c + 3, a3, tail),
        }
    }
    let mut r = [0f32; NA];
    for a in 0..NA {
        r[a] = hsum(_mm512_add_ps(_mm512_add_ps(a0[a], a1[a]), _mm512_add_ps(a2[a], a3[a])));
    }
    r
}
