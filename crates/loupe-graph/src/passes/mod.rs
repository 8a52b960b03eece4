//! Lowering: the graph a model builder made, through a flat, named list of passes, to the
//! graph the executor runs (docs/debugging.md, "Lowering stages and `loupe ir`").
//!
//! [`PASSES`] is data: `loupe ir --pass NAME`, `LOUPE_DEBUG=stop-after=NAME` and
//! `LOUPE_DEBUG=ir-output-dir=DIR` (one `NN-name.ir` file per pass) all iterate it. The IR
//! verifier runs after every pass in debug builds, in tests, and with `verify-ir`.

mod fuse;
mod kernels;
mod memory;
mod precision;
mod schedule;
mod shapes;

use std::path::{Path, PathBuf};

use crate::ir::Graph;
use crate::{print, verify, GraphError};

pub use kernels::select_kernels;
pub use memory::plan_memory;
pub use precision::matmul_precisions;
pub use schedule::linear_groups;

/// One lowering pass.
pub struct Pass {
    pub name: &'static str,
    /// One line on what it does to this graph.
    pub about: &'static str,
    pub run: fn(&mut Graph) -> Result<(), GraphError>,
}

/// The passes, in order. The graph as the model builder made it is the input of the first.
pub const PASSES: &[Pass] = &[
    Pass { name: "verify", about: "structural checks: every value computed once before use, widths, weights, logits", run: verify_pass },
    Pass { name: "infer-shapes", about: "derives each node's output shape from its op and inputs; rejects a declared shape that disagrees", run: shapes::infer_shapes },
    Pass {
        name: "choose-precision",
        about: "records each matmul weight's arithmetic (f32, fp8 activations, 8-bit activations, native blocks) from its storage and the graph's precision",
        run: precision::choose_precision,
    },
    Pass { name: "fuse", about: "mlp.act_fn (silu) + mlp.act_mul (mul) -> one swiglu node; the activation stays observable as its side output", run: fuse::fuse_swiglu },
    Pass { name: "plan-memory", about: "assigns every value a buffer slot, reusing slots whose values are dead (liveness over execution order)", run: plan_memory_pass },
    Pass { name: "select-kernels", about: "chooses the kernel each node runs (per matmul precision, weight type and ISA); the executor runs it", run: kernels::select_kernels_pass },
    Pass {
        name: "schedule",
        about: "groups consecutive linears that share their input (q/k/v, gate/up) into one grouped matmul; the rest run one op at a time",
        run: schedule::schedule_pass,
    },
];

fn verify_pass(graph: &mut Graph) -> Result<(), GraphError> {
    verify::verify(graph)
}

fn plan_memory_pass(graph: &mut Graph) -> Result<(), GraphError> {
    graph.memory_plan = Some(plan_memory(graph));
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
