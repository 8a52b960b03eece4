//! GGUF metadata values: the 13 value types, their on-disk tags and sizes, and a
//! human-readable `Display` for `loupe inspect`.

use std::fmt;

/// The type tag of a metadata value (`enum gguf_type` in ggml/include/gguf.h).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GgufValueType {
    U8,
    I8,
    U16,
    I16,
    U32,
    I32,
    F32,
    Bool,
    String,
    Array,
    U64,
    I64,
    F64,
}

impl GgufValueType {
    /// Every value type, in tag order (tag = index).
    pub const ALL: [GgufValueType; 13] = [
        GgufValueType::U8,
        GgufValueType::I8,
        GgufValueType::U16,
        GgufValueType::I16,
        GgufValueType::U32,
        GgufValueType::I32,
        GgufValueType::F32,
        GgufValueType::Bool,
        GgufValueType::String,
        GgufValueType::Array,
        GgufValueType::U64,
        GgufValueType::I64,
        GgufValueType::F64,
    ];

    /// The u32 tag written on disk (`GGUF_TYPE_UINT8 = 0` ... `GGUF_TYPE_FLOAT64 = 12`).
    pub fn id(self) -> u32 {
        match self {
            GgufValueType::U8 => 0,
            GgufValueType::I8 => 1,
            GgufValueType::U16 => 2,
            GgufValueType::I16 => 3,
            GgufValueType::U32 => 4,
            GgufValueType::I32 => 5,
            GgufValueType::F32 => 6,
            GgufValueType::Bool => 7,
            GgufValueType::String => 8,
            GgufValueType::Array => 9,
            GgufValueType::U64 => 10,
            GgufValueType::I64 => 11,
            GgufValueType::F64 => 12,
        }
    }

    /// The type for an on-disk tag, or `None` for tags 13 and above.
    pub fn from_id(id: u32) -> Option<GgufValueType> {
        usize::try_from(id).ok().and_then(|i| GgufValueType::ALL.get(i).copied())
    }

    /// A short lowercase name (`u32`, `string`, `array`...).
    pub fn name(self) -> &'static str {
        match self {
            GgufValueType::U8 => "u8",
            GgufValueType::I8 => "i8",
            GgufValueType::U16 => "u16",
            GgufValueType::I16 => "i16",
            GgufValueType::U32 => "u32",
            GgufValueType::I32 => "i32",
            GgufValueType::F32 => "f32",
            GgufValueType::Bool => "bool",
            GgufValueType::String => "string",
            GgufValueType::Array => "array",
            GgufValueType::U64 => "u64",
            GgufValueType::I64 => "i64",
            GgufValueType::F64 => "f64",
        }
    }

    /// The fewest bytes one value of this type occupies on disk. A string is at least its
    /// u64 length; an array at least its u32 element type and u64 count. The reader
    /// multiplies this by a declared element count and compares it with the bytes left
    /// before allocating anything, so a count of 2^63 in a 43-byte file fails at once.
    pub fn min_encoded_size(self) -> u64 {
        match self {
            GgufValueType::U8 | GgufValueType::I8 | GgufValueType::Bool => 1,
            GgufValueType::U16 | GgufValueType::I16 => 2,
            GgufValueType::U32 | GgufValueType::I32 | GgufValueType::F32 => 4,
            GgufValueType::U64 | GgufValueType::I64 | GgufValueType::F64 => 8,
            GgufValueType::String => 8,
            GgufValueType::Array => 12,
        }
    }
}

impl fmt::Display for GgufValueType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A metadata value. Arrays may nest (an array of arrays of strings, say).
#[derive(Debug, Clone, PartialEq)]
pub enum GgufValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    /// The declared element type and the elements (each of that type).
    Array(GgufValueType, Vec<GgufValue>),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl GgufValue {
    /// The value's type tag.
    pub fn value_type(&self) -> GgufValueType {
        match self {
            GgufValue::U8(_) => GgufValueType::U8,
            GgufValue::I8(_) => GgufValueType::I8,
            GgufValue::U16(_) => GgufValueType::U16,
            GgufValue::I16(_) => GgufValueType::I16,
            GgufValue::U32(_) => GgufValueType::U32,
            GgufValue::I32(_) => GgufValueType::I32,
            GgufValue::F32(_) => GgufValueType::F32,
            GgufValue::Bool(_) => GgufValueType::Bool,
            GgufValue::String(_) => GgufValueType::String,
            GgufValue::Array(..) => GgufValueType::Array,
            GgufValue::U64(_) => GgufValueType::U64,
            GgufValue::I64(_) => GgufValueType::I64,
            GgufValue::F64(_) => GgufValueType::F64,
        }
    }

    /// A description of the type for error messages: `u32`, `array of string`,
    /// `array of array of i32`.
    pub fn type_description(&self) -> String {
        match self {
            GgufValue::Array(elem, items) => match (elem, items.first()) {
                (GgufValueType::Array, Some(first)) => {
                    format!("array of {}", first.type_description())
                }
                _ => format!("array of {elem}"),
            },
            other => other.value_type().name().to_string(),
        }
    }

    /// The value as an `i128` when it is an integer of any width (never a bool or float),
    /// so callers can range-check into the type they need without loss.
    pub fn as_integer(&self) -> Option<i128> {
        match *self {
            GgufValue::U8(v) => Some(v.into()),
            GgufValue::I8(v) => Some(v.into()),
            GgufValue::U16(v) => Some(v.into()),
            GgufValue::I16(v) => Some(v.into()),
            GgufValue::U32(v) => Some(v.into()),
            GgufValue::I32(v) => Some(v.into()),
            GgufValue::U64(v) => Some(v.into()),
            GgufValue::I64(v) => Some(v.into()),
            _ => None,
        }
    }

    /// The value as a float when it is `f32` or `f64`.
    pub fn as_float(&self) -> Option<f64> {
        match *self {
            GgufValue::F32(v) => Some(v.into()),
            GgufValue::F64(v) => Some(v),
            _ => None,
        }
    }

    /// The string, when the value is one.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            GgufValue::String(s) => Some(s),
            _ => None,
        }
    }

    /// The elements, when the value is an array.
    pub fn as_array(&self) -> Option<&[GgufValue]> {
        match self {
            GgufValue::Array(_, items) => Some(items),
            _ => None,
        }
    }

    /// Equality that compares floats by their bits, so NaN payloads and -0.0 round-trip
    /// checks are exact (the derived `PartialEq` says `NaN != NaN`).
    pub fn bit_eq(&self, other: &GgufValue) -> bool {
        match (self, other) {
            (GgufValue::F32(a), GgufValue::F32(b)) => a.to_bits() == b.to_bits(),
            (GgufValue::F64(a), GgufValue::F64(b)) => a.to_bits() == b.to_bits(),
            (GgufValue::Array(ta, a), GgufValue::Array(tb, b)) => {
                ta == tb && a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.bit_eq(y))
            }
            (a, b) => a == b,
        }
    }
}

/// Arrays up to this length are printed in full; longer ones are summarized.
const DISPLAY_FULL_ARRAY_MAX: usize = 8;
/// Elements shown at the head of a summarized array.
const DISPLAY_ARRAY_HEAD: usize = 3;

impl fmt::Display for GgufValue {
    /// Scalars print plainly, strings quoted and escaped, and long arrays as
    /// `[49152 x string: "<|endoftext|>", "<|im_start|>", "<|im_end|>", ...]`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GgufValue::U8(v) => write!(f, "{v}"),
            GgufValue::I8(v) => write!(f, "{v}"),
            GgufValue::U16(v) => write!(f, "{v}"),
            GgufValue::I16(v) => write!(f, "{v}"),
            GgufValue::U32(v) => write!(f, "{v}"),
            GgufValue::I32(v) => write!(f, "{v}"),
            GgufValue::U64(v) => write!(f, "{v}"),
            GgufValue::I64(v) => write!(f, "{v}"),
            GgufValue::F32(v) => write!(f, "{v}"),
            GgufValue::F64(v) => write!(f, "{v}"),
            GgufValue::Bool(v) => write!(f, "{v}"),
            GgufValue::String(s) => write!(f, "{s:?}"),
            GgufValue::Array(elem, items) => {
                let summarized = items.len() > DISPLAY_FULL_ARRAY_MAX;
                f.write_str("[")?;
                if summarized {
                    write!(f, "{} x {elem}: ", items.len())?;
                }
                let shown = if summarized { DISPLAY_ARRAY_HEAD } else { items.len() };
                for (i, item) in items.iter().take(shown).enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{item}")?;
                }
                if summarized {
                    f.write_str(", ...")?;
                }
                f.write_str("]")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn type_ids_round_trip() {
        for (i, t) in GgufValueType::ALL.iter().enumerate() {
            assert_eq!(t.id() as usize, i);
            assert_eq!(GgufValueType::from_id(t.id()), Some(*t));
        }
        assert_eq!(GgufValueType::from_id(13), None);
        assert_eq!(GgufValueType::from_id(u32::MAX), None);
    }

    #[test]
    fn display_summarizes_long_arrays() {
        let tokens: Vec<GgufValue> = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "a"]
            .iter()
            .cycle()
            .take(49152)
            .map(|s| GgufValue::String((*s).to_string()))
            .collect();
        let v = GgufValue::Array(GgufValueType::String, tokens);
        assert_eq!(v.to_string(), r#"[49152 x string: "<|endoftext|>", "<|im_start|>", "<|im_end|>", ...]"#);
        let short = GgufValue::Array(GgufValueType::I32, vec![GgufValue::I32(1), GgufValue::I32(-2)]);
        assert_eq!(short.to_string(), "[1, -2]");
        assert_eq!(GgufValue::String("a\"b\n".into()).to_string(), r#""a\"b\n""#);
        assert_eq!(GgufValue::F32(1e-5).to_string(), "0.00001");
    }

    #[test]
    fn type_description_names_nesting() {
        let nested = GgufValue::Array(GgufValueType::Array, vec![GgufValue::Array(GgufValueType::I32, vec![])]);
        assert_eq!(nested.type_description(), "array of array of i32");
        assert_eq!(GgufValue::Bool(true).type_description(), "bool");
    }

    #[test]
    fn bit_eq_compares_nan_by_bits() {
        let nan = GgufValue::F32(f32::NAN);
        assert!(nan.bit_eq(&nan.clone()));
        assert!(!GgufValue::F64(0.0).bit_eq(&GgufValue::F64(-0.0)));
    }
}
