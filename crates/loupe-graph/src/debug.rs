//! `LOUPE_DEBUG`: runtime debugging options with MAX's names and meanings
//! (docs/max-debugging-options.md), read by lowering and by the executor.
//!
//! Options come from four places; a later layer overrides an earlier one, key by key:
//! `loupe.toml` `[debug]` table < environment (`LOUPE_DEBUG=a,b,key=value`, then per-key
//! `LOUPE_DEBUG_<KEY>`, key upper-cased with `-` as `_`) < `--debug key=value` flags <
//! the API ([`set_option`]). Within one layer, tokens apply left to right, so
//! `sensible,nan-check=0` is "sensible but no nan-check".
//!
//! The resolved options are process-wide ([`install`], [`current`]), as MAX's are: an
//! [`crate::Executor`] copies them into plain bools when it is created, so an option that
//! is off costs one predictable branch per node and no lookups while running.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, RwLock};

/// Where an option's value came from (lowest precedence first).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Source {
    Default,
    File,
    EnvList,
    EnvKey,
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
        matches!(
            self,
            OpLogLevel::Trace | OpLogLevel::Debug | OpLogLevel::Info
        )
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
    /// Stop lowering after this pass (MAX's `pre-jit` stops after emitting kernels).
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

/// A value an option cannot take.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("LOUPE_DEBUG: bad value '{value}' for option '{key}' (from {origin}): expected {expected}")]
pub struct DebugError {
    pub key: String,
    pub value: String,
    pub expected: &'static str,
    pub origin: Source,
}

/// `key=value` pairs of one layer, in the order given; a bare key has no value.
pub type Layer = Vec<(String, Option<String>)>;

/// Splits `a,b,key=value`: tokens trimmed, empty ones skipped.
pub fn parse_list(s: &str) -> Layer {
    s.split(',')
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .map(|t| match t.split_once('=') {
            Some((k, v)) => (k.trim().to_string(), Some(v.trim().to_string())),
            None => (t.to_string(), None),
        })
        .collect()
}

/// The per-key variable's name: `nan-check-stride` -> `LOUPE_DEBUG_NAN_CHECK_STRIDE`.
pub fn env_key(key: &str) -> String {
    format!(
        "LOUPE_DEBUG_{}",
        key.to_ascii_uppercase().replace(['-', '.'], "_")
    )
}

/// The `[debug]` table of a `loupe.toml` text, as a layer (values of any scalar type).
pub fn parse_toml(text: &str, path: &Path) -> Result<Layer, String> {
    let table: toml::Table = text
        .parse()
        .map_err(|e: toml::de::Error| format!("{}: {}", path.display(), e.message()))?;
    let Some(debug) = table.get("debug") else {
        return Ok(Vec::new());
    };
    let debug = debug
        .as_table()
        .ok_or_else(|| format!("{}: [debug] must be a table", path.display()))?;
    debug
        .iter()
        .map(|(k, v)| {
            let v = match v {
                toml::Value::String(s) => s.clone(),
                toml::Value::Integer(i) => i.to_string(),
                toml::Value::Boolean(b) => b.to_string(),
                toml::Value::Float(f) => f.to_string(),
                other => {
                    return Err(format!(
                        "{}: [debug] {k}: expected a string, number or boolean, got {}",
                        path.display(),
                        other.type_str()
                    ))
                }
            };
            Ok((k.clone(), Some(v)))
        })
        .collect()
}

/// The layers to resolve, lowest precedence first.
#[derive(Debug, Clone, Default)]
pub struct Layers {
    pub file: Layer,
    pub env_list: Layer,
    pub env_keys: Layer,
    pub flags: Layer,
    pub api: Layer,
}

impl Layers {
    /// The environment layers from the process environment.
    pub fn with_env(mut self) -> Layers {
        if let Ok(s) = std::env::var("LOUPE_DEBUG") {
            self.env_list = parse_list(&s);
        }
        self.env_keys = KEYS
            .iter()
            .filter_map(|k| {
                std::env::var(env_key(k))
                    .ok()
                    .map(|v| (k.to_string(), Some(v)))
            })
            .collect();
        self
    }
}

/// Resolves the layers; returns the options and the warnings to print (unknown options).
pub fn resolve(layers: &Layers) -> Result<(DebugOptions, Vec<String>), DebugError> {
    let mut opts = DebugOptions::default();
    let mut warnings = Vec::new();
    for (source, layer) in [
        (Source::File, &layers.file),
        (Source::EnvList, &layers.env_list),
        (Source::EnvKey, &layers.env_keys),
        (Source::Flag, &layers.flags),
        (Source::Api, &layers.api),
    ] {
        for (key, value) in layer {
            if !opts.apply(key, value.as_deref(), source)? {
                warnings.push(format!("LOUPE_DEBUG: unknown option '{key}'; ignoring"));
            }
        }
    }
    Ok((opts, warnings))
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
    pub fn apply(
        &mut self,
        key: &str,
        value: Option<&str>,
        source: Source,
    ) -> Result<bool, DebugError> {
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
                Some(v) => {
                    parse_bool(v).ok_or_else(|| bad("a boolean (1/0, true/false, yes/no, on/off)"))
                }
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
                self.uninitialized_read_mode = match text().map(str::to_ascii_lowercase).as_deref()
                {
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
                    _ => {
                        return Err(bad(
                            "notset, trace, debug, info, warning, error or critical",
                        ))
                    }
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
                    Some("binary_max_checkpoint") | Some("binary-max-checkpoint") => {
                        PrintStyle::BinaryMaxCheckpoint
                    }
                    Some("none") => PrintStyle::None,
                    _ => return Err(bad("compact, full, binary, binary_max_checkpoint or none")),
                }
            }
            "ir-output-dir" => {
                self.ir_output_dir = Some(PathBuf::from(
                    text().ok_or_else(|| bad("a directory path"))?,
                ))
            }
            "stop-after" => {
                self.stop_after = Some(
                    text()
                        .ok_or_else(|| bad("a lowering pass name (loupe ir --list-passes)"))?
                        .to_string(),
                )
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
                "uninitialized-read-mode" => {
                    format!("{:?}", self.uninitialized_read_mode).to_lowercase()
                }
                "device-sync-mode" => self.device_sync_mode.to_string(),
                "stack-trace-on-error" => self.stack_trace_on_error.to_string(),
                "stack-trace-on-crash" => self.stack_trace_on_crash.to_string(),
                "source-tracebacks" => self.source_tracebacks.to_string(),
                "op-log-level" => format!("{:?}", self.op_log_level).to_lowercase(),
                "assert-level" => format!("{:?}", self.assert_level).to_lowercase(),
                "print-style" => format!("{:?}", self.print_style).to_lowercase(),
                "ir-output-dir" => self
                    .ir_output_dir
                    .as_ref()
                    .map(|p| p.display().to_string())
                    .unwrap_or_else(|| "-".into()),
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

/// The options installed for this process (defaults until [`install`] is called).
static CURRENT: RwLock<Option<DebugOptions>> = RwLock::new(None);
/// The API layer: `key=value` pairs set by [`set_option`], highest precedence.
static API: Mutex<Layer> = Mutex::new(Vec::new());

/// Makes `opts` the process's options (the CLI calls this once, at start-up).
pub fn install(opts: DebugOptions) {
    if let Ok(mut g) = CURRENT.write() {
        *g = Some(opts);
    }
}

/// The process's options: what was installed, with the API layer applied on top.
pub fn current() -> DebugOptions {
    let mut opts = CURRENT
        .read()
        .ok()
        .and_then(|g| g.clone())
        .unwrap_or_default();
    if let Ok(api) = API.lock() {
        for (k, v) in api.iter() {
            // Values were validated by set_option.
            let _ = opts.apply(k, v.as_deref(), Source::Api);
        }
    }
    opts
}

/// The API setter (highest precedence): validated now, effective for executors and
/// lowerings started afterwards.
pub fn set_option(key: &str, value: Option<&str>) -> Result<(), DebugError> {
    let mut probe = DebugOptions::default();
    if !probe.apply(key, value, Source::Api)? {
        return Err(DebugError {
            key: key.to_string(),
            value: value.unwrap_or("").to_string(),
            expected: "a known option (see docs/debugging.md)",
            origin: Source::Api,
        });
    }
    if let Ok(mut api) = API.lock() {
        api.push((key.to_string(), value.map(str::to_string)));
    }
    Ok(())
}

/// The API layer set so far (for a resolver that merges it with other layers).
pub fn api_layer() -> Layer {
    API.lock().map(|a| a.clone()).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kv(s: &str) -> Layer {
        parse_list(s)
    }

    #[test]
    fn parses_lists_trimming_and_skipping_empty_tokens() {
        assert_eq!(
            kv(" nan-check , ,nan-check-stride = 5,"),
            vec![
                ("nan-check".into(), None),
                ("nan-check-stride".into(), Some("5".into()))
            ]
        );
        let (o, w) = resolve(&Layers {
            env_list: kv("nan-check,nan-check-stride=5,print-style=full"),
            ..Default::default()
        })
        .unwrap();
        assert!(
            o.nan_check
                && o.nan_check_stride == 5
                && o.print_style == PrintStyle::Full
                && w.is_empty()
        );
        assert_eq!(o.sources["nan-check"], Source::EnvList);
    }

    #[test]
    fn unknown_options_warn_and_bad_values_fail() {
        let (_, w) = resolve(&Layers {
            env_list: kv("frobnicate,nan-check"),
            ..Default::default()
        })
        .unwrap();
        assert_eq!(
            w,
            vec!["LOUPE_DEBUG: unknown option 'frobnicate'; ignoring".to_string()]
        );
        for bad in [
            "nan-check-stride=abc",
            "nan-check-stride=0",
            "uninitialized-read-mode=maybe",
            "nan-check=perhaps",
            "ir-output-dir",
            "op-log-level=loud",
            "assert-level=x",
        ] {
            let e = resolve(&Layers {
                flags: kv(bad),
                ..Default::default()
            })
            .unwrap_err();
            assert_eq!(e.origin, Source::Flag, "{bad}");
            assert!(e.to_string().starts_with("LOUPE_DEBUG: bad value"), "{e}");
        }
    }

    #[test]
    fn precedence_is_api_flag_env_file() {
        let layers = Layers {
            file: kv("nan-check-stride=2,print-style=full,op-log-level=info"),
            env_list: kv("nan-check-stride=3,print-style=binary"),
            env_keys: kv("nan-check-stride=4"),
            flags: kv("nan-check-stride=5"),
            api: Vec::new(),
        };
        let (o, _) = resolve(&layers).unwrap();
        assert_eq!(
            (o.nan_check_stride, o.print_style, o.op_log_level),
            (5, PrintStyle::Binary, OpLogLevel::Info)
        );
        assert_eq!(o.sources["op-log-level"], Source::File);
        assert_eq!(o.sources["print-style"], Source::EnvList);
        let (o, _) = resolve(&Layers {
            api: kv("nan-check-stride=6"),
            ..layers
        })
        .unwrap();
        assert_eq!(
            (o.nan_check_stride, o.sources["nan-check-stride"]),
            (6, Source::Api)
        );
    }

    #[test]
    fn sensible_turns_on_maxs_set_and_later_tokens_override() {
        let (o, _) = resolve(&Layers {
            env_list: kv("sensible,nan-check=0"),
            ..Default::default()
        })
        .unwrap();
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
    fn api_setter_wins_over_installed_options() {
        let (o, _) = resolve(&Layers {
            flags: kv("nan-check-stride=5,op-log-level=info"),
            ..Default::default()
        })
        .unwrap();
        install(o);
        set_option("nan-check-stride", Some("9")).unwrap();
        assert!(set_option("nan-check-stride", Some("x")).is_err());
        assert!(set_option("nope", None).is_err());
        let c = current();
        assert_eq!(
            (c.nan_check_stride, c.sources["nan-check-stride"]),
            (9, Source::Api)
        );
        assert_eq!(
            (c.op_log_level, c.sources["op-log-level"]),
            (OpLogLevel::Info, Source::Flag)
        );
    }

    #[test]
    fn env_keys_and_toml() {
        assert_eq!(env_key("nan-check-stride"), "LOUPE_DEBUG_NAN_CHECK_STRIDE");
        let layer = parse_toml(
            "[debug]\nnan-check = true\nnan-check-stride = 7\nir-output-dir = \"out\"\n",
            Path::new("loupe.toml"),
        )
        .unwrap();
        let (o, _) = resolve(&Layers {
            file: layer,
            ..Default::default()
        })
        .unwrap();
        assert!(
            o.nan_check && o.nan_check_stride == 7 && o.ir_output_dir == Some(PathBuf::from("out"))
        );
        assert!(parse_toml("[debug\n", Path::new("loupe.toml"))
            .unwrap_err()
            .contains("loupe.toml"));
        // Underscores are accepted for dashes, as in the per-key variables.
        let (o, w) = resolve(&Layers {
            flags: kv("NAN_CHECK=yes"),
            ..Default::default()
        })
        .unwrap();
        assert!(o.nan_check && w.is_empty());
    }
}
