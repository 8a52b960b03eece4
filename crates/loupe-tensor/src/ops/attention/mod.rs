//! Causal scaled-dot-product attention with grouped-query heads, mirroring
//! transformers' `eager_attention_forward`: `softmax(q k^T * scale + mask) v`
//! with the softmax in f32, query head `h` reading kv head `h / (n_heads / n_kv_heads)`
//! (`repeat_kv`).
//!
//! [`AttentionVariant`] selects two other conventions that models (or porting bugs) use: a
//! query-to-kv head map by modulo, and no causal mask within the call (encoders, prefix-LM
//! prompts). The default is the Llama one; [`causal_attention`] takes it.
//!
//! The cache may hold f32 or f16 rows ([`attention_cached`]): decode widens f16 rows in
//! registers inside its dot / axpy (exactly, so the result equals widening first), prefill
//! widens the layer's rows once per call and runs its matrix products in f32.

mod avx2;
mod avx512;
mod lanes;
pub(crate) mod rows;
#[cfg(test)]
mod tests;

use std::cell::RefCell;

use self::rows::{attend_heads, softmax_row, CachedRows, GroupParts, HeadRow, MAX_HEADS_PER_TASK};
use super::attention_tiles as tiles;
use super::kv_blocks::{KvBlocks, MAX_HEAD_DIM};
use crate::linear::f32::gemm_x_wt;
use crate::pool;
use crate::pool::OutPtr;
use crate::quant::Isa;
use crate::TensorError;

/// Query rows per prefill task: 9 heads x 512 tokens gives 144 tasks, enough for the
/// causal imbalance (late rows see more keys) to even out over dynamic claiming.
const TOKENS_PER_TASK: usize = 32;

/// From this many query rows per call, each task computes its scores and outputs with
/// two `gemm` products (prefill); below it, one SIMD dot / axpy per key (decode).
const GEMM_MIN_TOKENS: usize = 8;

/// Score rows up to this long (32 KiB of f32) live in a fixed per-thread array, part of
/// the thread's static TLS block rather than the heap, so decode below 8192 positions never
/// allocates, even on a pool worker that runs its first attention task mid-decode; longer
/// rows (large prefill chunks) use a heap buffer that grows by doubling.
const MIN_SCORE_SCRATCH: usize = 8192;

thread_local! {
    static SCORES_FIXED: RefCell<[f32; MIN_SCORE_SCRATCH]> = const { RefCell::new([0.0; MIN_SCORE_SCRATCH]) };
    static SCORES: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    /// The caller's f16 keys and values widened to f32 for a prefill call's matrix products.
    static WIDENED: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    /// The caller's keys transposed for a prefill call's tile kernels (taken for the call and
    /// put back, so a nested call just starts a buffer of its own).
    static KEYS_T: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
}

/// Head geometry of one attention call, and the arithmetic of its scores.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttentionShape {
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
    /// Multiplier of `q k^T` (usually `head_dim^-0.5`).
    pub scale: f32,
    /// Soft-capping of the scaled scores before the mask and softmax, `cap * tanh(s / cap)`
    /// (Gemma 2's `attn_logit_softcapping`; [`super::soft_cap`]); `None` in most models.
    pub softcap: Option<f32>,
}

impl AttentionShape {
    /// Without soft-capping.
    pub fn new(n_heads: usize, n_kv_heads: usize, head_dim: usize, scale: f32) -> AttentionShape {
        AttentionShape { n_heads, n_kv_heads, head_dim, scale, softcap: None }
    }
}

/// Which kv head a query head reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HeadMap {
    /// `h / (n_heads / n_kv_heads)`: consecutive query heads share a kv head
    /// (transformers' `repeat_kv`, which repeats each kv head in place).
    #[default]
    Grouped,
    /// `h % n_kv_heads`: the kv heads cycle (what tiling the kv heads, `k.repeat(1, g, 1)`,
    /// instead of `repeat_interleave` gives).
    Modulo,
}

impl HeadMap {
    /// The `i`-th of the `group` query heads that read kv head `kv_h` (of `n_kv_heads`).
    pub fn query_head(self, kv_h: usize, i: usize, group: usize, n_kv_heads: usize) -> usize {
        match self {
            HeadMap::Grouped => kv_h * group + i,
            HeadMap::Modulo => kv_h + i * n_kv_heads,
        }
    }

    /// The kv head query head `h` reads.
    pub fn kv_head(self, h: usize, group: usize, n_kv_heads: usize) -> usize {
        match self {
            HeadMap::Grouped => h / group,
            HeadMap::Modulo => h % n_kv_heads,
        }
    }
}

/// Which keys a query sees.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AttentionMask {
    /// Query `t` of the call sees the cache and the call's tokens up to itself.
    #[default]
    Causal,
    /// Every query sees the whole context, later tokens of the same call included.
    None,
    /// Causal within a window: the query at position `p` sees the keys at positions
    /// `p + 1 - window ..= p` (transformers' `sliding_window_overlay`: `kv_idx > q_idx -
    /// sliding_window`; Mistral, Gemma 2/3's local layers). The cache keeps every key; the
    /// older ones are masked.
    SlidingWindow(usize),
}

impl AttentionMask {
    /// The positions of the keys the query at `position` sees, in a context of `ctx` keys.
    pub fn visible(self, position: usize, ctx: usize) -> std::ops::Range<usize> {
        match self {
            AttentionMask::Causal => 0..position + 1,
            AttentionMask::None => 0..ctx,
            AttentionMask::SlidingWindow(w) => (position + 1).saturating_sub(w)..position + 1,
        }
    }
}

/// Conventions of one attention call beyond its geometry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct AttentionVariant {
    pub head_map: HeadMap,
    pub mask: AttentionMask,
}

impl AttentionVariant {
    pub fn is_default(&self) -> bool {
        *self == AttentionVariant::default()
    }
}

/// [`attention`] with the default variant: causal, grouped heads.
pub fn causal_attention(
    shape: AttentionShape,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    ctx: usize,
    out: &mut [f32],
    probs: Option<&mut [f32]>,
) -> Result<(), TensorError> {
    attention(shape, AttentionVariant::default(), q, k, v, ctx, out, probs)
}

/// Attention of `tokens` new queries over a context of `ctx` keys/values whose
/// last `tokens` rows belong to the queries themselves.
///
/// * `q`: `[tokens, n_heads * head_dim]` (after RoPE)
/// * `k`, `v`: `[ctx, n_kv_heads * head_dim]` (the cache, rows `0..ctx`)
/// * `out`: `[tokens, n_heads * head_dim]`
/// * `probs`: when given, receives the attention probabilities `[n_heads, tokens, ctx]`
///   (masked entries are 0), for taps.
#[allow(clippy::too_many_arguments)]
pub fn attention(
    shape: AttentionShape,
    variant: AttentionVariant,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    ctx: usize,
    out: &mut [f32],
    probs: Option<&mut [f32]>,
) -> Result<(), TensorError> {
    attention_cached(shape, variant, q, KvBlocks::F32(k), KvBlocks::F32(v), ctx, out, probs)
}

/// [`attention`] over cached rows of f32 or f16 (keys and values each either).
///
/// Decode rows read f16 rows through [`dot_cached`] / [`axpy_cached`]; a prefill call
/// (`tokens >= 8`), and any call over FP8 rows, widens rows `0..ctx` of the narrow keys or
/// values to f32 on the calling thread first (one conversion per layer and call, not per
/// head) and then runs as f32.
#[allow(clippy::too_many_arguments)]
pub fn attention_cached(
    shape: AttentionShape,
    variant: AttentionVariant,
    q: &[f32],
    k: KvBlocks<'_>,
    v: KvBlocks<'_>,
    ctx: usize,
    out: &mut [f32],
    probs: Option<&mut [f32]>,
) -> Result<(), TensorError> {
    let AttentionShape { n_heads, n_kv_heads, head_dim, scale, softcap } = shape;
    let q_width = n_heads * head_dim;
    let kv_width = n_kv_heads * head_dim;
    if n_kv_heads == 0 || n_heads % n_kv_heads != 0 || q_width == 0 {
        return Err(TensorError::Shape {
            op: "attention",
            detail: format!("{n_heads} query heads cannot share {n_kv_heads} kv heads"),
        });
    }
    let tokens = q.len() / q_width;
    if !q.len().is_multiple_of(q_width)
        || out.len() != q.len()
        || tokens > ctx
        || k.len() < ctx * kv_width
        || v.len() < ctx * kv_width
    {
        return Err(TensorError::Shape {
            op: "attention",
            detail: format!(
                "q {} elements, k {}, v {}, out {}, ctx {ctx}, head_dim {head_dim}",
                q.len(),
                k.len(),
                v.len(),
                out.len()
            ),
        });
    }
    let f16_rows = k.is_narrow() || v.is_narrow();
    if f16_rows && head_dim > MAX_HEAD_DIM {
        return Err(TensorError::Shape {
            op: "attention",
            detail: format!("head_dim {head_dim} over {MAX_HEAD_DIM} with an f16 or fp8 cache"),
        });
    }
    if let Some(p) = &probs {
        if p.len() != n_heads * tokens * ctx {
            return Err(TensorError::Shape {
                op: "attention",
                detail: format!("probs has {} elements, expected {n_heads}x{tokens}x{ctx}", p.len()),
            });
        }
    }
    // FP8 rows are widened once per call at decode too: read per query head, a row would be
    // decoded once for each head of its GQA group, which cost SmolLM2 (3 heads per kv head)
    // more than the widening pass (profile: attention 306 ms against 132 ms for f16 rows
    // over 260 steps of bench -p 64 -n 128). Widening is exact, so the bits are the same.
    let fp8_rows = matches!(k, KvBlocks::Fp8 { .. }) || matches!(v, KvBlocks::Fp8 { .. });
    let isa = Isa::active();
    // Prefill on AVX2 / AVX-512: the keys transposed once for the register-blocked kernels
    // (`attention_tiles`), widened from f16 by the transposition itself; elsewhere two gemm
    // products per chunk on f32 rows.
    let tiled = tokens >= GEMM_MIN_TOKENS && tiles::usable(isa, head_dim);
    let widen_keys = fp8_rows || (f16_rows && tokens >= GEMM_MIN_TOKENS && !(tiled && matches!(k, KvBlocks::F16(_))));
    let widen_values = fp8_rows || (f16_rows && tokens >= GEMM_MIN_TOKENS);
    if (widen_keys && k.is_narrow()) || (widen_values && v.is_narrow()) {
        let n = ctx * kv_width;
        let run = |buf: &mut Vec<f32>| {
            if buf.len() < 2 * n {
                buf.resize(2 * n, 0.0);
            }
            let (kw, vw) = buf.split_at_mut(n);
            let keys = if widen_keys && k.is_narrow() {
                k.widen_into(0, &mut kw[..n]);
                KvBlocks::F32(&kw[..n])
            } else {
                k
            };
            let values = if widen_values && v.is_narrow() {
                v.widen_into(0, &mut vw[..n]);
                KvBlocks::F32(&vw[..n])
            } else {
                v
            };
            attention_cached(shape, variant, q, keys, values, ctx, out, probs)
        };
        return WIDENED.with(|cell| match cell.try_borrow_mut() {
            Ok(mut buf) => run(&mut buf),
            Err(_) => run(&mut Vec::new()),
        });
    }
    // Prefill reads f32 rows (narrow ones were widened above), the tile kernels' keys f16
    // rows too (through the transposition).
    let (k32, v32): (&[f32], &[f32]) = match (k, v) {
        (KvBlocks::F32(k), KvBlocks::F32(v)) => (k, v),
        (_, KvBlocks::F32(v)) => (&[], v),
        _ => (&[], &[]),
    };
    let past = ctx - tokens;
    let group = n_heads / n_kv_heads;
    let chunks = tokens.div_ceil(TOKENS_PER_TASK);
    let out_ptr = OutPtr(out.as_mut_ptr());
    let probs_ptr = probs.map(|p| OutPtr(p.as_mut_ptr()));
    // Keys query row `t` of this call sees.
    let visible_keys = |t: usize| variant.mask.visible(past + t, ctx);
    let keys_t_guard = tiled.then(|| {
        let mut kt = KEYS_T.with(|cell| cell.take());
        tiles::transpose_keys(k, ctx, n_kv_heads, head_dim, &mut kt);
        kt
    });
    let (keys_t, kt_stride) = (keys_t_guard.as_deref().unwrap_or(&[]), tiles::padded_keys(ctx));

    // Prefill: one task per (query head, chunk of query rows). Decode: one per (kv head, part
    // of its query heads), which read each cached row once for the part. Each task writes
    // only its rows of its heads' slices of `out` and `probs`.
    let prefill = tokens >= GEMM_MIN_TOKENS;
    let parts = GroupParts::new(group, n_kv_heads * chunks);
    let n_tasks = if prefill { n_heads * chunks } else { n_kv_heads * parts.count() * chunks };
    pool::run(n_tasks, &|task| {
        let (unit, chunk) = (task / chunks, task % chunks);
        // `h`: prefill's query head; `part`: decode's heads, as indices in kv_h's group.
        let (h, kv_h, part) = if prefill {
            (unit, variant.head_map.kv_head(unit, group, n_kv_heads), 0..1)
        } else {
            (0, unit / parts.count(), parts.heads(unit % parts.count()))
        };
        let rows = chunk * TOKENS_PER_TASK..((chunk + 1) * TOKENS_PER_TASK).min(tokens);
        let need = if tiled {
            rows.len() * tiles::padded_keys(ctx)
        } else if prefill {
            rows.len() * ctx
        } else {
            part.len() * ctx
        };
        let task = |scratch: &mut [f32]| {
            if prefill {
                // Prefill: the chunk's scores against every key its last row sees (tile
                // kernels, or gemm), their softmax row by row, then the outputs.
                let n_keys = visible_keys(rows.end - 1).end;
                let stride = if tiled { tiles::padded_keys(n_keys) } else { n_keys };
                let s_all = &mut scratch[..rows.len() * stride];
                let q_chunk = q[rows.start * q_width + h * head_dim..].as_ptr();
                // SAFETY: q rows `rows` of head h are head_dim long at stride q_width; s_all
                // is rows.len() rows of `stride`. Tiles: tiles::usable(isa, head_dim) holds,
                // and kv head kv_h's transposed keys are head_dim rows of kt_stride >=
                // padded_keys(n_keys) floats (n_keys <= ctx). gemm: K^T is head_dim x n_keys
                // read from the cache rows 0..n_keys <= ctx of kv head kv_h (column stride
                // kv_width). Lengths were checked above.
                unsafe {
                    if tiled {
                        tiles::scores(
                            isa,
                            q_chunk,
                            q_width,
                            rows.len(),
                            head_dim,
                            keys_t.as_ptr().add(kv_h * head_dim * kt_stride),
                            kt_stride,
                            n_keys,
                            s_all.as_mut_ptr(),
                            stride,
                        );
                    } else {
                        gemm_x_wt(
                            rows.len(),
                            n_keys,
                            head_dim,
                            s_all.as_mut_ptr(),
                            n_keys,
                            q_chunk,
                            q_width,
                            k32.as_ptr().add(kv_h * head_dim),
                            kv_width,
                        );
                    }
                }
                for (i, t) in rows.clone().enumerate() {
                    let visible = visible_keys(t);
                    let srow = &mut s_all[i * stride..i * stride + n_keys];
                    softmax_row(&mut srow[visible.clone()], scale, softcap);
                    srow[..visible.start].fill(0.0);
                    srow[visible.end..].fill(0.0);
                    if let Some(p) = probs_ptr {
                        // SAFETY: row (h, t) of probs, [n_heads, tokens, ctx], belongs to
                        // this task alone; the length was checked above.
                        let prow = unsafe { std::slice::from_raw_parts_mut(p.get().add((h * tokens + t) * ctx), ctx) };
                        prow[..n_keys].copy_from_slice(srow);
                        prow[n_keys..].fill(0.0);
                    }
                }
                // SAFETY: V is n_keys rows of head_dim at stride kv_width from kv head kv_h
                // (n_keys <= ctx rows); the destination is rows `rows`, head h of `out` (row
                // stride q_width), which only this task writes; s_all as above.
                unsafe {
                    let (v_head, o) =
                        (v32.as_ptr().add(kv_h * head_dim), out_ptr.get().add(rows.start * q_width + h * head_dim));
                    if tiled {
                        tiles::weighted_values(
                            isa,
                            s_all.as_ptr(),
                            stride,
                            rows.len(),
                            n_keys,
                            v_head,
                            kv_width,
                            head_dim,
                            o,
                            q_width,
                        );
                    } else {
                        gemm::gemm(
                            rows.len(),
                            head_dim,
                            n_keys,
                            o,
                            1,
                            q_width as isize,
                            false,
                            s_all.as_ptr(),
                            1,
                            n_keys as isize,
                            v_head,
                            1,
                            kv_width as isize,
                            0.0f32,
                            1.0f32,
                            false,
                            false,
                            false,
                            gemm::Parallelism::None,
                        );
                    }
                }
                return;
            }
            let mut wide_row = [0f32; MAX_HEAD_DIM];
            let wide_row = &mut wide_row[..head_dim.min(MAX_HEAD_DIM)];
            let row = CachedRows { keys: &k, values: &v, start_of: |j: usize| j * kv_width + kv_h * head_dim };
            for t in rows {
                let visible = visible_keys(t);
                let mut heads: [HeadRow<'_>; MAX_HEADS_PER_TASK] = std::array::from_fn(|_| HeadRow::empty());
                let mut scratch_rows = scratch.chunks_exact_mut(ctx);
                for (slot, i) in heads.iter_mut().zip(part.clone()) {
                    let h = variant.head_map.query_head(kv_h, i, group, n_kv_heads);
                    let scores = match probs_ptr {
                        // SAFETY: row (h, t) of probs, [n_heads, tokens, ctx], belongs to this
                        // task alone (h is in one part of one kv head's group); the length was
                        // checked above.
                        Some(p) => unsafe { std::slice::from_raw_parts_mut(p.get().add((h * tokens + t) * ctx), ctx) },
                        None => scratch_rows.next().expect("scratch holds a score row per head of the part"),
                    };
                    // SAFETY: row t, head h of out ([tokens, n_heads * head_dim]) belongs to
                    // this task alone; out.len() == q.len() was checked above.
                    let o = unsafe {
                        std::slice::from_raw_parts_mut(out_ptr.get().add(t * q_width + h * head_dim), head_dim)
                    };
                    *slot = HeadRow { q: &q[t * q_width + h * head_dim..][..head_dim], scores, o };
                }
                let heads = &mut heads[..part.len()];
                attend_heads(isa, heads, &row, visible.clone(), scale, softcap, wide_row);
                for head in heads {
                    head.scores[..visible.start].fill(0.0);
                    head.scores[visible.end..].fill(0.0);
                }
            }
        };
        if need <= MIN_SCORE_SCRATCH {
            SCORES_FIXED.with(|cell| task(&mut cell.borrow_mut()[..]));
        } else {
            SCORES.with(|cell| {
                let mut scratch = cell.borrow_mut();
                if scratch.len() < need {
                    scratch.resize(need.next_power_of_two(), 0.0);
                }
                task(&mut scratch[..]);
            });
        }
    });
    if let Some(kt) = keys_t_guard {
        KEYS_T.with(|cell| cell.set(kt));
    }
    Ok(())
}
