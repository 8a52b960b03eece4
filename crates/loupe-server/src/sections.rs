//! A chat answer's text split into `content`, `reasoning` and `tool_calls`, whole
//! ([`message`]) or as streamed deltas ([`section_delta`]). A leaf: text in, JSON out.

use loupe_text::{Section, SectionSplitter};
use serde_json::{json, Value};

/// The answer text, the thinking and the tool calls in `parts`. A tool call whose body
/// is not `{"name": ..., "arguments": ...}` JSON stays answer text, markers included.
/// Calls get ids `call_<request>_<n>`, numbered from `first`.
pub(crate) fn split_answer(parts: Vec<Section>, request_id: &str, first: usize) -> (String, String, Vec<Value>) {
    let (mut content, mut reasoning, mut calls) = (String::new(), String::new(), Vec::new());
    for p in parts {
        match p {
            Section::Content(t) => content.push_str(&t),
            Section::Reasoning(t) => reasoning.push_str(&t),
            Section::ToolCall(body) => match serde_json::from_str::<Value>(body.trim()) {
                Ok(Value::Object(call)) if call.get("name").is_some_and(Value::is_string) => {
                    let arguments = call.get("arguments").cloned().unwrap_or_else(|| json!({}));
                    let n = first + calls.len();
                    let id = format!("call_{}_{n}", request_id.rsplit('-').next().unwrap_or(request_id));
                    calls.push(json!({"id": id, "type": "function", "function": {"name": call["name"], "arguments": arguments.to_string()}}));
                }
                _ => {
                    let (open, close) = loupe_text::sections::TOOL_CALL_MARKERS;
                    content.push_str(&format!("{open}{body}{close}"));
                }
            },
        }
    }
    (content, reasoning, calls)
}

/// A chat answer's `message`: with a splitter, the thinking goes to `reasoning` (present
/// only when the model thought and `include_reasoning`), tool calls to `tool_calls` (content null when the answer
/// is only calls, as OpenAI's), the rest to `content`. Also says whether it holds calls.
pub(crate) fn message(
    sections: Option<SectionSplitter>,
    text: &str,
    request_id: &str,
    include_reasoning: bool,
) -> (Value, bool) {
    let Some(mut s) = sections else { return (json!({"role": "assistant", "content": text}), false) };
    let mut parts = s.push(text);
    parts.extend(s.finish());
    let (content, reasoning, calls) = split_answer(parts, request_id, 0);
    let has_calls = !calls.is_empty();
    let mut m = json!({"role": "assistant", "content": if has_calls && content.trim().is_empty() { Value::Null } else { json!(content) }});
    if include_reasoning && !reasoning.is_empty() {
        m["reasoning"] = json!(reasoning);
    }
    if has_calls {
        m["tool_calls"] = Value::Array(calls);
    }
    (m, has_calls)
}

/// A streamed delta from the sections one piece of text completed: `reasoning` (when
/// `include_reasoning`), `content` and/or whole `tool_calls` (each with its `index`); `None`
/// when the splitter holds everything back. `calls` counts the calls sent so far.
pub(crate) fn section_delta(
    parts: Vec<Section>,
    request_id: &str,
    calls: &mut usize,
    include_reasoning: bool,
) -> Option<Value> {
    let (content, reasoning, new_calls) = split_answer(parts, request_id, *calls);
    let mut d = serde_json::Map::new();
    if include_reasoning && !reasoning.is_empty() {
        d.insert("reasoning".into(), json!(reasoning));
    }
    if !content.is_empty() {
        d.insert("content".into(), json!(content));
    }
    if !new_calls.is_empty() {
        let indexed: Vec<Value> = new_calls
            .into_iter()
            .enumerate()
            .map(|(k, mut c)| {
                c["index"] = json!(*calls + k);
                c
            })
            .collect();
        *calls += indexed.len();
        d.insert("tool_calls".into(), Value::Array(indexed));
    }
    (!d.is_empty()).then_some(Value::Object(d))
}
