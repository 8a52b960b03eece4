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

/// How a chat is rendered: with a generation prompt (a new assistant turn, the default), or
/// neither (`add_generation_prompt: false`), or with the final message left open for the
/// model to continue (`continue_final_message`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ChatEnd {
    GenerationPrompt,
    Closed,
    ContinueFinal,
}

impl ChatEnd {
    pub(crate) fn of(add_generation_prompt: bool, continue_final_message: bool) -> ChatEnd {
        match (continue_final_message, add_generation_prompt) {
            (true, _) => ChatEnd::ContinueFinal,
            (false, true) => ChatEnd::GenerationPrompt,
            (false, false) => ChatEnd::Closed,
        }
    }
}

/// Cuts a chat rendered without a generation prompt right after the final message's
/// content, so the model continues that message. transformers' rule
/// (`apply_chat_template(continue_final_message=True)`, which vLLM and SGLang call): the
/// last occurrence of the stripped content; its leading-stripped length kept when the
/// template kept the message's trailing spaces, else its stripped length.
pub(crate) fn continue_final(rendered: &str, final_content: &str) -> Option<String> {
    let stripped = final_content.trim();
    let at = rendered.rfind(stripped)?;
    let lead_stripped = final_content.trim_start();
    let end = if rendered[at..].starts_with(lead_stripped) { at + lead_stripped.len() } else { at + stripped.len() };
    Some(rendered[..end].to_string())
}

/// A generation request's prompt as token ids, and the request field it came from: the chat
/// rendered through the template (tools and the chat's end as the request says), a text
/// encoded with the tokenizer's special tokens, or ids as given; never empty, every id in
/// the vocabulary. What `/v1/*/completions` run and what `/v1/*/completions/render` return.
pub(crate) fn request_prompt(r: &Ready, req: &request::GenRequest) -> Result<(Vec<u32>, &'static str), ApiError> {
    let (prompt, param) = match &req.input {
        request::Input::Chat(messages) => {
            let end = ChatEnd::of(req.ext.add_generation_prompt, req.ext.continue_final_message);
            (chat_tokens(r, messages, req.tools.as_ref(), end)?, "messages")
        }
        request::Input::Text(text) => (
            r.engine
                .tokenizer()
                .encode(text, true)
                .map_err(|e| ApiError::invalid("prompt", format!("could not tokenize the prompt: {e}")))?,
            "prompt",
        ),
        request::Input::Tokens(ids) => (ids.clone(), "prompt"),
    };
    if prompt.is_empty() {
        return Err(ApiError::invalid(param, "The prompt is empty (no tokens)."));
    }
    check_vocabulary(r, &prompt, "prompt")?;
    Ok((prompt, param))
}

pub(crate) fn chat_tokens(
    r: &Ready,
    messages: &[Value],
    tools: Option<&request::Tools>,
    end: ChatEnd,
) -> Result<Vec<u32>, ApiError> {
    let add_generation_prompt = end == ChatEnd::GenerationPrompt;
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
    let mut text = rendered.map_err(|e| {
        ApiError::invalid("messages", format!("The chat template could not render these messages: {e}"))
    })?;
    if end == ChatEnd::ContinueFinal {
        let last = messages.last().and_then(|m| m.get("content")).and_then(Value::as_str).ok_or_else(|| {
            ApiError::invalid(
                "continue_final_message",
                "'continue_final_message' needs a final message with text content to continue.",
            )
        })?;
        text = continue_final(&text, last).ok_or_else(|| {
            ApiError::invalid("continue_final_message", "'continue_final_message' is set but the chat template does not render the final message's content verbatim, so it cannot be continued.")
        })?;
    }
    r.engine.tokenizer().encode(&text, false).map_err(|e| {
        log(format!("error: encoding a rendered chat failed: {e}"));
        ApiError::internal()
    })
}

#[cfg(test)]
mod tests {
    use super::continue_final;

    #[test]
    fn continuing_the_final_message_cuts_after_its_content() {
        let chatml = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nThe answer is<|im_end|>\n";
        assert_eq!(
            continue_final(chatml, "The answer is").as_deref(),
            Some("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nThe answer is")
        );
        // A template that strips the message keeps the stripped length; one that keeps
        // the trailing space keeps it.
        assert_eq!(continue_final("<a>x y</a>", " x y  ").as_deref(), Some("<a>x y"));
        assert_eq!(continue_final("<a> x y  </a>", " x y  ").as_deref(), Some("<a> x y  "));
        // The last occurrence: the same words earlier in the chat are not the cut.
        assert_eq!(continue_final("<u>ok</u><a>ok</a>", "ok").as_deref(), Some("<u>ok</u><a>ok"));
        assert_eq!(continue_final("<a>other</a>", "missing"), None);
    }
}
