//! Bad input fails with one clear line naming the file or field, exit code 2, no panic.

mod common;
use common::*;

#[test]
fn missing_model_file() {
    let out = run(loupe().args(["generate", "--model", "/nonexistent/model.gguf", "hi"]));
    assert_clean_failure(&out, "/nonexistent/model.gguf");
}

#[test]
fn file_that_is_not_gguf() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("notes.gguf");
    std::fs::write(&p, b"this is plain text, not a model").unwrap();
    let out = run(loupe().arg("generate").arg("--model").arg(&p).arg("hi"));
    assert_clean_failure(&out, "notes.gguf");
    let out = run(loupe().arg("inspect").arg(&p));
    assert_clean_failure(&out, "notes.gguf");
}

#[test]
fn truncated_gguf() {
    let model = tiny_model();
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("truncated.gguf");
    let bytes = std::fs::read(&model).unwrap();
    // In the header, in the metadata (the vocabulary), in the tensor infos, in the data.
    let infos = bytes.windows(17).position(|w| w == b"token_embd.weight").unwrap() + 10;
    for cut in [3usize, 24, 1000, 20_000, infos, bytes.len() / 2, bytes.len() - 1] {
        assert!(cut < bytes.len());
        std::fs::write(&p, &bytes[..cut]).unwrap();
        let out = run(loupe().arg("generate").arg("--model").arg(&p).arg("hi"));
        assert_clean_failure(&out, "truncated.gguf");
    }
}

#[test]
fn unsupported_architecture_and_tensor_type() {
    use loupe_formats::gguf::writer::GgufWriter;
    use loupe_formats::GgufValue;
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("falcon.gguf");
    let mut w = GgufWriter::new();
    w.add("general.architecture", GgufValue::String("falcon".into()));
    w.add_f32_tensor("token_embd.weight", &[4, 2], &[0.0; 8]);
    w.write_to_path(&p).unwrap();
    let out = run(loupe().arg("generate").arg("--model").arg(&p).arg("hi"));
    assert_clean_failure(&out, "unsupported architecture 'falcon'");

    // A tensor whose ggml type id (an IQ type, 16) loupe cannot run.
    let mut bytes = std::fs::read(&p).unwrap();
    let name = b"token_embd.weight";
    let at = bytes.windows(name.len()).position(|w| w == name).unwrap() + name.len();
    // name, then u32 n_dims (2), 2 x u64 dims, then the u32 type id
    let type_at = at + 4 + 16;
    bytes[type_at..type_at + 4].copy_from_slice(&16u32.to_le_bytes());
    std::fs::write(&p, &bytes).unwrap();
    let out = run(loupe().arg("generate").arg("--model").arg(&p).arg("hi"));
    assert_clean_failure(&out, "token_embd.weight");
}

#[test]
fn prompt_longer_than_context() {
    let model = tiny_model();
    // The tiny model's window is 256 tokens; " a" is at least one token each.
    assert_eq!(tiny_spec().context_length, 256);
    let prompt = " a".repeat(300);
    let out = run(loupe().arg("generate").arg("--model").arg(&model).arg(&prompt));
    assert_clean_failure(&out, "context window");
}

#[test]
fn zero_threads() {
    let out = run(loupe().args(["generate", "--threads", "0", "hi"]));
    assert_clean_failure(&out, "--threads");
}

#[test]
fn inspect_lists_tensors() {
    let out = run(loupe().arg("inspect").arg(tiny_model()));
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    let spec = tiny_spec();
    let vocab = 3 + 256 + spec.merges;
    assert!(text.contains("GGUF v3"), "{text}");
    assert!(
        text.contains("token_embd.weight")
            && text.contains("q8_0")
            && text.contains(&format!("[{vocab}, {}]", spec.hidden)),
        "{text}"
    );
    assert!(text.contains("blk.0.attn_q.weight") && text.contains("q4_1"), "{text}");
    assert!(text.contains(&format!("{} tensors", 2 + 9 * spec.layers)), "{text}");
    assert!(text.contains(&format!("[{vocab} x string: \"<|endoftext|>\"")), "the vocabulary is summarized: {text}");
}

#[test]
#[ignore = "needs the real model (scripts/test fetches it)"]
fn inspect_lists_tensors_of_the_real_model() {
    let model = real_model();
    let out = run(loupe().arg("inspect").arg(&model));
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("GGUF v3"), "{text}");
    assert!(text.contains("token_embd.weight") && text.contains("q8_0") && text.contains("[49152, 576]"), "{text}");
    assert!(text.contains("272 tensors"), "{text}");
}
