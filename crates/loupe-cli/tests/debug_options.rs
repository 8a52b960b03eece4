//! LOUPE_DEBUG options on the tiny random-weight model (same graph structure as SmolLM2's,
//! 4 layers): one test per option where it applies, plus the four ways of setting them and
//! `loupe ir`. The options-change-nothing check also runs on the real model (ignored unless
//! it is fetched).

mod common;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Command, Output};

use common::*;

/// `loupe` with no LOUPE_DEBUG settings inherited from the caller's environment.
fn clean() -> Command {
    let mut c = loupe();
    for (k, _) in std::env::vars() {
        if k.starts_with("LOUPE_DEBUG") || k.starts_with("MODULAR_DEBUG") || k.starts_with("MODULAR_MAX_DEBUG") {
            c.env_remove(k);
        }
    }
    c
}

/// `generate --json` of 4 tokens under the given debug flags; the output.
fn generate(model: &Path, debug: &[&str]) -> Output {
    let mut c = clean();
    c.args(["generate", "--json", "-n", "4", "-t", "2", "--model"]).arg(model).arg("The capital of France is");
    for d in debug {
        c.args(["--debug", d]);
    }
    run(&mut c)
}

fn tokens(o: &Output) -> serde_json::Value {
    assert!(o.status.success(), "{}", stderr(o));
    let v: serde_json::Value = serde_json::from_str(stdout(o).trim()).unwrap_or_else(|e| panic!("{e}: {}", stdout(o)));
    v["tokens"].clone()
}

/// `dump` of a truncated model (no files) under the given extra arguments.
fn dump(model: &Path, layers: &str, extra: &[&str]) -> Output {
    let mut c = clean();
    c.args(["dump", "--prompt", "Hello there", "-t", "2", "--layers", layers, "--model"]).arg(model).args(extra);
    run(&mut c)
}

/// The line of decoder.rs that builds the planted nodes.
fn plant_line() -> usize {
    let src = std::fs::read_to_string(repo_root().join("crates/loupe-models/src/decoder.rs")).unwrap();
    src.lines().position(|l| l.contains("Op::Plant(plant)")).unwrap() + 1
}

#[test]
fn nan_check_reports_the_op_that_made_the_nan_with_its_name_and_source_line() {
    let m = tiny_model();
    let o = dump(&m, "2", &["--taps", "^$", "--inject", "nan@1", "--debug", "nan-check,nan-check-stride=1"]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("nan-check: op plant_nan computing 'model.layers.1.self_attn.o_proj'"), "{err}");
    assert!(err.contains(&format!("crates/loupe-models/src/decoder.rs:{}:", plant_line())), "{err}");
    assert!(err.contains("produced 1 NaN and 1 Inf"), "{err}");
    // At the default stride (1 op in 20), the NaN has spread by the time an op is checked
    // (the 20th op is layer 1's k_proj, after the NaN planted in layer 0).
    let o = dump(&m, "3", &["--taps", "^$", "--inject", "nan@0", "--debug", "nan-check"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("nan-check: op linear computing 'model.layers.1.self_attn.k_proj'"), "{}", stderr(&o));
    // Off, the same run goes through.
    assert!(dump(&m, "2", &["--taps", "^$", "--inject", "nan@1"]).status.success());
}

#[test]
fn nan_check_uninitialized_read_check_and_assert_level_change_no_token() {
    checks_change_no_token(&tiny_model());
}

#[test]
#[ignore = "needs the real model (scripts/test fetches it)"]
fn nan_check_uninitialized_read_check_and_assert_level_pass_on_the_real_model_unchanged() {
    checks_change_no_token(&real_model());
}

fn checks_change_no_token(m: &Path) {
    let base = tokens(&generate(m, &[]));
    for flags in [
        &["nan-check", "nan-check-stride=1"][..],
        &["uninitialized-read-check"],
        &["assert-level=all"],
        &["device-sync-mode"],
        &["sensible"],
    ] {
        let o = generate(m, flags);
        assert_eq!(tokens(&o), base, "{flags:?}");
    }
}

#[test]
fn uninitialized_read_check_catches_a_half_written_buffer() {
    let m = tiny_model();
    let o = dump(&m, "1", &["--taps", "^$", "--inject", "uninit@0", "--debug", "uninitialized-read-check"]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("uninitialized-read-check: op add computing 'model.layers.0.attn_residual'"), "{err}");
    assert!(err.contains("of 'model.layers.0.self_attn.o_proj'") && err.contains("never written"), "{err}");
    // report: every poisoned read is a warning and the run finishes.
    let o = dump(
        &m,
        "1",
        &["--taps", "^$", "--inject", "uninit@0", "--debug", "uninitialized-read-check,uninitialized-read-mode=report"],
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("loupe: warning: uninitialized-read-check"), "{}", stderr(&o));
    // Without the check the defect goes unnoticed (zeros).
    assert!(dump(&m, "1", &["--taps", "^$", "--inject", "uninit@0"]).status.success());
}

#[test]
fn op_log_level_prints_launch_and_complete_lines_and_source_tracebacks_adds_locations() {
    let m = tiny_model();
    let o = dump(&m, "1", &["--taps", "^$", "--debug", "op-log-level=info"]);
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    let launches = err.lines().filter(|l| l.starts_with("[OP] LAUNCH ")).count();
    let completes = err.lines().filter(|l| l.starts_with("[OP] COMPLETE ") && l.contains(" us)")).count();
    assert!(launches >= 17 && launches == completes, "{launches} {completes}\n{err}");
    assert!(err.contains("[OP] LAUNCH model.layers.0.self_attn.q_proj [id=2] target=cpu op=linear"), "{err}");
    assert!(!err.contains(" @ crates/"), "{err}");
    let o = dump(&m, "1", &["--taps", "^$", "--debug", "op-log-level=debug,source-tracebacks"]);
    assert!(stderr(&o).contains("op=linear @ crates/loupe-models/src/decoder.rs:"), "{}", stderr(&o));
    // Levels above info print no op lines.
    let o = dump(&m, "1", &["--taps", "^$", "--debug", "op-log-level=warning"]);
    assert!(!stderr(&o).contains("[OP]"), "{}", stderr(&o));
}

#[test]
fn source_tracebacks_show_the_model_code_of_the_failing_op() {
    let m = tiny_model();
    let o = dump(
        &m,
        "1",
        &["--taps", "^$", "--inject", "nan@0", "--debug", "nan-check-stride=1,nan-check,source-tracebacks"],
    );
    let err = stderr(&o);
    assert!(err.contains("source traceback"), "{err}");
    assert!(err.contains(&format!("{} | o = b.node(o_name.clone(), Op::Plant(plant)", plant_line())), "{err}");
}

#[test]
fn stack_trace_on_error_prints_the_chain_and_a_backtrace() {
    let o =
        run(clean().args(["generate", "--model", "/nonexistent/model.gguf", "hi", "--debug", "stack-trace-on-error"]));
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("loupe: error:") && err.contains("error chain:") && err.contains("stack backtrace"), "{err}");
    assert!(err.contains("loupe::main") || err.contains("cmd_generate"), "no symbols in the backtrace: {err}");
    let o = run(clean().args(["generate", "--model", "/nonexistent/model.gguf", "hi"]));
    assert!(!stderr(&o).contains("stack backtrace"));
}

#[test]
fn stack_trace_on_crash_prints_a_backtrace_and_dies_by_the_signal() {
    for (kind, sig, name) in [
        ("segv", libc_sig::SEGV, "SIGSEGV"),
        ("abort", libc_sig::ABRT, "SIGABRT"),
        ("fpe", libc_sig::FPE, "SIGFPE"),
        ("ill", libc_sig::ILL, "SIGILL"),
        ("bus", libc_sig::BUS, "SIGBUS"),
    ] {
        let o = run(clean().args(["__crash", kind]).env("LOUPE_DEBUG", "stack-trace-on-crash"));
        let err = stderr(&o);
        assert_eq!(o.status.signal(), Some(sig), "{kind}: {:?}\n{err}", o.status);
        assert!(
            err.contains(&format!("loupe: fatal signal {name} ({sig}); backtrace of the crashing thread")),
            "{kind}: {err}"
        );
        assert!(err.contains("  #0  0x") && err.contains("main"), "{kind}: {err}");
        // Without the option: the same death, no report.
        let o = run(clean().args(["__crash", kind]));
        assert_eq!(o.status.signal(), Some(sig), "{kind}");
        assert!(!stderr(&o).contains("fatal signal"));
    }
}

/// Signal numbers of Linux on x86-64 / aarch64 (the test needs no libc dependency).
mod libc_sig {
    pub const ILL: i32 = 4;
    pub const ABRT: i32 = 6;
    pub const BUS: i32 = 7;
    pub const FPE: i32 = 8;
    pub const SEGV: i32 = 11;
}

#[test]
fn print_style_is_the_default_style_of_dump() {
    let m = tiny_model();
    let taps = ["--taps", "^model.norm$"];
    let compact = stdout(&dump(&m, "1", &taps));
    assert!(compact.starts_with("model.norm = tensor([[") && compact.contains("..."), "{compact}");
    let o = dump(&m, "1", &[&taps[..], &["--debug", "print-style=full"]].concat());
    assert!(
        stdout(&o).starts_with("model.norm = tensor<") && stdout(&o).contains("e-01") && !stdout(&o).contains("..."),
        "{}",
        stdout(&o)
    );
    let o = dump(&m, "1", &[&taps[..], &["--debug", "print-style=none"]].concat());
    assert!(o.status.success() && stdout(&o).is_empty(), "{}", stdout(&o));
    // binary_max_checkpoint writes .max files into -o.
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("d");
    let o = dump(
        &m,
        "1",
        &[&taps[..], &["--debug", "print-style=binary_max_checkpoint", "-o", out.to_str().unwrap()]].concat(),
    );
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(out.join("step0/model.norm.max").is_file());
}

#[test]
fn ir_output_dir_writes_one_file_per_pass_and_fuse_changes_the_ir() {
    let m = tiny_model();
    let dir = tempfile::tempdir().unwrap();
    let ir = dir.path().join("ir");
    let o = generate(&m, &[&format!("ir-output-dir={}", ir.display()), "verify-ir"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let passes = stdout(&run(clean().args(["ir", "--list-passes"])));
    let names: Vec<String> = passes.lines().map(|l| l.split_whitespace().nth(1).unwrap().to_string()).collect();
    assert_eq!(
        names,
        ["verify", "infer-shapes", "choose-precision", "fuse", "plan-memory", "select-kernels", "schedule"]
    );
    let mut files: Vec<String> =
        std::fs::read_dir(&ir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    files.sort();
    let want: Vec<String> = names.iter().enumerate().map(|(i, n)| format!("{i:02}-{n}.ir")).collect();
    assert_eq!(files, want);
    let read = |f: &str| std::fs::read_to_string(ir.join(f)).unwrap();
    for f in &files {
        assert!(read(f).lines().count() > 15 * tiny_spec().layers, "{f} is (nearly) empty");
    }
    let (built, fused, planned) = (read("00-verify.ir"), read("03-fuse.ir"), read("04-plan-memory.ir"));
    assert!(built.contains("= silu(") && !built.contains("swiglu"));
    let last = tiny_spec().layers - 1;
    assert!(fused.contains(&format!("model.layers.{last}.mlp.act_mul = swiglu(")) && !fused.contains("= silu("));
    assert!(!fused.contains(" buf=") && planned.contains(" buf="));
    assert!(read("05-select-kernels.ir").contains("kernel=matmul_wq(q4_1"));
}

#[test]
fn stop_after_stops_lowering_prints_the_ir_and_exits_cleanly() {
    let m = tiny_model();
    let o = generate(&m, &["stop-after=fuse"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("loupe: stopped after lowering pass 'fuse' (LOUPE_DEBUG stop-after); IR printed above"),
        "{}",
        stderr(&o)
    );
    assert!(stdout(&o).contains("swiglu(") && !stdout(&o).contains(" buf="), "{}", stdout(&o));
    assert!(!stderr(&o).contains("decode"), "generation ran: {}", stderr(&o));
    let o = generate(&m, &["stop-after=nope"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("unknown lowering pass 'nope'"), "{}", stderr(&o));
}

#[test]
fn loupe_ir_prints_any_stage() {
    let m = tiny_model();
    let ir = |extra: &[&str]| run(clean().args(["ir", "--layers", "1", "--model"]).arg(&m).args(extra));
    let last = stdout(&ir(&[]));
    let h = tiny_spec().hidden;
    assert!(last.contains(&format!("%2 model.layers.0.self_attn.q_proj = linear(%1 model.layers.0.input_layernorm) w=model.layers.0.self_attn.q_proj.weight[{h}x{h} q4_1] : [T, {h}] f32 buf=")), "{last}");
    assert!(last.contains("# crates/loupe-models/src/decoder.rs:"));
    let built = stdout(&ir(&["--pass", "verify"]));
    assert!(built.contains("model.layers.0.mlp.act_fn = silu(") && !built.contains("buf="), "{built}");
    let o = ir(&["--pass", "nope"]);
    assert_eq!(o.status.code(), Some(2));
}

#[test]
fn four_sources_with_precedence_api_flag_env_file() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("loupe.toml"),
        "[debug]\nnan-check-stride = 2\nop-log-level = \"info\"\nprint-style = \"full\"\n",
    )
    .unwrap();
    let opts = |env: &[(&str, &str)], flags: &[&str]| {
        let mut c = clean();
        c.current_dir(dir.path()).arg("debug-options");
        for (k, v) in env {
            c.env(k, v);
        }
        for f in flags {
            c.args(["--debug", f]);
        }
        let o = run(&mut c);
        assert!(o.status.success(), "{}", stderr(&o));
        (stdout(&o), stderr(&o))
    };
    let line = |text: &str, key: &str| {
        text.lines()
            .find(|l| l.starts_with(&format!("{key} ")))
            .unwrap()
            .split_whitespace()
            .skip(1)
            .collect::<Vec<_>>()
            .join(" ")
    };
    let (o, _) = opts(&[], &[]);
    assert_eq!(line(&o, "nan-check-stride"), "2 (loupe.toml)");
    let (o, _) = opts(&[("LOUPE_DEBUG", "nan-check-stride=3,print-style=compact")], &[]);
    assert_eq!(line(&o, "nan-check-stride"), "3 (LOUPE_DEBUG)");
    assert_eq!(line(&o, "op-log-level"), "info (loupe.toml)");
    // The list beats a per-key variable, as MAX 26.7's MODULAR_DEBUG beats MODULAR_MAX_DEBUG_<KEY>.
    let (o, _) = opts(&[("LOUPE_DEBUG", "nan-check-stride=3"), ("LOUPE_DEBUG_NAN_CHECK_STRIDE", "4")], &[]);
    assert_eq!(line(&o, "nan-check-stride"), "3 (LOUPE_DEBUG)");
    let (o, _) = opts(&[("LOUPE_DEBUG_NAN_CHECK_STRIDE", "4")], &[]);
    assert_eq!(line(&o, "nan-check-stride"), "4 (LOUPE_DEBUG_<KEY>)");
    // A MAX user's environment carries over when loupe's variables are not set.
    let (o, e) =
        opts(&[("MODULAR_DEBUG", "nan-check,assert-level=warn"), ("MODULAR_MAX_DEBUG_OP_LOG_LEVEL", "debug")], &[]);
    assert_eq!(line(&o, "nan-check"), "true (MODULAR_DEBUG)");
    assert_eq!(line(&o, "assert-level"), "warn (MODULAR_DEBUG)");
    assert_eq!(line(&o, "op-log-level"), "debug (MODULAR_MAX_DEBUG_<KEY>)");
    assert!(e.trim().is_empty(), "{e}");
    let (o, _) = opts(&[("MODULAR_DEBUG", "nan-check"), ("LOUPE_DEBUG", "verify-ir")], &[]);
    assert_eq!(line(&o, "nan-check"), "false (default)");
    // A token MAX would ignore is accepted with a warning saying so.
    let (o, e) = opts(&[("LOUPE_DEBUG", "nan-check=1")], &[]);
    assert_eq!(line(&o, "nan-check"), "true (LOUPE_DEBUG)");
    assert!(e.contains("'nan-check=1'") && e.contains("MAX 26.7"), "{e}");
    let (o, _) = opts(&[("LOUPE_DEBUG_NAN_CHECK_STRIDE", "4")], &["nan-check-stride=5"]);
    assert_eq!(line(&o, "nan-check-stride"), "5 (--debug)");
    let (o, e) = opts(&[("LOUPE_DEBUG", "sensible,frobnicate")], &[]);
    assert_eq!(e.trim(), "LOUPE_DEBUG: unknown option 'frobnicate'; ignoring");
    assert_eq!(line(&o, "nan-check"), "true (LOUPE_DEBUG)");
    assert_eq!(line(&o, "assert-level"), "all (LOUPE_DEBUG)");
    assert_eq!(line(&o, "stack-trace-on-crash"), "true (LOUPE_DEBUG)");
    // A bad value is one clear line and exit 2, whichever source it came from.
    for (env, flag) in
        [(Some(("LOUPE_DEBUG", "nan-check-stride=abc")), None), (None, Some("uninitialized-read-mode=maybe"))]
    {
        let mut c = clean();
        c.current_dir(dir.path()).arg("debug-options");
        if let Some((k, v)) = env {
            c.env(k, v);
        }
        if let Some(f) = flag {
            c.args(["--debug", f]);
        }
        let o = run(&mut c);
        assert_eq!(o.status.code(), Some(2));
        assert!(stderr(&o).starts_with("loupe: error: LOUPE_DEBUG: bad value"), "{}", stderr(&o));
        assert_eq!(stderr(&o).lines().count(), 1);
    }
}
