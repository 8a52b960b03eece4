//! `loupe dump`: run the model and capture named values (taps) without touching model code,
//! into the dump layout of docs/dump-format.md (manifest.json + one file per tensor) or printed in
//! MAX's COMPACT / FULL styles. The CLI side is [`crate::taps`]; the work is in
//! `loupe_explain::taps`.

use std::path::PathBuf;

use clap::Args;
use loupe_graph::debug::DebugOptions;

use crate::args::{parse_ids, parse_layers, ModelArgs, PromptArgs};
use crate::taps::{dump, DumpJob, Style};

#[derive(Args, Debug)]
pub struct DumpArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub input: PromptArgs,
    /// Keep only the first N decoder layers (`all` keeps every layer).
    #[arg(long, default_value = "all")]
    pub layers: String,
    /// Capture only values whose name (or alias) matches one of these regexes (repeatable).
    #[arg(long = "taps")]
    pub taps: Vec<String>,
    /// Also run K decode steps after the prompt and dump each (step k = the k-th new token).
    #[arg(long, default_value_t = 0)]
    pub steps: usize,
    /// Comma-separated token ids fed at the decode steps instead of greedy choices.
    #[arg(long)]
    pub teacher_force: Option<String>,
    /// Output directory (written atomically). Without it, tensors are printed in COMPACT style.
    #[arg(short = 'o', long = "output")]
    pub output: Option<PathBuf>,
    #[arg(long, value_enum)]
    pub style: Option<Style>,
    /// Digits after the point for --style full.
    #[arg(long, default_value_t = 6)]
    pub digits: usize,
    /// Stored element type (loupe computes in f32, so both store f32).
    #[arg(long, default_value = "f32", value_parser = ["f32", "native"])]
    pub dtype: String,
    /// Plant a bug in loupe's own graph at decoder layer LAYER (repeatable), to test the
    /// parity tools against a known answer. CLASS: rope-interleaved, transposed-weight,
    /// norm-eps, norm-eps-subtle, o-proj-scale, gelu-tanh, softmax-scale, gqa-mapping,
    /// missing-residual, bf16, kv-write, kv-write-decode, mask. (block-table@L,
    /// batch-reduction@L, spec-mask@L and stream-drop-last live in the batched engine and the
    /// server: loupe bisect and loupe serve plant them.)
    #[arg(long = "inject", value_name = "CLASS@LAYER")]
    pub inject: Vec<loupe_models::Fault>,
}

pub fn run(args: DumpArgs, debug: &DebugOptions) -> anyhow::Result<()> {
    let job = DumpJob {
        layers: parse_layers(&args.layers)?,
        teacher_force: args.teacher_force.as_deref().map(|s| parse_ids("--teacher-force", s)).transpose()?,
        model: args.model,
        input: args.input,
        taps: args.taps,
        steps: args.steps,
        output: args.output,
        style: args.style,
        digits: args.digits,
        inject: args.inject,
    };
    dump(job, debug)
}
