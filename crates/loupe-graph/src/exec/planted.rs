//! The batched engine's planted faults, run in place of their node's kernel: the executor
//! asks [`batched_fault`] before dispatching a node, so the ops' kernels carry no fault
//! branches. (The graph's own faults are ops and op attributes the builder chose; these
//! exist only in batched steps, or only in the steps that verify drafts, so the node keeps
//! its op and the step decides.)

use loupe_tensor::ops::PagedSpan;
use loupe_tensor::TensorError;

use super::ops::attention_paged;
use super::slots::Slots;
use super::step::StepKv;
use crate::fault::{rms_norm_over_step, stale_block_tables};
use crate::ir::{Graph, Node, Op, WeightData};
use crate::FaultClass;

/// The fault node runs with in this step: a batched-engine class, in a batched step
/// (`spec-mask`: in a batched step that verifies drafts).
pub(crate) fn batched_fault(node: &Node, step: &StepKv<'_, '_>) -> Option<FaultClass> {
    match (node.fault, step) {
        (Some(f @ (FaultClass::BatchReduction | FaultClass::BlockTable)), _) if step.is_batch() => Some(f),
        (Some(FaultClass::SpecMask), StepKv::Batch { spans, logit_rows, .. })
            if spans.iter().any(|s| verifies_drafts(s, logit_rows)) =>
        {
            Some(FaultClass::SpecMask)
        }
        _ => None,
    }
}

/// Whether `span` verifies drafts: more than one of its rows returns logits (a sequence
/// without drafts returns one, its last row's).
fn verifies_drafts(span: &PagedSpan<'_>, logit_rows: &[usize]) -> bool {
    logit_rows.iter().filter(|r| span.rows.contains(r)).count() > 1
}

/// The attention reads of [`FaultClass::SpecMask`]: each row of a span that verifies drafts
/// reads as if it were the span's last (every position of the step, later drafts included);
/// the other spans read as they are.
fn unmasked_verify_reads<'a>(spans: &[PagedSpan<'a>], logit_rows: &[usize]) -> Vec<PagedSpan<'a>> {
    let mut reads = Vec::with_capacity(spans.len());
    for s in spans {
        if verifies_drafts(s, logit_rows) {
            let last = s.past + s.rows.len() - 1;
            reads.extend(s.rows.clone().map(|r| PagedSpan { rows: r..r + 1, past: last, blocks: s.blocks }));
        } else {
            reads.push(PagedSpan { rows: s.rows.clone(), past: s.past, blocks: s.blocks });
        }
    }
    reads
}

/// Runs `node` with the planted `fault` (from [`batched_fault`]) into `out`.
pub(crate) fn run(
    fault: FaultClass,
    graph: &Graph,
    node: &Node,
    slots: &Slots,
    step: &mut StepKv<'_, '_>,
    out: &mut [f32],
    side: Option<&mut Vec<f32>>,
) -> Result<(), TensorError> {
    let misplaced = || TensorError::Shape {
        op: node.op.name(),
        detail: format!(
            "fault {fault} is planted on {} nodes only",
            if fault == FaultClass::BatchReduction { "rms_norm" } else { "attention" }
        ),
    };
    match (&node.op, step) {
        // The mean square over the step's rows instead of each row's features.
        (Op::RmsNorm { weight, eps }, StepKv::Batch { .. }) if fault == FaultClass::BatchReduction => {
            match &graph.weight(*weight).data {
                WeightData::F32(w) => rms_norm_over_step(slots.input(node, 0), w, *eps, out),
                WeightData::Quant(q) => {
                    return Err(TensorError::UnsupportedType { op: "rms_norm weight", dtype: q.ty })
                }
            }
            Ok(())
        }
        // Keys and values written through the right block tables, read through stale ones.
        (Op::Attention { layer, shape, variant, .. }, StepKv::Batch { kv, spans, .. })
            if fault == FaultClass::BlockTable =>
        {
            let tables = stale_block_tables(&spans.iter().map(|s| s.blocks).collect::<Vec<_>>());
            let stale: Vec<PagedSpan<'_>> = spans
                .iter()
                .zip(&tables)
                .map(|(s, t)| PagedSpan { rows: s.rows.clone(), past: s.past, blocks: t })
                .collect();
            let qkv = (slots.input(node, 0), slots.input(node, 1), slots.input(node, 2));
            attention_paged(*layer, *shape, *variant, qkv, kv, spans, &stale, out, side)
        }
        // Keys and values written as they are; the verifying spans' rows read past their place.
        (Op::Attention { layer, shape, variant, .. }, StepKv::Batch { kv, spans, logit_rows, .. })
            if fault == FaultClass::SpecMask =>
        {
            let reads = unmasked_verify_reads(spans, logit_rows);
            let qkv = (slots.input(node, 0), slots.input(node, 1), slots.input(node, 2));
            attention_paged(*layer, *shape, *variant, qkv, kv, spans, &reads, out, side)
        }
        _ => Err(misplaced()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_spans_that_verify_drafts_read_unmasked() {
        let blocks = [0u32, 1];
        // A sequence decoding one token (row 0), one verifying two drafts (rows 1..4, every
        // row a logits row), one prompt chunk (rows 4..7, its last row a logits row).
        let spans = [
            PagedSpan { rows: 0..1, past: 9, blocks: &blocks },
            PagedSpan { rows: 1..4, past: 5, blocks: &blocks },
            PagedSpan { rows: 4..7, past: 0, blocks: &blocks },
        ];
        let logit_rows = [0, 1, 2, 3, 6];
        assert!(!verifies_drafts(&spans[0], &logit_rows));
        assert!(verifies_drafts(&spans[1], &logit_rows));
        assert!(!verifies_drafts(&spans[2], &logit_rows));
        let reads: Vec<(std::ops::Range<usize>, usize)> =
            unmasked_verify_reads(&spans, &logit_rows).iter().map(|s| (s.rows.clone(), s.past)).collect();
        assert_eq!(reads, vec![(0..1, 9), (1..2, 7), (2..3, 7), (3..4, 7), (4..7, 0)]);
    }
}
