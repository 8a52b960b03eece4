//! Bodies of the cargo-fuzz targets in `fuzz/` (each target is a one-line call here), and
//! the pieces the test suite uses to run them without libFuzzer: a byte-driven generator
//! of valid GGUF files, a seeded PRNG and a mutator (tests/fuzz_smoke.rs).
//!
//! A target body panics only when it finds a bug: a parser that accepted a file must
//! serve every accessor without panicking, and what the writer writes must read back.

use std::collections::BTreeMap;
use std::path::Path;

use crate::gguf::writer::GgufWriter;
use crate::safetensors_file::{write_safetensors, Dtype, SafetensorsFile};
use crate::{GgmlType, GgufFile, GgufValue, GgufValueType};

/// Parses raw bytes as GGUF. On success, exercises every accessor and checks that the
/// writer accepts what the reader accepted and that it reads back the same.
pub fn gguf_parse(data: &[u8]) {
    let Ok(file) = GgufFile::from_bytes("fuzz.gguf", data.to_vec()) else {
        return;
    };
    let _ = file.architecture();
    for (key, value) in &file.metadata {
        let _ = value.to_string();
        let _ = (file.get_u32(key), file.get_u64(key), file.get_usize(key), file.get_f32(key));
        let _ = (file.get_bool(key), file.get_str(key), file.get_str_array(key));
        let _ = (file.get_f32_array(key), file.get_i32_array(key));
    }
    for t in &file.tensors {
        assert_eq!(file.tensor_data(t).len() as u64, t.size_bytes, "tensor '{}'", t.name);
        assert_eq!(t.shape().len(), t.dims.len());
    }
    let rewritten = rewrite(&file).expect("the writer must accept any file the reader accepts");
    let reread = GgufFile::from_bytes("fuzz-rewritten.gguf", rewritten).expect("rewritten file must read back");
    assert_same_contents(&file, &reread);
}

/// Builds a valid GGUF file from `data` as a stream of choices, writes it, reads it back
/// and checks equality; then checks that rewriting the parsed file gives the same bytes.
pub fn gguf_roundtrip(data: &[u8]) {
    let mut choices = Choices::new(data);
    let writer = arbitrary_gguf(&mut choices);
    let bytes = writer.to_bytes().expect("generated files are valid");
    let file = GgufFile::from_bytes("roundtrip.gguf", bytes.clone()).expect("writer output must read back");
    let expected = GgufFile::from_bytes("expected.gguf", bytes.clone()).expect("deterministic");
    assert_same_contents(&expected, &file);
    let rewritten = rewrite(&file).expect("re-writing a parsed file");
    assert!(rewritten == bytes, "write(read(bytes)) differs from bytes");
}

/// Parses raw bytes as a safetensors file and as a sharded-checkpoint index.
pub fn safetensors_parse(data: &[u8]) {
    let _ = crate::safetensors_file::checkpoint_index_for_fuzzing(data);
    let Ok(file) = SafetensorsFile::from_bytes("fuzz.safetensors", data.to_vec()) else {
        return;
    };
    for t in &file.tensors {
        let (s, e) = t.data_offsets;
        assert_eq!(file.tensor_data(t).len(), e - s, "tensor '{}'", t.name);
        if matches!(t.dtype, Dtype::F32 | Dtype::F16 | Dtype::BF16) {
            let values = file.to_f32(&t.name).expect("float tensors convert");
            assert_eq!(values.len(), t.n_elements());
        }
    }
}

/// A writer holding exactly the contents of `file`.
fn rewrite(file: &GgufFile) -> Result<Vec<u8>, crate::FormatError> {
    let mut w = GgufWriter::new();
    for (k, v) in &file.metadata {
        w.add(k.clone(), v.clone());
    }
    for t in &file.tensors {
        w.add_tensor(t.name.clone(), &t.dims, t.ggml_type, file.tensor_data(t).to_vec());
    }
    w.to_bytes()
}

fn assert_same_contents(a: &GgufFile, b: &GgufFile) {
    assert_eq!(a.metadata.len(), b.metadata.len());
    for ((ka, va), (kb, vb)) in a.metadata.iter().zip(&b.metadata) {
        assert_eq!(ka, kb);
        assert!(va.bit_eq(vb), "metadata '{ka}': {va:?} != {vb:?}");
    }
    assert_eq!(a.alignment, b.alignment);
    assert_eq!(a.tensors.len(), b.tensors.len());
    for (ta, tb) in a.tensors.iter().zip(&b.tensors) {
        assert_eq!(
            (&ta.name, &ta.dims, ta.ggml_type, ta.size_bytes),
            (&tb.name, &tb.dims, tb.ggml_type, tb.size_bytes)
        );
        assert!(a.tensor_data(ta) == b.tensor_data(tb), "data of tensor '{}'", ta.name);
    }
}

/// Reads fuzzer input as a stream of choices; yields zeros once exhausted, so every input
/// (including the empty one) describes some valid file.
pub struct Choices<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> Choices<'a> {
    pub fn new(data: &'a [u8]) -> Choices<'a> {
        Choices { data, pos: 0 }
    }

    pub fn byte(&mut self) -> u8 {
        let b = self.data.get(self.pos).copied().unwrap_or(0);
        self.pos = self.pos.saturating_add(1);
        b
    }

    /// A value in `0..n` (`n >= 1`).
    pub fn below(&mut self, n: u32) -> u32 {
        u32::from(self.byte()) % n.max(1)
    }

    pub fn u64(&mut self) -> u64 {
        (0..8).fold(0u64, |acc, _| acc << 8 | u64::from(self.byte()))
    }
}

/// Characters for generated strings: ASCII, quotes, escapes, and 2-, 3- and 4-byte UTF-8.
const ALPHABET: [char; 12] = ['a', 'z', '.', '_', ' ', '"', '\\', '\n', 'é', '中', '🦀', '\u{0}'];

fn arbitrary_string(ch: &mut Choices, max_len: u32) -> String {
    (0..ch.below(max_len + 1)).filter_map(|_| ALPHABET.get(ch.below(ALPHABET.len() as u32) as usize)).collect()
}

fn arbitrary_value(ch: &mut Choices, ty: GgufValueType, depth: usize) -> GgufValue {
    match ty {
        GgufValueType::U8 => GgufValue::U8(ch.byte()),
        GgufValueType::I8 => GgufValue::I8(ch.byte() as i8),
        GgufValueType::U16 => GgufValue::U16(ch.u64() as u16),
        GgufValueType::I16 => GgufValue::I16(ch.u64() as i16),
        GgufValueType::U32 => GgufValue::U32(ch.u64() as u32),
        GgufValueType::I32 => GgufValue::I32(ch.u64() as i32),
        GgufValueType::U64 => GgufValue::U64(ch.u64()),
        GgufValueType::I64 => GgufValue::I64(ch.u64() as i64),
        // From raw bits, so NaN payloads, infinities and -0.0 occur.
        GgufValueType::F32 => GgufValue::F32(f32::from_bits(ch.u64() as u32)),
        GgufValueType::F64 => GgufValue::F64(f64::from_bits(ch.u64())),
        GgufValueType::Bool => GgufValue::Bool(ch.byte() & 1 == 1),
        GgufValueType::String => GgufValue::String(arbitrary_string(ch, 12)),
        GgufValueType::Array => {
            // Nest at most 3 deep to keep inputs small; the depth cap has its own test.
            let mut elem = arbitrary_type(ch);
            if elem == GgufValueType::Array && depth >= 2 {
                elem = GgufValueType::U8;
            }
            let len = ch.below(6);
            let items = (0..len).map(|_| arbitrary_value(ch, elem, depth + 1)).collect();
            GgufValue::Array(elem, items)
        }
    }
}

fn arbitrary_type(ch: &mut Choices) -> GgufValueType {
    let all = GgufValueType::ALL;
    all.get(ch.below(all.len() as u32) as usize).copied().unwrap_or(GgufValueType::U8)
}

/// A writer filled with a valid file described by `ch`: optional alignment, up to 5
/// metadata pairs of any type, up to 3 tensors of any supported type and rank.
pub fn arbitrary_gguf(ch: &mut Choices) -> GgufWriter {
    let mut w = GgufWriter::new();
    if ch.byte() & 1 == 1 {
        w.set_alignment(1 << ch.below(9));
    }
    for i in 0..ch.below(6) {
        let key = format!("k{i}.{}", arbitrary_string(ch, 6));
        let ty = arbitrary_type(ch);
        let value = arbitrary_value(ch, ty, 0);
        w.add(key, value);
    }
    for i in 0..ch.below(4) {
        let ty = GgmlType::ALL.get(ch.below(GgmlType::ALL.len() as u32) as usize).copied().unwrap_or(GgmlType::F32);
        let n_dims = 1 + ch.below(4) as usize;
        let mut dims = vec![ty.block_size() as u64 * u64::from(1 + ch.below(2))];
        dims.extend((1..n_dims).map(|_| u64::from(1 + ch.below(3))));
        let n: u64 = dims.iter().product();
        let size = ty.bytes_for(n).unwrap_or(0);
        let data = (0..size).map(|_| ch.byte()).collect();
        w.add_tensor(format!("t{i}.{}", arbitrary_string(ch, 4)), &dims, ty, data);
    }
    w
}

/// The mutator's generator (one definition for all of loupe, in loupe-core).
pub use loupe_core::SplitMix64;

/// Values that tend to break size arithmetic: zero, one, sign bits, all ones, and the
/// counts and type ids just past each cap.
const INTERESTING: [u64; 14] =
    [0, 1, 5, 13, 31, 65, 0x7f, 0xff, 0xffff_ffff, 1 << 32, 1 << 63, (1 << 63) - 1, u64::MAX, u64::MAX - 7];

/// Applies 1-4 random mutations to `bytes`. Three quarters of the positions fall in the
/// first `hot_len` bytes (the header), where the parser's decisions are made.
pub fn mutate(bytes: &mut Vec<u8>, hot_len: usize, rng: &mut SplitMix64) {
    for _ in 0..1 + rng.below(4) {
        let len = bytes.len();
        let pos = match (len, rng.below(4)) {
            (0, _) => 0,
            (_, 0) => rng.below(len),
            _ => rng.below(hot_len.clamp(1, len)),
        };
        let interesting = INTERESTING.get(rng.below(INTERESTING.len())).copied().unwrap_or(0);
        match rng.below(7) {
            0 => {
                if let Some(b) = bytes.get_mut(pos) {
                    *b ^= 1 << rng.below(8);
                }
            }
            1 => {
                if let Some(b) = bytes.get_mut(pos) {
                    *b = interesting as u8;
                }
            }
            2 | 3 => {
                // Overwrite a u32 or u64 field with an interesting value.
                let width = if rng.below(2) == 0 { 4 } else { 8 };
                let le = interesting.to_le_bytes();
                for (i, v) in le.iter().take(width).enumerate() {
                    if let Some(b) = bytes.get_mut(pos + i) {
                        *b = *v;
                    }
                }
            }
            4 => bytes.truncate(pos),
            5 => {
                let n = 1 + rng.below(16);
                let extra = rng.bytes(n);
                let at = pos.min(bytes.len());
                bytes.splice(at..at, extra);
            }
            _ => {
                let end = pos.saturating_add(1 + rng.below(16)).min(bytes.len());
                if pos < end {
                    bytes.drain(pos..end);
                }
            }
        }
    }
}

/// A small valid safetensors image described by `ch` (F32/F16/BF16/I64/U8 tensors).
pub fn arbitrary_safetensors(ch: &mut Choices) -> Vec<u8> {
    const DTYPES: [Dtype; 5] = [Dtype::F32, Dtype::F16, Dtype::BF16, Dtype::I64, Dtype::U8];
    let mut owned: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = Vec::new();
    for i in 0..ch.below(4) {
        let dtype = DTYPES.get(ch.below(DTYPES.len() as u32) as usize).copied().unwrap_or(Dtype::U8);
        let shape: Vec<usize> = (0..ch.below(3)).map(|_| ch.below(4) as usize).collect();
        let n: usize = shape.iter().product::<usize>() * dtype.bitsize() / 8;
        let data = (0..n).map(|_| ch.byte()).collect();
        owned.push((format!("w{i}.{}", arbitrary_string(ch, 3)), dtype, shape, data));
    }
    let view: Vec<(&str, Dtype, &[usize], &[u8])> =
        owned.iter().map(|(n, d, s, b)| (n.as_str(), *d, s.as_slice(), b.as_slice())).collect();
    let mut meta = BTreeMap::new();
    if ch.byte() & 1 == 1 {
        meta.insert("format".to_string(), arbitrary_string(ch, 4));
    }
    write_safetensors(&view, &meta)
}

/// Where a GGUF image's header ends (its data section offset), for [`mutate`]'s `hot_len`.
pub fn gguf_header_len(bytes: &[u8]) -> usize {
    GgufFile::from_bytes(Path::new("probe"), bytes.to_vec()).map(|f| f.data_offset as usize).unwrap_or(bytes.len())
}
