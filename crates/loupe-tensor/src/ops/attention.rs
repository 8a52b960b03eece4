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

use std::cell::RefCell;

use half::f16;
use half::slice::HalfFloatSliceExt;

use super::paged_attention::{KvBlocks, MAX_HEAD_DIM};
use crate::matmul::{gemm_x_wt, OutPtr};
use crate::pool;
use crate::quant::Isa;
use crate::TensorError;

use super::attention_tiles as tiles;

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

    // One task per (head, chunk of query rows); each writes only its rows of its head's
    // slice of `out` and `probs`.
    pool::run(n_heads * chunks, &|task| {
        let (h, chunk) = (task / chunks, task % chunks);
        let kv_h = match variant.head_map {
            HeadMap::Grouped => h / group,
            HeadMap::Modulo => h % n_kv_heads,
        };
        let rows = chunk * TOKENS_PER_TASK..((chunk + 1) * TOKENS_PER_TASK).min(tokens);
        let need = if tiled {
            rows.len() * tiles::padded_keys(ctx)
        } else if tokens >= GEMM_MIN_TOKENS {
            rows.len() * ctx
        } else {
            ctx
        };
        let task = |scratch: &mut [f32]| {
            if tokens >= GEMM_MIN_TOKENS {
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
            for t in rows {
                let q_row = &q[t * q_width + h * head_dim..][..head_dim];
                let visible = visible_keys(t);
                let scores = match probs_ptr {
                    // SAFETY: row (h, t) of probs, [n_heads, tokens, ctx], belongs to this
                    // task alone; the length was checked above.
                    Some(p) => unsafe { std::slice::from_raw_parts_mut(p.get().add((h * tokens + t) * ctx), ctx) },
                    None => &mut scratch[..ctx],
                };
                // SAFETY: row t, head h of out ([tokens, n_heads * head_dim]) belongs to
                // this task alone; out.len() == q.len() was checked above.
                let o =
                    unsafe { std::slice::from_raw_parts_mut(out_ptr.get().add(t * q_width + h * head_dim), head_dim) };
                let row = CachedRows { keys: &k, values: &v, start_of: |j: usize| j * kv_width + kv_h * head_dim };
                attend_row(isa, q_row, &row, visible.clone(), scores, scale, softcap, o, wide_row);
                scores[..visible.start].fill(0.0);
                scores[visible.end..].fill(0.0);
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

/// The cached keys and values one query row of one head reads: `start_of(p)` is the first
/// element of that head's row at position `p` in both (contiguous or paged).
pub(crate) struct CachedRows<'a, 'b, F: Fn(usize) -> usize> {
    pub keys: &'a KvBlocks<'b>,
    pub values: &'a KvBlocks<'b>,
    pub start_of: F,
}

/// One query row of one head over the keys at positions `visible` (decode and paged rows):
/// raw scores into `scores[visible]`, their softmax in place, and `o = sum_p scores[p] v_p`.
/// `wide_row` (`q_row.len()` floats) is scratch for the per-key path.
///
/// The bits are those of the per-key loop of [`dot_cached`] and [`axpy_cached`]. Where the
/// ISA has a row kernel for the head size (AVX-512: multiples of 16, AVX2: of 8) and the rows
/// are f32 or f16, one call runs every key with the same accumulators in the same order,
/// without a call per key and with the output in registers across keys (decode attention
/// was 10% of SmolLM2's decode step, most of it calls and the output's store-to-load trips);
/// elsewhere the per-key loop runs.
#[allow(clippy::too_many_arguments)]
pub(crate) fn attend_row<F: Fn(usize) -> usize>(
    isa: Isa,
    q_row: &[f32],
    rows: &CachedRows<'_, '_, F>,
    visible: std::ops::Range<usize>,
    scores: &mut [f32],
    scale: f32,
    softcap: Option<f32>,
    o: &mut [f32],
    wide_row: &mut [f32],
) {
    let start_of = &rows.start_of;
    // Decided once for both passes: the checks walk every visible key.
    let kernel = row_kernel(isa, q_row.len(), rows, visible.clone()).filter(|_| visible.end <= scores.len());
    // SAFETY (both passes): row_kernel checked the ISA, the head size and every visible row's
    // range in both the keys and the values; visible.end <= scores.len() just above.
    if !kernel.is_some_and(|k| unsafe {
        row_kernel_pass(k, RowPass::Scores { q: q_row, scores }, rows.keys, start_of, visible.clone())
    }) {
        for j in visible.clone() {
            scores[j] = dot_cached(isa, q_row, rows.keys, start_of(j), wide_row);
        }
    }
    softmax_row(&mut scores[visible.clone()], scale, softcap);
    o.fill(0.0);
    if !kernel.is_some_and(|k| unsafe {
        row_kernel_pass(k, RowPass::WeightedSum { w: scores, o }, rows.values, start_of, visible.clone())
    }) {
        for j in visible {
            axpy_cached(isa, scores[j], rows.values, start_of(j), wide_row, o);
        }
    }
}

/// Which row kernel serves rows of `n` elements under `isa`, if any: the vector width of the
/// per-key path at that ISA, for head sizes that are whole vectors of it (at AVX-512 that
/// path is the 16-lane one with scalar tails, so the 8-lane kernel serves AVX2 alone), and
/// rows `start_of(p)..+n` inside both the keys and the values for every `p` in `keys`.
#[derive(Debug, Clone, Copy)]
enum RowKernel {
    Lanes16,
    Lanes8,
}

fn row_kernel<F: Fn(usize) -> usize>(
    isa: Isa,
    n: usize,
    rows: &CachedRows<'_, '_, F>,
    keys: std::ops::Range<usize>,
) -> Option<RowKernel> {
    let kernel = match isa {
        _ if !cfg!(target_arch = "x86_64") || n == 0 => return None,
        Isa::Avx512 | Isa::Amx if n.is_multiple_of(16) => RowKernel::Lanes16,
        Isa::Avx2 if n.is_multiple_of(8) => RowKernel::Lanes8,
        _ => return None,
    };
    let len = rows.keys.len().min(rows.values.len());
    keys.into_iter().all(|p| (rows.start_of)(p).checked_add(n).is_some_and(|end| end <= len)).then_some(kernel)
}

/// One pass of [`attend_row`] over the keys: raw scores (`scores[p] = q . row(p)`) or the
/// probability-weighted sum of the values (`o = sum_p w[p] row(p)`).
enum RowPass<'a> {
    Scores { q: &'a [f32], scores: &'a mut [f32] },
    WeightedSum { w: &'a [f32], o: &'a mut [f32] },
}

/// Runs `pass` over `keys` with `kernel`; false, having written nothing, for rows it does not
/// read (FP8, which callers widen first).
///
/// # Safety
/// `kernel` is [`row_kernel`]'s answer for these rows, this head size and `keys`, and `keys.end`
/// is within the scores (or weights) of `pass`.
unsafe fn row_kernel_pass(
    kernel: RowKernel,
    pass: RowPass<'_>,
    rows: &KvBlocks<'_>,
    start_of: &impl Fn(usize) -> usize,
    keys: std::ops::Range<usize>,
) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        macro_rules! run {
            ($simd:ident, $rows:expr) => {
                match pass {
                    RowPass::Scores { q, scores } => $simd::scores(q, $rows, start_of, keys, scores),
                    RowPass::WeightedSum { w, o } => $simd::weighted_sum(w, $rows, start_of, keys, o),
                }
            };
        }
        // SAFETY: the caller's contract (the ISA's features, which include F16C; whole
        // vectors; rows and keys in range).
        unsafe {
            match (kernel, rows) {
                (RowKernel::Lanes16, KvBlocks::F32(d)) => run!(simd512, d),
                (RowKernel::Lanes16, KvBlocks::F16(d)) => run!(simd512, d),
                (RowKernel::Lanes8, KvBlocks::F32(d)) => run!(simd256, d),
                (RowKernel::Lanes8, KvBlocks::F16(d)) => run!(simd256, d),
                (_, KvBlocks::Fp8 { .. }) => return false,
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (kernel, pass, rows, start_of, keys);
    true
}

/// Scales raw scores `q . k` by `scale`, soft-caps them when `softcap` says so (as
/// `eager_attention_forward` does before adding the mask), and turns them into
/// probabilities in place (max-subtracted exp, as torch.softmax does, in f32). Every
/// attention path (prefill, decode, paged) goes through here, so the cap applies alike.
pub(crate) fn softmax_row(scores: &mut [f32], scale: f32, softcap: Option<f32>) {
    if let Some(cap) = softcap {
        for s in scores.iter_mut() {
            *s = super::soft_cap_one(*s * scale, cap);
        }
        super::activation::softmax_in_place(scores);
    } else {
        super::activation::scaled_softmax_in_place(scores, scale);
    }
}

/// `a . b` (equal lengths): four vector accumulators (AVX-512: 16 lanes, AVX2: 8) when
/// the ISA has them, else the scalar reference [`dot_scalar`].
#[inline]
pub(crate) fn dot(isa: Isa, a: &[f32], b: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if a.len() == b.len() {
        if isa >= Isa::Avx512 {
            // SAFETY: the CPU has AVX-512F and F16C (Isa::Avx512); equal lengths checked.
            return unsafe { simd512::dot_f32(a, b) };
        }
        if isa >= Isa::Avx2 {
            // SAFETY: the CPU has AVX2, FMA and F16C (Isa::Avx2); equal lengths checked.
            return unsafe { simd256::dot_f32(a, b) };
        }
    }
    let _ = isa;
    dot_scalar(a, b)
}

/// Reference dot product, summed left to right.
pub fn dot_scalar(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// `y += alpha * x` (equal lengths).
#[inline]
pub(crate) fn axpy(isa: Isa, alpha: f32, x: &[f32], y: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if x.len() == y.len() {
        if isa >= Isa::Avx512 {
            // SAFETY: the CPU has AVX-512F and F16C; equal lengths checked.
            return unsafe { simd512::axpy_f32(alpha, x, y) };
        }
        if isa >= Isa::Avx2 {
            // SAFETY: the CPU has AVX2, FMA and F16C; equal lengths checked.
            return unsafe { simd256::axpy_f32(alpha, x, y) };
        }
    }
    let _ = isa;
    for (acc, &v) in y.iter_mut().zip(x) {
        *acc += alpha * v;
    }
}

/// `q . row` for the cached row at `start`: f32 rows go straight to [`dot`]; f16 rows are
/// widened in registers by a twin of that dot with the same accumulators in the same
/// order (so the result equals widening first, then the f32 dot, bit for bit). `scratch`
/// (`q.len()` floats) holds the widened row where no SIMD twin runs.
#[inline]
pub(crate) fn dot_cached(isa: Isa, q: &[f32], rows: &KvBlocks<'_>, start: usize, scratch: &mut [f32]) -> f32 {
    match rows {
        KvBlocks::F32(d) => dot(isa, q, &d[start..start + q.len()]),
        KvBlocks::F16(d) => {
            let k = &d[start..start + q.len()];
            #[cfg(target_arch = "x86_64")]
            {
                if isa >= Isa::Avx512 {
                    // SAFETY: AVX-512F and F16C are available (Isa::Avx512); equal lengths.
                    return unsafe { simd512::dot_f16(q, k) };
                }
                if isa >= Isa::Avx2 {
                    // SAFETY: AVX2, FMA and F16C are available (Isa::Avx2); equal lengths.
                    return unsafe { simd256::dot_f16(q, k) };
                }
            }
            k.convert_to_f32_slice(scratch);
            dot(isa, q, scratch)
        }
        KvBlocks::Fp8 { .. } => {
            let n = q.len();
            rows.widen_into(start, &mut scratch[..n]);
            dot(isa, q, &scratch[..n])
        }
    }
}

/// `out += w * row` for the cached row at `start` (see [`dot_cached`]).
#[inline]
pub(crate) fn axpy_cached(isa: Isa, w: f32, rows: &KvBlocks<'_>, start: usize, scratch: &mut [f32], out: &mut [f32]) {
    match rows {
        KvBlocks::F32(d) => axpy(isa, w, &d[start..start + out.len()], out),
        KvBlocks::F16(d) => {
            let v = &d[start..start + out.len()];
            #[cfg(target_arch = "x86_64")]
            {
                if isa >= Isa::Avx512 {
                    // SAFETY: as in dot_cached.
                    return unsafe { simd512::axpy_f16(w, v, out) };
                }
                if isa >= Isa::Avx2 {
                    // SAFETY: as in dot_cached.
                    return unsafe { simd256::axpy_f16(w, v, out) };
                }
            }
            v.convert_to_f32_slice(scratch);
            axpy(isa, w, scratch, out)
        }
        KvBlocks::Fp8 { .. } => {
            let n = out.len();
            rows.widen_into(start, &mut scratch[..n]);
            axpy(isa, w, &scratch[..n], out)
        }
    }
}

/// An element of a cached row, widened exactly to f32 (the scalar tails of the kernels).
trait Widen: Copy {
    fn widen(self) -> f32;
}

impl Widen for f32 {
    #[inline(always)]
    fn widen(self) -> f32 {
        self
    }
}

impl Widen for f16 {
    #[inline(always)]
    fn widen(self) -> f32 {
        self.to_f32()
    }
}

/// Defines `$dot(a: &[f32], b: &[$elem]) -> f32` and `$axpy(alpha, x: &[$elem], y)` for one
/// vector width: the whole vectors through `row_kernels!`'s `dot_vectors` (four
/// accumulators, then one vector at a time into the first, the fixed reduction
/// `(acc0 + acc1) + (acc2 + acc3)`), then `$hsum`, then a scalar tail. `$load` widens `$lanes` elements of `$elem` to a vector. The f32 and
/// f16 instances differ only in `$load`, which widens exactly, so their results are equal
/// bit for bit on equal (widened) rows.
#[cfg(target_arch = "x86_64")]
macro_rules! dot_axpy {
    ($features:literal, $lanes:literal, $vec:ty, $zero:ident, $fmadd:ident, $add:ident, $loadf:ident, $storef:ident, $set1:ident, $hsum:path,
     $dot:ident, $axpy:ident, $elem:ty, $load:path) => {
        #[target_feature(enable = $features)]
        pub unsafe fn $dot(a: &[f32], b: &[$elem]) -> f32 {
            let n = a.len();
            let mut sum = $hsum(dot_vectors(a.as_ptr(), b.as_ptr(), n));
            let mut i = n - n % $lanes;
            while i < n {
                sum += a[i] * Widen::widen(b[i]);
                i += 1;
            }
            sum
        }

        #[target_feature(enable = $features)]
        pub unsafe fn $axpy(alpha: f32, x: &[$elem], y: &mut [f32]) {
            let n = x.len();
            let (px, py) = (x.as_ptr(), y.as_mut_ptr());
            let va = $set1(alpha);
            let mut i = 0;
            while i + $lanes <= n {
                $storef(py.add(i), $fmadd(va, $load(px.add(i)), $loadf(py.add(i))));
                i += $lanes;
            }
            while i < n {
                y[i] += alpha * Widen::widen(x[i]);
                i += 1;
            }
        }
    };
}

/// Defines the row kernels of [`attend_row`] for one vector width: `scores` (every key's
/// dot, each with the accumulators, order and reduction of `dot_axpy!`'s dot) and
/// `weighted_sum` (the values' fused multiply-adds of `dot_axpy!`'s axpy in key order, the
/// output held in up to four vectors across keys). Callers guarantee the features, a head
/// size that is a whole number of vectors, rows in range and `keys.end` within the scores.
#[cfg(target_arch = "x86_64")]
macro_rules! row_kernels {
    ($features:literal, $lanes:literal, $vec:ty, $zero:ident, $fmadd:ident, $add:ident, $loadf:ident, $storef:ident, $set1:ident, $hsum:path, $load16:path) => {
        /// A cached element type the kernels widen, `$lanes` at a time.
        pub trait RowElem: Copy {
            /// # Safety
            /// `$lanes` elements at `p` are readable; the CPU has the module's features.
            unsafe fn load(p: *const Self) -> $vec;
        }

        impl RowElem for f32 {
            #[inline]
            #[target_feature(enable = $features)]
            unsafe fn load(p: *const f32) -> $vec {
                $loadf(p)
            }
        }

        impl RowElem for f16 {
            #[inline]
            #[target_feature(enable = $features)]
            unsafe fn load(p: *const f16) -> $vec {
                $load16(p)
            }
        }

        /// The whole vectors of `a . b` over `n` elements (the tail past `n - n % $lanes` is
        /// the caller's): four accumulators over `4 * $lanes` elements per pass, then one
        /// vector at a time into the first, combined as `(acc0 + acc1) + (acc2 + acc3)`.
        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn dot_vectors<E: RowElem>(pa: *const f32, pb: *const E, n: usize) -> $vec {
            let mut acc: [$vec; 4] = [$zero(); 4];
            let mut i = 0;
            while i + 4 * $lanes <= n {
                for (r, acc) in acc.iter_mut().enumerate() {
                    *acc = $fmadd($loadf(pa.add(i + $lanes * r)), E::load(pb.add(i + $lanes * r)), *acc);
                }
                i += 4 * $lanes;
            }
            while i + $lanes <= n {
                acc[0] = $fmadd($loadf(pa.add(i)), E::load(pb.add(i)), acc[0]);
                i += $lanes;
            }
            $add($add(acc[0], acc[1]), $add(acc[2], acc[3]))
        }

        #[target_feature(enable = $features)]
        pub unsafe fn scores<E: RowElem>(
            q: &[f32],
            rows: &[E],
            start_of: &impl Fn(usize) -> usize,
            keys: std::ops::Range<usize>,
            scores: &mut [f32],
        ) {
            let n = q.len();
            let pa = q.as_ptr();
            let out = scores.as_mut_ptr();
            for j in keys {
                *out.add(j) = $hsum(dot_vectors(pa, rows.as_ptr().add(start_of(j)), n));
            }
        }

        #[target_feature(enable = $features)]
        pub unsafe fn weighted_sum<E: RowElem>(
            w: &[f32],
            rows: &[E],
            start_of: &impl Fn(usize) -> usize,
            keys: std::ops::Range<usize>,
            o: &mut [f32],
        ) {
            let n = o.len();
            let (pw, po) = (w.as_ptr(), o.as_mut_ptr());
            let mut d = 0;
            while d + 4 * $lanes <= n {
                let mut acc: [$vec; 4] = [$zero(); 4];
                for j in keys.clone() {
                    let va = $set1(*pw.add(j));
                    let pb = rows.as_ptr().add(start_of(j) + d);
                    for (r, acc) in acc.iter_mut().enumerate() {
                        *acc = $fmadd(va, E::load(pb.add($lanes * r)), *acc);
                    }
                }
                for (r, acc) in acc.iter().enumerate() {
                    $storef(po.add(d + $lanes * r), *acc);
                }
                d += 4 * $lanes;
            }
            while d + $lanes <= n {
                let mut acc = $zero();
                for j in keys.clone() {
                    acc = $fmadd($set1(*pw.add(j)), E::load(rows.as_ptr().add(start_of(j) + d)), acc);
                }
                $storef(po.add(d), acc);
                d += $lanes;
            }
        }
    };
}

#[cfg(target_arch = "x86_64")]
mod simd512 {
    use std::arch::x86_64::*;

    use half::f16;

    use super::Widen;

    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn load_f32(p: *const f32) -> __m512 {
        _mm512_loadu_ps(p)
    }

    #[inline]
    #[target_feature(enable = "avx512f,f16c")]
    unsafe fn load_f16(p: *const f16) -> __m512 {
        _mm512_cvtph_ps(_mm256_loadu_si256(p as *const __m256i))
    }

    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn hsum(v: __m512) -> f32 {
        _mm512_reduce_add_ps(v)
    }

    dot_axpy!(
        "avx512f,f16c",
        16,
        __m512,
        _mm512_setzero_ps,
        _mm512_fmadd_ps,
        _mm512_add_ps,
        _mm512_loadu_ps,
        _mm512_storeu_ps,
        _mm512_set1_ps,
        hsum,
        dot_f32,
        axpy_f32,
        f32,
        load_f32
    );
    dot_axpy!(
        "avx512f,f16c",
        16,
        __m512,
        _mm512_setzero_ps,
        _mm512_fmadd_ps,
        _mm512_add_ps,
        _mm512_loadu_ps,
        _mm512_storeu_ps,
        _mm512_set1_ps,
        hsum,
        dot_f16,
        axpy_f16,
        f16,
        load_f16
    );
    row_kernels!(
        "avx512f,f16c",
        16,
        __m512,
        _mm512_setzero_ps,
        _mm512_fmadd_ps,
        _mm512_add_ps,
        _mm512_loadu_ps,
        _mm512_storeu_ps,
        _mm512_set1_ps,
        hsum,
        load_f16
    );
}

#[cfg(target_arch = "x86_64")]
mod simd256 {
    use std::arch::x86_64::*;

    use half::f16;

    use super::Widen;

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn load_f32(p: *const f32) -> __m256 {
        _mm256_loadu_ps(p)
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn load_f16(p: *const f16) -> __m256 {
        _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i))
    }

    /// Lanes summed as ((0+4) + (2+6)) + ((1+5) + (3+7)): high half onto low, then pairs.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn hsum(v: __m256) -> f32 {
        let x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
        let x = _mm_add_ps(x, _mm_movehl_ps(x, x));
        _mm_cvtss_f32(_mm_add_ss(x, _mm_shuffle_ps(x, x, 1)))
    }

    dot_axpy!(
        "avx2,fma,f16c",
        8,
        __m256,
        _mm256_setzero_ps,
        _mm256_fmadd_ps,
        _mm256_add_ps,
        _mm256_loadu_ps,
        _mm256_storeu_ps,
        _mm256_set1_ps,
        hsum,
        dot_f32,
        axpy_f32,
        f32,
        load_f32
    );
    dot_axpy!(
        "avx2,fma,f16c",
        8,
        __m256,
        _mm256_setzero_ps,
        _mm256_fmadd_ps,
        _mm256_add_ps,
        _mm256_loadu_ps,
        _mm256_storeu_ps,
        _mm256_set1_ps,
        hsum,
        dot_f16,
        axpy_f16,
        f16,
        load_f16
    );
    row_kernels!(
        "avx2,fma,f16c",
        8,
        __m256,
        _mm256_setzero_ps,
        _mm256_fmadd_ps,
        _mm256_add_ps,
        _mm256_loadu_ps,
        _mm256_storeu_ps,
        _mm256_set1_ps,
        hsum,
        load_f16
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_token_attends_only_to_itself() {
        // token-0 invariant: the output of token 0 is V[0] whatever q and k are.
        let shape = AttentionShape { n_heads: 2, n_kv_heads: 1, head_dim: 2, scale: 0.7, softcap: None };
        let q = [1.0, 2.0, 3.0, 4.0, 0.5, 0.5, -1.0, 1.0];
        let k = [0.3, 0.1, 0.9, -0.2];
        let v = [5.0, 6.0, 7.0, 8.0];
        let mut out = [0.0; 8];
        let mut probs = [0.0; 2 * 2 * 2];
        causal_attention(shape, &q, &k, &v, 2, &mut out, Some(&mut probs)).unwrap();
        assert_eq!(&out[..4], &[5.0, 6.0, 5.0, 6.0]);
        assert_eq!(probs[1], 0.0); // masked
        for h in 0..2 {
            let row = &probs[h * 4 + 2..h * 4 + 4];
            assert!((row.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        }
    }

    #[test]
    fn variants_change_head_map_and_mask() {
        // 4 query heads over 2 kv heads of dim 1; two tokens. v of kv head 0 is 10+pos,
        // of kv head 1 is 20+pos; all scores equal, so outputs are means of visible v.
        let shape = AttentionShape { n_heads: 4, n_kv_heads: 2, head_dim: 1, scale: 1.0, softcap: None };
        let q = [0.0; 8];
        let k = [0.0; 4];
        let v = [10.0, 20.0, 11.0, 21.0];
        let run = |variant: AttentionVariant| {
            let mut out = [0.0f32; 8];
            attention(shape, variant, &q, &k, &v, 2, &mut out, None).unwrap();
            out
        };
        let grouped = run(AttentionVariant::default());
        assert_eq!(&grouped[..4], &[10.0, 10.0, 20.0, 20.0]);
        let modulo = run(AttentionVariant { head_map: HeadMap::Modulo, ..Default::default() });
        assert_eq!(&modulo[..4], &[10.0, 20.0, 10.0, 20.0]);
        let open = run(AttentionVariant { mask: AttentionMask::None, ..Default::default() });
        // token 0 now also sees token 1
        assert_eq!(&open[..4], &[10.5, 10.5, 20.5, 20.5]);
        assert_eq!(&open[4..], &grouped[4..]);
    }

    #[test]
    fn simd_dot_and_axpy_match_scalar() {
        for n in [1, 15, 16, 64, 100, 128] {
            let a: Vec<f32> = (0..n).map(|i| ((i * 37 % 11) as f32 - 5.0) * 0.13).collect();
            let b: Vec<f32> = (0..n).map(|i| ((i * 53 % 7) as f32 - 3.0) * 0.29).collect();
            let want = dot_scalar(&a, &b);
            for isa in Isa::available() {
                let got = dot(isa, &a, &b);
                assert!((got - want).abs() <= 1e-5 * (1.0 + want.abs()), "{isa:?} n={n}: {got} vs {want}");
                let mut y = b.clone();
                axpy(isa, 0.75, &a, &mut y);
                for i in 0..n {
                    assert!((y[i] - (b[i] + 0.75 * a[i])).abs() <= 1e-6, "{isa:?} n={n} i={i}");
                }
            }
        }
    }

    #[test]
    fn prefill_in_chunks_equals_token_by_token_decode() {
        // 70 tokens spans three query chunks; the result must match running the same
        // queries one at a time over a growing context, with and without probs.
        let shape = AttentionShape { n_heads: 4, n_kv_heads: 2, head_dim: 16, scale: 0.25, softcap: None };
        let tokens = 70;
        let gen = |n: usize, seed: usize| -> Vec<f32> {
            (0..n).map(|i| (((i * 2654435761 + seed) % 1000) as f32 / 500.0) - 1.0).collect()
        };
        let q = gen(tokens * 64, 1);
        let k = gen(tokens * 32, 2);
        let v = gen(tokens * 32, 3);
        let mut out = vec![0.0; tokens * 64];
        let mut probs = vec![0.0; 4 * tokens * tokens];
        causal_attention(shape, &q, &k, &v, tokens, &mut out, Some(&mut probs)).unwrap();
        let mut out_np = vec![0.0; tokens * 64];
        causal_attention(shape, &q, &k, &v, tokens, &mut out_np, None).unwrap();
        assert_eq!(out, out_np);
        for t in 0..tokens {
            let mut o = vec![0.0; 64];
            causal_attention(
                shape,
                &q[t * 64..(t + 1) * 64],
                &k[..(t + 1) * 32],
                &v[..(t + 1) * 32],
                t + 1,
                &mut o,
                None,
            )
            .unwrap();
            // Prefill runs matrix products, decode one dot per key: same math, other
            // summation order.
            for (a, b) in out[t * 64..(t + 1) * 64].iter().zip(&o) {
                assert!((a - b).abs() <= 1e-5, "token {t}: {a} vs {b}");
            }
        }
    }

    /// Straightforward f64 attention over any variant.
    fn naive(
        shape: AttentionShape,
        variant: AttentionVariant,
        q: &[f32],
        k: &[f32],
        v: &[f32],
        ctx: usize,
    ) -> Vec<f64> {
        let AttentionShape { n_heads, n_kv_heads, head_dim, scale, softcap } = shape;
        let tokens = q.len() / (n_heads * head_dim);
        let (qw, kw) = (n_heads * head_dim, n_kv_heads * head_dim);
        let mut out = vec![0.0; q.len()];
        for h in 0..n_heads {
            let kh = match variant.head_map {
                HeadMap::Grouped => h / (n_heads / n_kv_heads),
                HeadMap::Modulo => h % n_kv_heads,
            };
            for t in 0..tokens {
                let pos = ctx - tokens + t;
                // Written as the masks' definitions, not through AttentionMask::visible.
                let keys: Vec<usize> = (0..ctx)
                    .filter(|&j| match variant.mask {
                        AttentionMask::Causal => j <= pos,
                        AttentionMask::None => true,
                        AttentionMask::SlidingWindow(w) => j <= pos && pos - j < w,
                    })
                    .collect();
                let s: Vec<f64> = keys
                    .iter()
                    .map(|&j| {
                        (0..head_dim)
                            .map(|d| q[t * qw + h * head_dim + d] as f64 * k[j * kw + kh * head_dim + d] as f64)
                            .sum::<f64>()
                            * scale as f64
                    })
                    .collect();
                // Soft-capping as `eager_attention_forward` writes it, before the mask.
                let s: Vec<f64> =
                    s.into_iter().map(|x| softcap.map_or(x, |c| c as f64 * (x / c as f64).tanh())).collect();
                let max = s.iter().cloned().fold(f64::MIN, f64::max);
                let e: Vec<f64> = s.iter().map(|x| (x - max).exp()).collect();
                let z: f64 = e.iter().sum();
                for d in 0..head_dim {
                    out[t * qw + h * head_dim + d] =
                        keys.iter().zip(&e).map(|(&j, e)| e / z * v[j * kw + kh * head_dim + d] as f64).sum();
                }
            }
        }
        out
    }

    #[test]
    fn prefill_and_decode_paths_match_a_naive_reference_for_every_variant() {
        let plain = AttentionShape { n_heads: 4, n_kv_heads: 2, head_dim: 16, scale: 0.25, softcap: None };
        // Scores up to about +-8 soft-capped at 2 (Gemma 2's attn_logit_softcapping): the cap
        // bites on most keys.
        let capped = AttentionShape { scale: 1.5, softcap: Some(2.0), ..plain };
        let gen = |n: usize, seed: usize| -> Vec<f32> {
            (0..n).map(|i| (((i * 2654435761 + seed) % 1000) as f32 / 500.0) - 1.0).collect()
        };
        for (shape, head_map) in [(plain, HeadMap::Grouped), (plain, HeadMap::Modulo), (capped, HeadMap::Grouped)] {
            // Windows shorter than the context, longer than the call, and wider than it all.
            for mask in [
                AttentionMask::Causal,
                AttentionMask::None,
                AttentionMask::SlidingWindow(1),
                AttentionMask::SlidingWindow(7),
                AttentionMask::SlidingWindow(64),
            ] {
                let variant = AttentionVariant { head_map, mask };
                // 40 new tokens after 5 cached (prefill path), and 1 after 44 (decode).
                for (tokens, ctx) in [(40, 45), (1, 45)] {
                    let q = gen(tokens * 64, 7);
                    let k = gen(ctx * 32, 8);
                    let v = gen(ctx * 32, 9);
                    let mut out = vec![0.0; tokens * 64];
                    attention(shape, variant, &q, &k, &v, ctx, &mut out, None).unwrap();
                    let want = naive(shape, variant, &q, &k, &v, ctx);
                    for (i, (a, b)) in out.iter().zip(&want).enumerate() {
                        assert!(
                            (*a as f64 - b).abs() < 1e-5,
                            "{shape:?} {variant:?} tokens {tokens} [{i}]: {a} vs {b}"
                        );
                    }
                    if shape.softcap.is_some() && mask != AttentionMask::SlidingWindow(1) {
                        // The cap is seen: without it the same scores give another output
                        // (except over one key, whose probability is 1 whatever its score).
                        let uncapped = naive(AttentionShape { softcap: None, ..shape }, variant, &q, &k, &v, ctx);
                        let diff = want.iter().zip(&uncapped).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
                        assert!(
                            diff > 1e-2,
                            "{variant:?} tokens {tokens}: the soft-cap changes the output by only {diff}"
                        );
                    }
                }
            }
        }
    }

    /// An FP8 cache (E4M3, a scale per row) gives exactly the attention of its rows widened
    /// to f32, decode and prefill (under the active ISA; CI runs every one via LOUPE_ISA).
    #[test]
    fn an_fp8_cache_gives_the_bits_of_its_rows_widened_to_f32() {
        let gen = |n: usize, seed: usize| -> Vec<f32> {
            (0..n).map(|i| (((i * 2654435761 + seed) % 1000) as f32 / 100.0) - 5.0).collect()
        };
        for head_dim in [64, 24, 7] {
            let shape = AttentionShape { n_heads: 4, n_kv_heads: 2, head_dim, scale: 0.25, softcap: None };
            let (qw, kw) = (4 * head_dim, 2 * head_dim);
            for (tokens, ctx) in [(1, 45), (3, 45), (40, 45)] {
                let q = gen(tokens * qw, 1);
                let quant = |x: Vec<f32>| {
                    let (mut c, mut s) = (vec![0u8; x.len()], vec![0f32; x.len() / kw]);
                    crate::fp8::quantize_rows_e4m3(&x, kw, &mut c, &mut s).unwrap();
                    (c, s)
                };
                let ((kc, ks), (vc, vs)) = (quant(gen(ctx * kw, 2)), quant(gen(ctx * kw, 3)));
                let (kb, vb) = (
                    KvBlocks::Fp8 { codes: &kc, scales: &ks, group: kw },
                    KvBlocks::Fp8 { codes: &vc, scales: &vs, group: kw },
                );
                let (k, v) = (kb.to_f32_vec(), vb.to_f32_vec());
                let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                let mut want = vec![0.0; tokens * qw];
                attention(shape, AttentionVariant::default(), &q, &k, &v, ctx, &mut want, None).unwrap();
                let mut got = vec![0.0; tokens * qw];
                attention_cached(shape, AttentionVariant::default(), &q, kb, vb, ctx, &mut got, None).unwrap();
                assert_eq!(bits(&got), bits(&want), "head_dim {head_dim}, {tokens} tokens");
            }
        }
    }

    #[test]
    fn an_f16_cache_gives_the_bits_of_its_rows_widened_to_f32() {
        let gen = |n: usize, seed: usize| -> Vec<f32> {
            (0..n).map(|i| (((i * 2654435761 + seed) % 1000) as f32 / 500.0) - 1.0).collect()
        };
        // head_dim 64 (whole vectors), 24 (an AVX-512 tail) and 7 (scalar only).
        for head_dim in [64, 24, 7] {
            let shape = AttentionShape { n_heads: 4, n_kv_heads: 2, head_dim, scale: 0.25, softcap: None };
            let (qw, kw) = (4 * head_dim, 2 * head_dim);
            // Decode (1 and 3 tokens: one dot per key) and prefill (40 and 70 tokens: the
            // tile kernels, whose key transposition widens f16 keys itself, in tasks of 64
            // keys, or gemm on widened rows), after 5 and 80 cached positions.
            for (tokens, ctx) in [(1, 45), (3, 45), (40, 45), (70, 150)] {
                let q = gen(tokens * qw, 1);
                let k16: Vec<f16> = gen(ctx * kw, 2).iter().map(|&x| f16::from_f32(x)).collect();
                let v16: Vec<f16> = gen(ctx * kw, 3).iter().map(|&x| f16::from_f32(x)).collect();
                let (k, v): (Vec<f32>, Vec<f32>) =
                    (k16.iter().map(|x| x.to_f32()).collect(), v16.iter().map(|x| x.to_f32()).collect());
                for with_probs in [false, true] {
                    let mut want = vec![0.0; tokens * qw];
                    let mut want_p = vec![0.0; 4 * tokens * ctx];
                    attention(
                        shape,
                        AttentionVariant::default(),
                        &q,
                        &k,
                        &v,
                        ctx,
                        &mut want,
                        with_probs.then_some(&mut want_p[..]),
                    )
                    .unwrap();
                    let mut got = vec![0.0; tokens * qw];
                    let mut got_p = vec![0.0; 4 * tokens * ctx];
                    let (kb, vb) = (KvBlocks::F16(&k16), KvBlocks::F16(&v16));
                    attention_cached(
                        shape,
                        AttentionVariant::default(),
                        &q,
                        kb,
                        vb,
                        ctx,
                        &mut got,
                        with_probs.then_some(&mut got_p[..]),
                    )
                    .unwrap();
                    let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(&got), bits(&want), "head_dim {head_dim}, {tokens} tokens, probs {with_probs}");
                    assert_eq!(bits(&got_p), bits(&want_p), "head_dim {head_dim}, {tokens} tokens");
                    // Mixed: f16 keys, f32 values.
                    attention_cached(
                        shape,
                        AttentionVariant::default(),
                        &q,
                        KvBlocks::F16(&k16),
                        KvBlocks::F32(&v),
                        ctx,
                        &mut got,
                        None,
                    )
                    .unwrap();
                    assert_eq!(bits(&got), bits(&want), "mixed, head_dim {head_dim}, {tokens} tokens");
                }
            }
        }
        // Too few cached rows is an error, not a panic.
        let shape = AttentionShape { n_heads: 2, n_kv_heads: 1, head_dim: 4, scale: 1.0, softcap: None };
        let short = vec![f16::ZERO; 4];
        let mut out = [0.0; 8];
        assert!(attention_cached(
            shape,
            AttentionVariant::default(),
            &[0.0; 8],
            KvBlocks::F16(&short),
            KvBlocks::F16(&short),
            2,
            &mut out,
            None
        )
        .is_err());
    }

    /// The row kernels give the bits of the per-key dot / axpy loop on every ISA, f32 and
    /// f16 rows, whole-vector head sizes and others (which take the per-key loop), rows out
    /// of order (paged) and windows that start past 0.
    #[test]
    fn row_kernels_give_the_bits_of_the_per_key_loop() {
        let gen = |n: usize, seed: usize| -> Vec<f32> {
            (0..n).map(|i| (((i * 2654435761 + seed) % 1000) as f32 / 250.0) - 2.0).collect()
        };
        let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
        for head_dim in [8, 16, 24, 64, 80, 256, 7] {
            let ctx = 37;
            let q = gen(head_dim, 1);
            let (k, v) = (gen(ctx * head_dim, 2), gen(ctx * head_dim, 3));
            let (k16, v16): (Vec<f16>, Vec<f16>) =
                (k.iter().map(|&x| f16::from_f32(x)).collect(), v.iter().map(|&x| f16::from_f32(x)).collect());
            // Position p's row is stored at slot (p * 11) % ctx, as a block table scatters them.
            let start_of = |p: usize| (p * 11 % ctx) * head_dim;
            for (keys, values) in [
                (KvBlocks::F32(&k), KvBlocks::F32(&v)),
                (KvBlocks::F16(&k16), KvBlocks::F16(&v16)),
                (KvBlocks::F16(&k16), KvBlocks::F32(&v)),
            ] {
                for visible in [0..ctx, 5..ctx, 36..37] {
                    for isa in Isa::available() {
                        let mut wide = vec![0f32; head_dim];
                        let mut want_s = vec![0f32; ctx];
                        for j in visible.clone() {
                            want_s[j] = dot_cached(isa, &q, &keys, start_of(j), &mut wide);
                        }
                        softmax_row(&mut want_s[visible.clone()], 0.3, None);
                        let mut want_o = vec![0f32; head_dim];
                        for j in visible.clone() {
                            axpy_cached(isa, want_s[j], &values, start_of(j), &mut wide, &mut want_o);
                        }
                        let (mut got_s, mut got_o) = (vec![0f32; ctx], vec![f32::NAN; head_dim]);
                        let rows = CachedRows { keys: &keys, values: &values, start_of };
                        attend_row(isa, &q, &rows, visible.clone(), &mut got_s, 0.3, None, &mut got_o, &mut wide);
                        assert_eq!(bits(&got_s), bits(&want_s), "{isa:?} head_dim {head_dim} {visible:?} scores");
                        assert_eq!(bits(&got_o), bits(&want_o), "{isa:?} head_dim {head_dim} {visible:?} output");
                    }
                }
            }
        }
    }

    #[test]
    fn rejects_bad_grouping() {
        let shape = AttentionShape { n_heads: 3, n_kv_heads: 2, head_dim: 2, scale: 1.0, softcap: None };
        let mut out = [0.0; 6];
        assert!(causal_attention(shape, &[0.0; 6], &[0.0; 4], &[0.0; 4], 1, &mut out, None).is_err());
    }
}
