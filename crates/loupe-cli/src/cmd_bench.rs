//! `loupe bench`: prefill and decode throughput, measured the way llama.cpp's `llama-bench`
//! measures it, so the two can be compared on the same file and threads
//! (`scripts/bench-vs-llama-cpp`).
//!
//! * `pp<N>` (prompt processing): one forward pass over `N` tokens from an empty cache,
//!   logits of the last token only. Tokens are BOS (when the model adds one) followed by
//!   seeded pseudo-random ids, as llama-bench's `test_prompt` does with `rand() % n_vocab`.
//! * `tg<N>` (text generation): `N` single-token forward passes from an empty cache, each
//!   feeding a pseudo-random id rather than a sampled one (llama-bench's `test_gen`), so the
//!   figure is the cost of the decode step and nothing else.
//! * Warm-up, also as llama-bench: a full `pp` run and one decode step before the timed
//!   repetitions, so buffers and the cache are allocated and pages are resident.

use std::io::Write;
use std::time::Instant;

use anyhow::Context;
use indicatif::{ProgressBar, ProgressStyle};
use loupe_graph::debug::DebugOptions;
use loupe_models::Model;

use crate::args::{precision_name, PrecisionArg};
pub use crate::bench_common::BenchArgs;
use crate::bench_common::{bench_tokens, model_size, peak_rss_bytes, write_table, ModelSize, TOKEN_SEED};
use crate::load::{load, Load};
use crate::UsageError;

/// The timings of one test (`pp512`, `tg128`).
#[derive(Clone)]
struct TestResult {
    name: String,
    tokens: usize,
    /// Tokens per second of each repetition, in run order.
    runs: Vec<f64>,
}

impl TestResult {
    fn mean(&self) -> f64 {
        self.runs.iter().sum::<f64>() / self.runs.len() as f64
    }

    /// Sample standard deviation (n - 1), as llama-bench reports; 0 for one run.
    fn stddev(&self) -> f64 {
        let n = self.runs.len();
        if n < 2 {
            return 0.0;
        }
        let mean = self.mean();
        (self.runs.iter().map(|r| (r - mean) * (r - mean)).sum::<f64>() / (n - 1) as f64).sqrt()
    }
}

/// Bytes a decode step reads from memory: every weight it multiplies by (read once per token,
/// as stored: blocks for native/q8, f32 for f32) and the KV cache rows attention reads.
/// Activations stay in cache and are not counted. Decode is memory-bound, so
/// bytes per token x tokens/s is the bandwidth the engine draws, to set against the machine's.
struct DecodeTraffic {
    weight_bytes: u64,
    /// KV cache bytes per position of context (all layers, K and V).
    kv_bytes_per_position: u64,
}

impl DecodeTraffic {
    /// Mean bytes per step of a tg run of `n_gen` steps from an empty cache (context 1..=n_gen).
    fn bytes_per_token(&self, n_gen: usize) -> f64 {
        self.weight_bytes as f64 + self.kv_bytes_per_position as f64 * (n_gen as f64 + 1.0) / 2.0
    }
}

pub fn run(args: BenchArgs, debug: &DebugOptions) -> anyhow::Result<()> {
    check_args(&args)?;
    let profiler = args.profile.profiler()?;
    let mut engine = load(
        &args.model,
        Load { profiler: profiler.clone(), ..Load::new(args.model.precision_or(PrecisionArg::Auto)) },
        debug,
    )?;
    args.prefill.apply(&mut engine);
    if let Some(counts) = args.batch.clone() {
        crate::bench_batch::run(&engine, &args, &counts.0)?;
        return args.profile.report(profiler.as_ref());
    }
    let workload = Workload::of(&engine, &args)?;
    let mut tests = time_tests(&engine, &args, &workload)?;
    let grammar = match args.grammar.spec()? {
        Some(spec) if args.n_gen > 0 => Some(grammar_tests(&engine, &spec, &args, workload.bos)?),
        Some(_) => return Err(UsageError("a grammar benchmark needs decode steps (--n-gen > 0)".into()).into()),
        None => None,
    };
    if let Some(g) = &grammar {
        tests.extend([g.free.clone(), g.constrained.clone()]);
    }
    let report = Report::measure(&engine, &args, tests, grammar);
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    if args.json { report.write_json(&mut out) } else { report.write_text(&mut out) }
        .and_then(|()| out.flush())
        .context("writing stdout")?;
    args.profile.report(profiler.as_ref())
}

/// Refuses flag values that would measure nothing.
fn check_args(args: &BenchArgs) -> anyhow::Result<()> {
    if args.repetitions == 0 {
        return Err(UsageError("--repetitions must be at least 1".into()).into());
    }
    if args.n_prompt == 0 && args.n_gen == 0 {
        return Err(UsageError("nothing to measure: --n-prompt and --n-gen are both 0".into()).into());
    }
    Ok(())
}

/// What the timed tests feed the model: checked against its context window and vocabulary.
struct Workload {
    vocab: usize,
    /// BOS, when the model's tokenizer adds one (llama-bench's prompts start with it).
    bos: Option<u32>,
}

impl Workload {
    fn of(engine: &loupe_runtime::Engine, args: &BenchArgs) -> anyhow::Result<Workload> {
        let model = engine.model();
        let context = model.config.max_position_embeddings().min(model.graph.context_length);
        for (flag, n) in [("--n-prompt", args.n_prompt), ("--n-gen", args.n_gen)] {
            if n > context {
                return Err(
                    UsageError(format!("{flag} {n}: more tokens than the context window of {context} tokens")).into()
                );
            }
        }
        let vocab = model.config.vocab_size();
        if vocab == 0 {
            return Err(UsageError(format!("{}: the model has an empty vocabulary", model.path.display())).into());
        }
        let bos = if model.tokenizer.add_bos_token() { model.tokenizer.bos_id() } else { None };
        Ok(Workload { vocab, bos })
    }
}

/// The `pp` and `tg` tests (those asked for), warm-up runs first, on one session, with a
/// progress bar on stderr.
fn time_tests(engine: &loupe_runtime::Engine, args: &BenchArgs, w: &Workload) -> anyhow::Result<Vec<TestResult>> {
    let needed = args.n_prompt.max(args.n_gen);
    let mut session = engine.session(needed);
    session.reserve(needed);
    let runs_per_test = args.warmup + args.repetitions;
    let total_steps =
        if args.n_prompt > 0 { runs_per_test } else { 0 } + if args.n_gen > 0 { runs_per_test } else { 0 };
    let bar = ProgressBar::new(total_steps as u64);
    bar.set_style(
        ProgressStyle::with_template("bench {msg} [{bar:30}] {pos}/{len}")
            .map(|s| s.progress_chars("=> "))
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let mut tests = Vec::new();
    if args.n_prompt > 0 {
        tests.push(time_prefill(&mut session, args, w, &bar)?);
    }
    if args.n_gen > 0 {
        tests.push(time_decode(&mut session, args, w, &bar)?);
    }
    bar.finish_and_clear();
    Ok(tests)
}

/// `pp<N>`: one forward pass over N tokens from an empty cache, per run.
fn time_prefill(
    session: &mut loupe_runtime::Session<'_>,
    args: &BenchArgs,
    w: &Workload,
    bar: &ProgressBar,
) -> anyhow::Result<TestResult> {
    let tokens = bench_tokens(args.n_prompt, w.bos, w.vocab, TOKEN_SEED);
    let name = format!("pp{}", args.n_prompt);
    let mut runs = Vec::with_capacity(args.repetitions);
    for i in 0..args.warmup + args.repetitions {
        let warm = i < args.warmup;
        bar.set_message(format!("{name} {}", if warm { "warm-up" } else { "run" }));
        session.reset();
        let start = Instant::now();
        session.forward(&tokens, false, None).with_context(|| format!("{name}: forward pass"))?;
        let seconds = start.elapsed().as_secs_f64();
        if !warm {
            runs.push(args.n_prompt as f64 / seconds);
        }
        bar.inc(1);
    }
    Ok(TestResult { name, tokens: args.n_prompt, runs })
}

/// `tg<N>`: N single-token decode steps from an empty cache, per run (a warm-up run takes one).
fn time_decode(
    session: &mut loupe_runtime::Session<'_>,
    args: &BenchArgs,
    w: &Workload,
    bar: &ProgressBar,
) -> anyhow::Result<TestResult> {
    // A different seed from pp's, as llama-bench's rand() stream has moved on by then.
    let tokens = bench_tokens(args.n_gen, w.bos, w.vocab, TOKEN_SEED ^ 0x7467);
    let name = format!("tg{}", args.n_gen);
    let mut runs = Vec::with_capacity(args.repetitions);
    for i in 0..args.warmup + args.repetitions {
        let warm = i < args.warmup;
        bar.set_message(format!("{name} {}", if warm { "warm-up" } else { "run" }));
        session.reset();
        // llama-bench warms generation up with a single decode step.
        let steps = if warm { &tokens[..1] } else { &tokens[..] };
        let start = Instant::now();
        for token in steps {
            session
                .forward(std::slice::from_ref(token), false, None)
                .with_context(|| format!("{name}: decode step"))?;
        }
        let seconds = start.elapsed().as_secs_f64();
        if !warm {
            runs.push(args.n_gen as f64 / seconds);
        }
        bar.inc(1);
    }
    Ok(TestResult { name, tokens: args.n_gen, runs })
}

/// Everything the report prints: the tests' timings and what is derived from them and the
/// machine (peak RSS, decode traffic, the read-bandwidth ceiling).
struct Report<'a> {
    args: &'a BenchArgs,
    model: &'a Model,
    threads: usize,
    load_s: f64,
    size: Option<ModelSize>,
    traffic: DecodeTraffic,
    tests: Vec<TestResult>,
    grammar: Option<GrammarCost>,
    peak_rss: Option<u64>,
    ceiling: Option<crate::bandwidth::ReadBandwidth>,
    isa: &'static str,
    isa_detected: &'static str,
}

impl<'a> Report<'a> {
    /// Reads peak RSS first, then measures the read-bandwidth ceiling (its buffer would
    /// dominate RSS) with the engine's thread count, only when there is a decode figure to set
    /// against it.
    fn measure(
        engine: &'a loupe_runtime::Engine,
        args: &'a BenchArgs,
        tests: Vec<TestResult>,
        grammar: Option<GrammarCost>,
    ) -> Report<'a> {
        let model = engine.model();
        let peak_rss = peak_rss_bytes();
        let has_tg = tests.iter().any(|t| t.name.starts_with("tg"));
        let ceiling = (has_tg && !args.no_ceiling)
            .then(|| {
                crate::bandwidth::measure(
                    engine.threads(),
                    crate::bandwidth::DEFAULT_BUFFER_BYTES,
                    crate::bandwidth::DEFAULT_PASSES,
                )
            })
            .flatten();
        Report {
            args,
            model,
            threads: engine.threads(),
            load_s: engine.load_time().as_secs_f64(),
            size: model_size(model),
            traffic: decode_traffic(model),
            tests,
            grammar,
            peak_rss,
            ceiling,
            isa: loupe_tensor::quant::Isa::active().name(),
            isa_detected: loupe_tensor::quant::Isa::detected().name(),
        }
    }

    fn pp(&self) -> Option<&TestResult> {
        self.tests.iter().find(|t| t.name.starts_with("pp"))
    }

    fn tg(&self) -> Option<&TestResult> {
        self.tests.iter().find(|t| t.name.starts_with("tg"))
    }

    fn tg_bytes_per_token(&self) -> Option<f64> {
        self.tg().map(|t| self.traffic.bytes_per_token(t.tokens))
    }

    /// The bandwidth decode draws: bytes per token x tokens/s.
    fn tg_read_gb_per_s(&self) -> Option<f64> {
        self.tg().zip(self.tg_bytes_per_token()).map(|(t, b)| b * t.mean() / 1e9)
    }

    /// Decode's bandwidth as a share of the machine's median read bandwidth.
    fn share(&self) -> Option<f64> {
        self.tg_read_gb_per_s().zip(self.ceiling).map(|(gbs, c)| gbs / c.median_gb_per_s)
    }

    /// One JSON object.
    fn write_json(&self, out: &mut impl Write) -> std::io::Result<()> {
        let (args, model, size, ceiling, traffic) = (self.args, self.model, &self.size, self.ceiling, &self.traffic);
        let (pp, tg, grammar_cost) = (self.pp(), self.tg(), &self.grammar);
        let precision = precision_name(model.precision);
        let (isa, isa_detected, threads, load_s, peak_rss) =
            (self.isa, self.isa_detected, self.threads, self.load_s, self.peak_rss);
        let (tg_bytes_per_token, tg_read_gb_per_s, share) =
            (self.tg_bytes_per_token(), self.tg_read_gb_per_s(), self.share());
        let obj = serde_json::json!({
            "loupe_version": env!("CARGO_PKG_VERSION"),
            "model": model.path.display().to_string(),
            "model_size_bytes": size.as_ref().map(|s| s.bytes),
            "model_params": size.as_ref().map(|s| s.params),
            "precision": precision,
            "isa": isa,
            "isa_detected": isa_detected,
            "kv_dtype": model.graph.kv_dtype.name(),
            "threads": threads,
            "n_prompt": args.n_prompt,
            "n_gen": args.n_gen,
            "repetitions": args.repetitions,
            "warmup": args.warmup,
            "load_s": load_s,
            "weights": if model.weights_in_place { "mapped" } else { "copied" },
            "pp_tokens_per_s": pp.map(TestResult::mean),
            "pp_stddev": pp.map(TestResult::stddev),
            "pp_runs": pp.map(|t| t.runs.clone()),
            "tg_tokens_per_s": tg.map(TestResult::mean),
            "tg_stddev": tg.map(TestResult::stddev),
            "tg_runs": tg.map(|t| t.runs.clone()),
            "peak_rss_bytes": peak_rss,
            "weight_bytes_per_token": traffic.weight_bytes,
            "kv_bytes_per_position": traffic.kv_bytes_per_position,
            "tg_bytes_per_token": tg_bytes_per_token,
            "tg_read_gb_per_s": tg_read_gb_per_s,
            "read_bandwidth_gb_per_s_median": ceiling.map(|c| c.median_gb_per_s),
            "read_bandwidth_gb_per_s_best": ceiling.map(|c| c.best_gb_per_s),
            "read_bandwidth_buffer_bytes": ceiling.map(|c| c.buffer_bytes),
            "read_bandwidth_passes": ceiling.map(|c| c.passes),
            "read_bandwidth_huge_pages": ceiling.map(|c| c.huge_pages),
            "tg_share_of_read_bandwidth": share,
            "grammar": grammar_cost.as_ref().map(|g| serde_json::json!({
                "kind": g.kind,
                "greedy_tokens_per_s_runs": g.free.runs,
                "constrained_tokens_per_s_runs": g.constrained.runs,
                "ratio_of_medians": median(&g.constrained.runs) / median(&g.free.runs),
                "masks": g.masks,
                "mask_ms_mean": g.mask_ms,
            })),
        });
        writeln!(out, "{obj}")
    }

    /// llama-bench's table, then one line each for the run, decode's traffic, the bandwidth
    /// ceiling and the grammar's cost.
    fn write_text(&self, out: &mut impl Write) -> std::io::Result<()> {
        let (args, model, size, tests) = (self.args, self.model, &self.size, &self.tests);
        let (precision, isa, threads) = (precision_name(model.precision), self.isa, self.threads);
        let model_name = model
            .path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| model.path.display().to_string());
        let size_cell = size
            .as_ref()
            .map(|s| format!("{:.2} MiB", s.bytes as f64 / (1024.0 * 1024.0)))
            .unwrap_or_else(|| "-".into());
        let params_cell =
            size.as_ref().map(|s| format!("{:.2} M", s.params as f64 / 1e6)).unwrap_or_else(|| "-".into());
        let backend = format!("CPU {precision} {isa}");
        let rows: Vec<[String; 7]> = tests
            .iter()
            .map(|t| {
                [
                    model_name.clone(),
                    size_cell.clone(),
                    params_cell.clone(),
                    backend.clone(),
                    threads.to_string(),
                    t.name.clone(),
                    format!("{:.2} ± {:.2}", t.mean(), t.stddev()),
                ]
            })
            .collect();
        let header = ["model", "size", "params", "backend", "threads", "test", "t/s"];
        write_table(out, &header, &rows, &[1, 2, 4, 6])?;
        let rss = self
            .peak_rss
            .map(|b| format!("{:.1} MiB", b as f64 / (1024.0 * 1024.0)))
            .unwrap_or_else(|| "unknown".into());
        writeln!(
            out,
            "\nload {:.2} s (weights {}) | peak RSS {rss} | KV cache {} | timed runs per test: {}, warm-up runs: {} | {}",
            self.load_s,
            if model.weights_in_place { "mapped" } else { "copied" },
            model.graph.kv_dtype,
            args.repetitions,
            args.warmup,
            tests.iter().map(|t| format!("{} {} tokens", t.name, t.tokens)).collect::<Vec<_>>().join(", ")
        )?;
        if let (Some(t), Some(bytes), Some(gbs)) = (self.tg(), self.tg_bytes_per_token(), self.tg_read_gb_per_s()) {
            writeln!(
                out,
                "decode reads {:.1} MB per token ({:.1} MB of weights + KV cache, mean over {}): {gbs:.1} GB/s at {:.1} t/s",
                bytes / 1e6,
                self.traffic.weight_bytes as f64 / 1e6,
                t.name,
                t.mean()
            )?;
        }
        if let (Some(c), Some(share)) = (self.ceiling, self.share()) {
            writeln!(
                out,
                "read bandwidth ({} threads, {} MiB buffer on {} pages, {} passes): median {:.1} GB/s, best {:.1} GB/s; decode draws {:.0}% of the median",
                c.threads,
                c.buffer_bytes >> 20,
                if c.huge_pages { "huge" } else { "4 KiB" },
                c.passes,
                c.median_gb_per_s,
                c.best_gb_per_s,
                100.0 * share
            )?;
        }
        if let Some(g) = &self.grammar {
            writeln!(
                out,
                "grammar ({}): greedy decode {:.2} t/s with masks vs {:.2} without, {:.3}x (medians of {} alternations); {} masks, {:.3} ms each, computed during the forward passes",
                g.kind,
                median(&g.constrained.runs),
                median(&g.free.runs),
                median(&g.constrained.runs) / median(&g.free.runs),
                g.free.runs.len(),
                g.masks,
                g.mask_ms
            )?;
        }
        if isa != self.isa_detected {
            writeln!(out, "note: kernels forced to {isa} by LOUPE_ISA; this CPU supports {}", self.isa_detected)?;
        }
        Ok(())
    }
}

/// The constrained-decoding figures of one bench run.
struct GrammarCost {
    kind: &'static str,
    free: TestResult,
    constrained: TestResult,
    masks: u64,
    mask_ms: f64,
}

fn median(runs: &[f64]) -> f64 {
    let mut v = runs.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// Greedy decode of --n-gen tokens without and with `spec`'s masks, alternated run by run
/// so both see the same machine state. Both pick tokens by argmax from the logits (the
/// constrained one after masking), so the only difference is the grammar: its mask
/// (computed on a helper thread during each forward pass, as the engines do), applying it,
/// and advancing it. A grammar that completes is compiled afresh and decoding goes on, as
/// the next request would.
fn grammar_tests(
    engine: &loupe_runtime::Engine,
    spec: &loupe_runtime::GrammarSpec,
    args: &BenchArgs,
    bos: Option<u32>,
) -> anyhow::Result<GrammarCost> {
    let grammars = engine.grammars().map_err(|e| UsageError(e.to_string()))?;
    grammars.compile(spec).map_err(|e| UsageError(e.to_string()))?;
    let prompt = bench_tokens(8, bos, engine.config().vocab_size(), TOKEN_SEED);
    let mut session = engine.session(prompt.len() + args.n_gen + 1);
    session.reserve(prompt.len() + args.n_gen + 1);
    let (mut free, mut constrained) = (Vec::new(), Vec::new());
    let (mut masks, mut mask_time) = (0u64, std::time::Duration::ZERO);
    for i in 0..args.warmup + args.repetitions {
        for with_grammar in [false, true] {
            session.reset();
            let mut logits = session.forward(&prompt, false, None).context("grammar bench: prompt")?.to_vec();
            let mut c = if with_grammar { Some(grammars.compile(spec)?) } else { None };
            let start = Instant::now();
            for _ in 0..args.n_gen {
                if let Some(c) = c.as_mut() {
                    c.apply(&mut logits)?;
                }
                let token = loupe_runtime::argmax(&logits);
                let next = match c.as_mut() {
                    Some(con) => {
                        con.advance(token, false)?;
                        if con.is_finished() {
                            let (n, t) = con.mask_stats();
                            masks += n;
                            mask_time += t;
                            *con = grammars.compile(spec)?;
                        }
                        let (fwd, mask) = std::thread::scope(|s| {
                            let mask = s.spawn(|| con.compute_mask());
                            (session.forward(&[token], false, None).map(<[f32]>::to_vec), mask.join())
                        });
                        mask.map_err(|_| anyhow::anyhow!("the grammar engine panicked"))??;
                        fwd
                    }
                    None => session.forward(&[token], false, None).map(<[f32]>::to_vec),
                };
                logits = next.context("grammar bench: decode step")?;
            }
            let tps = args.n_gen as f64 / start.elapsed().as_secs_f64();
            if let Some(con) = c {
                let (n, t) = con.mask_stats();
                masks += n;
                mask_time += t;
            }
            if i >= args.warmup {
                if with_grammar {
                    constrained.push(tps)
                } else {
                    free.push(tps)
                }
            }
        }
    }
    let name = |s: &str| format!("tg{} {s}", args.n_gen);
    Ok(GrammarCost {
        kind: spec.kind(),
        free: TestResult { name: name("greedy"), tokens: args.n_gen, runs: free },
        constrained: TestResult { name: name("greedy+grammar"), tokens: args.n_gen, runs: constrained },
        masks,
        mask_ms: mask_time.as_secs_f64() * 1e3 / masks.max(1) as f64,
    })
}

/// `n` token ids: BOS first when given, then ids drawn uniformly from `0..vocab` by SplitMix64.
/// Special ids may be drawn, as in llama-bench; a forward pass costs the same for any id.
fn decode_traffic(model: &Model) -> DecodeTraffic {
    let graph = &model.graph;
    let stored = |w: &loupe_graph::Weight| match &w.data {
        loupe_graph::WeightData::F32(v) => 4 * v.len() as u64,
        loupe_graph::WeightData::Quant(q) => q.data.len() as u64,
    };
    let mut weight_bytes = 0;
    for w in &graph.weights {
        let bytes = stored(w);
        // An untied embedding table is only looked up (one row per token); a tied one is also
        // the lm_head and read whole.
        if w.name == "model.embed_tokens.weight" && !model.config.decoder().is_some_and(|c| c.tie_word_embeddings) {
            weight_bytes += bytes / w.shape.first().copied().unwrap_or(1).max(1) as u64;
        } else {
            weight_bytes += bytes;
        }
    }
    // Keys and values of every layer, in the sessions' element type (Graph::kv_dtype).
    let kv_bytes_per_position = (graph.kv_layers * 2 * graph.kv_dtype.row_bytes(graph.kv_width)) as u64;
    DecodeTraffic { weight_bytes, kv_bytes_per_position }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stddev_is_sample_stddev() {
        let t = TestResult { name: "pp8".into(), tokens: 8, runs: vec![1.0, 2.0, 3.0] };
        assert!((t.mean() - 2.0).abs() < 1e-12);
        assert!((t.stddev() - 1.0).abs() < 1e-12);
        let one = TestResult { name: "tg4".into(), tokens: 4, runs: vec![5.0] };
        assert_eq!(one.stddev(), 0.0);
    }
}
