//! The declarative mapping file (`loupe compare --map FILE`): renames, fused-projection
//! splits and layout transforms that line up another tool's tensors with module paths.
//!
//! Format (JSON, chosen over TOML because regexes need no extra escaping rules beyond
//! JSON's and serde_json is already a dependency):
//! ```json
//! {
//!   "version": 1,
//!   "preset": "llama.cpp",
//!   "rules": [
//!     {"side": "b", "match": "blk\\.(\\d+)\\.attn_q", "rename": "model.layers.$1.self_attn.q_proj"},
//!     {"side": "b", "match": "model\\.layers\\.(\\d+)\\.self_attn\\.qkv_proj",
//!      "split": {"axis": -1, "parts": [
//!        {"rename": "model.layers.$1.self_attn.q_proj", "size": 576},
//!        {"rename": "model.layers.$1.self_attn.k_proj", "size": 192},
//!        {"rename": "model.layers.$1.self_attn.v_proj", "size": 192}]}},
//!     {"match": "(.*)\\.attn_heads", "rename": "$1.attn_output", "transforms": [{"op": "heads_first"}]}
//!   ]
//! }
//! ```
//! - `match` is a regex (Rust `regex` syntax, linear time) matched against the whole raw
//!   name; `rename` expands `$1`, `${name}` (write `${1}` when letters follow).
//! - `side`: `"a"`, `"b"` or `"both"` (default). The first matching rule of a side wins;
//!   names no rule matches get the built-in canonicalization (`names::canonical`).
//! - `transforms` (applied in order, before `split`): `{"op": "transpose", "perm": [1, 0]}`,
//!   `{"op": "reshape", "shape": [-1, 576]}`, `{"op": "merge_heads"}` (`[.., H, D]` ->
//!   `[.., H*D]`), `{"op": "split_heads", "heads": 9}`, `{"op": "heads_first"}`
//!   (`[H, T, D]` -> `[T, H*D]`), `{"op": "scale", "factor": 0.125}`, `{"op": "squeeze"}`.
//! - `split`: consecutive `size`s (or explicit `start`/`end`) along `axis`; at load, the
//!   parts must cover the axis exactly, or the pair reports an error.
//! - `preset`: `"llama.cpp"` adds llama.cpp eval-callback names (`names::llama_cpp_name`).
//! - Names no rule matches then get MAX's `PrintHook` naming (`max_names`: `layers.layers.N`,
//!   `model.lm_head`, fused `qkv_proj`, the `-input_0` of `o_proj` / `down_proj`), then the
//!   built-in canonical form.
//!   `--map llama.cpp` alone selects the preset without a file.

use std::path::{Path, PathBuf};

use regex::{Regex, RegexBuilder};
use serde::Deserialize;

use crate::error::ParityError;
use crate::max_names::{self, MaxLabel};
use crate::names;
use crate::tensor::Op;

/// Largest mapping file read.
const MAX_FILE_BYTES: u64 = 1 << 20;
/// Most rules, and most parts of one split.
const MAX_RULES: usize = 10_000;
const MAX_PARTS: usize = 64;
/// Compiled-regex size limit (the `regex` crate's budget for one program).
const REGEX_SIZE_LIMIT: usize = 1 << 20;

/// Which input a rule applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    A,
    B,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileSpec {
    version: u32,
    #[serde(default)]
    preset: Option<String>,
    #[serde(default)]
    rules: Vec<RuleSpec>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RuleSpec {
    #[serde(rename = "match")]
    pattern: String,
    #[serde(default)]
    side: Option<String>,
    #[serde(default)]
    rename: Option<String>,
    #[serde(default)]
    transforms: Vec<OpSpec>,
    #[serde(default)]
    split: Option<SplitSpec>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SplitSpec {
    #[serde(default = "last_axis")]
    axis: isize,
    parts: Vec<PartSpec>,
}

fn last_axis() -> isize {
    -1
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PartSpec {
    rename: String,
    #[serde(default)]
    size: Option<usize>,
    #[serde(default)]
    start: Option<usize>,
    #[serde(default)]
    end: Option<usize>,
}

#[derive(Deserialize)]
#[serde(tag = "op", rename_all = "snake_case", deny_unknown_fields)]
enum OpSpec {
    Transpose { perm: Vec<usize> },
    Reshape { shape: Vec<i64> },
    MergeHeads,
    SplitHeads { heads: usize },
    HeadsFirst,
    Scale { factor: f64 },
    Squeeze,
}

impl From<OpSpec> for Op {
    fn from(o: OpSpec) -> Op {
        match o {
            OpSpec::Transpose { perm } => Op::Transpose(perm),
            OpSpec::Reshape { shape } => Op::Reshape(shape),
            OpSpec::MergeHeads => Op::MergeHeads,
            OpSpec::SplitHeads { heads } => Op::SplitHeads { heads },
            OpSpec::HeadsFirst => Op::HeadsFirst,
            OpSpec::Scale { factor } => Op::Scale(factor),
            OpSpec::Squeeze => Op::Squeeze,
        }
    }
}

/// A split: the axis and its parts (name template, start, end).
type Split = (isize, Vec<(String, usize, usize)>);

/// One compiled rule.
#[derive(Debug, Clone)]
struct Rule {
    regex: Regex,
    sides: (bool, bool),
    rename: String,
    ops: Vec<Op>,
    split: Option<Split>,
}

/// A name a raw tensor is known by for pairing, and how to derive it from the raw tensor.
#[derive(Debug, Clone, PartialEq)]
pub struct Derived {
    pub name: String,
    /// Whether the name came from the raw name unchanged (preferred on collisions).
    pub exact: bool,
    /// Transforms to apply after loading, in order.
    pub ops: Vec<Op>,
    /// MAX's naming (crate::max_names): the built-in rules that made `name`, whether the
    /// tensor holds the last token only, which part of a fused q/k/v output it is (the
    /// pairing finds its extent), and whether it is no model value at all.
    pub max: MaxDerived,
}

/// What MAX's built-in naming rules did to one raw name.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MaxDerived {
    pub rules: Vec<&'static str>,
    pub last_token: bool,
    /// (attention module path, 0 q / 1 k / 2 v).
    pub qkv_part: Option<(String, usize)>,
    pub ignored: bool,
}

impl Derived {
    fn plain(name: String, exact: bool, ops: Vec<Op>) -> Derived {
        Derived { name, exact, ops, max: MaxDerived::default() }
    }
}

/// A compiled mapping: rules plus presets.
#[derive(Debug, Clone, Default)]
pub struct Mapping {
    rules: Vec<Rule>,
    llama_cpp: bool,
    pub source: Option<PathBuf>,
}

impl Mapping {
    /// Reads `--map`: the word `llama.cpp` selects that preset, anything else is a file.
    pub fn load(arg: &Path) -> Result<Mapping, ParityError> {
        if arg == Path::new("llama.cpp") && !arg.exists() {
            return Ok(Mapping { llama_cpp: true, ..Mapping::default() });
        }
        let err = |reason: String| ParityError::Mapping { path: arg.to_path_buf(), reason };
        let meta = std::fs::metadata(arg).map_err(|e| ParityError::io(arg, e))?;
        if meta.len() > MAX_FILE_BYTES {
            return Err(err(format!("{} bytes, over the limit of {MAX_FILE_BYTES}", meta.len())));
        }
        let text = std::fs::read_to_string(arg).map_err(|e| ParityError::io(arg, e))?;
        let mut m = Mapping::parse(&text).map_err(|e| match e {
            ParityError::Mapping { reason, .. } => err(reason),
            other => other,
        })?;
        m.source = Some(arg.to_path_buf());
        Ok(m)
    }

    /// Parses mapping JSON.
    pub fn parse(text: &str) -> Result<Mapping, ParityError> {
        let err = |reason: String| ParityError::Mapping { path: PathBuf::from("<mapping>"), reason };
        let spec: FileSpec = serde_json::from_str(text).map_err(|e| err(e.to_string()))?;
        if spec.version != 1 {
            return Err(err(format!("version {} (1 is read)", spec.version)));
        }
        if spec.rules.len() > MAX_RULES {
            return Err(err(format!("{} rules, over the limit of {MAX_RULES}", spec.rules.len())));
        }
        let llama_cpp = match spec.preset.as_deref() {
            None => false,
            Some("llama.cpp") => true,
            Some(other) => return Err(err(format!("unknown preset '{other}' (llama.cpp is known)"))),
        };
        let mut rules = Vec::with_capacity(spec.rules.len());
        for (i, r) in spec.rules.into_iter().enumerate() {
            let at = |reason: String| err(format!("rule {i} ('{}'): {reason}", r.pattern));
            let regex = RegexBuilder::new(&format!("^(?:{})$", r.pattern))
                .size_limit(REGEX_SIZE_LIMIT)
                .build()
                .map_err(|e| at(e.to_string()))?;
            let sides = match r.side.as_deref() {
                None | Some("both") => (true, true),
                Some("a") => (true, false),
                Some("b") => (false, true),
                Some(other) => return Err(at(format!("side '{other}' (a, b or both)"))),
            };
            let split = match r.split {
                None => None,
                Some(s) => {
                    if s.parts.is_empty() || s.parts.len() > MAX_PARTS {
                        return Err(at(format!("split needs 1 to {MAX_PARTS} parts")));
                    }
                    let mut next = 0usize;
                    let mut parts = Vec::new();
                    for p in s.parts {
                        let (start, end) = match (p.size, p.start, p.end) {
                            (Some(n), None, None) => {
                                (next, next.checked_add(n).ok_or_else(|| at("split sizes overflow".into()))?)
                            }
                            (None, Some(a), Some(b)) if a <= b => (a, b),
                            _ => {
                                return Err(at(format!("split part '{}' needs either size or start <= end", p.rename)))
                            }
                        };
                        next = end;
                        parts.push((p.rename, start, end));
                    }
                    Some((s.axis, parts))
                }
            };
            if split.is_some() && r.rename.is_some() {
                return Err(at("give either rename or split, not both".into()));
            }
            rules.push(Rule {
                regex,
                sides,
                rename: r.rename.unwrap_or_else(|| "$0".into()),
                ops: r.transforms.into_iter().map(Op::from).collect(),
                split,
            });
        }
        Ok(Mapping { rules, llama_cpp, source: None })
    }

    /// The names a raw tensor of `side` pairs under: one, or one per split part.
    pub fn derive(&self, side: Side, raw: &str) -> Vec<Derived> {
        for rule in &self.rules {
            let applies = match side {
                Side::A => rule.sides.0,
                Side::B => rule.sides.1,
            };
            if !applies {
                continue;
            }
            let Some(caps) = rule.regex.captures(raw) else { continue };
            let expand = |template: &str| {
                let mut out = String::new();
                caps.expand(template, &mut out);
                out
            };
            return match &rule.split {
                None => vec![Derived::plain(expand(&rule.rename), false, rule.ops.clone())],
                Some((axis, parts)) => parts
                    .iter()
                    .map(|(rename, start, end)| {
                        let mut ops = rule.ops.clone();
                        ops.push(Op::Slice { axis: *axis, start: *start, end: *end });
                        Derived::plain(expand(rename), false, ops)
                    })
                    .collect(),
            };
        }
        if self.llama_cpp {
            if let Some(n) = names::llama_cpp_name(raw) {
                return vec![Derived::plain(n, false, Vec::new())];
            }
        }
        match max_names::classify(raw) {
            None => {}
            Some(MaxLabel::Ignored(rule)) => {
                let max = MaxDerived { rules: vec![rule], ignored: true, ..MaxDerived::default() };
                return vec![Derived { name: raw.to_string(), exact: false, ops: Vec::new(), max }];
            }
            Some(MaxLabel::Renamed { name, last_token, rules }) => {
                let max = MaxDerived { rules, last_token, ..MaxDerived::default() };
                return vec![Derived { name: names::canonical(&name).name, exact: false, ops: Vec::new(), max }];
            }
            Some(MaxLabel::FusedQkv { attn, rules }) => {
                return ["q_proj", "k_proj", "v_proj"]
                    .iter()
                    .enumerate()
                    .map(|(i, p)| Derived {
                        name: format!("{attn}.{p}"),
                        exact: false,
                        ops: Vec::new(),
                        max: MaxDerived {
                            rules: rules.clone(),
                            qkv_part: Some((attn.clone(), i)),
                            ..MaxDerived::default()
                        },
                    })
                    .collect();
            }
        }
        let c = names::canonical(raw);
        vec![Derived::plain(c.name, c.exact, Vec::new())]
    }

    /// For a split rule matching `raw`: the axis and the extent the parts cover, so the
    /// loader can check that they cover the axis exactly.
    pub fn split_extent(&self, side: Side, raw: &str) -> Option<(isize, usize)> {
        let rule = self.rules.iter().find(|r| {
            (match side {
                Side::A => r.sides.0,
                Side::B => r.sides.1,
            }) && r.regex.is_match(raw)
        })?;
        let (axis, parts) = rule.split.as_ref()?;
        Some((*axis, parts.iter().map(|p| p.2).max().unwrap_or(0)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renames_splits_and_transforms() {
        let m = Mapping::parse(
            r#"{"version": 1, "rules": [
              {"side": "b", "match": "blk\\.(\\d+)\\.attn_q", "rename": "model.layers.$1.self_attn.q_proj"},
              {"match": "l(\\d+)\\.qkv", "split": {"axis": -1, "parts": [
                 {"rename": "model.layers.$1.self_attn.q_proj", "size": 4},
                 {"rename": "model.layers.$1.self_attn.k_proj", "size": 2},
                 {"rename": "model.layers.$1.self_attn.v_proj", "start": 6, "end": 8}]}},
              {"match": "(?P<m>.*)\\.heads", "rename": "${m}.attn_output", "transforms": [{"op": "heads_first"}]}
            ]}"#,
        )
        .expect("valid mapping");
        assert_eq!(m.derive(Side::B, "blk.3.attn_q")[0].name, "model.layers.3.self_attn.q_proj");
        // Side a does not apply the side-b rule, and anchoring stops partial matches.
        assert_eq!(m.derive(Side::A, "blk.3.attn_q")[0].name, "blk.3.attn_q");
        assert_eq!(m.derive(Side::B, "xblk.3.attn_q")[0].name, "xblk.3.attn_q");
        let parts = m.derive(Side::A, "l2.qkv");
        assert_eq!(parts.len(), 3);
        assert_eq!(parts[1].name, "model.layers.2.self_attn.k_proj");
        assert_eq!(parts[1].ops, vec![Op::Slice { axis: -1, start: 4, end: 6 }]);
        assert_eq!(m.split_extent(Side::A, "l2.qkv"), Some((-1, 8)));
        let h = m.derive(Side::B, "model.layers.0.self_attn.heads");
        assert_eq!(h[0].name, "model.layers.0.self_attn.attn_output");
        assert_eq!(h[0].ops, vec![Op::HeadsFirst]);
        // Built-in canonicalization still applies to unmatched names.
        assert_eq!(m.derive(Side::A, "model.norm-output")[0].name, "model.norm");
    }

    #[test]
    fn bad_mappings_are_refused_with_the_rule() {
        for (text, needle) in [
            (r#"{"version": 2}"#, "version 2"),
            (r#"{"version": 1, "rules": [{"match": "(", "rename": "x"}]}"#, "rule 0"),
            (r#"{"version": 1, "rules": [{"match": "a", "side": "c"}]}"#, "side 'c'"),
            (r#"{"version": 1, "rules": [{"match": "a", "bogus": 1}]}"#, "unknown field"),
            (r#"{"version": 1, "rules": [{"match": "a", "transforms": [{"op": "flip"}]}]}"#, "flip"),
            (
                r#"{"version": 1, "rules": [{"match": "a", "split": {"parts": [{"rename": "x"}]}}]}"#,
                "needs either size",
            ),
            (r#"{"version": 1, "preset": "vllm"}"#, "unknown preset"),
        ] {
            let e = Mapping::parse(text).unwrap_err().to_string();
            assert!(e.contains(needle), "{text}: {e}");
        }
    }
}
