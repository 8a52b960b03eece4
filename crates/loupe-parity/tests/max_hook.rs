//! `loupe compare` of a MAX `PrintHook` dump against a dump named by module path, with no map
//! file: MAX's own labels (tests/fixtures/max-26.7/hook/max, written by MAX 26.7 for a tiny
//! `max.nn` model in a `LayerList`) pair with the numpy reference of the same model
//! (hook/reference) through the built-in MAX naming rules.

use std::path::{Path, PathBuf};

use loupe_formats::max_file::write_max;
use loupe_parity::max_names;
use loupe_parity::{compare, CompareOptions, NoProgress};

fn hook() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/max-26.7/hook")
}

fn run(a: &Path, b: &Path) -> loupe_parity::Report {
    compare(a, b, &CompareOptions::default(), &mut NoProgress).expect("compare")
}

#[test]
fn maxs_hook_dump_pairs_with_module_paths_without_a_map() {
    let r = run(&hook().join("reference"), &hook().join("max"));
    let names: Vec<&str> = r.pairs.iter().map(|p| p.name.as_str()).collect();
    // Every reference value pairs: 12 per layer (q, k, v split from qkv_proj; attn_output and
    // act_mul from the -input_0 of o_proj and down_proj), model.norm and lm_head.
    assert_eq!(r.pairs.len(), 26, "{names:?}");
    assert!(r.unpaired_a.is_empty(), "{:?}", r.unpaired_a);
    for n in [
        "model.layers.1.self_attn.k_proj",
        "model.layers.0.self_attn.attn_output",
        "model.layers.1.mlp.act_mul",
        "model.layers.1",
        "model.norm",
        "lm_head",
    ] {
        assert!(names.contains(&n), "{n}: {names:?}");
    }
    assert_eq!(r.verdict.verdict, "match", "{:?}", r.verdict);
    let lm = r.pairs.iter().find(|p| p.name == "lm_head").expect("lm_head");
    assert!(lm.note.as_deref().is_some_and(|n| n.contains("last token")), "{:?}", lm.note);
    assert_eq!(lm.shape, vec![11]);
    // The graph input is not a model value; the rules applied are reported.
    assert!(!r.unpaired_b.iter().any(|u| u.name.starts_with("model-input")), "{:?}", r.unpaired_b);
    let rules: Vec<&str> = r.naming_rules.iter().map(|(k, _)| k.as_str()).collect();
    for rule in [
        max_names::RULE_LAYER_LIST,
        max_names::RULE_QKV,
        max_names::RULE_ATTN_OUT,
        max_names::RULE_ACT_MUL,
        max_names::RULE_HEAD,
        max_names::RULE_LAST_TOKEN,
        max_names::RULE_INPUTS,
    ] {
        assert!(rules.contains(&rule), "{rule}: {rules:?}");
    }
    // Either side may be MAX's.
    let r = run(&hook().join("max"), &hook().join("reference"));
    assert_eq!((r.pairs.len(), r.verdict.verdict), (26, "match"));
}

#[test]
fn a_fused_qkv_whose_widths_do_not_add_up_stays_unpaired_with_the_reason() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    std::fs::create_dir_all(&a).unwrap();
    std::fs::create_dir_all(&b).unwrap();
    let qkv = "model.layers.layers.0.self_attn.qkv_proj-output";
    write_max(b.join(format!("{qkv}.max")), qkv, &[2, 6], &[0.5; 12]).unwrap();
    for (n, w) in [("q_proj", 2), ("k_proj", 2), ("v_proj", 1)] {
        let name = format!("model.layers.0.self_attn.{n}");
        write_max(a.join(format!("{name}.max")), &name, &[2, w], &vec![0.5; 2 * w]).unwrap();
    }
    let r = run(&a, &b);
    assert!(r.pairs.is_empty());
    assert!(
        r.unpaired_b.iter().all(|u| u.reason.as_deref().is_some_and(|x| x.contains("6 wide"))),
        "{:?}",
        r.unpaired_b
    );
    // With the right widths all three parts pair, sliced in q, k, v order.
    write_max(a.join("model.layers.0.self_attn.v_proj.max"), "model.layers.0.self_attn.v_proj", &[2, 2], &[0.5; 4])
        .unwrap();
    let r = run(&a, &b);
    assert_eq!(r.pairs.len(), 3, "{:?}", r.unpaired_b);
    assert_eq!(r.verdict.verdict, "match");
}

/// MAX's own Llama pipeline (max.pipelines llama3, float32 on the CPU) with `PrintHook` on a
/// tiny 2-layer checkpoint, against transformers' dump of the same checkpoint and prompt
/// (tests/fixtures/max-26.7/pipeline, both made by scripts/max-fixtures).
#[test]
fn maxs_llama_pipeline_dump_pairs_with_transformers_without_a_map() {
    let dir = hook().join("../pipeline");
    let r = run(&dir.join("reference"), &dir.join("max"));
    let names: Vec<&str> = r.pairs.iter().map(|p| p.name.as_str()).collect();
    // The embedding, 10 values per layer (q, k, v from the fused qkv_proj; attn_output and
    // act_mul from the -input_0 of o_proj and down_proj) and model.norm (last token only).
    assert_eq!(r.pairs.len(), 22, "{names:?}");
    assert!(r.unpaired_a.is_empty(), "{:?}", r.unpaired_a);
    assert_eq!(r.verdict.verdict, "match", "{:?}", r.verdict);
    let norm = r.pairs.iter().find(|p| p.name == "model.norm").expect("model.norm");
    assert!(norm.note.as_deref().is_some_and(|n| n.contains("last token")), "{:?}", norm.note);
    for n in ["model.layers.1.self_attn.v_proj", "model.layers.0.self_attn.attn_output", "model.layers.1.mlp.act_mul"] {
        assert!(names.contains(&n), "{n}: {names:?}");
    }
    // MAX's names, as its hook listed them: the LayerList path, the fused projection, no
    // gate_proj / up_proj (they run inside mlp), the head, graph inputs and the sampler.
    let listed = std::fs::read_to_string(dir.join("tensor_names.txt")).expect("tensor_names.txt");
    for label in [
        "model.layers.layers.1.self_attn.qkv_proj-output",
        "model.layers.layers.0.mlp.down_proj-input_0",
        "model.lm_head-output",
        "model-input_0",
        "TopKSampler-output_0",
    ] {
        assert!(listed.lines().any(|l| l == label), "{label}");
    }
    assert!(!listed.contains("gate_proj") && !listed.contains("up_proj"));
    assert!(!r.unpaired_b.iter().any(|u| u.name.starts_with("model-input") || u.name.starts_with("TopKSampler")));
}
