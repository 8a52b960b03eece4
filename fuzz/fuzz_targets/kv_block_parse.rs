#![no_main]
// The body is loupe_runtime::batch::disk::fuzz_block_file, shared with the seeded unit test
// (crates/loupe-runtime/src/batch/disk/tests.rs): any bytes through the parser of the
// prefix cache's block files, which must refuse or accept, never panic; an accepted file
// writes back to its own bytes.

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    loupe_runtime::batch::disk::fuzz_block_file(data);
});
