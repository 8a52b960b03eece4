//! `loupe bench-serve`: drives an OpenAI-compatible server (loupe's, llama-server, vLLM)
//! with a fixed-seed workload and measures it as a client sees it.
//!
//! * **Load**: `requests` streamed completions of fixed-seed random-word prompts, at most
//!   `concurrency` in flight, optionally arriving as a Poisson process of `request_rate`
//!   per second (seeded); `ignore_eos` fixes every output at `output_tokens`. Per request:
//!   TTFT (send to first content chunk), TPOT ((last chunk − first chunk) / (tokens − 1)),
//!   ITL (the gaps between content chunks); per run: output tokens/s and requests/s over
//!   the wall time, and p50/p90/p99 of each.
//! * **Multi-turn chat**: `conversations` chats of `turns` turns run side by side; each
//!   turn resends the whole history. Per turn: the mean `cached_tokens` the server
//!   reports, and the retention: cached tokens / the previous turn's prompt + answer (how
//!   much of the conversation's KV the server kept).

use std::sync::Arc;
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use loupe_core::SplitMix64;
use serde_json::{json, Value};

/// What to run.
#[derive(Debug, Clone)]
pub struct BenchConfig {
    /// Base URL, `http://127.0.0.1:8000` (the `/v1/...` paths are added).
    pub url: String,
    pub model: Option<String>,
    pub api_key: Option<String>,
    pub concurrency: Vec<usize>,
    pub requests: usize,
    /// Words per prompt (about one token each for the default tokenizer).
    pub input_words: usize,
    pub output_tokens: usize,
    /// Requests per second (Poisson arrivals); `None`: all at once, `concurrency` at a time.
    pub request_rate: Option<f64>,
    pub seed: u64,
    /// `(conversations, turns)` of the multi-turn workload; `None`: skip it.
    pub multi_turn: Option<(usize, usize)>,
}

/// p50, p90, p99 (linear interpolation between order statistics, as numpy's default).
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct Percentiles {
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub mean: f64,
}

impl Percentiles {
    pub fn of(values: &[f64]) -> Percentiles {
        if values.is_empty() {
            return Percentiles::default();
        }
        let mut v = values.to_vec();
        v.sort_by(f64::total_cmp);
        let at = |q: f64| {
            let x = q * (v.len() - 1) as f64;
            let (lo, hi) = (x.floor() as usize, x.ceil() as usize);
            v[lo] + (v[hi] - v[lo]) * (x - lo as f64)
        };
        Percentiles { p50: at(0.5), p90: at(0.9), p99: at(0.99), mean: v.iter().sum::<f64>() / v.len() as f64 }
    }
}

/// One load run's results; times in milliseconds.
#[derive(Debug, Clone, serde::Serialize)]
pub struct LoadResult {
    pub concurrency: usize,
    pub request_rate: Option<f64>,
    pub requests: usize,
    pub errors: usize,
    /// The first error's message, if any.
    pub first_error: Option<String>,
    pub duration_s: f64,
    pub output_tokens: usize,
    pub output_tokens_per_s: f64,
    pub requests_per_s: f64,
    pub ttft_ms: Percentiles,
    pub tpot_ms: Percentiles,
    pub itl_ms: Percentiles,
}

/// One turn of the multi-turn workload, averaged over the conversations.
#[derive(Debug, Clone, serde::Serialize)]
pub struct TurnResult {
    pub turn: usize,
    pub prompt_tokens: f64,
    pub cached_tokens: f64,
    /// Cached tokens / the previous turn's prompt + completion tokens (None on turn 1).
    pub retention: Option<f64>,
    pub ttft_ms: f64,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct BenchReport {
    pub url: String,
    pub model: String,
    pub input_words: usize,
    pub output_tokens: usize,
    pub load: Vec<LoadResult>,
    pub multi_turn: Vec<TurnResult>,
}

type HttpClient = Client<HttpConnector, Full<Bytes>>;

struct Shared {
    client: HttpClient,
    url: String,
    api_key: Option<String>,
}

/// What one streamed request saw.
#[derive(Default)]
struct Record {
    ttft: f64,
    chunk_times: Vec<f64>,
    output_tokens: usize,
    prompt_tokens: usize,
    cached_tokens: usize,
    text: String,
}

impl Shared {
    /// A request to `path` with the bearer key, if any.
    fn request(&self, method: hyper::Method, path: &str, body: Bytes) -> Result<hyper::Request<Full<Bytes>>, String> {
        let mut req = hyper::Request::builder()
            .method(method)
            .uri(format!("{}{}", self.url, path))
            .header("content-type", "application/json");
        if let Some(k) = &self.api_key {
            req = req.header("authorization", format!("Bearer {k}"));
        }
        req.body(Full::new(body)).map_err(|e| e.to_string())
    }

    async fn post(&self, path: &str, body: &Value) -> Result<hyper::Response<hyper::body::Incoming>, String> {
        let req = self.request(hyper::Method::POST, path, Bytes::from(body.to_string()))?;
        self.client.request(req).await.map_err(|e| format!("{path}: {e}"))
    }

    async fn get_json(&self, path: &str) -> Result<Value, String> {
        let req = self.request(hyper::Method::GET, path, Bytes::new())?;
        let resp = self.client.request(req).await.map_err(|e| format!("{path}: {e}"))?;
        let status = resp.status();
        let bytes = resp.into_body().collect().await.map_err(|e| e.to_string())?.to_bytes();
        if !status.is_success() {
            return Err(format!("{path}: HTTP {status}: {}", String::from_utf8_lossy(&bytes)));
        }
        serde_json::from_slice(&bytes).map_err(|e| format!("{path}: {e}"))
    }

    /// Sends a streaming request and times its content chunks.
    async fn stream(&self, path: &str, body: &Value) -> Result<Record, String> {
        let start = Instant::now();
        let resp = self.post(path, body).await?;
        let status = resp.status();
        let mut body_stream = resp.into_body();
        if !status.is_success() {
            let bytes = body_stream.collect().await.map_err(|e| e.to_string())?.to_bytes();
            return Err(format!("HTTP {status}: {}", String::from_utf8_lossy(&bytes)));
        }
        let mut rec = Record::default();
        let mut pending = Vec::<u8>::new();
        let mut chunks = 0usize;
        let mut done = false;
        while let Some(frame) = body_stream.frame().await {
            let frame = frame.map_err(|e| e.to_string())?;
            let Some(data) = frame.data_ref() else { continue };
            pending.extend_from_slice(data);
            // SSE events end with a blank line.
            while let Some(end) = find_event_end(&pending) {
                let event: Vec<u8> = pending.drain(..end).collect();
                for line in String::from_utf8_lossy(&event).lines() {
                    let Some(payload) = line.strip_prefix("data:").map(str::trim) else { continue };
                    if payload == "[DONE]" {
                        done = true;
                        continue;
                    }
                    let v: Value =
                        serde_json::from_str(payload).map_err(|e| format!("bad SSE data {payload:?}: {e}"))?;
                    if let Some(err) = v.get("error") {
                        return Err(format!("error event: {err}"));
                    }
                    let choice = v.get("choices").and_then(|c| c.get(0));
                    let text = choice
                        .and_then(|c| c.get("text").or_else(|| c.get("delta").and_then(|d| d.get("content"))))
                        .and_then(Value::as_str)
                        .unwrap_or("");
                    if !text.is_empty() {
                        let t = start.elapsed().as_secs_f64() * 1e3;
                        if chunks == 0 {
                            rec.ttft = t;
                        }
                        rec.chunk_times.push(t);
                        rec.text.push_str(text);
                        chunks += 1;
                    }
                    if let Some(u) = v.get("usage").filter(|u| !u.is_null()) {
                        rec.output_tokens = u.get("completion_tokens").and_then(Value::as_u64).unwrap_or(0) as usize;
                        rec.prompt_tokens = u.get("prompt_tokens").and_then(Value::as_u64).unwrap_or(0) as usize;
                        rec.cached_tokens =
                            u.pointer("/prompt_tokens_details/cached_tokens").and_then(Value::as_u64).unwrap_or(0)
                                as usize;
                    }
                }
            }
        }
        if !done {
            return Err("the stream ended without data: [DONE]".into());
        }
        if rec.output_tokens == 0 {
            rec.output_tokens = chunks;
        }
        Ok(rec)
    }
}

fn find_event_end(buf: &[u8]) -> Option<usize> {
    let lf = buf.windows(2).position(|w| w == b"\n\n").map(|i| i + 2);
    let crlf = buf.windows(4).position(|w| w == b"\r\n\r\n").map(|i| i + 4);
    match (lf, crlf) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// Common English words: prompts are random sequences of them (about a token each).
const WORDS: &[&str] = &[
    "the", "of", "and", "to", "in", "is", "was", "for", "on", "are", "with", "they", "be", "at", "one", "have", "this",
    "from", "by", "hot", "word", "but", "what", "some", "we", "can", "out", "other", "were", "all", "there", "when",
    "up", "use", "your", "how", "said", "an", "each", "she", "which", "do", "their", "time", "if", "will", "way",
    "about", "many", "then", "them", "write", "would", "like", "so", "these", "her", "long", "make", "thing", "see",
    "him", "two", "has", "look", "more", "day", "could", "go", "come", "did", "number", "sound", "no", "most",
    "people", "my", "over", "know", "water", "than", "call", "first", "who", "may", "down", "side", "been", "now",
    "find", "any", "new", "work", "part", "take", "get", "place", "made", "live", "where", "after", "back", "little",
    "only", "round", "man", "year", "came", "show", "every", "good", "me", "give", "our", "under", "name", "very",
    "through", "just", "form", "sentence", "great", "think", "say", "help", "low", "line", "differ", "turn", "cause",
    "much", "mean", "before", "move", "right", "boy", "old", "too", "same", "tell", "does", "set", "three", "want",
    "air", "well", "also", "play", "small", "end", "put", "home", "read", "hand", "port", "large", "spell", "add",
    "even", "land", "here", "must", "big", "high", "such", "follow", "act", "why", "ask", "men", "change", "went",
    "light", "kind", "off", "need", "house", "picture", "try", "us", "again", "animal", "point", "mother", "world",
    "near", "build", "self", "earth", "father", "head", "stand", "own", "page", "should", "country", "found", "answer",
    "school", "grow", "study", "still", "learn", "plant",
];

fn random_words(rng: &mut SplitMix64, n: usize) -> String {
    (0..n).map(|_| WORDS[rng.below(WORDS.len())]).collect::<Vec<_>>().join(" ")
}

/// Why a benchmark stopped: the request or set-up step that failed, as a sentence.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct BenchError(String);

/// Runs the whole benchmark against `config.url`, reporting progress on stderr.
pub fn run(config: &BenchConfig) -> Result<BenchReport, BenchError> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| BenchError(format!("cannot start the client runtime: {e}")))?;
    runtime.block_on(run_async(config)).map_err(BenchError)
}

async fn run_async(config: &BenchConfig) -> Result<BenchReport, String> {
    // A fresh connection per request: servers differ in how they treat idle keep-alive
    // connections (llama-server closes them under a pooled client), and on loopback a
    // connection costs microseconds.
    let client: HttpClient = Client::builder(TokioExecutor::new()).pool_max_idle_per_host(0).build_http();
    let shared =
        Arc::new(Shared { client, url: config.url.trim_end_matches('/').to_string(), api_key: config.api_key.clone() });
    let model = match &config.model {
        Some(m) => m.clone(),
        None => {
            let models = shared.get_json("/v1/models").await?;
            models
                .pointer("/data/0/id")
                .and_then(Value::as_str)
                .ok_or("GET /v1/models lists no model; pass --served-model")?
                .to_string()
        }
    };
    // Warm-up: one short request (first-touch of pages, connection set-up).
    let warm = json!({"model": model, "prompt": "Hello", "max_tokens": 4, "temperature": 0, "stream": true, "ignore_eos": true});
    shared.stream("/v1/completions", &warm).await.map_err(|e| format!("warm-up request failed: {e}"))?;

    let mut load = Vec::new();
    for &concurrency in &config.concurrency {
        eprintln!(
            "bench-serve: {} requests, concurrency {concurrency}{} ...",
            config.requests,
            config.request_rate.map(|r| format!(", {r} req/s")).unwrap_or_default()
        );
        let r = load_run(&shared, &model, config, concurrency).await;
        eprintln!(
            "bench-serve:   {:.1} output tok/s, TTFT p50 {:.0} ms, TPOT p50 {:.1} ms, {} errors",
            r.output_tokens_per_s, r.ttft_ms.p50, r.tpot_ms.p50, r.errors
        );
        load.push(r);
    }
    let multi_turn = match config.multi_turn {
        Some((conversations, turns)) => {
            eprintln!("bench-serve: multi-turn chat, {conversations} conversations x {turns} turns ...");
            multi_turn_run(&shared, &model, config, conversations, turns).await?
        }
        None => Vec::new(),
    };
    Ok(BenchReport {
        url: config.url.clone(),
        model,
        input_words: config.input_words,
        output_tokens: config.output_tokens,
        load,
        multi_turn,
    })
}

async fn load_run(shared: &Arc<Shared>, model: &str, config: &BenchConfig, concurrency: usize) -> LoadResult {
    // Each concurrency level gets its own prompts, so a server's prefix cache never serves
    // one run from another (the same seed and level give the same prompts on every server).
    let mut rng = SplitMix64(config.seed ^ (concurrency as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15));
    let prompts: Vec<String> = (0..config.requests).map(|_| random_words(&mut rng, config.input_words)).collect();
    // Poisson arrivals: exponential gaps with mean 1/rate, from the same seed.
    let mut arrivals = Vec::with_capacity(config.requests);
    let mut t = 0.0f64;
    for _ in 0..config.requests {
        arrivals.push(t);
        if let Some(rate) = config.request_rate {
            let u = (rng.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
            t += -(1.0 - u).ln() / rate;
        }
    }
    let gate = Arc::new(tokio::sync::Semaphore::new(concurrency.max(1)));
    let start = Instant::now();
    let mut tasks = Vec::with_capacity(config.requests);
    for (prompt, at) in prompts.into_iter().zip(arrivals) {
        let wait = Duration::from_secs_f64(at).saturating_sub(start.elapsed());
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
        let permit = gate.clone().acquire_owned().await;
        let shared = shared.clone();
        let body = json!({"model": model, "prompt": prompt, "max_tokens": config.output_tokens, "temperature": 0, "stream": true,
                          "stream_options": {"include_usage": true}, "ignore_eos": true});
        tasks.push(tokio::spawn(async move {
            let r = shared.stream("/v1/completions", &body).await;
            drop(permit);
            r
        }));
    }
    let mut records = Vec::new();
    let mut errors = Vec::new();
    for t in tasks {
        match t.await {
            Ok(Ok(r)) => records.push(r),
            Ok(Err(e)) => errors.push(e),
            Err(e) => errors.push(e.to_string()),
        }
    }
    let duration = start.elapsed().as_secs_f64();
    let output_tokens: usize = records.iter().map(|r| r.output_tokens).sum();
    let ttft: Vec<f64> = records.iter().map(|r| r.ttft).collect();
    let tpot: Vec<f64> = records
        .iter()
        .filter(|r| r.output_tokens > 1 && r.chunk_times.len() > 1)
        .map(|r| (r.chunk_times[r.chunk_times.len() - 1] - r.chunk_times[0]) / (r.output_tokens - 1) as f64)
        .collect();
    let itl: Vec<f64> = records.iter().flat_map(|r| r.chunk_times.windows(2).map(|w| w[1] - w[0])).collect();
    LoadResult {
        concurrency,
        request_rate: config.request_rate,
        requests: config.requests,
        errors: errors.len(),
        first_error: errors.into_iter().next(),
        duration_s: duration,
        output_tokens,
        output_tokens_per_s: output_tokens as f64 / duration.max(1e-9),
        requests_per_s: records.len() as f64 / duration.max(1e-9),
        ttft_ms: Percentiles::of(&ttft),
        tpot_ms: Percentiles::of(&tpot),
        itl_ms: Percentiles::of(&itl),
    }
}

/// One conversation's turn: token counts the server reported and the time to first token.
struct TurnSample {
    prompt: usize,
    cached: usize,
    output: usize,
    ttft: f64,
}

async fn multi_turn_run(
    shared: &Arc<Shared>,
    model: &str,
    config: &BenchConfig,
    conversations: usize,
    turns: usize,
) -> Result<Vec<TurnResult>, String> {
    let mut tasks = Vec::new();
    for c in 0..conversations {
        let shared = shared.clone();
        let model = model.to_string();
        let (seed, words, out) = (config.seed ^ (0x9e37_79b9 + c as u64), config.input_words, config.output_tokens);
        tasks.push(tokio::spawn(async move {
            let mut rng = SplitMix64(seed);
            let mut messages = vec![json!({"role": "system", "content": "You are a helpful assistant."})];
            let mut per_turn = Vec::new();
            for _ in 0..turns {
                messages.push(json!({"role": "user", "content": random_words(&mut rng, words)}));
                let body = json!({"model": model, "messages": messages, "max_tokens": out, "temperature": 0, "stream": true,
                                  "stream_options": {"include_usage": true}, "ignore_eos": true});
                let r = shared.stream("/v1/chat/completions", &body).await?;
                messages.push(json!({"role": "assistant", "content": r.text}));
                per_turn.push(TurnSample { prompt: r.prompt_tokens, cached: r.cached_tokens, output: r.output_tokens, ttft: r.ttft });
            }
            Ok::<_, String>(per_turn)
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.push(t.await.map_err(|e| e.to_string())??);
    }
    let n = all.len().max(1) as f64;
    Ok((0..turns)
        .map(|k| {
            let mean = |f: &dyn Fn(&TurnSample) -> f64| all.iter().map(|c| f(&c[k])).sum::<f64>() / n;
            let retention = (k > 0).then(|| {
                all.iter().map(|c| c[k].cached as f64 / (c[k - 1].prompt + c[k - 1].output).max(1) as f64).sum::<f64>()
                    / n
            });
            TurnResult {
                turn: k + 1,
                prompt_tokens: mean(&|t| t.prompt as f64),
                cached_tokens: mean(&|t| t.cached as f64),
                retention,
                ttft_ms: mean(&|t| t.ttft),
            }
        })
        .collect())
}

/// The report as tables.
pub fn write_tables(report: &BenchReport, out: &mut dyn std::io::Write) -> std::io::Result<()> {
    writeln!(
        out,
        "server {} · model {} · {} prompt words · {} output tokens (ignore_eos)",
        report.url, report.model, report.input_words, report.output_tokens
    )?;
    writeln!(out, "| concurrency | req/s | output tok/s | TTFT p50/p90/p99 ms | TPOT p50/p90/p99 ms | ITL p50/p90/p99 ms | errors |")?;
    writeln!(out, "| ---: | ---: | ---: | --- | --- | --- | ---: |")?;
    for r in &report.load {
        let p = |p: &Percentiles| format!("{:.0} / {:.0} / {:.0}", p.p50, p.p90, p.p99);
        let q = |p: &Percentiles| format!("{:.1} / {:.1} / {:.1}", p.p50, p.p90, p.p99);
        writeln!(
            out,
            "| {} | {:.2} | {:.1} | {} | {} | {} | {} |",
            r.concurrency,
            r.requests_per_s,
            r.output_tokens_per_s,
            p(&r.ttft_ms),
            q(&r.tpot_ms),
            q(&r.itl_ms),
            r.errors
        )?;
        if let Some(e) = &r.first_error {
            writeln!(out, "  first error: {e}")?;
        }
    }
    if !report.multi_turn.is_empty() {
        writeln!(out, "\n| turn | prompt tokens | cached tokens | retention of the previous turn | TTFT ms |")?;
        writeln!(out, "| ---: | ---: | ---: | ---: | ---: |")?;
        for t in &report.multi_turn {
            let ret = t.retention.map_or("-".to_string(), |r| format!("{:.0}%", r * 100.0));
            writeln!(
                out,
                "| {} | {:.1} | {:.1} | {} | {:.0} |",
                t.turn, t.prompt_tokens, t.cached_tokens, ret, t.ttft_ms
            )?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_interpolate_like_numpy() {
        let p = Percentiles::of(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0]);
        assert!((p.p50 - 5.5).abs() < 1e-12);
        assert!((p.p90 - 9.1).abs() < 1e-12);
        assert!((p.p99 - 9.91).abs() < 1e-12);
        assert_eq!(Percentiles::of(&[]).p50, 0.0);
    }

    #[test]
    fn sse_events_end_at_blank_lines() {
        assert_eq!(find_event_end(b"data: x\n\ndata: y"), Some(9));
        assert_eq!(find_event_end(b"data: x\r\n\r\n"), Some(11));
        assert_eq!(find_event_end(b"data: x\n"), None);
    }
}
