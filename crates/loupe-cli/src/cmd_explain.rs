//! `loupe explain A B --tensor NAME`: which bug makes the target's NAME differ from the
//! reference's? Tests fix hypotheses numerically on the op's dumped inputs
//! (docs/parity-protocol.md, step 4); the work is in the `loupe-explain` crate.
//!
//! Exit code: 0 whatever the verdict (the answer is the table and the conclusion line);
//! 2 on bad input (a missing tensor, dump or model).

use std::io::Write;
use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use loupe_explain::{explain, report};

use crate::load::model_path;
use crate::UsageError;

#[derive(Args, Debug, Clone)]
pub struct ExplainArgs {
    /// Reference dump directory (A).
    pub a: PathBuf,
    /// Target dump directory (B): the side suspected of a bug.
    pub b: PathBuf,
    /// The tensor to explain (a value name: `model.layers.1.self_attn.q_rope`, ...).
    #[arg(long)]
    pub tensor: String,
    /// Model whose weights and hyper-parameters the hypotheses use [default: the cached SmolLM2].
    #[arg(long, short = 'm')]
    pub model: Option<PathBuf>,
    /// Dump step (0 = the prompt, k = the k-th decode step).
    #[arg(long, default_value_t = 0)]
    pub step: usize,
    /// Also write the explanation as JSON to FILE.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
}

pub fn run(args: ExplainArgs) -> anyhow::Result<u8> {
    // The model is resolved (and the default fetched) only when a hypothesis needs weights,
    // but a --model that does not exist is an error up front.
    let model = match &args.model {
        Some(p) => model_path(Some(p))?,
        None => loupe_runtime::default_model_path(),
    };
    let model = if args.model.is_none() && !model.is_file() { loupe_runtime::default_model()? } else { model };
    let e = explain(&args.a, &args.b, &args.tensor, args.step, model).map_err(|e| UsageError(e.to_string()))?;
    let mut out = std::io::stdout().lock();
    out.write_all(report::render(&e).as_bytes())?;
    if let Some(path) = &args.json {
        let text = serde_json::to_vec_pretty(&report::to_json(&e))?;
        std::fs::write(path, text).with_context(|| format!("{}: cannot write the JSON report", path.display()))?;
    }
    Ok(0)
}
