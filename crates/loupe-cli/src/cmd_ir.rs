//! `loupe ir`: the model's graph as text after any lowering pass.

use std::path::PathBuf;

use clap::Args;
use loupe_graph::passes::PASSES;

use crate::cmd_generate::{load_built_model, ModelArgs, PrecisionArg};

#[derive(Args, Debug)]
pub struct IrArgs {
    /// GGUF file or Hugging Face checkpoint directory [default: the cached SmolLM2]
    #[arg(long, short = 'm')]
    pub model: Option<PathBuf>,
    /// Print the IR after this pass [default: the last]. `--list-passes` names them.
    #[arg(long = "pass", value_name = "NAME")]
    pub pass: Option<String>,
    /// List the lowering passes and exit.
    #[arg(long)]
    pub list_passes: bool,
    /// Keep only the first N decoder layers (`all` keeps every layer).
    #[arg(long, default_value = "all")]
    pub layers: String,
    /// Weight precision (shown in weight types and kernels).
    #[arg(long, value_enum, default_value = "native")]
    pub precision: PrecisionArg,
    /// Plant a fault (as `loupe dump --inject`), to see it in the IR.
    #[arg(long = "inject", value_name = "CLASS@LAYER")]
    pub inject: Vec<loupe_models::Fault>,
}

pub fn run(args: IrArgs) -> anyhow::Result<()> {
    if args.list_passes {
        for (i, p) in PASSES.iter().enumerate() {
            println!("{i:02} {:<16} {}", p.name, p.about);
        }
        return Ok(());
    }
    let pass = args.pass.clone().unwrap_or_else(|| PASSES[PASSES.len() - 1].name.to_string());
    let layers = crate::cmd_dump::parse_layers(&args.layers)?;
    let model_args = ModelArgs { model: args.model.clone(), precision: args.precision, threads: None };
    let (model, _) = load_built_model(&model_args, layers, args.inject.clone())?;
    let graph = crate::debug_setup::lower(model.graph, Some(&pass))?;
    print!("{}", loupe_graph::print::to_text(&graph));
    Ok(())
}
