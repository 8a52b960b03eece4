//! Causal attention over a *paged* KV cache, for the batched engine: many sequences in one
//! call, each with its own block table, mixing prefill chunks and single decode tokens.
//!
//! Layout: one layer's keys (and, separately, values) are `n_blocks * block_size` rows of
//! `width = n_kv_heads * head_dim` elements; block `b` holds rows `b * block_size ..
//! (b + 1) * block_size`. A sequence's position `p` lives in block `blocks[p / block_size]`
//! at slot `p % block_size`. Rows are f32 or f16 ([`KvBlocks`]).
//!
//! **Batch invariance.** Every query row is computed alone, with the arithmetic of the
//! decode path of [`super::attention`] (one SIMD dot per visible key in position order, the
//! same softmax, one axpy per key): its result depends only on its own query, its position
//! and the cached rows it sees — never on how many rows the call has, which other sequences
//! share it, whether its prompt was chunked, or whether its prefix came from the prefix
//! cache. Prefill rows cost O(context) dots each instead of a `gemm`, which the batched
//! engine accepts for bit-identical output under any batching.

use std::cell::RefCell;
use std::ops::Range;

use super::attention::rows::{attend_heads, CachedRows, GroupParts, HeadRow, MAX_HEADS_PER_TASK};
use super::attention::{AttentionShape, AttentionVariant};
use super::kv_blocks::{KvBlocks, KvBlocksMut, MAX_HEAD_DIM};
use crate::pool;
use crate::pool::OutPtr;
use crate::quant::Isa;
use crate::TensorError;

/// Query rows of one sequence per task: small, so a long prefill chunk spreads over threads.
const ROWS_PER_TASK: usize = 8;

thread_local! {
    static SCORES: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// The rows of one sequence in a batched call.
#[derive(Debug, Clone)]
pub struct PagedSpan<'a> {
    /// Rows of `q` / `out` that belong to this sequence (consecutive positions).
    pub rows: Range<usize>,
    /// Positions cached before this call: the first row's position.
    pub past: usize,
    /// The sequence's block table; it must cover positions `0..past + rows.len()`.
    pub blocks: &'a [u32],
}

impl PagedSpan<'_> {
    /// Positions the sequence holds after this call.
    pub fn context(&self) -> usize {
        self.past + self.rows.len()
    }
}

fn shape_error(detail: String) -> TensorError {
    TensorError::Shape { op: "paged_attention", detail }
}

/// Index of the first element of position `p`'s row, checked against the storage.
fn row_start(
    blocks: &[u32],
    block_size: usize,
    width: usize,
    p: usize,
    storage_len: usize,
) -> Result<usize, TensorError> {
    let block = *blocks.get(p / block_size).ok_or_else(|| {
        shape_error(format!("position {p} is past the block table ({} blocks of {block_size})", blocks.len()))
    })?;
    let row = (block as usize)
        .checked_mul(block_size)
        .and_then(|r| r.checked_add(p % block_size))
        .ok_or_else(|| shape_error(format!("block {block} overflows")))?;
    let start = row.checked_mul(width).ok_or_else(|| shape_error(format!("block {block} overflows")))?;
    if start + width > storage_len {
        return Err(shape_error(format!("block {block} is outside the cache ({storage_len} elements)")));
    }
    Ok(start)
}

/// Writes `rows` (`[n, width]`, positions `past..past + n` of a sequence) into its blocks;
/// f16 storage rounds to nearest even.
pub fn write_paged(
    dst: &mut KvBlocksMut<'_>,
    width: usize,
    block_size: usize,
    blocks: &[u32],
    past: usize,
    rows: &[f32],
) -> Result<(), TensorError> {
    if width == 0 || block_size == 0 || !rows.len().is_multiple_of(width) {
        return Err(shape_error(format!("{} values are not rows of {width}", rows.len())));
    }
    let len = match dst {
        KvBlocksMut::F32(d) => d.len(),
        KvBlocksMut::F16(d) => d.len(),
        KvBlocksMut::Fp8 { codes, group, .. } => {
            if *group == 0 || !width.is_multiple_of(*group) {
                return Err(shape_error(format!("FP8 groups of {group} elements do not split rows of {width}")));
            }
            codes.len()
        }
    };
    let isa = crate::quant::Isa::active();
    for (i, row) in rows.chunks_exact(width).enumerate() {
        let start = row_start(blocks, block_size, width, past + i, len)?;
        match dst {
            KvBlocksMut::F32(d) => d[start..start + width].copy_from_slice(row),
            // The contiguous cache's conversion (`half`'s bits), one row on this thread.
            KvBlocksMut::F16(d) => crate::f16_rows::narrow_at(isa, row, &mut d[start..start + width]),
            KvBlocksMut::Fp8 { codes, scales, group } => {
                let (g, n) = (start / *group, width / *group);
                crate::fp8::quantize_rows_e4m3(row, *group, &mut codes[start..start + width], &mut scales[g..g + n])?;
            }
        }
    }
    Ok(())
}

/// Attention of every span's query rows over its own cached keys and values (this call's
/// rows must already be written, see [`write_paged`]).
///
/// * `q`, `out`: `[rows, n_heads * head_dim]`, the spans' rows together;
/// * `probs`: when given, `[n_heads, rows, ctx_max]` with `ctx_max` the largest span
///   context; each row holds its probabilities at its positions, zeros elsewhere.
#[allow(clippy::too_many_arguments)]
pub fn paged_attention(
    shape: AttentionShape,
    variant: AttentionVariant,
    q: &[f32],
    keys: KvBlocks<'_>,
    values: KvBlocks<'_>,
    block_size: usize,
    spans: &[PagedSpan<'_>],
    out: &mut [f32],
    probs: Option<&mut [f32]>,
) -> Result<(), TensorError> {
    let AttentionShape { n_heads, n_kv_heads, head_dim, scale, softcap } = shape;
    let q_width = n_heads * head_dim;
    let kv_width = n_kv_heads * head_dim;
    if n_kv_heads == 0 || n_heads % n_kv_heads != 0 || q_width == 0 || head_dim > MAX_HEAD_DIM || block_size == 0 {
        return Err(shape_error(format!(
            "{n_heads} query heads, {n_kv_heads} kv heads of {head_dim}, blocks of {block_size}"
        )));
    }
    if !q.len().is_multiple_of(q_width) || out.len() != q.len() || keys.len() != values.len() {
        return Err(shape_error(format!(
            "q {} elements, out {}, keys {}, values {}",
            q.len(),
            out.len(),
            keys.len(),
            values.len()
        )));
    }
    let total_rows = q.len() / q_width;
    let ctx_max = spans.iter().map(PagedSpan::context).max().unwrap_or(0);
    // Every position a span reads must be in its table and inside the storage: check once
    // here so the parallel tasks only index.
    for span in spans {
        if span.rows.end > total_rows || span.rows.start > span.rows.end {
            return Err(shape_error(format!("span rows {:?} outside the call's {total_rows} rows", span.rows)));
        }
        let ctx = span.context();
        if ctx > 0 {
            row_start(span.blocks, block_size, kv_width, ctx - 1, keys.len())?;
        }
        for &b in &span.blocks[..ctx.div_ceil(block_size).min(span.blocks.len())] {
            if (b as usize + 1) * block_size * kv_width > keys.len() {
                return Err(shape_error(format!("block {b} is outside the cache ({} elements)", keys.len())));
            }
        }
    }
    if let Some(p) = &probs {
        if p.len() != n_heads * total_rows * ctx_max {
            return Err(shape_error(format!(
                "probs has {} elements, expected {n_heads}x{total_rows}x{ctx_max}",
                p.len()
            )));
        }
    }
    let group = n_heads / n_kv_heads;
    let isa = Isa::active();
    // Tasks: (span, kv head, part of its group, chunk of rows). A part's heads read each
    // cached row once for all of them (`attend_heads`).
    let chunks: usize = spans.iter().map(|span| span.rows.len().div_ceil(ROWS_PER_TASK)).sum();
    let parts = GroupParts::new(group, n_kv_heads * chunks);
    let head_of = |kv_h: usize, i: usize| variant.head_map.query_head(kv_h, i, group, n_kv_heads);
    let mut tasks: Vec<(u32, u32, u32, u32)> = Vec::new();
    for (s, span) in spans.iter().enumerate() {
        for kv_h in 0..n_kv_heads {
            for part in 0..parts.count() {
                for c in 0..span.rows.len().div_ceil(ROWS_PER_TASK) {
                    tasks.push((s as u32, kv_h as u32, part as u32, c as u32));
                }
            }
        }
    }
    let out_ptr = OutPtr(out.as_mut_ptr());
    let probs_ptr = probs.map(|p| {
        p.fill(0.0);
        OutPtr(p.as_mut_ptr())
    });
    pool::run(tasks.len(), &|task| {
        let (s, kv_h, part, chunk) = tasks[task];
        let (span, kv_h) = (&spans[s as usize], kv_h as usize);
        let heads = parts.heads(part as usize);
        let first = span.rows.start + chunk as usize * ROWS_PER_TASK;
        let rows = first..(first + ROWS_PER_TASK).min(span.rows.end);
        // First element of kv head `kv_h` at position `p` of this span (in range: checked for
        // the span's last position before the tasks ran).
        let head_start = |p: usize| {
            span.blocks[p / block_size] as usize * block_size * kv_width + (p % block_size) * kv_width + kv_h * head_dim
        };
        let mut kv_row = [0f32; MAX_HEAD_DIM];
        let kv_row = &mut kv_row[..head_dim];
        let ctx = span.context();
        SCORES.with(|cell| {
            let mut scores = cell.borrow_mut();
            if scores.len() < heads.len() * ctx {
                scores.resize((heads.len() * ctx).next_power_of_two(), 0.0);
            }
            for r in rows {
                let position = span.past + (r - span.rows.start);
                let visible = variant.mask.visible(position, ctx);
                let mut slots: [HeadRow<'_>; MAX_HEADS_PER_TASK] = std::array::from_fn(|_| HeadRow::empty());
                for ((slot, scores), i) in slots.iter_mut().zip(scores.chunks_exact_mut(ctx)).zip(heads.clone()) {
                    let h = head_of(kv_h, i);
                    let scores = &mut scores[..visible.end];
                    scores[..visible.start].fill(0.0);
                    // SAFETY: row r, head h of `out` ([rows, q_width]) belongs to this task alone
                    // (each head is in one part of one kv head's group); out.len() == q.len()
                    // was checked above.
                    let o = unsafe {
                        std::slice::from_raw_parts_mut(out_ptr.get().add(r * q_width + h * head_dim), head_dim)
                    };
                    *slot = HeadRow { q: &q[r * q_width + h * head_dim..][..head_dim], scores, o };
                }
                let head_rows = &mut slots[..heads.len()];
                let cached = CachedRows { keys: &keys, values: &values, start_of: head_start };
                attend_heads(isa, head_rows, &cached, visible.clone(), scale, softcap, kv_row);
                if let Some(pp) = probs_ptr {
                    for (row, i) in head_rows.iter().zip(heads.clone()) {
                        let h = head_of(kv_h, i);
                        // SAFETY: row (h, r) of probs ([n_heads, rows, ctx_max]) belongs to
                        // this task alone; visible.end <= ctx_max; the length was checked above.
                        let prow = unsafe {
                            std::slice::from_raw_parts_mut(pp.get().add((h * total_rows + r) * ctx_max), visible.end)
                        };
                        prow.copy_from_slice(row.scores);
                    }
                }
            }
        });
    });
    Ok(())
}

#[cfg(test)]
mod tests {
    use half::f16;

    use super::*;
    use crate::ops::attention::rows::{axpy, axpy_cached, dot, dot_cached};
    use crate::ops::attention::{self, AttentionMask, HeadMap};
    use crate::testing::signed;

    const SHAPE: AttentionShape =
        AttentionShape { n_heads: 4, n_kv_heads: 2, head_dim: 16, scale: 0.25, softcap: None };

    /// Scatters contiguous rows into blocks following `table`.
    fn paged(rows: &[f32], width: usize, bs: usize, table: &[u32], n_blocks: usize) -> Vec<f32> {
        let mut store = vec![f32::NAN; n_blocks * bs * width];
        write_paged(&mut KvBlocksMut::F32(&mut store), width, bs, table, 0, rows).unwrap();
        store
    }

    #[test]
    fn f32_pages_equal_the_contiguous_decode_path_bit_for_bit() {
        let (ctx, bs) = (21, 4);
        let kvw = SHAPE.n_kv_heads * SHAPE.head_dim;
        let qw = SHAPE.n_heads * SHAPE.head_dim;
        let (k, v) = (signed(ctx * kvw, 1), signed(ctx * kvw, 2));
        let q = signed(qw, 3);
        // Blocks out of order, as a block manager hands them out.
        let table = [5u32, 0, 3, 1, 6, 2];
        let (kp, vp) = (paged(&k, kvw, bs, &table, 7), paged(&v, kvw, bs, &table, 7));
        // A sliding window starting mid-block, and one wider than the context; with and
        // without soft-capped scores (Gemma 2), which the paged path must cap alike.
        let capped = AttentionShape { scale: 2.0, softcap: Some(1.5), ..SHAPE };
        for shape in [SHAPE, capped] {
            for mask in [AttentionMask::Causal, AttentionMask::SlidingWindow(6), AttentionMask::SlidingWindow(40)] {
                let variant = AttentionVariant { mask, ..Default::default() };
                let mut want = vec![0f32; qw];
                attention::attention(shape, variant, &q, &k, &v, ctx, &mut want, None).unwrap();
                let mut got = vec![0f32; qw];
                let span = PagedSpan { rows: 0..1, past: ctx - 1, blocks: &table };
                paged_attention(
                    shape,
                    variant,
                    &q,
                    KvBlocks::F32(&kp),
                    KvBlocks::F32(&vp),
                    bs,
                    &[span],
                    &mut got,
                    None,
                )
                .unwrap();
                assert_eq!(
                    got.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                    want.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                    "{shape:?} {mask:?}"
                );
            }
        }
        // The cap changes the result (the test can see it).
        let run = |shape: AttentionShape| {
            let mut out = vec![0f32; qw];
            attention::causal_attention(shape, &q, &k, &v, ctx, &mut out, None).unwrap();
            out
        };
        assert_ne!(run(capped), run(AttentionShape { softcap: None, ..capped }));
        // The window changes the result (the test can see it).
        let mut causal = vec![0f32; qw];
        attention::causal_attention(SHAPE, &q, &k, &v, ctx, &mut causal, None).unwrap();
        let mut windowed = vec![0f32; qw];
        attention::attention(
            SHAPE,
            AttentionVariant { mask: AttentionMask::SlidingWindow(6), ..Default::default() },
            &q,
            &k,
            &v,
            ctx,
            &mut windowed,
            None,
        )
        .unwrap();
        assert_ne!(causal, windowed);
    }

    /// FP8 pages (a scale per 16 elements, blocks out of order) give the contiguous
    /// attention of the same rows widened, bit for bit.
    #[test]
    fn fp8_pages_equal_the_contiguous_path_over_their_widened_rows() {
        let (ctx, bs, group) = (21, 4, 16);
        let kvw = SHAPE.n_kv_heads * SHAPE.head_dim;
        let qw = SHAPE.n_heads * SHAPE.head_dim;
        let (k, v) = (signed(ctx * kvw, 1), signed(ctx * kvw, 2));
        let q = signed(qw, 3);
        let table = [5u32, 0, 3, 1, 6, 2];
        let n = 7 * bs * kvw;
        let (mut kc, mut ks, mut vc, mut vs) =
            (vec![0u8; n], vec![0f32; n / group], vec![0u8; n], vec![0f32; n / group]);
        write_paged(&mut KvBlocksMut::Fp8 { codes: &mut kc, scales: &mut ks, group }, kvw, bs, &table, 0, &k).unwrap();
        write_paged(&mut KvBlocksMut::Fp8 { codes: &mut vc, scales: &mut vs, group }, kvw, bs, &table, 0, &v).unwrap();
        let (kb, vb) =
            (KvBlocks::Fp8 { codes: &kc, scales: &ks, group }, KvBlocks::Fp8 { codes: &vc, scales: &vs, group });
        // The rows in position order, widened.
        let widen = |b: &KvBlocks<'_>| {
            let mut rows = vec![0f32; ctx * kvw];
            for p in 0..ctx {
                let start = (table[p / bs] as usize * bs + p % bs) * kvw;
                b.widen_into(start, &mut rows[p * kvw..(p + 1) * kvw]);
            }
            rows
        };
        let (kw, vw) = (widen(&kb), widen(&vb));
        for (a, b) in kw.iter().zip(&k) {
            assert!((a - b).abs() <= 0.07, "E4M3 keeps 3 mantissa bits: {a} vs {b}");
        }
        let mut want = vec![0f32; qw];
        attention::causal_attention(SHAPE, &q, &kw, &vw, ctx, &mut want, None).unwrap();
        let mut got = vec![0f32; qw];
        let span = PagedSpan { rows: 0..1, past: ctx - 1, blocks: &table };
        paged_attention(SHAPE, AttentionVariant::default(), &q, kb, vb, bs, &[span], &mut got, None).unwrap();
        assert_eq!(
            got.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            want.iter().map(|x| x.to_bits()).collect::<Vec<_>>()
        );
        // A group that does not split the rows is refused.
        assert!(write_paged(
            &mut KvBlocksMut::Fp8 { codes: &mut kc, scales: &mut ks, group: 7 },
            kvw,
            bs,
            &table,
            0,
            &k
        )
        .is_err());
    }

    /// Wide GQA groups (Qwen2.5-0.5B: 14 query heads on 2 kv heads, run as parts of 4 + 3),
    /// both head maps, f16 pages: every row of a prefill span has the bits of the contiguous
    /// decode path run for that row alone.
    #[test]
    fn grouped_heads_equal_the_contiguous_decode_path_row_by_row() {
        let shape = AttentionShape { n_heads: 14, n_kv_heads: 2, head_dim: 64, scale: 0.125, softcap: None };
        let (ctx, bs) = (11, 4);
        let kvw = shape.n_kv_heads * shape.head_dim;
        let qw = shape.n_heads * shape.head_dim;
        let (k, v) = (signed(ctx * kvw, 21), signed(ctx * kvw, 22));
        let table = [2u32, 0, 1];
        let (mut k16, mut v16) = (vec![f16::ZERO; 3 * bs * kvw], vec![f16::ZERO; 3 * bs * kvw]);
        write_paged(&mut KvBlocksMut::F16(&mut k16), kvw, bs, &table, 0, &k).unwrap();
        write_paged(&mut KvBlocksMut::F16(&mut v16), kvw, bs, &table, 0, &v).unwrap();
        let (kc, vc): (Vec<f16>, Vec<f16>) =
            (k.iter().map(|&x| f16::from_f32(x)).collect(), v.iter().map(|&x| f16::from_f32(x)).collect());
        let q = signed(ctx * qw, 23);
        for head_map in [HeadMap::Grouped, HeadMap::Modulo] {
            let variant = AttentionVariant { head_map, ..Default::default() };
            let mut got = vec![0f32; ctx * qw];
            let span = PagedSpan { rows: 0..ctx, past: 0, blocks: &table };
            paged_attention(shape, variant, &q, KvBlocks::F16(&k16), KvBlocks::F16(&v16), bs, &[span], &mut got, None)
                .unwrap();
            for t in 0..ctx {
                let mut want = vec![0f32; qw];
                attention::attention_cached(
                    shape,
                    variant,
                    &q[t * qw..(t + 1) * qw],
                    KvBlocks::F16(&kc),
                    KvBlocks::F16(&vc),
                    t + 1,
                    &mut want,
                    None,
                )
                .unwrap();
                let bits = |x: &[f32]| x.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&got[t * qw..(t + 1) * qw]), bits(&want), "{head_map:?} row {t}");
            }
        }
    }

    #[test]
    fn a_row_does_not_depend_on_its_neighbours_or_its_chunk() {
        let bs = 4;
        let kvw = SHAPE.n_kv_heads * SHAPE.head_dim;
        let qw = SHAPE.n_heads * SHAPE.head_dim;
        let ctx = 13;
        let (k, v) = (signed(ctx * kvw, 4), signed(ctx * kvw, 5));
        let table = [3u32, 1, 0, 2];
        let mut k16 = vec![f16::ZERO; 4 * bs * kvw];
        let mut v16 = vec![f16::ZERO; 4 * bs * kvw];
        write_paged(&mut KvBlocksMut::F16(&mut k16), kvw, bs, &table, 0, &k).unwrap();
        write_paged(&mut KvBlocksMut::F16(&mut v16), kvw, bs, &table, 0, &v).unwrap();
        let q = signed(ctx * qw, 6);
        let run = |spans: &[PagedSpan<'_>], q: &[f32]| {
            let mut out = vec![0f32; q.len()];
            paged_attention(
                SHAPE,
                AttentionVariant::default(),
                q,
                KvBlocks::F16(&k16),
                KvBlocks::F16(&v16),
                bs,
                spans,
                &mut out,
                None,
            )
            .unwrap();
            out
        };
        // The whole sequence as one prefill.
        let whole = run(&[PagedSpan { rows: 0..ctx, past: 0, blocks: &table }], &q);
        // As a 5-row chunk after 8 cached positions, next to another sequence's decode row.
        let other_table = [0u32];
        let mut q2 = signed(qw, 9);
        q2.extend_from_slice(&q[8 * qw..]);
        let mixed = run(
            &[
                PagedSpan { rows: 0..1, past: 0, blocks: &other_table },
                PagedSpan { rows: 1..6, past: 8, blocks: &table },
            ],
            &q2,
        );
        assert_eq!(
            whole[8 * qw..].iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            mixed[qw..].iter().map(|x| x.to_bits()).collect::<Vec<_>>()
        );
        // f16 storage stays close to f32.
        let mut f32_out = vec![0f32; ctx * qw];
        attention::causal_attention(SHAPE, &q, &k, &v, ctx, &mut f32_out, None).unwrap();
        for (a, b) in whole.iter().zip(&f32_out) {
            assert!((a - b).abs() < 2e-3, "{a} vs {b}");
        }
    }

    #[test]
    fn f16_rows_in_registers_equal_widening_first() {
        for n in [64usize, 80, 16, 7, 128] {
            let q = signed(n, 11);
            let k: Vec<f16> = signed(n, 12).iter().map(|&x| f16::from_f32(x)).collect();
            let wide: Vec<f32> = k.iter().map(|x| x.to_f32()).collect();
            let mut scratch = vec![0f32; n];
            for isa in Isa::available() {
                let got = dot_cached(isa, &q, &KvBlocks::F16(&k), 0, &mut scratch);
                assert_eq!(got.to_bits(), dot(isa, &q, &wide).to_bits(), "dot n={n} {isa:?}");
                let (mut a, mut b) = (signed(n, 13), signed(n, 13));
                axpy_cached(isa, 0.37, &KvBlocks::F16(&k), 0, &mut scratch, &mut a);
                axpy(isa, 0.37, &wide, &mut b);
                assert_eq!(a, b, "axpy n={n} {isa:?}");
            }
        }
    }

    #[test]
    fn probs_rows_sum_to_one_over_visible_positions() {
        let bs = 2;
        let kvw = SHAPE.n_kv_heads * SHAPE.head_dim;
        let qw = SHAPE.n_heads * SHAPE.head_dim;
        let (k, v) = (signed(5 * kvw, 7), signed(5 * kvw, 8));
        let table = [0u32, 1, 2];
        let (kp, vp) = (paged(&k, kvw, bs, &table, 3), paged(&v, kvw, bs, &table, 3));
        let q = signed(2 * qw, 9);
        let span = PagedSpan { rows: 0..2, past: 3, blocks: &table };
        let mut out = vec![0f32; 2 * qw];
        let mut probs = vec![0f32; SHAPE.n_heads * 2 * 5];
        paged_attention(
            SHAPE,
            AttentionVariant::default(),
            &q,
            KvBlocks::F32(&kp),
            KvBlocks::F32(&vp),
            bs,
            &[span],
            &mut out,
            Some(&mut probs),
        )
        .unwrap();
        for h in 0..SHAPE.n_heads {
            let row0 = &probs[(h * 2) * 5..(h * 2 + 1) * 5];
            assert!((row0.iter().sum::<f32>() - 1.0).abs() < 1e-5);
            assert_eq!(row0[4], 0.0, "position 3 cannot see position 4");
        }
    }

    #[test]
    fn bad_tables_are_errors_not_panics() {
        let kvw = SHAPE.n_kv_heads * SHAPE.head_dim;
        let qw = SHAPE.n_heads * SHAPE.head_dim;
        let store = vec![0f32; 2 * 4 * kvw];
        let q = signed(qw, 1);
        let mut out = vec![0f32; qw];
        for (blocks, past) in [(&[0u32][..], 4), (&[9u32][..], 0), (&[][..], 0)] {
            let span = PagedSpan { rows: 0..1, past, blocks };
            assert!(paged_attention(
                SHAPE,
                AttentionVariant::default(),
                &q,
                KvBlocks::F32(&store),
                KvBlocks::F32(&store),
                4,
                &[span],
                &mut out,
                None
            )
            .is_err());
        }
        let mut dst = vec![0f32; 4 * kvw];
        assert!(write_paged(&mut KvBlocksMut::F32(&mut dst), kvw, 4, &[1], 0, &signed(kvw, 1)).is_err());
    }
}
