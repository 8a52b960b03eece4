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
//!   `POST /tokenize`, `POST /detokenize`, `POST /reset_prefix_cache`; for the routers in
//!   front of replicas ([`replica`]): `/server_info`, `/model_info` (and their `/get_`
//!   names), `/get_load`, `POST /v1/chat/completions/render`, `POST /v1/completions/render`,
//!   `/flush_cache`. Request rules live in [`request`], error bodies in [`error`], metrics
//!   in [`metrics`].
//! * **Back-pressure and lifecycle.** At most `max_seqs + max_queue` requests in flight
//!   (429 with `Retry-After` beyond), a body size cap (413), a per-request timeout (408),
//!   cancellation when the client goes away (its KV blocks are back within one step), and
//!   graceful shutdown on SIGTERM/SIGINT: stop accepting, let in-flight requests finish
//!   within `shutdown_timeout`, cancel what is left, exit 0.
//!
//! Modules, callers above what they call (no two import each other): `startup` (bind, load,
//! signals) → `routes` (the route table, small handlers) → `generate` (chat and completions),
//! `replica` (what routers ask a worker) and `embeddings` → `stream` (SSE) → `answer` (an admitted request, its JSON pieces) and
//! `sections` (content / reasoning / tool calls) → `validate` (checks every route shares) →
//! `state` (shared state, outcome counting) → `options`, [`worker`], [`metrics`], [`error`];
//! [`request`] parses bodies (its `fields` leaf below `tools`, `messages`, `embeddings`).

// ApiError is returned once per failed request, a cold path; boxing it buys nothing.
#![allow(clippy::result_large_err)]

mod answer;
mod embeddings;
pub mod error;
mod generate;
pub mod metrics;
mod options;
mod replica;
pub mod request;
mod routes;
mod sections;
mod startup;
mod state;
mod stream;
mod validate;
pub mod worker;

pub use options::{LoadFormat, ServeError, ServeOptions};
pub use startup::serve;
