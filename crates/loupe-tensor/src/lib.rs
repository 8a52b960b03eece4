//! loupe-tensor: element types and the CPU kernels the graph executor calls.
//!
//! Layout convention everywhere: activations are row-major `[tokens, features]`;
//! a linear weight is `[out_features, in_features]` (Hugging Face / GGML row order),
//! so `y = x @ W^T`. Every SIMD kernel has a scalar twin and a test comparing them.

pub mod error;
pub mod f16_rows;
pub mod fp8;
pub mod hugepages;
pub mod linear;
pub mod ops;
pub mod pool;
pub mod quant;
pub(crate) mod reduce;
#[cfg(test)]
mod testing;

pub use error::TensorError;
pub use loupe_core::{GgmlType, QK_K};
