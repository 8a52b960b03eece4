//! `loupe quantize` end to end on the tiny model: the matrices come out in the target type,
//! the rest as they were, the file loads and runs, and its numbers stay near the original's;
//! bad arguments fail with one line.

mod common;
use common::*;

use loupe_formats::GgufFile;

fn dump_logits(model: &std::path::Path, out: &std::path::Path) -> Vec<f32> {
    dump_logits_at(model, out, "f32")
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
            let keep =
                loupe_models::quantize::EMBEDDINGS.contains(&ta.name.as_str()) && bits(ta.ggml_type) > bits(target);
            let want_ty = if ta.dims.len() < 2 || keep { ta.ggml_type.name() } else { ty };
            assert_eq!(tb.ggml_type.name(), want_ty, "{ty}: {}", ta.name);
        }
        assert_eq!(b.get("general.file_type").map(|v| v.to_string()), Some(file_type.to_string()), "{ty}");
        assert_eq!(
            a.get("general.architecture").map(|v| v.to_string()),
            b.get("general.architecture").map(|v| v.to_string())
        );
        let cos = cosine(&want, &dump_logits(&out, &dir.path().join(ty)));
        eprintln!("{ty}: logits cosine {cos}");
        assert!(
            cos >= min_cos && cos < previous,
            "{ty}: logits cosine {cos} against the original (the type before: {previous})"
        );
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
    let cos = cosine(&want, &dump_logits(&out, &dir.path().join("mx")));
    eprintln!("mxfp4: logits cosine {cos}");
    assert!(cos > 0.5 && cos < 0.9999, "mxfp4: logits cosine {cos} against the original");
    let o = run(loupe().args(["generate", "--precision", "native", "-n", "4", "-m"]).arg(&out).arg("hello"));
    assert!(o.status.success(), "native generate on MXFP4: {}", stderr(&o));
}

/// FP8 E4M3 (`--type fp8`: E4M3 codes with an f16 scale per 32, a loupe type id) written,
/// loaded and run: every matrix becomes `fp8_e4m3` (the embedding too with `--all`), the file
/// type names it, the logits stay near the original's (3 mantissa bits: nearer than 4-bit
/// MXFP4 written the same way, far from exact; measured cosines 0.968 and 0.70 on the
/// tiny model's random weights), native precision (the FP8 row dot against f32 activations) gives
/// f32's logits within rounding, and the file requantizes to q8_0 (FP8 is read back).
#[test]
fn fp8_files_load_and_run_near_the_original() {
    let dir = tempfile::tempdir().unwrap();
    let original = tiny_model();
    let want = dump_logits(&original, &dir.path().join("orig"));
    let out = dir.path().join("tiny-fp8.gguf");
    let o = run(loupe().arg("quantize").arg(&original).arg(&out).args(["--type", "FP8", "--all"]));
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("quantized to fp8_e4m3"), "{}", stderr(&o));
    let g = GgufFile::open(&out).unwrap();
    let matrices: Vec<_> = g.tensors.iter().filter(|t| t.dims.len() == 2).collect();
    assert!(
        !matrices.is_empty() && matrices.iter().all(|t| t.ggml_type == loupe_core::GgmlType::Fp8E4M3),
        "{:?}",
        matrices.iter().map(|t| (&t.name, t.ggml_type)).collect::<Vec<_>>()
    );
    assert_eq!(g.get("general.file_type").map(|v| v.to_string()), Some(loupe_core::FP8_E4M3_TYPE_ID.to_string()));
    let got = dump_logits(&out, &dir.path().join("fp8"));
    let cos = cosine(&want, &got);
    let mx = dir.path().join("tiny-mxfp4.gguf");
    assert!(run(loupe().arg("quantize").arg(&original).arg(&mx).args(["--type", "mxfp4", "--all"])).status.success());
    let cos_mxfp4 = cosine(&want, &dump_logits(&mx, &dir.path().join("mx")));
    eprintln!("fp8: logits cosine {cos} (mxfp4: {cos_mxfp4})");
    assert!(
        cos > 0.9 && cos < 0.9999 && cos > cos_mxfp4,
        "fp8: logits cosine {cos} against the original (mxfp4: {cos_mxfp4})"
    );
    let native = dump_logits_at(&out, &dir.path().join("fp8-native"), "native");
    let agree = cosine(&got, &native);
    assert!(agree > 0.99999, "fp8 native vs f32 logits cosine {agree}");
    let o = run(loupe().args(["generate", "--precision", "native", "-n", "4", "-m"]).arg(&out).arg("hello"));
    assert!(o.status.success(), "native generate on FP8: {}", stderr(&o));
    // The transformers reference cannot read the type: parity against it is refused up front,
    // naming what to do instead.
    let o = run(loupe().args(["parity", "--prompt", "hello", "-m"]).arg(&out));
    assert_clean_failure(
        &o,
        "a loupe type the transformers reference cannot read: dump the model it was quantized from",
    );
    let back = dir.path().join("tiny-fp8-q8_0.gguf");
    let o = run(loupe().arg("quantize").arg(&out).arg(&back).args(["--type", "q8_0", "--all"]));
    assert!(o.status.success(), "fp8 -> q8_0: {}", stderr(&o));
    assert!(GgufFile::open(&back)
        .unwrap()
        .tensors
        .iter()
        .filter(|t| t.dims.len() == 2)
        .all(|t| t.ggml_type == loupe_core::GgmlType::Q8_0));
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| f64::from(*x) * f64::from(*y)).sum();
    let norm = |v: &[f32]| v.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
    dot / (norm(a) * norm(b))
}

fn dump_logits_at(model: &std::path::Path, out: &std::path::Path, precision: &str) -> Vec<f32> {
    let o = run(loupe()
        .args([
            "dump",
            "--precision",
            precision,
            "--prompt",
            "The quick brown fox jumps over the lazy dog",
            "--taps",
            "lm_head",
            "-o",
        ])
        .arg(out)
        .arg("-m")
        .arg(model));
    assert!(o.status.success(), "dump: {}", stderr(&o));
    let f = std::fs::read_dir(out.join("step0"))
        .unwrap()
        .filter_map(Result::ok)
        .find(|e| e.file_name().to_string_lossy().starts_with("lm_head"))
        .expect("lm_head dumped")
        .path();
    loupe_formats::npy::NpyFile::open(&f).expect("npy").tensor().expect("tensor").to_f32().expect("f32")
}

/// NVFP4 (4.5 bits: E2M1 values, a UE4M3 scale per 16, a per-tensor f32 scale in a
/// `.scale` sidecar) written, loaded and run: every matrix gets its sidecar holding
/// amax / (6 * 448); the logits land nearer the original than MXFP4's (finer scales); native
/// precision honours the per-tensor scale (its logits match f32's); requantizing to q8_0 folds
/// the scale in and drops the sidecars.
#[test]
fn nvfp4_files_carry_their_tensor_scales_and_run_near_the_original() {
    let dir = tempfile::tempdir().unwrap();
    let original = tiny_model();
    let want = dump_logits(&original, &dir.path().join("orig"));
    let mut cos_of = std::collections::HashMap::new();
    for ty in ["mxfp4", "nvfp4"] {
        let out = dir.path().join(format!("tiny-{ty}.gguf"));
        let o = run(loupe().arg("quantize").arg(&original).arg(&out).args(["--type", ty, "--all"]));
        assert!(o.status.success(), "{}", stderr(&o));
        cos_of.insert(ty, cosine(&want, &dump_logits(&out, &dir.path().join(ty))));
    }
    eprintln!("logits cosine against the original: {cos_of:?}");
    assert!(cos_of["nvfp4"] > cos_of["mxfp4"] && cos_of["nvfp4"] < 0.99999, "{cos_of:?}");

    let nv = dir.path().join("tiny-nvfp4.gguf");
    let (a, g) = (GgufFile::open(&original).unwrap(), GgufFile::open(&nv).unwrap());
    assert_eq!(g.get("general.file_type").map(|v| v.to_string()), Some("39".into()));
    for t in a.tensors.iter().filter(|t| t.dims.len() == 2) {
        assert_eq!(g.tensor(&t.name).unwrap().ggml_type.name(), "nvfp4", "{}", t.name);
        let side = g
            .tensor(&loupe_models::weights::nvfp4_scale_name(&t.name))
            .unwrap_or_else(|| panic!("{}: no .scale sidecar", t.name));
        assert_eq!((side.ggml_type.name(), side.n_elements()), ("f32", 1));
        let mut w = vec![0f32; t.n_elements() as usize];
        loupe_tensor::quant::dequantize_row(t.ggml_type, a.tensor_data(t), &mut w).unwrap();
        let amax = w.iter().fold(0f32, |m, v| m.max(v.abs()));
        let got = loupe_models::weights::nvfp4_tensor_scale(&g, &t.name).unwrap();
        assert_eq!(got, amax / (6.0 * 448.0), "{}", t.name);
    }
    let native = dump_logits_at(&nv, &dir.path().join("nv-native"), "native");
    let f32_run = dump_logits(&nv, &dir.path().join("nv-f32"));
    let c = cosine(&native, &f32_run);
    assert!(c > 0.9999, "native vs f32 on the NVFP4 file: cosine {c} (a per-tensor scale dropped?)");

    let q8 = dir.path().join("from-nvfp4-q8_0.gguf");
    let o = run(loupe().arg("quantize").arg(&nv).arg(&q8).args(["--type", "q8_0", "--all"]));
    assert!(o.status.success(), "{}", stderr(&o));
    let g8 = GgufFile::open(&q8).unwrap();
    assert!(!g8.tensors.iter().any(|t| t.name.ends_with(".scale")), "sidecars dropped with the NVFP4 tensors");
    // Each q8_0 value is the NVFP4 value times its tensor's scale, to within q8_0's rounding
    // (half a step d = max|block| / 127, plus 127 times the f16 rounding of d: 0.562 d).
    for t in g.tensors.iter().filter(|t| t.ggml_type.name() == "nvfp4") {
        let n = t.n_elements() as usize;
        let scale = loupe_models::weights::nvfp4_tensor_scale(&g, &t.name).unwrap();
        let (mut nv, mut q) = (vec![0f32; n], vec![0f32; n]);
        loupe_tensor::quant::dequantize_row(t.ggml_type, g.tensor_data(t), &mut nv).unwrap();
        let t8 = g8.tensor(&t.name).unwrap();
        assert_eq!(t8.ggml_type.name(), "q8_0", "{}", t.name);
        loupe_tensor::quant::dequantize_row(t8.ggml_type, g8.tensor_data(t8), &mut q).unwrap();
        for (b, (nb, qb)) in nv.chunks(32).zip(q.chunks(32)).enumerate() {
            let amax = nb.iter().fold(0f32, |m, v| m.max((v * scale).abs()));
            for (x, y) in nb.iter().zip(qb) {
                assert!(
                    (x * scale - y).abs() <= amax / 127.0 * 0.57 + 1e-30,
                    "{} block {b}: {} became {y}",
                    t.name,
                    x * scale
                );
            }
        }
    }
}

/// Q4_K (256-element super-blocks) on a tiny model wide enough for them (hidden 256, FFN
/// 512): every matrix becomes Q4_K, the file says Q4_K_S, and it runs near the original at
/// f32 and at native precision; on the default tiny model (hidden 64) every matrix is kept,
/// each with its reason.
#[test]
fn q4_k_files_load_and_run_near_the_original() {
    let dir = tempfile::tempdir().unwrap();
    let wide = dir.path().join("wide.gguf");
    let spec = loupe_models::tiny::TinyLlama { hidden: 256, ffn: 512, ..tiny_spec() };
    loupe_models::tiny::write_tiny_llama_gguf(&wide, &spec).unwrap();
    let want = dump_logits(&wide, &dir.path().join("orig"));
    let out = dir.path().join("wide-q4_k.gguf");
    let o = run(loupe().arg("quantize").arg(&wide).arg(&out).args(["--type", "q4_K", "--all"]));
    assert!(o.status.success(), "{}", stderr(&o));
    let g = GgufFile::open(&out).unwrap();
    assert!(
        g.tensors.iter().filter(|t| t.dims.len() == 2).all(|t| t.ggml_type.name() == "q4_K"),
        "{:?}",
        g.tensors.iter().map(|t| (&t.name, t.ggml_type.name())).collect::<Vec<_>>()
    );
    assert_eq!(g.get("general.file_type").map(|v| v.to_string()), Some("14".into()));
    let cos = cosine(&want, &dump_logits(&out, &dir.path().join("q4k")));
    eprintln!("q4_K: logits cosine {cos}");
    assert!(cos > 0.8 && cos < 0.99999, "q4_K: logits cosine {cos} against the original");
    let native = dump_logits_at(&out, &dir.path().join("q4k-native"), "native");
    assert!(
        cosine(&native, &dump_logits(&out, &dir.path().join("q4k-f32"))) > 0.999,
        "native against f32 on the Q4_K file"
    );

    let narrow = dir.path().join("narrow-q4_k.gguf");
    let o = run(loupe().arg("quantize").arg(tiny_model()).arg(&narrow).args(["--type", "q4_K", "--all"]));
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("rows do not split into the target's blocks"), "{}", stderr(&o));
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
        (
            vec![tiny_model().display().to_string(), out.display().to_string(), "--type".into(), "q3_K".into()],
            "--type q3_K: expected one of q4_0, q4_1, q5_0, q5_1, q8_0, q4_K, mxfp4, nvfp4, fp8_e4m3, f16, bf16, f32"
                .to_string(),
        ),
        (
            vec![dir.path().display().to_string(), out.display().to_string(), "--type".into(), "q8_0".into()],
            "config.json: missing (a Hugging Face checkpoint directory has config.json".into(),
        ),
        (
            vec![not_gguf.display().to_string(), out.display().to_string(), "--type".into(), "q8_0".into()],
            "not a GGUF file".into(),
        ),
        (
            vec![
                tiny_model().display().to_string(),
                dir.path().join("exists.gguf").display().to_string(),
                "--type".into(),
                "q8_0".into(),
            ],
            "exists (--force replaces it)".into(),
        ),
        (
            vec![tiny_model().display().to_string(), "/nonexistent-dir/o.gguf".into(), "--type".into(), "q8_0".into()],
            "no directory /nonexistent-dir".into(),
        ),
    ] {
        let o = run(loupe().arg("quantize").args(&args));
        assert_clean_failure(&o, &needle);
    }
}
