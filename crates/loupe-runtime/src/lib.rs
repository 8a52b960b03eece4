//! loupe-runtime: loading a model and running it over sequences.
//!
//! * [`Engine`]: the loading API the CLI and the server share: `Engine::load(path,
//!   LoadOptions { precision, threads, debug, faults, lowering, .. })` → a lowered graph,
//!   tokenizer and chat template that hands out sessions.
//! * [`debug_config`]: where `LOUPE_DEBUG` options come from (`loupe.toml`, environment,
//!   flags, API) and which wins; the result is a plain `DebugOptions` passed explicitly.
//! * [`default_model`]: the default model's cache path and its fetch.
//! * [`Session`]: a graph, its executor and a KV cache; `prefill`/`decode` and teacher forcing.
//! * [`batch`]: the batched engine a server sits on: paged KV cache, prefix cache,
//!   continuous-batching scheduler, batch-invariant output.
//! * [`sampling`]: greedy and seeded sampling.
//! * [`generate`]: the generation loop with streaming, EOS and stop strings.
//! * [`constraint`]: constrained decoding (JSON schema, regex, Lark) through llguidance.
//! * [`embed`]: sentence embeddings from an encoder (pooling, normalization).

pub mod batch;
pub mod constraint;
pub mod debug_config;
pub mod default_model;
pub mod embed;
pub mod engine;
pub mod generate;
pub mod sampling;
pub mod speculative;

use loupe_graph::debug::DebugOptions;
use loupe_graph::exec::RunOptions;
use loupe_graph::{Executor, Graph, GraphError, KvCache, Observer};

pub use batch::{
    ngram_draft, BatchConfig, BatchEngine, BatchStats, Completion, DiskCacheConfig, DiskStats, DraftModel, Drafter,
    SeqEvent, SeqId, SeqRequest, SequenceTap, SpecRecord, SpecStats, SpeculationConfig, StepShape, Usage, PHASE_DECODE,
    PHASE_DRAFT, PHASE_PROMPT, PHASE_VERIFY,
};
pub use constraint::{Constraint, ConstraintError, GrammarSpec, Grammars};
pub use default_model::{default_model, default_model_path, fetch_model, FETCHABLE_MODELS};
pub use embed::{EmbedConfig, Embedding, Pooling};
pub use engine::{Engine, EngineError, LoadOptions, Lowering, Prompt};
pub use generate::{generate, FinishReason, GenerateRequest, Generation, StopMatcher};
pub use sampling::{argmax, Sampler, SamplingParams, TokenLogprobs};
pub use speculative::generate_speculative;

/// Errors of the runtime layer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RuntimeError {
    #[error(transparent)]
    Graph(#[from] GraphError),
    #[error(transparent)]
    Text(#[from] loupe_text::TextError),
    #[error("the prompt has {prompt} tokens but the context window is {context} tokens")]
    PromptTooLong { prompt: usize, context: usize },
    #[error("{0}")]
    InvalidRequest(String),
    #[error("draft model {}: {reason}", path.display())]
    DraftModel { path: std::path::PathBuf, reason: String },
    #[error(transparent)]
    Constraint(#[from] crate::constraint::ConstraintError),
    #[error(transparent)]
    Disk(#[from] crate::batch::disk::DiskError),
    #[error("speculation log {}: {source}", path.display())]
    SpeculationLog { path: std::path::PathBuf, source: std::io::Error },
}

/// One sequence being run through a model graph.
pub struct Session<'g> {
    graph: &'g Graph,
    executor: Executor,
    kv: KvCache,
    prefill_chunk: usize,
}

/// Rows per executor call when [`Session::forward`] runs a long prompt (see there): 512, the
/// default of llama.cpp's `n_ubatch` (common/common.h), which prefills at full speed on every
/// model of the benchmark matrix (BENCHMARKS.md, "prefill in chunks").
pub const DEFAULT_PREFILL_CHUNK: usize = 512;

impl<'g> Session<'g> {
    /// A session whose cache holds up to `context` positions (at most the model's window)
    /// as the graph's [`Graph::kv_dtype`], running under `debug` (`DebugOptions::default()`
    /// turns every check off).
    pub fn new(graph: &'g Graph, context: usize, debug: &DebugOptions) -> Session<'g> {
        let capacity = context.min(graph.context_length);
        let kv = KvCache::with_dtype(graph.kv_layers, graph.kv_width, capacity, graph.kv_dtype);
        Session { graph, executor: Executor::new(graph, debug), kv, prefill_chunk: DEFAULT_PREFILL_CHUNK }
    }

    /// Rows per executor call of a chunked prompt ([`Session::forward`]); at least 1.
    pub fn set_prefill_chunk(&mut self, rows: usize) {
        self.prefill_chunk = rows.max(1);
    }

    pub fn prefill_chunk(&self) -> usize {
        self.prefill_chunk
    }

    pub fn graph(&self) -> &Graph {
        self.graph
    }

    /// Positions in the cache.
    pub fn position(&self) -> usize {
        self.kv.len()
    }

    pub fn capacity(&self) -> usize {
        self.kv.capacity()
    }

    pub fn kv(&self) -> &KvCache {
        &self.kv
    }

    /// Profiles this session's steps into `profiler` (`None` stops).
    pub fn set_profiler(&mut self, profiler: Option<loupe_graph::Profiler>) {
        self.executor.set_profiler(profiler);
    }

    /// Forgets the sequence.
    pub fn reset(&mut self) {
        self.kv.truncate(0);
    }

    /// Pre-allocates cache rows for `positions` positions.
    pub fn reserve(&mut self, positions: usize) {
        self.kv.reserve(positions);
    }

    /// Runs `tokens` after what is cached; returns the last token's logits (or every
    /// token's with `all_logits`), showing values to `observer`.
    ///
    /// A decoder's prompt longer than [`Session::prefill_chunk`] rows, run for its last
    /// logits and without an observer, goes through the executor in chunks of that many
    /// rows: the executor's activation buffers grow to the rows of its largest call, so the
    /// chunk bounds prefill's memory whatever the prompt's length (llama.cpp's `n_ubatch`
    /// plays the same part). Each chunk appends its keys and values to the cache and its
    /// rows attend to every earlier position there, as one pass does: attention reads the
    /// current pass's keys back from the cache too. Taps and every row's logits
    /// (teacher forcing, encoders) keep one pass, so a dump holds the whole prompt.
    pub fn forward(
        &mut self,
        tokens: &[u32],
        all_logits: bool,
        observer: Option<&mut dyn Observer>,
    ) -> Result<&[f32], RuntimeError> {
        let chunk = self.prefill_chunk;
        if all_logits || observer.is_some() || self.graph.encoder || tokens.len() <= chunk {
            return Ok(self.executor.run(self.graph, tokens, &mut self.kv, RunOptions { all_logits }, observer)?);
        }
        // Room for the whole prompt is checked before the first chunk, so a prompt that
        // does not fit leaves the cache as it was.
        self.kv.check_room(tokens.len())?;
        for rows in tokens.chunks(chunk) {
            self.executor.run(self.graph, rows, &mut self.kv, RunOptions { all_logits: false }, None)?;
        }
        Ok(self.executor.logits())
    }

    /// Teacher forcing: one forward pass over `tokens` from an empty cache; returns the
    /// argmax of the logits at every position.
    pub fn teacher_forced_argmax(&mut self, tokens: &[u32]) -> Result<Vec<u32>, RuntimeError> {
        self.reset();
        let logits = self.forward(tokens, true, None)?;
        let vocab = logits.len() / tokens.len();
        Ok(logits.chunks_exact(vocab).map(argmax).collect())
    }
}
