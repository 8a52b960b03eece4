//! The ops' kernels: one node, given its inputs (in their slots) and the step, into its
//! output buffer. Matmuls run the kernel `select-kernels` chose ([`super::linear`]).

use loupe_tensor::linear::dequantize_row_fast;
use loupe_tensor::ops::{
    add_into, attention_cached, gelu, layer_norm, mul_into, paged_attention, rms_norm, round_bf16, router_select,
    router_weights, silu, silu_mul_into, slice_columns, soft_cap, AttentionShape, AttentionVariant, PagedSpan,
};
use loupe_tensor::TensorError;

use super::linear;
use super::slots::Slots;
use super::step::{Scratch, StepKv};
use crate::ir::{Graph, Node, Op, WeightData};
use crate::kernel::Kernel;
use crate::{KvWrite, PagedKvCache};

/// Runs one node into `out` (`rows` rows). `gathers`: the node reads every token's rows
/// and computes only the logits' rows (the last one, or each span's in a batched step).
#[allow(clippy::too_many_arguments)]
pub(crate) fn exec_node(
    graph: &Graph,
    kernel: Option<&Kernel>,
    node: &Node,
    slots: &Slots,
    tokens: &[u32],
    step: &mut StepKv<'_, '_>,
    rows: usize,
    gathers: bool,
    out: &mut [f32],
    side: Option<&mut Vec<f32>>,
    scratch: &mut Scratch,
) -> Result<(), TensorError> {
    match &node.op {
        Op::Embedding { table, scale } => {
            let w = graph.weight(*table);
            let dim = w.shape[1];
            for (t, (&id, row)) in tokens.iter().zip(out.chunks_exact_mut(dim)).enumerate() {
                let r = id as usize;
                if r >= w.shape[0] {
                    return Err(TensorError::Shape {
                        op: "embedding",
                        detail: format!("token id {id} at position {t} is outside the vocabulary of {}", w.shape[0]),
                    });
                }
                table_row(w, r, row)?;
                // An f32 product after the lookup, as transformers multiplies the
                // embedding's output (`Gemma3TextScaledWordEmbedding.forward`).
                if *scale != 1.0 {
                    row.iter_mut().for_each(|v| *v *= scale);
                }
            }
            Ok(())
        }
        Op::PositionEmbedding { table, offset } => {
            let w = graph.weight(*table);
            let dim = w.shape[1];
            // Each row's position: the cached positions before it in its own sequence.
            let position_of = |t: usize| match &*step {
                StepKv::Single { past, .. } => *past + t,
                StepKv::Batch { spans, .. } => {
                    spans.iter().find(|s| s.rows.contains(&t)).map_or(t, |s| s.past + (t - s.rows.start))
                }
            };
            for (t, row) in out.chunks_exact_mut(dim).enumerate() {
                let r = position_of(t) + offset;
                if r >= w.shape[0] {
                    return Err(TensorError::Shape {
                        op: "position_embedding",
                        detail: format!("position {r} is outside the table of {} positions", w.shape[0]),
                    });
                }
                table_row(w, r, row)?;
            }
            Ok(())
        }
        Op::ConstantEmbedding { table, row: r } => {
            let w = graph.weight(*table);
            let dim = w.shape[1];
            let Some(first) = out.chunks_exact_mut(dim).next() else { return Ok(()) };
            table_row(w, *r, first)?;
            let (first, rest) = out.split_at_mut(dim);
            rest.chunks_exact_mut(dim).for_each(|row| row.copy_from_slice(first));
            Ok(())
        }
        Op::LayerNorm { weight, bias, eps } => {
            let (w, b) = match (&graph.weight(*weight).data, &graph.weight(*bias).data) {
                (WeightData::F32(w), WeightData::F32(b)) => (w, b),
                (WeightData::Quant(q), _) | (_, WeightData::Quant(q)) => {
                    return Err(TensorError::UnsupportedType { op: "layer_norm weight", dtype: q.ty })
                }
            };
            layer_norm(slots.input(node, 0), w, b, *eps, out)
        }
        Op::RmsNorm { weight, eps } => {
            let w = match &graph.weight(*weight).data {
                WeightData::F32(d) => d,
                WeightData::Quant(q) => {
                    return Err(TensorError::UnsupportedType { op: "rms_norm weight", dtype: q.ty })
                }
            };
            rms_norm(slots.input(node, 0), w, *eps, out)
        }
        Op::Linear { weight, bias } => {
            let Some(Kernel::Linear(matmul)) = kernel else { return Err(unselected(node, kernel)) };
            let batch = match &*step {
                StepKv::Single { .. } => None,
                StepKv::Batch { logit_rows, prompt_rows, argmax_only, .. } => Some(linear::BatchRows {
                    gather: gathers.then_some(&logit_rows[..]),
                    prompt: prompt_rows,
                    // Only where this node's output is the logits themselves.
                    argmax_only: gathers && *argmax_only && graph.logits == Some(node.output),
                }),
            };
            linear::linear(graph, matmul, *weight, *bias, slots.input(node, 0), out, rows, batch, scratch)
        }
        Op::Rope { n_heads, table, mode } => match step {
            StepKv::Single { past, .. } => table.apply_mode_into(slots.input(node, 0), out, *n_heads, *past, *mode),
            StepKv::Batch { spans, .. } => {
                out.copy_from_slice(slots.input(node, 0));
                let width = out.len() / tokens.len();
                for span in spans.iter() {
                    table.apply_mode(
                        &mut out[span.rows.start * width..span.rows.end * width],
                        *n_heads,
                        span.past,
                        *mode,
                    )?;
                }
                Ok(())
            }
        },
        Op::Attention { layer, shape, variant, kv_write } => {
            let (q, k, v) = (slots.input(node, 0), slots.input(node, 1), slots.input(node, 2));
            match step {
                StepKv::Single { kv, past } => {
                    let (keys, values) = match kv_write {
                        KvWrite::InPlace => kv.append(*layer, k, v),
                        KvWrite::OneLate => kv.append_late(*layer, k, v),
                        KvWrite::OneLateAtDecode => kv.append_late_at_decode(*layer, k, v),
                    };
                    let ctx = *past + tokens.len();
                    let probs = side.map(|buf| {
                        buf.clear();
                        buf.resize(shape.n_heads * tokens.len() * ctx, 0.0);
                        buf.as_mut_slice()
                    });
                    attention_cached(*shape, *variant, q, keys, values, ctx, out, probs)
                }
                StepKv::Batch { kv, spans, .. } => {
                    attention_paged(*layer, *shape, *variant, (q, k, v), kv, spans, spans, out, side)
                }
            }
        }
        Op::Silu => {
            out.copy_from_slice(slots.input(node, 0));
            silu(out);
            Ok(())
        }
        Op::Gelu { tanh } => {
            out.copy_from_slice(slots.input(node, 0));
            gelu(out, *tanh);
            Ok(())
        }
        Op::Copy => {
            out.copy_from_slice(slots.input(node, 0));
            Ok(())
        }
        Op::RoundBf16 => {
            out.copy_from_slice(slots.input(node, 0));
            round_bf16(out);
            Ok(())
        }
        Op::Scale { factor } => {
            for (o, x) in out.iter_mut().zip(slots.input(node, 0)) {
                *o = x * factor;
            }
            Ok(())
        }
        Op::SoftCap { cap } => {
            // Row-local: on the logits' rows its input holds exactly those rows.
            let x = slots.input(node, 0);
            if x.len() != out.len() {
                return Err(TensorError::Shape {
                    op: "soft_cap",
                    detail: format!("input has {} elements, output {}", x.len(), out.len()),
                });
            }
            out.copy_from_slice(x);
            soft_cap(out, *cap);
            Ok(())
        }
        Op::Slice { start, len } => {
            let x = slots.input(node, 0);
            let rows = out.len().checked_div(*len).unwrap_or(0);
            if rows == 0 || !x.len().is_multiple_of(rows) {
                return Err(TensorError::Shape {
                    op: "slice",
                    detail: format!("input of {} elements for {rows} rows", x.len()),
                });
            }
            slice_columns(x, x.len() / rows, *start, *len, out)
        }
        Op::Mul => {
            mul_into(slots.input(node, 0), slots.input(node, 1), out)?;
            Ok(())
        }
        Op::Add => {
            add_into(slots.input(node, 0), slots.input(node, 1), out)?;
            Ok(())
        }
        Op::SwiGlu => {
            match side {
                // Observed: the activation goes through the side buffer, with the same
                // arithmetic as the unfused silu then mul (tested bit-identical).
                Some(act) => {
                    act.clear();
                    act.extend_from_slice(slots.input(node, 0));
                    silu(act);
                    mul_into(act, slots.input(node, 1), out)?;
                }
                None => silu_mul_into(slots.input(node, 0), slots.input(node, 1), out)?,
            }
            Ok(())
        }
        Op::RouterSelect { router, bias } => {
            let bias = match bias.map(|b| &graph.weight(b).data) {
                None => None,
                Some(WeightData::F32(b)) => Some(&b[..]),
                Some(WeightData::Quant(q)) => {
                    return Err(TensorError::UnsupportedType { op: "router correction bias", dtype: q.ty })
                }
            };
            router_select(router, slots.input(node, 0), bias, out)
        }
        Op::RouterWeights { router } => router_weights(router, slots.input(node, 0), slots.input(node, 1), out),
        Op::Experts { experts, gelu_tanh } => {
            let Some(Kernel::Experts { gate, up, down }) = kernel else { return Err(unselected(node, kernel)) };
            let (x, ids, weights) = (slots.input(node, 0), slots.input(node, 1), slots.input(node, 2));
            let batch = step.is_batch();
            linear::experts(
                graph,
                experts,
                [gate, up, down],
                *gelu_tanh,
                x,
                ids,
                weights,
                out,
                batch,
                &mut scratch.quant,
            )
        }
        Op::Plant(plant) => {
            plant.apply(slots.input(node, 0), out);
            Ok(())
        }
    }
}

/// Whether `op`'s kernel writes every element of its output whatever the inputs, so the
/// executor need not clear the buffer first (`uninitialized-read-check` still poisons it, and
/// nodes with a planted fault are cleared as before). A kernel that accumulates into its
/// output, or writes only some rows, must not be listed: it would read a slot's stale values.
/// Attention writes every row of a single sequence's step (each query row and head,
/// `attention_cached`); a batched step's paged kernel writes only its spans' rows.
pub(crate) fn writes_every_element(op: &Op, single_sequence: bool) -> bool {
    (single_sequence && matches!(op, Op::Attention { .. }))
        || matches!(
            op,
            Op::Linear { .. }
                | Op::RmsNorm { .. }
                | Op::LayerNorm { .. }
                | Op::Rope { .. }
                | Op::Silu
                | Op::Gelu { .. }
                | Op::Copy
                | Op::RoundBf16
                | Op::Scale { .. }
                | Op::SoftCap { .. }
                | Op::Mul
                | Op::Add
                | Op::SwiGlu
        )
}

/// Row `r` of an embedding table into `row` (dequantized when the table is block-quantized).
fn table_row(w: &crate::ir::Weight, r: usize, row: &mut [f32]) -> Result<(), TensorError> {
    let dim = w.shape[1];
    match &w.data {
        WeightData::F32(d) => row.copy_from_slice(&d[r * dim..(r + 1) * dim]),
        WeightData::Quant(q) => {
            dequantize_row_fast(q.ty, q.row(r), row)?;
            q.apply_tensor_scale(row);
        }
    }
    Ok(())
}

/// A matmul node whose kernel was not selected as one (or at all).
fn unselected(node: &Node, kernel: Option<&Kernel>) -> TensorError {
    TensorError::Shape {
        op: node.op.name(),
        detail: format!(
            "the selected kernel is {}, not a matmul",
            kernel.map_or("none".into(), |k| k.label(node.op.name()))
        ),
    }
}

/// Attention of a batched step over the paged cache: each span's keys and values are
/// written into its blocks (`spans`), then every row attends through the block tables of
/// `read` (the same spans, except under the planted fault `block-table`).
#[allow(clippy::too_many_arguments)]
pub(crate) fn attention_paged(
    layer: usize,
    shape: AttentionShape,
    variant: AttentionVariant,
    (q, k, v): (&[f32], &[f32], &[f32]),
    kv: &mut PagedKvCache,
    spans: &[PagedSpan<'_>],
    read: &[PagedSpan<'_>],
    out: &mut [f32],
    side: Option<&mut Vec<f32>>,
) -> Result<(), TensorError> {
    let tokens: usize = spans.iter().map(|s| s.rows.len()).sum();
    let width = k.len().checked_div(tokens).unwrap_or(0);
    for span in spans {
        let rows = span.rows.start * width..span.rows.end * width;
        kv.write(layer, span.blocks, span.past, &k[rows.clone()], &v[rows])?;
    }
    let ctx_max = spans.iter().map(PagedSpan::context).max().unwrap_or(0);
    let probs = side.map(|buf| {
        buf.clear();
        buf.resize(shape.n_heads * tokens * ctx_max, 0.0);
        buf.as_mut_slice()
    });
    let (keys, values) = kv
        .layer(layer)
        .ok_or_else(|| TensorError::Shape { op: "attention", detail: format!("layer {layer} has no paged cache") })?;
    paged_attention(shape, variant, q, keys, values, kv.block_size(), read, out, probs)
}
