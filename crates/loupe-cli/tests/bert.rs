//! BERT encoders from the command line: `loupe embed` on a tiny generated checkpoint (no
//! download), its refusals, and on the real all-MiniLM-L6-v2 against the transformers
//! reference: the sentence embeddings (`python -m loupe_reference embed`, which follows the
//! checkpoint's sentence-transformers pipeline) and `loupe parity` on every named value.

mod common;

use common::*;
use serde_json::Value;

fn tiny_bert_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    loupe_models::tiny_bert::write_tiny_bert(dir.path(), &loupe_models::tiny_bert::TinyBert::default()).unwrap();
    dir
}

fn embed_json(out: &std::process::Output) -> Value {
    assert!(out.status.success(), "loupe embed failed: {}", stderr(out));
    serde_json::from_str(&stdout(out)).unwrap_or_else(|e| panic!("not JSON ({e}): {}", stdout(out)))
}

fn vectors(v: &Value) -> Vec<Vec<f64>> {
    v["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["embedding"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect())
        .collect()
}

fn cosine(a: &[f64], b: &[f64]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| x * y).sum();
    dot / (a.iter().map(|x| x * x).sum::<f64>().sqrt() * b.iter().map(|x| x * x).sum::<f64>().sqrt())
}

#[test]
fn embed_prints_an_openai_style_list() {
    let dir = tiny_bert_dir();
    let out = run(loupe().arg("embed").arg("--model").arg(dir.path()).args(["the cat", "a dog sat", "--threads", "1"]));
    let v = embed_json(&out);
    assert_eq!(v["object"], "list");
    assert_eq!(
        (v["pooling"].as_str(), v["normalized"].as_bool()),
        (Some("mean"), Some(true)),
        "the checkpoint's pipeline: {v}"
    );
    let vs = vectors(&v);
    assert_eq!(vs.len(), 2);
    assert!(vs.iter().all(|e| e.len() == 32));
    for e in &vs {
        let norm = e.iter().map(|x| x * x).sum::<f64>().sqrt();
        assert!((norm - 1.0).abs() < 1e-5, "normalized: {norm}");
    }
    assert_eq!(v["data"][1]["index"], 1);
    // [CLS] the cat [SEP] + [CLS] a dog sat [SEP].
    assert_eq!(v["usage"]["prompt_tokens"], 9);

    // Flags override the checkpoint: CLS pooling, no normalization.
    let out = run(loupe().arg("embed").arg("--model").arg(dir.path()).args([
        "the cat",
        "--pooling",
        "cls",
        "--no-normalize",
        "--threads",
        "1",
    ]));
    let cls = embed_json(&out);
    assert_eq!((cls["pooling"].as_str(), cls["normalized"].as_bool()), (Some("cls"), Some(false)));
    let norm = vectors(&cls)[0].iter().map(|x| x * x).sum::<f64>().sqrt();
    assert!((norm - 1.0).abs() > 1e-3, "CLS state of a LayerNorm output is not unit length: {norm}");
    assert!(cosine(&vectors(&cls)[0], &vs[0]) < 0.9999, "CLS pooling gave the mean");
}

#[test]
fn embed_reads_texts_from_a_file_and_cuts_long_ones() {
    let dir = tiny_bert_dir();
    let file = dir.path().join("texts.txt");
    std::fs::write(&file, format!("the cat\n\n{}\n", "the cat sat on the mat ".repeat(10))).unwrap();
    let out = run(loupe().arg("embed").arg("--model").arg(dir.path()).arg("--file").arg(&file).args([
        "--max-tokens",
        "8",
        "--threads",
        "1",
    ]));
    let v = embed_json(&out);
    assert_eq!(vectors(&v).len(), 2, "the empty line is skipped");
    assert_eq!(v["usage"]["prompt_tokens"], 4 + 8);
    assert!(stderr(&out).contains("input 1 was cut to 8 tokens"), "{}", stderr(&out));
}

#[test]
fn embed_refuses_decoders_and_empty_input_in_one_line() {
    assert_clean_failure(&run(loupe().arg("embed").arg("--model").arg(tiny_model()).arg("hello")), "decoder");
    let dir = tiny_bert_dir();
    assert_clean_failure(&run(loupe().arg("embed").arg("--model").arg(dir.path())), "nothing to embed");
    assert_clean_failure(
        &run(loupe().arg("embed").arg("--model").arg(dir.path()).args(["x", "--max-tokens", "0"])),
        "--max-tokens",
    );
    // A bad flag value is clap's own message (exit 2), naming the choices.
    let out = run(loupe().arg("embed").arg("--model").arg(dir.path()).args(["x", "--pooling", "sum"]));
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("'sum' is not a pooling (mean, cls, max)"), "{}", stderr(&out));
}

#[test]
fn dump_runs_an_encoder_once() {
    let dir = tiny_bert_dir();
    assert_clean_failure(
        &run(loupe().arg("dump").arg("--model").arg(dir.path()).args(["--prompt", "the cat", "--steps", "1"])),
        "encoder",
    );
    let out_dir = dir.path().join("dump");
    let out = run(loupe().arg("dump").arg("--model").arg(dir.path()).args(["--prompt", "the cat", "-o"]).arg(&out_dir));
    assert!(out.status.success(), "{}", stderr(&out));
    let manifest: Value =
        serde_json::from_str(&std::fs::read_to_string(out_dir.join("manifest.json")).unwrap()).unwrap();
    let names: Vec<&str> = manifest["tensors"].as_array().unwrap().iter().filter_map(|t| t["name"].as_str()).collect();
    for want in [
        "embeddings.word_embeddings",
        "embeddings.LayerNorm",
        "encoder.layer.0.attention.self.query",
        "encoder.layer.1.output.LayerNorm",
    ] {
        assert!(names.contains(&want), "{want} missing from {names:?}");
    }
}

#[test]
#[ignore = "needs all-MiniLM-L6-v2 and the Python reference stack (scripts/test installs both)"]
fn minilm_embeddings_match_the_reference_pipeline() {
    let model = minilm_model();
    require_python_reference();
    let long = "The quick brown fox jumps over the lazy dog near the riverbank. ".repeat(30);
    let texts = [
        "The cat sits on the mat.",
        "A feline rests on a rug.",
        "Quarterly revenue rose by five percent.",
        long.as_str(),
    ];
    let ours = embed_json(&run(loupe().arg("embed").arg("--model").arg(&model).args(texts)));
    let out = python(&["embed", "--hf-dir", model.to_str().unwrap()]).args(texts).output().expect("python3");
    assert!(out.status.success(), "loupe_reference embed: {}", String::from_utf8_lossy(&out.stderr));
    let reference: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(reference["max_tokens"], 256, "sentence_bert_config.json's max_seq_length");
    assert_eq!(
        ours["usage"]["prompt_tokens"].as_u64(),
        Some(reference["tokens"].as_array().unwrap().iter().map(|t| t.as_u64().unwrap()).sum())
    );
    let ref_vectors: Vec<Vec<f64>> = reference["embeddings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e.as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect())
        .collect();
    let our_vectors = vectors(&ours);
    for (i, (a, b)) in our_vectors.iter().zip(&ref_vectors).enumerate() {
        assert_eq!(a.len(), 384);
        let worst = a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0f64, f64::max);
        // Measured 1e-7 on these texts (f32 rounding of a unit vector's entries).
        assert!(worst < 1e-5, "text {i}: max |loupe - reference| = {worst}");
    }
    // And the vectors mean what they should: a paraphrase is closer than an unrelated text.
    let (para, other) = (cosine(&our_vectors[0], &our_vectors[1]), cosine(&our_vectors[0], &our_vectors[2]));
    assert!(para > other + 0.3, "paraphrase {para:.3} vs unrelated {other:.3}");
}

#[test]
#[ignore = "needs all-MiniLM-L6-v2 and the Python reference stack (scripts/test installs both)"]
fn minilm_parity_matches_transformers_on_every_named_value() {
    let model = minilm_model();
    require_python_reference();
    let out = run(loupe()
        .arg("parity")
        .arg("--model")
        .arg(&model)
        .args(["--prompt", "Parity tools line up every tensor of the encoder."]));
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{text}\n{}", stderr(&out));
    assert!(text.contains("verdict: MATCH"), "{text}");
    assert!(text.contains("6 layer outputs") && text.contains("— pass"), "dumper guard: {text}");
    // Only BertModel's pooler (which sentence-transformers does not use) is the reference's alone.
    assert!(text.contains("unpaired in A (3): pooler.dense, pooler.activation, pooler"), "{text}");
}
