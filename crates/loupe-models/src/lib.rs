//! loupe-models: from a model file to a runnable graph, tokenizer and chat template.
//!
//! * [`family`]: one descriptor per model family (names, norms, activation, RoPE, attention
//!   variants, quirks, parser defaults), the table every family-dependent decision reads.
//! * [`config`]: `DecoderConfig` from GGUF metadata or `config.json`; a loaded [`Model`]
//!   holds it, or an encoder's `BertConfig`, as a [`ModelConfig`].
//! * [`weights`]: weight sources (GGUF, safetensors), the GGUF <-> HF name map, precision.
//! * [`decoder`]: the decoder graph builder; values named by HF module paths.
//! * [`bert`]: BERT encoders: their own config and graph builder.
//! * [`roles`]: what each value the builder emits is (role, layer, name, inputs).
//! * [`tokenizer`]: tokenizer specs from GGUF metadata (and back).
//! * [`quantize`]: `loupe quantize` over a [`quantize::TensorSource`].
//! * [`convert`]: a Hugging Face checkpoint directory as llama.cpp's converter writes it.
//! * [`tiny`]: a tiny random-weight Llama GGUF (real tokenizer) for tests.

pub mod bert;
pub mod config;
pub mod convert;
pub mod decoder;
pub mod error;
pub mod family;
pub mod placement;
pub mod quantize;
pub mod roles;
pub mod tiny;
pub mod tiny_bert;
pub mod tokenizer;
pub mod weights;

use std::io::Read;
use std::path::{Path, PathBuf};

use loupe_formats::safetensors_file::SafetensorsCheckpoint;
use loupe_formats::GgufFile;
use loupe_graph::{Graph, KvDtype, WeightData};
use loupe_text::{ChatTemplate, Tokenizer};

use family::Builder;

pub use bert::BertConfig;
pub use config::{DecoderConfig, MoeConfig};
pub use error::ModelError;
pub use family::{Family, FamilySpec, HiddenAct};
pub use loupe_graph::{Fault, FaultClass};
pub use placement::WeightPlacement;
pub use roles::{Module, ModuleRole, Wiring};
pub use weights::{Precision, Progress};

/// File name of the default model (SmolLM2-135M-Instruct, GGUF Q4_1).
pub const DEFAULT_MODEL_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// loupe's cache directory: `$LOUPE_CACHE_DIR`, else `$XDG_CACHE_HOME/loupe`, else
/// `~/.cache/loupe` (the same rule as `scripts/fetch-model`).
pub fn cache_dir() -> PathBuf {
    std::env::var_os("LOUPE_CACHE_DIR")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("XDG_CACHE_HOME").map(|x| PathBuf::from(x).join("loupe")))
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache").join("loupe")))
        .unwrap_or_else(|| PathBuf::from(".loupe-cache"))
}

/// Where the default model lives once fetched (it may not be there yet).
pub fn default_model_path() -> PathBuf {
    cache_dir().join("models").join(DEFAULT_MODEL_FILE)
}

/// The real model the test suites run: `$LOUPE_MODEL` if set, else [`default_model_path`].
/// Whether the file is there is the caller's question.
pub fn real_model_path() -> PathBuf {
    match std::env::var_os("LOUPE_MODEL").filter(|p| !p.is_empty()) {
        Some(p) => PathBuf::from(p),
        None => default_model_path(),
    }
}

/// What kind of checkpoint a path holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelFormat {
    Gguf,
    /// A Hugging Face directory (config.json + *.safetensors + tokenizer.json).
    HfDir(PathBuf),
}

/// A loaded model: its graph, tokenizer and chat template.
pub struct Model {
    pub path: PathBuf,
    pub format: ModelFormat,
    /// The hyper-parameters its builder read: a decoder's or an encoder's own config.
    pub config: ModelConfig,
    pub graph: Graph,
    pub tokenizer: Tokenizer,
    pub chat_template: Option<ChatTemplate>,
    pub precision: Precision,
    /// Whether the weight blocks are read in place from the file's mapping rather than
    /// copied ([`placement`]).
    pub weights_in_place: bool,
}

/// A loaded model's hyper-parameters, as its builder read them: each builder has its own
/// config type, so an encoder's keys (`layer_norm_eps`, `type_vocab_size`) never pass
/// through a decoder's (RoPE, windows, soft-caps, MoE) nor the reverse. What every model has
/// (vocabulary, width, layers, positions, family) is asked through the methods.
// One per loaded model: the bytes a decoder's config has over an encoder's cost nothing, and
// boxing it would put an indirection on every read.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq)]
pub enum ModelConfig {
    Decoder(DecoderConfig),
    Encoder(bert::BertConfig),
}

impl ModelConfig {
    pub fn family(&self) -> Family {
        match self {
            ModelConfig::Decoder(c) => c.family,
            ModelConfig::Encoder(_) => Family::Bert,
        }
    }

    pub fn vocab_size(&self) -> usize {
        match self {
            ModelConfig::Decoder(c) => c.vocab_size,
            ModelConfig::Encoder(c) => c.vocab_size,
        }
    }

    pub fn hidden_size(&self) -> usize {
        match self {
            ModelConfig::Decoder(c) => c.hidden_size,
            ModelConfig::Encoder(c) => c.hidden_size,
        }
    }

    pub fn num_hidden_layers(&self) -> usize {
        match self {
            ModelConfig::Decoder(c) => c.num_hidden_layers,
            ModelConfig::Encoder(c) => c.num_hidden_layers,
        }
    }

    /// Positions the model was trained for (an encoder's rows of absolute positions).
    pub fn max_position_embeddings(&self) -> usize {
        match self {
            ModelConfig::Decoder(c) => c.max_position_embeddings,
            ModelConfig::Encoder(c) => c.max_position_embeddings,
        }
    }

    /// The decoder's config; `None` for an encoder.
    pub fn decoder(&self) -> Option<&DecoderConfig> {
        match self {
            ModelConfig::Decoder(c) => Some(c),
            ModelConfig::Encoder(_) => None,
        }
    }

    /// The encoder's config; `None` for a decoder.
    pub fn encoder(&self) -> Option<&bert::BertConfig> {
        match self {
            ModelConfig::Decoder(_) => None,
            ModelConfig::Encoder(c) => Some(c),
        }
    }
}

/// Options for [`load`].
#[derive(Clone)]
pub struct LoadOptions<'a> {
    pub precision: Precision,
    /// Keep only the first N decoder layers.
    pub layers: Option<usize>,
    pub progress: Option<Progress<'a>>,
    /// Bugs to plant in the graph (`loupe dump --inject`), to test the parity tools against
    /// a known answer; empty in normal use.
    pub faults: Vec<Fault>,
    /// Where a GGUF's weight blocks live ([`placement`]; `--weights`).
    pub weights: WeightPlacement,
}

impl Default for LoadOptions<'_> {
    /// f32 weights (the parity baseline), every layer, no progress, no faults.
    fn default() -> Self {
        LoadOptions {
            precision: Precision::F32,
            layers: None,
            progress: None,
            faults: Vec::new(),
            weights: WeightPlacement::Auto,
        }
    }
}

/// Detects the checkpoint kind: a GGUF file (by magic), or a directory / `.safetensors`
/// file / `config.json` of a Hugging Face checkpoint.
pub fn detect_format(path: &Path) -> Result<ModelFormat, ModelError> {
    let io = |e| ModelError::Io { path: path.to_path_buf(), source: e };
    let meta = std::fs::metadata(path).map_err(io)?;
    if meta.is_dir() {
        if path.join("config.json").is_file() {
            return Ok(ModelFormat::HfDir(path.to_path_buf()));
        }
        return Err(ModelError::NotAModel { path: path.to_path_buf(), reason: "directory has no config.json".into() });
    }
    let mut magic = [0u8; 4];
    let n = std::fs::File::open(path).and_then(|mut f| f.read(&mut magic)).map_err(io)?;
    if n == 4 && &magic == b"GGUF" {
        return Ok(ModelFormat::Gguf);
    }
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
    if name.ends_with(".safetensors") || name == "config.json" {
        if let Some(dir) = path.parent() {
            if dir.join("config.json").is_file() {
                return Ok(ModelFormat::HfDir(dir.to_path_buf()));
            }
        }
    }
    Err(ModelError::NotAModel {
        path: path.to_path_buf(),
        reason: "not a GGUF file (bad magic) nor a Hugging Face checkpoint directory".into(),
    })
}

/// Loads a model from a GGUF file or a Hugging Face checkpoint directory.
pub fn load(path: &Path, options: LoadOptions<'_>) -> Result<Model, ModelError> {
    let format = detect_format(path)?;
    let mut model = match &format {
        ModelFormat::Gguf => {
            let mut gguf = GgufFile::open(path)?;
            let config = DecoderConfig::from_gguf(&gguf)?;
            let spec = tokenizer::spec_from_gguf(&mut gguf)?;
            let text_err = |e| ModelError::Tokenizer { path: path.to_path_buf(), source: e };
            let tokenizer = Tokenizer::from_spec(&spec).map_err(text_err)?;
            let chat_template = match &spec.chat_template {
                Some(src) => Some(chat_template_for(&tokenizer, src).map_err(text_err)?),
                None => None,
            };
            // The tokenizer holds what it needs: the spec's copy of the vocabulary goes before
            // the weights are read, so peak memory does not hold it beside them.
            drop(spec);
            release_freed_heap();
            let in_place = placement::in_place(&gguf, options.weights, options.precision);
            let mut source = weights::GgufSource::new(&gguf, options.precision, &config, options.progress, in_place);
            let graph = decoder::build_decoder(
                &config,
                &mut source,
                options.layers,
                options.precision == Precision::Q8,
                &options.faults,
            )?;
            Model {
                path: path.to_path_buf(),
                format,
                config: ModelConfig::Decoder(config),
                graph,
                tokenizer,
                chat_template,
                precision: options.precision,
                weights_in_place: source.weights_in_place(),
            }
        }
        ModelFormat::HfDir(dir) => {
            let config_path = dir.join("config.json");
            let json = config::read_config_json(&config_path)?;
            // Each builder reads its own config: the family's descriptor says which.
            let config = match config::hf_family(&json, &config_path)?.spec().builder {
                Builder::Decoder => ModelConfig::Decoder(DecoderConfig::from_hf_json(&json, &config_path)?),
                Builder::BertEncoder => ModelConfig::Encoder(bert::BertConfig::from_json(&json, &config_path)?),
            };
            let text_err = |e| ModelError::Tokenizer { path: dir.clone(), source: e };
            let tok_cfg = dir.join("tokenizer_config.json");
            let tokenizer =
                Tokenizer::from_file(&dir.join("tokenizer.json"), tok_cfg.is_file().then_some(tok_cfg.as_path()))
                    .map_err(text_err)?;
            let chat_template = match tokenizer.chat_template_source() {
                Some(src) => Some(chat_template_for(&tokenizer, src).map_err(text_err)?),
                None => None,
            };
            release_freed_heap();
            let checkpoint = SafetensorsCheckpoint::open(dir)?;
            let dtype = weights::config_dtype(&dir.join("config.json"))?;
            let mut source =
                weights::SafetensorsSource::new(&checkpoint, dir.clone(), options.precision, options.progress)
                    .with_config_dtype(dtype);
            let q8 = options.precision == Precision::Q8;
            let graph = match &config {
                ModelConfig::Encoder(bert) => bert::build_bert(bert, &mut source, options.layers, q8, &options.faults)?,
                ModelConfig::Decoder(c) => decoder::build_decoder(c, &mut source, options.layers, q8, &options.faults)?,
            };
            if let Some((first, from)) = source.converted.first() {
                let to = source.expected_dtype(*from);
                tracing::info!("{}: {} tensor(s) stored unlike the config's dtype, loaded as {to:?} (the first: {first}, stored as {from:?})", dir.display(), source.converted.len());
            }
            Model {
                path: path.to_path_buf(),
                format,
                config,
                graph,
                tokenizer,
                chat_template,
                precision: options.precision,
                weights_in_place: false,
            }
        }
    };
    model.graph.kv_dtype = default_kv_dtype(&model.graph, options.precision);
    model.graph.q8_k_quants = options.precision == Precision::Auto;
    Ok(model)
}

/// Returns the heap memory freed so far to the system. Building a tokenizer allocates and
/// frees tens of MB of temporaries (Gemma 3's 262,144-token vocabulary: the merges derived
/// from it, the intermediate maps); glibc keeps freed memory mapped in its arenas, so it would
/// stay resident through the weights' load and count in peak RSS (55 MB of Gemma 3's 410 MiB,
/// measured with `loupe bench -p 0 -n 1`). Elsewhere than glibc, nothing.
fn release_freed_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only returns free heap pages to the kernel; no allocation moves.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// The KV cache element type a loaded graph's sessions use: f16 where the weights stay
/// block-quantized (the fast path: decode reads half the cache bytes; rounding to f16,
/// relative error under 2^-11, is far below Q4/Q8 weight noise), f32 at `--precision f32`
/// and for checkpoints without quantized weights, whose point is agreement with the f32
/// reference.
pub fn default_kv_dtype(graph: &Graph, precision: Precision) -> KvDtype {
    let quantized = graph.weights.iter().any(|w| matches!(w.data, WeightData::Quant(_)));
    if precision != Precision::F32 && quantized {
        KvDtype::F16
    } else {
        KvDtype::F32
    }
}

fn chat_template_for(tokenizer: &Tokenizer, source: &str) -> Result<ChatTemplate, loupe_text::TextError> {
    ChatTemplate::new(source, tokenizer.bos_token().unwrap_or(""), tokenizer.eos_token().unwrap_or(""))
}
