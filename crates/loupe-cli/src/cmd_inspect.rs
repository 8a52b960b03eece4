//! `loupe inspect FILE`: a GGUF or safetensors file's metadata and tensors.

use std::path::PathBuf;

use clap::Args;
use loupe_formats::safetensors_file::SafetensorsFile;
use loupe_formats::GgufFile;

use crate::UsageError;

#[derive(Args, Debug)]
pub struct InspectArgs {
    /// A .gguf or .safetensors file.
    pub file: PathBuf,
    /// Print one JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: InspectArgs) -> anyhow::Result<()> {
    let path = &args.file;
    if !path.exists() {
        return Err(UsageError(format!("{}: no such file or directory", path.display())).into());
    }
    let mut magic = [0u8; 4];
    let is_gguf = std::fs::File::open(path).and_then(|mut f| std::io::Read::read_exact(&mut f, &mut magic)).is_ok()
        && &magic == b"GGUF";
    if is_gguf {
        let g = GgufFile::open(path).map_err(|e| UsageError(e.to_string()))?;
        if args.json {
            let meta: serde_json::Map<String, serde_json::Value> =
                g.metadata.iter().map(|(k, v)| (k.clone(), serde_json::Value::String(v.to_string()))).collect();
            let tensors: Vec<_> = g.tensors.iter().map(|t| serde_json::json!({"name": t.name, "dtype": t.ggml_type.name(), "shape": t.shape(), "offset": t.offset, "bytes": t.size_bytes})).collect();
            println!(
                "{}",
                serde_json::json!({"format": "gguf", "version": g.version, "metadata": meta, "tensors": tensors})
            );
            return Ok(());
        }
        println!(
            "{}: GGUF v{}, {} metadata keys, {} tensors, alignment {}",
            path.display(),
            g.version,
            g.metadata.len(),
            g.tensors.len(),
            g.alignment
        );
        println!("\nmetadata:");
        for (k, v) in &g.metadata {
            println!("  {k} = {v}");
        }
        println!("\ntensors:");
        let width = g.tensors.iter().map(|t| t.name.len()).max().unwrap_or(0);
        for t in &g.tensors {
            println!("  {:width$}  {:5}  {:?}", t.name, t.ggml_type.name(), t.shape());
        }
        let total: u64 = g.tensors.iter().map(|t| t.size_bytes).sum();
        println!("\n{} tensors, {:.1} MB of data", g.tensors.len(), total as f64 / 1e6);
        return Ok(());
    }
    let name = path.to_string_lossy();
    if !name.ends_with(".safetensors") {
        return Err(
            UsageError(format!("{}: not a GGUF file (bad magic) and not a .safetensors file", path.display())).into()
        );
    }
    let st = SafetensorsFile::open(path).map_err(|e| UsageError(e.to_string()))?;
    let infos: Vec<(&str, String, &[usize])> =
        st.tensors.iter().map(|t| (t.name.as_str(), format!("{:?}", t.dtype), t.shape.as_slice())).collect();
    if args.json {
        let tensors: Vec<_> = infos
            .iter()
            .map(|(n, dtype, shape)| serde_json::json!({"name": n, "dtype": dtype, "shape": shape}))
            .collect();
        println!("{}", serde_json::json!({"format": "safetensors", "metadata": st.metadata, "tensors": tensors}));
        return Ok(());
    }
    println!("{}: safetensors, {} tensors", path.display(), infos.len());
    if !st.metadata.is_empty() {
        println!("\nmetadata:");
        for (k, v) in &st.metadata {
            println!("  {k} = {v}");
        }
    }
    println!("\ntensors:");
    let width = infos.iter().map(|(n, _, _)| n.len()).max().unwrap_or(0);
    for (n, dtype, shape) in &infos {
        println!("  {n:width$}  {dtype:5}  {shape:?}");
    }
    Ok(())
}
