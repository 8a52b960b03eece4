//! AVX-512 register-tiled dot products for float weights (F32, F16, BF16) with
//! f32 activations: up to 4 weight rows x 4 activation rows per call.
//!
//! Serves `matmul_f32` at small `m` (decode and short prompts), where the `gemm`
//! crate packs all of `W` before multiplying and so reads it twice (measured: with
//! m = 2..4 it is 5x slower than m = 1), and float `QMatrix` weights at any `m`.
//! Each weight vector is loaded (and for F16/BF16 widened) once for all activation
//! rows of the tile; each activation vector once for all weight rows. The ragged
//! end of a row uses masked loads, so no scalar tail.
//!
//! Safety: every `unsafe fn` requires AVX-512 F/BW/VL (+ the AVX2/FMA/F16C set) and
//! the pointer contract of [`TileFn`]; reachable only through [`super::tile_fn`],
//! which checks the CPU.

use std::arch::x86_64::*;

use loupe_core::GgmlType;

use super::TileFn;

pub(super) const MAX_RW: usize = 4;
pub(super) const MAX_CA: usize = 4;

pub(super) fn tile_fn(ty: GgmlType) -> Option<TileFn> {
    Some(match ty {
        GgmlType::F32 => dispatch::<F32>,
        GgmlType::F16 => dispatch::<F16>,
        GgmlType::BF16 => dispatch::<BF16>,
        _ => return None,
    })
}

/// How to load 16 weights as f32.
trait Load {
    /// Bytes per weight.
    const SIZE: usize;
    unsafe fn load(p: *const u8) -> __m512;
    /// The first lanes selected by `mask`, zeros elsewhere; reads only those.
    unsafe fn load_masked(p: *const u8, mask: __mmask16) -> __m512;
}

struct F32;
struct F16;
struct BF16;

impl Load for F32 {
    const SIZE: usize = 4;
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    unsafe fn load(p: *const u8) -> __m512 {
        _mm512_loadu_ps(p.cast())
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    unsafe fn load_masked(p: *const u8, mask: __mmask16) -> __m512 {
        _mm512_maskz_loadu_ps(mask, p.cast())
    }
}

impl Load for F16 {
    const SIZE: usize = 2;
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    unsafe fn load(p: *const u8) -> __m512 {
        _mm512_cvtph_ps(_mm256_loadu_si256(p.cast()))
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    unsafe fn load_masked(p: *const u8, mask: __mmask16) -> __m512 {
        _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask, p.cast()))
    }
}

impl Load for BF16 {
    const SIZE: usize = 2;
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    unsafe fn load(p: *const u8) -> __m512 {
        _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(p.cast())), 16))
    }
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
    unsafe fn load_masked(p: *const u8, mask: __mmask16) -> __m512 {
        let h = _mm256_maskz_loadu_epi16(mask, p.cast());
        _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16))
    }
}

tile_dispatch!(
    Load,
    tile,
    (4, 4),
    (3, 4),
    (2, 4),
    (1, 4),
    (4, 3),
    (3, 3),
    (2, 3),
    (1, 3),
    (4, 2),
    (3, 2),
    (2, 2),
    (1, 2),
    (4, 1),
    (3, 1),
    (2, 1),
    (1, 1)
);

// Index loops over the const-size register arrays keep the tile shape explicit.
#[allow(clippy::needless_range_loop)]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma,f16c")]
unsafe fn tile<W: Load, const RW: usize, const CA: usize>(args: super::TileArgs) {
    let (w, w_stride, a, a_stride, n, out, out_stride) = args;
    let mut acc = [[_mm512_setzero_ps(); CA]; RW];
    let mut i = 0;
    while i + 16 <= n {
        let mut x = [_mm512_setzero_ps(); CA];
        for c in 0..CA {
            x[c] = _mm512_loadu_ps(a.add(c * a_stride + 4 * i).cast());
        }
        for r in 0..RW {
            let wv = W::load(w.add(r * w_stride + i * W::SIZE));
            for c in 0..CA {
                acc[r][c] = _mm512_fmadd_ps(wv, x[c], acc[r][c]);
            }
        }
        i += 16;
    }
    if i < n {
        let mask: __mmask16 = (1u16 << (n - i)) - 1;
        let mut x = [_mm512_setzero_ps(); CA];
        for c in 0..CA {
            x[c] = _mm512_maskz_loadu_ps(mask, a.add(c * a_stride + 4 * i).cast());
        }
        for r in 0..RW {
            let wv = W::load_masked(w.add(r * w_stride + i * W::SIZE), mask);
            for c in 0..CA {
                acc[r][c] = _mm512_fmadd_ps(wv, x[c], acc[r][c]);
            }
        }
    }
    for r in 0..RW {
        for c in 0..CA {
            *out.add(c * out_stride + r) = _mm512_reduce_add_ps(acc[r][c]);
        }
    }
}
