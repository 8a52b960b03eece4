//! f32 kernels for the non-matmul ops of decoder models: normalization, rotary
//! position embedding, activations, softmax and causal attention.
//!
//! Each follows the arithmetic of the Hugging Face transformers implementation
//! it mirrors (cited per function) so that `--precision f32` tracks PyTorch
//! to rounding noise.

pub mod activation;
pub mod attention;
mod attention_tiles;
pub mod kv_blocks;
pub mod moe;
pub mod norm;
pub mod paged_attention;
pub mod rope;
pub mod slice;

pub use activation::{
    add_in_place, add_into, erf, gelu, mul_in_place, mul_into, round_bf16, silu, silu_mul_into, soft_cap, soft_cap_one,
};
pub use attention::{
    attention, attention_cached, causal_attention, AttentionMask, AttentionShape, AttentionVariant, HeadMap,
};
pub use kv_blocks::{KvBlocks, KvBlocksMut};
pub use moe::{expert_id, router_select, router_weights, Router, RouterScoring};
pub use norm::{layer_norm, rms_norm};
pub use paged_attention::{paged_attention, write_paged, PagedSpan};
pub use rope::{RopeMode, RopeScaling, RopeTable};
pub use slice::slice_columns;

use crate::pool;
use crate::pool::OutPtr;

/// Elements from which an elementwise op or a row-wise norm splits its work over the compute
/// pool (a prefill's activations, 512 x 576 = 295K); a decode step's rows stay on the caller,
/// where a fork-join would cost more than the op. Every element (or row) is computed by the
/// same code either way, so the split changes no bit.
const PAR_MIN_ELEMS: usize = 1 << 15;

/// Runs `body(range)` over `0..len` in ranges of whole `unit`s (the last may end at `len`):
/// on the pool, a few ranges per thread, when `len >= PAR_MIN_ELEMS`; else once, on the caller.
pub(crate) fn par_ranges(len: usize, unit: usize, body: &(dyn Fn(std::ops::Range<usize>) + Sync)) {
    let threads = pool::threads();
    if len < PAR_MIN_ELEMS || unit == 0 || threads < 2 {
        body(0..len);
        return;
    }
    let units = len.div_ceil(unit);
    let tasks = (threads * 2).min(units);
    let per = units.div_ceil(tasks);
    pool::run(tasks, &|t| {
        let (a, b) = ((t * per * unit).min(len), ((t + 1) * per * unit).min(len));
        if a < b {
            body(a..b);
        }
    });
}

/// Sets `v` to `len` copies of `value` (`clear` then `resize`), filling large buffers (a
/// prefill's activations) on the compute pool.
pub fn resize_filled(v: &mut Vec<f32>, len: usize, value: f32) {
    v.clear();
    grow_filled(v, len, value);
}

/// Sets `v`'s length to `len` for a kernel that overwrites every element, where `v`'s
/// allocation holds `*initialized` written elements, past its length too (values of earlier,
/// longer uses): a length within them is set without touching the values (initialized, to be
/// overwritten), and only the part past them is zeroed. Updates `*initialized` for the
/// allocation `v` has on return (a reallocation copies only `v`'s elements).
///
/// Why: the executor's memory plan shares a slot between values of different widths (a
/// layer's 192-wide k, 576-wide q, 1536-wide gate), so each use truncated the buffer and the
/// next wider one zeroed its tail again: ~240 MB of zeroing per SmolLM2 pp512.
///
/// # Safety
/// The first `*initialized` elements of `v`'s allocation were written since it was allocated
/// (a mark larger than the capacity is clamped to it).
pub unsafe fn resize_for_overwrite_within(v: &mut Vec<f32>, len: usize, initialized: &mut usize) {
    let init = (*initialized).max(v.len()).min(v.capacity());
    if len <= init {
        // SAFETY: len <= init <= capacity, and the first init elements are initialized (the
        // contract).
        unsafe { v.set_len(len) };
    } else {
        // SAFETY: as above, for init.
        unsafe { v.set_len(init) };
        grow_filled(v, len, 0.0);
    }
    *initialized = init.max(len);
}

/// Grows `v` (no longer than `len`) to `len`, the new elements `value`, on the compute pool
/// when many.
fn grow_filled(v: &mut Vec<f32>, len: usize, value: f32) {
    let old = v.len();
    if len - old < PAR_MIN_ELEMS {
        v.resize(len, value);
        return;
    }
    v.reserve(len - old);
    let p = OutPtr(v.as_mut_ptr());
    par_ranges(len - old, 1024, &|r| {
        for i in r {
            // SAFETY: old + i < len <= v.capacity() (reserved above); par_ranges gives
            // disjoint ranges covering 0..len - old, each written by one task alone.
            unsafe { p.get().add(old + i).write(value) };
        }
    });
    // SAFETY: elements 0..old were initialized before, old..len just above.
    unsafe { v.set_len(len) };
}

/// `f(r, &mut x[r])` over ranges `r` of whole `unit`s of `x`, on the compute pool when large
/// ([`par_ranges`]); each range of `x` is written by one task alone.
pub(crate) fn par_chunks_mut(x: &mut [f32], unit: usize, f: &(dyn Fn(std::ops::Range<usize>, &mut [f32]) + Sync)) {
    let xp = OutPtr(x.as_mut_ptr());
    par_ranges(x.len(), unit, &|r| {
        // SAFETY: r lies within x; par_ranges gives disjoint ranges, so this task alone
        // writes x[r] while `x` is borrowed mutably for this call.
        let xr = unsafe { std::slice::from_raw_parts_mut(xp.get().add(r.start), r.len()) };
        f(r, xr);
    });
}

/// `f(a[r], b[r])` over ranges `r` of two equal-length slices ([`par_chunks_mut`]).
pub(crate) fn par_zip_mut(a: &mut [f32], b: &[f32], f: &(dyn Fn(&mut [f32], &[f32]) + Sync)) {
    let n = a.len().min(b.len());
    par_chunks_mut(&mut a[..n], 64, &|r, ar| f(ar, &b[r]));
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Growing within the mark keeps the old values (no zeroing pass), past it zeroes only
    /// the new part, and the mark follows a reallocation (which copies only the length).
    #[test]
    fn resize_for_overwrite_within_clears_only_what_was_never_written() {
        let mut v: Vec<f32> = (0..100).map(|i| i as f32 + 1.0).collect();
        let mut init = v.len();
        // SAFETY (every call): init is v's mark, kept by these calls alone.
        unsafe { resize_for_overwrite_within(&mut v, 10, &mut init) };
        assert_eq!((v.len(), init), (10, 100));
        unsafe { resize_for_overwrite_within(&mut v, 60, &mut init) };
        assert_eq!(v[59], 60.0, "an element written before is not cleared again");
        v.reserve_exact(200 - v.len());
        let capacity = v.capacity();
        unsafe { resize_for_overwrite_within(&mut v, 150, &mut init) };
        assert_eq!((v[99], v[100], v[149], init), (100.0, 0.0, 0.0, 150));
        assert_eq!(v.capacity(), capacity);
        // A reallocation: the written elements (up to the mark, past the length too) move to
        // the new allocation, the rest is zeros, and the mark is the new length.
        v.truncate(20);
        let mut init = 150;
        unsafe { resize_for_overwrite_within(&mut v, capacity + 50, &mut init) };
        assert!(v.capacity() > capacity);
        assert_eq!((v[19], v[20], v[149], v[150], v[capacity + 49], init), (20.0, 21.0, 0.0, 0.0, 0.0, capacity + 50));
        // A mark past the capacity is clamped to it.
        let mut w: Vec<f32> = vec![1.0; 8];
        let mut init = usize::MAX;
        unsafe { resize_for_overwrite_within(&mut w, 4, &mut init) };
        assert_eq!((w.len(), init), (4, 8));
    }
}
