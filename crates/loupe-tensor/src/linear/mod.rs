//! Linear layers, `y[m, n] = x[m, k] @ Wᵀ`, for every weight format and precision: the
//! kernel room. Laid out by layer, then by ISA (one file per ISA inside each layer):
//!
//! | layer | file(s) | what |
//! | --- | --- | --- |
//! | weights | `qmatrix` | [`QMatrix`]: a GGML block-quantized matrix, row by row |
//! | activations | `act16/` | [`Act16`]: an activation row as 16-bit blocks (`--precision native`) |
//! | dispatch | `dispatch` | which kernel family a type takes on an ISA, for every layer below |
//! | block geometry | `kinds` | the Act16 types' block sizes and offsets as `const` kind codes |
//! | shared SIMD | `simd/` | horizontal sums (their lane order is the bit-identity contract), block unpacking |
//! | one row | `decode/` | one activation row against one weight row: Act16 and f32 dots, scalar references |
//! | GEMV | `gemv/` | one activation row against 4 weight rows at a time (decode's hot loop) |
//! | batch-invariant | `invariant/` | many activation rows, each row's bits independent of the batch (batched engine) |
//! | f32 chains | `chain/` | [`matmul_wq_chain`]: dequantized 16-row panels, f32 activations, each output one FMA chain over `k` (the batched engine's prompt rows; same bits on every ISA) |
//! | 16-bit prompt panels | `prompt16/` | [`matmul_wq_prompt`]: native prompt rows of Q4_0/Q4_1/Q5_0/Q8_0 on AVX-512, 16 weight rows in the lanes of one vector (`vpdpwssd` on Act16 codes), each output row-local; other types and ISAs: `chain` |
//! | prefill | `prefill` | [`matmul_wq`]: one row through `invariant`, more through `prompt16` (or `chain`), or AMX tiles |
//! | AMX | `amx` | prefill of Q4_1 / Q8_0 / Q5_0 on AMX int8 tiles, bit-identical to the Act16 reference |
//! | f32 | `f32` | [`matmul_f32`] through the `gemm` crate |
//! | 8-bit | `q8` | [`matmul_q`]: 8-bit activations, llama.cpp's scheme (`--precision q8`) |
//! | panel tasks | `panel_tasks` | the task split and aligned per-thread buffers of the two panel kernels below |
//! | 8-bit prompt panels | `qpanel/` | [`matmul_q_prompt`]: prompt rows of Q4_K at 8-bit activations, 16 weight rows in the lanes of one vector (`vpdpbusd`), each output row-local |
//! | row tiles | `tiled` | the cache-tiled driver of the `quant` room's tile kernels (f32 below gemm's threshold, `q8`) |
//!
//! Bit-identity contract: for a type and an ISA, the one-row dot, the GEMV and the
//! batch-invariant kernels give the same bits per output (each is tested against the one-row
//! kernel), so a sequence decodes to the same tokens alone or in any batch.
//!
//! Dependencies run one way: layers use `kinds`, `simd`, `act16`, `qmatrix` and
//! `dispatch`; `invariant` uses `gemv` and `decode`; `chain` uses `decode`'s dequantizers;
//! `prompt16` uses `chain` (its fallback) and `act16`; `qpanel` uses `q8` (its fallback); `prefill` uses `invariant`, `prompt16` and `amx`. An ISA file may use its twin of another ISA (AVX-512 kernels that run
//! the AVX2 arithmetic).

pub mod act16;
pub mod amx;
pub mod chain;
pub mod decode;
pub(crate) mod dispatch;
pub mod f32;
mod gemv;
pub mod invariant;
pub(crate) mod kinds;
mod panel_tasks;
pub mod prefill;
pub mod prompt16;
pub mod q8;
pub mod qmatrix;
pub mod qpanel;
pub mod screen;
pub(crate) mod simd;
mod tiled;

pub use act16::Act16;
pub use chain::{matmul_wq_chain, matmul_wq_chain_with};
pub use decode::{dequantize_row_fast, dot_row, dot_row_act16, dot_row_act16_scalar, dot_row_scalar};
pub use dispatch::{can_group, native_kernel_isa};
pub use f32::matmul_f32;
pub use invariant::{
    matmul_f32_invariant, matmul_f32_invariant_with, matmul_wq_group, matmul_wq_group_with, matmul_wq_invariant,
    matmul_wq_invariant_with, MAX_GROUP,
};
pub use prefill::{can_group_prefill, matmul_wq, matmul_wq_prefill_group};
pub use prompt16::{has_act16_panels, matmul_wq_prompt, matmul_wq_prompt_scalar, matmul_wq_prompt_with};
pub use q8::{matmul_q, matmul_q_with, q8_rows_invariant};
pub use qmatrix::QMatrix;
pub use qpanel::{has_q8_panels, matmul_q_prompt, matmul_q_prompt_scalar, matmul_q_prompt_with};
pub use screen::{can_screen, row_norms, screen_norms, screened_argmax_logits};
