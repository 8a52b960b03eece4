//! Constrained decoding on the tiny random-weight Llama (its byte-level BPE tokenizer is
//! real): a random model writes garbage, so every valid output here is the grammar's doing.
//! Single-sequence and batched engines, mixed with unconstrained sequences, fast-forward,
//! and grammars refused with the keyword and path named.

use std::path::PathBuf;
use std::sync::OnceLock;

use loupe_runtime::{
    BatchConfig, BatchEngine, ConstraintError, Engine, FinishReason, GenerateRequest, GrammarSpec, LoadOptions,
    SamplingParams, SeqRequest,
};
use serde_json::{json, Value};

fn tiny_model() -> PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        let bytes = loupe_models::tiny::tiny_llama_gguf_bytes(&loupe_models::tiny::TinyLlama::default())
            .expect("building the tiny model");
        let path = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("loupe-tiny-constraint-{}.gguf", std::process::id()));
        std::fs::create_dir_all(env!("CARGO_TARGET_TMPDIR")).unwrap();
        std::fs::write(&path, &bytes).unwrap();
        path
    })
    .clone()
}

fn engine() -> &'static Engine {
    static ENGINE: OnceLock<Engine> = OnceLock::new();
    ENGINE.get_or_init(|| Engine::load(tiny_model(), LoadOptions::default()).expect("loading the tiny model"))
}

fn prompt(e: &Engine) -> Vec<u32> {
    e.tokenizer().encode("Write a record:", true).unwrap()
}

fn request(e: &Engine, grammar: Option<GrammarSpec>, sampling: SamplingParams) -> GenerateRequest {
    GenerateRequest { grammar, ..GenerateRequest::new(prompt(e), 160, sampling, e.tokenizer().eos_ids()) }
}

/// A hand-written check that an output is valid for its schema.
type ValidOutput = fn(&Value) -> bool;

/// Schemas a random model can only satisfy through the mask, and what a valid output must
/// show (checked by hand: no validator crate in the workspace).
fn schemas() -> Vec<(Value, ValidOutput)> {
    vec![
        (
            json!({"type": "object", "properties": {"name": {"type": "string", "maxLength": 8}, "age": {"type": "integer", "minimum": 0, "maximum": 120}}, "required": ["name", "age"], "additionalProperties": false}),
            |v| {
                v["name"].as_str().is_some_and(|s| s.chars().count() <= 8)
                    && v["age"].as_i64().is_some_and(|a| (0..=120).contains(&a))
                    && v.as_object().unwrap().len() == 2
            },
        ),
        (
            json!({"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]}, "tags": {"type": "array", "items": {"type": "boolean"}, "minItems": 2, "maxItems": 3}}, "required": ["color", "tags"], "additionalProperties": false}),
            |v| {
                ["red", "green", "blue"].contains(&v["color"].as_str().unwrap_or(""))
                    && v["tags"]
                        .as_array()
                        .is_some_and(|a| (2..=3).contains(&a.len()) && a.iter().all(Value::is_boolean))
            },
        ),
        (
            json!({"anyOf": [{"type": "object", "properties": {"x": {"const": 1}}, "required": ["x"], "additionalProperties": false}, {"type": "object", "properties": {"y": {"type": "null"}}, "required": ["y"], "additionalProperties": false}]}),
            |v| v == &json!({"x": 1}) || v == &json!({"y": null}),
        ),
    ]
}

#[test]
fn generated_json_matches_its_schema_greedy_and_sampled() {
    let e = engine();
    for (schema, valid) in schemas() {
        for sampling in [SamplingParams::default(), SamplingParams { temperature: 1.0, seed: 7, ..Default::default() }]
        {
            let out = e
                .generate_tokens(&request(e, Some(GrammarSpec::JsonSchema(schema.clone())), sampling), &mut |_| {})
                .unwrap();
            let v: Value = serde_json::from_str(&out.text)
                .unwrap_or_else(|err| panic!("{schema}: output {:?} is not JSON: {err}", out.text));
            assert!(valid(&v), "{schema}: {v} does not match");
            assert!(matches!(out.finish_reason, FinishReason::Grammar | FinishReason::Eos), "{:?}", out.finish_reason);
            assert!(out.masks.is_some_and(|(n, _)| n as usize >= out.tokens.len()));
        }
    }
}

#[test]
fn unconstrained_output_differs_so_the_mask_does_the_work() {
    let e = engine();
    let free = e.generate_tokens(&request(e, None, SamplingParams::default()), &mut |_| {}).unwrap();
    assert!(
        serde_json::from_str::<Value>(&free.text).is_err(),
        "the random model wrote JSON by itself: {:?}",
        free.text
    );
    assert!(free.masks.is_none());
}

#[test]
fn regex_and_lark_grammars_constrain_and_finish() {
    let e = engine();
    let rx = regex::Regex::new(r"^[0-9]{3}-[a-z]{2,4}$").unwrap();
    let out = e
        .generate_tokens(
            &request(e, Some(GrammarSpec::Regex("[0-9]{3}-[a-z]{2,4}".into())), SamplingParams::default()),
            &mut |_| {},
        )
        .unwrap();
    assert!(rx.is_match(&out.text), "{:?}", out.text);
    let lark = "start: greeting \" \" name\ngreeting: \"hello\" | \"bye\"\nname: /[A-Z][a-z]{1,5}/\n";
    let out = e
        .generate_tokens(
            &request(
                e,
                Some(GrammarSpec::Lark(lark.into())),
                SamplingParams { temperature: 1.0, seed: 3, ..Default::default() },
            ),
            &mut |_| {},
        )
        .unwrap();
    assert!(regex::Regex::new(r"^(hello|bye) [A-Z][a-z]{1,5}$").unwrap().is_match(&out.text), "{:?}", out.text);
    // A grammar with one possible output ends there, without waiting for EOS.
    let out = e
        .generate_tokens(&request(e, Some(GrammarSpec::Regex("done".into())), SamplingParams::default()), &mut |_| {})
        .unwrap();
    assert_eq!((out.text.as_str(), out.finish_reason), ("done", FinishReason::Grammar));
}

#[test]
fn fast_forward_appends_forced_tokens_and_stays_valid() {
    let e = engine();
    let schema = json!({"type": "object", "properties": {"a_rather_long_property_name": {"type": "integer", "minimum": 0, "maximum": 9}}, "required": ["a_rather_long_property_name"], "additionalProperties": false});
    let spec = GrammarSpec::JsonSchema(schema);
    let slow = e.generate_tokens(&request(e, Some(spec.clone()), SamplingParams::default()), &mut |_| {}).unwrap();
    let fast = e
        .generate_tokens(
            &GenerateRequest { fast_forward: true, ..request(e, Some(spec), SamplingParams::default()) },
            &mut |_| {},
        )
        .unwrap();
    for out in [&slow, &fast] {
        let v: Value = serde_json::from_str(&out.text).unwrap_or_else(|err| panic!("{:?}: {err}", out.text));
        assert!(v["a_rather_long_property_name"].as_i64().is_some_and(|x| (0..=9).contains(&x)), "{v}");
    }
    // The forced key costs no mask (nor a sampling step) with fast-forward.
    assert!(fast.masks.unwrap().0 < slow.masks.unwrap().0, "fast {:?} slow {:?}", fast.masks, slow.masks);
}

#[test]
fn batched_constrained_and_free_sequences_match_their_solo_runs() {
    let e = engine();
    let specs = [
        None,
        Some(GrammarSpec::JsonSchema(schemas()[0].0.clone())),
        Some(GrammarSpec::JsonObject),
        None,
        Some(GrammarSpec::Regex("[a-c]{5,9}".into())),
    ];
    let sampling = |i: usize| SamplingParams {
        temperature: if i.is_multiple_of(2) { 0.0 } else { 0.8 },
        seed: 40 + i as u64,
        ..Default::default()
    };
    let reqs: Vec<SeqRequest> = specs
        .iter()
        .enumerate()
        .map(|(i, g)| SeqRequest {
            grammar: g.clone(),
            ..SeqRequest::new(prompt(e), 60 + i, sampling(i), e.tokenizer().eos_ids())
        })
        .collect();
    let mut b = BatchEngine::new(e, BatchConfig::default()).unwrap();
    let together = b.run_all(reqs.clone()).unwrap();
    for (i, (req, got)) in reqs.iter().zip(&together).enumerate() {
        let mut solo = BatchEngine::new(e, BatchConfig::default()).unwrap();
        assert_eq!(solo.run_all(vec![req.clone()]).unwrap()[0].tokens, got.tokens, "request {i}");
        if req.sampling.temperature > 0.0 {
            // The single-sequence engine runs other kernels (bit-identity is promised within
            // the batched engine only); a random model's near-flat distribution turns their
            // last-bit differences into other draws. Greedy runs must agree.
            continue;
        }
        let single = e
            .generate_tokens(
                &GenerateRequest {
                    grammar: specs[i].clone(),
                    ..GenerateRequest::new(prompt(e), req.max_tokens, sampling(i), e.tokenizer().eos_ids())
                },
                &mut |_| {},
            )
            .unwrap();
        assert_eq!(single.tokens, got.tokens, "request {i}");
    }
    let text = |i: usize| e.tokenizer().decode(&together[i].tokens, true).unwrap();
    assert!(serde_json::from_str::<Value>(&text(1)).is_ok_and(|v| schemas()[0].1(&v)), "{}", text(1));
    assert!(serde_json::from_str::<Value>(&text(2)).is_ok_and(|v| v.is_object()), "{}", text(2));
    assert!(regex::Regex::new("^[a-c]{5,9}$").unwrap().is_match(&text(4)), "{}", text(4));
}

#[test]
fn invalid_grammars_fail_closed_naming_keyword_and_path() {
    let g = engine().grammars().unwrap();
    let invalid = |spec: GrammarSpec| match g.compile(&spec) {
        Err(ConstraintError::Invalid { keyword, path, message, .. }) => (keyword, path, message),
        other => panic!("{spec:?} compiled: {other:?}"),
    };
    let (k, p, _) = invalid(GrammarSpec::JsonSchema(
        json!({"type": "object", "properties": {"list": {"type": "array", "contains": {"type": "integer"}}}}),
    ));
    assert_eq!((k.as_deref(), p.as_deref()), (Some("contains"), Some("/properties/list")));
    let (k, p, _) = invalid(GrammarSpec::JsonSchema(
        json!({"anyOf": [{"type": "string"}, {"type": "string", "format": "no-such-format"}]}),
    ));
    assert_eq!((k.as_deref(), p.as_deref()), (Some("format"), Some("/anyOf/1")));
    let (k, p, _) =
        invalid(GrammarSpec::JsonSchema(json!({"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}})));
    assert_eq!((k.as_deref(), p.as_deref()), (Some("$ref"), Some("/properties/a")));
    let (k, p, _) =
        invalid(GrammarSpec::JsonSchema(json!({"properties": {"code": {"type": "string", "pattern": "(?<=a)b"}}})));
    assert_eq!((k.as_deref(), p.as_deref()), (Some("pattern"), Some("/properties/code")));
    let (_, _, m) = invalid(GrammarSpec::Regex("a(".into()));
    assert!(m.contains("unclosed group"), "{m}");
    let (_, _, m) = invalid(GrammarSpec::Lark("start: undefined_rule".into()));
    assert!(m.contains("undefined_rule"), "{m}");
    // The batched engine refuses such a request when it is added; nothing is queued.
    let mut b = BatchEngine::new(engine(), BatchConfig::default()).unwrap();
    let bad = SeqRequest {
        grammar: Some(GrammarSpec::Regex("a(".into())),
        ..SeqRequest::new(prompt(engine()), 8, SamplingParams::default(), vec![])
    };
    assert!(b.add(bad).is_err());
    assert!(!b.has_work());
}

#[test]
fn constraints_are_send_so_masks_can_run_beside_the_forward_pass() {
    fn send<T: Send>() {}
    send::<loupe_runtime::Constraint>();
    fn sync<T: Send + Sync>() {}
    sync::<loupe_runtime::Grammars>();
}

/// Feeds `text` through a fresh constraint token by token; the first token refused, if any.
fn refused_at(spec: &GrammarSpec, text: &str) -> Option<usize> {
    let e = engine();
    let mut c = e.grammars().unwrap().compile(spec).unwrap();
    for (i, t) in e.tokenizer().encode(text, false).unwrap().into_iter().enumerate() {
        if !c.allows(t).unwrap() {
            return Some(i);
        }
        c.advance(t, false).unwrap();
    }
    None
}

#[test]
fn tool_call_grammar_admits_calls_with_valid_arguments_and_optional_thinking() {
    let add = json!({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"], "additionalProperties": false});
    let call = "<tool_call>\n{\"name\": \"add\", \"arguments\": {\"a\": 1, \"b\": 2}}\n</tool_call>";
    let two = format!("{call}\n{call}");
    let thinking = format!("<think>\nI add.\n</think>\n\n{call}\n<think>Again.</think>{call}");
    let one = loupe_runtime::constraint::tool_call_grammar(&[("add", add.clone())], false, false);
    let many = loupe_runtime::constraint::tool_call_grammar(
        &[("add", add.clone()), ("other", json!({"type": "object"}))],
        true,
        false,
    );
    let thinks = loupe_runtime::constraint::tool_call_grammar(&[("add", add)], true, true);
    assert_eq!(refused_at(&one, call), None);
    assert_eq!(refused_at(&many, &two), None);
    assert_eq!(refused_at(&thinks, &thinking), None);
    // A second call is still under the grammar: its arguments must validate too.
    assert!(refused_at(&many, &format!("{call}\n<tool_call>\n{{\"name\": \"add\", \"arguments\": {{\"a\": \"x\""))
        .is_some());
    assert!(refused_at(&one, &format!("{call}\n")).is_some(), "one call only without parallel calls");
    assert!(refused_at(&many, "<think>x</think>").is_some(), "no thinking unless asked for");
    assert!(refused_at(&one, "Sure! <tool_call>").is_some(), "text before a forced call");
    assert!(refused_at(&one, "<tool_call>\n{\"name\": \"sub\"").is_some(), "an undeclared function");
}

/// Speculation under grammars: each draft row is masked by the grammar's state after the
/// tokens before it, so a draft the grammar forbids is never accepted and the output still
/// matches; greedy tokens equal the run without speculation. Three drafters: prompt lookup,
/// one that proposes forbidden tokens on purpose (token 0 and the last vocabulary id
/// repeated), and one that proposes the right continuation (so drafts are accepted).
#[test]
fn speculation_under_grammars_keeps_tokens_and_validity() {
    use loupe_runtime::batch::{Drafter, SpeculationConfig};
    use std::sync::Mutex;
    static RIGHT: Mutex<Vec<Vec<u32>>> = Mutex::new(Vec::new());
    fn forbidden(_: &[u32], k: usize) -> Vec<u32> {
        (0..k).map(|j| if j % 2 == 0 { 0 } else { 511 }).collect()
    }
    fn right(tokens: &[u32], k: usize) -> Vec<u32> {
        // The continuation of whichever expected answer the tokens so far end a prefix of.
        for answer in RIGHT.lock().unwrap().iter() {
            for cut in 0..answer.len() {
                if tokens.ends_with(&answer[..cut]) && (cut > 0 || answer.is_empty()) {
                    return answer[cut..].iter().take(k).copied().collect();
                }
            }
        }
        Vec::new()
    }
    let e = engine();
    let specs = [
        GrammarSpec::JsonSchema(schemas()[0].0.clone()),
        GrammarSpec::JsonObject,
        GrammarSpec::Regex("[a-c]{5,9}".into()),
        GrammarSpec::Regex("(ab|ba){3,6}".into()),
    ];
    let reqs: Vec<SeqRequest> = specs
        .iter()
        .map(|g| SeqRequest {
            grammar: Some(g.clone()),
            ..SeqRequest::new(prompt(e), 60, SamplingParams::default(), e.tokenizer().eos_ids())
        })
        .collect();
    let want: Vec<Vec<u32>> = BatchEngine::new(e, BatchConfig::default())
        .unwrap()
        .run_all(reqs.clone())
        .unwrap()
        .into_iter()
        .map(|c| c.tokens)
        .collect();
    *RIGHT.lock().unwrap() = want.clone();
    let drafters = [
        ("ngram", SpeculationConfig::default().drafter),
        ("forbidden", Drafter::Custom(forbidden)),
        ("right", Drafter::Custom(right)),
    ];
    let (abc, abba) = (regex::Regex::new("^[a-c]{5,9}$").unwrap(), regex::Regex::new("^(ab|ba){3,6}$").unwrap());
    for (name, drafter) in drafters {
        let config =
            BatchConfig { speculation: Some(SpeculationConfig { drafter, max_draft: 4 }), ..BatchConfig::default() };
        let mut b = BatchEngine::new(e, config).unwrap();
        let got: Vec<Vec<u32>> = b.run_all(reqs.clone()).unwrap().into_iter().map(|c| c.tokens).collect();
        assert_eq!(got, want, "drafter {name}");
        let s = b.stats().spec;
        match name {
            "forbidden" => assert!(s.draft_tokens > 0 && s.accepted_tokens < s.draft_tokens, "{name}: {s:?}"),
            "right" => assert!(s.accepted_tokens > 0, "{name}: {s:?}"),
            _ => {}
        }
        let text = |i: usize| e.tokenizer().decode(&got[i], true).unwrap();
        assert!(serde_json::from_str::<Value>(&text(0)).is_ok_and(|v| schemas()[0].1(&v)), "{name}: {}", text(0));
        assert!(serde_json::from_str::<Value>(&text(1)).is_ok_and(|v| v.is_object()), "{name}: {}", text(1));
        assert!(abc.is_match(&text(2)), "{name}: {}", text(2));
        assert!(abba.is_match(&text(3)), "{name}: {}", text(3));
    }
}
