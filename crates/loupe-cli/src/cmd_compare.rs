//! `loupe compare A B`: pair the tensors of two dumps (A = reference, B = target), print a
//! table in execution order and a verdict (first divergence, likely cause, false cliffs),
//! optionally write the JSON report; with `--calibrate HIGH LOW`, each tensor is judged
//! against its noise floor (loupe_parity::calibrate). Exit code: 0 within tolerance, 1 divergence (also
//! when nothing paired), 2 bad input (returned as an error; main prints one line).
//!
//! The work is done by `loupe_parity`; this file maps flags to options and draws progress.

use std::io::Write;
use std::path::PathBuf;

use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use loupe_parity::regex::Regex;
use loupe_parity::report::{render, to_json, RenderOptions};
use loupe_parity::{compare, Calibration, CompareOptions, Mapping, Progress, Thresholds};

/// Show a progress bar from this many pairs...
const BAR_MIN_PAIRS: usize = 64;
/// ... or this many bytes read.
const BAR_MIN_BYTES: u64 = 256 << 20;

#[derive(Args, Debug, Clone)]
pub struct CompareArgs {
    /// Reference (A): a dump directory (manifest.json), a directory of .max/.pt/.npy files,
    /// or one .npy/.npz/.pt/.max/.safetensors/.gguf file.
    pub a: PathBuf,
    /// Target (B), in any of the same forms.
    pub b: PathBuf,
    /// Name mapping file (JSON: renames, fused splits, transposes, head reshapes), or
    /// `llama.cpp` for llama.cpp eval-callback names.
    #[arg(long, value_name = "FILE")]
    pub map: Option<PathBuf>,
    /// Relative tolerance of the isclose mismatch count; giving --rtol or --atol makes any
    /// mismatch fail the tensor (default 1e-3, informational).
    #[arg(long)]
    pub rtol: Option<f64>,
    /// Absolute tolerance of the isclose mismatch count (default 1e-5, informational).
    #[arg(long)]
    pub atol: Option<f64>,
    /// A tensor diverges below this cosine similarity.
    #[arg(long, default_value_t = 0.99)]
    pub cos: f64,
    /// ... or above this NMSE, sum (a-b)^2 / sum a^2.
    #[arg(long, default_value_t = 1e-2)]
    pub nmse: f64,
    /// ... or when |norm(B)/norm(A) - 1| exceeds this (scale bugs keep cosine at 1).
    #[arg(long, default_value_t = 0.05)]
    pub norm_tol: f64,
    /// Compare only token row I of each tensor.
    #[arg(long, value_name = "I")]
    pub token_index: Option<usize>,
    /// Print (and keep in the JSON) the cosine of every token row.
    #[arg(long)]
    pub per_token: bool,
    /// Compute per-dimension (column) cosines; print the worst ones.
    #[arg(long)]
    pub per_dim: bool,
    /// Reshape B to A's shape when element counts agree.
    #[arg(long)]
    pub allow_reshape: bool,
    /// Compare only tensors whose name matches this regex.
    #[arg(long, value_name = "REGEX")]
    pub only: Option<String>,
    /// Write the JSON report to FILE (`-` for stdout, which replaces the table).
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Write a self-contained HTML report to FILE: the verdict, error along depth, a token x
    /// layer heat map, the first divergent tensor per dimension, a sortable table (computes
    /// per-token and per-dimension cosines).
    #[arg(long, value_name = "FILE")]
    pub html: Option<PathBuf>,
    /// Compare only decode step K (0 = prefill).
    #[arg(long, value_name = "K")]
    pub step: Option<u32>,
    /// Judge each tensor against its noise floor instead of --cos/--nmse/--norm-tol: the
    /// disagreement of two dumps of the reference at different precisions (f64 and f32 for
    /// an f32 target, f32 and bf16 for native/q8; `python -m loupe_reference dump --dtype`).
    #[arg(long, num_args = 2, value_names = ["HIGH", "LOW"])]
    pub calibrate: Option<Vec<PathBuf>>,
    /// With --calibrate: a tensor diverges when its error is more than F times its floor.
    #[arg(long, value_name = "F", default_value_t = loupe_parity::calibrate::DEFAULT_FACTOR, requires = "calibrate")]
    pub calibration_factor: f64,
}

/// An indicatif bar on stderr, shown only for large comparisons (and, as indicatif does,
/// only when stderr is a terminal).
struct Bar(Option<ProgressBar>);

impl Progress for Bar {
    fn start(&mut self, pairs: usize, bytes: u64) {
        if pairs >= BAR_MIN_PAIRS || bytes >= BAR_MIN_BYTES {
            let bar = ProgressBar::new(bytes);
            if let Ok(style) = ProgressStyle::with_template(
                "{spinner} comparing [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} {msg}",
            ) {
                bar.set_style(style.progress_chars("=> "));
            }
            self.0 = Some(bar);
        }
    }
    fn tick(&mut self, name: &str, bytes: u64) {
        if let Some(b) = &self.0 {
            b.inc(bytes);
            b.set_message(name.to_string());
        }
    }
    fn finish(&mut self) {
        if let Some(b) = self.0.take() {
            b.finish_and_clear();
        }
    }
}

fn check(ok: bool, what: &str) -> anyhow::Result<()> {
    if ok {
        Ok(())
    } else {
        anyhow::bail!("{what}")
    }
}

/// Runs the comparison; returns the exit code (0 match, 1 divergence).
pub fn run(args: CompareArgs) -> anyhow::Result<u8> {
    if let Some(p) = &args.html {
        crate::output::check_output_file("--html", p)?;
    }
    check(args.cos > 0.0 && args.cos <= 1.0, "--cos must be in (0, 1]")?;
    check(args.nmse.is_finite() && args.nmse >= 0.0, "--nmse must be a non-negative number")?;
    check(args.norm_tol.is_finite() && args.norm_tol >= 0.0, "--norm-tol must be a non-negative number")?;
    for (flag, v) in [("--rtol", args.rtol), ("--atol", args.atol)] {
        let ok = match v {
            None => true,
            Some(x) => x.is_finite() && x >= 0.0,
        };
        check(ok, &format!("{flag} must be a non-negative number"))?;
    }
    let defaults = Thresholds::default();
    let thresholds = Thresholds {
        cos: args.cos,
        nmse: args.nmse,
        norm_ratio_tol: args.norm_tol,
        rtol: args.rtol.unwrap_or(defaults.rtol),
        atol: args.atol.unwrap_or(defaults.atol),
        mismatches_fail: args.rtol.is_some() || args.atol.is_some(),
        ..defaults
    };
    let only = match &args.only {
        Some(re) => Some(Regex::new(re).map_err(|e| anyhow::anyhow!("--only: {e}"))?),
        None => None,
    };
    let mapping = match &args.map {
        Some(p) => Mapping::load(p)?,
        None => Mapping::default(),
    };
    let calibration = match args.calibrate.as_deref() {
        Some([high, low]) => {
            loupe_parity::calibrate::check_factor(args.calibration_factor)
                .map_err(|e| anyhow::anyhow!("--calibration-factor: {e}"))?;
            Some(Calibration::from_paths(high, low, args.calibration_factor, &mut Bar(None))?)
        }
        _ => None,
    };
    let opts = CompareOptions {
        calibration,
        mapping,
        thresholds,
        token_index: args.token_index,
        per_token: args.per_token || args.html.is_some(),
        per_dim: args.per_dim || args.html.is_some(),
        allow_reshape: args.allow_reshape,
        only,
        step: args.step,
    };
    let report = compare(&args.a, &args.b, &opts, &mut Bar(None))?;
    let json_to_stdout = args.json.as_deref().is_some_and(|p| p.as_os_str() == "-");
    let mut out = std::io::stdout().lock();
    if !json_to_stdout {
        write!(out, "{}", render(&report, RenderOptions { per_token: args.per_token, per_dim: args.per_dim }))?;
    }
    match &args.json {
        Some(_) if json_to_stdout => writeln!(out, "{}", to_json(&report))?,
        Some(path) => {
            std::fs::write(path, to_json(&report) + "\n").map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?
        }
        None => {}
    }
    if let Some(path) = &args.html {
        crate::output::write_html(path, &report)?;
    }
    out.flush()?;
    Ok(report.exit_code())
}
