//! One request through the batched engine with speculative decoding (`loupe generate
//! --speculate`): the batched engine's rows are computed as the single-sequence engine
//! computes them (batch invariance), and speculation changes no token of a greedy answer, so
//! the output is `Engine::generate_tokens`'s; only the time differs.

use std::path::Path;
use std::time::Instant;

use crate::batch::{BatchConfig, BatchEngine, SeqEvent, SeqRequest, SpecStats, SpeculationConfig};
use crate::generate::{FinishReason, GenerateRequest, Generation, StopMatcher};
use crate::{Engine, RuntimeError};

/// Generates `request` as [`Engine::generate_tokens`] does, one sequence in a batched
/// engine that speculates with `speculation`; returns the generation and what speculation
/// did. Text goes to `on_text` as it becomes final (stop strings held back as there). With
/// `log`, each step's proposals and what was accepted go to that file as JSON lines
/// ([`crate::SpecRecord`]).
pub fn generate_speculative(
    engine: &Engine,
    request: &GenerateRequest,
    speculation: SpeculationConfig,
    log: Option<&Path>,
    on_text: &mut dyn FnMut(&str),
) -> Result<(Generation, SpecStats), RuntimeError> {
    let context = engine.graph().context_length;
    let prompt_len = request.prompt_tokens.len();
    if prompt_len >= context {
        return Err(RuntimeError::PromptTooLong { prompt: prompt_len, context });
    }
    let budget = request.max_tokens.min(context - prompt_len);
    let config = BatchConfig {
        max_seqs: 1,
        prefix_cache: false,
        kv_cache_mb: None,
        // One sequence: its whole context, and no more.
        kv_blocks: Some(context.div_ceil(BatchConfig::default().block_size) + 1),
        speculation: Some(speculation),
        speculation_log: log.map(Path::to_path_buf),
        ..BatchConfig::default()
    };
    let mut batch = BatchEngine::new(engine, config)?;
    let mut seq = SeqRequest::new(
        request.prompt_tokens.clone(),
        budget.max(1),
        request.sampling.clone(),
        request.stop_ids.clone(),
    );
    seq.grammar = request.grammar.clone();
    seq.fast_forward = request.fast_forward;
    batch.add(seq)?;
    let mut decoder = engine.tokenizer().stream_decoder(true);
    let mut stops = StopMatcher::new(request.stop_strings.clone());
    let mut tokens = Vec::with_capacity(budget);
    let mut finish = FinishReason::Length;
    let start = Instant::now();
    let mut first_token = None;
    'steps: while batch.has_work() {
        for event in batch.step()? {
            match event {
                SeqEvent::Token { token, .. } => {
                    first_token.get_or_insert_with(Instant::now);
                    tokens.push(token);
                    if request.stop_ids.contains(&token) {
                        continue;
                    }
                    let (out, stopped) = stops.push(&decoder.push(token)?);
                    if !out.is_empty() {
                        on_text(&out);
                    }
                    if stopped {
                        finish = FinishReason::StopString;
                        break 'steps;
                    }
                }
                SeqEvent::Finished { reason, .. } => finish = reason,
            }
        }
    }
    if finish != FinishReason::StopString {
        let (out, _) = stops.push(&decoder.finish()?);
        let rest = out + &stops.flush();
        if !rest.is_empty() {
            on_text(&rest);
        }
    }
    let first = first_token.unwrap_or_else(Instant::now);
    let generation = Generation {
        tokens,
        text: stops.text,
        finish_reason: finish,
        prefill_time: first - start,
        decode_time: first.elapsed(),
        masks: None,
    };
    Ok((generation, batch.stats().spec))
}
