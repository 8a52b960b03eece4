//! The single-sequence session on the tiny random-weight Llama: a prompt run in chunks
//! (`Session::forward` past `prefill_chunk` rows) computes what one pass computes.

mod common;
use common::tiny_file;

use loupe_core::SplitMix64;
use loupe_runtime::{argmax, Engine, LoadOptions, Session};

fn engine() -> Engine {
    let path = tiny_file(&loupe_models::tiny::TinyLlama::default());
    Engine::load(path, LoadOptions::default()).expect("loading the tiny model")
}

fn prompt(n: usize, seed: u64) -> Vec<u32> {
    let mut rng = SplitMix64::new(seed);
    (0..n).map(|_| 3 + (rng.next_u64() % 400) as u32).collect()
}

/// Largest difference between `a` and `b`, relative to `a`'s largest magnitude.
fn relative_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    let scale = a.iter().fold(0f32, |m, x| m.max(x.abs())).max(1e-6);
    a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs())) / scale
}

/// Greedy continuation of `n` tokens after `logits`.
fn continue_greedy(session: &mut Session<'_>, logits: &[f32], n: usize) -> Vec<u32> {
    let mut next = argmax(logits);
    let mut out = vec![next];
    for _ in 1..n {
        next = argmax(session.forward(&[next], false, None).unwrap());
        out.push(next);
    }
    out
}

/// How far chunked and one-pass values may drift apart: a chunk of few rows runs decode's
/// kernels where one pass runs the prompt's (another activation rounding, ~1e-3 relative at
/// AVX2), while a chunk at the wrong positions or in the wrong order is off by O(1).
const CHUNK_TOLERANCE: f32 = 1e-2;

#[test]
fn a_prompt_in_chunks_computes_what_one_pass_computes() {
    let engine = engine();
    for (len, chunk) in [(40, 7), (64, 16), (33, 32), (17, 1)] {
        let tokens = prompt(len, len as u64);
        let mut whole = engine.session(len + 8);
        whole.set_prefill_chunk(usize::MAX);
        let whole_logits = whole.forward(&tokens, false, None).unwrap().to_vec();
        let mut chunked = engine.session(len + 8);
        chunked.set_prefill_chunk(chunk);
        let chunked_logits = chunked.forward(&tokens, false, None).unwrap().to_vec();
        assert_eq!(chunked.position(), len, "prompt {len}, chunk {chunk}: cached positions");
        let diff = relative_diff(&whole_logits, &chunked_logits);
        assert!(diff < CHUNK_TOLERANCE, "prompt {len}, chunk {chunk}: last logits differ by {diff} (relative)");
        for layer in 0..engine.graph().kv_layers {
            let (wk, wv) = whole.kv().layer(layer);
            let (ck, cv) = chunked.kv().layer(layer);
            for (name, w, c) in [("keys", wk, ck), ("values", wv, cv)] {
                let (w, c) = (w.to_f32_vec(), c.to_f32_vec());
                let diff = relative_diff(&w, &c);
                assert!(diff < CHUNK_TOLERANCE, "prompt {len}, chunk {chunk}: layer {layer} {name} differ by {diff}");
            }
        }
        assert_eq!(
            continue_greedy(&mut whole, &whole_logits, 8),
            continue_greedy(&mut chunked, &chunked_logits, 8),
            "prompt {len}, chunk {chunk}: greedy continuation"
        );
    }
}

#[test]
fn a_prompt_too_long_for_the_cache_leaves_it_empty() {
    let engine = engine();
    let mut session = engine.session(16);
    session.set_prefill_chunk(4);
    let err = session.forward(&prompt(20, 1), false, None).unwrap_err();
    assert!(err.to_string().contains("16"), "{err}");
    assert_eq!(session.position(), 0, "no chunk of the refused prompt is cached");
    // The session still runs a prompt that fits.
    session.forward(&prompt(12, 2), false, None).unwrap();
    assert_eq!(session.position(), 12);
}

#[test]
fn every_row_logits_keep_one_pass() {
    let engine = engine();
    let tokens = prompt(24, 5);
    let mut session = engine.session(32);
    session.set_prefill_chunk(5);
    let vocab = session.forward(&tokens[..1], false, None).unwrap().len();
    session.reset();
    let all = session.forward(&tokens, true, None).unwrap();
    assert_eq!(all.len(), tokens.len() * vocab, "teacher forcing returns every row's logits");
}
