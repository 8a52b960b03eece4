//! `.npy` files: reader (format versions 1.0, 2.0, 3.0) and an f32 writer.
//!
//! Layout (numpy `numpy/lib/format.py`, NEP 1 "A simple file format for NumPy arrays"):
//! 1. magic `\x93NUMPY` (6 bytes), u8 major, u8 minor (1.0, 2.0 or 3.0)
//! 2. header length: u16 little-endian (1.0) or u32 little-endian (2.0, 3.0)
//! 3. the header: an ASCII (1.0, 2.0) or UTF-8 (3.0) Python dict literal
//!    `{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }`, padded with spaces and
//!    a final `\n` so that the data starts on a multiple of 64 bytes (16 before numpy 1.?).
//! 4. the array data, C or Fortran order, exactly shape x itemsize bytes.
//!
//! Hardening: the header length is capped ([`MAX_HEADER_LEN`]) and checked against the
//! file before reading; the dict parser accepts only the literal forms numpy writes (no
//! `eval`); the rank, the element count and the byte length are checked before any view
//! is built. Structured and object dtypes (which numpy can only load with pickles) are
//! refused.

use std::path::{Path, PathBuf};

use crate::elem::{row_major_strides, ElemType, StoredTensor, MAX_RANK};
use crate::storage::SharedBytes;
use crate::zip_archive::Region;
use crate::FormatError;

/// The magic string `\x93NUMPY`.
pub const NPY_MAGIC: [u8; 6] = *b"\x93NUMPY";

/// Longest header accepted. numpy itself refuses headers over 10,000 bytes unless asked
/// (`max_header_size` in `numpy.lib.format.read_array_header_*`, numpy >= 1.24); a header
/// of a plain dtype with 64 dimensions is under 2 KB. We allow 10x numpy's default.
pub const MAX_HEADER_LEN: usize = 100_000;

/// An opened, validated `.npy` file.
#[derive(Debug, Clone)]
pub struct NpyFile {
    pub path: PathBuf,
    /// Format version `(major, minor)`.
    pub version: (u8, u8),
    /// The `descr` string as written (`<f4`, `|b1`, `<V2`...).
    pub descr: String,
    /// The element type `descr` names; `None` for opaque `V2` (bf16 bits without a flag).
    pub dtype: Option<ElemType>,
    pub big_endian: bool,
    pub fortran_order: bool,
    pub shape: Vec<usize>,
    /// Byte offset of the data within the shared bytes.
    pub data_offset: usize,
    /// End of the npy image within the shared bytes.
    end: usize,
    bytes: SharedBytes,
}

fn region_slice(bytes: &SharedBytes, start: usize, end: usize) -> &[u8] {
    bytes.get(start..end).unwrap_or_default()
}

impl NpyFile {
    /// Memory-maps and validates `path`.
    pub fn open(path: impl AsRef<Path>) -> Result<NpyFile, FormatError> {
        let path = path.as_ref();
        NpyFile::from_shared(path.to_path_buf(), SharedBytes::map_file(path)?)
    }

    /// Validates an in-memory image; `label` names it in errors.
    pub fn from_bytes(label: impl Into<PathBuf>, bytes: Vec<u8>) -> Result<NpyFile, FormatError> {
        NpyFile::from_shared(label.into(), SharedBytes::from_vec(bytes))
    }

    /// Validates shared bytes (a whole file's map or buffer).
    pub fn from_shared(path: PathBuf, bytes: SharedBytes) -> Result<NpyFile, FormatError> {
        let range = 0..bytes.len();
        NpyFile::from_region(path, Region { bytes, range })
    }

    /// Validates an npy image that occupies a region of shared bytes (a stored member of
    /// an npz archive, served from the archive's map).
    pub fn from_region(path: PathBuf, region: Region) -> Result<NpyFile, FormatError> {
        let base = region.range.start;
        let end = region.range.end;
        let whole = region.bytes;
        let bytes = region_slice(&whole, base, end);
        let file_len = bytes.len() as u64;
        let truncated = |field: &str, offset: u64| FormatError::Truncated {
            path: path.clone(),
            field: field.into(),
            offset,
            file_len,
        };
        let magic = bytes.get(..6).ok_or_else(|| truncated("magic", 0))?;
        if magic != NPY_MAGIC {
            return Err(FormatError::BadMagic { path, format: "npy", found: format!("{magic:02x?}") });
        }
        let version = match bytes.get(6..8) {
            Some(&[a, b]) => (a, b),
            _ => return Err(truncated("version", 6)),
        };
        let (len_size, utf8) = match version {
            (1, 0) => (2usize, false),
            (2, 0) => (4, false),
            (3, 0) => (4, true),
            (a, b) => {
                return Err(FormatError::Unsupported {
                    path,
                    what: format!("npy format version {a}.{b} (1.0, 2.0 and 3.0 are known)"),
                })
            }
        };
        let len_bytes = bytes.get(8..8 + len_size).ok_or_else(|| truncated("header length", 8))?;
        let header_len = match *len_bytes {
            [a, b] => usize::from(u16::from_le_bytes([a, b])),
            [a, b, c, d] => u32::from_le_bytes([a, b, c, d]) as usize,
            _ => return Err(truncated("header length", 8)),
        };
        if header_len > MAX_HEADER_LEN {
            return Err(FormatError::TooLarge {
                path,
                field: "npy header length".into(),
                value: header_len as u64,
                limit: MAX_HEADER_LEN as u64,
            });
        }
        let start = 8 + len_size;
        let data_offset = start + header_len;
        let raw = bytes
            .get(start..data_offset)
            .ok_or_else(|| truncated(&format!("header ({header_len} bytes declared)"), start as u64))?;
        let text = if utf8 {
            std::str::from_utf8(raw).ok()
        } else {
            raw.is_ascii().then(|| std::str::from_utf8(raw).ok()).flatten()
        }
        .ok_or_else(|| FormatError::invalid(&path, "npy header", "not ASCII/UTF-8 text"))?;
        let h = parse_header(&path, text)?;
        let (dtype, big_endian) = parse_descr(&path, &h.descr)?;
        let file = NpyFile {
            path,
            version,
            descr: h.descr,
            dtype,
            big_endian,
            fortran_order: h.fortran_order,
            shape: h.shape,
            data_offset: base + data_offset,
            end,
            bytes: whole,
        };
        // Check the data length now (with a 2-byte stand-in for opaque V2) so that a
        // truncated file fails at open, not at first use.
        file.view(dtype.unwrap_or(ElemType::U16))?;
        Ok(file)
    }

    /// The array as a [`StoredTensor`]. Opaque `V2` data needs [`NpyFile::tensor_as`].
    pub fn tensor(&self) -> Result<StoredTensor, FormatError> {
        match self.dtype {
            Some(t) => self.view(t),
            None => Err(FormatError::Unsupported {
                path: self.path.clone(),
                what: format!(
                    "npy dtype '{}' without a declared element type (bf16 bits are stored as V2; say dtype bf16 in the manifest)",
                    self.descr
                ),
            }),
        }
    }

    /// The array read as `dtype`: used when a manifest says that `<u2` / `V2` data holds
    /// bf16 bits. Element sizes must agree.
    pub fn tensor_as(&self, dtype: ElemType) -> Result<StoredTensor, FormatError> {
        let stored = self.dtype.unwrap_or(ElemType::U16);
        self.view(stored)?.reinterpret(dtype)
    }

    fn view(&self, dtype: ElemType) -> Result<StoredTensor, FormatError> {
        let t = if self.fortran_order && self.shape.len() > 1 {
            // Fortran order: the first index varies fastest, i.e. row-major strides of the
            // reversed shape, reversed.
            let rev: Vec<usize> = self.shape.iter().rev().copied().collect();
            let strides: Vec<usize> = row_major_strides(&rev).into_iter().rev().collect();
            let n = crate::elem::element_count(&self.path, "npy data", &self.shape)?;
            let end = (n as usize)
                .checked_mul(dtype.size())
                .and_then(|b| b.checked_add(self.data_offset))
                .filter(|&e| e == self.end)
                .ok_or_else(|| self.length_error(dtype, n))?;
            StoredTensor::strided(
                &self.path,
                "npy data",
                dtype,
                self.shape.clone(),
                strides,
                0,
                self.bytes.clone(),
                self.data_offset..end,
            )?
        } else {
            StoredTensor::contiguous(
                &self.path,
                "npy data",
                dtype,
                self.shape.clone(),
                self.bytes.clone(),
                self.data_offset..self.end,
                true,
            )?
        };
        Ok(t.with_big_endian(self.big_endian))
    }

    fn length_error(&self, dtype: ElemType, n: u64) -> FormatError {
        FormatError::invalid(
            &self.path,
            "npy data",
            format!(
                "shape {:?} of {} needs {} bytes, the file holds {}",
                self.shape,
                dtype.name(),
                n.saturating_mul(dtype.size() as u64),
                self.end.saturating_sub(self.data_offset)
            ),
        )
    }
}

/// The three keys of an npy header.
struct Header {
    descr: String,
    fortran_order: bool,
    shape: Vec<usize>,
}

/// Maps a `descr` to an element type. `=` means native order; every machine loupe runs on
/// is little-endian. Returns `None` for `V2` (opaque two bytes, bf16 in practice).
fn parse_descr(path: &Path, descr: &str) -> Result<(Option<ElemType>, bool), FormatError> {
    let unsupported = || FormatError::Unsupported { path: path.to_path_buf(), what: format!("npy dtype '{descr}'") };
    let mut chars = descr.chars();
    let order = chars.next().ok_or_else(unsupported)?;
    let big = match order {
        '<' | '|' | '=' => false,
        '>' => true,
        _ => return Err(unsupported()),
    };
    let t = match chars.as_str() {
        "f2" => ElemType::F16,
        "f4" => ElemType::F32,
        "f8" => ElemType::F64,
        "i1" => ElemType::I8,
        "i2" => ElemType::I16,
        "i4" => ElemType::I32,
        "i8" => ElemType::I64,
        "u1" => ElemType::U8,
        "u2" => ElemType::U16,
        "u4" => ElemType::U32,
        "u8" => ElemType::U64,
        "b1" => ElemType::Bool,
        "V2" => return Ok((None, big)),
        _ => return Err(unsupported()),
    };
    Ok((Some(t), big))
}

/// Parses the header dict: exactly the keys `descr`, `fortran_order` and `shape`.
fn parse_header(path: &Path, text: &str) -> Result<Header, FormatError> {
    let err = |reason: String| FormatError::invalid(path, "npy header", reason);
    let mut p = Lexer { s: text.as_bytes(), i: 0 };
    p.expect(b'{').map_err(&err)?;
    let (mut descr, mut fortran, mut shape) = (None, None, None);
    loop {
        p.skip_ws();
        if p.eat(b'}') {
            break;
        }
        let key = p.string().map_err(&err)?;
        p.expect(b':').map_err(&err)?;
        match key.as_str() {
            "descr" if descr.is_none() => descr = Some(p.string().map_err(&err)?),
            "fortran_order" if fortran.is_none() => fortran = Some(p.boolean().map_err(&err)?),
            "shape" if shape.is_none() => shape = Some(p.int_tuple().map_err(&err)?),
            "descr" | "fortran_order" | "shape" => return Err(err(format!("duplicate key '{key}'"))),
            _ => return Err(err(format!("unexpected key '{key}'"))),
        }
        p.skip_ws();
        if !p.eat(b',') {
            p.expect(b'}').map_err(&err)?;
            break;
        }
    }
    if !text.get(p.i..).unwrap_or("").trim().is_empty() {
        return Err(err("text after the closing brace".into()));
    }
    match (descr, fortran, shape) {
        (Some(descr), Some(fortran_order), Some(shape)) => Ok(Header { descr, fortran_order, shape }),
        _ => Err(err("missing one of 'descr', 'fortran_order', 'shape'".into())),
    }
}

/// A cursor over the Python literal subset numpy writes.
struct Lexer<'a> {
    s: &'a [u8],
    i: usize,
}

impl Lexer<'_> {
    fn skip_ws(&mut self) {
        while self.s.get(self.i).is_some_and(|c| c.is_ascii_whitespace()) {
            self.i += 1;
        }
    }
    fn eat(&mut self, c: u8) -> bool {
        self.skip_ws();
        if self.s.get(self.i) == Some(&c) {
            self.i += 1;
            true
        } else {
            false
        }
    }
    fn expect(&mut self, c: u8) -> Result<(), String> {
        if self.eat(c) {
            Ok(())
        } else {
            Err(format!("expected '{}' at byte {}", c as char, self.i))
        }
    }
    /// A quoted string without escapes (numpy's keys and simple descrs have none).
    fn string(&mut self) -> Result<String, String> {
        self.skip_ws();
        let q = match self.s.get(self.i) {
            Some(&q @ (b'\'' | b'"')) => q,
            _ => return Err(format!("expected a quoted string at byte {}", self.i)),
        };
        let start = self.i + 1;
        let len = self.s.get(start..).unwrap_or_default().iter().position(|&c| c == q);
        let end = start + len.ok_or("unterminated string")?;
        let body = self.s.get(start..end).unwrap_or_default();
        if body.contains(&b'\\') || body.len() > 64 {
            return Err(format!("unsupported string at byte {start}"));
        }
        self.i = end + 1;
        String::from_utf8(body.to_vec()).map_err(|_| "string is not UTF-8".to_string())
    }
    fn boolean(&mut self) -> Result<bool, String> {
        self.skip_ws();
        let rest = self.s.get(self.i..).unwrap_or_default();
        for (word, v) in [(&b"True"[..], true), (&b"False"[..], false)] {
            if rest.starts_with(word) {
                self.i += word.len();
                return Ok(v);
            }
        }
        Err(format!("expected True or False at byte {}", self.i))
    }
    /// `()`, `(5,)`, `(2, 3)`, `(2, 3,)`: non-negative integers (Python 2 wrote `3L`).
    fn int_tuple(&mut self) -> Result<Vec<usize>, String> {
        self.expect(b'(')?;
        let mut dims = Vec::new();
        loop {
            if self.eat(b')') {
                return Ok(dims);
            }
            if dims.len() >= MAX_RANK {
                return Err(format!("more than {MAX_RANK} dimensions"));
            }
            self.skip_ws();
            let start = self.i;
            while self.s.get(self.i).is_some_and(u8::is_ascii_digit) {
                self.i += 1;
            }
            let digits = std::str::from_utf8(self.s.get(start..self.i).unwrap_or_default()).unwrap_or("");
            let d: usize = digits.parse().map_err(|_| format!("bad dimension '{digits}' at byte {start}"))?;
            dims.push(d);
            if self.s.get(self.i) == Some(&b'L') {
                self.i += 1;
            }
            if !self.eat(b',') {
                self.expect(b')')?;
                return Ok(dims);
            }
        }
    }
}

/// The bytes of a version 1.0 `.npy` file holding `data` (little-endian, C order) with
/// the given `descr`. The header is padded to a multiple of 64 bytes, as numpy does.
pub fn npy_bytes_raw(descr: &str, shape: &[usize], data: &[u8]) -> Vec<u8> {
    let dims = match shape {
        [] => "()".to_string(),
        [d] => format!("({d},)"),
        _ => format!("({})", shape.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(", ")),
    };
    let mut header = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {dims}, }}");
    // 10 bytes of preamble + header + '\n' must be a multiple of 64.
    while (10 + header.len() + 1) % 64 != 0 {
        header.push(' ');
    }
    header.push('\n');
    let mut out = Vec::with_capacity(10 + header.len() + data.len());
    out.extend_from_slice(&NPY_MAGIC);
    out.extend_from_slice(&[1, 0]);
    // A rank-64 shape still fits in a u16 header; saturate rather than wrap otherwise.
    out.extend_from_slice(&u16::try_from(header.len()).unwrap_or(u16::MAX).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    out.extend_from_slice(data);
    out
}

/// The bytes of an f32 `.npy` file.
pub fn npy_bytes(shape: &[usize], data: &[f32]) -> Vec<u8> {
    let raw: Vec<u8> = data.iter().flat_map(|v| v.to_le_bytes()).collect();
    npy_bytes_raw("<f4", shape, &raw)
}

/// Writes an f32 `.npy` file (version 1.0, C order) that numpy loads as `float32`.
pub fn write_npy(path: impl AsRef<Path>, shape: &[usize], data: &[f32]) -> Result<(), FormatError> {
    let path = path.as_ref();
    let n = shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
    if n != Some(data.len()) {
        return Err(FormatError::invalid(
            path,
            "npy data",
            format!("shape {shape:?} does not hold {} values", data.len()),
        ));
    }
    std::fs::write(path, npy_bytes(shape, data)).map_err(|source| FormatError::Io { path: path.to_path_buf(), source })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_what_it_reads() {
        let bytes = npy_bytes(&[2, 3], &[0.0, 1.0, 2.0, 3.0, 4.0, 5.0]);
        assert_eq!((bytes.len() - 24) % 64, 0, "data starts on a 64-byte boundary");
        let f = NpyFile::from_bytes("a.npy", bytes).expect("valid");
        assert_eq!(f.shape, [2, 3]);
        assert_eq!(f.descr, "<f4");
        let t = f.tensor().expect("f32");
        assert!(t.is_contiguous());
        assert_eq!(t.to_f32().ok(), Some(vec![0.0, 1.0, 2.0, 3.0, 4.0, 5.0]));
    }

    #[test]
    fn header_forms() {
        let ok = |h: &str| parse_header(Path::new("h"), h).map(|h| h.shape);
        assert_eq!(ok("{'descr': '<f4', 'fortran_order': False, 'shape': (), }").ok(), Some(vec![]));
        assert_eq!(ok("{\"shape\": (3L, 4L), 'descr': '<f4', 'fortran_order': True}").ok(), Some(vec![3, 4]));
        assert_eq!(ok("{'descr':'<f4','fortran_order':False,'shape':(5,)}  \n").ok(), Some(vec![5]));
        for bad in [
            "{'descr': '<f4', 'fortran_order': False}",
            "{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': ()}",
            "{'descr': '<f4', 'fortran_order': 0, 'shape': ()}",
            "{'descr': '<f4', 'fortran_order': False, 'shape': (-1,)}",
            "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), 'x': 1}",
            "{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999999,)}",
            "{'descr': '<f4', 'fortran_order': False, 'shape': ()} junk",
            "{'descr': '<f4",
        ] {
            assert!(ok(bad).is_err(), "accepted {bad}");
        }
    }
}
