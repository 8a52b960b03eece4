//! The decode GEMV of `--precision native`: several Q4_1 / Q8_0 / Q5_0 / Q6_K / Q4_K weight rows against
//! one activation row quantized to 16-bit blocks ([`Act16`]).
//!
//! **Why a kernel of its own.** One row at a time ([`crate::wq::dot_row_act16`]), a
//! 576-wide row is 18 blocks; every block waits on the scalar offset chain
//! (`off += m * sum`, one f32 add latency per block), the f16 scale conversion and the
//! broadcast of `d * scale`, and every row pays a call and a horizontal sum. Measured
//! (SmolLM2 Q4_1, Intel Xeon, 1 thread) that ran at ~14 cycles per block, 5 GB/s: decode was
//! compute-bound at half the memory bandwidth. Here [`ROWS`] weight rows go through the
//! blocks together: the scales of the group are converted in a first pass (`p[b][r]`,
//! each row's offset in its own register), then each block of activations is loaded
//! once and multiplied with the block of every row of the group, whose accumulators are
//! independent chains.
//!
//! **Bit for bit the single-row kernels.** Per output, the arithmetic is exactly that of
//! `dot_row_act16` at the same ISA: the same integer lanes per block (exact, so how the
//! weights are unpacked does not matter), the same conversion, the same FMA of
//! `d * scale` into the even- or odd-block accumulator, the same offset chain from +0.0,
//! the same horizontal sum. So decode keeps its numbers, and the batched engine's
//! multi-row kernels (`crate::batch`), which repeat that arithmetic per activation row,
//! stay bit-identical to it (tested below and in `batch`).
//!
//! Q5_0, Q6_K and Q4_K have AVX2 arithmetic only (single-row, group, multi-row): an AVX-512
//! machine runs it for them in every path, so the agreement holds there as well. This decode
//! group computes Q5_0's AVX2 arithmetic with 512-bit vectors, two blocks per vector, with
//! the same bits (`x86::group_avx512_pairs`); doing the same for Q6_K and Q4_K (two AVX2
//! unpackings joined) measured slower than their AVX2 group (1 thread, hot 896 x 4864:
//! Q6_K 8.9-9.1 against 10.1-10.8 GiB/s, Q4_K 7.3-7.6 against 8.6-9.2). On AMX CPUs Q4_1 takes
//! the AVX2 arithmetic too, in every path (`batch::avx2_kernels_at`): there it decoded 8-11%
//! faster than the AVX-512 group.

use std::ops::Range;

use crate::matmul::{OutPtr, QMatrix};
use crate::quant::Isa;
use crate::wq::{dot_row_act16_scalar, Act16};
use crate::{GgmlType, TensorError};

/// Weight rows per group: 4 rows x 2 accumulators = 8 registers, which with the
/// activations and the unpacked weights fits AVX2's 16 ymm registers.
pub const ROWS: usize = 4;

/// `y[j] = W[j] . x` for `j` in `rows`, `W` Q4_1, Q8_0, Q5_0, Q6_K or Q4_K with `act` of `w.cols`
/// activations (checked by the caller, [`crate::batch`]).
///
/// # Safety
/// `isa` is supported by this CPU; `out` points to at least `w.rows` floats of which
/// this call alone writes those at `rows`; `w.cols == act.q.len()`, a multiple of 32
/// with at most [`crate::batch::MAX_STACK_BLOCKS`] blocks, and `act.scale_sum` holds
/// two floats per block.
pub(crate) unsafe fn gemv_rows(
    isa: Isa,
    w: &QMatrix,
    rows: Range<usize>,
    act: &Act16<'_>,
    out: OutPtr,
) -> Result<(), TensorError> {
    #[cfg(target_arch = "x86_64")]
    if isa >= Isa::Avx2
        && matches!(w.ty, GgmlType::Q4_1 | GgmlType::Q8_0 | GgmlType::Q5_0 | GgmlType::Q6K | GgmlType::Q4K)
    {
        // Q5_0 / Q6_K / Q4_K (and Q4_1 on AMX CPUs): the AVX2 kernels at AVX-512 too, as
        // `wq::dot_row_act16` and `batch` run (`batch::avx2_kernels_at`).
        if isa >= Isa::Avx512 && !crate::batch::avx2_kernels_at(isa, w.ty) {
            x86::rows_avx512(w, rows, act, out);
        } else if isa >= Isa::Avx512 && w.ty == GgmlType::Q5_0 {
            // The AVX2 kernel's bits, two blocks per 512-bit vector.
            x86::rows_avx512_pairs(w, rows, act, out);
        } else {
            x86::rows_avx2(w, rows, act, out);
        }
        return Ok(());
    }
    let _ = isa;
    for j in rows {
        let v = dot_row_act16_scalar(w.ty, w.row(j), act)?;
        out.get().add(j).write(v);
    }
    Ok(())
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;
    use std::ops::Range;

    use super::ROWS;
    use crate::batch::avx2::{self, block_at, block_bytes, d_at, has_offset, Q4_1, Q4_K, Q5_0, Q6_K, Q8_0};
    use crate::batch::MAX_STACK_BLOCKS;
    use crate::matmul::{OutPtr, QMatrix};
    use crate::wq::Act16;

    /// The per-block products of one group of `R` rows, and each row's offset.
    ///
    /// Q4_1: `p[2 * (b * R + r)] = d_{r,b} * scale_b` and `p[2 * (b * R + r) + 1] = m_{r,b} *
    /// sum_b`; the offset of row `r` is `sum_b m_{r,b} * sum_b`, added block by block from
    /// +0.0. Q8_0, Q5_0 and Q6_K: `p[b * R + r] = d_{r,b} * scale_b` (Q6_K: its super-block's
    /// `d`), offsets 0. Q4_K: `p[b * R + r] = d'_{r,b} * scale_b` and the offset `sum_b
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
    unsafe fn prepare<const R: usize, const KIND: u8>(
        w: *const u8,
        row_bytes: usize,
        blocks: usize,
        ss: *const f32,
        p: *mut f32,
    ) -> [f32; R] {
        let mut offsets = [0f32; R];
        if R == 4 && KIND != Q4_K {
            let rd32 = |b: usize, r: usize| std::ptr::read_unaligned(w.add(r * row_bytes + b * 20) as *const i32);
            let rd16 = |b: usize, r: usize| {
                std::ptr::read_unaligned(w.add(r * row_bytes + d_at(KIND, b)) as *const u16) as u64
            };
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
        if KIND == Q4_K {
            // [d', m'] * [scale, sum] (`avx2::q4_k_dms`, a super-block's 8 at a time), the
            // single-row kernel's products; each row's offset added block by block.
            for s in 0..blocks / 8 {
                for r in 0..R {
                    let (d, m) = avx2::q4_k_dms(w.add(r * row_bytes + s * 144));
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
            if KIND == Q4_K {
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
                    let d = _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(
                        std::ptr::read_unaligned(blk as *const u16) as i32
                    )));
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
    fn p_at<const R: usize, const KIND: u8>(b: usize, r: usize) -> usize {
        if KIND == Q4_1 {
            2 * (b * R + r)
        } else {
            b * R + r
        }
    }

    /// How many groups of rows ahead the weights are prefetched. The rows of a group are
    /// read side by side, [`ROWS`] short streams (360 bytes per Q4_1 row at k = 576) that
    /// the hardware prefetcher barely trains on; without this, one core drew 5 GB/s of
    /// the 10 it can read (SmolLM2 decode, Intel Xeon). 1, 2, 4 and 8 measured within the
    /// noise of each other there; 4 (~6 KiB ahead at k = 576) leaves room for slower memory.
    const PREFETCH_GROUPS: usize = 4;

    /// Prefetches, for each row of the group, the block pair `b, b + 1` of the row `ahead`
    /// bytes further on (spread through the loop, one line per row and step: a burst of
    /// prefetches per group stalled on the fill buffers). The address may lie past the
    /// matrix: prefetches never fault, and it is formed with `wrapping_add`.
    #[inline(always)]
    unsafe fn prefetch_pair<const R: usize, const KIND: u8>(w: *const u8, row_bytes: usize, b: usize, ahead: usize) {
        let pair = 2 * block_bytes(KIND);
        for r in 0..R {
            let p = w.wrapping_add(r * row_bytes + block_at(KIND, b) + ahead);
            _mm_prefetch::<_MM_HINT_T0>(p.cast());
            if pair > 64 {
                _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(64).cast());
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
            if $kind == Q6_K || $kind == Q4_K {
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
            let kind = avx2::kind(w.ty);
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

    /// AVX-512 driver (see [`super::gemv_rows`] for the contract), Q4_1 and Q8_0 only.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
    pub(super) unsafe fn rows_avx512(w: &QMatrix, rows: Range<usize>, act: &Act16<'_>, out: OutPtr) {
        drive!(w, rows, act, out, group_avx512, [Q4_1, Q8_0])
    }

    /// AVX-512 driver for Q5_0 (see [`super::gemv_rows`] for the contract): two blocks per
    /// 512-bit vector with the AVX2 kernel's bits ([`group_avx512_pairs`]).
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c,avx2,fma")]
    pub(super) unsafe fn rows_avx512_pairs(w: &QMatrix, rows: Range<usize>, act: &Act16<'_>, out: OutPtr) {
        drive!(w, rows, act, out, group_avx512_pairs, [Q5_0])
    }

    /// AVX2 driver (see [`super::gemv_rows`] for the contract).
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn rows_avx2(w: &QMatrix, rows: Range<usize>, act: &Act16<'_>, out: OutPtr) {
        drive!(w, rows, act, out, group_avx2, [Q4_1, Q8_0, Q5_0, Q6_K, Q4_K])
    }

    /// `R` consecutive weight rows at `w` against the activations: per row, the
    /// arithmetic of `wq::avx512::dot_q{4_1,8_0}_act16` (16 i32 lanes per block from one
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
                    $acc[r] = _mm512_fmadd_ps(
                        _mm512_set1_ps(*p.add(p_at::<R, KIND>(b, r))),
                        _mm512_cvtepi32_ps(dot),
                        $acc[r],
                    );
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
            let s = crate::batch::avx512::hsum(_mm512_add_ps(acc0[r], acc1[r]));
            // Q8_0 adds no offset (adding 0.0 would turn -0.0 into +0.0).
            let v = if KIND == Q4_1 { s + off[r] } else { s };
            y.add(r).write(v);
        }
    }

    /// `R` consecutive Q5_0 weight rows at `w` against the activations, bit for bit
    /// [`group_avx2`] (and so `batch::avx2::dot_q5_0_act16`) with half its vector
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
    /// The unpacking of a pair is `batch::avx512::unpack_pair`, which the batched kernel's
    /// pairs tile shares.
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
        debug_assert_eq!(KIND, Q5_0);
        let _ = prepare::<R, KIND>(w, row_bytes, blocks, ss, p);
        let mut acc = [_mm512_setzero_ps(); R];
        let mut b = 0;
        while b + 2 <= blocks {
            prefetch_pair::<R, KIND>(w, row_bytes, b, PREFETCH_GROUPS * ROWS * row_bytes);
            // Activations: [x_b 0..16 | x_b+1 0..16] and [x_b 16..32 | x_b+1 16..32].
            let (xa, xb) =
                (_mm512_loadu_si512(q.add(b * 32) as *const _), _mm512_loadu_si512(q.add(b * 32 + 32) as *const _));
            let (xlo, xhi) = (_mm512_shuffle_i64x2::<0x44>(xa, xb), _mm512_shuffle_i64x2::<0xEE>(xa, xb));
            for r in 0..R {
                let (wlo, whi) = crate::batch::avx512::unpack_pair::<KIND>(w.add(r * row_bytes + block_at(KIND, b)));
                let dot = _mm512_add_epi32(_mm512_madd_epi16(wlo, xlo), _mm512_madd_epi16(whi, xhi));
                let scale = _mm512_mask_broadcastss_ps(
                    _mm512_set1_ps(*p.add(b * R + r)),
                    0xFF00,
                    _mm_load_ss(p.add((b + 1) * R + r)),
                );
                acc[r] = _mm512_fmadd_ps(scale, _mm512_cvtepi32_ps(dot), acc[r]);
            }
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
            // Q5_0 has no offset (adding 0.0 would turn -0.0 into +0.0).
            y.add(r).write(avx2::hsum(_mm256_add_ps(_mm512_castps512_ps256(acc[r]), hi)));
        }
    }

    /// `R` consecutive weight rows at `w` against the activations: per row, the
    /// arithmetic of `batch::avx2::dot_{q4_1,q8_0,q5_0,q6_k}_act16` (per block, elements 0..16 and
    /// 16..32 as i16 each `vpmaddwd`'d and the two i32 vectors added: 8 lanes).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn group_avx2<const R: usize, const KIND: u8>(
        w: *const u8,
        row_bytes: usize,
        blocks: usize,
        q: *const i16,
        ss: *const f32,
        p: *mut f32,
        y: *mut f32,
    ) {
        let off = prepare::<R, KIND>(w, row_bytes, blocks, ss, p);
        let (mut acc0, mut acc1) = ([_mm256_setzero_ps(); R], [_mm256_setzero_ps(); R]);
        macro_rules! step {
            ($b:expr, $acc:ident) => {{
                let b = $b;
                let xlo = _mm256_loadu_si256(q.add(b * 32) as *const __m256i);
                let xhi = _mm256_loadu_si256(q.add(b * 32 + 16) as *const __m256i);
                for r in 0..R {
                    // The single-row kernel's unpacking (elements 0..16 and 16..32 as i16).
                    let (wlo, whi) = avx2::unpack::<KIND>(w.add(r * row_bytes), b);
                    let dot = _mm256_add_epi32(_mm256_madd_epi16(wlo, xlo), _mm256_madd_epi16(whi, xhi));
                    $acc[r] = _mm256_fmadd_ps(
                        _mm256_set1_ps(*p.add(p_at::<R, KIND>(b, r))),
                        _mm256_cvtepi32_ps(dot),
                        $acc[r],
                    );
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
            let s = avx2::hsum(_mm256_add_ps(acc0[r], acc1[r]));
            let v = if has_offset(KIND) { s + off[r] } else { s };
            y.add(r).write(v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wq::dot_row_act16;

    fn data(n: usize, seed: u32) -> Vec<f32> {
        let mut s = seed.wrapping_mul(2654435761).wrapping_add(12345);
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                // Mostly small values with a few large ones, as activations are.
                let u = (s >> 8) as f32 / (1u32 << 24) as f32 - 0.5;
                if s.is_multiple_of(61) {
                    u * 40.0
                } else {
                    u
                }
            })
            .collect()
    }

    /// `n x k` of `ty`: quantized from [`data`], or for Q6_K / Q4_K (no quantizer) random
    /// bytes with each super-block's f16 `d` (and Q4_K's `dmin`) small and finite.
    fn matrix(ty: GgmlType, n: usize, k: usize, seed: u32) -> QMatrix {
        if !matches!(ty, GgmlType::Q6K | GgmlType::Q4K) {
            return QMatrix::quantize(ty, n, k, &data(n * k, seed)).unwrap();
        }
        let bytes_per = ty.type_size();
        let mut bytes: Vec<u8> =
            data(n * k / 256 * bytes_per, seed).iter().map(|v| ((v + 1.0) * 127.0) as u8).collect();
        let small = half::f16::from_f32(0.01).to_le_bytes();
        for sb in bytes.chunks_mut(bytes_per) {
            if ty == GgmlType::Q6K {
                sb[208..].copy_from_slice(&small);
            } else {
                sb[..2].copy_from_slice(&small);
                sb[2..4].copy_from_slice(&half::f16::from_f32(0.003).to_le_bytes());
            }
        }
        QMatrix::new(ty, n, k, bytes).unwrap()
    }

    /// Every row of every group size (1..=9 rows, so full groups and each tail) is
    /// bit-identical to the single-row kernel of the same ISA, on every ISA this CPU has.
    #[test]
    #[allow(clippy::needless_range_loop)]
    fn rows_are_bit_identical_to_the_single_row_dot() {
        for ty in [GgmlType::Q4_1, GgmlType::Q8_0, GgmlType::Q5_0, GgmlType::Q6K, GgmlType::Q4K] {
            let shapes: &[(usize, usize)] = if matches!(ty, GgmlType::Q6K | GgmlType::Q4K) {
                &[(9, 256), (7, 512), (13, 768), (5, 4864)]
            } else {
                &[(9, 32), (7, 64), (13, 576), (5, 1536), (4, 96), (6, 896)]
            };
            for &(n, k) in shapes {
                let w = matrix(ty, n, k, n as u32 * 7 + k as u32);
                let x = data(k, 99 + k as u32);
                let mut q = vec![0i16; k];
                let mut ss = vec![0f32; 2 * (k / 32)];
                let act = Act16::quantize(&x, &mut q, &mut ss);
                for isa in Isa::available() {
                    for start in 0..n.min(3) {
                        let mut y = vec![f32::NAN; n];
                        // SAFETY: isa is available; y holds n floats; shapes as documented.
                        unsafe { gemv_rows(isa, &w, start..n, &act, OutPtr(y.as_mut_ptr())).unwrap() };
                        for j in 0..n {
                            if j < start {
                                assert!(y[j].is_nan(), "{ty} {isa}: row {j} written outside the range");
                                continue;
                            }
                            let want = dot_row_act16(isa, ty, w.row(j), &act).unwrap();
                            assert_eq!(
                                y[j].to_bits(),
                                want.to_bits(),
                                "{ty} {n}x{k} {isa} rows {start}..{n}: row {j}: {} vs {want}",
                                y[j]
                            );
                        }
                    }
                }
            }
        }
    }

    /// A zero activation row gives +0.0 for Q8_0 / Q5_0 and the exact offset-free zero for
    /// Q4_1, as the single-row kernels do (the sign of zero is part of the bits).
    #[test]
    fn zero_activations_keep_the_single_row_zero() {
        for ty in [GgmlType::Q4_1, GgmlType::Q8_0, GgmlType::Q5_0, GgmlType::Q6K, GgmlType::Q4K] {
            let (n, k) = (6, if matches!(ty, GgmlType::Q6K | GgmlType::Q4K) { 256 } else { 64 });
            let w = matrix(ty, n, k, 5);
            let x = vec![0f32; k];
            let mut q = vec![0i16; k];
            let mut ss = vec![0f32; 2 * k / 32];
            let act = Act16::quantize(&x, &mut q, &mut ss);
            for isa in Isa::available() {
                let mut y = vec![1f32; n];
                // SAFETY: as above.
                unsafe { gemv_rows(isa, &w, 0..n, &act, OutPtr(y.as_mut_ptr())).unwrap() };
                for (j, v) in y.iter().enumerate() {
                    assert_eq!(
                        v.to_bits(),
                        dot_row_act16(isa, ty, w.row(j), &act).unwrap().to_bits(),
                        "{ty} {isa} row {j}"
                    );
                }
            }
        }
    }
}
