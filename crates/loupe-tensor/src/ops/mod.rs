//! f32 kernels for the non-matmul ops of decoder models: normalization, rotary
//! position embedding, activations, softmax and causal attention.
//!
//! Each follows the arithmetic of the Hugging Face transformers implementation
//! it mirrors (cited per function) so that `--precision f32` tracks PyTorch
//! to rounding noise.

pub mod activation;
pub mod attention;
pub mod moe;
pub mod norm;
pub mod paged_attention;
pub mod rope;
pub mod slice;

pub use activation::{add_in_place, erf, gelu, mul_in_place, round_bf16, silu, silu_mul, soft_cap, soft_cap_one};
pub use attention::{attention, attention_cached, causal_attention, AttentionMask, AttentionShape, AttentionVariant, HeadMap};
pub use moe::{expert_id, router_select, router_weights, Router, RouterScoring};
pub use norm::{layer_norm, rms_norm};
pub use paged_attention::{paged_attention, write_paged, KvBlocks, KvBlocksMut, PagedSpan};
pub use rope::{RopeMode, RopeScaling, RopeTable};
pub use slice::slice_columns;
