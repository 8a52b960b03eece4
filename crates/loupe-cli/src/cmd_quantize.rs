//! `loupe quantize IN OUT.gguf --type T`: the same model with its weight matrices in
//! another GGML type ([`loupe_models::quantize`]), IN a GGUF or a Hugging Face checkpoint
//! directory (converted as llama.cpp's converter does: [`loupe_models::convert`]); `loupe
//! parity` against a dump of the original then shows what the quantization cost, layer by
//! layer.

use std::path::PathBuf;
use std::time::Instant;

use clap::Args;
use loupe_models::convert::quantize_hf_dir;
use loupe_models::quantize::{quantize_gguf, TensorFate, TARGETS};

use crate::UsageError;

#[derive(Args, Debug)]
pub struct QuantizeArgs {
    /// The GGUF file to read (any weight types loupe reads, K-quants included), or a Hugging
    /// Face checkpoint directory (config.json, *.safetensors in f32/f16/bf16, tokenizer.json;
    /// Llama, Qwen2 and Qwen3 with byte-level BPE tokenizers) to convert.
    pub input: PathBuf,
    /// The GGUF file to write.
    pub output: PathBuf,
    /// Target type of the weight matrices: q4_0, q4_1, q5_0, q5_1, q8_0, q4_K, mxfp4, nvfp4,
    /// fp8 (E4M3 codes with an f16 scale per 32; a loupe type other GGUF readers refuse),
    /// f16, bf16 or f32.
    #[arg(long = "type", value_name = "TYPE")]
    pub ty: String,
    /// Replace OUTPUT if it exists.
    #[arg(long)]
    pub force: bool,
    /// Quantize the token embedding and output projection too; by default they keep their
    /// type when it has more bits than TYPE (SmolLM2 Q4_1 to q4_0: quantizing its Q8_0
    /// embedding too raises the logits' mean KL against the original from 0.94 to 1.07).
    #[arg(long)]
    pub all: bool,
}

pub fn run(args: QuantizeArgs) -> anyhow::Result<()> {
    let names: Vec<&str> = TARGETS.iter().map(|t| t.name()).collect();
    // `fp8` is the and users' name for the E4M3 target (E5M2 weights are not written).
    let wanted = if args.ty.eq_ignore_ascii_case("fp8") { "fp8_e4m3" } else { args.ty.as_str() };
    let target = TARGETS
        .iter()
        .copied()
        .find(|t| t.name().eq_ignore_ascii_case(wanted))
        .ok_or_else(|| UsageError(format!("--type {}: expected one of {}", args.ty, names.join(", "))))?;
    let input = &args.input;
    let dir = input.is_dir();
    if !dir {
        let mut magic = [0u8; 4];
        let readable = std::fs::File::open(input).and_then(|mut f| std::io::Read::read_exact(&mut f, &mut magic));
        match readable {
            Err(e) => return Err(UsageError(format!("{}: {e}", input.display())).into()),
            Ok(()) if &magic != b"GGUF" => {
                return Err(UsageError(format!(
                    "{}: not a GGUF file (loupe quantize reads a GGUF or a Hugging Face checkpoint directory)",
                    input.display()
                ))
                .into())
            }
            Ok(()) => {}
        }
    }
    crate::output::check_output_file("OUTPUT", &args.output)?;
    if args.output.exists() && !args.force {
        return Err(UsageError(format!("{} exists (--force replaces it)", args.output.display())).into());
    }
    if std::fs::canonicalize(input).ok() == std::fs::canonicalize(&args.output).ok() {
        return Err(UsageError("OUTPUT is INPUT: write the quantized model to another file".into()).into());
    }
    let started = Instant::now();
    let mut last_tenth = 0;
    let progress = |done: usize, total: usize| {
        // Progress only when it takes long enough to wonder (a 135M model takes < 1 s).
        let tenth = done * 10 / total.max(1);
        if tenth > last_tenth && started.elapsed().as_secs_f64() > 2.0 {
            last_tenth = tenth;
            eprintln!("loupe quantize: {done}/{total} tensors ({:.1} s)", started.elapsed().as_secs_f64());
        }
    };
    let report = if dir {
        quantize_hf_dir(input, &args.output, target, !args.all, progress)
    } else {
        quantize_gguf(input, &args.output, target, !args.all, progress)
    }
    .map_err(|e| anyhow::anyhow!(e))?;
    let count = |f: fn(&TensorFate) -> bool| report.tensors.iter().filter(|(_, fate)| f(fate)).count();
    let quantized = count(|f| matches!(f, TensorFate::Quantized { .. }));
    let copied = count(|f| matches!(f, TensorFate::Copied));
    // Kept tensors grouped by reason, in file order; a reason shared by many (NVFP4's
    // per-tensor scales: one per matrix) is a count, not hundreds of names.
    let mut by_reason: Vec<(&str, Vec<&str>)> = Vec::new();
    for (name, fate) in &report.tensors {
        if let TensorFate::Kept { reason } = fate {
            if *reason == "one-dimensional" {
                continue;
            }
            match by_reason.iter_mut().find(|(r, _)| r == reason) {
                Some((_, names)) => names.push(name),
                None => by_reason.push((reason, vec![name])),
            }
        }
    }
    let kept: Vec<String> = by_reason
        .iter()
        .map(|(reason, names)| match names.as_slice() {
            [first, .., last] if names.len() > 3 => format!("{} tensors ({reason}: {first} ... {last})", names.len()),
            _ => names.iter().map(|n| format!("{n} ({reason})")).collect::<Vec<_>>().join(", "),
        })
        .collect();
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    eprintln!(
        "loupe quantize: wrote {} in {:.1} s: {quantized} matrices quantized to {}, {copied} already {} (copied), {} one-dimensional kept; {:.2} bits per weight over the matrices; {:.1} MiB -> {:.1} MiB",
        args.output.display(),
        started.elapsed().as_secs_f64(),
        target.name(),
        target.name(),
        count(|f| matches!(f, TensorFate::Kept { reason: "one-dimensional" })),
        report.bits_per_weight(),
        mib(report.bytes_in),
        mib(report.bytes_out)
    );
    let embeddings: Vec<String> = report
        .tensors
        .iter()
        .filter_map(|(name, fate)| match fate {
            TensorFate::Embedding { from, to } => Some(format!("{name} ({} -> {})", from.name(), to.name())),
            _ => None,
        })
        .collect();
    if !embeddings.is_empty() {
        eprintln!(
            "loupe quantize: embeddings kept at 8 bits: {} (--all quantizes them to {})",
            embeddings.join(", "),
            target.name()
        );
    }
    if !kept.is_empty() {
        eprintln!("loupe quantize: kept in their type: {}", kept.join(", "));
    }
    Ok(())
}
