//! `loupe print`: stored tensors printed byte for byte as MAX 26.7 prints them. The `.max`
//! files MAX itself wrote (tests/fixtures/max-26.7/prints/max) printed by loupe must equal
//! MAX's own stdout for the same tensors (prints/compact.txt, full-6.txt, full-3.txt), with
//! the label MAX keeps in the file (its sanitized form).

mod common;

use std::path::PathBuf;

use common::{loupe, run, stderr, stdout};
use serde_json::Value;

fn prints() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/max-26.7/prints")
}

fn sanitize(label: &str) -> String {
    loupe_formats::max_file::sanitize_label(label)
}

/// The files of the cases MAX wrote last under each label, in print order, and MAX's stdout
/// for exactly those prints (each block relabelled with the file's key).
fn expected(fixture: &str) -> (Vec<PathBuf>, String) {
    let cases: Value =
        serde_json::from_str(&std::fs::read_to_string(prints().join("cases.json")).expect("cases")).expect("json");
    let labels: Vec<String> =
        cases.as_array().expect("list").iter().map(|c| c["label"].as_str().expect("label").to_string()).collect();
    let text = std::fs::read_to_string(prints().join(fixture)).expect("fixture");
    // Each print starts at the beginning of a line with `label = tensor`.
    let mut starts = Vec::new();
    let mut from = 0;
    for l in &labels {
        let at = from + text[from..].find(&format!("{l} = tensor")).expect("label in the fixture");
        assert!(at == 0 || text.as_bytes()[at - 1] == b'\n');
        starts.push(at);
        from = at + 1;
    }
    starts.push(text.len());
    let (mut files, mut want) = (Vec::new(), String::new());
    for (i, l) in labels.iter().enumerate() {
        if labels[i + 1..].contains(l) {
            continue; // overwritten by a later print of the same label
        }
        let block = &text[starts[i]..starts[i + 1]];
        want.push_str(&block.replacen(l.as_str(), &sanitize(l), 1));
        files.push(prints().join("max").join(format!("{}.max", sanitize(l))));
    }
    (files, want)
}

#[test]
fn print_of_maxs_files_equals_maxs_stdout() {
    for (fixture, flags) in [
        ("compact.txt", vec![]),
        ("full-6.txt", vec!["--style", "full"]),
        ("full-3.txt", vec!["--style", "full", "--digits", "3"]),
    ] {
        let (files, want) = expected(fixture);
        let o = run(loupe().arg("print").args(&flags).args(&files));
        assert!(o.status.success(), "{}", stderr(&o));
        let got = stdout(&o);
        for (n, (a, b)) in got.lines().zip(want.lines()).enumerate() {
            assert_eq!(a, b, "{fixture} line {} (left: loupe print, right: MAX)", n + 1);
        }
        assert_eq!(got, want, "{fixture}");
    }
}

#[test]
fn print_reads_npy_and_directories() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = dir.path().join("x.npy");
    loupe_formats::npy::write_npy(&p, &[2, 2], &[1.0, -2.5, f32::NAN, f32::NEG_INFINITY]).expect("npy");
    let o = run(loupe().arg("print").arg(&p));
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o), "x = tensor([[1.0000, -2.5000],\n[nan, -INF]], dtype=f32, shape=[2,2])\n");
    let hook = prints().join("../hook/max");
    let o = run(loupe().args(["print", "--style", "full"]).arg(&hook));
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o).lines().count(), 46, "one line per tensor of MAX's PrintHook dump");
    assert!(stdout(&o).contains("model.lm_head-output = tensor<1x11xf32> ["), "{}", stdout(&o));
    let o = run(loupe().args(["print", "--only", r"^model\.norm-"]).arg(&hook));
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(stdout(&o).matches(" = tensor(").count(), 2, "{}", stdout(&o));
    assert!(stdout(&o).contains("model.norm-output = tensor([["), "{}", stdout(&o));
}

#[test]
fn bad_input_is_one_line_and_exit_2() {
    let dir = tempfile::tempdir().expect("tempdir");
    let bad = dir.path().join("bad.max");
    std::fs::write(&bad, b"\x93\xf0\x9f\x94\xa5++\x93\x00\x00").expect("write");
    let other = dir.path().join("notes.txt");
    std::fs::write(&other, "hi").expect("write");
    for (args, needle) in [
        (vec!["print".into(), dir.path().join("missing.max").display().to_string()], "missing.max"),
        (vec!["print".into(), bad.display().to_string()], "bad.max"),
        (vec!["print".into(), other.display().to_string()], "unknown input type"),
        (
            vec![
                "print".into(),
                "--digits".into(),
                "99".into(),
                "--style".into(),
                "full".into(),
                bad.display().to_string(),
            ],
            "--digits",
        ),
        (vec!["print".into(), "--only".into(), "(".into(), bad.display().to_string()], "--only"),
    ] {
        let o = run(loupe().args(&args));
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        let e = stderr(&o);
        assert_eq!(e.trim().lines().count(), 1, "{e}");
        assert!(e.starts_with("loupe: error:") && e.contains(needle), "{e}");
    }
}
