use loupe_core::SplitMix64;
use loupe_graph::{KvDtype, PagedKvCache};

use super::format::{begin, finish};
use super::*;

fn identity(dtype: KvDtype) -> CacheIdentity {
    CacheIdentity { fingerprint: 0x1234_5678_9abc_def0, salt: 42, layers: 3, width: 64, block_size: 4, dtype }
}

const TOKENS: [u32; 4] = [7, 8, 9, 10];

fn key() -> BlockKey<'static> {
    BlockKey { key: 0xfeed, parent: 0xbeef, prompt_positions: 3, tokens: &TOKENS }
}

/// A cache of `id`'s geometry with 4 blocks of seeded rows.
fn cache(id: &CacheIdentity, seed: u64) -> PagedKvCache {
    let (layers, width, bs) = (id.layers as usize, id.width as usize, id.block_size as usize);
    let mut kv = PagedKvCache::new(layers, width, bs, 4, id.dtype);
    let mut rng = SplitMix64::new(seed);
    for layer in 0..layers {
        let k: Vec<f32> = (0..4 * bs * width).map(|_| (rng.next_u64() % 2000) as f32 / 100.0 - 10.0).collect();
        let v: Vec<f32> = k.iter().map(|x| x * 0.5 + 1.0).collect();
        kv.write(layer, &[0, 1, 2, 3], 0, &k, &v).unwrap();
    }
    kv
}

fn file(id: &CacheIdentity, kv: &PagedKvCache, block: u32, key: &BlockKey<'_>) -> Vec<u8> {
    let mut out = Vec::new();
    begin(&mut out, id, key);
    kv.read_block(block, &mut out).unwrap();
    finish(&mut out);
    out
}

#[test]
fn a_file_round_trips_in_every_dtype() {
    for dtype in [KvDtype::F16, KvDtype::F32, KvDtype::Fp8E4M3] {
        let id = identity(dtype);
        let kv = cache(&id, 1);
        let bytes = file(&id, &kv, 2, &key());
        assert_eq!(bytes.len() as u64, id.file_bytes());
        assert_eq!(bytes[..8], MAGIC);
        let parsed = BlockFile::parse(&bytes).unwrap();
        assert_eq!(parsed.identity, id);
        assert_eq!((parsed.key, parsed.parent, parsed.prompt_positions), (0xfeed, 0xbeef, 3));
        assert_eq!(parsed.tokens, TOKENS);
        parsed.check(&id, &key()).unwrap();
        let mut want = Vec::new();
        kv.read_block(2, &mut want).unwrap();
        assert_eq!(parsed.payload, &want[..], "{dtype}");
        fuzz_block_file(&bytes);
    }
}

/// `bytes` with `f` applied and the checksum made right again, so the check under test is
/// the one that refuses it.
fn resealed(bytes: &[u8], f: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
    let mut b = bytes[..bytes.len() - 4].to_vec();
    f(&mut b);
    finish(&mut b);
    b
}

#[test]
fn every_corruption_is_refused_with_its_reason() {
    let id = identity(KvDtype::F16);
    let good = file(&id, &cache(&id, 2), 1, &key());
    let parse = |b: &[u8]| BlockFile::parse(b).unwrap_err();
    // Truncated anywhere, or extended.
    for len in [0, 10, HEADER_LEN, HEADER_LEN + 3, good.len() / 2, good.len() - 1] {
        let e = parse(&good[..len]);
        assert!(matches!(e, BlockFileError::Truncated { .. } | BlockFileError::Length { .. }), "{len}: {e}");
    }
    let mut long = good.clone();
    long.push(0);
    assert!(matches!(parse(&long), BlockFileError::Length { .. }));
    // Any flipped bit is caught by the checksum (header, tokens, payload, the sum itself).
    for at in [20, HEADER_LEN + 1, HEADER_LEN + 40, good.len() - 100, good.len() - 1] {
        let mut bad = good.clone();
        bad[at] ^= 0x10;
        assert!(matches!(parse(&bad), BlockFileError::Checksum { .. }), "byte {at}");
    }
    // Structural fields, checksum made right.
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (resealed(&good, |b| b[0] = b'X'), "magic"),
        (resealed(&good, |b| b[8] = 2), "version"),
        (resealed(&good, |b| b[12] = 9), "dtype"),
        (resealed(&good, |b| b[13] = 1), "reserved"),
        (resealed(&good, |b| b[32..36].copy_from_slice(&0u32.to_le_bytes())), "zero layers"),
        (resealed(&good, |b| b[32..36].copy_from_slice(&u32::MAX.to_le_bytes())), "huge layers"),
        (resealed(&good, |b| b[36..40].copy_from_slice(&(1u32 << 30).to_le_bytes())), "huge width"),
        (resealed(&good, |b| b[40..44].copy_from_slice(&u32::MAX.to_le_bytes())), "huge block"),
        (resealed(&good, |b| b[44..48].copy_from_slice(&5u32.to_le_bytes())), "prompt positions past the block"),
        (resealed(&good, |b| b[64..72].copy_from_slice(&1u64.to_le_bytes())), "payload length"),
        (resealed(&good, |b| b[64..72].copy_from_slice(&u64::MAX.to_le_bytes())), "huge payload"),
        (resealed(&good, |b| b[32..36].copy_from_slice(&4u32.to_le_bytes())), "layers without their rows"),
    ];
    for (bad, what) in cases {
        let e = parse(&bad);
        assert!(!matches!(e, BlockFileError::Checksum { .. }), "{what}: refused by its field, not the sum: {e}");
        fuzz_block_file(&bad);
    }
}

#[test]
fn another_model_dtype_geometry_or_block_is_refused() {
    let id = identity(KvDtype::F16);
    let good = file(&id, &cache(&id, 3), 0, &key());
    let parsed = BlockFile::parse(&good).unwrap();
    let others = [
        CacheIdentity { fingerprint: 1, ..id },
        CacheIdentity { salt: 43, ..id },
        CacheIdentity { layers: 4, ..id },
        CacheIdentity { width: 32, ..id },
        CacheIdentity { block_size: 8, ..id },
        CacheIdentity { dtype: KvDtype::F32, ..id },
    ];
    for other in others {
        assert!(matches!(parsed.check(&other, &key()), Err(BlockFileError::Mismatch { .. })), "{other:?}");
    }
    let tokens = [7, 8, 9, 11];
    for want in [
        BlockKey { key: 1, ..key() },
        BlockKey { parent: 1, ..key() },
        BlockKey { prompt_positions: 4, ..key() },
        BlockKey { tokens: &tokens, ..key() },
    ] {
        assert!(matches!(parsed.check(&id, &want), Err(BlockFileError::Contents(_))), "{want:?}");
    }
}

#[test]
fn seeded_random_and_mutated_files_never_panic_the_parser() {
    let id = identity(KvDtype::Fp8E4M3);
    let good = file(&id, &cache(&id, 4), 3, &key());
    let mut rng = SplitMix64::new(9);
    for i in 0..3000 {
        let mut b =
            if i % 3 == 0 { (0..rng.next_u64() % 300).map(|_| rng.next_u64() as u8).collect() } else { good.clone() };
        for _ in 0..1 + rng.next_u64() % 4 {
            if b.is_empty() {
                break;
            }
            let at = (rng.next_u64() % b.len() as u64) as usize;
            match rng.next_u64() % 3 {
                0 => b[at] = rng.next_u64() as u8,
                1 => b.truncate(at),
                _ => b.insert(at, rng.next_u64() as u8),
            }
        }
        if i % 2 == 0 && b.len() > 4 {
            b = resealed(&b, |_| {});
        }
        fuzz_block_file(&b);
    }
}

fn tier(dir: &std::path::Path, id: CacheIdentity, max_bytes: u64) -> DiskTier {
    DiskTier::open(&DiskCacheConfig { dir: dir.to_path_buf(), max_bytes }, id).unwrap()
}

/// Waits for the writer: a restore of a pending key waits for it.
fn flush(t: &mut DiskTier) {
    t.flush();
}

#[test]
fn spilled_blocks_restore_and_bad_files_are_deleted_and_counted() {
    let dir = tempfile::tempdir().unwrap();
    let id = identity(KvDtype::F16);
    let mut kv = cache(&id, 5);
    let mut t = tier(dir.path(), id, 1 << 20);
    t.spill(&kv, 1, &key());
    flush(&mut t);
    assert_eq!(t.stats().written_blocks, 1);
    let path = dir.path().join(format!("{:016x}.kvb", 0xfeed));
    assert_eq!(std::fs::metadata(&path).unwrap().len(), id.file_bytes());
    // Restored into another block: the same bytes.
    assert!(t.restore(&mut kv, 3, &key()));
    let (mut a, mut b) = (Vec::new(), Vec::new());
    kv.read_block(1, &mut a).unwrap();
    kv.read_block(3, &mut b).unwrap();
    assert_eq!(a, b);
    assert_eq!(t.stats().restored_blocks, 1);
    // Another sequence's tokens under the same key (a collision): refused, deleted.
    let other = [1, 2, 3, 4];
    assert!(!t.restore(&mut kv, 2, &BlockKey { tokens: &other, ..key() }));
    assert_eq!(t.stats().invalid_files, 1);
    flush(&mut t);
    drop(t);
    assert!(!path.exists(), "a refused file is deleted");
    // A file corrupted on disk, and a truncated one, found at the next start.
    let mut t = tier(dir.path(), id, 1 << 20);
    t.spill(&kv, 1, &key());
    let k2 = BlockKey { key: 0xabc, ..key() };
    t.spill(&kv, 2, &k2);
    flush(&mut t);
    drop(t);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[HEADER_LEN + 100] ^= 1;
    std::fs::write(&path, &bytes).unwrap();
    let p2 = dir.path().join(format!("{:016x}.kvb", 0xabc));
    let half = std::fs::read(&p2).unwrap();
    std::fs::write(&p2, &half[..half.len() / 2]).unwrap();
    std::fs::write(dir.path().join("notes.txt"), b"not ours").unwrap();
    let mut t = tier(dir.path(), id, 1 << 20);
    assert_eq!(t.stats().files, 2);
    assert!(!t.restore(&mut kv, 3, &key()));
    assert!(!t.restore(&mut kv, 3, &k2));
    assert_eq!(t.stats().invalid_files, 2);
    assert_eq!(t.stats().files, 0);
    flush(&mut t);
    drop(t);
    assert!(!path.exists() && !p2.exists());
    assert!(dir.path().join("notes.txt").exists(), "files that are not block files are left alone");
}

#[test]
fn another_models_file_under_the_same_key_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let id = identity(KvDtype::F16);
    let mut kv = cache(&id, 6);
    let mut t = tier(dir.path(), CacheIdentity { fingerprint: 99, ..id }, 1 << 20);
    t.spill(&kv, 0, &key());
    flush(&mut t);
    drop(t);
    let mut t = tier(dir.path(), id, 1 << 20);
    assert!(!t.restore(&mut kv, 1, &key()));
    assert_eq!(t.stats().invalid_files, 1);
}

#[test]
fn the_size_cap_deletes_the_least_recently_used_files() {
    let dir = tempfile::tempdir().unwrap();
    let id = identity(KvDtype::F16);
    let mut kv = cache(&id, 7);
    let mut t = tier(dir.path(), id, 3 * id.file_bytes());
    let keys: Vec<u64> = (1..=4).collect();
    for &k in &keys[..3] {
        t.spill(&kv, 0, &BlockKey { key: k, ..key() });
        flush(&mut t);
    }
    // Key 1 is used again, so key 2 is the oldest when key 4 comes.
    assert!(t.restore(&mut kv, 1, &BlockKey { key: 1, ..key() }));
    t.spill(&kv, 0, &BlockKey { key: 4, ..key() });
    flush(&mut t);
    t.poll();
    let s = t.stats();
    assert_eq!((s.files, s.evicted_files, s.bytes), (3, 1, 3 * id.file_bytes()), "{s:?}");
    assert!(!t.contains(2) && t.contains(1) && t.contains(4));
    drop(t);
    // A smaller cap at the next start trims the oldest.
    let t = tier(dir.path(), id, id.file_bytes());
    assert_eq!(t.stats().files, 1);
    drop(t);
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
}

#[test]
fn an_unusable_directory_or_budget_is_one_clear_error() {
    let id = identity(KvDtype::F16);
    let dir = tempfile::tempdir().unwrap();
    let blocker = dir.path().join("a-file");
    std::fs::write(&blocker, b"x").unwrap();
    let config = DiskCacheConfig { dir: blocker.join("sub"), max_bytes: 1 << 20 };
    let e = DiskTier::open(&config, id).err().unwrap().to_string();
    assert!(e.contains("prefix cache directory") && e.contains("a-file"), "{e}");
    let small = DiskCacheConfig { dir: dir.path().to_path_buf(), max_bytes: 10 };
    let e = DiskTier::open(&small, id).err().unwrap().to_string();
    assert!(e.contains("holds no block"), "{e}");
}

#[test]
fn a_failing_disk_turns_the_tier_off_without_failing() {
    let dir = tempfile::tempdir().unwrap();
    let id = identity(KvDtype::F16);
    let mut kv = cache(&id, 8);
    let sub = dir.path().join("tier");
    let mut t = tier(&sub, id, 1 << 20);
    std::fs::remove_dir_all(&sub).unwrap();
    t.spill(&kv, 0, &key());
    flush(&mut t);
    t.poll();
    assert!(!t.stats().enabled);
    // Off: nothing is found, nothing is written, nothing panics.
    t.spill(&kv, 0, &key());
    assert!(!t.contains(0xfeed) && !t.restore(&mut kv, 1, &key()));
}
