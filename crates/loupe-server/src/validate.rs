//! What handlers check before anything reaches the engine: the body size, the model id, the
//! token ids against the vocabulary, a `response_format` grammar (compiled once here so a bad
//! one is a 400), and a chat rendered through the model's template into tokens.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::http::StatusCode;
use serde_json::Value;

use crate::error::ApiError;
use crate::request;
use crate::state::{log, AppState, Ready};

/// The body, or 413 when it is over the cap.
pub(crate) fn body_bytes(body: Result<Bytes, BytesRejection>, state: &AppState) -> Result<Bytes, ApiError> {
    body.map_err(|e| {
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::payload_too_large(state.options.max_body_bytes)
        } else {
            ApiError::bad_request(format!("Could not read the request body: {}", e.body_text()))
        }
    })
}

/// What `/tokenize` and `/detokenize` share: the loaded model, and the body's fields with
/// `model` checked.
pub(crate) fn token_route_fields(
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
pub(crate) fn check_grammar(r: &Ready, spec: &loupe_runtime::GrammarSpec) -> Result<(), ApiError> {
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
pub(crate) fn check_vocabulary(r: &Ready, ids: &[u32], param: &str) -> Result<(), ApiError> {
    let vocab = r.engine.tokenizer().vocab_size();
    match ids.iter().find(|&&t| t as usize >= vocab) {
        Some(&t) => Err(ApiError::invalid(param, format!("token id {t} is outside the vocabulary of {vocab} tokens."))),
        None => Ok(()),
    }
}

pub(crate) fn check_model(model: &str, r: &Ready) -> Result<(), ApiError> {
    if model == r.model_id {
        Ok(())
    } else {
        Err(ApiError::model_not_found(model, &r.model_id))
    }
}

pub(crate) fn chat_tokens(
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
