//! `loupe bench-serve`: a fixed-seed client workload against a running OpenAI-compatible
//! server (`--url`), or against a `loupe serve` it starts and stops itself
//! ([`loupe_client::bench`] does the measuring; [`loupe_client::spawn`] starts the server).

use anyhow::Context;
use clap::Args;
use loupe_client::bench::{BenchConfig, BenchReport};
use loupe_client::{ServeProcess, SpawnError, SpawnOptions};

use crate::args::{parse_counts, Counts, ModelArgs, PrefixDiskArgs};
use crate::UsageError;

#[derive(Args, Debug)]
pub struct BenchServeArgs {
    /// Server to measure (`http://127.0.0.1:8000`); without it, a `loupe serve` of --model is started
    #[arg(long)]
    pub url: Option<String>,
    /// The model id to send [default: the first of GET /v1/models]
    #[arg(long)]
    pub served_model: Option<String>,
    /// Bearer key for the server
    #[arg(long, env = "LOUPE_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// Requests in flight at once; one run per value
    #[arg(long, short = 'c', default_value = "8,32", value_parser = parse_counts)]
    pub concurrency: Counts,
    /// Requests per run
    #[arg(long, default_value_t = 64)]
    pub requests: usize,
    /// Words per prompt (about one token each)
    #[arg(long, default_value_t = 128)]
    pub input_len: usize,
    /// Tokens generated per request (the server is asked to ignore EOS)
    #[arg(long, default_value_t = 128)]
    pub output_len: usize,
    /// Poisson arrivals at this many requests per second [default: all at once]
    #[arg(long)]
    pub request_rate: Option<f64>,
    /// Seed of the prompts and arrival times
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Multi-turn chat workload: CONVERSATIONS,TURNS (0 to skip)
    #[arg(long, default_value = "4,4", value_parser = parse_counts_or_zero)]
    pub multi_turn: Counts,
    /// Print the report as JSON
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub model: ModelArgs,
    /// KV cache budget in MiB of the server it starts (a small one forces prefix-cache
    /// evictions; with --prefix-cache-dir the multi-turn table then shows what came back
    /// from disk) [default: loupe serve's]
    #[arg(long)]
    pub kv_cache_mb: Option<usize>,
    #[command(flatten)]
    pub prefix_disk: PrefixDiskArgs,
}

fn parse_counts_or_zero(s: &str) -> Result<Counts, String> {
    if s == "0" {
        return Ok(Counts(Vec::new()));
    }
    let c = parse_counts(s)?;
    if c.0.len() != 2 {
        return Err(format!("expected CONVERSATIONS,TURNS, got {s:?}"));
    }
    Ok(c)
}

/// A `loupe serve` of `--model` for the benchmark, room for `max_seqs` sequences at once and
/// every request of a run queued; stopped (SIGTERM) when the returned process drops.
fn start_server(args: &BenchServeArgs, max_seqs: usize) -> anyhow::Result<ServeProcess> {
    let exe = std::env::current_exe().context("cannot find the loupe binary")?;
    let mut flags = args.model.serve_flags();
    flags.extend(["--max-seqs".into(), max_seqs.to_string().into()]);
    flags.extend(["--max-queue".into(), args.requests.max(1).to_string().into()]);
    if let Some(mb) = args.kv_cache_mb {
        flags.extend(["--kv-cache-mb".into(), mb.to_string().into()]);
    }
    flags.extend(args.prefix_disk.serve_flags());
    let server = ServeProcess::spawn(&SpawnOptions::new(exe, flags)).map_err(|e| match e {
        // loupe serve's own one-line error (a bad --model, say) is a usage error here too.
        SpawnError::Failed { .. } => anyhow::Error::from(UsageError(e.to_string())),
        other => other.into(),
    })?;
    eprintln!("bench-serve: started loupe serve at {}", server.url());
    Ok(server)
}

pub fn run(args: BenchServeArgs) -> anyhow::Result<()> {
    if args.requests == 0 || args.output_len == 0 {
        return Err(UsageError("--requests and --output-len must be at least 1".into()).into());
    }
    if args.request_rate.is_some_and(|r| !(r.is_finite() && r > 0.0)) {
        return Err(UsageError("--request-rate must be a positive number of requests per second".into()).into());
    }
    if args.url.is_some() && (args.kv_cache_mb.is_some() || args.prefix_disk.prefix_cache_dir.is_some()) {
        return Err(UsageError(
            "--kv-cache-mb and --prefix-cache-dir configure the server bench-serve starts; with --url, pass them to that server"
                .into(),
        )
        .into());
    }
    if args.url.is_none() {
        // A bad directory is one line here, not a server that fails to start.
        args.prefix_disk.config()?;
    }
    let max_concurrency = args.concurrency.0.iter().copied().max().unwrap_or(1);
    let (_own, url) = match &args.url {
        Some(u) => (None, u.clone()),
        None => {
            let server = start_server(&args, max_concurrency)?;
            let url = server.url();
            (Some(server), url)
        }
    };
    let config = BenchConfig {
        url,
        model: args.served_model.clone(),
        api_key: args.api_key.clone(),
        concurrency: args.concurrency.0.clone(),
        requests: args.requests,
        input_words: args.input_len,
        output_tokens: args.output_len,
        request_rate: args.request_rate,
        seed: args.seed,
        multi_turn: match args.multi_turn.0.as_slice() {
            [c, t] => Some((*c, *t)),
            _ => None,
        },
    };
    let report: BenchReport = loupe_client::bench::run(&config).map_err(|e| anyhow::anyhow!("bench-serve: {e}"))?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        loupe_client::bench::write_tables(&report, &mut std::io::stdout())?;
    }
    Ok(())
}
