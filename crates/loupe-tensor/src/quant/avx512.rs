//! AVX-512 (F/BW/VL) + VNNI dot kernels: two 32-element blocks per 512-bit
//! register, one `vpdpbusd` (u8 x i8, 4-way summed into i32) per pair.
//!
//! Register layout for a pair of blocks b0, b1 (64 bytes): `[b0 elements 0-15 |
//! b0 16-31 | b1 0-15 | b1 16-31]`. For nibble types the 16 `qs` bytes of each
//! block are broadcast to two 128-bit lanes and the odd lanes shifted right by 4,
//! which lands low nibbles (elements 0-15) and high nibbles (16-31) in GGML order,
//! matching the activation bytes as stored. i32 lanes 0-7 then belong to b0 and
//! 8-15 to b1, so one permuted scale vector converts both blocks at once.
//!
//! vpdpbusd wants an unsigned operand: offset weights (Q4_0, Q5_0) use their
//! unsigned code and subtract `offset * sum(a)` (a second vpdpbusd); Q8_0 uses
//! `|w| * (a * sign(w))`, which requires `a != -128` (Q8 quantizers never emit it).
//!
//! Odd trailing blocks go to the AVX2 kernel. K-quants use the AVX2 kernels.
//!
//! Safety: every `unsafe fn` requires the features in its `target_feature` (a
//! superset of AVX2's) and rows of the lengths [`super::check_dot`] verifies; the
//! safe wrappers check lengths and are reachable only through
//! [`super::vec_dot_fn`], which checks the CPU.

use std::arch::x86_64::*;
use std::ptr::read_unaligned;

use loupe_core::GgmlType;

use super::avx2;
use super::blocks::QK;
use super::VecDotFn;

pub(super) fn dot_fn(ty: GgmlType) -> Option<VecDotFn> {
    Some(match ty {
        GgmlType::F32 => f32_f32,
        GgmlType::F16 => f16_f32,
        GgmlType::BF16 => bf16_f32,
        GgmlType::Q4_0 => q4_0_q8_0,
        GgmlType::Q4_1 => q4_1_q8_1,
        GgmlType::Q5_0 => q5_0_q8_0,
        GgmlType::Q5_1 => q5_1_q8_1,
        GgmlType::Q8_0 => q8_0_q8_0,
        _ => return None,
    })
}

macro_rules! safe_wrappers {
    ($($name:ident => $kernel:ident ($wty:ident);)*) => {$(
        fn $name(w: &[u8], a: &[u8], n: usize) -> f32 {
            super::check_dot(GgmlType::$wty, w, a, n);
            // SAFETY: lengths checked above; the CPU was checked by `vec_dot_fn`,
            // the only way to obtain this function.
            unsafe { $kernel(w.as_ptr(), a.as_ptr(), n) }
        }
    )*};
}

safe_wrappers! {
    f32_f32 => dot_f32(F32);
    f16_f32 => dot_f16(F16);
    bf16_f32 => dot_bf16(BF16);
    q4_0_q8_0 => dot_q4_0(Q4_0);
    q4_1_q8_1 => dot_q4_1(Q4_1);
    q5_0_q8_0 => dot_q5_0(Q5_0);
    q5_1_q8_1 => dot_q5_1(Q5_1);
    q8_0_q8_0 => dot_q8_0(Q8_0);
}

#[inline(always)]
unsafe fn rd_u16(p: *const u8) -> u32 {
    read_unaligned(p.cast::<u16>()) as u32
}

#[inline(always)]
unsafe fn rd_u32(p: *const u8) -> u32 {
    read_unaligned(p.cast::<u32>())
}

/// 16 i32 lanes: 0-7 take element `lo` of `v`, 8-15 element `hi`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn spread2(v: __m128, lo: i32, hi: i32) -> __m512 {
    let idx = _mm512_set_epi32(hi, hi, hi, hi, hi, hi, hi, hi, lo, lo, lo, lo, lo, lo, lo, lo);
    _mm512_permutexvar_ps(idx, _mm512_castps128_ps512(v))
}

/// The nibbles of two blocks' `qs` (16 bytes each) in the pair layout.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn nibbles2(p0: *const u8, p1: *const u8) -> __m512i {
    let b0 = _mm256_broadcastsi128_si256(_mm_loadu_si128(p0.cast()));
    let b1 = _mm256_broadcastsi128_si256(_mm_loadu_si128(p1.cast()));
    let v = _mm512_inserti64x4(_mm512_castsi256_si512(b0), b1, 1);
    let v = _mm512_srlv_epi64(v, _mm512_set_epi64(4, 4, 0, 0, 4, 4, 0, 0));
    _mm512_and_si512(v, _mm512_set1_epi8(0x0F))
}

/// 32 bytes from each of two places, as one register.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn load2x32(p0: *const u8, p1: *const u8) -> __m512i {
    let lo = _mm256_loadu_si256(p0.cast());
    _mm512_inserti64x4(_mm512_castsi256_si512(lo), _mm256_loadu_si256(p1.cast()), 1)
}

/// `[dx0 dy0, dx1 dy1, _, _]` from the f16 scales at the start of four blocks.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn scales_d(x0: *const u8, x1: *const u8, y0: *const u8, y1: *const u8) -> __m128 {
    let hx = rd_u16(x0) | rd_u16(x1) << 16;
    let hy = rd_u16(y0) | rd_u16(y1) << 16;
    let f = _mm_cvtph_ps(_mm_set_epi32(0, 0, hy as i32, hx as i32));
    _mm_mul_ps(f, _mm_movehl_ps(f, f))
}

/// `[dx0 dy0, mx0 sy0, dx1 dy1, mx1 sy1]` from the `(d, m)` / `(d, s)` headers of
/// Q4_1/Q5_1 and Q8_1 blocks.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn scales_dm(x0: *const u8, x1: *const u8, y0: *const u8, y1: *const u8) -> __m128 {
    let h = _mm_set_epi32(rd_u32(y1) as i32, rd_u32(y0) as i32, rd_u32(x1) as i32, rd_u32(x0) as i32);
    let f = _mm256_cvtph_ps(h);
    _mm_mul_ps(_mm256_castps256_ps128(f), _mm256_extractf128_ps(f, 1))
}

/// Lanes 1 + 3 of the `m s` accumulator.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn odd_lanes_sum(v: __m128) -> f32 {
    let t = _mm_add_ps(v, _mm_movehl_ps(v, v));
    _mm_cvtss_f32(_mm_movehdup_ps(t))
}

/// Shared body of the float kernels: `$load(p)` yields 16 weights as f32. `$rows::<NA>` dots
/// one weight row with `NA` activation rows (`stride` floats apart), each with exactly the
/// operations of the one-row `$name` (which is `$rows::<1>`): the weights are loaded and
/// widened once for all of them, so the batched engine's rows cost one pass over the weights.
macro_rules! float_kernel {
    ($name:ident, $rows:ident, $chains:ident, $finish:ident, $segmented:ident, $wsize:expr, |$p:ident| $load:expr, $scalar:path) => {
        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
        unsafe fn $name(w: *const u8, a: *const u8, n: usize) -> f32 {
            $rows::<1>(w, a.cast::<f32>(), n, n)[0]
        }

        #[inline]
        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
        pub(crate) unsafe fn $rows<const NA: usize>(w: *const u8, a: *const f32, n: usize, stride: usize) -> [f32; NA] {
            let mut acc = [[_mm512_setzero_ps(); 4]; NA];
            let n64 = n / 64 * 64;
            $chains::<NA>(w, a, stride, 0..n64, super::FLOAT_ROWS_PREFETCH, &mut acc);
            $finish::<NA>(w, a, n, stride, n64, &acc)
        }

        /// `$rows`'s main loop over the elements `range` (whole steps of 64, below `n / 64 *
        /// 64`) into its four chains per activation row, `acc` (in registers for the loop).
        #[inline(always)]
        #[allow(clippy::needless_range_loop)]
        unsafe fn $chains<const NA: usize>(
            w: *const u8,
            a: *const f32,
            stride: usize,
            range: std::ops::Range<usize>,
            ahead: usize,
            acc_out: &mut [[__m512; 4]; NA],
        ) {
            let mut acc = *acc_out;
            let mut i = range.start;
            while i < range.end {
                // The weights ahead, into L2: the hardware prefetcher alone falls behind
                // the stream ([`super::FLOAT_ROWS_PREFETCH`]).
                let ahead = w.wrapping_add(i * $wsize).wrapping_add(ahead);
                for line in (0..64 * $wsize).step_by(64) {
                    _mm_prefetch::<_MM_HINT_T1>(ahead.wrapping_add(line).cast());
                }
                for u in 0..4 {
                    let $p = w.add((i + 16 * u) * $wsize);
                    let wv = $load;
                    for r in 0..NA {
                        acc[r][u] = _mm512_fmadd_ps(wv, _mm512_loadu_ps(a.add(r * stride + i + 16 * u)), acc[r][u]);
                    }
                }
                i += 64;
            }
            *acc_out = acc;
        }

        /// `$rows`'s end from element `n64 = n / 64 * 64`: the 16-wide steps into the first
        /// chain, the chains' sum and reduction, the scalar tail.
        #[inline(always)]
        #[allow(clippy::needless_range_loop)]
        unsafe fn $finish<const NA: usize>(
            w: *const u8,
            a: *const f32,
            n: usize,
            stride: usize,
            n64: usize,
            acc_in: &[[__m512; 4]; NA],
        ) -> [f32; NA] {
            let mut acc = *acc_in;
            let mut i = n64;
            while i + 16 <= n {
                let $p = w.add(i * $wsize);
                let wv = $load;
                for r in 0..NA {
                    acc[r][0] = _mm512_fmadd_ps(wv, _mm512_loadu_ps(a.add(r * stride + i)), acc[r][0]);
                }
                i += 16;
            }
            let mut out = [0f32; NA];
            for r in 0..NA {
                let v = _mm512_add_ps(_mm512_add_ps(acc[r][0], acc[r][1]), _mm512_add_ps(acc[r][2], acc[r][3]));
                out[r] = _mm512_reduce_add_ps(v);
                if i < n {
                    let wt = std::slice::from_raw_parts(w.add(i * $wsize), (n - i) * $wsize);
                    let at = std::slice::from_raw_parts(a.add(r * stride + i).cast::<u8>(), (n - i) * 4);
                    out[r] += $scalar(wt, at, n - i);
                }
            }
            out
        }

        /// `$rows` for each of `rows` weight rows (`wstride` bytes apart) against the same
        /// `NA` activation rows, `out[j * NA + r]` for weight row `j` and activation row `r`,
        /// every output `$rows`'s bits: the same chains advanced [`super::FLOAT_SEGMENT`]
        /// elements at a time for a group of weight rows, so that many elements of the
        /// activation rows stay in L1 while the group's rows pass over them (a whole row of
        /// `k = 4864` is 19 KiB per activation row: `$rows` alone read them from L2).
        #[inline]
        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
        pub(crate) unsafe fn $segmented<const NA: usize>(
            w: *const u8,
            wstride: usize,
            rows: usize,
            a: *const f32,
            n: usize,
            stride: usize,
            out: &mut [f32],
        ) {
            super::float_segmented_body!(
                $chains,
                $finish,
                _mm512_setzero_ps(),
                64,
                $wsize,
                w,
                wstride,
                rows,
                a,
                n,
                stride,
                out
            )
        }
    };
}

float_kernel!(
    dot_f32,
    dot_f32_rows,
    f32_chains,
    f32_finish,
    dot_f32_segmented,
    4,
    |p| _mm512_loadu_ps(p.cast()),
    super::scalar::f32_f32
);
float_kernel!(
    dot_f16,
    dot_f16_rows,
    f16_chains,
    f16_finish,
    dot_f16_segmented,
    2,
    |p| _mm512_cvtph_ps(_mm256_loadu_si256(p.cast())),
    super::scalar::f16_f32
);
float_kernel!(
    dot_bf16,
    dot_bf16_rows,
    bf16_chains,
    bf16_finish,
    dot_bf16_segmented,
    2,
    |p| _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(p.cast())), 16)),
    super::scalar::bf16_f32
);

/// Shared loop of the pair kernels. `$pair(x0, x1, y0, y1)` returns the i32 lane
/// sums of a pair and `(scale, extra)`: 16 per-lane scales and a 4-lane vector
/// accumulated on the side (the `m s` terms, or zeros). `$tail` is the AVX2 kernel
/// for one leftover block.
macro_rules! pair_kernel {
    ($name:ident, $wsize:expr, $asize:expr, $tail:path, |$x0:ident, $x1:ident, $y0:ident, $y1:ident| $pair:block) => {
        #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
        unsafe fn $name(w: *const u8, a: *const u8, n: usize) -> f32 {
            let nb = n / QK;
            let mut acc = _mm512_setzero_ps();
            let mut extra = _mm_setzero_ps();
            let mut i = 0;
            while i + 2 <= nb {
                let ($x0, $y0) = (w.add(i * $wsize), a.add(i * $asize));
                let ($x1, $y1) = ($x0.add($wsize), $y0.add($asize));
                let (p, scale, e): (__m512i, __m512, __m128) = $pair;
                acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), scale, acc);
                extra = _mm_add_ps(extra, e);
                i += 2;
            }
            let mut sum = _mm512_reduce_add_ps(acc) + odd_lanes_sum(extra);
            if i < nb {
                sum += $tail(w.add(i * $wsize), a.add(i * $asize), QK);
            }
            sum
        }
    };
}

pair_kernel!(dot_q8_0, 34, 34, avx2::dot_q8_0, |x0, x1, y0, y1| {
    let wv = load2x32(x0.add(2), x1.add(2));
    let av = load2x32(y0.add(2), y1.add(2));
    let neg = _mm512_movepi8_mask(wv);
    let signed_a = _mm512_mask_sub_epi8(av, neg, _mm512_setzero_si512(), av);
    let p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_abs_epi8(wv), signed_a);
    (p, spread2(scales_d(x0, x1, y0, y1), 0, 1), _mm_setzero_ps())
});

pair_kernel!(dot_q4_0, 18, 34, avx2::dot_q4_0, |x0, x1, y0, y1| {
    let q = nibbles2(x0.add(2), x1.add(2));
    let av = load2x32(y0.add(2), y1.add(2));
    let zero = _mm512_setzero_si512();
    let p = _mm512_dpbusd_epi32(zero, q, av);
    let bias = _mm512_dpbusd_epi32(zero, _mm512_set1_epi8(8), av);
    (_mm512_sub_epi32(p, bias), spread2(scales_d(x0, x1, y0, y1), 0, 1), _mm_setzero_ps())
});

pair_kernel!(dot_q4_1, 20, 36, avx2::dot_q4_1, |x0, x1, y0, y1| {
    let q = nibbles2(x0.add(4), x1.add(4));
    let av = load2x32(y0.add(4), y1.add(4));
    let p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), q, av);
    let s = scales_dm(x0, x1, y0, y1);
    (p, spread2(s, 0, 2), s)
});

// Q5: the 5th bits of the pair, `qh0 | qh1 << 32`, are exactly a byte mask in
// the pair layout (bit `j` of `qh` is element `j`), so one masked add sets them.
pair_kernel!(dot_q5_0, 22, 34, avx2::dot_q5_0, |x0, x1, y0, y1| {
    let k = rd_u32(x0.add(2)) as u64 | (rd_u32(x1.add(2)) as u64) << 32;
    let q = nibbles2(x0.add(6), x1.add(6));
    let q = _mm512_mask_add_epi8(q, k, q, _mm512_set1_epi8(16));
    let av = load2x32(y0.add(2), y1.add(2));
    let zero = _mm512_setzero_si512();
    let p = _mm512_dpbusd_epi32(zero, q, av);
    let bias = _mm512_dpbusd_epi32(zero, _mm512_set1_epi8(16), av);
    (_mm512_sub_epi32(p, bias), spread2(scales_d(x0, x1, y0, y1), 0, 1), _mm_setzero_ps())
});

pair_kernel!(dot_q5_1, 24, 36, avx2::dot_q5_1, |x0, x1, y0, y1| {
    let k = rd_u32(x0.add(4)) as u64 | (rd_u32(x1.add(4)) as u64) << 32;
    let q = nibbles2(x0.add(8), x1.add(8));
    let q = _mm512_mask_add_epi8(q, k, q, _mm512_set1_epi8(16));
    let av = load2x32(y0.add(4), y1.add(4));
    let p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), q, av);
    let s = scales_dm(x0, x1, y0, y1);
    (p, spread2(s, 0, 2), s)
});

/// Q8_0 / Q8_1 quantization of one row, byte-identical to `quantize::q8_0` /
/// `q8_1` (same f32 operations in the same order; `roundf` as truncate, then step
/// away from zero when the dropped fraction is at least one half).
///
/// # Safety
/// AVX-512 F/BW/VL; `src.len()` is a multiple of 32 and `dst` holds its blocks.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
pub(super) unsafe fn quantize_q8(src: &[f32], dst: &mut [u8], with_sum: bool) {
    let bs = if with_sum { 36 } else { 34 };
    let qs_off = if with_sum { 4 } else { 2 };
    let sign = _mm512_set1_ps(-0.0);
    let half = _mm512_set1_ps(0.5);
    let one = _mm512_set1_ps(1.0);
    for (x, out) in src.chunks_exact(QK).zip(dst.chunks_exact_mut(bs)) {
        let v = [_mm512_loadu_ps(x.as_ptr()), _mm512_loadu_ps(x.as_ptr().add(16))];
        let amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_andnot_ps(sign, v[0]), _mm512_andnot_ps(sign, v[1])));
        let d = amax / 127.0;
        let id = _mm512_set1_ps(if d != 0.0 { 1.0 / d } else { 0.0 });
        let mut sum = _mm512_setzero_si512();
        for (h, &vh) in v.iter().enumerate() {
            let s = _mm512_mul_ps(vh, id);
            let t = _mm512_roundscale_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(s);
            let frac = _mm512_sub_ps(s, t);
            let up = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(frac, half);
            let down = _mm512_cmp_ps_mask::<_CMP_LE_OQ>(frac, _mm512_set1_ps(-0.5));
            let t = _mm512_mask_add_ps(t, up, t, one);
            let r = _mm512_mask_sub_ps(t, down, t, one);
            let q = _mm512_cvttps_epi32(r);
            sum = _mm512_add_epi32(sum, q);
            _mm_storeu_si128(out.as_mut_ptr().add(qs_off + 16 * h).cast(), _mm512_cvtepi32_epi8(q));
        }
        out[..2].copy_from_slice(&to_f16(d).to_le_bytes());
        if with_sum {
            let s = _mm512_reduce_add_epi32(sum) as f32 * d;
            out[2..4].copy_from_slice(&to_f16(s).to_le_bytes());
        }
    }
}

/// f32 -> f16 bits, round to nearest even (as `half::f16::from_f32`), inline.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")]
unsafe fn to_f16(x: f32) -> u16 {
    _mm_extract_epi16::<0>(_mm_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm_set_ss(x))) as u16
}
