//! Qwen2 on real weights: Qwen2.5-Coder-0.5B-Instruct (GGUF `qwen2`: q/k/v biases, q/k rows
//! stored unpermuted, an untied Q8_0 `output.weight`, GPT-2 BPE with Qwen's pre-tokenizer,
//! 151,936 tokens, a ChatML template with tools), against transformers' goldens in
//! tests/golden/qwen2.5-coder-0.5b (`scripts/regen-goldens --set qwen2.5-coder-0.5b`):
//! `--precision f32` greedy identical token for token, and the native precision's
//! teacher-forced argmax in agreement on at least 99% of positions.
//!
//! The model tests are ignored by default; scripts/test fetches the model
//! (`scripts/fetch-model qwen2.5-coder-0.5b`) and runs them with `--include-ignored`.

mod common;
use common::*;
use loupe_models::{Family, LoadOptions, Precision};

const SET: &str = "qwen2.5-coder-0.5b";

#[test]
fn qwen_goldens_are_complete() {
    let goldens = goldens_of(SET);
    check_goldens_complete(&goldens);
    for g in &goldens {
        // Qwen's <|im_end|> and <|endoftext|>: the goldens were made with Qwen's ids, not SmolLM2's.
        assert!(g.eos_token_ids.contains(&151645), "{}: eos {:?}", g.name, g.eos_token_ids);
    }
}

#[test]
#[ignore = "needs Qwen2.5-Coder-0.5B-Instruct (scripts/test fetches it)"]
fn qwen_f32_greedy_matches_reference_goldens() {
    let failures = f32_greedy_failures(&qwen_model(), &goldens_of(SET));
    assert!(failures.is_empty(), "Qwen2.5 f32 greedy diverged from the reference:\n{}", failures.join("\n"));
}

#[test]
#[ignore = "needs Qwen2.5-Coder-0.5B-Instruct (scripts/test fetches it)"]
fn qwen_native_teacher_forced_argmax_agreement_at_least_99_percent() {
    let model = loupe_models::load(&qwen_model(), LoadOptions { precision: Precision::Native, ..Default::default() })
        .expect("load");
    assert_eq!(model.config.family(), Family::Qwen2);
    let c = model.config.decoder().expect("a decoder");
    assert!((c.qkv_bias, c.o_bias, c.tie_word_embeddings) == (true, false, false), "{c:?}");
    let (agree, total, _, _) = teacher_forced_agreement(&model.graph, &goldens_of(SET), "Qwen2.5 native");
    assert!(agree as f64 >= 0.99 * total as f64, "native agreement {agree}/{total} is below 99%");
}

/// `--precision auto` (8-bit activations for its Q4_K matrices; native prompt rows for the
/// Q5_0, Q6_K and Q8_0 ones, which the teacher-forced pass runs) keeps at least 99%
/// teacher-forced agreement with the f32 reference.
#[test]
#[ignore = "needs Qwen2.5-Coder-0.5B (scripts/test fetches it)"]
fn qwen_auto_teacher_forced_argmax_agreement_at_least_99_percent() {
    let model = loupe_models::load(&qwen_model(), LoadOptions { precision: Precision::Auto, ..Default::default() })
        .expect("load");
    let (agree, total, _, _) = teacher_forced_agreement(&model.graph, &goldens_of(SET), "Qwen2.5-Coder auto");
    assert!(agree as f64 >= 0.99 * total as f64, "auto agreement {agree}/{total} is below 99%");
}

/// Qwen's byte-level tokenizer (listed merges) through `loupe_text::CompactBpe`: the
/// same ids and offsets as `tokenizers`' BPE.
#[test]
#[ignore = "needs Qwen2.5-Coder-0.5B (scripts/test fetches it)"]
fn qwen_compact_tokenizer_equals_tokenizers_bpe() {
    let bad = compact_tokenizer_mismatches(&qwen_model(), &goldens_of(SET));
    assert!(bad.is_empty(), "{} texts tokenize differently:\n{}", bad.len(), bad.join("\n"));
}

/// `--precision auto` through the decode path (one token per step): on AVX-512 CPUs its Q5_0
/// decode rows take 8-bit activations while the teacher-forced pass's prompt rows stay
/// native, so the decode rows' agreement is held to 99% on its own.
#[test]
#[ignore = "needs the real model (scripts/test fetches it)"]
fn qwen_auto_decode_path_argmax_agreement_at_least_99_percent() {
    let model = loupe_models::load(&qwen_model(), LoadOptions { precision: Precision::Auto, ..Default::default() })
        .expect("load");
    let (agree, total) = decode_path_agreement(&model.graph, &goldens_of(SET), "Qwen2.5-Coder auto");
    assert!(agree as f64 >= 0.99 * total as f64, "auto decode-path agreement {agree}/{total} is below 99%");
}
