//! The `compact_bpe` fuzz target's body over a few thousand seeded inputs, under `cargo test`:
//! vocabularies of short pieces over a small alphabet (so merges happen) and random bytes.
//! A failure names the iteration; the seed is fixed.

use loupe_core::SplitMix64;
use loupe_text::fuzzing::compact_bpe;

fn run(i: usize, input: &[u8]) {
    if std::panic::catch_unwind(|| compact_bpe(input)).is_err() {
        panic!("compact_bpe: iteration {i} panicked on input {input:02x?}");
    }
}

#[test]
fn compact_bpe_agrees_with_tokenizers_bpe_on_seeded_inputs() {
    let mut rng = SplitMix64(0x6c6f_7570_6500_0002);
    // Letters, a two-byte and a three-byte character, <0x..> byte tokens, spaces.
    let alphabet: [&[u8]; 8] = [b"a", b"b", b"c", "é".as_bytes(), "猫".as_bytes(), b"<0x61>", b"<0xC3>", b" "];
    for i in 0..3000 {
        let mut input = Vec::new();
        for _ in 0..rng.below(80) {
            for _ in 0..1 + rng.below(4) {
                input.extend_from_slice(alphabet[rng.below(alphabet.len())]);
            }
            input.push(0xFF);
        }
        if i % 5 == 0 {
            // Raw bytes: invalid UTF-8, stray separators.
            input.extend((0..rng.below(64)).map(|_| rng.next_u64() as u8));
        } else {
            for _ in 0..rng.below(60) {
                input.extend_from_slice(alphabet[rng.below(alphabet.len())]);
            }
        }
        run(i, &input);
    }
    run(3000, &[]);
    run(3001, &[0xFF, 0xFF, 0xFF]);
}
