//! The Hugging Face checkpoint-directory path, end to end: a tiny random Llama checkpoint
//! (`python -m loupe_reference make-tiny`: config.json, f32 model.safetensors, SmolLM2's
//! tokenizer files) is generated greedily by `loupe generate --precision f32` and by the
//! transformers reference (`loupe_reference generate --hf-dir`); prompt ids and tokens must be
//! identical, for a raw and a chat prompt, in two configurations:
//! tied embeddings without RoPE scaling, and an untied lm_head with Llama-3 RoPE scaling.
//! The other families (Qwen2, Qwen3, Mistral, Gemma 3, Gemma 2, Qwen3-MoE, GLM-4-MoE, Phi-3,
//! Seed-OSS, Hunyuan-MoE) are generated the same way and also pass `loupe parity` (every named
//! value within tolerance of transformers' forward hooks).
//!
//! Needs the Python reference stack and the SmolLM2 GGUF (which supplies the tokenizer): ignored
//! by default; run with `--include-ignored` (scripts/test) it fails with one line when they are missing.

mod common;
use common::*;
use std::path::Path;
use std::process::Output;
use std::sync::Mutex;

/// One Python model run at a time (the machine has 2 cores shared with builds).
static SERIAL: Mutex<()> = Mutex::new(());

const MAX_TOKENS: &str = "32";
const PROMPTS: [(&str, bool); 2] = [("The quick brown fox", false), ("What is the capital of France?", true)];

#[derive(serde::Deserialize, Debug)]
struct JsonOut {
    prompt_tokens: Vec<u32>,
    tokens: Vec<u32>,
    text: String,
}

fn checked(what: &str, o: Output) -> String {
    assert!(o.status.success(), "{what} failed ({}):\n{}", o.status, stderr(&o));
    stdout(&o)
}

fn make_tiny(dir: &Path, tokenizer_gguf: &Path, tie: bool, rope: &str) {
    make_tiny_with(dir, tokenizer_gguf, tie, rope, &[]);
}

fn make_tiny_with(dir: &Path, tokenizer_gguf: &Path, tie: bool, rope: &str, extra: &[&str]) {
    let mut c = python(&["make-tiny", "--seed", "0", "--rope-scaling", rope, "--out"]);
    c.arg(dir).arg("--tokenizer-gguf").arg(tokenizer_gguf).args(extra);
    if tie {
        c.arg("--tie");
    }
    checked("make-tiny", c.output().expect("python3"));
    for f in ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"] {
        assert!(dir.join(f).is_file(), "make-tiny wrote no {f}");
    }
    let cfg = config_of(dir);
    assert_eq!(cfg["tie_word_embeddings"], serde_json::Value::Bool(tie), "{cfg}");
    let rope_type = cfg["rope_parameters"]["rope_type"].as_str().or_else(|| cfg["rope_scaling"]["rope_type"].as_str());
    assert_eq!(rope_type.unwrap_or("default"), if rope == "none" { "default" } else { rope }, "{cfg}");
}

fn reference(dir: &Path, prompt: &str, chat: bool) -> JsonOut {
    let mut c = python(&["generate", "--hf-dir"]);
    c.arg(dir).args(["--prompt", prompt, "--max-tokens", MAX_TOKENS, "--json"]);
    if chat {
        c.arg("--chat");
    }
    let out = checked("loupe_reference generate", c.output().expect("python3"));
    serde_json::from_str(out.lines().last().unwrap_or("")).unwrap_or_else(|e| panic!("reference json: {e}: {out}"))
}

/// Greedy decoding, loupe's default in these tests.
const GREEDY: &[&str] = &["--temperature", "0"];
/// Seeded sampling at temperature 1: tokens follow the whole distribution, not only its
/// argmax (what a monotone change of the logits, such as a final soft-cap, moves).
const SAMPLED: &[&str] = &["--temperature", "1", "--seed", "7"];

fn ours(dir: &Path, prompt: &str, chat: bool) -> JsonOut {
    ours_with(dir, prompt, chat, GREEDY)
}

fn ours_with(dir: &Path, prompt: &str, chat: bool, sampling: &[&str]) -> JsonOut {
    let mut c = loupe();
    c.arg("generate").arg("--model").arg(dir);
    c.args(["--precision", "f32", "--json", "--max-tokens", MAX_TOKENS]).args(sampling);
    if chat {
        c.arg("--chat");
    }
    c.arg(prompt);
    let out = checked("loupe generate", run(&mut c));
    serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("loupe json: {e}: {out}"))
}

/// `loupe parity` on the checkpoint (both sides dumped by module path, every paired value
/// compared, at the prefill and two teacher-forced decode steps): the verdict must be MATCH,
/// every value within tolerance. The prompt is longer than the sliding-window tests' window.
fn parity_matches(dir: &Path, label: &str) {
    let mut c = loupe();
    c.arg("parity")
        .arg("--model")
        .arg(dir)
        .args([
            "--prompt",
            "The quick brown fox jumps over the lazy dog because it was tired of running",
            "--steps",
            "2",
            "-o",
        ])
        .arg(dir.join("parity"));
    let o = run(&mut c);
    let out = stdout(&o);
    assert!(
        o.status.success() && out.contains("verdict: MATCH"),
        "{label}: loupe parity did not match ({}):\n{out}\n{}",
        o.status,
        stderr(&o)
    );
}

/// The checkpoint's config.json.
fn config_of(dir: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap()
}

/// The test must be able to see `feature`: with `edit` applied to config.json, loupe's
/// greedy tokens on the prompts differ from `tokens` (those of the unedited checkpoint).
fn assert_generation_changes_without(
    dir: &Path,
    tokens: &[Vec<u32>],
    feature: &str,
    edit: impl FnOnce(&mut serde_json::Value),
) {
    assert_ne!(
        generation_without(dir, GREEDY, edit),
        tokens,
        "{feature} change nothing on these prompts; the test cannot detect their absence"
    );
}

/// loupe's tokens on the prompts, decoded as `sampling` says, with `edit` applied to
/// config.json; the file is restored afterwards.
fn generation_without(dir: &Path, sampling: &[&str], edit: impl FnOnce(&mut serde_json::Value)) -> Vec<Vec<u32>> {
    let original = std::fs::read(dir.join("config.json")).unwrap();
    let mut cfg = config_of(dir);
    edit(&mut cfg);
    std::fs::write(dir.join("config.json"), serde_json::to_string_pretty(&cfg).unwrap()).unwrap();
    let edited = PROMPTS.iter().map(|(p, chat)| ours_with(dir, p, *chat, sampling).tokens).collect();
    std::fs::write(dir.join("config.json"), original).unwrap();
    edited
}

/// config.json edit: the same checkpoint read as a Llama.
fn as_llama(cfg: &mut serde_json::Value) {
    cfg["architectures"] = serde_json::json!(["LlamaForCausalLM"]);
    cfg["model_type"] = serde_json::json!("llama");
}

/// Both sides on both prompts; returns loupe's tokens per prompt.
fn compare(dir: &Path, label: &str) -> Vec<Vec<u32>> {
    let mut all = Vec::new();
    for (prompt, chat) in PROMPTS {
        let r = reference(dir, prompt, chat);
        let o = ours(dir, prompt, chat);
        let what = format!("{label}, prompt {prompt:?} (chat {chat})");
        assert_eq!(o.prompt_tokens, r.prompt_tokens, "{what}: prompt ids differ");
        assert_eq!(r.tokens.len(), MAX_TOKENS.parse::<usize>().unwrap(), "{what}: the reference stopped early: {r:?}");
        assert_eq!(o.tokens, r.tokens, "{what}: tokens differ\nloupe:     {:?}\nreference: {:?}", o.text, r.text);
        assert_eq!(o.text, r.text, "{what}: detokenized text differs");
        all.push(o.tokens);
    }
    all
}

/// A tiny checkpoint (`make-tiny` with `extra`, no RoPE scaling) in `<temp>/<name>`, with the
/// Python lock held; the directory lives as long as the returned TempDir.
fn tiny_checkpoint(
    name: &str,
    tie: bool,
    extra: &[&str],
) -> (std::sync::MutexGuard<'static, ()>, tempfile::TempDir, std::path::PathBuf) {
    let (guard, gguf) = setup();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join(name);
    make_tiny_with(&dir, &gguf, tie, "none", extra);
    (guard, tmp, dir)
}

fn setup() -> (std::sync::MutexGuard<'static, ()>, std::path::PathBuf) {
    let guard = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let model = real_model();
    require_python_reference();
    (guard, model)
}

#[test]
#[ignore = "needs the real model and the Python reference stack (scripts/test installs both)"]
fn tiny_tied_no_rope_scaling_matches_reference() {
    let (_guard, gguf) = setup();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("tiny-tied");
    make_tiny(&dir, &gguf, true, "none");
    let st = std::fs::read(dir.join("model.safetensors")).unwrap();
    assert!(
        !String::from_utf8_lossy(&st[..st.len().min(8192)]).contains("lm_head.weight"),
        "a tied checkpoint should store no lm_head.weight"
    );
    compare(&dir, "tied, rope none");
}

#[test]
#[ignore = "needs the real model and the Python reference stack (scripts/test installs both)"]
fn tiny_untied_llama3_rope_matches_reference() {
    let (_guard, gguf) = setup();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("tiny-llama3");
    make_tiny(&dir, &gguf, false, "llama3");
    let tokens = compare(&dir, "untied, rope llama3");

    // The same weights without the scaling generate otherwise.
    assert_generation_changes_without(&dir, &tokens, "llama3 RoPE scaling does", |cfg| {
        let obj = cfg.as_object_mut().unwrap();
        obj.remove("rope_scaling");
        obj.insert("rope_parameters".into(), serde_json::json!({"rope_type": "default", "rope_theta": 10000.0}));
    });
}

/// Qwen2ForCausalLM: q/k/v biases (random, so a loader that drops them is caught) and no
/// o_proj bias, through the same builder.
#[test]
#[ignore = "needs the real model and the Python reference stack (scripts/test installs both)"]
fn tiny_qwen2_matches_reference() {
    let (_guard, _tmp, dir) = tiny_checkpoint("tiny-qwen2", false, &["--family", "qwen2"]);
    let cfg = config_of(&dir);
    assert_eq!(cfg["architectures"][0], "Qwen2ForCausalLM", "{cfg}");
    let tokens = compare(&dir, "qwen2");
    parity_matches(&dir, "qwen2");

    // Read as a Llama, the checkpoint's q/k/v biases are not loaded.
    assert_generation_changes_without(&dir, &tokens, "q/k/v biases", as_llama);
}

/// MistralForCausalLM with an 8-token window: both prompts outgrow it within their 24
/// generated tokens (the chat prompt before the first), so every layer's mask is exercised
/// at prefill and decode.
#[test]
#[ignore = "needs the real model and the Python reference stack (scripts/test installs both)"]
fn tiny_mistral_sliding_window_matches_reference() {
    let (_guard, _tmp, dir) = tiny_checkpoint("tiny-mistral", false, &["--family", "mistral", "--sliding-window", "8"]);
    let cfg = config_of(&dir);
    assert_eq!(
        (cfg["architectures"][0].as_str(), cfg["sliding_window"].as_u64()),
        (Some("MistralForCausalLM"), Some(8)),
        "{cfg}"
    );
    let tokens = compare(&dir, "mistral, window 8");
    parity_matches(&dir, "mistral, window 8");

    assert_generation_changes_without(&dir, &tokens, "the sliding window does", |cfg| {
        cfg["sliding_window"] = serde_json::Value::Null
    });
}

/// Qwen3ForCausalLM: per-head q/k RMSNorms (random weights 1 + N(0, 0.1^2)) before RoPE,
/// with attention biases.
#[test]
#[ignore = "needs the real model and the Python reference stack (scripts/test installs both)"]
fn tiny_qwen3_matches_reference() {
    let (_guard, _tmp, dir) = tiny_checkpoint("tiny-qwen3", true, &["--family", "qwen3", "--attention-bias"]);
    let cfg = config_of(&dir);
    assert_eq!(cfg["architectures"][0], "Qwen3ForCausalLM", "{cfg}");
    let tokens = compare(&dir, "qwen3");
    parity_matches(&dir, "qwen3");

    // Read as a Llama (which has none), the q/k norms are not applied.
    assert_generation_changes_without(&dir, &tokens, "q/k norms", as_llama);
}

/// Gemma3ForCausalLM: `1 + weight` norms (random weights N(0, 0.1^2)), four norms per layer,
/// q/k norms, embeddings scaled by sqrt(64), GELU-tanh, query_pre_attn_scalar 24 (not
/// head_dim), layer 0 sliding (window 8, RoPE base 1e4) and layer 1 global (base 1e6).
#[test]
#[ignore = "needs the real model and the Python reference stack (scripts/test installs both)"]
fn tiny_gemma3_matches_reference() {
    let (_guard, _tmp, dir) = tiny_checkpoint("tiny-gemma3", true, &["--family", "gemma3", "--sliding-window", "8"]);
    let cfg = config_of(&dir);
    assert_eq!(
        (cfg["architectures"][0].as_str(), cfg["sliding_window"].as_u64()),
        (Some("Gemma3ForCausalLM"), Some(8)),
        "{cfg}"
    );
    let tokens = compare(&dir, "gemma3");
    parity_matches(&dir, "gemma3");

    // Without the window (both layers global), the generation changes: the window is seen.
    assert_generation_changes_without(&dir, &tokens, "the sliding window and local RoPE base do", |cfg| {
        cfg["layer_types"] = serde_json::json!(["full_attention", "full_attention"]);
    });
}

/// Gemma2ForCausalLM: Gemma 3's `1 + weight` and sandwich norms, scaled embeddings and
/// GELU-tanh without q/k norms; query_pre_attn_scalar 8 (not head_dim 16); layer 0 sliding
/// (window 8), layer 1 global, one RoPE base; attention scores (up to about 7) soft-capped
/// at 3 and logits (up to about 7) at 5 (make-tiny's values).
#[test]
#[ignore = "needs the real model and the Python reference stack (scripts/test installs both)"]
fn tiny_gemma2_matches_reference() {
    let (_guard, _tmp, dir) = tiny_checkpoint("tiny-gemma2", true, &["--family", "gemma2", "--sliding-window", "8"]);
    let cfg = config_of(&dir);
    let f = |k: &str| cfg[k].as_f64();
    assert_eq!(
        (cfg["architectures"][0].as_str(), cfg["sliding_window"].as_u64()),
        (Some("Gemma2ForCausalLM"), Some(8)),
        "{cfg}"
    );
    assert_eq!(
        (f("attn_logit_softcapping"), f("final_logit_softcapping"), f("query_pre_attn_scalar")),
        (Some(3.0), Some(5.0), Some(8.0)),
        "{cfg}"
    );
    assert_eq!(cfg["layer_types"], serde_json::json!(["sliding_attention", "full_attention"]), "{cfg}");
    let tokens = compare(&dir, "gemma2");
    // Parity pairs `lm_head` (uncapped) and `logits` (the capped model output) too.
    parity_matches(&dir, "gemma2");

    // Null turns a cap off (an absent key would mean Gemma2Config's default, 50 or 30).
    let no_attn_cap = |cfg: &mut serde_json::Value| cfg["attn_logit_softcapping"] = serde_json::Value::Null;
    let no_final_cap = |cfg: &mut serde_json::Value| cfg["final_logit_softcapping"] = serde_json::Value::Null;
    assert_generation_changes_without(&dir, &tokens, "the attention soft-cap does", no_attn_cap);
    // The final cap is monotone, so greedy tokens keep their argmax; sampled ones change.
    assert_eq!(
        generation_without(&dir, GREEDY, no_final_cap),
        tokens,
        "without the final cap greedy tokens should not change (tanh is monotone)"
    );
    let sampled: Vec<Vec<u32>> = PROMPTS.iter().map(|(p, chat)| ours_with(&dir, p, *chat, SAMPLED).tokens).collect();
    assert_ne!(
        generation_without(&dir, SAMPLED, no_final_cap),
        sampled,
        "the final soft-cap changes no sampled token; the test cannot detect its absence"
    );
    assert_generation_changes_without(&dir, &tokens, "the sliding window does", |cfg| {
        cfg["layer_types"] = serde_json::json!(["full_attention", "full_attention"]);
    });
}

/// How many of the prompt's tokens each expert of MoE layer `layer` received, from loupe's
/// own dump of the router's choice (`mlp.gate.top_k_index`) on the chat prompt.
fn expert_load(dir: &Path, layer: usize, n_experts: usize) -> Vec<usize> {
    let out = dir.join("routing");
    let name = format!("model.layers.{layer}.mlp.gate.top_k_index");
    let mut c = loupe();
    c.arg("dump")
        .arg("--model")
        .arg(dir)
        .args(["--precision", "f32", "--chat", "--prompt", PROMPTS[1].0, "--taps"])
        .arg(format!("^{}$", name.replace('.', r"\.")))
        .arg("-o")
        .arg(&out);
    checked("loupe dump", run(&mut c));
    let ids = loupe_formats::npy::NpyFile::open(out.join("step0").join(format!("{name}.npy")))
        .expect("npy")
        .tensor()
        .expect("tensor")
        .to_f32()
        .expect("f32");
    std::fs::remove_dir_all(&out).unwrap();
    let mut load = vec![0; n_experts];
    for id in ids {
        assert!(id >= 0.0 && id.fract() == 0.0 && (id as usize) < n_experts, "expert id {id}");
        load[id as usize] += 1;
    }
    load
}

/// `loupe bisect` on the checkpoint: the batched engine (among neighbours, chunked, from the
/// prefix cache) and the server give the single-sequence path's tokens, which follow
/// transformers' argmax; every rung must run and pass.
fn bisect_matches(dir: &Path, label: &str) {
    let mut c = loupe();
    c.arg("bisect").arg("--model").arg(dir).args(["--prompt", "The quick brown fox jumps over the lazy dog"]);
    let o = run(&mut c);
    let out = stdout(&o);
    assert!(
        o.status.success() && out.contains("verdict: MATCH on every rung that ran"),
        "{label}: bisect ({}):\n{out}\n{}",
        o.status,
        stderr(&o)
    );
    for rung in ["reference", "teacher-forced", "incremental", "batched", "served"] {
        assert!(
            out.lines().any(|l| l.contains(rung) && l.contains(" ok ")),
            "{label}: rung {rung} did not pass:\n{out}"
        );
    }
}

/// The prompt must exercise every expert of the MoE layer, or a wrong expert could go unseen.
fn assert_every_expert_routed(dir: &Path, layer: usize, n_experts: usize) {
    let load = expert_load(dir, layer, n_experts);
    assert!(load.iter().all(|&n| n > 0), "layer {layer}: some expert gets no token of the chat prompt: {load:?}");
}

/// Runs `f` with the f32 tensor `name` of the checkpoint's model.safetensors zeroed in place
/// (the file is restored afterwards): a parameter no config key turns off.
fn with_zeroed_tensor<T>(dir: &Path, name: &str, f: impl FnOnce() -> T) -> T {
    let path = dir.join("model.safetensors");
    let original = std::fs::read(&path).unwrap();
    let n = u64::from_le_bytes(original[..8].try_into().unwrap()) as usize;
    let header: serde_json::Value = serde_json::from_slice(&original[8..8 + n]).unwrap();
    let entry = &header[name];
    assert_eq!(entry["dtype"], "F32", "{name}: {entry}");
    let (a, b) =
        (entry["data_offsets"][0].as_u64().unwrap() as usize, entry["data_offsets"][1].as_u64().unwrap() as usize);
    let mut edited = original.clone();
    assert!(edited[8 + n + a..8 + n + b].iter().any(|&x| x != 0), "{name} is already zero");
    edited[8 + n + a..8 + n + b].fill(0);
    std::fs::write(&path, edited).unwrap();
    let out = f();
    std::fs::write(&path, original).unwrap();
    out
}

/// Qwen3MoeForCausalLM: Qwen3 attention (q/k norms) with layer 0 a sparse MoE block (softmax
/// router over 8 experts, top 2 renormalized) and layer 1 dense (`mlp_only_layers`); the router,
/// its choice and weights and the experts are all paired by parity.
#[test]
#[ignore = "needs the real model and the Python reference stack (scripts/test installs both)"]
fn tiny_qwen3_moe_matches_reference() {
    let (_guard, _tmp, dir) = tiny_checkpoint("tiny-qwen3-moe", false, &["--family", "qwen3_moe"]);
    let cfg = config_of(&dir);
    assert_eq!(cfg["architectures"][0], "Qwen3MoeForCausalLM", "{cfg}");
    assert_eq!(
        (cfg["num_local_experts"].as_u64(), cfg["num_experts_per_tok"].as_u64(), cfg["norm_topk_prob"].as_bool()),
        (Some(8), Some(2), Some(true)),
        "{cfg}"
    );
    assert_eq!(cfg["mlp_only_layers"], serde_json::json!([1]), "{cfg}");
    let tokens = compare(&dir, "qwen3_moe");
    parity_matches(&dir, "qwen3_moe");
    bisect_matches(&dir, "qwen3_moe");
    assert_every_expert_routed(&dir, 0, 8);

    assert_generation_changes_without(&dir, &tokens, "the renormalization of the top-k weights does", |cfg| {
        cfg["norm_topk_prob"] = serde_json::json!(false)
    });
    // Layer 1 sparse too (it has no expert weights): loupe must refuse, naming the tensor.
    let original = std::fs::read(dir.join("config.json")).unwrap();
    let mut edited = config_of(&dir);
    edited["mlp_only_layers"] = serde_json::json!([]);
    std::fs::write(dir.join("config.json"), serde_json::to_string(&edited).unwrap()).unwrap();
    let mut c = loupe();
    let o = run(c.arg("generate").arg("--model").arg(&dir).args(["--precision", "f32", "--max-tokens", "1", "hi"]));
    std::fs::write(dir.join("config.json"), original).unwrap();
    assert_clean_failure(&o, "model.layers.1.mlp.gate.weight");
}

/// Glm4MoeForCausalLM with DeepSeek-V3's router: layer 0 dense (`first_k_dense_replace` 1),
/// layer 1 sparse: sigmoid scores, a selection-only correction bias, 4 groups of 2 experts of
/// which 2 groups may be used, top 2, renormalized, times 2.5, plus one shared expert; q/k norms
/// and q/k/v biases; `partial_rotary_factor` 1.0 (loupe refuses GLM's default 0.5).
#[test]
#[ignore = "needs the real model and the Python reference stack (scripts/test installs both)"]
fn tiny_glm4_moe_matches_reference() {
    let (_guard, _tmp, dir) = tiny_checkpoint("tiny-glm4-moe", false, &["--family", "glm4_moe"]);
    let cfg = config_of(&dir);
    assert_eq!(cfg["architectures"][0], "Glm4MoeForCausalLM", "{cfg}");
    let f = |k: &str| cfg[k].as_f64();
    assert_eq!(
        (
            f("n_routed_experts"),
            f("n_group"),
            f("topk_group"),
            f("n_shared_experts"),
            f("routed_scaling_factor"),
            f("first_k_dense_replace")
        ),
        (Some(8.0), Some(4.0), Some(2.0), Some(1.0), Some(2.5), Some(1.0)),
        "{cfg}"
    );
    let tokens = compare(&dir, "glm4_moe");
    parity_matches(&dir, "glm4_moe");
    bisect_matches(&dir, "glm4_moe");
    assert_every_expert_routed(&dir, 1, 8);

    let edit = |k: &'static str, v: serde_json::Value| move |cfg: &mut serde_json::Value| cfg[k] = v;
    assert_generation_changes_without(
        &dir,
        &tokens,
        "the renormalization of the top-k weights does",
        edit("norm_topk_prob", serde_json::json!(false)),
    );
    assert_generation_changes_without(
        &dir,
        &tokens,
        "the shared expert does",
        edit("n_shared_experts", serde_json::json!(0)),
    );
    assert_generation_changes_without(
        &dir,
        &tokens,
        "routed_scaling_factor does",
        edit("routed_scaling_factor", serde_json::json!(1.0)),
    );
    assert_generation_changes_without(&dir, &tokens, "the group limit does", |cfg| {
        cfg["n_group"] = serde_json::json!(1);
        cfg["topk_group"] = serde_json::json!(1);
    });
    let unbiased = with_zeroed_tensor(&dir, "model.layers.1.mlp.gate.e_score_correction_bias", || {
        PROMPTS.iter().map(|(p, chat)| ours(&dir, p, *chat).tokens).collect::<Vec<_>>()
    });
    assert_ne!(
        unbiased, tokens,
        "the correction bias changes nothing on these prompts; the test cannot detect its absence"
    );

    // GLM's default partial rotary embedding is refused by name, never ignored.
    let original = std::fs::read(dir.join("config.json")).unwrap();
    let mut edited = config_of(&dir);
    edited["rope_parameters"]["partial_rotary_factor"] = serde_json::json!(0.5);
    std::fs::write(dir.join("config.json"), serde_json::to_string(&edited).unwrap()).unwrap();
    let mut c = loupe();
    let o = run(c.arg("generate").arg("--model").arg(&dir).args(["--precision", "f32", "--max-tokens", "1", "hi"]));
    std::fs::write(dir.join("config.json"), original).unwrap();
    assert_clean_failure(&o, "partial_rotary_factor");
}

/// Phi3ForCausalLM: fused `qkv_proj` and `gate_up_proj` (one matmul each, named as the
/// modules' hooks see them, then split), `partial_rotary_factor` 0.5 (RoPE turns 8 of each
/// head's 16 dims) and an 8-token window on every layer.
#[test]
#[ignore = "needs the real model and the Python reference stack (scripts/test installs both)"]
fn tiny_phi3_matches_reference() {
    let (_guard, _tmp, dir) =
        tiny_checkpoint("tiny-phi3", false, &["--family", "phi3", "--partial-rotary", "0.5", "--sliding-window", "8"]);
    let cfg = config_of(&dir);
    assert_eq!(
        (
            cfg["architectures"][0].as_str(),
            cfg["sliding_window"].as_u64(),
            cfg["rope_parameters"]["partial_rotary_factor"].as_f64()
        ),
        (Some("Phi3ForCausalLM"), Some(8), Some(0.5)),
        "{cfg}"
    );
    let tokens = compare(&dir, "phi3");
    // Parity pairs the fused projections, their parts (which the reference dump slices as
    // Phi3Attention and Phi3MLP do) and `mlp.activation_fn` with the reference's hooks.
    parity_matches(&dir, "phi3");

    assert_generation_changes_without(&dir, &tokens, "partial rotary does", |cfg| {
        cfg["rope_parameters"]["partial_rotary_factor"] = serde_json::json!(1.0)
    });
    assert_generation_changes_without(&dir, &tokens, "the sliding window does", |cfg| {
        cfg["sliding_window"] = serde_json::Value::Null
    });
}

/// Phi-3 with LongRoPE and partial rotary (0.75: 12 of 16 dims, 6 short and 6 long factors),
/// original length 16, default attention factor sqrt(1 + ln 128 / ln 16). The chat prompt is
/// past the switch at prefill (long factors throughout); the raw prompt (4 tokens) crosses it
/// while generating, where transformers' generate runs the whole sequence again with the long
/// factors, and so must loupe; parity's prompt (15 tokens) crosses it at its second decode
/// step, a forward call with a cache of short-factor keys. Without the scaling, with
/// attention factor 1, or with the long factors never reached, tokens change.
#[test]
#[ignore = "needs the real model and the Python reference stack (scripts/test installs both)"]
fn tiny_phi3_longrope_partial_rotary_matches_reference() {
    let (guard, gguf) = setup();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("tiny-phi3-longrope");
    make_tiny_with(&dir, &gguf, false, "longrope", &["--family", "phi3", "--partial-rotary", "0.75"]);
    let cfg = config_of(&dir);
    let rope = &cfg["rope_parameters"];
    assert_eq!(
        (
            cfg["original_max_position_embeddings"].as_u64(),
            cfg["max_position_embeddings"].as_u64(),
            rope["partial_rotary_factor"].as_f64()
        ),
        (Some(16), Some(2048), Some(0.75)),
        "{cfg}"
    );
    assert_eq!(
        (rope["short_factor"].as_array().map(Vec::len), rope["long_factor"].as_array().map(Vec::len)),
        (Some(6), Some(6)),
        "{cfg}"
    );
    let tokens = compare(&dir, "phi3 longrope");
    let prompt_lens: Vec<usize> = PROMPTS.iter().map(|(p, chat)| ours(&dir, p, *chat).prompt_tokens.len()).collect();
    assert!(
        prompt_lens[0] < 16 && prompt_lens[0] + tokens[0].len() > 16 && prompt_lens[1] > 16,
        "the prompts should cross the switch in decode and at prefill: {prompt_lens:?}"
    );
    parity_matches(&dir, "phi3 longrope");

    assert_generation_changes_without(&dir, &tokens, "LongRoPE scaling does", |cfg| {
        let rope = cfg["rope_parameters"].as_object_mut().unwrap();
        rope.retain(|k, _| k == "rope_theta" || k == "partial_rotary_factor");
        rope.insert("rope_type".into(), serde_json::json!("default"));
    });
    assert_generation_changes_without(&dir, &tokens, "LongRoPE's attention factor does", |cfg| {
        cfg["rope_parameters"]["attention_factor"] = serde_json::json!(1.0)
    });
    // The long factors never used: the switch moved past every sequence, the attention
    // factor kept at its value for original length 16.
    let factor = (1.0f64 + (2048.0f64 / 16.0).ln() / 16f64.ln()).sqrt();
    assert_generation_changes_without(&dir, &tokens, "LongRoPE's long factors do", |cfg| {
        cfg["original_max_position_embeddings"] = serde_json::json!(1024);
        cfg["rope_parameters"]["attention_factor"] = serde_json::json!(factor);
    });
    // The batched engine refuses a request that could cross the switch (it would not
    // reproduce the recompute) and runs one that stays within it.
    let bench = |n_gen: &str| {
        let mut c = loupe();
        c.arg("bench").arg("--model").arg(&dir).args([
            "--precision",
            "f32",
            "--batch",
            "2",
            "--n-prompt",
            "8",
            "--n-gen",
            n_gen,
        ]);
        run(&mut c)
    };
    let o = bench("16");
    assert!(
        !o.status.success() && stderr(&o).contains("LongRoPE's original length 16"),
        "a batch crossing the switch should be refused:\n{}",
        stderr(&o)
    );
    let o = bench("4");
    assert!(o.status.success(), "a batch within the switch should run:\n{}", stderr(&o));
    drop(guard);
}

/// A config feature loupe must either reproduce or refuse (exit 2 naming it), never ignore:
/// on the raw prompt, loupe's tokens equal the reference's, or loupe fails cleanly.
fn matches_or_refuses(extra: &[&str], field: &str) {
    let (_guard, gguf) = setup();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("tiny-variant");
    make_tiny_with(&dir, &gguf, false, "none", extra);
    let (prompt, chat) = PROMPTS[0];
    let mut c = loupe();
    c.arg("generate").arg("--model").arg(&dir);
    c.args(["--precision", "f32", "--temperature", "0", "--json", "--max-tokens", MAX_TOKENS, prompt]);
    let o = run(&mut c);
    if !o.status.success() {
        assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
        assert!(stderr(&o).contains(field), "the error should name {field}: {}", stderr(&o));
        return;
    }
    let ours: JsonOut = serde_json::from_str(stdout(&o).trim()).unwrap();
    let r = reference(&dir, prompt, chat);
    assert_eq!(
        ours.tokens, r.tokens,
        "{extra:?}: loupe ran the checkpoint but generated other tokens (is {field} ignored?)"
    );
}

#[test]
#[ignore = "needs the real model and the Python reference stack (scripts/test installs both)"]
fn tiny_attention_bias_matches_reference() {
    matches_or_refuses(&["--attention-bias"], "attention_bias");
}

/// Known loupe bug (found by this test): `mlp_bias` is not read from config.json
/// (loupe-models/src/config/hf.rs, from_hf_json) and the MLP projections are built without bias
/// (loupe-models/src/decoder.rs, gate/up/down `linear(..., false, ..)`), so the biases are silently dropped.
#[test]
#[ignore = "needs the real model and the Python reference stack (scripts/test installs both)"]
fn tiny_mlp_bias_matches_reference_or_is_refused() {
    matches_or_refuses(&["--mlp-bias"], "mlp_bias");
}

/// `hidden_act: gelu_pytorch_tanh` on a Llama: read from config.json and built (HiddenAct),
/// so loupe's tokens equal the reference's (this test once caught it silently running SiLU).
#[test]
#[ignore = "needs the real model and the Python reference stack (scripts/test installs both)"]
fn tiny_gelu_matches_reference_or_is_refused() {
    matches_or_refuses(&["--hidden-act", "gelu_pytorch_tanh"], "hidden_act");
}

/// SeedOssForCausalLM: Llama with q/k/v biases (SeedOssConfig's default `attention_bias`) and
/// o_proj's bias under its own key (`attention_out_bias`, make-tiny --attention-bias).
#[test]
#[ignore = "needs the real model and the Python reference stack (scripts/test installs both)"]
fn tiny_seed_oss_matches_reference() {
    let (_guard, _tmp, dir) = tiny_checkpoint("tiny-seed-oss", false, &["--family", "seed_oss", "--attention-bias"]);
    let cfg = config_of(&dir);
    assert_eq!(
        (cfg["architectures"][0].as_str(), cfg["attention_out_bias"].as_bool()),
        (Some("SeedOssForCausalLM"), Some(true)),
        "{cfg}"
    );
    let tokens = compare(&dir, "seed_oss");
    parity_matches(&dir, "seed_oss");

    // Read as a Llama (attention_bias covers all four projections there), o_proj's bias is
    // loaded under the wrong rule: without attention_out_bias it is dropped.
    assert_generation_changes_without(&dir, &tokens, "o_proj's bias does", |cfg| {
        cfg["attention_out_bias"] = serde_json::Value::Bool(false)
    });
}

/// HunYuanMoEV1ForCausalLM: Llama attention with per-head q/k norms after RoPE
/// (`query_layernorm`, `key_layernorm`) and every layer sparse: a softmax router
/// (`mlp.gate.wg`) over 8 experts, top 2 (`moe_topk`, one per layer) always renormalized, plus
/// a shared MLP (`mlp.shared_mlp`), all `intermediate_size` wide; RoPE `dynamic` with `alpha`
/// 1000, a fixed NTK base. Parity pairs q after RoPE and after its norm, the router, its choice
/// and weights, the experts and the shared MLP, so the norms' order is checked there: no
/// config key moves or removes them.
#[test]
#[ignore = "needs the real model and the Python reference stack (scripts/test installs both)"]
fn tiny_hunyuan_moe_matches_reference() {
    let (_guard, gguf) = setup();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("tiny-hunyuan-moe");
    make_tiny_with(&dir, &gguf, false, "dynamic", &["--family", "hunyuan_v1_moe"]);
    let cfg = config_of(&dir);
    assert_eq!(
        (cfg["architectures"][0].as_str(), cfg["num_experts"].as_u64(), cfg["rope_parameters"]["alpha"].as_f64()),
        (Some("HunYuanMoEV1ForCausalLM"), Some(8), Some(1000.0)),
        "{cfg}"
    );
    assert_eq!(cfg["moe_topk"], serde_json::json!([2, 2]), "{cfg}");
    let tokens = compare(&dir, "hunyuan_v1_moe");
    parity_matches(&dir, "hunyuan_v1_moe");
    bisect_matches(&dir, "hunyuan_v1_moe");
    assert_every_expert_routed(&dir, 0, 8);
    assert_every_expert_routed(&dir, 1, 8);

    assert_generation_changes_without(&dir, &tokens, "the NTK-alpha RoPE base does", |cfg| {
        cfg["rope_parameters"] = serde_json::json!({"rope_type": "default", "rope_theta": 10000.0})
    });
    assert_generation_changes_without(&dir, &tokens, "moe_topk does", |cfg| {
        cfg["moe_topk"] = serde_json::json!([1, 1])
    });
    let unshared = with_zeroed_tensor(&dir, "model.layers.1.mlp.shared_mlp.down_proj.weight", || {
        PROMPTS.iter().map(|(p, chat)| ours(&dir, p, *chat).tokens).collect::<Vec<_>>()
    });
    assert_ne!(unshared, tokens, "the shared MLP changes nothing on these prompts; the test cannot detect its absence");

    // A top-k that differs between layers is refused by name, never read as one value.
    let original = std::fs::read(dir.join("config.json")).unwrap();
    let mut edited = config_of(&dir);
    edited["moe_topk"] = serde_json::json!([2, 1]);
    std::fs::write(dir.join("config.json"), serde_json::to_string(&edited).unwrap()).unwrap();
    let mut c = loupe();
    let o = run(c.arg("generate").arg("--model").arg(&dir).args(["--precision", "f32", "--max-tokens", "1", "hi"]));
    std::fs::write(dir.join("config.json"), original).unwrap();
    assert_clean_failure(&o, "moe_topk");
}
