//! A poor man's fuzz run, executed by `cargo test`: the bodies of the `fuzz/` targets over
//! a few thousand generated and mutated inputs from a fixed seed. It cannot find what
//! coverage-guided fuzzing finds, but it keeps the targets compiling and catches
//! regressions on the mutations it does try. A failure prints the seed and iteration;
//! re-run with that seed to reproduce.

use loupe_formats::fuzzing::{
    arbitrary_gguf, arbitrary_safetensors, gguf_header_len, gguf_parse, gguf_roundtrip, mutate, safetensors_parse,
    Choices, SplitMix64,
};

const SEED: u64 = 0x6c6f_7570_6500_0001; // "loupe" + 1
const ITERATIONS: usize = 3000;

/// Runs `body` under catch_unwind so the failing input is reported.
fn run(name: &str, i: usize, input: &[u8], body: fn(&[u8])) {
    let outcome = std::panic::catch_unwind(|| body(input));
    if outcome.is_err() {
        panic!("{name}: iteration {i} (seed {SEED:#x}) panicked on input {input:02x?}");
    }
}

#[test]
fn gguf_roundtrip_over_random_inputs() {
    let mut rng = SplitMix64(SEED);
    run("gguf_roundtrip", 0, &[], gguf_roundtrip);
    for i in 0..ITERATIONS {
        let n = rng.below(512);
        let input = rng.bytes(n);
        run("gguf_roundtrip", i, &input, gguf_roundtrip);
    }
}

#[test]
fn gguf_parse_over_mutated_valid_files() {
    let mut rng = SplitMix64(SEED ^ 1);
    let mut accepted = 0;
    for i in 0..ITERATIONS {
        let n = rng.below(256);
        let seed_input = rng.bytes(n);
        let mut bytes = arbitrary_gguf(&mut Choices::new(&seed_input)).to_bytes().expect("generated files are valid");
        let hot = gguf_header_len(&bytes);
        mutate(&mut bytes, hot, &mut rng);
        if loupe_formats::GgufFile::from_bytes("m", bytes.clone()).is_ok() {
            accepted += 1;
        }
        run("gguf_parse", i, &bytes, gguf_parse);
    }
    // Some mutations (of padding, tensor data, string contents) leave a valid file; if
    // none do, the mutator is broken and the test is exercising nothing but the magic.
    assert!(accepted > 0 && accepted < ITERATIONS, "accepted {accepted} of {ITERATIONS}");
}

#[test]
fn gguf_parse_over_random_bytes_with_a_valid_prefix() {
    let mut rng = SplitMix64(SEED ^ 2);
    for i in 0..ITERATIONS {
        let mut bytes = b"GGUF".to_vec();
        bytes.extend_from_slice(&[3, 0, 0, 0]);
        let n = rng.below(128);
        bytes.extend(rng.bytes(n));
        run("gguf_parse", i, &bytes, gguf_parse);
    }
}

#[test]
fn safetensors_parse_over_mutated_valid_files() {
    let mut rng = SplitMix64(SEED ^ 3);
    for i in 0..ITERATIONS {
        let n = rng.below(128);
        let seed_input = rng.bytes(n);
        let mut bytes = arbitrary_safetensors(&mut Choices::new(&seed_input));
        safetensors_parse(&bytes);
        let hot = bytes.len();
        mutate(&mut bytes, hot, &mut rng);
        run("safetensors_parse", i, &bytes, safetensors_parse);
    }
}
