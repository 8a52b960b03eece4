//! Linear layers: `y = x @ W^T` with `x: [m, k]`, `W: [n, k]` (out_features x
//! in_features, the GGUF / Hugging Face row order), `y: [m, n]`, all row-major.
//!
//! - [`matmul_f32`]: f32 weights. Small `m` (decode, short prompts) runs the row
//!   kernels below, which read W once; from `GEMM_MIN_M` rows on, the `gemm`
//!   crate.
//! - [`matmul_q`]: weights kept in their GGML type ([`QMatrix`]). Each row of `x` is
//!   quantized once to the weight's `vec_dot_type` into a caller-owned scratch
//!   buffer; then a register-tiled kernel (4 weight rows x 2 activation rows on
//!   AVX-512) or one `vec_dot` per output computes `y`.
//!
//! Both split work over [`crate::pool`] tasks that each own a band of weight rows
//! sized to stay in L1/L2 while all `m` activation rows pass over it, so each weight
//! byte is read from memory once per call.

use crate::pool;
use crate::quant::{self, Isa};
use crate::{GgmlType, TensorError};

/// Below this many multiply-adds `gemm` runs single-threaded: a fork-join costs more
/// than it saves on small products.
const GEMM_PARALLEL_MIN_FLOPS: usize = 1 << 18;

/// Output columns per `gemm` task when a large product is split over the pool: a
/// multiple of the AVX-512 micro-kernel's width, and small enough that each thread
/// gets a few tasks on SmolLM2's narrowest projections (192 columns).
const GEMM_TASK_COLS: usize = 48;

/// From this many activation rows `matmul_f32` hands over to `gemm`. Below it the
/// row kernels win: gemm packs all of W first, so for a few rows it reads W twice
/// (measured at 576 x 576: m = 2 took 5x as long as m = 1).
const GEMM_MIN_M: usize = 16;

/// Least estimated single-thread work (ns) worth a fork-join over the pool: with hot
/// workers a job costs about a microsecond to publish and join.
const SPLIT_MIN_NS: usize = 3_000;

/// Work estimates for the thresholds above (one core, cache-resident, measured
/// on the AVX-512 kernels): weight bytes streamed per ns by the dot kernels, and
/// ns per element to quantize activations.
const KERNEL_BYTES_PER_NS: usize = 16;
const QUANTIZE_NS_PER_ELEM: usize = 1;

/// Target bytes of weight rows per task: a band that fits in L1 (32-48 KiB) or
/// at worst L2 beside the activation rows, so the `m` passes over it hit cache.
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
    if m < GEMM_MIN_M {
        let rows = Rows { ty: GgmlType::F32, data: f32_bytes(w), n, k, row_bytes: 4 * k };
        run(Isa::active(), rows, f32_bytes(x), 4 * k, m, y);
        return Ok(());
    }
    let threads = pool::threads();
    let tasks = if m * n * k >= GEMM_PARALLEL_MIN_FLOPS && threads > 1 { n.div_ceil(GEMM_TASK_COLS) } else { 1 };
    let cols_per_task = n.div_ceil(tasks);
    let out = OutPtr(y.as_mut_ptr());
    pool::run(tasks, &|t| {
        let j0 = t * cols_per_task;
        if j0 >= n {
            return;
        }
        let cols = cols_per_task.min(n - j0);
        // SAFETY: the lengths were checked above: x is m x k, rows j0..j0+cols of w
        // are in w (n x k), and the destination is columns j0..j0+cols of y (m x n),
        // disjoint between tasks. The split is over output columns only, so each
        // element's reduction over k is the same whatever the thread count.
        unsafe { gemm_x_wt(m, cols, k, out.get().add(j0), n, x.as_ptr(), k, w.as_ptr().add(j0 * k), k) };
    });
    Ok(())
}

/// `dst[i, j] = sum_c x[i, c] * w[j, c]` for `i < m`, `j < n`, `c < k` (`x Wᵀ`), single
/// threaded through `gemm`; each operand row-major with its own row stride (in
/// elements), so callers can pass a band of columns of a wider output or one head of a
/// wider activation. `dst`'s old contents are ignored.
///
/// # Safety
/// `x` must be readable at `i * x_stride + c`, `w` at `j * w_stride + c`, and `dst`
/// writable at `i * dst_stride + j`, for all `i, j, c` above, with nothing else reading
/// or writing those `dst` elements during the call.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn gemm_x_wt(
    m: usize,
    n: usize,
    k: usize,
    dst: *mut f32,
    dst_stride: usize,
    x: *const f32,
    x_stride: usize,
    w: *const f32,
    w_stride: usize,
) {
    // gemm's arguments: (m, n, k, dst, dst column stride, dst row stride, read_dst,
    // lhs, lhs col stride, lhs row stride, rhs, rhs col stride, rhs row stride, alpha,
    // beta, conj..., parallelism); `Wᵀ` is `w` read with its strides swapped.
    gemm::gemm(
        m,
        n,
        k,
        dst,
        1,
        dst_stride as isize,
        false,
        x,
        1,
        x_stride as isize,
        w,
        w_stride as isize,
        1,
        0.0f32,
        1.0f32,
        false,
        false,
        false,
        gemm::Parallelism::None,
    );
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
    /// The blocks, row after row (its own vector, or a model's [`crate::hugepages::WeightArena`]).
    pub data: crate::hugepages::WeightBytes,
    /// A per-tensor factor on every element (NVFP4's second-level scale; 1 for every other
    /// type). Kernels compute with the blocks alone and multiply their finished outputs by it
    /// ([`QMatrix::apply_tensor_scale`]), as llama.cpp scales the result of an NVFP4 matmul.
    pub tensor_scale: f32,
    layout: Layout,
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
        Ok(QMatrix { ty, rows, cols, data, tensor_scale: 1.0, layout: Layout::RowMajor })
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

    /// Multiplies outputs computed from the blocks alone by the per-tensor scale (nothing to
    /// do, and bit-identical, when it is 1).
    pub fn apply_tensor_scale(&self, y: &mut [f32]) {
        if self.tensor_scale != 1.0 {
            let s = self.tensor_scale;
            y.iter_mut().for_each(|v| *v *= s);
        }
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

/// A row-major weight matrix as bytes: `n` rows of `k` elements of `ty`.
#[derive(Clone, Copy)]
struct Rows<'a> {
    ty: GgmlType,
    data: &'a [u8],
    n: usize,
    k: usize,
    row_bytes: usize,
}

impl Rows<'_> {
    fn row(&self, j: usize) -> &[u8] {
        &self.data[j * self.row_bytes..(j + 1) * self.row_bytes]
    }
}

/// `y[i, j] = dot(w_j, act_i)` for `m` activation rows already in
/// `vec_dot_type(w.ty)` (`act_row` bytes each), with the tiled kernel when the ISA
/// has one for the type, else one `vec_dot` per output.
///
/// Work is split over tasks that each own a tile of weight rows (output columns)
/// and run every activation row over it, so the tile is fetched from memory once
/// and then served from L1/L2.
fn run(isa: Isa, w: Rows<'_>, act: &[u8], act_row: usize, m: usize, y: &mut [f32]) {
    let n = w.n;
    let tile = quant::tile_fn(isa, w.ty);
    let step = tile.map_or(1, |t| t.max_rw);
    let per_task = tile_rows(n, w.row_bytes).next_multiple_of(step);
    let tasks = n.div_ceil(per_task);
    let out = OutPtr(y.as_mut_ptr());
    let task = |t: usize| {
        let cols = t * per_task..((t + 1) * per_task).min(n);
        match tile {
            // SAFETY: `y` has m * n elements (checked by the callers) and is
            // exclusively borrowed for this call; this task writes only columns in
            // `cols`, which no other task owns.
            Some(tk) => unsafe { task_tiled(w, act, act_row, m, cols, tk, out) },
            None => {
                let dot = quant::vec_dot_fn(isa, w.ty);
                for i in 0..m {
                    let a = &act[i * act_row..(i + 1) * act_row];
                    for j in cols.clone() {
                        let v = dot(w.row(j), a, w.k);
                        // SAFETY: as above; i < m, j < n.
                        unsafe { out.get().add(i * n + j).write(v) };
                    }
                }
            }
        }
    };
    if worth_splitting(tasks, w.data.len().saturating_mul(m) / KERNEL_BYTES_PER_NS) {
        pool::run(tasks, &task);
    } else {
        (0..tasks).for_each(task);
    }
}

/// One task of [`run`] with the register-tiled microkernel: blocks of `max_ca`
/// activation rows sweep the task's weight rows `max_rw` at a time.
///
/// # Safety
/// `out` points to `y[m, w.n]`; no one else reads or writes columns `cols` of it
/// during the call.
unsafe fn task_tiled(
    w: Rows<'_>,
    act: &[u8],
    act_row: usize,
    m: usize,
    cols: std::ops::Range<usize>,
    t: quant::Tile,
    out: OutPtr,
) {
    let mut i = 0;
    while i < m {
        let na = t.max_ca.min(m - i);
        let mut j = cols.start;
        while j < cols.end {
            let nw = t.max_rw.min(cols.end - j);
            // SAFETY (TileFn contract): 1 <= nw <= max_rw, 1 <= na <= max_ca; rows
            // j..j + nw <= n of `w` and i..i + na <= m of `act` are in bounds (the
            // slices' lengths were checked by the callers); outputs
            // (i + c) * n + j + r are in `y` and in this task's columns.
            (t.f)(
                w.data.as_ptr().add(j * w.row_bytes),
                w.row_bytes,
                nw,
                act.as_ptr().add(i * act_row),
                act_row,
                na,
                w.k,
                out.get().add(i * w.n + j),
                w.n,
            );
            j += nw;
        }
        i += na;
    }
}

/// Whether to fan `tasks` out over the pool, given an estimate of the work in
/// single-thread nanoseconds.
fn worth_splitting(tasks: usize, work_ns: usize) -> bool {
    tasks > 1 && pool::threads() > 1 && work_ns >= SPLIT_MIN_NS
}

/// Rows per task: about [`TILE_BYTES`] of weights, but small enough that every
/// thread gets several tasks.
fn tile_rows(n: usize, row_bytes: usize) -> usize {
    let by_cache = (TILE_BYTES / row_bytes.max(1)).max(4);
    let threads = pool::threads();
    if threads <= 1 {
        return n.max(1);
    }
    let by_balance = n.div_ceil(threads * TASKS_PER_THREAD).max(4);
    by_cache.min(by_balance).max(1)
}

/// An output pointer shared by pool tasks that write disjoint elements (see `run`,
/// `wq::matmul_wq`, attention).
pub(crate) struct OutPtr<T = f32>(pub(crate) *mut T);
impl<T> Clone for OutPtr<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for OutPtr<T> {}
// SAFETY: tasks write disjoint elements through it (see `run`).
unsafe impl<T: Send> Send for OutPtr<T> {}
unsafe impl<T: Send> Sync for OutPtr<T> {}
impl<T> OutPtr<T> {
    // A method (not field access) so closures capture the whole `Sync` wrapper.
    pub(crate) fn get(self) -> *mut T {
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
    if data.as_ptr().align_offset(4) != 0 || !data.len().is_multiple_of(4) {
        return None;
    }
    // SAFETY: aligned and sized as just checked; every bit pattern is a valid f32.
    Some(unsafe { std::slice::from_raw_parts(data.as_ptr().cast::<f32>(), data.len() / 4) })
}
