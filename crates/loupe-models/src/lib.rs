//! loupe-models: from a model file to a runnable graph, tokenizer and chat template.
//!
//! * [`config`]: `LlamaConfig` from GGUF metadata or `config.json`.
//! * [`weights`]: weight sources (GGUF, safetensors), the GGUF <-> HF name map, precision.
//! * [`llama`]: the Llama-family graph builder; values named by HF module paths.
//! * [`roles`]: what each value the builder emits is (role, layer, name, inputs).
//! * [`tokenizer`]: tokenizer specs from GGUF metadata.

pub mod config;
pub mod error;
pub mod llama;
pub mod roles;
pub mod tokenizer;
pub mod weights;

use std::io::Read;
use std::path::{Path, PathBuf};

use loupe_formats::safetensors_file::SafetensorsCheckpoint;
use loupe_formats::GgufFile;
use loupe_graph::Graph;
use loupe_text::{ChatTemplate, Tokenizer};

pub use config::LlamaConfig;
pub use loupe_graph::{Fault, FaultClass};
pub use error::ModelError;
pub use roles::{Module, ModuleRole};
pub use weights::{Precision, Progress};

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
    pub config: LlamaConfig,
    pub graph: Graph,
    pub tokenizer: Tokenizer,
    pub chat_template: Option<ChatTemplate>,
    pub precision: Precision,
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
}

impl Default for LoadOptions<'_> {
    /// f32 weights (the parity baseline), every layer, no progress, no faults.
    fn default() -> Self {
        LoadOptions { precision: Precision::F32, layers: None, progress: None, faults: Vec::new() }
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
    Err(ModelError::NotAModel { path: path.to_path_buf(), reason: "not a GGUF file (bad magic) nor a Hugging Face checkpoint directory".into() })
}

/// Loads a model from a GGUF file or a Hugging Face checkpoint directory.
pub fn load(path: &Path, options: LoadOptions<'_>) -> Result<Model, ModelError> {
    let format = detect_format(path)?;
    match &format {
        ModelFormat::Gguf => {
            let gguf = GgufFile::open(path)?;
            let config = LlamaConfig::from_gguf(&gguf)?;
            let spec = tokenizer::spec_from_gguf(&gguf)?;
            let text_err = |e| ModelError::Tokenizer { path: path.to_path_buf(), source: e };
            let tokenizer = Tokenizer::from_spec(&spec).map_err(text_err)?;
            let chat_template = match &spec.chat_template {
                Some(src) => Some(chat_template_for(&tokenizer, src).map_err(text_err)?),
                None => None,
            };
            let mut source = weights::GgufSource::new(&gguf, options.precision, config.num_attention_heads, config.num_key_value_heads, options.progress);
            let graph = llama::build_llama(&config, &mut source, options.layers, options.precision == Precision::Q8, &options.faults)?;
            Ok(Model { path: path.to_path_buf(), format, config, graph, tokenizer, chat_template, precision: options.precision })
        }
        ModelFormat::HfDir(dir) => {
            let config = LlamaConfig::from_hf_config(&dir.join("config.json"))?;
            let text_err = |e| ModelError::Tokenizer { path: dir.clone(), source: e };
            let tok_cfg = dir.join("tokenizer_config.json");
            let tokenizer = Tokenizer::from_file(&dir.join("tokenizer.json"), tok_cfg.is_file().then_some(tok_cfg.as_path())).map_err(text_err)?;
            let chat_template = match tokenizer.chat_template_source() {
                Some(src) => Some(chat_template_for(&tokenizer, src).map_err(text_err)?),
                None => None,
            };
            let checkpoint = SafetensorsCheckpoint::open(dir)?;
            let mut source = weights::SafetensorsSource::new(&checkpoint, dir.clone(), options.precision, options.progress);
            let graph = llama::build_llama(&config, &mut source, options.layers, options.precision == Precision::Q8, &options.faults)?;
            Ok(Model { path: path.to_path_buf(), format, config, graph, tokenizer, chat_template, precision: options.precision })
        }
    }
}

fn chat_template_for(tokenizer: &Tokenizer, source: &str) -> Result<ChatTemplate, loupe_text::TextError> {
    ChatTemplate::new(source, tokenizer.bos_token().unwrap_or(""), tokenizer.eos_token().unwrap_or(""))
}
