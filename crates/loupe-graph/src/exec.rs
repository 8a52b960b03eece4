//! The CPU executor: runs nodes in order over per-value buffers, reusing a buffer once
//! its value's last reader has run, and shows each computed value to an [`Observer`].
//!
//! Taps cannot change the numbers: the observer gets a shared slice after the node has
//! written it, and buffer reuse depends only on the graph, never on what is observed.

use loupe_tensor::matmul::{matmul_f32, matmul_q};
use loupe_tensor::ops::{add_in_place, attention, gelu, mul_in_place, rms_norm, round_bf16, silu};
use loupe_tensor::wq::{dequantize_row_fast, matmul_wq};
use loupe_tensor::TensorError;

use crate::ir::{Graph, Node, Op, ValueInfo, WeightData};
use crate::verify::row_width;
use crate::{GraphError, KvCache, KvWrite};

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

/// Reusable execution state for one graph.
#[derive(Debug, Default)]
pub struct Executor {
    buffers: Vec<Option<Vec<f32>>>,
    pool: Vec<Vec<f32>>,
    last_use: Vec<usize>,
    quant_scratch: Vec<u8>,
    logits: Vec<f32>,
}

impl Executor {
    pub fn new(graph: &Graph) -> Executor {
        let mut last_use = vec![0usize; graph.values.len()];
        for (i, node) in graph.nodes.iter().enumerate() {
            for inp in &node.inputs {
                last_use[inp.0 as usize] = i;
            }
        }
        Executor { buffers: vec![None; graph.values.len()], pool: Vec::new(), last_use, quant_scratch: Vec::new(), logits: Vec::new() }
    }

    /// Runs the graph on `tokens`, appending to `kv`, and returns the logits: one row of
    /// `vocab` per token with `all_logits`, else the last token's row.
    pub fn run(
        &mut self,
        graph: &Graph,
        tokens: &[u32],
        kv: &mut KvCache,
        options: RunOptions,
        mut observer: Option<&mut dyn Observer>,
    ) -> Result<&[f32], GraphError> {
        if tokens.is_empty() {
            return Err(GraphError::Input("no tokens to run".into()));
        }
        kv.check_room(tokens.len())?;
        let logits_id = graph.logits.ok_or_else(|| GraphError::Input("graph has no logits".into()))?;
        let n_tokens = tokens.len();
        let past = kv.len();
        let context = past + n_tokens;

        for (i, node) in graph.nodes.iter().enumerate() {
            let info = graph.value(node.output);
            let width = row_width(info).ok_or_else(|| GraphError::Input(format!("value {} has no row width", info.name)))?;
            let is_logits = node.output == logits_id;
            let rows = if is_logits && !options.all_logits { 1 } else { n_tokens };
            let mut out = self.pool.pop().unwrap_or_default();
            out.clear();
            out.resize(rows * width, 0.0);
            let side = match (node.side, observer.as_deref_mut()) {
                (Some(s), Some(obs)) => obs.wants(graph.value(s)).then_some(s),
                _ => None,
            };
            let mut side_buf = side.map(|_| self.pool.pop().unwrap_or_default());
            self.exec_node(graph, node, tokens, kv, past, rows, &mut out, side_buf.as_mut())
                .map_err(|source| GraphError::Kernel { op: node.op.name(), name: info.name.clone(), location: info.location.to_string(), source })?;
            if let (Some(s), Some(buf), Some(obs)) = (side, side_buf, observer.as_deref_mut()) {
                let sinfo = graph.value(s);
                obs.observe(sinfo, &sinfo.concrete_shape(n_tokens, context), &buf);
                self.pool.push(buf);
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
            self.buffers[node.output.0 as usize] = Some(out);
            for inp in &node.inputs {
                let id = inp.0 as usize;
                if self.last_use[id] == i && *inp != logits_id {
                    if let Some(buf) = self.buffers[id].take() {
                        self.pool.push(buf);
                    }
                }
            }
        }
        kv.commit(n_tokens);
        let logits = self.buffers[logits_id.0 as usize].take().unwrap_or_default();
        let old = std::mem::replace(&mut self.logits, logits);
        self.pool.push(old);
        // Anything still held (values nobody reads, e.g. side outputs) goes back to the pool.
        for b in self.buffers.iter_mut() {
            if let Some(buf) = b.take() {
                self.pool.push(buf);
            }
        }
        Ok(&self.logits)
    }

    fn input(&self, node: &Node, k: usize) -> &[f32] {
        self.buffers[node.inputs[k].0 as usize].as_deref().unwrap_or(&[])
    }

    #[allow(clippy::too_many_arguments)]
    fn exec_node(&mut self, graph: &Graph, node: &Node, tokens: &[u32], kv: &mut KvCache, past: usize, rows: usize, out: &mut [f32], side: Option<&mut Vec<f32>>) -> Result<(), TensorError> {
        match &node.op {
            Op::Embedding { table } => {
                let w = graph.weight(*table);
                let dim = w.shape[1];
                for (t, (&id, row)) in tokens.iter().zip(out.chunks_exact_mut(dim)).enumerate() {
                    let r = id as usize;
                    if r >= w.shape[0] {
                        return Err(TensorError::Shape { op: "embedding", detail: format!("token id {id} at position {t} is outside the vocabulary of {}", w.shape[0]) });
                    }
                    match &w.data {
                        WeightData::F32(d) => row.copy_from_slice(&d[r * dim..(r + 1) * dim]),
                        WeightData::Quant(q) => dequantize_row_fast(q.ty, q.row(r), row)?,
                    }
                }
                Ok(())
            }
            Op::RmsNorm { weight, eps } => {
                let w = match &graph.weight(*weight).data {
                    WeightData::F32(d) => d,
                    WeightData::Quant(q) => return Err(TensorError::UnsupportedType { op: "rms_norm weight", dtype: q.ty }),
                };
                rms_norm(self.input(node, 0), w, *eps, out)
            }
            Op::Linear { weight, bias } => {
                let w = graph.weight(*weight);
                let (n, k) = (w.shape[0], w.shape[1]);
                let x_all = self.buffers[node.inputs[0].0 as usize].as_deref().unwrap_or(&[]);
                // The logits of generation need only the last token's row.
                let x = &x_all[x_all.len() - rows * k..];
                match &w.data {
                    WeightData::F32(d) => matmul_f32(x, d, out, rows, k, n)?,
                    WeightData::Quant(q) if graph.quantize_activations => matmul_q(x, q, out, rows, &mut self.quant_scratch)?,
                    WeightData::Quant(q) => matmul_wq(x, q, out, rows)?,
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
            Op::Rope { n_heads, table, mode } => {
                out.copy_from_slice(self.input(node, 0));
                table.apply_mode(out, *n_heads, past, *mode)
            }
            Op::Attention { layer, shape, variant, kv_write } => {
                let q = self.buffers[node.inputs[0].0 as usize].as_deref().unwrap_or(&[]);
                let k = self.buffers[node.inputs[1].0 as usize].as_deref().unwrap_or(&[]);
                let v = self.buffers[node.inputs[2].0 as usize].as_deref().unwrap_or(&[]);
                let (keys, values) = match kv_write {
                    KvWrite::InPlace => kv.append(*layer, k, v),
                    KvWrite::OneLate => kv.append_late(*layer, k, v),
                };
                let ctx = past + tokens.len();
                let probs = side.map(|buf| {
                    buf.clear();
                    buf.resize(shape.n_heads * tokens.len() * ctx, 0.0);
                    buf.as_mut_slice()
                });
                attention(*shape, *variant, q, keys, values, ctx, out, probs)
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
            Op::Mul => {
                out.copy_from_slice(self.input(node, 0));
                mul_in_place(out, self.input(node, 1));
                Ok(())
            }
            Op::Add => {
                out.copy_from_slice(self.input(node, 0));
                add_in_place(out, self.input(node, 1));
                Ok(())
            }
        }
    }
}
