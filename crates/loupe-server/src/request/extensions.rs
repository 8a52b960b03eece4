//! Engine extension fields: what vLLM and SGLang accept beyond OpenAI's schema, and what
//! the routers in front of replicas (sglang-router's `smg`, vllm-router) add to every body
//! they forward (`skip_special_tokens: true`, `no_stop_trim: false`, ...). A value that
//! leaves the answer as loupe gives it anyway is accepted silently; a value that would
//! change it is implemented ([`Extensions`]) or refused with a 400 naming the field. A leaf
//! of `request`.

use super::fields::Fields;
use crate::error::ApiError;

/// The extension fields a request set, with their defaults filled in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Extensions {
    /// vLLM's and SGLang's `skip_special_tokens` (default true): false keeps the text of
    /// special tokens the model generates (the end-of-sequence token that ends the answer
    /// is never part of it, as in vLLM).
    pub skip_special_tokens: bool,
    /// Chat only, vLLM's and SGLang's `continue_final_message` (default false): true renders
    /// the chat without a generation prompt and leaves the final (assistant) message open,
    /// so the model continues it; transformers' `apply_chat_template` rule.
    pub continue_final_message: bool,
    /// Chat only, vLLM's `add_generation_prompt` (default true, false when
    /// `continue_final_message` is true).
    pub add_generation_prompt: bool,
    /// Chat only, SGLang's `separate_reasoning` (default true): false leaves a reasoning
    /// model's thinking in `content`, markers included.
    pub separate_reasoning: bool,
    /// Chat only, vLLM's `include_reasoning` (default true): false drops the thinking from
    /// the answer.
    pub include_reasoning: bool,
    /// Chat only, SGLang's `stream_reasoning` (default true: thinking is streamed as it is
    /// generated, which is what loupe does). False is refused where it would matter (a
    /// streamed answer of a reasoning model): see [`Extensions::check_reasoning`].
    pub stream_reasoning: bool,
    /// loupe's `speculate` (default true): false opts the request out of the server's
    /// speculative decoding (`--speculate`); its tokens are the same either way.
    pub speculate: bool,
}

impl Default for Extensions {
    fn default() -> Self {
        Extensions {
            skip_special_tokens: true,
            continue_final_message: false,
            add_generation_prompt: true,
            separate_reasoning: true,
            include_reasoning: true,
            stream_reasoning: true,
            speculate: true,
        }
    }
}

/// Which endpoint's fields to read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExtensionsOf {
    Chat,
    Completion,
}

/// A field accepted only at the value that leaves the answer unchanged.
fn only(f: &mut Fields, key: &str, accepted: bool, why: &str) -> Result<(), ApiError> {
    match f.bool(key)? {
        Some(v) if v != accepted => {
            Err(ApiError::invalid(key, format!("'{key}': {v} is not supported by this server: {why}")))
        }
        _ => Ok(()),
    }
}

impl Extensions {
    /// Reads the extension fields `endpoint` knows from `f`, leaving the others (unknown).
    pub fn read(f: &mut Fields, endpoint: ExtensionsOf) -> Result<Extensions, ApiError> {
        let mut x = Extensions {
            skip_special_tokens: f.bool("skip_special_tokens")?.unwrap_or(true),
            speculate: f.bool("speculate")?.unwrap_or(true),
            ..Extensions::default()
        };
        only(
            f,
            "return_hidden_states",
            false,
            "it returns no hidden states (loupe dump writes every intermediate tensor).",
        )?;
        only(f, "no_stop_trim", false, "a matched stop string is always trimmed from the output.")?;
        only(f, "include_stop_str_in_output", false, "a matched stop string is always trimmed from the output.")?;
        // Only changes how kept special tokens are joined.
        only(f, "spaces_between_special_tokens", true, "special tokens are decoded as the tokenizer joins them.")?;
        if let Some(n) = f.int_in("min_tokens", 0, u32::MAX as i64)? {
            if n > 0 {
                return Err(ApiError::invalid("min_tokens", "'min_tokens' above 0 is not supported by this server yet (use 'ignore_eos' with 'max_tokens' to fix the length)."));
            }
        }
        if endpoint == ExtensionsOf::Completion {
            return Ok(x);
        }
        x.continue_final_message = f.bool("continue_final_message")?.unwrap_or(false);
        match f.bool("add_generation_prompt")? {
            Some(true) if x.continue_final_message => {
                return Err(ApiError::invalid(
                    "add_generation_prompt",
                    "'add_generation_prompt' and 'continue_final_message' cannot both be true: the first opens a new assistant turn, the second continues the last message.",
                ))
            }
            Some(v) => x.add_generation_prompt = v,
            None => x.add_generation_prompt = !x.continue_final_message,
        }
        x.separate_reasoning = f.bool("separate_reasoning")?.unwrap_or(true);
        x.include_reasoning = f.bool("include_reasoning")?.unwrap_or(true);
        x.stream_reasoning = f.bool("stream_reasoning")?.unwrap_or(true);
        Ok(x)
    }

    /// Refuses `stream_reasoning: false` where it would change a response: a streamed answer
    /// whose thinking is split out (loupe streams thinking as it is generated).
    pub fn check_reasoning(&self, stream: bool, splits_reasoning: bool) -> Result<(), ApiError> {
        if !self.stream_reasoning && stream && splits_reasoning && self.separate_reasoning && self.include_reasoning {
            return Err(ApiError::invalid(
                "stream_reasoning",
                "'stream_reasoning': false is not supported by this server: thinking is streamed as it is generated.",
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(body: &str, endpoint: ExtensionsOf) -> Result<(Extensions, Vec<String>), ApiError> {
        let mut f = Fields::parse(body.as_bytes()).unwrap();
        let x = Extensions::read(&mut f, endpoint)?;
        Ok((x, f.finish(true).unwrap()))
    }

    #[test]
    fn the_routers_defaults_are_accepted_and_consumed() {
        // What smg 0.3.2 and vllm-router 0.1.17 add to a chat body (measured).
        let body = r#"{"no_stop_trim": false, "ignore_eos": false, "continue_final_message": false, "skip_special_tokens": true,
                       "separate_reasoning": true, "stream_reasoning": true, "return_hidden_states": false, "include_reasoning": true}"#;
        let (x, rest) = read(body, ExtensionsOf::Chat).unwrap();
        assert_eq!(x, Extensions::default());
        assert_eq!(rest, ["ignore_eos"]);
        let body = r#"{"no_stop_trim": false, "skip_special_tokens": true, "return_hidden_states": false}"#;
        let (x, rest) = read(body, ExtensionsOf::Completion).unwrap();
        assert_eq!((x, rest.len()), (Extensions::default(), 0));
    }

    #[test]
    fn values_that_change_the_answer_are_implemented_or_refused_by_name() {
        let (x, _) =
            read(r#"{"skip_special_tokens": false, "continue_final_message": true}"#, ExtensionsOf::Chat).unwrap();
        assert!(!x.skip_special_tokens && x.continue_final_message && !x.add_generation_prompt);
        let (x, _) = read(r#"{"separate_reasoning": false, "include_reasoning": false}"#, ExtensionsOf::Chat).unwrap();
        assert!(!x.separate_reasoning && !x.include_reasoning && x.add_generation_prompt);
        for (body, field) in [
            (r#"{"return_hidden_states": true}"#, "return_hidden_states"),
            (r#"{"no_stop_trim": true}"#, "no_stop_trim"),
            (r#"{"include_stop_str_in_output": true}"#, "include_stop_str_in_output"),
            (r#"{"spaces_between_special_tokens": false}"#, "spaces_between_special_tokens"),
            (r#"{"min_tokens": 3}"#, "min_tokens"),
            (r#"{"skip_special_tokens": "no"}"#, "skip_special_tokens"),
            (r#"{"continue_final_message": true, "add_generation_prompt": true}"#, "add_generation_prompt"),
        ] {
            let e = read(body, ExtensionsOf::Chat).unwrap_err();
            assert_eq!((e.status.as_u16(), e.param.as_deref()), (400, Some(field)), "{body}: {}", e.message);
        }
        // Chat-only fields are unknown on completions (left for the strict check).
        let (_, rest) = read(r#"{"continue_final_message": false}"#, ExtensionsOf::Completion).unwrap();
        assert_eq!(rest, ["continue_final_message"]);
        let no_stream = Extensions { stream_reasoning: false, ..Extensions::default() };
        assert!(no_stream.check_reasoning(true, true).is_err());
        assert!(no_stream.check_reasoning(false, true).is_ok());
        assert!(no_stream.check_reasoning(true, false).is_ok());
    }
}
