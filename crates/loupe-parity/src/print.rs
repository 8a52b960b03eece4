//! MAX's tensor print styles, byte for byte as MAX 26.7 prints them (the fixtures under
//! `tests/fixtures/max-26.7/`, made by `scripts/max-fixtures`, are the specification; the
//! tests in `tests/max_fixtures.rs` compare against them).
//!
//! COMPACT: `label = tensor(BODY, dtype=f32, shape=[2,3])`. The tensor is a series of 2-D
//! matrices (leading dims flattened; a rank-0 or rank-1 tensor is one row), each `[` rows `]`;
//! one extra bracket pair per dimension beyond 2 around the whole. Rows are joined by `",\n"`,
//! matrices by `",\n\n"`. A row of 7 or more elements shows its first and last 3 around
//! `..., `; 7 or more rows (or matrices) show their first and last 3 with `"\n ..., \n"`
//! between (after the row's comma, before the matrix's). Floats in 4 fixed decimals, cut at
//! 31 characters as MAX cuts them (f32's largest value prints as 31 digits, no point); `nan`, `INF`, `-INF`; integers in full; booleans
//! `True` / `False`. An empty tensor's body is `[]`.
//!
//! FULL: `label = tensor<2x3xf32> [a, b, ...]`, every element in one flat list, floats in C's
//! `%.{digits}e` form (`-8.333333e-01`).

use loupe_formats::{FormatError, StoredTensor};

/// Elision rule of COMPACT: runs of this length or more are abbreviated.
const ELIDE_AT: usize = 7;
const EDGE: usize = ELIDE_AT / 2;
/// Between the kept rows or matrices of an elided run.
const ROW_FILLER: &str = "\n ..., \n";
/// MAX formats a COMPACT float into a 32-byte buffer: longer numbers lose their tail.
const MAX_FLOAT_CHARS: usize = 31;

/// A tensor's elements as the printer reads them.
#[derive(Debug, Clone, Copy)]
pub enum PrintData<'a> {
    /// Floating-point elements of any width, widened exactly to f32 (f16, bf16, fp8, f32).
    F32(&'a [f32]),
    F64(&'a [f64]),
    /// Signed integers of any width, widened.
    Int(&'a [i64]),
    /// Unsigned integers of any width, widened.
    UInt(&'a [u64]),
    Bool(&'a [bool]),
}

impl PrintData<'_> {
    fn len(&self) -> usize {
        match self {
            PrintData::F32(v) => v.len(),
            PrintData::F64(v) => v.len(),
            PrintData::Int(v) => v.len(),
            PrintData::UInt(v) => v.len(),
            PrintData::Bool(v) => v.len(),
        }
    }

    /// Element `i` in `style`; `None` past the end.
    fn element(&self, i: usize, style: Style) -> Option<String> {
        Some(match self {
            PrintData::F32(v) => style.float(f64::from(*v.get(i)?)),
            PrintData::F64(v) => style.float(*v.get(i)?),
            PrintData::Int(v) => v.get(i)?.to_string(),
            PrintData::UInt(v) => v.get(i)?.to_string(),
            PrintData::Bool(v) => if *v.get(i)? { "True" } else { "False" }.to_string(),
        })
    }
}

/// One tensor to print: MAX's dtype name (`f32`, `bf16`, `si8`, ...; see [`max_dtype_name`]),
/// its shape and its elements in row-major order.
#[derive(Debug, Clone, Copy)]
pub struct Printable<'a> {
    pub dtype: &'a str,
    pub shape: &'a [usize],
    pub data: PrintData<'a>,
}

#[derive(Debug, Clone, Copy)]
enum Style {
    Compact,
    Full(usize),
}

impl Style {
    fn float(self, v: f64) -> String {
        if v.is_nan() {
            return "nan".into();
        }
        if v.is_infinite() {
            return if v > 0.0 { "INF" } else { "-INF" }.into();
        }
        match self {
            Style::Compact => {
                let mut s = format!("{v:.4}");
                s.truncate(MAX_FLOAT_CHARS);
                s
            }
            Style::Full(digits) => c_exponent(v, digits),
        }
    }
}

/// `v` as C's `printf("%.{digits}e", v)`: at least two exponent digits, with a sign.
pub fn c_exponent(v: f64, digits: usize) -> String {
    let s = format!("{v:.digits$e}");
    let Some((mantissa, exp)) = s.split_once('e') else { return s };
    let (sign, digits_part) = match exp.strip_prefix('-') {
        Some(d) => ('-', d),
        None => ('+', exp),
    };
    format!("{mantissa}e{sign}{digits_part:0>2}")
}

/// MAX's name for a loupe element type in prints (`si8`, `ui8`, `bf16`, ...). The FP8 names
/// are loupe's guess: MAX 26.7 refused an FP8 print on the CPU, so no fixture shows one.
pub fn max_dtype_name(elem: loupe_formats::elem::ElemType) -> &'static str {
    use loupe_formats::elem::ElemType as E;
    match elem {
        E::Bool => "bool",
        E::U8 => "ui8",
        E::U16 => "ui16",
        E::U32 => "ui32",
        E::U64 => "ui64",
        E::I8 => "si8",
        E::I16 => "si16",
        E::I32 => "si32",
        E::I64 => "si64",
        E::F16 => "f16",
        E::BF16 => "bf16",
        E::F32 => "f32",
        E::F64 => "f64",
        E::F8E4M3Fn => "f8e4m3fn",
        E::F8E5M2 => "f8e5m2",
    }
}

/// A tensor's elements, owned, in the widest type of their kind (what [`PrintData`] borrows).
#[derive(Debug, Clone, PartialEq)]
pub enum Values {
    F32(Vec<f32>),
    F64(Vec<f64>),
    Int(Vec<i64>),
    UInt(Vec<u64>),
    Bool(Vec<bool>),
}

impl Values {
    pub fn data(&self) -> PrintData<'_> {
        match self {
            Values::F32(v) => PrintData::F32(v),
            Values::F64(v) => PrintData::F64(v),
            Values::Int(v) => PrintData::Int(v),
            Values::UInt(v) => PrintData::UInt(v),
            Values::Bool(v) => PrintData::Bool(v),
        }
    }

    /// The elements of a stored tensor in their own kind: integers and f64 exactly when the
    /// tensor is dense and little-endian (`.max`, most `.npy`), through f32 otherwise.
    pub fn of(t: &StoredTensor) -> Result<Values, FormatError> {
        use loupe_formats::elem::ElemType as E;
        let raw = t.raw_bytes();
        let ints = |raw: &[u8], size: usize, signed: bool| -> Vec<i128> {
            raw.chunks_exact(size)
                .map(|c| {
                    let mut b = [0u8; 16];
                    b[..size].copy_from_slice(c);
                    if signed && c[size - 1] & 0x80 != 0 {
                        b[size..].fill(0xff);
                    }
                    i128::from_le_bytes(b)
                })
                .collect()
        };
        let widened = || t.to_f32();
        Ok(match (t.dtype, raw) {
            (E::F64, Some(r)) => Values::F64(
                r.chunks_exact(8)
                    .map(|c| f64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
                    .collect(),
            ),
            (E::I8 | E::I16 | E::I32 | E::I64, Some(r)) => {
                Values::Int(ints(r, t.dtype.size(), true).into_iter().map(|v| v as i64).collect())
            }
            (E::U8 | E::U16 | E::U32 | E::U64, Some(r)) => {
                Values::UInt(ints(r, t.dtype.size(), false).into_iter().map(|v| v as u64).collect())
            }
            (E::Bool, _) => Values::Bool(widened()?.into_iter().map(|v| v != 0.0).collect()),
            (E::I8 | E::I16 | E::I32 | E::I64, None) => Values::Int(widened()?.into_iter().map(|v| v as i64).collect()),
            (E::U8 | E::U16 | E::U32 | E::U64, None) => {
                Values::UInt(widened()?.into_iter().map(|v| v as u64).collect())
            }
            (E::F64 | E::F32 | E::F16 | E::BF16 | E::F8E4M3Fn | E::F8E5M2, _) => Values::F32(widened()?),
        })
    }
}

/// One f32 tensor in COMPACT style (loupe's graph values, which are f32).
pub fn compact(label: &str, shape: &[usize], data: &[f32]) -> String {
    compact_of(label, &Printable { dtype: "f32", shape, data: PrintData::F32(data) })
}

/// One f32 tensor in FULL style, `digits` digits after the point.
pub fn full(label: &str, shape: &[usize], data: &[f32], digits: usize) -> String {
    full_of(label, &Printable { dtype: "f32", shape, data: PrintData::F32(data) }, digits)
}

/// One tensor of any element type in COMPACT style.
pub fn compact_of(label: &str, t: &Printable<'_>) -> String {
    let dims: Vec<String> = t.shape.iter().map(|d| d.to_string()).collect();
    format!("{label} = tensor({}, dtype={}, shape=[{}])", body(t), t.dtype, dims.join(","))
}

/// One tensor of any element type in FULL style, `digits` digits after the point.
pub fn full_of(label: &str, t: &Printable<'_>, digits: usize) -> String {
    let mut ty: String = t.shape.iter().map(|d| format!("{d}x")).collect();
    ty.push_str(t.dtype);
    let n = t.data.len();
    let values: Vec<String> = (0..n).filter_map(|i| t.data.element(i, Style::Full(digits))).collect();
    format!("{label} = tensor<{ty}> [{}]", values.join(", "))
}

fn row(out: &mut String, t: &Printable<'_>, start: usize, cols: usize) {
    let el = |i: usize| t.data.element(start + i, Style::Compact).unwrap_or_default();
    let join = |r: std::ops::Range<usize>| r.map(el).collect::<Vec<_>>().join(", ");
    out.push('[');
    if cols >= ELIDE_AT {
        out.push_str(&join(0..EDGE));
        out.push_str(", ..., ");
        out.push_str(&join(cols - EDGE..cols));
    } else {
        out.push_str(&join(0..cols));
    }
    out.push(']');
}

/// The indices shown of a run of `n`: all, or the first and last [`EDGE`] with a gap.
fn shown(n: usize) -> Vec<Option<usize>> {
    if n >= ELIDE_AT {
        (0..EDGE).map(Some).chain(std::iter::once(None)).chain((n - EDGE..n).map(Some)).collect()
    } else {
        (0..n).map(Some).collect()
    }
}

fn body(t: &Printable<'_>) -> String {
    let shape = t.shape;
    if t.data.len() == 0 {
        return "[]".into();
    }
    let rank = shape.len();
    let cols = shape.last().copied().unwrap_or(1);
    let rows = if rank < 2 { 1 } else { shape[rank - 2] };
    let mats: usize = if rank > 2 { shape[..rank - 2].iter().product() } else { 1 };
    let extra = rank.saturating_sub(2);
    let mut out = "[".repeat(extra);
    let mut first_mat = true;
    for m in shown(mats) {
        let Some(m) = m else {
            out.push_str(ROW_FILLER);
            continue;
        };
        if !first_mat {
            out.push_str(",\n\n");
        }
        first_mat = false;
        out.push('[');
        let mut first_row = true;
        for r in shown(rows) {
            let Some(r) = r else {
                out.push_str(ROW_FILLER);
                continue;
            };
            if !first_row {
                // After an elided run the filler already ends the line.
                if !out.ends_with(ROW_FILLER) {
                    out.push(',');
                }
                out.push('\n');
            }
            first_row = false;
            row(&mut out, t, (m * rows + r) * cols, cols);
            if rows >= ELIDE_AT && r == EDGE - 1 {
                out.push(',');
            }
        }
        out.push(']');
    }
    out.push_str(&"]".repeat(extra));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compact_matches_max_example() {
        let data = vec![1.12345f32; 20];
        assert_eq!(
            compact("a", &[20], &data),
            "a = tensor([[1.1235, 1.1235, 1.1235, ..., 1.1235, 1.1235, 1.1235]], dtype=f32, shape=[20])"
        );
    }

    #[test]
    fn short_dims_are_not_elided_and_full_prints_everything() {
        assert_eq!(
            compact("b", &[2, 2], &[1.0, 2.0, 3.0, -4.5]),
            "b = tensor([[1.0000, 2.0000],\n[3.0000, -4.5000]], dtype=f32, shape=[2,2])"
        );
        assert_eq!(full("c", &[2], &[-0.8333333, f32::INFINITY], 6), "c = tensor<2xf32> [-8.333333e-01, INF]");
        assert_eq!(full("d", &[], &[3.25], 3), "d = tensor<f32> [3.250e+00]");
    }

    #[test]
    fn c_exponents_have_two_digits_and_a_sign() {
        assert_eq!(c_exponent(f64::from(1e-40f32), 6), "9.999946e-41");
        assert_eq!(c_exponent(1e300, 2), "1.00e+300");
        assert_eq!(c_exponent(0.0, 1), "0.0e+00");
    }
}
