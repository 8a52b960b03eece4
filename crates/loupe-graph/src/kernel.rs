//! The lowering's decisions as typed values, one per node: the arithmetic of each matmul
//! (`choose-precision`), the kernel each node runs (`select-kernels`) and which linears
//! share one grouped matmul (`schedule`). The printer shows them and the executor runs
//! them; nothing decides them again at run time.

use std::fmt;

use loupe_tensor::quant::Isa;
use loupe_tensor::GgmlType;

/// The arithmetic of a matmul (a linear, or one of an expert's three): what its activations
/// go through. Decided by the `choose-precision` pass from the weight's storage and the
/// graph's precision flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MatmulPrecision {
    /// f32 activations times f32 (dequantized) weights.
    F32,
    /// `--precision fp8`: activation rows rounded to FP8 E4M3 per token (dynamic, guarded
    /// scale) times f32 weights that the loader rounded to FP8 per output row.
    Fp8,
    /// `--precision q8`: activations quantized to 8-bit blocks (llama.cpp's scheme) times
    /// block-quantized weights.
    Q8,
    /// f32 activations (as 16-bit blocks, Act16, for the types that have them) times
    /// block-quantized weights.
    Native,
    /// `--precision auto`'s Q6_K where the CPU has its 8-bit prompt panels: decode rows
    /// [`MatmulPrecision::Native`]'s arithmetic, prompt rows (a single sequence's prefill, a
    /// batched step's prompt tokens) 8-bit activations through
    /// `loupe_tensor::linear::matmul_q_prompt`.
    NativeQ8Prompt,
    /// `--precision auto`'s Q5_0 on AVX-512 CPUs: decode rows (and every row verified or
    /// batched with them) [`MatmulPrecision::Q8`]'s arithmetic, prompt rows native 16-bit
    /// activations (their panels run faster than the 8-bit dot kernels, which Q5_0 has no
    /// panels for).
    Q8NativePrompt,
}

/// A matmul kernel: its arithmetic, the weight type it reads and the ISA whose arithmetic
/// runs (AVX2 for the types `loupe_tensor::linear::native_kernel_isa` sends there).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Matmul {
    pub precision: MatmulPrecision,
    pub ty: GgmlType,
    pub isa: Isa,
}

impl fmt::Display for Matmul {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (ty, isa) = (self.ty, self.isa.name());
        match self.precision {
            MatmulPrecision::F32 => f.write_str("matmul_f32(gemm)"),
            MatmulPrecision::Fp8 => f.write_str("matmul_f32(gemm,fp8-e4m3 activations)"),
            MatmulPrecision::Q8 => write!(f, "matmul_q({ty}x8-bit activations,{isa})"),
            MatmulPrecision::Native => write!(f, "matmul_wq({ty},{isa})"),
            MatmulPrecision::NativeQ8Prompt => write!(f, "matmul_wq({ty},{isa};prompt rows x8-bit activations)"),
            MatmulPrecision::Q8NativePrompt => write!(f, "matmul_q({ty}x8-bit activations,{isa};prompt rows native)"),
        }
    }
}

/// The kernel a node runs, chosen by `select-kernels`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kernel {
    /// The op's one kernel (norms, elementwise ops, RoPE, routing, slices, plants).
    Op,
    /// Rows of an embedding table of this type: copied (f32) or dequantized.
    Gather(GgmlType),
    /// Attention over the KV cache in f32 (single sequence or paged).
    Attention,
    /// `silu(gate) * up` in one pass.
    SiluMul,
    Linear(Matmul),
    /// The routed experts' gate, up and down matmuls.
    Experts {
        gate: Matmul,
        up: Matmul,
        down: Matmul,
    },
}

impl Kernel {
    /// The kernel's name in IR text; `op` is the node's op name (for [`Kernel::Op`]).
    pub fn label(&self, op: &str) -> String {
        match self {
            Kernel::Op => op.to_string(),
            Kernel::Gather(GgmlType::F32) => "gather_f32".to_string(),
            Kernel::Gather(ty) => format!("gather_dequantize({ty})"),
            Kernel::Attention => "attention_f32".to_string(),
            Kernel::SiluMul => "silu_mul".to_string(),
            Kernel::Linear(m) => m.to_string(),
            // One name when the three agree (the usual case: one type per expert tensor).
            Kernel::Experts { gate, up, down } if gate == up && up == down => format!("experts({gate})"),
            Kernel::Experts { gate, up, down } => format!("experts(gate={gate},up={up},down={down})"),
        }
    }
}

/// Consecutive linears that read the same input and run as one grouped matmul (q/k/v,
/// gate/up: one fork-join, the activation row quantized once), chosen by `schedule`. Each
/// output gets the bits of its own matmul, so grouping changes the cost, never the numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinearGroup {
    /// Index of the group's first node.
    pub first: usize,
    /// Number of nodes, 2 up to `loupe_tensor::linear::MAX_GROUP`.
    pub len: usize,
}
