//! `loupe ir`: the model's graph as text after any lowering pass.

use clap::Args;
use loupe_graph::debug::DebugOptions;
use loupe_graph::passes::PASSES;
use loupe_runtime::Lowering;

use crate::args::{parse_layers, ModelArgs, PrecisionArg};
use crate::load::{load, Load};

#[derive(Args, Debug)]
pub struct IrArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Print the IR after this pass [default: the last]. `--list-passes` names them.
    #[arg(long = "pass", value_name = "NAME")]
    pub pass: Option<String>,
    /// List the lowering passes and exit.
    #[arg(long)]
    pub list_passes: bool,
    /// Keep only the first N decoder layers (`all` keeps every layer).
    #[arg(long, default_value = "all")]
    pub layers: String,
    /// Plant a fault (as `loupe dump --inject`), to see it in the IR.
    #[arg(long = "inject", value_name = "CLASS@LAYER")]
    pub inject: Vec<loupe_models::Fault>,
}

pub fn run(args: IrArgs, debug: &DebugOptions) -> anyhow::Result<()> {
    if args.list_passes {
        for (i, p) in PASSES.iter().enumerate() {
            println!("{i:02} {:<16} {}", p.name, p.about);
        }
        return Ok(());
    }
    let pass = args.pass.clone().unwrap_or_else(|| PASSES[PASSES.len() - 1].name.to_string());
    let what = Load {
        precision: args.model.precision_or(PrecisionArg::Auto),
        layers: parse_layers(&args.layers)?,
        faults: args.inject.clone(),
        lowering: Lowering::Until(pass),
        profiler: None,
    };
    let engine = load(&args.model, what, debug)?;
    print!("{}", loupe_graph::print::to_text(engine.graph()));
    Ok(())
}
