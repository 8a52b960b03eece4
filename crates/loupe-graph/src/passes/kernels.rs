//! The `select-kernels` pass: the kernel each node runs ([`Kernel`]), from the matmul
//! precisions of `choose-precision`, the weights' types and the active ISA. The executor
//! dispatches on it; the IR text prints it.

use loupe_tensor::linear::native_kernel_isa;
use loupe_tensor::quant::Isa;

use crate::ir::{Graph, Op, WeightId};
use crate::kernel::{Kernel, Matmul, MatmulPrecision};
use crate::GraphError;

pub fn select_kernels_pass(graph: &mut Graph) -> Result<(), GraphError> {
    graph.kernels = select_kernels(graph, &graph.precision)?;
    Ok(())
}

/// One kernel per node. `precision` is `choose-precision`'s, per weight id; a matmul weight
/// without one is an error naming the node (the passes ran out of order).
pub fn select_kernels(
    graph: &Graph,
    precision: &[Option<crate::kernel::MatmulPrecision>],
) -> Result<Vec<Kernel>, GraphError> {
    let isa = Isa::active();
    let matmul = |i: usize, w: WeightId| -> Result<Matmul, GraphError> {
        let weight = graph.weight(w);
        let ty = weight.compute_type();
        let precision = precision.get(w.0 as usize).copied().flatten().ok_or_else(|| {
            let v = graph.value(graph.nodes[i].output);
            GraphError::Verify {
                node: i,
                name: v.name.clone(),
                location: v.location.to_string(),
                reason: format!("no matmul precision chosen for weight {} (run choose-precision first)", weight.name),
            }
        })?;
        let isa = match precision {
            MatmulPrecision::Native | MatmulPrecision::NativeQ8Prompt => native_kernel_isa(isa, ty),
            MatmulPrecision::F32 | MatmulPrecision::Fp8 | MatmulPrecision::Q8 | MatmulPrecision::Q8NativePrompt => isa,
        };
        Ok(Matmul { precision, ty, isa })
    };
    graph
        .nodes
        .iter()
        .enumerate()
        .map(|(i, node)| {
            Ok(match &node.op {
                Op::Linear { weight, .. } => Kernel::Linear(matmul(i, *weight)?),
                Op::Experts { experts, .. } => match experts.first() {
                    Some(e) => {
                        Kernel::Experts { gate: matmul(i, e.gate)?, up: matmul(i, e.up)?, down: matmul(i, e.down)? }
                    }
                    // Refused by the verifier; the executor reports it as a shape error.
                    None => Kernel::Op,
                },
                Op::Embedding { table, .. }
                | Op::PositionEmbedding { table, .. }
                | Op::ConstantEmbedding { table, .. } => Kernel::Gather(graph.weight(*table).compute_type()),
                Op::Attention { .. } => Kernel::Attention,
                Op::SwiGlu => Kernel::SiluMul,
                Op::RouterSelect { .. }
                | Op::RouterWeights { .. }
                | Op::LayerNorm { .. }
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
                | Op::Plant(_) => Kernel::Op,
            })
        })
        .collect()
}
