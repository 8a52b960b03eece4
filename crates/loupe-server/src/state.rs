//! The state every handler shares ([`AppState`]: options, metrics, admission counters) and
//! what exists once the model is loaded ([`Ready`]), with the helpers that record a response's
//! outcome. Handlers read it; it calls no handler.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{SystemTime, UNIX_EPOCH};

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use loupe_runtime::Engine;
use loupe_text::SectionMarkers;

use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::options::ServeOptions;
use crate::worker::EngineHandle;

/// One line of the server's log, on stderr, prefixed `loupe serve: `.
pub(crate) fn log(message: impl AsRef<str>) {
    eprintln!("loupe serve: {}", message.as_ref());
}

/// What exists once the model is loaded.
pub(crate) struct Ready {
    /// How chat answers are split into `content` and `reasoning`; `None`: not at all.
    pub(crate) reasoning: Option<SectionMarkers>,
    pub(crate) engine: Arc<Engine>,
    pub(crate) handle: EngineHandle,
    /// An encoder's sentence-embedding pipeline (`/v1/embeddings`); `None` for decoders.
    pub(crate) embed: Option<loupe_runtime::EmbedConfig>,
    pub(crate) model_id: String,
    pub(crate) context: usize,
    pub(crate) created: u64,
}

pub(crate) struct AppState {
    pub(crate) options: ServeOptions,
    pub(crate) ready: OnceLock<Ready>,
    /// Embedding requests run one at a time (each is a whole encoder pass on the pool).
    pub(crate) embed_lock: Arc<Mutex<()>>,
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) in_flight: AtomicUsize,
    pub(crate) next_key: AtomicU64,
    pub(crate) shutting_down: AtomicBool,
}

impl AppState {
    pub(crate) fn limit(&self) -> usize {
        self.options.batch.max_seqs + self.options.max_queue
    }

    pub(crate) fn ready(&self) -> Result<&Ready, ApiError> {
        if self.shutting_down.load(Ordering::Relaxed) {
            return Err(ApiError::shutting_down());
        }
        self.ready.get().ok_or_else(ApiError::loading)
    }
}

pub(crate) fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

pub(crate) fn count_outcome(state: &AppState, status: StatusCode) {
    let i = if status.is_success() {
        0
    } else if status.is_client_error() {
        1
    } else {
        2
    };
    state.metrics.requests[i].add(1);
}

pub(crate) fn respond(state: &AppState, result: Result<Response, ApiError>) -> Response {
    let response = result.unwrap_or_else(|e| e.into_response());
    count_outcome(state, response.status());
    response
}
