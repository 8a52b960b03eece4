//! The AVX2 chain kernel: two vectors per activation row hold its 16 outputs of the panel;
//! 6 rows at a time (12 accumulators, the two panel vectors and a broadcast: 15 of the 16
//! registers). The chains run [`super::DEPTH`] elements at a time over all rows, the partial
//! sums kept in `y` between (exact: an f32 stored and loaded is itself).

use std::arch::x86_64::*;

use super::{DEPTH, PANEL};

/// Activation rows per tile.
pub(super) const TILE_ROWS: usize = 6;

/// [`super::rows`] on AVX2 + FMA.
///
/// # Safety
/// As [`super::rows`], on a CPU with AVX2 and FMA.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn rows(x: *const f32, m: usize, k: usize, panel: *const f32, y: *mut f32, n: usize, cols: usize) {
    for k0 in (0..k).step_by(DEPTH) {
        let depth = DEPTH.min(k - k0);
        let (w, go_on) = (panel.add(k0 * PANEL), k0 > 0);
        let mut i = 0;
        while i + TILE_ROWS <= m {
            tile::<TILE_ROWS>(x.add(i * k + k0 * TILE_ROWS), depth, w, y.add(i * n), n, cols, go_on);
            i += TILE_ROWS;
        }
        // The last rows: the same chain per output, fewer accumulators.
        let (xt, yt) = (x.add(i * k), y.add(i * n));
        match m - i {
            1 => tile::<1>(xt.add(k0), depth, w, yt, n, cols, go_on),
            2 => tile::<2>(xt.add(k0 * 2), depth, w, yt, n, cols, go_on),
            3 => tile::<3>(xt.add(k0 * 3), depth, w, yt, n, cols, go_on),
            4 => tile::<4>(xt.add(k0 * 4), depth, w, yt, n, cols, go_on),
            5 => tile::<5>(xt.add(k0 * 5), depth, w, yt, n, cols, go_on),
            _ => {}
        }
    }
}

/// `depth` elements of a tile of `R` activation rows (element-major, see `pack_rows`)
/// against the panel, the chains starting from `y` (`go_on`) or +0.0; the first `cols`
/// outputs of each row are written.
#[inline]
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma")]
unsafe fn tile<const R: usize>(
    x: *const f32,
    depth: usize,
    panel: *const f32,
    y: *mut f32,
    n: usize,
    cols: usize,
    go_on: bool,
) {
    let mut lo = [_mm256_setzero_ps(); R];
    let mut hi = [_mm256_setzero_ps(); R];
    if go_on {
        for r in 0..R {
            let mut part = [0f32; PANEL];
            std::ptr::copy_nonoverlapping(y.add(r * n), part.as_mut_ptr(), cols);
            lo[r] = _mm256_loadu_ps(part.as_ptr());
            hi[r] = _mm256_loadu_ps(part.as_ptr().add(8));
        }
    }
    for kk in 0..depth {
        let w0 = _mm256_loadu_ps(panel.add(kk * PANEL));
        let w1 = _mm256_loadu_ps(panel.add(kk * PANEL + 8));
        for r in 0..R {
            let xv = _mm256_set1_ps(*x.add(kk * R + r));
            lo[r] = _mm256_fmadd_ps(w0, xv, lo[r]);
            hi[r] = _mm256_fmadd_ps(w1, xv, hi[r]);
        }
    }
    for r in 0..R {
        if cols == PANEL {
            _mm256_storeu_ps(y.add(r * n), lo[r]);
            _mm256_storeu_ps(y.add(r * n + 8), hi[r]);
        } else {
            let mut out = [0f32; PANEL];
            _mm256_storeu_ps(out.as_mut_ptr(), lo[r]);
            _mm256_storeu_ps(out.as_mut_ptr().add(8), hi[r]);
            std::ptr::copy_nonoverlapping(out.as_ptr(), y.add(r * n), cols);
        }
    }
}

/// `src` (`PANEL` rows of `k`, a multiple of 8) transposed into `dst` (`k` rows of `PANEL`),
/// as two 8-row halves, 8 x 8 at a time: pairs of rows interleaved, 4 x 4 blocks within
/// 128-bit lanes, then the lanes.
///
/// # Safety
/// `src` readable and `dst` writable for `PANEL * k` f32; `k` a multiple of 8; AVX2.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn transpose(src: *const f32, k: usize, dst: *mut f32) {
    for half in 0..2 {
        let (src, dst) = (src.add(half * 8 * k), dst.add(half * 8));
        for kk in (0..k).step_by(8) {
            let r: [__m256; 8] = std::array::from_fn(|j| _mm256_loadu_ps(src.add(j * k + kk)));
            let t: [__m256; 8] = std::array::from_fn(|j| {
                let (a, b) = (r[j & !1], r[j | 1]);
                if j % 2 == 0 {
                    _mm256_unpacklo_ps(a, b)
                } else {
                    _mm256_unpackhi_ps(a, b)
                }
            });
            // u[4g + q]: in lane l, column 4l + q of rows 4g..4g + 4.
            let u: [__m256; 8] = std::array::from_fn(|j| {
                let (g, q) = (j / 4, j % 4);
                let (a, b) = (t[4 * g + q / 2], t[4 * g + 2 + q / 2]);
                if q % 2 == 0 {
                    _mm256_shuffle_ps::<0x44>(a, b)
                } else {
                    _mm256_shuffle_ps::<0xEE>(a, b)
                }
            });
            for q in 0..4 {
                _mm256_storeu_ps(dst.add((kk + q) * PANEL), _mm256_permute2f128_ps::<0x20>(u[q], u[4 + q]));
                _mm256_storeu_ps(dst.add((kk + 4 + q) * PANEL), _mm256_permute2f128_ps::<0x31>(u[q], u[4 + q]));
            }
        }
    }
}
