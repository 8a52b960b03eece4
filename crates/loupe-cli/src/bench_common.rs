//! What `loupe bench` and its batched mode (`bench_batch`) share: the flags, the seeded token
//! ids, the checkpoint's size, peak RSS and llama-bench's table. A leaf: both bench modules
//! read it, it reads neither (so `cmd_bench`, which hands `--batch` to `bench_batch`, and
//! `bench_batch` do not import each other).

use std::io::Write;
use std::path::Path;

use clap::Args;
use loupe_models::{Model, ModelFormat};

use crate::args::ModelArgs;

/// Seed of the benchmark token ids: fixed, so every run feeds the same sequence.
pub(crate) const TOKEN_SEED: u64 = 0x6c6f_7570_655f_6265; // "loupe_be"

#[derive(Args, Debug)]
#[command(after_help = "Like llama-bench: pp<N> is one forward pass over N tokens (BOS, then seeded random ids) \
from an empty cache; tg<N> is N single-token decode steps from an empty cache, each feeding a random id (no \
sampling). Before the timed repetitions, each warm-up runs one full pp pass and one decode step. t/s is \
the mean ± sample standard deviation over the repetitions. Peak RSS is the process's high-water mark \
(VmHWM), model load included.")]
pub struct BenchArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Prompt tokens of the prefill test (0 skips it).
    #[arg(long = "n-prompt", short = 'p', default_value_t = 512)]
    pub n_prompt: usize,
    /// Decode steps of the generation test (0 skips it).
    #[arg(long = "n-gen", short = 'n', default_value_t = 128)]
    pub n_gen: usize,
    /// Timed repetitions of each test.
    #[arg(long, short = 'r', default_value_t = 5)]
    pub repetitions: usize,
    /// Untimed warm-up runs before the repetitions (0 for none).
    #[arg(long, default_value_t = 1)]
    pub warmup: usize,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Batched mode, like llama.cpp's llama-batched-bench `-npl`: for each count of
    /// concurrent sequences (e.g. 1,4,8,16,32), prefill that many prompts of --n-prompt
    /// tokens in one engine step, then --n-gen decode steps of one token per sequence.
    #[arg(long, value_parser = crate::args::parse_counts)]
    pub batch: Option<crate::args::Counts>,
    /// Skip measuring the machine's read bandwidth after the decode test (the ceiling
    /// decode's GB/s is reported against; ~1-2 s and a 1 GiB buffer, after peak RSS is
    /// taken).
    #[arg(long)]
    pub no_ceiling: bool,
    #[command(flatten)]
    pub engine: crate::args::BatchEngineArgs,
    #[command(flatten)]
    pub prefill: crate::args::PrefillArgs,
    /// With a grammar (--json-schema, --regex, ...): two more decode tests, alternated run
    /// by run, greedy decoding without and with the grammar's masks, and their ratio (what
    /// constrained decoding costs at batch 1).
    #[command(flatten)]
    pub grammar: crate::cmd_generate::GrammarArgs,
    #[command(flatten)]
    pub profile: crate::args::ProfileArgs,
}

/// Tensor bytes and parameter count of the checkpoint (what llama-bench calls size and params).
pub(crate) struct ModelSize {
    pub(crate) bytes: u64,
    pub(crate) params: u64,
}

pub(crate) fn bench_tokens(n: usize, bos: Option<u32>, vocab: usize, seed: u64) -> Vec<u32> {
    let mut rng = loupe_core::SplitMix64(seed);
    let mut next = || rng.next_u64();
    (0..n)
        .map(|i| match (i, bos) {
            (0, Some(b)) => b,
            _ => (next() % vocab as u64) as u32,
        })
        .collect()
}

/// Size and parameters of the tensors in the file, as stored (GGUF only; `None` otherwise).
pub(crate) fn model_size(model: &Model) -> Option<ModelSize> {
    match model.format {
        ModelFormat::Gguf => gguf_size(&model.path),
        ModelFormat::HfDir(_) => None,
    }
}

fn gguf_size(path: &Path) -> Option<ModelSize> {
    let g = loupe_formats::GgufFile::open(path).ok()?;
    Some(ModelSize {
        bytes: g.tensors.iter().map(|t| t.size_bytes).sum(),
        params: g.tensors.iter().map(|t| t.n_elements()).sum(),
    })
}

/// The process's peak resident set (`VmHWM` in /proc/self/status), in bytes; `None` where
/// /proc is not available.
pub(crate) fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.trim_start_matches("VmHWM:").trim().trim_end_matches("kB").trim().parse().ok()?;
    Some(kib * 1024)
}

/// A Markdown table with padded columns, as llama-bench prints.
pub(crate) fn write_table<const N: usize>(
    out: &mut impl Write,
    header: &[&str; N],
    rows: &[[String; N]],
    right_aligned: &[usize],
) -> std::io::Result<()> {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    // Numbers align right, text left, as in llama-bench's table.
    let right = |col: usize| right_aligned.contains(&col);
    let line = |cells: Vec<String>| -> String {
        let padded: Vec<String> = cells
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let pad = widths[i] - c.chars().count();
                if right(i) {
                    format!("{}{c}", " ".repeat(pad))
                } else {
                    format!("{c}{}", " ".repeat(pad))
                }
            })
            .collect();
        format!("| {} |", padded.join(" | "))
    };
    writeln!(out, "{}", line(header.iter().map(|h| h.to_string()).collect()))?;
    let rule: Vec<String> = widths
        .iter()
        .enumerate()
        .map(|(i, w)| if right(i) { format!("{}:", "-".repeat(w + 1)) } else { "-".repeat(w + 2) })
        .collect();
    writeln!(out, "|{}|", rule.join("|"))?;
    for row in rows {
        writeln!(out, "{}", line(row.to_vec()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_start_with_bos_and_stay_in_vocab() {
        let t = bench_tokens(1000, Some(1), 49152, TOKEN_SEED);
        assert_eq!(t[0], 1);
        assert!(t.iter().all(|&id| id < 49152));
        assert_eq!(t, bench_tokens(1000, Some(1), 49152, TOKEN_SEED), "deterministic");
        let no_bos = bench_tokens(3, None, 10, TOKEN_SEED);
        assert!(no_bos.iter().all(|&id| id < 10));
    }
}
