//! The reference dumper (`python -m loupe_reference dump`) writes the dump layout that loupe's
//! comparator reads: run on the real model, two layers, the taps of layer 0 plus the logits,
//! one decode step; checks the manifest schema, execution order, files, shapes and stats.
//!
//! The `name(1)` suffix of a module called twice is unit-tested on the Python side
//! (reference/tests/test_dump.py, `test_module_called_twice_gets_suffixes`): no Llama module
//! is called twice in one forward. Ignored by default (it needs the Python stack and the
//! model); run with `--include-ignored` (scripts/test) it fails with one line when they are missing.

mod common;
use common::*;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::Path;

/// (descr, fortran_order, shape, data offset) of a version 1/2/3 `.npy` file.
fn npy_header(bytes: &[u8]) -> (String, bool, Vec<usize>, usize) {
    assert_eq!(&bytes[..6], b"\x93NUMPY", "not an .npy file");
    let (len, start) = match bytes[6] {
        1 => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10),
        _ => (u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize, 12),
    };
    let header = std::str::from_utf8(&bytes[start..start + len]).unwrap();
    let field = |key: &str| {
        let at = header.find(&format!("'{key}':")).unwrap_or_else(|| panic!("no {key} in {header}"));
        header[at + key.len() + 3..].trim_start().to_string()
    };
    let descr = field("descr");
    let descr = descr.trim_start_matches('\'').split('\'').next().unwrap().to_string();
    let fortran = field("fortran_order").starts_with("True");
    let shape = field("shape");
    let inner = &shape[1..shape.find(')').unwrap()];
    let shape = inner.split(',').map(str::trim).filter(|s| !s.is_empty()).map(|s| s.parse().unwrap()).collect();
    (descr, fortran, shape, start + len)
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

#[test]
#[ignore = "needs the real model and the Python reference stack (scripts/test installs both)"]
fn reference_dump_layout_on_the_real_model() {
    let model = real_model();
    require_python_reference();
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("hf");
    let o = python(&["dump", "--gguf"])
        .arg(&model)
        .args([
            "--prompt",
            "The quick brown fox",
            "--layers",
            "2",
            "--taps",
            "model.layers.0",
            "--taps",
            "^lm_head$",
            "--steps",
            "1",
            "-o",
        ])
        .arg(&out)
        .output()
        .expect("python3");
    assert!(o.status.success(), "reference dump failed: {}", stderr(&o));
    assert_eq!(
        Path::new(stdout(&o).trim()).canonicalize().unwrap(),
        out.canonicalize().unwrap(),
        "stdout names the dump directory"
    );
    // Written atomically: nothing but the dump beside it.
    let siblings: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(siblings, vec![std::ffi::OsString::from("hf")]);

    let m: Value = serde_json::from_str(&std::fs::read_to_string(out.join("manifest.json")).unwrap()).unwrap();
    assert_eq!(m["format"], "loupe-dump");
    assert_eq!(m["version"], 1);
    assert_eq!(m["producer"]["engine"], "transformers");
    assert!(m["producer"]["version"].as_str().is_some_and(|v| !v.is_empty()));
    let path = Path::new(m["model"]["path"].as_str().unwrap());
    assert_eq!(path.canonicalize().unwrap(), model.canonicalize().unwrap());
    assert!(m["model"]["sha256"].as_str().is_some_and(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit())));
    assert_eq!(m["prompt"], "The quick brown fox");
    assert_eq!(m["chat"], false);
    assert_eq!(m["precision"], "f32");
    let prompt: Vec<u64> = m["prompt_tokens"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap()).collect();
    assert_eq!(prompt, vec![504, 2365, 6354, 16438], "SmolLM2's ids for the raw prompt (no BOS)");
    assert_eq!(m["generated_tokens"].as_array().map(Vec::len), Some(1));
    let t = prompt.len();

    let tensors = m["tensors"].as_array().unwrap();
    let mut by_step: BTreeMap<u64, Vec<&Value>> = BTreeMap::new();
    let mut last_order = -1i64;
    for e in tensors {
        for key in ["name", "step", "order", "file", "dtype", "shape", "axes", "stats"] {
            assert!(e.get(key).is_some(), "tensor entry without {key}: {e}");
        }
        let order = e["order"].as_i64().unwrap();
        assert!(order > last_order, "tensors are listed in execution order: {e}");
        last_order = order;
        by_step.entry(e["step"].as_u64().unwrap()).or_default().push(e);
    }
    assert_eq!(by_step.keys().copied().collect::<Vec<_>>(), vec![0, 1]);

    let hidden = [576usize];
    let expected: Vec<(&str, Vec<usize>)> = vec![
        ("model.layers.0.input_layernorm", vec![576]),
        ("model.layers.0.self_attn.q_proj", vec![576]),
        ("model.layers.0.self_attn.k_proj", vec![192]),
        ("model.layers.0.self_attn.v_proj", vec![192]),
        ("model.layers.0.self_attn.q_rope", vec![576]),
        ("model.layers.0.self_attn.k_rope", vec![192]),
        ("model.layers.0.self_attn.attn_probs", vec![]),
        ("model.layers.0.self_attn.attn_output", vec![576]),
        ("model.layers.0.self_attn.o_proj", hidden.to_vec()),
        ("model.layers.0.self_attn", hidden.to_vec()),
        ("model.layers.0.attn_residual", hidden.to_vec()),
        ("model.layers.0.post_attention_layernorm", hidden.to_vec()),
        ("model.layers.0.mlp.gate_proj", vec![1536]),
        ("model.layers.0.mlp.act_fn", vec![1536]),
        ("model.layers.0.mlp.up_proj", vec![1536]),
        ("model.layers.0.mlp.act_mul", vec![1536]),
        ("model.layers.0.mlp.down_proj", hidden.to_vec()),
        ("model.layers.0.mlp", hidden.to_vec()),
        ("model.layers.0", hidden.to_vec()),
        ("lm_head", vec![49152]),
    ];
    for (step, entries) in &by_step {
        let rows = if *step == 0 { t } else { 1 };
        let ctx = t + *step as usize;
        let names: Vec<&str> = entries.iter().map(|e| e["name"].as_str().unwrap()).collect();
        let mut want: Vec<&str> = expected.iter().map(|(n, _)| *n).collect();
        want.sort();
        let mut got = names.clone();
        got.sort();
        assert_eq!(got, want, "step {step}: the taps of layer 0 and lm_head, nothing of layer 1");
        let pos = |n: &str| names.iter().position(|x| *x == n).unwrap();
        assert!(pos("model.layers.0.self_attn.q_proj") < pos("model.layers.0.self_attn.q_rope"));
        assert!(pos("model.layers.0.self_attn.attn_probs") < pos("model.layers.0.self_attn.attn_output"));
        assert!(pos("model.layers.0.self_attn.o_proj") < pos("model.layers.0.attn_residual"));
        assert!(pos("model.layers.0") < pos("lm_head"));

        for e in entries {
            let name = e["name"].as_str().unwrap();
            let shape: Vec<usize> =
                e["shape"].as_array().unwrap().iter().map(|d| d.as_u64().unwrap() as usize).collect();
            let want_shape = match expected.iter().find(|(n, _)| *n == name).unwrap() {
                (n, _) if n.ends_with("attn_probs") => vec![9, rows, ctx],
                (_, w) => vec![rows, w[0]],
            };
            assert_eq!(shape, want_shape, "step {step}: {name}");
            assert_eq!(e["dtype"], "f32");
            assert_eq!(e["axes"].as_array().unwrap().len(), shape.len(), "{name}: one axis name per dimension");
            let file = e["file"].as_str().unwrap();
            assert_eq!(file, format!("step{step}/{name}.npy"));
            let bytes = std::fs::read(out.join(file)).unwrap_or_else(|err| panic!("{file}: {err}"));
            let (descr, fortran, npy_shape, offset) = npy_header(&bytes);
            assert_eq!((descr.as_str(), fortran, &npy_shape), ("<f4", false, &shape), "{file}");
            let data = f32s(&bytes[offset..]);
            assert_eq!(data.len(), shape.iter().product::<usize>(), "{file}: data size");
            let s = &e["stats"];
            let min = data.iter().copied().fold(f32::INFINITY, f32::min) as f64;
            let max = data.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
            // (serde_json without its float_roundtrip feature may parse a float 1 ulp off)
            let close = |a: Option<f64>, b: f64| a.is_some_and(|a| (a - b).abs() <= 1e-15 * b.abs());
            assert!(
                close(s["min"].as_f64(), min) && close(s["max"].as_f64(), max),
                "{name}: stats {s} vs min {min} max {max}"
            );
            assert_eq!((s["nan"].as_u64(), s["inf"].as_u64()), (Some(0), Some(0)));
            let mean = data.iter().map(|&v| v as f64).sum::<f64>() / data.len() as f64;
            assert!((s["mean"].as_f64().unwrap() - mean).abs() <= 1e-9 * (1.0 + mean.abs()), "{name}: mean");
            assert!(s["std"].as_f64().unwrap() >= 0.0);
            if name.ends_with("attn_probs") {
                // softmax rows sum to 1; causal: token 0 of the prompt sees only itself
                for row in data.chunks(ctx) {
                    assert!((row.iter().sum::<f32>() - 1.0).abs() < 1e-4, "{name}: a row of probabilities sums to 1");
                }
                if *step == 0 {
                    assert_eq!(data[0], 1.0, "token 0 attends only to itself");
                }
            }
        }
        // The attention block's output is o_proj's output (an alias).
        let read = |n: &str| {
            let bytes = std::fs::read(out.join(format!("step{step}/{n}.npy"))).unwrap();
            f32s(&bytes[npy_header(&bytes).3..])
        };
        assert_eq!(read("model.layers.0.self_attn"), read("model.layers.0.self_attn.o_proj"));
    }
}
