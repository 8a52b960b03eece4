//! `y = x Wᵀ` for f32 weights through the `gemm` crate (`--precision f32`, and the f32 tiles
//! that prefill dequantizes block-quantized weights into).

use super::qmatrix::check_len;
use super::tiled::{f32_bytes, run, Rows};
use crate::pool;
use crate::pool::OutPtr;
use crate::quant::Isa;
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
pub(crate) const GEMM_MIN_M: usize = 16;

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
