//! Hand-made valid and corrupt dump files: npy, npz, `.pt` (pickle), `.max`. Each corrupt
//! file must be refused with an error naming the file and the field (docs/parsers-threat-model.md,
//! "How the defences are tested"); hostile pickles must be refused without running anything.

use loupe_formats::dump_fuzzing::tiny_pt;
use loupe_formats::elem::ElemType;
use loupe_formats::max_file::{max_bytes, sanitize_label, MaxFile, MAX_MAGIC};
use loupe_formats::npy::{npy_bytes, npy_bytes_raw, NpyFile};
use loupe_formats::zip_archive::write_zip;
use loupe_formats::{FormatError, NpzFile, PtFile};

fn msg<T: std::fmt::Debug>(r: Result<T, FormatError>, file: &str, needles: &[&str]) -> FormatError {
    let e = match r {
        Ok(v) => panic!("accepted a corrupt {file}: {v:?}"),
        Err(e) => e,
    };
    let m = e.to_string();
    assert!(m.contains(file), "message does not name the file {file}: {m}");
    for n in needles {
        assert!(m.contains(n), "message lacks {n:?}: {m}");
    }
    e
}

fn f32s(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// An npy image with a hand-written header (padded like numpy's) and data.
fn npy_with_header(version: u8, header: &str, data: &[u8]) -> Vec<u8> {
    let len_size = if version == 1 { 2 } else { 4 };
    let mut h = header.to_string();
    while !(8 + len_size + h.len() + 1).is_multiple_of(64) {
        h.push(' ');
    }
    h.push('\n');
    let mut out = b"\x93NUMPY".to_vec();
    out.extend_from_slice(&[version, 0]);
    if version == 1 {
        out.extend_from_slice(&(h.len() as u16).to_le_bytes());
    } else {
        out.extend_from_slice(&(h.len() as u32).to_le_bytes());
    }
    out.extend_from_slice(h.as_bytes());
    out.extend_from_slice(data);
    out
}

// ---------------------------------------------------------------- npy

#[test]
fn npy_layouts_read_correctly() {
    // Fortran order: the 2x3 matrix [[0,1,2],[3,4,5]] is stored column by column.
    let f = npy_with_header(
        1,
        "{'descr': '<f4', 'fortran_order': True, 'shape': (2, 3), }",
        &f32s(&[0., 3., 1., 4., 2., 5.]),
    );
    let t = NpyFile::from_bytes("f.npy", f).and_then(|f| f.tensor()).expect("fortran");
    assert_eq!(t.to_f32().ok(), Some(vec![0., 1., 2., 3., 4., 5.]));
    // Big-endian f8 in a version 3 header.
    let be: Vec<u8> = [1.5f64, -2.0].iter().flat_map(|v| v.to_be_bytes()).collect();
    let t = NpyFile::from_bytes(
        "b.npy",
        npy_with_header(3, "{'descr': '>f8', 'fortran_order': False, 'shape': (2,), }", &be),
    )
    .and_then(|f| f.tensor())
    .expect("big-endian");
    assert_eq!(t.to_f32().ok(), Some(vec![1.5, -2.0]));
    // Version 2 header, integer and bool types, scalar shape.
    for (descr, data, want) in [
        ("<i8", (-3i64).to_le_bytes().to_vec(), -3.0f32),
        ("|u1", vec![200], 200.0),
        ("|b1", vec![1], 1.0),
        ("<f2", half::f16::from_f32(0.5).to_le_bytes().to_vec(), 0.5),
        ("<i2", (-7i16).to_le_bytes().to_vec(), -7.0),
    ] {
        let h = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': (), }}");
        let t = NpyFile::from_bytes("s.npy", npy_with_header(2, &h, &data)).and_then(|f| f.tensor()).expect(descr);
        assert_eq!(t.to_f32().ok(), Some(vec![want]), "{descr}");
    }
    // bf16 bits stored as V2 (ml_dtypes) or <u2, read when the caller says bf16.
    let bits = half::bf16::from_f32(-1.25).to_le_bytes();
    for descr in ["<V2", "<u2"] {
        let f = NpyFile::from_bytes("h.npy", npy_bytes_raw(descr, &[1], &bits)).expect(descr);
        assert_eq!(f.tensor_as(ElemType::BF16).and_then(|t| t.to_f32()).ok(), Some(vec![-1.25]));
    }
    let opaque = NpyFile::from_bytes("v.npy", npy_bytes_raw("<V2", &[1], &bits)).expect("V2");
    msg(opaque.tensor(), "v.npy", &["V2", "bf16"]);
}

#[test]
fn npy_bad_magic_and_version() {
    msg(NpyFile::from_bytes("m.npy", b"\x93NUMPZ\x01\x00".to_vec()), "m.npy", &["not a npy file"]);
    let mut v = npy_bytes(&[1], &[1.0]);
    v[6] = 4;
    msg(NpyFile::from_bytes("v.npy", v), "v.npy", &["version 4.0"]);
    msg(NpyFile::from_bytes("e.npy", Vec::new()), "e.npy", &["truncated", "magic"]);
}

#[test]
fn npy_header_lengths_are_capped_and_checked_against_the_file() {
    let mut v = b"\x93NUMPY\x02\x00".to_vec();
    v.extend_from_slice(&u32::MAX.to_le_bytes());
    let e = msg(NpyFile::from_bytes("h.npy", v), "h.npy", &["header length", "over the limit"]);
    assert!(matches!(e, FormatError::TooLarge { .. }));
    let mut v = b"\x93NUMPY\x01\x00".to_vec();
    v.extend_from_slice(&1000u16.to_le_bytes());
    v.extend_from_slice(b"{'descr'");
    msg(NpyFile::from_bytes("t.npy", v), "t.npy", &["truncated", "1000 bytes declared"]);
}

#[test]
fn npy_truncated_or_padded_data() {
    let mut v = npy_bytes(&[10], &[0.0; 10]);
    v.truncate(v.len() - 4);
    msg(NpyFile::from_bytes("t.npy", v), "t.npy", &["npy data", "need 40 bytes", "holds 36"]);
    let mut v = npy_bytes(&[2], &[0.0; 2]);
    v.push(0);
    msg(NpyFile::from_bytes("p.npy", v), "p.npy", &["need 8 bytes", "holds 9"]);
}

#[test]
fn npy_absurd_shapes() {
    let h = "{'descr': '<f4', 'fortran_order': False, 'shape': (1099511627776, 1099511627776), }";
    msg(NpyFile::from_bytes("a.npy", npy_with_header(1, h, &[])), "a.npy", &["shape"]);
    let h = "{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4), }";
    let e =
        msg(NpyFile::from_bytes("b.npy", npy_with_header(1, h, &[])), "b.npy", &["element count", "over the limit"]);
    assert!(matches!(e, FormatError::TooLarge { .. }));
    let dims = vec!["1"; 65].join(", ");
    let h = format!("{{'descr': '<f4', 'fortran_order': False, 'shape': ({dims}), }}");
    msg(NpyFile::from_bytes("r.npy", npy_with_header(1, &h, &[0; 4])), "r.npy", &["more than 64 dimensions"]);
    let h = "{'descr': '<f4', 'fortran_order': False, 'shape': (-1,), }";
    msg(NpyFile::from_bytes("n.npy", npy_with_header(1, h, &[0; 4])), "n.npy", &["bad dimension"]);
    // A zero dimension is a valid empty array.
    let h = "{'descr': '<f4', 'fortran_order': False, 'shape': (0, 5), }";
    let t = NpyFile::from_bytes("z.npy", npy_with_header(1, h, &[])).and_then(|f| f.tensor()).expect("empty");
    assert_eq!(t.to_f32().ok(), Some(vec![]));
}

#[test]
fn npy_unsupported_or_malformed_headers() {
    for (descr, needle) in [("<c8", "npy dtype '<c8'"), ("|O", "npy dtype '|O'"), ("<M8", "npy dtype")] {
        let h = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': (1,), }}");
        msg(NpyFile::from_bytes("d.npy", npy_with_header(1, &h, &[0; 8])), "d.npy", &[needle]);
    }
    // Structured dtypes are lists, which the literal parser refuses.
    let h = "{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (1,), }";
    msg(NpyFile::from_bytes("s.npy", npy_with_header(1, h, &[0; 4])), "s.npy", &["npy header", "quoted string"]);
    let h = "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), 'descr': '<f4', }";
    msg(NpyFile::from_bytes("k.npy", npy_with_header(1, h, &[0; 4])), "k.npy", &["duplicate key 'descr'"]);
    let h = "{'descr': '<f4', 'shape': (1,), }";
    msg(NpyFile::from_bytes("m.npy", npy_with_header(1, h, &[0; 4])), "m.npy", &["missing"]);
    let mut v = npy_with_header(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }", &[0; 4]);
    v[20] = 0xff; // a non-ASCII byte in a version 1 header
    msg(NpyFile::from_bytes("u.npy", v), "u.npy", &["ASCII"]);
}

// ---------------------------------------------------------------- npz

#[test]
fn npz_stored_and_deflated_members() {
    let a = npy_bytes(&[2], &[1.0, 2.0]);
    let b = npy_bytes(&[1, 3], &[3.0, 4.0, 5.0]);
    let z = write_zip(&[("a.npy", &a, false), ("b.npy", &b, true)]).expect("zip");
    let f = NpzFile::from_bytes("x.npz", z).expect("valid npz");
    let names: Vec<&str> = f.arrays.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["a", "b"]);
    assert_eq!(f.array("b").and_then(|a| a.tensor().ok()).and_then(|t| t.to_f32().ok()), Some(vec![3.0, 4.0, 5.0]));
    assert_eq!(f.array("a").and_then(|a| a.tensor().ok()).and_then(|t| t.to_f32().ok()), Some(vec![1.0, 2.0]));
}

#[test]
fn npz_corrupt_archives() {
    let a = npy_bytes(&[2], &[1.0, 2.0]);
    let z = write_zip(&[("a.txt", b"hello", false)]).expect("zip");
    msg(NpzFile::from_bytes("n.npz", z), "n.npz", &["npz member 'a.txt'"]);
    let z = write_zip(&[("a.npy", &a, true)]).expect("zip");
    msg(NpzFile::from_bytes("t.npz", z[..z.len() / 2].to_vec()), "t.npz", &["zip archive"]);
    // A member whose central-directory size understates what it inflates to (a zip bomb
    // pattern): refused, never inflated past the declared size.
    let mut z = write_zip(&[("a.npy", &a, true)]).expect("zip");
    let cd = z.windows(4).position(|w| w == b"PK\x01\x02").expect("central directory");
    z[cd + 24..cd + 28].copy_from_slice(&10u32.to_le_bytes());
    msg(NpzFile::from_bytes("b.npz", z), "b.npz", &["a.npy"]);
    // An npy member with a corrupt header names the member.
    let mut bad = a.clone();
    bad[6] = 9;
    let z = write_zip(&[("c.npy", &bad, false)]).expect("zip");
    msg(NpzFile::from_bytes("c.npz", z), "c.npz:c.npy", &["version 9.0"]);
}

// ---------------------------------------------------------------- .pt / pickle

/// A `.pt` archive around a hand-written pickle and one f32 storage `0` of `n` elements.
fn pt_with(pickle: &[u8], n: usize) -> Vec<u8> {
    let data = f32s(&(0..n).map(|i| i as f32).collect::<Vec<_>>());
    write_zip(&[("x/data.pkl", pickle, false), ("x/byteorder", b"little", false), ("x/data/0", &data, false)])
        .expect("zip")
}

/// The pickle prefix of `_rebuild_tensor_v2(storage('0', numel), ...)` up to the size.
fn rebuild_prefix(key: &str, numel: u8) -> Vec<u8> {
    let mut p = vec![0x80, 2];
    p.extend_from_slice(b"ctorch._utils\n_rebuild_tensor_v2\n((X\x07\x00\x00\x00storagectorch\nFloatStorage\n");
    p.push(b'X');
    p.extend_from_slice(&(key.len() as u32).to_le_bytes());
    p.extend_from_slice(key.as_bytes());
    p.extend_from_slice(b"X\x03\x00\x00\x00cpuK");
    p.push(numel);
    p.extend_from_slice(b"tQK\x00");
    p
}

fn rebuild(key: &str, numel: u8, size: u8) -> Vec<u8> {
    let mut p = rebuild_prefix(key, numel);
    p.extend_from_slice(&[b'K', size, 0x85, b'K', 1, 0x85, 0x89]);
    p.extend_from_slice(b"ccollections\nOrderedDict\n)RtR.");
    p
}

#[test]
fn pt_hand_built_tensor_reads() {
    let f = PtFile::from_bytes("t.pt", tiny_pt()).expect("valid");
    assert_eq!(f.prefix, "t");
    assert_eq!(f.tensors.len(), 1);
    assert_eq!(f.tensors[0].0, "");
    assert_eq!(f.tensors[0].1.to_f32().ok(), Some(vec![1.0, 2.0]));
    let f = PtFile::from_bytes("r.pt", pt_with(&rebuild("0", 3, 3), 3)).expect("valid");
    assert_eq!(f.tensors[0].1.to_f32().ok(), Some(vec![0.0, 1.0, 2.0]));
}

#[test]
fn pt_hostile_globals_are_refused_not_run() {
    // cos\nsystem\n(S'touch pwned'\ntR. : the classic code-execution pickle, in protocol 2.
    let mut p = vec![0x80, 2];
    p.extend_from_slice(b"cos\nsystem\nX\x0b\x00\x00\x00touch pwned\x85R.");
    let e = msg(
        PtFile::from_bytes("evil.pt", pt_with(&p, 1)),
        "evil.pt",
        &["global 'os.system'", "allow-list", "never executed"],
    );
    assert!(matches!(e, FormatError::Invalid { .. }));
    assert!(!std::path::Path::new("pwned").exists());
    // STACK_GLOBAL (protocol 4) with builtins.eval.
    let mut p = vec![0x80, 4];
    p.extend_from_slice(b"\x8c\x08builtins\x8c\x04eval\x93\x8c\x041+1\x85R.");
    msg(PtFile::from_bytes("eval.pt", pt_with(&p, 1)), "eval.pt", &["global 'builtins.eval'"]);
    // A lookalike of an allowed module.
    let mut p = vec![0x80, 2];
    p.extend_from_slice(b"ctorch._utils\n_rebuild_tensor\n.");
    msg(PtFile::from_bytes("l.pt", pt_with(&p, 1)), "l.pt", &["torch._utils._rebuild_tensor'"]);
    // REDUCE of a dtype global (allowed to name, not to call).
    let mut p = vec![0x80, 2];
    p.extend_from_slice(b"ctorch\nfloat32\n)R.");
    msg(PtFile::from_bytes("d.pt", pt_with(&p, 1)), "d.pt", &["REDUCE of Dtype"]);
}

#[test]
fn pt_refused_opcodes_are_named() {
    for (op, name) in [
        (b'b', "BUILD"),
        (b'i', "INST"),
        (0x81, "NEWOBJ"),
        (b'o', "OBJ"),
        (b'P', "PERSID"),
        (0x82, "EXT1"),
        (b'0', "POP"),
    ] {
        let p = vec![0x80, 2, b'N', op, b'.'];
        msg(PtFile::from_bytes("o.pt", pt_with(&p, 1)), "o.pt", &[&format!("opcode {name}"), "not allowed"]);
    }
    msg(PtFile::from_bytes("p.pt", pt_with(&[0x80, 6, b'N', b'.'], 1)), "p.pt", &["protocol 6"]);
}

#[test]
fn pt_malformed_pickles() {
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (vec![0x80, 2, b'R', b'.'], "stack underflow"),
        (vec![0x80, 2, b'h', 7, b'.'], "memo key 7 was never stored"),
        (vec![0x80, 2, 0x8a, 9, 0, 0, 0, 0, 0, 0, 0, 0, 0, b'.'], "LONG1 of 9 bytes"),
        (vec![0x80, 2, b'X', 0xff, 0xff, 0xff, 0x7f], "truncated"),
        (vec![0x80, 2, b'N'], "truncated"),
        (vec![0x80, 2, b'(', b'N', b'.'], "STOP inside an open MARK"),
        (vec![0x80, 2, b'N', b'N', b'u', b'.'], "no MARK"),
        (vec![0x80, 2, b'N', b'N', b'N', b's', b'.'], "SETITEM on a non-dict"),
        // A list that contains itself: EMPTY_LIST, BINPUT 0, BINGET 0, APPEND, STOP.
        (vec![0x80, 2, b']', b'q', 0, b'h', 0, b'a', b'.'], "contains itself"),
    ];
    for (p, needle) in cases {
        msg(PtFile::from_bytes("m.pt", pt_with(&p, 1)), "m.pt", &[needle]);
    }
    let mut deep = vec![0x80, 2];
    deep.extend(std::iter::repeat_n(b'(', 5000));
    msg(PtFile::from_bytes("deep.pt", pt_with(&deep, 1)), "deep.pt", &["nested deeper"]);
    let mut nested = vec![0x80, 2];
    nested.extend(std::iter::repeat_n(b']', 100));
    nested.extend(std::iter::repeat_n(b'a', 99));
    nested.push(b'.');
    msg(PtFile::from_bytes("n.pt", pt_with(&nested, 1)), "n.pt", &["nested deeper than 64"]);
}

#[test]
fn pt_storage_references_are_checked() {
    // A view larger than its storage.
    msg(PtFile::from_bytes("v.pt", pt_with(&rebuild("0", 2, 5), 2)), "v.pt", &["reaches element 4", "storage holds 2"]);
    // A storage key that tries to leave data/.
    msg(PtFile::from_bytes("k.pt", pt_with(&rebuild("../x", 1, 1), 1)), "k.pt", &["storage key '../x'"]);
    // A storage the archive does not have.
    msg(PtFile::from_bytes("s.pt", pt_with(&rebuild("7", 1, 1), 1)), "s.pt", &["no storage named 'x/data/7"]);
    // Legacy format and non-zip bytes.
    msg(PtFile::from_bytes("old.pt", vec![0x80, 2, 0x8a, 0x0a]), "old.pt", &["legacy"]);
    msg(PtFile::from_bytes("j.pt", b"junk".to_vec()), "j.pt", &["not a torch zip"]);
    let z = write_zip(&[("x/other", b"1", false)]).expect("zip");
    msg(PtFile::from_bytes("z.pt", z), "z.pt", &["data.pkl"]);
    let z = write_zip(&[
        ("x/data.pkl", &rebuild("0", 1, 1), false),
        ("x/byteorder", b"middle", false),
        ("x/data/0", &[0; 4], false),
    ])
    .expect("zip");
    msg(PtFile::from_bytes("b.pt", z), "b.pt", &["byteorder", "middle"]);
}

// ---------------------------------------------------------------- .max

/// A `.max` file built field by field from docs/dump-format.md ("The `.max` file"), not by our writer.
fn hand_built_max() -> Vec<u8> {
    let key = b"model.layers.0-output";
    let mut v = vec![0x93, 0xF0, 0x9F, 0x94, 0xA5, 0x2B, 0x2B, 0x93]; // magic
    v.extend_from_slice(&0u32.to_le_bytes()); // major
    v.extend_from_slice(&1u32.to_le_bytes()); // minor
    let meta = 4 + key.len() as u64 + 2 + 4 * 2 + 8;
    v.extend_from_slice(&meta.to_le_bytes()); // metadata_size
    v.extend_from_slice(&(key.len() as u32).to_le_bytes()); // keylen
    v.extend_from_slice(key);
    v.push(81); // f32
    v.push(2); // rank
    v.extend_from_slice(&2u32.to_le_bytes());
    v.extend_from_slice(&3u32.to_le_bytes());
    v.extend_from_slice(&(24 + meta).to_le_bytes()); // data offset
    v.extend_from_slice(&f32s(&[1., 2., 3., 4., 5., 6.]));
    v
}

#[test]
fn max_reads_the_spec_layout_and_writes_it_byte_for_byte() {
    let bytes = hand_built_max();
    let f = MaxFile::from_bytes("h.max", bytes.clone()).expect("valid");
    assert_eq!(f.key, "model.layers.0-output");
    assert_eq!(f.version, (0, 1));
    assert_eq!(f.tensor.shape, [2, 3]);
    assert_eq!(f.tensor.dtype, ElemType::F32);
    assert_eq!(f.tensor.to_f32().ok(), Some(vec![1., 2., 3., 4., 5., 6.]));
    let written =
        max_bytes("model.layers.0-output", ElemType::F32, &[2, 3], &f32s(&[1., 2., 3., 4., 5., 6.])).expect("write");
    assert_eq!(written, bytes);
    assert_eq!(&written[..8], &MAX_MAGIC);
    // bf16 and a rank-0 tensor round-trip too.
    let b = half::bf16::from_f32(3.5).to_le_bytes();
    let w = max_bytes("s", ElemType::BF16, &[], &b).expect("write");
    let f = MaxFile::from_bytes("s.max", w).expect("read");
    assert_eq!(f.tensor.to_f32().ok(), Some(vec![3.5]));
    assert_eq!(sanitize_label("a/b c:d?e\"f<g>h|i\\j"), "a_b_c_d_e_f_g_h_i_j");
}

#[test]
fn max_corrupt_files() {
    let good = hand_built_max();
    let patch = |at: usize, bytes: &[u8]| {
        let mut v = good.clone();
        v[at..at + bytes.len()].copy_from_slice(bytes);
        v
    };
    msg(MaxFile::from_bytes("m.max", patch(0, &[0])), "m.max", &["not a MAX .max file"]);
    msg(MaxFile::from_bytes("v.max", patch(8, &1u32.to_le_bytes())), "v.max", &["version 1.1"]);
    msg(MaxFile::from_bytes("s.max", patch(16, &99u64.to_le_bytes())), "s.max", &["metadata size", "99"]);
    msg(MaxFile::from_bytes("k.max", patch(24, &u32::MAX.to_le_bytes())), "k.max", &["key length", "over the limit"]);
    msg(MaxFile::from_bytes("k2.max", patch(24, &60000u32.to_le_bytes())), "k2.max", &["truncated", "key"]);
    let dt = 28 + 21;
    msg(MaxFile::from_bytes("d.max", patch(dt, &[3])), "d.max", &["unknown dtype code 3"]);
    msg(MaxFile::from_bytes("f4.max", patch(dt, &[64])), "f4.max", &["f4_e2m1fn"]);
    msg(MaxFile::from_bytes("r.max", patch(dt + 1, &[200])), "r.max", &["rank", "over the limit"]);
    let off = dt + 2 + 8;
    msg(MaxFile::from_bytes("o.max", patch(off, &7u64.to_le_bytes())), "o.max", &["data offset"]);
    let mut t = good.clone();
    t.truncate(t.len() - 1);
    msg(MaxFile::from_bytes("t.max", t), "t.max", &["need 24 bytes", "holds 23"]);
    let mut t = good.clone();
    t.push(0);
    msg(MaxFile::from_bytes("p.max", t), "p.max", &["holds 25"]);
    msg(MaxFile::from_bytes("e.max", good[..30].to_vec()), "e.max", &["truncated"]);
    let big = patch(dt + 2, &u32::MAX.to_le_bytes());
    msg(MaxFile::from_bytes("b.max", big), "b.max", &["element count"]);
}
