//! `tools`, `tool_choice` and `parallel_tool_calls` of a chat request: OpenAI's rules for
//! tool objects, and the grammar a forced choice imposes on the output.

use loupe_runtime::GrammarSpec;
use serde_json::Value;

use super::fields::{kind_of, Fields};
use crate::error::ApiError;

/// Which tool calls a request asks for.
#[derive(Debug, Clone, PartialEq)]
pub enum ToolChoice {
    /// The model may call tools or answer.
    Auto,
    /// The model must call at least one tool (constrained by a grammar).
    Required,
    /// The model must call this tool (constrained by a grammar).
    Named(String),
}

/// A request's tools: the OpenAI tool objects (what the chat template renders), the
/// choice, and whether several calls may come in one answer (`parallel_tool_calls`).
#[derive(Debug, Clone, PartialEq)]
pub struct Tools {
    pub list: Vec<Value>,
    pub choice: ToolChoice,
    pub parallel: bool,
}

impl Tools {
    /// The function names, in order.
    pub fn names(&self) -> Vec<&str> {
        self.list.iter().filter_map(|t| t["function"]["name"].as_str()).collect()
    }

    /// The output grammar that `required` or a named choice imposes (`None` for `auto`):
    /// [`loupe_runtime::constraint::tool_call_grammar`] over the chosen functions, with a
    /// thinking block allowed before each call when the model reasons (`think`).
    pub fn grammar(&self, think: bool) -> Option<GrammarSpec> {
        let names: Vec<&str> = match &self.choice {
            ToolChoice::Auto => return None,
            ToolChoice::Required => self.names(),
            ToolChoice::Named(n) => vec![n.as_str()],
        };
        let functions: Vec<(&str, Value)> = self
            .list
            .iter()
            .filter_map(|t| {
                let name = t["function"]["name"].as_str().filter(|n| names.contains(n))?;
                Some((
                    name,
                    t["function"].get("parameters").cloned().unwrap_or_else(|| serde_json::json!({"type": "object"})),
                ))
            })
            .collect();
        Some(loupe_runtime::constraint::tool_call_grammar(&functions, self.parallel, think))
    }
}

/// OpenAI's rule for function names.
pub(super) fn valid_function_name(name: &str) -> bool {
    (1..=64).contains(&name.len()) && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// `tools`, `tool_choice` and `parallel_tool_calls` of a chat request.
pub(super) fn tools(f: &mut Fields) -> Result<Option<Tools>, ApiError> {
    let parallel = f.bool("parallel_tool_calls")?.unwrap_or(true);
    let bad = |param: &str, m: String| ApiError::invalid(param, m);
    let list = match f.take("tools") {
        None => Vec::new(),
        Some(Value::Array(list)) => list,
        Some(v) => return Err(bad("tools", format!("'tools' must be an array, got {}.", kind_of(&v)))),
    };
    for (i, t) in list.iter().enumerate() {
        if t.get("type").and_then(Value::as_str) != Some("function") {
            return Err(bad("tools", format!("tools[{i}].type must be \"function\".")));
        }
        let func = t
            .get("function")
            .and_then(Value::as_object)
            .ok_or_else(|| bad("tools", format!("tools[{i}].function must be an object.")))?;
        match func.get("name").and_then(Value::as_str) {
            Some(n) if valid_function_name(n) => {}
            _ => {
                return Err(bad("tools", format!("tools[{i}].function.name must be 1-64 letters, digits, '_' or '-'.")))
            }
        }
        if func.get("parameters").is_some_and(|p| !p.is_object()) {
            return Err(bad("tools", format!("tools[{i}].function.parameters must be a JSON schema object.")));
        }
    }
    let names: Vec<&str> = list.iter().filter_map(|t| t["function"]["name"].as_str()).collect();
    if let Some(dup) = names.iter().enumerate().find(|(i, n)| names[..*i].contains(n)).map(|(_, n)| *n) {
        return Err(bad("tools", format!("two tools are named '{dup}'.")));
    }
    let choice = match f.take("tool_choice") {
        None => (!list.is_empty()).then_some(ToolChoice::Auto),
        Some(Value::String(s)) if s == "none" => None,
        Some(Value::String(s)) if s == "auto" => (!list.is_empty()).then_some(ToolChoice::Auto),
        Some(Value::String(s)) if s == "required" => Some(ToolChoice::Required),
        Some(v) => match v.get("function").and_then(|f| f.get("name")).and_then(Value::as_str) {
            Some(name) if v.get("type").and_then(Value::as_str) == Some("function") => Some(ToolChoice::Named(name.to_string())),
            _ => return Err(bad("tool_choice", "'tool_choice' must be \"none\", \"auto\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": ...}}.".into())),
        },
    };
    let Some(choice) = choice else { return Ok(None) };
    match &choice {
        _ if list.is_empty() => return Err(bad("tool_choice", "'tool_choice' needs 'tools'.".into())),
        ToolChoice::Named(n) if !names.contains(&n.as_str()) => {
            return Err(bad(
                "tool_choice",
                format!("'tool_choice' names '{n}', which is not among the tools ({}).", names.join(", ")),
            ))
        }
        _ => {}
    }
    Ok(Some(Tools { list, choice, parallel }))
}
