//! Fuzz bodies of the dump-format readers (npy, npz, `.pt`, `.max`), run over mutated
//! inputs by `tests/fuzz_dump_formats.rs` and callable from cargo-fuzz targets. A body
//! panics only on a bug: a reader that accepted a file must convert every tensor it
//! listed (or refuse cleanly), and the writers' output must read back.

use crate::elem::ElemType;
use crate::max_file::{max_bytes, MaxFile};
use crate::npy::{npy_bytes, NpyFile};
use crate::npz::NpzFile;
use crate::pt::PtFile;
use crate::zip_archive::write_zip;

/// Tensors larger than this are not converted by the fuzz bodies (time, not safety).
const CONVERT_LIMIT: usize = 1 << 16;

fn convert(t: &crate::StoredTensor) {
    if t.n_elements() <= CONVERT_LIMIT {
        let v = t.to_f32().expect("a validated tensor converts");
        assert_eq!(v.len(), t.n_elements());
    }
}

/// Parses bytes as `.npy`.
pub fn npy_parse(data: &[u8]) {
    if let Ok(f) = NpyFile::from_bytes("fuzz.npy", data.to_vec()) {
        match f.tensor() {
            Ok(t) => convert(&t),
            Err(_) => assert!(f.dtype.is_none(), "a typed npy must yield a tensor"),
        }
        if let Ok(t) = f.tensor_as(ElemType::BF16) {
            convert(&t);
        }
    }
}

/// Parses bytes as `.npz`.
pub fn npz_parse(data: &[u8]) {
    if let Ok(f) = NpzFile::from_bytes("fuzz.npz", data.to_vec()) {
        for (_, a) in &f.arrays {
            if let Ok(t) = a.tensor() {
                convert(&t);
            }
        }
    }
}

/// Parses bytes as a `torch.save` file.
pub fn pt_parse(data: &[u8]) {
    if let Ok(f) = PtFile::from_bytes("fuzz.pt", data.to_vec()) {
        for (_, t) in &f.tensors {
            convert(t);
        }
    }
}

/// Parses bytes as a `.max` file; an accepted file must re-write to the same bytes.
pub fn max_parse(data: &[u8]) {
    if let Ok(f) = MaxFile::from_bytes("fuzz.max", data.to_vec()) {
        convert(&f.tensor);
        let raw = f.tensor.raw_bytes().expect("max tensors are contiguous");
        let mut again = max_bytes(&f.key, f.tensor.dtype, &f.tensor.shape, raw).expect("re-write");
        // The writer always writes minor version 1; readers accept any minor of major 0.
        again[12..16].copy_from_slice(&f.version.1.to_le_bytes());
        assert!(again == data, "write(read(bytes)) != bytes");
    }
}

/// Seeds for the mutators: one valid file per format.
pub fn seed_files() -> Vec<(&'static str, Vec<u8>)> {
    let npy = npy_bytes(&[2, 3], &[1.0, -2.0, 3.5, 0.0, 5.0, 6.0]);
    let npz = write_zip(&[("a.npy", &npy, false), ("b.npy", &npy, true)]).unwrap_or_default();
    let raw: Vec<u8> = [1.0f32, 2.0].iter().flat_map(|v| v.to_le_bytes()).collect();
    let max = max_bytes("x-output", ElemType::F32, &[2], &raw).unwrap_or_default();
    vec![("npy", npy), ("npz", npz), ("pt", tiny_pt()), ("max", max)]
}

/// A `.pt` image equivalent to `torch.save(torch.tensor([1., 2.]), "t.pt")`, assembled by
/// hand from the opcodes `pickletools.dis` shows for that file.
pub fn tiny_pt() -> Vec<u8> {
    let mut p = vec![0x80, 2];
    p.extend_from_slice(b"ctorch._utils\n_rebuild_tensor_v2\n(");
    p.extend_from_slice(b"(X\x07\x00\x00\x00storage");
    p.extend_from_slice(b"ctorch\nFloatStorage\n");
    p.extend_from_slice(b"X\x01\x00\x00\x000X\x03\x00\x00\x00cpuK\x02tQ");
    p.extend_from_slice(b"K\x00K\x02\x85K\x01\x85\x89ccollections\nOrderedDict\n)RtR.");
    let data: Vec<u8> = [1.0f32, 2.0].iter().flat_map(|v| v.to_le_bytes()).collect();
    write_zip(&[("t/data.pkl", &p, false), ("t/byteorder", b"little", false), ("t/data/0", &data, false)])
        .unwrap_or_default()
}
