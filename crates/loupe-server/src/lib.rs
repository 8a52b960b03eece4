//! `loupe serve`: an OpenAI-compatible HTTP server over the batched engine.
//!
//! * **Threads.** HTTP runs on a small tokio runtime; the model runs on its own engine
//!   thread ([`worker`]) and the compute pool, never on the async runtime. Handlers talk to
//!   the engine thread over channels.
//! * **Start-up.** The listener is bound first, so `GET /health` answers 503 (with an
//!   OpenAI error body) while the model loads, and 200 after; other routes answer 503
//!   until then. One log line per phase, with its time.
//! * **Routes.** `POST /v1/chat/completions`, `POST /v1/completions` (both streaming by
//!   SSE, `stream_options.include_usage`), `GET /v1/models`, `GET /health`, `GET /metrics`,
//!   `POST /tokenize`, `POST /detokenize`. Request rules live in [`request`], error bodies
//!   in [`error`], metrics in [`metrics`].
//! * **Back-pressure and lifecycle.** At most `max_seqs + max_queue` requests in flight
//!   (429 with `Retry-After` beyond), a body size cap (413), a per-request timeout (408),
//!   cancellation when the client goes away (its KV blocks are back within one step), and
//!   graceful shutdown on SIGTERM/SIGINT: stop accepting, let in-flight requests finish
//!   within `shutdown_timeout`, cancel what is left, exit 0.

// ApiError is returned once per failed request, a cold path; boxing it buys nothing.
#![allow(clippy::result_large_err)]

pub mod bench;
pub mod error;
pub mod metrics;
pub mod request;
pub mod worker;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use loupe_runtime::{BatchConfig, Engine, Usage};
use loupe_text::{Section, SectionMarkers, SectionSplitter};
use serde_json::{json, Value};
use tokio::sync::mpsc::UnboundedReceiver;

use error::ApiError;
use metrics::Metrics;
use request::{GenRequest, Input};
use worker::{EngineHandle, Job, Reply, TokenInfo};

/// How the server runs.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    pub host: String,
    /// 0: any free port (the log line and [`ServeOptions::on_listening`] give it).
    pub port: u16,
    /// Require `Authorization: Bearer <key>` on `/v1/*`, `/tokenize`, `/detokenize`.
    pub api_key: Option<String>,
    /// Drop unknown request fields with a warning instead of answering 400.
    pub allow_extra_request_fields: bool,
    /// Requests that may wait beyond the `max_seqs` running ones.
    pub max_queue: usize,
    pub max_body_bytes: usize,
    pub request_timeout: Option<Duration>,
    pub shutdown_timeout: Duration,
    /// Context window the server enforces (prompt + generated); `None`: the model's.
    pub max_context: Option<usize>,
    /// The model id clients name; `None`: the model file's stem.
    pub served_model_name: Option<String>,
    pub batch: BatchConfig,
    /// Planted fault `stream-drop-last` (`loupe serve --inject`, for testing `loupe
    /// bisect`): streamed responses hold each text delta back one chunk and drop the last.
    pub drop_last_stream_delta: bool,
    /// `--reasoning-parser`: one of [`loupe_text::REASONING_PARSERS`]; `None`: the model
    /// family's default (`loupe_models::FamilySpec::reasoning_parser`).
    pub reasoning_parser: Option<String>,
}

/// Why the server could not run.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("could not listen on {addr}: {source}")]
    Bind { addr: String, source: std::io::Error },
    #[error("could not start the HTTP runtime: {0}")]
    Runtime(std::io::Error),
    #[error("loading the model failed: {0}")]
    Load(String),
    #[error("could not start the engine: {0}")]
    Engine(String),
    #[error("the HTTP server failed: {0}")]
    Http(std::io::Error),
}

fn log(message: impl AsRef<str>) {
    eprintln!("loupe serve: {}", message.as_ref());
}

/// What exists once the model is loaded.
struct Ready {
    /// How chat answers are split into `content` and `reasoning`; `None`: not at all.
    reasoning: Option<SectionMarkers>,
    engine: Arc<Engine>,
    handle: EngineHandle,
    /// An encoder's sentence-embedding pipeline (`/v1/embeddings`); `None` for decoders.
    embed: Option<loupe_runtime::EmbedConfig>,
    model_id: String,
    context: usize,
    created: u64,
}

struct AppState {
    options: ServeOptions,
    ready: OnceLock<Ready>,
    /// Embedding requests run one at a time (each is a whole encoder pass on the pool).
    embed_lock: Arc<Mutex<()>>,
    metrics: Arc<Metrics>,
    in_flight: AtomicUsize,
    next_key: AtomicU64,
    shutting_down: AtomicBool,
}

impl AppState {
    fn limit(&self) -> usize {
        self.options.batch.max_seqs + self.options.max_queue
    }

    fn ready(&self) -> Result<&Ready, ApiError> {
        if self.shutting_down.load(Ordering::Relaxed) {
            return Err(ApiError::shutting_down());
        }
        self.ready.get().ok_or_else(ApiError::loading)
    }
}

fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// Runs the server until SIGTERM or SIGINT. `load` builds the engine (on a blocking
/// thread, while `/health` answers 503); `on_listening` is told the bound address.
pub fn serve(
    options: ServeOptions,
    load: impl FnOnce() -> Result<Engine, String> + Send + 'static,
) -> Result<(), ServeError> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("loupe-http")
        .enable_all()
        .build()
        .map_err(ServeError::Runtime)?;
    runtime.block_on(run(options, load))
}

async fn run(
    options: ServeOptions,
    load: impl FnOnce() -> Result<Engine, String> + Send + 'static,
) -> Result<(), ServeError> {
    let start = Instant::now();
    let addr = format!("{}:{}", options.host, options.port);
    let listener =
        tokio::net::TcpListener::bind(&addr).await.map_err(|source| ServeError::Bind { addr: addr.clone(), source })?;
    let local: SocketAddr = listener.local_addr().map_err(|source| ServeError::Bind { addr, source })?;
    log(format!("listening on http://{local} (GET /health answers 503 until the model is loaded)"));

    let metrics = Arc::new(Metrics::default());
    let state = Arc::new(AppState {
        options: options.clone(),
        ready: OnceLock::new(),
        embed_lock: Arc::new(Mutex::new(())),
        metrics: metrics.clone(),
        in_flight: AtomicUsize::new(0),
        next_key: AtomicU64::new(1),
        shutting_down: AtomicBool::new(false),
    });
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let failed: Arc<Mutex<Option<ServeError>>> = Arc::new(Mutex::new(None));

    // Load in the background; a failure stops the server with the error.
    {
        let state = state.clone();
        let failed = failed.clone();
        let stop_tx = stop_tx.clone();
        tokio::spawn(async move {
            let (batch, metrics) = (state.options.batch.clone(), state.metrics.clone());
            let loaded = tokio::task::spawn_blocking(move || {
                let t = Instant::now();
                let engine = load().map_err(ServeError::Load)?;
                let embed = if engine.is_encoder() {
                    Some(engine.embed_config().map_err(|e| ServeError::Load(e.to_string()))?)
                } else {
                    None
                };
                let load_time = t.elapsed();
                log(format!(
                    "phase load: {:.2} s ({}, {:?} precision, {} threads)",
                    load_time.as_secs_f64(),
                    engine.path().display(),
                    engine.precision(),
                    engine.threads()
                ));
                let engine = Arc::new(engine);
                let t = Instant::now();
                let handle = EngineHandle::spawn(engine.clone(), batch, metrics).map_err(ServeError::Engine)?;
                let kv_time = t.elapsed();
                Ok::<_, ServeError>((engine, handle, embed, load_time, kv_time))
            })
            .await;
            match loaded {
                Ok(Ok((engine, handle, embed, load_time, kv_time))) => {
                    let model_context = engine.context_length();
                    let context = state.options.max_context.map_or(model_context, |c| c.min(model_context));
                    let model_id = state.options.served_model_name.clone().unwrap_or_else(|| {
                        engine
                            .path()
                            .file_stem()
                            .map(|s| s.to_string_lossy().into_owned())
                            .unwrap_or_else(|| "model".into())
                    });
                    let m = &state.metrics;
                    m.model_load_time[0].observe(load_time.as_secs_f64() * 1e3);
                    m.model_load_time[1].observe(kv_time.as_secs_f64() * 1e3);
                    m.model_load_time[2].observe(start.elapsed().as_secs_f64() * 1e3);
                    let b = &state.options.batch;
                    log(format!(
                        "phase kv_cache: {:.2} s ({} {} blocks of {} positions, up to {} sequences, {} tokens per step, prefix cache {})",
                        kv_time.as_secs_f64(),
                        m.kv_blocks_total.get(),
                        b.kv_dtype.unwrap_or(engine.graph().kv_dtype),
                        b.block_size,
                        b.max_seqs,
                        b.max_batch_tokens,
                        if b.prefix_cache { "on" } else { "off" }
                    ));
                    let parser = state
                        .options
                        .reasoning_parser
                        .clone()
                        .unwrap_or_else(|| engine.config().family.default_reasoning_parser().into());
                    // Tool calls are not served yet, so only reasoning markers split the text.
                    let reasoning = SectionMarkers::for_reasoning_parser(&parser)
                        .filter(|m| m.reasoning.is_some())
                        .map(|m| SectionMarkers { tool_call: None, ..m });
                    log(format!("reasoning parser: {parser}"));
                    if let Some(e) = &embed {
                        log(format!(
                            "encoder: serving /v1/embeddings only ({} pooling{}, inputs cut at {} tokens)",
                            e.pooling.name(),
                            if e.normalize { ", L2-normalized" } else { "" },
                            e.max_tokens
                        ));
                    }
                    let _ = state.ready.set(Ready {
                        reasoning,
                        engine,
                        handle,
                        embed,
                        model_id: model_id.clone(),
                        context,
                        created: unix_now(),
                    });
                    log(format!(
                        "ready in {:.2} s: model '{model_id}', context {context} tokens, at most {} requests in flight",
                        start.elapsed().as_secs_f64(),
                        state.limit()
                    ));
                }
                Ok(Err(e)) => {
                    *failed.lock().unwrap_or_else(|p| p.into_inner()) = Some(e);
                    let _ = stop_tx.send(true);
                }
                Err(join) => {
                    *failed.lock().unwrap_or_else(|p| p.into_inner()) =
                        Some(ServeError::Load(format!("the loading thread failed: {join}")));
                    let _ = stop_tx.send(true);
                }
            }
        });
    }

    // Signals: stop accepting; after the grace period, cancel what is still running.
    {
        let state = state.clone();
        let stop_tx = stop_tx.clone();
        tokio::spawn(async move {
            shutdown_signal().await;
            state.shutting_down.store(true, Ordering::Relaxed);
            let grace = state.options.shutdown_timeout;
            log(format!(
                "shutting down: no new requests; {} in flight get up to {:.0} s to finish",
                state.in_flight.load(Ordering::Relaxed),
                grace.as_secs_f64()
            ));
            let _ = stop_tx.send(true);
            tokio::time::sleep(grace).await;
            if let Some(ready) = state.ready.get() {
                let left = state.in_flight.load(Ordering::Relaxed);
                if left > 0 {
                    log(format!("shutdown timeout: cancelling {left} requests"));
                }
                ready.handle.cancel_all();
            }
            // Connections that still do not close are not waited for.
            tokio::time::sleep(Duration::from_secs(5)).await;
            log("shutdown: connections still open after the timeout are dropped");
            std::process::exit(0);
        });
    }

    let app = router(state.clone());
    let mut stop_rx2 = stop_rx.clone();
    axum::serve(listener, app)
        .with_graceful_shutdown(async move {
            let _ = stop_rx2.wait_for(|&s| s).await;
        })
        .await
        .map_err(ServeError::Http)?;
    drop(stop_rx);
    if let Some(e) = failed.lock().unwrap_or_else(|p| p.into_inner()).take() {
        return Err(e);
    }
    log("stopped");
    Ok(())
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
}

fn router(state: Arc<AppState>) -> Router {
    let limit = state.options.max_body_bytes;
    let api = Router::new()
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/completions", post(completions))
        .route("/v1/embeddings", post(embeddings))
        .route("/v1/models", get(models))
        .route("/tokenize", post(tokenize))
        .route("/detokenize", post(detokenize))
        .route_layer(middleware::from_fn_with_state(state.clone(), require_api_key));
    Router::new()
        .route("/health", get(health))
        .route("/metrics", get(metrics_text))
        .merge(api)
        .fallback(|| async { ApiError::not_found("No such route. Routes: POST /v1/chat/completions, POST /v1/completions, POST /v1/embeddings, GET /v1/models, GET /health, GET /metrics, POST /tokenize, POST /detokenize.") })
        .method_not_allowed_fallback(|| async { ApiError { status: StatusCode::METHOD_NOT_ALLOWED, ..ApiError::bad_request("Method not allowed on this route.") } })
        .layer(DefaultBodyLimit::max(limit))
        .with_state(state)
}

async fn require_api_key(State(state): State<Arc<AppState>>, request: Request, next: Next) -> Response {
    if let Some(key) = &state.options.api_key {
        let given = request
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        if given != Some(key.as_str()) {
            state.metrics.requests[1].add(1);
            return ApiError::unauthorized().into_response();
        }
    }
    next.run(request).await
}

async fn health(State(state): State<Arc<AppState>>) -> Response {
    match state.ready() {
        Ok(_) => Json(json!({"status": "ok"})).into_response(),
        Err(e) => e.into_response(),
    }
}

async fn metrics_text(State(state): State<Arc<AppState>>) -> Response {
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], state.metrics.render()).into_response()
}

async fn models(State(state): State<Arc<AppState>>) -> Result<Json<Value>, ApiError> {
    let r = state.ready()?;
    Ok(Json(
        json!({"object": "list", "data": [{"id": r.model_id, "object": "model", "created": r.created, "owned_by": "loupe", "max_model_len": r.context}]}),
    ))
}

/// The body, or 413 when it is over the cap.
fn body_bytes(body: Result<Bytes, BytesRejection>, state: &AppState) -> Result<Bytes, ApiError> {
    body.map_err(|e| {
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::payload_too_large(state.options.max_body_bytes)
        } else {
            ApiError::bad_request(format!("Could not read the request body: {}", e.body_text()))
        }
    })
}

fn count_outcome(state: &AppState, status: StatusCode) {
    let i = if status.is_success() {
        0
    } else if status.is_client_error() {
        1
    } else {
        2
    };
    state.metrics.requests[i].add(1);
}

/// What `/tokenize` and `/detokenize` share: the loaded model, and the body's fields with
/// `model` checked.
fn token_route_fields(
    state: &AppState,
    body: Result<Bytes, BytesRejection>,
) -> Result<(&Ready, request::Fields), ApiError> {
    let r = state.ready()?;
    let body = body_bytes(body, state)?;
    let mut f = request::Fields::parse(&body)?;
    if let Some(m) = f.string("model")? {
        check_model(&m, r)?;
    }
    Ok((r, f))
}

/// Compiles a `response_format` grammar once here, so an invalid or unsupported schema is
/// a 400 naming the keyword and the JSON path (in the message and as `error.keyword` /
/// `error.path`), never a 200 with unconstrained text. The engine compiles it again when
/// the request is admitted (a few milliseconds; the first request also builds the token
/// environment, which takes longer, so this runs off the async workers).
fn check_grammar(r: &Ready, spec: &loupe_runtime::GrammarSpec) -> Result<(), ApiError> {
    let compiled = tokio::task::block_in_place(|| r.engine.grammars().and_then(|g| g.compile(spec).map(drop)));
    compiled.map_err(|e| {
        let mut err = ApiError::invalid("response_format", format!("{e}."));
        if let loupe_runtime::ConstraintError::Invalid { keyword, path, .. } = &e {
            if let Some(k) = keyword {
                err.extra.insert("keyword".into(), k.clone().into());
            }
            if let Some(p) = path {
                err.extra.insert("path".into(), if p.is_empty() { "/".into() } else { p.clone().into() });
            }
        }
        err
    })
}

/// Refuses ids the tokenizer does not know, naming the request field.
fn check_vocabulary(r: &Ready, ids: &[u32], param: &str) -> Result<(), ApiError> {
    let vocab = r.engine.tokenizer().vocab_size();
    match ids.iter().find(|&&t| t as usize >= vocab) {
        Some(&t) => Err(ApiError::invalid(param, format!("token id {t} is outside the vocabulary of {vocab} tokens."))),
        None => Ok(()),
    }
}

async fn tokenize(State(state): State<Arc<AppState>>, body: Result<Bytes, BytesRejection>) -> Response {
    let result = (|| {
        let (r, mut f) = token_route_fields(&state, body)?;
        let tokens = if let Some(messages) = f.take("messages") {
            let add_generation_prompt = f.bool("add_generation_prompt")?.unwrap_or(true);
            chat_tokens(r, &request::messages(Some(messages))?, None, add_generation_prompt)?
        } else {
            let prompt = f
                .string("prompt")?
                .ok_or_else(|| ApiError::invalid("prompt", "'prompt' (a string) or 'messages' is required."))?;
            let special = f.bool("add_special_tokens")?.unwrap_or(true);
            r.engine
                .tokenizer()
                .encode(&prompt, special)
                .map_err(|e| ApiError::invalid("prompt", format!("could not tokenize the prompt: {e}")))?
        };
        f.finish(state.options.allow_extra_request_fields)?;
        Ok::<_, ApiError>(
            Json(json!({"count": tokens.len(), "max_model_len": r.context, "tokens": tokens})).into_response(),
        )
    })();
    respond(&state, result)
}

async fn detokenize(State(state): State<Arc<AppState>>, body: Result<Bytes, BytesRejection>) -> Response {
    let result = (|| {
        let (r, mut f) = token_route_fields(&state, body)?;
        let bad = || ApiError::invalid("tokens", "'tokens' is required: an array of token ids.");
        let ids = match f.take("tokens") {
            Some(Value::Array(v)) => request::token_ids(&v).ok_or_else(bad)?,
            _ => return Err(bad()),
        };
        f.finish(state.options.allow_extra_request_fields)?;
        check_vocabulary(r, &ids, "tokens")?;
        let text = r.engine.tokenizer().decode(&ids, false).map_err(|_| ApiError::internal())?;
        Ok(Json(json!({"prompt": text})).into_response())
    })();
    respond(&state, result)
}

fn respond(state: &AppState, result: Result<Response, ApiError>) -> Response {
    let response = result.unwrap_or_else(|e| e.into_response());
    count_outcome(state, response.status());
    response
}

fn check_model(model: &str, r: &Ready) -> Result<(), ApiError> {
    if model == r.model_id {
        Ok(())
    } else {
        Err(ApiError::model_not_found(model, &r.model_id))
    }
}

fn chat_tokens(
    r: &Ready,
    messages: &[Value],
    tools: Option<&request::Tools>,
    add_generation_prompt: bool,
) -> Result<Vec<u32>, ApiError> {
    let template = r.engine.model().chat_template.as_ref().ok_or_else(|| {
        ApiError::invalid("messages", "This model has no chat template; use /v1/completions with a raw prompt.")
    })?;
    let messages_json = Value::Array(messages.to_vec()).to_string();
    let rendered = match tools {
        None => template.render_json(&messages_json, add_generation_prompt),
        Some(t) => {
            // A template that never reads `tools` would silently drop them (llama.cpp #27129).
            if !r.engine.tokenizer().chat_template_source().is_some_and(|s| s.contains("tools")) {
                return Err(ApiError::invalid("tools", "This model's chat template does not render tools; the request is refused rather than answered without them."));
            }
            template.render_json_with_tools(
                &messages_json,
                &Value::Array(t.list.clone()).to_string(),
                add_generation_prompt,
            )
        }
    };
    let text = rendered.map_err(|e| {
        ApiError::invalid("messages", format!("The chat template could not render these messages: {e}"))
    })?;
    r.engine.tokenizer().encode(&text, false).map_err(|e| {
        log(format!("error: encoding a rendered chat failed: {e}"));
        ApiError::internal()
    })
}

#[derive(Clone, Copy, PartialEq)]
enum Endpoint {
    Chat,
    Completion,
}

async fn embeddings(State(state): State<Arc<AppState>>, body: Result<Bytes, BytesRejection>) -> Response {
    let result = embed_request(&state, body).await.map(|v| Json(v).into_response());
    respond(&state, result)
}

/// `POST /v1/embeddings`: validates, then embeds every input on a blocking thread (the
/// engine never runs on the async runtime), one request at a time.
async fn embed_request(state: &Arc<AppState>, body: Result<Bytes, BytesRejection>) -> Result<Value, ApiError> {
    let r = state.ready()?;
    let body = body_bytes(body, state)?;
    let req = request::embeddings(&body, state.options.allow_extra_request_fields)?;
    if !req.dropped.is_empty() {
        log(format!("warning: dropped unknown request fields: {}", req.dropped.join(", ")));
    }
    if let Some(m) = &req.model {
        check_model(m, r)?;
    }
    let Some(config) = r.embed.clone() else {
        return Err(ApiError::invalid("model", format!("The model `{}` is a decoder: /v1/embeddings needs an encoder model (BERT, e.g. `loupe serve --model` an all-MiniLM-L6-v2 directory).", r.model_id)));
    };
    let hidden = r.engine.config().hidden_size;
    if let Some(d) = req.dimensions.filter(|&d| d != hidden) {
        return Err(ApiError::invalid("dimensions", format!("This model's embeddings have {hidden} dimensions; {d} would need truncation the model was not trained for.")));
    }
    let limit = state.limit();
    if state.in_flight.fetch_add(1, Ordering::Relaxed) >= limit {
        state.in_flight.fetch_sub(1, Ordering::Relaxed);
        return Err(ApiError::queue_full(limit));
    }
    struct InFlight<'a>(&'a AtomicUsize);
    impl Drop for InFlight<'_> {
        fn drop(&mut self) {
            self.0.fetch_sub(1, Ordering::Relaxed);
        }
    }
    let _in_flight = InFlight(&state.in_flight);
    let (engine, lock, inputs) = (r.engine.clone(), state.embed_lock.clone(), req.input);
    let embedded = tokio::task::spawn_blocking(move || {
        let _one_at_a_time = lock.lock().unwrap_or_else(|p| p.into_inner());
        engine.embed_all(&inputs, &config)
    })
    .await
    .map_err(|e| {
        log(format!("error: embedding thread failed: {e}"));
        ApiError::internal()
    })?;
    let embedded = embedded.map_err(|e| match e {
        loupe_runtime::RuntimeError::InvalidRequest(m) => ApiError::invalid("input", m),
        other => {
            log(format!("error: embedding failed: {other}"));
            ApiError::internal()
        }
    })?;
    let tokens: usize = embedded.iter().map(|e| e.tokens).sum();
    let data: Vec<Value> = embedded
        .into_iter()
        .enumerate()
        .map(|(i, e)| {
            let embedding = match req.encoding_format {
                request::EncodingFormat::Float => json!(e.vector),
                request::EncodingFormat::Base64 => {
                    use base64::Engine as _;
                    let bytes: Vec<u8> = e.vector.iter().flat_map(|x| x.to_le_bytes()).collect();
                    json!(base64::engine::general_purpose::STANDARD.encode(bytes))
                }
            };
            json!({"object": "embedding", "index": i, "embedding": embedding})
        })
        .collect();
    Ok(
        json!({"object": "list", "data": data, "model": r.model_id, "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}),
    )
}

async fn chat_completions(State(state): State<Arc<AppState>>, body: Result<Bytes, BytesRejection>) -> Response {
    generate(state, body, Endpoint::Chat).await
}

async fn completions(State(state): State<Arc<AppState>>, body: Result<Bytes, BytesRejection>) -> Response {
    generate(state, body, Endpoint::Completion).await
}

/// A request admitted to the engine: frees its place when dropped, and cancels its
/// sequence unless it finished (the client went away, or it timed out).
struct Admission {
    state: Arc<AppState>,
    key: u64,
    finished: bool,
}

impl Drop for Admission {
    fn drop(&mut self) {
        self.state.in_flight.fetch_sub(1, Ordering::Relaxed);
        if !self.finished {
            if let Some(r) = self.state.ready.get() {
                r.handle.cancel(self.key);
            }
        }
    }
}

/// Everything a response needs besides the replies.
struct Answer {
    admission: Admission,
    replies: UnboundedReceiver<Reply>,
    endpoint: Endpoint,
    id: String,
    model: String,
    created: u64,
    prompt_tokens: usize,
    logprobs: bool,
    include_usage: bool,
    deadline: Option<tokio::time::Instant>,
    timeout: Option<Duration>,
    /// [`ServeOptions::drop_last_stream_delta`]: the chunk held back, sent when the next
    /// delta arrives and dropped at the end.
    held: Option<Option<Value>>,
    /// Chat answers of a reasoning model or with tools: splits streamed text into
    /// `content`, `reasoning` and tool calls (docs/serving.md).
    sections: Option<SectionSplitter>,
    /// Tool calls sent so far (their `index` in streamed deltas).
    tool_calls: usize,
}

impl Drop for Answer {
    /// Replies the handler never took (the client went away) leave the buffered gauge.
    fn drop(&mut self) {
        self.replies.close();
        while let Ok(reply) = self.replies.try_recv() {
            if matches!(reply, Reply::Delta { .. } | Reply::Done { .. }) {
                self.admission.state.metrics.responses_buffered.add(-1);
            }
        }
    }
}

enum Received {
    Reply(Reply),
    Closed,
    TimedOut,
}

impl Answer {
    async fn next(&mut self) -> Received {
        let reply = match self.deadline {
            Some(d) => match tokio::time::timeout_at(d, self.replies.recv()).await {
                Ok(r) => r,
                Err(_) => return Received::TimedOut,
            },
            None => self.replies.recv().await,
        };
        match reply {
            Some(r) => {
                if let Reply::Delta { sent, .. } | Reply::Done { sent, .. } = &r {
                    let m = &self.admission.state.metrics;
                    m.responses_buffered.add(-1);
                    m.response_queue_time.observe(sent.elapsed().as_secs_f64() * 1e3);
                }
                Received::Reply(r)
            }
            None => Received::Closed,
        }
    }

    fn usage(&self, usage: &Usage) -> Value {
        json!({
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": usage.completion_tokens,
            "total_tokens": self.prompt_tokens + usage.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
        })
    }

    fn timeout_error(&self) -> ApiError {
        ApiError::timeout(self.timeout.map_or(0.0, |t| t.as_secs_f64()))
    }
}

fn failure(message: String, client: bool) -> ApiError {
    if client {
        ApiError::bad_request(message)
    } else {
        ApiError::internal()
    }
}

/// -9999 stands for a log-probability of minus infinity (JSON has no infinity); OpenAI
/// reports masked tokens the same way.
fn finite(lp: f32) -> f32 {
    if lp.is_finite() {
        lp
    } else {
        -9999.0
    }
}

fn chat_logprob(info: &TokenInfo) -> Value {
    json!({
        "token": info.token,
        "logprob": finite(info.logprob),
        "bytes": info.token.as_bytes(),
        "top_logprobs": info.top.iter().map(|(t, l)| json!({"token": t, "logprob": finite(*l), "bytes": t.as_bytes()})).collect::<Vec<_>>(),
    })
}

/// The legacy completions `logprobs` object.
#[derive(Default)]
struct CompletionLogprobs {
    tokens: Vec<String>,
    token_logprobs: Vec<f32>,
    top: Vec<serde_json::Map<String, Value>>,
    offsets: Vec<usize>,
}

impl CompletionLogprobs {
    fn push(&mut self, info: &TokenInfo, offset: usize) {
        self.tokens.push(info.token.clone());
        self.token_logprobs.push(finite(info.logprob));
        self.top.push(info.top.iter().map(|(t, l)| (t.clone(), json!(finite(*l)))).collect());
        self.offsets.push(offset);
    }

    fn to_json(&self) -> Value {
        json!({"tokens": self.tokens, "token_logprobs": self.token_logprobs, "top_logprobs": self.top, "text_offset": self.offsets})
    }
}

async fn generate(state: Arc<AppState>, body: Result<Bytes, BytesRejection>, endpoint: Endpoint) -> Response {
    let arrived = Instant::now();
    let answer = match admit(&state, body, endpoint, arrived) {
        Ok(a) => a,
        Err(e) => {
            count_outcome(&state, e.status);
            return e.into_response();
        }
    };
    let (mut answer, stream) = answer;
    // Wait for the engine to take the request, so that a refusal is still an HTTP error.
    match answer.next().await {
        Received::Reply(Reply::Admitted) => {}
        Received::Reply(Reply::Failed { message, client }) => return respond(&state, Err(failure(message, client))),
        Received::Reply(Reply::ShuttingDown) | Received::Closed => {
            return respond(&state, Err(ApiError::shutting_down()))
        }
        Received::TimedOut => return respond(&state, Err(answer.timeout_error())),
        Received::Reply(_) => return respond(&state, Err(ApiError::internal())),
    }
    if stream {
        count_outcome(&state, StatusCode::OK);
        return stream_response(answer).into_response();
    }
    let result = collect(&mut answer).await;
    respond(&state, result)
}

/// Validates, tokenizes and hands the request to the engine thread.
fn admit(
    state: &Arc<AppState>,
    body: Result<Bytes, BytesRejection>,
    endpoint: Endpoint,
    arrived: Instant,
) -> Result<(Answer, bool), ApiError> {
    let r = state.ready()?;
    if r.embed.is_some() {
        return Err(ApiError::invalid(
            "model",
            format!("The model `{}` is an encoder: this server answers POST /v1/embeddings only.", r.model_id),
        ));
    }
    let body = body_bytes(body, state)?;
    let key = state.next_key.fetch_add(1, Ordering::Relaxed);
    // Without a seed, each request draws its own (OpenAI's sampling is not reproducible
    // unless a seed is given).
    let fallback_seed = loupe_core::SplitMix64(
        key ^ (SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0)),
    )
    .next_u64();
    let allow = state.options.allow_extra_request_fields;
    let req: GenRequest = match endpoint {
        Endpoint::Chat => request::chat(&body, allow, fallback_seed)?,
        Endpoint::Completion => request::completion(&body, allow, fallback_seed)?,
    };
    if !req.dropped.is_empty() {
        log(format!("warning: dropped unknown request fields: {}", req.dropped.join(", ")));
    }
    if let Some(m) = &req.model {
        check_model(m, r)?;
    }
    let (prompt, param) = match &req.input {
        Input::Chat(messages) => (chat_tokens(r, messages, req.tools.as_ref(), true)?, "messages"),
        Input::Text(text) => (
            r.engine
                .tokenizer()
                .encode(text, true)
                .map_err(|e| ApiError::invalid("prompt", format!("could not tokenize the prompt: {e}")))?,
            "prompt",
        ),
        Input::Tokens(ids) => (ids.clone(), "prompt"),
    };
    if prompt.is_empty() {
        return Err(ApiError::invalid(param, "The prompt is empty (no tokens)."));
    }
    check_vocabulary(r, &prompt, "prompt")?;
    if prompt.len() >= r.context {
        return Err(ApiError::prompt_too_long(prompt.len(), r.context, param));
    }
    // `tool_choice` required or named: the output is tool calls, by grammar.
    let grammar = req.grammar.clone().or_else(|| req.tools.as_ref().and_then(|t| t.grammar(r.reasoning.is_some())));
    if let Some(spec) = &grammar {
        check_grammar(r, spec).map_err(|e| {
            if req.grammar.is_some() {
                e
            } else {
                ApiError { param: Some("tools".into()), ..e }
            }
        })?;
    }
    let room = r.context - prompt.len();
    let max_tokens = req.max_tokens.map_or(room, |m| m.min(room));
    // Admission: a bounded number in flight.
    let limit = state.limit();
    if state.in_flight.fetch_add(1, Ordering::Relaxed) >= limit {
        state.in_flight.fetch_sub(1, Ordering::Relaxed);
        return Err(ApiError::queue_full(limit));
    }
    let admission = Admission { state: state.clone(), key, finished: false };
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let prompt_tokens = prompt.len();
    let job = Job {
        key,
        prompt,
        max_tokens,
        sampling: req.sampling,
        stop: req.stop,
        logprobs: req.logprobs,
        ignore_eos: req.ignore_eos,
        grammar,
        arrived,
        replies: tx,
    };
    if !r.handle.submit(job) {
        return Err(ApiError::shutting_down());
    }
    let timeout = state.options.request_timeout;
    let prefix = if endpoint == Endpoint::Chat { "chatcmpl" } else { "cmpl" };
    Ok((
        Answer {
            admission,
            replies: rx,
            endpoint,
            id: format!("{prefix}-{key:016x}"),
            model: r.model_id.clone(),
            created: unix_now(),
            prompt_tokens,
            logprobs: req.logprobs.is_some(),
            include_usage: req.include_usage,
            deadline: timeout.map(|t| tokio::time::Instant::from_std(arrived + t)),
            timeout,
            held: state.options.drop_last_stream_delta.then_some(None),
            sections: match (&req.tools, endpoint) {
                // Tool calls are split out whenever tools are offered, with the reasoning
                // markers if the model reasons.
                (Some(_), Endpoint::Chat) => {
                    Some(SectionSplitter::new(r.reasoning.unwrap_or(SectionMarkers::PLAIN).with_tool_calls()))
                }
                (None, Endpoint::Chat) => r.reasoning.map(SectionSplitter::new),
                _ => None,
            },
            tool_calls: 0,
        },
        req.stream,
    ))
}

/// A whole (non-streaming) response.
async fn collect(answer: &mut Answer) -> Result<Response, ApiError> {
    let mut text = String::new();
    let mut chat_lp: Vec<Value> = Vec::new();
    let mut comp_lp = CompletionLogprobs::default();
    loop {
        match answer.next().await {
            Received::Reply(Reply::Delta { text: t, logprobs, .. }) => {
                if let Some(info) = &logprobs {
                    chat_lp.push(chat_logprob(info));
                    comp_lp.push(info, text.len());
                }
                text.push_str(&t);
            }
            Received::Reply(Reply::Done { finish, usage, .. }) => {
                answer.admission.finished = true;
                let usage_json = answer.usage(&usage);
                let (chat_message, has_calls) = message(answer.sections.take(), &text, &answer.id);
                let finish = if has_calls && finish == "stop" { "tool_calls" } else { finish };
                let body = match answer.endpoint {
                    Endpoint::Chat => json!({
                        "id": answer.id, "object": "chat.completion", "created": answer.created, "model": answer.model,
                        "choices": [{"index": 0, "message": chat_message,
                                     "logprobs": if answer.logprobs { json!({"content": chat_lp, "refusal": null}) } else { Value::Null },
                                     "finish_reason": finish}],
                        "usage": usage_json, "system_fingerprint": null,
                    }),
                    Endpoint::Completion => json!({
                        "id": answer.id, "object": "text_completion", "created": answer.created, "model": answer.model,
                        "choices": [{"index": 0, "text": text, "logprobs": if answer.logprobs { comp_lp.to_json() } else { Value::Null }, "finish_reason": finish}],
                        "usage": usage_json, "system_fingerprint": null,
                    }),
                };
                return Ok(Json(body).into_response());
            }
            Received::Reply(Reply::Failed { message, client }) => return Err(failure(message, client)),
            Received::Reply(Reply::ShuttingDown) | Received::Closed => return Err(ApiError::shutting_down()),
            Received::Reply(Reply::Admitted) => {}
            Received::TimedOut => return Err(answer.timeout_error()),
        }
    }
}

/// Where a stream is.
enum Phase {
    Start,
    Body,
    Usage(Value),
    Done,
    End,
}

/// An SSE response: chunks as the engine produces them, `data: [DONE]` at the end.
fn stream_response(answer: Answer) -> Sse<impl futures_util::Stream<Item = Result<Event, Infallible>>> {
    let start = if answer.endpoint == Endpoint::Chat { Phase::Start } else { Phase::Body };
    let stream = futures_util::stream::unfold((answer, start, 0usize), |(mut a, phase, offset)| async move {
        let event = |v: Value| Event::default().data(v.to_string());
        match phase {
            Phase::Start => {
                // Chat streams open with the assistant role, as OpenAI's do.
                let first = chunk(&a, json!({"role": "assistant", "content": ""}), Value::Null, Value::Null);
                Some((Ok(event(first)), (a, Phase::Body, offset)))
            }
            Phase::Body => loop {
                match a.next().await {
                    Received::Reply(Reply::Delta { text, logprobs, .. }) => {
                        if text.is_empty() && logprobs.is_none() {
                            continue;
                        }
                        let lp = match (&logprobs, a.endpoint) {
                            (None, _) => Value::Null,
                            (Some(info), Endpoint::Chat) => json!({"content": [chat_logprob(info)], "refusal": null}),
                            (Some(info), Endpoint::Completion) => {
                                let mut c = CompletionLogprobs::default();
                                c.push(info, offset);
                                c.to_json()
                            }
                        };
                        let next_offset = offset + text.len();
                        let delta = match a.sections.as_mut() {
                            Some(s) => match section_delta(s.push(&text), &a.id, &mut a.tool_calls) {
                                Some(d) => d,
                                None if lp.is_null() => continue,
                                None => json!({"content": ""}),
                            },
                            None => json!({"content": text}),
                        };
                        let mut body = match a.endpoint {
                            Endpoint::Chat => chunk(&a, delta, lp, Value::Null),
                            Endpoint::Completion => chunk(&a, json!(text), lp, Value::Null),
                        };
                        if let Some(held) = a.held.as_mut() {
                            // Planted fault: send the chunk before this one, keep this one.
                            match held.replace(body) {
                                Some(previous) => body = previous,
                                None => continue,
                            }
                        }
                        return Some((Ok(event(body)), (a, Phase::Body, next_offset)));
                    }
                    Received::Reply(Reply::Done { finish, usage, .. }) => {
                        a.admission.finished = true;
                        // What the section splitter still held goes out with the last chunk.
                        let mut calls = a.tool_calls;
                        let held_back = a.sections.take().and_then(|s| section_delta(s.finish(), &a.id, &mut calls));
                        let finish = if calls > 0 && finish == "stop" { "tool_calls" } else { finish };
                        let empty = if a.endpoint == Endpoint::Chat {
                            held_back.unwrap_or_else(|| json!({}))
                        } else {
                            json!("")
                        };
                        let last = chunk(&a, empty, Value::Null, json!(finish));
                        let next = if a.include_usage { Phase::Usage(a.usage(&usage)) } else { Phase::Done };
                        return Some((Ok(event(last)), (a, next, offset)));
                    }
                    Received::Reply(Reply::Admitted) => continue,
                    Received::Reply(Reply::Failed { message, client }) => {
                        return Some((Ok(event(failure(message, client).body())), (a, Phase::Done, offset)))
                    }
                    Received::Reply(Reply::ShuttingDown) | Received::Closed => {
                        return Some((Ok(event(ApiError::shutting_down().body())), (a, Phase::Done, offset)))
                    }
                    Received::TimedOut => {
                        let e = a.timeout_error().body();
                        return Some((Ok(event(e)), (a, Phase::Done, offset)));
                    }
                }
            },
            Phase::Usage(usage) => {
                let object = if a.endpoint == Endpoint::Chat { "chat.completion.chunk" } else { "text_completion" };
                let body = json!({"id": a.id, "object": object, "created": a.created, "model": a.model, "choices": [], "usage": usage});
                Some((Ok(event(body)), (a, Phase::Done, offset)))
            }
            Phase::Done => Some((Ok(Event::default().data("[DONE]")), (a, Phase::End, offset))),
            Phase::End => None,
        }
    });
    Sse::new(stream)
}

/// The answer text, the thinking and the tool calls in `parts`. A tool call whose body
/// is not `{"name": ..., "arguments": ...}` JSON stays answer text, markers included.
/// Calls get ids `call_<request>_<n>`, numbered from `first`.
fn split_answer(parts: Vec<Section>, request_id: &str, first: usize) -> (String, String, Vec<Value>) {
    let (mut content, mut reasoning, mut calls) = (String::new(), String::new(), Vec::new());
    for p in parts {
        match p {
            Section::Content(t) => content.push_str(&t),
            Section::Reasoning(t) => reasoning.push_str(&t),
            Section::ToolCall(body) => match serde_json::from_str::<Value>(body.trim()) {
                Ok(Value::Object(call)) if call.get("name").is_some_and(Value::is_string) => {
                    let arguments = call.get("arguments").cloned().unwrap_or_else(|| json!({}));
                    let n = first + calls.len();
                    let id = format!("call_{}_{n}", request_id.rsplit('-').next().unwrap_or(request_id));
                    calls.push(json!({"id": id, "type": "function", "function": {"name": call["name"], "arguments": arguments.to_string()}}));
                }
                _ => {
                    let (open, close) = loupe_text::sections::TOOL_CALL_MARKERS;
                    content.push_str(&format!("{open}{body}{close}"));
                }
            },
        }
    }
    (content, reasoning, calls)
}

/// A chat answer's `message`: with a splitter, the thinking goes to `reasoning` (present
/// only when the model thought), tool calls to `tool_calls` (content null when the answer
/// is only calls, as OpenAI's), the rest to `content`. Also says whether it holds calls.
fn message(sections: Option<SectionSplitter>, text: &str, request_id: &str) -> (Value, bool) {
    let Some(mut s) = sections else { return (json!({"role": "assistant", "content": text}), false) };
    let mut parts = s.push(text);
    parts.extend(s.finish());
    let (content, reasoning, calls) = split_answer(parts, request_id, 0);
    let has_calls = !calls.is_empty();
    let mut m = json!({"role": "assistant", "content": if has_calls && content.trim().is_empty() { Value::Null } else { json!(content) }});
    if !reasoning.is_empty() {
        m["reasoning"] = json!(reasoning);
    }
    if has_calls {
        m["tool_calls"] = Value::Array(calls);
    }
    (m, has_calls)
}

/// A streamed delta from the sections one piece of text completed: `reasoning`,
/// `content` and/or whole `tool_calls` (each with its `index`); `None` when the splitter
/// holds everything back. `calls` counts the calls sent so far.
fn section_delta(parts: Vec<Section>, request_id: &str, calls: &mut usize) -> Option<Value> {
    let (content, reasoning, new_calls) = split_answer(parts, request_id, *calls);
    let mut d = serde_json::Map::new();
    if !reasoning.is_empty() {
        d.insert("reasoning".into(), json!(reasoning));
    }
    if !content.is_empty() {
        d.insert("content".into(), json!(content));
    }
    if !new_calls.is_empty() {
        let indexed: Vec<Value> = new_calls
            .into_iter()
            .enumerate()
            .map(|(k, mut c)| {
                c["index"] = json!(*calls + k);
                c
            })
            .collect();
        *calls += indexed.len();
        d.insert("tool_calls".into(), Value::Array(indexed));
    }
    (!d.is_empty()).then_some(Value::Object(d))
}

/// One streamed chunk; `usage: null` on every chunk when usage was asked for, as OpenAI does.
fn chunk(a: &Answer, delta: Value, logprobs: Value, finish: Value) -> Value {
    let mut body = match a.endpoint {
        Endpoint::Chat => {
            json!({"id": a.id, "object": "chat.completion.chunk", "created": a.created, "model": a.model, "system_fingerprint": null,
                                 "choices": [{"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}]})
        }
        Endpoint::Completion => {
            json!({"id": a.id, "object": "text_completion", "created": a.created, "model": a.model, "system_fingerprint": null,
                                       "choices": [{"index": 0, "text": delta, "logprobs": logprobs, "finish_reason": finish}]})
        }
    };
    if a.include_usage {
        body["usage"] = Value::Null;
    }
    body
}
