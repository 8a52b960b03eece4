//! loupe's debug-option sources against MAX 26.7's own answers
//! (tests/fixtures/max-26.7/options.json, made by scripts/max-fixtures): for every environment
//! MAX was given, loupe reading the same variables (MODULAR_DEBUG, MODULAR_MAX_DEBUG_<KEY>)
//! ends with MAX's values, except where it printed a warning saying how MAX reads the token
//! differently; and every such warning is true (MAX's values differ, or MAX ignored the token).

use std::collections::BTreeMap;
use std::path::PathBuf;

use loupe_graph::debug::{AssertLevel, DebugOptions, OpLogLevel, PrintStyle, UninitMode};
use loupe_runtime::debug_config::{resolve, Layers};
use serde_json::Value;

/// The values MAX's `InferenceSession.debug` reports, in MAX's spelling, for loupe's options.
fn loupe_as_max(o: &DebugOptions) -> BTreeMap<&'static str, String> {
    let lower = |s: String| s.to_ascii_lowercase();
    BTreeMap::from([
        ("nan_check", o.nan_check.to_string()),
        ("uninitialized_read_check", o.uninitialized_read_check.to_string()),
        (
            "uninitialized_read_mode",
            match (o.uninitialized_read_mode, o.sources.contains_key("uninitialized-read-mode")) {
                (_, false) => String::new(),
                (UninitMode::Abort, true) => "abort".into(),
                (UninitMode::Report, true) => "report".into(),
            },
        ),
        ("device_sync_mode", o.device_sync_mode.to_string()),
        ("stack_trace_on_error", o.stack_trace_on_error.to_string()),
        ("stack_trace_on_crash", o.stack_trace_on_crash.to_string()),
        ("source_tracebacks", o.source_tracebacks.to_string()),
        ("pre_jit", (o.stop_after.as_deref() == Some("select-kernels")).to_string()),
        (
            "op_log_level",
            if o.op_log_level == OpLogLevel::NotSet { String::new() } else { lower(format!("{:?}", o.op_log_level)) },
        ),
        (
            "assert_level",
            if o.sources.contains_key("assert-level") { lower(format!("{:?}", o.assert_level)) } else { String::new() },
        ),
        (
            "print_style",
            match (o.print_style, o.sources.contains_key("print-style")) {
                (_, false) | (PrintStyle::None, true) => "PrintStyle.NONE".into(),
                (PrintStyle::Compact, true) => "PrintStyle.COMPACT".into(),
                (PrintStyle::Full, true) => "PrintStyle.FULL".into(),
                (PrintStyle::Binary, true) => "PrintStyle.BINARY".into(),
                (PrintStyle::BinaryMaxCheckpoint, true) => "PrintStyle.BINARY_MAX_CHECKPOINT".into(),
            },
        ),
        ("ir_output_dir", o.ir_output_dir.as_ref().map(|p| p.display().to_string()).unwrap_or_default()),
    ])
}

fn max_values(debug: &Value) -> BTreeMap<&'static str, String> {
    let keys = [
        "nan_check",
        "uninitialized_read_check",
        "uninitialized_read_mode",
        "device_sync_mode",
        "stack_trace_on_error",
        "stack_trace_on_crash",
        "source_tracebacks",
        "pre_jit",
        "op_log_level",
        "assert_level",
        "print_style",
        "ir_output_dir",
    ];
    keys.iter()
        .map(|k| {
            let v = match &debug[*k] {
                Value::Bool(b) => b.to_string(),
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            (*k, v)
        })
        .collect()
}

fn upper_style(m: &mut BTreeMap<&'static str, String>) {
    if let Some(s) = m.get_mut("print_style") {
        *s = s.to_ascii_uppercase().replace("PRINTSTYLE.", "PrintStyle.");
    }
}

#[test]
fn loupe_reads_maxs_variables_as_max_26_7_does_or_says_why_not() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/max-26.7/options.json");
    let runs: Value = serde_json::from_str(&std::fs::read_to_string(path).expect("options.json")).expect("json");
    let runs = runs.as_array().expect("a list");
    assert!(runs.len() >= 40);
    let (mut same, mut warned) = (0, 0);
    for run in runs {
        let env: BTreeMap<String, String> =
            run["env"].as_object().expect("env").iter().map(|(k, v)| (k.clone(), v.as_str().unwrap().into())).collect();
        let layers = Layers::default().with_vars(|name| env.get(name).cloned());
        let (opts, warnings) = resolve(&layers).unwrap_or_else(|e| panic!("{env:?}: {e}"));
        let mut ours = loupe_as_max(&opts);
        let mut max = max_values(&run["debug"]);
        upper_style(&mut ours);
        upper_style(&mut max);
        let max_ignored = run["stderr"]
            .as_array()
            .expect("stderr")
            .iter()
            .any(|l| l.as_str().is_some_and(|l| l.contains("unknown option")));
        // loupe-only warnings about tokens loupe itself cannot read (a bad value from
        // MODULAR_DEBUG, an option loupe does not know) are not claims about MAX.
        let claims: Vec<&String> = warnings.iter().filter(|w| w.contains("MAX 26.7 ")).collect();
        if claims.is_empty() {
            let unread = warnings.iter().any(|w| w.contains("ignoring"));
            if unread {
                // loupe ignored a token (a value it cannot read, or an option it does not
                // have): the rest must still agree with MAX.
                for (k, v) in &max {
                    if ours[k] != *v
                        && !["assert_level", "op_log_level", "uninitialized_read_mode", "print_style"].contains(k)
                    {
                        panic!("{env:?}: {k} is {} in loupe, {v} in MAX ({warnings:?})", ours[k]);
                    }
                }
            } else {
                assert_eq!(ours, max, "{env:?}: loupe and MAX 26.7 differ without a warning");
            }
            same += 1;
        } else {
            assert!(
                max_ignored || ours != max,
                "{env:?}: loupe warned {claims:?}, but MAX read it as loupe does ({max:?})"
            );
            warned += 1;
        }
    }
    assert!(same >= 25 && warned >= 8, "{same} same, {warned} warned");
    let _ = AssertLevel::None;
}
