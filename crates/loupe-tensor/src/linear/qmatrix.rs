//! [`QMatrix`]: a weight matrix kept in GGML blocks, row by row, as every block-quantized
//! kernel of this room reads it.

use crate::quant;
use crate::{GgmlType, TensorError};

/// How a [`QMatrix`] stores its rows. Only plain GGUF row order today; a
/// repacked (interleaved-rows, AMX-tile) layout will be another variant, built at
/// load time and invisible to callers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Layout {
    /// Row `i` is `data[i * row_bytes..][..row_bytes]`, blocks as in the file.
    RowMajor,
}

/// A weight matrix `[rows = n (out features), cols = k (in features)]` in a GGML
/// type (block-quantized, or F32/F16/BF16), as stored in GGUF.
#[derive(Clone, Debug)]
pub struct QMatrix {
    pub ty: GgmlType,
    /// Output features (`n`).
    pub rows: usize,
    /// Input features (`k`), a multiple of the type's block size.
    pub cols: usize,
    /// The blocks, row after row (its own vector, or a model's [`crate::hugepages::WeightArena`]).
    pub data: crate::hugepages::WeightBytes,
    /// A per-tensor factor on every element (NVFP4's second-level scale; 1 for every other
    /// type). Kernels compute with the blocks alone and multiply their finished outputs by it
    /// ([`QMatrix::apply_tensor_scale`]), as llama.cpp scales the result of an NVFP4 matmul.
    pub tensor_scale: f32,
    pub(crate) layout: Layout,
    /// Its rows' L2 norms once a screen asked for them ([`QMatrix::screen_norms_with`]), shared
    /// by the clones (a graph and its lowered copy).
    screen_norms: std::sync::Arc<std::sync::OnceLock<Vec<f32>>>,
}

impl QMatrix {
    /// Wraps `data` as `rows x cols` elements of `ty`, checking that `cols` is a
    /// whole number of blocks and `data` is exactly the right size.
    pub fn new(
        ty: GgmlType,
        rows: usize,
        cols: usize,
        data: impl Into<crate::hugepages::WeightBytes>,
    ) -> Result<Self, TensorError> {
        let data = data.into();
        let row = quant::row_bytes("QMatrix::new", ty, cols)?;
        let expected = row.checked_mul(rows).ok_or_else(|| TensorError::Shape {
            op: "QMatrix::new",
            detail: format!("{rows} x {cols} {ty} overflows usize"),
        })?;
        if data.len() != expected {
            return Err(TensorError::ByteLength {
                op: "QMatrix::new",
                dtype: ty,
                elements: rows * cols,
                expected,
                got: data.len(),
            });
        }
        Ok(QMatrix {
            ty,
            rows,
            cols,
            data,
            tensor_scale: 1.0,
            layout: Layout::RowMajor,
            screen_norms: Default::default(),
        })
    }

    /// Quantizes an f32 `[rows, cols]` matrix (types [`quant::quantize_row`] supports).
    pub fn quantize(ty: GgmlType, rows: usize, cols: usize, src: &[f32]) -> Result<Self, TensorError> {
        check_len("QMatrix::quantize", "src", src.len(), rows, cols)?;
        let row = quant::row_bytes("QMatrix::quantize", ty, cols)?;
        let mut data = vec![0u8; row * rows];
        for (d, s) in data.chunks_exact_mut(row.max(1)).zip(src.chunks_exact(cols.max(1))) {
            quant::quantize_row(ty, s, d)?;
        }
        QMatrix::new(ty, rows, cols, data)
    }

    /// The same matrix with a per-tensor scale (see [`QMatrix::tensor_scale`]).
    pub fn with_tensor_scale(mut self, scale: f32) -> Self {
        self.tensor_scale = scale;
        self
    }

    /// Checks that `x` holds `m` activation rows of `cols` and `y` `m` output rows of `rows`
    /// (`op` names the matmul in the error).
    pub(crate) fn check_io(&self, op: &'static str, x: &[f32], y: &[f32], m: usize) -> Result<(), TensorError> {
        let (n, k) = (self.rows, self.cols);
        if m.checked_mul(k) != Some(x.len()) || m.checked_mul(n) != Some(y.len()) {
            return Err(TensorError::Shape {
                op,
                detail: format!("x has {} elements and y {}, expected {m}x{k} and {m}x{n}", x.len(), y.len()),
            });
        }
        Ok(())
    }

    /// Multiplies outputs computed from the blocks alone by the per-tensor scale (nothing to
    /// do, and bit-identical, when it is 1).
    pub fn apply_tensor_scale(&self, y: &mut [f32]) {
        if self.tensor_scale != 1.0 {
            let s = self.tensor_scale;
            y.iter_mut().for_each(|v| *v *= s);
        }
    }

    /// Its rows' L2 norms as `init` computes them (`linear::screen::screen_norms`), on first
    /// use (one pass over the matrix), then kept: the weights do not change after loading.
    pub(crate) fn screen_norms_with(
        &self,
        init: impl FnOnce(&QMatrix) -> Result<Vec<f32>, TensorError>,
    ) -> Result<&[f32], TensorError> {
        if let Some(norms) = self.screen_norms.get() {
            return Ok(norms);
        }
        let norms = init(self)?;
        // Another thread may have set them meanwhile: the same values.
        let _ = self.screen_norms.set(norms);
        Ok(self.screen_norms.get().map(Vec::as_slice).unwrap_or_default())
    }

    /// Bytes per row.
    pub fn row_bytes(&self) -> usize {
        self.data.len() / self.rows.max(1)
    }

    /// The bytes of row `i` (blocks of `ty`).
    pub fn row(&self, i: usize) -> &[u8] {
        match self.layout {
            Layout::RowMajor => {
                let rb = self.row_bytes();
                &self.data[i * rb..(i + 1) * rb]
            }
        }
    }

    /// The whole matrix as f32, row-major `[rows, cols]`.
    pub fn dequantize(&self) -> Vec<f32> {
        let mut out = vec![0.0f32; self.rows * self.cols];
        if self.cols > 0 {
            for (i, o) in out.chunks_exact_mut(self.cols).enumerate() {
                quant::dequantize_row(self.ty, self.row(i), o).expect("QMatrix::new checked the size");
            }
        }
        self.apply_tensor_scale(&mut out);
        out
    }
}

pub(crate) fn check_len(op: &'static str, what: &str, got: usize, rows: usize, cols: usize) -> Result<(), TensorError> {
    match rows.checked_mul(cols) {
        Some(want) if want == got => Ok(()),
        _ => Err(TensorError::Shape { op, detail: format!("{what} has {got} elements, expected {rows} x {cols}") }),
    }
}
