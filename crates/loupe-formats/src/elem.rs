//! Element types of the dump formats (npy, npz, `.pt`, `.max`, raw + manifest) and a
//! validated view of one stored tensor that converts to f32.
//!
//! GGUF and safetensors keep their own dtype enums (`GgmlType`, `safetensors::Dtype`); this
//! one covers what numpy, PyTorch and MAX write for activations: floats (f64/f32/f16/bf16
//! and the two common fp8 formats), integers and bool. Everything converts to f32, the
//! comparator's working type (docs/parity-protocol.md, step 1: dump in f32).

use std::ops::Range;
use std::path::{Path, PathBuf};

use crate::storage::SharedBytes;
use crate::FormatError;

/// Most dimensions of a tensor in any dump format. numpy's own limit is 64 (`NPY_MAXDIMS`
/// in numpy 2.x); activations have 1-4. The cap bounds the header structures we build.
pub const MAX_RANK: usize = 64;

/// Most elements one tensor may expand to in memory (as f32): 2^32, i.e. 16 GiB, below
/// the 24 GiB of the machines we run on. A strided view (a stride of 0 repeats one
/// element) can claim far more elements than its file holds; this cap is checked before
/// allocating.
pub const MAX_ELEMENTS: u64 = 1 << 32;

/// One element type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ElemType {
    Bool,
    U8,
    U16,
    U32,
    U64,
    I8,
    I16,
    I32,
    I64,
    F16,
    BF16,
    F32,
    F64,
    /// fp8 E4M3 "fn" (finite, NaN = all mantissa and exponent bits set; OCP FP8 spec).
    F8E4M3Fn,
    /// fp8 E5M2 (IEEE-like: inf and NaN).
    F8E5M2,
}

impl ElemType {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            ElemType::Bool | ElemType::U8 | ElemType::I8 => 1,
            ElemType::F8E4M3Fn | ElemType::F8E5M2 => 1,
            ElemType::U16 | ElemType::I16 | ElemType::F16 | ElemType::BF16 => 2,
            ElemType::U32 | ElemType::I32 | ElemType::F32 => 4,
            ElemType::U64 | ElemType::I64 | ElemType::F64 => 8,
        }
    }

    /// The short name used in loupe dump manifests (`"f32"`, `"bf16"`, `"i64"`...).
    pub fn name(self) -> &'static str {
        match self {
            ElemType::Bool => "bool",
            ElemType::U8 => "u8",
            ElemType::U16 => "u16",
            ElemType::U32 => "u32",
            ElemType::U64 => "u64",
            ElemType::I8 => "i8",
            ElemType::I16 => "i16",
            ElemType::I32 => "i32",
            ElemType::I64 => "i64",
            ElemType::F16 => "f16",
            ElemType::BF16 => "bf16",
            ElemType::F32 => "f32",
            ElemType::F64 => "f64",
            ElemType::F8E4M3Fn => "f8_e4m3fn",
            ElemType::F8E5M2 => "f8_e5m2",
        }
    }

    /// Parses a manifest dtype: the short names of [`ElemType::name`] and the long numpy /
    /// PyTorch spellings (`float32`, `bfloat16`, `int64`, `float8_e4m3fn`...).
    pub fn from_name(s: &str) -> Option<ElemType> {
        let t = match s.trim().to_ascii_lowercase().as_str() {
            "bool" => ElemType::Bool,
            "u8" | "uint8" => ElemType::U8,
            "u16" | "uint16" => ElemType::U16,
            "u32" | "uint32" => ElemType::U32,
            "u64" | "uint64" => ElemType::U64,
            "i8" | "int8" => ElemType::I8,
            "i16" | "int16" => ElemType::I16,
            "i32" | "int32" => ElemType::I32,
            "i64" | "int64" => ElemType::I64,
            "f16" | "float16" | "half" => ElemType::F16,
            "bf16" | "bfloat16" => ElemType::BF16,
            "f32" | "float32" | "float" => ElemType::F32,
            "f64" | "float64" | "double" => ElemType::F64,
            "f8_e4m3fn" | "float8_e4m3fn" | "f8e4m3fn" => ElemType::F8E4M3Fn,
            "f8_e5m2" | "float8_e5m2" | "f8e5m2" => ElemType::F8E5M2,
            _ => return None,
        };
        Some(t)
    }

    /// Converts one element's bytes (exactly `size()` of them) to f32. Integers above 2^24
    /// round to the nearest f32, as `tensor.float()` does.
    fn decode(self, b: &[u8], big_endian: bool) -> f32 {
        fn arr<const N: usize>(b: &[u8], big: bool) -> [u8; N] {
            let mut a = [0u8; N];
            // Callers pass exactly N bytes; a short slice leaves zeros rather than panicking.
            for (d, s) in a.iter_mut().zip(b) {
                *d = *s;
            }
            if big {
                a.reverse();
            }
            a
        }
        let first = b.first().copied().unwrap_or(0);
        match self {
            ElemType::Bool => f32::from(u8::from(first != 0)),
            ElemType::U8 => f32::from(first),
            ElemType::I8 => f32::from(first as i8),
            ElemType::U16 => f32::from(u16::from_le_bytes(arr(b, big_endian))),
            ElemType::I16 => f32::from(i16::from_le_bytes(arr(b, big_endian))),
            ElemType::U32 => u32::from_le_bytes(arr(b, big_endian)) as f32,
            ElemType::I32 => i32::from_le_bytes(arr(b, big_endian)) as f32,
            ElemType::U64 => u64::from_le_bytes(arr(b, big_endian)) as f32,
            ElemType::I64 => i64::from_le_bytes(arr(b, big_endian)) as f32,
            ElemType::F16 => half::f16::from_bits(u16::from_le_bytes(arr(b, big_endian))).to_f32(),
            ElemType::BF16 => half::bf16::from_bits(u16::from_le_bytes(arr(b, big_endian))).to_f32(),
            ElemType::F32 => f32::from_le_bytes(arr(b, big_endian)),
            ElemType::F64 => f64::from_le_bytes(arr(b, big_endian)) as f32,
            ElemType::F8E4M3Fn => f8_e4m3fn_to_f32(first),
            ElemType::F8E5M2 => f8_e5m2_to_f32(first),
        }
    }
}

/// fp8 E4M3FN: 1 sign, 4 exponent (bias 7), 3 mantissa bits; no infinities; `S.1111.111`
/// is NaN (OCP 8-bit floating point specification, v1.0, table 1; [`loupe_core::fp8`]).
pub fn f8_e4m3fn_to_f32(b: u8) -> f32 {
    loupe_core::fp8::e4m3fn_to_f32(b)
}

/// fp8 E5M2: 1 sign, 5 exponent (bias 15), 2 mantissa bits, IEEE 754 conventions: the top
/// byte of an f16, so widening it is exact.
pub fn f8_e5m2_to_f32(b: u8) -> f32 {
    loupe_core::fp8::e5m2_to_f32(b)
}

/// A validated tensor stored in some file: element type, shape, and where its elements
/// lie. Built by the format readers after every offset and extent has been checked
/// against the bytes, so converting it cannot read out of bounds.
#[derive(Debug, Clone)]
pub struct StoredTensor {
    /// The file it came from (named in errors).
    pub path: PathBuf,
    pub dtype: ElemType,
    /// Row-major shape.
    pub shape: Vec<usize>,
    /// Elements stored most-significant byte first (numpy `>f4`, a `.pt` with
    /// `byteorder` = `big`).
    pub big_endian: bool,
    layout: Layout,
    bytes: SharedBytes,
    /// The storage's byte range within `bytes`.
    range: Range<usize>,
}

#[derive(Debug, Clone, PartialEq)]
enum Layout {
    /// Row-major and dense from the start of the range.
    Contiguous,
    /// Element strides per dimension and an element offset into the storage (a PyTorch
    /// view, a Fortran-ordered npy array).
    Strided { strides: Vec<usize>, offset: usize },
}

/// Product of dims, checked, capped at [`MAX_ELEMENTS`].
pub(crate) fn element_count(path: &Path, field: &str, shape: &[usize]) -> Result<u64, FormatError> {
    if shape.len() > MAX_RANK {
        return Err(FormatError::TooLarge {
            path: path.to_path_buf(),
            field: format!("{field} rank"),
            value: shape.len() as u64,
            limit: MAX_RANK as u64,
        });
    }
    let mut n: u64 = 1;
    for &d in shape {
        n = n
            .checked_mul(d as u64)
            .ok_or_else(|| FormatError::invalid(path, field, format!("shape {shape:?} overflows")))?;
    }
    if n > MAX_ELEMENTS {
        return Err(FormatError::TooLarge {
            path: path.to_path_buf(),
            field: format!("{field} element count (shape {shape:?})"),
            value: n,
            limit: MAX_ELEMENTS,
        });
    }
    Ok(n)
}

impl StoredTensor {
    /// A dense row-major tensor whose bytes start at `region.start` in `bytes`; the region
    /// must hold exactly shape x dtype size bytes (`exact`) or at least that (`!exact`, for
    /// containers that pad).
    pub fn contiguous(
        path: &Path,
        field: &str,
        dtype: ElemType,
        shape: Vec<usize>,
        bytes: SharedBytes,
        region: Range<usize>,
        exact: bool,
    ) -> Result<StoredTensor, FormatError> {
        let n = element_count(path, field, &shape)?;
        let need = n
            .checked_mul(dtype.size() as u64)
            .and_then(|b| usize::try_from(b).ok())
            .ok_or_else(|| FormatError::invalid(path, field, "byte size overflows"))?;
        if region.start > region.end || region.end > bytes.len() {
            return Err(FormatError::invalid(path, field, "data lies outside the file"));
        }
        let have = region.end - region.start;
        if have < need || (exact && have != need) {
            return Err(FormatError::invalid(
                path,
                field,
                format!("{} {} elements of shape {shape:?} need {need} bytes, the file holds {have}", n, dtype.name()),
            ));
        }
        Ok(StoredTensor {
            path: path.to_path_buf(),
            dtype,
            shape,
            big_endian: false,
            layout: Layout::Contiguous,
            range: region.start..region.start + need,
            bytes,
        })
    }

    /// A strided view over a storage occupying `range` of `bytes` (element strides and
    /// offset, as PyTorch's `as_strided`). Every element the view can reach is checked to
    /// lie inside the storage.
    #[allow(clippy::too_many_arguments)] // as_strided's own argument list, plus provenance
    pub fn strided(
        path: &Path,
        field: &str,
        dtype: ElemType,
        shape: Vec<usize>,
        strides: Vec<usize>,
        offset: usize,
        bytes: SharedBytes,
        range: Range<usize>,
    ) -> Result<StoredTensor, FormatError> {
        let n = element_count(path, field, &shape)?;
        if strides.len() != shape.len() {
            return Err(FormatError::invalid(
                path,
                field,
                format!("{} strides for {} dimensions", strides.len(), shape.len()),
            ));
        }
        if range.end > bytes.len() || range.start > range.end {
            return Err(FormatError::invalid(path, field, "storage lies outside the file"));
        }
        let storage_elems = (range.end - range.start) / dtype.size();
        if n > 0 {
            // Highest element index reachable: offset + sum (dim-1) * stride.
            let mut last = offset as u64;
            for (&d, &s) in shape.iter().zip(&strides) {
                let step = (d as u64 - 1).checked_mul(s as u64);
                last = step
                    .and_then(|st| last.checked_add(st))
                    .ok_or_else(|| FormatError::invalid(path, field, "strided extent overflows"))?;
            }
            if last >= storage_elems as u64 {
                return Err(FormatError::invalid(
                    path,
                    field,
                    format!(
                        "view (shape {shape:?}, strides {strides:?}, offset {offset}) reaches element {last}, storage holds {storage_elems}"
                    ),
                ));
            }
        }
        let dense = row_major_strides(&shape);
        let layout = if offset == 0 && (strides == dense || n <= 1) {
            Layout::Contiguous
        } else {
            Layout::Strided { strides, offset }
        };
        Ok(StoredTensor { path: path.to_path_buf(), dtype, shape, big_endian: false, layout, bytes, range })
    }

    /// Marks the elements as big-endian.
    pub fn with_big_endian(mut self, big: bool) -> StoredTensor {
        self.big_endian = big;
        self
    }

    /// Reinterprets a 2-byte integer or opaque tensor as bf16 (numpy has no bfloat16, so
    /// dumpers store bf16 bits as `<u2` or `|V2` and flag the real type elsewhere).
    pub fn reinterpret(mut self, dtype: ElemType) -> Result<StoredTensor, FormatError> {
        if dtype.size() != self.dtype.size() {
            return Err(FormatError::invalid(
                &self.path,
                "dtype",
                format!("cannot reinterpret {} as {} (element sizes differ)", self.dtype.name(), dtype.name()),
            ));
        }
        self.dtype = dtype;
        Ok(self)
    }

    /// Number of elements (checked at construction).
    pub fn n_elements(&self) -> usize {
        self.shape.iter().product()
    }

    /// Whether the elements are dense, row-major and little-endian: [`Self::raw_bytes`]
    /// then returns them.
    pub fn is_contiguous(&self) -> bool {
        self.layout == Layout::Contiguous && !self.big_endian
    }

    /// The element bytes of a contiguous little-endian tensor (a slice of the mapping).
    pub fn raw_bytes(&self) -> Option<&[u8]> {
        if self.is_contiguous() {
            self.bytes.get(self.range.clone())
        } else {
            None
        }
    }

    /// The values as f32 in row-major order.
    pub fn to_f32(&self) -> Result<Vec<f32>, FormatError> {
        let n = self.n_elements();
        let mut out: Vec<f32> = Vec::new();
        // A failed allocation aborts the process in Rust; ask for it fallibly.
        out.try_reserve_exact(n).map_err(|_| FormatError::TooLarge {
            path: self.path.clone(),
            field: "tensor allocation (f32 elements)".into(),
            value: n as u64,
            limit: MAX_ELEMENTS,
        })?;
        let es = self.dtype.size();
        let data = self.bytes.get(self.range.clone()).unwrap_or_default();
        match &self.layout {
            Layout::Contiguous => {
                let data = data.get(..n * es).unwrap_or_default();
                if self.dtype == ElemType::F32 && !self.big_endian {
                    out.extend(data.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])));
                } else {
                    out.extend(data.chunks_exact(es).map(|c| self.dtype.decode(c, self.big_endian)));
                }
            }
            Layout::Strided { strides, offset } => {
                if n > 0 {
                    self.gather(data, strides, *offset, &mut out);
                }
            }
        }
        if out.len() != n {
            return Err(FormatError::invalid(
                &self.path,
                "tensor data",
                format!("decoded {} elements, expected {n}", out.len()),
            ));
        }
        Ok(out)
    }

    /// Walks the view in row-major order (an odometer over the indices).
    fn gather(&self, data: &[u8], strides: &[usize], offset: usize, out: &mut Vec<f32>) {
        let es = self.dtype.size();
        let rank = self.shape.len();
        if rank == 0 {
            let b = data.get(offset * es..offset * es + es).unwrap_or_default();
            out.push(self.dtype.decode(b, self.big_endian));
            return;
        }
        let (inner_len, inner_stride) = (self.shape[rank - 1], strides[rank - 1]);
        let mut idx = vec![0usize; rank - 1];
        loop {
            let base: usize = offset + idx.iter().zip(strides).map(|(i, s)| i * s).sum::<usize>();
            for j in 0..inner_len {
                let e = (base + j * inner_stride) * es;
                // In bounds: the reachable extent was checked at construction.
                let b = data.get(e..e + es).unwrap_or_default();
                out.push(self.dtype.decode(b, self.big_endian));
            }
            // Advance the odometer over the outer dimensions.
            let mut k = rank - 1;
            loop {
                if k == 0 {
                    return;
                }
                k -= 1;
                idx[k] += 1;
                if idx[k] < self.shape[k] {
                    break;
                }
                idx[k] = 0;
            }
        }
    }
}

/// Row-major element strides of `shape`.
pub fn row_major_strides(shape: &[usize]) -> Vec<usize> {
    let mut strides = vec![1usize; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1].saturating_mul(shape[i + 1]);
    }
    strides
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fp8_decoding_matches_the_ocp_tables() {
        // E4M3FN: 0x38 = 1.0, 0x7e = 448 (max), 0x7f = NaN, 0x01 = 2^-9 (min subnormal).
        assert_eq!(f8_e4m3fn_to_f32(0x38), 1.0);
        assert_eq!(f8_e4m3fn_to_f32(0x7e), 448.0);
        assert!(f8_e4m3fn_to_f32(0x7f).is_nan());
        assert_eq!(f8_e4m3fn_to_f32(0x01), 2f32.powi(-9));
        assert_eq!(f8_e4m3fn_to_f32(0xb8), -1.0);
        // E5M2: 0x3c = 1.0, 0x7b = 57344 (max), 0x7c = inf.
        assert_eq!(f8_e5m2_to_f32(0x3c), 1.0);
        assert_eq!(f8_e5m2_to_f32(0x7b), 57344.0);
        assert_eq!(f8_e5m2_to_f32(0x7c), f32::INFINITY);
    }

    #[test]
    fn e5m2_widens_as_the_top_byte_of_an_ieee_half() {
        for b in 0..=255u8 {
            let (x, h) = (f8_e5m2_to_f32(b), half::f16::from_bits(u16::from(b) << 8).to_f32());
            assert!(x == h || (x.is_nan() && h.is_nan()), "{b:#04x}: {x} vs {h}");
        }
    }

    #[test]
    fn strided_views_gather_in_row_major_order() {
        // Storage 0..6 as a 2x3 matrix; its transpose is shape [3, 2], strides [1, 3].
        let bytes: Vec<u8> = (0..6).flat_map(|v| (v as f32).to_le_bytes()).collect();
        let b = SharedBytes::from_vec(bytes);
        let p = Path::new("t");
        let t = StoredTensor::strided(p, "t", ElemType::F32, vec![3, 2], vec![1, 3], 0, b.clone(), 0..24)
            .expect("valid view");
        assert_eq!(t.to_f32().ok(), Some(vec![0.0, 3.0, 1.0, 4.0, 2.0, 5.0]));
        assert!(!t.is_contiguous());
        // An offset view of the last two elements.
        let t = StoredTensor::strided(p, "t", ElemType::F32, vec![2], vec![1], 4, b.clone(), 0..24).expect("valid");
        assert_eq!(t.to_f32().ok(), Some(vec![4.0, 5.0]));
        // Reaching past the storage is refused.
        let err = StoredTensor::strided(p, "t", ElemType::F32, vec![3], vec![2], 2, b, 0..24).unwrap_err().to_string();
        assert!(err.contains("reaches element 6"), "{err}");
    }

    #[test]
    fn expanded_views_cannot_claim_unbounded_memory() {
        let b = SharedBytes::from_vec(vec![0; 4]);
        let err =
            StoredTensor::strided(Path::new("t"), "t", ElemType::F32, vec![1 << 40], vec![0], 0, b, 0..4).unwrap_err();
        assert!(matches!(err, FormatError::TooLarge { .. }), "{err}");
    }
}
