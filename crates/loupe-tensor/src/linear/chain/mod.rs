//! [`matmul_wq_chain`]: block-quantized weights dequantized to f32, f32 activations, and
//! every output one fused multiply-add chain over `k` in increasing order from `+0.0`.
//!
//! This is the arithmetic of prompt rows in the batched engine. The 16-bit-activation
//! kernels (`invariant`) spend one float conversion and one FMA per 32-value block and
//! output on top of their integer products; here a 16-wide panel of weight rows is
//! dequantized once and every activation row reuses it, so prefill runs at the FMA units'
//! rate. The result is the same bits whatever the number of rows, their order, the thread
//! count and the ISA: each output's chain depends only on its activation row and its weight
//! row (an FMA rounds the same on every ISA, and `f32::mul_add` is the scalar reference).
//!
//! Layout: a task dequantizes [`PANEL`] weight rows ([`dequantize_row_fast`], bit-identical
//! to `quant::dequantize_row`) and stores them transposed, `panel[kk * PANEL + j]`, so one
//! vector load holds element `kk` of all 16 rows; each activation row's element is
//! broadcast and multiplied into one accumulator vector per row. A panel of `k` columns is
//! `64 k` bytes (311 KiB at `k = 4864`), held in L2 while all rows stream past it.

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(test)]
mod tests;

use std::cell::RefCell;

use super::decode::dequantize_row_fast;
use super::qmatrix::QMatrix;
use crate::pool::{self, OutPtr};
use crate::quant::Isa;
use crate::TensorError;

/// Weight rows per panel: one AVX-512 vector (two AVX2 vectors) of f32.
pub const PANEL: usize = 16;

/// Elements of `k` each pass of the kernels takes over all rows before the next (their
/// partial sums wait in `y`), so a pass's slice of the panel (64 KiB) and of a 12-row tile
/// (48 KiB) fit a 512 KiB L2 beside each other (Zen 3's) at any `k`; shorter passes cost
/// more than they save, their partial sums going through memory more often (BENCHMARKS.md,
/// "Batched engine", 2026-11-28 night).
const DEPTH: usize = 1024;

/// Tasks per compute thread: enough that a thread finishing early takes another panel run.
const TASKS_PER_THREAD: usize = 4;

thread_local! {
    /// The calling thread's panel (`k x PANEL`) and its weight rows dequantized (`PANEL x k`).
    static PANELS: RefCell<(Vec<f32>, Vec<f32>)> = const { RefCell::new((Vec::new(), Vec::new())) };
    /// The caller's activations in tiles ([`pack_rows`]).
    static TILES: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// `y[m, n] = x[m, k] @ W^T` for a GGML-typed `W` (`n = w.rows`, `k = w.cols`): each output
/// the FMA chain `acc = fma(w[j, kk], x[i, kk], acc)` for `kk = 0..k` from `acc = +0.0`,
/// then the tensor's scale. Runs the kernels of [`Isa::active`]; every ISA gives the same bits.
pub fn matmul_wq_chain(x: &[f32], w: &QMatrix, y: &mut [f32], m: usize) -> Result<(), TensorError> {
    matmul_wq_chain_with(Isa::active(), x, w, y, m)
}

/// [`matmul_wq_chain`] on the kernels of a given ISA level (tests compare them).
///
/// # Panics
/// If this CPU does not support `isa`.
pub fn matmul_wq_chain_with(isa: Isa, x: &[f32], w: &QMatrix, y: &mut [f32], m: usize) -> Result<(), TensorError> {
    assert!(isa.is_supported(), "matmul_wq_chain_with: this CPU does not support {isa}");
    let (n, k) = (w.rows, w.cols);
    w.check_io("matmul_wq_chain", x, y, m)?;
    if m == 0 || n == 0 {
        return Ok(());
    }
    let panels = n.div_ceil(PANEL);
    let tasks = (pool::threads() * TASKS_PER_THREAD).min(panels).max(1);
    let per = panels.div_ceil(tasks);
    let out = OutPtr(y.as_mut_ptr());
    let height = tile_rows(isa);
    TILES.with(|tiles| {
        let tiles = &mut *tiles.borrow_mut();
        pack_rows(x, m, k, height, tiles)?;
        pool::try_run(tasks, &|t| {
            PANELS.with(|bufs| {
                let (panel, dequantized) = &mut *bufs.borrow_mut();
                panel.resize(k * PANEL, 0.0);
                dequantized.resize(PANEL * k, 0.0);
                for p in (t * per).min(panels)..((t + 1) * per).min(panels) {
                    let j0 = p * PANEL;
                    let cols = PANEL.min(n - j0);
                    pack(isa, w, j0, cols, panel, dequantized)?;
                    // SAFETY: the tiles hold m rows of k and the panel k x PANEL (sized
                    // above); the outputs are columns j0..j0 + cols of y (m x n), written by
                    // this task alone.
                    unsafe { rows(isa, tiles.as_ptr(), m, k, panel.as_ptr(), out.get().add(j0), n, cols) };
                }
                Ok(())
            })
        })
    })?;
    w.apply_tensor_scale(y);
    Ok(())
}

/// Activation rows per tile of the kernel `isa` runs (the layout [`pack_rows`] writes).
fn tile_rows(isa: Isa) -> usize {
    #[cfg(target_arch = "x86_64")]
    if isa >= Isa::Avx512 {
        return avx512::TILE_ROWS;
    } else if isa >= Isa::Avx2 {
        return avx2::TILE_ROWS;
    }
    let _ = isa;
    1
}

/// `x` (`m` rows of `k`) in tiles of `height` rows, each element-major: tile `t` (rows
/// `height t..`, `h` of them, fewer in the last) starts at `height t k` and holds row `r`'s
/// element `kk` at `kk h + r`, so a tile's `h` elements at `kk` are adjacent and the
/// kernel addresses them from one pointer. The tiles are spread over the pool (every
/// element is written, so the buffer is only grown, never cleared).
fn pack_rows(x: &[f32], m: usize, k: usize, height: usize, tiles: &mut Vec<f32>) -> Result<(), TensorError> {
    if tiles.len() < m * k {
        tiles.resize(m * k, 0.0);
    }
    let out = OutPtr(tiles.as_mut_ptr());
    pool::try_run(m.div_ceil(height), &|t| {
        let (i0, h) = (t * height, height.min(m - t * height));
        // SAFETY: tile t is elements i0 k .. (i0 + h) k of the buffer (grown to m k above),
        // written by this task alone.
        let tile = unsafe { std::slice::from_raw_parts_mut(out.get().add(i0 * k), h * k) };
        for (r, row) in x[i0 * k..(i0 + h) * k].chunks_exact(k).enumerate() {
            for (kk, &v) in row.iter().enumerate() {
                tile[kk * h + r] = v;
            }
        }
        Ok(())
    })
}

/// Dequantizes weight rows `j0..j0 + cols` of `w` into `panel` transposed (`panel[kk *
/// PANEL + j]`) through `dequantized` (`PANEL` rows of `k`); the columns of missing rows (a
/// last panel under 16) are zero.
fn pack(
    isa: Isa,
    w: &QMatrix,
    j0: usize,
    cols: usize,
    panel: &mut [f32],
    dequantized: &mut [f32],
) -> Result<(), TensorError> {
    let k = w.cols;
    for (j, row) in dequantized.chunks_exact_mut(k).enumerate() {
        if j < cols {
            dequantize_row_fast(w.ty, w.row(j0 + j), row)?;
        } else {
            row.iter_mut().for_each(|v| *v = 0.0);
        }
    }
    #[cfg(target_arch = "x86_64")]
    if isa >= Isa::Avx512 && k.is_multiple_of(PANEL) {
        // SAFETY: AVX-512 is available; both buffers hold PANEL x k f32 (sized by the caller).
        unsafe { avx512::transpose(dequantized.as_ptr(), k, panel.as_mut_ptr()) };
        return Ok(());
    } else if isa >= Isa::Avx2 && k.is_multiple_of(8) {
        // SAFETY: AVX2 is available; both buffers hold PANEL x k f32 (sized by the caller).
        unsafe { avx2::transpose(dequantized.as_ptr(), k, panel.as_mut_ptr()) };
        return Ok(());
    }
    let _ = isa;
    for (j, row) in dequantized.chunks_exact(k).enumerate() {
        for (kk, &v) in row.iter().enumerate() {
            panel[kk * PANEL + j] = v;
        }
    }
    Ok(())
}

/// All `m` activation rows, in the tiles [`pack_rows`] wrote for `isa` at `x`, against one
/// packed panel, into the first `cols` columns of each output row at `y` (row stride `n`).
///
/// # Safety
/// `x` readable for `m * k` f32, `panel` for `k * PANEL`, `y` writable at `i * n + j` for
/// `i < m`, `j < cols <= PANEL`, and `isa` supported by this CPU.
#[allow(clippy::too_many_arguments)]
unsafe fn rows(isa: Isa, x: *const f32, m: usize, k: usize, panel: *const f32, y: *mut f32, n: usize, cols: usize) {
    #[cfg(target_arch = "x86_64")]
    if isa >= Isa::Avx2 {
        if isa >= Isa::Avx512 {
            avx512::rows(x, m, k, panel, y, n, cols);
        } else {
            avx2::rows(x, m, k, panel, y, n, cols);
        }
        return;
    }
    let _ = isa;
    rows_scalar(x, m, k, panel, y, n, cols);
}

/// The reference: each output's chain written out with `f32::mul_add` (tiles of one row
/// are the rows as they were).
///
/// # Safety
/// As [`rows`].
unsafe fn rows_scalar(x: *const f32, m: usize, k: usize, panel: *const f32, y: *mut f32, n: usize, cols: usize) {
    for i in 0..m {
        for j in 0..cols {
            let mut acc = 0f32;
            for kk in 0..k {
                acc = (*panel.add(kk * PANEL + j)).mul_add(*x.add(i * k + kk), acc);
            }
            *y.add(i * n + j) = acc;
        }
    }
}
