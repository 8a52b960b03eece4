//! The batched engine's planted faults, run in place of their node's kernel: the executor
//! asks [`batched_fault`] before dispatching a node, so the ops' kernels carry no fault
//! branches. (The graph's own faults are ops and op attributes the builder chose; these two
//! exist only in batched steps, so the node keeps its op and the step decides.)

use loupe_tensor::ops::PagedSpan;
use loupe_tensor::TensorError;

use super::ops::attention_paged;
use super::slots::Slots;
use super::step::StepKv;
use crate::fault::{rms_norm_over_step, stale_block_tables};
use crate::ir::{Graph, Node, Op, WeightData};
use crate::FaultClass;

/// The fault node runs with in this step: a batched-engine class, in a batched step.
pub(crate) fn batched_fault(node: &Node, step: &StepKv<'_, '_>) -> Option<FaultClass> {
    match node.fault {
        Some(f @ (FaultClass::BatchReduction | FaultClass::BlockTable)) if step.is_batch() => Some(f),
        _ => None,
    }
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
            if fault == FaultClass::BlockTable { "attention" } else { "rms_norm" }
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
        _ => Err(misplaced()),
    }
}
