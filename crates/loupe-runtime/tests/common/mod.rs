//! What the runtime's test binaries share: the tiny random-weight GGUF models on disk.

use std::path::PathBuf;

/// The tiny model of `spec` under the target's temporary folder, named by its bytes' hash
/// (written once, atomically, shared by concurrent test binaries and by the tests of one
/// binary, which run on parallel threads: each writer has a temporary name of its own).
#[allow(dead_code)] // not every test binary that shares this module uses it
pub fn tiny_file(spec: &loupe_models::tiny::TinyLlama) -> PathBuf {
    let bytes = loupe_models::tiny::tiny_llama_gguf_bytes(spec).expect("building the tiny model");
    let hash = bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3));
    let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("loupe-tiny-llama-{hash:016x}.gguf"));
    if std::fs::read(&path).ok().as_deref() != Some(&bytes[..]) {
        std::fs::create_dir_all(env!("CARGO_TARGET_TMPDIR")).unwrap();
        static WRITERS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let writer = WRITERS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tmp = path.with_extension(format!("{}.{writer}.tmp", std::process::id()));
        std::fs::write(&tmp, &bytes).unwrap();
        std::fs::rename(&tmp, &path).unwrap();
    }
    path
}

/// A real model the tests use (fetched by `scripts/test`): `$env_var` when set, else
/// `file` where `scripts/fetch-model fetch_name` puts it; a missing file fails with one line
/// saying how to get it.
#[allow(dead_code)] // not every test binary that shares this module uses it
pub fn real_gguf(env_var: &str, file: &str, fetch_name: &str) -> PathBuf {
    let path = match std::env::var_os(env_var).filter(|p| !p.is_empty()) {
        Some(p) => PathBuf::from(p),
        None => loupe_models::cache_dir().join("models").join(file),
    };
    assert!(
        path.is_file(),
        "needs {file} at {} (missing): run scripts/fetch-model {fetch_name} or set {env_var}",
        path.display()
    );
    path
}

/// The golden files of one model (`tests/golden/<model>/*.json`), parsed, in file-name order.
#[allow(dead_code)] // not every test binary that shares this module uses it
pub fn golden_files(model: &str) -> Vec<serde_json::Value> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/golden").join(model);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    files.iter().map(|f| serde_json::from_slice(&std::fs::read(f).unwrap()).unwrap()).collect()
}

/// A golden's array of token ids (`prompt_tokens`, `tokens`, `eos_token_ids`).
#[allow(dead_code)] // not every test binary that shares this module uses it
pub fn ids(v: &serde_json::Value) -> Vec<u32> {
    v.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()
}
