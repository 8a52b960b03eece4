//! AVX2 + FMA + F16C dot kernels (one 256-bit register = one 32-element block).
//!
//! Integer core: `vpmaddubsw` (u8 x i8 -> pairwise-summed i16) then `vpmaddwd` by
//! ones (-> i32). maddubs needs one unsigned operand, so signed weights use the
//! sign trick: `|w| * (a * sign(w))`. No sum here can saturate the i16 step:
//! the largest is `2 * 128 * 127 = 32512` (Q8_0) or `2 * 63 * 127` (Q6_K).
//!
//! Safety: every `unsafe fn` here requires AVX2, FMA and F16C, and rows of the
//! lengths [`super::check_dot`] verifies. The safe wrappers check the lengths; they
//! are reachable only through [`super::vec_dot_fn`], which checks the CPU.

use std::arch::x86_64::*;
use std::ptr::read_unaligned;

use loupe_core::GgmlType;

use crate::reduce::avx2::hsum;

use super::avx2_klanes::{dot_q4k, dot_q5k, dot_q6k};
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
        GgmlType::Q4K => q4k_q8k,
        GgmlType::Q5K => q5k_q8k,
        GgmlType::Q6K => q6k_q8k,
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
    q4k_q8k => dot_q4k(Q4K);
    q5k_q8k => dot_q5k(Q5K);
    q6k_q8k => dot_q6k(Q6K);
}

#[inline(always)]
unsafe fn rd_u16(p: *const u8) -> u16 {
    read_unaligned(p.cast::<u16>())
}

#[inline(always)]
unsafe fn rd_u32(p: *const u8) -> u32 {
    read_unaligned(p.cast::<u32>())
}

/// The product of two f16 scales, `d_x * d_y`, in lane 0 (F16C converts both at once).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn scale2(dx: u16, dy: u16) -> __m128 {
    let f = _mm_cvtph_ps(_mm_cvtsi32_si128((dx as u32 | (dy as u32) << 16) as i32));
    _mm_mul_ss(f, _mm_movehdup_ps(f))
}

/// Unpacks 16 bytes of nibbles into 32 bytes: low nibbles (elements 0-15) in the
/// low lane, high nibbles (16-31) in the high lane, the GGML element order.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn nibbles(p: *const u8) -> __m256i {
    let q = _mm_loadu_si128(p.cast());
    _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(q, 4), q), _mm256_set1_epi8(0x0F))
}

/// Expands the 32 bits of a Q5 `qh` word to 32 bytes, 0xFF where the bit is set
/// (byte `j` <- bit `j`): broadcast byte `j / 8` into each byte, then test bit `j % 8`
/// by OR-ing every other bit in and comparing with all-ones.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn bits_to_bytes(qh: u32) -> __m256i {
    let spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32(qh as i32),
        _mm256_setr_epi64x(0, 0x0101_0101_0101_0101, 0x0202_0202_0202_0202, 0x0303_0303_0303_0303),
    );
    let others = _mm256_set1_epi64x(0x7fbf_dfef_f7fb_fdfe_u64 as i64);
    _mm256_cmpeq_epi8(_mm256_or_si256(spread, others), _mm256_set1_epi8(-1))
}

/// Signed x signed bytes -> 8 lanes of i32 sums (sign trick, see the module note).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_i8(w: __m256i, a: __m256i) -> __m256i {
    let p = _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(a, w));
    _mm256_madd_epi16(p, _mm256_set1_epi16(1))
}

/// Unsigned x signed bytes -> 8 lanes of i32 sums.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_u8(w: __m256i, a: __m256i) -> __m256i {
    _mm256_madd_epi16(_mm256_maddubs_epi16(w, a), _mm256_set1_epi16(1))
}

/// Shared loop of the float kernels: `$load(p)` yields 8 weights as f32. `$rows::<NA>` dots
/// one weight row with `NA` activation rows (`stride` floats apart), each with exactly the
/// operations of the one-row `$name` (which is `$rows::<1>`), the weights loaded once.
macro_rules! float_kernel {
    ($name:ident, $rows:ident, $chains:ident, $finish:ident, $segmented:ident, $wsize:expr, |$p:ident| $load:expr, $scalar:path) => {
        #[target_feature(enable = "avx2,fma,f16c")]
        unsafe fn $name(w: *const u8, a: *const u8, n: usize) -> f32 {
            $rows::<1>(w, a.cast::<f32>(), n, n)[0]
        }

        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
        pub(crate) unsafe fn $rows<const NA: usize>(w: *const u8, a: *const f32, n: usize, stride: usize) -> [f32; NA] {
            let mut acc = [[_mm256_setzero_ps(); 4]; NA];
            let n32 = n / 32 * 32;
            $chains::<NA>(w, a, stride, 0..n32, super::FLOAT_ROWS_PREFETCH, &mut acc);
            $finish::<NA>(w, a, n, stride, n32, &acc)
        }

        /// `$rows`'s main loop over the elements `range` (whole steps of 32, below `n / 32 *
        /// 32`) into its four chains per activation row, `acc` (in registers for the loop).
        #[inline(always)]
        #[allow(clippy::needless_range_loop)]
        unsafe fn $chains<const NA: usize>(
            w: *const u8,
            a: *const f32,
            stride: usize,
            range: std::ops::Range<usize>,
            ahead: usize,
            acc_out: &mut [[__m256; 4]; NA],
        ) {
            let mut acc = *acc_out;
            let mut i = range.start;
            while i < range.end {
                // As the AVX-512 kernels: the weights prefetched ahead into L2.
                let ahead = w.wrapping_add(i * $wsize).wrapping_add(ahead);
                for line in (0..32 * $wsize).step_by(64) {
                    _mm_prefetch::<_MM_HINT_T1>(ahead.wrapping_add(line).cast());
                }
                for u in 0..4 {
                    let $p = w.add((i + 8 * u) * $wsize);
                    let wv = $load;
                    for r in 0..NA {
                        acc[r][u] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(a.add(r * stride + i + 8 * u)), acc[r][u]);
                    }
                }
                i += 32;
            }
            *acc_out = acc;
        }

        /// `$rows`'s end from element `n32 = n / 32 * 32`: the 8-wide steps into the first
        /// chain, the chains' sum and reduction, the scalar tail.
        #[inline(always)]
        #[allow(clippy::needless_range_loop)]
        unsafe fn $finish<const NA: usize>(
            w: *const u8,
            a: *const f32,
            n: usize,
            stride: usize,
            n32: usize,
            acc_in: &[[__m256; 4]; NA],
        ) -> [f32; NA] {
            let mut acc = *acc_in;
            let mut i = n32;
            while i + 8 <= n {
                let $p = w.add(i * $wsize);
                let wv = $load;
                for r in 0..NA {
                    acc[r][0] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(a.add(r * stride + i)), acc[r][0]);
                }
                i += 8;
            }
            let mut out = [0f32; NA];
            for r in 0..NA {
                let v = _mm256_add_ps(_mm256_add_ps(acc[r][0], acc[r][1]), _mm256_add_ps(acc[r][2], acc[r][3]));
                out[r] = hsum(v);
                if i < n {
                    let wt = std::slice::from_raw_parts(w.add(i * $wsize), (n - i) * $wsize);
                    let at = std::slice::from_raw_parts(a.add(r * stride + i).cast::<u8>(), (n - i) * 4);
                    out[r] += $scalar(wt, at, n - i);
                }
            }
            out
        }

        /// `$rows` for `rows` weight rows against the same activation rows, segment by
        /// segment, as the AVX-512 `float_kernel!`'s `$segmented`.
        #[inline]
        #[target_feature(enable = "avx2,fma,f16c")]
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
                _mm256_setzero_ps(),
                32,
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
    |p| _mm256_loadu_ps(p.cast()),
    super::scalar::f32_f32
);
float_kernel!(
    dot_f16,
    dot_f16_rows,
    f16_chains,
    f16_finish,
    dot_f16_segmented,
    2,
    |p| _mm256_cvtph_ps(_mm_loadu_si128(p.cast())),
    super::scalar::f16_f32
);
float_kernel!(
    dot_bf16,
    dot_bf16_rows,
    bf16_chains,
    bf16_finish,
    dot_bf16_segmented,
    2,
    |p| _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128(p.cast())), 16)),
    super::scalar::bf16_f32
);

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn dot_q4_0(w: *const u8, a: *const u8, n: usize) -> f32 {
    let mut acc = _mm256_setzero_ps();
    for i in 0..n / QK {
        let (x, y) = (w.add(i * 18), a.add(i * 34));
        let q = _mm256_sub_epi8(nibbles(x.add(2)), _mm256_set1_epi8(8));
        let p = dot_i8(q, _mm256_loadu_si256(y.add(2).cast()));
        let d = _mm256_broadcastss_ps(scale2(rd_u16(x), rd_u16(y)));
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), d, acc);
    }
    hsum(acc)
}

/// Q4_1: the header pairs `(d, m)` and `(d, s)` convert together; lane 0 of their
/// product is `d_x d_y`, lane 1 is `m_x s_y` (the offset term, summed separately).
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn dot_q4_1(w: *const u8, a: *const u8, n: usize) -> f32 {
    let mut acc = _mm256_setzero_ps();
    let mut acc_m = _mm_setzero_ps();
    for i in 0..n / QK {
        let (x, y) = (w.add(i * 20), a.add(i * 36));
        let h = _mm_cvtph_ps(_mm_set_epi32(0, 0, rd_u32(y) as i32, rd_u32(x) as i32));
        let prod = _mm_mul_ps(h, _mm_movehl_ps(h, h));
        acc_m = _mm_add_ps(acc_m, prod);
        let p = dot_u8(nibbles(x.add(4)), _mm256_loadu_si256(y.add(4).cast()));
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_broadcastss_ps(prod), acc);
    }
    hsum(acc) + _mm_cvtss_f32(_mm_movehdup_ps(acc_m))
}

/// Q5_0: `q - 16` is the nibble when the high bit is set and the nibble with its
/// upper four bits set (i.e. minus 16, as an i8) when it is clear.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn dot_q5_0(w: *const u8, a: *const u8, n: usize) -> f32 {
    let mut acc = _mm256_setzero_ps();
    for i in 0..n / QK {
        let (x, y) = (w.add(i * 22), a.add(i * 34));
        let hi = _mm256_andnot_si256(bits_to_bytes(rd_u32(x.add(2))), _mm256_set1_epi8(0xF0u8 as i8));
        let q = _mm256_or_si256(nibbles(x.add(6)), hi);
        let p = dot_i8(q, _mm256_loadu_si256(y.add(2).cast()));
        let d = _mm256_broadcastss_ps(scale2(rd_u16(x), rd_u16(y)));
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), d, acc);
    }
    hsum(acc)
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn dot_q5_1(w: *const u8, a: *const u8, n: usize) -> f32 {
    let mut acc = _mm256_setzero_ps();
    let mut acc_m = _mm_setzero_ps();
    for i in 0..n / QK {
        let (x, y) = (w.add(i * 24), a.add(i * 36));
        let h = _mm_cvtph_ps(_mm_set_epi32(0, 0, rd_u32(y) as i32, rd_u32(x) as i32));
        let prod = _mm_mul_ps(h, _mm_movehl_ps(h, h));
        acc_m = _mm_add_ps(acc_m, prod);
        let hi = _mm256_and_si256(bits_to_bytes(rd_u32(x.add(4))), _mm256_set1_epi8(0x10));
        let q = _mm256_or_si256(nibbles(x.add(8)), hi);
        let p = dot_u8(q, _mm256_loadu_si256(y.add(4).cast()));
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_broadcastss_ps(prod), acc);
    }
    hsum(acc) + _mm_cvtss_f32(_mm_movehdup_ps(acc_m))
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn dot_q8_0(w: *const u8, a: *const u8, n: usize) -> f32 {
    let mut acc = _mm256_setzero_ps();
    for i in 0..n / QK {
        let (x, y) = (w.add(i * 34), a.add(i * 34));
        let p = dot_i8(_mm256_loadu_si256(x.add(2).cast()), _mm256_loadu_si256(y.add(2).cast()));
        let d = _mm256_broadcastss_ps(scale2(rd_u16(x), rd_u16(y)));
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), d, acc);
    }
    hsum(acc)
}
