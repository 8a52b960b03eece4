//! Loads a model through the library (the default SmolLM2, fetched into the cache on first
//! use, or the GGUF / checkpoint directory given as the second argument) and generates
//! greedily:
//!
//!     cargo run --release -p loupe-runtime --example generate -- "What is the capital of France?"
use loupe_runtime::{default_model, Engine, LoadOptions, Prompt, SamplingParams};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let question = args.next().unwrap_or_else(|| "What is the capital of France?".into());
    let path = match args.next() {
        Some(p) => p.into(),
        None => default_model()?,
    };
    // Native precision (GGML blocks in memory), every core, no debug checks.
    let engine = Engine::load(path, LoadOptions::default())?;
    let greedy = SamplingParams::default(); // temperature 0
    let out = engine.generate(&Prompt::chat(&question), 64, &greedy, &mut |piece| print!("{piece}"))?;
    println!("\n[{} tokens, finish: {}]", out.tokens.len(), out.finish_reason.as_str());
    Ok(())
}
