//! Each row of the signature table, and each false cliff, recognized on synthetic dumps
//! built to show it (docs/parity-protocol.md, "Signatures").

mod common;

use common::*;
use loupe_parity::result::{Reason, Status};
use loupe_parity::{CompareOptions, DumpStyle};

#[test]
fn identical_dumps_match() {
    let a = model(1, 0);
    let r = run(&a, &a);
    assert_eq!(r.verdict.verdict, "match");
    assert_eq!(r.exit_code(), 0);
    assert_eq!(r.pairs.len(), a.len());
    assert!(r.pairs.iter().all(|p| p.status == Status::Match));
    assert!(r.verdict.first_divergence.is_none() && r.verdict.likely_cause.is_none());
    assert!(r.verdict.next_step.as_deref().unwrap_or("").contains("bisect ladder"));
    assert!(r.unpaired_a.is_empty() && r.unpaired_b.is_empty());
}

#[test]
fn embedding_divergence() {
    let a = model(1, 0);
    let mut b = a.clone();
    get(&mut b, "model.embed_tokens").data = Rng(9).vec(T * D);
    let r = run(&a, &b);
    assert_eq!(r.exit_code(), 1);
    assert_eq!(r.verdict.first_divergence.as_deref(), Some("model.embed_tokens"));
    assert_eq!(signature(&r), "embedding");
    assert!(r.verdict.likely_cause.as_deref().unwrap_or("").contains("embedding load"));
}

#[test]
fn scale_bug_keeps_cosine_at_one() {
    let a = model(1, 0);
    let mut b = a.clone();
    for v in &mut get(&mut b, "model.embed_tokens").data {
        *v *= 1.5;
    }
    let r = run(&a, &b);
    let p = &r.pairs[0];
    assert!(p.cosine().unwrap_or(0.0) > 0.999999);
    assert!(p.reasons.contains(&Reason::NormRatio) && !p.reasons.contains(&Reason::Cosine));
    assert_eq!(signature(&r), "scale");
    assert!(
        r.verdict.likely_cause.as_deref().unwrap_or("").contains("embedding multiplier"),
        "{:?}",
        r.verdict.likely_cause
    );
    // A norm whose output is scaled: same signature, named as a norm problem.
    let mut b = a.clone();
    for v in &mut get(&mut b, "model.layers.2.post_attention_layernorm").data {
        *v *= 0.9;
    }
    let r = run(&a, &b);
    assert_eq!(signature(&r), "scale");
    assert!(r.verdict.likely_cause.as_deref().unwrap_or("").contains("norm epsilon"));
}

#[test]
fn layer0_bad_at_token0() {
    let a = model(1, 0);
    let mut b = a.clone();
    perturb_rows(get(&mut b, "model.layers.0.self_attn.attn_output"), 0..T, 1.0, 5);
    let r = run(&a, &b);
    assert_eq!(r.verdict.first_divergence.as_deref(), Some("model.layers.0.self_attn.attn_output"));
    assert_eq!(signature(&r), "layer0_token0");
    let t0 = r.verdict.token0.as_ref().expect("token-0 invariant applied");
    assert!(t0.token0_cosine < 0.99 && t0.conclusion.contains("V, o_proj"));
}

#[test]
fn later_tokens_bad_from_layer0() {
    let a = model(1, 0);
    let mut b = a.clone();
    perturb_rows(get(&mut b, "model.layers.0.self_attn.q_rope"), 1..T, 1.0, 5);
    let r = run(&a, &b);
    assert_eq!(r.verdict.first_divergence.as_deref(), Some("model.layers.0.self_attn.q_rope"));
    assert_eq!(signature(&r), "later_tokens");
    assert!(r.verdict.likely_cause.as_deref().unwrap_or("").contains("RoPE"));
    let t0 = r.verdict.token0.as_ref().expect("token-0 invariant applied");
    assert!(t0.token0_cosine > 0.9999 && t0.conclusion.contains("RoPE"));
}

#[test]
fn slow_monotonic_decay() {
    let a = model(1, 0);
    let mut b = a.clone();
    for t in b.iter_mut() {
        if let Some(l) = loupe_parity::names::layer_index(&t.name) {
            perturb_rows(t, 0..T, 0.045 * (l as f32 + 1.0), 100 + l as u64);
        }
    }
    let r = run(&a, &b);
    assert_eq!(r.exit_code(), 1);
    assert_eq!(signature(&r), "slow_decay", "{:?}", r.verdict.likely_cause);
}

#[test]
fn sudden_cliffs_with_spikes() {
    let a = model(1, 0);
    // The reference spikes at layer 2, the target stays flat.
    let mut spiky = a.clone();
    get(&mut spiky, "model.layers.2").data[5] = 2000.0;
    let r = run(&spiky, &a);
    assert_eq!(r.verdict.first_divergence.as_deref(), Some("model.layers.2"));
    assert_eq!(signature(&r), "cliff_reference_spikes");
    // The target spikes.
    let r = run(&a, &spiky);
    assert_eq!(signature(&r), "cliff_target_spikes");
    assert!(r.verdict.likely_cause.as_deref().unwrap_or("").contains("norm order"));
}

#[test]
fn last_token_only() {
    let a = model(1, 0);
    let mut b = a.clone();
    perturb_rows(get(&mut b, "model.layers.3"), T - 1..T, 0.2, 7);
    let r = run(&a, &b);
    let p = r.pairs.iter().find(|p| p.name == "model.layers.3").expect("pair");
    assert!(p.cosine().unwrap_or(0.0) >= 0.99, "whole-tensor cosine stays high");
    assert_eq!(p.reasons, vec![Reason::LastToken]);
    assert_eq!(signature(&r), "last_token");
}

#[test]
fn near_tie_in_logits() {
    let a = model(1, 0);
    let mut b = a.clone();
    let lm = get(&mut b, "lm_head");
    // Row 2: make two logits a near tie in the reference's favour of index 3, then flip.
    let row = &mut lm.data[2 * V..3 * V];
    let top = row.iter().cloned().fold(f32::MIN, f32::max);
    row[3] = top + 0.01;
    row[4] = top + 0.005;
    let mut a2 = a.clone();
    a2.iter_mut().find(|t| t.name == "lm_head").expect("lm").data[2 * V..3 * V].copy_from_slice(row);
    row.swap(3, 4);
    let r = run(&a2, &b);
    let p = r.pairs.iter().find(|p| p.name == "lm_head").expect("pair");
    let l = p.logits.as_ref().expect("logit metrics");
    assert_eq!(l.argmax_mismatch_count, 1);
    assert_eq!(l.argmax_mismatches[0].row, 2);
    assert!(p.reasons.contains(&Reason::Argmax));
    assert_eq!(signature(&r), "near_tie");
}

#[test]
fn non_finite_values() {
    let a = model(1, 0);
    let mut b = a.clone();
    get(&mut b, "model.layers.1.mlp.act_fn").data[3] = f32::NAN;
    get(&mut b, "model.layers.1.mlp.act_fn").data[4] = f32::INFINITY;
    let r = run(&a, &b);
    assert_eq!(r.verdict.first_divergence.as_deref(), Some("model.layers.1.mlp.act_fn"));
    assert_eq!(signature(&r), "non_finite");
    assert!(r.verdict.likely_cause.as_deref().unwrap_or("").contains("target produces NaN/Inf"));
    // Both sides all NaN: a clear report, no panic.
    let mut n = a.clone();
    get(&mut n, "model.norm").data.iter_mut().for_each(|v| *v = f32::NAN);
    let r = run(&n, &n);
    let p = r.pairs.iter().find(|p| p.name == "model.norm").expect("pair");
    assert_eq!(p.status, Status::Diverged);
    assert!(p.reasons.contains(&Reason::NonFinite));
    assert!(r.verdict.likely_cause.as_deref().unwrap_or("").contains("reference has NaN/Inf"));
}

#[test]
fn shape_mismatch_and_allow_reshape() {
    let a = model(1, 0);
    let mut b = a.clone();
    get(&mut b, "model.layers.1.self_attn.k_proj").shape = vec![D, T];
    let r = run(&a, &b);
    assert_eq!(r.verdict.first_divergence.as_deref(), Some("model.layers.1.self_attn.k_proj"));
    assert_eq!(signature(&r), "shape_mismatch");
    let opts = CompareOptions { allow_reshape: true, ..CompareOptions::default() };
    let r = run_with(&a, &b, &opts);
    assert_eq!(r.verdict.verdict, "match");
    assert!(r.pairs.iter().any(|p| p.note.as_deref().unwrap_or("").contains("--allow-reshape")));
}

#[test]
fn op_table_localizes_the_first_sub_op() {
    let a = model(1, 0);
    let mut b = a.clone();
    perturb_rows(get(&mut b, "model.layers.2.mlp.act_fn"), 0..T, 1.0, 3);
    let r = run(&a, &b);
    assert_eq!(r.verdict.first_divergence.as_deref(), Some("model.layers.2.mlp.act_fn"));
    assert_eq!(signature(&r), "op");
    assert!(r.verdict.likely_cause.as_deref().unwrap_or("").contains("SiLU vs GELU"));
}

#[test]
fn o_proj_blamed_only_when_its_input_was_compared_and_matched() {
    let a = model(1, 0);
    let mut b = a.clone();
    perturb_rows(get(&mut b, "model.layers.2.self_attn.o_proj"), 0..T, 1.0, 3);
    let r = run(&a, &b);
    assert_eq!(r.verdict.first_divergence.as_deref(), Some("model.layers.2.self_attn.o_proj"));
    let cause = r.verdict.likely_cause.as_deref().unwrap_or("");
    assert!(cause.contains("the o_proj weight (its input self_attn.attn_output matched)"), "{cause}");
}

/// A reference dumped the way MAX's torch-side hooks dump it: module outputs only (no
/// q_rope / k_rope / attn_output / attn_residual / act_mul, which no module returns).
fn module_outputs_only(m: &[Named]) -> Vec<Named> {
    let not_modules = [".q_rope", ".k_rope", ".attn_output", ".attn_residual", ".act_mul"];
    m.iter().filter(|t| !not_modules.iter().any(|s| t.name.ends_with(s))).cloned().collect()
}

#[test]
fn a_bug_inside_the_attention_core_with_a_module_output_reference_cites_only_what_was_compared() {
    let full = model(1, 0);
    let reference = module_outputs_only(&full);
    // A RoPE / softmax-scale / GQA bug in layer 2: q_rope (for RoPE), the attention output and
    // everything after it change; q/k/v projections do not.
    let mut target = full.clone();
    for name in
        ["model.layers.2.self_attn.q_rope", "model.layers.2.self_attn.attn_output", "model.layers.2.self_attn.o_proj"]
    {
        perturb_rows(get(&mut target, name), 0..T, 1.0, 5);
    }
    // loupe / MAX `.max` dumps through DumpWriter, and MAX's PyTorch-side `.pt` directory.
    for style in ["npy", "max", "max-torch-pt"] {
        let dir = tempfile::tempdir().unwrap();
        let pa = match style {
            "npy" => {
                write_style(&dir.path().join("ref"), "transformers", &reference, Some(vec![1, 2, 3]), DumpStyle::Npy)
            }
            "max" => {
                write_style(&dir.path().join("ref"), "transformers", &reference, Some(vec![1, 2, 3]), DumpStyle::Max)
            }
            _ => write_max_torch_dir(&dir.path().join("ref"), &reference),
        };
        let pb = write_style(&dir.path().join("tgt"), "loupe", &target, Some(vec![1, 2, 3]), DumpStyle::Npy);
        let r = loupe_parity::compare(&pa, &pb, &CompareOptions::default(), &mut loupe_parity::NoProgress).unwrap();
        assert_eq!(r.verdict.first_divergence.as_deref(), Some("model.layers.2.self_attn.o_proj"), "{style:?}");
        assert_eq!(signature(&r), "op");
        let cause = r.verdict.likely_cause.as_deref().unwrap_or("");
        // Never the o_proj weight on the strength of an input nobody compared.
        assert!(!cause.contains("(its input"), "{style:?}: {cause}");
        assert!(cause.contains("its input self_attn.attn_output was not compared"), "{style:?}: {cause}");
        assert!(cause.contains("self_attn.q_proj, self_attn.k_proj, self_attn.v_proj matched"), "{style:?}: {cause}");
        // The attention core ranks before the o_proj weight.
        let (core, weight) =
            (cause.find("attention core").unwrap_or(usize::MAX), cause.find("o_proj weight").unwrap_or(0));
        assert!(core < weight, "{style:?}: {cause}");
        let next = r.verdict.next_step.as_deref().unwrap_or("");
        assert!(next.contains("dump model.layers.2.self_attn.attn_output on both sides"), "{style:?}: {next}");
        assert!(
            next.contains("loupe explain REF TARGET --tensor model.layers.2.self_attn.o_proj"),
            "{style:?}: {next}"
        );
    }
}

#[test]
fn an_mlp_bug_with_a_module_output_reference_names_its_unseen_input() {
    let full = model(1, 0);
    let reference = module_outputs_only(&full);
    let mut target = full.clone();
    for name in ["model.layers.1.mlp.act_mul", "model.layers.1.mlp.down_proj"] {
        perturb_rows(get(&mut target, name), 0..T, 1.0, 7);
    }
    let r = run(&reference, &target);
    assert_eq!(r.verdict.first_divergence.as_deref(), Some("model.layers.1.mlp.down_proj"));
    let cause = r.verdict.likely_cause.as_deref().unwrap_or("");
    assert!(cause.contains("its input mlp.act_mul was not compared"), "{cause}");
    assert!(cause.contains("mlp.up_proj, mlp.act_fn matched"), "{cause}");
    assert!(!cause.contains("(its input"), "{cause}");
}

#[test]
fn different_prompt_tokens_come_first() {
    let a = model(1, 0);
    let dir = tempfile::tempdir().expect("tmp");
    let pa = write(&dir.path().join("a"), "transformers", &a, Some(vec![1, 2, 3]));
    let pb = write(&dir.path().join("b"), "loupe", &a, Some(vec![1, 2, 4]));
    let r =
        loupe_parity::compare(&pa, &pb, &CompareOptions::default(), &mut loupe_parity::NoProgress).expect("compare");
    assert_eq!(r.verdict.verdict, "divergence");
    assert_eq!(r.verdict.first_divergence.as_deref(), Some("prompt_tokens"));
    assert_eq!(signature(&r), "prompt_tokens");
    assert!(r.verdict.likely_cause.as_deref().unwrap_or("").contains("position 2: 3 vs 4"));
}

#[test]
fn false_cliff_layer_offset() {
    let a = model(1, 0);
    let mut b = a.clone();
    // The target dumped hidden_states[i + 1] as layer i: it is one layer ahead.
    for l in 0..LAYERS - 1 {
        let next = a.iter().find(|t| t.name == format!("model.layers.{}", l + 1)).expect("layer").data.clone();
        get(&mut b, &format!("model.layers.{l}")).data = next;
    }
    let r = run(&a, &b);
    assert_eq!(r.verdict.first_divergence.as_deref(), Some("model.layers.0"));
    let c = r.verdict.false_cliffs.iter().find(|c| c.kind == "layer_offset").expect("layer offset found");
    assert!(c.message.contains("off by one"), "{}", c.message);
    assert_eq!(signature(&r), "false_cliff");
    assert!(!r.layer_shifts.is_empty() && r.layer_shifts[0].vs_next.unwrap_or(0.0) > 0.9999);
}

#[test]
fn false_cliff_decode_step_embedding() {
    let mut a = model(1, 0);
    a.extend(model(2, 1));
    let mut b = a.clone();
    let e = b.iter_mut().find(|t| t.name == "model.embed_tokens" && t.step == 1).expect("step 1 embedding");
    perturb_rows(e, 0..T, 1.0, 11);
    let r = run(&a, &b);
    assert_eq!(r.verdict.first_divergence_step, Some(1));
    let c = r.verdict.false_cliffs.iter().find(|c| c.kind == "decode_mask").expect("decode mask cliff");
    assert!(c.message.contains("attention mask"));
    // --step 0 compares the prefill alone, which matches.
    let opts = CompareOptions { step: Some(0), ..CompareOptions::default() };
    assert_eq!(run_with(&a, &b, &opts).verdict.verdict, "match");
}

#[test]
fn false_cliff_double_fired_hook() {
    let a = model(1, 0);
    let mut b = a.clone();
    let mut twice = b.iter().find(|t| t.name == "model.layers.1.mlp.down_proj").expect("t").clone();
    twice.name = "model.layers.1.mlp.down_proj(1)".into();
    b.push(twice.clone());
    let r = run(&a, &b);
    let c = r.verdict.false_cliffs.iter().find(|c| c.kind == "double_hook").expect("double hook cliff");
    assert_eq!(c.names, ["model.layers.1.mlp.down_proj(1)"]);
    assert_eq!(r.unpaired_b.len(), 1);
    // A module called twice that the other side never names (Gemma 3's rotary_emb, once per
    // layer type) cannot be mispaired: no cliff.
    let mut rotary = twice.clone();
    rotary.name = "model.rotary_emb".into();
    let mut rotary1 = twice;
    rotary1.name = "model.rotary_emb(1)".into();
    let mut b = a.clone();
    b.extend([rotary, rotary1]);
    let r = run(&a, &b);
    assert!(r.verdict.false_cliffs.iter().all(|c| c.kind != "double_hook"), "{:?}", r.verdict.false_cliffs);
}

#[test]
fn nothing_paired_is_a_divergence() {
    let a = model(1, 0);
    let mut b = a.clone();
    for t in &mut b {
        t.name = format!("other.{}", t.name);
    }
    let r = run(&a, &b);
    assert!(r.pairs.is_empty());
    assert_eq!(r.exit_code(), 1);
    assert!(r.verdict.likely_cause.as_deref().unwrap_or("").contains("No matching tensors found"));
    assert_eq!(r.unpaired_a.len(), a.len());
    let text = loupe_parity::report::render(&r, Default::default());
    assert!(text.contains("No matching tensors found."));
}
