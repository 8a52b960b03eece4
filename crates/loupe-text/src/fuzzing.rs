//! The body of the `compact_bpe` fuzz target (fuzz/fuzz_targets/compact_bpe.rs), also run over
//! seeded inputs by tests/fuzz_smoke.rs: a vocabulary, merges and a text from arbitrary bytes,
//! through [`CompactBpe`] and through `tokenizers`' BPE configured as transformers configures
//! it. Building may fail on bad input, the same way for both; neither may panic, and when both
//! tokenize they must agree.

use tokenizers::Model;

use crate::backend::TokenModel;
use crate::compact_bpe::{generate_merges, merge_pairs, tokenizers_bpe, CompactBpe};

/// `data`: tokens separated by 0xFF bytes (lossy UTF-8), the last segment the text. The text's
/// first byte picks the model: bit 1 set, listed merges (every split of a token into two
/// tokens, in token order or, bit 2 set, reversed; bit 3 set, one more joining the first two
/// tokens, which need not be valid); else scored, each token's score its first byte modulo 8 (ties on
/// purpose), with the first token as the unknown token when bit 0 is set.
pub fn compact_bpe(data: &[u8]) {
    let mut parts: Vec<&[u8]> = data.split(|&b| b == 0xFF).collect();
    let Some(text) = parts.pop() else { return };
    let tokens: Vec<String> = parts.iter().map(|p| String::from_utf8_lossy(p).into_owned()).collect();
    let mode = text.first().copied().unwrap_or(0);
    let (ours, reference) = if mode & 2 != 0 {
        let known: std::collections::HashSet<&str> = tokens.iter().map(String::as_str).collect();
        let mut merges: Vec<String> = Vec::new();
        for t in &tokens {
            for (at, _) in t.char_indices().skip(1) {
                let (l, r) = t.split_at(at);
                if known.contains(l) && known.contains(r) && !l.contains(' ') && !r.contains(' ') {
                    merges.push(format!("{l} {r}"));
                }
            }
        }
        if mode & 4 != 0 {
            merges.reverse();
        }
        if let (true, [a, b, ..]) = (mode & 8 != 0, tokens.as_slice()) {
            merges.push(format!("{a} {b}"));
        }
        let ours = CompactBpe::listed(&tokens, &merges);
        let reference = merge_pairs(&merges).ok().and_then(|m| tokenizers_bpe(&tokens, m, true, None).ok());
        (ours, reference)
    } else {
        let scores: Vec<f32> = parts.iter().map(|p| -f32::from(p.first().copied().unwrap_or(0) % 8)).collect();
        let unk = (mode % 2 == 1 && !tokens.is_empty()).then(|| tokens[0].as_str());
        let ours = CompactBpe::scored(&tokens, &scores, unk);
        (ours, tokenizers_bpe(&tokens, generate_merges(&tokens, &scores), false, unk).ok())
    };
    let (ours, reference) = match (ours, reference) {
        (Ok(ours), Some(reference)) => (TokenModel::from(ours), reference),
        (Err(_), None) => return,
        (ours, reference) => panic!(
            "one side refused the vocabulary {tokens:?}: ours {:?}, tokenizers' {}",
            ours.err(),
            if reference.is_some() { "built" } else { "refused" }
        ),
    };
    let text = String::from_utf8_lossy(text);
    for word in text.split(' ').filter(|w| !w.is_empty()) {
        let a = ours.tokenize(word).map(|t| t.into_iter().map(|t| (t.id, t.offsets)).collect::<Vec<_>>());
        let b = reference.tokenize(word).map(|t| t.into_iter().map(|t| (t.id, t.offsets)).collect::<Vec<_>>());
        match (a, b) {
            (Ok(a), Ok(b)) => assert_eq!(a, b, "word {word:?} of vocabulary {tokens:?}"),
            (Err(_), Err(_)) => {}
            (a, b) => panic!("one model failed: {a:?} vs {b:?} on {word:?} of vocabulary {tokens:?}"),
        }
    }
}
