//! Loading a model as the CLI and the server do: one call from a path to a lowered graph,
//! its tokenizer and chat template, under explicit options, and sessions over it.
//!
//! ```no_run
//! use loupe_runtime::{Engine, LoadOptions, Prompt};
//!
//! let engine = Engine::load(loupe_runtime::default_model()?, LoadOptions::default())?;
//! let out = engine.generate(&Prompt::chat("What is the capital of France?"), 32, &Default::default(), &mut |_| {})?;
//! println!("{}", out.text);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use loupe_graph::debug::DebugOptions;
use loupe_graph::passes::{self, LowerError, LowerOptions};
use loupe_graph::{Fault, Graph, KvDtype, Profiler};
use loupe_models::{Model, ModelConfig, ModelError, Precision, Progress};
use loupe_text::{ChatMessage, Tokenizer};

use crate::constraint::{ConstraintError, Grammars};
use crate::{generate, GenerateRequest, Generation, RuntimeError, SamplingParams, Session};

/// How far to lower the built graph.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Lowering {
    /// Every pass; `LOUPE_DEBUG` `stop-after` (in [`LoadOptions::debug`]) ends loading with
    /// [`EngineError::StoppedAfter`].
    #[default]
    Full,
    /// Stop after the named pass and keep the graph as it is then (`loupe ir --pass`).
    Until(String),
    /// No pass: the graph as the model builder made it (the executor plans its memory).
    None,
}

/// Options of [`Engine::load`].
#[derive(Clone)]
pub struct LoadOptions<'a> {
    /// Weight precision: `Native` (GGML blocks in memory, the default), `F32` (the parity
    /// baseline), `Q8` (8-bit activations, as llama.cpp).
    pub precision: Precision,
    /// Compute threads; `None` uses every core. The compute pool is process-wide: a second
    /// engine in the same process must ask for the same number (or `None`).
    pub threads: Option<usize>,
    /// Debug options for lowering and for every session of this engine.
    pub debug: DebugOptions,
    /// Bugs to plant in the graph (`--inject`), for testing the parity tools.
    pub faults: Vec<Fault>,
    pub lowering: Lowering,
    /// Keep only the first N decoder layers.
    pub layers: Option<usize>,
    /// Called with (bytes done, bytes total) while weights load.
    pub progress: Option<Progress<'a>>,
    /// Element type of every session's KV cache; `None` takes the loader's choice
    /// ([`loupe_models::default_kv_dtype`]: f16 for quantized weights, f32 at f32).
    pub kv_dtype: Option<KvDtype>,
    /// `--profile`: every session and batched engine of this engine profiles its steps here.
    pub profiler: Option<Profiler>,
    /// `--weights`: where a GGUF's weight blocks live ([`loupe_models::placement`]).
    pub weights: loupe_models::WeightPlacement,
}

impl Default for LoadOptions<'_> {
    fn default() -> Self {
        LoadOptions {
            precision: Precision::Native,
            threads: None,
            debug: DebugOptions::default(),
            faults: Vec::new(),
            lowering: Lowering::Full,
            layers: None,
            progress: None,
            kv_dtype: None,
            profiler: None,
            weights: loupe_models::WeightPlacement::Auto,
        }
    }
}

/// Errors of loading a model and preparing prompts.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EngineError {
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Lower(#[from] LowerError),
    /// `stop-after` ended lowering on purpose: `ir` is the graph's text at that point (also
    /// written to `ir_output_dir` when that is set).
    #[error("stopped after lowering pass '{pass}' (LOUPE_DEBUG stop-after)")]
    StoppedAfter { pass: String, ir: String, ir_output_dir: Option<PathBuf> },
    #[error("{0}")]
    Threads(String),
    #[error("{path}: {reason}")]
    Path { path: PathBuf, reason: String },
    #[error("{path}: the model has no chat template")]
    NoChatTemplate { path: PathBuf },
    #[error("chat template: {0}")]
    ChatTemplate(loupe_text::TextError),
    #[error(transparent)]
    Text(#[from] loupe_text::TextError),
    #[error("the default model: {0}")]
    DefaultModel(String),
    #[error("fetching a model: {0}")]
    Fetch(String),
}

/// A prompt: raw text, or a user message rendered through the model's chat template.
#[derive(Debug, Clone, Default)]
pub struct Prompt<'a> {
    pub text: &'a str,
    /// Render through the chat template (implied by `system`).
    pub chat: bool,
    pub system: Option<&'a str>,
}

impl<'a> Prompt<'a> {
    /// Raw text, encoded with the tokenizer's default special tokens (BOS).
    pub fn raw(text: &'a str) -> Prompt<'a> {
        Prompt { text, chat: false, system: None }
    }

    /// A user message in the model's chat template, with the assistant turn opened.
    pub fn chat(text: &'a str) -> Prompt<'a> {
        Prompt { text, chat: true, system: None }
    }

    pub fn with_system(self, system: Option<&'a str>) -> Prompt<'a> {
        Prompt { system, ..self }
    }
}

/// A loaded, lowered model; hands out sessions that share its graph.
pub struct Engine {
    model: Model,
    debug: DebugOptions,
    threads: usize,
    load_time: Duration,
    ir_files: Vec<PathBuf>,
    profiler: Option<Profiler>,
    grammars: std::sync::OnceLock<Result<Grammars, ConstraintError>>,
    prefill_chunk: usize,
}

impl Engine {
    /// Loads a GGUF file or a Hugging Face checkpoint directory and lowers its graph.
    pub fn load(path: impl AsRef<Path>, options: LoadOptions<'_>) -> Result<Engine, EngineError> {
        let path = path.as_ref();
        if !path.exists() {
            return Err(EngineError::Path { path: path.to_path_buf(), reason: "no such file or directory".into() });
        }
        let threads = start_threads(options.threads)?;
        let start = Instant::now();
        let mut model = loupe_models::load(
            path,
            loupe_models::LoadOptions {
                precision: options.precision,
                layers: options.layers,
                progress: options.progress,
                faults: options.faults,
                weights: options.weights,
            },
        )?;
        if let Some(dtype) = options.kv_dtype {
            model.graph.kv_dtype = dtype;
        }
        let graph = std::mem::take(&mut model.graph);
        let mut lower = LowerOptions::from_debug(&options.debug);
        let (graph, ir_files) = match &options.lowering {
            Lowering::None => (graph, Vec::new()),
            Lowering::Until(pass) => {
                lower.stop_after = Some(pass.clone());
                let lowered = passes::lower(graph, &lower)?;
                (lowered.graph, lowered.files)
            }
            Lowering::Full => {
                let lowered = passes::lower(graph, &lower)?;
                if let Some(pass) = lowered.stopped_after {
                    return Err(EngineError::StoppedAfter {
                        pass: pass.to_string(),
                        ir: loupe_graph::print::to_text(&lowered.graph),
                        ir_output_dir: lower.ir_output_dir,
                    });
                }
                (lowered.graph, lowered.files)
            }
        };
        model.graph = graph;
        Ok(Engine {
            model,
            debug: options.debug,
            threads,
            load_time: start.elapsed(),
            ir_files,
            profiler: options.profiler,
            grammars: std::sync::OnceLock::new(),
            prefill_chunk: crate::DEFAULT_PREFILL_CHUNK,
        })
    }

    pub fn model(&self) -> &Model {
        &self.model
    }

    pub fn into_model(self) -> Model {
        self.model
    }

    pub fn graph(&self) -> &Graph {
        &self.model.graph
    }

    pub fn config(&self) -> &ModelConfig {
        &self.model.config
    }

    pub fn tokenizer(&self) -> &Tokenizer {
        &self.model.tokenizer
    }

    pub fn precision(&self) -> Precision {
        self.model.precision
    }

    pub fn path(&self) -> &Path {
        &self.model.path
    }

    /// The debug options every session of this engine runs under.
    pub fn debug(&self) -> &DebugOptions {
        &self.debug
    }

    /// The profiler every session and batched engine of this engine reports to (`--profile`).
    pub fn profiler(&self) -> Option<&Profiler> {
        self.profiler.as_ref()
    }

    /// Compute threads of the process's pool.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Reading, building and lowering the model.
    pub fn load_time(&self) -> Duration {
        self.load_time
    }

    /// The IR files written under `ir-output-dir`, one per lowering pass.
    pub fn ir_files(&self) -> &[PathBuf] {
        &self.ir_files
    }

    /// The model's context window.
    pub fn context_length(&self) -> usize {
        self.model.graph.context_length
    }

    /// A new sequence whose cache holds up to `context` positions (capped at the model's
    /// window), under this engine's debug options.
    pub fn session(&self, context: usize) -> Session<'_> {
        let mut s = Session::new(&self.model.graph, context, &self.debug);
        s.set_profiler(self.profiler.clone());
        s.set_prefill_chunk(self.prefill_chunk);
        s
    }

    /// Prompt rows per forward pass of this engine's sessions ([`Session::forward`]);
    /// at least 1. The batched engine chunks prompts by its own token budget.
    pub fn set_prefill_chunk(&mut self, rows: usize) {
        self.prefill_chunk = rows.max(1);
    }

    /// Token ids as transformers builds them: the chat template rendered and encoded without
    /// added special tokens, or the raw text with the tokenizer's default ones.
    pub fn prompt_tokens(&self, prompt: &Prompt<'_>) -> Result<Vec<u32>, EngineError> {
        if prompt.chat || prompt.system.is_some() {
            let template = self
                .model
                .chat_template
                .as_ref()
                .ok_or_else(|| EngineError::NoChatTemplate { path: self.model.path.clone() })?;
            let mut messages = Vec::new();
            if let Some(s) = prompt.system {
                messages.push(ChatMessage::new("system", s));
            }
            messages.push(ChatMessage::new("user", prompt.text));
            let text = template.render(&messages, true).map_err(EngineError::ChatTemplate)?;
            Ok(self.model.tokenizer.encode(&text, false)?)
        } else {
            Ok(self.model.tokenizer.encode(prompt.text, true)?)
        }
    }

    /// Generates up to `max_tokens` after `prompt`, stopping at the model's EOS tokens;
    /// `on_text` receives the text as it becomes final.
    pub fn generate(
        &self,
        prompt: &Prompt<'_>,
        max_tokens: usize,
        sampling: &SamplingParams,
        on_text: &mut dyn FnMut(&str),
    ) -> Result<Generation, RuntimeError> {
        let prompt_tokens = self.prompt_tokens(prompt).map_err(|e| RuntimeError::InvalidRequest(e.to_string()))?;
        let request = GenerateRequest::new(prompt_tokens, max_tokens, sampling.clone(), self.model.tokenizer.eos_ids());
        self.generate_tokens(&request, on_text)
    }

    /// [`Engine::generate`] for a prepared request (token ids, stop ids and strings).
    pub fn generate_tokens(
        &self,
        request: &GenerateRequest,
        on_text: &mut dyn FnMut(&str),
    ) -> Result<Generation, RuntimeError> {
        let context = self.context_length();
        if request.prompt_tokens.len() >= context {
            return Err(RuntimeError::PromptTooLong { prompt: request.prompt_tokens.len(), context });
        }
        let grammars = match request.grammar {
            Some(_) => Some(self.grammars()?),
            None => None,
        };
        let mut session = self.session((request.prompt_tokens.len() + request.max_tokens).min(context));
        generate(&mut session, &self.model.tokenizer, grammars, request, on_text)
    }

    /// The model's grammar compiler for constrained decoding, built on first use (it walks
    /// the whole vocabulary) over the model's end-of-generation ids.
    pub fn grammars(&self) -> Result<&Grammars, ConstraintError> {
        self.grammars
            .get_or_init(|| {
                Grammars::new(&self.model.tokenizer, self.model.config.vocab_size(), &self.model.tokenizer.eos_ids())
            })
            .as_ref()
            .map_err(Clone::clone)
    }
}

/// Starts the process's compute pool (and rayon's, which only parallelizes weight loading)
/// with `threads` threads, or every core; a pool already running with another count is an
/// error, since the kernels of every engine in the process share it.
pub fn start_threads(threads: Option<usize>) -> Result<usize, EngineError> {
    let n = match threads {
        Some(0) => return Err(EngineError::Threads("--threads must be at least 1".into())),
        Some(n) => n,
        // Starts the pool with one thread per core, or finds it running.
        None => loupe_tensor::pool::threads(),
    };
    loupe_tensor::pool::init_global(n).map_err(|e| EngineError::Threads(e.to_string()))?;
    // rayon's global pool can be built once; a second engine finds it built, which is fine:
    // it only splits weight loading.
    let _ = rayon::ThreadPoolBuilder::new().num_threads(n).build_global();
    Ok(n)
}
