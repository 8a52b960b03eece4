//! Tests on small tokenizers built in Rust (no Python needed). Mostly StreamDecoder: the chunks
//! concatenate to the full decode, for random id sequences (invalid UTF-8, byte-fallback runs,
//! special tokens, out-of-vocabulary ids) and for real text with multibyte characters.

use loupe_text::{Tokenizer, TokenizerSpec};

/// GPT-2's byte-to-unicode table, restated so the test does not trust the crate's copy.
fn byte_char(b: u8) -> char {
    let printable = |b: u32| (0x21..=0x7E).contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b);
    let mut n = 0;
    for x in 0..256u32 {
        if x == u32::from(b) {
            return char::from_u32(if printable(x) { x } else { 256 + n }).unwrap();
        }
        if !printable(x) {
            n += 1;
        }
    }
    unreachable!()
}

fn spell(s: &str) -> String {
    s.bytes().map(byte_char).collect()
}

/// Byte-level BPE: the 256 bytes, merges that build a few multibyte characters and words, and
/// two control tokens.
pub fn byte_level() -> Tokenizer {
    let mut tokens: Vec<String> = (0..=255u8).map(|b| byte_char(b).to_string()).collect();
    let mut merges = Vec::new();
    for word in ["é", "😀", "日本", " the", "the", " hello", "hello", "語", "ü"] {
        let spelled = spell(word);
        let chars: Vec<char> = spelled.chars().collect();
        let mut acc = chars[0].to_string();
        for c in &chars[1..] {
            merges.push(format!("{acc} {c}"));
            acc.push(*c);
            if !tokens.contains(&acc) {
                tokens.push(acc.clone());
            }
        }
    }
    let mut types = vec![1; tokens.len()];
    tokens.extend(["<|im_start|>".to_string(), "<|im_end|>".to_string()]);
    types.extend([3, 3]);
    let eos = tokens.len() as u32 - 1;
    let spec = TokenizerSpec {
        model: "gpt2".into(),
        tokens,
        token_types: Some(types),
        merges,
        eos_id: Some(eos),
        ..Default::default()
    };
    Tokenizer::from_spec(&spec).expect("byte-level spec")
}

/// SentencePiece-style: byte-fallback tokens, "▁" pieces with scores, control tokens.
pub fn sentencepiece() -> Tokenizer {
    let mut tokens: Vec<String> = vec!["<unk>".into(), "<s>".into(), "</s>".into()];
    let mut types = vec![2, 3, 3];
    tokens.extend((0..=255u8).map(|b| format!("<0x{b:02X}>")));
    types.extend([6; 256]);
    for piece in ["▁", "a", "b", "c", "é", "▁a", "▁b", "ab", "▁ab", "▁▁", "bc", "▁abc", "日"] {
        tokens.push(piece.into());
        types.push(1);
    }
    tokens.push("<|im_end|>".into());
    types.push(3);
    let scores: Vec<f32> = (0..tokens.len()).map(|i| -(i as f32)).collect();
    let spec = TokenizerSpec {
        model: "llama".into(),
        tokens,
        scores: Some(scores),
        token_types: Some(types),
        bos_id: Some(1),
        eos_id: Some(2),
        unk_id: Some(0),
        ..Default::default()
    };
    Tokenizer::from_spec(&spec).expect("sentencepiece spec")
}

/// xorshift64*: deterministic, good enough to draw ids.
pub struct Rng(u64);
impl Rng {
    pub fn below(&mut self, n: u32) -> u32 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 33) as u32 % n
    }
}

/// Streams `ids` and checks the invariant; returns the chunks.
pub fn check_stream(tok: &Tokenizer, ids: &[u32], skip: bool) -> Vec<String> {
    let mut stream = tok.stream_decoder(skip);
    let mut chunks = Vec::new();
    for &id in ids {
        chunks.push(stream.push(id).unwrap_or_else(|e| panic!("push {id} of {ids:?}: {e}")));
    }
    assert_eq!(stream.text(), chunks.concat());
    chunks.push(stream.finish().expect("finish"));
    let full = tok.decode(ids, skip).expect("decode");
    assert_eq!(chunks.concat(), full, "ids {ids:?} skip={skip}, chunks {chunks:?}");
    chunks
}

#[test]
fn random_sequences_concatenate_to_the_full_decode() {
    for tok in [byte_level(), sentencepiece()] {
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
        let n = tok.vocab_size() as u32 + 2; // a few ids past the vocabulary too
        for _ in 0..400 {
            let len = 1 + rng.below(40) as usize;
            let ids: Vec<u32> = (0..len).map(|_| rng.below(n)).collect();
            check_stream(&tok, &ids, false);
            check_stream(&tok, &ids, true);
        }
    }
}

#[test]
fn multibyte_text_streams_whole_characters() {
    let text = "the é 😀 日本語 hello ü 🎉 abc";
    for tok in [byte_level(), sentencepiece()] {
        let ids = tok.encode(text, false).unwrap();
        let chunks = check_stream(&tok, &ids, true);
        assert!(chunks.iter().all(|c| !c.contains('\u{FFFD}')), "{chunks:?}");
        assert_eq!(chunks.concat(), tok.decode(&ids, true).unwrap());
        // Held back until complete: some push returned "" while a character was in flight.
        assert!(chunks.iter().any(String::is_empty), "{chunks:?}");
    }
}

#[test]
fn byte_fallback_run_that_turns_invalid_is_not_emitted_early() {
    let tok = sentencepiece();
    let id = |t: &str| tok.id_of(t).unwrap();
    // "é" as bytes, then a stray continuation byte: the whole run decodes to three U+FFFD.
    let ids = [id("▁a"), id("<0xC3>"), id("<0xA9>"), id("<|im_end|>"), id("<0x80>"), id("b")];
    let chunks = check_stream(&tok, &ids, true);
    assert!(!chunks.concat().contains('é'), "{chunks:?}");
}

#[test]
fn public_types_are_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<loupe_text::Tokenizer>();
    check::<loupe_text::ChatTemplate>();
    check::<loupe_text::TokenizerSpec>();
    check::<loupe_text::TextError>();
}

fn text_of(bytes: &[loupe_text::TokenBytes], ids: &[u32]) -> Vec<u8> {
    ids.iter()
        .flat_map(|&id| match &bytes[id as usize] {
            loupe_text::TokenBytes::Text(b) => b.clone(),
            loupe_text::TokenBytes::Special(_) => Vec::new(),
        })
        .collect()
}

#[test]
fn byte_level_token_bytes_concatenate_to_the_decode() {
    let tok = byte_level();
    let n = tok.vocab_size();
    let bytes = tok.token_bytes(n + 3).expect("token bytes");
    assert_eq!(bytes.len(), n + 3);
    // The control tokens and the ids past the vocabulary are special, with their names.
    let im_end = tok.id_of("<|im_end|>").unwrap() as usize;
    assert_eq!(bytes[im_end], loupe_text::TokenBytes::Special("<|im_end|>".into()));
    assert_eq!(bytes[n + 1], loupe_text::TokenBytes::Special(format!("<[{}]>", n + 1)));
    assert_eq!(bytes[tok.id_of(&spell(" the")).unwrap() as usize], loupe_text::TokenBytes::Text(b" the".to_vec()));
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    for _ in 0..200 {
        let ids: Vec<u32> = (0..1 + rng.below(12)).map(|_| rng.below(n as u32)).collect();
        let ours = String::from_utf8_lossy(&text_of(&bytes, &ids)).into_owned();
        assert_eq!(ours, tok.decode(&ids, true).unwrap(), "ids {ids:?}");
    }
}

#[test]
fn sentencepiece_token_bytes_spell_the_encoded_text() {
    let tok = sentencepiece();
    let bytes = tok.token_bytes(tok.vocab_size()).expect("token bytes");
    assert_eq!(bytes[tok.id_of("<0xE2>").unwrap() as usize], loupe_text::TokenBytes::Text(vec![0xE2]));
    assert_eq!(bytes[tok.id_of("▁ab").unwrap() as usize], loupe_text::TokenBytes::Text(b" ab".to_vec()));
    assert_eq!(bytes[2], loupe_text::TokenBytes::Special("</s>".into()));
    for text in ["ab c", "abc  b 日本語 ü", "é😀a", "a  b"] {
        let ids = tok.encode(text, false).unwrap();
        // The Metaspace pre-tokenizer adds one leading space (▁) that the decoder strips.
        let ours = text_of(&bytes, &ids);
        assert_eq!(std::str::from_utf8(&ours).unwrap().strip_prefix(' ').unwrap(), text, "ids {ids:?}");
    }
}
