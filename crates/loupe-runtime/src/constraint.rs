//! Constrained decoding: output that parses, through the `llguidance` grammar engine.
//!
//! * [`Grammars`]: one per model. It holds llguidance's parser factory over the model's
//!   token environment: every id's true bytes ([`loupe_text::TokenBytes`]), special
//!   tokens marked as llguidance expects (byte 0xFF first), the model's end-of-generation
//!   ids. Building it walks the whole vocabulary, so [`crate::Engine::grammars`] builds it
//!   once, on first use.
//! * [`Grammars::compile`] turns a [`GrammarSpec`] (JSON schema, any JSON object, regex,
//!   Lark) into a per-sequence [`Constraint`]. It **fails closed**: a grammar llguidance
//!   cannot compile, or one that admits no output at all, is an error naming the keyword
//!   and the JSON path of the offending subschema (llguidance itself names neither, so
//!   [`locate_schema_error`] finds the deepest subschema that fails alone).
//! * [`Constraint`]: masks a row of logits before sampling (disallowed ids to -inf), then
//!   advances on the sampled token; when the grammar is complete the sequence ends. Its
//!   mask for the next step depends only on the tokens so far, so the engines compute it
//!   on another thread while the forward pass of the same step runs.
//!
//! JSON output is compact by default (`", "` and `": "` separators, no free whitespace),
//! as `json.dumps` writes it: free whitespace lets a small model pad forever. A schema's
//! own top-level `"x-guidance"` options win.

use std::sync::Arc;
use std::time::{Duration, Instant};

use llguidance::api::TopLevelGrammar;
use llguidance::{Matcher, ParserFactory};
use loupe_text::{TokenBytes, Tokenizer};
use serde_json::Value;
use toktrie::{SimpleVob, TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};

/// What the output must match.
#[derive(Debug, Clone, PartialEq)]
pub enum GrammarSpec {
    /// A JSON Schema (draft 2020-12 subset that llguidance supports).
    JsonSchema(Value),
    /// Any JSON object (OpenAI's `json_object` response format).
    JsonObject,
    /// A regular expression the whole output must match.
    Regex(String),
    /// A Lark grammar (llguidance's dialect; `start` is the root rule).
    Lark(String),
}

impl GrammarSpec {
    /// The kind, for messages and metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            GrammarSpec::JsonSchema(_) => "json schema",
            GrammarSpec::JsonObject => "json object",
            GrammarSpec::Regex(_) => "regex",
            GrammarSpec::Lark(_) => "lark grammar",
        }
    }
}

/// Why a grammar was refused or a constraint failed.
#[derive(Debug, Clone, thiserror::Error, PartialEq)]
#[non_exhaustive]
pub enum ConstraintError {
    /// The grammar does not compile or admits no output; `keyword` and `path` (a JSON
    /// pointer into the schema, `""` for the root) say where, when known.
    #[error("invalid {kind}{}: {message}", where_(keyword.as_deref(), path.as_deref()))]
    Invalid { kind: &'static str, keyword: Option<String>, path: Option<String>, message: String },
    /// The tokenizer cannot give its tokens' bytes, or llguidance refused the vocabulary.
    #[error("constrained decoding is unavailable for this model: {0}")]
    Unavailable(String),
    /// The grammar engine failed while generating (a bug, reported rather than ignored).
    #[error("grammar engine: {0}")]
    Engine(String),
}

fn where_(keyword: Option<&str>, path: Option<&str>) -> String {
    match (keyword, path) {
        (Some(k), Some(p)) => format!(" (keyword '{k}' at '{}')", if p.is_empty() { "/" } else { p }),
        (None, Some(p)) => format!(" (at '{}')", if p.is_empty() { "/" } else { p }),
        (Some(k), None) => format!(" (keyword '{k}')"),
        (None, None) => String::new(),
    }
}

/// The model's vocabulary as llguidance sees it.
struct TokenEnv {
    trie: TokTrie,
    tokenizer: Tokenizer,
}

impl TokenizerEnv for TokenEnv {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    /// Text to ids as the model would write it; llguidance uses this to tokenize forced
    /// text. Invalid UTF-8 falls back to the trie's greedy tokenization.
    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        self.trie.tokenize_with_greedy_fallback(s, |text| self.tokenizer.encode(text, false).unwrap_or_default())
    }
}

/// The per-model grammar compiler; see the module docs. Cheap to share (`Arc` inside).
#[derive(Clone)]
pub struct Grammars {
    factory: Arc<ParserFactory>,
    vocab: usize,
    build_time: Duration,
}

impl std::fmt::Debug for Grammars {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grammars").field("vocab", &self.vocab).field("build_time", &self.build_time).finish()
    }
}

impl Grammars {
    /// Over `tokenizer`'s tokens for a model with `n_logits` logits per row, ending
    /// sequences on `eos_ids` (the first is the EOS; the rest end generation too).
    pub fn new(tokenizer: &Tokenizer, n_logits: usize, eos_ids: &[u32]) -> Result<Grammars, ConstraintError> {
        let start = Instant::now();
        let bytes = tokenizer.token_bytes(n_logits).map_err(|e| ConstraintError::Unavailable(e.to_string()))?;
        let words: Vec<Vec<u8>> = bytes
            .into_iter()
            .map(|t| match t {
                TokenBytes::Text(b) => b,
                TokenBytes::Special(name) => {
                    let mut w = Vec::with_capacity(name.len() + 1);
                    w.push(TokTrie::SPECIAL_TOKEN_MARKER);
                    w.extend_from_slice(name.as_bytes());
                    w
                }
            })
            .collect();
        let eos = *eos_ids.first().ok_or_else(|| {
            ConstraintError::Unavailable(
                "the model has no end-of-sequence token, so a grammar could never end it".into(),
            )
        })?;
        if let Some(&bad) = eos_ids.iter().find(|&&t| t as usize >= n_logits) {
            return Err(ConstraintError::Unavailable(format!(
                "end-of-sequence id {bad} is outside the {n_logits} logits"
            )));
        }
        let info = TokRxInfo::new(n_logits as u32, eos);
        let mut trie = TokTrie::from(&info, &words);
        if eos_ids.len() > 1 {
            trie = trie.with_eos_tokens(eos_ids);
        }
        let env: TokEnv = Arc::new(TokenEnv { trie, tokenizer: tokenizer.clone() });
        let mut factory = ParserFactory::new_simple(&env).map_err(|e| ConstraintError::Unavailable(e.to_string()))?;
        factory.quiet();
        Ok(Grammars { factory: Arc::new(factory), vocab: n_logits, build_time: start.elapsed() })
    }

    /// How long building the token environment took.
    pub fn build_time(&self) -> Duration {
        self.build_time
    }

    /// A constraint for one sequence, with its first mask computed (a grammar that admits
    /// nothing is refused here, not at the first step).
    pub fn compile(&self, spec: &GrammarSpec) -> Result<Constraint, ConstraintError> {
        let kind = spec.kind();
        let grammar = match spec {
            GrammarSpec::JsonSchema(schema) => {
                if !schema.is_object() && !schema.is_boolean() {
                    return Err(ConstraintError::Invalid {
                        kind,
                        keyword: None,
                        path: Some(String::new()),
                        message: "a JSON schema must be an object or a boolean".into(),
                    });
                }
                TopLevelGrammar::from_json_schema(with_compact_json(schema))
            }
            GrammarSpec::JsonObject => {
                TopLevelGrammar::from_json_schema(with_compact_json(&serde_json::json!({"type": "object"})))
            }
            GrammarSpec::Regex(rx) => TopLevelGrammar::from_regex(rx),
            GrammarSpec::Lark(src) => TopLevelGrammar::from_lark(src.clone()),
        };
        let matcher = Matcher::new(self.factory.create_parser(grammar));
        if let Some(message) = matcher.get_error() {
            return Err(match spec {
                GrammarSpec::JsonSchema(schema) => {
                    let (path, keyword, message) =
                        locate_schema_error(self, schema).unwrap_or((String::new(), keyword_of(&message), message));
                    ConstraintError::Invalid { kind, keyword, path: Some(path), message }
                }
                _ => ConstraintError::Invalid { kind, keyword: None, path: None, message },
            });
        }
        let mut constraint = Constraint { matcher, mask: None, vocab: self.vocab, mask_time: Duration::ZERO, masks: 0 };
        constraint.compute_mask()?;
        if constraint.mask.as_ref().is_some_and(|m| m.is_zero()) {
            return Err(ConstraintError::Invalid {
                kind,
                keyword: None,
                path: Some(String::new()),
                message: "the grammar admits no output (it is unsatisfiable)".into(),
            });
        }
        Ok(constraint)
    }

    /// Whether `schema` compiles on its own (with `root`'s definitions, for `$ref`).
    fn schema_compiles(&self, schema: &Value, root: &Value) -> Option<String> {
        let mut s = schema.clone();
        if let (Some(obj), Some(root)) = (s.as_object_mut(), root.as_object()) {
            for key in ["$defs", "definitions"] {
                if let (false, Some(defs)) = (obj.contains_key(key), root.get(key)) {
                    obj.insert(key.into(), defs.clone());
                }
            }
        }
        Matcher::new(self.factory.create_parser(TopLevelGrammar::from_json_schema(with_compact_json(&s)))).get_error()
    }
}

/// The grammar of an answer made only of tool calls, in the Hermes / Qwen2.5 form
/// `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`: one call, or with
/// `parallel` one or more separated by newlines. `functions` are (name, parameters schema);
/// each call's arguments must match its function's. With `think`, each call may be preceded
/// by a `<think>…</think>` block (a reasoning model thinks between calls). The grammar is
/// complete after any call, so the model may end its turn there; every later call is under
/// the same grammar (enforcement never stops after the first).
pub fn tool_call_grammar(functions: &[(&str, Value)], parallel: bool, think: bool) -> GrammarSpec {
    let variants: Vec<Value> = functions
        .iter()
        .map(|(name, params)| serde_json::json!({"type": "object", "properties": {"name": {"const": name}, "arguments": params}, "required": ["name", "arguments"], "additionalProperties": false}))
        .collect();
    let schema = with_compact_json(&serde_json::json!({"anyOf": variants}));
    let repeat = if parallel { " (\"\\n\" section)*" } else { "" };
    let section = if think {
        "section: (think_block ws)? call\nthink_block[lazy]: /<think>(.|\\n)*<\\/think>/\nws: /[ \\n]*/\n"
    } else {
        "section: call\n"
    };
    GrammarSpec::Lark(format!(
        "start: section{repeat}\n{section}call: \"<tool_call>\\n\" args \"\\n</tool_call>\"\nargs: %json {schema}\n"
    ))
}

/// Adds compact separators unless the schema sets its own `x-guidance` options.
fn with_compact_json(schema: &Value) -> Value {
    let mut s = schema.clone();
    if let Some(obj) = s.as_object_mut() {
        obj.entry("x-guidance").or_insert_with(
            || serde_json::json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "}),
        );
    }
    s
}

/// Keywords whose value is one subschema, a map of them, or a list of them.
const ONE_SCHEMA: &[&str] = &[
    "items",
    "additionalProperties",
    "not",
    "propertyNames",
    "contains",
    "additionalItems",
    "if",
    "then",
    "else",
    "unevaluatedProperties",
    "unevaluatedItems",
];
const SCHEMA_MAPS: &[&str] = &["properties", "patternProperties", "$defs", "definitions", "dependentSchemas"];
const SCHEMA_LISTS: &[&str] = &["anyOf", "allOf", "oneOf", "prefixItems"];

fn child_schemas(schema: &Value) -> Vec<(String, &Value)> {
    let mut out = Vec::new();
    let Some(obj) = schema.as_object() else { return out };
    let esc = |k: &str| k.replace('~', "~0").replace('/', "~1");
    for (key, v) in obj {
        if ONE_SCHEMA.contains(&key.as_str()) && v.is_object() {
            out.push((format!("/{}", esc(key)), v));
        } else if SCHEMA_MAPS.contains(&key.as_str()) {
            for (name, sub) in v.as_object().into_iter().flatten() {
                out.push((format!("/{}/{}", esc(key), esc(name)), sub));
            }
        } else if SCHEMA_LISTS.contains(&key.as_str()) || (key == "items" && v.is_array()) {
            for (i, sub) in v.as_array().into_iter().flatten().enumerate() {
                out.push((format!("/{}/{i}", esc(key)), sub));
            }
        }
    }
    out
}

/// The offending keyword named in one of llguidance's messages.
fn keyword_of(message: &str) -> Option<String> {
    if let Some(rest) = message.split("Unimplemented keys: [").nth(1) {
        return rest
            .split(']')
            .next()
            .and_then(|keys| keys.split(',').next())
            .map(|k| k.trim().trim_matches('"').to_string());
    }
    let table = [
        ("Unknown format", "format"),
        ("Invalid type", "type"),
        ("regex parse error", "pattern"),
        ("Pointer", "$ref"),
        ("oneOf", "oneOf"),
        ("$ref", "$ref"),
        ("minItems", "minItems"),
        ("maxItems", "maxItems"),
        ("minLength", "minLength"),
        ("maxLength", "maxLength"),
        ("minimum", "minimum"),
        ("maximum", "maximum"),
        ("enum", "enum"),
        ("const", "const"),
        ("required", "required"),
    ];
    table.iter().find(|(needle, _)| message.contains(needle)).map(|(_, k)| k.to_string())
}

/// Where a schema that fails to compile goes wrong: the deepest subschema that fails on
/// its own (each compiled with the root's definitions), as (JSON pointer, keyword,
/// llguidance's message). `None` if the failure only shows in the whole.
pub fn locate_schema_error(grammars: &Grammars, root: &Value) -> Option<(String, Option<String>, String)> {
    let mut message = grammars.schema_compiles(root, root)?;
    let mut path = String::new();
    let mut node = root;
    // Descend while some child fails alone; bounded by the schema's depth.
    'descend: loop {
        for (suffix, child) in child_schemas(node) {
            if let Some(m) = grammars.schema_compiles(child, root) {
                path.push_str(&suffix);
                node = child;
                message = m;
                continue 'descend;
            }
        }
        break;
    }
    let keyword = keyword_of(&message);
    // A regex error in a property-name pattern belongs to `patternProperties`, not `pattern`.
    let keyword = match keyword.as_deref() {
        Some("pattern") if node.get("pattern").is_none() && node.get("patternProperties").is_some() => {
            Some("patternProperties".into())
        }
        _ => keyword,
    };
    Some((path, keyword, message.lines().next().unwrap_or_default().to_string()))
}

/// One sequence's grammar state; see the module docs.
pub struct Constraint {
    matcher: Matcher,
    /// The allowed ids for the next token, once computed.
    mask: Option<SimpleVob>,
    vocab: usize,
    mask_time: Duration,
    masks: u64,
}

impl std::fmt::Debug for Constraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Constraint")
            .field("masks", &self.masks)
            .field("mask_time", &self.mask_time)
            .field("stopped", &self.matcher.is_stopped())
            .finish()
    }
}

impl Constraint {
    /// Computes the mask for the next token if it is not computed yet (the engines call this
    /// on a helper thread during the forward pass).
    pub fn compute_mask(&mut self) -> Result<(), ConstraintError> {
        if self.mask.is_some() {
            return Ok(());
        }
        let start = Instant::now();
        let mask = self.matcher.compute_mask_or_eos().map_err(|e| ConstraintError::Engine(e.to_string()))?;
        self.mask_time += start.elapsed();
        self.masks += 1;
        self.mask = Some(mask);
        Ok(())
    }

    /// Sets every disallowed logit to -inf (computing the mask first if needed). Not
    /// llguidance's `SimpleVob::apply_to`, which writes 0.0 to allowed entries: it is meant
    /// for a bias buffer, not for logits.
    pub fn apply(&mut self, logits: &mut [f32]) -> Result<(), ConstraintError> {
        self.compute_mask()?;
        let Some(mask) = &self.mask else { return Ok(()) };
        let words = mask.as_slice();
        for (w, chunk) in logits.chunks_mut(32).enumerate() {
            let bits = words.get(w).copied().unwrap_or(0);
            if bits == u32::MAX {
                continue;
            }
            for (j, l) in chunk.iter_mut().enumerate() {
                if bits & (1 << j) == 0 {
                    *l = f32::NEG_INFINITY;
                }
            }
        }
        Ok(())
    }

    /// Whether `token` is allowed next (computing the mask if needed).
    pub fn allows(&mut self, token: u32) -> Result<bool, ConstraintError> {
        self.compute_mask()?;
        Ok(self.mask.as_ref().is_some_and(|m| (token as usize) < self.vocab && m.is_allowed(token)))
    }

    /// Advances on the sampled `token`; then, with `fast_forward`, also consumes the tokens
    /// the grammar forces next and returns them (the caller appends them without sampling).
    pub fn advance(&mut self, token: u32, fast_forward: bool) -> Result<Vec<u32>, ConstraintError> {
        self.mask = None;
        self.matcher
            .consume_token(token)
            .map_err(|e| ConstraintError::Engine(format!("token {token} was not accepted: {e}")))?;
        if !fast_forward || self.matcher.is_stopped() {
            return Ok(Vec::new());
        }
        let forced = self.matcher.consume_ff_tokens();
        if let Some(e) = self.matcher.get_error() {
            return Err(ConstraintError::Engine(e));
        }
        Ok(forced)
    }

    /// The grammar is complete and admits nothing more: the sequence ends here.
    pub fn is_finished(&self) -> bool {
        self.matcher.is_stopped()
    }

    /// Masks computed and the time they took (for `loupe bench`).
    pub fn mask_stats(&self) -> (u64, Duration) {
        (self.masks, self.mask_time)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keywords_are_read_from_llguidance_messages() {
        assert_eq!(keyword_of("Unimplemented keys: [\"contains\"]").as_deref(), Some("contains"));
        assert_eq!(keyword_of("Unknown format: weird").as_deref(), Some("format"));
        assert_eq!(keyword_of("something else"), None);
    }

    #[test]
    fn subschemas_are_listed_with_json_pointers() {
        let s = serde_json::json!({"properties": {"a/b": {"type": "string"}}, "anyOf": [{}, {}], "items": {"type": "integer"}});
        let mut paths: Vec<String> = child_schemas(&s).into_iter().map(|(p, _)| p).collect();
        paths.sort();
        assert_eq!(paths, ["/anyOf/0", "/anyOf/1", "/items", "/properties/a~1b"]);
    }

    #[test]
    fn errors_name_keyword_and_path() {
        let e = ConstraintError::Invalid {
            kind: "json schema",
            keyword: Some("contains".into()),
            path: Some("/properties/a".into()),
            message: "Unimplemented keys".into(),
        };
        assert_eq!(e.to_string(), "invalid json schema (keyword 'contains' at '/properties/a'): Unimplemented keys");
    }
}
