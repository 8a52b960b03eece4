//! `loupe generate`: load a model, build the prompt, stream the completion.

use std::io::Write;

use anyhow::Context;
use clap::Args;
use loupe_graph::debug::DebugOptions;
use loupe_runtime::{GenerateRequest, Prompt, RuntimeError, SamplingParams};

use crate::args::{precision_name, ModelArgs, PrecisionArg};
use crate::load::{cli_error, load, Load};
use crate::UsageError;

#[derive(Args, Debug)]
pub struct GenerateArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// The prompt (the user message with --chat).
    pub prompt: String,
    /// Wrap the prompt in the model's chat template as a user message.
    #[arg(long)]
    pub chat: bool,
    /// System message (implies --chat).
    #[arg(long)]
    pub system: Option<String>,
    /// Maximum new tokens.
    #[arg(long, short = 'n', default_value_t = 256)]
    pub max_tokens: usize,
    /// Sampling temperature; 0 is greedy.
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    /// Keep only the K most likely tokens (0 = off).
    #[arg(long, default_value_t = 0)]
    pub top_k: usize,
    /// Nucleus sampling threshold (1 = off).
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f32,
    /// Drop tokens below this fraction of the top probability (0 = off).
    #[arg(long, default_value_t = 0.0)]
    pub min_p: f32,
    /// Penalty on tokens already present (1 = off).
    #[arg(long, default_value_t = 1.0)]
    pub repetition_penalty: f32,
    /// OpenAI's presence penalty on tokens already generated, -2..2 (0 = off).
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub presence_penalty: f32,
    /// OpenAI's frequency penalty per earlier generation of a token, -2..2 (0 = off).
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub frequency_penalty: f32,
    /// Random seed for sampling.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Stop when this string appears (repeatable); the text is cut before it.
    #[arg(long = "stop")]
    pub stop: Vec<String>,
    /// Print one JSON object {"prompt_tokens", "tokens", "text"} instead of streaming text.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub profile: crate::args::ProfileArgs,
}

pub fn run(args: GenerateArgs, debug: &DebugOptions) -> anyhow::Result<()> {
    let sampling = SamplingParams {
        temperature: args.temperature,
        top_k: args.top_k,
        top_p: args.top_p,
        min_p: args.min_p,
        repetition_penalty: args.repetition_penalty,
        presence_penalty: args.presence_penalty,
        frequency_penalty: args.frequency_penalty,
        seed: args.seed,
    };
    sampling.validate().map_err(UsageError)?;
    let profiler = args.profile.profiler()?;
    let engine = load(&args.model, Load { profiler: profiler.clone(), ..Load::new(args.model.precision_or(PrecisionArg::Native)) }, debug)?;
    let prompt = Prompt { text: &args.prompt, chat: args.chat, system: args.system.as_deref() };
    let prompt_tokens = engine.prompt_tokens(&prompt).map_err(cli_error)?;
    let context = engine.config().max_position_embeddings;
    if prompt_tokens.len() >= context {
        return Err(UsageError(format!("prompt: {} tokens do not fit the context window of {context} tokens", prompt_tokens.len())).into());
    }
    let request = GenerateRequest {
        prompt_tokens: prompt_tokens.clone(),
        max_tokens: args.max_tokens,
        sampling,
        stop_ids: engine.tokenizer().eos_ids(),
        stop_strings: args.stop.clone(),
    };
    let stdout = std::io::stdout();
    let json = args.json;
    let mut on_text = |piece: &str| {
        if !json {
            let mut out = stdout.lock();
            let _ = out.write_all(piece.as_bytes());
            let _ = out.flush();
        }
    };
    let result = engine.generate_tokens(&request, &mut on_text).map_err(|e| match e {
        RuntimeError::PromptTooLong { .. } | RuntimeError::InvalidRequest(_) => anyhow::Error::from(UsageError(e.to_string())),
        other => anyhow::Error::from(other),
    })?;
    if json {
        let obj = serde_json::json!({ "prompt_tokens": prompt_tokens, "tokens": result.tokens, "text": result.text });
        println!("{obj}");
    } else {
        println!();
    }
    eprintln!(
        "loupe: {} load {:.2} s | prefill {} tokens {:.1} tokens/s | decode {} tokens {:.1} tokens/s | {} | {} threads | finish: {}",
        precision_name(engine.precision()),
        engine.load_time().as_secs_f64(),
        prompt_tokens.len(),
        result.prefill_tokens_per_s(prompt_tokens.len()),
        result.tokens.len(),
        result.decode_tokens_per_s(),
        engine.path().file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default(),
        engine.threads(),
        result.finish_reason.as_str()
    );
    std::io::stdout().flush().context("writing stdout")?;
    args.profile.report(profiler.as_ref())
}
