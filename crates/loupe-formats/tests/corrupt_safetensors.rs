//! Hand-made corrupt safetensors files and sharded checkpoints, one test per category
//! (docs/parsers-threat-model.md). Each must be
//! rejected with an error naming the file and the field.

use std::collections::BTreeMap;
use std::path::Path;

use loupe_formats::safetensors_file::{write_safetensors, Dtype, MAX_HEADER_LEN};
use loupe_formats::{FormatError, SafetensorsCheckpoint, SafetensorsFile};

const LABEL: &str = "corrupt.safetensors";

/// An image with the given JSON header and data section.
fn st(json: &str, data: &[u8]) -> Vec<u8> {
    let mut out = (json.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(json.as_bytes());
    out.extend_from_slice(data);
    out
}

fn assert_rejects(bytes: Vec<u8>, needles: &[&str]) -> FormatError {
    let err = match SafetensorsFile::from_bytes(LABEL, bytes) {
        Ok(f) => panic!("accepted a corrupt file: {f:?}"),
        Err(e) => e,
    };
    let msg = err.to_string();
    assert!(msg.starts_with(LABEL), "message does not name the file: {msg}");
    for needle in needles {
        assert!(msg.contains(needle), "message lacks {needle:?}: {msg}");
    }
    err
}

#[test]
fn the_valid_baseline_is_accepted() {
    let f =
        SafetensorsFile::from_bytes(LABEL, st(r#"{"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#, &[0; 8]))
            .expect("valid");
    assert_eq!(f.to_f32("w").ok(), Some(vec![0.0, 0.0]));
}

#[test]
fn huge_header_length() {
    let mut bytes = u64::MAX.to_le_bytes().to_vec();
    bytes.extend_from_slice(b"{}");
    let err = assert_rejects(bytes, &["header length", "over the limit of 100000000"]);
    assert!(matches!(err, FormatError::TooLarge { .. }));
    let mut bytes = (MAX_HEADER_LEN + 1).to_le_bytes().to_vec();
    bytes.extend_from_slice(b"{}");
    assert_rejects(bytes, &["header length"]);
    // Under the cap but past the end of the file: refused before allocating.
    let mut bytes = 1_000_000u64.to_le_bytes().to_vec();
    bytes.extend_from_slice(b"{}");
    let err = assert_rejects(bytes, &["truncated", "header (1000000 bytes declared)"]);
    assert!(matches!(err, FormatError::Truncated { .. }));
    assert_rejects(vec![1, 2, 3], &["truncated", "header length"]);
}

#[test]
fn shape_bytes_mismatch() {
    let json = r#"{"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}"#;
    assert_rejects(st(json, &[0; 8]), &["tensor 'w' data_offsets", "spans 8 bytes", "needs 12"]);
    let json = r#"{"w":{"dtype":"BF16","shape":[2,2],"data_offsets":[0,4]}}"#;
    assert_rejects(st(json, &[0; 4]), &["tensor 'w' data_offsets", "needs 8"]);
}

#[test]
fn shape_product_overflow() {
    // 2^32 x 2^32 wraps to 0 in unchecked u64 arithmetic, matching the empty range.
    let json = r#"{"w":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,0]}}"#;
    assert_rejects(st(json, &[]), &["tensor 'w' shape", "overflows"]);
    let json = r#"{"w":{"dtype":"F32","shape":[18446744073709551615],"data_offsets":[0,0]}}"#;
    assert_rejects(st(json, &[]), &["tensor 'w' shape", "overflows"]);
}

#[test]
fn overlapping_offsets() {
    let json = r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},
                   "b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}"#;
    assert_rejects(st(json, &[0; 12]), &["tensor 'b' data_offsets", "overlaps tensor 'a' [0, 8)"]);
    let json = r#"{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},
                   "b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}"#;
    assert_rejects(st(json, &[0; 8]), &["overlaps"]);
}

#[test]
fn gaps_and_uncovered_bytes() {
    let json = r#"{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},
                   "b":{"dtype":"U8","shape":[4],"data_offsets":[8,12]}}"#;
    assert_rejects(st(json, &[0; 12]), &["tensor 'b' data_offsets", "gap"]);
    let json = r#"{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]}}"#;
    assert_rejects(st(json, &[0; 6]), &["data section", "is 6 bytes but the tensors cover 4"]);
    assert_rejects(st(json, &[0; 2]), &["data section", "is 2 bytes"]);
}

#[test]
fn bad_offsets() {
    let json = r#"{"a":{"dtype":"U8","shape":[0],"data_offsets":[4,0]}}"#;
    assert_rejects(st(json, &[0; 4]), &["tensor 'a' data_offsets", "end 0 is before start 4"]);
    let json = r#"{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4,8]}}"#;
    assert_rejects(st(json, &[0; 4]), &["tensor 'a' data_offsets", "3 values"]);
    let json = r#"{"a":{"dtype":"U8","shape":[4],"data_offsets":[-1,3]}}"#;
    assert_rejects(st(json, &[0; 4]), &["tensor 'a' data_offsets", "not a non-negative integer"]);
    let json = r#"{"a":{"dtype":"U8","shape":[4]}}"#;
    assert_rejects(st(json, &[0; 4]), &["tensor 'a' data_offsets", "is missing"]);
}

#[test]
fn bad_json() {
    assert_rejects(st(r#"{"a":"#, &[]), &["header JSON"]);
    assert_rejects(st("[1,2]", &[]), &["header JSON", "not an object"]);
    assert_rejects(st("\"str\"", &[]), &["header JSON"]);
    let mut bytes = st("{}  ", &[]);
    bytes[9] = 0xff;
    assert_rejects(bytes, &["header JSON"]);
    assert_rejects(st(r#"{"a":5}"#, &[]), &["tensor 'a' entry", "not an object"]);
    assert_rejects(st(r#"{"__metadata__":{"k":1}}"#, &[]), &["__metadata__ 'k'", "not a string"]);
    // A nesting bomb stops at serde_json's recursion limit, not the stack.
    let bomb = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    assert_rejects(st(&bomb, &[]), &["header JSON"]);
}

#[test]
fn duplicate_keys() {
    let json = r#"{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},
                   "a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}}"#;
    assert_rejects(st(json, &[0; 2]), &["header JSON", "duplicate key \"a\""]);
}

#[test]
fn unknown_dtype() {
    let json = r#"{"a":{"dtype":"Q4_K","shape":[1],"data_offsets":[0,1]}}"#;
    assert_rejects(st(json, &[0]), &["tensor 'a' dtype", "Q4_K"]);
}

// ---- sharded checkpoints ----

fn shard(tensors: &[(&str, &[f32])]) -> Vec<u8> {
    let owned: Vec<(String, Vec<usize>, Vec<u8>)> = tensors
        .iter()
        .map(|(n, v)| ((*n).to_string(), vec![v.len()], v.iter().flat_map(|x| x.to_le_bytes()).collect()))
        .collect();
    let view: Vec<(&str, Dtype, &[usize], &[u8])> =
        owned.iter().map(|(n, s, b)| (n.as_str(), Dtype::F32, s.as_slice(), b.as_slice())).collect();
    write_safetensors(&view, &BTreeMap::new())
}

fn write(dir: &Path, name: &str, bytes: &[u8]) {
    std::fs::write(dir.join(name), bytes).expect("write");
}

const INDEX: &str = "model.safetensors.index.json";

fn sharded_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    write(dir.path(), "model-00001-of-00002.safetensors", &shard(&[("a", &[1.0]), ("b", &[2.0, 3.0])]));
    write(dir.path(), "model-00002-of-00002.safetensors", &shard(&[("c", &[4.0])]));
    write(
        dir.path(),
        INDEX,
        br#"{"metadata":{"total_size":16},"weight_map":{
            "a":"model-00001-of-00002.safetensors","b":"model-00001-of-00002.safetensors",
            "c":"model-00002-of-00002.safetensors"}}"#,
    );
    dir
}

#[test]
fn sharded_checkpoint_unified_lookup() {
    let dir = sharded_dir();
    let ck = SafetensorsCheckpoint::open(dir.path()).expect("valid checkpoint");
    assert_eq!(ck.shards.len(), 2);
    assert_eq!(ck.len(), 3);
    assert_eq!(ck.names().collect::<Vec<_>>(), ["a", "b", "c"]);
    assert_eq!(ck.to_f32("b").ok(), Some(vec![2.0, 3.0]));
    assert_eq!(ck.to_f32("c").ok(), Some(vec![4.0]));
    assert_eq!(ck.shape("b").ok(), Some(&[2usize][..]));
    assert_eq!(ck.dtype("a").ok(), Some(Dtype::F32));
    assert_eq!(ck.tensor_bytes("c").ok(), Some(&4.0f32.to_le_bytes()[..]));
    assert_eq!(ck.index_metadata["total_size"], 16);
    let err = ck.to_f32("zz").unwrap_err().to_string();
    assert!(err.contains(INDEX) && err.contains("'zz'"), "{err}");
    // The index file itself also opens it.
    assert_eq!(SafetensorsCheckpoint::open(dir.path().join(INDEX)).map(|c| c.len()).ok(), Some(3));
}

#[test]
fn single_file_checkpoint() {
    let dir = tempfile::tempdir().expect("tempdir");
    write(dir.path(), "model.safetensors", &shard(&[("w", &[1.5])]));
    let ck = SafetensorsCheckpoint::open(dir.path()).expect("single file");
    assert_eq!(ck.to_f32("w").ok(), Some(vec![1.5]));
    assert!(ck.index_path.is_none());
    let ck = SafetensorsCheckpoint::open(dir.path().join("model.safetensors")).expect("the file itself");
    assert_eq!(ck.len(), 1);
    let empty = tempfile::tempdir().expect("tempdir");
    let err = SafetensorsCheckpoint::open(empty.path()).unwrap_err().to_string();
    assert!(err.contains("model.safetensors.index.json or model.safetensors"), "{err}");
}

fn assert_checkpoint_rejects(dir: &Path, needles: &[&str]) {
    let err = SafetensorsCheckpoint::open(dir).expect_err("corrupt checkpoint accepted").to_string();
    for needle in needles {
        assert!(err.contains(needle), "message lacks {needle:?}: {err}");
    }
}

#[test]
fn index_path_traversal() {
    let dir = sharded_dir();
    for evil in ["../model-00002-of-00002.safetensors", "/etc/passwd", "sub/x.safetensors", ".."] {
        let index = format!(r#"{{"weight_map":{{"a":"{evil}"}}}}"#);
        write(dir.path(), INDEX, index.as_bytes());
        assert_checkpoint_rejects(dir.path(), &[INDEX, "weight_map shard", "not a plain file name"]);
    }
}

#[test]
fn index_and_shards_disagree() {
    let dir = sharded_dir();
    // A listed tensor missing from its shard.
    write(
        dir.path(),
        INDEX,
        br#"{"weight_map":{"a":"model-00001-of-00002.safetensors","b":"model-00001-of-00002.safetensors",
            "c":"model-00002-of-00002.safetensors","d":"model-00002-of-00002.safetensors"}}"#,
    );
    assert_checkpoint_rejects(dir.path(), &["weight_map 'd'", "has no tensor of that name"]);
    // A shard tensor the index does not list.
    write(
        dir.path(),
        INDEX,
        br#"{"weight_map":{"a":"model-00001-of-00002.safetensors","c":"model-00002-of-00002.safetensors"}}"#,
    );
    assert_checkpoint_rejects(dir.path(), &["model-00001-of-00002.safetensors", "tensor 'b'", "does not list it"]);
    // The same tensor in two shards.
    write(dir.path(), "model-00002-of-00002.safetensors", &shard(&[("a", &[9.0]), ("c", &[4.0])]));
    write(
        dir.path(),
        INDEX,
        br#"{"weight_map":{"a":"model-00001-of-00002.safetensors","b":"model-00001-of-00002.safetensors",
            "c":"model-00002-of-00002.safetensors"}}"#,
    );
    assert_checkpoint_rejects(
        dir.path(),
        &["model-00002-of-00002.safetensors", "tensor 'a'", "lists it in shard model-00001"],
    );
}

#[test]
fn index_missing_shard_or_bad_json() {
    let dir = sharded_dir();
    write(dir.path(), INDEX, br#"{"weight_map":{"a":"model-00009-of-00009.safetensors"}}"#);
    assert_checkpoint_rejects(dir.path(), &["model-00009-of-00009.safetensors"]);
    write(dir.path(), INDEX, br#"{"weight_map":{"a":"x","a":"y"}}"#);
    assert_checkpoint_rejects(dir.path(), &[INDEX, "duplicate key \"a\""]);
    write(dir.path(), INDEX, b"not json");
    assert_checkpoint_rejects(dir.path(), &[INDEX, "index JSON"]);
    // A corrupt shard is reported under the shard's own name.
    write(dir.path(), "model-00002-of-00002.safetensors", b"\xff\xff\xff\xff\xff\xff\xff\xff");
    write(dir.path(), INDEX, br#"{"weight_map":{"c":"model-00002-of-00002.safetensors"}}"#);
    assert_checkpoint_rejects(dir.path(), &["model-00002-of-00002.safetensors", "header length"]);
}
