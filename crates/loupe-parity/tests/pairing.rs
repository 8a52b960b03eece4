//! Pairing across tools: MAX `.max` labels, MAX's PyTorch-side `.pt` directories with
//! `tensor_names.txt`, transformers-debugger names, the llama.cpp preset, and a mapping
//! file with a fused qkv split, a transpose and a head reshape. Ambiguous names are never
//! paired.

mod common;

use std::path::Path;

use common::*;
use loupe_formats::max_file::write_max;
use loupe_formats::npy::npy_bytes;
use loupe_formats::zip_archive::write_zip;
use loupe_parity::result::Status;
use loupe_parity::source::SourceKind;
use loupe_parity::{compare, CompareOptions, Mapping, NoProgress, TensorSource};

fn cmp(a: &Path, b: &Path, opts: &CompareOptions) -> loupe_parity::Report {
    compare(a, b, opts, &mut NoProgress).expect("compare")
}

#[test]
fn max_flat_directory_pairs_with_a_loupe_dump() {
    let a = model(1, 0);
    let dir = tempfile::tempdir().expect("tmp");
    let max_dir = dir.path().join("max");
    std::fs::create_dir_all(&max_dir).expect("dir");
    for t in &a {
        write_max(max_dir.join(format!("{}-output.max", t.name)), &format!("{}-output", t.name), &t.shape, &t.data)
            .expect("max");
    }
    // An input label stays unpaired rather than pairing with the module's output.
    write_max(max_dir.join("model.norm-input_0.max"), "model.norm-input_0", &[T, D], &vec![0.0; T * D]).expect("max");
    let dump = write(&dir.path().join("dump"), "loupe", &a, None);
    let r = cmp(&max_dir, &dump, &CompareOptions::default());
    assert_eq!(r.pairs.len(), a.len());
    assert_eq!(r.verdict.verdict, "match");
    // The flat directory is only sorted by name; pairs follow the dump's execution order.
    let names: Vec<&str> = r.pairs.iter().map(|p| p.name.as_str()).collect();
    let expected: Vec<&str> = a.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, expected);
    assert_eq!(r.pairs[0].name_a, "model.embed_tokens-output");
    let src = TensorSource::open(&max_dir).expect("open");
    assert!(!src.ordered);
    let listed: Vec<&str> =
        src.entries.iter().map(|e| e.name.as_str()).filter(|n| n.ends_with("mlp.down_proj-output")).collect();
    assert_eq!(listed[0], "model.layers.0.mlp.down_proj-output", "natural order within the directory");
    assert_eq!(r.unpaired_a.len(), 1);
    assert_eq!(r.unpaired_a[0].name, "model.norm-input_0");
}

#[test]
fn max_torch_directory_with_tensor_names_and_batch_dims() {
    let a = model(1, 0);
    let dir = tempfile::tempdir().expect("tmp");
    let td = dir.path().join("torch");
    let step0 = td.join("0");
    std::fs::create_dir_all(&step0).expect("dir");
    let mut names = String::new();
    for t in &a {
        let label = format!("{}-output", t.name);
        let mut shape = vec![1];
        shape.extend(&t.shape);
        std::fs::write(step0.join(format!("{label}.pt")), pt_bytes(&shape, &t.data)).expect("pt");
        names.push_str(&label);
        names.push('\n');
    }
    std::fs::write(step0.join("tensor_names.txt"), names).expect("names");
    let src = TensorSource::open(&td).expect("open");
    assert_eq!(src.kind, SourceKind::MaxTorchDir);
    // Execution order from tensor_names.txt, not alphabetical (lm_head is last).
    assert_eq!(src.entries.last().map(|e| e.name.as_str()), Some("lm_head-output"));
    assert_eq!(src.entries.first().map(|e| e.name.as_str()), Some("model.embed_tokens-output"));
    let dump = write(&dir.path().join("dump"), "loupe", &a, None);
    let r = cmp(&td, &dump, &CompareOptions::default());
    assert_eq!(r.pairs.len(), a.len());
    assert_eq!(r.verdict.verdict, "match", "{:?}", r.verdict);
    assert_eq!(r.pairs[0].shape_a, vec![1, T, D]);
    assert_eq!(r.pairs[0].shape, vec![T, D]);
}

#[test]
fn transformers_debugger_names_in_an_npz() {
    let a = model(1, 0);
    let dir = tempfile::tempdir().expect("tmp");
    let mut members: Vec<(String, Vec<u8>)> = Vec::new();
    for t in &a {
        members.push((format!("{}_outputs.npy", t.name), npy_bytes(&t.shape, &t.data)));
    }
    members.push(("model.norm_inputs.npy".into(), npy_bytes(&[T, D], &vec![0.0; T * D])));
    let refs: Vec<(&str, &[u8], bool)> = members.iter().map(|(n, b)| (n.as_str(), b.as_slice(), true)).collect();
    let npz = dir.path().join("debug.npz");
    std::fs::write(&npz, write_zip(&refs).expect("zip")).expect("write");
    let dump = write(&dir.path().join("dump"), "loupe", &a, None);
    let r = cmp(&npz, &dump, &CompareOptions::default());
    assert_eq!(r.pairs.len(), a.len());
    assert_eq!(r.verdict.verdict, "match");
    assert_eq!(r.unpaired_a.iter().map(|u| u.name.as_str()).collect::<Vec<_>>(), ["model.norm_inputs"]);
}

#[test]
fn collisions_are_ambiguous_or_resolved_by_the_exact_name() {
    let a = model(1, 0);
    let mut b = a.clone();
    // Two raw names canonicalize to model.norm: neither is exact, so neither pairs.
    let norm = b.iter().position(|t| t.name == "model.norm").expect("norm");
    b[norm].name = "model.norm-output".into();
    let mut dup = b[norm].clone();
    dup.name = "model.norm_outputs".into();
    b.push(dup);
    // The exact name wins over a suffixed one.
    let mut extra = b.iter().find(|t| t.name == "lm_head").expect("lm").clone();
    extra.name = "lm_head-output".into();
    extra.data.iter_mut().for_each(|v| *v = 0.0);
    b.push(extra);
    let r = run(&a, &b);
    assert!(r.pairs.iter().all(|p| p.name != "model.norm"), "an ambiguous name must not pair");
    let amb: Vec<_> = r.unpaired_b.iter().filter(|u| u.reason.as_deref().unwrap_or("").contains("ambiguous")).collect();
    assert_eq!(amb.len(), 2);
    assert!(r.unpaired_a.iter().any(|u| u.name == "model.norm"));
    let lm = r.pairs.iter().find(|p| p.name == "lm_head").expect("lm pair");
    assert_eq!((lm.name_b.as_str(), lm.status), ("lm_head", Status::Match));
    assert!(r.unpaired_b.iter().any(|u| u.raw.as_deref() == Some("lm_head-output") && u.reason.is_some()));
}

#[test]
fn mapping_file_with_fused_split_transpose_and_heads() {
    let a = model(1, 0);
    let g = |n: &str| a.iter().find(|t| t.name == n).expect("tensor");
    let dir = tempfile::tempdir().expect("tmp");
    let tdir = dir.path().join("target");
    std::fs::create_dir_all(&tdir).expect("dir");
    for l in 0..LAYERS {
        // qkv fused along features and stored transposed: [3D, T].
        let (q, k, v) = (
            g(&format!("model.layers.{l}.self_attn.q_proj")),
            g(&format!("model.layers.{l}.self_attn.k_proj")),
            g(&format!("model.layers.{l}.self_attn.v_proj")),
        );
        let mut fused = vec![0f32; 3 * D * T];
        for t in 0..T {
            for (j, src) in [q, k, v].iter().enumerate() {
                for d in 0..D {
                    fused[(j * D + d) * T + t] = src.data[t * D + d];
                }
            }
        }
        std::fs::write(tdir.join(format!("blk.{l}.qkv.npy")), npy_bytes(&[3 * D, T], &fused)).expect("write");
        // Attention output kept heads-first: [H=4, T, 4].
        let att = g(&format!("model.layers.{l}.self_attn.attn_output"));
        let (h, hd) = (4, D / 4);
        let mut hf = vec![0f32; D * T];
        for t in 0..T {
            for hh in 0..h {
                for d in 0..hd {
                    hf[(hh * T + t) * hd + d] = att.data[t * D + hh * hd + d];
                }
            }
        }
        std::fs::write(tdir.join(format!("blk.{l}.attn_heads.npy")), npy_bytes(&[h, T, hd], &hf)).expect("write");
        let out = g(&format!("model.layers.{l}"));
        std::fs::write(tdir.join(format!("l_out-{l}.npy")), npy_bytes(&out.shape, &out.data)).expect("write");
    }
    let map = dir.path().join("map.json");
    std::fs::write(
        &map,
        r#"{"version": 1, "preset": "llama.cpp", "rules": [
          {"side": "b", "match": "blk\\.(\\d+)\\.qkv", "transforms": [{"op": "transpose", "perm": [1, 0]}],
           "split": {"axis": -1, "parts": [
             {"rename": "model.layers.$1.self_attn.q_proj", "size": 16},
             {"rename": "model.layers.$1.self_attn.k_proj", "size": 16},
             {"rename": "model.layers.$1.self_attn.v_proj", "size": 16}]}},
          {"side": "b", "match": "blk\\.(\\d+)\\.attn_heads", "rename": "model.layers.${1}.self_attn.attn_output",
           "transforms": [{"op": "heads_first"}]}
        ]}"#,
    )
    .expect("map");
    let dump = write(&dir.path().join("ref"), "transformers", &a, None);
    let opts = CompareOptions { mapping: Mapping::load(&map).expect("mapping"), ..CompareOptions::default() };
    let r = cmp(&dump, &tdir, &opts);
    assert_eq!(r.pairs.len(), LAYERS * 5, "{:?}", r.pairs.iter().map(|p| &p.name).collect::<Vec<_>>());
    assert_eq!(r.verdict.verdict, "match", "{:?}", r.verdict);
    let k = r.pairs.iter().find(|p| p.name == "model.layers.2.self_attn.k_proj").expect("k");
    assert_eq!((k.name_b.as_str(), k.shape_b.clone()), ("blk.2.qkv", vec![T, D]));
    assert!(r.unpaired_b.is_empty());
    // A split that does not cover the axis is an error naming the tensor.
    let bad = dir.path().join("bad.json");
    std::fs::write(&bad, r#"{"version": 1, "rules": [{"side": "b", "match": "blk\\.(\\d+)\\.qkv", "split": {"parts": [{"rename": "x$1", "size": 5}]}}]}"#).expect("bad");
    let opts = CompareOptions {
        mapping: Mapping::load(&bad).expect("mapping"),
        only: Some(regex::Regex::new("^x0$").expect("re")),
        ..CompareOptions::default()
    };
    let mut a2 = a.clone();
    a2.push(Named { name: "x0".into(), step: 0, shape: vec![3 * D, 5], data: vec![0.0; 3 * D * 5] });
    let dump2 = write(&dir.path().join("ref2"), "transformers", &a2, None);
    let err = compare(&dump2, &tdir, &opts, &mut NoProgress).unwrap_err().to_string();
    assert!(err.contains("blk.0.qkv") && err.contains("split parts cover 5"), "{err}");
}

#[test]
fn two_single_files_pair_whatever_their_names() {
    let dir = tempfile::tempdir().expect("tmp");
    let (x, y) = (dir.path().join("torch_out.npy"), dir.path().join("max_out.max"));
    std::fs::write(&x, npy_bytes(&[1, 2, 3], &[1., 2., 3., 4., 5., 6.])).expect("npy");
    write_max(&y, "whatever-output", &[2, 3], &[1., 2., 3., 4., 5., 6.]).expect("max");
    let r = cmp(&x, &y, &CompareOptions::default());
    assert_eq!(r.pairs.len(), 1);
    assert_eq!(r.verdict.verdict, "match");
    assert_eq!(r.pairs[0].name_b, "whatever-output");
}
