//! Inputs that are corrupt, hostile or odd: each is refused with an error naming the file
//! (the CLI's exit 2) or reported clearly, never a panic. Also the JSON report's stable
//! fields and the source kinds.

mod common;

use std::path::Path;

use common::*;
use loupe_formats::npy::npy_bytes;
use loupe_formats::zip_archive::write_zip;
use loupe_parity::report::{render, to_json, RenderOptions};
use loupe_parity::result::Status;
use loupe_parity::{compare, CompareOptions, DumpStyle, NoProgress, TensorSource};

fn err(a: &Path, b: &Path) -> String {
    compare(a, b, &CompareOptions::default(), &mut NoProgress).map(|_| ()).expect_err("must be refused").to_string()
}

fn small_dump(dir: &Path, name: &str) -> std::path::PathBuf {
    write(&dir.join(name), "loupe", &model(1, 0)[..3], None)
}

fn edit_manifest(dump: &Path, f: impl Fn(&mut serde_json::Value)) {
    let p = dump.join("manifest.json");
    let mut v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&p).expect("read")).expect("json");
    f(&mut v);
    std::fs::write(&p, v.to_string()).expect("write");
}

#[test]
fn manifest_paths_cannot_escape_the_dump() {
    let dir = tempfile::tempdir().expect("tmp");
    let good = small_dump(dir.path(), "good");
    let bad = small_dump(dir.path(), "bad");
    edit_manifest(&bad, |v| v["tensors"][0]["file"] = "../good/step0/model.embed_tokens.npy".into());
    let e = err(&good, &bad);
    assert!(e.contains("manifest.json") && e.contains("not a relative path inside the dump"), "{e}");
    edit_manifest(&bad, |v| v["tensors"][0]["file"] = "/etc/passwd".into());
    assert!(err(&good, &bad).contains("not a relative path"));
}

#[test]
fn manifest_errors_name_the_field() {
    let dir = tempfile::tempdir().expect("tmp");
    let good = small_dump(dir.path(), "good");
    for (i, (edit, needle)) in [
        (
            Box::new(|v: &mut serde_json::Value| v["format"] = "other".into()) as Box<dyn Fn(&mut serde_json::Value)>,
            "format 'other'",
        ),
        (Box::new(|v: &mut serde_json::Value| v["version"] = 9.into()), "version 9"),
        (Box::new(|v: &mut serde_json::Value| v["tensors"][0]["dtype"] = "f7".into()), "unknown dtype 'f7'"),
        (Box::new(|v: &mut serde_json::Value| v["tensors"][1]["name"] = "model.embed_tokens".into()), "listed twice"),
        (
            Box::new(|v: &mut serde_json::Value| v["tensors"][0]["shape"] = serde_json::json!([6, 17])),
            "the manifest says shape [6, 17]",
        ),
        (Box::new(|v: &mut serde_json::Value| v["tensors"] = "x".into()), "manifest.json"),
    ]
    .into_iter()
    .enumerate()
    {
        let bad = small_dump(dir.path(), &format!("bad{i}"));
        edit_manifest(&bad, edit);
        let e = err(&good, &bad);
        assert!(e.contains(needle), "{needle}: {e}");
    }
}

#[test]
fn corrupt_tensor_files_in_a_dump() {
    let dir = tempfile::tempdir().expect("tmp");
    let good = small_dump(dir.path(), "good");
    // Truncated npy.
    let bad = small_dump(dir.path(), "trunc");
    let f = bad.join("step0/model.embed_tokens.npy");
    let bytes = std::fs::read(&f).expect("read");
    std::fs::write(&f, &bytes[..bytes.len() - 10]).expect("write");
    let e = err(&good, &bad);
    assert!(e.contains("model.embed_tokens.npy") && e.contains("need 384 bytes"), "{e}");
    // An npy with an absurd shape.
    let bad = small_dump(dir.path(), "absurd");
    let h = "{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296), }";
    let mut v = b"\x93NUMPY\x01\x00".to_vec();
    v.extend_from_slice(&(h.len() as u16).to_le_bytes());
    v.extend_from_slice(h.as_bytes());
    std::fs::write(bad.join("step0/model.embed_tokens.npy"), v).expect("write");
    assert!(err(&good, &bad).contains("model.embed_tokens.npy"));
    // A binary-style dump whose raw file has the wrong length.
    let raw = write_style(&dir.path().join("raw"), "loupe", &model(1, 0)[..3], None, DumpStyle::Binary);
    let r = compare(&good, &raw, &CompareOptions::default(), &mut NoProgress).expect("raw dump reads");
    assert_eq!(r.verdict.verdict, "match");
    std::fs::write(raw.join("step0/model.embed_tokens.bin"), [0u8; 7]).expect("write");
    assert!(err(&good, &raw).contains("need 384 bytes, the file holds 7"));
    // A max-style dump reads too.
    let mx = write_style(&dir.path().join("max"), "loupe", &model(1, 0)[..3], None, DumpStyle::Max);
    assert_eq!(
        compare(&good, &mx, &CompareOptions::default(), &mut NoProgress).expect("max dump").verdict.verdict,
        "match"
    );
}

#[test]
fn a_hostile_pickle_is_refused_not_run() {
    let dir = tempfile::tempdir().expect("tmp");
    let mut p = vec![0x80, 2];
    p.extend_from_slice(b"cos\nsystem\nX\x0b\x00\x00\x00touch pwned\x85R.");
    let pt = dir.path().join("evil.pt");
    std::fs::write(&pt, write_zip(&[("evil/data.pkl", &p, false)]).expect("zip")).expect("write");
    let good = small_dump(dir.path(), "good");
    let e = err(&good, &pt);
    assert!(e.contains("evil.pt") && e.contains("os.system") && e.contains("allow-list"), "{e}");
    assert!(!dir.path().join("pwned").exists() && !Path::new("pwned").exists());
    // The same file inside a directory of dumps.
    let d = dir.path().join("pts");
    std::fs::create_dir_all(&d).expect("dir");
    std::fs::copy(&pt, d.join("x.pt")).expect("copy");
    assert!(err(&good, &d).contains("os.system"));
}

#[test]
fn unknown_and_missing_inputs() {
    let dir = tempfile::tempdir().expect("tmp");
    let good = small_dump(dir.path(), "good");
    let txt = dir.path().join("notes.txt");
    std::fs::write(&txt, "hi").expect("write");
    assert!(err(&good, &txt).contains("unknown input type '.txt'"));
    assert!(err(&good, &dir.path().join("nope")).contains("nope"));
    let empty = dir.path().join("empty");
    std::fs::create_dir_all(&empty).expect("dir");
    assert!(err(&good, &empty).contains("no manifest.json"));
    // Two files that give the same tensor name in one directory.
    let d = dir.path().join("dup");
    std::fs::create_dir_all(&d).expect("dir");
    std::fs::write(d.join("a.npy"), npy_bytes(&[1], &[1.0])).expect("w");
    loupe_formats::max_file::write_max(d.join("a.max"), "a", &[1], &[1.0]).expect("w");
    assert!(err(&good, &d).contains("comes from both"));
}

#[test]
fn token_index_and_per_token_output() {
    let a = model(1, 0);
    let mut b = a.clone();
    perturb_rows(get(&mut b, "model.layers.1"), 2..3, 1.0, 3);
    let opts = CompareOptions { token_index: Some(2), per_token: true, per_dim: true, ..CompareOptions::default() };
    let r = run_with(&a, &b, &opts);
    let p = r.pairs.iter().find(|p| p.name == "model.layers.1").expect("pair");
    assert_eq!(p.shape, vec![D]);
    assert_eq!(p.status, Status::Diverged);
    let opts = CompareOptions { token_index: Some(1), ..CompareOptions::default() };
    assert_eq!(run_with(&a, &b, &opts).verdict.verdict, "match", "row 1 is untouched");
    let opts = CompareOptions { token_index: Some(99), ..CompareOptions::default() };
    let r = run_with(&a, &b, &opts);
    assert!(r
        .pairs
        .iter()
        .all(|p| p.status == Status::Skipped && p.note.as_deref().unwrap_or("").contains("out of range")));
    let opts = CompareOptions { per_token: true, per_dim: true, ..CompareOptions::default() };
    let r = run_with(&a, &b, &opts);
    let p = r.pairs.iter().find(|p| p.name == "model.layers.1").expect("pair");
    assert_eq!(p.token_cosines.as_ref().map(Vec::len), Some(T));
    assert_eq!(p.dim_cosines.as_ref().map(Vec::len), Some(D));
    let text = render(&r, RenderOptions { per_token: true, per_dim: true });
    assert!(text.contains("per-token cosine: t0 1.0000") && text.contains("worst per-dim cosines"), "{text}");
}

#[test]
fn json_report_has_the_stable_fields() {
    let a = model(1, 0);
    let mut b = a.clone();
    perturb_rows(get(&mut b, "model.layers.2.mlp.up_proj"), 0..T, 1.0, 3);
    let r = run(&a, &b);
    let v: serde_json::Value = serde_json::from_str(&to_json(&r)).expect("valid JSON");
    for key in [
        "format",
        "version",
        "verdict",
        "first_divergence",
        "likely_cause",
        "false_cliffs",
        "pairs",
        "unpaired_a",
        "unpaired_b",
        "thresholds",
        "signature",
        "token0",
        "a",
        "b",
    ] {
        assert!(v.get(key).is_some(), "missing {key}");
    }
    assert_eq!(v["verdict"], "divergence");
    assert_eq!(v["first_divergence"], "model.layers.2.mlp.up_proj");
    let p = &v["pairs"][0];
    for key in [
        "name",
        "name_a",
        "name_b",
        "shape",
        "status",
        "cosine",
        "max_abs_diff",
        "max_abs_index",
        "max_rel_diff",
        "mean_abs_diff",
        "nmse",
        "rel_norm_error",
        "sqnr_db",
        "mismatches",
        "nan_a",
        "inf_b",
        "tokens",
    ] {
        assert!(p.get(key).is_some(), "pair lacks {key}: {p}");
    }
    assert_eq!(p["status"], "match");
    assert!(p["sqnr_db"].is_null(), "identical tensors have infinite SQNR, written as null");
    assert_eq!(v["thresholds"]["cos"], 0.99);
    let lm = v["pairs"].as_array().expect("pairs").iter().find(|p| p["name"] == "lm_head").expect("lm_head");
    assert_eq!(lm["logits"]["argmax_agreement"], 1.0);
    let text = render(&r, RenderOptions::default());
    assert!(
        text.contains("verdict: DIVERGENCE") && text.contains("first divergence: model.layers.2.mlp.up_proj"),
        "{text}"
    );
}

#[test]
fn single_file_sources() {
    let dir = tempfile::tempdir().expect("tmp");
    let a = model(1, 0);
    let members: Vec<(String, Vec<u8>)> =
        a.iter().map(|t| (format!("{}.npy", t.name), npy_bytes(&t.shape, &t.data))).collect();
    let refs: Vec<(&str, &[u8], bool)> = members.iter().map(|(n, b)| (n.as_str(), b.as_slice(), false)).collect();
    let npz = dir.path().join("all.npz");
    std::fs::write(&npz, write_zip(&refs).expect("zip")).expect("w");
    let src = TensorSource::open(&npz).expect("npz");
    assert!(src.ordered && src.entries.len() == a.len());
    let st: Vec<(String, Vec<u8>)> =
        a.iter().map(|t| (t.name.clone(), t.data.iter().flat_map(|v| v.to_le_bytes()).collect())).collect();
    let entries: Vec<(&str, loupe_formats::safetensors_file::Dtype, &[usize], &[u8])> = st
        .iter()
        .zip(&a)
        .map(|((n, b), t)| (n.as_str(), loupe_formats::safetensors_file::Dtype::F32, t.shape.as_slice(), b.as_slice()))
        .collect();
    let stf = dir.path().join("all.safetensors");
    std::fs::write(&stf, loupe_formats::safetensors_file::write_safetensors(&entries, &Default::default())).expect("w");
    let r = compare(&npz, &stf, &CompareOptions::default(), &mut NoProgress).expect("compare");
    assert_eq!((r.pairs.len(), r.verdict.verdict), (a.len(), "match"));
    // Natural order of a safetensors file: layers.2 before layers.10.
    let d = dir.path().join("nat.safetensors");
    let z = [0u8; 4];
    let names = ["model.layers.10", "model.layers.2", "model.layers.1"];
    let e: Vec<(&str, loupe_formats::safetensors_file::Dtype, &[usize], &[u8])> =
        names.iter().map(|n| (*n, loupe_formats::safetensors_file::Dtype::F32, &[1usize][..], &z[..])).collect();
    std::fs::write(&d, loupe_formats::safetensors_file::write_safetensors(&e, &Default::default())).expect("w");
    let src = TensorSource::open(&d).expect("st");
    assert_eq!(
        src.entries.iter().map(|e| e.name.as_str()).collect::<Vec<_>>(),
        ["model.layers.1", "model.layers.2", "model.layers.10"]
    );
}

#[test]
fn gguf_weights_compare_with_safetensors() {
    use loupe_formats::safetensors_file::{write_safetensors, Dtype};
    let dir = tempfile::tempdir().expect("tmp");
    let w: Vec<f32> = (0..12).map(|i| i as f32 * 0.25 - 1.0).collect();
    let half: Vec<u8> = w.iter().flat_map(|v| half::f16::from_f32(*v).to_le_bytes()).collect();
    let mut g = loupe_formats::GgufWriter::new();
    g.add_f32_tensor("blk.0.attn_q.weight", &[4, 3], &w);
    g.add_tensor("blk.0.attn_k.weight", &[4, 3], loupe_formats::GgmlType::F16, half);
    let gguf = dir.path().join("m.gguf");
    g.write_to_path(&gguf).expect("gguf");
    let raw: Vec<u8> = w.iter().flat_map(|v| v.to_le_bytes()).collect();
    let st = dir.path().join("m.safetensors");
    std::fs::write(
        &st,
        write_safetensors(
            &[
                ("model.layers.0.self_attn.q_proj.weight", Dtype::F32, &[3, 4], &raw),
                ("model.layers.0.self_attn.k_proj.weight", Dtype::F32, &[3, 4], &raw),
            ],
            &Default::default(),
        ),
    )
    .expect("st");
    let map = dir.path().join("map.json");
    std::fs::write(
        &map,
        r#"{"version": 1, "rules": [{"side": "b", "match": "blk\\.(\\d+)\\.attn_(q|k)\\.weight", "rename": "model.layers.$1.self_attn.${2}_proj.weight"}]}"#,
    )
    .expect("map");
    let opts = CompareOptions { mapping: loupe_parity::Mapping::load(&map).expect("map"), ..CompareOptions::default() };
    let r = compare(&st, &gguf, &opts, &mut NoProgress).expect("compare");
    assert_eq!(r.pairs.len(), 2);
    assert_eq!(r.verdict.verdict, "match", "{:?}", r.verdict);
    assert!(r.pairs.iter().all(|p| p.shape == vec![3, 4]));
}
