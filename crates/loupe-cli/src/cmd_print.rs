//! `loupe print FILE...`: stored tensors printed as MAX prints them (COMPACT or FULL, byte
//! for byte MAX 26.7's stdout; loupe_parity::print), so `diff` works against MAX's own output.
//!
//! Any input `loupe compare` reads: `.max`, `.npy`, `.npz`, `.pt` (read without running
//! pickle code), `.safetensors`, `.gguf` (dequantized, printed as f32), a dump directory or a
//! directory of tensor files, in the source's order. Each tensor prints in its own element
//! type (`dtype=bf16`, `si8`, ...). A `.max` file is labelled by the key inside it (MAX's
//! sanitized label), other tensors by their name in the source. `--only REGEX` picks tensors
//! by name (one tensor of a safetensors checkpoint, one layer of a dump). A dump's steps follow
//! one another with no header line, as MAX prints none.

use std::io::Write;
use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, ValueEnum};
use loupe_parity::print::{compact_of, full_of, max_dtype_name, PrintData, Printable, Values};
use loupe_parity::regex::Regex;
use loupe_parity::source::Loaded;
use loupe_parity::TensorSource;

use crate::UsageError;

/// Most digits FULL takes (MAX's own precision is a small integer; C's `%e` allows more).
const MAX_DIGITS: usize = 40;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Style {
    /// MAX's COMPACT: 4 decimals, long runs elided.
    Compact,
    /// MAX's FULL: every element, `%.{digits}e`.
    Full,
}

#[derive(Args, Debug, Clone)]
pub struct PrintArgs {
    /// Tensor files (.max .npy .npz .pt .safetensors .gguf) or dump directories.
    #[arg(required = true, value_name = "FILE")]
    pub files: Vec<PathBuf>,
    /// compact (MAX's default) or full.
    #[arg(long, value_enum, default_value = "compact")]
    pub style: Style,
    /// Digits after the point in FULL style (MAX's `precision`).
    #[arg(long, default_value_t = 6, value_name = "N")]
    pub digits: usize,
    /// Print only the tensors whose name matches this regex.
    #[arg(long, value_name = "REGEX")]
    pub only: Option<String>,
}

pub fn run(args: PrintArgs) -> anyhow::Result<()> {
    if args.digits > MAX_DIGITS {
        return Err(UsageError(format!("--digits {}: at most {MAX_DIGITS}", args.digits)).into());
    }
    if args.digits != 6 && args.style == Style::Compact {
        return Err(UsageError("--digits applies to --style full (COMPACT always shows 4 decimals)".into()).into());
    }
    let only = match &args.only {
        Some(re) => Some(Regex::new(re).map_err(|e| UsageError(format!("--only '{re}': {e}")))?),
        None => None,
    };
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    for path in &args.files {
        let src = TensorSource::open(path)?;
        for (i, e) in src.entries.iter().enumerate() {
            if only.as_ref().is_some_and(|re| !re.is_match(&e.name)) {
                continue;
            }
            let (dtype, shape, values) = match src.load_stored(i)? {
                Loaded::Stored(t) => {
                    let values = Values::of(&t).with_context(|| format!("{}: {}", path.display(), e.name))?;
                    (max_dtype_name(t.dtype), t.shape, values)
                }
                Loaded::F32(t) => ("f32", t.shape, Values::F32(t.data)),
            };
            let data: PrintData<'_> = values.data();
            let t = Printable { dtype, shape: &shape, data };
            let line = match args.style {
                Style::Compact => compact_of(&e.name, &t),
                Style::Full => full_of(&e.name, &t, args.digits),
            };
            if writeln!(out, "{line}").is_err() {
                // A closed pipe (`loupe print ... | head`) ends the listing quietly.
                return Ok(());
            }
        }
    }
    let _ = out.flush();
    Ok(())
}
