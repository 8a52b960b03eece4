//! Files written by numpy and PyTorch themselves, generated at test time by python3, must
//! read back to the values Python reports. Ignored by default (they need python3 with numpy
//! and torch); run with `--include-ignored` (scripts/test installs them) they fail with one
//! line when Python cannot produce the fixtures.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use loupe_formats::{FormatError, NpyFile, NpzFile, PtFile, StoredTensor};
use serde_json::Value;

const SCRIPT: &str = r#"
import json, sys, collections, os
import numpy as np, torch
out = sys.argv[1]
expect = {}
def rec(key, arr):
    a = np.asarray(arr, dtype=np.float64) if not isinstance(arr, torch.Tensor) else arr.detach().to(torch.float64).numpy()
    expect[key] = {"shape": list(a.shape), "values": [None if np.isnan(v) else float(v) for v in a.reshape(-1)]}
def npy(name, arr, **kw):
    p = os.path.join(out, name)
    if kw:
        with open(p, "wb") as f: np.lib.format.write_array(f, arr, **kw)
    else:
        np.save(p, arr)
    rec(name, arr.astype(np.float64))
rng = np.random.default_rng(0)
npy("f32.npy", rng.standard_normal((2, 3)).astype("<f4"))
npy("f64be.npy", rng.standard_normal((4,)).astype(">f8"))
npy("f16.npy", rng.standard_normal((3, 2)).astype("<f2"))
npy("i64.npy", np.arange(-3, 3, dtype="<i8").reshape(2, 3))
npy("u8.npy", np.arange(250, 256, dtype="u1"))
npy("bool.npy", np.array([True, False, True]))
npy("fortran.npy", np.asfortranarray(rng.standard_normal((3, 4)).astype("<f4")))
npy("v2.npy", rng.standard_normal((2, 2)).astype("<f4"), version=(2, 0))
npy("v3.npy", rng.standard_normal((5,)).astype("<f4"), version=(3, 0))
npy("scalar.npy", np.array(2.5, dtype="<f4"))
npy("empty.npy", np.zeros((0, 5), dtype="<f4"))
a, b = rng.standard_normal((2, 2)).astype("<f4"), np.arange(6, dtype="<i4").reshape(3, 2)
np.savez(os.path.join(out, "plain.npz"), a=a, b=b)
np.savez_compressed(os.path.join(out, "packed.npz"), a=a, b=b)
rec("npz:a", a); rec("npz:b", b)
def pt(name, obj, **kw):
    torch.save(obj, os.path.join(out, name), **kw)
torch.manual_seed(0)
x = torch.randn(1, 4, 3)
pt("single.pt", x); rec("single.pt", x)
base = torch.randn(4, 6)
sd = collections.OrderedDict()
sd["w"] = base.t()                           # non-contiguous view
sd["slice"] = base[1:3, 2:5]                 # offset view sharing the storage
sd["bf16"] = torch.randn(3, 2).to(torch.bfloat16)
sd["f16"] = torch.randn(5).half()[1:]        # storage offset
sd["i64"] = torch.arange(-4, 4)
sd["bool"] = torch.tensor([True, False])
sd["f64"] = torch.randn(2, 2, dtype=torch.float64)
sd["fp8"] = torch.tensor([1.0, -0.5, 448.0, 0.0]).to(torch.float8_e4m3fn)
sd["u16"] = torch.tensor([1, 65535], dtype=torch.uint16)
pt("state.pt", sd)
for k, v in sd.items(): rec("state.pt:" + k, v)
nested = {"layers": [torch.ones(2), (torch.zeros(1), torch.full((2,), 3.0))], "n": 3, "s": "x", "f": 1.5, "none": None}
pt("nested.pt", nested)
rec("nested.pt:layers.0", nested["layers"][0]); rec("nested.pt:layers.1.0", nested["layers"][1][0]); rec("nested.pt:layers.1.1", nested["layers"][1][1])
p = torch.nn.Parameter(torch.randn(3))
pt("param.pt", p); rec("param.pt", p)
pt("proto4.pt", {"a": x}, pickle_protocol=4); rec("proto4.pt:a", x)
pt("legacy.pt", x, _use_new_zipfile_serialization=False)
json.dump(expect, open(os.path.join(out, "expect.json"), "w"))
"#;

type Fixtures = (PathBuf, serde_json::Map<String, Value>);

/// Runs the generator once per test binary into target/tmp; panics with one line (in every
/// test that asks) when python3 with numpy and torch cannot.
fn fixtures() -> &'static Fixtures {
    static FIXTURES: OnceLock<Result<Fixtures, String>> = OnceLock::new();
    match FIXTURES.get_or_init(generate) {
        Ok(f) => f,
        Err(why) => panic!("needs python3 with numpy and torch (scripts/test installs them): {why}"),
    }
}

fn generate() -> Result<Fixtures, String> {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("loupe-formats-python-fixtures");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("fixture dir");
    match Command::new("python3").arg("-c").arg(SCRIPT).arg(&dir).output() {
        Ok(o) if o.status.success() => {}
        Ok(o) => return Err(String::from_utf8_lossy(&o.stderr).lines().last().unwrap_or("").to_string()),
        Err(e) => return Err(format!("cannot run python3: {e}")),
    }
    let text = std::fs::read_to_string(dir.join("expect.json")).expect("expect.json");
    let Value::Object(map) = serde_json::from_str(&text).expect("json") else { panic!("expect.json is not an object") };
    Ok((dir, map))
}

fn check(expect: &serde_json::Map<String, Value>, key: &str, t: &StoredTensor) {
    let e = expect.get(key).unwrap_or_else(|| panic!("no expectation for {key}"));
    let shape: Vec<usize> =
        e["shape"].as_array().expect("shape").iter().map(|d| d.as_u64().expect("dim") as usize).collect();
    assert_eq!(t.shape, shape, "{key}: shape");
    let got = t.to_f32().unwrap_or_else(|err| panic!("{key}: {err}"));
    let want: Vec<f32> =
        e["values"].as_array().expect("values").iter().map(|v| v.as_f64().map_or(f32::NAN, |x| x as f32)).collect();
    assert_eq!(got.len(), want.len(), "{key}: length");
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert!(g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan()), "{key}[{i}]: got {g}, numpy/torch say {w}");
    }
}

#[test]
#[ignore = "needs python3 with numpy and torch (scripts/test installs them)"]
fn reads_what_numpy_writes() {
    let (dir, expect) = fixtures();
    let dir = Dir(dir);
    for name in [
        "f32.npy",
        "f64be.npy",
        "f16.npy",
        "i64.npy",
        "u8.npy",
        "bool.npy",
        "fortran.npy",
        "v2.npy",
        "v3.npy",
        "scalar.npy",
        "empty.npy",
    ] {
        let f = NpyFile::open(dir.path().join(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        check(expect, name, &f.tensor().expect("typed"));
    }
    let v = NpyFile::open(dir.path().join("v3.npy")).expect("v3");
    assert_eq!(v.version, (3, 0));
    assert!(NpyFile::open(dir.path().join("fortran.npy")).expect("f").fortran_order);
    for name in ["plain.npz", "packed.npz"] {
        let f = NpzFile::open(dir.path().join(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
        for arr in ["a", "b"] {
            check(expect, &format!("npz:{arr}"), &f.array(arr).expect("member").tensor().expect("typed"));
        }
    }
}

#[test]
#[ignore = "needs python3 with numpy and torch (scripts/test installs them)"]
fn reads_what_torch_save_writes() {
    let (dir, expect) = fixtures();
    let dir = Dir(dir);
    let open = |name: &str| PtFile::open(dir.path().join(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
    let single = open("single.pt");
    assert_eq!(single.tensors.len(), 1);
    check(expect, "single.pt", &single.tensors[0].1);
    let state = open("state.pt");
    let names: Vec<&str> = state.tensors.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["w", "slice", "bf16", "f16", "i64", "bool", "f64", "fp8", "u16"]);
    for (n, t) in &state.tensors {
        check(expect, &format!("state.pt:{n}"), t);
    }
    assert!(!state.tensors[0].1.is_contiguous(), "a transposed view stays strided");
    let nested = open("nested.pt");
    let names: Vec<&str> = nested.tensors.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["layers.0", "layers.1.0", "layers.1.1"]);
    for (n, t) in &nested.tensors {
        check(expect, &format!("nested.pt:{n}"), t);
    }
    check(expect, "param.pt", &open("param.pt").tensors[0].1);
    let p4 = open("proto4.pt");
    check(expect, "proto4.pt:a", &p4.tensors[0].1);
    let legacy = PtFile::open(dir.path().join("legacy.pt")).unwrap_err();
    assert!(matches!(legacy, FormatError::Unsupported { .. }) && legacy.to_string().contains("legacy"), "{legacy}");
}

#[test]
#[ignore = "needs python3 with numpy and torch (scripts/test installs them)"]
fn fixture_paths_are_named_in_errors() {
    let (dir, _) = fixtures();
    let dir = Dir(dir);
    let p = dir.path().join("single.pt");
    let err = NpyFile::open(&p).unwrap_err().to_string();
    assert!(err.contains(&*p.to_string_lossy()) && err.contains("not a npy file"), "{err}");
    assert!(Path::new(&p).exists());
}

/// Lets the tests say `dir.path()` as with a temp dir.
struct Dir<'a>(&'a PathBuf);

impl Dir<'_> {
    fn path(&self) -> &Path {
        self.0
    }
}
