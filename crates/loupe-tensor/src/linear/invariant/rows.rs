//! The activation side the multi-row kernels of every ISA share ([`ActBatch`]: rows
//! quantized to Act16, block scales and sums transposed so lanes are rows) and how rows are
//! laid out and chunked for them.

use crate::linear::qmatrix::QMatrix;

/// Activation rows of `x` are laid out transposed (lanes = rows) in multiples of this,
/// one AVX-512 vector, so the vectorized per-weight-row preparation needs no tail.
pub(crate) const LANES: usize = 16;

/// Quantized activation rows up to this many bytes (`m * k * 2`; k = 576 at m = 32 is
/// 36 KiB, measured faster unchunked) stay in L1 (48 KiB on Sapphire Rapids) while every
/// weight row of a band passes over all of them; past it (SmolLM2's FFN down projection,
/// k = 1536, at m = 32 is 96 KiB) the rows are taken [`CHUNK_ROWS`] at a time and the
/// band's weight rows (in L2) pass over each chunk instead. (The AVX-512 kernels keep up to 16
/// rows in one chunk whatever their size: see `avx512::act16_rows`.)
pub(crate) const ACT_L1_BYTES: usize = 40 << 10;

/// Activation rows per chunk when they do not all fit in L1 (one AVX-512 tile).
pub(crate) const CHUNK_ROWS: usize = 8;

/// Weight rows ahead of the one being multiplied whose bytes the multi-row kernels prefetch.
/// At 2-8 activation rows a weight row's products take little longer than its bytes take to
/// arrive, and the preparation of its block scales stalled on them (perf: `vcvtph2ps` of
/// the row's first scales. Four rows ahead measured best at 2-8 sequences (BENCHMARKS.md, "Measurements once in doc comments").
#[cfg(target_arch = "x86_64")]
pub(crate) const PREFETCH_ROWS: usize = 4;

/// Prefetches weight row `j` of `w` into L2 if `j < end` (the task's rows end there); L2,
/// not L1, as `linear::gemv::x86::prefetch_pair` explains.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) fn prefetch_row(w: &QMatrix, j: usize, end: usize) {
    use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T1};
    if j < end {
        for line in w.row(j).chunks(64) {
            // SAFETY: a prefetch of an address inside the row; SSE is baseline on x86_64.
            unsafe { _mm_prefetch::<_MM_HINT_T1>(line.as_ptr().cast()) };
        }
    }
}

/// Weight rows per chunk of that path: 64 rows of k = 1536 Q4_1 are 60 KiB, in L2 for the
/// next activation row.
#[cfg(target_arch = "x86_64")]
pub(crate) const GEMV_CHUNK_ROWS: usize = 64;

/// Where row `i`'s value for block `b` lies in the transposed block scales and sums
/// ([`ActBatch::st`], [`ActBatch::su`]) and in the kernels' per-weight-row products: rows
/// in groups of [`LANES`], a group's blocks one after another (`[mp / LANES][blocks][LANES]`),
/// so the values of a chunk of rows for every block lie together in `blocks * 64` bytes.
/// (A `[blocks][mp]` layout put consecutive blocks `4 * mp` bytes apart: at m = 1024 every
/// block of a chunk fell in the same L1 set, and batched prefill ran at half speed.)
/// A tile of rows that starts at a multiple of its width (4 or 8) stays in one group, and
/// reads its rows' products at `lane_at(i, 0, blocks) + b * LANES + a`.
#[inline(always)]
pub(crate) fn lane_at(i: usize, b: usize, blocks: usize) -> usize {
    (i / LANES) * blocks * LANES + b * LANES + i % LANES
}

/// Rearranges one quantized activation row for the AVX-512 pairs kernels
/// (`avx512::tile_pairs`): in every whole pair of blocks `(b, b + 1)` (64 values) the
/// middle two 16-value quarters swap, so that `[x_b 0..16 | x_b+1 0..16]` and
/// `[x_b 16..32 | x_b+1 16..32]` are the two 512-bit loads the kernel multiplies (it
/// shuffled them into place per activation row and weight row before). An odd last block
/// stays as it is. A permutation of the inputs of exact integer sums: the bits do not
/// change.
pub(crate) fn arrange_pairs(q: &mut [i16]) {
    for pair in q.chunks_exact_mut(64) {
        let (a, b) = pair[16..48].split_at_mut(16);
        a.swap_with_slice(b);
    }
}

/// The activation side of a multi-row Q4_1 / Q8_0 / Q5_0 / Q6_K / Q4_K call.
#[derive(Clone, Copy)]
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(crate) struct ActBatch<'a> {
    /// Row `i` at `q[i * k..]` (for the pairs kernels after [`arrange_pairs`]).
    pub(crate) q: &'a [i16],
    /// Block scales / block sums transposed, lanes = rows, at [`lane_at`] (`mp * blocks`
    /// values and [`LANES`] of slack).
    pub(crate) st: &'a [f32],
    pub(crate) su: &'a [f32],
    pub(crate) m: usize,
    pub(crate) k: usize,
    pub(crate) blocks: usize,
}
