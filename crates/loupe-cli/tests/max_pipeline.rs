//! loupe against MAX's own Llama pipeline: `loupe dump` of the tiny checkpoint that
//! `scripts/max-fixtures` gave MAX 26.7 (make-tiny, seed 0), on the same prompt, compared with
//! the `.max` files MAX's `PrintHook` wrote (tests/fixtures/max-26.7/pipeline/max), with no
//! map file: MAX's names pair with loupe's module paths and every pair matches.

mod common;

use common::{loupe, make_tiny_checkpoint, repo_root, run, stderr, stdout};

#[test]
#[ignore = "needs the Python reference stack and the real model's tokenizer (scripts/test installs both)"]
fn loupe_dump_of_the_tiny_checkpoint_matches_maxs_pipeline_dump() {
    let dir = tempfile::tempdir().expect("tempdir");
    let model = make_tiny_checkpoint(dir.path());
    let dump = dir.path().join("loupe");
    let o = run(loupe()
        .args(["dump", "--precision", "f32", "--prompt", "The capital of France is", "--model"])
        .arg(&model)
        .arg("-o")
        .arg(&dump));
    assert!(o.status.success(), "{}", stderr(&o));
    let max = repo_root().join("tests/fixtures/max-26.7/pipeline/max");
    let o = run(loupe().arg("compare").arg(&max).arg(&dump));
    let out = stdout(&o);
    assert_eq!(o.status.code(), Some(0), "{out}{}", stderr(&o));
    assert!(out.contains("verdict: MATCH"), "{out}");
    for line in [
        "model.layers.1.self_attn.k_proj",
        "model.layers.0.self_attn.attn_output",
        "model.layers.1.mlp.act_mul",
        "the reference holds the last token only (MAX)",
        "MAX naming",
    ] {
        assert!(out.contains(line), "{line}: {out}");
    }
}
