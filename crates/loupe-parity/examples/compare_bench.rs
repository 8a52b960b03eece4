//! Throughput and memory of `loupe compare` on large dumps (a benchmark helper, not a test).
//!
//! ```text
//! cargo run --release -p loupe-parity --example compare_bench -- --gib 1 [--dir DIR] [--style npy|binary|max] [--reuse]
//! ```
//! Writes two synthetic dumps of `--gib` GiB in total (half each: [512, 4096] f32 tensors,
//! the target = reference + 1e-3 noise) into a temp dir (or DIR), compares them, and
//! prints the time, the throughput over the bytes of both sides, and the peak resident
//! memory (VmHWM from /proc/self/status). `--reuse` compares dumps an earlier run left in
//! DIR without writing them again (to profile the comparison alone). The files were just written, so they are read
//! from the page cache: this measures the comparator, not the disk.

use std::time::Instant;

use loupe_parity::{compare, CompareOptions, DumpStyle, DumpWriter, NoProgress};

const T: usize = 512;
const D: usize = 4096;

fn vm_hwm_kib() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// xorshift64* uniform in [-1, 1).
fn fill(state: &mut u64, out: &mut [f32]) {
    for v in out {
        *state ^= *state >> 12;
        *state ^= *state << 25;
        *state ^= *state >> 27;
        let x = state.wrapping_mul(0x2545_F491_4F6C_DD1D);
        *v = ((x >> 40) as f32 / (1u64 << 23) as f32) - 1.0;
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut gib = 1.0f64;
    let mut dir_arg = None;
    let mut style = DumpStyle::Npy;
    let mut reuse = false;
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        match a.as_str() {
            "--reuse" => reuse = true,
            "--gib" => gib = it.next().ok_or("--gib needs a value")?.parse()?,
            "--dir" => dir_arg = Some(std::path::PathBuf::from(it.next().ok_or("--dir needs a value")?)),
            "--style" => {
                style = match it.next().as_deref() {
                    Some("npy") => DumpStyle::Npy,
                    Some("binary") => DumpStyle::Binary,
                    Some("max") => DumpStyle::Max,
                    other => return Err(format!("--style {other:?}: npy, binary or max").into()),
                }
            }
            other => return Err(format!("unknown argument {other}").into()),
        }
    }
    let tmp = tempfile::tempdir()?;
    let root = dir_arg.unwrap_or_else(|| tmp.path().to_path_buf());
    let per_tensor = (T * D * 4) as f64;
    let n = ((gib * (1u64 << 30) as f64 / 2.0) / per_tensor).ceil().max(1.0) as usize;
    let (pa, pb) = (root.join("ref"), root.join("tgt"));
    if reuse && pa.join("manifest.json").is_file() && pb.join("manifest.json").is_file() {
        return run(&pa, &pb, 2.0 * n as f64 * per_tensor);
    }
    let t0 = Instant::now();
    let mut wa = DumpWriter::create(root.join("ref"), "bench", style)?;
    let mut wb = DumpWriter::create(root.join("tgt"), "bench", style)?;
    let (mut sa, mut sb) = (0x1234_5678_9abc_def1u64, 0x0fed_cba9_8765_4321u64);
    let mut a = vec![0f32; T * D];
    let mut noise = vec![0f32; T * D];
    for i in 0..n {
        fill(&mut sa, &mut a);
        fill(&mut sb, &mut noise);
        let b: Vec<f32> = a.iter().zip(&noise).map(|(x, e)| x + 1e-3 * e).collect();
        let name = format!("model.layers.{i}");
        wa.add(&name, 0, &[T, D], &a)?;
        wb.add(&name, 0, &[T, D], &b)?;
    }
    let (pa, pb) = (wa.finish()?, wb.finish()?);
    let bytes = 2.0 * n as f64 * per_tensor;
    eprintln!(
        "wrote {n} + {n} tensors of [{T}, {D}] f32 ({:.2} GiB) in {:.1}s",
        bytes / (1u64 << 30) as f64,
        t0.elapsed().as_secs_f64()
    );
    run(&pa, &pb, bytes)
}

fn run(pa: &std::path::Path, pb: &std::path::Path, bytes: f64) -> Result<(), Box<dyn std::error::Error>> {
    let hwm_before = vm_hwm_kib();
    let t1 = Instant::now();
    let report = compare(pa, pb, &CompareOptions::default(), &mut NoProgress)?;
    let secs = t1.elapsed().as_secs_f64();
    println!("pairs:        {} ({})", report.pairs.len(), report.verdict.verdict);
    println!("compared:     {:.2} GiB in {secs:.2}s", bytes / (1u64 << 30) as f64);
    println!("throughput:   {:.0} MB/s ({:.1} M elements/s per side)", bytes / 1e6 / secs, (bytes / 8.0) / 1e6 / secs);
    match (hwm_before, vm_hwm_kib()) {
        (Some(b), Some(a)) => println!(
            "peak RSS:     {:.1} MiB (VmHWM; {:.1} MiB before comparing)",
            a as f64 / 1024.0,
            b as f64 / 1024.0
        ),
        _ => println!("peak RSS:     unavailable (/proc/self/status)"),
    }
    Ok(())
}
