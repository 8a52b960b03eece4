//! Running the Python reference (`python3 -m loupe_reference`, transformers in f32) for the
//! commands that compare against it: `parity` (a dump) and `bisect` (a dump, and teacher-forced
//! argmax with the top logits).

use std::path::Path;
use std::process::Command;

use anyhow::Context;

use crate::args::PromptArgs;
use crate::UsageError;

/// What a reference dump captures.
pub struct DumpRequest<'a> {
    pub layers: &'a str,
    pub taps: &'a [String],
    pub steps: usize,
    /// Token ids fed at the decode steps instead of the reference's greedy ones.
    pub teacher_force: Option<&'a [u32]>,
    /// `--dtype` (f64, f16, bf16: a calibration run); `None` for f32.
    pub dtype: Option<&'a str>,
}

/// The Python reference is installed and can read `model`: gguf-py (and so transformers)
/// refuses loupe's own FP8 tensor type, so such a file is turned away here with what to do
/// instead, not after ~20 s of loading with a numpy error.
fn require(model: &Path) -> anyhow::Result<()> {
    if model.is_file() {
        if let Ok(file) = loupe_formats::GgufFile::open(model) {
            if let Some(t) = file.tensors.iter().find(|t| t.ggml_type == loupe_core::GgmlType::Fp8E4M3) {
                return Err(UsageError(format!(
                    "{}: holds {} tensors ({} first), a loupe type the transformers reference cannot read: dump the model it was quantized from (loupe dump -m ORIGINAL -o DIR) and pass --reference DIR",
                    model.display(),
                    t.ggml_type,
                    t.name
                ))
                .into());
            }
        }
    }
    let ok = Command::new("python3")
        .args(["-c", "import loupe_reference"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if ok {
        Ok(())
    } else {
        Err(UsageError("--reference hf needs the Python reference: pip install -e reference/ (torch, transformers, gguf, accelerate)".into()).into())
    }
}

/// `python3 -m loupe_reference SUB` with the model and prompt flags.
fn command(sub: &str, model: &Path, input: &PromptArgs) -> Command {
    let mut cmd = Command::new("python3");
    cmd.args(["-m", "loupe_reference", sub]);
    if model.is_dir() {
        cmd.arg("--hf-dir").arg(model);
    } else {
        cmd.arg("--gguf").arg(model);
    }
    cmd.args(["--prompt", &input.prompt]);
    if input.chat {
        cmd.arg("--chat");
    }
    if let Some(s) = &input.system {
        cmd.args(["--chat", "--system", s]);
    }
    cmd
}

fn run(mut cmd: Command, what: &str) -> anyhow::Result<String> {
    let output = cmd.output().context("cannot run python3")?;
    if !output.status.success() {
        let err = String::from_utf8_lossy(&output.stderr);
        let last = err.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("").trim().to_string();
        anyhow::bail!("the reference's {what} failed ({}): {last}", output.status);
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

fn ids(t: &[u32]) -> String {
    t.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
}

/// Dumps the reference's named values into `out` (`python -m loupe_reference dump`).
pub fn dump(model: &Path, input: &PromptArgs, req: &DumpRequest<'_>, out: &Path) -> anyhow::Result<()> {
    require(model)?;
    let mut cmd = command("dump", model, input);
    cmd.args(["--layers", req.layers]);
    for t in req.taps {
        cmd.args(["--taps", t]);
    }
    match req.teacher_force {
        Some(t) => {
            cmd.args(["--teacher-force", &ids(t)]);
        }
        None if req.steps > 0 => {
            cmd.args(["--steps", &req.steps.to_string()]);
        }
        None => {}
    }
    if let Some(d) = req.dtype {
        cmd.args(["--dtype", d]);
    }
    cmd.arg("-o").arg(out);
    let what = req.dtype.map_or(String::new(), |d| format!(" in {d} for the noise floors"));
    eprintln!("loupe: running the transformers reference{what} (python -m loupe_reference dump); loading takes ~20 s");
    run(cmd, "dump").map(|_| ())
}

/// The reference's logits along `prompt + tokens`, teacher-forced (the bisect ladder's type).
pub use loupe_explain::bisect::TeacherForced;

/// `python -m loupe_reference teacher-force --tokens ... --top-logits 2`.
pub fn teacher_force(model: &Path, input: &PromptArgs, tokens: &[u32]) -> anyhow::Result<TeacherForced> {
    require(model)?;
    let mut cmd = command("teacher-force", model, input);
    cmd.args(["--tokens", &ids(tokens), "--top-logits", "2"]);
    eprintln!(
        "loupe: running the transformers reference (python -m loupe_reference teacher-force); loading takes ~20 s"
    );
    let out = run(cmd, "teacher-force")?;
    let line = out.lines().rev().find(|l| l.trim_start().starts_with('{')).unwrap_or("");
    let v: serde_json::Value =
        serde_json::from_str(line).with_context(|| format!("the reference printed no JSON line: {out}"))?;
    let list = |k: &str| -> Vec<u32> {
        v[k].as_array().map(|a| a.iter().filter_map(|x| x.as_u64().map(|x| x as u32)).collect()).unwrap_or_default()
    };
    let margins = v["top_logits"]
        .as_array()
        .map(|rows| {
            rows.iter()
                .map(|r| {
                    let l = |i: usize| r.get(i).and_then(|p| p.get(1)).and_then(|x| x.as_f64());
                    match (l(0), l(1)) {
                        (Some(a), Some(b)) => a - b,
                        _ => f64::INFINITY,
                    }
                })
                .collect()
        })
        .unwrap_or_default();
    let top1 = v["top_logits"]
        .as_array()
        .map(|rows| {
            rows.iter().map(|r| r.get(0).and_then(|p| p.get(1)).and_then(|x| x.as_f64()).unwrap_or(f64::NAN)).collect()
        })
        .unwrap_or_default();
    Ok(TeacherForced { prompt_tokens: list("prompt_tokens"), argmax: list("argmax"), margins, top1 })
}
