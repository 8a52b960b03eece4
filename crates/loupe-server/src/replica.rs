//! What the routers in front of replicas ask a worker, in the shapes they parse (measured
//! against sglang-router 0.3.2's `smg` and vllm-router 0.1.17; docs/deploy.md):
//!
//! * `GET /server_info`, `GET /get_server_info` (smg, at registration): `served_model_name`
//!   becomes the id smg's `/v1/models` lists. No `model_path`: smg loads a tokenizer from it,
//!   treating a path it cannot read as a Hugging Face repo id to download.
//! * `GET /model_info`, `GET /get_model_info` (smg): `model_type` and `architectures`.
//! * `GET /get_load` (both, under their `power_of_two` policy): smg sums `num_tokens` over a
//!   list of ranks, vllm-router reads `{"load": N}`; neither sends anything that tells them
//!   apart, so `--load-format` picks the shape ([`LoadFormat`]).
//! * `POST /v1/chat/completions/render`, `POST /v1/completions/render` (vllm-router's
//!   cache-aware policy, on every worker per request): the prompt's token ids,
//!   `{"token_ids": [...]}`, from the same parsing and template as the completion itself.
//! * `POST /flush_cache` (SGLang's name; a router fans a client's call out to every worker):
//!   as `POST /reset_prefix_cache`.
//!
//! None of these is counted in `loupe_requests_total` (they serve no completion).

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

use crate::answer::Endpoint;
use crate::error::ApiError;
use crate::options::LoadFormat;
use crate::request;
use crate::state::AppState;
use crate::validate::{body_bytes, check_model, request_prompt};

/// `GET /server_info` and `GET /get_server_info`, in SGLang's shape.
pub(crate) async fn server_info(State(state): State<Arc<AppState>>) -> Result<Json<Value>, ApiError> {
    let r = state.ready()?;
    let b = &state.options.batch;
    let m = &state.metrics;
    let kv_tokens = m.kv_blocks_total.get().max(0) as usize * b.block_size;
    Ok(Json(json!({
        "served_model_name": r.model_id,
        "version": env!("CARGO_PKG_VERSION"),
        "engine": "loupe",
        "context_length": r.context,
        "max_running_requests": b.max_seqs,
        "max_queued_requests": state.options.max_queue,
        "max_total_tokens": kv_tokens,
        "max_prefill_tokens": b.max_batch_tokens,
        "page_size": b.block_size,
        "disable_radix_cache": !b.prefix_cache,
        "tp_size": 1,
        "dp_size": 1,
        "precision": r.engine.precision().name(),
        "kv_cache_dtype": b.kv_dtype.unwrap_or(r.engine.graph().kv_dtype).to_string(),
    })))
}

/// `GET /model_info` and `GET /get_model_info`, in SGLang's shape.
pub(crate) async fn model_info(State(state): State<Arc<AppState>>) -> Result<Json<Value>, ApiError> {
    let r = state.ready()?;
    let family = r.engine.config().family();
    Ok(Json(json!({
        "served_model_name": r.model_id,
        "is_generation": r.embed.is_none(),
        "model_type": family.name(),
        "architectures": family.spec().hf_archs,
        "max_model_len": r.context,
    })))
}

/// The load a worker reports: requests running and waiting, and KV-cache tokens in use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Load {
    pub running: usize,
    pub waiting: usize,
    pub tokens: usize,
}

impl Load {
    /// The body of `GET /get_load` in `format`'s shape.
    pub(crate) fn body(self, format: LoadFormat) -> Value {
        match format {
            // SGLang's engine answers one entry per data-parallel rank; smg sums
            // `num_tokens`.
            LoadFormat::Sglang => json!([{
                "dp_rank": 0, "num_reqs": self.running + self.waiting, "num_waiting_reqs": self.waiting, "num_tokens": self.tokens,
            }]),
            // vllm-router reads an integer `load`: requests in flight here.
            LoadFormat::Vllm => json!({"load": self.running + self.waiting}),
        }
    }
}

/// `GET /get_load`.
pub(crate) async fn get_load(State(state): State<Arc<AppState>>) -> Result<Json<Value>, ApiError> {
    state.ready()?;
    let m = &state.metrics;
    let in_flight = state.in_flight.load(std::sync::atomic::Ordering::Relaxed);
    let running = (m.requests_running.get().max(0) as usize).min(in_flight);
    let load = Load {
        running,
        // Requests admitted by the HTTP side and not yet running are waiting too.
        waiting: in_flight - running,
        tokens: m.kv_blocks_used.get().max(0) as usize * state.options.batch.block_size,
    };
    Ok(Json(load.body(state.options.load_format)))
}

async fn render(state: &AppState, body: Result<Bytes, BytesRejection>, endpoint: Endpoint) -> Response {
    let result = (|| {
        let r = state.ready()?;
        let body = body_bytes(body, state)?;
        let allow = state.options.allow_extra_request_fields;
        let req = match endpoint {
            Endpoint::Chat => request::chat(&body, allow, 0)?,
            Endpoint::Completion => request::completion(&body, allow, 0)?,
        };
        if let Some(m) = &req.model {
            check_model(m, r)?;
        }
        let (ids, _) = request_prompt(r, &req)?;
        Ok::<_, ApiError>(Json(json!({"token_ids": ids, "count": ids.len(), "max_model_len": r.context})))
    })();
    result.into_response()
}

/// `POST /v1/chat/completions/render`: the chat's prompt as token ids.
pub(crate) async fn chat_render(State(state): State<Arc<AppState>>, body: Result<Bytes, BytesRejection>) -> Response {
    render(&state, body, Endpoint::Chat).await
}

/// `POST /v1/completions/render`: the prompt's token ids.
pub(crate) async fn completion_render(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    render(&state, body, Endpoint::Completion).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn load_shapes_are_the_ones_each_router_parses() {
        let load = Load { running: 2, waiting: 1, tokens: 480 };
        // smg sums the integer `num_tokens` of a list; anything else reads as -1 (idle).
        let sglang = load.body(LoadFormat::Sglang);
        let ranks = sglang.as_array().unwrap();
        assert_eq!(ranks.len(), 1);
        assert_eq!(ranks[0]["num_tokens"].as_u64(), Some(480));
        assert_eq!(ranks[0]["num_reqs"].as_u64(), Some(3));
        // vllm-router reads an integer `load` of an object.
        assert_eq!(load.body(LoadFormat::Vllm), json!({"load": 3}));
    }
}
