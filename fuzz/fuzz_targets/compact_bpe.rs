#![no_main]
// The body is loupe_text::fuzzing::compact_bpe, shared with the seeded smoke test
// (crates/loupe-text/tests/fuzz_smoke.rs): a vocabulary and a text from the bytes, through
// loupe's looked-up merges and tokenizers' listed ones, which must agree.

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    loupe_text::fuzzing::compact_bpe(data);
});
