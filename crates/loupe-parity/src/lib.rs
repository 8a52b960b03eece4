//! loupe-parity: the comparator side of loupe's parity toolkit.
//!
//! Given two sets of dumped tensors, a reference (A, usually PyTorch) and a target (B,
//! usually loupe), it pairs them by name, measures each pair, finds the first divergence
//! in execution order, recognizes false cliffs, and names the likely cause from the
//! signature table of docs/parity-protocol.md.
//!
//! - [`source`]: open a dump directory, a directory of tensor files, or one file
//!   (npy, npz, pt, max, safetensors, gguf) as named entries, loaded lazily as f32.
//! - [`mapping`] and [`pairing`]: align names (exact, MAX labels, transformers-debugger
//!   names, optional llama.cpp names, a declarative mapping file with renames, fused
//!   splits and layout transforms). Nothing is paired by position.
//! - [`metrics`] and [`logits`]: cosine, abs/rel diffs with positions, NMSE, SQNR,
//!   isclose mismatches, NaN/Inf counts, per-token/per-dim cosines; argmax, top-k, KL.
//! - [`result`], [`evidence`], [`signatures`], [`verdict`]: the divergence rule, false
//!   cliffs, the token-0 invariant, and the table of signatures (`evidence` holds what the
//!   signatures and the verdict share; `verdict` uses `signatures`, never the reverse).
//! - [`calibrate`]: noise floors from two runs of the reference at different precisions,
//!   and the divergence rule against them (`--calibrate`).
//! - [`compare`]: the driver; [`report`]: terminal table and JSON; [`html`]: the
//!   self-contained HTML page.
//! - [`manifest`]: the dump manifest; [`writer`]: the one writer of dumps (atomic);
//!   [`source`] is the one reader; [`print`]: MAX's COMPACT / FULL prints of a tensor,
//!   the dump styles that go to stdout instead of files.

pub mod calibrate;
pub mod compare;
pub mod error;
pub mod evidence;
pub mod html;
pub mod logits;
pub mod manifest;
pub mod mapping;
pub mod max_names;
pub mod metrics;
pub mod names;
pub mod pairing;
pub mod print;
pub mod progress;
pub mod report;
pub mod result;
pub mod signatures;
pub mod source;
pub mod tensor;
pub mod verdict;
pub mod writer;

pub use calibrate::Calibration;
pub use compare::{compare, compare_sources, CompareOptions, Report};
pub use error::ParityError;
pub use manifest::Manifest;
pub use mapping::Mapping;
pub use progress::{NoProgress, Progress};
pub use regex;
pub use result::Thresholds;
pub use source::TensorSource;
pub use tensor::Tensor;
pub use writer::{Capture, DumpStyle, DumpWriter};
