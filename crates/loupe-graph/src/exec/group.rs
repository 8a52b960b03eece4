//! Grouped matmuls: the linears of one [`LinearGroup`] (the `schedule` pass's q/k/v,
//! gate/up) through one `matmul_wq_group` (decode) or `matmul_wq_prefill_group` (a single
//! sequence's prefill on AMX). One fork-join instead of one per linear; every output has
//! the bits of its own matmul.

use loupe_tensor::linear::{can_group_prefill, matmul_wq_group, matmul_wq_prefill_group, QMatrix, MAX_GROUP};
use loupe_tensor::TensorError;

use super::slots::Slots;
use crate::ir::{Graph, Node, Op, WeightData};
use crate::kernel::LinearGroup;
use crate::verify::row_width;
use crate::GraphError;

/// The quantized weight of a grouped linear (the schedule groups no other).
fn quant<'g>(graph: &'g Graph, node: &Node) -> Result<&'g QMatrix, TensorError> {
    match &node.op {
        Op::Linear { weight, bias: None } => match &graph.weight(*weight).data {
            WeightData::Quant(q) => Ok(q),
            WeightData::F32(_) => Err(TensorError::Shape {
                op: "linear_group",
                detail: format!("{} is f32; a group takes block-quantized weights", graph.weight(*weight).name),
            }),
        },
        op => {
            Err(TensorError::Shape { op: "linear_group", detail: format!("a group takes linears, not {}", op.name()) })
        }
    }
}

/// For each node, the members of its group from it on (0 outside a group).
pub(crate) fn members_from(n_nodes: usize, groups: &[LinearGroup]) -> Vec<u8> {
    let mut rest = vec![0u8; n_nodes];
    for g in groups {
        for j in 0..g.len {
            if let Some(r) = rest.get_mut(g.first + j) {
                *r = (g.len - j) as u8;
            }
        }
    }
    rest
}

/// How many of the `members` group members from node `i` run grouped in a call of
/// `n_tokens` rows: all of them in decode, in prefill the leading ones the AMX prefill
/// kernel takes at this row count (at least 2, else 1: node `i` runs alone).
pub(crate) fn runnable(graph: &Graph, i: usize, members: usize, n_tokens: usize) -> usize {
    if n_tokens == 1 {
        return members;
    }
    let nodes = &graph.nodes[i..i + members];
    let k = nodes[0].inputs.first().and_then(|&v| row_width(graph.value(v)));
    let n = nodes
        .iter()
        .take_while(|node| matches!((quant(graph, node), k), (Ok(q), Some(k)) if can_group_prefill(q, k, n_tokens)))
        .count();
    if n >= 2 {
        n
    } else {
        1
    }
}

/// Runs `nodes` (members of one group, all reading `nodes[0]`'s input) as one grouped
/// matmul over `n_tokens` rows, into their slots.
pub(crate) fn run(graph: &Graph, nodes: &[Node], slots: &mut Slots, n_tokens: usize) -> Result<(), GraphError> {
    let kernel_err = |source| {
        let info = graph.value(nodes[0].output);
        GraphError::Kernel { op: "linear", name: info.name.clone(), location: info.location.to_string(), source }
    };
    if nodes.is_empty() || nodes.len() > MAX_GROUP {
        let detail = format!("{} linears (1 to {MAX_GROUP})", nodes.len());
        return Err(GraphError::Input(format!("linear group: {detail}")));
    }
    let first = quant(graph, &nodes[0]).map_err(kernel_err)?;
    // Fixed arrays, not Vecs: a warm decode step allocates nothing (the output buffers are
    // the slots' own, taken out and put back).
    let mut ws = [first; MAX_GROUP];
    for (w, node) in ws.iter_mut().zip(nodes) {
        *w = quant(graph, node).map_err(kernel_err)?;
    }
    let mut outs: [Vec<f32>; MAX_GROUP] = Default::default();
    let mut inits = [0usize; MAX_GROUP];
    for (j, node) in nodes.iter().enumerate() {
        let (mut out, mut init) = slots.take(slots.of(node.output));
        // The grouped kernels write every output element (and a group never runs with a
        // debug option on, so no poison is due): no clearing pass first.
        // SAFETY: init is this buffer's mark, kept by Slots::take/put.
        unsafe { loupe_tensor::ops::resize_for_overwrite_within(&mut out, ws[j].rows * n_tokens, &mut init) };
        outs[j] = out;
        inits[j] = init;
    }
    let count = nodes.len();
    let result = {
        let x = slots.input(&nodes[0], 0);
        let mut ys = outs.each_mut().map(|o| o.as_mut_slice());
        if n_tokens == 1 {
            matmul_wq_group(x, &ws[..count], &mut ys[..count])
        } else {
            matmul_wq_prefill_group(x, &ws[..count], &mut ys[..count], n_tokens)
        }
    };
    // The buffers go back whatever happened, so no slot is left empty.
    for ((node, out), init) in nodes.iter().zip(outs.iter_mut()).zip(inits) {
        let s = slots.of(node.output);
        slots.put(s, std::mem::take(out), init);
    }
    result.map_err(kernel_err)
}
