//! loupe-core: what every other loupe crate shares and nothing else, so that depending on
//! it pulls in no parser and no kernel.
//!
//! - [`GgmlType`] and [`QK_K`]: the GGML element types and their block geometry, needed by
//!   the readers (to validate tensor extents) and by the kernels (to walk blocks).
//! - [`fp8`]: the OCP 8-bit float formats (E4M3FN, E5M2), widened by the dump readers and
//!   narrowed (round to nearest even, saturating) by the kernels' FP8 quantization.
//! - [`SplitMix64`]: the one seeded generator behind the sampler's seeding, the bench's
//!   random prompts, the fuzz mutator and the tests' random data.

pub mod fp8;
pub mod ggml_type;
pub mod rng;

pub use fp8::Fp8Format;
pub use ggml_type::{GgmlType, FP8_E4M3_TYPE_ID, QK_K};
pub use rng::SplitMix64;
