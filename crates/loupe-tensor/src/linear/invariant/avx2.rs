//! AVX2 multi-row kernels: each repeats, per activation row, the one-row Act16 kernel of
//! `decode::avx2` operation for operation (same accumulators, same order).

use std::arch::x86_64::*;
use std::ops::Range;

use super::rows::*;
use crate::linear::kinds::*;
use crate::linear::qmatrix::QMatrix;
use crate::linear::simd::avx2::*;
use crate::pool::OutPtr;

/// Multi-row twin of the dots above: see `avx512::act16_rows` (same contract).
///
/// # Safety
/// AVX2, FMA, F16C; as `avx512::act16_rows`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn act16_rows(
    w: &QMatrix,
    rows: Range<usize>,
    act: &ActBatch<'_>,
    p: &mut [f32],
    off: &mut [f32],
    out: OutPtr,
) {
    let (m, blocks, k, n) = (act.m, act.blocks, act.k, w.rows);
    let kind = kind(w.ty);
    let offset = has_offset(kind);
    // As the AVX-512 kernels: rows that do not fit in L1 together are taken CHUNK_ROWS at a
    // time, and the band's weight rows (in L2) pass over each chunk.
    let chunk = if m * k * 2 <= ACT_L1_BYTES { m } else { CHUNK_ROWS };
    for c0 in (0..m).step_by(chunk) {
        let c1 = (c0 + chunk).min(m);
        for j in rows.clone() {
            let row = w.row(j).as_ptr();
            prefetch_row(w, j + PREFETCH_ROWS, rows.end);
            prepare(row, kind, act, c0..c1, p.as_mut_ptr(), off.as_mut_ptr());
            let (pp, y) = (p.as_ptr(), out.get().add(j));
            let mut i = c0;
            while i < c1 {
                let na = (c1 - i).min(4);
                let (q, pi, yi) = (act.q.as_ptr().add(i * k), pp.add(lane_at(i, 0, blocks)), y.add(i * n));
                let r: &[f32] = match (kind, na) {
                    (Q4_1, 4) => &tile::<4, Q4_1>(row, blocks, q, k, pi),
                    (Q4_1, 3) => &tile::<3, Q4_1>(row, blocks, q, k, pi),
                    (Q4_1, 2) => &tile::<2, Q4_1>(row, blocks, q, k, pi),
                    (Q4_1, _) => &tile::<1, Q4_1>(row, blocks, q, k, pi),
                    (Q5_0, 4) => &tile::<4, Q5_0>(row, blocks, q, k, pi),
                    (Q5_0, 3) => &tile::<3, Q5_0>(row, blocks, q, k, pi),
                    (Q5_0, 2) => &tile::<2, Q5_0>(row, blocks, q, k, pi),
                    (Q5_0, _) => &tile::<1, Q5_0>(row, blocks, q, k, pi),
                    (Q6_K, 4) => &tile::<4, Q6_K>(row, blocks, q, k, pi),
                    (Q6_K, 3) => &tile::<3, Q6_K>(row, blocks, q, k, pi),
                    (Q6_K, 2) => &tile::<2, Q6_K>(row, blocks, q, k, pi),
                    (Q6_K, _) => &tile::<1, Q6_K>(row, blocks, q, k, pi),
                    (Q4_0, 4) => &tile::<4, Q4_0>(row, blocks, q, k, pi),
                    (Q4_0, 3) => &tile::<3, Q4_0>(row, blocks, q, k, pi),
                    (Q4_0, 2) => &tile::<2, Q4_0>(row, blocks, q, k, pi),
                    (Q4_0, _) => &tile::<1, Q4_0>(row, blocks, q, k, pi),
                    (Q4_K, 4) => &tile::<4, Q4_K>(row, blocks, q, k, pi),
                    (Q4_K, 3) => &tile::<3, Q4_K>(row, blocks, q, k, pi),
                    (Q4_K, 2) => &tile::<2, Q4_K>(row, blocks, q, k, pi),
                    (Q4_K, _) => &tile::<1, Q4_K>(row, blocks, q, k, pi),
                    (Q5_K, 4) => &tile::<4, Q5_K>(row, blocks, q, k, pi),
                    (Q5_K, 3) => &tile::<3, Q5_K>(row, blocks, q, k, pi),
                    (Q5_K, 2) => &tile::<2, Q5_K>(row, blocks, q, k, pi),
                    (Q5_K, _) => &tile::<1, Q5_K>(row, blocks, q, k, pi),
                    (_, 4) => &tile::<4, Q8_0>(row, blocks, q, k, pi),
                    (_, 3) => &tile::<3, Q8_0>(row, blocks, q, k, pi),
                    (_, 2) => &tile::<2, Q8_0>(row, blocks, q, k, pi),
                    (_, _) => &tile::<1, Q8_0>(row, blocks, q, k, pi),
                };
                for (a, &v) in r.iter().enumerate() {
                    // Q8_0 / Q5_0 / Q6_K / Q4_0 add no offset (adding 0.0 would turn -0.0 into +0.0).
                    let v = if offset { v + off[i + a] } else { v };
                    yi.add(a * n).write(v);
                }
                i += na;
            }
        }
    }
}

/// `p[lane_at(i, b)] = d_b * scale_{i,b}`, `off[i] = sum_b m_b * sum_{i,b}` (Q4_1) for
/// the rows `i_rows` (starting at a multiple of 8), 8 activation rows per vector (the last
/// may run past `i_rows` within its group of [`LANES`]: rows of zero scales); the same f32
/// operations as the single-row kernels.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn prepare(row: *const u8, kind: u8, act: &ActBatch<'_>, i_rows: Range<usize>, p: *mut f32, off: *mut f32) {
    let blocks = act.blocks;
    let offset = has_offset(kind);
    let (st, su) = (act.st.as_ptr(), act.su.as_ptr());
    let kdms = KDms::of_row(row, kind, blocks);
    for c in i_rows.step_by(8) {
        let mut o = _mm256_setzero_ps();
        for b in 0..blocks {
            let at = lane_at(c, b, blocks);
            let (dv, mv) = match kind {
                Q4_1 => dm_at::<Q4_1>(row, b),
                _ if has_k_scales(kind) => kdms.at(b),
                _ => (f16_at(row.add(d_at(kind, b))), 0.0),
            };
            let d = _mm256_set1_ps(dv);
            _mm256_storeu_ps(p.add(at), _mm256_mul_ps(d, _mm256_loadu_ps(st.add(at))));
            if offset {
                let mm = _mm256_set1_ps(mv);
                o = _mm256_add_ps(o, _mm256_mul_ps(mm, _mm256_loadu_ps(su.add(at))));
            }
        }
        _mm256_storeu_ps(off.add(c), o);
    }
}

/// One weight row against `NA <= 4` activation rows (8 accumulators: 16 ymm
/// registers hold them, the two weight halves and the temporaries only barely).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn tile<const NA: usize, const KIND: u8>(
    w: *const u8,
    blocks: usize,
    q: *const i16,
    k: usize,
    p: *const f32,
) -> [f32; NA] {
    let (mut acc0, mut acc1) = ([_mm256_setzero_ps(); NA], [_mm256_setzero_ps(); NA]);
    macro_rules! step {
        ($b:expr, $acc:ident) => {{
            let b = $b;
            let wv = unpack::<KIND>(w, b);
            for a in 0..NA {
                let dot = block_dot(wv, q.add(a * k + b * 32));
                $acc[a] = _mm256_fmadd_ps(_mm256_set1_ps(*p.add(b * LANES + a)), dot, $acc[a]);
            }
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
    let mut r = [0f32; NA];
    for a in 0..NA {
        r[a] = hsum(_mm256_add_ps(acc0[a], acc1[a]));
    }
    r
}

/// f32 weight row against all `m` rows of `x`, 2 at a time (see `avx512::f32_rows`).
///
/// # Safety
/// AVX2 + FMA; as `avx512::f32_rows`.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn f32_rows(w: *const f32, x: *const f32, k: usize, m: usize, y: *mut f32, n: usize) {
    let mut i = 0;
    while i < m {
        let na = (m - i).min(2);
        let xi = x.add(i * k);
        let r: &[f32] = if na == 2 { &dot_f32_rows::<2>(w, xi, k) } else { &dot_f32_rows::<1>(w, xi, k) };
        for (a, &v) in r.iter().enumerate() {
            y.add((i + a) * n).write(v);
        }
        i += na;
    }
}

/// `NA` f32 dots: 8-wide chunks into accumulator `c % 4`, `(a0 + a1) + (a2 + a3)`,
/// [`hsum`], then the `k % 8` tail added one product at a time.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn dot_f32_rows<const NA: usize>(w: *const f32, x: *const f32, k: usize) -> [f32; NA] {
    let z = [_mm256_setzero_ps(); NA];
    let (mut a0, mut a1, mut a2, mut a3) = (z, z, z, z);
    let full = k / 8;
    macro_rules! step {
        ($c:expr, $acc:ident) => {{
            let c = $c;
            let wv = _mm256_loadu_ps(w.add(c * 8));
            for a in 0..NA {
                $acc[a] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x.add(a * k + c * 8)), $acc[a]);
            }
        }};
    }
    let mut c = 0;
    while c + 4 <= full {
        step!(c, a0);
        step!(c + 1, a1);
        step!(c + 2, a2);
        step!(c + 3, a3);
        c += 4;
    }
    if c < full {
        step!(c, a0);
    }
    if c + 1 < full {
        step!(c + 1, a1);
    }
    if c + 2 < full {
        step!(c + 2, a2);
    }
    let mut r = [0f32; NA];
    for a in 0..NA {
        let mut v = hsum(_mm256_add_ps(_mm256_add_ps(a0[a], a1[a]), _mm256_add_ps(a2[a], a3[a])));
        for c in full * 8..k {
            v += w.add(c).read_unaligned() * *x.add(a * k + c);
        }
        r[a] = v;
    }
    r
}
