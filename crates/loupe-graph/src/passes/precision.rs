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

/// Block-quantized weights take 8-bit activations with `quantize_activations` (with
/// `q8_k_quants`, only the types [`auto_takes_q8`] names, and the decode rows of those
/// [`auto_decode_q8`] names on the active ISA), else f32 ones; f32 weights take
/// FP8-rounded activations where the loader rounded the weight to FP8
/// ([`crate::Weight::fp8`]), else f32 ones. Nothing here reads a weight's name.
fn precision_of(graph: &Graph, id: WeightId) -> MatmulPrecision {
    let w = graph.weight(id);
    match &w.data {
        WeightData::Quant(_) if graph.quantize_activations => MatmulPrecision::Q8,
        WeightData::Quant(q) if graph.q8_k_quants && auto_takes_q8(q.ty) => MatmulPrecision::Q8,
        WeightData::Quant(q) if graph.q8_k_quants && auto_decode_q8(q.ty, loupe_tensor::quant::Isa::active()) => {
            MatmulPrecision::Q8NativePrompt
        }
        WeightData::Quant(q) if graph.q8_k_quants && auto_prompt_q8(q.ty) => MatmulPrecision::NativeQ8Prompt,
        WeightData::Quant(_) => MatmulPrecision::Native,
        WeightData::F32(_) if w.fp8 => MatmulPrecision::Fp8,
        WeightData::F32(_) => MatmulPrecision::F32,
    }
}

/// The weight types `--precision auto` multiplies with 8-bit activation blocks instead of
/// native's 16-bit ones, on the kernels of `isa`: Q4_K, the bulk of a Q4_K_M file. Its 8-bit
/// kernels (decode: the Q8_K dot, llama.cpp's scheme; prefill on AVX-512: `matmul_q_prompt`'s
/// panels, Q8_0 activations) run faster than the 16-bit ones on 2 cores, and the
/// teacher-forced argmax agreement with f32 stays at or above 99% on every model's goldens
/// (tested per model in loupe-cli; figures in README.md). Q8_K decode for Q6_K as well put
/// Gemma 3 270M under 99%, and 8-bit activations for every type put SmolLM2 Q4_1 under it
/// (BENCHMARKS.md), so the other types decode natively (Q6_K's prompt rows: [`auto_prompt_q8`]).
///
/// Q5_K, the bulk of a Q5_K_M file, takes them too: its Q8_K kernels decode faster than
/// its 16-bit ones (the AVX2 Act16 arithmetic, which native runs), and its Q8_K activations
/// are rounded exactly as Q4_K's, on weights with one more bit. No model of the goldens
/// ships Q5_K, so its agreement rests on that argument, not on a measurement (BENCHMARKS.md,
/// "Q4_0 decode and fast drafts", its Q5_K_M paragraph).
pub fn auto_takes_q8(ty: loupe_tensor::GgmlType) -> bool {
    matches!(ty, loupe_tensor::GgmlType::Q4K | loupe_tensor::GgmlType::Q5K)
}

/// The weight types whose decode rows `--precision auto` multiplies with 8-bit activation
/// blocks on the kernels of `isa` while prompt rows keep native arithmetic: Q5_0 (most
/// matrices of Qwen2.5's and Gemma 3's Q4_K_M files) at `Isa::Avx512`. Its 8-bit decode
/// reads the same bytes as native's, and rows verified or batched together cost half
/// native's multiply instructions; its prompt rows keep the 16-bit panels, twice as fast as
/// its 8-bit dot kernels on prompts (it has no 8-bit panels). 8-bit Q5_0 for every row held
/// the agreement (Gemma 3 99.27%, Qwen2.5-Coder 100%, teacher-forced); with AVX2's kernels
/// Gemma 3 fell to 1086 of 1097 positions (99.00%, one short), and AMX CPUs, unmeasured,
/// keep native Q5_0 (BENCHMARKS.md, "2026-11-30 (late night)").
pub fn auto_decode_q8(ty: loupe_tensor::GgmlType, isa: loupe_tensor::quant::Isa) -> bool {
    ty == loupe_tensor::GgmlType::Q5_0 && isa == loupe_tensor::quant::Isa::Avx512
}

/// The weight types whose prompt rows `--precision auto` multiplies with 8-bit activations
/// while decode keeps native arithmetic: Q6_K, where the CPU has its 8-bit prompt panels
/// (`loupe_tensor::linear::has_q8_panels`, AVX-512 VNNI). Their activations carry a scale
/// per 32 values, finer than decode's Q8_K (256), which is what keeps Gemma 3 270M over 99%
/// where Q8_K for Q6_K did not; prefill through them is ~2x native's f32 chains.
pub fn auto_prompt_q8(ty: loupe_tensor::GgmlType) -> bool {
    ty == loupe_tensor::GgmlType::Q6K && loupe_tensor::linear::has_q8_panels(loupe_tensor::quant::Isa::active(), ty)
}

#[cfg(test)]
mod tests {
    use super::{auto_decode_q8, auto_takes_q8};
    use loupe_tensor::quant::Isa;
    use loupe_tensor::GgmlType;

    #[test]
    fn auto_takes_8_bit_activations_per_type_and_isa() {
        assert!(auto_takes_q8(GgmlType::Q4K) && auto_takes_q8(GgmlType::Q5K));
        for ty in [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q8_0, GgmlType::Q6K] {
            assert!(!auto_takes_q8(ty), "{ty:?}");
        }
        for isa in [Isa::Scalar, Isa::Avx2, Isa::Avx512, Isa::Amx] {
            for ty in [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q8_0, GgmlType::Q6K, GgmlType::Q4K] {
                assert!(!auto_decode_q8(ty, isa), "{ty:?} at {isa:?}");
            }
            // Measured at 99% only with AVX-512's kernels; AMX is unmeasured.
            assert_eq!(auto_decode_q8(GgmlType::Q5_0, isa), isa == Isa::Avx512, "Q5_0 at {isa:?}");
        }
    }
}
