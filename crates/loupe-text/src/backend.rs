//! [`Backend`]: the `tokenizers` pipeline (added tokens, normalizer, pre-tokenizer,
//! post-processor, decoder) around a [`TokenModel`], which is either one of `tokenizers`' own
//! models or loupe's [`CompactBpe`], which GGUF vocabularies get (Gemma's and Llama 2's merges
//! derived from scores, SmolLM2's and Qwen's listed).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use tokenizers::models::bpe::BPE;
use tokenizers::models::{ModelWrapper, TrainerWrapper};
use tokenizers::{DecoderWrapper, Model, NormalizerWrapper, PostProcessorWrapper, PreTokenizerWrapper, Token};

use crate::compact_bpe::CompactBpe;

/// The tokenizer pipeline loupe runs: `tokenizers::Tokenizer` with [`TokenModel`] as its model.
pub type Backend =
    tokenizers::TokenizerImpl<TokenModel, NormalizerWrapper, PreTokenizerWrapper, PostProcessorWrapper, DecoderWrapper>;

/// The model step of a [`Backend`]. One per tokenizer, so the size gap between the variants
/// (`tokenizers`' models are large structs, [`CompactBpe`] an `Arc`) costs nothing worth a box.
#[derive(Clone, Debug)]
#[allow(clippy::large_enum_variant)]
pub enum TokenModel {
    /// One of `tokenizers`' models (from a tokenizer.json, or a GGUF with its merges).
    Hf(ModelWrapper),
    /// The vocabulary held once, merges looked up (derived from scores, or the file's).
    Compact(CompactBpe),
}

impl From<ModelWrapper> for TokenModel {
    fn from(model: ModelWrapper) -> Self {
        Self::Hf(model)
    }
}

impl From<BPE> for TokenModel {
    fn from(model: BPE) -> Self {
        Self::Hf(model.into())
    }
}

impl From<CompactBpe> for TokenModel {
    fn from(model: CompactBpe) -> Self {
        Self::Compact(model)
    }
}

impl TokenModel {
    /// The `tokenizers` model this one stands for, merges spelled out (what tokenizer.json
    /// holds): for saving and for the tests, not for encoding.
    pub fn to_hf(&self) -> tokenizers::Result<ModelWrapper> {
        match self {
            Self::Hf(model) => Ok(model.clone()),
            Self::Compact(bpe) => Ok(bpe.to_hf()?.into()),
        }
    }
}

impl Model for TokenModel {
    type Trainer = TrainerWrapper;

    fn tokenize(&self, sequence: &str) -> tokenizers::Result<Vec<Token>> {
        match self {
            Self::Hf(model) => model.tokenize(sequence),
            Self::Compact(bpe) => Ok(bpe
                .tokenize(sequence)?
                .into_iter()
                .map(|(id, offsets)| Token::new(id, bpe.spelling(id).to_owned(), offsets))
                .collect()),
        }
    }

    fn token_to_id(&self, token: &str) -> Option<u32> {
        match self {
            Self::Hf(model) => model.token_to_id(token),
            Self::Compact(bpe) => bpe.token_to_id(token),
        }
    }

    fn id_to_token(&self, id: u32) -> Option<String> {
        match self {
            Self::Hf(model) => model.id_to_token(id),
            Self::Compact(bpe) => bpe.id_to_token(id).map(str::to_owned),
        }
    }

    fn get_vocab(&self) -> HashMap<String, u32> {
        match self {
            Self::Hf(model) => model.get_vocab(),
            Self::Compact(bpe) => bpe.get_vocab(),
        }
    }

    fn get_vocab_size(&self) -> usize {
        match self {
            Self::Hf(model) => model.get_vocab_size(),
            Self::Compact(bpe) => bpe.vocab_size(),
        }
    }

    fn save(&self, folder: &Path, prefix: Option<&str>) -> tokenizers::Result<Vec<PathBuf>> {
        self.to_hf()?.save(folder, prefix)
    }

    fn get_trainer(&self) -> TrainerWrapper {
        match self {
            Self::Hf(model) => model.get_trainer(),
            Self::Compact(_) => tokenizers::models::bpe::BpeTrainer::default().into(),
        }
    }
}

/// Serialized as the `tokenizers` model it stands for, so a saved tokenizer.json loads
/// anywhere.
impl Serialize for TokenModel {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Self::Hf(model) => model.serialize(serializer),
            Self::Compact(_) => self.to_hf().map_err(serde::ser::Error::custom)?.serialize(serializer),
        }
    }
}

impl<'de> Deserialize<'de> for TokenModel {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        ModelWrapper::deserialize(deserializer).map(Self::Hf)
    }
}
