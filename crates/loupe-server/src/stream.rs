//! The SSE response of a streamed generation: chunks as the engine produces them (a chat
//! stream opens with the assistant role), the usage chunk when asked for, `data: [DONE]`.

use std::convert::Infallible;

use axum::response::sse::{Event, Sse};
use serde_json::{json, Value};

use crate::answer::{chat_logprob, chunk, failure, Answer, CompletionLogprobs, Endpoint, Received};
use crate::error::ApiError;
use crate::sections::section_delta;
use crate::worker::Reply;

/// Where a stream is.
pub(crate) enum Phase {
    Start,
    Body,
    Usage(Value),
    Done,
    End,
}

/// An SSE response: chunks as the engine produces them, `data: [DONE]` at the end.
pub(crate) fn stream_response(answer: Answer) -> Sse<impl futures_util::Stream<Item = Result<Event, Infallible>>> {
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
                            Some(s) => {
                                match section_delta(s.push(&text), &a.id, &mut a.tool_calls, a.include_reasoning) {
                                    Some(d) => d,
                                    None if lp.is_null() => continue,
                                    None => json!({"content": ""}),
                                }
                            }
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
                        let held_back = a
                            .sections
                            .take()
                            .and_then(|s| section_delta(s.finish(), &a.id, &mut calls, a.include_reasoning));
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
