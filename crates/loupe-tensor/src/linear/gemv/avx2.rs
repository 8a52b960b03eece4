//! The GEMV's AVX2 group, every Act16 type.

use std::arch::x86_64::*;
use std::ops::Range;

use super::x86::*;
use crate::linear::act16::Act16;
use crate::linear::dispatch::MAX_STACK_BLOCKS;
use crate::linear::kinds::*;
use crate::linear::qmatrix::QMatrix;
use crate::linear::simd::avx2;
use crate::pool::OutPtr;

/// AVX2 driver (see [`super::gemv_rows`] for the contract).
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn rows_avx2(w: &QMatrix, rows: Range<usize>, act: &Act16<'_>, out: OutPtr) {
    drive!(w, rows, act, out, group_avx2, [Q4_1, Q8_0, Q5_0, Q6_K, Q4_K, Q4_0, Q5_K])
}

/// `R` consecutive weight rows at `w` against the activations: per row, the
/// arithmetic of `decode::avx2::dot_{q4_1,q8_0,q5_0,q6_k}_act16` (per block, elements 0..16 and
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
                $acc[r] =
                    _mm256_fmadd_ps(_mm256_set1_ps(*p.add(p_at::<R, KIND>(b, r))), _mm256_cvtepi32_ps(dot), $acc[r]);
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
