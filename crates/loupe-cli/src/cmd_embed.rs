//! `loupe embed`: sentence embeddings from an encoder model (BERT), pooled and normalized as
//! the checkpoint's sentence-transformers files say, printed as an OpenAI-style JSON list.

use std::io::{BufRead, Write};

use anyhow::Context;
use clap::Args;
use loupe_graph::debug::DebugOptions;
use loupe_runtime::Pooling;
use serde_json::json;

use crate::args::{ModelArgs, PrecisionArg};
use crate::load::{load, Load};
use crate::UsageError;

/// The model `loupe embed` fetches when `--model` is omitted (`scripts/fetch-model` name).
pub const DEFAULT_EMBED_MODEL: &str = "all-minilm-l6-v2";

#[derive(Args, Debug)]
pub struct EmbedArgs {
    /// Encoder checkpoint directory (BERT: config.json, model.safetensors, tokenizer.json,
    /// optional sentence-transformers files) [default: all-MiniLM-L6-v2, fetched on first use]
    #[arg(long, short = 'm')]
    pub model: Option<std::path::PathBuf>,
    /// Weight precision [default: native, which is the checkpoint's own (f32 for MiniLM)]
    #[arg(long, value_enum)]
    pub precision: Option<PrecisionArg>,
    /// Compute threads [default: all cores]
    #[arg(long, short = 't')]
    pub threads: Option<usize>,
    /// Texts to embed, one vector each.
    pub texts: Vec<String>,
    /// Also embed each line of this file ("-": standard input); empty lines are skipped.
    #[arg(long)]
    pub file: Option<std::path::PathBuf>,
    /// Pooling of the token states: mean, cls or max [default: the checkpoint's Pooling
    /// module, else mean]
    #[arg(long, value_parser = parse_pooling)]
    pub pooling: Option<Pooling>,
    /// L2-normalize each vector [default: when the checkpoint's pipeline ends in Normalize]
    #[arg(long, overrides_with = "no_normalize")]
    pub normalize: bool,
    /// Do not normalize, whatever the checkpoint says.
    #[arg(long)]
    pub no_normalize: bool,
    /// Cut inputs to this many tokens, specials included [default: the checkpoint's
    /// max_seq_length, else the model's window]
    #[arg(long)]
    pub max_tokens: Option<usize>,
    /// Print the cosine similarity of every pair of inputs after the JSON (a matrix on stderr).
    #[arg(long)]
    pub similarity: bool,
}

fn parse_pooling(s: &str) -> Result<Pooling, String> {
    Pooling::from_name(s).ok_or_else(|| format!("'{s}' is not a pooling (mean, cls, max)"))
}

pub fn run(args: EmbedArgs, debug: &DebugOptions) -> anyhow::Result<()> {
    if args.max_tokens == Some(0) {
        return Err(UsageError("--max-tokens must be at least 1".into()).into());
    }
    let mut texts = args.texts.clone();
    if let Some(path) = &args.file {
        let lines: Vec<String> = if path.as_os_str() == "-" {
            std::io::stdin().lock().lines().collect::<Result<_, _>>().context("reading standard input")?
        } else {
            let f = std::fs::File::open(path).map_err(|e| UsageError(format!("--file {}: {e}", path.display())))?;
            std::io::BufReader::new(f)
                .lines()
                .collect::<Result<_, _>>()
                .with_context(|| format!("reading {}", path.display()))?
        };
        texts.extend(lines.into_iter().filter(|l| !l.trim().is_empty()));
    }
    if texts.is_empty() {
        return Err(UsageError("nothing to embed: give texts as arguments or --file".into()).into());
    }
    let model = match &args.model {
        Some(p) => p.clone(),
        None => loupe_runtime::fetch_model(DEFAULT_EMBED_MODEL)?,
    };
    let model_args =
        ModelArgs { model: Some(model), precision: args.precision, threads: args.threads, ..Default::default() };
    let engine = load(&model_args, Load::new(model_args.precision_or(PrecisionArg::Auto)), debug)?;
    if !engine.is_encoder() {
        return Err(UsageError(format!(
            "{} is a {} decoder: loupe embed needs an encoder model (BERT, e.g. `loupe fetch-model {DEFAULT_EMBED_MODEL}`)",
            engine.path().display(),
            engine.config().family().name()
        ))
        .into());
    }
    let mut config = engine.embed_config().map_err(|e| UsageError(e.to_string()))?;
    if let Some(p) = args.pooling {
        config.pooling = p;
    }
    if args.normalize {
        config.normalize = true;
    }
    if args.no_normalize {
        config.normalize = false;
    }
    if let Some(n) = args.max_tokens {
        config.max_tokens = n.min(engine.context_length());
    }
    let mut data = Vec::with_capacity(texts.len());
    let mut vectors = Vec::with_capacity(texts.len());
    let mut tokens = 0;
    for (i, e) in engine.embed_all(&texts, &config)?.into_iter().enumerate() {
        if e.truncated {
            eprintln!("loupe: input {i} was cut to {} tokens (--max-tokens)", config.max_tokens);
        }
        tokens += e.tokens;
        data.push(json!({"object": "embedding", "index": i, "embedding": e.vector}));
        vectors.push(e.vector);
    }
    let out = json!({
        "object": "list",
        "model": engine.path().display().to_string(),
        "pooling": config.pooling.name(),
        "normalized": config.normalize,
        "data": data,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    });
    let mut stdout = std::io::stdout().lock();
    serde_json::to_writer(&mut stdout, &out)?;
    writeln!(stdout)?;
    if args.similarity {
        for a in &vectors {
            let row: Vec<String> = vectors.iter().map(|b| format!("{:.4}", cosine(a, b))).collect();
            eprintln!("{}", row.join(" "));
        }
    }
    Ok(())
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(&x, &y)| x as f64 * y as f64).sum();
    let na: f64 = a.iter().map(|&x| x as f64 * x as f64).sum::<f64>().sqrt();
    let nb: f64 = b.iter().map(|&x| x as f64 * x as f64).sum::<f64>().sqrt();
    if na == 0.0 || nb == 0.0 {
        0.0
    } else {
        dot / (na * nb)
    }
}
