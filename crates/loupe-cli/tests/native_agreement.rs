//! `--precision native` (quantized activations): teacher-forced next-token argmax agrees
//! with the f32 PyTorch reference on at least 99% of positions over all golden sequences.

mod common;
use common::*;
use loupe_models::{LoadOptions, Precision};

fn agreement(precision: Precision) -> (usize, usize, usize, usize) {
    agreement_with_kv(precision, None)
}

/// [`agreement`] with the KV cache stored as `kv` (the graph's default when `None`).
fn agreement_with_kv(precision: Precision, kv: Option<loupe_graph::KvDtype>) -> (usize, usize, usize, usize) {
    let model_path = real_model();
    let mut model = loupe_models::load(
        &model_path,
        LoadOptions { precision, layers: None, progress: None, faults: Vec::new(), ..Default::default() },
    )
    .expect("load");
    if let Some(kv) = kv {
        model.graph.kv_dtype = kv;
    }
    let label = format!("{precision:?} with a {} KV cache", model.graph.kv_dtype);
    teacher_forced_agreement(&model.graph, &goldens(), &label)
}

#[test]
#[ignore = "needs the real model (scripts/test fetches it)"]
fn native_teacher_forced_argmax_agreement_at_least_99_percent() {
    let (agree, total, _, _) = agreement(Precision::Native);
    assert!(agree as f64 >= 0.99 * total as f64, "native agreement {agree}/{total} is below 99%");
}

#[test]
#[ignore = "needs the real model (scripts/test fetches it)"]
fn f32_teacher_forced_argmax_matches_reference_everywhere_but_near_ties() {
    let (agree, total, _, _) = agreement(Precision::F32);
    assert!(agree as f64 >= 0.999 * total as f64, "f32 agreement {agree}/{total} is below 99.9%");
}

/// llama.cpp's scheme (8-bit activations) is reported, not held to 99%: its rounding flips
/// near ties (SmolLM2's logit margins are often < 0.05). The floor catches a broken kernel.
#[test]
#[ignore = "needs the real model (scripts/test fetches it)"]
fn q8_activation_agreement_is_reported() {
    let (agree, total, _, _) = agreement(Precision::Q8);
    assert!(agree as f64 >= 0.93 * total as f64, "q8 agreement {agree}/{total} is below 93%: a kernel is broken");
}

/// An FP8 E4M3 KV cache (a scale per 32 elements): teacher-forced, every attention reads
/// the quantized rows (the prompt's own too), at f32 and at native precision. E4M3 keeps 3
/// mantissa bits (relative rounding error up to 2^-4), which flips SmolLM2's near ties as
/// q8's activations do (measured 96.1% at f32): reported, with q8's floor for a broken kernel.
#[test]
#[ignore = "needs the real model (scripts/test fetches it)"]
fn fp8_kv_cache_teacher_forced_agreement_is_reported() {
    for precision in [Precision::F32, Precision::Native] {
        let (agree, total, _, _) = agreement_with_kv(precision, Some(loupe_graph::KvDtype::Fp8E4M3));
        assert!(
            agree as f64 >= 0.93 * total as f64,
            "{precision:?} with an fp8 KV cache: agreement {agree}/{total} is below 93%: a kernel is broken"
        );
    }
}

/// The same agreement through the decode path: each golden sequence fed one token per
/// step, as generation runs it. Decode uses other kernels than the teacher-forced pass
/// (GEMV with 16-bit activation blocks for Q4_1/Q8_0 instead of f32 GEMM), so it is
/// measured on its own.
#[test]
#[ignore = "needs the real model (scripts/test fetches it)"]
fn native_decode_path_argmax_agreement_at_least_99_percent() {
    let model_path = real_model();
    let model = loupe_models::load(
        &model_path,
        LoadOptions {
            precision: Precision::Native,
            layers: None,
            progress: None,
            faults: Vec::new(),
            ..Default::default()
        },
    )
    .expect("load");
    let (agree, total) = decode_path_agreement(&model.graph, &goldens(), "Native");
    assert!(agree as f64 >= 0.99 * total as f64, "native decode-path agreement {agree}/{total} is below 99%");
}

/// `--precision auto` (the default of generate, bench and serve) holds the precision
/// contract: at least 99% teacher-forced agreement with the f32 reference. SmolLM2 Q4_1 has
/// no K-quant, so auto runs native arithmetic throughout here.
#[test]
#[ignore = "needs the real model (scripts/test fetches it)"]
fn auto_teacher_forced_argmax_agreement_at_least_99_percent() {
    let (agree, total, _, _) = agreement(Precision::Auto);
    assert!(agree as f64 >= 0.99 * total as f64, "auto agreement {agree}/{total} is below 99%");
}
