//! A poor man's fuzz run of the dump-format readers (npy, npz, `.pt`, `.max`): each
//! format's valid seed file, mutated a few thousand times from a fixed seed, must be
//! either refused or read completely, never panic. A failure prints the seed, iteration
//! and input.

use loupe_formats::dump_fuzzing::{max_parse, npy_parse, npz_parse, pt_parse, seed_files};
use loupe_formats::fuzzing::{mutate, SplitMix64};

const SEED: u64 = 0x6c6f_7570_6500_0002;
const ITERATIONS: usize = 2000;

fn run(name: &str, i: usize, input: &[u8], body: fn(&[u8])) {
    if std::panic::catch_unwind(|| body(input)).is_err() {
        panic!("{name}: iteration {i} (seed {SEED:#x}) panicked on input {input:02x?}");
    }
}

#[test]
fn dump_readers_survive_mutations_of_valid_files() {
    for (k, (format, seed)) in seed_files().into_iter().enumerate() {
        assert!(!seed.is_empty(), "seed {format} was not built");
        let body: fn(&[u8]) = match format {
            "npy" => npy_parse,
            "npz" => npz_parse,
            "pt" => pt_parse,
            _ => max_parse,
        };
        run(format, 0, &seed, body);
        let mut rng = SplitMix64(SEED ^ k as u64);
        for i in 0..ITERATIONS {
            let mut bytes = seed.clone();
            // Mutate the whole file: headers, zip directories and pickles are all hot.
            let hot = bytes.len();
            mutate(&mut bytes, hot, &mut rng);
            run(format, i, &bytes, body);
        }
    }
}

#[test]
fn dump_readers_survive_random_bytes_after_a_valid_magic() {
    let mut rng = SplitMix64(SEED ^ 99);
    type Body = fn(&[u8]);
    let magics: [(&[u8], Body); 4] = [
        (b"\x93NUMPY\x01\x00", npy_parse),
        (b"\x93NUMPY\x03\x00", npy_parse),
        (b"PK\x03\x04", pt_parse),
        (&[0x93, 0xF0, 0x9F, 0x94, 0xA5, 0x2B, 0x2B, 0x93, 0, 0, 0, 0, 1, 0, 0, 0], max_parse),
    ];
    for i in 0..ITERATIONS {
        let (magic, body) = magics[i % magics.len()];
        let mut bytes = magic.to_vec();
        let n = rng.below(160);
        bytes.extend(rng.bytes(n));
        run("magic+random", i, &bytes, body);
    }
}
