//! `loupe serve`: the OpenAI-compatible server ([`loupe_server`]) on the batched engine.

use std::time::Duration;

use clap::Args;
use loupe_graph::debug::DebugOptions;

use crate::args::{BatchEngineArgs, ModelArgs, PrecisionArg, PrefixDiskArgs};
use crate::load::{load, Load};
use crate::UsageError;

#[derive(Args, Debug)]
pub struct ServeArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Address to listen on (127.0.0.1: this machine only; 0.0.0.0: every interface)
    #[arg(long, default_value = "127.0.0.1")]
    pub host: String,
    /// Port to listen on (0: any free port; the log line names it)
    #[arg(long, default_value_t = 8000)]
    pub port: u16,
    /// Require `Authorization: Bearer KEY` on /v1/*, /tokenize and /detokenize [default: $LOUPE_API_KEY, else no key]
    #[arg(long, env = "LOUPE_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// Drop unknown request fields with a warning instead of answering 400
    #[arg(long)]
    pub allow_extra_request_fields: bool,
    /// Sequences generating at once (the running batch)
    #[arg(long, default_value_t = 32)]
    pub max_seqs: usize,
    /// Requests that may wait for a place in the batch; beyond that, 429 with Retry-After
    #[arg(long, default_value_t = 256)]
    pub max_queue: usize,
    /// Largest request body in bytes (413 beyond)
    #[arg(long, default_value_t = 4 << 20)]
    pub max_body_bytes: usize,
    /// Seconds a request may take from arrival to its last token (408 beyond; 0 = no limit)
    #[arg(long, default_value_t = 600.0)]
    pub request_timeout: f64,
    /// Seconds in-flight requests get to finish after SIGTERM/SIGINT before they are cancelled
    #[arg(long, default_value_t = 30.0)]
    pub shutdown_timeout: f64,
    /// Context window the server enforces, prompt plus generated tokens [default: the model's]
    #[arg(long)]
    pub max_context: Option<usize>,
    /// The model id clients send in `model` [default: the model file's name without extension]
    #[arg(long)]
    pub served_model_name: Option<String>,
    /// Move the model's thinking into the message's `reasoning` field: qwen3, deepseek_r1
    /// (output starts inside the block), or none [default: by model family: qwen3 for
    /// Qwen3, none otherwise]
    #[arg(long, value_name = "NAME", value_parser = clap::builder::PossibleValuesParser::new(loupe_text::REASONING_PARSERS))]
    pub reasoning_parser: Option<String>,
    /// Shape of GET /get_load, for the router's load-based policy (power_of_two): sglang
    /// (sglang-router's smg sums `num_tokens` of `[{"num_reqs", "num_tokens", ...}]`) or vllm
    /// (vllm-router reads `{"load": requests in flight}`)
    #[arg(long, value_enum, default_value_t = LoadFormatArg::Sglang)]
    pub load_format: LoadFormatArg,
    #[command(flatten)]
    pub engine: BatchEngineArgs,
    #[command(flatten)]
    pub prefix_disk: PrefixDiskArgs,
    #[command(flatten)]
    pub profile: crate::args::ProfileArgs,
    /// Plant a fault, for testing the parity tools on a server that is wrong on purpose:
    /// graph and batched-engine faults as `loupe dump --inject` and `loupe bisect --inject`
    /// take them, and `stream-drop-last` in the server's streamed responses
    #[arg(long = "inject", value_name = "CLASS[@LAYER]")]
    pub inject: Vec<loupe_graph::Fault>,
    /// Sleep this long before loading (tests observe /health's 503 with it)
    #[arg(long, hide = true, default_value_t = 0)]
    pub load_delay_ms: u64,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug)]
pub enum LoadFormatArg {
    Sglang,
    Vllm,
}

fn seconds(flag: &str, s: f64) -> anyhow::Result<Duration> {
    if !(s.is_finite() && s >= 0.0) {
        return Err(UsageError(format!("{flag} must be a number of seconds >= 0, got {s}")).into());
    }
    Ok(Duration::from_secs_f64(s))
}

pub fn run(args: ServeArgs, debug: &DebugOptions) -> anyhow::Result<()> {
    if args.max_seqs == 0 {
        return Err(UsageError("--max-seqs must be at least 1".into()).into());
    }
    if args.max_context == Some(0) {
        return Err(UsageError("--max-context must be at least 1".into()).into());
    }
    if args.engine.block_size == 0 || args.engine.max_batch_tokens == 0 {
        return Err(UsageError("--block-size and --max-batch-tokens must be at least 1".into()).into());
    }
    if args.engine.no_prefix_cache && args.prefix_disk.prefix_cache_dir.is_some() {
        return Err(UsageError("--prefix-cache-dir needs the prefix cache (drop --no-prefix-cache)".into()).into());
    }
    let mut batch =
        args.engine.config(args.max_seqs, crate::load::draft_model(&args.engine.speculation, &args.model)?)?;
    batch.prefix_cache_disk = args.prefix_disk.config()?;
    let request_timeout = seconds("--request-timeout", args.request_timeout)?;
    let options = loupe_server::ServeOptions {
        host: args.host,
        port: args.port,
        api_key: args.api_key.filter(|k| !k.is_empty()),
        allow_extra_request_fields: args.allow_extra_request_fields,
        max_queue: args.max_queue,
        max_body_bytes: args.max_body_bytes,
        request_timeout: (!request_timeout.is_zero()).then_some(request_timeout),
        shutdown_timeout: seconds("--shutdown-timeout", args.shutdown_timeout)?,
        max_context: args.max_context,
        served_model_name: args.served_model_name,
        batch,
        drop_last_stream_delta: args.inject.iter().any(|f| f.class == loupe_graph::FaultClass::StreamDropLast),
        reasoning_parser: args.reasoning_parser,
        load_format: match args.load_format {
            LoadFormatArg::Sglang => loupe_server::LoadFormat::Sglang,
            LoadFormatArg::Vllm => loupe_server::LoadFormat::Vllm,
        },
    };
    let faults: Vec<loupe_graph::Fault> =
        args.inject.iter().filter(|f| f.class.subsystem() != loupe_graph::Subsystem::Server).copied().collect();
    if !args.inject.is_empty() {
        let list: Vec<String> = args.inject.iter().map(|f| f.to_string()).collect();
        eprintln!("loupe serve: warning: planted faults: {} (this server is wrong on purpose)", list.join(", "));
    }
    let profiler = args.profile.profiler()?;
    let load_profiler = profiler.clone();
    let model = args.model;
    let debug = debug.clone();
    // The model path is checked before the server starts, so a typo is one line and exit 2.
    crate::load::model_path(model.model.as_deref())?;
    let delay = Duration::from_millis(args.load_delay_ms);
    loupe_server::serve(options, move || {
        std::thread::sleep(delay);
        load(
            &model,
            Load { profiler: load_profiler, faults, ..Load::new(model.precision_or(PrecisionArg::Auto)) },
            &debug,
        )
        .map_err(|e| crate::one_line(&e))
    })?;
    // After a graceful shutdown (SIGINT/SIGTERM with every request done in time).
    args.profile.report(profiler.as_ref())
}
