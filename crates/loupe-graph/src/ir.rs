//! The IR: values, weights, ops, nodes, and the builder models use.

use std::panic::Location;
use std::sync::Arc;

use loupe_tensor::linear::QMatrix;
use loupe_tensor::ops::{AttentionShape, AttentionVariant, RopeMode, RopeTable, Router};
use loupe_tensor::GgmlType;

use crate::fault::{FaultClass, Plant};
use crate::kernel::{Kernel, LinearGroup, MatmulPrecision};
use crate::kv::KvWrite;

/// Index of a value in [`Graph::values`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ValueId(pub u32);

/// Index of a weight in [`Graph::weights`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct WeightId(pub u32);

/// Index of a node in [`Graph::nodes`] (= its execution order).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct NodeId(pub u32);

/// A dimension of a value's shape, resolved when the graph runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dim {
    /// The tokens of this forward call (the prompt in prefill, 1 in decode).
    Tokens,
    /// Every position the call attends over: cached tokens plus this call's.
    Context,
    Fixed(usize),
}

impl std::fmt::Display for Dim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Dim::Tokens => f.write_str("T"),
            Dim::Context => f.write_str("C"),
            Dim::Fixed(n) => write!(f, "{n}"),
        }
    }
}

/// What a value is: its name (the contract with PyTorch hooks), shape and axes.
#[derive(Debug, Clone)]
pub struct ValueInfo {
    /// Hugging Face module path of the module whose output this is, or that path plus a
    /// dotted suffix for values PyTorch does not expose as a module output (`...q_rope`).
    pub name: String,
    /// Further names of the same value (`model.layers.3.self_attn` is the output of its
    /// `o_proj`): a tap on any of them captures it.
    pub aliases: Vec<String>,
    pub shape: Vec<Dim>,
    /// Axis meanings, e.g. `["token", "hidden"]`, written into dump manifests.
    pub axes: Vec<&'static str>,
    /// Where the model code created the node (`#[track_caller]`).
    pub location: &'static Location<'static>,
}

impl ValueInfo {
    /// Whether `name` is this value's name or one of its aliases.
    pub fn answers_to(&self, name: &str) -> bool {
        self.name == name || self.aliases.iter().any(|a| a == name)
    }

    /// The concrete shape for a call with `tokens` new tokens and `context` positions.
    pub fn concrete_shape(&self, tokens: usize, context: usize) -> Vec<usize> {
        self.shape
            .iter()
            .map(|d| match d {
                Dim::Tokens => tokens,
                Dim::Context => context,
                Dim::Fixed(n) => *n,
            })
            .collect()
    }
}

/// Weight storage: dequantized f32, or GGML blocks used by quantized dot products.
#[derive(Debug, Clone)]
pub enum WeightData {
    /// Row-major `[rows, cols]`.
    F32(Arc<Vec<f32>>),
    Quant(Arc<QMatrix>),
}

/// A named constant tensor (`model.layers.0.self_attn.q_proj.weight`).
#[derive(Debug, Clone)]
pub struct Weight {
    pub name: String,
    /// `[rows, cols]` for matrices, `[len]` for vectors.
    pub shape: Vec<usize>,
    pub data: WeightData,
    /// The element type it was stored as in the checkpoint.
    pub source_type: GgmlType,
    /// `--precision fp8`: the loader rounded these f32 values to FP8 E4M3, one guarded scale
    /// per output row (FP8 W8A8 emulated on f32 storage), so the matmuls that read it take
    /// FP8-rounded activations. `choose-precision` records that from this flag; which
    /// weights get it (the decoder layers' projections) is the loader's rule, by name.
    pub fp8: bool,
}

impl Weight {
    /// The element type the kernels see.
    pub fn compute_type(&self) -> GgmlType {
        match &self.data {
            WeightData::F32(_) => GgmlType::F32,
            WeightData::Quant(q) => q.ty,
        }
    }
}

/// The operations. Matched exhaustively everywhere (no `_ =>`), so a new op fails to
/// compile wherever it is not handled.
#[derive(Debug, Clone)]
pub enum Op {
    /// Rows of `table` for this call's token ids, times `scale` (1 except in families that
    /// scale embeddings, e.g. Gemma's sqrt(hidden_size)). No value inputs.
    Embedding {
        table: WeightId,
        scale: f32,
    },
    /// Rows of `table` at the call's positions plus `offset` (absolute position
    /// embeddings: BERT's `embeddings.position_embeddings`, offset 0). No value inputs.
    PositionEmbedding {
        table: WeightId,
        offset: usize,
    },
    /// Row `row` of `table` for every token (BERT's `token_type_embeddings` of a
    /// single-segment input, all type 0). No value inputs.
    ConstantEmbedding {
        table: WeightId,
        row: usize,
    },
    /// `weight * x / rms(x)` per row.
    RmsNorm {
        weight: WeightId,
        eps: f32,
    },
    /// `(x - mean) / sqrt(var + eps) * weight + bias` per row (`torch.nn.LayerNorm`).
    LayerNorm {
        weight: WeightId,
        bias: WeightId,
        eps: f32,
    },
    /// `x @ weight^T (+ bias)`.
    Linear {
        weight: WeightId,
        bias: Option<WeightId>,
    },
    /// Rotary embedding of `n_heads` heads at the call's positions, pairing elements as
    /// `mode` says.
    Rope {
        n_heads: usize,
        table: Arc<RopeTable>,
        mode: RopeMode,
    },
    /// Writes k and v (inputs 1, 2) into the layer's cache as `kv_write` says, then attends
    /// with q (input 0) under `variant` (head map, mask).
    Attention {
        layer: usize,
        shape: AttentionShape,
        variant: AttentionVariant,
        kv_write: KvWrite,
    },
    Silu,
    /// GELU, exact (erf) or with the tanh approximation.
    Gelu {
        tanh: bool,
    },
    Mul,
    Add,
    /// The input unchanged, as a new value (a value that should have been computed from more
    /// inputs, e.g. a residual sum whose add is missing).
    Copy,
    /// The input rounded to bfloat16 and widened back (what a bf16 activation holds).
    RoundBf16,
    /// The input times a constant (embedding and residual multipliers; fault `o-proj-scale`).
    Scale {
        factor: f32,
    },
    /// `cap * tanh(x / cap)` elementwise ([`loupe_tensor::ops::soft_cap`]): Gemma 2's
    /// `final_logit_softcapping` of `lm_head`'s output. Row-local, so when it follows the
    /// logits' linear it runs on the logits' rows only (see [`Graph::logit_rows_values`]).
    SoftCap {
        cap: f32,
    },
    /// Columns `start..start + len` of each input row ([`loupe_tensor::ops::slice_columns`]):
    /// the parts of a fused projection (Phi-3's `qkv_proj` into q, k, v; `gate_up_proj`
    /// into gate and up), so the fused matmul stays one value under its module's name.
    Slice {
        start: usize,
        len: usize,
    },
    /// `silu(gate) * up` (inputs 0, 1): the `fuse` pass's replacement for `mlp.act_fn`
    /// followed by `mlp.act_mul`. The activation is the node's side output, written (by the
    /// same arithmetic) only when observed, so taps on `mlp.act_fn` still see it.
    SwiGlu,
    /// Mixture-of-Experts routing, part 1: the experts each token goes to, from the router's
    /// logits (input 0, `[T, n_experts]`), as `[T, top_k]` expert ids held in f32, ascending
    /// per token ([`loupe_tensor::ops::router_select`]). `bias`: the selection-only
    /// `e_score_correction_bias` of sigmoid routers.
    RouterSelect {
        router: Router,
        bias: Option<WeightId>,
    },
    /// Routing, part 2: the weight of each chosen expert (inputs: logits, ids), `[T, top_k]`
    /// ([`loupe_tensor::ops::router_weights`]).
    RouterWeights {
        router: Router,
    },
    /// The routed experts (inputs: hidden `[T, D]`, ids, weights): per token, the weighted
    /// sum over its chosen experts of `down(act(gate x) * up x)`, added in ascending expert
    /// id as transformers' experts loop adds them. Each expert's rows are gathered and go
    /// through the same matmuls as a linear (row-local in batched steps), so a token's
    /// result does not depend on which other tokens chose the same expert there.
    Experts {
        experts: Arc<Vec<ExpertWeights>>,
        gelu_tanh: bool,
    },
    /// The input with a test-only defect (faults `nan`, `uninit`), for testing the debug
    /// checks against a known answer.
    Plant(Plant),
}

/// One routed expert's SwiGLU (or GeGLU) MLP: `gate_proj`, `up_proj` `[I, D]`,
/// `down_proj` `[D, I]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExpertWeights {
    pub gate: WeightId,
    pub up: WeightId,
    pub down: WeightId,
}

impl Op {
    /// Short op name used in IR text, logs and errors.
    pub fn name(&self) -> &'static str {
        match self {
            Op::Embedding { .. } => "embedding",
            Op::PositionEmbedding { .. } => "position_embedding",
            Op::ConstantEmbedding { .. } => "constant_embedding",
            Op::RmsNorm { .. } => "rms_norm",
            Op::LayerNorm { .. } => "layer_norm",
            Op::Linear { .. } => "linear",
            Op::Rope { .. } => "rope",
            Op::Attention { .. } => "attention",
            Op::Silu => "silu",
            Op::Gelu { tanh: true } => "gelu_tanh",
            Op::Gelu { tanh: false } => "gelu",
            Op::Mul => "mul",
            Op::Add => "add",
            Op::Copy => "copy",
            Op::RoundBf16 => "round_bf16",
            Op::Scale { .. } => "scale",
            Op::SoftCap { .. } => "soft_cap",
            Op::Slice { .. } => "slice",
            Op::SwiGlu => "swiglu",
            Op::RouterSelect { .. } => "router_select",
            Op::RouterWeights { .. } => "router_weights",
            Op::Experts { .. } => "experts",
            Op::Plant(Plant::NanInf) => "plant_nan",
            Op::Plant(Plant::HalfUnwritten) => "plant_unwritten",
        }
    }

    /// Number of value inputs the op takes.
    pub fn arity(&self) -> usize {
        match self {
            Op::Embedding { .. } | Op::PositionEmbedding { .. } | Op::ConstantEmbedding { .. } => 0,
            Op::LayerNorm { .. }
            | Op::RmsNorm { .. }
            | Op::Linear { .. }
            | Op::Rope { .. }
            | Op::Silu
            | Op::Gelu { .. }
            | Op::Copy
            | Op::RoundBf16
            | Op::Scale { .. }
            | Op::SoftCap { .. }
            | Op::Slice { .. }
            | Op::Plant(_) => 1,
            Op::RouterSelect { .. } => 1,
            Op::Mul | Op::Add | Op::SwiGlu | Op::RouterWeights { .. } => 2,
            Op::Attention { .. } | Op::Experts { .. } => 3,
        }
    }
}

/// One step of the program: `output = op(inputs)`.
#[derive(Debug, Clone)]
pub struct Node {
    pub op: Op,
    pub inputs: Vec<ValueId>,
    pub output: ValueId,
    /// An intermediate the op computes on the way that PyTorch users want to see
    /// (attention probabilities). Written out only when an observer asks for it, by the
    /// same kernel call, so tapping it cannot change the numbers.
    pub side: Option<ValueId>,
    /// The planted fault this node carries, if any (see [`crate::fault`]); shown in IR text.
    pub fault: Option<FaultClass>,
}

/// A model as a flat program in execution order.
#[derive(Debug, Clone)]
pub struct Graph {
    pub values: Vec<ValueInfo>,
    pub weights: Vec<Weight>,
    pub nodes: Vec<Node>,
    /// The value a run returns: a decoder's logits, an encoder's last hidden state.
    pub logits: Option<ValueId>,
    /// An encoder (BERT): attention is bidirectional, and every run returns the output value
    /// for every token (there are no "logit rows" to select).
    pub encoder: bool,
    /// Number of attention layers with a KV cache, and each cache row's width.
    pub kv_layers: usize,
    pub kv_width: usize,
    /// Positions the model was trained for (`max_position_embeddings`).
    pub context_length: usize,
    /// Quantize activations to 8-bit blocks for block-quantized weights (llama.cpp's
    /// scheme) instead of multiplying dequantized weights by f32 activations.
    pub quantize_activations: bool,
    /// `--precision auto`: 8-bit activation blocks for the weight types
    /// `passes::precision::auto_takes_q8` names (Q4_K, Q5_K; Q5_0 at AVX-512), 16-bit ones (native) for the others.
    pub q8_k_quants: bool,
    /// Element type of a single sequence's KV cache ([`crate::KvCache`]): f16 for graphs
    /// that keep quantized weights (half the bytes decode reads per cached position, as
    /// the batched engine's default), f32 for the f32 parity baseline. Set by the model
    /// loader; `--kv-dtype` overrides it.
    pub kv_dtype: crate::KvDtype,
    /// Buffer slot of every value, set by the `plan-memory` pass (the executor plans one
    /// itself for a graph that was not lowered).
    pub memory_plan: Option<MemoryPlan>,
    /// Per weight id, the arithmetic of the matmuls that read it (`None` for weights no
    /// matmul reads), set by the `choose-precision` pass (empty before it ran).
    pub precision: Vec<Option<MatmulPrecision>>,
    /// Per node, the kernel the `select-kernels` pass chose (empty before it ran). The
    /// executor runs these (it selects them itself, the same way, for an unlowered graph).
    pub kernels: Vec<Kernel>,
    /// The runs of linears that share one grouped matmul, set by the `schedule` pass (`None`
    /// before it ran).
    pub groups: Option<Vec<LinearGroup>>,
}

impl Default for Graph {
    /// An empty graph; its sessions cache f32 rows until a loader says otherwise.
    fn default() -> Graph {
        Graph {
            values: Vec::new(),
            weights: Vec::new(),
            nodes: Vec::new(),
            logits: None,
            encoder: false,
            kv_layers: 0,
            kv_width: 0,
            context_length: 0,
            quantize_activations: false,
            q8_k_quants: false,
            kv_dtype: crate::KvDtype::F32,
            memory_plan: None,
            precision: Vec::new(),
            kernels: Vec::new(),
            groups: None,
        }
    }
}

/// Which buffer slot holds each value while it is live. Two values share a slot only if
/// their lifetimes (producing node to last reader) do not overlap; the logits keep a slot
/// of their own, as the executor hands them out after the run.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MemoryPlan {
    /// Indexed by value id.
    pub slot: Vec<u32>,
    pub n_slots: usize,
}

impl Graph {
    pub fn value(&self, id: ValueId) -> &ValueInfo {
        &self.values[id.0 as usize]
    }

    pub fn weight(&self, id: WeightId) -> &Weight {
        &self.weights[id.0 as usize]
    }

    /// The value with this name or alias.
    pub fn find_value(&self, name: &str) -> Option<ValueId> {
        self.values.iter().position(|v| v.answers_to(name)).map(|i| ValueId(i as u32))
    }

    /// The length past which the graph's RoPE turns with LongRoPE's long factors (a call
    /// ending beyond it uses them for all its rows), if it has LongRoPE (Phi-3).
    pub fn longrope_switch(&self) -> Option<usize> {
        self.nodes.iter().find_map(|n| match &n.op {
            Op::Rope { table, .. } => table.long_after(),
            _ => None,
        })
    }

    /// Which values hold only the rows the caller gets logits for (the last token in
    /// generation, each sequence's last in a batched step), indexed by value id: the logits,
    /// and, walking back, the input of each row-local [`Op::SoftCap`] between them and the
    /// linear that computes them (whose input it gathers those rows from). So a soft-capped
    /// `lm_head` still multiplies only the rows it must.
    pub fn logit_rows_values(&self) -> Vec<bool> {
        let mut on = vec![false; self.values.len()];
        if self.encoder {
            return on;
        }
        let mut v = self.logits;
        while let Some(id) = v {
            on[id.0 as usize] = true;
            v = match self.producer(id) {
                Some(Node { op: Op::SoftCap { .. }, inputs, .. }) => inputs.first().copied(),
                _ => None,
            };
        }
        on
    }

    /// The node that produces `value`.
    pub fn producer(&self, value: ValueId) -> Option<&Node> {
        self.nodes.iter().find(|n| n.output == value)
    }
}

/// Builds a [`Graph`] node by node; models call it with module paths as names.
#[derive(Debug, Default)]
pub struct GraphBuilder {
    graph: Graph,
}

impl GraphBuilder {
    pub fn new() -> GraphBuilder {
        GraphBuilder::default()
    }

    /// Registers a weight; returns its id.
    pub fn weight(&mut self, weight: Weight) -> WeightId {
        self.graph.weights.push(weight);
        WeightId((self.graph.weights.len() - 1) as u32)
    }

    pub fn weight_info(&self, id: WeightId) -> &Weight {
        self.graph.weight(id)
    }

    /// Appends `op(inputs)` producing a value called `name` of the given shape.
    #[track_caller]
    pub fn node(
        &mut self,
        name: impl Into<String>,
        op: Op,
        inputs: &[ValueId],
        shape: Vec<Dim>,
        axes: Vec<&'static str>,
    ) -> ValueId {
        let id = ValueId(self.graph.values.len() as u32);
        self.graph.values.push(ValueInfo {
            name: name.into(),
            aliases: Vec::new(),
            shape,
            axes,
            location: Location::caller(),
        });
        self.graph.nodes.push(Node { op, inputs: inputs.to_vec(), output: id, side: None, fault: None });
        id
    }

    /// Declares a side output of the node that computes `of` (see [`Node::side`]).
    #[track_caller]
    pub fn side_output(
        &mut self,
        of: ValueId,
        name: impl Into<String>,
        shape: Vec<Dim>,
        axes: Vec<&'static str>,
    ) -> ValueId {
        let id = ValueId(self.graph.values.len() as u32);
        self.graph.values.push(ValueInfo {
            name: name.into(),
            aliases: Vec::new(),
            shape,
            axes,
            location: Location::caller(),
        });
        if let Some(node) = self.graph.nodes.iter_mut().find(|n| n.output == of) {
            node.side = Some(id);
        }
        id
    }

    /// Records that the node computing `value` carries a planted fault.
    pub fn mark_fault(&mut self, value: ValueId, fault: FaultClass) {
        if let Some(node) = self.graph.nodes.iter_mut().find(|n| n.output == value) {
            node.fault = Some(fault);
        }
    }

    /// Renames a value: a node inserted after the one that computed a module's output (a
    /// planted fault) takes over the module's name, so dumps keep pairing by name.
    pub fn rename(&mut self, value: ValueId, name: impl Into<String>) {
        self.graph.values[value.0 as usize].name = name.into();
    }

    /// Gives `value` another name (a module whose output is this same value).
    pub fn alias(&mut self, value: ValueId, name: impl Into<String>) {
        self.graph.values[value.0 as usize].aliases.push(name.into());
    }

    pub fn value(&self, id: ValueId) -> &ValueInfo {
        self.graph.value(id)
    }

    pub fn set_logits(&mut self, value: ValueId) {
        self.graph.logits = Some(value);
    }

    pub fn set_kv(&mut self, layers: usize, width: usize, context_length: usize) {
        self.graph.kv_layers = layers;
        self.graph.kv_width = width;
        self.graph.context_length = context_length;
    }

    /// Marks the graph as an encoder ([`Graph::encoder`]).
    pub fn set_encoder(&mut self, on: bool) {
        self.graph.encoder = on;
    }

    pub fn set_quantize_activations(&mut self, on: bool) {
        self.graph.quantize_activations = on;
    }

    pub fn finish(self) -> Graph {
        self.graph
    }
}
