//! The `choose-precision` pass: the arithmetic of every matmul, per weight a linear or an
//! expert reads ([`MatmulPrecision`]). Weights were dequantized or kept in blocks while
//! loading (`--precision`, so peak memory never holds both); this pass records what that
//! and the graph's flags mean for each matmul's activations, so the executor never asks
//! again (nor matches weight names at run time).

use crate::ir::{Graph, Op, WeightData, WeightId};
use crate::kernel::MatmulPrecision;
use crate::GraphError;

pub fn choose_precision(graph: &mut Graph) -> Result<(), GraphError> {
    graph.precision = matmul_precisions(graph);
    Ok(())
}

/// Per weight id, the precision of the matmuls that read it (`None`: no matmul does).
pub fn matmul_precisions(graph: &Graph) -> Vec<Option<MatmulPrecision>> {
    let mut out = vec![None; graph.weights.len()];
    let mut set = |w: WeightId| out[w.0 as usize] = Some(precision_of(graph, w));
    for node in &graph.nodes {
        match &node.op {
            Op::Linear { weight, .. } => set(*weight),
            Op::Experts { experts, .. } => experts.iter().flat_map(|e| [e.gate, e.up, e.down]).for_each(&mut set),
            Op::Embedding { .. }
            | Op::PositionEmbedding { .. }
            | Op::ConstantEmbedding { .. }
            | Op::RmsNorm { .. }
            | Op::LayerNorm { .. }
            | Op::Rope { .. }
            | Op::Attention { .. }
            | Op::Silu
            | Op::Gelu { .. }
            | Op::Mul
            | Op::Add
            | Op::Copy
            | Op::RoundBf16
            | Op::Scale { .. }
            | Op::SoftCap { .. }
            | Op::Slice { .. }
            | Op::SwiGlu
            | Op::RouterSelect { .. }
            | Op::RouterWeights { .. }
            | Op::Plant(_) => {}
        }
    }
    out
}

/// Block-quantized weights take 8-bit activations with `quantize_activations`, else f32
/// ones; f32 weights take FP8-rounded activations where the loader rounded the weight to
/// FP8 ([`crate::Weight::fp8`]), else f32 ones. Nothing here reads a weight's name.
fn precision_of(graph: &Graph, id: WeightId) -> MatmulPrecision {
    let w = graph.weight(id);
    match &w.data {
        WeightData::Quant(_) if graph.quantize_activations => MatmulPrecision::Q8,
        WeightData::Quant(_) => MatmulPrecision::Native,
        WeightData::F32(_) if w.fp8 => MatmulPrecision::Fp8,
        WeightData::F32(_) => MatmulPrecision::F32,
    }
}
