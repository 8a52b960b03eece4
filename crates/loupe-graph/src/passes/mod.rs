//! Lowering: the graph a model builder made, through a flat, named list of passes, to the
//! graph the executor runs (docs/debugging.md, "Lowering stages and `loupe ir`").
//!
//! [`PASSES`] is data: `loupe ir --pass NAME`, `LOUPE_DEBUG=stop-after=NAME` and
//! `LOUPE_DEBUG=ir-output-dir=DIR` (one `NN-name.ir` file per pass) all iterate it. The IR
//! verifier runs after every pass in debug builds, in tests, and with `verify-ir`.

mod fuse;
mod memory;
mod shapes;

use std::path::{Path, PathBuf};

use crate::ir::{Graph, Op, WeightData};
use crate::{print, verify, GraphError};

pub use memory::plan_memory;

/// One lowering pass.
pub struct Pass {
    pub name: &'static str,
    /// One line on what it does to this graph.
    pub about: &'static str,
    pub run: fn(&mut Graph) -> Result<(), GraphError>,
}

/// The passes, in order.
pub const PASSES: &[Pass] = &[
    Pass { name: "build", about: "the graph as the model builder made it (identity: the builder ran before lowering)", run: identity },
    Pass { name: "verify", about: "structural checks: every value computed once before use, widths, weights, logits", run: verify_pass },
    Pass { name: "infer-shapes", about: "derives each node's output shape from its op and inputs; rejects a declared shape that disagrees", run: shapes::infer_shapes },
    Pass {
        name: "choose-precision",
        about: "identity on this graph: weights are dequantized or kept in blocks while loading (--precision), so peak memory never holds both",
        run: identity,
    },
    Pass { name: "fuse", about: "mlp.act_fn (silu) + mlp.act_mul (mul) -> one swiglu node; the activation stays observable as its side output", run: fuse::fuse_swiglu },
    Pass { name: "plan-memory", about: "assigns every value a buffer slot, reusing slots whose values are dead (liveness over execution order)", run: plan_memory_pass },
    Pass { name: "select-kernels", about: "records the kernel each node runs (per weight type, precision and ISA)", run: select_kernels },
    Pass {
        name: "schedule",
        about: "identity on this graph: nodes run in the builder's order, which verify proved topological; one op at a time, each op multi-threaded",
        run: identity,
    },
];

fn verify_pass(graph: &mut Graph) -> Result<(), GraphError> {
    verify::verify(graph)
}

fn identity(_: &mut Graph) -> Result<(), GraphError> {
    Ok(())
}

fn plan_memory_pass(graph: &mut Graph) -> Result<(), GraphError> {
    graph.memory_plan = Some(plan_memory(graph));
    Ok(())
}

fn select_kernels(graph: &mut Graph) -> Result<(), GraphError> {
    let isa = loupe_tensor::quant::Isa::active().name();
    let kernels = graph
        .nodes
        .iter()
        .map(|node| match &node.op {
            Op::Linear { weight, .. } => match &graph.weight(*weight).data {
                WeightData::F32(_) => "matmul_f32(gemm)".to_string(),
                WeightData::Quant(q) if graph.quantize_activations => {
                    format!("matmul_q({}x8-bit activations,{isa})", q.ty)
                }
                WeightData::Quant(q) => format!("matmul_wq({},{isa})", q.ty),
            },
            Op::Embedding { table, .. } => match &graph.weight(*table).data {
                WeightData::F32(_) => "gather_f32".to_string(),
                WeightData::Quant(q) => format!("gather_dequantize({})", q.ty),
            },
            Op::Attention { .. } => "attention_f32".to_string(),
            Op::SwiGlu => "silu_mul".to_string(),
            Op::PositionEmbedding { .. } | Op::ConstantEmbedding { .. } => "gather_f32".to_string(),
            Op::Experts { experts, .. } => match experts.first().map(|e| &graph.weight(e.gate).data) {
                Some(WeightData::Quant(q)) if graph.quantize_activations => {
                    format!("experts(matmul_q({}x8-bit activations,{isa}))", q.ty)
                }
                Some(WeightData::Quant(q)) => format!("experts(matmul_wq({},{isa}))", q.ty),
                _ => "experts(matmul_f32(gemm))".to_string(),
            },
            op @ (Op::RouterSelect { .. } | Op::RouterWeights { .. }) => op.name().to_string(),
            op @ (Op::LayerNorm { .. }
            | Op::RmsNorm { .. }
            | Op::Rope { .. }
            | Op::Silu
            | Op::Gelu { .. }
            | Op::Mul
            | Op::Add
            | Op::Copy
            | Op::RoundBf16
            | Op::Scale { .. }
            | Op::SoftCap { .. }
            | Op::Slice { .. }
            | Op::Plant(_)) => op.name().to_string(),
        })
        .collect();
    graph.kernels = kernels;
    Ok(())
}

/// The pass called `name`.
pub fn find(name: &str) -> Option<(usize, &'static Pass)> {
    PASSES.iter().enumerate().find(|(_, p)| p.name == name)
}

/// How to lower.
#[derive(Debug, Clone, Default)]
pub struct LowerOptions {
    /// Stop after this pass (`stop-after`, `loupe ir --pass`).
    pub stop_after: Option<String>,
    /// Write `NN-name.ir` per pass here.
    pub ir_output_dir: Option<PathBuf>,
    /// Verify after every pass even in a release build.
    pub verify_between: bool,
}

impl LowerOptions {
    /// The lowering asked for by `LOUPE_DEBUG` (`stop-after`, `ir-output-dir`, and
    /// `verify-ir` or `assert-level=all` for verifying between passes).
    pub fn from_debug(debug: &crate::debug::DebugOptions) -> LowerOptions {
        LowerOptions {
            stop_after: debug.stop_after.clone(),
            ir_output_dir: debug.ir_output_dir.clone(),
            verify_between: debug.verify_ir || debug.assert_level == crate::debug::AssertLevel::All,
        }
    }
}

/// What lowering returns.
#[derive(Debug)]
pub struct Lowered {
    pub graph: Graph,
    /// The pass lowering stopped after, when asked to stop before the end.
    pub stopped_after: Option<&'static str>,
    /// The files written to `ir_output_dir`.
    pub files: Vec<PathBuf>,
}

/// Errors of lowering.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LowerError {
    #[error("unknown lowering pass '{0}' (known: {known})", known = PASSES.iter().map(|p| p.name).collect::<Vec<_>>().join(", "))]
    UnknownPass(String),
    #[error("lowering pass '{pass}': {source}")]
    Pass {
        pass: &'static str,
        #[source]
        source: Box<GraphError>,
    },
    #[error("ir-output-dir {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Runs the passes on `graph`, verifying between them when asked (always in debug builds).
pub fn lower(mut graph: Graph, options: &LowerOptions) -> Result<Lowered, LowerError> {
    let stop = match &options.stop_after {
        Some(name) => Some(find(name).ok_or_else(|| LowerError::UnknownPass(name.clone()))?.0),
        None => None,
    };
    if let Some(dir) = &options.ir_output_dir {
        std::fs::create_dir_all(dir).map_err(|source| LowerError::Io { path: dir.clone(), source })?;
    }
    let verify_between = options.verify_between || cfg!(debug_assertions);
    let mut files = Vec::new();
    for (i, pass) in PASSES.iter().enumerate() {
        (pass.run)(&mut graph).map_err(|source| LowerError::Pass { pass: pass.name, source: Box::new(source) })?;
        if verify_between {
            verify::verify(&graph).map_err(|source| LowerError::Pass { pass: pass.name, source: Box::new(source) })?;
        }
        if let Some(dir) = &options.ir_output_dir {
            files.push(write_stage(dir, i, pass, &graph)?);
        }
        if stop == Some(i) {
            let stopped_after = (i + 1 < PASSES.len()).then_some(pass.name);
            return Ok(Lowered { graph, stopped_after, files });
        }
    }
    Ok(Lowered { graph, stopped_after: None, files })
}

/// `DIR/NN-name.ir`: a header naming the pass, then the IR text.
fn write_stage(dir: &Path, i: usize, pass: &Pass, graph: &Graph) -> Result<PathBuf, LowerError> {
    let path = dir.join(format!("{i:02}-{}.ir", pass.name));
    let text = format!("# after pass {i:02} {}: {}\n{}", pass.name, pass.about, print::to_text(graph));
    std::fs::write(&path, text).map_err(|source| LowerError::Io { path: path.clone(), source })?;
    Ok(path)
}
