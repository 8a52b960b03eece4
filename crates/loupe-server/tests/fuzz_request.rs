//! The `openai_request` fuzz target's body over a few thousand mutations of valid chat and
//! completion bodies, from a fixed seed (a seeded stand-in for `cargo fuzz`, which finds
//! more; see fuzz/README.md). A failure names the seed, iteration and input.

use loupe_core::SplitMix64;
use loupe_server::request::fuzz_request;

const SEED: u64 = 0x6c6f_7570_6500_0011;
const ITERATIONS: usize = 4000;

const VALID: [&str; 5] = [
    r#"{"model": "m", "messages": [{"role": "developer", "content": "Be brief."}, {"role": "user", "content": [{"type": "text", "text": "Hi"}]}], "temperature": 0.5, "top_p": 0.9, "stop": ["\n", "END"], "logprobs": true, "top_logprobs": 3, "stream": true, "stream_options": {"include_usage": true}, "seed": -3, "max_completion_tokens": 40}"#,
    r#"{"prompt": "Once upon a time", "max_tokens": 16, "logprobs": 2, "presence_penalty": 1.5, "frequency_penalty": -0.5, "n": 1, "best_of": 1, "echo": false, "suffix": null}"#,
    r#"{"prompt": [1, 2, 3, 4294967295], "top_k": -1, "min_p": 0.1, "repetition_penalty": 1.1, "user": "u", "metadata": {"a": 1}}"#,
    r#"{"messages": [{"role": "assistant", "content": null, "name": "x"}], "tools": [], "tool_choice": "none", "response_format": {"type": "text"}, "logit_bias": {}}"#,
    r##"{"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_schema", "json_schema": {"name": "n", "strict": true, "schema": {"type": ["object", "null"], "properties": {"a": {"type": "array", "items": {"$ref": "#/$defs/b"}}}, "$defs": {"b": {"enum": [1, "x", null]}}}}}}"##,
];

fn mutate(input: &mut Vec<u8>, rng: &mut SplitMix64) {
    let interesting: [&[u8]; 12] = [
        b"null",
        b"-1",
        b"1e309",
        b"[]",
        b"{}",
        b"\"",
        b"\\u0000",
        b"99999999999999999999",
        b"true",
        b",",
        b"\xff\xfe",
        b"NaN",
    ];
    for _ in 0..1 + rng.next_u64() % 4 {
        let at = if input.is_empty() { 0 } else { (rng.next_u64() % input.len() as u64) as usize };
        match rng.next_u64() % 5 {
            0 => input.truncate(at),
            1 if !input.is_empty() => input[at] = rng.next_u64() as u8,
            2 => {
                let piece = interesting[(rng.next_u64() % interesting.len() as u64) as usize];
                input.splice(at..at, piece.iter().copied());
            }
            3 if !input.is_empty() => {
                let end = (at + 1 + (rng.next_u64() % 16) as usize).min(input.len());
                input.drain(at..end);
            }
            _ => {
                // Duplicate a span: deep nesting and repeated keys.
                let end = (at + (rng.next_u64() % 64) as usize).min(input.len());
                let span: Vec<u8> = input[at..end].to_vec();
                input.splice(at..at, span);
            }
        }
    }
}

#[test]
fn request_parsers_never_panic_on_mutated_bodies() {
    let mut rng = SplitMix64(SEED);
    for body in VALID {
        fuzz_request(body.as_bytes());
    }
    for i in 0..ITERATIONS {
        let mut input = VALID[i % VALID.len()].as_bytes().to_vec();
        mutate(&mut input, &mut rng);
        let outcome = std::panic::catch_unwind(|| fuzz_request(&input));
        assert!(outcome.is_ok(), "iteration {i} (seed {SEED:#x}) panicked on {:?}", String::from_utf8_lossy(&input));
    }
}

#[test]
fn deeply_nested_bodies_are_refused_not_overflowing() {
    // serde_json stops at 128 levels; the parser must answer, not blow the stack.
    let deep = format!("{{\"messages\": {}{}}}", "[".repeat(100_000), "]".repeat(100_000));
    fuzz_request(deep.as_bytes());
}
