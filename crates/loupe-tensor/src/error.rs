//! Typed kernel errors with the shapes and dtypes involved.

use loupe_core::GgmlType;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TensorError {
    #[error("{op}: shape mismatch: {detail}")]
    Shape { op: &'static str, detail: String },
    #[error("{op}: unsupported dtype {dtype}")]
    UnsupportedType { op: &'static str, dtype: GgmlType },
    #[error("{op}: buffer of {got} bytes, expected {expected} for {dtype} x {elements}")]
    ByteLength { op: &'static str, dtype: GgmlType, elements: usize, expected: usize, got: usize },
}
