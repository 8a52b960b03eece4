//! The CPU executor: runs the lowered graph's nodes in order over the buffer slots of the
//! memory plan (a slot is reused once its value's last reader has run), each with the
//! kernel `select-kernels` chose and the linear groups of `schedule`, and shows each
//! computed value to an [`Observer`]. The `LOUPE_DEBUG` checks (nan-check,
//! uninitialized-read-check, op-log-level, assert-level) run around each kernel call when on.
//!
//! Taps cannot change the numbers: the observer gets a shared slice after the node has
//! written it, and buffer reuse depends only on the graph, never on what is observed.
//!
//! | file | what |
//! | --- | --- |
//! | `mod` | [`Executor`]: the runs, the node loop, profiling |
//! | `slots` | the buffer slots and each value's slot |
//! | `step` | where a run's keys and values go (one sequence or a paged batch), scratch |
//! | `checks` | the `LOUPE_DEBUG` checks around a kernel |
//! | `ops` | one node's kernel, by op |
//! | `linear` | the matmul kernels a [`crate::kernel::Matmul`] names: linears, experts |
//! | `group` | a [`crate::kernel::LinearGroup`] as one grouped matmul |
//! | `planted` | the batched engine's planted faults, run in place of their node's kernel |

mod checks;
mod group;
mod linear;
mod ops;
mod planted;
mod slots;
mod step;

use std::collections::HashMap;
use std::sync::Arc;

use loupe_tensor::ops::PagedSpan;
use loupe_tensor::pool;

use crate::debug::DebugOptions;
use crate::ir::{Graph, Op, ValueInfo};
use crate::kernel::Kernel;
use crate::passes::{linear_groups, matmul_precisions, plan_memory, select_kernels};
use crate::profile::{node_cost, AttnWork, Profiler, StepProfile, TraceEvent};
use crate::verify::row_width;
use crate::{GraphError, KvCache, KvWrite, PagedKvCache};
use checks::{ExecDebug, POISON_BITS};
use slots::Slots;
use step::{Scratch, StepKv};

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
    /// How many of the span's last rows return logits: 0 (a prefill chunk before the
    /// prompt's end), 1 (the last token, as generation), or more (speculative
    /// verification: the last token and the drafts after it, each row's logits computed as
    /// a one-token decode would compute them).
    pub logits: usize,
    /// How many of the span's rows, from its first, are prompt tokens: their linears run
    /// through the prompt rows' arithmetic (`loupe_tensor::linear::matmul_wq_prompt` for
    /// block-quantized weights at `--precision native`, `matmul_q_prompt` at 8-bit
    /// activations), the rest through
    /// decode's. A position's arithmetic then depends only on whether it is in its own
    /// sequence's prompt, never on the batch.
    pub prompt_rows: usize,
    /// The caller reads the span's logits only for each row's argmax (greedy sampling with
    /// no penalty, grammar mask or log-probabilities). When every span of a step with two
    /// or more logits rows says so (and no observer watches), a block-quantized `lm_head` at
    /// native arithmetic computes them by `loupe_tensor::linear::screened_argmax_logits`:
    /// native's argmax, bit for bit, at 8-bit arithmetic's cost; the other values are not
    /// native's.
    pub argmax_only: bool,
}

/// Reusable execution state for one graph.
#[derive(Debug, Default)]
pub struct Executor {
    slots: Slots,
    /// The kernel of each node: the graph's `select-kernels` result, or selected here the
    /// same way for a graph that was not lowered. Empty if selection failed (a run then
    /// reports the node).
    kernels: Vec<Kernel>,
    /// Per node, the members of its linear group from it on (0 outside a group): the
    /// graph's `schedule` result, or scheduled here for a graph that was not lowered.
    group_rest: Vec<u8>,
    /// Per value, whether it holds only the logits' rows ([`Graph::logit_rows_values`]).
    on_logit_rows: Vec<bool>,
    scratch: Scratch,
    logits: Vec<f32>,
    debug: ExecDebug,
    /// Linear nodes run inside a grouped matmul so far (all runs).
    grouped_linears: u64,
    /// `--profile`: where each step's timings go ([`crate::profile`]).
    profiler: Option<Profiler>,
    /// The current step's timings, merged into `profiler` when the step ends.
    step_profile: StepProfile,
    /// Trace names of grouped decode matmuls, by their first node.
    group_names: HashMap<usize, Arc<str>>,
}

impl Executor {
    /// An executor for `graph` under the given debug options (copied into plain flags now;
    /// `DebugOptions::default()` turns every check off). It runs the lowering's decisions
    /// (memory plan, kernels, groups) where the graph has them, else makes them with the
    /// passes' own functions.
    pub fn new(graph: &Graph, debug: &DebugOptions) -> Executor {
        let plan = match &graph.memory_plan {
            Some(p) if p.slot.len() == graph.values.len() => p.clone(),
            _ => plan_memory(graph),
        };
        let kernels = if graph.kernels.len() == graph.nodes.len() {
            graph.kernels.clone()
        } else {
            let precision = match graph.precision.len() == graph.weights.len() {
                true => graph.precision.clone(),
                false => matmul_precisions(graph),
            };
            select_kernels(graph, &precision).unwrap_or_default()
        };
        let groups = match &graph.groups {
            Some(g) => g.clone(),
            None => linear_groups(graph, &kernels, &plan),
        };
        Executor {
            group_rest: group::members_from(graph.nodes.len(), &groups),
            slots: Slots::new(plan),
            kernels,
            on_logit_rows: graph.logit_rows_values(),
            scratch: Scratch::default(),
            logits: Vec::new(),
            debug: ExecDebug::from_options(debug),
            grouped_linears: 0,
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

    /// How many linear nodes ran inside a grouped matmul (q/k/v, gate/up sharing one
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

    /// The logits of the last [`Executor::run`] or [`Executor::run_batch`].
    pub fn logits(&self) -> &[f32] {
        &self.logits
    }

    /// One batched step: `tokens` holds the spans' tokens one after the other (span `i`'s
    /// rows follow span `i - 1`'s). Keys and values go into each span's blocks of `kv`;
    /// every op computes each row with arithmetic that does not depend on the other rows
    /// (row-local kernels, paged attention per row), so a sequence's numbers are the same
    /// in any batch. Returns `span.logits` rows of logits per span, in span and row order.
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
        let mut prompt_rows = Vec::with_capacity(tokens.len());
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
            prompt_rows.extend((0..span.len).map(|r| r < span.prompt_rows));
            attn = attn.plus(AttnWork::causal(span.past, span.len));
            row += span.len;
            context = context.max(end);
            if span.logits > span.len {
                return Err(GraphError::Input(format!(
                    "a span of {} rows cannot return logits for {} of them",
                    span.len, span.logits
                )));
            }
            logit_rows.extend(row - span.logits..row);
        }
        let n_logits = logit_rows.len();
        let argmax_only = n_logits >= 2 && observer.is_none() && spans.iter().all(|s| s.logits == 0 || s.argmax_only);
        let mut step = StepKv::Batch { kv, spans: paged, logit_rows, prompt_rows, argmax_only };
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
        if self.slots.slot_of.len() != graph.values.len() || self.group_rest.len() != graph.nodes.len() {
            return Err(GraphError::Input(format!(
                "executor planned for {} values and {} nodes, graph has {} and {}",
                self.slots.slot_of.len(),
                self.group_rest.len(),
                graph.values.len(),
                graph.nodes.len()
            )));
        }
        let n_tokens = tokens.len();
        let fill = if self.debug.uninit { f32::from_bits(POISON_BITS) } else { 0.0 };
        self.debug.start_run(graph.values.len());

        let mut next = 0;
        while next < graph.nodes.len() {
            let i = next;
            let node = &graph.nodes[i];
            let group = self.group_now(graph, i, n_tokens, step);
            if group > 1 {
                let t0 = self.profile_start(i);
                group::run(graph, &graph.nodes[i..i + group], &mut self.slots, n_tokens)?;
                self.grouped_linears += group as u64;
                if let Some(t0) = t0 {
                    self.profile_group(graph, i, group, n_tokens, t0);
                }
                // Each output to the observer in node order, as the node-by-node loop would.
                if let Some(obs) = observer.as_deref_mut() {
                    for node in &graph.nodes[i..i + group] {
                        let info = graph.value(node.output);
                        if obs.wants(info) {
                            obs.observe(info, &info.concrete_shape(n_tokens, context), self.slots.value(node.output));
                        }
                    }
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
            let out_slot = self.slots.of(node.output);
            let (mut out, mut out_init) = self.slots.take(out_slot);
            if self.debug.uninit || node.fault.is_some() || !ops::writes_every_element(&node.op, !step.is_batch()) {
                let capacity = out.capacity();
                loupe_tensor::ops::resize_filled(&mut out, rows * width, fill);
                // A reallocation (the capacity grew) holds only what was just written.
                out_init = if out.capacity() == capacity { out_init.max(out.len()) } else { out.len() };
            } else {
                // The kernel overwrites all of it: keep the slot's old (initialized) values
                // rather than zeroing every prefill activation first (a pass over each
                // node's output, ~5% of SmolLM2's prefill in perf).
                // SAFETY: out_init is this buffer's mark, kept by Slots::take/put.
                unsafe { loupe_tensor::ops::resize_for_overwrite_within(&mut out, rows * width, &mut out_init) };
            }
            let side = match (node.side, observer.as_deref_mut()) {
                (Some(s), Some(obs)) => obs.wants(graph.value(s)).then_some(s),
                _ => None,
            };
            let mut side_buf = side.map(|s| self.slots.take(self.slots.of(s)).0);
            let started = match self.debug.any {
                true => self.debug.before_node(graph, i, node, n_tokens, &self.slots)?,
                false => None,
            };
            let t0 = self.profile_start(i);
            // A batched-engine fault runs in place of the node's kernel; every other node
            // runs the kernel selected for it.
            let ran = match planted::batched_fault(node, step) {
                Some(fault) => planted::run(fault, graph, node, &self.slots, step, &mut out, side_buf.as_mut()),
                None => ops::exec_node(
                    graph,
                    self.kernels.get(i),
                    node,
                    &self.slots,
                    tokens,
                    step,
                    rows,
                    gathers,
                    &mut out,
                    side_buf.as_mut(),
                    &mut self.scratch,
                ),
            };
            ran.map_err(|source| GraphError::Kernel {
                op: node.op.name(),
                name: info.name.clone(),
                location: info.location.to_string(),
                source,
            })?;
            if let Some(t0) = t0 {
                let (bytes, flops) = node_cost(graph, node, rows, attn);
                self.profile_node(i, node.op.name(), t0, bytes, flops);
            }
            if self.debug.any {
                self.debug.after_node(i, node, info, &out, started)?;
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
            self.slots.put(out_slot, out, out_init);
            if let (Some(s), Some(buf)) = (side, side_buf) {
                // Resized by its kernel: only its length is known to be written.
                let init = buf.len();
                self.slots.put(self.slots.of(s), buf, init);
            }
        }
        // The logits change places with the previous call's buffer: both keep their capacity.
        let logits_slot = self.slots.of(logits_id);
        std::mem::swap(&mut self.slots.bufs[logits_slot], &mut self.logits);
        self.slots.init[logits_slot] = self.slots.bufs[logits_slot].len();
        if let (Some(start), Some(p)) = (step_start, self.profiler.as_ref()) {
            let sp = &mut self.step_profile;
            sp.nanos = pool::trace_now().saturating_sub(start);
            sp.threads = sp.threads.max(1);
            sp.add_worker_spans(pool::take_spans());
            p.merge(sp);
        }
        Ok(())
    }

    /// How many linears from node `i` run now as one grouped matmul (1: node `i` runs
    /// alone). The `schedule` pass chose the groups; what depends on the call is checked
    /// here: never with a debug option on (those check node by node), nor in a batched
    /// step's prefill (the prefill group's AMX bits are not the multi-row kernels', and a
    /// row's bits must not depend on its batch), nor for a batched step's one row when it is
    /// a prompt token (a prompt left one row by the prefix cache: the grouped kernel is
    /// decode's, and prompt rows take the prompt arithmetic); in prefill, only the members
    /// the AMX kernel takes at this row count.
    fn group_now(&self, graph: &Graph, i: usize, n_tokens: usize, step: &StepKv<'_, '_>) -> usize {
        let members = usize::from(self.group_rest[i]);
        if members < 2
            || self.debug.any
            || n_tokens == 0
            || (step.is_batch() && (n_tokens > 1 || step.has_prompt_rows()))
        {
            return 1;
        }
        group::runnable(graph, i, members, n_tokens)
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
}
