//! The generation loop: prefill the prompt, then decode one token at a time until EOS, a
//! stop string, or the token budget; text is streamed as it becomes final.

use std::time::{Duration, Instant};

use loupe_text::Tokenizer;

use crate::constraint::{Constraint, GrammarSpec, Grammars};
use crate::sampling::{Sampler, SamplingParams};
use crate::{RuntimeError, Session};

/// What to generate.
#[derive(Debug, Clone)]
pub struct GenerateRequest {
    pub prompt_tokens: Vec<u32>,
    pub max_tokens: usize,
    pub sampling: SamplingParams,
    /// Token ids that end generation (included in the output tokens, as transformers'
    /// `generate` includes its EOS).
    pub stop_ids: Vec<u32>,
    /// Strings that end generation; the text is cut before the first occurrence.
    pub stop_strings: Vec<String>,
    /// What the output must match ([`crate::constraint`]); `None`: unconstrained.
    pub grammar: Option<GrammarSpec>,
    /// With a grammar: append the tokens it forces without sampling them (fewer decode
    /// steps; the forced tokenization may differ from the one the model would sample).
    pub fast_forward: bool,
}

impl GenerateRequest {
    /// An unconstrained request with these stop ids and no stop strings.
    pub fn new(
        prompt_tokens: Vec<u32>,
        max_tokens: usize,
        sampling: SamplingParams,
        stop_ids: Vec<u32>,
    ) -> GenerateRequest {
        GenerateRequest {
            prompt_tokens,
            max_tokens,
            sampling,
            stop_ids,
            stop_strings: Vec::new(),
            grammar: None,
            fast_forward: false,
        }
    }
}

/// Why generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FinishReason {
    Eos,
    StopString,
    Length,
    /// The grammar is complete and admits no further token.
    Grammar,
}

impl FinishReason {
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Eos => "eos",
            FinishReason::StopString => "stop",
            FinishReason::Length => "length",
            FinishReason::Grammar => "grammar",
        }
    }
}

/// The result of a generation, with timings.
#[derive(Debug, Clone)]
pub struct Generation {
    pub tokens: Vec<u32>,
    pub text: String,
    pub finish_reason: FinishReason,
    pub prefill_time: Duration,
    pub decode_time: Duration,
    /// With a grammar: masks computed and their total time (overlapped with the forward
    /// passes, so not all of it adds to the decode time).
    pub masks: Option<(u64, Duration)>,
}

impl Generation {
    /// Prompt tokens processed per second of prefill.
    pub fn prefill_tokens_per_s(&self, prompt_len: usize) -> f64 {
        prompt_len as f64 / self.prefill_time.as_secs_f64().max(1e-9)
    }

    /// Tokens per second of decode (the first token comes from prefill).
    pub fn decode_tokens_per_s(&self) -> f64 {
        self.tokens.len().saturating_sub(1) as f64 / self.decode_time.as_secs_f64().max(1e-9)
    }
}

/// Holds back streamed text that could still turn out to start a stop string.
#[derive(Debug, Clone, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    pub(crate) text: String,
    emitted: usize,
}

impl StopMatcher {
    pub fn new(stops: Vec<String>) -> StopMatcher {
        StopMatcher { stops, text: String::new(), emitted: 0 }
    }

    /// Adds `chunk`; returns the text now safe to emit and whether a stop string matched
    /// (the text is then cut before it, and nothing after it is ever emitted).
    pub fn push(&mut self, chunk: &str) -> (String, bool) {
        let search_from = self.emitted.saturating_sub(self.stops.iter().map(|s| s.len()).max().unwrap_or(0));
        self.text.push_str(chunk);
        let found = self
            .stops
            .iter()
            .filter(|s| !s.is_empty())
            .filter_map(|s| {
                self.text[floor_char(&self.text, search_from)..]
                    .find(s.as_str())
                    .map(|i| i + floor_char(&self.text, search_from))
            })
            .min();
        if let Some(at) = found {
            self.text.truncate(at);
            let out = self.text[self.emitted.min(at)..].to_string();
            self.emitted = self.text.len();
            return (out, true);
        }
        // Keep the longest tail that is a proper prefix of some stop string.
        let mut hold = 0;
        for s in &self.stops {
            for k in (1..s.len()).rev() {
                if k <= self.text.len() - self.emitted && s.is_char_boundary(k) && self.text.ends_with(&s[..k]) {
                    hold = hold.max(k);
                    break;
                }
            }
        }
        let end = self.text.len() - hold;
        let out = self.text[self.emitted..end].to_string();
        self.emitted = end;
        (out, false)
    }

    /// Everything still held back (at the end of the stream).
    pub fn flush(&mut self) -> String {
        let out = self.text[self.emitted..].to_string();
        self.emitted = self.text.len();
        out
    }
}

fn floor_char(s: &str, mut i: usize) -> usize {
    while i > 0 && !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

/// Generates from `request.prompt_tokens`, calling `on_text` with each piece of final text.
/// A request with a grammar needs the model's `grammars`.
pub fn generate(
    session: &mut Session<'_>,
    tokenizer: &Tokenizer,
    grammars: Option<&Grammars>,
    request: &GenerateRequest,
    on_text: &mut dyn FnMut(&str),
) -> Result<Generation, RuntimeError> {
    request.sampling.validate().map_err(RuntimeError::InvalidRequest)?;
    let mut constraint: Option<Constraint> = match (&request.grammar, grammars) {
        (None, _) => None,
        (Some(spec), Some(g)) => Some(g.compile(spec)?),
        (Some(_), None) => {
            return Err(RuntimeError::InvalidRequest(
                "a grammar needs the model's token environment (Engine::grammars)".into(),
            ))
        }
    };
    let prompt_len = request.prompt_tokens.len();
    if prompt_len == 0 {
        return Err(RuntimeError::InvalidRequest("the prompt is empty (no tokens)".into()));
    }
    if prompt_len >= session.capacity() {
        return Err(RuntimeError::PromptTooLong { prompt: prompt_len, context: session.capacity() });
    }
    let budget = request.max_tokens.min(session.capacity() - prompt_len);
    session.reset();
    session.reserve(prompt_len + budget);

    let mut sampler = Sampler::new(request.sampling.clone());
    let mut context: Vec<u32> = Vec::with_capacity(prompt_len + budget);
    context.extend_from_slice(&request.prompt_tokens);
    let mut decoder = tokenizer.stream_decoder(true);
    let mut stops = StopMatcher::new(request.stop_strings.clone());
    let mut tokens = Vec::with_capacity(budget);
    let mut finish = FinishReason::Length;
    let mut logits_buf: Vec<f32> = Vec::new();

    // LongRoPE (Phi-3): when the sequence first grows past the original length while
    // decoding, transformers' generate drops the cache and runs the whole sequence again,
    // so every key is rotated with the long factors (`Phi3ForCausalLM
    // .prepare_inputs_for_generation`: input length >= original + 1 with at most original
    // positions cached). `recompute` is that length.
    let recompute = session.graph().longrope_switch();
    let start = Instant::now();
    logits_buf.extend_from_slice(session.forward(&request.prompt_tokens, false, None)?);
    let prefill_time = start.elapsed();
    let decode_start = Instant::now();

    'outer: while tokens.len() < budget {
        if let Some(c) = constraint.as_mut() {
            c.apply(&mut logits_buf)?;
        }
        let next = sampler.sample(&mut logits_buf, &context);
        // The sampled token, then any the grammar forces after it.
        let mut new = vec![next];
        if let Some(c) = constraint.as_mut() {
            let mut forced = c.advance(next, request.fast_forward)?;
            forced.truncate(budget - tokens.len() - 1);
            new.extend(forced);
        }
        for &t in &new {
            tokens.push(t);
            context.push(t);
            if request.stop_ids.contains(&t) {
                finish = FinishReason::Eos;
                break 'outer;
            }
            let piece = decoder.push(t)?;
            let (out, stopped) = stops.push(&piece);
            if !out.is_empty() {
                on_text(&out);
            }
            if stopped {
                finish = FinishReason::StopString;
                break 'outer;
            }
        }
        if constraint.as_ref().is_some_and(Constraint::is_finished) {
            finish = FinishReason::Grammar;
            break;
        }
        if tokens.len() >= budget {
            break;
        }
        logits_buf.clear();
        let crossing = recompute.is_some_and(|n| context.len() > n && context.len() - new.len() <= n);
        if crossing {
            session.reset();
        }
        let input: &[u32] = if crossing { &context } else { &new };
        match constraint.as_mut() {
            // The next mask depends only on the tokens so far: compute it while the
            // forward pass runs.
            Some(c) => {
                let (logits, mask) = std::thread::scope(|s| {
                    let mask = s.spawn(|| c.compute_mask());
                    let logits = session.forward(input, false, None);
                    (logits, mask.join())
                });
                logits_buf.extend_from_slice(logits?);
                mask.map_err(|_| RuntimeError::InvalidRequest("the grammar engine panicked".into()))??;
            }
            None => logits_buf.extend_from_slice(session.forward(input, false, None)?),
        }
    }
    if finish != FinishReason::StopString {
        let (out, _) = stops.push(&decoder.finish()?);
        let rest = out + &stops.flush();
        if !rest.is_empty() {
            on_text(&rest);
        }
    }
    let decode_time = decode_start.elapsed();
    Ok(Generation {
        tokens,
        text: stops.text,
        finish_reason: finish,
        prefill_time,
        decode_time,
        masks: constraint.map(|c| c.mask_stats()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], chunks: &[&str]) -> (String, String, bool) {
        let stops: Vec<String> = stops.iter().map(|s| s.to_string()).collect();
        let mut m = StopMatcher::new(stops.clone());
        let mut streamed = String::new();
        let mut hit = false;
        for c in chunks {
            let (out, stop) = m.push(c);
            streamed += &out;
            if stop {
                hit = true;
                break;
            }
        }
        if !hit {
            streamed += &m.flush();
        }
        (streamed, m.text, hit)
    }

    #[test]
    fn stop_string_split_across_chunks_is_never_streamed() {
        let (streamed, text, hit) = run(&["\n\nUser:"], &["Hello", "\n", "\nUs", "er: more"]);
        assert!(hit);
        assert_eq!(streamed, "Hello");
        assert_eq!(text, "Hello");
    }

    #[test]
    fn held_back_text_is_released_when_no_stop_follows() {
        let (streamed, text, hit) = run(&["END"], &["the E", "ND", "x"]);
        assert!(hit);
        assert_eq!(streamed, "the ");
        assert_eq!(text, "the ");
        let (streamed, _, hit) = run(&["END"], &["the E", "nd"]);
        assert!(!hit);
        assert_eq!(streamed, "the End");
    }

    #[test]
    fn multibyte_text_is_safe() {
        let (streamed, _, hit) = run(&["é!"], &["caf", "é", " ok"]);
        assert!(!hit);
        assert_eq!(streamed, "café ok");
    }
}
