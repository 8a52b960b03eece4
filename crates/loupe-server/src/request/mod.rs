//! Parsing and validating OpenAI request bodies, by the rules real clients need:
//! explicit `null` means absent; `developer` is `system`; unknown top-level fields are a 400
//! naming the field (or dropped with a warning under `--allow-extra-request-fields`);
//! every range error names its parameter. Fields the server does not implement yet are
//! refused with a 400 when they would change the output (never silently dropped).

mod embeddings;
mod extensions;
mod fields;
mod messages;
mod tools;

use loupe_runtime::{GrammarSpec, SamplingParams};
use serde_json::Value;

use crate::error::ApiError;
pub use embeddings::{embeddings, EmbeddingsRequest, EncodingFormat, MAX_EMBEDDING_INPUTS};
pub use extensions::{Extensions, ExtensionsOf};
use fields::kind_of;
pub use fields::Fields;
pub use messages::messages;
use tools::tools;
pub use tools::{ToolChoice, Tools};

/// The most alternatives `top_logprobs` / `logprobs` may ask for (OpenAI's limit is 20).
pub const MAX_TOP_LOGPROBS: usize = 20;
/// The most stop strings a request may give.
pub const MAX_STOP_STRINGS: usize = 16;

/// What the prompt is.
#[derive(Debug, Clone, PartialEq)]
pub enum Input {
    /// OpenAI messages, validated and normalized for the chat template: `role` (developer
    /// as system), `content` as text, and an assistant's `tool_calls` (arguments parsed into
    /// objects, as templates expect) or a tool result's `tool_call_id`.
    Chat(Vec<Value>),
    Text(String),
    Tokens(Vec<u32>),
}

/// A validated generation request (chat or completion).
#[derive(Debug, Clone)]
pub struct GenRequest {
    pub model: Option<String>,
    pub input: Input,
    /// `None`: up to the context window.
    pub max_tokens: Option<usize>,
    pub sampling: SamplingParams,
    pub stop: Vec<String>,
    pub stream: bool,
    pub include_usage: bool,
    /// vLLM's and llama-server's `ignore_eos` extension: generate until `max_tokens` even
    /// past the end-of-sequence token (benchmarks use it to fix output lengths).
    pub ignore_eos: bool,
    /// `Some(n)`: report log-probabilities with `n` alternatives per token.
    pub logprobs: Option<usize>,
    /// Unknown fields dropped under `--allow-extra-request-fields`.
    pub dropped: Vec<String>,
    /// `response_format` `json_object` / `json_schema`: what the output must match.
    pub grammar: Option<GrammarSpec>,
    /// `tools` with a `tool_choice` other than `none`.
    pub tools: Option<Tools>,
    /// vLLM's and SGLang's extension fields (what routers add to every body).
    pub ext: Extensions,
}

/// What both endpoints read: sampling, limits, stop strings, streaming.
struct Common {
    sampling: SamplingParams,
    max_tokens: Option<usize>,
    stop: Vec<String>,
    stream: bool,
    include_usage: bool,
    ignore_eos: bool,
    grammar: Option<GrammarSpec>,
}

/// `response_format`: `text` (or null), `json_object`, or `json_schema` with
/// `json_schema.schema`. A schema root must admit an object (OpenAI's structured-outputs
/// contract): its `type` missing, `"object"`, or a list including `"object"`.
fn response_format(v: Option<Value>) -> Result<Option<GrammarSpec>, ApiError> {
    let bad = |m: String| ApiError::invalid("response_format", m);
    let Some(v) = v else { return Ok(None) };
    let Value::Object(mut o) = v else {
        return Err(bad(format!("'response_format' must be an object, got {}.", kind_of(&v))));
    };
    let kind = match o.remove("type") {
        Some(Value::String(t)) => t,
        _ => return Err(bad("'response_format.type' must be one of 'text', 'json_object', 'json_schema'.".into())),
    };
    match kind.as_str() {
        "text" => Ok(None),
        "json_object" => Ok(Some(GrammarSpec::JsonObject)),
        "json_schema" => {
            let Some(Value::Object(mut js)) = o.remove("json_schema") else {
                return Err(bad("'response_format.json_schema' must be an object holding 'name' and 'schema'.".into()));
            };
            // `name`, `description` and `strict` do not change the grammar: it is always
            // enforced (strict), whatever `strict` says.
            if let Some(n) = js.get("name") {
                if !n.is_string() {
                    return Err(bad("'response_format.json_schema.name' must be a string.".into()));
                }
            }
            let schema = match js.remove("schema") {
                Some(Value::Object(s)) => Value::Object(s),
                None => serde_json::json!({"type": "object"}),
                Some(v) => {
                    return Err(bad(format!(
                        "'response_format.json_schema.schema' must be an object, got {}.",
                        kind_of(&v)
                    )))
                }
            };
            let admits_object = match schema.get("type") {
                None => true,
                Some(Value::String(t)) => t == "object",
                Some(Value::Array(ts)) => ts.iter().any(|t| t == "object"),
                Some(_) => false,
            };
            if !admits_object {
                return Err(bad(format!(
                    "invalid json schema (keyword 'type' at '/'): the root of a response schema must be an object (its 'type' missing, \"object\", or a list including \"object\"), got {}.",
                    schema["type"]
                )));
            }
            Ok(Some(GrammarSpec::JsonSchema(schema)))
        }
        other => Err(bad(format!(
            "'response_format.type' must be one of 'text', 'json_object', 'json_schema', got '{other}'."
        ))),
    }
}

fn common(f: &mut Fields, fallback_seed: u64) -> Result<Common, ApiError> {
    let mut s = SamplingParams { temperature: 1.0, ..SamplingParams::default() };
    if let Some(t) = f.f32_in("temperature", 0.0, 2.0)? {
        s.temperature = t;
    }
    if let Some(p) = f.f32_in("top_p", f32::MIN_POSITIVE, 1.0)? {
        s.top_p = p;
    }
    // vLLM's convention: -1 or 0 turn top-k off.
    if let Some(k) = f.int_in("top_k", -1, u32::MAX as i64)? {
        s.top_k = k.max(0) as usize;
    }
    if let Some(p) = f.f32_in("min_p", 0.0, 1.0)? {
        s.min_p = p;
    }
    if let Some(p) = f.f32_in("presence_penalty", -2.0, 2.0)? {
        s.presence_penalty = p;
    }
    if let Some(p) = f.f32_in("frequency_penalty", -2.0, 2.0)? {
        s.frequency_penalty = p;
    }
    if let Some(p) = f.f32_in("repetition_penalty", f32::MIN_POSITIVE, 100.0)? {
        s.repetition_penalty = p;
    }
    s.seed = match f.take("seed") {
        None => fallback_seed,
        // OpenAI's seed is a signed 64-bit integer; its bits seed the generator.
        Some(v) => match (v.as_i64(), v.as_u64()) {
            (Some(x), _) => x as u64,
            (None, Some(x)) => x,
            _ => return Err(ApiError::invalid("seed", format!("'seed' must be an integer, got {v}."))),
        },
    };
    let max_tokens = f.int_in("max_tokens", 1, u32::MAX as i64)?;
    let max_completion = f.int_in("max_completion_tokens", 1, u32::MAX as i64)?;
    let max_tokens = max_completion.or(max_tokens).map(|n| n as usize);
    let stop = match f.take("stop") {
        None => Vec::new(),
        Some(Value::String(s)) => vec![s],
        Some(Value::Array(items)) => {
            let mut out = Vec::new();
            for (i, item) in items.iter().enumerate() {
                match item.as_str() {
                    Some(s) => out.push(s.to_string()),
                    None => {
                        return Err(ApiError::invalid(
                            "stop",
                            format!("'stop[{i}]' must be a string, got {}.", kind_of(item)),
                        ))
                    }
                }
            }
            out
        }
        Some(v) => {
            return Err(ApiError::invalid(
                "stop",
                format!("'stop' must be a string or an array of strings, got {}.", kind_of(&v)),
            ))
        }
    };
    if stop.len() > MAX_STOP_STRINGS {
        return Err(ApiError::invalid(
            "stop",
            format!("'stop' may hold at most {MAX_STOP_STRINGS} strings, got {}.", stop.len()),
        ));
    }
    if stop.iter().any(|s| s.is_empty()) {
        return Err(ApiError::invalid("stop", "'stop' strings must not be empty."));
    }
    if let Some(n) = f
        .int_in("n", 1, i64::MAX)
        .map_err(|_| ApiError::invalid("n", "'n' must be 1: this server returns one choice per request."))?
    {
        if n != 1 {
            return Err(ApiError::invalid("n", "'n' must be 1: this server returns one choice per request."));
        }
    }
    let stream = f.bool("stream")?.unwrap_or(false);
    let include_usage = match f.take("stream_options") {
        None => false,
        Some(Value::Object(mut o)) => {
            let usage = match o.remove("include_usage") {
                None | Some(Value::Null) => false,
                Some(Value::Bool(b)) => b,
                Some(v) => {
                    return Err(ApiError::invalid(
                        "stream_options",
                        format!("'stream_options.include_usage' must be a boolean, got {}.", kind_of(&v)),
                    ))
                }
            };
            // OpenAI's other option, `include_obfuscation`, only pads chunks; accepted.
            o.remove("include_obfuscation");
            if let Some(k) = o.keys().next() {
                return Err(ApiError::invalid("stream_options", format!("Unrecognized stream option: {k}.")));
            }
            if !stream {
                return Err(ApiError::invalid(
                    "stream_options",
                    "'stream_options' is only allowed when 'stream' is true.",
                ));
            }
            usage
        }
        Some(v) => {
            return Err(ApiError::invalid(
                "stream_options",
                format!("'stream_options' must be an object, got {}.", kind_of(&v)),
            ))
        }
    };
    // Accepted and without effect on the output.
    for ignored in ["user", "metadata", "store", "service_tier", "prompt_cache_key", "safety_identifier"] {
        f.take(ignored);
    }
    // Refused rather than dropped: they would change the output.
    if let Some(v) = f.take("logit_bias") {
        if v.as_object().is_none_or(|o| !o.is_empty()) {
            return Err(ApiError::invalid("logit_bias", "'logit_bias' is not supported by this server yet."));
        }
    }
    let ignore_eos = f.bool("ignore_eos")?.unwrap_or(false);
    let grammar = response_format(f.take("response_format"))?;
    Ok(Common { sampling: s, max_tokens, stop, stream, include_usage, ignore_eos, grammar })
}

/// `POST /v1/chat/completions`.
pub fn chat(body: &[u8], allow_extra: bool, fallback_seed: u64) -> Result<GenRequest, ApiError> {
    let mut f = Fields::parse(body)?;
    let model = f.string("model")?;
    let input = Input::Chat(messages(f.take("messages"))?);
    let tools = tools(&mut f)?;
    let Common { sampling, max_tokens, stop, stream, include_usage, ignore_eos, grammar } =
        common(&mut f, fallback_seed)?;
    let want = f.bool("logprobs")?.unwrap_or(false);
    let top = f.int_in("top_logprobs", 0, MAX_TOP_LOGPROBS as i64)?;
    if top.is_some() && !want {
        return Err(ApiError::invalid("top_logprobs", "'top_logprobs' needs 'logprobs': true."));
    }
    let logprobs = want.then(|| top.unwrap_or(0) as usize);
    if tools.as_ref().is_some_and(|t| t.choice != ToolChoice::Auto) && grammar.is_some() {
        return Err(ApiError::invalid("response_format", "'response_format' cannot be combined with a 'tool_choice' that forces tool calls: both would constrain the output."));
    }
    let ext = Extensions::read(&mut f, ExtensionsOf::Chat)?;
    let dropped = f.finish(allow_extra)?;
    Ok(GenRequest {
        model,
        input,
        max_tokens,
        sampling,
        stop,
        stream,
        include_usage,
        ignore_eos,
        logprobs,
        dropped,
        grammar,
        tools,
        ext,
    })
}

/// `POST /v1/completions`.
pub fn completion(body: &[u8], allow_extra: bool, fallback_seed: u64) -> Result<GenRequest, ApiError> {
    let mut f = Fields::parse(body)?;
    let model = f.string("model")?;
    let bad_prompt = || {
        ApiError::invalid(
            "prompt",
            "'prompt' is required: a string, an array holding one string, or an array of token ids.",
        )
    };
    let input = match f.take("prompt") {
        Some(Value::String(s)) => Input::Text(s),
        Some(Value::Array(items)) => match items.as_slice() {
            [Value::String(s)] => Input::Text(s.clone()),
            [Value::Array(ids)] => Input::Tokens(token_ids(ids).ok_or_else(bad_prompt)?),
            [] => return Err(bad_prompt()),
            ids if ids.iter().all(Value::is_number) => Input::Tokens(token_ids(ids).ok_or_else(bad_prompt)?),
            _ => {
                return Err(ApiError::invalid(
                    "prompt",
                    "'prompt' may hold one prompt: this server returns one choice per request.",
                ))
            }
        },
        _ => return Err(bad_prompt()),
    };
    let Common { sampling, max_tokens, stop, stream, include_usage, ignore_eos, grammar } =
        common(&mut f, fallback_seed)?;
    let logprobs = f.int_in("logprobs", 0, MAX_TOP_LOGPROBS as i64)?.map(|n| n as usize);
    if f.bool("echo")? == Some(true) {
        return Err(ApiError::invalid("echo", "'echo' is not supported by this server yet."));
    }
    f.int_in("best_of", 1, 1).map_err(|_| ApiError::invalid("best_of", "'best_of' must be 1."))?;
    if f.string("suffix")?.is_some_and(|s| !s.is_empty()) {
        return Err(ApiError::invalid("suffix", "'suffix' (fill-in-the-middle) is not supported by this server."));
    }
    f.take("parallel_tool_calls");
    let ext = Extensions::read(&mut f, ExtensionsOf::Completion)?;
    let dropped = f.finish(allow_extra)?;
    // OpenAI's default for the completions endpoint is 16 tokens.
    Ok(GenRequest {
        model,
        input,
        max_tokens: Some(max_tokens.unwrap_or(16)),
        sampling,
        stop,
        stream,
        include_usage,
        ignore_eos,
        logprobs,
        dropped,
        grammar,
        tools: None,
        ext,
    })
}

/// Token ids from JSON numbers; `None` if any is not a u32.
pub fn token_ids(values: &[Value]) -> Option<Vec<u32>> {
    values.iter().map(|v| v.as_u64().and_then(|x| u32::try_from(x).ok())).collect()
}

/// The body of the `openai_request` fuzz target (`fuzz/`) and of its seeded smoke test:
/// any bytes through both endpoints' parsers, which must answer, never panic.
pub fn fuzz_request(data: &[u8]) {
    let _ = chat(data, false, 0);
    let _ = chat(data, true, 0);
    let _ = completion(data, false, 0);
    let _ = completion(data, true, 0);
    let _ = embeddings(data, false);
    let _ = embeddings(data, true);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chat_of(json: &str) -> Result<GenRequest, ApiError> {
        chat(json.as_bytes(), false, 7)
    }

    #[test]
    fn developer_is_system_nulls_are_absent_and_defaults_follow_openai() {
        let r = chat_of(r#"{"model": "m", "messages": [{"role": "developer", "content": "Be brief."}, {"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
                          "tools": null, "tool_choice": null, "response_format": null, "temperature": null, "seed": null}"#)
        .unwrap();
        assert_eq!(
            r.input,
            Input::Chat(vec![
                serde_json::json!({"role": "system", "content": "Be brief."}),
                serde_json::json!({"role": "user", "content": "Hi"})
            ])
        );
        assert_eq!(r.sampling.temperature, 1.0);
        assert_eq!(r.sampling.seed, 7);
        assert_eq!(r.max_tokens, None);
        assert!(r.logprobs.is_none());
    }

    #[test]
    fn unknown_fields_are_refused_or_dropped() {
        let body = r#"{"messages": [{"role": "user", "content": "x"}], "frobnicate": 1}"#;
        let e = chat(body.as_bytes(), false, 0).unwrap_err();
        assert_eq!(e.status, 400);
        assert_eq!(e.param.as_deref(), Some("frobnicate"));
        assert_eq!(chat(body.as_bytes(), true, 0).unwrap().dropped, ["frobnicate"]);
    }

    #[test]
    fn ranges_name_their_parameter() {
        for (body, param) in [
            (r#"{"messages": [{"role": "user", "content": "x"}], "temperature": 3}"#, "temperature"),
            (r#"{"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}"#, "top_logprobs"),
            (
                r#"{"messages": [{"role": "user", "content": "x"}], "logprobs": true, "top_logprobs": 21}"#,
                "top_logprobs",
            ),
            (r#"{"messages": [{"role": "user", "content": "x"}], "n": 2}"#, "n"),
            (r#"{"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}"#, "max_tokens"),
            (r#"{"messages": [{"role": "user", "content": "x"}], "stop": [1]}"#, "stop"),
            (r#"{"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]}"#, "tools"),
            (
                r#"{"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": {"name": "a b"}}]}"#,
                "tools",
            ),
            (r#"{"messages": [{"role": "user", "content": "x"}], "tool_choice": "required"}"#, "tool_choice"),
            (
                r#"{"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": {"type": "function", "function": {"name": "g"}}}"#,
                "tool_choice",
            ),
            (r#"{"messages": [{"role": "tool", "content": "x"}]}"#, "messages"),
            (
                r#"{"messages": [{"role": "assistant", "content": null, "tool_calls": [{"id": "1", "type": "function", "function": {"name": "f", "arguments": "{"}}]}]}"#,
                "messages",
            ),
            (
                r#"{"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "xml"}}"#,
                "response_format",
            ),
            (
                r#"{"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": {"type": "string"}}}}"#,
                "response_format",
            ),
            (
                r#"{"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": {"type": ["array", "null"]}}}}"#,
                "response_format",
            ),
            (
                r#"{"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_schema"}}"#,
                "response_format",
            ),
            (
                r#"{"messages": [{"role": "user", "content": "x"}], "stream_options": {"include_usage": true}}"#,
                "stream_options",
            ),
            (r#"{"messages": []}"#, "messages"),
        ] {
            let e = chat_of(body).unwrap_err();
            assert_eq!((e.status.as_u16(), e.param.as_deref()), (400, Some(param)), "{body}: {}", e.message);
        }
        assert_eq!(chat_of("[1]").unwrap_err().status, 400);
        assert_eq!(chat_of("{").unwrap_err().status, 400);
    }

    #[test]
    fn response_format_roots_that_admit_an_object_are_accepted() {
        let with = |rf: &str| {
            chat_of(&format!(r#"{{"messages": [{{"role": "user", "content": "x"}}], "response_format": {rf}}}"#))
        };
        assert_eq!(with(r#"{"type": "text"}"#).unwrap().grammar, None);
        assert_eq!(with(r#"{"type": "json_object"}"#).unwrap().grammar, Some(GrammarSpec::JsonObject));
        for schema in [
            r#"{"properties": {"a": {"type": "integer"}}}"#,
            r#"{"type": "object"}"#,
            r#"{"type": ["object", "null"]}"#,
        ] {
            let g = with(&format!(
                r#"{{"type": "json_schema", "json_schema": {{"name": "n", "strict": true, "schema": {schema}}}}}"#
            ))
            .unwrap()
            .grammar;
            assert_eq!(g, Some(GrammarSpec::JsonSchema(serde_json::from_str(schema).unwrap())), "{schema}");
        }
        let e = with(r#"{"type": "json_schema", "json_schema": {"name": "n", "schema": {"type": "integer"}}}"#)
            .unwrap_err();
        assert!(e.message.contains("keyword 'type' at '/'"), "{}", e.message);
    }

    #[test]
    fn embeddings_inputs_and_formats() {
        let r = embeddings(br#"{"model": "m", "input": "hello"}"#, false).unwrap();
        assert_eq!(
            (r.input, r.encoding_format, r.dimensions),
            (vec!["hello".to_string()], EncodingFormat::Float, None)
        );
        let r =
            embeddings(br#"{"input": ["a", "b"], "encoding_format": "base64", "dimensions": 384, "user": "u"}"#, false)
                .unwrap();
        assert_eq!((r.input.len(), r.encoding_format, r.dimensions), (2, EncodingFormat::Base64, Some(384)));
        for (body, param, needle) in [
            (r#"{}"#, "input", "required"),
            (r#"{"input": []}"#, "input", "empty array"),
            (r#"{"input": [1, 2]}"#, "input", "token-id"),
            (r#"{"input": [[1, 2]]}"#, "input", "token-id"),
            (r#"{"input": ""}"#, "input", "empty string"),
            (r#"{"input": 3}"#, "input", "a string or an array"),
            (r#"{"input": "x", "encoding_format": "int8"}"#, "encoding_format", "int8"),
            (r#"{"input": "x", "dimensions": 0}"#, "dimensions", "dimensions"),
            (r#"{"input": "x", "temperature": 1}"#, "temperature", "temperature"),
        ] {
            let e = embeddings(body.as_bytes(), false).unwrap_err();
            assert_eq!((e.status.as_u16(), e.param.as_deref()), (400, Some(param)), "{body}: {}", e.message);
            assert!(e.message.contains(needle), "{body}: {}", e.message);
        }
        let many = format!(r#"{{"input": [{}]}}"#, vec!["\"x\""; MAX_EMBEDDING_INPUTS + 1].join(","));
        assert!(embeddings(many.as_bytes(), false).unwrap_err().message.contains("at most"));
    }

    #[test]
    fn completion_prompts_and_logprobs() {
        let r = completion(br#"{"prompt": ["Once"], "logprobs": 3, "max_tokens": 5, "stop": "\n"}"#, false, 0).unwrap();
        assert_eq!(r.input, Input::Text("Once".into()));
        assert_eq!((r.logprobs, r.max_tokens, r.stop.as_slice()), (Some(3), Some(5), ["\n".to_string()].as_slice()));
        let r = completion(br#"{"prompt": [1, 2, 3]}"#, false, 0).unwrap();
        assert_eq!((r.input, r.max_tokens), (Input::Tokens(vec![1, 2, 3]), Some(16)));
        assert!(completion(br#"{"prompt": ["a", "b"]}"#, false, 0).is_err());
        assert!(completion(br#"{"prompt": [-1]}"#, false, 0).is_err());
        assert!(completion(br#"{"prompt": "a", "echo": true}"#, false, 0).is_err());
    }
}
