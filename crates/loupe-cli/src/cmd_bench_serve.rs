//! `loupe bench-serve`: a fixed-seed client workload against a running OpenAI-compatible
//! server (`--url`), or against a `loupe serve` it starts and stops itself
//! ([`loupe_server::bench`] does the measuring).

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use clap::{Args, ValueEnum};

use crate::args::{parse_counts, Counts, ModelArgs};
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

/// A `loupe serve` started for the benchmark; SIGTERM on drop.
struct OwnServer {
    child: Child,
}

impl Drop for OwnServer {
    fn drop(&mut self) {
        // SAFETY: kill(2) on our own child's pid; no memory is touched.
        unsafe {
            libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM);
        }
        let _ = self.child.wait();
    }
}

fn start_server(args: &BenchServeArgs, max_seqs: usize) -> anyhow::Result<(OwnServer, String)> {
    let exe = std::env::current_exe()?;
    let mut cmd = Command::new(exe);
    cmd.args([
        "serve",
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "--max-seqs",
        &max_seqs.to_string(),
        "--max-queue",
        &args.requests.max(1).to_string(),
    ]);
    if let Some(m) = &args.model.model {
        cmd.arg("--model").arg(m);
    }
    if let Some(t) = args.model.threads {
        cmd.args(["--threads", &t.to_string()]);
    }
    if let Some(p) = args.model.precision.and_then(|p| p.to_possible_value()) {
        cmd.args(["--precision", p.get_name()]);
    }
    cmd.stdout(Stdio::null()).stderr(Stdio::piped());
    let mut child = cmd.spawn()?;
    let stderr = child.stderr.take().ok_or_else(|| anyhow::anyhow!("no stderr from loupe serve"))?;
    let server = OwnServer { child };
    let (tx, rx) = mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let mut url = None;
    loop {
        match rx.recv_timeout(Duration::from_secs(300)) {
            Ok(line) => {
                if let Some(rest) = line.split("listening on ").nth(1) {
                    url = rest.split_whitespace().next().map(str::to_string);
                }
                if line.contains(": ready in ") {
                    break;
                }
                if line.starts_with("loupe: error") {
                    return Err(UsageError(format!("loupe serve failed to start: {line}")).into());
                }
            }
            Err(_) => return Err(anyhow::anyhow!("loupe serve did not become ready")),
        }
    }
    // Keep draining its log so the server never blocks on a full pipe.
    std::thread::spawn(move || for _ in rx {});
    let url = url.ok_or_else(|| anyhow::anyhow!("loupe serve did not print its address"))?;
    eprintln!("bench-serve: started loupe serve at {url}");
    Ok((server, url))
}

pub fn run(args: BenchServeArgs) -> anyhow::Result<()> {
    if args.requests == 0 || args.output_len == 0 {
        return Err(UsageError("--requests and --output-len must be at least 1".into()).into());
    }
    if args.request_rate.is_some_and(|r| !(r.is_finite() && r > 0.0)) {
        return Err(UsageError("--request-rate must be a positive number of requests per second".into()).into());
    }
    let max_concurrency = args.concurrency.0.iter().copied().max().unwrap_or(1);
    let (_own, url) = match &args.url {
        Some(u) => (None, u.clone()),
        None => {
            let (s, u) = start_server(&args, max_concurrency)?;
            (Some(s), u)
        }
    };
    let config = loupe_server::bench::BenchConfig {
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
    let report = loupe_server::bench::run(&config).map_err(|e| anyhow::anyhow!("bench-serve: {e}"))?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        loupe_server::bench::write_tables(&report, &mut std::io::stdout())?;
    }
    Ok(())
}
