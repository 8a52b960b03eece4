//! The batched engine: many sequences through one model at once, the layer a server sits on.
//!
//! * **Ragged steps.** Each [`BatchEngine::step`] runs one forward pass over the tokens of
//!   every scheduled sequence (prefill chunks and single decode tokens together), so each
//!   weight matrix is read once per step for all of them ([`Executor::run_batch`]).
//! * **Paged KV cache** ([`PagedKvCache`]) of `block_size`-position blocks under a memory
//!   budget, f16 by default; a sequence holds a block table. When a step needs more blocks
//!   than are available, the newest running sequence is *preempted*: its blocks are
//!   released and it goes back to the front of the queue, to be recomputed later (its
//!   generated tokens and sampler state are kept, so its output does not change). A
//!   request is never failed for lack of blocks unless it alone cannot fit the whole cache.
//! * **Prefix cache** ([`blocks::BlockManager`]): full blocks are registered under a hash
//!   chain of their tokens; a new sequence claims the longest cached prefix of its prompt
//!   and skips computing it ([`Usage::cached_tokens`]).
//! * **Scheduler**: continuous batching (sequences join and leave between steps), FIFO
//!   admission (no request overtakes an earlier one), chunked prefill under
//!   `max_batch_tokens` per step, at most `max_seqs` running, cancellation that releases a
//!   sequence's blocks at once, sampling parameters and seed per sequence.
//! * **Batch- and cache-invariant output**: every kernel of a batched step computes each
//!   row alone (see [`Executor::run_batch`]), and cached blocks hold exactly the values the
//!   sequence would have computed itself, so a request's tokens are bit-identical whether
//!   it runs alone, among 31 others, chunked, preempted and recomputed, or from the prefix
//!   cache.

pub mod blocks;
pub mod disk;
mod draft_model;
mod offload;
mod reset;
mod schedule;
mod spec_log;
mod speculate;
mod tap;

use std::collections::VecDeque;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::path::PathBuf;

use loupe_graph::{BatchSpan, Executor, Graph, KvDtype, PagedKvCache, Profiler};

use crate::constraint::{Constraint, GrammarSpec};
use crate::{Engine, FinishReason, RuntimeError, Sampler, SamplingParams, TokenLogprobs};
pub use blocks::{BlockManager, PrefixStats};
pub use disk::{DiskCacheConfig, DiskStats};
pub use draft_model::DraftModel;
use spec_log::{SpecLog, StepClock};
pub use spec_log::{SpecRecord, PHASE_DECODE, PHASE_DRAFT, PHASE_PROMPT, PHASE_VERIFY};
use speculate::SpecState;
pub use speculate::{ngram_draft, Drafter, SpecStats, SpeculationConfig};
pub use tap::{SequenceTap, StepLayout, StepObserver, WholeStep};

/// Identifies a sequence of a [`BatchEngine`].
pub type SeqId = u64;

/// Sizes and policies of a [`BatchEngine`].
#[derive(Debug, Clone)]
pub struct BatchConfig {
    /// KV cache budget in MiB; `None`: a quarter of the machine's memory, capped at what
    /// `max_seqs` full contexts need.
    pub kv_cache_mb: Option<usize>,
    /// Exact number of KV blocks, overriding `kv_cache_mb` (tests, tuning).
    pub kv_blocks: Option<usize>,
    /// Element type of the paged cache; `None`: the graph's ([`Graph::kv_dtype`], f16 for
    /// quantized weights, f32 at f32 precision). [`BatchEngine::config`] shows the one used.
    pub kv_dtype: Option<KvDtype>,
    /// Positions per KV block.
    pub block_size: usize,
    /// Tokens per step (decode tokens plus prefill chunks).
    pub max_batch_tokens: usize,
    /// Sequences running at once.
    pub max_seqs: usize,
    pub prefix_cache: bool,
    /// The prefix cache's disk tier: evicted blocks go to this directory and come back on a
    /// later hit ([`disk`]); `None` (the default): off. Needs `prefix_cache`.
    pub prefix_cache_disk: Option<DiskCacheConfig>,
    /// Speculative decoding ([`speculate`]); `None` (the default): off. A request may opt
    /// out ([`SeqRequest::speculate`]).
    pub speculation: Option<SpeculationConfig>,
    /// With speculation: write each speculating sequence's proposals, accepted count and
    /// produced tokens, step by step, to this file as JSON lines ([`SpecRecord`]); created
    /// (truncated) by [`BatchEngine::new`]. `None` (the default): no log.
    pub speculation_log: Option<PathBuf>,
}

impl Default for BatchConfig {
    fn default() -> Self {
        BatchConfig {
            kv_cache_mb: None,
            kv_blocks: None,
            kv_dtype: None,
            block_size: 16,
            max_batch_tokens: 512,
            max_seqs: 32,
            prefix_cache: true,
            prefix_cache_disk: None,
            speculation: None,
            speculation_log: None,
        }
    }
}

/// One request: prompt token ids, a length limit, stop ids and sampling.
#[derive(Debug, Clone)]
pub struct SeqRequest {
    pub prompt: Vec<u32>,
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    /// Token ids that end the sequence (included in its output), usually the model's EOS.
    pub stop_ids: Vec<u32>,
    /// Report each generated token's log-probability and this many most likely
    /// alternatives ([`TokenLogprobs`]); `None`: no log-probabilities.
    pub logprobs: Option<usize>,
    /// What the output must match ([`crate::constraint`]); compiled when the request is
    /// added, so an invalid grammar fails [`BatchEngine::add`].
    pub grammar: Option<GrammarSpec>,
    /// With a grammar: append the tokens it forces without sampling them (they come
    /// without log-probabilities).
    pub fast_forward: bool,
    /// Speculate for this request when the engine speculates (default true); its tokens are
    /// the same either way.
    pub speculate: bool,
}

impl SeqRequest {
    /// An unconstrained request without log-probabilities.
    pub fn new(prompt: Vec<u32>, max_tokens: usize, sampling: SamplingParams, stop_ids: Vec<u32>) -> SeqRequest {
        SeqRequest {
            prompt,
            max_tokens,
            sampling,
            stop_ids,
            logprobs: None,
            grammar: None,
            fast_forward: false,
            speculate: true,
        }
    }
}

/// Token counts of a finished sequence.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: usize,
    /// Prompt tokens whose keys and values came from the prefix cache (not computed).
    pub cached_tokens: usize,
    pub completion_tokens: usize,
}

/// What a step produced for one sequence.
#[derive(Debug, Clone, PartialEq)]
pub enum SeqEvent {
    /// A new token (also sent for the token that finishes the sequence), with its
    /// log-probabilities when the request asked for them.
    Token {
        id: SeqId,
        token: u32,
        logprobs: Option<TokenLogprobs>,
    },
    Finished {
        id: SeqId,
        reason: FinishReason,
        usage: Usage,
    },
}

/// Counters of a [`BatchEngine`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BatchStats {
    pub steps: u64,
    pub blocks_total: usize,
    pub blocks_in_use: usize,
    pub peak_blocks_in_use: usize,
    /// Blocks registered in the prefix cache.
    pub blocks_cached: usize,
    pub prefix: PrefixStats,
    /// The prefix cache's disk tier (all zero when it is off).
    pub disk: DiskStats,
    pub preemptions: u64,
    pub running: usize,
    pub waiting: usize,
    /// Tokens computed by steps (prefill and decode), and of those, prompt or recomputed
    /// tokens (everything but the one decode token of a generating sequence).
    pub tokens_computed: u64,
    pub prefill_tokens_computed: u64,
    /// Speculative decoding's counters (all zero when it is off).
    pub spec: SpecStats,
}

/// The shape of the last step, by MAX's batch types: context encoding (CE: prompt chunks,
/// recomputation) and token generation (TG: one new token of a generating sequence).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StepShape {
    pub ce_seqs: usize,
    pub ce_tokens: usize,
    pub tg_seqs: usize,
}

/// A finished sequence, as [`BatchEngine::run_all`] returns it.
#[derive(Debug, Clone, PartialEq)]
pub struct Completion {
    pub id: SeqId,
    pub tokens: Vec<u32>,
    pub reason: FinishReason,
    pub usage: Usage,
}

struct Sequence {
    id: SeqId,
    /// Prompt then generated tokens.
    tokens: Vec<u32>,
    prompt_len: usize,
    max_tokens: usize,
    stop_ids: Vec<u32>,
    logprobs: Option<usize>,
    sampler: Sampler,
    constraint: Option<Constraint>,
    fast_forward: bool,
    /// Block table: position `p` is in `blocks[p / block_size]`.
    blocks: Vec<u32>,
    /// Chain keys of the first `keys.len()` full blocks (registered or claimed).
    keys: Vec<u64>,
    /// Positions whose keys and values are in the cache.
    computed: usize,
    /// Set at first admission; a recompute after preemption does not change it.
    cached_tokens: Option<usize>,
    /// Whether it may speculate, how many tokens it may draft, and the draft this step
    /// verifies (after its last token).
    speculate: bool,
    spec: SpecState,
    draft: Vec<u32>,
    /// The draft model's cache for this sequence (`--speculate draft`), made on first use.
    draft_cache: Option<draft_model::DraftState>,
}

impl Sequence {
    fn generated(&self) -> usize {
        self.tokens.len() - self.prompt_len
    }

    fn usage(&self) -> Usage {
        Usage {
            prompt_tokens: self.prompt_len,
            cached_tokens: self.cached_tokens.unwrap_or(0),
            completion_tokens: self.generated(),
        }
    }
}

/// Many sequences over one model; see the module docs.
pub struct BatchEngine<'e> {
    engine: &'e Engine,
    graph: &'e Graph,
    executor: Executor,
    kv: PagedKvCache,
    blocks: BlockManager,
    disk: Option<disk::DiskTier>,
    config: BatchConfig,
    waiting: VecDeque<Sequence>,
    running: Vec<Sequence>,
    next_id: SeqId,
    stats: BatchStats,
    last_step: StepShape,
    /// Rows of the embedding table: the token ids a prompt may hold.
    vocab: usize,
    /// [`BatchConfig::speculation_log`], open.
    spec_log: Option<SpecLog>,
    /// The engine's profiler, and this step's clock under it when speculation is on.
    profiler: Option<Profiler>,
    clock: Option<StepClock>,
}

/// Bytes of memory the machine has (`/proc/meminfo` MemTotal), if known.
fn total_memory_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

impl<'e> BatchEngine<'e> {
    /// A batched engine over `engine`'s model, under its debug options.
    pub fn new(engine: &'e Engine, mut config: BatchConfig) -> Result<BatchEngine<'e>, RuntimeError> {
        let graph = engine.graph();
        let kv_dtype = *config.kv_dtype.get_or_insert(graph.kv_dtype);
        if config.block_size == 0 || config.max_batch_tokens == 0 || config.max_seqs == 0 {
            return Err(RuntimeError::InvalidRequest(
                "block size, max batch tokens and max sequences must be at least 1".into(),
            ));
        }
        let per_block =
            PagedKvCache::bytes_per_block(graph.kv_layers, graph.kv_width, config.block_size, kv_dtype).max(1);
        let blocks_per_seq = graph.context_length.div_ceil(config.block_size);
        let n_blocks = match (config.kv_blocks, config.kv_cache_mb) {
            (Some(n), _) => n,
            (None, Some(mb)) => mb.saturating_mul(1 << 20) / per_block,
            (None, None) => {
                let quarter = total_memory_bytes().unwrap_or(8 << 30) / 4;
                ((quarter / per_block as u64) as usize).min(blocks_per_seq.saturating_mul(config.max_seqs))
            }
        };
        if n_blocks == 0 {
            return Err(RuntimeError::InvalidRequest(format!(
                "a KV cache budget of {} MiB holds no block ({} KiB each: {} layers, {} positions of {} {} values)",
                config.kv_cache_mb.unwrap_or(0),
                per_block / 1024,
                graph.kv_layers,
                config.block_size,
                graph.kv_width,
                kv_dtype
            )));
        }
        // What changes a cached block's values besides its tokens.
        let mut salt = DefaultHasher::new();
        engine.path().hash(&mut salt);
        std::fs::metadata(engine.path()).map(|m| m.len()).unwrap_or(0).hash(&mut salt);
        format!("{:?}", engine.precision()).hash(&mut salt);
        kv_dtype.hash(&mut salt);
        config.block_size.hash(&mut salt);
        let salt = salt.finish();
        if let Some(SpeculationConfig { drafter: Drafter::Model(model), .. }) = &config.speculation {
            model.check_fits(engine)?;
        }
        let spec_log = match (&config.speculation_log, &config.speculation) {
            (None, _) => None,
            (Some(path), Some(_)) => Some(SpecLog::create(path)?),
            (Some(_), None) => {
                return Err(RuntimeError::InvalidRequest("a speculation log needs speculation on".into()))
            }
        };
        let disk = offload::open_disk(engine, &config, salt, kv_dtype)?;
        let kv = PagedKvCache::new(graph.kv_layers, graph.kv_width, config.block_size, n_blocks, kv_dtype);
        let mut blocks = BlockManager::new(n_blocks, config.block_size, salt, config.prefix_cache);
        if disk.is_some() {
            blocks.keep_evicted();
        }
        Ok(BatchEngine {
            engine,
            graph,
            executor: {
                let mut e = Executor::new(graph, engine.debug());
                e.set_profiler(engine.profiler().cloned());
                e
            },
            kv,
            blocks,
            disk,
            config,
            waiting: VecDeque::new(),
            running: Vec::new(),
            next_id: 0,
            stats: BatchStats::default(),
            last_step: StepShape::default(),
            vocab: graph
                .nodes
                .iter()
                .find_map(|n| {
                    if let loupe_graph::Op::Embedding { table, .. } = n.op {
                        Some(graph.weight(table).shape[0])
                    } else {
                        None
                    }
                })
                .unwrap_or(usize::MAX),
            spec_log,
            profiler: engine.profiler().cloned(),
            clock: None,
        })
    }

    pub fn config(&self) -> &BatchConfig {
        &self.config
    }

    /// Bytes of the KV cache (its budget; pages are touched as blocks are first used).
    pub fn kv_cache_bytes(&self) -> usize {
        PagedKvCache::bytes_per_block(
            self.graph.kv_layers,
            self.graph.kv_width,
            self.config.block_size,
            self.kv.dtype(),
        ) * self.blocks.total()
    }

    /// Queues a request; it starts at a coming step, after every earlier request.
    pub fn add(&mut self, request: SeqRequest) -> Result<SeqId, RuntimeError> {
        request.sampling.validate().map_err(RuntimeError::InvalidRequest)?;
        let context = self.graph.context_length;
        let n = request.prompt.len();
        if n == 0 {
            return Err(RuntimeError::InvalidRequest("the prompt is empty (no tokens)".into()));
        }
        if n >= context {
            return Err(RuntimeError::PromptTooLong { prompt: n, context });
        }
        // LongRoPE (Phi-3): transformers runs a sequence that outgrows the original length
        // again in one call with the long factors (`loupe_runtime::generate` does the same);
        // the batched engine's chunked prefill and per-step spans do not, so a request that
        // could cross the switch is refused rather than answered with other numbers.
        if let Some(switch) = self.graph.longrope_switch() {
            if n + request.max_tokens > switch {
                return Err(RuntimeError::InvalidRequest(format!(
                    "the prompt ({n} tokens) plus max_tokens ({}) passes LongRoPE's original length {switch}, where transformers recomputes the sequence with the long factors; the batched engine does not reproduce that yet (use loupe generate, or keep prompt + max_tokens within {switch})",
                    request.max_tokens
                )));
            }
        }
        let vocab = self.vocab;
        if let Some(&bad) = request.prompt.iter().find(|&&t| t as usize >= vocab) {
            return Err(RuntimeError::InvalidRequest(format!("token id {bad} is outside the vocabulary of {vocab}")));
        }
        // The prompt and the first generated token must fit the whole cache.
        let need = self.blocks.blocks_for(n + 1);
        if need > self.blocks.total() {
            return Err(RuntimeError::InvalidRequest(format!(
                "the prompt needs {need} KV blocks but the cache has {} (raise --kv-cache-mb)",
                self.blocks.total()
            )));
        }
        let constraint = match &request.grammar {
            Some(spec) => Some(self.engine.grammars()?.compile(spec)?),
            None => None,
        };
        let id = self.next_id;
        self.next_id += 1;
        self.waiting.push_back(Sequence {
            id,
            tokens: request.prompt,
            prompt_len: n,
            max_tokens: request.max_tokens,
            stop_ids: request.stop_ids,
            logprobs: request.logprobs,
            sampler: Sampler::new(request.sampling),
            constraint,
            fast_forward: request.fast_forward,
            blocks: Vec::new(),
            keys: Vec::new(),
            computed: 0,
            cached_tokens: None,
            speculate: request.speculate && self.config.speculation.is_some(),
            spec: self
                .config
                .speculation
                .as_ref()
                .map_or(SpecState::new(&SpeculationConfig::default()), SpecState::new),
            draft_cache: None,
            draft: Vec::new(),
        });
        Ok(id)
    }

    /// Stops a sequence now, releasing its blocks; false if it is not queued or running.
    pub fn cancel(&mut self, id: SeqId) -> bool {
        if let Some(i) = self.running.iter().position(|s| s.id == id) {
            let seq = self.running.remove(i);
            self.release(seq);
            return true;
        }
        if let Some(i) = self.waiting.iter().position(|s| s.id == id) {
            if let Some(seq) = self.waiting.remove(i) {
                self.release(seq);
            }
            return true;
        }
        false
    }

    /// Whether any sequence is queued or running.
    pub fn has_work(&self) -> bool {
        !self.waiting.is_empty() || !self.running.is_empty()
    }

    pub fn stats(&self) -> BatchStats {
        BatchStats {
            blocks_total: self.blocks.total(),
            blocks_in_use: self.blocks.in_use(),
            blocks_cached: self.blocks.cached(),
            prefix: self.blocks.stats(),
            disk: self.disk.as_ref().map(|d| d.stats()).unwrap_or_default(),
            running: self.running.len(),
            waiting: self.waiting.len(),
            ..self.stats
        }
    }

    /// Token counts so far of a queued or running sequence (`cached_tokens` is 0 until it
    /// is first scheduled).
    pub fn usage(&self, id: SeqId) -> Option<Usage> {
        self.running.iter().chain(self.waiting.iter()).find(|s| s.id == id).map(Sequence::usage)
    }

    /// What the last step computed (all zero before the first, or when it ran nothing).
    pub fn last_step(&self) -> StepShape {
        self.last_step
    }

    /// Ids of the running sequences, oldest first.
    pub fn running(&self) -> Vec<SeqId> {
        self.running.iter().map(|s| s.id).collect()
    }

    fn release(&mut self, mut seq: Sequence) {
        Self::give_back(&mut self.blocks, &mut seq);
    }

    /// Releases every block `seq` holds; it must be computed again from position 0.
    fn give_back(blocks: &mut BlockManager, seq: &mut Sequence) {
        for b in seq.blocks.drain(..) {
            blocks.release(b);
        }
        seq.keys.clear();
        seq.computed = 0;
        seq.draft.clear();
    }

    /// Preempts the newest running sequence (after index `keep`): its blocks go back and it
    /// waits at the front of the queue to be recomputed. False if there is none.
    fn preempt_newest(&mut self, keep: usize) -> bool {
        if self.running.len() <= keep + 1 {
            return false;
        }
        let Some(mut seq) = self.running.pop() else { return false };
        Self::give_back(&mut self.blocks, &mut seq);
        self.waiting.push_front(seq);
        self.stats.preemptions += 1;
        true
    }

    /// Grows `seq`'s block table to hold `positions`; false if there are not enough
    /// available blocks (nothing is allocated then).
    fn grow(blocks: &mut BlockManager, seq: &mut Sequence, positions: usize) -> bool {
        let need = blocks.blocks_for(positions).saturating_sub(seq.blocks.len());
        if need > blocks.available() {
            return false;
        }
        for _ in 0..need {
            match blocks.allocate() {
                Some(b) => seq.blocks.push(b),
                None => return false,
            }
        }
        true
    }

    /// Runs one step; returns the tokens it produced and the sequences it finished.
    pub fn step(&mut self) -> Result<Vec<SeqEvent>, RuntimeError> {
        self.step_observed(None)
    }

    /// [`BatchEngine::step`] showing the values of the forward pass to `observer`: one
    /// sequence's rows through [`SequenceTap`], or the whole step through [`WholeStep`].
    pub fn step_observed(
        &mut self,
        mut observer: Option<&mut dyn StepObserver>,
    ) -> Result<Vec<SeqEvent>, RuntimeError> {
        let mut events = Vec::new();
        if self.config.speculation.is_some() && self.profiler.is_some() {
            self.clock = Some(StepClock::start());
        }
        let plan = self.schedule(&mut events);
        let verifies = self.running.iter().any(|s| !s.draft.is_empty());
        // Blocks the schedule evicted go to the disk tier before this step overwrites them.
        self.spill_evicted();
        self.last_step = StepShape::default();
        // Grammar masks of the sequences that sample this step, computed on a helper
        // thread while the forward pass runs (they depend only on the tokens so far).
        let mut constraints: Vec<(usize, Constraint)> = Vec::new();
        for (i, &n) in plan.iter().enumerate() {
            let seq = &mut self.running[i];
            if n > 0 && seq.computed + n - seq.draft.len() == seq.tokens.len() {
                if let Some(c) = seq.constraint.take() {
                    constraints.push((i, c));
                }
            }
        }
        let mut tokens = Vec::new();
        let mut spans = Vec::new();
        // (running index, logits rows) of the sequences that sample this step.
        let mut logit_seqs: Vec<(usize, usize)> = Vec::new();
        let mut logit_rows = 0;
        let mut layout = Vec::new();
        for (i, &n) in plan.iter().enumerate() {
            if n == 0 {
                continue;
            }
            let seq = &self.running[i];
            // Its own tokens, then the drafts (which only follow a sequence's last token).
            let own = n - seq.draft.len();
            let logits = if seq.computed + own == seq.tokens.len() { 1 + seq.draft.len() } else { 0 };
            layout.push(StepLayout {
                seq: seq.id,
                rows: tokens.len()..tokens.len() + n,
                logit_rows: logit_rows..logit_rows + logits,
            });
            tokens.extend_from_slice(&seq.tokens[seq.computed..seq.computed + own]);
            tokens.extend_from_slice(&seq.draft);
            let prompt_rows = seq.prompt_len.saturating_sub(seq.computed).min(n);
            // Greedy with nothing else reading the logits: only each row's argmax matters.
            let argmax_only = seq.sampler.is_plain_greedy() && seq.constraint.is_none() && seq.logprobs.is_none();
            spans.push(BatchSpan { len: n, past: seq.computed, blocks: &seq.blocks, logits, prompt_rows, argmax_only });
            if logits > 0 {
                logit_seqs.push((i, logits));
                logit_rows += logits;
            }
        }
        if tokens.is_empty() {
            return Ok(events);
        }
        if let Some(obs) = observer.as_deref_mut() {
            obs.begin_step(&layout);
        }
        let (executor, kv, graph) = (&mut self.executor, &mut self.kv, self.graph);
        let (logits, masks) = std::thread::scope(|s| {
            let masks = (!constraints.is_empty())
                .then(|| s.spawn(|| constraints.iter_mut().try_for_each(|(_, c)| c.compute_mask())));
            let logits = executor.run_batch(graph, &tokens, &spans, kv, observer.map(|o| o.as_observer()));
            (logits, masks.map(|h| h.join()))
        });
        let n_spans = spans.len();
        drop(spans);
        for (i, c) in constraints {
            self.running[i].constraint = Some(c);
        }
        if let Some(masks) = masks {
            masks.map_err(|_| RuntimeError::InvalidRequest("the grammar engine panicked".into()))??;
        }
        let logits = logits?;
        let vocab = logits.len().checked_div(logit_rows).unwrap_or(0);
        self.stats.steps += 1;
        self.stats.tokens_computed += tokens.len() as u64;
        // A generating sequence's token and its drafts are token generation (TG).
        let (tg_seqs, tg_tokens) = plan
            .iter()
            .enumerate()
            .filter(|&(i, &n)| {
                let seq = &self.running[i];
                n == 1 + seq.draft.len() && seq.computed + 1 == seq.tokens.len() && seq.generated() > 0
            })
            .fold((0, 0), |(seqs, tokens), (_, &n)| (seqs + 1, tokens + n));
        self.stats.prefill_tokens_computed += (tokens.len() - tg_tokens) as u64;
        self.last_step = StepShape { ce_seqs: n_spans - tg_seqs, ce_tokens: tokens.len() - tg_tokens, tg_seqs };
        // Sample in plan order; logits rows follow the spans that asked for them. A sequence
        // with drafts verifies them row by row: each accepted draft is its token, the first
        // row that disagrees gives the token in its place, and a fully accepted draft gets
        // the next token from its last row.
        let mut jobs = Vec::with_capacity(logit_seqs.len());
        let (mut row, mut wanted) = (0, logit_seqs.iter().peekable());
        for (i, seq) in self.running.iter_mut().enumerate() {
            let Some(&(_, rows)) = wanted.next_if(|&&(j, _)| j == i) else { continue };
            jobs.push(speculate::SampleJob {
                draft: std::mem::take(&mut seq.draft),
                verifier: speculate::Verifier {
                    tokens: &seq.tokens,
                    constraint: seq.constraint.as_mut(),
                    sampler: &mut seq.sampler,
                    stop_ids: &seq.stop_ids,
                    logprobs: seq.logprobs,
                },
                logits: &logits[row * vocab..(row + rows) * vocab],
            });
            row += rows;
        }
        let verified = speculate::verify_all(jobs, vocab);
        let mut sampled = Vec::with_capacity(logit_seqs.len());
        let mut logged = Ok(());
        for (&(i, _), (draft, result)) in logit_seqs.iter().zip(verified) {
            let (new, accepted) = result?;
            let seq = &mut self.running[i];
            if !draft.is_empty() {
                let spec = &mut self.stats.spec;
                spec.verify_steps += 1;
                spec.draft_tokens += draft.len() as u64;
                spec.accepted_tokens += accepted as u64;
                let (max, free) =
                    self.config.speculation.as_ref().map_or((1, true), |c| (c.max_draft, c.drafter.drafts_are_free()));
                seq.spec.update(draft.len(), accepted, max, free);
            }
            if let Some(log) = self.spec_log.as_mut().filter(|_| seq.speculate) {
                let produced: Vec<u32> = new.iter().map(|&(t, _)| t).collect();
                let record = SpecRecord {
                    step: self.stats.steps,
                    seq: seq.id,
                    position: seq.tokens.len(),
                    proposed: &draft,
                    accepted,
                    produced: &produced,
                };
                logged = logged.and_then(|()| log.write(&record, self.engine.tokenizer()));
            }
            sampled.push((i, new, draft.len() - accepted, accepted));
        }
        SpecLog::flush_or_close(&mut self.spec_log, logged);
        // Positions whose keys and values this step computed and kept: a rejected draft's
        // are overwritten later.
        for (i, &n) in plan.iter().enumerate() {
            self.running[i].computed += n;
        }
        for &(i, _, rejected, _) in &sampled {
            self.running[i].computed -= rejected;
        }
        let mut finished = Vec::new();
        for (i, new, _, accepted) in sampled {
            let seq = &mut self.running[i];
            // The sampled tokens, then any the grammar forces after the last (a grammar has
            // consumed the accepted drafts already; when they are all there is, nothing more).
            let consumed = accepted == new.len();
            let mut new: Vec<(u32, Option<TokenLogprobs>)> = new;
            let room = seq
                .max_tokens
                .saturating_sub(seq.generated() + new.len())
                .min(self.graph.context_length.saturating_sub(seq.tokens.len() + new.len()));
            if let (Some(c), Some(&(last, _)), false) = (seq.constraint.as_mut(), new.last(), consumed) {
                new.extend(c.advance(last, seq.fast_forward)?.into_iter().take(room).map(|t| (t, None)));
            }
            let mut reason = None;
            let n_new = new.len();
            for (k, (token, logprobs)) in new.into_iter().enumerate() {
                seq.tokens.push(token);
                events.push(SeqEvent::Token { id: seq.id, token, logprobs });
                reason = if seq.stop_ids.contains(&token) {
                    Some(FinishReason::Eos)
                } else if seq.generated() >= seq.max_tokens || seq.tokens.len() >= self.graph.context_length {
                    Some(FinishReason::Length)
                } else if k + 1 == n_new && seq.constraint.as_ref().is_some_and(Constraint::is_finished) {
                    // The grammar's state is after all of `new`: complete only at its end.
                    Some(FinishReason::Grammar)
                } else {
                    None
                };
                if reason.is_some() {
                    break;
                }
            }
            if let Some(reason) = reason {
                events.push(SeqEvent::Finished { id: seq.id, reason, usage: seq.usage() });
                finished.push(i);
            }
        }
        // Register the blocks this step filled (after the accepted drafts joined the tokens
        // they are positions of), and give back the blocks only rejected drafts used.
        let bs = self.config.block_size;
        for (i, &n) in plan.iter().enumerate() {
            let seq = &mut self.running[i];
            if n == 0 {
                continue;
            }
            while (seq.keys.len() + 1) * bs <= seq.computed {
                let j = seq.keys.len();
                let parent = seq.keys.last().copied().unwrap_or(0);
                let prompt = self.blocks.prompt_positions(j, seq.prompt_len);
                let key = self.blocks.register(seq.blocks[j], parent, &seq.tokens[j * bs..(j + 1) * bs], prompt);
                seq.keys.push(key);
            }
            let keep = self.blocks.blocks_for(seq.tokens.len()).max(seq.keys.len());
            while seq.blocks.len() > keep {
                if let Some(b) = seq.blocks.pop() {
                    self.blocks.release(b);
                }
            }
        }
        for i in finished.into_iter().rev() {
            let seq = self.running.remove(i);
            self.release(seq);
        }
        self.stats.peak_blocks_in_use = self.stats.peak_blocks_in_use.max(self.blocks.in_use());
        if let (Some(clock), Some(profiler)) = (self.clock.take(), &self.profiler) {
            clock.finish(profiler, verifies, self.last_step.ce_tokens > 0);
        }
        Ok(events)
    }

    /// Queues every request and steps until all have finished; completions in request order.
    pub fn run_all(&mut self, requests: Vec<SeqRequest>) -> Result<Vec<Completion>, RuntimeError> {
        let ids = requests.into_iter().map(|r| self.add(r)).collect::<Result<Vec<_>, _>>()?;
        let mut out: Vec<Option<Completion>> = vec![None; ids.len()];
        let mut tokens: Vec<Vec<u32>> = vec![Vec::new(); ids.len()];
        let index = |id: SeqId| ids.iter().position(|&x| x == id);
        while self.has_work() {
            for event in self.step()? {
                match event {
                    SeqEvent::Token { id, token, .. } => {
                        if let Some(i) = index(id) {
                            tokens[i].push(token);
                        }
                    }
                    SeqEvent::Finished { id, reason, usage } => {
                        if let Some(i) = index(id) {
                            out[i] = Some(Completion { id, tokens: std::mem::take(&mut tokens[i]), reason, usage });
                        }
                    }
                }
            }
        }
        Ok(out.into_iter().flatten().collect())
    }
}
