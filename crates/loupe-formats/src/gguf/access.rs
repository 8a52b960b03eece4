//! Typed metadata getters. Each `get_*` fails with an error naming the file and key when
//! the key is absent or holds a value of the wrong type or range; each `opt_*` returns
//! `Ok(None)` when the key is absent and fails the same way otherwise.
//!
//! Integer getters accept any integer type whose value fits, because writers disagree on
//! widths (gguf-py writes most counts as u32, some converters as i32 or u64). Float
//! getters accept f32 and f64. Nothing converts between bools, numbers and strings.

use super::{GgufFile, GgufValue, GgufValueType};
use crate::FormatError;

/// Generates `get_X` / `opt_X` pairs over a conversion `fn(&GgufValue) -> Option<T>`.
macro_rules! getters {
    ($(($get:ident, $opt:ident, $ty:ty, $conv:expr, $expected:literal)),* $(,)?) => {$(
        #[doc = concat!("The `", $expected, "` under `key`, or an error naming the key.")]
        pub fn $get(&self, key: &str) -> Result<$ty, FormatError> {
            self.$opt(key)?.ok_or_else(|| self.missing_key(key))
        }

        #[doc = concat!("The `", $expected, "` under `key`; `Ok(None)` when absent.")]
        pub fn $opt(&self, key: &str) -> Result<Option<$ty>, FormatError> {
            match self.get(key) {
                None => Ok(None),
                Some(v) => $conv(v)
                    .map(Some)
                    .ok_or_else(|| self.wrong_type(key, $expected, v)),
            }
        }
    )*};
}

fn int<T: TryFrom<i128>>(v: &GgufValue) -> Option<T> {
    v.as_integer().and_then(|i| T::try_from(i).ok())
}

fn float(v: &GgufValue) -> Option<f32> {
    match *v {
        GgufValue::F32(f) => Some(f),
        // An f64 beyond f32's range would silently become infinite; refuse it instead.
        GgufValue::F64(f) if !f.is_finite() || f.abs() <= f64::from(f32::MAX) => Some(f as f32),
        _ => None,
    }
}

fn boolean(v: &GgufValue) -> Option<bool> {
    match *v {
        GgufValue::Bool(b) => Some(b),
        _ => None,
    }
}

fn string(v: &GgufValue) -> Option<&str> {
    v.as_str()
}

fn array_of<'v, T>(
    v: &'v GgufValue,
    elem_ok: fn(GgufValueType) -> bool,
    conv: fn(&'v GgufValue) -> Option<T>,
) -> Option<Vec<T>> {
    match v {
        GgufValue::Array(elem, items) if elem_ok(*elem) => items.iter().map(conv).collect(),
        _ => None,
    }
}

fn is_integer_type(t: GgufValueType) -> bool {
    use GgufValueType::*;
    matches!(t, U8 | I8 | U16 | I16 | U32 | I32 | U64 | I64)
}

fn str_array(v: &GgufValue) -> Option<Vec<&str>> {
    array_of(v, |t| t == GgufValueType::String, string)
}

fn f32_array(v: &GgufValue) -> Option<Vec<f32>> {
    array_of(v, |t| matches!(t, GgufValueType::F32 | GgufValueType::F64), float)
}

fn i32_array(v: &GgufValue) -> Option<Vec<i32>> {
    array_of(v, is_integer_type, int::<i32>)
}

fn array(v: &GgufValue) -> Option<&[GgufValue]> {
    v.as_array()
}

impl GgufFile {
    getters! {
        (get_u32, opt_u32, u32, int::<u32>, "u32 (or any integer that fits)"),
        (get_u64, opt_u64, u64, int::<u64>, "u64 (or any non-negative integer)"),
        (get_usize, opt_usize, usize, int::<usize>, "usize (or any integer that fits)"),
        (get_i64, opt_i64, i64, int::<i64>, "i64 (or any integer that fits)"),
        (get_f32, opt_f32, f32, float, "f32 (or f64 in f32 range)"),
        (get_bool, opt_bool, bool, boolean, "bool"),
        (get_str, opt_str, &str, string, "string"),
        (get_str_array, opt_str_array, Vec<&str>, str_array, "array of string"),
        (get_f32_array, opt_f32_array, Vec<f32>, f32_array, "array of f32/f64"),
        (get_i32_array, opt_i32_array, Vec<i32>, i32_array, "array of integers that fit i32"),
        (get_array, opt_array, &[GgufValue], array, "array"),
    }

    /// [`Self::opt_str_array`], moved out of the metadata ([`Self::take_metadata`]): the
    /// strings are not copied, and the file no longer holds the entry. On a value of another
    /// type it fails as `opt_str_array` does and leaves the entry in place.
    pub fn take_str_array(&mut self, key: &str) -> Result<Option<Vec<String>>, FormatError> {
        if self.opt_str_array(key)?.is_none() {
            return Ok(None);
        }
        match self.take_metadata(key) {
            // Checked just above: an array whose elements are all strings.
            Some(GgufValue::Array(_, items)) => Ok(Some(
                items
                    .into_iter()
                    .filter_map(|v| match v {
                        GgufValue::String(s) => Some(s),
                        _ => None,
                    })
                    .collect(),
            )),
            _ => Ok(None),
        }
    }

    /// [`Self::opt_f32_array`], removing the entry from the metadata once converted.
    pub fn take_f32_array(&mut self, key: &str) -> Result<Option<Vec<f32>>, FormatError> {
        let values = self.opt_f32_array(key)?;
        self.take_metadata(key);
        Ok(values)
    }

    /// [`Self::opt_i32_array`], removing the entry from the metadata once converted.
    pub fn take_i32_array(&mut self, key: &str) -> Result<Option<Vec<i32>>, FormatError> {
        let values = self.opt_i32_array(key)?;
        self.take_metadata(key);
        Ok(values)
    }

    /// The model architecture (`general.architecture`, required by the GGUF spec).
    pub fn architecture(&self) -> Result<&str, FormatError> {
        self.get_str("general.architecture")
    }

    fn missing_key(&self, key: &str) -> FormatError {
        FormatError::Missing { path: self.path.clone(), what: "metadata key", name: key.to_string() }
    }

    fn wrong_type(&self, key: &str, expected: &str, found: &GgufValue) -> FormatError {
        let detail = match found {
            GgufValue::Array(..) => String::new(),
            scalar => format!(" {}", truncate_for_error(&scalar.to_string())),
        };
        let range_hint = match (found.as_integer(), expected.contains("integer")) {
            (Some(_), _) => " (out of range)",
            (None, true) if matches!(found, GgufValue::Array(..)) => " (or an element out of range)",
            _ => "",
        };
        FormatError::Invalid {
            path: self.path.clone(),
            field: format!("metadata '{key}'"),
            reason: format!("expected {expected}, found {}{detail}{range_hint}", found.type_description()),
        }
    }
}

/// Keeps error lines short when a value is, say, a whole chat template.
fn truncate_for_error(s: &str) -> String {
    const MAX_CHARS: usize = 60;
    if s.chars().count() <= MAX_CHARS {
        s.to_string()
    } else {
        let head: String = s.chars().take(MAX_CHARS).collect();
        format!("{head}...")
    }
}

#[cfg(test)]
mod tests {
    use crate::gguf::writer::GgufWriter;
    use crate::gguf::{GgufFile, GgufValue, GgufValueType};

    fn file() -> GgufFile {
        let mut w = GgufWriter::new();
        w.add("general.architecture", GgufValue::String("llama".into()));
        w.add("u8", GgufValue::U8(7));
        w.add("neg", GgufValue::I32(-1));
        w.add("big", GgufValue::U64(u64::from(u32::MAX) + 1));
        w.add("f64", GgufValue::F64(1e-5));
        w.add("f64.huge", GgufValue::F64(1e300));
        w.add("flag", GgufValue::Bool(true));
        w.add(
            "toks",
            GgufValue::Array(GgufValueType::String, vec![GgufValue::String("a".into()), GgufValue::String("b".into())]),
        );
        w.add("scores", GgufValue::Array(GgufValueType::F32, vec![GgufValue::F32(0.5), GgufValue::F32(-1.0)]));
        w.add("types", GgufValue::Array(GgufValueType::U8, vec![GgufValue::U8(1), GgufValue::U8(3)]));
        w.add("wide", GgufValue::Array(GgufValueType::U64, vec![GgufValue::U64(u64::MAX)]));
        let bytes = w.to_bytes().expect("valid writer input");
        GgufFile::from_bytes("mem.gguf", bytes).expect("valid file")
    }

    #[test]
    fn integer_getters_accept_any_width_that_fits() {
        let f = file();
        assert_eq!(f.get_u32("u8").ok(), Some(7));
        assert_eq!(f.get_u64("big").ok(), Some(u64::from(u32::MAX) + 1));
        assert_eq!(f.get_usize("u8").ok(), Some(7));
        assert_eq!(f.get_i64("neg").ok(), Some(-1));
        let err = f.get_u32("big").unwrap_err().to_string();
        assert!(err.contains("mem.gguf") && err.contains("'big'") && err.contains("out of range"), "{err}");
        let err = f.get_u32("neg").unwrap_err().to_string();
        assert!(err.contains("'neg'"), "{err}");
        let err = f.get_u32("flag").unwrap_err().to_string();
        assert!(err.contains("found bool"), "{err}");
    }

    #[test]
    fn float_bool_and_string_getters() {
        let f = file();
        assert_eq!(f.get_f32("f64").ok(), Some(1e-5));
        assert!(f.get_f32("f64.huge").is_err());
        assert!(f.get_f32("u8").is_err());
        assert_eq!(f.get_bool("flag").ok(), Some(true));
        assert_eq!(f.architecture().ok(), Some("llama"));
        assert!(f.get_str("u8").is_err());
    }

    #[test]
    fn array_getters() {
        let f = file();
        assert_eq!(f.get_str_array("toks").ok(), Some(vec!["a", "b"]));
        assert_eq!(f.get_f32_array("scores").ok(), Some(vec![0.5, -1.0]));
        assert_eq!(f.get_i32_array("types").ok(), Some(vec![1, 3]));
        let err = f.get_i32_array("wide").unwrap_err().to_string();
        assert!(err.contains("'wide'") && err.contains("array of u64"), "{err}");
        let err = f.get_str_array("scores").unwrap_err().to_string();
        assert!(err.contains("expected array of string, found array of f32"), "{err}");
        assert_eq!(f.get_array("toks").map(|a| a.len()).ok(), Some(2));
    }

    #[test]
    fn take_moves_arrays_out_and_keeps_the_rest_reachable() {
        let mut f = file();
        let keys = f.metadata.len();
        // A value of another type is an error and stays in place.
        assert!(f.take_str_array("scores").is_err());
        assert_eq!(f.take_str_array("toks").ok(), Some(Some(vec!["a".to_string(), "b".to_string()])));
        assert_eq!(f.take_f32_array("scores").ok(), Some(Some(vec![0.5, -1.0])));
        assert_eq!(f.take_i32_array("types").ok(), Some(Some(vec![1, 3])));
        assert_eq!(f.take_str_array("toks").ok(), Some(None));
        assert!(f.get("toks").is_none() && f.get("scores").is_none() && f.get("types").is_none());
        assert_eq!(f.metadata.len(), keys - 3);
        // The index of the entries after the removed ones still points at their values.
        assert_eq!(f.get_u64("big").ok(), Some(u64::from(u32::MAX) + 1));
        assert!(matches!(f.get("wide"), Some(GgufValue::Array(GgufValueType::U64, _))));
        assert_eq!(f.architecture().ok(), Some("llama"));
        assert!(f.take_metadata("nope").is_none());
    }

    #[test]
    fn missing_and_optional() {
        let f = file();
        let err = f.get_u32("llama.block_count").unwrap_err().to_string();
        assert!(err.contains("mem.gguf") && err.contains("llama.block_count"), "{err}");
        assert_eq!(f.opt_u32("llama.block_count").ok(), Some(None));
        assert_eq!(f.opt_u32("u8").ok(), Some(Some(7)));
        assert!(f.opt_bool("u8").is_err());
        assert_eq!(f.opt_str_array("nope").ok(), Some(None));
    }
}
