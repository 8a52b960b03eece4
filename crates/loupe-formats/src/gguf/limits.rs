//! Safety caps of the GGUF reader, each checked before anything is allocated.
//!
//! Every count is also checked against the bytes left in the file (count x the smallest
//! encoding of one item), so in practice a file can only make the reader allocate in
//! proportion to its own size. The caps bound what remains: the in-memory blow-up of a
//! large honest-looking file, and recursion. They sit far above any real model: the
//! largest vocabularies are ~256k tokens (Gemma 3: 262,144), merges ~500k, ~1-2k tensors.
//! Motivation: docs/parsers-threat-model.md (llama.cpp's missing caps, the Python reader's hang on
//! a 2^63-element array, candle's divide by zero on `general.alignment = 0`).

/// Most metadata key/value pairs.
pub const MAX_METADATA_KVS: u64 = 1 << 20;

/// Most tensors in one file.
pub const MAX_TENSORS: u64 = 1 << 20;

/// Longest metadata key, in bytes. The GGUF spec (ggml/docs/gguf.md, "gguf_metadata_kv_t")
/// says a key "must be at most 2^16-1 bytes long".
pub const MAX_KEY_LEN: u64 = (1 << 16) - 1;

/// Longest tensor name, in bytes. The GGUF spec (ggml/docs/gguf.md, "gguf_tensor_info_t")
/// says the name "must be at most 64 bytes long" (ggml's `GGML_MAX_NAME` is 64).
pub const MAX_TENSOR_NAME_LEN: u64 = 64;

/// Longest string value, in bytes. Chat templates, the longest real strings, run to tens of
/// KiB; 64 MiB leaves room for odd embedded blobs while bounding one allocation.
pub const MAX_STRING_LEN: u64 = 64 << 20;

/// Most elements in one array.
pub const MAX_ARRAY_LEN: u64 = 1 << 24;

/// Most metadata values in the whole file, counting every array element at every depth.
/// In memory each value is a 32-byte `GgufValue`, so a u8 array costs 32x its file size;
/// this cap holds the total to 512 MiB whatever the file's size.
pub const MAX_METADATA_VALUES: u64 = 1 << 24;

/// Deepest nesting of arrays (an array of strings is depth 1). Real files use depth 1;
/// the cap keeps recursion bounded against a depth bomb.
pub const MAX_ARRAY_DEPTH: usize = 8;

/// Most dimensions of a tensor: ggml's `GGML_MAX_DIMS` (ggml/include/ggml.h).
pub const MAX_DIMS: u32 = 4;

/// Largest `general.alignment`. ggml requires only a non-zero power of two (gguf.cpp);
/// writers use 32 (the default, `GGUF_DEFAULT_ALIGNMENT`) or at most a page. 1 MiB bounds
/// the padding a file can make the reader skip and the data-offset arithmetic.
pub const MAX_ALIGNMENT: u64 = 1 << 20;

/// The alignment when `general.alignment` is absent (`GGUF_DEFAULT_ALIGNMENT`, gguf.h).
pub const DEFAULT_ALIGNMENT: u64 = 32;
