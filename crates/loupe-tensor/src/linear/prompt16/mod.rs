//! [`matmul_wq_prompt`]: prompt rows at `--precision native` (a single sequence's prefill, a
//! batched step's prompt tokens) for Q4_0, Q4_1, Q5_0 and Q8_0 weights on AVX-512, through
//! weight panels at 16-bit activations; other types and ISAs take the f32 chains
//! (`matmul_wq_chain`).
//!
//! **Why.** The chains multiply dequantized f32 weights, 16 products per FMA; their
//! throughput is the FMA units'. Native decode already multiplies 16-bit activation codes
//! ([`Act16`]) by the weights' integer codes exactly; here 16 weight rows are packed so that
//! a 64-byte vector holds a pair of consecutive codes of each row as i16, and one `vpdpwssd`
//! against the activations' pair broadcast adds 32 products into the 16 rows' lanes: twice
//! the chains' products per instruction, and a lane is an output (no horizontal sums).
//!
//! **Arithmetic** (the contract; [`pack::rows_scalar`] is its reference). Activation row `i`
//! is quantized to Act16 (per block of 32: codes `a`, `scale`, and the exact f32 `sum` of
//! its values), weight row `j` read as signed codes `q` with per-block `d` (and Q4_1's `m`).
//! From `acc = +0.0`, blocks in order:
//! * `isum = sum_{e in b} q_e a_e`, exact in i32 (at most `32 * 128 * 32767`);
//! * `acc = fma(f32(isum), d * scale, acc)`, then for Q4_1 `acc = fma(m, sum, acc)`;
//!
//! and the output is `acc`. The codes are decode's (the same error bound, under 2^-16 of
//! each block's largest activation); each output depends only on its two rows, so the bits do
//! not depend on the batch, the row order or the thread count (invariant 12).
//!
//! **Layout.** A task packs [`PANEL`] weight rows into one record per block of 32
//! ([`RECORD_BYTES`]): 16 code vectors (`codes[p * 64 + 4 r + 2 t]` = row `r`'s code `2 p +
//! t`, i16), then `d` and `m` of the 16 rows as f32 lanes. A panel of `k` columns is `36 k`
//! bytes (175 KiB at `k = 4864`), held in L2 while every activation row streams past it.

#[cfg(target_arch = "x86_64")]
mod avx512;
mod layout;
mod pack;
#[cfg(test)]
mod tests;

use super::panel_tasks::for_each_panel;
pub use super::panel_tasks::PANEL;
use layout::{Rows, RECORD_BYTES};

use std::cell::RefCell;

use super::act16::Act16;
use super::chain::matmul_wq_chain_with;
use super::qmatrix::QMatrix;
use crate::pool::{self, OutPtr};
use crate::quant::Isa;
use crate::{GgmlType, TensorError};

thread_local! {
    /// The caller's activation rows as Act16 codes and per-block scales and sums.
    static CODES: RefCell<(Vec<i16>, Vec<f32>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

/// Whether native prompt rows of `ty` take the panels at `isa` (else the chains): Q4_0,
/// Q4_1, Q5_0 and Q8_0 on AVX-512.
pub fn has_act16_panels(isa: Isa, ty: GgmlType) -> bool {
    cfg!(target_arch = "x86_64")
        && isa >= Isa::Avx512
        && matches!(ty, GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q5_0 | GgmlType::Q8_0)
}

/// `y[m, n] = x[m, k] @ W^T` for prompt rows at native precision: the panels where
/// [`has_act16_panels`], else `matmul_wq_chain`. Runs the kernels of [`Isa::active`].
pub fn matmul_wq_prompt(x: &[f32], w: &QMatrix, y: &mut [f32], m: usize) -> Result<(), TensorError> {
    matmul_wq_prompt_with(Isa::active(), x, w, y, m)
}

/// [`matmul_wq_prompt`] on the kernels of a given ISA level.
///
/// # Panics
/// If this CPU does not support `isa`.
pub fn matmul_wq_prompt_with(isa: Isa, x: &[f32], w: &QMatrix, y: &mut [f32], m: usize) -> Result<(), TensorError> {
    assert!(isa.is_supported(), "matmul_wq_prompt_with: this CPU does not support {isa}");
    if !has_act16_panels(isa, w.ty) {
        return matmul_wq_chain_with(isa, x, w, y, m);
    }
    panels(isa, x, w, y, m, false)
}

/// The panels' arithmetic through [`pack::rows_scalar`] whatever the ISA: the reference the
/// SIMD kernel is tested against.
pub fn matmul_wq_prompt_scalar(x: &[f32], w: &QMatrix, y: &mut [f32], m: usize) -> Result<(), TensorError> {
    if !matches!(w.ty, GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q5_0 | GgmlType::Q8_0) {
        return Err(TensorError::UnsupportedType { op: "matmul_wq_prompt_scalar", dtype: w.ty });
    }
    panels(Isa::Scalar, x, w, y, m, true)
}

/// Quantizes `x` to Act16, then runs every panel of `w` over all rows.
fn panels(isa: Isa, x: &[f32], w: &QMatrix, y: &mut [f32], m: usize, scalar: bool) -> Result<(), TensorError> {
    let (n, k) = (w.rows, w.cols);
    w.check_io("matmul_wq_prompt", x, y, m)?;
    if !k.is_multiple_of(32) {
        return Err(TensorError::Shape {
            op: "matmul_wq_prompt",
            detail: format!("k = {k} is not a multiple of the {} block (32)", w.ty),
        });
    }
    if m == 0 || n == 0 {
        return Ok(());
    }
    let blocks = k / 32;
    CODES.with(|codes| {
        let (q, scale_sum) = &mut *codes.borrow_mut();
        q.resize(m * k, 0);
        scale_sum.resize(m * blocks * 2, 0.0);
        let (q_out, ss_out) = (OutPtr(q.as_mut_ptr().cast::<u8>()), OutPtr(scale_sum.as_mut_ptr().cast::<u8>()));
        pool::run(m, &|i| {
            // SAFETY: task i alone writes row i of `q` (k codes) and of `scale_sum` (two per
            // block), both sized above and borrowed exclusively for this call.
            let (qi, si) = unsafe {
                (
                    std::slice::from_raw_parts_mut(q_out.get().cast::<i16>().add(i * k), k),
                    std::slice::from_raw_parts_mut(ss_out.get().cast::<f32>().add(i * blocks * 2), blocks * 2),
                )
            };
            Act16::quantize(&x[i * k..(i + 1) * k], qi, si);
        });
        let (q, scale_sum) = (&**q, &**scale_sum);
        let out = OutPtr(y.as_mut_ptr());
        for_each_panel(n, blocks * RECORD_BYTES, &|panel, j0, cols| {
            pack::pack(isa, scalar, w, j0, cols, panel);
            let run = Rows { ty: w.ty, panel, blocks, q, scale_sum, m };
            // SAFETY: the outputs are columns j0..j0 + cols of y (m x n), written by this task
            // alone; the panel and the activations were sized above.
            unsafe { run.compute(isa, scalar, out.get().add(j0), n, cols) };
        });
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
