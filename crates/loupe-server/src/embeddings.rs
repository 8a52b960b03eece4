//! `POST /v1/embeddings`: an encoder's sentence embeddings, one request at a time on a
//! blocking thread (the engine never runs on the async runtime).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};

use crate::error::ApiError;
use crate::request;
use crate::state::{log, respond, AppState};
use crate::validate::{body_bytes, check_model};

pub(crate) async fn embeddings(State(state): State<Arc<AppState>>, body: Result<Bytes, BytesRejection>) -> Response {
    let result = embed_request(&state, body).await.map(|v| Json(v).into_response());
    respond(&state, result)
}

/// `POST /v1/embeddings`: validates, then embeds every input on a blocking thread (the
/// engine never runs on the async runtime), one request at a time.
pub(crate) async fn embed_request(
    state: &Arc<AppState>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Value, ApiError> {
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
    let hidden = r.engine.config().hidden_size();
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
