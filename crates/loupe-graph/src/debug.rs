//! `LOUPE_DEBUG`: runtime debugging options with MAX's names and meanings
//! (docs/max-debugging-options.md), as a plain struct that lowering and the executor are given.
//!
//! This crate holds the options and their per-key parser ([`DebugOptions::apply`]); where
//! they come from (`loupe.toml`, `LOUPE_DEBUG`, `LOUPE_DEBUG_<KEY>`, `--debug`, the API)
//! and their precedence is resolved above it, in `loupe_runtime::debug_config`. Nothing
//! here is process-wide: each [`crate::Executor`] is handed its options and copies them
//! into plain bools when created, so two sessions in one process can differ, and an option
//! that is off costs one predictable branch per node and no lookups while running.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;

/// Where an option's value came from (lowest precedence first).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Source {
    Default,
    File,
    /// `LOUPE_DEBUG_<KEY>`.
    EnvKey,
    /// `MODULAR_MAX_DEBUG_<KEY>`, read for a key whose `LOUPE_DEBUG_<KEY>` is not set.
    ModularKey,
    /// `LOUPE_DEBUG`: beats the per-key variables, as MAX's list beats its per-key variables.
    EnvList,
    /// `MODULAR_DEBUG`, read when `LOUPE_DEBUG` is not set.
    ModularList,
    Flag,
    Api,
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Source::Default => "default",
            Source::File => "loupe.toml",
            Source::EnvList => "LOUPE_DEBUG",
            Source::EnvKey => "LOUPE_DEBUG_<KEY>",
            Source::ModularList => "MODULAR_DEBUG",
            Source::ModularKey => "MODULAR_MAX_DEBUG_<KEY>",
            Source::Flag => "--debug",
            Source::Api => "API",
        })
    }
}

/// `uninitialized-read-mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum UninitMode {
    /// The first poisoned read is an error.
    #[default]
    Abort,
    /// Every poisoned read is a warning on stderr; the run goes on.
    Report,
}

/// `op-log-level`: the `[OP] LAUNCH`/`COMPLETE` lines are info-level messages, printed at
/// `trace`, `debug` and `info`; `notset` (the default) and the levels above info print none.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub enum OpLogLevel {
    #[default]
    NotSet,
    Trace,
    Debug,
    Info,
    Warning,
    Error,
    Critical,
}

impl OpLogLevel {
    pub fn logs_ops(self) -> bool {
        matches!(self, OpLogLevel::Trace | OpLogLevel::Debug | OpLogLevel::Info)
    }
}

/// `assert-level`: the executor's bounds checks around kernel calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub enum AssertLevel {
    /// No extra checks (the kernels' own checks still return errors).
    #[default]
    None,
    /// A failed check is a warning on stderr.
    Warn,
    /// A failed check is an error: input lengths against shapes, KV-cache bounds.
    Safe,
    /// `safe`, plus each kernel's output length checked after it ran.
    All,
}

/// `print-style`: how tensors are printed by `loupe dump` without `--style` and by debug
/// output (MAX's styles; `none` prints nothing).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PrintStyle {
    #[default]
    Compact,
    Full,
    Binary,
    BinaryMaxCheckpoint,
    None,
}

/// Every option; see docs/debugging.md.
#[derive(Debug, Clone, PartialEq)]
pub struct DebugOptions {
    pub nan_check: bool,
    /// Check 1 in N op outputs; 1 checks every one.
    pub nan_check_stride: u32,
    pub uninitialized_read_check: bool,
    pub uninitialized_read_mode: UninitMode,
    /// Accepted; a no-op on CPU, where every kernel has finished when its call returns.
    pub device_sync_mode: bool,
    pub stack_trace_on_error: bool,
    pub stack_trace_on_crash: bool,
    pub source_tracebacks: bool,
    pub op_log_level: OpLogLevel,
    pub assert_level: AssertLevel,
    pub print_style: PrintStyle,
    pub ir_output_dir: Option<PathBuf>,
    /// Stop lowering after this pass (MAX 26.7's `pre-jit` stops once the graph's Mojo is
    /// emitted: tests/fixtures/max-26.7/probes.json).
    pub stop_after: Option<String>,
    /// Run the IR verifier between every two lowering passes (always on in debug builds).
    pub verify_ir: bool,
    /// Where each key set away from its default came from.
    pub sources: BTreeMap<&'static str, Source>,
}

impl Default for DebugOptions {
    fn default() -> Self {
        DebugOptions {
            nan_check: false,
            // MAX's documented default. MAX 26.7 does not take the option in MODULAR_DEBUG and
            // does not report it (tests/fixtures/max-26.7/options.json).
            nan_check_stride: 20,
            uninitialized_read_check: false,
            uninitialized_read_mode: UninitMode::Abort,
            device_sync_mode: false,
            stack_trace_on_error: false,
            stack_trace_on_crash: false,
            source_tracebacks: false,
            op_log_level: OpLogLevel::NotSet,
            assert_level: AssertLevel::None,
            print_style: PrintStyle::Compact,
            ir_output_dir: None,
            stop_after: None,
            verify_ir: false,
            sources: BTreeMap::new(),
        }
    }
}

/// The option names, in the order docs and listings show them.
pub const KEYS: &[&str] = &[
    "sensible",
    "nan-check",
    "nan-check-stride",
    "uninitialized-read-check",
    "uninitialized-read-mode",
    "device-sync-mode",
    "stack-trace-on-error",
    "stack-trace-on-crash",
    "source-tracebacks",
    "op-log-level",
    "assert-level",
    "print-style",
    "ir-output-dir",
    "stop-after",
    "pre-jit",
    "verify-ir",
];

/// loupe's options that MAX 26.7 refuses in `MODULAR_DEBUG` as unknown
/// (tests/fixtures/max-26.7/options.json); it accepts every other name of [`KEYS`], exactly as
/// written.
const LOUPE_ONLY_KEYS: &[&str] = &["nan-check-stride", "stop-after", "verify-ir"];

/// The boolean options (a bare name means on).
const BOOL_KEYS: &[&str] = &[
    "sensible",
    "nan-check",
    "uninitialized-read-check",
    "device-sync-mode",
    "stack-trace-on-error",
    "stack-trace-on-crash",
    "source-tracebacks",
    "pre-jit",
    "verify-ir",
];

/// loupe's own options, which MAX has no name for.
const LOUPE_ONLY: &[&str] = &["stop-after", "verify-ir"];

/// How MAX 26.7 would read a token that loupe accepts differently, for the warning loupe
/// prints (`None`: MAX reads it as loupe does, or it is loupe's own option). `per_key`: the
/// token came from a per-key variable (`LOUPE_DEBUG_<KEY>`), not a comma list. Every case is
/// one MAX was seen to take in tests/fixtures/max-26.7/options.json.
pub fn max_reading(key: &str, value: Option<&str>, per_key: bool) -> Option<String> {
    let norm = key.trim().to_ascii_lowercase().replace('_', "-");
    if LOUPE_ONLY.contains(&norm.as_str()) || !KEYS.contains(&norm.as_str()) {
        return None;
    }
    let is_bool = BOOL_KEYS.contains(&norm.as_str());
    if per_key {
        return match (norm.as_str(), value.map(|v| v.trim().to_ascii_lowercase())) {
            ("sensible", _) => Some("MAX 26.7 ignores MODULAR_MAX_DEBUG_SENSIBLE (it reads _SENSIBLE_MODE, and that does not turn the set on)".into()),
            (_, Some(v)) if is_bool && v == "on" => Some(format!("MAX 26.7 reads '{v}' as false (it takes 1, true or yes)")),
            _ => None,
        };
    }
    if !KEYS.contains(&norm.as_str()) || LOUPE_ONLY_KEYS.contains(&norm.as_str()) {
        return Some(format!("MAX 26.7 ignores '{norm}' in MODULAR_DEBUG as an unknown option"));
    }
    if key != norm {
        return Some(format!(
            "MAX 26.7 reads option names as written (lower case, '-') and ignores '{key}' as an unknown option"
        ));
    }
    match value {
        Some(v) if is_bool => Some(format!(
            "MAX 26.7 takes a boolean option as its bare name and ignores '{key}={v}' as an unknown option"
        )),
        Some(v)
            if key == "print-style" && !["compact", "full", "binary", "binary_max_checkpoint", "none"].contains(&v) =>
        {
            Some(format!("MAX 26.7 reads print-style '{v}' as no style (NONE)"))
        }
        Some(v)
            if ["assert-level", "op-log-level", "uninitialized-read-mode"].contains(&key)
                && v.chars().any(|c| c.is_ascii_uppercase()) =>
        {
            Some(format!("MAX 26.7 keeps '{v}' as written, while loupe reads it in lower case"))
        }
        _ => None,
    }
}

/// A value an option cannot take.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("LOUPE_DEBUG: bad value '{value}' for option '{key}' (from {origin}): expected {expected}")]
pub struct DebugError {
    pub key: String,
    pub value: String,
    pub expected: &'static str,
    pub origin: Source,
}

impl DebugOptions {
    /// Sets one option from code (the API source, highest precedence): an unknown key or a
    /// bad value is an error.
    pub fn with(mut self, key: &str, value: Option<&str>) -> Result<DebugOptions, DebugError> {
        if !self.apply(key, value, Source::Api)? {
            return Err(DebugError {
                key: key.to_string(),
                value: value.unwrap_or("").to_string(),
                expected: "a known option (see docs/debugging.md)",
                origin: Source::Api,
            });
        }
        Ok(self)
    }
}

fn parse_bool(v: &str) -> Option<bool> {
    match v.to_ascii_lowercase().as_str() {
        "1" | "true" | "yes" | "on" => Some(true),
        "0" | "false" | "no" | "off" => Some(false),
        _ => None,
    }
}

impl DebugOptions {
    /// Sets one option; `Ok(false)` for an unknown key. A bare key means `true` for a
    /// boolean option and is a bad value for the others.
    pub fn apply(&mut self, key: &str, value: Option<&str>, source: Source) -> Result<bool, DebugError> {
        let key_norm = key.trim().to_ascii_lowercase().replace('_', "-");
        let Some(&name) = KEYS.iter().find(|k| **k == key_norm) else {
            return Ok(false);
        };
        let bad = |expected: &'static str| DebugError {
            key: name.to_string(),
            value: value.unwrap_or("").to_string(),
            expected,
            origin: source,
        };
        let flag = || -> Result<bool, DebugError> {
            match value {
                None => Ok(true),
                Some(v) => parse_bool(v).ok_or_else(|| bad("a boolean (1/0, true/false, yes/no, on/off)")),
            }
        };
        let text = || value.filter(|v| !v.is_empty());
        match name {
            "sensible" => {
                if flag()? {
                    // MAX's set: the checks cheap enough to leave on while developing.
                    for k in [
                        "nan-check",
                        "device-sync-mode",
                        "stack-trace-on-error",
                        "stack-trace-on-crash",
                        "source-tracebacks",
                    ] {
                        self.apply(k, None, source)?;
                    }
                    self.apply("assert-level", Some("all"), source)?;
                }
            }
            "nan-check" => self.nan_check = flag()?,
            "nan-check-stride" => {
                self.nan_check_stride = text()
                    .and_then(|v| v.parse::<u32>().ok())
                    .filter(|n| *n >= 1)
                    .ok_or_else(|| bad("a positive integer"))?;
            }
            "uninitialized-read-check" => self.uninitialized_read_check = flag()?,
            "uninitialized-read-mode" => {
                self.uninitialized_read_mode = match text().map(str::to_ascii_lowercase).as_deref() {
                    Some("abort") => UninitMode::Abort,
                    Some("report") => UninitMode::Report,
                    _ => return Err(bad("abort or report")),
                }
            }
            "device-sync-mode" => self.device_sync_mode = flag()?,
            "stack-trace-on-error" => self.stack_trace_on_error = flag()?,
            "stack-trace-on-crash" => self.stack_trace_on_crash = flag()?,
            "source-tracebacks" => self.source_tracebacks = flag()?,
            "verify-ir" => self.verify_ir = flag()?,
            "op-log-level" => {
                self.op_log_level = match text().map(str::to_ascii_lowercase).as_deref() {
                    Some("notset") => OpLogLevel::NotSet,
                    Some("trace") => OpLogLevel::Trace,
                    Some("debug") => OpLogLevel::Debug,
                    Some("info") => OpLogLevel::Info,
                    Some("warning") | Some("warn") => OpLogLevel::Warning,
                    Some("error") => OpLogLevel::Error,
                    Some("critical") => OpLogLevel::Critical,
                    _ => return Err(bad("notset, trace, debug, info, warning, error or critical")),
                }
            }
            "assert-level" => {
                self.assert_level = match text().map(str::to_ascii_lowercase).as_deref() {
                    Some("none") => AssertLevel::None,
                    Some("warn") => AssertLevel::Warn,
                    Some("safe") => AssertLevel::Safe,
                    Some("all") => AssertLevel::All,
                    _ => return Err(bad("none, warn, safe or all")),
                }
            }
            "print-style" => {
                self.print_style = match text().map(str::to_ascii_lowercase).as_deref() {
                    Some("compact") => PrintStyle::Compact,
                    Some("full") => PrintStyle::Full,
                    Some("binary") => PrintStyle::Binary,
                    Some("binary_max_checkpoint") | Some("binary-max-checkpoint") => PrintStyle::BinaryMaxCheckpoint,
                    Some("none") => PrintStyle::None,
                    _ => return Err(bad("compact, full, binary, binary_max_checkpoint or none")),
                }
            }
            "ir-output-dir" => self.ir_output_dir = Some(PathBuf::from(text().ok_or_else(|| bad("a directory path"))?)),
            "stop-after" => {
                self.stop_after =
                    Some(text().ok_or_else(|| bad("a lowering pass name (loupe ir --list-passes)"))?.to_string())
            }
            // MAX's pre-jit: stop once kernels are chosen (and written to ir-output-dir).
            "pre-jit" => {
                if flag()? {
                    self.stop_after = Some("select-kernels".to_string());
                }
            }
            _ => return Ok(false),
        }
        self.sources.insert(name, source);
        Ok(true)
    }

    /// `key = value (source)` per option, for `loupe debug-options` and docs.
    pub fn listing(&self) -> String {
        let mut s = String::new();
        let show = |k: &str| -> String {
            match k {
                "sensible" => "-".into(),
                "nan-check" => self.nan_check.to_string(),
                "nan-check-stride" => self.nan_check_stride.to_string(),
                "uninitialized-read-check" => self.uninitialized_read_check.to_string(),
                "uninitialized-read-mode" => format!("{:?}", self.uninitialized_read_mode).to_lowercase(),
                "device-sync-mode" => self.device_sync_mode.to_string(),
                "stack-trace-on-error" => self.stack_trace_on_error.to_string(),
                "stack-trace-on-crash" => self.stack_trace_on_crash.to_string(),
                "source-tracebacks" => self.source_tracebacks.to_string(),
                "op-log-level" => format!("{:?}", self.op_log_level).to_lowercase(),
                "assert-level" => format!("{:?}", self.assert_level).to_lowercase(),
                "print-style" => format!("{:?}", self.print_style).to_lowercase(),
                "ir-output-dir" => {
                    self.ir_output_dir.as_ref().map(|p| p.display().to_string()).unwrap_or_else(|| "-".into())
                }
                "stop-after" | "pre-jit" => self.stop_after.clone().unwrap_or_else(|| "-".into()),
                "verify-ir" => self.verify_ir.to_string(),
                _ => String::new(),
            }
        };
        for k in KEYS {
            let src = self.sources.get(k).copied().unwrap_or(Source::Default);
            s.push_str(&format!("{k:<26} {:<12} ({src})\n", show(k)));
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn apply_parses_values_and_records_sources() {
        let mut o = DebugOptions::default();
        assert!(o.apply("nan-check", None, Source::Flag).unwrap());
        assert!(o.apply("NAN_CHECK_STRIDE", Some("5"), Source::EnvKey).unwrap());
        assert!(o.apply("print-style", Some("full"), Source::File).unwrap());
        assert!(o.nan_check && o.nan_check_stride == 5 && o.print_style == PrintStyle::Full);
        assert_eq!(o.sources["nan-check"], Source::Flag);
        assert_eq!(o.sources["nan-check-stride"], Source::EnvKey);
        assert!(!o.apply("frobnicate", None, Source::Api).unwrap(), "unknown keys are reported, not set");
        for (k, v) in [
            ("nan-check-stride", Some("abc")),
            ("nan-check-stride", Some("0")),
            ("uninitialized-read-mode", Some("maybe")),
            ("nan-check", Some("perhaps")),
            ("ir-output-dir", None),
            ("op-log-level", Some("loud")),
            ("assert-level", Some("x")),
        ] {
            let e = o.apply(k, v, Source::Flag).unwrap_err();
            assert_eq!(e.origin, Source::Flag);
            assert!(e.to_string().starts_with("LOUPE_DEBUG: bad value"), "{e}");
        }
    }

    #[test]
    fn sensible_turns_on_maxs_set_and_later_keys_override() {
        let mut o = DebugOptions::default();
        o.apply("sensible", None, Source::EnvList).unwrap();
        o.apply("nan-check", Some("0"), Source::EnvList).unwrap();
        assert!(
            !o.nan_check
                && o.device_sync_mode
                && o.stack_trace_on_error
                && o.stack_trace_on_crash
                && o.source_tracebacks
        );
        assert_eq!(o.assert_level, AssertLevel::All);
        assert!(!o.uninitialized_read_check);
    }

    #[test]
    fn with_sets_an_option_from_code() {
        let o = DebugOptions::default().with("nan-check-stride", Some("9")).unwrap();
        assert_eq!((o.nan_check_stride, o.sources["nan-check-stride"]), (9, Source::Api));
        assert!(DebugOptions::default().with("nope", None).is_err());
        assert!(DebugOptions::default().with("nan-check-stride", Some("x")).is_err());
    }
}
