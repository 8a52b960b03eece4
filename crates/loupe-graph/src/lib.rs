//! loupe-graph: the intermediate representation every model is built as, and its executor.
//!
//! * [`ir`]: a flat list of nodes in execution order; each node computes one value named by
//!   the Hugging Face module path of what it computes (`model.layers.3.self_attn.q_proj`) and
//!   remembers the source location that built it.
//! * [`verify`]: structural checks run after building (and between passes).
//! * [`passes`]: lowering as a flat, named list of passes (fuse, plan-memory, ...).
//! * [`kernel`]: the lowering's decisions as typed values (matmul precision, kernel, linear
//!   groups): the printer shows them, the executor runs them.
//! * [`debug`]: `LOUPE_DEBUG` options, read by lowering and the executor.
//! * [`fault`]: named bugs a builder can plant in one layer, for testing the parity tools.
//! * [`exec`]: runs the graph on CPU over a KV cache, calling an [`exec::Observer`] that can
//!   look at (never change) any value: the mechanism behind taps, dumps and checks.
//! * [`profile`]: the op profiler an executor can be given (`--profile`): per-node time,
//!   bytes and flops, a ranked table and a Chrome trace.

pub mod debug;
pub mod error;
pub mod exec;
pub mod fault;
pub mod ir;
pub mod kernel;
pub mod kv;
pub mod paged;
pub mod passes;
pub mod print;
pub mod profile;
pub mod verify;

pub use error::GraphError;
pub use exec::BatchSpan;
pub use exec::{Executor, Observer, RunOptions};
pub use fault::{Fault, FaultClass, FaultParseError, Plant, Subsystem};
pub use ir::{
    Dim, ExpertWeights, Graph, GraphBuilder, MemoryPlan, Node, NodeId, Op, ValueId, ValueInfo, Weight, WeightData,
    WeightId,
};
pub use kv::{KvCache, KvWrite};
pub use paged::{KvDtype, PagedKvCache};
pub use profile::Profiler;
