//! loupe against the real MAX 26.7: the fixtures under `tests/fixtures/max-26.7/` were made by
//! `scripts/max-fixtures` from MAX itself (its README names the command). loupe's COMPACT and
//! FULL prints of the same tensors must be byte-identical to MAX's stdout, and every `.max`
//! file MAX wrote must read back with MAX's dtype, shape and values.

use std::path::PathBuf;

use loupe_formats::elem::ElemType;
use loupe_formats::max_file::sanitize_label;
use loupe_formats::MaxFile;
use loupe_parity::print::{compact_of, full_of, max_dtype_name, PrintData, Printable, Values};
use serde_json::Value;

fn fixtures() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/max-26.7")
}

struct Case {
    label: String,
    dtype: String,
    shape: Vec<usize>,
    values: Vec<f64>,
}

fn number(v: &Value) -> f64 {
    match v {
        Value::Number(n) => n.as_f64().expect("a number"),
        Value::String(s) => match s.as_str() {
            "nan" => f64::NAN,
            "inf" => f64::INFINITY,
            "-inf" => f64::NEG_INFINITY,
            other => panic!("value {other}"),
        },
        other => panic!("value {other}"),
    }
}

fn cases() -> Vec<Case> {
    let text = std::fs::read_to_string(fixtures().join("prints/cases.json")).expect("cases.json");
    let v: Value = serde_json::from_str(&text).expect("cases.json parses");
    v.as_array()
        .expect("a list")
        .iter()
        .map(|c| Case {
            label: c["label"].as_str().expect("label").to_string(),
            dtype: c["dtype"].as_str().expect("dtype").to_string(),
            shape: c["shape"].as_array().expect("shape").iter().map(|d| d.as_u64().expect("dim") as usize).collect(),
            values: c["values"].as_array().expect("values").iter().map(number).collect(),
        })
        .collect()
}

/// MAX's dtype name for the fixture script's numpy-style names.
fn elem_of(dtype: &str) -> ElemType {
    match dtype {
        "float32" => ElemType::F32,
        "float64" => ElemType::F64,
        "float16" => ElemType::F16,
        "bfloat16" => ElemType::BF16,
        "int8" => ElemType::I8,
        "uint8" => ElemType::U8,
        "int16" => ElemType::I16,
        "uint16" => ElemType::U16,
        "int32" => ElemType::I32,
        "uint32" => ElemType::U32,
        "int64" => ElemType::I64,
        "uint64" => ElemType::U64,
        "bool" => ElemType::Bool,
        other => panic!("dtype {other}"),
    }
}

/// The values MAX printed for a case: the graph input is f32 (`np.float32` of the listed
/// values) and the graph casts it; the cast's result is what MAX wrote to the case's `.max`
/// file, which is read unless a later print of the same label overwrote it.
fn values_of(case: &Case, overwritten: bool) -> Values {
    let elem = elem_of(&case.dtype);
    if elem == ElemType::F32 || overwritten {
        return Values::F32(case.values.iter().map(|&v| v as f32).collect());
    }
    let f = MaxFile::open(fixtures().join("prints/max").join(format!("{}.max", sanitize_label(&case.label))))
        .expect("the case's .max file");
    Values::of(&f.tensor).expect("values")
}

fn printed(style: &dyn Fn(&str, &Printable<'_>) -> String) -> String {
    let cases = cases();
    let mut out = String::new();
    for (i, c) in cases.iter().enumerate() {
        let overwritten = cases[i + 1..].iter().any(|d| d.label == c.label);
        let values = values_of(c, overwritten);
        let t = Printable { dtype: max_dtype_name(elem_of(&c.dtype)), shape: &c.shape, data: values.data() };
        out.push_str(&style(&c.label, &t));
        out.push('\n');
    }
    out
}

/// Byte equality, failing with the first differing line.
fn assert_same(ours: &str, file: &str) {
    let max = std::fs::read_to_string(fixtures().join(file)).expect("fixture");
    if ours == max {
        return;
    }
    for (i, (a, b)) in ours.lines().zip(max.lines()).enumerate() {
        assert_eq!(a, b, "{file}: line {} differs (left: loupe, right: MAX)", i + 1);
    }
    assert_eq!(ours.len(), max.len(), "{file}: lengths differ");
}

#[test]
fn compact_is_byte_identical_to_max() {
    assert_same(&printed(&|l, t| compact_of(l, t)), "prints/compact.txt");
}

#[test]
fn full_is_byte_identical_to_max_at_precision_6_and_3() {
    assert_same(&printed(&|l, t| full_of(l, t, 6)), "prints/full-6.txt");
    assert_same(&printed(&|l, t| full_of(l, t, 3)), "prints/full-3.txt");
}

#[test]
fn every_max_file_reads_with_maxs_dtype_shape_and_values() {
    let cases = cases();
    let dir = fixtures().join("prints/max");
    let mut read = 0;
    for (i, c) in cases.iter().enumerate() {
        // A repeated label overwrites its file: the last print wins.
        if cases[i + 1..].iter().any(|d| d.label == c.label) {
            continue;
        }
        let key = sanitize_label(&c.label);
        let f = MaxFile::open(dir.join(format!("{key}.max"))).unwrap_or_else(|e| panic!("{key}: {e}"));
        assert_eq!(f.key, key);
        assert_eq!(f.tensor.dtype, elem_of(&c.dtype), "{key}");
        assert_eq!(f.tensor.shape, c.shape, "{key}");
        let got = f.tensor.to_f32().expect("values");
        assert_eq!(got.len(), c.values.len(), "{key}");
        for (j, (&g, &want)) in got.iter().zip(&c.values).enumerate() {
            let want32 = want as f32;
            let ok = match f.tensor.dtype {
                ElemType::F32 => g.to_bits() == want32.to_bits() || (g.is_nan() && want32.is_nan()),
                ElemType::F16 | ElemType::BF16 => {
                    (g.is_nan() && want.is_nan())
                        || g == want32
                        || ((g - want32).abs() <= want32.abs() * 2f32.powi(-7))
                        // Below the type's normal range the cast flushes (bf16 1e-39 -> 0).
                        || (g == 0.0 && want.abs() < 1e-37)
                }
                ElemType::Bool => g == f32::from(u8::from(want != 0.0)),
                _ => f64::from(g) == (want32 as f64),
            };
            assert!(ok, "{key}[{j}]: read {g}, MAX was given {want}");
        }
        if let Values::Int(v) = Values::of(&f.tensor).expect("values") {
            // Integers come back exactly (not through f32).
            for (&g, &want) in v.iter().zip(&c.values) {
                assert_eq!(g as f64, want, "{key}");
            }
        }
        read += 1;
    }
    assert!(read >= 20, "read {read} files");
    // MAX's sanitization: `? | < > : / space` become `_`; `* ( ) , ; . + = @ & ' [ ] -` stay.
    assert!(dir.join("label__with_odd_chars__a_b.max").is_file());
    assert!(dir.join("keep*()_,;.+=@&'[]-x.max").is_file());
    let repeated = MaxFile::open(dir.join("repeated.max")).expect("repeated.max");
    assert_eq!(repeated.tensor.to_f32().expect("values"), vec![7.0, 8.0], "the last print of a label wins");
}

#[test]
fn print_data_borrows_what_values_own() {
    let v = Values::Bool(vec![true, false]);
    let t = Printable { dtype: "bool", shape: &[2], data: v.data() };
    assert_eq!(compact_of("b", &t), "b = tensor([[True, False]], dtype=bool, shape=[2])");
    let t = Printable { dtype: "si64", shape: &[1], data: PrintData::Int(&[-9_007_199_254_740_993]) };
    assert_eq!(full_of("i", &t, 6), "i = tensor<1xsi64> [-9007199254740993]");
}
