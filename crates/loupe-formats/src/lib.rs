//! loupe-formats: readers and writers of the tensor containers loupe meets.
//!
//! Every parser here reads untrusted bytes: sizes use checked arithmetic, counts and
//! lengths are capped before anything is allocated, offsets are checked against the
//! file length, and nothing panics on bad input (see `ARCHITECTURE.md`, "Invariants",
//! and docs/parsers-threat-model.md). Errors name the file and the field.
//!
//! - [`gguf`]: GGUF v2/v3 reader ([`GgufFile`]) and writer ([`gguf::writer::GgufWriter`]).
//! - [`safetensors_file`]: safetensors files ([`SafetensorsFile`]) and sharded Hugging Face
//!   checkpoints ([`SafetensorsCheckpoint`]).
//! - `fuzzing` (feature `fuzzing`): the bodies of the `fuzz/` targets, also run by the
//!   test suite (the crate's dev-dependency on itself turns the feature on for its tests).
//! - Dump formats (parity tooling): [`npy`] (`.npy` reader/writer), [`npz`], [`pt`]
//!   (`torch.save` archives through the allow-listed pickle VM in [`pickle`]), [`max_file`]
//!   (Modular MAX `.max` reader/writer), [`raw`] (headerless bytes + manifest). Each yields
//!   [`elem::StoredTensor`]s that convert to f32; `dump_fuzzing` (feature `fuzzing`) holds
//!   their fuzz bodies.

#[cfg(feature = "fuzzing")]
pub mod dump_fuzzing;
pub mod elem;
pub mod error;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
pub mod gguf;
pub mod max_file;
pub mod npy;
pub mod npz;
pub mod pickle;
pub mod pt;
pub mod raw;
pub mod safetensors_file;
pub mod storage;
pub mod zip_archive;

pub use elem::{ElemType, StoredTensor};
pub use error::FormatError;
pub use gguf::writer::GgufWriter;
pub use gguf::{GgufFile, GgufTensorInfo, GgufValue, GgufValueType};
pub use loupe_core::{GgmlType, QK_K};
pub use max_file::MaxFile;
pub use npy::{write_npy, NpyFile};
pub use npz::NpzFile;
pub use pt::PtFile;
pub use safetensors_file::{SafetensorsCheckpoint, SafetensorsFile};
pub use storage::SharedBytes;
