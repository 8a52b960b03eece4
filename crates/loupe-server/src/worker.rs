//! The engine thread: owns the [`BatchEngine`] and runs its steps, never on the async
//! runtime. HTTP handlers send it [`Job`]s over a channel; each job's replies (text deltas,
//! the end, or an error) go back on the job's own channel. The thread also detokenizes and
//! applies stop strings, since it holds the tokenizer, and keeps the engine-side metrics.
//!
//! Cancellation: a handler that goes away (client disconnect, timeout) sends
//! [`Command::Cancel`]; the thread takes commands before every step, so the sequence's KV
//! blocks are back within one step. A closed reply channel is treated the same way.

use std::collections::HashMap;
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::Instant;

use loupe_runtime::{
    BatchConfig, BatchEngine, Engine, FinishReason, SamplingParams, SeqEvent, SeqId, SeqRequest, StopMatcher,
    TokenLogprobs, Usage,
};
use loupe_text::{StreamDecoder, Tokenizer};
use tokio::sync::mpsc::UnboundedSender;

use crate::metrics::Metrics;

/// A token's log-probability with its text, and the most likely alternatives.
#[derive(Debug, Clone)]
pub struct TokenInfo {
    pub token: String,
    pub logprob: f32,
    pub top: Vec<(String, f32)>,
}

/// What a job's channel receives.
#[derive(Debug)]
pub enum Reply {
    /// The engine queued the request (sent before anything else).
    Admitted,
    /// New text (possibly empty while a character or stop string is incomplete) and, if
    /// asked for, the log-probabilities of the token that produced it.
    Delta { text: String, logprobs: Option<TokenInfo>, sent: Instant },
    /// The sequence ended. `finish` is OpenAI's finish reason (`stop` or `length`).
    Done { finish: &'static str, usage: Usage, sent: Instant },
    /// The engine refused the job or failed; `client` when the request itself was at
    /// fault (the message is then safe to show).
    Failed { message: String, client: bool },
    /// The server is shutting down and cancelled the job.
    ShuttingDown,
}

/// A generation request for the engine thread.
pub struct Job {
    /// The server's id for the request (for cancellation).
    pub key: u64,
    pub prompt: Vec<u32>,
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    pub stop: Vec<String>,
    pub logprobs: Option<usize>,
    /// Generate past the end-of-sequence token, up to `max_tokens`.
    pub ignore_eos: bool,
    /// Leave special tokens out of the text (`skip_special_tokens`, default true).
    pub skip_special_tokens: bool,
    /// Speculate when the server does (`speculate`, default true; tokens are the same).
    pub speculate: bool,
    /// What the output must match (validated by the handler).
    pub grammar: Option<loupe_runtime::GrammarSpec>,
    pub arrived: Instant,
    pub replies: UnboundedSender<Reply>,
}

pub enum Command {
    Add(Box<Job>),
    Cancel(u64),
    /// Cancel everything in flight, answering each with [`Reply::ShuttingDown`].
    CancelAll,
    /// Empty the prefix cache of unheld blocks; the count dropped goes back on the channel.
    ResetPrefixCache(tokio::sync::oneshot::Sender<usize>),
    Stop,
}

/// Sends commands to the engine thread; joins it on drop.
pub struct EngineHandle {
    commands: mpsc::Sender<Command>,
    thread: Option<JoinHandle<()>>,
    metrics: Arc<Metrics>,
}

impl EngineHandle {
    /// Starts the engine thread over `engine`; fails if the batched engine cannot be built
    /// (the KV cache budget holds no block, ...).
    pub fn spawn(engine: Arc<Engine>, config: BatchConfig, metrics: Arc<Metrics>) -> Result<EngineHandle, String> {
        let (tx, rx) = mpsc::channel::<Command>();
        let (ready_tx, ready_rx) = mpsc::channel::<Result<(), String>>();
        let m = metrics.clone();
        let thread = std::thread::Builder::new()
            .name("loupe-engine".into())
            .spawn(move || {
                let batch = match BatchEngine::new(&engine, config) {
                    Ok(b) => b,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e.to_string()));
                        return;
                    }
                };
                let worker = Worker {
                    batch,
                    tokenizer: engine.tokenizer(),
                    routes: HashMap::new(),
                    keys: HashMap::new(),
                    metrics: m,
                    eos_ids: engine.tokenizer().eos_ids(),
                };
                worker.sample_gauges();
                let _ = ready_tx.send(Ok(()));
                worker.run(rx);
            })
            .map_err(|e| format!("could not start the engine thread: {e}"))?;
        match ready_rx.recv() {
            Ok(Ok(())) => Ok(EngineHandle { commands: tx, thread: Some(thread), metrics }),
            Ok(Err(e)) => {
                let _ = thread.join();
                Err(e)
            }
            Err(_) => Err("the engine thread stopped while starting".into()),
        }
    }

    /// Hands a job to the engine thread; false if it has stopped.
    pub fn submit(&self, job: Job) -> bool {
        self.metrics.requests_awaiting_admission.add(1);
        let ok = self.commands.send(Command::Add(Box::new(job))).is_ok();
        if !ok {
            self.metrics.requests_awaiting_admission.add(-1);
        }
        ok
    }

    pub fn cancel(&self, key: u64) {
        let _ = self.commands.send(Command::Cancel(key));
    }

    pub fn cancel_all(&self) {
        let _ = self.commands.send(Command::CancelAll);
    }

    /// Empties the engine's prefix cache of the blocks no request holds, between two steps;
    /// the number of blocks dropped, or `None` if the engine thread has stopped.
    pub async fn reset_prefix_cache(&self) -> Option<usize> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.commands.send(Command::ResetPrefixCache(tx)).ok()?;
        rx.await.ok()
    }
}

impl Drop for EngineHandle {
    fn drop(&mut self) {
        let _ = self.commands.send(Command::Stop);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A running job's state on the engine thread.
struct Route<'t> {
    key: u64,
    replies: UnboundedSender<Reply>,
    decoder: StreamDecoder<'t>,
    stops: StopMatcher,
    stop_ids: Vec<u32>,
    arrived: Instant,
    first_token: Option<Instant>,
    generated: usize,
}

struct Worker<'e> {
    batch: BatchEngine<'e>,
    tokenizer: &'e Tokenizer,
    routes: HashMap<SeqId, Route<'e>>,
    keys: HashMap<u64, SeqId>,
    metrics: Arc<Metrics>,
    /// The model's end-of-sequence ids, every request's stop ids.
    eos_ids: Vec<u32>,
}

impl<'e> Worker<'e> {
    fn run(mut self, rx: mpsc::Receiver<Command>) {
        loop {
            // Idle: block for the next command. Busy: take what arrived, then step.
            let mut commands: Vec<Command> = Vec::new();
            if !self.batch.has_work() {
                match rx.recv() {
                    Ok(c) => commands.push(c),
                    Err(_) => return,
                }
            }
            commands.extend(rx.try_iter());
            for command in commands {
                match command {
                    Command::Add(job) => self.admit(*job),
                    Command::Cancel(key) => {
                        if let Some(id) = self.keys.remove(&key) {
                            self.batch.cancel(id);
                            self.routes.remove(&id);
                        }
                    }
                    Command::CancelAll => {
                        for (id, route) in self.routes.drain() {
                            self.batch.cancel(id);
                            let _ = route.replies.send(Reply::ShuttingDown);
                        }
                        self.keys.clear();
                    }
                    Command::ResetPrefixCache(reply) => {
                        let _ = reply.send(self.batch.reset_prefix_cache());
                    }
                    Command::Stop => return,
                }
            }
            if self.batch.has_work() {
                self.step();
            }
            self.sample_gauges();
        }
    }

    fn admit(&mut self, job: Job) {
        self.metrics.requests_awaiting_admission.add(-1);
        let stop_ids = if job.ignore_eos { Vec::new() } else { self.eos_ids.clone() };
        let request = SeqRequest {
            logprobs: job.logprobs,
            grammar: job.grammar,
            speculate: job.speculate,
            ..SeqRequest::new(job.prompt, job.max_tokens, job.sampling, stop_ids.clone())
        };
        match self.batch.add(request) {
            Ok(id) => {
                let _ = job.replies.send(Reply::Admitted);
                self.keys.insert(job.key, id);
                self.routes.insert(
                    id,
                    Route {
                        key: job.key,
                        replies: job.replies,
                        decoder: self.tokenizer.stream_decoder(job.skip_special_tokens),
                        stops: StopMatcher::new(job.stop),
                        stop_ids,
                        arrived: job.arrived,
                        first_token: None,
                        generated: 0,
                    },
                );
            }
            // Requests are validated before they get here; what is left is the request's
            // own fault (a prompt the cache cannot hold) and safe to show.
            Err(e) => {
                let _ = job.replies.send(Reply::Failed { message: e.to_string(), client: true });
            }
        }
    }

    fn send(&self, route: &Route<'_>, reply: Reply) -> bool {
        // Counted before the send, so the handler's decrement can never come first.
        self.metrics.responses_buffered.add(1);
        let sent = route.replies.send(reply).is_ok();
        if !sent {
            self.metrics.responses_buffered.add(-1);
        }
        sent
    }

    fn step(&mut self) {
        let events = match self.batch.step() {
            Ok(events) => events,
            Err(e) => {
                // A failed step fails everything in it; the detail goes to the log only.
                eprintln!("loupe serve: error: an engine step failed: {e}");
                for (id, route) in self.routes.drain() {
                    self.batch.cancel(id);
                    let _ = route.replies.send(Reply::Failed { message: e.to_string(), client: false });
                }
                self.keys.clear();
                return;
            }
        };
        let shape = self.batch.last_step();
        let m = &self.metrics;
        if shape.ce_seqs > 0 {
            m.batch_size[0].observe(shape.ce_seqs as f64);
            m.batch_input_tokens[0].observe(shape.ce_tokens as f64);
        }
        if shape.tg_seqs > 0 {
            m.batch_size[1].observe(shape.tg_seqs as f64);
            m.batch_input_tokens[1].observe(shape.tg_seqs as f64);
        }
        for event in events {
            match event {
                SeqEvent::Token { id, token, logprobs } => self.on_token(id, token, logprobs),
                SeqEvent::Finished { id, reason, usage } => self.on_finished(id, reason, usage),
            }
        }
    }

    fn token_text(&self, id: u32) -> String {
        self.tokenizer.decode(&[id], false).unwrap_or_default()
    }

    fn on_token(&mut self, id: SeqId, token: u32, logprobs: Option<TokenLogprobs>) {
        let Some(mut route) = self.routes.remove(&id) else { return };
        let now = Instant::now();
        if route.first_token.is_none() {
            route.first_token = Some(now);
            self.metrics.time_to_first_token.observe(ms(now - route.arrived));
        }
        route.generated += 1;
        self.metrics.generated_tokens.add(1);
        // The token that ends the sequence is not part of the answer, even when special
        // tokens are kept (vLLM's rule); with them skipped it decodes to nothing anyway.
        let chunk =
            if route.stop_ids.contains(&token) { String::new() } else { route.decoder.push(token).unwrap_or_default() };
        let (text, hit) = route.stops.push(&chunk);
        // The stop token (EOS) is not part of the content, so it gets no log-probability.
        let logprobs = logprobs.filter(|_| !route.stop_ids.contains(&token)).map(|lp| TokenInfo {
            token: self.token_text(token),
            logprob: lp.logprob,
            top: lp.top.iter().map(|&(t, l)| (self.token_text(t), l)).collect(),
        });
        if !self.send(&route, Reply::Delta { text, logprobs, sent: now }) {
            // The client went away: stop its sequence now.
            self.batch.cancel(id);
            self.keys.remove(&route.key);
            return;
        }
        if hit {
            let usage = self.batch.usage(id).unwrap_or_default();
            self.batch.cancel(id);
            self.finish(route, "stop", usage);
            return;
        }
        self.routes.insert(id, route);
    }

    fn on_finished(&mut self, id: SeqId, reason: FinishReason, usage: Usage) {
        let Some(mut route) = self.routes.remove(&id) else { return };
        let decoder = std::mem::replace(&mut route.decoder, self.tokenizer.stream_decoder(true));
        let rest = decoder.finish().unwrap_or_default();
        let (mut text, hit) = route.stops.push(&rest);
        if !hit {
            text.push_str(&route.stops.flush());
        }
        if !text.is_empty() {
            self.send(&route, Reply::Delta { text, logprobs: None, sent: Instant::now() });
        }
        let finish = if hit || reason != FinishReason::Length { "stop" } else { "length" };
        self.finish(route, finish, usage);
    }

    /// Ends a route: metrics, then the `Done` reply.
    fn finish(&mut self, route: Route<'_>, finish: &'static str, usage: Usage) {
        self.keys.remove(&route.key);
        self.metrics.prompt_tokens.add(usage.prompt_tokens as u64);
        self.metrics.cached_prompt_tokens.add(usage.cached_tokens as u64);
        let now = Instant::now();
        self.metrics.request_latency.observe(ms(now - route.arrived));
        if let (Some(first), true) = (route.first_token, route.generated > 1) {
            self.metrics.time_per_output_token.observe(ms(now - first) / (route.generated - 1) as f64);
        }
        self.send(&route, Reply::Done { finish, usage, sent: now });
    }

    fn sample_gauges(&self) {
        let s = self.batch.stats();
        let m = &self.metrics;
        m.requests_queued.set(s.waiting as i64);
        m.requests_running.set(s.running as i64);
        m.kv_blocks_used.set(s.blocks_in_use as i64);
        m.kv_blocks_total.set(s.blocks_total as i64);
        m.prefix_cache_queries.set((s.prefix.hit_blocks + s.prefix.miss_blocks) as i64);
        m.prefix_cache_hits.set(s.prefix.hit_blocks as i64);
        m.preemptions.set(s.preemptions as i64);
        m.sample_disk(&s.disk);
        m.sample_spec(&s.spec);
    }
}

fn ms(d: std::time::Duration) -> f64 {
    d.as_secs_f64() * 1e3
}
