//! The tiny random-weight Llama of `loupe_models::tiny`: deterministic bytes, loads in every
//! precision with the configuration asked for, a working byte-level BPE tokenizer and chat
//! template, q/k permutation consistent with the loader, and a graph that runs.

mod common;
use common::{all_logits, argmax};
use loupe_formats::{GgmlType, GgufFile};
use loupe_graph::debug::DebugOptions;
use loupe_graph::exec::RunOptions;
use loupe_graph::{Executor, KvCache, WeightData};
use loupe_models::tiny::{self, TinyLlama};
use loupe_models::{load, LoadOptions, Model, Precision};
use loupe_text::ChatMessage;

fn write(spec: &TinyLlama) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tiny.gguf");
    tiny::write_tiny_llama_gguf(&path, spec).unwrap();
    (dir, path)
}

fn load_tiny(path: &std::path::Path, precision: Precision) -> Model {
    load(path, LoadOptions { precision, ..Default::default() }).unwrap_or_else(|e| panic!("{precision:?}: {e}"))
}

#[test]
fn the_same_spec_gives_the_same_bytes() {
    let spec = TinyLlama::default();
    let a = tiny::tiny_llama_gguf_bytes(&spec).unwrap();
    let b = tiny::tiny_llama_gguf_bytes(&spec).unwrap();
    assert!(a == b, "two builds of the same tiny model differ");
    let other = tiny::tiny_llama_gguf_bytes(&TinyLlama { seed: spec.seed + 1, ..spec.clone() }).unwrap();
    assert_eq!(a.len(), other.len());
    assert!(a != other, "the seed changes nothing");
    let (_dir, path) = write(&spec);
    assert!(std::fs::read(&path).unwrap() == a, "the file holds other bytes than tiny_llama_gguf_bytes");
    let leftovers: Vec<_> =
        std::fs::read_dir(path.parent().unwrap()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(leftovers, [std::ffi::OsString::from("tiny.gguf")], "the temporary file was left behind");
}

#[test]
fn the_file_looks_like_smollm2_in_small() {
    let spec = TinyLlama::default();
    let (_dir, path) = write(&spec);
    let f = GgufFile::open(&path).unwrap();
    assert_eq!(f.architecture().ok(), Some("llama"));
    assert_eq!(f.tensors.len(), 2 + 9 * spec.layers, "embedding, final norm, 9 tensors per layer");
    assert!(f.tensor("output.weight").is_none(), "tied embeddings: no output.weight");
    let ty = |n: &str| f.tensor(n).unwrap_or_else(|| panic!("no {n}")).ggml_type;
    assert_eq!(ty("token_embd.weight"), GgmlType::Q8_0);
    assert_eq!(ty("blk.0.attn_q.weight"), GgmlType::Q4_1);
    assert_eq!(ty("blk.0.attn_v.weight"), GgmlType::Q8_0);
    assert_eq!(ty("blk.0.ffn_down.weight"), GgmlType::Q8_0);
    assert_eq!(ty("blk.0.attn_norm.weight"), GgmlType::F32);
    assert_eq!(f.get_str("tokenizer.ggml.model").ok(), Some("gpt2"));
    assert_eq!(f.get_str("tokenizer.ggml.pre").ok(), Some("smollm"));
    let tokens = f.get_str_array("tokenizer.ggml.tokens").unwrap();
    assert_eq!(tokens.len(), 3 + 256 + spec.merges, "the training text should yield every merge asked for");
    assert_eq!(&tokens[..3], tiny::SPECIAL_TOKENS);
    assert_eq!(f.get_str_array("tokenizer.ggml.merges").unwrap().len(), spec.merges);
    assert!(f.get_str("tokenizer.chat_template").unwrap().contains("<|im_start|>"));

    let m = load_tiny(&path, Precision::F32);
    let c = m.config.decoder().expect("a decoder");
    assert_eq!(
        (
            c.num_hidden_layers,
            c.hidden_size,
            c.num_attention_heads,
            c.num_key_value_heads,
            c.head_dim,
            c.intermediate_size
        ),
        (spec.layers, spec.hidden, spec.heads, spec.kv_heads, spec.head_dim(), spec.ffn)
    );
    assert_eq!(c.vocab_size, tokens.len());
    assert_eq!(c.max_position_embeddings, spec.context_length);
    assert!(c.tie_word_embeddings);
    assert_eq!((m.graph.kv_layers, m.graph.kv_width), (spec.layers, spec.kv_width()));
}

#[test]
fn every_precision_loads_and_keeps_blocks_where_it_should() {
    let (_dir, path) = write(&TinyLlama::default());
    for precision in [Precision::F32, Precision::Native, Precision::Q8] {
        let m = load_tiny(&path, precision);
        let q =
            m.graph.weights.iter().find(|w| w.name == "model.layers.0.self_attn.q_proj.weight").expect("q_proj weight");
        match (&q.data, precision) {
            (WeightData::F32(_), Precision::F32) => {}
            (WeightData::Quant(b), Precision::Native | Precision::Q8) => assert_eq!(b.ty, GgmlType::Q4_1),
            (_, p) => panic!("{p:?}: q_proj held as {:?}", q.compute_type()),
        }
        assert_eq!(m.graph.quantize_activations, precision == Precision::Q8);
    }
}

#[test]
fn tokenizer_round_trips_and_knows_its_specials() {
    let (_dir, path) = write(&TinyLlama::default());
    let m = load_tiny(&path, Precision::F32);
    let tok = &m.tokenizer;
    for text in [
        "The quick brown fox jumps over the lazy dog",
        "Hello there",
        "  two  spaces\nand a line\ttab",
        "ünïcödé ✓ 日本語 🦀",
        "x = fibonacci(10) + 1492;",
        "",
    ] {
        let ids = tok.encode(text, false).unwrap();
        assert!(ids.iter().all(|&i| (i as usize) < m.config.vocab_size()), "{text:?}: {ids:?}");
        assert_eq!(tok.decode(&ids, false).unwrap(), text, "{text:?} -> {ids:?}");
    }
    // Merges were learnt: common words take fewer tokens than bytes.
    let fox = "The quick brown fox jumps over the lazy dog";
    let n = tok.encode(fox, false).unwrap().len();
    assert!(n < fox.len() / 2, "{n} tokens for {} bytes: merges are not applied", fox.len());
    // No BOS on a raw prompt (add_bos_token = false, as SmolLM2's GGUF).
    assert!(!tok.add_bos_token());
    assert_eq!(tok.encode_prompt("Hello").unwrap(), tok.encode("Hello", false).unwrap());
    assert_eq!((tok.bos_id(), tok.eos_id()), (Some(tiny::BOS_ID), Some(tiny::EOS_ID)));
    assert_eq!(tok.id_of("<|im_start|>"), Some(1));
    assert!(tok.is_special(1) && tok.is_special(2) && !tok.is_special(100));
    // Special tokens written in the text are matched whole.
    assert_eq!(tok.encode("<|im_end|>", false).unwrap(), [2]);
    assert_eq!(tok.decode(&[1, 2], true).unwrap(), "");
    // The chat template is SmolLM2's.
    let ids = tok.chat_ids(&[ChatMessage::user("hi")], true).unwrap();
    assert_eq!(ids[0], 1, "the chat starts with <|im_start|>");
    let text = tok.decode(&ids, false).unwrap();
    assert!(text.starts_with("<|im_start|>system\nYou are a helpful AI assistant named SmolLM"), "{text}");
    assert!(text.ends_with("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"), "{text}");
}

#[test]
fn qk_permutation_is_undone_by_the_loader() {
    let (heads, head_dim, cols) = (3, 8, 5);
    let hf: Vec<f32> = (0..heads * head_dim * cols).map(|i| i as f32).collect();
    let gguf = tiny::permute_rows(&hf, heads, cols);
    assert_ne!(gguf, hf);
    // Within a head, GGUF row 2i + j is HF row j * head_dim/2 + i.
    assert_eq!(&gguf[cols..2 * cols], &hf[(head_dim / 2) * cols..(head_dim / 2 + 1) * cols]);
    let bytes: Vec<u8> = gguf.iter().flat_map(|v| v.to_le_bytes()).collect();
    let back = loupe_models::weights::unpermute_rows(&bytes, heads, cols * 4);
    let back: Vec<f32> = back.chunks(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
    assert_eq!(back, hf);

    // In the file, f32 q/k weights: what the loader delivers is the unpermuted GGUF rows.
    let spec = TinyLlama { matrix_type: GgmlType::F32, ..TinyLlama::default() };
    let (_dir, path) = write(&spec);
    let f = GgufFile::open(&path).unwrap();
    let m = load_tiny(&path, Precision::F32);
    for (gguf_name, hf_name, n_heads) in [
        ("blk.1.attn_q.weight", "model.layers.1.self_attn.q_proj.weight", spec.heads),
        ("blk.1.attn_k.weight", "model.layers.1.self_attn.k_proj.weight", spec.kv_heads),
    ] {
        let raw = f.tensor_data(f.tensor(gguf_name).unwrap());
        let want: Vec<f32> = loupe_models::weights::unpermute_rows(raw, n_heads, spec.hidden * 4)
            .chunks(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        let w = m.graph.weights.iter().find(|w| w.name == hf_name).unwrap();
        let WeightData::F32(got) = &w.data else { panic!("{hf_name} not f32") };
        assert_eq!(**got, want, "{hf_name}");
        let raw_f32: Vec<f32> = raw.chunks(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();
        assert_ne!(**got, raw_f32, "{hf_name}: rows were not reordered");
    }
}

#[test]
fn runs_in_every_precision_with_finite_distinct_logits_and_agreeing_argmax() {
    let (_dir, path) = write(&TinyLlama::default());
    let f32_model = load_tiny(&path, Precision::F32);
    let tokens =
        f32_model.tokenizer.encode("The quick brown fox jumps over the lazy dog because it was tired", false).unwrap();
    let vocab = f32_model.config.vocab_size();
    let base = all_logits(&f32_model.graph, &tokens);
    assert_eq!(base.len(), tokens.len() * vocab);
    assert!(base.iter().all(|x| x.is_finite()));
    let base_argmax: Vec<usize> = base.chunks(vocab).map(argmax).collect();
    // Random weights, but not degenerate: the predictions vary with the input and the logits
    // have a spread (not all near zero).
    let distinct: std::collections::HashSet<_> = base_argmax.iter().collect();
    assert!(distinct.len() > 2, "the model predicts the same few tokens everywhere: {base_argmax:?}");
    let spread = base[..vocab].iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b))
        - base[..vocab].iter().fold(f32::INFINITY, |a, &b| a.min(b));
    assert!(spread > 1.0, "logit spread {spread}");
    for precision in [Precision::Native, Precision::Q8] {
        let m = load_tiny(&path, precision);
        let logits = all_logits(&m.graph, &tokens);
        assert!(logits.iter().all(|x| x.is_finite()), "{precision:?}");
        let agree = logits.chunks(vocab).map(argmax).zip(&base_argmax).filter(|(a, b)| a == *b).count();
        // The same weights (F32 dequantizes the same blocks): only the arithmetic differs.
        let floor = if precision == Precision::Native { tokens.len() } else { tokens.len() * 3 / 4 };
        assert!(agree >= floor, "{precision:?}: argmax agrees with f32 on {agree}/{} positions", tokens.len());
    }
}

/// `--precision fp8`: every decoder-layer matrix holds, row by row, values FP8 E4M3
/// represents at that row's guarded scale (max|row| / 448, applied as its reciprocal), the embedding (also the tied
/// lm_head) keeps f32's values, the graph rounds its layer inputs to FP8, and the logits
/// stay near f32's without equalling them.
#[test]
fn fp8_precision_rounds_layer_weights_per_row_and_keeps_the_embedding() {
    use loupe_core::fp8::Fp8Format;
    let (_dir, path) = write(&TinyLlama::default());
    let (wide, fp8) = (load_tiny(&path, Precision::F32), load_tiny(&path, Precision::Fp8));
    assert!(!wide.graph.weights.iter().any(|w| w.fp8), "f32 marks no weight fp8");
    let values = |m: &Model, name: &str| -> Vec<f32> {
        match &m.graph.weights.iter().find(|w| w.name == name).unwrap_or_else(|| panic!("no {name}")).data {
            WeightData::F32(v) => v.to_vec(),
            WeightData::Quant(_) => panic!("{name}: fp8 keeps f32 values"),
        }
    };
    let mut layer_matrices = 0;
    for w in fp8.graph.weights.iter().filter(|w| w.shape.len() == 2) {
        let (a, b) = (values(&wide, &w.name), values(&fp8, &w.name));
        assert_eq!(w.fp8, loupe_models::weights::is_fp8_linear(&w.name), "{}: marked by the loader's rule", w.name);
        if !w.fp8 {
            assert_eq!(a, b, "{}: kept as it was", w.name);
            continue;
        }
        layer_matrices += 1;
        assert_ne!(a, b, "{}: rounded", w.name);
        for (ra, rb) in a.chunks(w.shape[1]).zip(b.chunks(w.shape[1])) {
            let amax = ra.iter().fold(0f32, |m, v| m.max(v.abs()));
            let (scale, inv) = loupe_tensor::fp8::scale_and_reciprocal(amax, Fp8Format::E4M3);
            for (&x, &y) in ra.iter().zip(rb) {
                let code = Fp8Format::E4M3.encode(x * inv);
                assert_eq!(y, Fp8Format::E4M3.decode(code) * scale, "{}: {x} became {y}", w.name);
            }
        }
    }
    assert_eq!(layer_matrices, 7 * TinyLlama::default().layers);
    let tokens = fp8.tokenizer.encode("The quick brown fox jumps over the lazy dog", true).unwrap();
    let (la, lb) = (all_logits(&wide.graph, &tokens), all_logits(&fp8.graph, &tokens));
    let dot: f64 = la.iter().zip(&lb).map(|(x, y)| f64::from(*x) * f64::from(*y)).sum();
    let norm = |v: &[f32]| v.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>().sqrt();
    let cos = dot / (norm(&la) * norm(&lb));
    eprintln!("fp8 against f32: logits cosine {cos}");
    assert!(cos > 0.9 && cos < 1.0, "fp8 logits against f32's: cosine {cos}");
}

/// A tiny Gemma 2 GGUF (`gemma2` keys and tensor names, norms stored plus one): the config
/// reads its caps and every-other-layer window, the graph soft-caps attention (an attribute
/// of each attention node) and the logits (a `soft_cap` node named `logits` after `lm_head`),
/// whose rows are `lm_head`'s capped; and each cap changes the logits.
#[test]
fn a_tiny_gemma2_soft_caps_its_scores_and_logits() {
    use loupe_graph::{Observer, ValueInfo};
    use loupe_models::tiny::TinyGemma2;
    use loupe_models::Family;
    let gemma = TinyGemma2::default();
    let spec = TinyLlama { gemma2: Some(gemma), ..TinyLlama::default() };
    let (_dir, path) = write(&spec);
    let m = load_tiny(&path, Precision::F32);
    let c = m.config.decoder().expect("a decoder");
    assert_eq!(
        (c.family, c.attn_logit_softcap, c.final_logit_softcap),
        (Family::Gemma2, Some(gemma.attn_softcap), Some(gemma.final_softcap))
    );
    assert_eq!(c.layer_windows, [Some(8), None, Some(8), None]);
    let text = loupe_graph::print::to_text(&m.graph);
    assert_eq!(text.matches(&format!("softcap={}", gemma.attn_softcap)).count(), spec.layers, "{text}");
    assert!(text.contains(&format!("%{} logits = soft_cap(", m.graph.logits.unwrap().0)), "{text}");

    struct Rows(Vec<(String, Vec<f32>)>);
    impl Observer for Rows {
        fn wants(&mut self, v: &ValueInfo) -> bool {
            v.name == "lm_head" || v.name == "logits"
        }
        fn observe(&mut self, v: &ValueInfo, _: &[usize], data: &[f32]) {
            self.0.push((v.name.clone(), data.to_vec()));
        }
    }
    let tokens = [1u32, 72, 301, 44, 260, 7, 415, 99, 3, 12, 40];
    let mut exec = Executor::new(&m.graph, &DebugOptions::default());
    let mut kv = KvCache::new(m.graph.kv_layers, m.graph.kv_width, m.graph.context_length);
    let mut rows = Rows(Vec::new());
    let logits = exec.run(&m.graph, &tokens, &mut kv, RunOptions::default(), Some(&mut rows)).unwrap().to_vec();
    let vocab = logits.len();
    let (head, capped) = (&rows.0[0], &rows.0[1]);
    assert_eq!(
        (head.0.as_str(), head.1.len(), capped.0.as_str()),
        ("lm_head", vocab, "logits"),
        "generation computes the last row only"
    );
    let mut want = head.1.clone();
    loupe_tensor::ops::soft_cap(&mut want, gemma.final_softcap);
    assert_eq!(capped.1, want);
    assert_eq!(logits, want);
    assert!(
        head.1.iter().any(|x| x.abs() > gemma.final_softcap / 2.0),
        "the final cap does not bite: {:?}",
        &head.1[..8]
    );
    assert_eq!(argmax(&head.1), argmax(&logits), "soft-capping is monotone");
    // With all logits the last row is the same.
    assert_eq!(all_logits(&m.graph, &tokens)[(tokens.len() - 1) * vocab..], logits[..]);

    // Each cap changes the logits (a large cap is no cap).
    for other in [TinyGemma2 { attn_softcap: 1e9, ..gemma }, TinyGemma2 { final_softcap: 1e9, ..gemma }] {
        let (_d, p) = write(&TinyLlama { gemma2: Some(other), ..spec.clone() });
        let uncapped = all_logits(&load_tiny(&p, Precision::F32).graph, &tokens);
        let diff = uncapped[(tokens.len() - 1) * vocab..]
            .iter()
            .zip(&logits)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        assert!(diff > 1e-2, "{other:?}: logits moved by only {diff}");
    }
}
