//! The `plan-memory` pass: a buffer slot per value, reused once the value is dead.
//!
//! A value is live from the node that writes it to its last reader. Slots are handed out
//! in execution order; a node's output (and side output) get their slots before the slots
//! of inputs it reads for the last time are freed, so no kernel writes over its own input.
//! Values nobody reads (side outputs, tapped-only values) free their slot right after their
//! node. The logits keep their slot: the executor hands them out after the run.

use crate::ir::{Graph, MemoryPlan};

/// Plans the slots of `graph` (used by the pass, and by the executor for an unlowered graph).
pub fn plan_memory(graph: &Graph) -> MemoryPlan {
    let n_values = graph.values.len();
    let mut last_use = vec![None::<usize>; n_values];
    for (i, node) in graph.nodes.iter().enumerate() {
        for inp in &node.inputs {
            last_use[inp.0 as usize] = Some(i);
        }
    }
    let mut slot = vec![u32::MAX; n_values];
    let mut free: Vec<u32> = Vec::new();
    let mut n_slots = 0usize;
    let mut take = |free: &mut Vec<u32>| {
        free.pop().unwrap_or_else(|| {
            n_slots += 1;
            (n_slots - 1) as u32
        })
    };
    for (i, node) in graph.nodes.iter().enumerate() {
        let outs = std::iter::once(node.output).chain(node.side);
        for v in outs.clone() {
            slot[v.0 as usize] = take(&mut free);
        }
        let mut release = |v: crate::ValueId| {
            if graph.logits != Some(v) && slot[v.0 as usize] != u32::MAX {
                free.push(slot[v.0 as usize]);
            }
        };
        for (k, inp) in node.inputs.iter().enumerate() {
            // Freed once, at its last reader (an input read twice by one node is one value).
            if last_use[inp.0 as usize] == Some(i) && !node.inputs[..k].contains(inp) {
                release(*inp);
            }
        }
        for v in outs {
            if last_use[v.0 as usize].is_none() {
                release(v);
            }
        }
    }
    MemoryPlan { slot, n_slots }
}
