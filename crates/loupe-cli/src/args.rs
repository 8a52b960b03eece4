//! Arguments that several commands share. A flag means one thing in every command:
//! `--model` a GGUF file or checkpoint directory, `--precision` the weight precision,
//! `--threads` compute threads, `--layers` the decoder layers to keep.

use std::path::PathBuf;

use clap::{Args, ValueEnum};
use loupe_models::Precision;

use crate::UsageError;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum PrecisionArg {
    /// Dequantize weights at load and compute in f32 (closest to PyTorch).
    F32,
    /// Keep GGML blocks in memory; dequantize in registers against f32 activations (fast).
    Native,
    /// Keep GGML blocks and quantize activations to 8-bit blocks, as llama.cpp does.
    Q8,
}

impl From<PrecisionArg> for Precision {
    fn from(p: PrecisionArg) -> Precision {
        match p {
            PrecisionArg::F32 => Precision::F32,
            PrecisionArg::Native => Precision::Native,
            PrecisionArg::Q8 => Precision::Q8,
        }
    }
}

/// The name a precision is shown and written with (`f32`, `native`, `q8`).
pub fn precision_name(p: Precision) -> &'static str {
    match p {
        Precision::F32 => "f32",
        Precision::Native => "native",
        Precision::Q8 => "q8",
    }
}

/// The model flags of every command that loads a model.
#[derive(Args, Debug, Clone, Default)]
pub struct ModelArgs {
    /// GGUF file or Hugging Face checkpoint directory [default: the cached SmolLM2-135M-Instruct Q4_1, fetched on first use]
    #[arg(long, short = 'm')]
    pub model: Option<PathBuf>,
    /// Weight precision [default: native; f32, the parity baseline, for dump and parity]
    #[arg(long, value_enum, alias = "mode")]
    pub precision: Option<PrecisionArg>,
    /// Compute threads [default: all cores]
    #[arg(long, short = 't')]
    pub threads: Option<usize>,
}

impl ModelArgs {
    /// `--precision`, or the command's default.
    pub fn precision_or(&self, default: PrecisionArg) -> Precision {
        self.precision.unwrap_or(default).into()
    }
}

/// The prompt flags of `loupe dump` and `loupe parity`.
#[derive(Args, Debug, Clone)]
pub struct PromptArgs {
    /// The prompt (the user message with --chat).
    #[arg(long)]
    pub prompt: String,
    /// Wrap the prompt in the model's chat template.
    #[arg(long)]
    pub chat: bool,
    /// A system message for the chat template (implies --chat).
    #[arg(long)]
    pub system: Option<String>,
}

impl PromptArgs {
    pub fn prompt(&self) -> loupe_runtime::Prompt<'_> {
        loupe_runtime::Prompt { text: &self.prompt, chat: self.chat, system: self.system.as_deref() }
    }
}

/// `--layers N|all`: `None` keeps every layer.
pub fn parse_layers(s: &str) -> anyhow::Result<Option<usize>> {
    if s == "all" {
        return Ok(None);
    }
    match s.parse::<usize>() {
        Ok(n) if n > 0 => Ok(Some(n)),
        _ => Err(UsageError(format!("--layers must be a positive number or 'all', got '{s}'")).into()),
    }
}

/// A comma-separated list of token ids (`--teacher-force 12,7,99`).
pub fn parse_ids(flag: &str, s: &str) -> anyhow::Result<Vec<u32>> {
    s.split(',')
        .filter(|t| !t.trim().is_empty())
        .map(|t| t.trim().parse::<u32>().map_err(|_| UsageError(format!("{flag}: '{t}' is not a token id")).into()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layers_and_ids() {
        assert_eq!(parse_layers("all").unwrap(), None);
        assert_eq!(parse_layers("3").unwrap(), Some(3));
        for bad in ["0", "-1", "x", ""] {
            assert!(parse_layers(bad).unwrap_err().to_string().contains("--layers"), "{bad}");
        }
        assert_eq!(parse_ids("--teacher-force", " 1, 2,,3 ").unwrap(), vec![1, 2, 3]);
        assert!(parse_ids("--teacher-force", "1,x").unwrap_err().to_string().contains("'x'"));
    }

    #[test]
    fn precision_defaults_per_command() {
        let a = ModelArgs::default();
        assert_eq!(a.precision_or(PrecisionArg::F32), Precision::F32);
        let a = ModelArgs { precision: Some(PrecisionArg::Q8), ..ModelArgs::default() };
        assert_eq!(a.precision_or(PrecisionArg::Native), Precision::Q8);
    }
}
