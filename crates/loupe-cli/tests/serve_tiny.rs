//! `loupe serve` on the tiny random-weight model, under plain `cargo test` (no Python, no
//! real model): the real binary on 127.0.0.1 with `--port 0`, started, spoken to over
//! HTTP/1.1 and stopped by `loupe_client` (the helper the binary itself starts servers with).
//! The `openai`-client suite in `tests/serve/` covers the same server on the real model; this
//! one keeps the server honest where that suite cannot run.

mod common;
use common::*;

use std::time::Duration;

use loupe_client::{HttpClient, ServeProcess, SpawnOptions};
use serde_json::{json, Value};

/// `loupe serve` of the tiny model on two threads, started and stopped by the binary's own
/// helper ([`loupe_client::spawn`]).
struct Server {
    process: ServeProcess,
    http: HttpClient,
}

impl Server {
    fn start(extra: &[&str]) -> Server {
        let mut args = vec!["--model".into(), tiny_model().into_os_string(), "--threads".into(), "2".into()];
        args.extend(extra.iter().map(Into::into));
        let options = SpawnOptions { ready_timeout: Duration::from_secs(60), ..SpawnOptions::new(loupe_path(), args) };
        let process = ServeProcess::spawn(&options).unwrap_or_else(|e| panic!("{e}"));
        let http = process.client().with_timeout(Duration::from_secs(120));
        Server { process, http }
    }

    /// One request on a fresh connection; returns the status and the body.
    fn request(&self, method: &str, path: &str, body: Option<&Value>) -> (u16, String) {
        let r = self.http.request(method, path, body).unwrap_or_else(|e| panic!("{e}"));
        (r.status, r.body)
    }

    fn json(&self, method: &str, path: &str, body: Option<&Value>) -> (u16, Value) {
        self.http.json(method, path, body).unwrap_or_else(|e| panic!("{e}"))
    }

    /// SIGTERM; the exit code.
    fn stop(self) -> Option<i32> {
        self.stop_with_log().0
    }

    /// SIGTERM; the exit code and the whole log. A server that needed SIGKILL fails the test.
    fn stop_with_log(self) -> (Option<i32>, Vec<String>) {
        let stopped = self.process.stop().expect("stopping loupe serve");
        assert!(!stopped.killed, "loupe serve ignored SIGTERM: {:?}", stopped.log);
        (stopped.code, stopped.log)
    }
}

fn model_id() -> String {
    tiny_model().file_stem().unwrap().to_string_lossy().into_owned()
}

#[test]
fn greedy_chat_equals_loupe_generate_and_streams_the_same_text() {
    let s = Server::start(&[]);
    let prompt = "Tell me about the sea.";
    let out = run(loupe().arg("generate").arg("--model").arg(tiny_model()).args([
        "--chat",
        "--temperature",
        "0",
        "--max-tokens",
        "12",
        "--json",
        prompt,
    ]));
    assert!(out.status.success(), "{}", stderr(&out));
    let cli: Value = serde_json::from_str(stdout(&out).trim()).unwrap();
    let body = json!({"model": model_id(), "messages": [{"role": "user", "content": prompt}], "temperature": 0, "max_tokens": 12});
    let (status, r) = s.json("POST", "/v1/chat/completions", Some(&body));
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["choices"][0]["message"]["content"], cli["text"]);
    assert_eq!(r["usage"]["completion_tokens"], cli["tokens"].as_array().unwrap().len());
    assert_eq!(r["usage"]["prompt_tokens"], cli["prompt_tokens"].as_array().unwrap().len());
    assert!(r["usage"]["prompt_tokens_details"]["cached_tokens"].is_u64());

    let mut stream_body = body.clone();
    stream_body["stream"] = json!(true);
    stream_body["stream_options"] = json!({"include_usage": true});
    let (status, sse) = s.request("POST", "/v1/chat/completions", Some(&stream_body));
    assert_eq!(status, 200);
    let events: Vec<&str> = sse.lines().filter_map(|l| l.strip_prefix("data: ")).collect();
    assert_eq!(events.last(), Some(&"[DONE]"));
    let chunks: Vec<Value> = events[..events.len() - 1].iter().map(|e| serde_json::from_str(e).unwrap()).collect();
    let text: String = chunks.iter().filter_map(|c| c["choices"][0]["delta"]["content"].as_str()).collect();
    assert_eq!(text, cli["text"].as_str().unwrap());
    let usage = &chunks.last().unwrap()["usage"];
    assert_eq!(usage["completion_tokens"], r["usage"]["completion_tokens"]);
    // The second identical prompt found its full blocks in the prefix cache.
    assert!(usage["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap() >= 16, "{usage}");
    assert_eq!(s.stop(), Some(0));
}

#[test]
fn errors_are_openai_bodies() {
    let s = Server::start(&["--max-context", "64", "--max-body-bytes", "4000"]);
    let chat = |extra: Value| {
        let mut b = json!({"model": model_id(), "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2});
        for (k, v) in extra.as_object().unwrap() {
            b[k] = v.clone();
        }
        s.json("POST", "/v1/chat/completions", Some(&b))
    };
    let (status, e) = chat(json!({"frobnicate": 1}));
    assert_eq!((status, e["error"]["param"].as_str()), (400, Some("frobnicate")));
    let (status, e) = chat(json!({"temperature": -1}));
    assert_eq!((status, e["error"]["param"].as_str()), (400, Some("temperature")));
    let (status, e) = chat(json!({"model": "other"}));
    assert_eq!((status, e["error"]["code"].as_str()), (404, Some("model_not_found")));
    let long = "lighthouse ".repeat(100);
    let (status, e) = chat(json!({"messages": [{"role": "user", "content": long}]}));
    assert_eq!(status, 400);
    let n = e["error"]["num_tokens"].as_u64().unwrap();
    assert_eq!(e["error"]["max_length"], 64);
    assert_eq!(
        e["error"]["message"],
        format!("Prompt is too long: {n} tokens exceeds the configured maximum context length of 64 tokens. Please shorten your prompt.")
    );
    let (status, e) = chat(json!({"messages": [{"role": "user", "content": "x".repeat(5000)}]}));
    assert_eq!(status, 413, "{e}");
    let (status, e) = s.json("GET", "/nowhere", None);
    assert_eq!((status, e["error"]["type"].as_str()), (404, Some("not_found_error")));
    // Nulls are absent; developer is system.
    let (status, _) = chat(
        json!({"tools": null, "seed": null, "messages": [{"role": "developer", "content": "Be brief."}, {"role": "user", "content": "hi"}]}),
    );
    assert_eq!(status, 200);
    assert_eq!(s.stop(), Some(0));
}

#[test]
fn metrics_health_tokenize_and_a_clean_sigterm() {
    let s = Server::start(&["--api-key", "k3y"]);
    let (status, h) = s.json("GET", "/health", None);
    assert_eq!((status, h["status"].as_str()), (200, Some("ok")));
    let (status, e) = s.json("POST", "/tokenize", Some(&json!({"prompt": "hello"})));
    assert_eq!((status, e["error"]["code"].as_str()), (401, Some("invalid_api_key")));
    let (status, metrics) = s.request("GET", "/metrics", None);
    assert_eq!(status, 200);
    for name in [
        "loupe_time_to_first_token_milliseconds_count",
        "loupe_kv_cache_blocks_total",
        "loupe_batch_size_bucket{batch_type=\"TG\",le=\"1\"}",
        "loupe_model_load_time_milliseconds_count{component=\"load\"} 1",
    ] {
        assert!(metrics.contains(name), "no {name} in:\n{metrics}");
    }
    let (code, log) = s.stop_with_log();
    assert_eq!(code, Some(0));
    assert!(log.iter().any(|l| l.contains("shutting down")), "{log:?}");
    assert!(log.iter().any(|l| l.starts_with("loupe serve: phase load:")), "{log:?}");
}

#[test]
fn serve_profile_prints_the_table_after_a_clean_shutdown() {
    let s = Server::start(&["--profile"]);
    let (status, _) =
        s.json("POST", "/v1/completions", Some(&json!({"model": model_id(), "prompt": "hello", "max_tokens": 4})));
    assert_eq!(status, 200);
    let (code, log) = s.stop_with_log();
    assert_eq!(code, Some(0));
    let text = log.join("\n");
    assert!(text.contains("profile: ") && text.contains("by op kind") && text.contains("attention"), "{text}");
    assert!(log.iter().any(|l| l.contains("lm_head")), "{text}");
}
