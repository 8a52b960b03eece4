//! Linear layers: `y = x @ W^T` with `x: [m, k]`, `W: [n, k]` (out_features x
//! in_features, the GGUF / Hugging Face row order), `y: [m, n]`, all row-major.
//!
//! - [`matmul_f32`]: f32 weights. `m == 1` (decode) runs a row-parallel GEMV over
//!   the f32 dot kernels of `quant`; larger `m` goes to the `gemm` crate.
//! - [`matmul_q`]: weights kept in their GGML type ([`QMatrix`]). Each row of `x` is
//!   quantized once to the weight's `vec_dot_type` into a caller-owned scratch
//!   buffer, then every output is one `vec_dot`. Work is split over tiles of weight
//!   rows sized to stay in L1/L2 while all `m` activation rows pass over them, so
//!   each weight byte is read from memory once per call.

use rayon::prelude::*;

use crate::quant::{self, Isa, VecDotFn};
use crate::{GgmlType, TensorError};

/// Below this many multiply-adds `gemm` runs single-threaded; its rayon fork/join
/// costs more than it saves on small products.
const GEMM_PARALLEL_MIN_FLOPS: usize = 1 << 18;

/// Target bytes of weight rows per task: a tile that fits in L1 (48 KiB on
/// Sapphire Rapids) with room for one activation row, so the `m` passes over it
/// hit cache.
const TILE_BYTES: usize = 32 << 10;

/// Tasks per thread to aim for, so uneven tiles still balance.
const TASKS_PER_THREAD: usize = 4;

/// y[m, n] = x[m, k] @ w[n, k]^T in f32 (plain FMA accumulation; no reduced
/// precision anywhere, so results stay close to PyTorch's f32 matmul).
pub fn matmul_f32(x: &[f32], w: &[f32], y: &mut [f32], m: usize, k: usize, n: usize) -> Result<(), TensorError> {
    check_len("matmul_f32", "x", x.len(), m, k)?;
    check_len("matmul_f32", "w", w.len(), n, k)?;
    check_len("matmul_f32", "y", y.len(), m, n)?;
    if m == 0 || n == 0 {
        return Ok(());
    }
    if k == 0 {
        y.fill(0.0);
        return Ok(());
    }
    if m == 1 {
        // Decode: gemm packs W before multiplying, which for a single row means
        // touching W twice; a row-parallel dot reads it once (memory-bound).
        let dot = quant::vec_dot_fn(Isa::active(), GgmlType::F32);
        let wb = f32_bytes(w);
        let row = 4 * k;
        parallel_rows(y, n, row, |j| dot(&wb[j * row..(j + 1) * row], f32_bytes(x), k));
        return Ok(());
    }
    let par = if m * n * k >= GEMM_PARALLEL_MIN_FLOPS && rayon::current_num_threads() > 1 {
        gemm::Parallelism::Rayon(rayon::current_num_threads())
    } else {
        gemm::Parallelism::None
    };
    // SAFETY: the lengths were checked above: x is m x k (row stride k), w is n x k
    // read as the k x n matrix W^T (row stride 1, column stride k), y is m x n
    // (row stride n). read_dst = false, so y's old contents are ignored.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            y.as_mut_ptr(),
            1,
            n as isize,
            false,
            x.as_ptr(),
            1,
            k as isize,
            w.as_ptr(),
            k as isize,
            1,
            0.0f32,
            1.0f32,
            false,
            false,
            false,
            par,
        );
    }
    Ok(())
}

/// How a [`QMatrix`] stores its rows. Only plain GGUF row order today; a
/// repacked (interleaved-rows, AMX-tile) layout will be another variant, built at
/// load time and invisible to callers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Layout {
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
    pub data: Vec<u8>,
    layout: Layout,
}

impl QMatrix {
    /// Wraps `data` as `rows x cols` elements of `ty`, checking that `cols` is a
    /// whole number of blocks and `data` is exactly the right size.
    pub fn new(ty: GgmlType, rows: usize, cols: usize, data: Vec<u8>) -> Result<Self, TensorError> {
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
        Ok(QMatrix { ty, rows, cols, data, layout: Layout::RowMajor })
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
        out
    }
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
    if w.ty == GgmlType::F32 && m > 1 {
        if let Some(wf) = aligned_f32(&w.data) {
            return matmul_f32(x, wf, y, m, k, n);
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
        if m >= 8 {
            buf.par_chunks_mut(act_row).zip(x.par_chunks(k)).for_each(quantize);
        } else {
            buf.chunks_mut(act_row).zip(x.chunks(k)).for_each(quantize);
        }
        buf
    };
    match (w.layout, quant::tile_fn(isa, w.ty)) {
        (Layout::RowMajor, Some(t)) => tiled_kernel(act, act_row, w, y, m, t),
        (Layout::RowMajor, None) => {
            let dot = quant::vec_dot_fn(isa, w.ty);
            if m == 1 {
                parallel_rows(y, n, w.row_bytes(), |j| dot(w.row(j), act, k));
            } else {
                tiled(act, act_row, w, y, m, dot);
            }
        }
    }
    Ok(())
}

/// `y[j] = f(j)` for `j < n`, split over rayon tasks of about [`TILE_BYTES`] of
/// weights each (`row_bytes` per `j`).
fn parallel_rows(y: &mut [f32], n: usize, row_bytes: usize, f: impl Fn(usize) -> f32 + Sync) {
    let tile = tile_rows(n, row_bytes);
    if tile >= n {
        y.iter_mut().enumerate().for_each(|(j, v)| *v = f(j));
        return;
    }
    y[..n].par_chunks_mut(tile).enumerate().for_each(|(t, ys)| {
        for (o, v) in ys.iter_mut().enumerate() {
            *v = f(t * tile + o);
        }
    });
}

/// Runs `task(t)` for every tile `t < tiles`, in parallel when there is more than one.
fn for_each_tile(tiles: usize, task: impl Fn(usize) + Sync + Send) {
    if tiles == 1 {
        task(0);
    } else {
        (0..tiles).into_par_iter().for_each(task);
    }
}

/// Each task owns a tile of weight rows (output columns) and runs every activation
/// row over it, so the tile is fetched from memory once and then served from
/// L1/L2. Without a tiled kernel: one `vec_dot` per output.
fn tiled(act: &[u8], act_row: usize, w: &QMatrix, y: &mut [f32], m: usize, dot: VecDotFn) {
    let (n, k) = (w.rows, w.cols);
    let tile = tile_rows(n, w.row_bytes());
    let out = OutPtr(y.as_mut_ptr());
    for_each_tile(n.div_ceil(tile), |t| {
        for i in 0..m {
            let a = &act[i * act_row..(i + 1) * act_row];
            for j in t * tile..((t + 1) * tile).min(n) {
                let v = dot(w.row(j), a, k);
                // SAFETY: i < m and j < n, and y.len() == m * n was checked by the
                // caller; tasks own disjoint column ranges, so no two write the same
                // element, and `y` is exclusively borrowed for the whole call.
                unsafe { out.get().add(i * n + j).write(v) };
            }
        }
    });
}

/// As [`tiled`], with the register-tiled microkernel: within a task, blocks of
/// `max_ca` activation rows sweep the task's weight rows `max_rw` at a time.
fn tiled_kernel(act: &[u8], act_row: usize, w: &QMatrix, y: &mut [f32], m: usize, t: quant::Tile) {
    let (n, k) = (w.rows, w.cols);
    let rb = w.row_bytes();
    let tile = tile_rows(n, rb).next_multiple_of(t.max_rw);
    let out = OutPtr(y.as_mut_ptr());
    for_each_tile(n.div_ceil(tile), |task| {
        let (j0, j1) = (task * tile, ((task + 1) * tile).min(n));
        let mut i = 0;
        while i < m {
            let na = t.max_ca.min(m - i);
            let mut j = j0;
            while j < j1 {
                let nw = t.max_rw.min(j1 - j);
                // SAFETY (TileFn contract): rows j..j + nw < n of `w` (row-major,
                // rb bytes each) and rows i..i + na < m of `act` (act_row bytes each,
                // quantized from k elements) are in bounds; outputs (i + c) * n + j + r
                // lie in y (m * n, checked by the caller), inside this task's column
                // range, which no other task writes.
                unsafe {
                    (t.f)(
                        w.data.as_ptr().add(j * rb),
                        rb,
                        nw,
                        act.as_ptr().add(i * act_row),
                        act_row,
                        na,
                        k,
                        out.get().add(i * n + j),
                        n,
                    )
                };
                j += nw;
            }
            i += na;
        }
    });
}

/// Rows per task: about [`TILE_BYTES`] of weights, but small enough that every
/// thread gets several tasks.
fn tile_rows(n: usize, row_bytes: usize) -> usize {
    let by_cache = (TILE_BYTES / row_bytes.max(1)).max(4);
    let threads = rayon::current_num_threads();
    if threads <= 1 {
        return n.max(1);
    }
    let by_balance = n.div_ceil(threads * TASKS_PER_THREAD).max(4);
    by_cache.min(by_balance).max(1)
}

/// The output pointer shared by the tasks of [`tiled`].
#[derive(Clone, Copy)]
struct OutPtr(*mut f32);
// SAFETY: tasks write disjoint elements through it (see `tiled`).
unsafe impl Send for OutPtr {}
unsafe impl Sync for OutPtr {}
impl OutPtr {
    // A method (not field access) so closures capture the whole `Sync` wrapper.
    fn get(self) -> *mut f32 {
        self.0
    }
}

fn check_len(op: &'static str, what: &str, got: usize, rows: usize, cols: usize) -> Result<(), TensorError> {
    match rows.checked_mul(cols) {
        Some(want) if want == got => Ok(()),
        _ => Err(TensorError::Shape { op, detail: format!("{what} has {got} elements, expected {rows} x {cols}") }),
    }
}

fn f32_bytes(x: &[f32]) -> &[u8] {
    // SAFETY: any f32 is 4 initialized bytes; u8 has alignment 1.
    unsafe { std::slice::from_raw_parts(x.as_ptr().cast::<u8>(), std::mem::size_of_val(x)) }
}

/// `data` as f32s when it is 4-byte aligned (a `Vec<u8>` usually is, but nothing
/// promises it).
fn aligned_f32(data: &[u8]) -> Option<&[f32]> {
    if data.as_ptr().align_offset(4) != 0 || data.len() % 4 != 0 {
        return None;
    }
    // SAFETY: aligned and sized as just checked; every bit pattern is a valid f32.
    Some(unsafe { std::slice::from_raw_parts(data.as_ptr().cast::<f32>(), data.len() / 4) })
}
