use loupe_core::SplitMix64 as Rng;
use tokenizers::Model;

use super::*;
use crate::backend::TokenModel;

const ALPHABET: [&str; 7] = ["a", "b", "c", "\u{2581}", "é", "ß", "猫"];

/// A SentencePiece-like vocabulary: `<unk>`, byte tokens for some bytes, the alphabet's
/// characters (some missing, so byte fallback and unknowns happen), and random pieces of 2-5
/// characters, duplicates included; scores from a small set, so ties are common.
fn random_vocab(rng: &mut Rng) -> (Vec<String>, Vec<f32>) {
    let mut tokens = vec!["<unk>".to_owned()];
    for byte in [0x61u8, 0x62, 0xC3, 0xA9, 0xE7, 0x8C, 0xAB] {
        if rng.below(4) != 0 {
            tokens.push(format!("<0x{byte:02X}>"));
        }
    }
    for c in ALPHABET {
        if rng.below(6) != 0 {
            tokens.push(c.to_owned());
        }
    }
    for _ in 0..60 + rng.below(60) {
        let len = 2 + rng.below(4);
        tokens.push((0..len).map(|_| ALPHABET[rng.below(ALPHABET.len())]).collect());
    }
    let scores = (0..tokens.len()).map(|_| [-3.0, -2.0, -1.5, -1.0, 0.0, f32::NAN][rng.below(6)]).collect();
    (tokens, scores)
}

fn random_word(rng: &mut Rng) -> String {
    let extra = ["x", "\u{2581}\u{2581}", "ab"];
    (0..1 + rng.below(14))
        .map(|_| if rng.below(8) == 0 { extra[rng.below(extra.len())] } else { ALPHABET[rng.below(ALPHABET.len())] })
        .collect()
}

fn hf_tokens(model: &tokenizers::models::ModelWrapper, word: &str) -> Vec<(u32, String, (usize, usize))> {
    model.tokenize(word).expect("hf tokenize").into_iter().map(|t| (t.id, t.value, t.offsets)).collect()
}

fn our_tokens(model: &TokenModel, word: &str) -> Vec<(u32, String, (usize, usize))> {
    model.tokenize(word).expect("tokenize").into_iter().map(|t| (t.id, t.value, t.offsets)).collect()
}

#[test]
fn ids_and_offsets_equal_tokenizers_bpe_with_the_derived_merges() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut compared = 0;
    for vocab_seed in 0..40 {
        let (tokens, scores) = random_vocab(&mut rng);
        let unk = (vocab_seed % 2 == 0).then_some("<unk>");
        let ours: TokenModel = CompactBpe::scored(&tokens, &scores, unk).expect("build").into();
        let hf = ours.to_hf().expect("listed merges");
        assert_eq!(ours.get_vocab_size(), hf.get_vocab_size(), "vocabulary {vocab_seed}");
        assert_eq!(ours.get_vocab(), hf.get_vocab(), "vocabulary {vocab_seed}");
        for id in 0..tokens.len() as u32 + 2 {
            assert_eq!(ours.id_to_token(id), hf.id_to_token(id), "vocabulary {vocab_seed}, id {id}");
        }
        for _ in 0..200 {
            let word = random_word(&mut rng);
            assert_eq!(our_tokens(&ours, &word), hf_tokens(&hf, &word), "vocabulary {vocab_seed}, word {word:?}");
            compared += 1;
        }
    }
    assert_eq!(compared, 8000);
}

/// The merges of a random vocabulary, listed in a random order: every split of a token into
/// two tokens, some twice (a repeated pair takes its later rank).
fn random_merges(tokens: &[String], rng: &mut Rng) -> Vec<String> {
    let mut merges = Vec::new();
    for t in tokens {
        for (at, _) in t.char_indices().skip(1) {
            let (l, r) = t.split_at(at);
            if tokens.iter().any(|x| x == l) && tokens.iter().any(|x| x == r) && !l.contains(' ') && !r.contains(' ') {
                merges.push(format!("{l} {r}"));
            }
        }
    }
    for i in (1..merges.len()).rev() {
        merges.swap(i, rng.below(i + 1));
    }
    for _ in 0..merges.len() / 8 {
        let again = merges[rng.below(merges.len())].clone();
        merges.push(again);
    }
    merges
}

#[test]
fn listed_merges_give_the_ids_and_offsets_of_tokenizers_bpe() {
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    for vocab_seed in 0..40 {
        let (tokens, _) = random_vocab(&mut rng);
        let merges = random_merges(&tokens, &mut rng);
        let ours: TokenModel = CompactBpe::listed(&tokens, &merges).expect("build").into();
        let pairs = merge_pairs(&merges).expect("random merges are well-formed");
        let reference: tokenizers::models::ModelWrapper =
            tokenizers_bpe(&tokens, pairs, true, None).expect("reference BPE").into();
        let saved = ours.to_hf().expect("listed");
        assert_eq!(ours.get_vocab(), reference.get_vocab(), "vocabulary {vocab_seed}");
        for _ in 0..200 {
            let word = random_word(&mut rng);
            let expected = hf_tokens(&reference, &word);
            assert_eq!(our_tokens(&ours, &word), expected, "vocabulary {vocab_seed}, word {word:?}");
            assert_eq!(hf_tokens(&saved, &word), expected, "to_hf, vocabulary {vocab_seed}, word {word:?}");
        }
    }
}

#[test]
fn bad_listed_merges_are_errors() {
    let tokens = ["a", "b", "ab", "c"];
    for (merge, says) in [
        ("a b c", "two tokens"),
        ("a  b", "two tokens"),
        ("ab", "two tokens"),
        ("a x", "not in the vocabulary"),
        ("a c", "not in the vocabulary"),
    ] {
        let err = CompactBpe::listed(&tokens, &["a b".to_owned(), merge.to_owned()]).expect_err(merge);
        let text = err.to_string();
        assert!(text.contains("tokenizer.ggml.merges") && text.contains("merge 1") && text.contains(says), "{text}");
    }
}

#[test]
fn a_pair_ranks_by_score_then_lengths_then_first_position() {
    // "abc" outranks "ab" (higher score), so "a b c" merges b+c first; among the splits of
    // "abcd" the longer left half ranks first; equal scores fall back to file position.
    let tokens = ["a", "b", "c", "d", "ab", "bc", "abc", "cd", "abcd"];
    let scores = [0.0, 0.0, 0.0, 0.0, -5.0, -1.0, -2.0, -1.0, -3.0];
    let bpe = CompactBpe::scored(&tokens, &scores, None).expect("build");
    let ids = |w: &str| bpe.tokenize(w).expect("tokenize").into_iter().map(|(id, _)| id).collect::<Vec<_>>();
    // b+c (-1.0) ties c+d (-1.0): "bc" comes first in the file, so it merges first; then
    // a+bc = "abc" (-2.0), then abc+d = "abcd" (-3.0).
    assert_eq!(ids("abcd"), vec![8]);
    assert_eq!(ids("abc"), vec![6]);
    // b+c first (it ties c+d and comes first in the file); "bcd" is not a token.
    assert_eq!(ids("bcd"), vec![5, 3]);
}

#[test]
fn duplicates_keep_the_last_id_and_the_first_position() {
    let tokens = ["a", "b", "ab", "x", "ab"];
    let bpe = CompactBpe::scored(&tokens, &[0.0; 5], None).expect("build");
    assert_eq!(bpe.token_to_id("ab"), Some(4));
    assert_eq!(bpe.id_to_token(2), None, "a shadowed duplicate has no spelling, as in tokenizers");
    assert_eq!(bpe.id_to_token(4), Some("ab"));
    assert_eq!(bpe.vocab_size(), 4);
    assert_eq!(bpe.tokenize("ab").expect("tokenize"), vec![(4, (0, 2))]);
}

#[test]
fn unknown_characters_fall_back_to_bytes_then_fuse_into_unk() {
    let tokens = ["<unk>", "a", "<0xC3>", "<0xA9>"];
    let bpe = CompactBpe::scored(&tokens, &[0.0; 4], Some("<unk>")).expect("build");
    // é is two byte tokens; 猫 and ß have no byte tokens: one fused <unk> over both.
    assert_eq!(
        bpe.tokenize("aé猫ßa").expect("tokenize"),
        vec![(1, (0, 1)), (2, (1, 2)), (3, (2, 3)), (0, (3, 8)), (1, (8, 9))]
    );
    // Without an unknown token the characters are dropped, as tokenizers drops them (and, as
    // there, the offsets count only the symbols kept).
    let bare = CompactBpe::scored(&tokens, &[0.0; 4], None).expect("build");
    assert_eq!(bare.tokenize("a猫a").expect("tokenize"), vec![(1, (0, 1)), (1, (1, 2))]);
}

#[test]
fn bad_vocabularies_are_errors_not_panics() {
    let err = CompactBpe::scored(&["a", "b"], &[0.0], None).expect_err("scores of the wrong length");
    assert!(err.to_string().contains("tokenizer.ggml.scores"), "{err}");
    // An unknown token that is not in the vocabulary fails the encode that needs it.
    let bpe = CompactBpe::scored(&["a"], &[0.0], Some("<unk>")).expect("build");
    assert!(bpe.tokenize("a").is_ok());
    let err = bpe.tokenize("b").expect_err("no <unk> to map b to");
    assert!(err.to_string().contains("<unk>"), "{err}");
    // Empty and odd inputs.
    let empty: [&str; 0] = [];
    let none = CompactBpe::scored(&empty, &[], None).expect("an empty vocabulary builds");
    assert_eq!(none.tokenize("abc").expect("tokenize"), vec![]);
    assert_eq!(bpe.tokenize("").expect("tokenize"), vec![]);
}

#[test]
fn score_key_orders_as_total_cmp_descending() {
    let values = [f32::NEG_INFINITY, -2.5, -0.0, 0.0, 1e-30, 3.0, f32::INFINITY, f32::NAN, -f32::NAN];
    for a in values {
        for b in values {
            assert_eq!(score_key(a).cmp(&score_key(b)), b.total_cmp(&a), "{a} vs {b}");
        }
    }
}
