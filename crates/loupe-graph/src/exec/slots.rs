//! The executor's buffers: one slot per buffer of the memory plan, each value's slot, and
//! how much of each slot's allocation holds values written before.

use crate::ir::{MemoryPlan, Node, ValueId};

#[derive(Debug, Default)]
pub(crate) struct Slots {
    /// Buffer slots of the memory plan; a slot's capacity grows to its largest value and is
    /// then reused, so a warm decode loop allocates nothing.
    pub(crate) bufs: Vec<Vec<f32>>,
    /// Slot of each value (the graph's `plan-memory` result, or planned by the executor).
    pub(crate) slot_of: Vec<u32>,
    /// Per slot, how many leading elements of its buffer's allocation hold values written
    /// before (past the buffer's length too): growing within them needs no clearing
    /// ([`loupe_tensor::ops::resize_for_overwrite_within`]). 0 while a slot's buffer is taken
    /// out, so a buffer dropped on an error path never leaves a stale mark.
    pub(crate) init: Vec<usize>,
}

impl Slots {
    pub(crate) fn new(plan: MemoryPlan) -> Slots {
        Slots { bufs: vec![Vec::new(); plan.n_slots], init: vec![0; plan.n_slots], slot_of: plan.slot }
    }

    /// The slot of value `v`.
    pub(crate) fn of(&self, v: ValueId) -> usize {
        self.slot_of[v.0 as usize] as usize
    }

    /// The data of value `v` (its slot's buffer).
    pub(crate) fn value(&self, v: ValueId) -> &[f32] {
        &self.bufs[self.of(v)]
    }

    /// Input `k` of `node`.
    pub(crate) fn input(&self, node: &Node, k: usize) -> &[f32] {
        self.value(node.inputs[k])
    }

    /// Takes slot `s`'s buffer out with its initialized mark, leaving an empty buffer and a
    /// mark of 0 (what stays if the buffer is dropped on an error path).
    pub(crate) fn take(&mut self, s: usize) -> (Vec<f32>, usize) {
        (std::mem::take(&mut self.bufs[s]), std::mem::take(&mut self.init[s]))
    }

    /// Puts a buffer back into slot `s` with the count of leading elements of its allocation
    /// written so far.
    pub(crate) fn put(&mut self, s: usize, buf: Vec<f32>, initialized: usize) {
        self.bufs[s] = buf;
        self.init[s] = initialized;
    }
}
