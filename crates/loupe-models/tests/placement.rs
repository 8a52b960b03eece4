//! `--weights`: a GGUF's blocks read in place from the file's mapping compute exactly what
//! copied blocks compute; matrices the loader transforms, and f32 precision, are never in
//! place; `auto` on a file too small for its huge-page probe copies.

mod common;
use common::all_logits;
use loupe_graph::WeightData;
use loupe_models::tiny::{self, TinyLlama};
use loupe_models::{load, LoadOptions, Model, Precision, WeightPlacement};

fn write(spec: &TinyLlama) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.gguf");
    tiny::write_tiny_llama_gguf(&path, spec).unwrap();
    (dir, path)
}

fn load_with(path: &std::path::Path, precision: Precision, weights: WeightPlacement) -> Model {
    load(path, LoadOptions { precision, weights, ..Default::default() })
        .unwrap_or_else(|e| panic!("{precision:?} {weights:?}: {e}"))
}

/// The names of the model's block matrices whose bytes are read in place.
fn in_place(m: &Model) -> Vec<String> {
    m.graph
        .weights
        .iter()
        .filter(|w| matches!(&w.data, WeightData::Quant(q) if q.data.is_in_place()))
        .map(|w| w.name.clone())
        .collect()
}

#[test]
fn mapped_weights_compute_exactly_what_copied_ones_do() {
    let (_dir, path) = write(&TinyLlama::default());
    for precision in [Precision::Native, Precision::Auto, Precision::Q8] {
        let mapped = load_with(&path, precision, WeightPlacement::Mapped);
        let copied = load_with(&path, precision, WeightPlacement::Copied);
        assert!(mapped.weights_in_place && !copied.weights_in_place, "{precision:?}");
        assert!(in_place(&copied).is_empty(), "{precision:?}: copied weights read in place");
        let names = in_place(&mapped);
        for kept in ["model.layers.0.self_attn.v_proj.weight", "model.layers.1.mlp.down_proj.weight"] {
            assert!(names.iter().any(|n| n == kept), "{precision:?}: {kept} not in place: {names:?}");
        }
        // llama.cpp's q/k row permutation is undone into memory of the loader's own.
        assert!(!names.iter().any(|n| n.contains("q_proj") || n.contains("k_proj")), "{names:?}");
        let tokens = mapped.tokenizer.encode("The quick brown fox jumps over the lazy dog", false).unwrap();
        let (a, b) = (all_logits(&mapped.graph, &tokens), all_logits(&copied.graph, &tokens));
        assert!(a == b, "{precision:?}: in-place weights give other logits");
    }
}

#[test]
fn f32_precision_and_a_small_file_under_auto_copy() {
    let (_dir, path) = write(&TinyLlama::default());
    let f32_model = load_with(&path, Precision::F32, WeightPlacement::Mapped);
    assert!(!f32_model.weights_in_place, "f32 computes from values the loader makes");
    assert!(in_place(&f32_model).is_empty());
    // The tiny file holds no 16 separate 2 MiB windows of data to probe.
    let auto = load_with(&path, Precision::Native, WeightPlacement::Auto);
    assert_eq!(auto.weights_in_place, std::env::var("LOUPE_HUGEPAGES").is_ok_and(|v| v.trim() == "0"));
}

#[test]
fn in_place_weights_outlive_the_file_handle_and_survive_its_removal() {
    let (dir, path) = write(&TinyLlama::default());
    let mapped = load_with(&path, Precision::Native, WeightPlacement::Mapped);
    let tokens = mapped.tokenizer.encode("hello world", false).unwrap();
    let before = all_logits(&mapped.graph, &tokens);
    // Unlinking a mapped file keeps its pages (the mapping holds the inode).
    drop(dir);
    assert!(!path.exists());
    assert!(all_logits(&mapped.graph, &tokens) == before);
}
