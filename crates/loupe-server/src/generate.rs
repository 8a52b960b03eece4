//! `POST /v1/chat/completions` and `POST /v1/completions`: validate and tokenize the request,
//! admit it (429 past `max_seqs + max_queue`), hand it to the engine thread, then answer it
//! whole ([`collect`]) or as a stream ([`crate::stream`]).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use loupe_text::{SectionMarkers, SectionSplitter};
use serde_json::{json, Value};

use crate::answer::{chat_logprob, failure, Admission, Answer, CompletionLogprobs, Endpoint, Received};
use crate::error::ApiError;
use crate::request::{self, GenRequest};
use crate::sections::message;
use crate::state::{count_outcome, log, respond, unix_now, AppState};
use crate::stream::stream_response;
use crate::validate::{body_bytes, check_grammar, check_model, request_prompt};
use crate::worker::{Job, Reply};

pub(crate) async fn chat_completions(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    generate(state, body, Endpoint::Chat).await
}

pub(crate) async fn completions(State(state): State<Arc<AppState>>, body: Result<Bytes, BytesRejection>) -> Response {
    generate(state, body, Endpoint::Completion).await
}

pub(crate) async fn generate(
    state: Arc<AppState>,
    body: Result<Bytes, BytesRejection>,
    endpoint: Endpoint,
) -> Response {
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
pub(crate) fn admit(
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
    let (prompt, param) = request_prompt(r, &req)?;
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
    // `separate_reasoning: false` (SGLang's) leaves the thinking in `content`.
    let reasoning = r.reasoning.filter(|_| req.ext.separate_reasoning);
    req.ext.check_reasoning(req.stream, reasoning.is_some())?;
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
        skip_special_tokens: req.ext.skip_special_tokens,
        speculate: req.ext.speculate,
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
                // markers if the model reasons (and the request did not turn that off).
                (Some(_), Endpoint::Chat) => {
                    Some(SectionSplitter::new(reasoning.unwrap_or(SectionMarkers::PLAIN).with_tool_calls()))
                }
                (None, Endpoint::Chat) => reasoning.map(SectionSplitter::new),
                _ => None,
            },
            include_reasoning: req.ext.include_reasoning,
            tool_calls: 0,
        },
        req.stream,
    ))
}

/// A whole (non-streaming) response.
pub(crate) async fn collect(answer: &mut Answer) -> Result<Response, ApiError> {
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
                let (chat_message, has_calls) =
                    message(answer.sections.take(), &text, &answer.id, answer.include_reasoning);
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
