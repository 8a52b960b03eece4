//! loupe-core: what every other loupe crate shares and nothing else, so that depending on
//! it pulls in no parser and no kernel.
//!
//! - [`GgmlType`] and [`QK_K`]: the GGML element types and their block geometry, needed by
//!   the readers (to validate tensor extents) and by the kernels (to walk blocks).
//! - [`SplitMix64`]: the one seeded generator behind the sampler's seeding, the bench's
//!   random prompts, the fuzz mutator and the tests' random data.

pub mod ggml_type;
pub mod rng;

pub use ggml_type::{GgmlType, QK_K};
pub use rng::SplitMix64;
