//! [`matmul_q_prompt`]: prompt rows against Q4_K, Q5_K and Q6_K weights with 8-bit activations
//! (`--precision auto` and `q8`), on AVX-512 VNNI, through weight panels whose lanes are
//! output columns.
//!
//! **Why a kernel of its own.** The row-tiled dots of `quant` (`avx512_ktile`) keep one
//! (weight row, activation row) pair per register: 64 codes meet 64 activations, and the
//! sub-block scales ride on the second of two 16-bit multiplies (`vpmaddubsw`, then
//! `vpdpwssd`), two multiplies per 64 products. Here 16 weight rows are rearranged so that a
//! 64-byte vector holds 4 consecutive codes of each of the 16 rows: one `vpdpbusd` against 4
//! activations broadcast adds 64 products into the 16 rows' lanes, and after the vectors of a
//! sum group (32 elements for Q4_K and Q5_K, 16 for Q6_K: one scale each) each lane holds that row's
//! group sum. One multiply per 64 products, and no horizontal sum at all: a lane is an output.
//!
//! **Activations in blocks of 32** (Q8_0: an f16 scale per 32 values), not Q8_K's 256: the
//! group sums are scaled in f32 anyway, so a scale per 32 costs nothing more, and an outlier
//! coarsens only its own 32 values. Gemma 3's hidden states have outliers ~100x their
//! neighbours; with Q8_K activations its teacher-forced agreement sat at the 99% floor
//! (98.7-99.3% as the f32 rounding fell), with these above it (tests/gemma3.rs).
//!
//! **Arithmetic** (the contract; [`pack::rows_scalar`] is its reference). Weight codes are
//! unsigned (Q4_K 0..=15, Q5_K 0..=31, Q6_K 0..=63). For weight row `j` (per group `g`:
//! `ws_g = d * sc_g` and `wm_g`, f32: Q4_K's and Q5_K's `dmin * m_g`, Q6_K's `32 * ws_g`, its
//! codes' bias) and activation row `i` (codes `a`; per block of 32 `d_a` from its f16; per
//! group `s_a = d_a * f32(sum a)`), starting from `acc = +0.0`, groups in order:
//! * `dot = sum_{e in g} q_e a_e`, exact in i32;
//! * `acc = fma(f32(dot), ws_g * d_a, acc)`, then `acc = fma(-wm_g, s_a, acc)`;
//!
//! and the output is `acc`. Each output depends only on its weight row and activation row, so
//! the bits do not depend on how many rows are computed together, their order or the thread
//! count (invariant 12 holds for prompt rows). They are not the bits of `quant::vec_dot`:
//! the single-sequence engine's prefill (from 2 rows) and the batched engine's prompt rows use
//! this arithmetic, decode rows keep decode's.
//!
//! **Layout.** A task packs [`PANEL`] weight rows (`pack::pack`) into one super-block record
//! after another ([`Format::sb_bytes`] each): the codes as bytes, `codes[(e / 4) * 64 + 4 r +
//! e % 4]` = row `r`'s element `e`, then `ws` and `wm` of the 16 rows per group as f32 lanes.
//! A Q4_K or Q5_K panel of `k` columns is `20 k` bytes (160 KiB at `k = 8192`), Q6_K's `24 k`, held
//! in L2 while every activation row streams past it; packing costs about one pass over the
//! weights per call, small next to prefill's `m` passes.

#[cfg(target_arch = "x86_64")]
mod avx512;
mod layout;
mod pack;
#[cfg(test)]
mod tests;

use super::panel_tasks::for_each_panel;
pub use super::panel_tasks::PANEL;
use layout::{Format, Rows, Q8_0_BYTES, SIDE_BYTES};
use pack::pack;

use super::q8::matmul_q_with;
use super::qmatrix::QMatrix;
use crate::pool::{self, OutPtr};
use crate::quant::blocks::QK_K;
use crate::quant::{self, Isa};
use crate::{GgmlType, TensorError};

/// Whether prompt rows of `ty` take the panels at `isa` (else [`matmul_q_prompt`] is
/// `matmul_q`): Q4_K, Q5_K and Q6_K on AVX-512 VNNI.
pub fn has_q8_panels(isa: Isa, ty: GgmlType) -> bool {
    cfg!(target_arch = "x86_64") && isa >= Isa::Avx512 && Format::of(ty).is_some()
}

/// `y[m, n] = x[m, k] @ W^T` for prompt rows at 8-bit activations: the panels where
/// [`has_q8_panels`], else `matmul_q` (the dot's bits). Activations are quantized to Q8_0,
/// with their side table, in `scratch` (grown as needed, reused). Runs the kernels of
/// [`Isa::active`].
pub fn matmul_q_prompt(
    x: &[f32],
    w: &QMatrix,
    y: &mut [f32],
    m: usize,
    scratch: &mut Vec<u8>,
) -> Result<(), TensorError> {
    matmul_q_prompt_with(Isa::active(), x, w, y, m, scratch)
}

/// [`matmul_q_prompt`] on the kernels of a given ISA level.
///
/// # Panics
/// If this CPU does not support `isa`.
pub fn matmul_q_prompt_with(
    isa: Isa,
    x: &[f32],
    w: &QMatrix,
    y: &mut [f32],
    m: usize,
    scratch: &mut Vec<u8>,
) -> Result<(), TensorError> {
    assert!(isa.is_supported(), "matmul_q_prompt_with: this CPU does not support {isa}");
    if !has_q8_panels(isa, w.ty) || !w.cols.is_multiple_of(QK_K) {
        return matmul_q_with(isa, x, w, y, m, scratch);
    }
    panels(isa, x, w, y, m, scratch, false)
}

/// The panels' arithmetic through [`pack::rows_scalar`] whatever the ISA: the reference the
/// SIMD kernel is tested against (and `matmul_q_prompt`'s bits on every CPU that runs it).
pub fn matmul_q_prompt_scalar(
    x: &[f32],
    w: &QMatrix,
    y: &mut [f32],
    m: usize,
    scratch: &mut Vec<u8>,
) -> Result<(), TensorError> {
    panels(Isa::Scalar, x, w, y, m, scratch, true)
}

/// Quantizes `x` to Q8_0 with a side table of each block's `d_a` and `s_a` after the rows,
/// then runs every panel of `w` over all rows.
fn panels(
    isa: Isa,
    x: &[f32],
    w: &QMatrix,
    y: &mut [f32],
    m: usize,
    scratch: &mut Vec<u8>,
    scalar: bool,
) -> Result<(), TensorError> {
    let (n, k) = (w.rows, w.cols);
    let fmt = Format::of(w.ty).ok_or(TensorError::UnsupportedType { op: "matmul_q_prompt", dtype: w.ty })?;
    w.check_io("matmul_q_prompt", x, y, m)?;
    if !k.is_multiple_of(QK_K) {
        return Err(TensorError::Shape {
            op: "matmul_q_prompt",
            detail: format!("k = {k} is not a multiple of the {} super-block ({QK_K})", w.ty),
        });
    }
    if m == 0 || n == 0 {
        return Ok(());
    }
    let sbs = k / QK_K;
    let act_row = k / 32 * Q8_0_BYTES;
    let side_at = m * act_row;
    let need = side_at + m * sbs * SIDE_BYTES;
    if scratch.len() < need {
        scratch.resize(need, 0);
    }
    let (act, side) = scratch[..need].split_at_mut(side_at);
    let (act_out, side_out) = (OutPtr(act.as_mut_ptr()), OutPtr(side.as_mut_ptr()));
    let quantizer = if scalar { Isa::Scalar } else { isa };
    pool::try_run(m, &|i| {
        // SAFETY: task i alone writes row i of `act` (bytes i act_row ..) and of `side`
        // (bytes i sbs SIDE_BYTES ..), both borrowed exclusively for this call.
        let (row, row_side) = unsafe {
            (
                std::slice::from_raw_parts_mut(act_out.get().add(i * act_row), act_row),
                std::slice::from_raw_parts_mut(side_out.get().add(i * sbs * SIDE_BYTES), sbs * SIDE_BYTES),
            )
        };
        quant::quantize_row_with(quantizer, GgmlType::Q8_0, &x[i * k..(i + 1) * k], row)?;
        let len = fmt.group_len();
        for (b, blk) in row.chunks_exact(Q8_0_BYTES).enumerate() {
            let d = half::f16::from_le_bytes([blk[0], blk[1]]).to_f32();
            let sb = &mut row_side[(b / 8) * SIDE_BYTES..(b / 8 + 1) * SIDE_BYTES];
            sb[4 * (b % 8)..4 * (b % 8) + 4].copy_from_slice(&d.to_le_bytes());
            for (i, group) in blk[2..].chunks_exact(len.min(32)).enumerate() {
                let sum: i32 = group.iter().map(|&q| q as i8 as i32).sum();
                let at = 32 + 4 * ((b % 8) * 32 / len + i);
                sb[at..at + 4].copy_from_slice(&(d * sum as f32).to_le_bytes());
            }
        }
        Ok(())
    })?;
    let (act, side) = (&*act, &*side);
    let out = OutPtr(y.as_mut_ptr());
    for_each_panel(n, sbs * fmt.sb_bytes(), &|panel, j0, cols| {
        pack(isa, scalar, fmt, w, j0, cols, panel);
        let run = Rows { fmt, panel, sbs, act, act_row, side, m };
        // SAFETY: the outputs are columns j0..j0 + cols of y (m x n), written by this task
        // alone; the panel, activations and side table were sized above.
        unsafe { run.compute(isa, scalar, out.get().add(j0), n, cols) };
    });
    w.apply_tensor_scale(y);
    Ok(())
}

impl Rows<'_> {
    /// Every activation row against the panel into the first `cols` columns of each output
    /// row at `y` (row stride `n`).
    ///
    /// # Safety
    /// `y` writable at `i * n + j` for `i < m`, `j < cols <= PANEL`; `isa` supported.
    unsafe fn compute(&self, isa: Isa, scalar: bool, y: *mut f32, n: usize, cols: usize) {
        #[cfg(target_arch = "x86_64")]
        if !scalar && isa >= Isa::Avx512 {
            avx512::rows(self, y, n, cols);
            return;
        }
        let _ = (isa, scalar);
        pack::rows_scalar(self, y, n, cols);
    }
}
