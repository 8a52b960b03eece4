#![no_main]
// The body is loupe_formats::dump_fuzzing::pt_parse, shared with the seeded smoke test
// (crates/loupe-formats/tests/fuzz_dump_formats.rs).

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    loupe_formats::dump_fuzzing::pt_parse(data);
});
