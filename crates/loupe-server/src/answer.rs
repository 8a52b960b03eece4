//! A generation request once admitted: its place in the admission count ([`Admission`]),
//! its reply channel and response fields ([`Answer`]), and the JSON pieces both the whole and
//! the streamed responses are made of (log-probabilities, chunks). Read by
//! [`crate::generate`] and [`crate::stream`]; calls neither.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use loupe_runtime::Usage;
use loupe_text::SectionSplitter;
use serde_json::{json, Value};
use tokio::sync::mpsc::UnboundedReceiver;

use crate::error::ApiError;
use crate::state::AppState;
use crate::worker::{Reply, TokenInfo};

#[derive(Clone, Copy, PartialEq)]
pub(crate) enum Endpoint {
    Chat,
    Completion,
}

/// A request admitted to the engine: frees its place when dropped, and cancels its
/// sequence unless it finished (the client went away, or it timed out).
pub(crate) struct Admission {
    pub(crate) state: Arc<AppState>,
    pub(crate) key: u64,
    pub(crate) finished: bool,
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
pub(crate) struct Answer {
    pub(crate) admission: Admission,
    pub(crate) replies: UnboundedReceiver<Reply>,
    pub(crate) endpoint: Endpoint,
    pub(crate) id: String,
    pub(crate) model: String,
    pub(crate) created: u64,
    pub(crate) prompt_tokens: usize,
    pub(crate) logprobs: bool,
    pub(crate) include_usage: bool,
    pub(crate) deadline: Option<tokio::time::Instant>,
    pub(crate) timeout: Option<Duration>,
    /// [`ServeOptions::drop_last_stream_delta`]: the chunk held back, sent when the next
    /// delta arrives and dropped at the end.
    pub(crate) held: Option<Option<Value>>,
    /// Chat answers of a reasoning model or with tools: splits streamed text into
    /// `content`, `reasoning` and tool calls (docs/serving.md).
    pub(crate) sections: Option<SectionSplitter>,
    /// Whether a chat answer's thinking is sent (`include_reasoning`, default true).
    pub(crate) include_reasoning: bool,
    /// Tool calls sent so far (their `index` in streamed deltas).
    pub(crate) tool_calls: usize,
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

pub(crate) enum Received {
    Reply(Reply),
    Closed,
    TimedOut,
}

impl Answer {
    pub(crate) async fn next(&mut self) -> Received {
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

    pub(crate) fn usage(&self, usage: &Usage) -> Value {
        json!({
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": usage.completion_tokens,
            "total_tokens": self.prompt_tokens + usage.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
        })
    }

    pub(crate) fn timeout_error(&self) -> ApiError {
        ApiError::timeout(self.timeout.map_or(0.0, |t| t.as_secs_f64()))
    }
}

pub(crate) fn failure(message: String, client: bool) -> ApiError {
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

pub(crate) fn chat_logprob(info: &TokenInfo) -> Value {
    json!({
        "token": info.token,
        "logprob": finite(info.logprob),
        "bytes": info.token.as_bytes(),
        "top_logprobs": info.top.iter().map(|(t, l)| json!({"token": t, "logprob": finite(*l), "bytes": t.as_bytes()})).collect::<Vec<_>>(),
    })
}

/// The legacy completions `logprobs` object.
#[derive(Default)]
pub(crate) struct CompletionLogprobs {
    pub(crate) tokens: Vec<String>,
    pub(crate) token_logprobs: Vec<f32>,
    pub(crate) top: Vec<serde_json::Map<String, Value>>,
    pub(crate) offsets: Vec<usize>,
}

impl CompletionLogprobs {
    pub(crate) fn push(&mut self, info: &TokenInfo, offset: usize) {
        self.tokens.push(info.token.clone());
        self.token_logprobs.push(finite(info.logprob));
        self.top.push(info.top.iter().map(|(t, l)| (t.clone(), json!(finite(*l)))).collect());
        self.offsets.push(offset);
    }

    pub(crate) fn to_json(&self) -> Value {
        json!({"tokens": self.tokens, "token_logprobs": self.token_logprobs, "top_logprobs": self.top, "text_offset": self.offsets})
    }
}

/// One streamed chunk; `usage: null` on every chunk when usage was asked for, as OpenAI does.
pub(crate) fn chunk(a: &Answer, delta: Value, logprobs: Value, finish: Value) -> Value {
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
