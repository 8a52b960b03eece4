//! Opens the real SmolLM2 model (`$LOUPE_MODEL`, else the cache path of
//! `scripts/fetch-model`: `loupe_models::real_model_path`). Ignored by default; run with
//! `--include-ignored` (scripts/test fetches the model) it fails with one line when the model
//! is missing. Expected figures: docs/models.md, "The default model".

use loupe_formats::{GgmlType, GgufFile};

#[test]
#[ignore = "needs the real model (scripts/test fetches it)"]
fn smollm2_q4_1_header() {
    let path = loupe_models::real_model_path();
    assert!(
        path.is_file(),
        "needs the real model at {} (missing): run scripts/fetch-model or set LOUPE_MODEL",
        path.display()
    );
    let f = GgufFile::open(&path).expect("the real model opens");
    assert_eq!(f.version, 3);
    assert_eq!(f.tensors.len(), 272);
    assert_eq!(f.architecture().ok(), Some("llama"));
    assert_eq!(f.get_u32("llama.block_count").ok(), Some(30));
    assert_eq!(f.get_u32("llama.embedding_length").ok(), Some(576));
    assert_eq!(f.get_u32("llama.feed_forward_length").ok(), Some(1536));
    assert_eq!(f.get_u32("llama.attention.head_count").ok(), Some(9));
    assert_eq!(f.get_u32("llama.attention.head_count_kv").ok(), Some(3));
    let eps = f.get_f32("llama.attention.layer_norm_rms_epsilon").expect("eps");
    assert!((eps - 1e-5).abs() < 1e-9, "{eps}");

    let tokens = f.get_str_array("tokenizer.ggml.tokens").expect("vocab");
    assert_eq!(tokens.len(), 49152);
    assert_eq!(f.get_u32("tokenizer.ggml.bos_token_id").ok(), Some(1));
    assert_eq!(f.get_u32("tokenizer.ggml.eos_token_id").ok(), Some(2));
    assert_eq!(tokens.get(2).copied(), Some("<|im_end|>"));

    let embd = f.tensor("token_embd.weight").expect("token_embd.weight");
    assert_eq!(embd.ggml_type, GgmlType::Q8_0);
    assert_eq!(embd.dims, [576, 49152]);
    assert_eq!(embd.shape(), [49152, 576]);
    assert_eq!(f.tensor_data(embd).len() as u64, embd.size_bytes);
    assert!(f.tensor("output.weight").is_none(), "SmolLM2 ties its embeddings");

    let count = |t: GgmlType| f.tensors.iter().filter(|i| i.ggml_type == t).count();
    assert_eq!(count(GgmlType::Q4_1), 210);
    assert_eq!(count(GgmlType::F32), 61);
    let data: u64 = f.tensors.iter().map(|t| t.size_bytes).sum();
    assert!((96_000_000..97_000_000).contains(&data), "{data} bytes of tensor data");
    assert!(f.bytes().len() as u64 >= f.data_offset + data);
    assert_eq!(f.data_offset % f.alignment, 0);

    // `loupe inspect` prints the vocabulary summarized.
    let shown = f.get("tokenizer.ggml.tokens").expect("tokens").to_string();
    assert!(shown.starts_with("[49152 x string: \"<|endoftext|>\""), "{shown}");
}
