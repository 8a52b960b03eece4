//! From per-pair results to a verdict: the first divergence in execution order, false
//! cliffs (dump bugs that look like model bugs), the token-0 invariant, and the likely
//! cause from docs/parity-protocol.md's signature table, evaluated in order (first match wins).

use serde::Serialize;

use crate::names::{is_attention_output, is_embedding, is_layer_output, is_logits_name, layer_index, repeat_call_base};
use crate::result::{PairReport, Status};
use crate::signatures::{localize, uncompared_inputs, Ctx, SIGNATURES};

pub use crate::evidence::{magnitude_only, Evidence, FalseCliff, LayerShift};

/// The token-0 invariant applied to the first diverged attention value.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Token0 {
    pub tensor: String,
    pub step: u32,
    pub token0_cosine: f64,
    pub worst_later_token: Option<usize>,
    pub worst_later_cosine: Option<f64>,
    pub conclusion: String,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SignatureHit {
    pub id: &'static str,
    pub signature: &'static str,
    pub first_check: &'static str,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Verdict {
    /// `match` or `divergence`.
    pub verdict: &'static str,
    pub first_divergence: Option<String>,
    pub first_divergence_step: Option<u32>,
    pub likely_cause: Option<String>,
    pub signature: Option<SignatureHit>,
    pub false_cliffs: Vec<FalseCliff>,
    pub token0: Option<Token0>,
    pub next_step: Option<String>,
}

/// Target layer i matching reference layer i±1 far better than layer i, for most of the
/// diverged layers checked (false cliff 1).
pub fn layer_offset(shifts: &[LayerShift], cos: f64) -> Option<FalseCliff> {
    if shifts.is_empty() {
        return None;
    }
    let better = |other: Option<f64>, own: f64| other.is_some_and(|o| o >= cos && o - own >= 0.05);
    let need = shifts.len().div_ceil(2);
    for (dir, label) in [(1i64, "i+1"), (-1, "i-1")] {
        let hits: Vec<&LayerShift> =
            shifts.iter().filter(|s| better(if dir > 0 { s.vs_next } else { s.vs_prev }, s.own_cosine)).collect();
        if hits.len() >= need {
            let s = hits[0];
            let other = s.layer as i64 + dir;
            let (v, oname) = if dir > 0 {
                (s.vs_next, format!("model.layers.{other}"))
            } else if other < 0 {
                (s.vs_prev, "model.embed_tokens".into())
            } else {
                (s.vs_prev, format!("model.layers.{other}"))
            };
            return Some(FalseCliff {
                kind: "layer_offset",
                message: format!(
                    "dump indexing off by one: target model.layers.{} matches reference {oname} (cosine {:.4}) far better than reference model.layers.{} ({:.4}); target layer i lines up with reference layer {label} (hidden_states[i] is the input of layer i, not its output)",
                    s.layer, v.unwrap_or(0.0), s.layer, s.own_cosine
                ),
                names: hits.iter().map(|h| format!("model.layers.{}", h.layer)).collect(),
            });
        }
    }
    None
}

/// Embedding fine at step 0 but bad at a decode step (false cliff 2).
pub fn decode_mask(pairs: &[PairReport]) -> Option<FalseCliff> {
    let emb = |p: &&PairReport| is_embedding(&p.name);
    let prefill_ok = pairs.iter().filter(emb).any(|p| p.step == 0 && p.status == Status::Match);
    let bad: Vec<&PairReport> = pairs.iter().filter(emb).filter(|p| p.step > 0 && p.status.is_failure()).collect();
    if !prefill_ok || bad.is_empty() {
        return None;
    }
    Some(FalseCliff {
        kind: "decode_mask",
        message: format!(
            "embedding matches at step 0 but not at decode step {}: the decode-step dump did not extend the input ids and attention mask with the teacher-forced tokens",
            bad[0].step
        ),
        names: bad.iter().map(|p| format!("{} (step {})", p.name, p.step)).collect(),
    })
}

/// Names with a repeated-call marker `(k)` on one side only (false cliff 3), whose base name
/// the other side has: a module called twice that the other side never names (Gemma 3's
/// `model.rotary_emb`, run once per layer type) cannot be mispaired.
pub fn double_hooks(names_a: &[String], names_b: &[String]) -> Option<FalseCliff> {
    let marked = |v: &[String], other: &[String]| {
        v.iter().filter(|n| repeat_call_base(n).is_some_and(|base| other.contains(&base))).cloned().collect::<Vec<_>>()
    };
    let (ma, mb) = (marked(names_a, names_b), marked(names_b, names_a));
    let (side, names) = match (ma.is_empty(), mb.is_empty()) {
        (false, true) => ("reference", ma),
        (true, false) => ("target", mb),
        _ => return None,
    };
    Some(FalseCliff {
        kind: "double_hook",
        message: format!(
            "the {side} dump has values of modules called twice ({}): a hook that fires twice overwrites its first capture, so the same-named tensor on the other side may hold a different call",
            names.iter().take(3).cloned().collect::<Vec<_>>().join(", ")
        ),
        names,
    })
}

/// The token-0 invariant on the first diverged attention output (or q/k after RoPE).
pub fn token0(pairs: &[PairReport], cos: f64) -> Option<Token0> {
    let p = pairs.iter().find(|p| {
        p.status == Status::Diverged
            && (is_attention_output(&p.name) || p.name.ends_with("_rope"))
            && p.tokens.as_ref().is_some_and(|t| t.rows >= 2)
    })?;
    let t = p.tokens.as_ref()?;
    let later_bad = t.worst_later_cosine.is_some_and(|c| c < cos);
    let conclusion = if t.token0_cosine < cos {
        "token 0 already diverges: under a causal mask token 0 attends only to itself, so suspect V, o_proj or the KV-cache write (not RoPE, not the mask)"
    } else if later_bad {
        "token 0 matches but later tokens do not: suspect RoPE, the attention mask, or KV-cache reads (or the GQA head mapping)"
    } else {
        "every token row is within tolerance; the divergence is in magnitude, not direction"
    };
    Some(Token0 {
        tensor: p.name.clone(),
        step: p.step,
        token0_cosine: t.token0_cosine,
        worst_later_token: t.worst_later_token,
        worst_later_cosine: t.worst_later_cosine,
        conclusion: conclusion.into(),
    })
}

/// Decides the verdict.
pub fn decide(ev: &Evidence) -> Verdict {
    let mut cliffs = Vec::new();
    cliffs.extend(layer_offset(&ev.layer_shifts, ev.thresholds.cos));
    cliffs.extend(decode_mask(ev.pairs));
    cliffs.extend(double_hooks(&ev.names_a, &ev.names_b));
    let first = ev.first();
    let tokens0 = token0(ev.pairs, ev.thresholds.cos);
    if ev.pairs.is_empty() {
        return Verdict {
            verdict: "divergence",
            first_divergence: None,
            first_divergence_step: None,
            likely_cause: Some("No matching tensors found: the names differ (see the unpaired lists; use --map) or the inputs are not what was meant".into()),
            signature: None,
            false_cliffs: cliffs,
            token0: None,
            next_step: None,
        };
    }
    let tokens_differ = ev.prompt_tokens.as_ref().is_some_and(|(a, b)| a != b);
    let ctx = Ctx { ev, first, cliffs: &cliffs };
    let mut hit = None;
    if first.is_some() || tokens_differ {
        for s in SIGNATURES {
            if let Some(cause) = (s.test)(&ctx) {
                hit = Some((s, cause));
                break;
            }
        }
    }
    let first_pair = first.and_then(|i| ev.pairs.get(i));
    let likely_cause = hit.as_ref().map(|(s, cause)| match first_pair.and_then(|p| localize(ev, p).map(|h| (p, h))) {
        Some((p, hint)) if s.id != "op" => format!("{cause}. First value out of tolerance: {} ({hint})", p.name),
        _ => cause.clone(),
    });
    let next_step = match first_pair {
        None => Some("every paired tensor is within tolerance; if generation still diverges, follow the bisect ladder: teacher-forced dump at decode step K, incremental decode, server vs pipeline (docs/parity-protocol.md, step 5)".into()),
        Some(p) if is_layer_output(&p.name) => {
            let l = layer_index(&p.name).unwrap_or(0);
            Some(format!("dump the sub-ops of layer {l} (norms, q/k/v, rope, attention, o_proj, residual, mlp) and compare them: --only 'model\\.layers\\.{l}\\.'"))
        }
        Some(p) if is_logits_name(&p.name) => Some("compare the top-10 logits of the mismatching rows (--token-index ROW --per-dim)".into()),
        Some(p) => match uncompared_inputs(ev, p) {
            missing if missing.is_empty() => Some("feed the reference's input to this op alone to tell a wrong op from inherited error (docs/parity-protocol.md, step 3)".into()),
            missing => {
                // explain recomputes the attention block from the q/k/v projections.
                let explain = if missing.iter().any(|m| m.ends_with(".self_attn.attn_output")) {
                    format!("; or test the attention-core hypotheses without it: loupe explain REF TARGET --tensor {} --model MODEL", p.name)
                } else {
                    String::new()
                };
                Some(format!(
                    "dump {} on both sides (hook it in the reference) and compare again, so the op's input is evidence; then feed the reference's input to the op alone (docs/parity-protocol.md, step 3){explain}",
                    missing.join(", ")
                ))
            }
        },
    };
    // Different prompt token ids invalidate every comparison after them (protocol step 0).
    let (first_divergence, first_divergence_step) = if tokens_differ {
        (Some("prompt_tokens".to_string()), Some(0))
    } else {
        (first_pair.map(|p| p.name.clone()), first_pair.map(|p| p.step))
    };
    Verdict {
        verdict: if first_divergence.is_some() { "divergence" } else { "match" },
        first_divergence,
        first_divergence_step,
        likely_cause,
        signature: hit.map(|(s, _)| SignatureHit { id: s.id, signature: s.signature, first_check: s.first_check }),
        false_cliffs: cliffs,
        token0: tokens0,
        next_step,
    }
}
