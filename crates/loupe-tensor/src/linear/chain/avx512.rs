//! The AVX-512 chain kernel: one vector per activation row holds its 16 outputs of the
//! panel; 12 rows at a time (12 accumulators, the panel vector and a broadcast), so each
//! panel load feeds 12 FMAs. The chains run [`super::DEPTH`] elements at a time over all
//! rows, the partial sums kept in `y` between (exact: an f32 stored and loaded is itself).

use std::arch::x86_64::*;

use super::{DEPTH, PANEL};

/// Activation rows per tile.
pub(super) const TILE_ROWS: usize = 12;

/// [`super::rows`] on AVX-512.
///
/// # Safety
/// As [`super::rows`], on a CPU with AVX-512 F.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn rows(x: *const f32, m: usize, k: usize, panel: *const f32, y: *mut f32, n: usize, cols: usize) {
    let mask = ((1u32 << cols) - 1) as __mmask16;
    for k0 in (0..k).step_by(DEPTH) {
        let depth = DEPTH.min(k - k0);
        let (w, go_on) = (panel.add(k0 * PANEL), k0 > 0);
        let mut i = 0;
        while i + TILE_ROWS <= m {
            tile::<TILE_ROWS>(x.add(i * k + k0 * TILE_ROWS), depth, w, y.add(i * n), n, mask, go_on);
            i += TILE_ROWS;
        }
        // The last rows: the same chain per output, fewer accumulators.
        macro_rules! tail {
            ($($r:literal)*) => {
                match m - i {
                    $($r => tile::<$r>(x.add(i * k + k0 * $r), depth, w, y.add(i * n), n, mask, go_on),)*
                    _ => {}
                }
            };
        }
        tail!(1 2 3 4 5 6 7 8 9 10 11);
    }
}

/// `depth` elements of a tile of `R` activation rows (element-major, see `pack_rows`)
/// against the panel, the chains starting from `y` (`go_on`) or +0.0, written under `mask`.
#[inline]
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f")]
unsafe fn tile<const R: usize>(
    x: *const f32,
    depth: usize,
    panel: *const f32,
    y: *mut f32,
    n: usize,
    mask: __mmask16,
    go_on: bool,
) {
    let mut acc = [_mm512_setzero_ps(); R];
    if go_on {
        for (r, a) in acc.iter_mut().enumerate() {
            *a = _mm512_maskz_loadu_ps(mask, y.add(r * n));
        }
    }
    for kk in 0..depth {
        let w = _mm512_loadu_ps(panel.add(kk * PANEL));
        for (r, a) in acc.iter_mut().enumerate() {
            *a = _mm512_fmadd_ps(w, _mm512_set1_ps(*x.add(kk * R + r)), *a);
        }
    }
    for (r, a) in acc.iter().enumerate() {
        _mm512_mask_storeu_ps(y.add(r * n), mask, *a);
    }
}

/// `src` (`PANEL` rows of `k`, a multiple of 16) transposed into `dst` (`k` rows of
/// `PANEL`), 16 x 16 at a time: pairs of rows interleaved, then 4 x 4 blocks within 128-bit
/// lanes, then the lanes.
///
/// # Safety
/// `src` readable and `dst` writable for `PANEL * k` f32; `k` a multiple of 16; AVX-512 F.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn transpose(src: *const f32, k: usize, dst: *mut f32) {
    for kk in (0..k).step_by(16) {
        let r: [__m512; 16] = std::array::from_fn(|j| _mm512_loadu_ps(src.add(j * k + kk)));
        // t[2i], t[2i + 1]: rows 2i and 2i + 1 interleaved (low / high pairs of each lane).
        let t: [__m512; 16] = std::array::from_fn(|j| {
            let (a, b) = (r[j & !1], r[j | 1]);
            if j % 2 == 0 {
                _mm512_unpacklo_ps(a, b)
            } else {
                _mm512_unpackhi_ps(a, b)
            }
        });
        // u[4g + q]: in lane l, column 4l + q of rows 4g..4g + 4.
        let u: [__m512; 16] = std::array::from_fn(|j| {
            let (g, q) = (j / 4, j % 4);
            let (a, b) = (t[4 * g + q / 2], t[4 * g + 2 + q / 2]);
            if q % 2 == 0 {
                _mm512_shuffle_ps::<0x44>(a, b)
            } else {
                _mm512_shuffle_ps::<0xEE>(a, b)
            }
        });
        for q in 0..4 {
            let a = _mm512_shuffle_f32x4::<0x44>(u[q], u[4 + q]);
            let b = _mm512_shuffle_f32x4::<0xEE>(u[q], u[4 + q]);
            let c = _mm512_shuffle_f32x4::<0x44>(u[8 + q], u[12 + q]);
            let d = _mm512_shuffle_f32x4::<0xEE>(u[8 + q], u[12 + q]);
            _mm512_storeu_ps(dst.add((kk + q) * PANEL), _mm512_shuffle_f32x4::<0x88>(a, c));
            _mm512_storeu_ps(dst.add((kk + 4 + q) * PANEL), _mm512_shuffle_f32x4::<0xDD>(a, c));
            _mm512_storeu_ps(dst.add((kk + 8 + q) * PANEL), _mm512_shuffle_f32x4::<0x88>(b, d));
            _mm512_storeu_ps(dst.add((kk + 12 + q) * PANEL), _mm512_shuffle_f32x4::<0xDD>(b, d));
        }
    }
}
