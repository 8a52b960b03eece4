//! Raw tensor files (the `binary` dump style and MAX's `BINARY` print style): the element
//! bytes alone, row-major and little-endian, with dtype and shape recorded elsewhere (a
//! loupe dump manifest). The file length must equal shape x dtype size exactly, which is
//! the only check a headerless format allows, so it is not optional.

use std::path::Path;

use crate::elem::{ElemType, StoredTensor};
use crate::storage::SharedBytes;
use crate::FormatError;

/// Memory-maps `path` as a tensor of `dtype` and `shape`.
pub fn open_raw(path: impl AsRef<Path>, dtype: ElemType, shape: &[usize]) -> Result<StoredTensor, FormatError> {
    let path = path.as_ref();
    raw_from_shared(path, SharedBytes::map_file(path)?, dtype, shape)
}

/// Views shared bytes as a tensor of `dtype` and `shape`.
pub fn raw_from_shared(
    path: &Path,
    bytes: SharedBytes,
    dtype: ElemType,
    shape: &[usize],
) -> Result<StoredTensor, FormatError> {
    let len = bytes.len();
    StoredTensor::contiguous(path, "raw tensor data", dtype, shape.to_vec(), bytes, 0..len, true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn length_must_match_exactly() {
        let p = Path::new("t.bin");
        let b = SharedBytes::from_vec(vec![0; 12]);
        assert_eq!(raw_from_shared(p, b.clone(), ElemType::F32, &[3]).map(|t| t.n_elements()).ok(), Some(3));
        let err = raw_from_shared(p, b.clone(), ElemType::F32, &[2]).unwrap_err().to_string();
        assert!(err.contains("need 8 bytes, the file holds 12"), "{err}");
        assert!(raw_from_shared(p, b, ElemType::F16, &[1 << 40, 1 << 40]).is_err());
    }
}
