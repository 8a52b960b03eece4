//! Arguments that several commands share. A flag means one thing in every command:
//! `--model` a GGUF file or checkpoint directory, `--precision` the weight precision,
//! `--threads` compute threads, `--layers` the decoder layers to keep, `--kv-dtype` the KV
//! cache's element type (single sequences and the batched engine alike).

use std::path::PathBuf;

use clap::{Args, ValueEnum};
use loupe_graph::KvDtype;
use loupe_models::Precision;

use crate::UsageError;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum PrecisionArg {
    /// Dequantize weights at load and compute in f32 (closest to PyTorch).
    F32,
    /// Keep GGML blocks in memory; dequantize in registers against f32 activations (16-bit
    /// blocks): the exact-arithmetic mode, 100% teacher-forced agreement with f32.
    Native,
    /// Keep GGML blocks and quantize activations to 8-bit blocks, as llama.cpp does.
    Q8,
    /// FP8 E4M3 weights (per output row) and activations (per token) in the decoder layers,
    /// guarded scales, f32 accumulation: FP8 W8A8 numerics, emulated (speed of f32).
    Fp8,
    /// The default of generate, bench, serve: blocks kept; 8-bit activation blocks for Q4_K/Q5_K
    /// weights (and, on AVX-512 CPUs, for the prompt rows of Q6_K ones and, without AMX, the
    /// decode rows of Q5_0 ones), native arithmetic
    /// for the rest (>= 99% teacher-forced agreement with f32 on every model's goldens).
    Auto,
}

impl From<PrecisionArg> for Precision {
    fn from(p: PrecisionArg) -> Precision {
        match p {
            PrecisionArg::F32 => Precision::F32,
            PrecisionArg::Native => Precision::Native,
            PrecisionArg::Q8 => Precision::Q8,
            PrecisionArg::Fp8 => Precision::Fp8,
            PrecisionArg::Auto => Precision::Auto,
        }
    }
}

/// The name a precision is shown and written with (`f32`, `native`, `q8`, `fp8`, `auto`).
pub fn precision_name(p: Precision) -> &'static str {
    p.name()
}

/// The model flags of every command that loads a model.
#[derive(Args, Debug, Clone, Default)]
pub struct ModelArgs {
    /// GGUF file or Hugging Face checkpoint directory [default: the cached SmolLM2-135M-Instruct Q4_1, fetched on first use]
    #[arg(long, short = 'm')]
    pub model: Option<PathBuf>,
    /// Weight precision [default: auto; f32, the parity baseline, for dump, parity and bisect]
    #[arg(long, value_enum, alias = "mode")]
    pub precision: Option<PrecisionArg>,
    /// Compute threads [default: all cores]
    #[arg(long, short = 't')]
    pub threads: Option<usize>,
    /// KV cache element type: f16, f32 or fp8_e4m3 (a scale per 32 elements) [default: f16
    /// for quantized weights, f32 at --precision f32]
    #[arg(long, value_parser = parse_kv_dtype)]
    pub kv_dtype: Option<KvDtype>,
    /// Where a GGUF's weights live: mapped (read in place from the file's memory map, in the
    /// page cache: nothing copied, loads in the time it takes to map the pages), copied (into
    /// huge pages of loupe's own), or auto: mapped when the mapping gets 2 MiB pages or huge
    /// pages are off, copied otherwise. See README.md (`loupe bench`)
    #[arg(long, value_enum, default_value_t = WeightsArg::Auto)]
    pub weights: WeightsArg,
}

/// `--weights`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum WeightsArg {
    #[default]
    Auto,
    Mapped,
    Copied,
}

impl From<WeightsArg> for loupe_models::WeightPlacement {
    fn from(w: WeightsArg) -> Self {
        match w {
            WeightsArg::Auto => loupe_models::WeightPlacement::Auto,
            WeightsArg::Mapped => loupe_models::WeightPlacement::Mapped,
            WeightsArg::Copied => loupe_models::WeightPlacement::Copied,
        }
    }
}

fn parse_kv_dtype(s: &str) -> Result<KvDtype, String> {
    s.parse()
}

impl ModelArgs {
    /// `--precision`, or the command's default.
    pub fn precision_or(&self, default: PrecisionArg) -> Precision {
        self.precision.unwrap_or(default).into()
    }

    /// These flags as `loupe serve` takes them: the one rule for a command that starts its own
    /// server (bisect's served rung, bench-serve). Every flag given is forwarded, none is
    /// added, so the child loads what this command would load.
    pub fn serve_flags(&self) -> Vec<std::ffi::OsString> {
        let mut flags: Vec<std::ffi::OsString> = Vec::new();
        if let Some(m) = &self.model {
            flags.extend(["--model".into(), m.clone().into_os_string()]);
        }
        if let Some(p) = self.precision {
            flags.extend(["--precision".into(), precision_name(p.into()).into()]);
        }
        if let Some(t) = self.threads {
            flags.extend(["--threads".into(), t.to_string().into()]);
        }
        if let Some(d) = self.kv_dtype {
            flags.extend(["--kv-dtype".into(), d.name().into()]);
        }
        if self.weights != WeightsArg::Auto {
            let name = clap::ValueEnum::to_possible_value(&self.weights).map(|v| v.get_name().to_string());
            flags.extend(["--weights".into(), name.unwrap_or_default().into()]);
        }
        flags
    }
}

/// The batched engine's flags (`loupe bench --batch`, and the server).
#[derive(Args, Debug, Clone)]
pub struct BatchEngineArgs {
    /// KV cache budget in MiB [default: a quarter of the machine's memory, at most what
    /// --max-seqs full contexts need]
    #[arg(long)]
    pub kv_cache_mb: Option<usize>,
    /// Positions per KV cache block
    #[arg(long, default_value_t = 16)]
    pub block_size: usize,
    /// Tokens per engine step (decode tokens plus prefill chunks)
    #[arg(long, default_value_t = 2048)]
    pub max_batch_tokens: usize,
    /// Turn the prefix cache off
    #[arg(long)]
    pub no_prefix_cache: bool,
    #[command(flatten)]
    pub speculation: SpeculationArgs,
}

/// Speculative decoding's flags (the batched engine's; `loupe generate` takes them too).
#[derive(Args, Debug, Clone, Default)]
pub struct SpeculationArgs {
    /// Speculative decoding: ngram (prompt lookup: draft the tokens that followed an earlier
    /// occurrence of the last 2-4 tokens, in the prompt or the output), draft (a smaller
    /// model with the same tokenizer, --draft-model, drafts greedily), or off. One step
    /// verifies the drafts; greedy output is identical bit for bit, sampled output has the
    /// same distribution
    #[arg(long, value_enum, default_value_t = SpeculateArg::Off)]
    pub speculate: SpeculateArg,
    /// With --speculate draft: the draft model, a GGUF file or checkpoint directory with the
    /// target's tokenizer (loaded with the target's --threads, --kv-dtype and --weights)
    #[arg(long, value_name = "PATH")]
    pub draft_model: Option<PathBuf>,
    /// The draft model's arithmetic. It decides only which tokens are proposed, never the
    /// output (the target verifies every one), so the default is the fastest: 8-bit
    /// activation blocks, as llama.cpp computes [default: q8]
    #[arg(long, value_enum, value_name = "PRECISION")]
    pub draft_precision: Option<PrecisionArg>,
    /// The most draft tokens one step verifies (the number adapts to what is accepted)
    /// [default: 8 with ngram, 5 with draft]
    #[arg(long, value_name = "K")]
    pub draft_tokens: Option<usize>,
    /// With --speculate: write every step's proposals, how many were accepted and the tokens
    /// produced (ids and text), one JSON object per sequence and step, to FILE
    #[arg(long, value_name = "FILE")]
    pub speculation_log: Option<PathBuf>,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SpeculateArg {
    #[default]
    Off,
    Ngram,
    Draft,
}

impl SpeculationArgs {
    /// Checks the flags together: one usage error for a combination that means nothing.
    pub fn check(&self) -> anyhow::Result<()> {
        if let Some(path) = &self.speculation_log {
            if self.speculate == SpeculateArg::Off {
                return Err(UsageError("--speculation-log needs --speculate".into()).into());
            }
            crate::output::check_output_file("--speculation-log", path)?;
        }
        if self.draft_model.is_some() && self.speculate != SpeculateArg::Draft {
            return Err(UsageError("--draft-model needs --speculate draft".into()).into());
        }
        if self.draft_precision.is_some() && self.speculate != SpeculateArg::Draft {
            return Err(UsageError("--draft-precision needs --speculate draft".into()).into());
        }
        if self.speculate == SpeculateArg::Draft && self.draft_model.is_none() {
            return Err(UsageError("--speculate draft needs --draft-model PATH".into()).into());
        }
        if self.draft_tokens.is_some() && self.speculate == SpeculateArg::Off {
            return Err(UsageError("--draft-tokens needs --speculate".into()).into());
        }
        if self.draft_tokens == Some(0) {
            return Err(UsageError("--draft-tokens must be at least 1".into()).into());
        }
        Ok(())
    }

    /// `--draft-tokens`, else the drafter's default (`Drafter::default_max_draft`: a draft
    /// model's proposals each cost a pass, prompt lookup's nothing).
    pub fn draft_tokens(&self) -> usize {
        let free = self.speculate != SpeculateArg::Draft;
        self.draft_tokens.unwrap_or(loupe_runtime::Drafter::default_max_draft(free))
    }

    /// The draft model's precision: `--draft-precision`, else 8-bit activation blocks.
    pub fn draft_precision(&self) -> Precision {
        self.draft_precision.unwrap_or(PrecisionArg::Q8).into()
    }

    /// The engine's speculation settings; `None` when off. `draft` is the loaded draft model
    /// of `--speculate draft` (`crate::load::draft_model`; whether it fits the target is
    /// checked when the batched engine starts).
    pub fn config(
        &self,
        draft: Option<loupe_runtime::DraftModel>,
    ) -> anyhow::Result<Option<loupe_runtime::SpeculationConfig>> {
        self.check()?;
        let drafter = match (self.speculate, draft) {
            (SpeculateArg::Off, _) => return Ok(None),
            (SpeculateArg::Ngram, _) => loupe_runtime::SpeculationConfig::default().drafter,
            (SpeculateArg::Draft, Some(model)) => loupe_runtime::Drafter::Model(model),
            (SpeculateArg::Draft, None) => anyhow::bail!("--speculate draft: the draft model was not loaded"),
        };
        Ok(Some(loupe_runtime::SpeculationConfig { drafter, max_draft: self.draft_tokens() }))
    }

    /// These flags as `loupe serve` takes them (for a command that starts its own server).
    pub fn serve_flags(&self) -> Vec<std::ffi::OsString> {
        let name = match self.speculate {
            SpeculateArg::Off => return Vec::new(),
            SpeculateArg::Ngram => "ngram",
            SpeculateArg::Draft => "draft",
        };
        let mut flags: Vec<std::ffi::OsString> =
            vec!["--speculate".into(), name.into(), "--draft-tokens".into(), self.draft_tokens().to_string().into()];
        if let Some(path) = &self.draft_model {
            flags.extend(["--draft-model".into(), path.clone().into_os_string()]);
            if let Some(p) = self.draft_precision {
                flags.extend(["--draft-precision".into(), precision_name(p.into()).into()]);
            }
        }
        if let Some(path) = &self.speculation_log {
            flags.extend(["--speculation-log".into(), path.clone().into_os_string()]);
        }
        flags
    }
}

/// The prefix cache's disk tier (`loupe serve`, forwarded by `loupe bench-serve`).
#[derive(Args, Debug, Clone, Default)]
pub struct PrefixDiskArgs {
    /// Keep prefix-cache blocks evicted from memory as files in DIR (created if missing) and
    /// read them back when a later prompt starts with the same tokens (KV offloading; one
    /// server per directory; files of another model or precision are never used) [default: off]
    #[arg(long, value_name = "DIR")]
    pub prefix_cache_dir: Option<PathBuf>,
    /// Disk budget of --prefix-cache-dir in MiB: beyond it the least recently used block
    /// files are deleted
    #[arg(long, value_name = "MIB", default_value_t = 4096, requires = "prefix_cache_dir")]
    pub prefix_cache_disk_mb: u64,
}

impl PrefixDiskArgs {
    /// The disk tier asked for, its directory created and checked writable now, so a bad
    /// one is one line before any model is loaded.
    pub fn config(&self) -> anyhow::Result<Option<loupe_runtime::DiskCacheConfig>> {
        let Some(dir) = &self.prefix_cache_dir else { return Ok(None) };
        if self.prefix_cache_disk_mb == 0 {
            return Err(UsageError("--prefix-cache-disk-mb must be at least 1".into()).into());
        }
        loupe_runtime::batch::disk::prepare_dir(dir).map_err(|e| UsageError(format!("--prefix-cache-dir: {e}")))?;
        Ok(Some(loupe_runtime::DiskCacheConfig {
            dir: dir.clone(),
            max_bytes: self.prefix_cache_disk_mb.saturating_mul(1 << 20),
        }))
    }

    /// These flags as `loupe serve` takes them (for a command that starts its own server).
    pub fn serve_flags(&self) -> Vec<std::ffi::OsString> {
        let Some(dir) = &self.prefix_cache_dir else { return Vec::new() };
        vec![
            "--prefix-cache-dir".into(),
            dir.clone().into_os_string(),
            "--prefix-cache-disk-mb".into(),
            self.prefix_cache_disk_mb.to_string().into(),
        ]
    }
}

impl BatchEngineArgs {
    /// The engine configuration for at most `max_seqs` sequences at once. Its KV cache
    /// holds the loaded graph's element type (`--kv-dtype` sets it, see [`ModelArgs`]). The
    /// server adds the disk tier ([`PrefixDiskArgs::config`]).
    pub fn config(
        &self,
        max_seqs: usize,
        draft: Option<loupe_runtime::DraftModel>,
    ) -> anyhow::Result<loupe_runtime::BatchConfig> {
        Ok(loupe_runtime::BatchConfig {
            kv_cache_mb: self.kv_cache_mb,
            kv_blocks: None,
            kv_dtype: None,
            block_size: self.block_size,
            max_batch_tokens: self.max_batch_tokens,
            max_seqs,
            prefix_cache: !self.no_prefix_cache,
            prefix_cache_disk: None,
            speculation: self.speculation.config(draft)?,
            speculation_log: self.speculation.speculation_log.clone(),
        })
    }
}

/// A list of positive counts, parsed from `1,4,8,16,32`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Counts(pub Vec<usize>);

/// A comma-separated list of positive counts (`1,4,8,16,32`).
pub fn parse_counts(s: &str) -> Result<Counts, String> {
    let counts: Vec<usize> = s
        .split(',')
        .map(|p| p.trim().parse::<usize>().map_err(|_| format!("'{p}' is not a count (expected e.g. 1,4,8,16,32)")))
        .collect::<Result<_, _>>()?;
    if counts.contains(&0) {
        return Err("counts must be at least 1".into());
    }
    Ok(Counts(counts))
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
    fn weights_are_forwarded_to_a_child_server_only_when_given() {
        let auto = ModelArgs::default();
        assert!(!auto.serve_flags().iter().any(|f| f == "--weights"));
        let copied = ModelArgs { weights: WeightsArg::Copied, ..Default::default() };
        let flags: Vec<String> = copied.serve_flags().iter().map(|f| f.to_string_lossy().into_owned()).collect();
        assert_eq!(flags, ["--weights", "copied"]);
        assert_eq!(loupe_models::WeightPlacement::from(WeightsArg::Mapped), loupe_models::WeightPlacement::Mapped);
    }

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

/// `--prefill-chunk` (`generate`, `bench`): prompt rows per forward pass of one sequence.
#[derive(Args, Debug, Clone, Copy, Default)]
pub struct PrefillArgs {
    /// Prompt rows per forward pass: a longer prompt runs in chunks of this many rows, so
    /// prefill's activation buffers stay this size whatever the prompt's length (llama.cpp's
    /// --ubatch-size) [default: 512]
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    pub prefill_chunk: Option<u32>,
}

impl PrefillArgs {
    /// Sets the engine's chunk when the flag is given.
    pub fn apply(&self, engine: &mut loupe_runtime::Engine) {
        if let Some(rows) = self.prefill_chunk {
            engine.set_prefill_chunk(rows as usize);
        }
    }
}

/// `--profile` and its output (`generate`, `bench`, `serve`).
#[derive(Args, Debug, Clone, Default)]
pub struct ProfileArgs {
    /// Profile every op: when the command ends, a table on stderr ranks op kinds and nodes
    /// (by module path) by wall time, with calls, bytes read, GB/s and GFLOP/s.
    #[arg(long)]
    pub profile: bool,
    /// Also write a Chrome trace JSON (opens in Perfetto or chrome://tracing), one track per
    /// compute thread; implies --profile.
    #[arg(long, value_name = "FILE")]
    pub profile_out: Option<std::path::PathBuf>,
    /// Nodes listed in the profile table.
    #[arg(long, value_name = "N", default_value_t = 25)]
    pub profile_top: usize,
}

impl ProfileArgs {
    /// A profiler when asked for; checks that the trace file can be written before any work.
    pub fn profiler(&self) -> anyhow::Result<Option<loupe_graph::Profiler>> {
        if let Some(p) = &self.profile_out {
            crate::output::check_output_file("--profile-out", p)?;
        }
        Ok((self.profile || self.profile_out.is_some()).then(loupe_graph::Profiler::new))
    }

    /// Prints the table on stderr and writes the trace.
    pub fn report(&self, profiler: Option<&loupe_graph::Profiler>) -> anyhow::Result<()> {
        let Some(p) = profiler else { return Ok(()) };
        let data = p.snapshot();
        eprint!("{}", data.table(self.profile_top));
        if let Some(path) = &self.profile_out {
            std::fs::write(path, data.chrome_trace())
                .map_err(|e| anyhow::anyhow!("--profile-out {}: {e}", path.display()))?;
            eprintln!(
                "loupe: wrote a Chrome trace of {} events to {} (open it in https://ui.perfetto.dev)",
                data.events.len(),
                path.display()
            );
        }
        Ok(())
    }
}
