//! Where the `LOUPE_DEBUG` options come from, and which source wins.
//!
//! Options come from five places; a later layer overrides an earlier one, key by key:
//! `loupe.toml` `[debug]` table < environment (per-key `LOUPE_DEBUG_<KEY>`, key upper-cased
//! with `-` as `_`, then the list `LOUPE_DEBUG=a,b,key=value`) < `--debug key=value` flags <
//! the API layer (set in code). Within one layer, tokens apply left to right, so
//! `sensible,nan-check=0` is "sensible but no nan-check".
//!
//! The environment follows MAX 26.7 (tests/fixtures/max-26.7/options.json): its list
//! `MODULAR_DEBUG` beats its per-key `MODULAR_MAX_DEBUG_<KEY>`, so loupe's list beats its
//! per-key variables too. A MAX user's environment carries over: `MODULAR_DEBUG` is read
//! when `LOUPE_DEBUG` is not set, and `MODULAR_MAX_DEBUG_<KEY>` for a key whose
//! `LOUPE_DEBUG_<KEY>` is not set. A value from MAX's variables that loupe cannot read is
//! a warning, not an error (MAX stores e.g. `assert-level=bogus` without a word). A token of the
//! environment that MAX 26.7 would read differently (`nan-check=1`, which it ignores as an
//! unknown option) is accepted with a warning that says how MAX reads it.
//!
//! The result is a plain [`DebugOptions`] value: nothing is installed process-wide. The CLI
//! resolves once at start-up and passes the options to [`crate::Engine::load`]; a library
//! user can build `DebugOptions` directly or resolve the same sources with
//! [`resolve_sources`].

use std::path::Path;

use loupe_graph::debug::{max_reading, DebugError, DebugOptions, Source, KEYS};

/// A source's contents could not be read or parsed.
#[derive(Debug, thiserror::Error)]
pub enum DebugConfigError {
    /// `message` names the file.
    #[error("{message}")]
    File { path: std::path::PathBuf, message: String },
    #[error(transparent)]
    Option(#[from] DebugError),
}

/// Options and the warnings to show (unknown options are ignored with a warning).
#[derive(Debug, Clone, Default)]
pub struct Resolved {
    pub options: DebugOptions,
    pub warnings: Vec<String>,
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
    format!("LOUPE_DEBUG_{}", key.to_ascii_uppercase().replace(['-', '.'], "_"))
}

/// MAX's per-key variable for a loupe key: `nan-check` -> `MODULAR_MAX_DEBUG_NAN_CHECK`;
/// `None` for loupe's own keys and `sensible`.
pub fn modular_env_key(key: &str) -> Option<String> {
    match key {
        // MAX ignores MODULAR_MAX_DEBUG_SENSIBLE, and its _SENSIBLE_MODE sets a flag without
        // turning the set on (tests/fixtures/max-26.7/options.json): neither is read.
        "stop-after" | "verify-ir" | "sensible" => None,
        k => Some(format!("MODULAR_MAX_DEBUG_{}", k.to_ascii_uppercase().replace(['-', '.'], "_"))),
    }
}

/// The `[debug]` table of a `loupe.toml` text, as a layer (values of any scalar type).
pub fn parse_toml(text: &str, path: &Path) -> Result<Layer, String> {
    let table: toml::Table =
        text.parse().map_err(|e: toml::de::Error| format!("{}: {}", path.display(), e.message()))?;
    let Some(debug) = table.get("debug") else {
        return Ok(Vec::new());
    };
    let debug = debug.as_table().ok_or_else(|| format!("{}: [debug] must be a table", path.display()))?;
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
    pub env_keys: Layer,
    /// `MODULAR_MAX_DEBUG_<KEY>` for keys without a `LOUPE_DEBUG_<KEY>`.
    pub modular_keys: Layer,
    pub env_list: Layer,
    /// `MODULAR_DEBUG`, when `LOUPE_DEBUG` is not set.
    pub modular_list: Layer,
    pub flags: Layer,
    pub api: Layer,
}

impl Layers {
    /// The environment layers from the process environment.
    pub fn with_env(self) -> Layers {
        self.with_vars(|name| std::env::var(name).ok())
    }

    /// The environment layers from `var` (the process environment in [`Self::with_env`]).
    pub fn with_vars(mut self, var: impl Fn(&str) -> Option<String>) -> Layers {
        match (var("LOUPE_DEBUG"), var("MODULAR_DEBUG")) {
            (Some(s), _) => self.env_list = parse_list(&s),
            (None, Some(s)) => self.modular_list = parse_list(&s),
            (None, None) => {}
        }
        for k in KEYS {
            if let Some(v) = var(&env_key(k)) {
                self.env_keys.push((k.to_string(), Some(v)));
            } else if let Some(v) = modular_env_key(k).and_then(|name| var(&name)) {
                self.modular_keys.push((k.to_string(), Some(v)));
            }
        }
        self
    }
}

/// Resolves the layers; returns the options and the warnings to print (unknown options).
pub fn resolve(layers: &Layers) -> Result<(DebugOptions, Vec<String>), DebugError> {
    let mut opts = DebugOptions::default();
    let mut warnings = Vec::new();
    for (source, layer) in [
        (Source::File, &layers.file),
        (Source::EnvKey, &layers.env_keys),
        (Source::ModularKey, &layers.modular_keys),
        (Source::EnvList, &layers.env_list),
        (Source::ModularList, &layers.modular_list),
        (Source::Flag, &layers.flags),
        (Source::Api, &layers.api),
    ] {
        let (var, from_max) = match source {
            Source::ModularList | Source::ModularKey => ("MODULAR_DEBUG", true),
            _ => ("LOUPE_DEBUG", false),
        };
        for (key, value) in layer {
            match opts.apply(key, value.as_deref(), source) {
                Ok(true) => {}
                Ok(false) => {
                    warnings.push(format!("{var}: unknown option '{key}'; ignoring"));
                    continue;
                }
                Err(e) if from_max => {
                    warnings.push(format!("{e}; ignoring it"));
                    continue;
                }
                Err(e) => return Err(e),
            }
            if matches!(source, Source::EnvList | Source::EnvKey | Source::ModularList | Source::ModularKey) {
                let per_key = matches!(source, Source::EnvKey | Source::ModularKey);
                if let Some(why) = max_reading(key, value.as_deref(), per_key) {
                    let token = match value {
                        Some(v) => format!("{key}={v}"),
                        None => key.clone(),
                    };
                    warnings.push(format!("{var}: '{token}' ({source}) is accepted, but {why}"));
                }
            }
        }
    }
    Ok((opts, warnings))
}

/// Resolves the standard sources: `DIR/loupe.toml` when present, the process environment
/// when `read_env`, the `--debug` values `flags` (each a comma list), then `api`.
pub fn resolve_sources(dir: &Path, flags: &[String], api: Layer, read_env: bool) -> Result<Resolved, DebugConfigError> {
    let mut layers = Layers::default();
    if read_env {
        layers = layers.with_env();
    }
    let toml_path = dir.join("loupe.toml");
    if toml_path.is_file() {
        let text = std::fs::read_to_string(&toml_path).map_err(|e| DebugConfigError::File {
            path: toml_path.clone(),
            message: format!("{}: {e}", toml_path.display()),
        })?;
        layers.file = parse_toml(&text, &toml_path)
            .map_err(|message| DebugConfigError::File { path: toml_path.clone(), message })?;
    }
    for f in flags {
        layers.flags.extend(parse_list(f));
    }
    layers.api = api;
    let (options, warnings) = resolve(&layers)?;
    Ok(Resolved { options, warnings })
}

#[cfg(test)]
mod tests {
    use super::*;
    use loupe_graph::debug::{AssertLevel, OpLogLevel, PrintStyle};
    use std::path::PathBuf;

    fn kv(s: &str) -> Layer {
        parse_list(s)
    }

    #[test]
    fn parses_lists_trimming_and_skipping_empty_tokens() {
        assert_eq!(
            kv(" nan-check , ,nan-check-stride = 5,"),
            vec![("nan-check".into(), None), ("nan-check-stride".into(), Some("5".into()))]
        );
        let (o, w) =
            resolve(&Layers { env_list: kv("nan-check,nan-check-stride=5,print-style=full"), ..Default::default() })
                .unwrap();
        assert!(o.nan_check && o.nan_check_stride == 5 && o.print_style == PrintStyle::Full);
        // nan-check-stride is not one of MAX 26.7's MODULAR_DEBUG options: accepted, with a warning.
        assert!(w.len() == 1 && w[0].contains("'nan-check-stride=5'"), "{w:?}");
        assert_eq!(o.sources["nan-check"], Source::EnvList);
    }

    #[test]
    fn unknown_options_warn_and_bad_values_fail() {
        let (_, w) = resolve(&Layers { env_list: kv("frobnicate,nan-check"), ..Default::default() }).unwrap();
        assert_eq!(w, vec!["LOUPE_DEBUG: unknown option 'frobnicate'; ignoring".to_string()]);
        for bad in [
            "nan-check-stride=abc",
            "nan-check-stride=0",
            "uninitialized-read-mode=maybe",
            "nan-check=perhaps",
            "ir-output-dir",
            "op-log-level=loud",
            "assert-level=x",
        ] {
            let e = resolve(&Layers { flags: kv(bad), ..Default::default() }).unwrap_err();
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
            ..Default::default()
        };
        let (o, _) = resolve(&layers).unwrap();
        assert_eq!((o.nan_check_stride, o.print_style, o.op_log_level), (5, PrintStyle::Binary, OpLogLevel::Info));
        assert_eq!(o.sources["op-log-level"], Source::File);
        assert_eq!(o.sources["print-style"], Source::EnvList);
        let (o, _) = resolve(&Layers { api: kv("nan-check-stride=6"), ..layers }).unwrap();
        assert_eq!((o.nan_check_stride, o.sources["nan-check-stride"]), (6, Source::Api));
    }

    #[test]
    fn the_list_beats_per_key_variables_as_in_max() {
        // MAX 26.7: MODULAR_DEBUG=nan-check with MODULAR_MAX_DEBUG_NAN_CHECK=0 is on.
        let vars = |pairs: &'static [(&'static str, &'static str)]| {
            move |name: &str| pairs.iter().find(|(k, _)| *k == name).map(|(_, v)| v.to_string())
        };
        let (o, w) = resolve(
            &Layers::default().with_vars(vars(&[("LOUPE_DEBUG", "nan-check"), ("LOUPE_DEBUG_NAN_CHECK", "0")])),
        )
        .unwrap();
        assert!(o.nan_check && w.is_empty(), "{w:?}");
        assert_eq!(o.sources["nan-check"], Source::EnvList);
        // MAX's variables carry over when loupe's are not set, and are named as the source.
        let (o, w) = resolve(&Layers::default().with_vars(vars(&[
            ("MODULAR_DEBUG", "nan-check,assert-level=bogus"),
            ("MODULAR_MAX_DEBUG_OP_LOG_LEVEL", "info"),
            ("MODULAR_MAX_DEBUG_SENSIBLE_MODE", "1"),
        ])))
        .unwrap();
        assert!(o.nan_check && o.op_log_level == OpLogLevel::Info && !o.device_sync_mode);
        assert_eq!((o.sources["nan-check"], o.sources["op-log-level"]), (Source::ModularList, Source::ModularKey));
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(w[0].contains("'bogus'") && w[0].contains("MODULAR_DEBUG"), "{w:?}");
        // LOUPE_DEBUG hides MODULAR_DEBUG entirely.
        let (o, _) = resolve(
            &Layers::default().with_vars(vars(&[("LOUPE_DEBUG", "verify-ir"), ("MODULAR_DEBUG", "nan-check")])),
        )
        .unwrap();
        assert!(!o.nan_check && o.verify_ir);
    }

    #[test]
    fn tokens_max_reads_differently_are_accepted_with_a_warning() {
        let (o, w) = resolve(&Layers {
            env_list: kv("nan-check=1,NAN-CHECK,print-style=FULL,stop-after=fuse"),
            ..Default::default()
        })
        .unwrap();
        assert!(o.nan_check && o.print_style == PrintStyle::Full);
        assert_eq!(w.len(), 3, "{w:?}");
        assert!(w[0].contains("'nan-check=1'") && w[0].contains("bare name"), "{w:?}");
        assert!(w[1].contains("'NAN-CHECK'") && w[1].contains("as written"), "{w:?}");
        assert!(w[2].contains("NONE"), "{w:?}");
        let (_, w) = resolve(&Layers { env_keys: kv("nan-check=on"), ..Default::default() }).unwrap();
        assert!(w.len() == 1 && w[0].contains("as false"), "{w:?}");
        // loupe's own sources (flags, loupe.toml) are loupe's grammar: no warnings.
        let (_, w) =
            resolve(&Layers { flags: kv("nan-check=1"), file: kv("NAN_CHECK=yes"), ..Default::default() }).unwrap();
        assert!(w.is_empty(), "{w:?}");
    }

    #[test]
    fn sensible_turns_on_maxs_set_and_later_tokens_override() {
        let (o, _) = resolve(&Layers { env_list: kv("sensible,nan-check=0"), ..Default::default() }).unwrap();
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
    fn api_layer_wins_and_standard_sources_read_the_toml_file() {
        let dir = std::env::temp_dir().join(format!("loupe-debug-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("loupe.toml"), "[debug]\nnan-check-stride = 7\nop-log-level = \"info\"\n").unwrap();
        let r = resolve_sources(&dir, &["nan-check-stride=5".to_string()], kv("nan-check-stride=9"), false).unwrap();
        assert_eq!((r.options.nan_check_stride, r.options.sources["nan-check-stride"]), (9, Source::Api));
        assert_eq!((r.options.op_log_level, r.options.sources["op-log-level"]), (OpLogLevel::Info, Source::File));
        std::fs::write(dir.join("loupe.toml"), "[debug\n").unwrap();
        let e = resolve_sources(&dir, &[], Vec::new(), false).unwrap_err();
        assert!(e.to_string().contains("loupe.toml"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn env_keys_and_toml() {
        assert_eq!(env_key("nan-check-stride"), "LOUPE_DEBUG_NAN_CHECK_STRIDE");
        let layer = parse_toml(
            "[debug]\nnan-check = true\nnan-check-stride = 7\nir-output-dir = \"out\"\n",
            Path::new("loupe.toml"),
        )
        .unwrap();
        let (o, _) = resolve(&Layers { file: layer, ..Default::default() }).unwrap();
        assert!(o.nan_check && o.nan_check_stride == 7 && o.ir_output_dir == Some(PathBuf::from("out")));
        assert!(parse_toml("[debug\n", Path::new("loupe.toml")).unwrap_err().contains("loupe.toml"));
        // Underscores are accepted for dashes, as in the per-key variables.
        let (o, w) = resolve(&Layers { flags: kv("NAN_CHECK=yes"), ..Default::default() }).unwrap();
        assert!(o.nan_check && w.is_empty());
    }
}
