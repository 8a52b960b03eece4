//! `loupe quantize` end to end on the tiny model: the matrices come out in the target type,
//! the rest as they were, the file loads and runs, and its numbers stay near the original's;
//! bad arguments fail with one line.

mod common;
use common::*;

use loupe_formats::GgufFile;

fn dump_logits(model: &std::path::Path, out: &std::path::Path) -> Vec<f32> {
    let o = run(loupe().args(["dump", "--precision", "f32", "--prompt", "The quick brown fox jumps over the lazy dog", "--taps", "lm_head", "-o"]).arg(out).arg("-m").arg(model));
    assert!(o.status.success(), "dump: {}", stderr(&o));
    let f = std::fs::read_dir(out.join("step0")).unwrap().filter_map(Result::ok).find(|e| e.file_name().to_string_lossy().starts_with("lm_head")).expect("lm_head dumped").path();
    loupe_formats::npy::NpyFile::open(&f).expect("npy").tensor().expect("tensor").to_f32().expect("f32")
}

#[test]
fn quantizing_the_tiny_model_to_each_legacy_type_keeps_it_close_to_the_original() {
    let dir = tempfile::tempdir().unwrap();
    let original = tiny_model();
    let want = dump_logits(&original, &dir.path().join("orig"));
    // The tiny model's matrices are Q4_1: f16 and q8_0 hold those values almost exactly, q4_0
    // (symmetric, no offset) loses more of them; each step down must cost more (measured:
    // 0.999997, 0.99966, 0.834 logits cosine).
    let mut previous = 1.0;
    for (ty, file_type, min_cos) in [("f16", 1u32, 0.99999), ("q8_0", 7, 0.999), ("q4_0", 2, 0.7)] {
        let out = dir.path().join(format!("tiny-{ty}.gguf"));
        let o = run(loupe().arg("quantize").arg(&original).arg(&out).args(["--type", ty]));
        assert!(o.status.success(), "{ty}: {}", stderr(&o));
        assert!(stderr(&o).contains(&format!("quantized to {ty}")), "{}", stderr(&o));
        let (a, b) = (GgufFile::open(&original).unwrap(), GgufFile::open(&out).unwrap());
        assert_eq!(a.tensors.len(), b.tensors.len());
        for (ta, tb) in a.tensors.iter().zip(&b.tensors) {
            assert_eq!((&ta.name, &ta.dims), (&tb.name, &tb.dims));
            let target = loupe_models::quantize::TARGETS.into_iter().find(|t| t.name() == ty).unwrap();
            let bits = |t: loupe_core::GgmlType| t.type_size() as f64 / t.block_size() as f64;
            // The embedding keeps its type where it has more bits than the target.
            let keep = loupe_models::quantize::EMBEDDINGS.contains(&ta.name.as_str()) && bits(ta.ggml_type) > bits(target);
            let want_ty = if ta.dims.len() < 2 || keep { ta.ggml_type.name() } else { ty };
            assert_eq!(tb.ggml_type.name(), want_ty, "{ty}: {}", ta.name);
        }
        assert_eq!(b.get("general.file_type").map(|v| v.to_string()), Some(file_type.to_string()), "{ty}");
        assert_eq!(a.get("general.architecture").map(|v| v.to_string()), b.get("general.architecture").map(|v| v.to_string()));
        let got = dump_logits(&out, &dir.path().join(ty));
        let dot: f64 = want.iter().zip(&got).map(|(x, y)| f64::from(*x) * f64::from(*y)).sum();
        let norm = |v: &[f32]| v.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
        let cos = dot / (norm(&want) * norm(&got));
        eprintln!("{ty}: logits cosine {cos}");
        assert!(cos >= min_cos && cos < previous, "{ty}: logits cosine {cos} against the original (the type before: {previous})");
        previous = cos;
    }
}

/// MXFP4 (4.25 bits: E2M1 values, a power-of-two scale per 32) written, loaded and run at
/// f32 and native precision.
#[test]
fn mxfp4_files_load_and_run_near_the_original() {
    let dir = tempfile::tempdir().unwrap();
    let original = tiny_model();
    let want = dump_logits(&original, &dir.path().join("orig"));
    let out = dir.path().join("tiny-mxfp4.gguf");
    let o = run(loupe().arg("quantize").arg(&original).arg(&out).args(["--type", "mxfp4", "--all"]));
    assert!(o.status.success(), "{}", stderr(&o));
    let g = GgufFile::open(&out).unwrap();
    assert!(g.tensors.iter().filter(|t| t.dims.len() == 2).all(|t| t.ggml_type.name() == "mxfp4"));
    assert_eq!(g.get("general.file_type").map(|v| v.to_string()), Some("38".into()));
    let got = dump_logits(&out, &dir.path().join("mx"));
    let dot: f64 = want.iter().zip(&got).map(|(x, y)| f64::from(*x) * f64::from(*y)).sum();
    let norm = |v: &[f32]| v.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
    let cos = dot / (norm(&want) * norm(&got));
    eprintln!("mxfp4: logits cosine {cos}");
    assert!(cos > 0.5 && cos < 0.9999, "mxfp4: logits cosine {cos} against the original");
    let o = run(loupe().args(["generate", "--precision", "native", "-n", "4", "-m"]).arg(&out).arg("hello"));
    assert!(o.status.success(), "native generate on MXFP4: {}", stderr(&o));
}

#[test]
fn all_quantizes_the_embedding_too() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("all.gguf");
    let o = run(loupe().arg("quantize").arg(tiny_model()).arg(&out).args(["--type", "q4_0", "--all"]));
    assert!(o.status.success(), "{}", stderr(&o));
    let g = GgufFile::open(&out).unwrap();
    assert_eq!(g.tensor("token_embd.weight").unwrap().ggml_type.name(), "q4_0");
    let o = run(loupe().arg("quantize").arg(tiny_model()).arg(&out).args(["--type", "q4_0", "--force"]));
    assert!(stderr(&o).contains("token_embd.weight (embedding kept at its higher precision"), "{}", stderr(&o));
}

#[test]
fn bad_quantize_arguments_fail_with_one_line() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("o.gguf");
    let not_gguf = dir.path().join("x.bin");
    std::fs::write(&not_gguf, b"not a model").unwrap();
    std::fs::write(dir.path().join("exists.gguf"), b"").unwrap();
    for (args, needle) in [
        (vec![tiny_model().display().to_string(), out.display().to_string(), "--type".into(), "q3_K".into()], "--type q3_K: expected one of q4_0, q4_1, q5_0, q5_1, q8_0, mxfp4, f16, bf16, f32".to_string()),
        (vec![dir.path().display().to_string(), out.display().to_string(), "--type".into(), "q8_0".into()], "a directory; loupe quantize reads a GGUF file".into()),
        (vec![not_gguf.display().to_string(), out.display().to_string(), "--type".into(), "q8_0".into()], "not a GGUF file".into()),
        (vec![tiny_model().display().to_string(), dir.path().join("exists.gguf").display().to_string(), "--type".into(), "q8_0".into()], "exists (--force replaces it)".into()),
        (vec![tiny_model().display().to_string(), "/nonexistent-dir/o.gguf".into(), "--type".into(), "q8_0".into()], "no directory /nonexistent-dir".into()),
    ] {
        let o = run(loupe().arg("quantize").args(&args));
        assert_clean_failure(&o, &needle);
    }
}
