//! The body of the `scored_bpe` fuzz target (fuzz/fuzz_targets/scored_bpe.rs), also run over
//! seeded inputs by tests/fuzz_smoke.rs: a vocabulary and a text from arbitrary bytes, through
//! [`ScoredBpe`] and through `tokenizers`' BPE with the same merges listed. Building either
//! may fail on bad input; neither may panic, and when both tokenize they must agree.

use tokenizers::Model;

use crate::backend::TokenModel;
use crate::scored_bpe::ScoredBpe;

/// `data`: tokens separated by 0xFF bytes (lossy UTF-8), the last segment the text; each
/// token's score is its first byte modulo 8 (ties on purpose); an unknown token when the text
/// starts with an odd byte.
pub fn scored_bpe(data: &[u8]) {
    let mut parts: Vec<&[u8]> = data.split(|&b| b == 0xFF).collect();
    let Some(text) = parts.pop() else { return };
    let tokens: Vec<String> = parts.iter().map(|p| String::from_utf8_lossy(p).into_owned()).collect();
    let scores: Vec<f32> = parts.iter().map(|p| -f32::from(p.first().copied().unwrap_or(0) % 8)).collect();
    let unk = (text.first().is_some_and(|b| b % 2 == 1) && !tokens.is_empty()).then(|| tokens[0].as_str());
    let Ok(ours) = ScoredBpe::new(&tokens, &scores, unk) else { return };
    let ours = TokenModel::from(ours);
    let Ok(listed) = ours.to_hf() else { return };
    let text = String::from_utf8_lossy(text);
    for word in text.split(' ').filter(|w| !w.is_empty()) {
        let a = ours.tokenize(word).map(|t| t.into_iter().map(|t| (t.id, t.offsets)).collect::<Vec<_>>());
        let b = listed.tokenize(word).map(|t| t.into_iter().map(|t| (t.id, t.offsets)).collect::<Vec<_>>());
        match (a, b) {
            (Ok(a), Ok(b)) => assert_eq!(a, b, "word {word:?} of vocabulary {tokens:?}"),
            (Err(_), Err(_)) => {}
            (a, b) => panic!("one model failed: {a:?} vs {b:?} on {word:?} of vocabulary {tokens:?}"),
        }
    }
}
