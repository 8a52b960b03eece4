//! The `schedule` pass: which consecutive linears run as one grouped matmul
//! ([`LinearGroup`]). Nodes run in the builder's order, which `verify` proved topological,
//! one op at a time, each op multi-threaded; this pass finds the runs of linears that can
//! share one fork-join: q/k/v and gate/up.
//!
//! A group is up to `MAX_GROUP` consecutive linears with the `Native` kernel and no bias,
//! planted fault or side output, each not the logits' (which compute only the logits'
//! rows), reading the same input, of a type the grouped decode kernel takes
//! ([`can_group`]), each writing its own buffer slot. The executor runs a group as one
//! `matmul_wq_group` in decode and, on AMX, one `matmul_wq_prefill_group` in a
//! single sequence's prefill (for the members that kernel takes at the call's row count);
//! with a debug check on, or in a batched prefill step, it runs the members one by one.

use loupe_tensor::linear::{can_group, MAX_GROUP};

use crate::ir::{Graph, MemoryPlan, Node, Op, WeightData};
use crate::kernel::{Kernel, LinearGroup, MatmulPrecision};
use crate::verify::row_width;
use crate::GraphError;

pub fn schedule_pass(graph: &mut Graph) -> Result<(), GraphError> {
    let plan = match &graph.memory_plan {
        Some(p) if p.slot.len() == graph.values.len() => p.clone(),
        _ => super::plan_memory(graph),
    };
    graph.groups = Some(linear_groups(graph, &graph.kernels, &plan));
    Ok(())
}

/// The grouped runs of `graph` under `kernels` (one per node) and the slots of `plan`.
pub fn linear_groups(graph: &Graph, kernels: &[Kernel], plan: &MemoryPlan) -> Vec<LinearGroup> {
    let logit_rows = graph.logit_rows_values();
    let eligible = |i: usize, node: &Node, input| {
        let Op::Linear { weight, bias: None } = &node.op else { return false };
        // Groups run decode rows (and AMX prefill, which takes no Q6_K): native arithmetic.
        let native = matches!(kernels.get(i), Some(Kernel::Linear(m))
            if matches!(m.precision, MatmulPrecision::Native | MatmulPrecision::NativeQ8Prompt));
        let k = row_width(graph.value(input));
        native
            && matches!((&graph.weight(*weight).data, k), (WeightData::Quant(q), Some(k)) if can_group(q, k))
            && node.inputs.len() == 1
            && node.inputs[0] == input
            && node.side.is_none()
            && node.fault.is_none()
            && !logit_rows[node.output.0 as usize]
    };
    let mut groups = Vec::new();
    let mut i = 0;
    while i < graph.nodes.len() {
        let Some(&input) = graph.nodes[i].inputs.first() else {
            i += 1;
            continue;
        };
        // The input's slot and the outputs' so far: a member never writes a slot the group
        // reads or another member writes.
        let mut slots = vec![plan.slot[input.0 as usize]];
        let mut len = 0;
        for (j, node) in graph.nodes.iter().enumerate().skip(i).take(MAX_GROUP) {
            let slot = plan.slot[node.output.0 as usize];
            if !eligible(j, node, input) || slots.contains(&slot) {
                break;
            }
            slots.push(slot);
            len += 1;
        }
        if len > 1 {
            groups.push(LinearGroup { first: i, len });
            i += len;
        } else {
            i += 1;
        }
    }
    groups
}
