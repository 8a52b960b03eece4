//! Hand-made corrupt GGUF files, one test per category of parser failure seen in the wild
//! (docs/parsers-threat-model.md). Each file is built byte by byte, and each must be
//! rejected with a typed error whose message names the file and the field at fault.

use std::time::{Duration, Instant};

use loupe_formats::gguf::writer::GgufWriter;
use loupe_formats::{FormatError, GgmlType, GgufFile, GgufValue, GgufValueType};

const LABEL: &str = "corrupt.gguf";

/// Parses `bytes` and asserts a rejection whose message names the file and contains
/// every string of `needles`. Returns the error for variant checks.
fn assert_rejects(bytes: Vec<u8>, needles: &[&str]) -> FormatError {
    let err = match GgufFile::from_bytes(LABEL, bytes) {
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

/// A little-endian byte builder for GGUF images.
#[derive(Default, Clone)]
struct B(Vec<u8>);

impl B {
    fn header(version: u32, n_tensors: u64, n_kv: u64) -> B {
        let mut b = B(b"GGUF".to_vec());
        b.u32(version).u64(n_tensors).u64(n_kv);
        b
    }
    fn raw(&mut self, bytes: &[u8]) -> &mut B {
        self.0.extend_from_slice(bytes);
        self
    }
    fn u8(&mut self, v: u8) -> &mut B {
        self.raw(&[v])
    }
    fn u32(&mut self, v: u32) -> &mut B {
        self.raw(&v.to_le_bytes())
    }
    fn u64(&mut self, v: u64) -> &mut B {
        self.raw(&v.to_le_bytes())
    }
    fn str(&mut self, s: &[u8]) -> &mut B {
        self.u64(s.len() as u64).raw(s)
    }
    fn kv_u32(&mut self, key: &str, v: u32) -> &mut B {
        self.str(key.as_bytes()).u32(4).u32(v)
    }
    fn kv_str(&mut self, key: &str, v: &[u8]) -> &mut B {
        self.str(key.as_bytes()).u32(8).str(v)
    }
    fn tensor(&mut self, name: &str, dims: &[u64], ty: u32, offset: u64) -> &mut B {
        self.str(name.as_bytes()).u32(dims.len() as u32);
        for &d in dims {
            self.u64(d);
        }
        self.u32(ty).u64(offset)
    }
    fn pad(&mut self, alignment: usize) -> &mut B {
        while !self.0.len().is_multiple_of(alignment) {
            self.0.push(0);
        }
        self
    }
    fn zeros(&mut self, n: usize) -> &mut B {
        self.0.resize(self.0.len() + n, 0);
        self
    }
    fn done(&self) -> Vec<u8> {
        self.0.clone()
    }
}

/// A valid file: one metadata pair, one f32 tensor of 4 elements.
fn valid() -> B {
    let mut b = B::header(3, 1, 1);
    b.kv_str("general.architecture", b"llama").tensor("w", &[4], 0, 0).pad(32).zeros(16);
    b
}

#[test]
fn the_valid_baseline_is_accepted() {
    let f = GgufFile::from_bytes(LABEL, valid().done()).expect("valid");
    assert_eq!(f.tensors.len(), 1);
    let mut v2 = valid().done();
    v2[4] = 2;
    assert_eq!(GgufFile::from_bytes(LABEL, v2).map(|f| f.version).ok(), Some(2));
}

#[test]
fn bad_magic() {
    let mut bytes = valid().done();
    bytes[..4].copy_from_slice(b"GGML");
    let err = assert_rejects(bytes, &["not a GGUF file", "GGML"]);
    assert!(matches!(err, FormatError::BadMagic { .. }));
    assert_rejects(b"PK\x03\x04 a zip file".to_vec(), &["not a GGUF file", "a zip archive"]);
    let mut safetensors = 2u64.to_le_bytes().to_vec();
    safetensors.extend_from_slice(b"{}");
    assert_rejects(safetensors, &["not a GGUF file", "looks like safetensors"]);
    assert_rejects(Vec::new(), &["magic"]);
    assert_rejects(b"GG".to_vec(), &["truncated", "magic"]);
}

#[test]
fn version_1_is_unsupported() {
    let err = assert_rejects(B::header(1, 0, 0).done(), &["unsupported GGUF version 1"]);
    assert!(matches!(err, FormatError::Unsupported { .. }));
}

#[test]
fn unknown_versions() {
    assert_rejects(B::header(0, 0, 0).done(), &["unsupported GGUF version 0"]);
    assert_rejects(B::header(4, 0, 0).done(), &["unsupported GGUF version 4"]);
    assert_rejects(B::header(u32::MAX, 0, 0).done(), &["GGUF version 4294967295"]);
}

#[test]
fn big_endian() {
    // gguf-py writes big-endian files with the magic as is and every number swapped, so the
    // version reads as 0x03000000 (gguf_reader.py detects them the same way).
    let mut bytes = b"GGUF".to_vec();
    bytes.extend_from_slice(&3u32.to_be_bytes());
    bytes.extend_from_slice(&0u64.to_be_bytes());
    bytes.extend_from_slice(&0u64.to_be_bytes());
    assert_rejects(bytes, &["big-endian GGUF", "version 3 byte-swapped"]);
    let mut swapped_magic = valid().done();
    swapped_magic[..4].copy_from_slice(b"FUGG");
    assert_rejects(swapped_magic, &["big-endian GGUF"]);
}

#[test]
fn truncated_at_every_field() {
    // A file with every value type, nested arrays and several tensors, cut at every byte
    // before the end of its last tensor's data: every prefix must be refused as truncated.
    let mut w = GgufWriter::new();
    w.add("general.architecture", GgufValue::String("llama".into()));
    for (i, v) in [
        GgufValue::U8(1),
        GgufValue::I8(-1),
        GgufValue::U16(2),
        GgufValue::I16(-2),
        GgufValue::U32(3),
        GgufValue::I32(-3),
        GgufValue::F32(0.5),
        GgufValue::Bool(true),
        GgufValue::U64(4),
        GgufValue::I64(-4),
        GgufValue::F64(0.25),
    ]
    .into_iter()
    .enumerate()
    {
        w.add(format!("scalar.{i}"), v);
    }
    w.add("tokens", GgufValue::Array(GgufValueType::String, vec![GgufValue::String("ab".into()); 3]));
    w.add(
        "nested",
        GgufValue::Array(GgufValueType::Array, vec![GgufValue::Array(GgufValueType::U16, vec![GgufValue::U16(9); 2])]),
    );
    w.add_f32_tensor("a", &[2, 2], &[1.0, 2.0, 3.0, 4.0]);
    w.add_tensor("q", &[32], GgmlType::Q4_1, vec![1; 20]);
    let full = w.to_bytes().expect("valid");
    let f = GgufFile::from_bytes(LABEL, full.clone()).expect("valid");
    let data_end = f.tensors.iter().map(|t| f.data_offset + t.offset + t.size_bytes).max().expect("tensors") as usize;
    let mut fields = std::collections::BTreeSet::new();
    for len in 0..data_end {
        let err = GgufFile::from_bytes(LABEL, full[..len].to_vec()).expect_err("prefix accepted");
        match &err {
            FormatError::Truncated { field, .. } => {
                fields.insert(field.split([':', '[', '(']).next().unwrap_or("").trim().to_string());
            }
            other => panic!("prefix of {len} bytes: expected a truncation error, got {other}"),
        }
        assert!(err.to_string().starts_with(LABEL));
    }
    // The cuts landed in every kind of field.
    // (Cuts early in the metadata are caught by the up-front check that the declared
    // counts fit in the bytes left, reported as "header".)
    for expected in
        ["magic", "version", "tensor count", "metadata kv count", "header", "metadata kv #13 key string length"]
    {
        assert!(fields.contains(expected), "no cut reported in {expected:?}: {fields:?}");
    }
    assert!(fields.iter().any(|f| f.starts_with("metadata 'nested'")), "{fields:?}");
    assert!(fields.iter().any(|f| f.starts_with("tensor 'q' dims")), "{fields:?}");
    assert!(fields.iter().any(|f| f.starts_with("data of tensor")), "{fields:?}");
    // Prefixes that keep all the data (cutting only the final padding) are fine.
    for len in data_end..=full.len() {
        assert!(GgufFile::from_bytes(LABEL, full[..len].to_vec()).is_ok(), "{len}");
    }
}

#[test]
fn huge_string_length() {
    let mut b = B::header(3, 0, 1);
    b.u64(u64::MAX).raw(b"general.name");
    let err = assert_rejects(b.done(), &["metadata kv #0 key string length", "over the limit"]);
    assert!(matches!(err, FormatError::TooLarge { .. }));

    let mut b = B::header(3, 0, 1);
    b.str(b"general.name").u32(8).u64(1 << 40).raw(b"x");
    assert_rejects(b.done(), &["metadata 'general.name' string length", "1099511627776"]);

    // Under the cap but past the end of the file.
    let mut b = B::header(3, 0, 1);
    b.str(b"general.name").u32(8).u64(1000).raw(b"short");
    assert_rejects(b.done(), &["truncated", "metadata 'general.name' string bytes"]);
}

#[test]
fn huge_array_count_fails_instantly() {
    // The 43-byte file that hung the Python reader: an array of 2^63 elements.
    let mut b = B::header(3, 0, 1);
    b.str(b"a").u32(9).u32(0).u64(1 << 63);
    let bytes = b.done();
    assert!(bytes.len() < 64, "{} bytes", bytes.len());
    let start = Instant::now();
    assert_rejects(bytes, &["metadata 'a' array length", "9223372036854775808", "over the limit"]);
    assert!(start.elapsed() < Duration::from_secs(1));

    // Under the cap, but more u64 elements than the file has bytes for.
    let mut b = B::header(3, 0, 1);
    b.str(b"a").u32(9).u32(10).u64(1_000_000).u64(7);
    assert_rejects(b.done(), &["truncated", "metadata 'a'", "1000000 x u64 needs at least 8000000 bytes"]);

    // Strings: each needs at least its 8-byte length.
    let mut b = B::header(3, 0, 1);
    b.str(b"tok").u32(9).u32(8).u64(100).zeros(100);
    assert_rejects(b.done(), &["metadata 'tok'", "100 x string needs at least 800 bytes"]);
}

#[test]
fn nested_array_depth_bomb() {
    let nest = |depth: usize| {
        let mut b = B::header(3, 0, 1);
        b.str(b"bomb").u32(9);
        for _ in 0..depth - 1 {
            b.u32(9).u64(1);
        }
        b.u32(0).u64(1).u8(7);
        b.done()
    };
    assert!(GgufFile::from_bytes(LABEL, nest(8)).is_ok(), "depth 8 is allowed");
    assert_rejects(nest(9), &["metadata 'bomb'[0][0][0][0][0][0][0][0] array nesting depth", "is 9", "limit of 8"]);
    assert_rejects(nest(10_000), &["array nesting depth"]);
}

#[test]
fn counts_of_minus_one() {
    let err = assert_rejects(B::header(3, u64::MAX, 0).done(), &["tensor count", "18446744073709551615"]);
    assert!(matches!(err, FormatError::TooLarge { .. }));
    assert_rejects(B::header(3, 0, u64::MAX).done(), &["metadata kv count", "over the limit"]);
    // Under the caps, but more than the file could hold.
    assert_rejects(B::header(3, 1000, 0).done(), &["truncated", "1000 tensor infos need at least 32000 bytes"]);
}

#[test]
fn too_many_or_too_few_dims() {
    let mut b = B::header(3, 1, 0);
    b.tensor("w", &[1, 1, 1, 1, 4], 0, 0).pad(32).zeros(16);
    assert_rejects(b.done(), &["tensor 'w' n_dims", "5 dimensions", "GGML_MAX_DIMS"]);
    let mut b = B::header(3, 1, 0);
    b.tensor("w", &[], 0, 0).pad(32).zeros(16);
    assert_rejects(b.done(), &["tensor 'w' n_dims", "0 dimensions"]);
    let mut b = B::header(3, 1, 0);
    b.str(b"w").u32(u32::MAX).zeros(64);
    assert_rejects(b.done(), &["tensor 'w' n_dims"]);
}

#[test]
fn zero_dim() {
    let mut b = B::header(3, 1, 0);
    b.tensor("w", &[4, 0], 0, 0).pad(32).zeros(16);
    assert_rejects(b.done(), &["tensor 'w' dims[1]", "dimension is 0"]);
}

#[test]
fn dim_product_overflow() {
    let mut b = B::header(3, 1, 0);
    b.tensor("w", &[1 << 32, 1 << 32], 0, 0).pad(32).zeros(16);
    assert_rejects(b.done(), &["tensor 'w' dims[1]", "element count overflows"]);
    // Fits u64 but not ggml's int64_t `ne`.
    let mut b = B::header(3, 1, 0);
    b.tensor("w", &[1 << 62, 4], 0, 0);
    assert_rejects(b.done(), &["tensor 'w' dims[1]", "overflows"]);
    // The element count fits, the byte size is past the file.
    let mut b = B::header(3, 1, 0);
    b.tensor("w", &[1 << 40, 1 << 20], 0, 0);
    assert_rejects(b.done(), &["data of tensor 'w'"]);
}

#[test]
fn unknown_type_id() {
    // (1000 is loupe's own FP8 type, `loupe_core::FP8_E4M3_TYPE_ID`; 41 is past ggml's last.)
    for id in [4u32, 5, 16, 29, 31, 41, 999, 1001, u32::MAX] {
        let mut b = B::header(3, 1, 0);
        b.tensor("blk.0.ffn_up.weight", &[32], id, 0).pad(32).zeros(64);
        let err = assert_rejects(b.done(), &["unsupported ggml type id", &id.to_string(), "blk.0.ffn_up.weight"]);
        assert!(matches!(err, FormatError::Unsupported { .. }));
    }
}

#[test]
fn block_size_mismatch() {
    let mut b = B::header(3, 1, 0);
    b.tensor("w", &[33, 2], GgmlType::Q4_1.id(), 0).pad(32).zeros(64);
    assert_rejects(b.done(), &["tensor 'w' dims[0]", "33 is not a multiple of the q4_1 block size 32"]);
}

#[test]
fn bad_alignment() {
    let with_alignment = |value: &mut dyn FnMut(&mut B)| {
        let mut b = B::header(3, 1, 1);
        b.str(b"general.alignment");
        value(&mut b);
        b.tensor("w", &[4], 0, 0).pad(64).zeros(16);
        b.done()
    };
    assert_rejects(
        with_alignment(&mut |b| {
            b.u32(4).u32(0);
        }),
        &["general.alignment", "0 is not a non-zero power of two"],
    );
    assert_rejects(
        with_alignment(&mut |b| {
            b.u32(4).u32(48);
        }),
        &["general.alignment", "48 is not"],
    );
    let err = assert_rejects(
        with_alignment(&mut |b| {
            b.u32(4).u32(1 << 31);
        }),
        &["general.alignment", "over the limit"],
    );
    assert!(matches!(err, FormatError::TooLarge { .. }));
    assert_rejects(
        with_alignment(&mut |b| {
            b.u32(10).u64(32);
        }),
        &["general.alignment", "must be a u32, found u64"],
    );
    assert_rejects(
        with_alignment(&mut |b| {
            b.u32(5).u32(32);
        }),
        &["general.alignment", "found i32"],
    );
    // A valid non-default alignment moves the data section.
    let ok = with_alignment(&mut |b| {
        b.u32(4).u32(64);
    });
    let f = GgufFile::from_bytes(LABEL, ok).expect("alignment 64");
    assert_eq!((f.alignment, f.data_offset % 64), (64, 0));
}

#[test]
fn offset_misaligned() {
    let mut b = B::header(3, 1, 0);
    b.tensor("w", &[4], 0, 8).pad(32).zeros(64);
    assert_rejects(b.done(), &["tensor 'w' offset", "8 is not a multiple of the alignment 32"]);
}

#[test]
fn offset_past_eof() {
    let mut b = B::header(3, 1, 0);
    b.tensor("w", &[4], 0, 1 << 20).pad(32).zeros(16);
    let err = assert_rejects(b.done(), &["data of tensor 'w'", "16 bytes at data offset 1048576"]);
    assert!(matches!(err, FormatError::Truncated { .. }));
    // An offset so large that data_offset + offset wraps u64.
    let mut b = B::header(3, 1, 0);
    b.tensor("w", &[4], 0, u64::MAX - 31).pad(32).zeros(16);
    assert_rejects(b.done(), &["data of tensor 'w'"]);
}

#[test]
fn overlapping_tensors() {
    let mut b = B::header(3, 2, 0);
    b.tensor("a", &[16], 0, 0).tensor("b", &[16], 0, 32).pad(32).zeros(96);
    assert!(GgufFile::from_bytes(LABEL, b.done()).is_err(), "a is 64 bytes, b starts at 32");
    assert_rejects(b.done(), &["tensor 'b' offset", "overlaps tensor 'a'"]);
    // Declared in reverse order: still found.
    let mut b = B::header(3, 2, 0);
    b.tensor("b", &[16], 0, 32).tensor("a", &[16], 0, 0).pad(32).zeros(96);
    assert_rejects(b.done(), &["tensor 'b' offset", "overlaps tensor 'a'"]);
    // Two tensors at the same offset.
    let mut b = B::header(3, 2, 0);
    b.tensor("a", &[4], 0, 0).tensor("b", &[4], 0, 0).pad(32).zeros(32);
    assert_rejects(b.done(), &["overlaps"]);
}

#[test]
fn duplicate_tensor_name() {
    let mut b = B::header(3, 2, 0);
    b.tensor("w", &[4], 0, 0).tensor("w", &[4], 0, 32).pad(32).zeros(64);
    assert_rejects(b.done(), &["tensor #1 name", "duplicate tensor name 'w' (also tensor #0)"]);
}

#[test]
fn duplicate_key() {
    let mut b = B::header(3, 0, 2);
    b.kv_u32("llama.block_count", 30).kv_u32("llama.block_count", 31);
    assert_rejects(b.done(), &["metadata key 'llama.block_count'", "duplicate key (kv #0 and kv #1)"]);
}

#[test]
fn invalid_utf8() {
    let mut b = B::header(3, 0, 1);
    b.str(b"general.\xffname").u32(4).u32(1);
    assert_rejects(b.done(), &["metadata kv #0 key", "not valid UTF-8", "byte offset 40"]);
    let mut b = B::header(3, 0, 1);
    b.kv_str("general.name", b"caf\xc3");
    assert_rejects(b.done(), &["metadata 'general.name'", "not valid UTF-8"]);
    let mut b = B::header(3, 0, 1);
    b.str(b"tokenizer.ggml.tokens").u32(9).u32(8).u64(2).str(b"ok").str(b"\xc0\x80");
    assert_rejects(b.done(), &["metadata 'tokenizer.ggml.tokens'[1]", "not valid UTF-8"]);
    let mut b = B::header(3, 1, 0);
    b.tensor("w\u{80}", &[4], 0, 0);
    let mut bytes = b.done();
    let at = bytes.iter().position(|&c| c == 0xc2).expect("the name's first byte");
    bytes[at] = 0xfe;
    assert_rejects(bytes, &["tensor #0 name", "not valid UTF-8"]);
}

#[test]
fn wrong_value_type_id() {
    for id in [13u32, 14, 255, u32::MAX] {
        let mut b = B::header(3, 0, 1);
        b.str(b"general.name").u32(id).u32(0);
        assert_rejects(b.done(), &["metadata 'general.name' value type", &format!("unknown value type id {id}")]);
    }
    let mut b = B::header(3, 0, 1);
    b.str(b"arr").u32(9).u32(13).u64(1).u8(0);
    assert_rejects(b.done(), &["metadata 'arr' array element type", "unknown value type id 13"]);
}

#[test]
fn invalid_bool() {
    let mut b = B::header(3, 0, 1);
    b.str(b"flag").u32(7).u8(2);
    assert_rejects(b.done(), &["metadata 'flag'", "bool byte is 2"]);
}

#[test]
fn empty_or_overlong_names() {
    let mut b = B::header(3, 0, 1);
    b.str(b"").u32(4).u32(1);
    assert_rejects(b.done(), &["metadata kv #0 key", "key is empty"]);
    let mut b = B::header(3, 1, 0);
    b.tensor("", &[4], 0, 0).pad(32).zeros(16);
    assert_rejects(b.done(), &["tensor #0 name", "name is empty"]);
    let mut b = B::header(3, 1, 0);
    b.tensor(&"x".repeat(65), &[4], 0, 0).pad(32).zeros(16);
    assert_rejects(b.done(), &["tensor #0 name string length", "is 65, over the limit of 64"]);
}

#[test]
fn open_reports_io_errors_with_the_path() {
    let missing = std::env::temp_dir().join("loupe-no-such-file.gguf");
    let err = GgufFile::open(&missing).expect_err("missing file");
    assert!(matches!(err, FormatError::Io { .. }));
    assert!(err.to_string().contains("loupe-no-such-file.gguf"), "{err}");

    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("m.gguf");
    std::fs::write(&path, valid().done()).expect("write");
    let f = GgufFile::open(&path).expect("mapped");
    assert!(f.shared_bytes().is_mapped());
    assert_eq!(f.tensor_bytes("w").map(<[u8]>::len).ok(), Some(16));
    let err = GgufFile::open(dir.path()).expect_err("a directory");
    assert!(err.to_string().contains("not a regular file"), "{err}");
}
