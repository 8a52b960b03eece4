#![no_main]
// The body is loupe_server::request::fuzz_request, shared with the seeded smoke test
// (crates/loupe-server/tests/fuzz_request.rs): HTTP request bodies through the chat and
// completion parsers.

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    loupe_server::request::fuzz_request(data);
});
