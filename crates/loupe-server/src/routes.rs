//! The route table ([`router`]) and the small handlers: the API-key check, `/health`,
//! `/metrics`, `/v1/models`, `/tokenize`, `/detokenize`. Generation lives in [`crate::generate`],
//! embeddings in [`crate::embeddings`].

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};

use crate::embeddings::embeddings;
use crate::error::ApiError;
use crate::generate::{chat_completions, completions};
use crate::replica;
use crate::request;
use crate::state::AppState;
use crate::validate::{chat_tokens, check_vocabulary, token_route_fields, ChatEnd};

pub(crate) fn router(state: Arc<AppState>) -> Router {
    let limit = state.options.max_body_bytes;
    let api = Router::new()
        .route("/v1/chat/completions", post(chat_completions))
        .route("/v1/completions", post(completions))
        .route("/v1/embeddings", post(embeddings))
        .route("/v1/models", get(models))
        .route("/tokenize", post(tokenize))
        .route("/detokenize", post(detokenize))
        .route("/reset_prefix_cache", post(reset_prefix_cache))
        .route("/flush_cache", post(reset_prefix_cache).get(reset_prefix_cache))
        .route("/v1/chat/completions/render", post(replica::chat_render))
        .route("/v1/completions/render", post(replica::completion_render))
        .route_layer(middleware::from_fn_with_state(state.clone(), require_api_key));
    Router::new()
        .route("/health", get(health))
        .route("/metrics", get(metrics_text))
        .route("/server_info", get(replica::server_info))
        .route("/get_server_info", get(replica::server_info))
        .route("/model_info", get(replica::model_info))
        .route("/get_model_info", get(replica::model_info))
        .route("/get_load", get(replica::get_load))
        .merge(api)
        .fallback(|| async { ApiError::not_found("No such route. Routes: POST /v1/chat/completions, POST /v1/completions, POST /v1/embeddings, GET /v1/models, GET /health, GET /metrics, POST /tokenize, POST /detokenize, POST /reset_prefix_cache, POST /flush_cache; for routers: GET /server_info, GET /model_info, GET /get_load, POST /v1/chat/completions/render, POST /v1/completions/render.") })
        .method_not_allowed_fallback(|| async { ApiError { status: StatusCode::METHOD_NOT_ALLOWED, ..ApiError::bad_request("Method not allowed on this route.") } })
        .layer(DefaultBodyLimit::max(limit))
        .with_state(state)
}

pub(crate) async fn require_api_key(State(state): State<Arc<AppState>>, request: Request, next: Next) -> Response {
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

pub(crate) async fn health(State(state): State<Arc<AppState>>) -> Response {
    match state.ready() {
        Ok(_) => Json(json!({"status": "ok"})).into_response(),
        Err(e) => e.into_response(),
    }
}

/// `POST /reset_prefix_cache` (vLLM's and MAX's name; `max benchmark` calls it before a
/// run) and `/flush_cache` (SGLang's, which routers fan out to every worker): empties the prefix cache of the blocks no running request holds, so a benchmark
/// measures a cold cache. Answers 200 with how many blocks were dropped. Not counted as a
/// request in the metrics (it serves no completion).
pub(crate) async fn reset_prefix_cache(State(state): State<Arc<AppState>>) -> Response {
    let r = match state.ready() {
        Ok(r) => r,
        Err(e) => return e.into_response(),
    };
    match r.handle.reset_prefix_cache().await {
        Some(dropped) => Json(json!({"status": "ok", "dropped_blocks": dropped})).into_response(),
        None => ApiError::shutting_down().into_response(),
    }
}

pub(crate) async fn metrics_text(State(state): State<Arc<AppState>>) -> Response {
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], state.metrics.render()).into_response()
}

pub(crate) async fn models(State(state): State<Arc<AppState>>) -> Result<Json<Value>, ApiError> {
    let r = state.ready()?;
    Ok(Json(
        json!({"object": "list", "data": [{"id": r.model_id, "object": "model", "created": r.created, "owned_by": "loupe", "max_model_len": r.context}]}),
    ))
}

pub(crate) async fn tokenize(State(state): State<Arc<AppState>>, body: Result<Bytes, BytesRejection>) -> Response {
    let result = (|| {
        let (r, mut f) = token_route_fields(&state, body)?;
        let tokens = if let Some(messages) = f.take("messages") {
            let continue_final_message = f.bool("continue_final_message")?.unwrap_or(false);
            let add_generation_prompt = f.bool("add_generation_prompt")?.unwrap_or(!continue_final_message);
            chat_tokens(
                r,
                &request::messages(Some(messages))?,
                None,
                ChatEnd::of(add_generation_prompt, continue_final_message),
            )?
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
    // Not counted in loupe_requests_total: it serves no completion (vllm-router calls it on
    // every worker for every request it routes by prefix).
    result.unwrap_or_else(|e| e.into_response())
}

pub(crate) async fn detokenize(State(state): State<Arc<AppState>>, body: Result<Bytes, BytesRejection>) -> Response {
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
    result.unwrap_or_else(|e| e.into_response())
}
