//! A tiny random-weight Llama as a GGUF file, for tests that need a whole model but not
//! SmolLM2's numbers: taps, dumps, debug options, planted faults, lowering, the executor.
//!
//! The file is laid out like the real SmolLM2 GGUF: architecture `llama`, tied embeddings
//! (no `output.weight`), a Q8_0 `token_embd.weight`, block-quantized layer matrices (Q4_1,
//! with `attn_v` and `ffn_down` in Q8_0 so both native decode paths run), F32 norms, q/k rows
//! permuted as llama.cpp's converter permutes them (which [`crate::weights::unpermute_rows`]
//! undoes), and a real byte-level BPE tokenizer (`tokenizer.ggml.model = "gpt2"`, `pre =
//! "smollm"`, every byte a token, merges learnt from a small English text, `<|endoftext|>`,
//! `<|im_start|>`, `<|im_end|>` as control tokens, BOS 1, EOS 2) with SmolLM2's ChatML template.
//!
//! With [`TinyLlama::gemma2`] set, the file is laid out as llama.cpp's converter writes a
//! Gemma 2 instead (architecture `gemma2`): four norms per layer stored plus one, q/k rows
//! unpermuted, every other layer sliding, and the two soft-caps in the metadata.
//!
//! Deterministic: the same [`TinyLlama`] gives the same bytes on every run and machine
//! (SplitMix64 draws, scalar quantization).

use std::collections::HashMap;
use std::path::Path;

use loupe_core::SplitMix64;
use loupe_formats::{GgmlType, GgufValue, GgufValueType, GgufWriter};
use loupe_tensor::quant::{quantize_row_with, Isa};

use crate::error::ModelError;

/// Shape and seed of a tiny Llama. `TinyLlama::default()`: 4 layers, hidden 64, 4 heads /
/// 2 KV heads (head dim 16), FFN 128, context 256, a vocabulary of 512 tokens.
#[derive(Debug, Clone, PartialEq)]
pub struct TinyLlama {
    pub seed: u64,
    pub layers: usize,
    pub hidden: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub ffn: usize,
    /// `llama.context_length`: the window (prompts longer than this are refused).
    pub context_length: usize,
    /// BPE merges to learn (fewer if the training text runs out of pairs); the vocabulary is
    /// 3 special tokens + 256 bytes + one token per merge.
    pub merges: usize,
    pub rope_theta: f32,
    pub rms_eps: f32,
    /// `token_embd.weight` (also the tied lm_head).
    pub embedding_type: GgmlType,
    /// q, k, o, gate, up projections.
    pub matrix_type: GgmlType,
    /// v and down projections.
    pub matrix_type_alt: GgmlType,
    /// Write a Gemma 2 (architecture `gemma2`) instead of a Llama.
    pub gemma2: Option<TinyGemma2>,
}

/// What a tiny Gemma 2 adds to the shape: its window and soft-caps (`gemma2.*` keys).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TinyGemma2 {
    /// `gemma2.attention.sliding_window`, on layers 0, 2, 4, ...
    pub sliding_window: usize,
    /// `gemma2.attn_logit_softcapping`.
    pub attn_softcap: f32,
    /// `gemma2.final_logit_softcapping`.
    pub final_softcap: f32,
}

impl Default for TinyGemma2 {
    /// Caps low enough to change the tiny model's scores and logits, a window shorter than
    /// the tests' prompts.
    fn default() -> Self {
        TinyGemma2 { sliding_window: 8, attn_softcap: 4.0, final_softcap: 10.0 }
    }
}

impl Default for TinyLlama {
    fn default() -> Self {
        TinyLlama {
            seed: 0x10c0_7e57,
            layers: 4,
            hidden: 64,
            heads: 4,
            kv_heads: 2,
            ffn: 128,
            context_length: 256,
            merges: 253,
            rope_theta: 10000.0,
            rms_eps: 1e-5,
            embedding_type: GgmlType::Q8_0,
            matrix_type: GgmlType::Q4_1,
            matrix_type_alt: GgmlType::Q8_0,
            gemma2: None,
        }
    }
}

impl TinyLlama {
    pub fn head_dim(&self) -> usize {
        self.hidden / self.heads
    }

    /// Width of one K (or V) row: `kv_heads * head_dim`.
    pub fn kv_width(&self) -> usize {
        self.kv_heads * self.head_dim()
    }
}

/// SmolLM2-135M-Instruct's chat template (ChatML with a default system message).
pub const CHAT_TEMPLATE: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

/// The special tokens, ids 0, 1, 2 (as in SmolLM2).
pub const SPECIAL_TOKENS: [&str; 3] = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"];
pub const BOS_ID: u32 = 1;
pub const EOS_ID: u32 = 2;

/// The text the merges are learnt from: the tests' prompts and some ordinary English, so
/// common words are a few tokens long.
const TRAINING_TEXT: &str = "The quick brown fox jumps over the lazy dog because it was tired. \
Hello there! Hello world. What is the capital of France? The capital of France is Paris. \
The lighthouse keeper climbed the stairs of the lighthouse every evening to light the lamp. \
Explain why the sky is blue in two sentences. Name a planet with rings. Saturn is a planet with rings. \
You are a helpful AI assistant named SmolLM, trained by Hugging Face. \
The sea was calm and the wind was low; the ships came into the harbour at the end of the day. \
In the morning the children walked to the school through the fields, and in the evening they walked home again. \
There is a small house on the hill where an old man lives with his dog and his cat. \
Write a function that returns the nth Fibonacci number. def fibonacci(n): return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2) \
Columbus sailed across the Atlantic in 1492, and people still talk about it in 2024. \
The system prompt says: answer in one word. Red, yellow and blue are the primary colors.";

/// Splits text into GPT-2-style pieces (an optional leading space, then a run of letters,
/// of digits, or of other non-space characters; spaces on their own), each spelled in the
/// byte alphabet. Only used to learn merges: the tokenizer built from the file has its own.
fn pieces(text: &str, table: &[char; 256]) -> Vec<String> {
    #[derive(PartialEq, Clone, Copy)]
    enum Class {
        Letter,
        Digit,
        Other,
        Space,
    }
    let class = |c: char| {
        if c.is_alphabetic() {
            Class::Letter
        } else if c.is_numeric() {
            Class::Digit
        } else if c.is_whitespace() {
            Class::Space
        } else {
            Class::Other
        }
    };
    let mut out: Vec<String> = Vec::new();
    let mut cur = String::new();
    for c in text.chars() {
        let k = class(c);
        let last = cur.chars().last().map(class);
        let joins = k != Class::Space && (cur == " " || last == Some(k));
        if !joins && !cur.is_empty() {
            out.push(std::mem::take(&mut cur));
        }
        cur.push(c);
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out.iter().map(|p| p.bytes().map(|b| table[b as usize]).collect()).collect()
}

/// Learns up to `n` BPE merges from [`TRAINING_TEXT`]: the most frequent adjacent pair
/// each time, ties broken by the pair's spelling (so the result is deterministic).
fn learn_merges(n: usize, table: &[char; 256]) -> Vec<(String, String)> {
    let mut counts: HashMap<String, usize> = HashMap::new();
    for p in pieces(TRAINING_TEXT, table) {
        *counts.entry(p).or_default() += 1;
    }
    let mut words: Vec<(Vec<String>, usize)> =
        counts.into_iter().map(|(w, c)| (w.chars().map(String::from).collect(), c)).collect();
    words.sort();
    let mut merges = Vec::new();
    while merges.len() < n {
        let mut pairs: HashMap<(&str, &str), usize> = HashMap::new();
        for (syms, c) in &words {
            for w in syms.windows(2) {
                *pairs.entry((&w[0], &w[1])).or_default() += c;
            }
        }
        let Some(((a, b), _)) = pairs.into_iter().max_by(|(p, x), (q, y)| x.cmp(y).then_with(|| q.cmp(p))) else {
            break;
        };
        let (a, b) = (a.to_string(), b.to_string());
        for (syms, _) in &mut words {
            let mut i = 0;
            while i + 1 < syms.len() {
                if syms[i] == a && syms[i + 1] == b {
                    syms[i] = format!("{a}{b}");
                    syms.remove(i + 1);
                }
                i += 1;
            }
        }
        merges.push((a, b));
    }
    merges
}

/// The vocabulary (specials, the 256 bytes in byte order, then one token per new merge
/// result) and the merges, `"left right"`.
pub fn tiny_vocab(merges: usize) -> (Vec<String>, Vec<String>) {
    let table = loupe_text::bytes_to_unicode();
    let mut tokens: Vec<String> = SPECIAL_TOKENS.iter().map(|s| s.to_string()).collect();
    tokens.extend(table.iter().map(|c| c.to_string()));
    let mut seen: std::collections::HashSet<String> = tokens.iter().cloned().collect();
    let mut merge_lines = Vec::new();
    for (a, b) in learn_merges(merges, &table) {
        let joined = format!("{a}{b}");
        if seen.insert(joined.clone()) {
            tokens.push(joined);
        }
        merge_lines.push(format!("{a} {b}"));
    }
    (tokens, merge_lines)
}

/// llama.cpp's q/k row permutation (convert_hf_to_gguf.py, `LlamaModel.permute`): within each
/// head, HF row `j * head_dim/2 + i` goes to GGUF row `2i + j`. The inverse of
/// [`crate::weights::unpermute_rows`].
pub fn permute_rows(data: &[f32], n_heads: usize, cols: usize) -> Vec<f32> {
    crate::weights::permute_rows(data, n_heads, cols)
}

/// Uniform draws in `[-scale, scale)`.
fn uniform(rng: &mut SplitMix64, n: usize, scale: f32) -> Vec<f32> {
    (0..n).map(|_| ((rng.next_u64() >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale).collect()
}

/// `values` (row-major, rows of `cols`) encoded as `ty`, by the scalar kernels (every ISA
/// writes the same bytes; scalar makes that independent of the machine by construction).
fn encode(ty: GgmlType, values: &[f32], cols: usize) -> Result<Vec<u8>, ModelError> {
    let rows = values.len() / cols;
    let err = |source| ModelError::Tensor { path: "<tiny llama>".into(), name: format!("{ty} rows of {cols}"), source };
    let row_bytes = ty.bytes_for(cols as u64).unwrap_or(0) as usize;
    let mut out = vec![0u8; rows * row_bytes];
    for (src, dst) in values.chunks(cols).zip(out.chunks_mut(row_bytes.max(1))) {
        quantize_row_with(Isa::Scalar, ty, src, dst).map_err(err)?;
    }
    Ok(out)
}

fn strings(v: &[String]) -> GgufValue {
    GgufValue::Array(GgufValueType::String, v.iter().map(|s| GgufValue::String(s.clone())).collect())
}

/// RMSNorm weights: 1 ± 0.2.
fn norm_weight(rng: &mut SplitMix64, n: usize) -> Vec<f32> {
    uniform(rng, n, 0.2).into_iter().map(|x| 1.0 + x).collect()
}

/// A `[rows, cols]` matrix of uniform draws with variance `gain² / cols` (so a product with
/// an O(1) input stays O(gain)), q/k rows permuted as llama.cpp stores them, encoded as `ty`.
/// Scales keep hidden states O(1) and attention neither uniform nor one-hot, so planted
/// faults show clearly and greedy choices are not near ties.
#[allow(clippy::too_many_arguments)]
fn add_matrix(
    w: &mut GgufWriter,
    rng: &mut SplitMix64,
    name: String,
    ty: GgmlType,
    rows: usize,
    cols: usize,
    gain: f32,
    permute_heads: Option<usize>,
) -> Result<(), ModelError> {
    let mut values = uniform(rng, rows * cols, gain * (3.0 / cols as f32).sqrt());
    if let Some(n) = permute_heads {
        values = permute_rows(&values, n, cols);
    }
    w.add_tensor(name, &[cols as u64, rows as u64], ty, encode(ty, &values, cols)?);
    Ok(())
}

/// The GGUF file of `spec`, in memory.
pub fn tiny_llama_gguf_bytes(spec: &TinyLlama) -> Result<Vec<u8>, ModelError> {
    let (tokens, merges) = tiny_vocab(spec.merges);
    let vocab = tokens.len();
    let (h, f, hd) = (spec.hidden, spec.ffn, spec.head_dim());
    let kv = spec.kv_width();
    let u32v = |n: usize| GgufValue::U32(n as u32);

    let arch = if spec.gemma2.is_some() { "gemma2" } else { "llama" };
    let key = |k: &str| format!("{arch}.{k}");
    let mut w = GgufWriter::new().with_label("<tiny llama>");
    w.add("general.architecture", GgufValue::String(arch.into()));
    w.add("general.name", GgufValue::String(format!("loupe tiny {arch}")));
    w.add("general.file_type", GgufValue::U32(3)); // MOSTLY_Q4_1, as SmolLM2's
    w.add("general.quantization_version", GgufValue::U32(2));
    w.add(key("vocab_size"), u32v(vocab));
    w.add(key("context_length"), u32v(spec.context_length));
    w.add(key("embedding_length"), u32v(h));
    w.add(key("block_count"), u32v(spec.layers));
    w.add(key("feed_forward_length"), u32v(f));
    w.add(key("rope.dimension_count"), u32v(hd));
    w.add(key("attention.head_count"), u32v(spec.heads));
    w.add(key("attention.head_count_kv"), u32v(spec.kv_heads));
    w.add(key("attention.layer_norm_rms_epsilon"), GgufValue::F32(spec.rms_eps));
    w.add(key("rope.freq_base"), GgufValue::F32(spec.rope_theta));
    if let Some(g) = &spec.gemma2 {
        w.add(key("attention.sliding_window"), u32v(g.sliding_window));
        w.add(key("attn_logit_softcapping"), GgufValue::F32(g.attn_softcap));
        w.add(key("final_logit_softcapping"), GgufValue::F32(g.final_softcap));
    }
    w.add("tokenizer.ggml.model", GgufValue::String("gpt2".into()));
    w.add("tokenizer.ggml.pre", GgufValue::String("smollm".into()));
    w.add("tokenizer.ggml.tokens", strings(&tokens));
    let types = (0..vocab).map(|i| GgufValue::I32(if i < SPECIAL_TOKENS.len() { 3 } else { 1 })).collect();
    w.add("tokenizer.ggml.token_type", GgufValue::Array(GgufValueType::I32, types));
    w.add("tokenizer.ggml.merges", strings(&merges));
    w.add("tokenizer.ggml.bos_token_id", GgufValue::U32(BOS_ID));
    w.add("tokenizer.ggml.eos_token_id", GgufValue::U32(EOS_ID));
    w.add("tokenizer.ggml.unknown_token_id", GgufValue::U32(0));
    w.add("tokenizer.ggml.padding_token_id", GgufValue::U32(EOS_ID));
    w.add("tokenizer.ggml.add_bos_token", GgufValue::Bool(false));
    w.add("tokenizer.chat_template", GgufValue::String(CHAT_TEMPLATE.into()));

    let mut rng = SplitMix64(spec.seed);
    let rng = &mut rng;
    let (m, alt) = (spec.matrix_type, spec.matrix_type_alt);
    add_matrix(&mut w, rng, "token_embd.weight".into(), spec.embedding_type, vocab, h, (h as f32 / 3.0).sqrt(), None)?;
    // Gemma's converter stores q/k rows as Hugging Face has them, and norms plus one (which
    // `norm_weight`'s 1 +- 0.2 stands for).
    let gemma = spec.gemma2.is_some();
    let (q_perm, k_perm) = if gemma { (None, None) } else { (Some(spec.heads), Some(spec.kv_heads)) };
    for l in 0..spec.layers {
        w.add_f32_tensor(format!("blk.{l}.attn_norm.weight"), &[h as u64], &norm_weight(rng, h));
        add_matrix(&mut w, rng, format!("blk.{l}.attn_q.weight"), m, spec.heads * hd, h, 2.0, q_perm)?;
        add_matrix(&mut w, rng, format!("blk.{l}.attn_k.weight"), m, kv, h, 2.0, k_perm)?;
        add_matrix(&mut w, rng, format!("blk.{l}.attn_v.weight"), alt, kv, h, 1.0, None)?;
        add_matrix(&mut w, rng, format!("blk.{l}.attn_output.weight"), m, h, spec.heads * hd, 1.0, None)?;
        if gemma {
            w.add_f32_tensor(format!("blk.{l}.post_attention_norm.weight"), &[h as u64], &norm_weight(rng, h));
        }
        w.add_f32_tensor(format!("blk.{l}.ffn_norm.weight"), &[h as u64], &norm_weight(rng, h));
        add_matrix(&mut w, rng, format!("blk.{l}.ffn_gate.weight"), m, f, h, 1.0, None)?;
        add_matrix(&mut w, rng, format!("blk.{l}.ffn_up.weight"), m, f, h, 1.0, None)?;
        add_matrix(&mut w, rng, format!("blk.{l}.ffn_down.weight"), alt, h, f, 1.0, None)?;
        if gemma {
            w.add_f32_tensor(format!("blk.{l}.post_ffw_norm.weight"), &[h as u64], &norm_weight(rng, h));
        }
    }
    w.add_f32_tensor("output_norm.weight", &[h as u64], &norm_weight(rng, h));
    Ok(w.to_bytes()?)
}

/// Writes the GGUF file of `spec` to `path`, atomically (a temporary file beside it, then a
/// rename), so concurrent writers of the same file never expose a partial one.
pub fn write_tiny_llama_gguf(path: &Path, spec: &TinyLlama) -> Result<(), ModelError> {
    let bytes = tiny_llama_gguf_bytes(spec)?;
    let io = |source| ModelError::Io { path: path.to_path_buf(), source };
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(format!(".{}.{:?}.partial", std::process::id(), std::thread::current().id()).replace(['(', ')'], ""));
    std::fs::write(&tmp, &bytes).map_err(io)?;
    std::fs::rename(&tmp, path).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        io(e)
    })
}
