//! `loupe bench --batch 1,4,8,16,32`: aggregate throughput of the batched engine at several
//! counts of concurrent sequences, measured as llama.cpp's `llama-batched-bench` measures
//! it (`-npp N_PROMPT -ntg N_GEN -npl COUNTS`), so the two compare on the same file and
//! threads (`scripts/bench-vs-llama-cpp --batch`).
//!
//! For each count `npl`: `npl` sequences of `--n-prompt` tokens (BOS, then seeded random
//! ids, different per sequence) are queued at once and computed in one step (the step budget
//! is raised to npl x n_prompt when `--max-batch-tokens` is smaller, so that decode steps are
//! pure decode, as in llama-batched-bench, which processes every prompt before decoding):
//! the prefill time; then `--n-gen` decode steps of one token per sequence are the decode
//! time. Prefill rate = npl x n_prompt / prefill time, decode rate =
//! npl x n_gen / decode time. Unlike llama-batched-bench, which feeds tokens it does not
//! sample, each step samples (greedy argmax over the vocabulary) as a server would. The
//! prefix cache is off (the prompts share nothing). A warm-up round runs first; the figures
//! are medians over the repetitions.

use std::io::Write;
use std::time::Instant;

use anyhow::Context;
use indicatif::{ProgressBar, ProgressStyle};
use loupe_runtime::{BatchEngine, Engine, SamplingParams, SeqRequest};

use crate::args::precision_name;
use crate::bench_common::{bench_tokens, model_size, peak_rss_bytes, write_table, BenchArgs, TOKEN_SEED};
use crate::UsageError;

/// One count of concurrent sequences, over the repetitions.
struct Point {
    npl: usize,
    prefill: Vec<f64>,
    decode: Vec<f64>,
    blocks_used: usize,
    blocks_total: usize,
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    if n == 0 {
        return 0.0;
    }
    if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    }
}

/// Prefill and decode tokens/s of one round at `npl` sequences, and the KV blocks it held.
fn round(engine: &Engine, args: &BenchArgs, npl: usize, round: u64) -> anyhow::Result<(f64, f64, usize, usize)> {
    let model = engine.model();
    let bos = if model.tokenizer.add_bos_token() { model.tokenizer.bos_id() } else { None };
    let vocab = model.config.vocab_size();
    let mut config = args.engine.config(npl, crate::load::draft_model(&args.engine.speculation, &args.model)?)?;
    config.prefix_cache = false;
    // All prompts in one step, so that decode steps are pure decode (llama-batched-bench
    // also processes every prompt before the first decode step).
    config.max_batch_tokens = config.max_batch_tokens.max(npl * args.n_prompt);
    let mut batch = BatchEngine::new(engine, config)?;
    for s in 0..npl {
        let prompt = bench_tokens(args.n_prompt, bos, vocab, TOKEN_SEED ^ (round << 32) ^ s as u64);
        // n_gen decode steps after the first token, which the prefill's logits give.
        batch.add(SeqRequest {
            prompt,
            max_tokens: args.n_gen + 1,
            sampling: SamplingParams::default(),
            stop_ids: Vec::new(),
            logprobs: None,
            grammar: None,
            fast_forward: false,
            speculate: true,
        })?;
    }
    let start = Instant::now();
    let mut prefill_steps = 0;
    while batch.stats().prefill_tokens_computed < (npl * args.n_prompt) as u64 {
        batch.step()?;
        prefill_steps += 1;
        if prefill_steps > npl * args.n_prompt + 1 {
            anyhow::bail!("the engine did not finish the prompts");
        }
    }
    let prefill_s = start.elapsed().as_secs_f64();
    let start = Instant::now();
    let mut peak = 0;
    // Tokens produced (with --speculate a step may produce several per sequence).
    let mut decoded = 0u64;
    while batch.has_work() {
        decoded += batch.step()?.iter().filter(|e| matches!(e, loupe_runtime::SeqEvent::Token { .. })).count() as u64;
        peak = peak.max(batch.stats().blocks_in_use);
    }
    let decode_s = start.elapsed().as_secs_f64();
    if decoded != (npl * args.n_gen) as u64 {
        anyhow::bail!("expected {} decode tokens, the engine produced {decoded}", npl * args.n_gen);
    }
    let spec = batch.stats().spec;
    if spec.draft_tokens > 0 {
        eprintln!(
            "loupe bench: {npl} sequences: speculation verified {} drafts in {} steps, {:.0}% accepted, {:.2} tokens per verification{}",
            spec.draft_tokens,
            spec.verify_steps,
            100.0 * spec.acceptance_rate(),
            spec.tokens_per_verify_step(),
            match args.engine.speculation.speculate {
                crate::args::SpeculateArg::Ngram => " (random prompts give prompt lookup little to copy)",
                _ => "",
            }
        );
    }
    Ok(((npl * args.n_prompt) as f64 / prefill_s, decoded as f64 / decode_s, peak, batch.stats().blocks_total))
}

pub fn run(engine: &Engine, args: &BenchArgs, counts: &[usize]) -> anyhow::Result<()> {
    if args.n_prompt == 0 || args.n_gen == 0 {
        return Err(UsageError("--batch needs --n-prompt and --n-gen of at least 1".into()).into());
    }
    if args.engine.kv_cache_mb == Some(0) {
        return Err(UsageError("--kv-cache-mb 0: the KV cache budget must be at least 1 MiB".into()).into());
    }
    let context = engine.context_length();
    if args.n_prompt + args.n_gen + 1 > context {
        return Err(UsageError(format!(
            "--n-prompt + --n-gen ({}) exceed the context window of {context} tokens",
            args.n_prompt + args.n_gen
        ))
        .into());
    }
    let rounds = args.warmup + args.repetitions;
    let bar = ProgressBar::new((counts.len() * rounds) as u64);
    bar.set_style(
        ProgressStyle::with_template("bench --batch {msg} [{bar:30}] {pos}/{len}")
            .map(|s| s.progress_chars("=> "))
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let mut points = Vec::new();
    for &npl in counts {
        let mut p = Point { npl, prefill: Vec::new(), decode: Vec::new(), blocks_used: 0, blocks_total: 0 };
        for r in 0..rounds {
            bar.set_message(format!("{npl} sequences {}", if r < args.warmup { "warm-up" } else { "run" }));
            let (pp, tg, used, total) =
                round(engine, args, npl, r as u64).with_context(|| format!("{npl} sequences"))?;
            if r >= args.warmup {
                p.prefill.push(pp);
                p.decode.push(tg);
            }
            p.blocks_used = p.blocks_used.max(used);
            p.blocks_total = total;
            bar.inc(1);
        }
        points.push(p);
    }
    bar.finish_and_clear();

    let model = engine.model();
    let precision = precision_name(model.precision);
    let isa = loupe_tensor::quant::Isa::active().name();
    let peak_rss = peak_rss_bytes();
    let size = model_size(model);
    let config = args.engine.config(
        counts.iter().copied().max().unwrap_or(1),
        crate::load::draft_model(&args.engine.speculation, &args.model)?,
    )?;
    let kv_dtype = engine.graph().kv_dtype;
    let one = points.iter().find(|p| p.npl == 1).map(|p| median(&p.decode));
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    if args.json {
        let rows: Vec<serde_json::Value> = points
            .iter()
            .map(|p| {
                serde_json::json!({
                    "npl": p.npl,
                    "prefill_tokens_per_s": median(&p.prefill),
                    "decode_tokens_per_s": median(&p.decode),
                    "prefill_runs": p.prefill,
                    "decode_runs": p.decode,
                    "kv_blocks_used": p.blocks_used,
                    "kv_blocks_total": p.blocks_total,
                })
            })
            .collect();
        let obj = serde_json::json!({
            "loupe_version": env!("CARGO_PKG_VERSION"),
            "mode": "batch",
            "model": model.path.display().to_string(),
            "model_size_bytes": size.as_ref().map(|s| s.bytes),
            "precision": precision,
            "isa": isa,
            "threads": engine.threads(),
            "n_prompt": args.n_prompt,
            "n_gen": args.n_gen,
            "repetitions": args.repetitions,
            "warmup": args.warmup,
            "kv_dtype": kv_dtype.name(),
            "block_size": config.block_size,
            "max_batch_tokens": config.max_batch_tokens,
            "peak_rss_bytes": peak_rss,
            "points": rows,
        });
        writeln!(out, "{obj}").context("writing stdout")?;
    } else {
        writeln!(
            out,
            "{} | CPU {precision} {isa} | {} threads | KV {} in blocks of {} | n_prompt {} n_gen {} | medians of {} runs\n",
            model.path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default(),
            engine.threads(),
            kv_dtype,
            config.block_size,
            args.n_prompt,
            args.n_gen,
            args.repetitions
        )
        .context("writing stdout")?;
        let rows: Vec<[String; 5]> = points
            .iter()
            .map(|p| {
                let tg = median(&p.decode);
                [
                    p.npl.to_string(),
                    format!("{:.1}", median(&p.prefill)),
                    format!("{tg:.1}"),
                    one.map(|o| format!("{:.2}x", tg / o)).unwrap_or_else(|| "-".into()),
                    format!("{} / {}", p.blocks_used, p.blocks_total),
                ]
            })
            .collect();
        write_table(
            &mut out,
            &["sequences", "prefill t/s", "decode t/s", "decode vs 1", "KV blocks used"],
            &rows,
            &[0, 1, 2, 3, 4],
        )
        .context("writing stdout")?;
        let rss =
            peak_rss.map(|b| format!("{:.1} MiB", b as f64 / (1024.0 * 1024.0))).unwrap_or_else(|| "unknown".into());
        writeln!(out, "\npeak RSS {rss} (model load included)").context("writing stdout")?;
    }
    out.flush().context("writing stdout")?;
    Ok(())
}
