//! What `loupe serve` is started with ([`ServeOptions`]) and why it can fail to run
//! ([`ServeError`]). A leaf: every other module may read these, this one reads none of them.

use std::time::Duration;

use loupe_runtime::BatchConfig;
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
    /// The shape of `GET /get_load`, for the router in front (`--load-format`).
    pub load_format: LoadFormat,
}

/// The shape of `GET /get_load`: each router parses its own and nothing in their requests
/// tells them apart (docs/deploy.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LoadFormat {
    /// SGLang's engine's: `[{"dp_rank": 0, "num_reqs", "num_waiting_reqs", "num_tokens"}]`;
    /// sglang-router's `smg` sums `num_tokens`.
    #[default]
    Sglang,
    /// vllm-router's: `{"load": N}`, requests in flight.
    Vllm,
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
