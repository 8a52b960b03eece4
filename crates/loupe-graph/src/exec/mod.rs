//! The CPU executor: runs nodes in order over the buffer slots of the memory plan (a slot
//! is reused once its value's last reader has run), and shows each computed value to an
//! [`Observer`]. The `LOUPE_DEBUG` checks (nan-check, uninitialized-read-check, op-log-level,
//! assert-level) run around each kernel call when on.
//!
//! Taps cannot change the numbers: the observer gets a shared slice after the node has
//! written it, and buffer reuse depends only on the graph, never on what is observed.

use loupe_tensor::linear::{matmul_f32, matmul_q};
use loupe_tensor::pool;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use loupe_tensor::linear::{can_group, matmul_f32_invariant, matmul_wq_group, matmul_wq_invariant, MAX_GROUP};
use loupe_tensor::linear::{can_group_prefill, matmul_wq_prefill_group};
use loupe_tensor::linear::{dequantize_row_fast, matmul_wq};
use loupe_tensor::ops::{
    add_in_place, add_into, attention_cached, expert_id, gelu, layer_norm, mul_in_place, mul_into, paged_attention,
    rms_norm, round_bf16, router_select, router_weights, silu, silu_mul_into, slice_columns, soft_cap, PagedSpan,
};
use loupe_tensor::TensorError;

use crate::debug::{AssertLevel, DebugOptions, UninitMode};
use crate::ir::{Graph, Node, Op, Plant, ValueInfo, WeightData};
use crate::passes::plan_memory;
use crate::profile::{node_cost, AttnWork, Profiler, StepProfile, TraceEvent};
use crate::verify::row_width;
use crate::{FaultClass, GraphError, KvCache, KvWrite, PagedKvCache};

/// Looks at values as the executor computes them.
pub trait Observer {
    /// Whether to call [`Observer::observe`] for this value (asked once per value per run).
    fn wants(&mut self, value: &ValueInfo) -> bool;
    /// The value's data, row-major in `shape`, right after its node ran.
    fn observe(&mut self, value: &ValueInfo, shape: &[usize], data: &[f32]);
}

/// Per-call options.
#[derive(Debug, Clone, Copy, Default)]
pub struct RunOptions {
    /// Compute logits for every token of the call (teacher forcing, dumps) rather than only
    /// the last one (generation).
    pub all_logits: bool,
}

/// One sequence's rows in a batched step ([`Executor::run_batch`]).
#[derive(Debug, Clone, Copy)]
pub struct BatchSpan<'a> {
    /// Tokens of this sequence in the step (a prefill chunk, or 1 in decode).
    pub len: usize,
    /// Positions of the sequence already cached: the first token's position.
    pub past: usize,
    /// The sequence's block table in the paged cache; it covers `past + len` positions.
    pub blocks: &'a [u32],
    /// Whether the step returns logits for this sequence's last token.
    pub logits: bool,
}

/// Where a run reads and writes keys and values.
enum StepKv<'k, 's> {
    /// One sequence, contiguous cache, `past` positions before the call.
    Single { kv: &'k mut KvCache, past: usize },
    /// Many sequences over a paged cache; `rows[i]` are span i's rows of the step.
    Batch { kv: &'k mut PagedKvCache, spans: Vec<PagedSpan<'s>>, logit_rows: Vec<usize> },
}

/// Reusable execution state for one graph.
#[derive(Debug, Default)]
pub struct Executor {
    /// Buffer slots of the memory plan; a slot's capacity grows to its largest value and is
    /// then reused, so a warm decode loop allocates nothing.
    slots: Vec<Vec<f32>>,
    /// Slot of each value (the graph's `plan-memory` result, or planned here).
    slot_of: Vec<u32>,
    /// Per slot, how many leading elements of its buffer's allocation hold values written
    /// before (past the buffer's length too): growing within them needs no clearing
    /// ([`loupe_tensor::ops::resize_for_overwrite_within`]). 0 while a slot's buffer is taken
    /// out, so a buffer dropped on an error path never leaves a stale mark.
    slot_init: Vec<usize>,
    /// Per value, whether it holds only the logits' rows ([`Graph::logit_rows_values`]).
    on_logit_rows: Vec<bool>,
    quant_scratch: Vec<u8>,
    /// The rows of the logits' input gathered for a batched step.
    gathered: Vec<f32>,
    logits: Vec<f32>,
    debug: ExecDebug,
    /// Nodes run so far (all runs): `nan-check-stride` counts kernel outputs across calls.
    ops_run: u64,
    /// `uninitialized-read-mode=report`: values computed from poison in this run. NaN
    /// arithmetic carries the poison's bit pattern on, so their own reads are not reported
    /// again: each report names a value that really was left unwritten.
    tainted: Vec<bool>,
    /// Linear nodes run inside a grouped decode matmul so far (all runs).
    grouped_linears: u64,
    /// `--profile`: where each step's timings go ([`crate::profile`]).
    profiler: Option<Profiler>,
    /// The current step's timings, merged into `profiler` when the step ends.
    step_profile: StepProfile,
    /// Trace names of grouped decode matmuls, by their first node.
    group_names: HashMap<usize, Arc<str>>,
}

/// The `LOUPE_DEBUG` options the executor acts on, copied into plain fields once, so an
/// option that is off costs one branch per node (`any`) and nothing else.
#[derive(Debug, Clone, Default)]
struct ExecDebug {
    any: bool,
    nan_check: bool,
    nan_stride: u64,
    uninit: bool,
    uninit_abort: bool,
    op_log: bool,
    source: bool,
    asserts: AssertLevel,
}

/// The poison that `uninitialized-read-check` fills fresh buffers with: all bytes 0xFF, as
/// MAX does on the host (a NaN no kernel produces from real inputs).
const POISON_BITS: u32 = 0xFFFF_FFFF;

impl ExecDebug {
    fn from_options(o: &DebugOptions) -> ExecDebug {
        let asserts = o.assert_level;
        let op_log = o.op_log_level.logs_ops();
        ExecDebug {
            any: o.nan_check || o.uninitialized_read_check || op_log || asserts != AssertLevel::None,
            nan_check: o.nan_check,
            nan_stride: u64::from(o.nan_check_stride.max(1)),
            uninit: o.uninitialized_read_check,
            uninit_abort: o.uninitialized_read_mode == UninitMode::Abort,
            op_log,
            source: o.source_tracebacks,
            asserts,
        }
    }
}

impl Executor {
    /// An executor for `graph` under the given debug options (copied into plain flags now;
    /// `DebugOptions::default()` turns every check off).
    pub fn new(graph: &Graph, debug: &DebugOptions) -> Executor {
        let plan = match &graph.memory_plan {
            Some(p) if p.slot.len() == graph.values.len() => p.clone(),
            _ => plan_memory(graph),
        };
        Executor {
            slots: vec![Vec::new(); plan.n_slots],
            slot_init: vec![0; plan.n_slots],
            slot_of: plan.slot,
            on_logit_rows: graph.logit_rows_values(),
            quant_scratch: Vec::new(),
            gathered: Vec::new(),
            logits: Vec::new(),
            debug: ExecDebug::from_options(debug),
            ops_run: 0,
            grouped_linears: 0,
            tainted: Vec::new(),
            profiler: None,
            step_profile: StepProfile::default(),
            group_names: HashMap::new(),
        }
    }

    /// Profiles every step from now on into `profiler` (and turns on the compute pool's job
    /// tracing, which is process-wide); `None` stops.
    pub fn set_profiler(&mut self, profiler: Option<Profiler>) {
        if profiler.is_some() {
            pool::set_tracing(true);
        }
        self.profiler = profiler;
    }

    /// How many linear nodes ran inside a grouped decode matmul (q/k/v, gate/up sharing one
    /// fork-join), over every call so far: what tests and profiles check the grouping by.
    pub fn grouped_linears(&self) -> u64 {
        self.grouped_linears
    }

    /// Runs the graph on `tokens`, appending to `kv`, and returns the logits: one row of
    /// `vocab` per token with `all_logits`, else the last token's row.
    pub fn run(
        &mut self,
        graph: &Graph,
        tokens: &[u32],
        kv: &mut KvCache,
        options: RunOptions,
        observer: Option<&mut dyn Observer>,
    ) -> Result<&[f32], GraphError> {
        if tokens.is_empty() {
            return Err(GraphError::Input("no tokens to run".into()));
        }
        kv.check_room(tokens.len())?;
        let past = kv.len();
        // An encoder's output is every token's hidden state.
        let logit_rows = if options.all_logits || graph.encoder { tokens.len() } else { 1 };
        let mut step = StepKv::Single { kv, past };
        let attn = AttnWork::causal(past, tokens.len());
        self.run_step(graph, tokens, &mut step, past + tokens.len(), logit_rows, attn, observer)?;
        if let StepKv::Single { kv, .. } = step {
            kv.commit(tokens.len());
        }
        Ok(&self.logits)
    }

    /// One batched step: `tokens` holds the spans' tokens one after the other (span `i`'s
    /// rows follow span `i - 1`'s). Keys and values go into each span's blocks of `kv`;
    /// every op computes each row with arithmetic that does not depend on the other rows
    /// (row-local kernels, paged attention per row), so a sequence's numbers are the same
    /// in any batch. Returns one row of logits per span with `logits`, in span order.
    ///
    /// Observers see each value for the whole step (`[tokens, ...]`; attention
    /// probabilities `[heads, tokens, longest context]`).
    pub fn run_batch(
        &mut self,
        graph: &Graph,
        tokens: &[u32],
        spans: &[BatchSpan<'_>],
        kv: &mut PagedKvCache,
        observer: Option<&mut dyn Observer>,
    ) -> Result<&[f32], GraphError> {
        if tokens.is_empty() {
            return Err(GraphError::Input("no tokens to run".into()));
        }
        if graph.encoder {
            return Err(GraphError::Input(
                "the batched engine runs decoders; an encoder runs one sequence at a time".into(),
            ));
        }
        let total: usize = spans.iter().map(|s| s.len).sum();
        if total != tokens.len() || spans.iter().any(|s| s.len == 0) {
            return Err(GraphError::Input(format!(
                "{} tokens but the spans cover {total} (every span needs a token)",
                tokens.len()
            )));
        }
        if kv.layers() != graph.kv_layers || kv.width() != graph.kv_width {
            return Err(GraphError::Input(format!(
                "paged cache has {} layers of width {}, the graph needs {} of {}",
                kv.layers(),
                kv.width(),
                graph.kv_layers,
                graph.kv_width
            )));
        }
        if let Some(node) = graph
            .nodes
            .iter()
            .find(|n| matches!(n.op, Op::Attention { kv_write: KvWrite::OneLate | KvWrite::OneLateAtDecode, .. }))
        {
            return Err(GraphError::Input(format!(
                "'{}' carries the kv-write fault, which the batched engine does not plant",
                graph.value(node.output).name
            )));
        }
        let mut paged = Vec::with_capacity(spans.len());
        let mut logit_rows = Vec::new();
        let mut attn = AttnWork::default();
        let mut row = 0;
        let mut context = 0;
        for span in spans {
            let end = span.past + span.len;
            if end > graph.context_length {
                return Err(GraphError::ContextOverflow { needed: end, capacity: graph.context_length });
            }
            if span.blocks.len() * kv.block_size() < end {
                return Err(GraphError::Input(format!(
                    "a block table of {} blocks cannot hold {end} positions",
                    span.blocks.len()
                )));
            }
            paged.push(PagedSpan { rows: row..row + span.len, past: span.past, blocks: span.blocks });
            attn = attn.plus(AttnWork::causal(span.past, span.len));
            row += span.len;
            context = context.max(end);
            if span.logits {
                logit_rows.push(row - 1);
            }
        }
        let n_logits = logit_rows.len();
        let mut step = StepKv::Batch { kv, spans: paged, logit_rows };
        self.run_step(graph, tokens, &mut step, context, n_logits, attn, observer)?;
        Ok(&self.logits)
    }

    /// The node loop shared by [`Executor::run`] and [`Executor::run_batch`]: `context` is
    /// the longest context of the step, `logit_rows` the rows the logits node computes,
    /// `attn` what attention reads (for the profiler).
    #[allow(clippy::too_many_arguments)]
    fn run_step(
        &mut self,
        graph: &Graph,
        tokens: &[u32],
        step: &mut StepKv<'_, '_>,
        context: usize,
        logit_rows: usize,
        attn: AttnWork,
        mut observer: Option<&mut dyn Observer>,
    ) -> Result<(), GraphError> {
        let step_start = self.profiler.is_some().then(pool::trace_now);
        if step_start.is_some() {
            self.step_profile.prepare(graph);
        }
        let logits_id = graph.logits.ok_or_else(|| GraphError::Input("graph has no logits".into()))?;
        if self.slot_of.len() != graph.values.len() {
            return Err(GraphError::Input(format!(
                "executor planned for {} values, graph has {}",
                self.slot_of.len(),
                graph.values.len()
            )));
        }
        let n_tokens = tokens.len();
        let fill = if self.debug.uninit { f32::from_bits(POISON_BITS) } else { 0.0 };
        if self.debug.uninit {
            self.tainted.clear();
            self.tainted.resize(graph.values.len(), false);
        }

        let mut next = 0;
        while next < graph.nodes.len() {
            let i = next;
            let node = &graph.nodes[i];
            let group = self.linear_group(graph, i, n_tokens, step);
            if group > 1 {
                let t0 = self.profile_start(i);
                self.run_linear_group(graph, i, group, n_tokens, context, observer.as_deref_mut())?;
                if let Some(t0) = t0 {
                    self.profile_group(graph, i, group, n_tokens, t0);
                }
                next += group;
                continue;
            }
            next += 1;
            let info = graph.value(node.output);
            let width =
                row_width(info).ok_or_else(|| GraphError::Input(format!("value {} has no row width", info.name)))?;
            let on_logit_rows = self.on_logit_rows.get(node.output.0 as usize).copied().unwrap_or(false);
            let rows = if on_logit_rows { logit_rows } else { n_tokens };
            // The node that selects the logits' rows from every token's (lm_head's linear).
            let gathers = on_logit_rows && !node.inputs.first().is_some_and(|i| self.on_logit_rows[i.0 as usize]);
            let out_slot = self.slot_of[node.output.0 as usize] as usize;
            let (mut out, mut out_init) = self.take_slot(out_slot);
            if self.debug.uninit
                || node.fault.is_some()
                || !writes_every_element(&node.op, matches!(step, StepKv::Single { .. }))
            {
                let capacity = out.capacity();
                loupe_tensor::ops::resize_filled(&mut out, rows * width, fill);
                // A reallocation (the capacity grew) holds only what was just written.
                out_init = if out.capacity() == capacity { out_init.max(out.len()) } else { out.len() };
            } else {
                // The kernel overwrites all of it: keep the slot's old (initialized) values
                // rather than zeroing every prefill activation first (a pass over each
                // node's output, ~5% of SmolLM2's prefill in perf).
                // SAFETY: out_init is this buffer's mark, kept by take_slot/put_slot.
                unsafe { loupe_tensor::ops::resize_for_overwrite_within(&mut out, rows * width, &mut out_init) };
            }
            let side = match (node.side, observer.as_deref_mut()) {
                (Some(s), Some(obs)) => obs.wants(graph.value(s)).then_some(s),
                _ => None,
            };
            let mut side_buf = side.map(|s| self.take_slot(self.slot_of[s.0 as usize] as usize).0);
            let started = if self.debug.any { self.before_node(graph, i, node, n_tokens)? } else { None };
            let t0 = self.profile_start(i);
            self.exec_node(graph, node, tokens, step, rows, gathers, &mut out, side_buf.as_mut()).map_err(
                |source| GraphError::Kernel {
                    op: node.op.name(),
                    name: info.name.clone(),
                    location: info.location.to_string(),
                    source,
                },
            )?;
            if let Some(t0) = t0 {
                let (bytes, flops) = node_cost(graph, node, rows, attn);
                self.profile_node(i, node.op.name(), t0, bytes, flops);
            }
            if self.debug.any {
                self.after_node(i, node, info, &out, started)?;
            }
            if let (Some(s), Some(buf), Some(obs)) = (side, side_buf.as_ref(), observer.as_deref_mut()) {
                let sinfo = graph.value(s);
                obs.observe(sinfo, &sinfo.concrete_shape(n_tokens, context), buf);
            }
            if let Some(obs) = observer.as_deref_mut() {
                if obs.wants(info) {
                    let mut shape = info.concrete_shape(rows, context);
                    if shape.first() == Some(&n_tokens) {
                        shape[0] = rows;
                    }
                    obs.observe(info, &shape, &out);
                }
            }
            self.put_slot(out_slot, out, out_init);
            if let (Some(s), Some(buf)) = (side, side_buf) {
                // Resized by its kernel: only its length is known to be written.
                let init = buf.len();
                self.put_slot(self.slot_of[s.0 as usize] as usize, buf, init);
            }
        }
        // The logits change places with the previous call's buffer: both keep their capacity.
        let logits_slot = self.slot_of[logits_id.0 as usize] as usize;
        std::mem::swap(&mut self.slots[logits_slot], &mut self.logits);
        self.slot_init[logits_slot] = self.slots[logits_slot].len();
        if let (Some(start), Some(p)) = (step_start, self.profiler.as_ref()) {
            let sp = &mut self.step_profile;
            sp.nanos = pool::trace_now().saturating_sub(start);
            sp.threads = sp.threads.max(1);
            sp.add_worker_spans(pool::take_spans());
            p.merge(sp);
        }
        Ok(())
    }

    /// Takes slot `s`'s buffer out with its initialized mark, leaving an empty buffer and a
    /// mark of 0 (what stays if the buffer is dropped on an error path).
    fn take_slot(&mut self, s: usize) -> (Vec<f32>, usize) {
        (std::mem::take(&mut self.slots[s]), std::mem::take(&mut self.slot_init[s]))
    }

    /// Puts a buffer back into slot `s` with the count of leading elements of its allocation
    /// written so far.
    fn put_slot(&mut self, s: usize, buf: Vec<f32>, initialized: usize) {
        self.slots[s] = buf;
        self.slot_init[s] = initialized;
    }

    /// Profiling: labels the pool's jobs with node `i` and returns the start time.
    fn profile_start(&self, i: usize) -> Option<u64> {
        self.profiler.as_ref()?;
        pool::set_trace_label(i as u32);
        Some(pool::trace_now())
    }

    /// Profiling: node `i` ran from `t0` until now.
    fn profile_node(&mut self, i: usize, op: &'static str, t0: u64, bytes: u64, flops: u64) {
        let dur = pool::trace_now().saturating_sub(t0);
        let sp = &mut self.step_profile;
        sp.add(i, dur, bytes, flops);
        let name = sp.names[i].clone();
        sp.events.push(TraceEvent { name, op, thread: 0, start_ns: t0, dur_ns: dur });
    }

    /// Profiling: a grouped decode matmul of `count` linears from node `i` ran from `t0`
    /// until now; its time is split by weight bytes, and the trace shows one span.
    fn profile_group(&mut self, graph: &Graph, i: usize, count: usize, rows: usize, t0: u64) {
        let dur = pool::trace_now().saturating_sub(t0);
        let nodes = &graph.nodes[i..i + count];
        let costs: Vec<(u64, u64)> = nodes.iter().map(|n| node_cost(graph, n, rows, AttnWork::default())).collect();
        let total_bytes: u64 = costs.iter().map(|c| c.0).sum::<u64>().max(1);
        for (j, (bytes, flops)) in costs.into_iter().enumerate() {
            let share = (dur as u128 * bytes as u128 / total_bytes as u128) as u64;
            self.step_profile.add(i + j, share, bytes, flops);
        }
        let name = self
            .group_names
            .entry(i)
            .or_insert_with(|| format!("{} (+{} grouped)", graph.value(nodes[0].output).name, count - 1).into())
            .clone();
        self.step_profile.events.push(TraceEvent { name, op: "linear_group", thread: 0, start_ns: t0, dur_ns: dur });
    }

    /// How many nodes from `i` on run as one [`matmul_wq_group`] (decode, in either engine:
    /// one row through it has the bits of one row through `matmul_wq_invariant`) or
    /// [`matmul_wq_prefill_group`] (single-sequence prefill on AMX): consecutive linears
    /// (native precision, no bias, no planted fault,
    /// not the logits) reading the same input, each of a type the grouped kernel takes,
    /// each writing its own buffer slot. 1 when node `i` does not start such a run, and
    /// always with a debug option on (those check node by node). The grouped kernel gives
    /// every output the bits of its own matmul, so this changes the cost (one fork-join for
    /// q/k/v, one for gate/up), never the numbers.
    fn linear_group(&self, graph: &Graph, i: usize, n_tokens: usize, step: &StepKv<'_, '_>) -> usize {
        // The batched engine groups its one-row steps only: the prefill group's AMX bits
        // are not the multi-row kernels' (a row's bits must not depend on its batch).
        if self.debug.any
            || n_tokens == 0
            || graph.quantize_activations
            || !(matches!(step, StepKv::Single { .. }) || n_tokens == 1)
        {
            return 1;
        }
        let first = &graph.nodes[i];
        let input = match first.inputs.first() {
            Some(&v) => v,
            None => return 1,
        };
        let k = match row_width(graph.value(input)) {
            Some(k) => k,
            None => return 1,
        };
        let eligible = |node: &Node| {
            matches!(&node.op, Op::Linear { weight, bias: None }
                if matches!(&graph.weight(*weight).data, WeightData::Quant(q)
                    if if n_tokens == 1 { can_group(q, k) } else { can_group_prefill(q, k, n_tokens) }))
                && node.inputs.len() == 1
                && node.inputs[0] == input
                && node.side.is_none()
                && node.fault.is_none()
                && !self.on_logit_rows[node.output.0 as usize]
        };
        // The input's slot and the outputs' so far (fixed size: decode allocates nothing).
        let mut slots = [self.slot_of[input.0 as usize]; MAX_GROUP + 1];
        let mut n = 0;
        for node in graph.nodes[i..].iter().take(MAX_GROUP) {
            let slot = self.slot_of[node.output.0 as usize];
            if !eligible(node) || slots[..=n].contains(&slot) {
                break;
            }
            n += 1;
            slots[n] = slot;
        }
        n.max(1)
    }

    /// Runs nodes `i..i + count` (a [`Self::linear_group`]) as one grouped matmul, then shows
    /// each output to the observer in node order, as the node-by-node loop would.
    fn run_linear_group<'o>(
        &mut self,
        graph: &Graph,
        i: usize,
        count: usize,
        n_tokens: usize,
        context: usize,
        mut observer: Option<&mut (dyn Observer + 'o)>,
    ) -> Result<(), GraphError> {
        let nodes = &graph.nodes[i..i + count];
        let quant = |node: &Node| match &node.op {
            Op::Linear { weight, .. } => match &graph.weight(*weight).data {
                WeightData::Quant(q) => &**q,
                WeightData::F32(_) => unreachable!("linear_group takes quantized weights only"),
            },
            _ => unreachable!("linear_group takes linears only"),
        };
        // Fixed arrays, not Vecs: a warm decode step allocates nothing (the output buffers
        // are the slots' own, taken out and put back).
        let mut ws = [quant(&nodes[0]); MAX_GROUP];
        let mut outs: [Vec<f32>; MAX_GROUP] = Default::default();
        let mut inits = [0usize; MAX_GROUP];
        for (j, node) in nodes.iter().enumerate() {
            ws[j] = quant(node);
            let (mut out, mut init) = self.take_slot(self.slot_of[node.output.0 as usize] as usize);
            // The grouped kernels write every output element (and a group never forms with
            // a debug option on, so no poison is due): no clearing pass first.
            // SAFETY: init is this buffer's mark, kept by take_slot/put_slot.
            unsafe { loupe_tensor::ops::resize_for_overwrite_within(&mut out, ws[j].rows * n_tokens, &mut init) };
            outs[j] = out;
            inits[j] = init;
        }
        {
            let x = &self.slots[self.slot_of[nodes[0].inputs[0].0 as usize] as usize];
            let mut ys = outs.each_mut().map(|o| o.as_mut_slice());
            let grouped = if n_tokens == 1 {
                matmul_wq_group(x, &ws[..count], &mut ys[..count])
            } else {
                matmul_wq_prefill_group(x, &ws[..count], &mut ys[..count], n_tokens)
            };
            grouped.map_err(|source| {
                let info = graph.value(nodes[0].output);
                GraphError::Kernel {
                    op: nodes[0].op.name(),
                    name: info.name.clone(),
                    location: info.location.to_string(),
                    source,
                }
            })?;
        }
        self.grouped_linears += count as u64;
        for ((node, out), init) in nodes.iter().zip(outs.iter_mut()).zip(inits) {
            let out = std::mem::take(out);
            let info = graph.value(node.output);
            if let Some(obs) = observer.as_deref_mut() {
                if obs.wants(info) {
                    obs.observe(info, &info.concrete_shape(n_tokens, context), &out);
                }
            }
            self.put_slot(self.slot_of[node.output.0 as usize] as usize, out, init);
        }
        Ok(())
    }

    /// Debug checks before a kernel: `op-log-level`'s LAUNCH line, `assert-level`'s input
    /// lengths, `uninitialized-read-check`'s poisoned inputs. Returns the launch time.
    fn before_node(
        &mut self,
        graph: &Graph,
        i: usize,
        node: &Node,
        n_tokens: usize,
    ) -> Result<Option<Instant>, GraphError> {
        let info = graph.value(node.output);
        if self.debug.op_log {
            let at = if self.debug.source { format!(" @ {}", info.location) } else { String::new() };
            eprintln!("[OP] LAUNCH {} [id={i}] target=cpu op={}{at}", info.name, node.op.name());
        }
        if self.debug.asserts != AssertLevel::None {
            for inp in &node.inputs {
                let v = graph.value(*inp);
                let have = self.slots[self.slot_of[inp.0 as usize] as usize].len();
                let want = row_width(v).map(|w| w * n_tokens);
                if want != Some(have) {
                    let msg =
                        format!("input '{}' holds {have} values, its shape [T={n_tokens}, ...] needs {want:?}", v.name);
                    self.assert_failed(node, info, msg)?;
                }
            }
        }
        if self.debug.uninit {
            for inp in &node.inputs {
                if self.tainted[inp.0 as usize] {
                    self.tainted[node.output.0 as usize] = true;
                    continue;
                }
                let data = &self.slots[self.slot_of[inp.0 as usize] as usize];
                let poisoned = data.iter().filter(|x| x.to_bits() == POISON_BITS).count();
                if poisoned > 0 {
                    let input = graph.value(*inp);
                    let first = data.iter().position(|x| x.to_bits() == POISON_BITS).unwrap_or(0);
                    let err = GraphError::UninitializedRead {
                        op: node.op.name(),
                        name: info.name.clone(),
                        location: info.location.to_string(),
                        input: format!("'{}' (built at {})", input.name, input.location),
                        poisoned,
                        len: data.len(),
                        first,
                    };
                    if self.debug.uninit_abort {
                        return Err(err);
                    }
                    eprintln!("loupe: warning: {err}");
                    self.tainted[node.output.0 as usize] = true;
                }
            }
        }
        Ok(self.debug.op_log.then(Instant::now))
    }

    /// Debug checks after a kernel: `nan-check` (every stride-th op), `op-log-level`'s
    /// COMPLETE line.
    fn after_node(
        &mut self,
        i: usize,
        node: &Node,
        info: &ValueInfo,
        out: &[f32],
        started: Option<Instant>,
    ) -> Result<(), GraphError> {
        if let Some(t) = started {
            let at = if self.debug.source { format!(" @ {}", info.location) } else { String::new() };
            eprintln!(
                "[OP] COMPLETE {} [id={i}] target=cpu op={} ({:.1} us){at}",
                info.name,
                node.op.name(),
                t.elapsed().as_secs_f64() * 1e6
            );
        }
        if self.debug.nan_check {
            self.ops_run += 1;
            if self.ops_run.is_multiple_of(self.debug.nan_stride) {
                let (mut nans, mut infs, mut first) = (0usize, 0usize, None);
                for (k, x) in out.iter().enumerate() {
                    if !x.is_finite() {
                        if x.is_nan() {
                            nans += 1;
                        } else {
                            infs += 1;
                        }
                        first.get_or_insert(k);
                    }
                }
                if let Some(first) = first {
                    let width = row_width(info).unwrap_or(1).max(1);
                    return Err(GraphError::NanCheck {
                        op: node.op.name(),
                        name: info.name.clone(),
                        location: info.location.to_string(),
                        nans,
                        infs,
                        len: out.len(),
                        first: (first / width, first % width),
                    });
                }
            }
        }
        Ok(())
    }

    fn assert_failed(&self, node: &Node, info: &ValueInfo, detail: String) -> Result<(), GraphError> {
        let err = GraphError::Assert {
            op: node.op.name(),
            name: info.name.clone(),
            location: info.location.to_string(),
            detail,
        };
        if self.debug.asserts == AssertLevel::Warn {
            eprintln!("loupe: warning: {err}");
            Ok(())
        } else {
            Err(err)
        }
    }

    fn input(&self, node: &Node, k: usize) -> &[f32] {
        &self.slots[self.slot_of[node.inputs[k].0 as usize] as usize]
    }

    /// Runs one node into `out` (`rows` rows). `gathers`: the node reads every token's rows
    /// and computes only the logits' rows (the last one, or each span's in a batched step).
    #[allow(clippy::too_many_arguments)]
    fn exec_node(
        &mut self,
        graph: &Graph,
        node: &Node,
        tokens: &[u32],
        step: &mut StepKv<'_, '_>,
        rows: usize,
        gathers: bool,
        out: &mut [f32],
        side: Option<&mut Vec<f32>>,
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
                            detail: format!(
                                "token id {id} at position {t} is outside the vocabulary of {}",
                                w.shape[0]
                            ),
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
                layer_norm(self.input(node, 0), w, b, *eps, out)
            }
            Op::RmsNorm { weight, eps } => {
                let w = match &graph.weight(*weight).data {
                    WeightData::F32(d) => d,
                    WeightData::Quant(q) => {
                        return Err(TensorError::UnsupportedType { op: "rms_norm weight", dtype: q.ty })
                    }
                };
                if node.fault == Some(FaultClass::BatchReduction) && matches!(step, StepKv::Batch { .. }) {
                    crate::fault::rms_norm_over_step(self.input(node, 0), w, *eps, out);
                    return Ok(());
                }
                rms_norm(self.input(node, 0), w, *eps, out)
            }
            Op::Linear { weight, bias } => {
                let w = graph.weight(*weight);
                let (n, k) = (w.shape[0], w.shape[1]);
                let x_all = &self.slots[self.slot_of[node.inputs[0].0 as usize] as usize];
                // --precision fp8: the input as FP8 E4M3 holds it, one scale per token.
                let fp8_x;
                let x_all: &[f32] = if graph.fp8_activations && crate::ir::is_fp8_linear(&w.name) {
                    fp8_x = loupe_tensor::fp8::round_trip_rows_e4m3(x_all, k)?;
                    &fp8_x
                } else {
                    x_all
                };
                match step {
                    StepKv::Single { .. } => {
                        // The logits of generation need only the last token's row.
                        let x = &x_all[x_all.len() - rows * k..];
                        match &w.data {
                            WeightData::F32(d) => matmul_f32(x, d, out, rows, k, n)?,
                            WeightData::Quant(q) if graph.quantize_activations => {
                                matmul_q(x, q, out, rows, &mut self.quant_scratch)?
                            }
                            WeightData::Quant(q) => matmul_wq(x, q, out, rows)?,
                        }
                    }
                    StepKv::Batch { logit_rows, .. } => {
                        let x = if gathers {
                            self.gathered.clear();
                            for &r in logit_rows.iter() {
                                self.gathered.extend_from_slice(&x_all[r * k..(r + 1) * k]);
                            }
                            &self.gathered[..]
                        } else {
                            x_all
                        };
                        matmul_rows_invariant(
                            x,
                            &w.data,
                            graph.quantize_activations,
                            out,
                            rows,
                            k,
                            n,
                            &mut self.quant_scratch,
                        )?;
                    }
                }
                if let Some(b) = bias {
                    if let WeightData::F32(b) = &graph.weight(*b).data {
                        for row in out.chunks_exact_mut(n) {
                            add_in_place(row, b);
                        }
                    }
                }
                Ok(())
            }
            Op::Rope { n_heads, table, mode } => match step {
                StepKv::Single { past, .. } => table.apply_mode_into(self.input(node, 0), out, *n_heads, *past, *mode),
                StepKv::Batch { spans, .. } => {
                    out.copy_from_slice(self.input(node, 0));
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
                let slot = |k: usize| self.slot_of[node.inputs[k].0 as usize] as usize;
                let (q, k, v) = (&self.slots[slot(0)], &self.slots[slot(1)], &self.slots[slot(2)]);
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
                        let width = k.len() / tokens.len();
                        for span in spans.iter() {
                            let rows = span.rows.start * width..span.rows.end * width;
                            kv.write(*layer, span.blocks, span.past, &k[rows.clone()], &v[rows])?;
                        }
                        let ctx_max = spans.iter().map(PagedSpan::context).max().unwrap_or(0);
                        let probs = side.map(|buf| {
                            buf.clear();
                            buf.resize(shape.n_heads * tokens.len() * ctx_max, 0.0);
                            buf.as_mut_slice()
                        });
                        let (keys, values) = kv.layer(*layer).ok_or_else(|| TensorError::Shape {
                            op: "attention",
                            detail: format!("layer {layer} has no paged cache"),
                        })?;
                        if node.fault == Some(FaultClass::BlockTable) {
                            let tables =
                                crate::fault::stale_block_tables(&spans.iter().map(|s| s.blocks).collect::<Vec<_>>());
                            let stale: Vec<PagedSpan<'_>> = spans
                                .iter()
                                .zip(&tables)
                                .map(|(s, t)| PagedSpan { rows: s.rows.clone(), past: s.past, blocks: t })
                                .collect();
                            return paged_attention(
                                *shape,
                                *variant,
                                q,
                                keys,
                                values,
                                kv.block_size(),
                                &stale,
                                out,
                                probs,
                            );
                        }
                        paged_attention(*shape, *variant, q, keys, values, kv.block_size(), spans, out, probs)
                    }
                }
            }
            Op::Silu => {
                out.copy_from_slice(self.input(node, 0));
                silu(out);
                Ok(())
            }
            Op::Gelu { tanh } => {
                out.copy_from_slice(self.input(node, 0));
                gelu(out, *tanh);
                Ok(())
            }
            Op::Copy => {
                out.copy_from_slice(self.input(node, 0));
                Ok(())
            }
            Op::RoundBf16 => {
                out.copy_from_slice(self.input(node, 0));
                round_bf16(out);
                Ok(())
            }
            Op::Scale { factor } => {
                for (o, x) in out.iter_mut().zip(self.input(node, 0)) {
                    *o = x * factor;
                }
                Ok(())
            }
            Op::SoftCap { cap } => {
                // Row-local: on the logits' rows its input holds exactly those rows.
                let x = self.input(node, 0);
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
                let x = self.input(node, 0);
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
                mul_into(self.input(node, 0), self.input(node, 1), out)?;
                Ok(())
            }
            Op::Add => {
                add_into(self.input(node, 0), self.input(node, 1), out)?;
                Ok(())
            }
            Op::SwiGlu => {
                match side {
                    // Observed: the activation goes through the side buffer, with the same
                    // arithmetic as the unfused silu then mul (tested bit-identical).
                    Some(act) => {
                        act.clear();
                        act.extend_from_slice(self.input(node, 0));
                        silu(act);
                        mul_into(act, self.input(node, 1), out)?;
                    }
                    None => silu_mul_into(self.input(node, 0), self.input(node, 1), out)?,
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
                router_select(router, self.input(node, 0), bias, out)
            }
            Op::RouterWeights { router } => router_weights(router, self.input(node, 0), self.input(node, 1), out),
            Op::Experts { experts, gelu_tanh } => {
                let batch = matches!(step, StepKv::Batch { .. });
                let (x, ids, weights) =
                    (self.input(node, 0).to_vec(), self.input(node, 1).to_vec(), self.input(node, 2).to_vec());
                run_experts(graph, experts, *gelu_tanh, &x, &ids, &weights, out, batch, &mut self.quant_scratch)
            }
            Op::Plant(plant) => {
                let x = self.input(node, 0);
                match plant {
                    Plant::NanInf => {
                        out.copy_from_slice(x);
                        if let Some(v) = out.get_mut(0) {
                            *v = f32::NAN;
                        }
                        if let Some(v) = out.get_mut(1) {
                            *v = f32::INFINITY;
                        }
                    }
                    Plant::HalfUnwritten => {
                        let half = out.len() / 2;
                        out[..half].copy_from_slice(&x[..half]);
                    }
                }
                Ok(())
            }
        }
    }
}

/// Whether `op`'s kernel writes every element of its output whatever the inputs, so the
/// executor need not clear the buffer first (`uninitialized-read-check` still poisons it, and
/// nodes with a planted fault are cleared as before). A kernel that accumulates into its
/// output, or writes only some rows, must not be listed: it would read a slot's stale values.
/// Attention writes every row of a single sequence's step (each query row and head,
/// `attention_cached`); a batched step's paged kernel writes only its spans' rows.
fn writes_every_element(op: &Op, single_sequence: bool) -> bool {
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

/// The routed experts of [`Op::Experts`]: for each expert in ascending id, the rows of the
/// tokens that chose it are gathered and go through `gate`/`up`, the activation, their
/// product and `down` (the matmuls a linear node would run: row-local ones in batched
/// steps); each result row, times the token's weight for that expert, is added to the
/// token's output row, which starts at zero (`Qwen3MoeExperts.forward`: `zeros_like`, then
/// `index_add_` expert by expert).
#[allow(clippy::too_many_arguments)]
fn run_experts(
    graph: &Graph,
    experts: &[crate::ir::ExpertWeights],
    gelu_tanh: bool,
    x: &[f32],
    ids: &[f32],
    weights: &[f32],
    out: &mut [f32],
    batch: bool,
    scratch: &mut Vec<u8>,
) -> Result<(), TensorError> {
    let quantize_activations = graph.quantize_activations;
    let shape_err = |detail: String| TensorError::Shape { op: "experts", detail };
    let first = experts.first().ok_or_else(|| shape_err("no experts".into()))?;
    let (inter, d) = (graph.weight(first.gate).shape[0], graph.weight(first.gate).shape[1]);
    let tokens = x.len() / d;
    if x.len() != tokens * d
        || out.len() != x.len()
        || tokens == 0
        || !ids.len().is_multiple_of(tokens)
        || weights.len() != ids.len()
    {
        return Err(shape_err(format!(
            "hidden {} (width {d}), ids {}, weights {}, output {}",
            x.len(),
            ids.len(),
            weights.len(),
            out.len()
        )));
    }
    let k = ids.len() / tokens;
    let mut chosen: Vec<Vec<(usize, usize)>> = vec![Vec::new(); experts.len()];
    for (t, row) in ids.chunks_exact(k).enumerate() {
        for (j, &id) in row.iter().enumerate() {
            chosen[expert_id(id, experts.len())?].push((t, j));
        }
    }
    out.iter_mut().for_each(|o| *o = 0.0);
    // `--precision fp8`: each expert matmul's input rows are rounded to FP8 E4M3 per token, as
    // the linear op rounds those of the decoder layers' projections (the experts are
    // `model.layers.*` weights, rounded per row at load).
    let fp8 = graph.fp8_activations && crate::ir::is_fp8_linear(&graph.weight(first.gate).name);
    let matmul = |x: &[f32],
                  w: &WeightData,
                  y: &mut [f32],
                  m: usize,
                  k: usize,
                  n: usize,
                  scratch: &mut Vec<u8>|
     -> Result<(), TensorError> {
        let rounded;
        let x = if fp8 {
            rounded = loupe_tensor::fp8::round_trip_rows_e4m3(x, k)?;
            &rounded[..]
        } else {
            x
        };
        if batch {
            return matmul_rows_invariant(x, w, quantize_activations, y, m, k, n, scratch);
        }
        match w {
            WeightData::F32(data) => matmul_f32(x, data, y, m, k, n),
            WeightData::Quant(q) if quantize_activations => matmul_q(x, q, y, m, scratch),
            WeightData::Quant(q) => matmul_wq(x, q, y, m),
        }
    };
    let (mut xs, mut gate, mut up, mut y) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for (e, rows) in experts.iter().zip(&chosen) {
        if rows.is_empty() {
            continue;
        }
        let m = rows.len();
        xs.clear();
        for &(t, _) in rows {
            xs.extend_from_slice(&x[t * d..(t + 1) * d]);
        }
        gate.resize(m * inter, 0.0);
        up.resize(m * inter, 0.0);
        y.resize(m * d, 0.0);
        matmul(&xs, &graph.weight(e.gate).data, &mut gate, m, d, inter, scratch)?;
        matmul(&xs, &graph.weight(e.up).data, &mut up, m, d, inter, scratch)?;
        if gelu_tanh {
            gelu(&mut gate, true);
        } else {
            silu(&mut gate);
        }
        mul_in_place(&mut gate, &up);
        matmul(&gate, &graph.weight(e.down).data, &mut y, m, inter, d, scratch)?;
        for (r, &(t, j)) in rows.iter().enumerate() {
            let w = weights[t * k + j];
            for (o, v) in out[t * d..(t + 1) * d].iter_mut().zip(&y[r * d..(r + 1) * d]) {
                *o += v * w;
            }
        }
    }
    Ok(())
}

/// `y = x W^T` with each output row computed alone: the result for a row does not depend
/// on `m` or on the other rows (see [`Executor::run_batch`]). Block-quantized weights go
/// through the multi-row kernels of `loupe_tensor::linear::invariant`, which read each weight block once
/// per step for every row; 8-bit activations (`--precision q8`) run one row at a time.
#[allow(clippy::too_many_arguments)]
fn matmul_rows_invariant(
    x: &[f32],
    w: &WeightData,
    quantize_activations: bool,
    y: &mut [f32],
    m: usize,
    k: usize,
    n: usize,
    scratch: &mut Vec<u8>,
) -> Result<(), TensorError> {
    if x.len() != m * k || y.len() != m * n {
        return Err(TensorError::Shape {
            op: "linear",
            detail: format!("x has {} elements and y {}, expected {m}x{k} and {m}x{n}", x.len(), y.len()),
        });
    }
    match w {
        WeightData::F32(d) => matmul_f32_invariant(x, d, y, m, k, n),
        WeightData::Quant(q) if quantize_activations => {
            for (xr, yr) in x.chunks_exact(k).zip(y.chunks_exact_mut(n)) {
                matmul_q(xr, q, yr, 1, scratch)?;
            }
            Ok(())
        }
        WeightData::Quant(q) => matmul_wq_invariant(x, q, y, m),
    }
}

/// Row `r` of an embedding table into `row` (dequantized when the table is block-quantized).
fn table_row(w: &crate::Weight, r: usize, row: &mut [f32]) -> Result<(), TensorError> {
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
