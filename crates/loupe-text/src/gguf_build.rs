//! Builds a `tokenizers` pipeline ([`Backend`]) from GGUF tokenizer metadata exactly as transformers 5.x does
//! in `AutoTokenizer.from_pretrained(dir, gguf_file=name)`.
//!
//! The reference is `transformers/integrations/gguf/gguf_tokenizer_mapping.py` plus the classes it
//! instantiates (`GPT2Tokenizer`, `LlamaTokenizer`, `TokenizersBackend.__init__`). The order of the
//! steps below follows theirs, because the order in which tokens are added decides the ids of
//! tokens that are not in the vocabulary and which tokens count as special:
//!
//! 1. the model, pre-tokenizer and decoder of the class chosen by `tokenizer.ggml.model`;
//! 2. that class's default special tokens (`<|endoftext|>` for GPT-2, `<unk>`/`<s>`/`</s>` for
//!    Llama), added as special tokens (appended with new ids when absent from the vocabulary);
//! 3. CONTROL tokens as special added tokens, USER_DEFINED ones as plain added tokens;
//! 4. the split regex that `tokenizer.ggml.pre` selects, if any;
//! 5. the bos/eos/unk/pad tokens named by id in the file, as special added tokens;
//! 6. the post-processor: BOS/EOS per `add_bos_token`/`add_eos_token` (defaults: true for
//!    "llama", false for "gpt2").
//!
//! Known, deliberate non-mirroring: `tokenizer.ggml.add_space_prefix` is ignored, as in HF.

use std::borrow::Cow;
use std::collections::HashSet;

use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::decoders::strip::Strip;
use tokenizers::decoders::DecoderWrapper;
use tokenizers::normalizers::{Prepend, Replace, Sequence as NormalizerSequence};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::metaspace::{Metaspace, PrependScheme};
use tokenizers::pre_tokenizers::sequence::Sequence as PreTokenizerSequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::processors::template::TemplateProcessing;
use tokenizers::{AddedToken, SplitDelimiterBehavior};

use crate::backend::{Backend, TokenModel};
use crate::compact_bpe::{generate_merges, merge_pairs, tokenizers_bpe, CompactBpe};
use crate::error::{Result, TextError};
use crate::spec::{invalid, token_type, TokenizerSpec};

/// What a build produces: the backend plus the special-token facts HF keeps beside it.
pub(crate) struct Built {
    pub tokenizer: Backend,
    pub bos_token: Option<String>,
    pub eos_token: Option<String>,
    pub unk_token: Option<String>,
    pub pad_token: Option<String>,
    pub add_bos: bool,
    pub add_eos: bool,
}

const SUPPORTED: &str = "gpt2 (byte-level BPE), llama (SentencePiece BPE; also phi3, gemma, gemma2, gemma3)";

/// Mirrors `convert_gguf_tokenizer` + `TokenizersBackend.__init__` for a GGUF tokenizer.
pub(crate) fn build(spec: &TokenizerSpec) -> Result<Built> {
    spec.validate()?;
    let arch = spec.architecture.as_deref().unwrap_or("");
    let mut tokenizer = match spec.model.as_str() {
        "gpt2" => byte_level_tokenizer(spec)?,
        "llama" => match arch {
            "gemma" | "gemma2" | "gemma3" => gemma_tokenizer(spec)?,
            "phi3" => phi3_tokenizer(spec)?,
            _ => sentencepiece_tokenizer(spec)?,
        },
        other => {
            return Err(TextError::Unsupported {
                what: format!("tokenizer.ggml.model = {other:?}"),
                supported: SUPPORTED,
            })
        }
    };
    add_gguf_special_tokens(&mut tokenizer, spec);
    set_split_regex(&mut tokenizer, spec)?;

    let name = |id: Option<u32>| id.map(|id| spec.tokens[id as usize].clone());
    let (bos_token, eos_token) = (name(spec.bos_id), name(spec.eos_id));
    let (unk_token, pad_token) = (name(spec.unk_id), name(spec.pad_id));
    // TokenizersBackend.__init__ then _post_init: every named special token is an added special
    // token, in SPECIAL_TOKENS_ATTRIBUTES order, unless already added (by content).
    let named: Vec<&String> = [&bos_token, &eos_token, &unk_token, &pad_token].into_iter().flatten().collect();
    add_missing_specials(&mut tokenizer, &named);

    // get_gguf_tokenizer: "llama" files without the flag get BOS, as llama.cpp does.
    let add_bos = spec.add_bos.unwrap_or(spec.model == "llama") && bos_token.is_some();
    let add_eos = spec.add_eos.unwrap_or(false) && eos_token.is_some();
    let post = bos_eos_post_processor(&tokenizer, bos_token.as_deref(), eos_token.as_deref(), add_bos, add_eos)?;
    tokenizer.with_post_processor(Some(post));
    Ok(Built { tokenizer, bos_token, eos_token, unk_token, pad_token, add_bos, add_eos })
}

/// GPT-2's byte-to-unicode table (`bytes_to_unicode` in transformers): printable Latin-1 bytes map
/// to themselves, the other 68 bytes to U+0100.. in order.
pub fn bytes_to_unicode() -> [char; 256] {
    let mut table = ['\0'; 256];
    let printable = |b: u32| (0x21..=0x7E).contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b);
    let mut next = 256u32;
    for b in 0..256u32 {
        let code = if printable(b) {
            b
        } else {
            next += 1;
            next - 1
        };
        // Every code point here is below 0x200, so from_u32 cannot fail.
        table[b as usize] = char::from_u32(code).unwrap_or('\u{FFFD}');
    }
    table
}

/// `byte_level_tokenizer` + `GPT2Tokenizer.__init__`.
fn byte_level_tokenizer(spec: &TokenizerSpec) -> Result<Backend> {
    let table = bytes_to_unicode();
    let alphabet: HashSet<char> = table.iter().copied().collect();
    // A token written outside the byte alphabet (llama.cpp stores some as plain text) is respelled
    // from its UTF-8 bytes. A Python dict comprehension: a later duplicate overwrites the id.
    let keys: Vec<Cow<'_, str>> = spec
        .tokens
        .iter()
        .map(|token| {
            if token.chars().all(|c| alphabet.contains(&c)) {
                Cow::Borrowed(token.as_str())
            } else {
                Cow::Owned(token.bytes().map(|b| table[b as usize]).collect())
            }
        })
        .collect();
    let bpe: TokenModel = if spec.merges.is_empty() {
        // Merges derived from the scores over the unrespelled tokens, as transformers does.
        let merges = generate_merges(&spec.tokens, scores_to_rank(spec, None)?);
        tokenizers_bpe(&keys, merges, true, None).map_err(|e| build_err("BPE model", e))?.into()
    } else {
        CompactBpe::listed(&keys, &spec.merges)?.into()
    };
    let mut tokenizer = Backend::new(bpe);
    tokenizer.with_pre_tokenizer(Some(ByteLevel::new(false, true, true)));
    tokenizer.with_decoder(Some(ByteLevelDecoder::default()));
    // GPT2Tokenizer's defaults: unk = bos = eos = "<|endoftext|>".
    add_missing_specials(&mut tokenizer, &[&"<|endoftext|>".to_string()]);
    Ok(tokenizer)
}

/// `sentencepiece_tokenizer` + `LlamaTokenizer.__init__` (legacy=False, add_prefix_space=True).
fn sentencepiece_tokenizer(spec: &TokenizerSpec) -> Result<Backend> {
    // No unk_token on the model: LlamaTokenizer does not pass one, so unknown characters without
    // a byte token are dropped, as in HF.
    let bpe = sentencepiece_bpe(spec, &spec.tokens, None, None)?;
    let mut tokenizer = Backend::new(bpe);
    tokenizer.with_pre_tokenizer(Some(Metaspace::new('\u{2581}', PrependScheme::First, false)));
    tokenizer.with_decoder(Some(sentencepiece_decoder(true)?));
    // LlamaTokenizer's defaults, in SPECIAL_TOKENS_ATTRIBUTES order (bos, eos, unk).
    let defaults = ["<s>".to_string(), "</s>".to_string(), "<unk>".to_string()];
    add_missing_specials(&mut tokenizer, &defaults.iter().collect::<Vec<_>>());
    Ok(tokenizer)
}

/// `sentencepiece_tokenizer(tokenizer_dict, vocab_scores)`'s model: `tokens` as the vocabulary
/// (a later duplicate overwrites the id, as a Python dict does), byte fallback, `unk` as the
/// model's unknown token when the tokenizer class passes one, and the merges: the file's, else
/// those `get_merges` derives from `tokens` ranked by `vocab_scores` (else the file's scores),
/// which [`CompactBpe`] looks up instead of listing.
fn sentencepiece_bpe<T: AsRef<str>>(
    spec: &TokenizerSpec,
    tokens: &[T],
    vocab_scores: Option<&[f32]>,
    unk: Option<&str>,
) -> Result<TokenModel> {
    if spec.merges.is_empty() {
        return Ok(CompactBpe::scored(tokens, scores_to_rank(spec, vocab_scores)?, unk)?.into());
    }
    Ok(tokenizers_bpe(tokens, merge_pairs(&spec.merges)?, false, unk).map_err(|e| build_err("BPE model", e))?.into())
}

/// The SentencePiece decoder: `▁` back to spaces, byte tokens to bytes, fused; `strip_prefix`
/// drops the one leading space the Metaspace prefix added (LlamaTokenizer; Gemma adds none).
fn sentencepiece_decoder(strip_prefix: bool) -> Result<DecoderSequence> {
    let replace = Replace::new("\u{2581}", " ").map_err(|e| build_err("decoder", e))?;
    let mut decoders: Vec<DecoderWrapper> = vec![replace.into(), ByteFallback::new().into(), Fuse::new().into()];
    if strip_prefix {
        decoders.push(Strip::new(' ', 1, 0).into());
    }
    Ok(DecoderSequence::new(decoders))
}

/// `phi3_tokenizer`: the prefix space comes from a normalizer and there is no pre-tokenizer.
fn phi3_tokenizer(spec: &TokenizerSpec) -> Result<Backend> {
    let mut tokenizer = sentencepiece_tokenizer(spec)?;
    let replace = Replace::new(" ", "\u{2581}").map_err(|e| build_err("normalizer", e))?;
    let normalizer = NormalizerSequence::new(vec![Prepend::new("\u{2581}".into()).into(), replace.into()]);
    tokenizer.with_normalizer(Some(normalizer));
    tokenizer.with_pre_tokenizer(None::<Metaspace>);
    Ok(tokenizer)
}

/// Python's `str.isspace` for one character: Unicode White_Space plus the four ASCII
/// information separators U+001C..U+001F, which Python also counts.
fn py_isspace(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// `gemma_tokenizer` + `GemmaTokenizer.__init__`: SentencePiece BPE with two fixes Gemma files
/// need. A token of two or more spaces is stored with real spaces and respelled with one `▁`
/// per character (HF: `"▁" * len(t) if " " in t and not t.strip()`), and the merges are derived
/// from the vocabulary ranked by file position (score `-index`), not by the file's scores.
/// Then Gemma's pipeline: spaces replaced by `▁` in a normalizer, no prefix space, a split
/// on " " merged with the previous piece, byte fallback, and `<unk>` as the model's unknown.
fn gemma_tokenizer(spec: &TokenizerSpec) -> Result<Backend> {
    let respelled: Vec<Cow<'_, str>> = spec
        .tokens
        .iter()
        .map(|t| {
            if t.contains(' ') && t.chars().all(py_isspace) {
                Cow::Owned("\u{2581}".repeat(t.chars().count()))
            } else {
                Cow::Borrowed(t.as_str())
            }
        })
        .collect();
    // Positions as scores: exact in f32 below 2^24 entries (Vocab sizes are far smaller).
    let positions: Vec<f32> = (0..respelled.len()).map(|i| -(i as f32)).collect();
    let bpe = sentencepiece_bpe(spec, &respelled, Some(&positions), Some("<unk>"))?;
    let mut tokenizer = Backend::new(bpe);
    let split = Split::new(SplitPattern::String(" ".into()), SplitDelimiterBehavior::MergedWithPrevious, false)
        .map_err(|e| build_err("split pre-tokenizer", e))?;
    tokenizer.with_pre_tokenizer(Some(split));
    tokenizer.with_decoder(Some(sentencepiece_decoder(false)?));
    tokenizer.with_normalizer(Some(Replace::new(" ", "\u{2581}").map_err(|e| build_err("normalizer", e))?));
    // GemmaTokenizer's defaults, in SPECIAL_TOKENS_ATTRIBUTES order (bos, eos, unk, pad, mask).
    let defaults = ["<bos>", "<eos>", "<unk>", "<pad>", "<mask>"].map(String::from);
    add_missing_specials(&mut tokenizer, &defaults.iter().collect::<Vec<_>>());
    Ok(tokenizer)
}

/// The scores `get_merges(tokenizer_dict, vocab_scores)` ranks derived merges by: the
/// class's `vocab_scores`, else the file's.
fn scores_to_rank<'s>(spec: &'s TokenizerSpec, vocab_scores: Option<&'s [f32]>) -> Result<&'s [f32]> {
    vocab_scores.or(spec.scores.as_deref()).ok_or_else(|| {
        invalid("tokenizer.ggml.scores", "needed to derive merges: the file has neither merges nor scores")
    })
}

/// `add_gguf_special_tokens`: CONTROL tokens become special added tokens (in a byte-level vocab
/// only those spelled in the byte alphabet: others are llama.cpp mislabels); USER_DEFINED tokens
/// present in the vocabulary become plain added tokens.
fn add_gguf_special_tokens(tokenizer: &mut Backend, spec: &TokenizerSpec) {
    let byte_level = spec.model == "gpt2";
    let alphabet: HashSet<char> = bytes_to_unicode().iter().copied().collect();
    let control: Vec<AddedToken> = spec
        .tokens
        .iter()
        .enumerate()
        .filter(|(id, token)| {
            spec.token_type(*id) == token_type::CONTROL && (!byte_level || token.chars().all(|c| alphabet.contains(&c)))
        })
        .map(|(_, token)| AddedToken::from(token.clone(), true).normalized(false))
        .collect();
    if !control.is_empty() {
        tokenizer.add_special_tokens(&control);
    }
    let user: Vec<AddedToken> = spec
        .tokens
        .iter()
        .enumerate()
        .filter(|(id, token)| {
            spec.token_type(*id) == token_type::USER_DEFINED && tokenizer.token_to_id(token).is_some()
        })
        .map(|(_, token)| AddedToken::from(token.clone(), false).normalized(false))
        .collect();
    if !user.is_empty() {
        tokenizer.add_tokens(&user);
    }
}

/// The split regexes of `GGUF_PRE_TOKENIZER_SPLITS`, keyed by `tokenizer.ggml.pre`.
const LLAMA3_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const TEKKEN_SPLIT: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const GPT4O_SPLIT: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN2_SPLIT: &str =
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN35_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// One `tokenizer.ggml.pre` name per split regex loupe applies (the name llama.cpp's
/// converter writes for it), with the regex: what a converter from `tokenizer.json` looks a
/// `Split` pre-tokenizer's pattern up in.
pub const GGUF_PRE_SPLITS: [(&str, &str); 5] = [
    ("llama-bpe", LLAMA3_SPLIT),
    ("qwen2", QWEN2_SPLIT),
    ("tekken", TEKKEN_SPLIT),
    ("gpt-4o", GPT4O_SPLIT),
    ("qwen35", QWEN35_SPLIT),
];

fn split_regex_for(pre: &str) -> Option<&'static str> {
    Some(match pre {
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral" | "midm-2.0" | "lfm2"
        | "jina-v5-nano" | "dbrx" | "smaug-bpe" => LLAMA3_SPLIT,
        "tekken" => TEKKEN_SPLIT,
        "qwen2" | "deepseek-r1-qwen" | "kormo" | "f2llmv2" | "megrez" => QWEN2_SPLIT,
        "qwen35" => QWEN35_SPLIT,
        "gpt-4o" | "llama4" | "kanana2" | "talkie" | "minimax-m2" => GPT4O_SPLIT,
        // Everything else ("smollm", "default", "gpt2", ...) keeps the class's pre-tokenizer:
        // for "gpt2" files that is ByteLevel with GPT-2's own regex.
        _ => return None,
    })
}

/// `set_split_regex`: the listed `pre` values split with their regex, then map to bytes.
fn set_split_regex(tokenizer: &mut Backend, spec: &TokenizerSpec) -> Result<()> {
    let Some(regex) = spec.pre.as_deref().and_then(split_regex_for) else {
        return Ok(());
    };
    let split = Split::new(SplitPattern::Regex(regex.to_owned()), SplitDelimiterBehavior::Isolated, false)
        .map_err(|e| build_err("split pre-tokenizer", e))?;
    let seq = PreTokenizerSequence::new(vec![split.into(), ByteLevel::new(false, true, false).into()]);
    tokenizer.with_pre_tokenizer(Some(seq));
    Ok(())
}

/// Adds each token as a special added token unless an added token with that content exists
/// (TokenizersBackend compares by content), in one call so the matcher is rebuilt once.
pub(crate) fn add_missing_specials(tokenizer: &mut Backend, tokens: &[&String]) {
    let existing: HashSet<String> = tokenizer.get_added_tokens_decoder().into_values().map(|t| t.content).collect();
    let mut seen = HashSet::new();
    let new: Vec<AddedToken> = tokens
        .iter()
        .filter(|t| !existing.contains(t.as_str()) && seen.insert(t.as_str()))
        .map(|t| AddedToken::from((*t).clone(), true))
        .collect();
    if !new.is_empty() {
        tokenizer.add_tokens(&new);
    }
}

/// `update_post_processor`: `[bos] $A [eos]` per the flags.
pub(crate) fn bos_eos_post_processor(
    tokenizer: &Backend,
    bos: Option<&str>,
    eos: Option<&str>,
    add_bos: bool,
    add_eos: bool,
) -> Result<TemplateProcessing> {
    let mut single = Vec::new();
    let mut pair = Vec::new();
    let mut specials: Vec<(String, u32)> = Vec::new();
    let mut special = |token: Option<&str>, field: &'static str| -> Result<String> {
        let token = token.ok_or_else(|| invalid(field, "flag set but no such token"))?;
        let id = tokenizer
            .token_to_id(token)
            .ok_or_else(|| invalid(field, format!("{token:?} is not in the vocabulary")))?;
        if !specials.iter().any(|(t, _)| t == token) {
            specials.push((token.to_owned(), id));
        }
        Ok(token.to_owned())
    };
    let bos = if add_bos { Some(special(bos, "add_bos_token")?) } else { None };
    let eos = if add_eos { Some(special(eos, "add_eos_token")?) } else { None };
    for (seq, type_id) in [("A", 0), ("B", 1)] {
        let out = if type_id == 0 { &mut single } else { &mut pair };
        if let Some(b) = &bos {
            out.push(format!("{b}:{type_id}"));
        }
        out.push(format!("${seq}:{type_id}"));
        if let Some(e) = &eos {
            out.push(format!("{e}:{type_id}"));
        }
    }
    let pair = [single.clone(), pair].concat();
    TemplateProcessing::builder()
        .try_single(single)
        .and_then(|b| b.try_pair(pair))
        .map_err(|e| TextError::Build { component: "post-processor", message: e.to_string() })?
        .special_tokens(specials)
        .build()
        .map_err(|e| TextError::Build { component: "post-processor", message: e.to_string() })
}

fn build_err(component: &'static str, e: impl std::fmt::Display) -> TextError {
    TextError::Build { component, message: e.to_string() }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn byte_table_matches_gpt2() {
        let t = bytes_to_unicode();
        assert_eq!(t[b'!' as usize], '!');
        assert_eq!(t[b' ' as usize], '\u{0120}'); // "Ġ"
        assert_eq!(t[b'\n' as usize], '\u{010A}'); // "Ċ"
        assert_eq!(t[0], '\u{0100}');
        assert_eq!(t[0xAD], '\u{0143}');
        let distinct: HashSet<char> = t.iter().copied().collect();
        assert_eq!(distinct.len(), 256);
    }

    /// The direct transcription of transformers' `generate_merges`: every split of every token into two
    /// tokens of the vocabulary, best score first. Python dict semantics are kept: a duplicate token
    /// keeps its first position in iteration but its last id and score.
    fn generate_merges_reference(tokens: &[String], scores: &[f32]) -> Vec<(String, String)> {
        let mut id_of: HashMap<&str, usize> = HashMap::with_capacity(tokens.len());
        let mut score_of: HashMap<&str, f32> = HashMap::with_capacity(tokens.len());
        let mut order: Vec<&str> = Vec::with_capacity(tokens.len());
        for (id, token) in tokens.iter().enumerate() {
            if id_of.insert(token, id).is_none() {
                order.push(token);
            }
            score_of.insert(token, scores[id]);
        }
        // (left, right, score); Python slices by code point, so split at char boundaries.
        let mut merges: Vec<(&str, &str, f32)> = Vec::new();
        for &piece in &order {
            let score = score_of[piece];
            let mut local: Vec<(&str, &str, f32)> = piece
                .char_indices()
                .skip(1)
                .map(|(at, _)| piece.split_at(at))
                .filter(|(l, r)| id_of.contains_key(l) && id_of.contains_key(r))
                .map(|(l, r)| (l, r, score))
                .collect();
            local.sort_by_key(|(l, r, _)| (id_of[l], id_of[r]));
            merges.extend(local);
        }
        // sorted(key=(score, len(l), len(r)), reverse=True) is stable: ties keep their order.
        merges.sort_by(|a, b| {
            let key = |m: &(&str, &str, f32)| (m.0.chars().count(), m.1.chars().count());
            b.2.total_cmp(&a.2).then_with(|| key(b).cmp(&key(a)))
        });
        merges.into_iter().map(|(l, r, _)| (l.to_owned(), r.to_owned())).collect()
    }

    /// The fast derivation against the direct transcription, on random vocabularies with
    /// duplicates, multi-byte characters and tied scores.
    #[test]
    fn derived_merges_match_the_direct_transcription() {
        let alphabet = ["a", "b", "\u{2581}", "é", "字", "c"];
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut next = |n: usize| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state % n as u64) as usize
        };
        for round in 0..20 {
            let tokens: Vec<String> =
                (0..300).map(|_| (0..1 + next(5)).map(|_| alphabet[next(alphabet.len())]).collect()).collect();
            let scores: Vec<f32> =
                (0..tokens.len()).map(|i| if round % 2 == 0 { -(i as f32) } else { -((next(4)) as f32) }).collect();
            assert_eq!(generate_merges(&tokens, &scores), generate_merges_reference(&tokens, &scores), "round {round}");
        }
    }

    #[test]
    fn merges_follow_scores_then_lengths() {
        let tokens: Vec<String> = ["a", "b", "c", "ab", "bc", "abc"].iter().map(|s| s.to_string()).collect();
        let scores = [0.0, 0.0, 0.0, -1.0, -2.0, -0.5];
        let merges = generate_merges(&tokens, &scores);
        // "abc" (-0.5) splits as a|bc and ab|c; lengths (1,2) < (2,1) reversed puts ab|c first.
        assert_eq!(
            merges,
            vec![
                ("ab".into(), "c".into()),
                ("a".into(), "bc".into()),
                ("a".into(), "b".into()),
                ("b".into(), "c".into())
            ]
        );
    }

    #[test]
    fn bad_merge_is_an_error() {
        let spec = TokenizerSpec {
            model: "gpt2".into(),
            tokens: vec!["a".into(), "b".into(), "ab".into()],
            merges: vec!["a b c".into()],
            ..Default::default()
        };
        let err = build(&spec).err().expect("must fail");
        assert!(err.to_string().contains("merge 0"), "{err}");
        let spec = TokenizerSpec { model: "wordpiece".into(), tokens: vec!["a".into()], ..Default::default() };
        assert!(matches!(build(&spec), Err(TextError::Unsupported { .. })));
        let spec = TokenizerSpec { model: "llama".into(), tokens: vec!["a".into()], ..Default::default() };
        let err = build(&spec).err().expect("no scores, no merges");
        assert!(err.to_string().contains("scores"), "{err}");
    }
}
