//! Chat templates rendered the way transformers' `apply_chat_template(..., tokenize=False)`
//! renders them (`transformers/utils/chat_template_utils.py`, `_compile_jinja_template` and
//! `render_jinja_template`).
//!
//! What transformers sets up, and how it is mirrored on minijinja:
//! - `trim_blocks=True`, `lstrip_blocks=True`, no autoescape, the trailing newline of the source
//!   dropped (Jinja's default), `loopcontrols` (`{% break %}`): same settings here.
//! - `tojson` is Python's `json.dumps(ensure_ascii=False, ...)`: [`crate::pyjson`].
//! - globals `raise_exception(msg)` (→ [`TextError::TemplateRaised`]) and `strftime_now(fmt)`.
//! - Python methods on strings/dicts/lists (`.strip()`, `.items()`, ...): minijinja-contrib's
//!   `pycompat`.
//! - `{% generation %}` (transformers' assistant-mask extension) renders its body unchanged; it is
//!   rewritten to an always-true `{% if %}` block, which keeps the block-tag whitespace rules.
//! - The context: `messages`, `tools=None`, `documents=None`, `add_generation_prompt`, then the
//!   tokenizer's special tokens (`bos_token`, `eos_token`, ...) and caller variables.
//! - Values print as Python prints them: `None`, `True`, `False`.
//! - Messages: keys whose value is null are dropped, and reasoning under any of
//!   `reasoning_content`/`thinking`/`reasoning` is copied to `thinking` and `reasoning_content`.

use minijinja::value::{Kwargs, ValueKind};
use minijinja::{AutoEscape, Environment, Error, ErrorKind, Value};
use serde::{Deserialize, Serialize};

use crate::error::{Result, TextError};
use crate::pyjson;
use crate::strftime;

/// One chat message. `role` is usually "system", "user" or "assistant".
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self { role: role.into(), content: content.into() }
    }
    pub fn system(content: impl Into<String>) -> Self {
        Self::new("system", content)
    }
    pub fn user(content: impl Into<String>) -> Self {
        Self::new("user", content)
    }
    pub fn assistant(content: impl Into<String>) -> Self {
        Self::new("assistant", content)
    }
}

const TEMPLATE_NAME: &str = "chat_template";
/// Prefix that marks errors raised by the template's own `raise_exception`.
const RAISED: &str = "\u{0}loupe-raise_exception\u{0}";
/// Names a message's reasoning is passed under; the first is the one templates read.
const REASONING_FIELDS: [&str; 3] = ["reasoning_content", "thinking", "reasoning"];

/// A compiled chat template plus the variables transformers passes to it.
pub struct ChatTemplate {
    env: Environment<'static>,
    vars: Vec<(String, Value)>,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.vars.iter().map(|(k, _)| k.as_str()).collect();
        f.debug_struct("ChatTemplate").field("vars", &names).finish()
    }
}

impl ChatTemplate {
    /// Compiles `source` (a Jinja chat template) with `bos_token`/`eos_token` as variables.
    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> Result<Self> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_keep_trailing_newline(false);
        env.set_auto_escape_callback(|_| AutoEscape::None);
        env.set_unknown_method_callback(python_method);
        env.add_filter("trim", |value: String, chars: Option<String>| -> String {
            match chars {
                Some(chars) => value.trim_matches(|c| chars.contains(c)).to_owned(),
                None => value.trim_matches(py_isspace).to_owned(),
            }
        });
        env.set_formatter(|out, state, value| match value.kind() {
            ValueKind::None => out.write_str("None").map_err(Error::from),
            ValueKind::Bool => out.write_str(if value.is_true() { "True" } else { "False" }).map_err(Error::from),
            _ => minijinja::escape_formatter(out, state, value),
        });
        env.add_filter("tojson", |value: Value, kwargs: Kwargs| -> std::result::Result<String, Error> {
            let options = pyjson::DumpOptions::from_kwargs(&kwargs)?;
            pyjson::dumps(&value, &options)
        });
        env.add_function("raise_exception", |message: Value| -> std::result::Result<Value, Error> {
            let text = message.as_str().map(str::to_owned).unwrap_or_else(|| message.to_string());
            Err(Error::new(ErrorKind::InvalidOperation, format!("{RAISED}{text}")))
        });
        env.add_function("strftime_now", |format: String| -> String {
            strftime::strftime(&format, &strftime::DateTime::now_utc())
        });
        env.add_template_owned(TEMPLATE_NAME, rewrite_generation_tags(source))
            .map_err(|e| TextError::TemplateSyntax { message: describe(&e) })?;
        let vars =
            vec![("bos_token".to_owned(), Value::from(bos_token)), ("eos_token".to_owned(), Value::from(eos_token))];
        Ok(Self { env, vars })
    }

    /// Sets (or replaces) a template variable, like the extra keyword arguments of
    /// `apply_chat_template` (`enable_thinking=False`, `tools=[...]`, `date_string=...`).
    pub fn set_var<T: Serialize>(&mut self, name: impl Into<String>, value: T) {
        let name = name.into();
        let value = Value::from_serialize(value);
        match self.vars.iter_mut().find(|(k, _)| *k == name) {
            Some(slot) => slot.1 = value,
            None => self.vars.push((name, value)),
        }
    }

    /// Sets a variable from JSON text, keeping object key order as Python would (a
    /// `serde_json::Value` passed to [`Self::set_var`] has its keys sorted). For OpenAI `tools`.
    pub fn set_var_json(&mut self, name: impl Into<String>, json: &str) -> Result<()> {
        let value: Value = serde_json::from_str(json)
            .map_err(|e| TextError::TemplateRender { message: format!("variable is not valid JSON: {e}") })?;
        let name = name.into();
        match self.vars.iter_mut().find(|(k, _)| *k == name) {
            Some(slot) => slot.1 = value,
            None => self.vars.push((name, value)),
        }
        Ok(())
    }

    /// `apply_chat_template(messages, tokenize=False, add_generation_prompt=...)`.
    pub fn render(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String> {
        let messages: Vec<Value> = messages.iter().map(Value::from_serialize).collect();
        self.render_values(messages, add_generation_prompt, None)
    }

    /// [`Self::render_json`] with `tools` (a JSON array of OpenAI tool objects, key order
    /// kept) as `apply_chat_template(messages, tools=tools)` passes them.
    pub fn render_json_with_tools(
        &self,
        messages_json: &str,
        tools_json: &str,
        add_generation_prompt: bool,
    ) -> Result<String> {
        let parse = |what: &str, json: &str| -> Result<Value> {
            serde_json::from_str(json)
                .map_err(|e| TextError::TemplateRender { message: format!("{what} are not valid JSON: {e}") })
        };
        let messages: Vec<Value> = parse("messages", messages_json)?
            .try_iter()
            .map_err(|e| TextError::TemplateRender { message: describe(&e) })?
            .collect();
        self.render_values(messages, add_generation_prompt, Some(parse("tools", tools_json)?))
    }

    /// Like [`Self::render`], for messages given as a JSON array of objects (OpenAI-style messages
    /// with `tool_calls`, `name`, content parts, ...). Key order is kept, as Python keeps it.
    pub fn render_json(&self, messages_json: &str, add_generation_prompt: bool) -> Result<String> {
        let messages: Vec<Value> = serde_json::from_str(messages_json)
            .map_err(|e| TextError::TemplateRender { message: format!("messages are not a JSON array: {e}") })?;
        self.render_values(messages, add_generation_prompt, None)
    }

    fn render_values(&self, messages: Vec<Value>, add_generation_prompt: bool, tools: Option<Value>) -> Result<String> {
        if messages.is_empty() {
            // transformers refuses before rendering; templates would index messages[0].
            return Err(TextError::TemplateRender {
                message: "cannot apply a chat template to an empty conversation".into(),
            });
        }
        let messages = messages.into_iter().map(normalize_message).collect::<Result<Vec<_>>>()?;
        let mut ctx: Vec<(String, Value)> = vec![
            ("messages".into(), Value::from(messages)),
            ("tools".into(), Value::from(())),
            ("documents".into(), Value::from(())),
            ("add_generation_prompt".into(), Value::from(add_generation_prompt)),
        ];
        for (name, value) in self.vars.iter().chain(tools.map(|t| ("tools".to_string(), t)).as_ref()) {
            match ctx.iter_mut().find(|(k, _)| k == name) {
                Some(slot) => slot.1 = value.clone(),
                None => ctx.push((name.clone(), value.clone())),
            }
        }
        let template =
            self.env.get_template(TEMPLATE_NAME).map_err(|e| TextError::TemplateRender { message: describe(&e) })?;
        template.render(Value::from_iter(ctx)).map_err(|e| match raised_message(&e) {
            Some(message) => TextError::TemplateRaised { message },
            None => TextError::TemplateRender { message: describe(&e) },
        })
    }
}

/// Python's `str.isspace` per character: Rust's whitespace plus the ASCII separators
/// U+001C..U+001F, which Python's `strip()`/`split()` (and so Jinja's `trim`) also remove.
fn py_isspace(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// Python methods on values: pycompat, except that argument-less `strip`/`lstrip`/`rstrip`/
/// `split` use Python's notion of whitespace.
fn python_method(
    state: &minijinja::State,
    value: &Value,
    method: &str,
    args: &[Value],
) -> std::result::Result<Value, Error> {
    let no_args = args.iter().all(Value::is_none) && args.len() <= 1;
    if let (Some(s), true) = (value.as_str(), no_args) {
        match method {
            "strip" => return Ok(Value::from(s.trim_matches(py_isspace))),
            "lstrip" => return Ok(Value::from(s.trim_start_matches(py_isspace))),
            "rstrip" => return Ok(Value::from(s.trim_end_matches(py_isspace))),
            "split" => return Ok(s.split(py_isspace).filter(|w| !w.is_empty()).map(Value::from).collect()),
            _ => {}
        }
    }
    minijinja_contrib::pycompat::unknown_method_callback(state, value, method, args)
}

/// Drops null-valued keys and aliases reasoning fields, as `apply_chat_template` does.
fn normalize_message(message: Value) -> Result<Value> {
    if message.kind() != ValueKind::Map {
        return Err(TextError::TemplateRender {
            message: format!("chat messages must be objects, got {}", message.kind()),
        });
    }
    let render_err = |e: Error| TextError::TemplateRender { message: describe(&e) };
    let mut entries: Vec<(Value, Value)> = Vec::new();
    for key in message.try_iter().map_err(render_err)? {
        let value = message.get_item(&key).map_err(render_err)?;
        if !value.is_none() {
            entries.push((key, value));
        }
    }
    let get = |entries: &[(Value, Value)], name: &str| {
        entries.iter().find(|(k, _)| k.as_str() == Some(name)).map(|(_, v)| v.clone())
    };
    if let Some(reasoning) = REASONING_FIELDS.iter().find_map(|f| get(&entries, f)) {
        // {"thinking": r, **message, "reasoning_content": r}: "thinking" keeps its place if present.
        if get(&entries, "thinking").is_none() {
            entries.insert(0, (Value::from("thinking"), reasoning.clone()));
        }
        match entries.iter_mut().find(|(k, _)| k.as_str() == Some("reasoning_content")) {
            Some(slot) => slot.1 = reasoning,
            None => entries.push((Value::from("reasoning_content"), reasoning)),
        }
    }
    Ok(Value::from_iter(entries))
}

/// The message of a `raise_exception` call anywhere in the error chain.
fn raised_message(err: &Error) -> Option<String> {
    let mut current: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = current {
        if let Some(mj) = e.downcast_ref::<Error>() {
            if let Some(message) = mj.detail().and_then(|d| d.strip_prefix(RAISED)) {
                return Some(message.to_owned());
            }
        }
        current = e.source();
    }
    None
}

/// The error with its location, without our internal marker.
fn describe(err: &Error) -> String {
    let mut text = err.to_string().replace(RAISED, "");
    let mut source = std::error::Error::source(err);
    while let Some(e) = source {
        text.push_str(": ");
        text.push_str(&e.to_string().replace(RAISED, ""));
        source = e.source();
    }
    text
}

/// Rewrites `{% generation %}`/`{% endgeneration %}` (transformers' extension, a no-op when
/// rendering) to `{% if true %}`/`{% endif %}`, keeping `-` whitespace markers.
fn rewrite_generation_tags(source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(start) = rest.find("{%") {
        out.push_str(&rest[..start]);
        let tag = &rest[start..];
        let Some(end) = tag.find("%}") else {
            out.push_str(tag);
            return out;
        };
        let inner = &tag[2..end];
        let left_dash = inner.starts_with('-');
        let right_dash = inner.ends_with('-') && inner.len() > usize::from(left_dash);
        let word = inner.trim_start_matches('-').trim_end_matches('-').trim();
        let l = if left_dash { "-" } else { "" };
        let r = if right_dash { "-" } else { "" };
        match word {
            "generation" => out.push_str(&format!("{{%{l} if true {r}%}}")),
            "endgeneration" => out.push_str(&format!("{{%{l} endif {r}%}}")),
            _ => out.push_str(&tag[..end + 2]),
        }
        rest = &tag[end + 2..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(src: &str, messages: &[ChatMessage], gen: bool) -> Result<String> {
        ChatTemplate::new(src, "<s>", "</s>")?.render(messages, gen)
    }

    #[test]
    fn trims_blocks_like_hf() {
        let src =
            "{% for m in messages %}\n  {% if m.role == 'user' %}\nU:{{ m.content }}\n  {% endif %}\n{% endfor %}\n";
        assert_eq!(render(src, &[ChatMessage::user("hi")], false).unwrap(), "U:hi\n");
    }

    #[test]
    fn raise_exception_is_typed() {
        let src = "{% if messages[0].role != 'system' %}{{ raise_exception('Need a system message!') }}{% endif %}ok";
        match render(src, &[ChatMessage::user("x")], false) {
            Err(TextError::TemplateRaised { message }) => {
                assert_eq!(message, "Need a system message!")
            }
            other => panic!("expected TemplateRaised, got {other:?}"),
        }
        assert_eq!(render(src, &[ChatMessage::system("x")], false).unwrap(), "ok");
    }

    #[test]
    fn python_methods_and_printing() {
        let src = "{{ messages[0].content.strip().title() }}|{{ messages[0].content.split()|length }}|\
                   {{ messages[0].content.startswith('  a') }}|{{ none }}|{{ tools }}|{{ x is defined }}|\
                   {% for k, v in messages[0].items() %}{{ k }}={{ v|trim }};{% endfor %}";
        let out = render(src, &[ChatMessage::user("  ab cd ")], false).unwrap();
        assert_eq!(out, "Ab Cd|2|True|None|None|False|role=user;content=ab cd;");
    }

    #[test]
    fn tojson_is_json_dumps_and_loop_controls_work() {
        let src = "{{ messages[0]|tojson }}{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}{{ m.role }}{% endfor %}";
        let out = render(src, &[ChatMessage::user("<b>é"), ChatMessage::assistant("z")], false).unwrap();
        assert_eq!(out, r#"{"role": "user", "content": "<b>é"}user"#);
    }

    #[test]
    fn generation_tags_and_json_messages() {
        let src = "{% for m in messages %}{% generation %}\n{{ m.content }}{% endgeneration %}\n{% endfor %}\
                   {{ messages[1].thinking }}/{{ messages[1].reasoning_content }}/{{ messages[0].tool_calls is defined }}";
        let t = ChatTemplate::new(src, "", "").unwrap();
        let out = t
            .render_json(
                r#"[{"role": "user", "content": "a", "tool_calls": null},
                             {"role": "assistant", "content": "b", "reasoning": "r"}]"#,
                false,
            )
            .unwrap();
        assert_eq!(out, "abr/r/False");
        assert!(rewrite_generation_tags("{%- generation -%}x{%endgeneration%}") == "{%- if true -%}x{% endif %}");
    }

    #[test]
    fn errors_are_typed() {
        assert!(matches!(ChatTemplate::new("{% if %}", "", ""), Err(TextError::TemplateSyntax { .. })));
        assert!(matches!(
            render("{{ 1 + 'a' }}", &[ChatMessage::user("x")], false),
            Err(TextError::TemplateRender { .. })
        ));
        assert!(matches!(render("x", &[], false), Err(TextError::TemplateRender { .. })));
        let t = ChatTemplate::new("x", "", "").unwrap();
        assert!(t.render_json("{}", false).is_err());
        assert!(t.render_json("[1]", false).is_err());
    }

    #[test]
    fn vars_and_strftime() {
        let mut t = ChatTemplate::new("{{ bos_token }}{{ enable_thinking }}{{ strftime_now('%Y')|length }}", "<s>", "")
            .unwrap();
        t.set_var("enable_thinking", false);
        t.set_var_json("tools", r#"[{"z": 1, "a": 2}]"#).unwrap();
        assert!(t.set_var_json("tools", "{").is_err());
        let order = ChatTemplate::new("{{ tools|tojson }}", "", "").map(|mut o| {
            o.set_var_json("tools", r#"[{"z": 1, "a": 2}]"#).unwrap();
            o.render(&[ChatMessage::user("x")], false).unwrap()
        });
        assert_eq!(order.unwrap(), r#"[{"z": 1, "a": 2}]"#);
        assert_eq!(t.render(&[ChatMessage::user("x")], false).unwrap(), "<s>False4");
    }
}
