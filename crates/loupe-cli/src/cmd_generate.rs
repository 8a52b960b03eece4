//! `loupe generate`: load a model, build the prompt, stream the completion.

use std::io::Write;

use anyhow::Context;
use clap::Args;
use loupe_graph::debug::DebugOptions;
use loupe_runtime::{ConstraintError, GenerateRequest, GrammarSpec, Prompt, RuntimeError, SamplingParams};

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
    pub grammar: GrammarArgs,
    #[command(flatten)]
    pub speculation: crate::args::SpeculationArgs,
    #[command(flatten)]
    pub prefill: crate::args::PrefillArgs,
    #[command(flatten)]
    pub profile: crate::args::ProfileArgs,
}

/// Constrained decoding: at most one of these (the output must match it).
#[derive(Args, Debug, Default)]
#[group(multiple = false)]
pub struct GrammarArgs {
    /// Output must be JSON valid against the JSON Schema in FILE.
    #[arg(long, value_name = "FILE")]
    pub json_schema: Option<std::path::PathBuf>,
    /// Output must be a JSON object.
    #[arg(long)]
    pub json_object: bool,
    /// Output must match this regular expression (whole).
    #[arg(long, value_name = "REGEX")]
    pub regex: Option<String>,
    /// Output must match the Lark grammar in FILE (llguidance's dialect; the root rule is `start`).
    #[arg(long, value_name = "FILE")]
    pub grammar: Option<std::path::PathBuf>,
    /// With a grammar: append the tokens it forces without sampling them.
    #[arg(long)]
    pub fast_forward: bool,
}

impl GrammarArgs {
    /// The grammar asked for, read from its file; a file that is missing or not JSON is a
    /// usage error naming it.
    pub fn spec(&self) -> Result<Option<GrammarSpec>, UsageError> {
        let read =
            |p: &std::path::Path| std::fs::read_to_string(p).map_err(|e| UsageError(format!("{}: {e}", p.display())));
        Ok(if let Some(p) = &self.json_schema {
            let text = read(p)?;
            let schema: serde_json::Value =
                serde_json::from_str(&text).map_err(|e| UsageError(format!("{}: not JSON: {e}", p.display())))?;
            Some(GrammarSpec::JsonSchema(schema))
        } else if self.json_object {
            Some(GrammarSpec::JsonObject)
        } else if let Some(rx) = &self.regex {
            Some(GrammarSpec::Regex(rx.clone()))
        } else if let Some(p) = &self.grammar {
            Some(GrammarSpec::Lark(read(p)?))
        } else {
            if self.fast_forward {
                return Err(UsageError(
                    "--fast-forward needs a grammar (--json-schema, --json-object, --regex or --grammar)".into(),
                ));
            }
            None
        })
    }
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
    let grammar = args.grammar.spec()?;
    let speculation = args.speculation.config(crate::load::draft_model(&args.speculation, &args.model)?)?;
    let profiler = args.profile.profiler()?;
    let mut engine = load(
        &args.model,
        Load { profiler: profiler.clone(), ..Load::new(args.model.precision_or(PrecisionArg::Auto)) },
        debug,
    )?;
    args.prefill.apply(&mut engine);
    let prompt = Prompt { text: &args.prompt, chat: args.chat, system: args.system.as_deref() };
    let prompt_tokens = engine.prompt_tokens(&prompt).map_err(cli_error)?;
    let context = engine.config().max_position_embeddings();
    if prompt_tokens.len() >= context {
        return Err(UsageError(format!(
            "prompt: {} tokens do not fit the context window of {context} tokens",
            prompt_tokens.len()
        ))
        .into());
    }
    let request = GenerateRequest {
        prompt_tokens: prompt_tokens.clone(),
        max_tokens: args.max_tokens,
        sampling,
        stop_ids: engine.tokenizer().eos_ids(),
        stop_strings: args.stop.clone(),
        grammar,
        fast_forward: args.grammar.fast_forward,
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
    let usage_error = |e: RuntimeError| match e {
        RuntimeError::PromptTooLong { .. }
        | RuntimeError::InvalidRequest(_)
        | RuntimeError::Constraint(ConstraintError::Invalid { .. }) => anyhow::Error::from(UsageError(e.to_string())),
        other => anyhow::Error::from(other),
    };
    // With --speculate: one sequence through the batched engine, whose tokens are these
    // (batch invariance; speculation changes no greedy token).
    let drafter = speculation.as_ref().map(|s| s.drafter.name());
    let (result, spec) = match speculation {
        None => (engine.generate_tokens(&request, &mut on_text).map_err(usage_error)?, None),
        Some(s) => {
            let (g, stats) = loupe_runtime::generate_speculative(
                &engine,
                &request,
                s,
                args.speculation.speculation_log.as_deref(),
                &mut on_text,
            )
            .map_err(usage_error)?;
            (g, Some(stats))
        }
    };
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
    if let Some(s) = spec {
        eprintln!(
            "loupe: speculation ({}, up to {} drafts): {} verification steps, {} of {} drafts accepted ({:.0}%), {:.2} tokens per verification",
            drafter.unwrap_or_default(),
            args.speculation.draft_tokens(),
            s.verify_steps,
            s.accepted_tokens,
            s.draft_tokens,
            100.0 * s.acceptance_rate(),
            s.tokens_per_verify_step()
        );
    }
    if let Some((n, t)) = result.masks {
        eprintln!(
            "loupe: grammar masks {n}, {:.3} ms each (computed during the forward passes)",
            t.as_secs_f64() * 1e3 / n.max(1) as f64
        );
    }
    std::io::stdout().flush().context("writing stdout")?;
    args.profile.report(profiler.as_ref())
}
