//! The parts of the GEMV both x86 ISAs share: the group's block scales prepared in a first
//! pass, weight prefetching, and the block loop and row-group driver as macros (each ISA's
//! group kernel is their `$step`/`$group`).

use std::arch::x86_64::*;

use crate::linear::kinds::*;
use crate::linear::simd::avx2;

/// Weight rows per group: 4 rows x 2 accumulators = 8 registers, which with the
/// activations and the unpacked weights fits AVX2's 16 ymm registers.
pub const ROWS: usize = 4;

/// The per-block products of one group of `R` rows, and each row's offset.
///
/// Q4_1: `p[2 * (b * R + r)] = d_{r,b} * scale_b` and `p[2 * (b * R + r) + 1] = m_{r,b} *
/// sum_b`; the offset of row `r` is `sum_b m_{r,b} * sum_b`, added block by block from
/// +0.0. Q8_0, Q5_0 and Q6_K: `p[b * R + r] = d_{r,b} * scale_b` (Q6_K: its super-block's
/// `d`), offsets 0. Q4_K and Q5_K: `p[b * R + r] = d'_{r,b} * scale_b` and the offset `sum_b
/// m'_{r,b} * sum_b` with `d' = d * sc`, `m' = -(dmin * m)` (`avx2::q4_k_dms`). `[d, m] * [scale, sum]` as
/// a lane multiply and the offset as a lane add are the operations of both single-row
/// kernels (the AVX2 one spells them as scalar f32 operations; IEEE makes them the same).
///
/// A full group (`R == 4`) converts the four rows' scales of a block with one F16C
/// instruction: one block's `[d, m]` of the four rows is 8 halves, so Q4_1 needs one
/// 8-lane convert, multiply, store and add per block instead of four of each. Measured on
/// an AMD EPYC (Zen 3), where this pass took a fifth of decode.
#[inline(always)]
#[allow(clippy::needless_range_loop)]
pub(crate) unsafe fn prepare<const R: usize, const KIND: u8>(
    w: *const u8,
    row_bytes: usize,
    blocks: usize,
    ss: *const f32,
    p: *mut f32,
) -> [f32; R] {
    let mut offsets = [0f32; R];
    if R == 4 && !has_k_scales(KIND) {
        let rd32 = |b: usize, r: usize| std::ptr::read_unaligned(w.add(r * row_bytes + b * 20) as *const i32);
        let rd16 =
            |b: usize, r: usize| std::ptr::read_unaligned(w.add(r * row_bytes + d_at(KIND, b)) as *const u16) as u64;
        if KIND == Q4_1 {
            let mut off = _mm256_setzero_ps();
            for b in 0..blocks {
                // [scale, sum] in every lane pair.
                let sc = _mm256_castpd_ps(_mm256_broadcast_sd(&*(ss.add(2 * b) as *const f64)));
                let dm = _mm256_cvtph_ps(_mm_setr_epi32(rd32(b, 0), rd32(b, 1), rd32(b, 2), rd32(b, 3)));
                let prod = _mm256_mul_ps(dm, sc);
                _mm256_storeu_ps(p.add(8 * b), prod);
                off = _mm256_add_ps(off, prod);
            }
            let mut lanes = [0f32; 8];
            _mm256_storeu_ps(lanes.as_mut_ptr(), off);
            for r in 0..R {
                offsets[r] = lanes[2 * r + 1];
            }
        } else {
            for b in 0..blocks {
                let halves = rd16(b, 0) | rd16(b, 1) << 16 | rd16(b, 2) << 32 | rd16(b, 3) << 48;
                let d = _mm_cvtph_ps(_mm_cvtsi64_si128(halves as i64));
                _mm_storeu_ps(p.add(4 * b), _mm_mul_ps(d, _mm_set1_ps(*ss.add(2 * b))));
            }
        }
        return offsets;
    }
    let mut off = [_mm_setzero_ps(); R];
    if has_k_scales(KIND) {
        // [d', m'] * [scale, sum] (`avx2::q4_k_dms`, a super-block's 8 at a time), the
        // single-row kernel's products; each row's offset added block by block.
        for s in 0..blocks / 8 {
            for r in 0..R {
                let (d, m) = avx2::q4_k_dms(w.add(r * row_bytes + s * k_super_bytes(KIND)));
                for j in 0..8 {
                    let b = 8 * s + j;
                    let sc = _mm_castpd_ps(_mm_load_sd(ss.add(2 * b) as *const f64));
                    let prod = _mm_mul_ps(_mm_setr_ps(d[j], m[j], 0.0, 0.0), sc);
                    *p.add(b * R + r) = _mm_cvtss_f32(prod);
                    off[r] = _mm_add_ps(off[r], prod);
                }
            }
        }
    }
    for b in 0..blocks {
        if has_k_scales(KIND) {
            break;
        } else if KIND == Q4_1 {
            let sc = _mm_castpd_ps(_mm_load_sd(ss.add(2 * b) as *const f64));
            for r in 0..R {
                let blk = w.add(r * row_bytes + b * 20);
                let dm = _mm_cvtph_ps(_mm_cvtsi32_si128(std::ptr::read_unaligned(blk as *const i32)));
                let prod = _mm_mul_ps(dm, sc);
                _mm_storel_pd(p.add(2 * (b * R + r)) as *mut f64, _mm_castps_pd(prod));
                off[r] = _mm_add_ps(off[r], prod);
            }
        } else {
            let scale = *ss.add(2 * b);
            for r in 0..R {
                let blk = w.add(r * row_bytes + d_at(KIND, b));
                let d =
                    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(std::ptr::read_unaligned(blk as *const u16) as i32)));
                *p.add(b * R + r) = d * scale;
            }
        }
    }
    for r in 0..R {
        offsets[r] = _mm_cvtss_f32(_mm_movehdup_ps(off[r]));
    }
    offsets
}

/// The index in `p` of block `b`'s `d * scale` for row `r` (see [`prepare`]).
#[inline(always)]
pub(crate) fn p_at<const R: usize, const KIND: u8>(b: usize, r: usize) -> usize {
    if KIND == Q4_1 {
        2 * (b * R + r)
    } else {
        b * R + r
    }
}

/// How many groups of rows ahead the weights are prefetched. The rows of a group are
/// read side by side, [`ROWS`] short streams (360 bytes per Q4_1 row at k = 576) that
/// the hardware prefetcher barely trains on. 4 groups is ~6 KiB ahead at k = 576
/// (BENCHMARKS.md, "Prefetching weights into L2").
pub(crate) const PREFETCH_GROUPS: usize = 4;

/// Prefetches, for each row of the group, the block pair `b, b + 1` of the row `ahead`
/// bytes further on (spread through the loop, one line per row and step: a burst of
/// prefetches per group stalled on the fill buffers), into L2 (`T1`): prefetching the
/// streams into L1 held a core to less than half of what it can read (BENCHMARKS.md,
/// "Prefetching weights into L2"). The address may lie past the matrix: prefetches never
/// fault, and it is formed with `wrapping_add`.
#[inline(always)]
pub(crate) unsafe fn prefetch_pair<const R: usize, const KIND: u8>(
    w: *const u8,
    row_bytes: usize,
    b: usize,
    ahead: usize,
) {
    let pair = 2 * block_bytes(KIND);
    for r in 0..R {
        let p = w.wrapping_add(r * row_bytes + block_at(KIND, b) + ahead);
        _mm_prefetch::<_MM_HINT_T1>(p.cast());
        if pair > 64 {
            _mm_prefetch::<_MM_HINT_T1>(p.wrapping_add(64).cast());
        }
    }
}

/// The block loop of both ISAs' groups: pairs of blocks (the even one into `$acc0`, the
/// odd one into `$acc1`, as the single-row kernels), each pair's prefetch issued first,
/// then an odd last block.
///
/// Q6_K (`$kind`, whole super-blocks of 8 blocks) runs the same sequence a super-block
/// per iteration with `b = 8 s + i`, `i` constant, so its unpacking's shifts and
/// offsets within the super-block fold to constants.
macro_rules! block_pairs {
    ($kind:expr, $blocks:expr, $prefetch:expr, $step:ident, $acc0:ident, $acc1:ident) => {{
        let mut b = 0;
        if is_k($kind) {
            for s in 0..$blocks / 8 {
                let b8 = 8 * s;
                $prefetch(b8);
                $step!(b8, $acc0);
                $step!(b8 + 1, $acc1);
                $prefetch(b8 + 2);
                $step!(b8 + 2, $acc0);
                $step!(b8 + 3, $acc1);
                $prefetch(b8 + 4);
                $step!(b8 + 4, $acc0);
                $step!(b8 + 5, $acc1);
                $prefetch(b8 + 6);
                $step!(b8 + 6, $acc0);
                $step!(b8 + 7, $acc1);
            }
            b = $blocks / 8 * 8;
        }
        while b + 2 <= $blocks {
            $prefetch(b);
            $step!(b, $acc0);
            $step!(b + 1, $acc1);
            b += 2;
        }
        if b < $blocks {
            $step!(b, $acc0);
        }
    }};
}

/// Runs `group::<R, KIND>` over `rows` in groups of [`ROWS`], the tail with fewer, for
/// the block formats `$kind` (the caller routes only those here).
macro_rules! drive {
    ($w:expr, $rows:expr, $act:expr, $out:expr, $group:ident, [$($kind:ident),*]) => {{
        let (w, act) = ($w, $act);
        let row_bytes = w.row_bytes();
        let (q, ss) = (act.q.as_ptr(), act.scale_sum.as_ptr());
        let blocks = act.q.len() / 32;
        // Written by `prepare` before the group reads it; not zeroed (16 KiB per call).
        let mut p = std::mem::MaybeUninit::<[f32; 2 * ROWS * MAX_STACK_BLOCKS]>::uninit();
        let pp = p.as_mut_ptr().cast::<f32>();
        let (mut j, end) = ($rows.start, $rows.end);
        let base = w.data.as_ptr();
        let kind = kind(w.ty);
        while j < end {
            let r = (end - j).min(ROWS);
            let (wj, y) = (base.add(j * row_bytes), $out.get().add(j));
            match (kind, r) {
                $(
                    ($kind, 4) => $group::<4, $kind>(wj, row_bytes, blocks, q, ss, pp, y),
                    ($kind, 3) => $group::<3, $kind>(wj, row_bytes, blocks, q, ss, pp, y),
                    ($kind, 2) => $group::<2, $kind>(wj, row_bytes, blocks, q, ss, pp, y),
                    ($kind, _) => $group::<1, $kind>(wj, row_bytes, blocks, q, ss, pp, y),
                )*
                _ => unreachable!("{} has no group kernel at this ISA", w.ty),
            }
            j += r;
        }
    }};
}

pub(crate) use block_pairs;
pub(crate) use drive;
