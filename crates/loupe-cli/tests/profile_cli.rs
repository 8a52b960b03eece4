//! `--profile` as a user runs it, on the tiny model: `generate` and `bench` print the ranked
//! table on stderr when they end, `--profile-out` writes a Chrome trace that parses, and a
//! trace path in a missing directory is refused before any work. (`serve --profile` is
//! tested in serve_tiny.rs, where the server is started and stopped.)

mod common;
use common::*;

use serde_json::Value;

/// The table's sections and at least one node row of each op kind the tiny model runs.
fn assert_table(err: &str) {
    assert!(err.contains("profile: ") && err.contains(" steps, "), "{err}");
    assert!(err.contains("by op kind") && err.contains("GB/s") && err.contains("GFLOP/s"), "{err}");
    for op in ["linear", "attention", "rms_norm", "rope"] {
        assert!(err.lines().any(|l| l.trim_start().starts_with(op)), "no {op} row in:\n{err}");
    }
    assert!(err.contains("model.layers.0.self_attn.q_proj") || err.contains("lm_head"), "{err}");
}

#[test]
fn generate_profile_prints_the_table_and_writes_a_chrome_trace() {
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("trace.json");
    let o = run(loupe()
        .args(["generate", "hello there", "-n", "6", "-t", "2", "--profile-top", "7", "--profile-out"])
        .arg(&trace)
        .arg("-m")
        .arg(tiny_model()));
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    assert_table(&err);
    assert!(err.contains("slowest 7 nodes"), "{err}");
    assert!(err.contains("wrote a Chrome trace of"), "{err}");
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&trace).unwrap()).expect("trace JSON");
    let events = v["traceEvents"].as_array().unwrap();
    assert!(events.iter().any(|e| e["ph"] == "M" && e["name"] == "thread_name"));
    let spans: Vec<&Value> = events.iter().filter(|e| e["ph"] == "X").collect();
    assert!(spans.len() > 50, "{} spans", spans.len());
    assert!(spans.iter().any(|e| e["name"] == "lm_head" && e["tid"] == 0));
}

#[test]
fn bench_profile_and_a_bad_trace_path() {
    let o = run(loupe()
        .args(["bench", "-p", "8", "-n", "4", "-r", "1", "--warmup", "0", "--no-ceiling", "--profile", "-m"])
        .arg(tiny_model()));
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    assert_table(&err);
    // Steps: one prefill and four decode steps.
    assert!(err.contains("profile: 5 steps"), "{err}");
    let o = run(loupe().args(["generate", "x", "--profile-out", "/nonexistent-dir/t.json", "-m"]).arg(tiny_model()));
    assert_clean_failure(&o, "--profile-out /nonexistent-dir/t.json: no directory /nonexistent-dir");
}
