//! `--precision q8`: block-quantized weights against activations quantized to 8-bit blocks
//! (Q8_0 / Q8_1 / Q8_K), llama.cpp's scheme, through the `quant` room's dot products.

use super::f32::{matmul_f32, GEMM_MIN_M};
use super::qmatrix::{check_len, Layout, QMatrix};
use super::tiled::*;
use crate::pool;
use crate::pool::OutPtr;
use crate::quant::{self, Isa};
use crate::{GgmlType, TensorError};

/// Whether [`matmul_q`] gives each output the bits of `quant::vec_dot` on its row for any
/// number of rows `m` (block-quantized types: per-row dots or tiles with the dot's
/// arithmetic), so a batch of rows may go through in one call and stay batch-invariant.
/// Float weights take a GEMM from [`GEMM_MIN_M`] rows on, whose sums differ.
pub fn q8_rows_invariant(ty: GgmlType) -> bool {
    quant::vec_dot_type(ty) != GgmlType::F32
}

/// y[m, n] = x[m, k] @ W^T for a [`QMatrix`] `W` (`n = w.rows`, `k = w.cols`).
///
/// Activations are quantized to `vec_dot_type(w.ty)` (Q8_0 / Q8_1 / Q8_K) into
/// `scratch`, which grows as needed and is reused across calls (no allocation once
/// it is large enough); float weights use `x` directly. Runs the kernels of
/// [`Isa::active`].
pub fn matmul_q(x: &[f32], w: &QMatrix, y: &mut [f32], m: usize, scratch: &mut Vec<u8>) -> Result<(), TensorError> {
    matmul_q_with(Isa::active(), x, w, y, m, scratch)
}

/// [`matmul_q`] on the kernels of a given ISA level (tests, bisecting).
///
/// # Panics
/// If this CPU does not support `isa`.
pub fn matmul_q_with(
    isa: Isa,
    x: &[f32],
    w: &QMatrix,
    y: &mut [f32],
    m: usize,
    scratch: &mut Vec<u8>,
) -> Result<(), TensorError> {
    assert!(isa.is_supported(), "matmul_q_with: this CPU does not support {isa}");
    let (n, k) = (w.rows, w.cols);
    check_len("matmul_q", "x", x.len(), m, k)?;
    check_len("matmul_q", "y", y.len(), m, n)?;
    if m == 0 || n == 0 {
        return Ok(());
    }
    if k == 0 {
        y.fill(0.0);
        return Ok(());
    }
    if w.ty == GgmlType::F32 && m >= GEMM_MIN_M {
        if let Some(wf) = aligned_f32(&w.data) {
            matmul_f32(x, wf, y, m, k, n)?;
            w.apply_tensor_scale(y);
            return Ok(());
        }
    }
    let aty = quant::vec_dot_type(w.ty);
    let act_row = quant::row_bytes("matmul_q", aty, k)?;
    let act: &[u8] = if aty == GgmlType::F32 {
        f32_bytes(x)
    } else {
        let need = m * act_row;
        if scratch.len() < need {
            scratch.resize(need, 0);
        }
        let buf = &mut scratch[..need];
        let quantize = |(d, s): (&mut [u8], &[f32])| {
            quant::quantize_row(aty, s, d).expect("row sizes were checked");
        };
        if worth_splitting(m, m * k * QUANTIZE_NS_PER_ELEM) {
            let dst = OutPtr(buf.as_mut_ptr());
            pool::run(m, &|i| {
                // SAFETY: task i alone writes row i (bytes i*act_row..(i+1)*act_row) of
                // `buf`, which is borrowed exclusively for this call.
                let d = unsafe { std::slice::from_raw_parts_mut(dst.get().add(i * act_row), act_row) };
                quantize((d, &x[i * k..(i + 1) * k]));
            });
        } else {
            buf.chunks_mut(act_row).zip(x.chunks(k)).for_each(quantize);
        }
        if let Some(arrange) = quant::tile_fn(isa, w.ty).and_then(|t| t.arrange) {
            arrange(buf);
        }
        buf
    };
    match w.layout {
        Layout::RowMajor => {
            let rows = Rows { ty: w.ty, data: &w.data, n, k, row_bytes: w.row_bytes() };
            run(isa, rows, act, act_row, m, y);
        }
    }
    w.apply_tensor_scale(y);
    Ok(())
}
