#![no_main]
// The body is loupe_formats::fuzzing::gguf_roundtrip, shared with the seeded smoke test.

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    loupe_formats::fuzzing::gguf_roundtrip(data);
});
