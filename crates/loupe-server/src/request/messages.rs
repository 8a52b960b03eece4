//! The `messages` array of a chat request (also what `/tokenize` takes), normalized for the
//! chat template: roles checked (`developer` is `system`), `content` as text, an assistant's
//! `tool_calls` with parsed arguments, a tool result's `tool_call_id`.

use serde_json::Value;

use super::fields::kind_of;
use crate::error::ApiError;

/// The text of a message's `content`: a string, or an array of `{"type": "text"}` parts.
fn content_text(v: Option<Value>, at: &str) -> Result<String, ApiError> {
    match v {
        None => Ok(String::new()),
        Some(Value::String(s)) => Ok(s),
        Some(Value::Array(parts)) => {
            let mut text = String::new();
            for (j, part) in parts.iter().enumerate() {
                match (part.get("type").and_then(Value::as_str), part.get("text").and_then(Value::as_str)) {
                    (Some("text"), Some(t)) => text.push_str(t),
                    (Some(kind), _) if kind != "text" => {
                        return Err(ApiError::invalid(
                            "messages",
                            format!("{at}.content[{j}] is of type '{kind}'; this model takes text parts only."),
                        ));
                    }
                    _ => {
                        return Err(ApiError::invalid(
                            "messages",
                            format!("{at}.content[{j}] must be {{\"type\": \"text\", \"text\": \"...\"}}."),
                        ))
                    }
                }
            }
            Ok(text)
        }
        Some(other) => Err(ApiError::invalid(
            "messages",
            format!("{at}.content must be a string or an array of text parts, got {}.", kind_of(&other)),
        )),
    }
}

/// An assistant message's `tool_calls`, for the template: `{"id", "type": "function",
/// "function": {"name", "arguments"}}` with the arguments (a JSON string in OpenAI's API)
/// parsed into an object, as transformers' templates expect them.
fn tool_calls(v: Value, at: &str) -> Result<Value, ApiError> {
    let bad = |m: String| ApiError::invalid("messages", format!("{at}.tool_calls{m}"));
    let Value::Array(calls) = v else { return Err(bad(" must be an array.".into())) };
    let mut out = Vec::with_capacity(calls.len());
    for (j, call) in calls.into_iter().enumerate() {
        let func = call.get("function").ok_or_else(|| bad(format!("[{j}].function is required.")))?;
        let name = func
            .get("name")
            .and_then(Value::as_str)
            .ok_or_else(|| bad(format!("[{j}].function.name must be a string.")))?;
        let arguments = match func.get("arguments") {
            Some(Value::String(s)) => serde_json::from_str::<Value>(s)
                .map_err(|e| bad(format!("[{j}].function.arguments is not JSON: {e}.")))?,
            Some(v @ Value::Object(_)) => v.clone(),
            None => serde_json::json!({}),
            Some(v) => return Err(bad(format!("[{j}].function.arguments must be a JSON string, got {}.", kind_of(v)))),
        };
        let id = call.get("id").and_then(Value::as_str).unwrap_or_default();
        out.push(serde_json::json!({"id": id, "type": "function", "function": {"name": name, "arguments": arguments}}));
    }
    Ok(Value::Array(out))
}

/// The `messages` array of a chat request (also what `/tokenize` takes).
pub fn messages(v: Option<Value>) -> Result<Vec<Value>, ApiError> {
    let Some(Value::Array(items)) = v else {
        return Err(ApiError::invalid(
            "messages",
            "'messages' is required: a non-empty array of {\"role\", \"content\"} objects.",
        ));
    };
    if items.is_empty() {
        return Err(ApiError::invalid("messages", "'messages' must not be empty."));
    }
    let mut out = Vec::with_capacity(items.len());
    for (i, item) in items.into_iter().enumerate() {
        let at = format!("messages[{i}]");
        let Value::Object(mut m) = item else {
            return Err(ApiError::invalid("messages", format!("{at} must be an object.")));
        };
        m.retain(|_, v| !v.is_null());
        let role = match m.remove("role") {
            Some(Value::String(r)) => r,
            _ => {
                return Err(ApiError::invalid(
                    "messages",
                    format!("{at}.role is required: system, developer, user or assistant."),
                ))
            }
        };
        let role = match role.as_str() {
            // Recent OpenAI SDKs send `developer` for what older ones called `system`.
            "developer" | "system" => "system",
            "user" => "user",
            "assistant" => "assistant",
            "tool" => "tool",
            other => {
                return Err(ApiError::invalid(
                    "messages",
                    format!("{at}.role '{other}' is not one of system, developer, user, assistant, tool."),
                ))
            }
        };
        let content = content_text(m.remove("content"), &at)?;
        m.remove("name");
        let mut message = serde_json::json!({"role": role, "content": content});
        if role == "assistant" {
            if let Some(calls) = m.remove("tool_calls") {
                message["tool_calls"] = tool_calls(calls, &at)?;
            }
        }
        if role == "tool" {
            match m.remove("tool_call_id") {
                Some(Value::String(id)) => message["tool_call_id"] = Value::String(id),
                _ => {
                    return Err(ApiError::invalid(
                        "messages",
                        format!("{at}.tool_call_id is required on a tool message: the id of the call it answers."),
                    ))
                }
            }
        }
        if let Some(k) = m.keys().next() {
            let what = if k == "function_call" { " (the deprecated function_call; use tool_calls)" } else { "" };
            return Err(ApiError::invalid("messages", format!("{at} has an unsupported field '{k}'{what}.")));
        }
        out.push(message);
    }
    Ok(out)
}
