//! `loupe generate`: load a model, build the prompt, stream the completion.

use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use clap::{Args, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};
use loupe_models::{LoadOptions, Model, Precision};
use loupe_runtime::{generate, GenerateRequest, RuntimeError, SamplingParams, Session};
use loupe_text::ChatMessage;

use crate::{model_path, UsageError};

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum PrecisionArg {
    /// Dequantize weights at load and compute in f32 (closest to PyTorch).
    F32,
    /// Keep GGML blocks in memory; dequantize in registers against f32 activations (fast).
    Native,
    /// Keep GGML blocks and quantize activations to 8-bit blocks, as llama.cpp does.
    Q8,
}

impl From<PrecisionArg> for Precision {
    fn from(p: PrecisionArg) -> Precision {
        match p {
            PrecisionArg::F32 => Precision::F32,
            PrecisionArg::Native => Precision::Native,
            PrecisionArg::Q8 => Precision::Q8,
        }
    }
}

/// Options shared by commands that load a model.
#[derive(Args, Debug, Clone)]
pub struct ModelArgs {
    /// GGUF file or Hugging Face checkpoint directory [default: the cached SmolLM2-135M-Instruct Q4_1, fetched on first use]
    #[arg(long, short = 'm')]
    pub model: Option<PathBuf>,
    /// Weight precision.
    #[arg(long, value_enum, default_value = "native")]
    pub precision: PrecisionArg,
    /// Compute threads [default: all cores]
    #[arg(long, short = 't')]
    pub threads: Option<usize>,
}

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
    /// Random seed for sampling.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Stop when this string appears (repeatable); the text is cut before it.
    #[arg(long = "stop")]
    pub stop: Vec<String>,
    /// Print one JSON object {"prompt_tokens", "tokens", "text"} instead of streaming text.
    #[arg(long)]
    pub json: bool,
}

/// Loads a model with a progress bar on stderr.
pub fn load_model(args: &ModelArgs, layers: Option<usize>) -> anyhow::Result<(Model, f64)> {
    load_model_with_faults(args, layers, Vec::new())
}

/// [`load_model`] with planted faults (`loupe dump --inject`); the graph is lowered
/// through the pass list (under `LOUPE_DEBUG`'s `ir-output-dir` and `stop-after`).
pub fn load_model_with_faults(args: &ModelArgs, layers: Option<usize>, faults: Vec<loupe_models::Fault>) -> anyhow::Result<(Model, f64)> {
    let (mut model, load_s) = load_built_model(args, layers, faults)?;
    let graph = std::mem::take(&mut model.graph);
    model.graph = crate::debug_setup::lower(graph, None)?;
    Ok((model, load_s))
}

/// The model with its graph as the builder made it (before lowering).
pub fn load_built_model(args: &ModelArgs, layers: Option<usize>, faults: Vec<loupe_models::Fault>) -> anyhow::Result<(Model, f64)> {
    let path = model_path::resolve(args.model.as_deref())?;
    let bar = ProgressBar::new(0);
    bar.set_style(ProgressStyle::with_template("loading {msg} [{bar:30}] {bytes}/{total_bytes}").map(|s| s.progress_chars("=> ")).unwrap_or_else(|_| ProgressStyle::default_bar()));
    bar.set_message(path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default());
    let progress = |done: u64, total: u64| {
        bar.set_length(total);
        bar.set_position(done);
    };
    let start = Instant::now();
    let model = loupe_models::load(&path, LoadOptions { precision: args.precision.into(), layers, progress: Some(&progress), faults })
        .map_err(|e| UsageError(e.to_string()))?;
    bar.finish_and_clear();
    Ok((model, start.elapsed().as_secs_f64()))
}

/// Prompt token ids as transformers builds them: the chat template rendered and encoded
/// without added special tokens, or the raw text with the tokenizer's default ones.
pub fn prompt_tokens(model: &Model, prompt: &str, chat: bool, system: Option<&str>) -> anyhow::Result<Vec<u32>> {
    if chat || system.is_some() {
        let template = model.chat_template.as_ref().ok_or_else(|| UsageError(format!("{}: the model has no chat template; drop --chat", model.path.display())))?;
        let mut messages = Vec::new();
        if let Some(s) = system {
            messages.push(ChatMessage::new("system", s));
        }
        messages.push(ChatMessage::new("user", prompt));
        let text = template.render(&messages, true).map_err(|e| UsageError(format!("chat template: {e}")))?;
        Ok(model.tokenizer.encode(&text, false)?)
    } else {
        Ok(model.tokenizer.encode(prompt, true)?)
    }
}

pub fn run(args: GenerateArgs) -> anyhow::Result<()> {
    let threads = crate::init_threads(args.model.threads)?;
    let sampling = SamplingParams {
        temperature: args.temperature,
        top_k: args.top_k,
        top_p: args.top_p,
        min_p: args.min_p,
        repetition_penalty: args.repetition_penalty,
        seed: args.seed,
    };
    sampling.validate().map_err(UsageError)?;
    let (model, load_s) = load_model(&args.model, None)?;
    let prompt_tokens = prompt_tokens(&model, &args.prompt, args.chat, args.system.as_deref())?;
    let context = model.config.max_position_embeddings;
    if prompt_tokens.len() >= context {
        return Err(UsageError(format!("prompt: {} tokens do not fit the context window of {context} tokens", prompt_tokens.len())).into());
    }
    let request = GenerateRequest {
        prompt_tokens: prompt_tokens.clone(),
        max_tokens: args.max_tokens,
        sampling,
        stop_ids: model.tokenizer.eos_ids(),
        stop_strings: args.stop.clone(),
    };
    let mut session = Session::new(&model.graph, (prompt_tokens.len() + args.max_tokens).min(context));
    let stdout = std::io::stdout();
    let json = args.json;
    let mut on_text = |piece: &str| {
        if !json {
            let mut out = stdout.lock();
            let _ = out.write_all(piece.as_bytes());
            let _ = out.flush();
        }
    };
    let result = generate(&mut session, &model.tokenizer, &request, &mut on_text).map_err(|e| match e {
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
        match model.precision {
            Precision::F32 => "f32",
            Precision::Native => "native",
            Precision::Q8 => "q8",
        },
        load_s,
        prompt_tokens.len(),
        result.prefill_tokens_per_s(prompt_tokens.len()),
        result.tokens.len(),
        result.decode_tokens_per_s(),
        model.path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default(),
        threads,
        result.finish_reason.as_str()
    );
    std::io::stdout().flush().context("writing stdout")?;
    Ok(())
}
