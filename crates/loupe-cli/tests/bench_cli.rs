//! `loupe bench`: the JSON report at tiny sizes (on the tiny random-weight model, and on the
//! real model where its figures are known), the table, and bad input.

mod common;
use common::*;

fn positive_finite(v: &serde_json::Value, field: &str) -> f64 {
    let x = v[field].as_f64().unwrap_or_else(|| panic!("{field} is not a number: {v}"));
    assert!(x.is_finite() && x > 0.0, "{field} = {x}");
    x
}

/// `loupe bench --json` at tiny sizes on `model`, with the checks that hold for any model;
/// returns the report.
fn bench_json(model: &std::path::Path) -> serde_json::Value {
    let out = run(loupe()
        .arg("bench")
        .arg("--model")
        .arg(model)
        .args(["-p", "8", "-n", "4", "-r", "2", "-t", "2", "--json"]));
    assert!(out.status.success(), "loupe bench failed: {}", stderr(&out));
    let text = stdout(&out);
    assert_eq!(text.trim().lines().count(), 1, "one JSON object expected: {text}");
    let v: serde_json::Value = serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("bad JSON ({e}): {text}"));
    for test in ["pp", "tg"] {
        positive_finite(&v, &format!("{test}_tokens_per_s"));
        let sd = v[format!("{test}_stddev")].as_f64().expect("stddev");
        assert!(sd.is_finite() && sd >= 0.0, "{test}_stddev = {sd}");
        let runs = v[format!("{test}_runs")].as_array().expect("runs array");
        assert_eq!(runs.len(), 2, "{test}_runs: {v}");
        assert!(runs.iter().all(|r| r.as_f64().is_some_and(|x| x.is_finite() && x > 0.0)), "{test}_runs: {v}");
    }
    assert_eq!(v["threads"], 2);
    assert_eq!(v["precision"], "auto", "the default precision");
    assert_eq!(v["n_prompt"], 8);
    assert_eq!(v["n_gen"], 4);
    assert_eq!(v["repetitions"], 2);
    assert!(["scalar", "avx2", "avx512", "amx"].contains(&v["isa"].as_str().expect("isa")), "{v}");
    assert!(v["loupe_version"].is_string());
    assert!(v["model"].as_str().expect("model").ends_with(".gguf"));
    positive_finite(&v, "peak_rss_bytes");
    // Where the weights lie depends on the page cache (auto); the field says which.
    assert!(["mapped", "copied"].contains(&v["weights"].as_str().expect("weights")), "{v}");
    positive_finite(&v, "tg_read_gb_per_s");
    // A decode step reads every weight (native keeps the blocks; the tied embedding is also
    // the lm_head) plus, on average over tg, the K and V rows of 2.5 cached positions.
    let weights = v["weight_bytes_per_token"].as_f64().expect("weight_bytes_per_token");
    let kv = v["kv_bytes_per_position"].as_f64().expect("kv_bytes_per_position");
    let per_token = positive_finite(&v, "tg_bytes_per_token");
    assert!((per_token - (weights + kv * 2.5)).abs() < 1.0, "{v}");
    // The read-bandwidth ceiling, measured after the tests, and decode's share of it.
    let median = positive_finite(&v, "read_bandwidth_gb_per_s_median");
    assert!(positive_finite(&v, "read_bandwidth_gb_per_s_best") >= median, "{v}");
    assert_eq!(v["read_bandwidth_buffer_bytes"].as_u64(), Some(1 << 30), "{v}");
    let share = positive_finite(&v, "tg_share_of_read_bandwidth");
    assert!((share - v["tg_read_gb_per_s"].as_f64().unwrap() / median).abs() < 1e-9, "{v}");
    assert!(["scalar", "avx2", "avx512", "amx"].contains(&v["isa_detected"].as_str().expect("isa_detected")), "{v}");
    v
}

#[test]
fn json_report() {
    let model = tiny_model();
    let v = bench_json(&model);
    let f = loupe_formats::GgufFile::open(&model).unwrap();
    let bytes: u64 = f.tensors.iter().map(|t| t.size_bytes).sum();
    let params: u64 = f.tensors.iter().map(|t| t.n_elements()).sum();
    assert_eq!(v["model_size_bytes"].as_u64(), Some(bytes), "{v}");
    assert_eq!(v["model_params"].as_u64(), Some(params), "{v}");
    assert_eq!(v["weight_bytes_per_token"].as_u64(), Some(bytes), "{v}");
    // Native precision caches f16 rows: 2 bytes per element.
    let spec = tiny_spec();
    assert_eq!(v["kv_dtype"], "f16", "{v}");
    assert_eq!(v["kv_bytes_per_position"].as_u64(), Some((spec.layers * 2 * spec.kv_width() * 2) as u64), "{v}");
}

#[test]
#[ignore = "needs the real model (scripts/test fetches it)"]
fn json_report_on_the_real_model() {
    let v = bench_json(&real_model());
    // 96.6 MB of tensors in SmolLM2-135M Q4_1; the process holds at least the weights.
    assert_eq!(v["model_size_bytes"].as_u64(), Some(96_576_768), "{v}");
    assert!(v["model_params"].as_u64().is_some_and(|p| p > 100_000_000), "{v}");
    assert!(positive_finite(&v, "peak_rss_bytes") > 50e6, "{v}");
    // 30 layers x (K + V) x 192 f16 per cached position.
    assert_eq!(v["weight_bytes_per_token"].as_u64(), Some(96_576_768), "{v}");
    assert_eq!(v["kv_bytes_per_position"].as_u64(), Some(23_040), "{v}");
}

#[test]
fn table_and_single_test() {
    let model = tiny_model();
    let out = run(loupe().arg("bench").arg("--model").arg(&model).args([
        "-p",
        "0",
        "-n",
        "2",
        "-r",
        "1",
        "-t",
        "1",
        "--precision",
        "f32",
    ]));
    assert!(out.status.success(), "loupe bench failed: {}", stderr(&out));
    let text = stdout(&out);
    assert!(text.starts_with("| model"), "{text}");
    assert!(text.contains("| tg2 ") && !text.contains("pp0"), "{text}");
    assert!(text.contains("CPU f32"), "{text}");
    assert!(text.contains("peak RSS"), "{text}");
    // f32 computes from values the loader makes: nothing of the file is kept.
    assert!(text.contains("(weights copied)"), "{text}");
    // The f32 baseline caches f32 rows.
    assert!(text.contains("KV cache f32"), "{text}");
    assert!(text.contains("read bandwidth (1 threads, 1024 MiB buffer") && text.contains("% of the median"), "{text}");
    // --no-ceiling: no measurement, null fields; prefill alone never measures it.
    for args in [&["-p", "0", "-n", "2", "--no-ceiling"][..], &["-p", "4", "-n", "0"][..]] {
        let out =
            run(loupe().arg("bench").arg("--model").arg(&model).args(["-r", "1", "-t", "1", "--json"]).args(args));
        assert!(out.status.success(), "loupe bench {args:?} failed: {}", stderr(&out));
        let v: serde_json::Value = serde_json::from_str(stdout(&out).trim()).unwrap();
        assert!(
            v["read_bandwidth_gb_per_s_median"].is_null() && v["tg_share_of_read_bandwidth"].is_null(),
            "{args:?}: {v}"
        );
    }
    // --kv-dtype f32 overrides native precision's f16 cache.
    let out = run(loupe().arg("bench").arg("--model").arg(&model).args([
        "-p",
        "0",
        "-n",
        "2",
        "-r",
        "1",
        "-t",
        "1",
        "--json",
        "--no-ceiling",
        "--kv-dtype",
        "f32",
    ]));
    assert!(out.status.success(), "loupe bench --kv-dtype f32 failed: {}", stderr(&out));
    let v: serde_json::Value = serde_json::from_str(stdout(&out).trim()).unwrap();
    let spec = tiny_spec();
    assert_eq!((v["precision"].as_str(), v["kv_dtype"].as_str()), (Some("auto"), Some("f32")), "{v}");
    assert_eq!(v["kv_bytes_per_position"].as_u64(), Some((spec.layers * 2 * spec.kv_width() * 4) as u64), "{v}");
}

#[test]
fn bad_input() {
    // Checked before the model is touched: no model needed.
    assert_clean_failure(&run(loupe().args(["bench", "--model", "/nonexistent/m.gguf", "-r", "0"])), "--repetitions");
    assert_clean_failure(
        &run(loupe().args(["bench", "--model", "/nonexistent/m.gguf", "-p", "0", "-n", "0"])),
        "nothing to measure",
    );
    assert_clean_failure(
        &run(loupe().args(["bench", "--model", "/nonexistent/m.gguf", "-p", "8"])),
        "/nonexistent/m.gguf",
    );
    assert_clean_failure(&run(loupe().args(["bench", "--model", "/nonexistent/m.gguf", "-t", "0"])), "--threads");
    let out = run(loupe().args(["bench", "-p", "abc"]));
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));

    let model = tiny_model();
    // The tiny model's window is 256 tokens.
    assert_eq!(tiny_spec().context_length, 256);
    let out = run(loupe().arg("bench").arg("--model").arg(&model).args(["-p", "300", "-n", "0", "-r", "1"]));
    assert_clean_failure(&out, "context window");
    let out = run(loupe().arg("bench").arg("--model").arg(&model).args(["-p", "0", "-n", "300", "-r", "1"]));
    assert_clean_failure(&out, "--n-gen");
}

#[test]
fn batched_json_and_table() {
    let model = tiny_model();
    let out = run(loupe()
        .arg("bench")
        .arg("--model")
        .arg(&model)
        .args(["--batch", "1,3", "-p", "20", "-n", "5", "-r", "2", "-t", "2", "--json"]));
    assert!(out.status.success(), "loupe bench --batch failed: {}", stderr(&out));
    let v: serde_json::Value =
        serde_json::from_str(stdout(&out).trim()).unwrap_or_else(|e| panic!("bad JSON ({e}): {}", stdout(&out)));
    assert_eq!(v["mode"], "batch");
    assert_eq!(v["kv_dtype"], "f16");
    let points = v["points"].as_array().expect("points");
    assert_eq!(points.iter().map(|p| p["npl"].as_u64().unwrap()).collect::<Vec<_>>(), vec![1, 3]);
    for p in points {
        positive_finite(p, "prefill_tokens_per_s");
        positive_finite(p, "decode_tokens_per_s");
        assert_eq!(p["decode_runs"].as_array().unwrap().len(), 2, "{p}");
        // 20 prompt + 5 generated positions per sequence: two blocks of 16 each.
        assert_eq!(p["kv_blocks_used"].as_u64().unwrap(), 2 * p["npl"].as_u64().unwrap(), "{p}");
    }
    positive_finite(&v, "peak_rss_bytes");

    let out = run(loupe().arg("bench").arg("--model").arg(&model).args([
        "--batch",
        "2",
        "-p",
        "8",
        "-n",
        "2",
        "-r",
        "1",
        "--kv-dtype",
        "f32",
    ]));
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(text.contains("| sequences |") && text.contains("KV f32"), "{text}");

    let out = run(loupe().arg("bench").arg("--model").arg(&model).args(["--batch", "0,2"]));
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("at least 1"), "{}", stderr(&out));
    assert_clean_failure(
        &run(loupe().arg("bench").arg("--model").arg(&model).args(["--batch", "2", "-p", "200", "-n", "100"])),
        "context window",
    );
    assert_clean_failure(
        &run(loupe().arg("bench").arg("--model").arg(&model).args(["--batch", "2", "--kv-cache-mb", "0"])),
        "KV cache budget",
    );
}

/// `loupe bench --regex`: greedy decode with and without the grammar, alternated, in the
/// same report, with the masks counted.
#[test]
fn grammar_cost_is_reported_beside_plain_greedy() {
    let out = run(loupe().arg("bench").arg("--model").arg(tiny_model()).args([
        "-p",
        "0",
        "-n",
        "12",
        "-r",
        "2",
        "-t",
        "2",
        "--no-ceiling",
        "--json",
        "--regex",
        "[a-z]{3}[0-9]{2}",
    ]));
    assert!(out.status.success(), "loupe bench failed: {}", stderr(&out));
    let v: serde_json::Value = serde_json::from_str(stdout(&out).trim()).unwrap();
    let g = &v["grammar"];
    assert_eq!(g["kind"], "regex", "{v}");
    for key in ["greedy_tokens_per_s_runs", "constrained_tokens_per_s_runs"] {
        let runs = g[key].as_array().unwrap_or_else(|| panic!("{key}: {v}"));
        assert_eq!(runs.len(), 2, "{v}");
        assert!(runs.iter().all(|r| r.as_f64().is_some_and(|x| x.is_finite() && x > 0.0)), "{v}");
    }
    // 12 steps per run, 3 runs (warm-up included), and the grammar completes every 5 tokens
    // and is compiled afresh: at least one mask per step.
    assert!(g["masks"].as_u64().unwrap() >= 36, "{v}");
    positive_finite(g, "mask_ms_mean");
    positive_finite(g, "ratio_of_medians");
    let bad = run(loupe()
        .arg("bench")
        .arg("--model")
        .arg(tiny_model())
        .args(["-p", "0", "-n", "4", "-r", "1", "--regex", "a("]));
    assert_eq!(bad.status.code(), Some(2), "{}", stderr(&bad));
    assert!(stderr(&bad).contains("invalid regex"), "{}", stderr(&bad));
}
