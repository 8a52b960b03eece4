//! The server's metrics, rendered in the Prometheus text format (version 0.0.4) at
//! `GET /metrics`. Names take MAX's meanings with a `loupe_` prefix (see
//! `docs/serving.md` for the list); times are in milliseconds, as MAX reports them.
//!
//! The text format is small enough to write directly: counters and gauges are atomics,
//! histograms a mutex over cumulative bucket counts.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Mutex;

/// Bucket upper bounds for latencies in milliseconds (1 ms to 2 min).
const MS_BUCKETS: &[f64] = &[
    1.0, 2.5, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0, 2500.0, 5000.0, 10000.0, 30000.0, 60000.0, 120000.0,
];
/// Bucket upper bounds for batch sizes (sequences per step).
const SIZE_BUCKETS: &[f64] = &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0];
/// Bucket upper bounds for tokens per step.
const TOKEN_BUCKETS: &[f64] = &[1.0, 4.0, 16.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0];

/// A Prometheus histogram: cumulative buckets, sum and count.
pub struct Histogram {
    bounds: &'static [f64],
    state: Mutex<HistogramState>,
}

#[derive(Default)]
struct HistogramState {
    /// Observations at or below each bound (not yet cumulative).
    buckets: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    fn new(bounds: &'static [f64]) -> Histogram {
        Histogram { bounds, state: Mutex::new(HistogramState { buckets: vec![0; bounds.len()], sum: 0.0, count: 0 }) }
    }

    pub fn observe(&self, value: f64) {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(i) = self.bounds.iter().position(|&b| value <= b) {
            s.buckets[i] += 1;
        }
        s.sum += value;
        s.count += 1;
    }

    /// Observations so far.
    pub fn count(&self) -> u64 {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).count
    }

    fn render(&self, out: &mut String, name: &str, labels: &str) {
        let s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let sep = if labels.is_empty() { "" } else { "," };
        let mut cumulative = 0;
        for (bound, n) in self.bounds.iter().zip(&s.buckets) {
            cumulative += n;
            let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"{bound}\"}} {cumulative}");
        }
        let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"+Inf\"}} {}", s.count);
        let braces = if labels.is_empty() { String::new() } else { format!("{{{labels}}}") };
        let _ = writeln!(out, "{name}_sum{braces} {}", s.sum);
        let _ = writeln!(out, "{name}_count{braces} {}", s.count);
    }
}

/// A counter that only goes up.
#[derive(Default)]
pub struct Counter(AtomicU64);

impl Counter {
    pub fn add(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// A value that goes up and down.
#[derive(Default)]
pub struct Gauge(AtomicI64);

impl Gauge {
    pub fn set(&self, v: i64) {
        self.0.store(v, Ordering::Relaxed);
    }
    pub fn add(&self, v: i64) {
        self.0.fetch_add(v, Ordering::Relaxed);
    }
    pub fn get(&self) -> i64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// The phases of start-up timed in `loupe_model_load_time_milliseconds{component}`.
pub const LOAD_PHASES: [&str; 3] = ["load", "kv_cache", "total"];

/// Everything `/metrics` reports.
pub struct Metrics {
    /// Start-up phases: `load` (read, build and lower the model), `kv_cache` (allocate the
    /// paged cache and start the engine thread), `total` (process start to ready).
    pub model_load_time: [Histogram; 3],
    pub time_to_first_token: Histogram,
    /// Per request: decode time / (generated tokens - 1), the first token excluded.
    pub time_per_output_token: Histogram,
    /// Arrival to the last token, per request.
    pub request_latency: Histogram,
    /// Sequences per step by batch type: [CE (prompt chunks), TG (one new token each)].
    pub batch_size: [Histogram; 2],
    pub batch_input_tokens: [Histogram; 2],
    /// Sequences the scheduler has queued but not started, sampled each step.
    pub requests_queued: Gauge,
    pub requests_running: Gauge,
    /// Accepted by the HTTP layer, not yet handed to the engine thread.
    pub requests_awaiting_admission: Gauge,
    /// Produced by the engine, not yet taken by the request's HTTP handler.
    pub responses_buffered: Gauge,
    /// Time a response waits in its request's output queue.
    pub response_queue_time: Histogram,
    pub prompt_tokens: Counter,
    /// Prompt tokens whose keys and values came from the prefix cache.
    pub cached_prompt_tokens: Counter,
    pub generated_tokens: Counter,
    /// Requests answered, by outcome: [success, client error (4xx), server error (5xx)].
    pub requests: [Counter; 3],
    pub kv_blocks_used: Gauge,
    pub kv_blocks_total: Gauge,
    /// Full prompt blocks looked up in the prefix cache, and found.
    pub prefix_cache_queries: Gauge,
    pub prefix_cache_hits: Gauge,
    pub preemptions: Gauge,
    /// The prefix cache's disk tier ([`Metrics::sample_disk`]): blocks written, blocks
    /// restored, files refused, and the bytes of its files now.
    pub disk_blocks_written: Gauge,
    pub disk_blocks_restored: Gauge,
    pub disk_files_invalid: Gauge,
    pub disk_bytes: Gauge,
    /// Speculative decoding ([`Metrics::sample_spec`]): verification steps with drafts,
    /// draft tokens, accepted draft tokens (vLLM's `spec_decode_*` meanings).
    pub spec_drafts: Gauge,
    pub spec_draft_tokens: Gauge,
    pub spec_accepted_tokens: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        let ms = || Histogram::new(MS_BUCKETS);
        Metrics {
            model_load_time: [ms(), ms(), ms()],
            time_to_first_token: ms(),
            time_per_output_token: ms(),
            request_latency: ms(),
            batch_size: [Histogram::new(SIZE_BUCKETS), Histogram::new(SIZE_BUCKETS)],
            batch_input_tokens: [Histogram::new(TOKEN_BUCKETS), Histogram::new(TOKEN_BUCKETS)],
            requests_queued: Gauge::default(),
            requests_running: Gauge::default(),
            requests_awaiting_admission: Gauge::default(),
            responses_buffered: Gauge::default(),
            response_queue_time: ms(),
            prompt_tokens: Counter::default(),
            cached_prompt_tokens: Counter::default(),
            generated_tokens: Counter::default(),
            requests: Default::default(),
            kv_blocks_used: Gauge::default(),
            kv_blocks_total: Gauge::default(),
            prefix_cache_queries: Gauge::default(),
            prefix_cache_hits: Gauge::default(),
            preemptions: Gauge::default(),
            disk_blocks_written: Gauge::default(),
            disk_blocks_restored: Gauge::default(),
            disk_files_invalid: Gauge::default(),
            disk_bytes: Gauge::default(),
            spec_drafts: Gauge::default(),
            spec_draft_tokens: Gauge::default(),
            spec_accepted_tokens: Gauge::default(),
        }
    }
}

/// An engine counter as a gauge's i64, saturating (a count past i64::MAX is not reachable,
/// but the conversion must not panic or wrap).
fn gauge_value(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

fn header(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

impl Metrics {
    /// Copies the disk tier's counters (the engine thread calls it with its other gauges).
    pub fn sample_disk(&self, d: &loupe_runtime::DiskStats) {
        self.disk_blocks_written.set(gauge_value(d.written_blocks));
        self.disk_blocks_restored.set(gauge_value(d.restored_blocks));
        self.disk_files_invalid.set(gauge_value(d.invalid_files));
        self.disk_bytes.set(gauge_value(d.bytes));
    }

    /// Copies speculation's counters (the engine thread calls it with its other gauges).
    pub fn sample_spec(&self, s: &loupe_runtime::SpecStats) {
        self.spec_drafts.set(gauge_value(s.verify_steps));
        self.spec_draft_tokens.set(gauge_value(s.draft_tokens));
        self.spec_accepted_tokens.set(gauge_value(s.accepted_tokens));
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let name = "loupe_model_load_time_milliseconds";
        header(&mut out, name, "histogram", "Start-up time by phase (component: load, kv_cache, total).");
        for (h, phase) in self.model_load_time.iter().zip(LOAD_PHASES) {
            h.render(&mut out, name, &format!("component=\"{phase}\""));
        }
        for (h, name, help) in [
            (
                &self.time_to_first_token,
                "loupe_time_to_first_token_milliseconds",
                "Request arrival to its first generated token.",
            ),
            (
                &self.time_per_output_token,
                "loupe_time_per_output_token_milliseconds",
                "Per request: decode time / (generated tokens - 1).",
            ),
            (&self.request_latency, "loupe_request_latency_milliseconds", "Request arrival to its last token."),
            (
                &self.response_queue_time,
                "loupe_response_queue_time_milliseconds",
                "Time a response waits in its request's output queue.",
            ),
        ] {
            header(&mut out, name, "histogram", help);
            h.render(&mut out, name, "");
        }
        for (hs, name, help) in [
            (
                &self.batch_size,
                "loupe_batch_size",
                "Sequences per engine step, by batch type (CE: prompt chunks, TG: token generation).",
            ),
            (&self.batch_input_tokens, "loupe_batch_input_tokens", "Tokens per engine step, by batch type."),
        ] {
            header(&mut out, name, "histogram", help);
            for (h, kind) in hs.iter().zip(["CE", "TG"]) {
                h.render(&mut out, name, &format!("batch_type=\"{kind}\""));
            }
        }
        for (g, name, help) in [
            (
                &self.requests_queued,
                "loupe_num_requests_queued",
                "Requests queued by the scheduler, not yet started (sampled each step).",
            ),
            (
                &self.requests_running,
                "loupe_num_requests_running",
                "Sequences in the running batch (sampled each step).",
            ),
            (
                &self.requests_awaiting_admission,
                "loupe_num_requests_awaiting_admission",
                "Requests accepted by the HTTP layer, not yet handed to the engine.",
            ),
            (
                &self.responses_buffered,
                "loupe_num_responses_buffered",
                "Responses produced by the engine, not yet taken by their HTTP handler.",
            ),
            (&self.kv_blocks_used, "loupe_kv_cache_blocks_used", "KV cache blocks held by sequences."),
            (&self.kv_blocks_total, "loupe_kv_cache_blocks_total", "KV cache blocks in all."),
            (
                &self.disk_bytes,
                "loupe_prefix_cache_disk_bytes",
                "Bytes of the prefix cache's block files on disk (--prefix-cache-dir).",
            ),
        ] {
            header(&mut out, name, "gauge", help);
            let _ = writeln!(out, "{name} {}", g.get());
        }
        // Counters the engine thread keeps itself are exported as counters too.
        for (v, name, help) in [
            (self.prompt_tokens.get(), "loupe_prompt_tokens_total", "Prompt tokens of admitted requests."),
            (
                self.cached_prompt_tokens.get(),
                "loupe_cached_prompt_tokens_total",
                "Prompt tokens served from the prefix cache.",
            ),
            (self.generated_tokens.get(), "loupe_generated_tokens_total", "Tokens generated."),
            (
                self.prefix_cache_queries.get().max(0) as u64,
                "loupe_prefix_cache_queries_total",
                "Full prompt blocks looked up in the prefix cache.",
            ),
            (
                self.prefix_cache_hits.get().max(0) as u64,
                "loupe_prefix_cache_hits_total",
                "Full prompt blocks found in the prefix cache.",
            ),
            (
                self.preemptions.get().max(0) as u64,
                "loupe_preemptions_total",
                "Sequences preempted for lack of KV blocks (recomputed later).",
            ),
            (
                self.disk_blocks_written.get().max(0) as u64,
                "loupe_prefix_cache_disk_blocks_written_total",
                "Prefix-cache blocks evicted from memory and written to disk.",
            ),
            (
                self.disk_blocks_restored.get().max(0) as u64,
                "loupe_prefix_cache_disk_blocks_restored_total",
                "Prefix-cache blocks read back from disk on a prefix hit.",
            ),
            (
                self.disk_files_invalid.get().max(0) as u64,
                "loupe_prefix_cache_disk_files_invalid_total",
                "Prefix-cache block files refused (corrupt, truncated, another model's) and deleted.",
            ),
            (
                self.spec_drafts.get().max(0) as u64,
                "loupe_spec_decode_num_drafts_total",
                "Speculative decoding: steps of a sequence that verified drafts.",
            ),
            (
                self.spec_draft_tokens.get().max(0) as u64,
                "loupe_spec_decode_num_draft_tokens_total",
                "Speculative decoding: draft tokens proposed and verified.",
            ),
            (
                self.spec_accepted_tokens.get().max(0) as u64,
                "loupe_spec_decode_num_accepted_tokens_total",
                "Speculative decoding: draft tokens accepted (produced without a step of their own).",
            ),
        ] {
            header(&mut out, name, "counter", help);
            let _ = writeln!(out, "{name} {v}");
        }
        let name = "loupe_requests_total";
        header(&mut out, name, "counter", "Requests answered, by outcome.");
        for (c, outcome) in self.requests.iter().zip(["success", "client_error", "server_error"]) {
            let _ = writeln!(out, "{name}{{outcome=\"{outcome}\"}} {}", c.get());
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_cumulative_and_end_at_count() {
        let m = Metrics::default();
        for v in [0.5, 3.0, 3.0, 1e9] {
            m.time_to_first_token.observe(v);
        }
        let text = m.render();
        let line =
            |s: &str| text.lines().find(|l| l.starts_with(s)).unwrap_or_else(|| panic!("no line {s}")).to_string();
        assert_eq!(
            line("loupe_time_to_first_token_milliseconds_bucket{le=\"1\"}"),
            "loupe_time_to_first_token_milliseconds_bucket{le=\"1\"} 1"
        );
        assert_eq!(
            line("loupe_time_to_first_token_milliseconds_bucket{le=\"5\"}"),
            "loupe_time_to_first_token_milliseconds_bucket{le=\"5\"} 3"
        );
        assert_eq!(
            line("loupe_time_to_first_token_milliseconds_bucket{le=\"120000\"}"),
            "loupe_time_to_first_token_milliseconds_bucket{le=\"120000\"} 3"
        );
        assert_eq!(
            line("loupe_time_to_first_token_milliseconds_bucket{le=\"+Inf\"}"),
            "loupe_time_to_first_token_milliseconds_bucket{le=\"+Inf\"} 4"
        );
        assert_eq!(
            line("loupe_time_to_first_token_milliseconds_count"),
            "loupe_time_to_first_token_milliseconds_count 4"
        );
        m.batch_size[1].observe(8.0);
        assert!(m.render().contains("loupe_batch_size_bucket{batch_type=\"TG\",le=\"8\"} 1"));
    }

    #[test]
    fn every_metric_has_help_and_type() {
        let text = Metrics::default().render();
        let types = text.lines().filter(|l| l.starts_with("# TYPE")).count();
        let helps = text.lines().filter(|l| l.starts_with("# HELP")).count();
        assert_eq!(types, helps);
        assert!(types >= 20, "{types} metrics");
        assert!(text.lines().filter(|l| !l.starts_with('#')).all(|l| l.starts_with("loupe_")));
    }

    #[test]
    fn disk_tier_counters_are_exported() {
        let m = Metrics::default();
        m.sample_disk(&loupe_runtime::DiskStats {
            written_blocks: 7,
            restored_blocks: 3,
            invalid_files: 1,
            bytes: 4096,
            ..Default::default()
        });
        let text = m.render();
        for line in [
            "loupe_prefix_cache_disk_blocks_written_total 7",
            "loupe_prefix_cache_disk_blocks_restored_total 3",
            "loupe_prefix_cache_disk_files_invalid_total 1",
            "loupe_prefix_cache_disk_bytes 4096",
        ] {
            assert!(text.lines().any(|l| l == line), "{line}");
        }
    }
}
