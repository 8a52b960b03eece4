//! f32 kernels for the non-matmul ops of decoder models: normalization, rotary
//! position embedding, activations, softmax and causal attention.
//!
//! Each follows the arithmetic of the Hugging Face transformers implementation
//! it mirrors (cited per function) so that `--precision f32` tracks PyTorch
//! to rounding noise.

pub mod activation;
pub mod attention;
mod attention_tiles;
pub mod moe;
pub mod norm;
pub mod paged_attention;
pub mod rope;
pub mod slice;

pub use activation::{add_in_place, add_into, erf, gelu, mul_in_place, mul_into, round_bf16, silu, silu_mul_into, soft_cap, soft_cap_one};
pub use attention::{attention, attention_cached, causal_attention, AttentionMask, AttentionShape, AttentionVariant, HeadMap};
pub use moe::{expert_id, router_select, router_weights, Router, RouterScoring};
pub use norm::{layer_norm, rms_norm};
pub use paged_attention::{paged_attention, write_paged, KvBlocks, KvBlocksMut, PagedSpan};
pub use rope::{RopeMode, RopeScaling, RopeTable};
pub use slice::slice_columns;

use crate::matmul::OutPtr;
use crate::pool;

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

/// Sets `v`'s length to `len` for a kernel that overwrites every element: a buffer at least
/// that long is truncated, its values left as they are (initialized, to be overwritten); a
/// shorter one keeps its values and only the new tail is zeroed.
pub fn resize_for_overwrite(v: &mut Vec<f32>, len: usize) {
    if v.len() >= len {
        v.truncate(len);
    } else {
        grow_filled(v, len, 0.0);
    }
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
