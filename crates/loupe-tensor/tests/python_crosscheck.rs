//! Bit-exact cross-check against the Python reference, gguf-py's
//! `gguf.quants` (the code transformers uses to dequantize GGUF weights, so the
//! reference side of every parity comparison).
//!
//! Writes random blocks of every type gguf-py implements to a temp dir, has an
//! inline Python script dequantize them (and quantize one f32 row to each type it
//! can quantize), and compares with `dequantize_row` / `quantize_row` bit for bit.
//! Ignored by default (it needs `python3` with `gguf` and `numpy`); run with
//! `--include-ignored` (scripts/test installs them) it fails with one line when they are missing.

mod common;

use std::path::Path;
use std::process::Command;

use common::*;
use loupe_tensor::quant;
use loupe_tensor::GgmlType;

const SCRIPT: &str = r#"
import sys
import numpy as np
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize, quantize

d, deq_names, q_names = sys.argv[1], sys.argv[2], sys.argv[3]
for name in deq_names.split(","):
    raw = np.fromfile(f"{d}/{name}.bin", dtype=np.uint8)
    np.asarray(dequantize(raw, T[name]), dtype=np.float32).tofile(f"{d}/{name}.deq")
x = np.fromfile(f"{d}/x.f32", dtype=np.float32)
for name in q_names.split(","):
    np.ascontiguousarray(quantize(x, T[name])).view(np.uint8).tofile(f"{d}/{name}.q")
"#;

/// Types gguf-py 0.19 can dequantize (it has no Q8_1 or Q8_K).
const DEQUANT_TYPES: [GgmlType; 13] = [
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q2K,
    GgmlType::Q3K,
    GgmlType::Q4K,
    GgmlType::Q5K,
    GgmlType::Q6K,
];

/// Types gguf-py can quantize (no K-quants, no Q8_1/Q8_K).
const QUANT_TYPES: [GgmlType; 7] =
    [GgmlType::F16, GgmlType::BF16, GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0];

const N: usize = 8192;

fn py_name(ty: GgmlType) -> String {
    ty.name().to_uppercase()
}

/// Fails with one line unless `python3` can import `gguf` and `numpy`.
fn require_python() {
    let out = Command::new("python3").args(["-c", "import gguf, numpy"]).output();
    let why = match &out {
        Ok(o) if o.status.success() => return,
        Ok(o) => String::from_utf8_lossy(&o.stderr).lines().last().unwrap_or("").to_string(),
        Err(e) => format!("cannot run python3: {e}"),
    };
    panic!(
        "needs python3 with the gguf and numpy packages (scripts/test installs them; or pip install gguf numpy): {why}"
    );
}

fn names(types: &[GgmlType]) -> String {
    types.iter().map(|t| py_name(*t)).collect::<Vec<_>>().join(",")
}

fn read_f32(path: &Path) -> Vec<f32> {
    std::fs::read(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

#[test]
#[ignore = "needs python3 with gguf and numpy (scripts/test installs them)"]
fn matches_gguf_py_bit_for_bit() {
    require_python();
    let dir = tempfile::tempdir().unwrap();
    let mut rng = Rng::new(42);
    let mut rows = Vec::new();
    for ty in DEQUANT_TYPES {
        let row = random_row(&mut rng, ty, N);
        std::fs::write(dir.path().join(format!("{}.bin", py_name(ty))), &row).unwrap();
        rows.push((ty, row));
    }
    let x = rng.activations(N);
    let xb: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
    std::fs::write(dir.path().join("x.f32"), xb).unwrap();

    let out = Command::new("python3")
        .args(["-c", SCRIPT])
        .arg(dir.path())
        .arg(names(&DEQUANT_TYPES))
        .arg(names(&QUANT_TYPES))
        .output()
        .expect("run python3");
    assert!(out.status.success(), "python failed:\n{}", String::from_utf8_lossy(&out.stderr));

    for (ty, row) in &rows {
        let want = read_f32(&dir.path().join(format!("{}.deq", py_name(*ty))));
        let got = dequant(*ty, row, N);
        assert_eq!(want.len(), N, "{ty}: python returned {} values", want.len());
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(
                g.to_bits(),
                w.to_bits(),
                "{ty} element {i} (block {}): loupe {g:e}, gguf-py {w:e}",
                i / ty.block_size()
            );
        }
    }

    for ty in QUANT_TYPES {
        let want = std::fs::read(dir.path().join(format!("{}.q", py_name(ty)))).unwrap();
        let mut got = vec![0u8; ty.bytes_for(N as u64).unwrap() as usize];
        quant::quantize_row(ty, &x, &mut got).unwrap();
        assert_eq!(want.len(), got.len(), "{ty}: python wrote {} bytes", want.len());
        if let Some(i) = got.iter().zip(&want).position(|(a, b)| a != b) {
            let b = i / ty.type_size();
            panic!(
                "{ty} quantization differs at byte {i} (block {b}): loupe {:02x?}, gguf-py {:02x?}",
                &got[b * ty.type_size()..(b + 1) * ty.type_size()],
                &want[b * ty.type_size()..(b + 1) * ty.type_size()]
            );
        }
    }
}
