//! A Hugging Face checkpoint directory (config.json, *.safetensors, tokenizer.json and
//! tokenizer_config.json) read as llama.cpp's converter (`convert_hf_to_gguf.py`) would write
//! it: GGUF metadata from the config and the tokenizer, tensors renamed and laid out as GGUF
//! stores them. [`HfCheckpoint`] is a [`TensorSource`], so `loupe quantize` writes it in any
//! target type with the same code that requantizes a GGUF.
//!
//! * Families: those loupe reads both from config.json and from GGUF with the same graph
//!   (Llama, Qwen2, Qwen3: [`crate::family::GgufSpec::converted`]). A config whose model GGUF metadata cannot state
//!   (sliding windows, partial rotary, another activation, a RoPE scaling other than linear
//!   and Llama 3's) is refused naming the key, never converted into a different model; and
//!   the written file's config is read back and compared with the directory's
//!   ([`check_round_trip`]).
//! * Tensors: `model.layers.N.self_attn.q_proj.weight` -> `blk.N.attn_q.weight` and so on
//!   ([`crate::weights::gguf_name_in`]); Llama's q/k rows (weights and biases) permuted for
//!   llama.cpp's interleaved RoPE ([`crate::weights::permute_rows`], which loupe's GGUF loader
//!   undoes); vectors (norms, biases) widened to f32 as llama.cpp stores them; no
//!   `output.weight` when the embeddings are tied; Llama 3 RoPE scaling as llama.cpp's
//!   `rope_freqs.weight` tensor.
//! * Tokenizer: byte-level BPE only (`tokenizer.ggml.model` gpt2): tokens by id (ids the
//!   tokenizer lacks below the config's `vocab_size` become `[PAD<id>]`, unused, as llama.cpp
//!   pads), added special tokens as control tokens, the merges, bos/eos/unk/pad ids, the
//!   bos/eos flags, the chat template. `tokenizer.ggml.pre` is the name whose split loupe's
//!   GGUF tokenizer builder applies, chosen by encoding probe texts with each candidate and
//!   with tokenizer.json and keeping the first that gives the same ids for all (llama.cpp
//!   hashes the encoding of one text for the same purpose); none matching is refused.

use std::borrow::Cow;
use std::path::{Path, PathBuf};

use loupe_formats::safetensors_file::SafetensorsCheckpoint;
use loupe_formats::{GgmlType, GgufFile, GgufValue};
use loupe_tensor::ops::RopeScaling;
use loupe_text::spec::token_type;
use loupe_text::{Tokenizer, TokenizerSpec, GGUF_PRE_SPLITS};
use serde_json::Value;

use crate::config::DecoderConfig;
use crate::error::ModelError;
use crate::family::Family;
use crate::quantize::{InputTensor, TensorSource};
use crate::weights::{gguf_name_in, permute_rows};

/// Texts the converted tokenizer must encode to the same ids as tokenizer.json (besides one
/// made of the tokenizer's own special tokens).
const PROBES: [&str; 6] = [
    "Hello world! It's a test: 3.14159 + 42 = 45.14159, isn't it?",
    "  two  spaces,\n\nnew lines\tand a tab   ",
    "héllo wörld, naïve café, 日本語のテキスト, Ελληνικά, 🙂👍🏽",
    "don't WON'T you'll they've 12345678 x=1;y=22 foo_bar-baz",
    "def f(x):\n    return x ** 2  # squares\n",
    "",
];

/// One tensor of the directory, under its GGUF name.
struct Entry {
    gguf: String,
    hf: String,
    /// Rows are permuted for llama.cpp's RoPE with this many heads.
    permute_heads: Option<usize>,
}

/// A Hugging Face checkpoint directory as llama.cpp's converter would write it.
pub struct HfCheckpoint {
    pub dir: PathBuf,
    pub config: DecoderConfig,
    checkpoint: SafetensorsCheckpoint,
    metadata: Vec<(String, GgufValue)>,
    entries: Vec<Entry>,
    /// Llama 3 RoPE scaling's per-frequency divisors (`rope_freqs.weight`).
    rope_freqs: Option<Vec<f32>>,
}

fn missing(path: PathBuf, what: &str) -> ModelError {
    ModelError::NotAModel { path, reason: format!("missing ({what})") }
}

impl HfCheckpoint {
    /// Reads the directory's config, tokenizer and tensor list (the tensors themselves are
    /// read as they are written). Errors name the file, the config key or the tensor.
    pub fn open(dir: &Path) -> Result<HfCheckpoint, ModelError> {
        let config_path = dir.join("config.json");
        if !config_path.is_file() {
            return Err(missing(
                config_path,
                "a Hugging Face checkpoint directory has config.json, *.safetensors and tokenizer.json",
            ));
        }
        let tokenizer_path = dir.join("tokenizer.json");
        if !tokenizer_path.is_file() {
            return Err(missing(tokenizer_path, "the GGUF's tokenizer is converted from it"));
        }
        let config = DecoderConfig::from_hf_config(&config_path)?;
        let Some(arch) = config.family.gguf_arch().filter(|_| config.family.spec().gguf.converted) else {
            let supported =
                Family::ALL.iter().filter(|f| f.spec().gguf.converted).map(|f| f.name()).collect::<Vec<_>>().join(", ");
            return Err(ModelError::UnsupportedArchitecture {
                path: config_path,
                arch: format!("{} (not converted to GGUF)", config.family.name()),
                supported,
            });
        };
        let bad = |field: &str, reason: String| ModelError::InvalidConfig {
            source_file: config_path.clone(),
            field: field.into(),
            reason,
        };
        if !config.layer_windows.is_empty() {
            return Err(bad(
                "sliding_window",
                "sliding-window attention is not converted (loupe reads no window from a llama/qwen2/qwen3 GGUF)"
                    .into(),
            ));
        }
        if config.rotary_dim != config.head_dim {
            return Err(bad("partial_rotary_factor", "partial rotary embedding is not converted".into()));
        }
        if config.hidden_act != config.family.default_hidden_act() {
            return Err(bad(
                "hidden_act",
                format!(
                    "{:?} is not converted (a GGUF states no activation; loupe reads {:?})",
                    config.hidden_act,
                    config.family.default_hidden_act()
                ),
            ));
        }
        let json: Value = serde_json::from_str(
            &std::fs::read_to_string(&config_path)
                .map_err(|e| ModelError::Io { path: config_path.clone(), source: e })?,
        )
        .map_err(|e| bad("config.json", e.to_string()))?;

        let key = |k: &str| format!("{arch}.{k}");
        let u32v = |n: usize| GgufValue::U32(n as u32);
        let name = dir
            .canonicalize()
            .ok()
            .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
            .unwrap_or_else(|| "model".into());
        let mut metadata = vec![
            ("general.architecture".to_string(), GgufValue::String(arch.into())),
            ("general.name".to_string(), GgufValue::String(name)),
            ("general.quantization_version".to_string(), GgufValue::U32(2)),
            (key("vocab_size"), u32v(config.vocab_size)),
            (key("context_length"), u32v(config.max_position_embeddings)),
            (key("embedding_length"), u32v(config.hidden_size)),
            (key("block_count"), u32v(config.num_hidden_layers)),
            (key("feed_forward_length"), u32v(config.intermediate_size)),
            (key("rope.dimension_count"), u32v(config.rotary_dim)),
            (key("attention.head_count"), u32v(config.num_attention_heads)),
            (key("attention.head_count_kv"), u32v(config.num_key_value_heads)),
            (key("attention.layer_norm_rms_epsilon"), GgufValue::F32(config.rms_norm_eps)),
            (key("rope.freq_base"), GgufValue::F32(config.rope_theta)),
        ];
        if json.get("head_dim").is_some_and(|h| !h.is_null())
            || config.head_dim != config.hidden_size / config.num_attention_heads
        {
            // As llama.cpp writes them whenever config.json states head_dim (transformers'
            // GGUF loader takes Qwen3's head_dim from key_length, else its default of 128).
            metadata.push((key("attention.key_length"), u32v(config.head_dim)));
            metadata.push((key("attention.value_length"), u32v(config.head_dim)));
        }
        let rope_freqs = match &config.rope_scaling {
            RopeScaling::None => None,
            RopeScaling::Linear { factor } => {
                metadata.push((key("rope.scaling.type"), GgufValue::String("linear".into())));
                metadata.push((key("rope.scaling.factor"), GgufValue::F32(*factor)));
                None
            }
            RopeScaling::Llama3 { .. } => {
                Some(llama3_freq_factors(&config).map_err(|e| bad("rope_scaling", e.to_string()))?)
            }
            other => return Err(bad("rope_scaling", format!("{other:?} is not converted (linear and llama3 are)"))),
        };
        let spec = tokenizer_spec(dir, &config, arch, &json)?;
        metadata.extend(crate::tokenizer::spec_to_gguf(&spec));

        let checkpoint = SafetensorsCheckpoint::open(dir)?;

        let mut entries = Vec::new();
        for hf in checkpoint.names() {
            if hf.ends_with("rotary_emb.inv_freq") || (config.tie_word_embeddings && hf == "lm_head.weight") {
                continue; // recomputed from the config; the tied lm_head is the embedding
            }
            let gguf = gguf_name_in(config.family, hf).ok_or_else(|| ModelError::NotAModel {
                path: dir.to_path_buf(),
                reason: format!(
                    "tensor '{hf}' has no GGUF name in the {} family (not converted)",
                    config.family.name()
                ),
            })?;
            let permute_heads = if !config.family.gguf_permutes_qk() {
                None
            } else if gguf.contains(".attn_q.") {
                Some(config.num_attention_heads)
            } else if gguf.contains(".attn_k.") {
                Some(config.num_key_value_heads)
            } else {
                None
            };
            entries.push(Entry { gguf, hf: hf.to_string(), permute_heads });
        }
        for needed in ["model.embed_tokens.weight", "model.norm.weight"]
            .into_iter()
            .chain((!config.tie_word_embeddings).then_some("lm_head.weight"))
        {
            if checkpoint.tensor(needed).is_none() {
                return Err(ModelError::MissingWeight { path: dir.to_path_buf(), name: needed.to_string() });
            }
        }
        // llama.cpp's order: the embedding, the layers in order, the final norm, the output.
        entries.sort_by_cached_key(|e| match e.gguf.strip_prefix("blk.").and_then(|r| r.split_once('.')) {
            Some((layer, rest)) => (1, layer.parse::<usize>().unwrap_or(usize::MAX), rest.to_string()),
            None if e.gguf == "token_embd.weight" => (0, 0, String::new()),
            None => (2, 0, e.gguf.clone()),
        });
        Ok(HfCheckpoint { dir: dir.to_path_buf(), config, checkpoint, metadata, entries, rope_freqs })
    }
}

/// llama.cpp's `rope_freqs.weight` for Llama 3 RoPE scaling: per frequency, the plain inverse
/// frequency over the scaled one (loupe divides each frequency by it).
fn llama3_freq_factors(config: &DecoderConfig) -> Result<Vec<f32>, loupe_tensor::TensorError> {
    let plain = loupe_tensor::ops::RopeTable::new(config.head_dim, config.rope_theta, &RopeScaling::None)?;
    let scaled = loupe_tensor::ops::RopeTable::new(config.head_dim, config.rope_theta, &config.rope_scaling)?;
    Ok(plain.inv_freq().iter().zip(scaled.inv_freq()).map(|(p, s)| p / s).collect())
}

impl TensorSource for HfCheckpoint {
    fn path(&self) -> &Path {
        &self.dir
    }

    fn metadata(&self) -> Vec<(String, GgufValue)> {
        self.metadata.clone()
    }

    fn tensor_count(&self) -> usize {
        self.entries.len() + usize::from(self.rope_freqs.is_some())
    }

    fn bytes_in(&self) -> u64 {
        self.entries
            .iter()
            .filter_map(|e| self.checkpoint.tensor(&e.hf))
            .map(|(f, i)| f.tensor_data(i).len() as u64)
            .sum()
    }

    fn tensor(&self, i: usize) -> Result<Option<InputTensor<'_>>, ModelError> {
        let Some(e) = self.entries.get(i) else {
            let f = self.rope_freqs.as_deref().unwrap_or(&[]);
            let data = f.iter().flat_map(|v| v.to_le_bytes()).collect();
            return Ok(Some(InputTensor {
                name: "rope_freqs.weight".into(),
                dims: vec![f.len() as u64],
                ty: GgmlType::F32,
                data: Cow::Owned(data),
                scale: 1.0,
            }));
        };
        let (file, info) = self
            .checkpoint
            .tensor(&e.hf)
            .ok_or_else(|| ModelError::MissingWeight { path: self.dir.clone(), name: e.hf.clone() })?;
        let ty = crate::weights::ggml_type_of(info.dtype).ok_or_else(|| ModelError::InvalidConfig {
            source_file: self.dir.clone(),
            field: e.hf.clone(),
            reason: format!("unsupported dtype {:?} (loupe quantize reads F32, F16 and BF16 checkpoints)", info.dtype),
        })?;
        let dims: Vec<u64> = info.shape.iter().rev().map(|&d| d as u64).collect();
        let mut data = Cow::Borrowed(file.tensor_data(info));
        if let Some(heads) = e.permute_heads {
            let rows = info.shape.first().copied().unwrap_or(1).max(1);
            data = Cow::Owned(permute_rows(&data, heads, data.len() / rows));
        }
        if info.shape.len() < 2 && ty != GgmlType::F32 {
            // Vectors (norms, biases) in f32, as llama.cpp's converter writes them: exact.
            let mut wide = vec![0f32; info.shape.iter().product()];
            loupe_tensor::quant::dequantize_row(ty, &data, &mut wide).map_err(|source| ModelError::Tensor {
                path: self.dir.clone(),
                name: e.hf.clone(),
                source,
            })?;
            return Ok(Some(InputTensor {
                name: e.gguf.clone(),
                dims,
                ty: GgmlType::F32,
                data: Cow::Owned(wide.iter().flat_map(|v| v.to_le_bytes()).collect()),
                scale: 1.0,
            }));
        }
        Ok(Some(InputTensor { name: e.gguf.clone(), dims, ty, data, scale: 1.0 }))
    }
}

/// Reads the written GGUF's config back and compares it with the directory's: the same model
/// or an error (a key this converter forgot, or one loupe's GGUF reader reads otherwise).
pub fn check_round_trip(source: &HfCheckpoint, output: &Path) -> Result<(), ModelError> {
    let gguf = GgufFile::open(output)?;
    let mut back = DecoderConfig::from_gguf(&gguf)?;
    let mut want = source.config.clone();
    if matches!(want.rope_scaling, RopeScaling::Llama3 { .. }) {
        // Stated by the `rope_freqs.weight` tensor instead (the graph builder reads it).
        want.rope_scaling = RopeScaling::None;
        back.rope_scaling = RopeScaling::None;
    }
    if back != want {
        return Err(ModelError::NotAModel {
            path: output.to_path_buf(),
            reason: format!("reads back as another model than {}: {back:?} against {want:?}", source.dir.display()),
        });
    }
    Ok(())
}

/// The tokenizer of `dir` as GGUF tokenizer metadata (see the module docs).
fn tokenizer_spec(
    dir: &Path,
    config: &DecoderConfig,
    arch: &str,
    config_json: &Value,
) -> Result<TokenizerSpec, ModelError> {
    let path = dir.join("tokenizer.json");
    let text = std::fs::read_to_string(&path).map_err(|e| ModelError::Io { path: path.clone(), source: e })?;
    let json: Value = serde_json::from_str(&text).map_err(|e| ModelError::InvalidConfig {
        source_file: path.clone(),
        field: "tokenizer.json".into(),
        reason: e.to_string(),
    })?;
    let refuse = |what: String| ModelError::NotAModel {
        path: path.clone(),
        reason: format!(
            "{what} is not converted (loupe quantize converts byte-level BPE tokenizers: tokenizer.ggml.model gpt2)"
        ),
    };
    let model = &json["model"];
    let kind = model["type"].as_str().unwrap_or("<none>");
    if kind != "BPE" {
        return Err(refuse(format!("a {kind} tokenizer")));
    }
    let byte_level = |v: &Value| v.to_string().contains("\"ByteLevel\"");
    if model["byte_fallback"].as_bool() == Some(true)
        || !byte_level(&json["decoder"])
        || !byte_level(&json["pre_tokenizer"])
    {
        return Err(refuse(
            "a SentencePiece-style BPE tokenizer (byte fallback or no byte-level pre-tokenizer and decoder)".into(),
        ));
    }
    let tok_cfg = dir.join("tokenizer_config.json");
    let text_err = |e| ModelError::Tokenizer { path: path.clone(), source: e };
    let hf = Tokenizer::from_file(&path, tok_cfg.is_file().then_some(tok_cfg.as_path())).map_err(text_err)?;

    let vocab = hf.inner().get_vocab(true);
    let n = config.vocab_size.max(vocab.values().map(|&id| id as usize + 1).max().unwrap_or(0));
    let mut tokens: Vec<Option<String>> = vec![None; n];
    for (token, id) in vocab {
        tokens[id as usize] = Some(token);
    }
    let added = hf.inner().get_added_tokens_decoder();
    let mut types = Vec::with_capacity(n);
    let tokens: Vec<String> = tokens
        .into_iter()
        .enumerate()
        .map(|(id, t)| {
            types.push(match (&t, added.get(&(id as u32))) {
                (None, _) => token_type::UNUSED,
                (Some(_), Some(a)) if a.special => token_type::CONTROL,
                (Some(_), Some(_)) => token_type::USER_DEFINED,
                (Some(_), None) => token_type::NORMAL,
            });
            t.unwrap_or_else(|| format!("[PAD{id}]"))
        })
        .collect();
    let merges: Vec<String> = match model["merges"].as_array() {
        None => Vec::new(),
        Some(list) => list
            .iter()
            .map(|m| match m {
                Value::String(s) => Some(s.clone()),
                Value::Array(pair) if pair.len() == 2 => Some(format!("{} {}", pair[0].as_str()?, pair[1].as_str()?)),
                _ => None,
            })
            .collect::<Option<_>>()
            .ok_or_else(|| ModelError::InvalidConfig {
                source_file: path.clone(),
                field: "model.merges".into(),
                reason: "not a list of \"a b\" strings or [a, b] pairs".into(),
            })?,
    };
    // The config's ids where tokenizer_config.json names no token (llama.cpp's SpecialVocab).
    let config_id = |k: &str| match &config_json[k] {
        Value::Number(n) => n.as_u64().map(|v| v as u32),
        Value::Array(a) => a.first().and_then(Value::as_u64).map(|v| v as u32),
        _ => None,
    };
    let id_of = |t: Option<&str>| t.and_then(|t| hf.id_of(t));
    let mut spec = TokenizerSpec {
        model: "gpt2".into(),
        pre: None,
        tokens,
        scores: None,
        token_types: Some(types),
        merges,
        bos_id: hf.bos_id().or_else(|| config_id("bos_token_id")),
        eos_id: hf.eos_id().or_else(|| config_id("eos_token_id")),
        unk_id: id_of(hf.unk_token()),
        pad_id: id_of(hf.pad_token()),
        add_bos: Some(hf.add_bos_token()),
        add_eos: Some(hf.add_eos_token()),
        add_space_prefix: None,
        chat_template: hf.chat_template_source().map(str::to_string),
        architecture: Some(arch.to_string()),
    };

    // Candidates for `pre`: the name of tokenizer.json's own split regex, then GPT-2's split
    // (a plain ByteLevel pre-tokenizer), then every other split loupe knows.
    let pre_json = json["pre_tokenizer"].to_string();
    let mut candidates: Vec<&str> = GGUF_PRE_SPLITS
        .iter()
        .filter(|(_, regex)| pre_json.contains(&Value::String(regex.to_string()).to_string()))
        .map(|(name, _)| *name)
        .collect();
    candidates.push("gpt2");
    candidates.extend(GGUF_PRE_SPLITS.iter().map(|(name, _)| *name));
    let mut specials: Vec<(u32, String)> =
        added.iter().filter(|(_, a)| a.special).map(|(id, a)| (*id, a.content.clone())).collect();
    specials.sort();
    let specials: Vec<String> = specials.into_iter().map(|(_, s)| s).collect();
    let special_probe = format!(
        "{}user\nHi there{}\n",
        specials.first().map(String::as_str).unwrap_or(""),
        specials.get(1).map(String::as_str).unwrap_or("")
    );
    let probes: Vec<&str> = PROBES.iter().copied().chain([special_probe.as_str()]).collect();
    let want: Vec<Vec<u32>> = probes.iter().map(|p| hf.encode(p, true)).collect::<Result<_, _>>().map_err(text_err)?;
    let mut tried = Vec::new();
    for pre in candidates {
        if tried.contains(&pre) {
            continue;
        }
        tried.push(pre);
        spec.pre = Some(pre.to_string());
        let built = Tokenizer::from_spec(&spec).map_err(text_err)?;
        let same = probes.iter().zip(&want).all(|(p, w)| built.encode(p, true).ok().as_ref() == Some(w));
        if same {
            return Ok(spec);
        }
    }
    Err(ModelError::NotAModel {
        path,
        reason: format!(
            "no tokenizer.ggml.pre that loupe reads ({}) encodes the probe texts as this tokenizer does; not converted",
            tried.join(", ")
        ),
    })
}

/// `loupe quantize DIR OUT --type T`: the checkpoint in `dir` converted ([`HfCheckpoint`]) and
/// written with its matrices in `target` ([`crate::quantize::quantize_source`]), then read
/// back and checked to be the same model ([`check_round_trip`]; the file is removed if not).
pub fn quantize_hf_dir(
    dir: &Path,
    output: &Path,
    target: GgmlType,
    keep_embeddings: bool,
    progress: impl FnMut(usize, usize),
) -> Result<crate::quantize::QuantizeReport, ModelError> {
    let source = HfCheckpoint::open(dir)?;
    let report = crate::quantize::quantize_source(&source, output, target, keep_embeddings, progress)?;
    if let Err(e) = check_round_trip(&source, output) {
        let _ = std::fs::remove_file(output);
        return Err(e);
    }
    Ok(report)
}
