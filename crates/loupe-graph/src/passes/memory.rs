//! The `plan-memory` pass: a buffer slot per value, reused once the value is dead.
//!
//! A value is live from the node that writes it to its last reader. Slots are handed out
//! in execution order; a node's output (and side output) get their slots before the slots
//! of inputs it reads for the last time are freed, so no kernel writes over its own input.
//! Values nobody reads (side outputs, tapped-only values) free their slot right after their
//! node. The logits keep their slot: the executor hands them out after the run.
//!
//! **Which free slot.** A slot's buffer grows to the largest value it ever holds and keeps
//! that capacity, so the plan's memory is the sum of each slot's largest value. A value takes
//! the smallest free slot that already holds one at least its size (best fit), else the
//! largest free slot (which grows the least); sizes are compared at [`PLAN_TOKENS`] rows and
//! context. Handed out last-freed-first instead, the MLP's wide values wander over every
//! slot: Qwen2.5-0.5B's six slots would all hold 4,864 floats per prompt row where three
//! suffice (BENCHMARKS.md, "2026-11-30 (night)": prefill buffers planned by size).

use crate::ir::{Graph, MemoryPlan, ValueInfo};

/// Rows and context at which values' sizes are compared ([`plan_memory`]): a long prompt,
/// where the buffers are largest. Any value gives a correct plan; it only ranks sizes.
const PLAN_TOKENS: usize = 512;

/// Elements of `v` at [`PLAN_TOKENS`] rows and context.
fn plan_size(v: &ValueInfo) -> usize {
    v.concrete_shape(PLAN_TOKENS, PLAN_TOKENS).into_iter().fold(1, usize::saturating_mul)
}

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
    // Free slots, and each slot's largest value so far.
    let mut free: Vec<u32> = Vec::new();
    let mut largest: Vec<usize> = Vec::new();
    let mut take = |free: &mut Vec<u32>, size: usize| {
        let fits = free
            .iter()
            .enumerate()
            .filter(|(_, &s)| largest[s as usize] >= size)
            .min_by_key(|(_, &s)| largest[s as usize]);
        let pick = fits.or_else(|| free.iter().enumerate().max_by_key(|(_, &s)| largest[s as usize]));
        let s = match pick.map(|(at, _)| at) {
            Some(at) => free.swap_remove(at),
            None => {
                largest.push(0);
                (largest.len() - 1) as u32
            }
        };
        largest[s as usize] = largest[s as usize].max(size);
        s
    };
    for (i, node) in graph.nodes.iter().enumerate() {
        let outs = std::iter::once(node.output).chain(node.side);
        for v in outs.clone() {
            // A side output nobody reads is written only when a tap observes it (attention's
            // probabilities, the SwiGLU's activation): it does not size its slot.
            let observed_only = node.side == Some(v) && last_use[v.0 as usize].is_none();
            slot[v.0 as usize] = take(&mut free, if observed_only { 0 } else { plan_size(graph.value(v)) });
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
    let n_slots = slot.iter().filter(|&&s| s != u32::MAX).map(|&s| s as usize + 1).max().unwrap_or(0);
    MemoryPlan { slot, n_slots }
}
