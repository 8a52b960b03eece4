//! The CPU op profiler (`--profile` on `generate`, `bench` and `serve`): per node, by module
//! path and op kind, wall time, calls, bytes read and floating-point operations, hence
//! achieved GB/s and GFLOP/s; a ranked table, and a Chrome trace (`--profile-out`) with one
//! track per compute thread that opens in Perfetto or `chrome://tracing`.
//!
//! An executor given a [`Profiler`] times each node on the calling thread (track 0) and
//! turns on the compute pool's job tracing, which records each worker's share of each job
//! (tracks 1..) under the node that published it. It keeps its counts locally and merges
//! them into the profiler once per step (one lock per step). An executor without one does
//! nothing more than test an `Option` per node.
//!
//! Costs are computed from shapes, not measured: a linear reads its weight's stored bytes
//! plus its input and does `2·rows·n·k` flops; attention reads the keys and values of each
//! sequence's context once (`2·positions·kv_width` elements at the cache's element size) and
//! does `4·heads·head_dim` flops per (query, key) pair its causal mask lets through;
//! elementwise ops and norms read their inputs and do a few flops per element (the
//! per-op constants are in `node_cost`). Grouped decode linears (q/k/v, gate/up) run as one
//! kernel: the group's time is split among its nodes in proportion to their weight bytes,
//! and the trace shows the group as one span.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};

use loupe_tensor::pool::TaskSpan;

use crate::ir::{Graph, Node, Op, WeightData};
use crate::verify::row_width;

/// Most trace events kept (about 40 bytes each); later ones are counted, not kept.
pub const MAX_TRACE_EVENTS: usize = 2_000_000;

/// One node's totals.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NodeStats {
    pub name: String,
    pub op: &'static str,
    pub calls: u64,
    pub nanos: u64,
    pub bytes: u64,
    pub flops: u64,
}

impl NodeStats {
    pub fn gb_per_s(&self) -> f64 {
        if self.nanos == 0 {
            0.0
        } else {
            self.bytes as f64 / self.nanos as f64
        }
    }
    pub fn gflop_per_s(&self) -> f64 {
        if self.nanos == 0 {
            0.0
        } else {
            self.flops as f64 / self.nanos as f64
        }
    }
}

/// One span of the trace: `thread` 0 is the thread that runs the graph, 1.. the pool's
/// workers. Times are nanoseconds since the pool's trace epoch.
#[derive(Debug, Clone, PartialEq)]
pub struct TraceEvent {
    pub name: Arc<str>,
    pub op: &'static str,
    pub thread: u32,
    pub start_ns: u64,
    pub dur_ns: u64,
}

/// Everything profiled so far.
#[derive(Debug, Clone, Default)]
pub struct ProfileData {
    /// By value name; [`ProfileData::ranked`] sorts them.
    pub nodes: HashMap<Arc<str>, NodeStats>,
    /// Graph steps (forward calls) profiled.
    pub steps: u64,
    /// Wall time of those steps.
    pub step_nanos: u64,
    pub events: Vec<TraceEvent>,
    pub dropped_events: u64,
    /// Compute threads seen (the graph's thread and the workers that took part).
    pub threads: u32,
    /// Time the caller attributes to phases of its own, around the graph's steps (the
    /// batched engine's drafting and verification under speculation), in first-seen order.
    pub phases: Vec<PhaseStats>,
}

/// A caller's phase ([`Profiler::add_phase`]): how often it ran and for how long.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PhaseStats {
    pub name: &'static str,
    pub calls: u64,
    pub nanos: u64,
}

/// A shared handle: clone it into every executor to profile, read it when done.
#[derive(Debug, Clone, Default)]
pub struct Profiler(Arc<Mutex<ProfileData>>);

impl Profiler {
    pub fn new() -> Profiler {
        Profiler::default()
    }

    /// A copy of the data so far.
    pub fn snapshot(&self) -> ProfileData {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Adds `calls` runs taking `nanos` in all to the caller's phase `name` (listed under
    /// "by phase" in [`ProfileData::table`]; phases may overlap the graph's nodes).
    pub fn add_phase(&self, name: &'static str, calls: u64, nanos: u64) {
        let mut d = self.0.lock().unwrap_or_else(|e| e.into_inner());
        match d.phases.iter_mut().find(|p| p.name == name) {
            Some(p) => {
                p.calls += calls;
                p.nanos += nanos;
            }
            None => d.phases.push(PhaseStats { name, calls, nanos }),
        }
    }

    /// Adds one step's counts and events, and clears them (keeping the node names).
    pub(crate) fn merge(&self, step: &mut StepProfile) {
        let mut d = self.0.lock().unwrap_or_else(|e| e.into_inner());
        d.steps += 1;
        d.step_nanos += step.nanos;
        for (s, name) in step.nodes.iter_mut().zip(&step.names).filter(|(s, _)| s.calls > 0) {
            let e = d.nodes.entry(name.clone()).or_insert_with(|| NodeStats {
                name: s.name.clone(),
                op: s.op,
                ..NodeStats::default()
            });
            e.calls += s.calls;
            e.nanos += s.nanos;
            e.bytes += s.bytes;
            e.flops += s.flops;
            (s.calls, s.nanos, s.bytes, s.flops) = (0, 0, 0, 0);
        }
        d.threads = d.threads.max(step.threads);
        let room = MAX_TRACE_EVENTS.saturating_sub(d.events.len());
        let n = step.events.len();
        d.events.extend(step.events.drain(..).take(room));
        d.dropped_events += n.saturating_sub(room) as u64;
        step.nanos = 0;
    }
}

/// One step's counts, kept by the executor until the step ends: per node index, and the
/// node names as shared strings (made once, so a step allocates only its events).
#[derive(Debug, Default)]
pub(crate) struct StepProfile {
    pub nodes: Vec<NodeStats>,
    pub names: Vec<Arc<str>>,
    pub events: Vec<TraceEvent>,
    pub nanos: u64,
    pub threads: u32,
}

impl StepProfile {
    /// Sizes the tables for `graph` (once).
    pub fn prepare(&mut self, graph: &Graph) {
        if self.nodes.len() != graph.nodes.len() {
            self.names = graph.nodes.iter().map(|n| Arc::from(graph.value(n.output).name.as_str())).collect();
            self.nodes = graph
                .nodes
                .iter()
                .map(|n| NodeStats {
                    name: graph.value(n.output).name.clone(),
                    op: n.op.name(),
                    ..NodeStats::default()
                })
                .collect();
        }
    }

    /// Node `i` ran for `nanos`.
    pub fn add(&mut self, i: usize, nanos: u64, bytes: u64, flops: u64) {
        if let Some(s) = self.nodes.get_mut(i) {
            s.calls += 1;
            s.nanos += nanos;
            s.bytes += bytes;
            s.flops += flops;
        }
    }

    /// Adds the pool's worker spans, labelled by the node index they were published under.
    pub fn add_worker_spans(&mut self, spans: Vec<TaskSpan>) {
        for s in spans {
            let i = s.label as usize;
            let (name, op) = match (self.names.get(i), self.nodes.get(i)) {
                (Some(n), Some(st)) => (n.clone(), st.op),
                _ => (Arc::from("(outside the graph)"), "job"),
            };
            self.threads = self.threads.max(s.thread + 1);
            self.events.push(TraceEvent {
                name,
                op,
                thread: s.thread,
                start_ns: s.start_ns,
                dur_ns: s.end_ns.saturating_sub(s.start_ns),
            });
        }
    }
}

/// What attention reads in one step: `positions`, the cached positions of every sequence
/// (each read once per step), and `pairs`, the (query row, key position) pairs scored.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AttnWork {
    pub positions: u64,
    pub pairs: u64,
}

impl AttnWork {
    /// One sequence with `past` cached positions and `rows` new ones, causal.
    pub fn causal(past: usize, rows: usize) -> AttnWork {
        let (p, r) = (past as u64, rows as u64);
        AttnWork { positions: p + r, pairs: r * p + r * (r + 1) / 2 }
    }

    pub fn plus(self, o: AttnWork) -> AttnWork {
        AttnWork { positions: self.positions + o.positions, pairs: self.pairs + o.pairs }
    }
}

/// Bytes read and flops of one node over `rows` token rows (see the module docs).
pub fn node_cost(graph: &Graph, node: &Node, rows: usize, attn: AttnWork) -> (u64, u64) {
    let rows = rows as u64;
    let width = |v| row_width(graph.value(v)).unwrap_or(0) as u64;
    let inputs: u64 = node.inputs.iter().map(|&v| width(v)).sum();
    let out = width(node.output);
    let act_bytes = 4 * rows * inputs;
    match &node.op {
        Op::Linear { weight, bias } => {
            let w = graph.weight(*weight);
            let wbytes = match &w.data {
                WeightData::F32(d) => 4 * d.len() as u64,
                WeightData::Quant(q) => q.data.len() as u64,
            };
            let k = inputs;
            let bias_bytes = bias.map_or(0, |_| 4 * out);
            (wbytes + act_bytes + bias_bytes, 2 * rows * out * k)
        }
        Op::Attention { shape, .. } => {
            let kv_elem = graph.kv_dtype.bytes() as u64;
            let kv_width = (shape.n_kv_heads * shape.head_dim) as u64;
            let q_width = (shape.n_heads * shape.head_dim) as u64;
            // q·k and p·v: 2 flops per element each, per scored pair.
            (4 * rows * q_width + 2 * attn.positions * kv_width * kv_elem, 4 * attn.pairs * q_width)
        }
        Op::Embedding { .. } | Op::PositionEmbedding { .. } | Op::ConstantEmbedding { .. } => (4 * rows * out, 0),
        // Two passes for the moments, then a multiply-add and the affine: ~7 per element.
        Op::LayerNorm { .. } => (act_bytes + 8 * out, 7 * rows * out),
        // x², the sum, the scale and the weight: ~4 per element.
        Op::RmsNorm { .. } => (act_bytes + 4 * out, 4 * rows * out),
        // A rotation: 2 multiplies and an add per element, plus the table read.
        Op::Rope { .. } => (2 * act_bytes, 3 * rows * out),
        // exp, add, divide, multiply: ~4 per element (GELU's tanh about as much).
        Op::Silu | Op::Gelu { .. } | Op::SoftCap { .. } => (act_bytes, 4 * rows * out),
        Op::SwiGlu => (act_bytes, 5 * rows * out),
        Op::Mul | Op::Add | Op::Scale { .. } | Op::RoundBf16 => (act_bytes, rows * out),
        Op::Copy | Op::Slice { .. } | Op::Plant(_) => (act_bytes, 0),
        // Scores, a sort and a gather per token: a few flops per expert.
        Op::RouterSelect { router, .. } | Op::RouterWeights { router } => {
            (act_bytes, 8 * rows * router.n_experts as u64)
        }
        // Each token runs top_k experts' three matmuls; the bytes are the experts' weights
        // (an upper bound: experts no token chose are not read).
        Op::Experts { experts, .. } => {
            let wbytes: u64 = experts
                .iter()
                .flat_map(|e| [e.gate, e.up, e.down])
                .map(|w| match &graph.weight(w).data {
                    WeightData::F32(d) => 4 * d.len() as u64,
                    WeightData::Quant(q) => q.data.len() as u64,
                })
                .sum();
            let per_expert: u64 =
                experts.first().map_or(0, |e| graph.weight(e.gate).shape.iter().product::<usize>() as u64);
            let top_k = node.inputs.get(1).map_or(0, |&v| width(v));
            (wbytes + act_bytes, 2 * 3 * rows * top_k * per_expert)
        }
    }
}

impl ProfileData {
    /// Nodes by total time, longest first.
    pub fn ranked(&self) -> Vec<&NodeStats> {
        let mut v: Vec<&NodeStats> = self.nodes.values().collect();
        v.sort_by(|a, b| b.nanos.cmp(&a.nanos).then_with(|| a.name.cmp(&b.name)));
        v
    }

    /// Totals per op kind, longest first.
    pub fn by_op(&self) -> Vec<NodeStats> {
        let mut m: HashMap<&'static str, NodeStats> = HashMap::new();
        for s in self.nodes.values() {
            let e =
                m.entry(s.op).or_insert_with(|| NodeStats { name: s.op.to_string(), op: s.op, ..NodeStats::default() });
            e.calls += s.calls;
            e.nanos += s.nanos;
            e.bytes += s.bytes;
            e.flops += s.flops;
        }
        let mut v: Vec<NodeStats> = m.into_values().collect();
        v.sort_by(|a, b| b.nanos.cmp(&a.nanos).then_with(|| a.name.cmp(&b.name)));
        v
    }

    /// The ranked table: per op kind, then the `top` slowest nodes.
    pub fn table(&self, top: usize) -> String {
        let total: u64 = self.nodes.values().map(|s| s.nanos).sum();
        let mut out = String::new();
        let _ = writeln!(
            out,
            "profile: {} steps, {:.1} ms in the graph ({:.1} ms in nodes), {} compute threads",
            self.steps,
            self.step_nanos as f64 / 1e6,
            total as f64 / 1e6,
            self.threads.max(1)
        );
        let pct = |n: u64| if total == 0 { 0.0 } else { 100.0 * n as f64 / total as f64 };
        let row = |out: &mut String, s: &NodeStats, label: &str| {
            let _ = writeln!(
                out,
                "  {label:<44} {:<11} {:>8} {:>10.2} {:>6.1}% {:>10.1} {:>8.2} {:>9.2}",
                s.op,
                s.calls,
                s.nanos as f64 / 1e6,
                pct(s.nanos),
                s.bytes as f64 / 1e6,
                s.gb_per_s(),
                s.gflop_per_s()
            );
        };
        let head = |out: &mut String, what: &str| {
            let _ = writeln!(
                out,
                "  {what:<44} {:<11} {:>8} {:>10} {:>7} {:>10} {:>8} {:>9}",
                "op", "calls", "ms", "share", "MB read", "GB/s", "GFLOP/s"
            );
        };
        head(&mut out, "by op kind");
        for s in self.by_op() {
            row(&mut out, &s, &s.name);
        }
        if !self.phases.is_empty() {
            let _ = writeln!(out);
            let _ = writeln!(out, "  {:<56} {:>8} {:>10} {:>12}", "by phase", "calls", "ms", "ms per call");
            for p in &self.phases {
                let ms = p.nanos as f64 / 1e6;
                let _ =
                    writeln!(out, "  {:<56} {:>8} {:>10.2} {:>12.4}", p.name, p.calls, ms, ms / p.calls.max(1) as f64);
            }
        }
        let _ = writeln!(out);
        head(&mut out, &format!("slowest {top} nodes"));
        for s in self.ranked().into_iter().take(top) {
            let label = if s.name.len() > 44 { format!("…{}", &s.name[s.name.len() - 43..]) } else { s.name.clone() };
            row(&mut out, s, &label);
        }
        if self.dropped_events > 0 {
            let _ = writeln!(
                out,
                "  ({} trace events past the first {MAX_TRACE_EVENTS} were not kept)",
                self.dropped_events
            );
        }
        out
    }

    /// The Chrome trace event format (JSON object with `traceEvents`): one complete event
    /// (`"ph": "X"`) per node run or worker share, times in microseconds, and thread names.
    pub fn chrome_trace(&self) -> String {
        let mut out = String::from("{\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n");
        let threads = self.events.iter().map(|e| e.thread + 1).max().unwrap_or(1).max(self.threads);
        let _ = write!(
            out,
            "{{\"ph\":\"M\",\"pid\":1,\"tid\":0,\"name\":\"process_name\",\"args\":{{\"name\":\"loupe\"}}}}"
        );
        for t in 0..threads {
            let name = if t == 0 { "graph (compute thread 0)".to_string() } else { format!("pool worker {t}") };
            let _ = write!(
                out,
                ",\n{{\"ph\":\"M\",\"pid\":1,\"tid\":{t},\"name\":\"thread_name\",\"args\":{{\"name\":\"{name}\"}}}}"
            );
        }
        for e in &self.events {
            let _ = write!(
                out,
                ",\n{{\"ph\":\"X\",\"pid\":1,\"tid\":{},\"name\":\"{}\",\"cat\":\"{}\",\"ts\":{:.3},\"dur\":{:.3}}}",
                e.thread,
                json_escape(&e.name),
                e.op,
                e.start_ns as f64 / 1e3,
                e.dur_ns as f64 / 1e3
            );
        }
        out.push_str("\n]}\n");
        out
    }
}

fn json_escape(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(o, "\\u{:04x}", c as u32);
            }
            c => o.push(c),
        }
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phases_accumulate_by_name_in_first_seen_order_and_print_under_their_own_heading() {
        let p = Profiler::new();
        assert!(!p.snapshot().table(5).contains("by phase"), "no phase, no section");
        p.add_phase("verify", 1, 3_000_000);
        p.add_phase("draft", 2, 1_000);
        p.add_phase("verify", 1, 5_000_000);
        let data = p.snapshot();
        assert_eq!(
            data.phases,
            [
                PhaseStats { name: "verify", calls: 2, nanos: 8_000_000 },
                PhaseStats { name: "draft", calls: 2, nanos: 1_000 }
            ]
        );
        let table = data.table(5);
        let verify = table.lines().find(|l| l.trim_start().starts_with("verify")).expect("a verify row");
        let cols: Vec<&str> = verify.split_whitespace().collect();
        assert_eq!(cols, ["verify", "2", "8.00", "4.0000"], "{verify}");
        assert!(table.find("by phase") < table.find("slowest 5 nodes"));
    }
}
