//! `loupe compare`: the argument handling and exit codes of `loupe_cli::cmd_compare`, and
//! the binary end to end.

use std::path::Path;
use std::process::Command;

use clap::Parser;
use loupe_cli::cmd_compare::{self, CompareArgs};
use loupe_parity::{DumpStyle, DumpWriter};

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    args: CompareArgs,
}

fn args(list: &[&str]) -> CompareArgs {
    let mut v = vec!["compare"];
    v.extend_from_slice(list);
    Cli::try_parse_from(v).expect("valid flags").args
}

/// Writes a dump of three [T=4, D=8] tensors; `bug` scales the second one.
fn dump(dir: &Path, name: &str, bug: f32) -> String {
    let mut w = DumpWriter::create(dir.join(name), "test", DumpStyle::Npy).expect("create");
    for (i, n) in ["model.embed_tokens", "model.layers.0", "lm_head"].iter().enumerate() {
        let data: Vec<f32> = (0..32).map(|k| ((k * 7 + i * 3) % 11) as f32 - 5.0).collect();
        let data: Vec<f32> = if i == 1 { data.iter().map(|v| v * bug).collect() } else { data };
        w.add(n, 0, &[4, 8], &data).expect("add");
    }
    w.finish().expect("finish").display().to_string()
}

#[test]
fn exit_codes_and_json() {
    let dir = tempfile::tempdir().expect("tmp");
    let (a, b, c) = (dump(dir.path(), "a", 1.0), dump(dir.path(), "b", 1.0), dump(dir.path(), "c", 2.0));
    assert_eq!(cmd_compare::run(args(&[&a, &b])).expect("runs"), 0);
    let json = dir.path().join("r.json");
    let code = cmd_compare::run(args(&[&a, &c, "--json", &json.display().to_string()])).expect("runs");
    assert_eq!(code, 1);
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).expect("json")).expect("parse");
    assert_eq!(v["verdict"], "divergence");
    assert_eq!(v["first_divergence"], "model.layers.0");
    assert!(
        v["likely_cause"].as_str().unwrap_or("").contains("norm ratio")
            || v["likely_cause"].as_str().unwrap_or("").contains("‖target‖")
    );
    // --only that matches nothing: nothing paired is a divergence.
    assert_eq!(cmd_compare::run(args(&[&a, &b, "--only", "^nope$"])).expect("runs"), 1);
    // Explicit tolerances make isclose mismatches fail.
    assert_eq!(
        cmd_compare::run(args(&[&a, &b, "--rtol", "0", "--atol", "0", "--per-token", "--per-dim", "--step", "0"]))
            .expect("runs"),
        0
    );
}

#[test]
fn bad_input_is_an_error() {
    let dir = tempfile::tempdir().expect("tmp");
    let a = dump(dir.path(), "a", 1.0);
    let missing = dir.path().join("missing").display().to_string();
    let e = cmd_compare::run(args(&[&a, &missing])).unwrap_err().to_string();
    assert!(e.contains("missing"), "{e}");
    assert!(cmd_compare::run(args(&[&a, &a, "--cos", "1.5"])).unwrap_err().to_string().contains("--cos"));
    assert!(cmd_compare::run(args(&[&a, &a, "--only", "("])).unwrap_err().to_string().contains("--only"));
    assert!(cmd_compare::run(args(&[&a, &a, "--rtol=-1"])).is_err());
    let e = cmd_compare::run(args(&[&a, &a, "--map", &missing])).unwrap_err().to_string();
    assert!(e.contains("missing"), "{e}");
}

#[test]
fn the_binary() {
    let dir = tempfile::tempdir().expect("tmp");
    let (a, b, c) = (dump(dir.path(), "a", 1.0), dump(dir.path(), "b", 1.0), dump(dir.path(), "c", 2.0));
    let run = |x: &str, y: &str| {
        Command::new(env!("CARGO_BIN_EXE_loupe")).args(["compare", x, y]).output().expect("spawn loupe")
    };
    let o = run(&a, &b);
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{stderr}");
    assert!(String::from_utf8_lossy(&o.stdout).contains("verdict: MATCH"));
    let o = run(&a, &c);
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stdout).contains("first divergence: model.layers.0"));
    let o = run(&a, &dir.path().join("nope").display().to_string());
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.starts_with("loupe: error:") && err.lines().count() == 1, "{err}");
}
