//! f32 kernels for the non-matmul ops of decoder models: normalization, rotary
//! position embedding, activations, softmax and causal attention.
//!
//! Each follows the arithmetic of the Hugging Face transformers implementation
//! it mirrors (cited per function) so that `--precision f32` tracks PyTorch
//! to rounding noise.

pub mod activation;
pub mod attention;
pub mod norm;
pub mod rope;

pub use activation::{add_in_place, mul_in_place, silu, silu_mul};
pub use attention::{causal_attention, AttentionShape};
pub use norm::rms_norm;
pub use rope::{RopeTable, RopeScaling};
