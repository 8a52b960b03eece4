//! The signature table of docs/parity-protocol.md ("Signatures"),
//! as data: each row pairs a test over the comparison with a likely cause and a first
//! check. Rows are tried in order and the first that matches names the cause; rows for
//! harness and dump problems come first (protocol: "Fix in this order: comparator/harness,
//! graph, decode state, server"). The last row localizes by op kind.

use crate::evidence::{magnitude_only, Evidence, FalseCliff};
use crate::names::{is_embedding, is_layer_output, is_logits_name, layer_index};
use crate::result::{PairReport, Reason, Status};

/// What a signature test sees.
pub struct Ctx<'a> {
    pub ev: &'a Evidence<'a>,
    /// Index of the first failing pair.
    pub first: Option<usize>,
    pub cliffs: &'a [FalseCliff],
}

impl Ctx<'_> {
    fn first(&self) -> Option<&PairReport> {
        self.first.and_then(|i| self.ev.pairs.get(i))
    }
    fn cos(&self) -> f64 {
        self.ev.thresholds.cos
    }
    /// Layer-output cosines at `step`, by layer, the embedding standing for layer -1.
    fn layer_series(&self, step: u32) -> Vec<(i64, &PairReport)> {
        let mut v: Vec<(i64, &PairReport)> = self
            .ev
            .pairs
            .iter()
            .filter(|p| p.step == step && p.metrics.is_some())
            .filter_map(|p| {
                if is_layer_output(&p.name) {
                    layer_index(&p.name).map(|l| (l as i64, p))
                } else if is_embedding(&p.name) {
                    Some((-1, p))
                } else {
                    None
                }
            })
            .collect();
        v.sort_by_key(|x| x.0);
        v
    }
    /// The first failing pair's layer output and the one before it (a "sudden cliff" is a
    /// drop of at least 0.05 in cosine from one to the other).
    fn cliff(&self) -> Option<(&PairReport, bool)> {
        let f = self.first()?;
        let l = layer_index(&f.name)? as i64;
        let series = self.layer_series(f.step);
        let at = series.iter().position(|(i, _)| *i == l)?;
        let here = series[at].1;
        let prev = at.checked_sub(1).map(|j| series[j]).filter(|(i, _)| *i == l - 1)?;
        let sudden = prev.1.cosine()? - here.cosine()? >= 0.05;
        Some((here, sudden))
    }
}

/// One row of the table.
pub struct Signature {
    pub id: &'static str,
    /// The signature as docs/parity-protocol.md states it.
    pub signature: &'static str,
    pub first_check: &'static str,
    /// Returns the likely cause when the signature matches.
    pub test: fn(&Ctx) -> Option<String>,
}

pub const SIGNATURES: &[Signature] = &[
    Signature {
        id: "prompt_tokens",
        signature: "the two dumps saw different prompt token ids",
        first_check: "tokenizer and chat template (protocol step 0)",
        test: |c| {
            let (a, b) = c.ev.prompt_tokens.as_ref()?;
            if a == b {
                return None;
            }
            let i = a.iter().zip(b).position(|(x, y)| x != y).unwrap_or(a.len().min(b.len()));
            Some(format!(
                "prompt token ids differ (first at position {i}: {} vs {}; lengths {} and {}): the tokenizer or chat template, not the graph",
                a.get(i).map_or("end".into(), |t| t.to_string()),
                b.get(i).map_or("end".into(), |t| t.to_string()),
                a.len(),
                b.len()
            ))
        },
    },
    Signature {
        id: "false_cliff",
        signature: "a false cliff: the dump, not the model",
        first_check: "fix the dumper, then compare again",
        test: |c| c.cliffs.first().map(|f| format!("a dump bug, not a model bug: {}", f.message)),
    },
    Signature {
        id: "non_finite",
        signature: "NaN or Inf on one side only",
        first_check: "LOUPE_DEBUG=nan-check to stop at the op that produces it",
        test: |c| {
            let f = c.first().filter(|f| f.reasons.contains(&Reason::NonFinite))?;
            let m = f.metrics.as_ref()?;
            Some(if m.nan_b + m.inf_b > m.nan_a + m.inf_a {
                format!("the target produces NaN/Inf at {} ({} NaN, {} Inf): overflow of a narrow dtype, an uninitialized read, a division by zero or an unguarded scale reciprocal", f.name, m.nan_b, m.inf_b)
            } else {
                format!("the reference has NaN/Inf at {} ({} NaN, {} Inf): fix or re-dump the reference before trusting this comparison", f.name, m.nan_a, m.inf_a)
            })
        },
    },
    Signature {
        id: "shape_mismatch",
        signature: "the two sides have different shapes",
        first_check: "a --map rule (transpose, head reshape, split) or --allow-reshape",
        test: |c| {
            let f = c.first().filter(|f| f.status == Status::ShapeMismatch)?;
            Some(format!("{} has shape {:?} in the reference and {:?} in the target: a layout difference (transpose, head split, batch dim) or a wrong pairing", f.name, f.shape_a, f.shape_b))
        },
    },
    Signature {
        id: "scale",
        signature: "cosine ~1 with the magnitude off",
        first_check: "norm epsilon, embedding/residual multipliers, norm weight offset (1 + w)",
        test: |c| {
            // The norm ratio must be off: an NMSE-only failure is a small direction error.
            let f = c.first().filter(|f| magnitude_only(f) && f.reasons.contains(&Reason::NormRatio))?;
            let r = f.metrics.as_ref()?.norm_ratio;
            let what = if is_embedding(&f.name) {
                "a missing or wrong embedding multiplier (e.g. sqrt(hidden_size))"
            } else if f.name.contains("norm") {
                "the norm epsilon or the norm weight (an offset of 1 + w)"
            } else {
                "a scale bug: a norm epsilon, a missing multiplier (embedding, residual, attention scale) or a dtype rounding"
            };
            Some(format!("{what}: the direction matches but ‖target‖/‖reference‖ = {r:.4} at {}", f.name))
        },
    },
    Signature {
        id: "embedding",
        signature: "embedding cosine < 0.99",
        first_check: "weight names; same token ids",
        test: |c| {
            c.first()
                .filter(|f| is_embedding(&f.name))
                .map(|_| "embedding load, vocabulary sharding, or dtype".to_string())
        },
    },
    Signature {
        id: "layer0_token0",
        signature: "layer 0 < 0.99 already at token 0",
        first_check: "the token-0 invariant",
        test: |c| {
            let f = c.first().filter(|f| layer_index(&f.name) == Some(0))?;
            (f.tokens.as_ref()?.token0_cosine < c.cos())
                .then(|| "layer-0 attention or MLP (not RoPE: token 0 is already wrong)".to_string())
        },
    },
    Signature {
        id: "later_tokens",
        signature: "token 0 perfect, tokens >= 1 bad from layer 0/1",
        first_check: "the reference's RoPE cos/sin and head layout",
        test: |c| {
            let f = c.first().filter(|f| matches!(layer_index(&f.name), Some(0 | 1)))?;
            let t = f.tokens.as_ref()?;
            (t.token0_cosine >= c.cos() && t.worst_later_cosine? < c.cos())
                .then(|| "RoPE, the attention mask, the KV cache, or the GQA head mapping".to_string())
        },
    },
    Signature {
        id: "cliff_reference_spikes",
        signature: "sudden cliff; reference spikes, target flat",
        first_check: "the attention output at that layer",
        test: |c| {
            let (here, sudden) = c.cliff()?;
            let m = here.metrics.as_ref()?;
            (sudden && m.absmax_a >= 10.0 * m.absmax_b).then(|| {
                format!(
                    "an attention sink/anchor not forming at {} (reference max |x| {:.3e}, target {:.3e})",
                    here.name, m.absmax_a, m.absmax_b
                )
            })
        },
    },
    Signature {
        id: "cliff_target_spikes",
        signature: "sudden cliff; target spikes, reference near 0",
        first_check: "is the reference dump really that layer's output?",
        test: |c| {
            let (here, sudden) = c.cliff()?;
            let m = here.metrics.as_ref()?;
            (sudden && m.absmax_b >= 10.0 * m.absmax_a).then(|| {
                format!(
                    "norm order, a residual connection, or a dump bug at {} (target max |x| {:.3e}, reference {:.3e})",
                    here.name, m.absmax_b, m.absmax_a
                )
            })
        },
    },
    Signature {
        id: "slow_decay",
        signature: "slow monotonic decay of cosine with depth",
        first_check: "rerun both in f32",
        test: |c| {
            let f = c.first()?;
            let l = layer_index(&f.name)? as i64;
            let series: Vec<f64> = c
                .layer_series(f.step)
                .iter()
                .filter(|(i, _)| *i >= 0 && *i <= l)
                .filter_map(|(_, p)| p.cosine())
                .collect();
            if l < 2 || series.len() < 3 {
                return None;
            }
            // Gentle, monotonic, and spread over several layers (one drop is a local bug).
            let steps: Vec<f64> = series.windows(2).map(|w| w[0] - w[1]).collect();
            let monotonic = steps.iter().all(|&d| d >= -1e-4);
            let gentle = steps.iter().all(|&d| d < 0.05);
            let decreasing = steps.iter().filter(|&&d| d > 1e-4).count();
            let total = series[0] - series[series.len() - 1];
            (monotonic && gentle && decreasing >= 2 && total > 1e-3).then(|| format!("reduced-precision accumulation or the attention scale: cosine decays gently from {:.4} to {:.4} over {} layers", series[0], series[series.len() - 1], series.len()))
        },
    },
    Signature {
        id: "last_token",
        signature: "whole-sequence cosine ~1, last token bad",
        first_check: "compare the last token alone (--token-index)",
        test: |c| {
            let f = c.first().filter(|f| f.reasons.contains(&Reason::LastToken))?;
            let t = f.tokens.as_ref()?;
            Some(format!(
                "a position-specific bug: {} matches overall but its last token has cosine {:.4}",
                f.name, t.last_token_cosine
            ))
        },
    },
    Signature {
        id: "near_tie",
        signature: "logits cosine >= 0.98 but argmax differs",
        first_check: "diff of the top-10 logits",
        test: |c| {
            let f = c
                .first()
                .filter(|f| f.reasons.contains(&Reason::Argmax) && (f.logits.is_some() || is_logits_name(&f.name)))?;
            if f.cosine()? < 0.98 {
                return None;
            }
            let l = f.logits.as_ref()?;
            let gap = l.argmax_mismatches.first().map_or(String::new(), |m| {
                format!(
                    " (row {}: reference prefers {} over {} by {:.3e})",
                    m.row, m.reference_top, m.target_top, m.reference_gap
                )
            });
            Some(format!("small numeric drift flipping a close top-1 token{gap}"))
        },
    },
    Signature {
        id: "op",
        signature: "first value out of tolerance, by op kind",
        first_check: "feed the reference's input to that op alone (protocol step 3)",
        test: |c| {
            let f = c.first()?;
            Some(match localize(c.ev, f) {
                Some(h) => format!("{h} (first value out of tolerance: {})", f.name),
                None => format!("the first value out of tolerance is {}", f.name),
            })
        },
    },
];

/// What each kind of value usually gets wrong, by name suffix (the localization table of
/// protocol step 3, with the hypotheses of step 4).
const OP_HINTS: &[(&str, &str)] = &[
    (
        ".self_attn.q_proj",
        "the q projection: weight layout (transpose, llama.cpp's q/k row permutation) or the norm feeding it",
    ),
    (
        ".self_attn.k_proj",
        "the k projection: weight layout (transpose, llama.cpp's q/k row permutation) or the norm feeding it",
    ),
    (".self_attn.v_proj", "the v projection weight or the norm feeding it"),
    (".self_attn.q_rope", "RoPE: split-half vs interleaved pairs, theta, scaling, or positions"),
    (".self_attn.k_rope", "RoPE: split-half vs interleaved pairs, theta, scaling, or positions"),
    (".self_attn.attn_output", "the attention core: softmax scale, causal mask, GQA head mapping, or the KV cache"),
    (".self_attn.o_proj", "the o_proj weight"),
    (".self_attn", "the o_proj weight"),
    (".attn_residual", "the residual connection: a missing or doubled skip, or a residual multiplier"),
    ("_layernorm", "RMSNorm: epsilon, the weight (or a 1 + w offset), or the f32 upcast"),
    ("model.norm", "the final RMSNorm: epsilon or weight"),
    (".mlp.gate_proj", "the gate projection weight (or gate and up swapped)"),
    (".mlp.up_proj", "the up projection weight (or gate and up swapped)"),
    (".mlp.act_fn", "the activation: SiLU vs GELU, tanh vs erf approximation"),
    (".mlp.act_mul", "the gating product act(gate) * up"),
    (".mlp.down_proj", "the down projection weight"),
    (".mlp", "the down projection weight"),
    ("lm_head", "the lm_head weight (tied to the embedding?) or the final norm"),
    ("logits", "the lm_head weight (tied to the embedding?) or the final norm"),
];

/// The values each value is computed from, by name suffix within its layer (Llama's
/// dataflow; the residual stream entering the layer is not listed).
const INPUTS: &[(&str, &[&str])] = &[
    (".self_attn.q_proj", &["input_layernorm"]),
    (".self_attn.k_proj", &["input_layernorm"]),
    (".self_attn.v_proj", &["input_layernorm"]),
    (".self_attn.q_rope", &["self_attn.q_proj"]),
    (".self_attn.k_rope", &["self_attn.k_proj"]),
    (".self_attn.attn_output", &["self_attn.q_rope", "self_attn.k_rope", "self_attn.v_proj"]),
    (".self_attn.o_proj", &["self_attn.attn_output"]),
    (".self_attn", &["self_attn.attn_output"]),
    (".attn_residual", &["self_attn.o_proj"]),
    (".post_attention_layernorm", &["attn_residual"]),
    (".mlp.gate_proj", &["post_attention_layernorm"]),
    (".mlp.up_proj", &["post_attention_layernorm"]),
    (".mlp.act_fn", &["mlp.gate_proj"]),
    (".mlp.act_mul", &["mlp.act_fn", "mlp.up_proj"]),
    (".mlp.down_proj", &["mlp.act_mul"]),
    (".mlp", &["mlp.act_mul"]),
];

/// The full names of the inputs of `name` ([`INPUTS`]), with the layer prefix of `name`.
fn inputs_of(name: &str) -> Vec<String> {
    INPUTS
        .iter()
        .find(|(suffix, _)| name.ends_with(suffix))
        .map(|(suffix, ins)| {
            let prefix = &name[..name.len() - suffix.len()];
            ins.iter().map(|i| format!("{prefix}.{i}")).collect()
        })
        .unwrap_or_default()
}

/// How a value fared in the comparison: `None` when it was not compared (absent from
/// either dump, or skipped).
fn compared(ev: &Evidence, name: &str, step: u32) -> Option<Status> {
    ev.pairs
        .iter()
        .find(|p| p.step == step && (p.name == name || p.name_a == name || p.name_b == name))
        .map(|p| p.status)
        .filter(|s| *s != Status::Skipped)
}

/// The direct inputs of `p` that were not compared (empty when every input was, or when
/// the value's inputs are not known).
pub fn uncompared_inputs(ev: &Evidence, p: &PairReport) -> Vec<String> {
    inputs_of(&p.name).into_iter().filter(|i| compared(ev, i, p.step).is_none()).collect()
}

/// The nearest compared values upstream of `name` through values that were not compared,
/// with their status (a breadth-first walk within the layer).
fn nearest_compared_upstream(ev: &Evidence, name: &str, step: u32) -> Vec<(String, Status)> {
    let mut found: Vec<(String, Status)> = Vec::new();
    let mut frontier = inputs_of(name);
    let mut seen: Vec<String> = Vec::new();
    while let Some(n) = frontier.pop() {
        if seen.contains(&n) {
            continue;
        }
        seen.push(n.clone());
        match compared(ev, &n, step) {
            Some(s) => found.push((n, s)),
            None => frontier.extend(inputs_of(&n)),
        }
    }
    // Execution order of the comparison, where known.
    found.sort_by_key(|(n, _)| ev.pairs.iter().position(|p| p.step == step && p.name == *n));
    found
}

/// Where the first divergent value `p` points, citing only evidence that was compared:
/// the op's hint when its inputs matched; when an input was not compared, says so, names
/// the nearest compared values upstream and ranks what lies between them and `p`.
pub fn localize(ev: &Evidence, p: &PairReport) -> Option<String> {
    let hint = op_hint(&p.name)?;
    let inputs = inputs_of(&p.name);
    if inputs.is_empty() {
        return Some(hint);
    }
    let missing = uncompared_inputs(ev, p);
    if missing.is_empty() {
        let short: Vec<&str> = inputs.iter().map(|i| short_name(i)).collect();
        let all_matched = inputs.iter().all(|i| compared(ev, i, p.step) == Some(Status::Match));
        let how = if all_matched { "matched" } else { "was compared and also diverges" };
        return Some(format!("{hint} (its input {} {how})", short.join(", ")));
    }
    let upstream = nearest_compared_upstream(ev, &p.name, p.step);
    let seen = if upstream.is_empty() {
        "no value upstream of it in its layer was compared".to_string()
    } else {
        let part = |want: bool| {
            upstream
                .iter()
                .filter(|(_, s)| (*s == Status::Match) == want)
                .map(|(n, _)| short_name(n))
                .collect::<Vec<_>>()
        };
        let (ok, bad) = (part(true), part(false));
        let mut s = Vec::new();
        if !ok.is_empty() {
            s.push(format!("upstream, {} matched", ok.join(", ")));
        }
        if !bad.is_empty() {
            s.push(format!("{} diverged", bad.join(", ")));
        }
        s.join("; ")
    };
    let missing_short: Vec<&str> = missing.iter().map(|m| short_name(m)).collect();
    let attention_core_unseen = missing.iter().any(|m| m.ends_with(".self_attn.attn_output"));
    let candidates = if attention_core_unseen {
        "ranked: (1) the attention core (RoPE pairing or theta, softmax scale, GQA head mapping, causal mask, KV cache), which has more ways to go wrong and was not observed; (2) the o_proj weight".to_string()
    } else {
        format!("{hint}, or an op between the last matched value and it")
    };
    Some(format!("{candidates}: its input {} was not compared (not in both dumps), {seen}", missing_short.join(", ")))
}

/// `self_attn.attn_output` for `model.layers.3.self_attn.attn_output`.
fn short_name(name: &str) -> &str {
    match name.strip_prefix("model.layers.") {
        Some(rest) => rest.split_once('.').map_or(name, |(_, r)| r),
        None => name,
    }
}

/// The localization hint for a value name (what its kind of op usually gets wrong; no
/// evidence: see [`localize`]).
pub fn op_hint(name: &str) -> Option<String> {
    if is_layer_output(name) {
        return Some(format!(
            "layer {}'s output: tap its sub-ops to find the first one out of tolerance",
            layer_index(name).unwrap_or(0)
        ));
    }
    if is_embedding(name) {
        return Some("the embedding lookup: weights, vocabulary, token ids".into());
    }
    OP_HINTS.iter().find(|(suffix, _)| name.ends_with(suffix)).map(|(_, h)| h.to_string())
}
