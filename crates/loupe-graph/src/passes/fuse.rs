//! The `fuse` pass: `act = silu(gate); prod = act * up` becomes `prod = swiglu(gate, up)`.
//!
//! Saves one buffer and one pass over `[T, intermediate]` per layer. The fused kernel does
//! the same arithmetic in the same order (`silu` per element, then one multiply), so values
//! are bit-identical. The activation is not lost: it becomes the fused node's side output,
//! which the kernel writes only when an observer taps it (as attention's probabilities), so
//! a tap on `mlp.act_fn` still sees it and cannot change any number.

use crate::ir::{Graph, Node, Op};
use crate::GraphError;

pub fn fuse_swiglu(graph: &mut Graph) -> Result<(), GraphError> {
    let mut readers = vec![0usize; graph.values.len()];
    for node in &graph.nodes {
        for inp in &node.inputs {
            readers[inp.0 as usize] += 1;
        }
    }
    let mut fused_away = vec![false; graph.nodes.len()];
    let mut replaced: Vec<(usize, Node)> = Vec::new();
    for (i, node) in graph.nodes.iter().enumerate() {
        let Op::Mul = node.op else { continue };
        let act = node.inputs[0];
        // The silu node must be the multiply's first input and read by nothing else; a node
        // carrying a planted fault keeps its identity (its IR line says FAULT=).
        let Some((j, act_node)) = graph.nodes[..i].iter().enumerate().rev().find(|(_, n)| n.output == act) else {
            continue;
        };
        let fusable = matches!(act_node.op, Op::Silu)
            && act_node.fault.is_none()
            && act_node.side.is_none()
            && node.fault.is_none()
            && node.side.is_none()
            && readers[act.0 as usize] == 1
            && graph.logits != Some(act);
        if !fusable {
            continue;
        }
        fused_away[j] = true;
        replaced.push((
            i,
            Node {
                op: Op::SwiGlu,
                inputs: vec![act_node.inputs[0], node.inputs[1]],
                output: node.output,
                side: Some(act),
                fault: None,
            },
        ));
    }
    if replaced.is_empty() {
        return Ok(());
    }
    for (i, node) in replaced {
        graph.nodes[i] = node;
    }
    // Per-node decisions made before this pass no longer line up with the nodes.
    graph.kernels.clear();
    graph.groups = None;
    let mut k = 0;
    graph.nodes.retain(|_| {
        k += 1;
        !fused_away[k - 1]
    });
    Ok(())
}
