//! Pairing tensors of two sources by name, reported in execution order (A's, or B's when
//! only B knows it). Each raw name yields one or more derived names
//! (mapping rules, built-in canonical forms); a pair needs the same (step, derived name)
//! on both sides. A derived name claimed by two raw names of one side pairs only if one
//! of them is that name exactly; otherwise both are reported as ambiguous. Nothing is
//! paired by position or substring (Polygraphy's fallback, which can silently pair the
//! wrong tensors), except two single-tensor files, which is what the user
//! asked for by naming them.

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;

use crate::mapping::{Mapping, MaxDerived, Side};
use crate::source::TensorSource;
use crate::tensor::Op;

/// One side of a pair: which entry, under which name, through which transforms.
#[derive(Debug, Clone, PartialEq)]
pub struct Candidate {
    pub entry: usize,
    pub raw: String,
    pub name: String,
    pub exact: bool,
    pub ops: Vec<Op>,
    pub step: u32,
    /// (entry order, part index) for execution order.
    pub order: (u64, usize),
    /// MAX's naming rules behind `name` (crate::max_names).
    pub max: MaxDerived,
}

/// A name one side has and the other does not (or that could not be paired safely).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Unpaired {
    pub name: String,
    pub step: u32,
    /// The raw name, when the name was derived.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub raw: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

#[derive(Debug, Clone, Default)]
pub struct Pairing {
    /// In execution order of side A.
    pub pairs: Vec<(Candidate, Candidate)>,
    pub unpaired_a: Vec<Unpaired>,
    pub unpaired_b: Vec<Unpaired>,
    /// MAX's built-in naming rules that applied, with how many tensors each touched.
    pub rules: Vec<(String, usize)>,
}

fn candidates(
    src: &TensorSource,
    side: Side,
    mapping: &Mapping,
    step: Option<u32>,
    rules: &mut BTreeMap<&'static str, usize>,
) -> Vec<Candidate> {
    let mut out = Vec::new();
    for (i, e) in src.entries.iter().enumerate() {
        if step.is_some_and(|s| s != e.step) {
            continue;
        }
        for (k, d) in mapping.derive(side, &e.name).into_iter().enumerate() {
            if k == 0 {
                for r in &d.max.rules {
                    *rules.entry(r).or_default() += 1;
                }
            }
            if d.max.ignored {
                continue;
            }
            out.push(Candidate {
                entry: i,
                raw: e.name.clone(),
                name: d.name,
                exact: d.exact,
                ops: d.ops,
                step: e.step,
                order: (e.order, k),
                max: d.max,
            });
        }
    }
    out
}

/// Gives each part of a fused MAX `qkv_proj` its slice, from the widths of `q_proj`,
/// `k_proj` and `v_proj` on the other side (for SmolLM2, 576 + 192 + 192 of 960); a part
/// whose widths are not all known, or do not add up to the fused width, is left unpaired.
fn split_fused_qkv(
    cands: Vec<Candidate>,
    src: &TensorSource,
    other: &[Candidate],
    other_src: &TensorSource,
    rejected: &mut Vec<Unpaired>,
) -> Vec<Candidate> {
    let width = |c: &Candidate| other_src.entries.get(c.entry)?.shape.as_ref()?.last().copied();
    let widths: HashMap<(u32, &str), Option<usize>> =
        other.iter().map(|c| ((c.step, c.name.as_str()), width(c))).collect();
    let mut out = Vec::with_capacity(cands.len());
    for mut c in cands {
        let Some((attn, part)) = c.max.qkv_part.clone() else {
            out.push(c);
            continue;
        };
        let w: Vec<Option<usize>> = ["q_proj", "k_proj", "v_proj"]
            .iter()
            .map(|p| widths.get(&(c.step, format!("{attn}.{p}").as_str())).copied().flatten())
            .collect();
        let fused = src.entries.get(c.entry).and_then(|e| e.shape.as_ref()?.last().copied());
        match (w[0], w[1], w[2]) {
            (Some(q), Some(k), Some(v)) if fused.is_none_or(|f| f == q + k + v) => {
                let start = [0, q, q + k][part];
                c.ops.push(Op::Slice { axis: -1, start, end: start + [q, k, v][part] });
                out.push(c);
            }
            (Some(q), Some(k), Some(v)) => rejected.push(unpaired(
                &c,
                Some(format!("the fused qkv_proj is {} wide, the other side's q, k, v {q} + {k} + {v}", fused.unwrap_or(0))),
            )),
            _ => rejected.push(unpaired(
                &c,
                Some("a part of MAX's fused qkv_proj: the other side has no q_proj, k_proj and v_proj (with shapes) to split it by".into()),
            )),
        }
    }
    out
}

fn unpaired(c: &Candidate, reason: Option<String>) -> Unpaired {
    Unpaired { name: c.name.clone(), step: c.step, raw: (c.raw != c.name).then(|| c.raw.clone()), reason }
}

/// Resolves collisions: (step, name) -> the one candidate that may pair.
fn index(cands: &[Candidate], rejected: &mut Vec<Unpaired>) -> HashMap<(u32, String), usize> {
    let mut groups: HashMap<(u32, String), Vec<usize>> = HashMap::new();
    for (i, c) in cands.iter().enumerate() {
        groups.entry((c.step, c.name.clone())).or_default().push(i);
    }
    let mut out = HashMap::new();
    let mut keys: Vec<_> = groups.into_iter().collect();
    keys.sort_by_key(|(_, v)| v.first().copied());
    for (key, members) in keys {
        if members.len() == 1 {
            out.insert(key, members[0]);
            continue;
        }
        let exact: Vec<usize> = members.iter().copied().filter(|&i| cands[i].exact).collect();
        let raws: Vec<&str> = members.iter().map(|&i| cands[i].raw.as_str()).collect();
        if exact.len() == 1 {
            out.insert(key.clone(), exact[0]);
            for &i in members.iter().filter(|&&i| i != exact[0]) {
                rejected.push(unpaired(&cands[i], Some(format!("'{}' is also present under its exact name", key.1))));
            }
        } else {
            for &i in &members {
                rejected
                    .push(unpaired(&cands[i], Some(format!("ambiguous: {} all map to '{}'", raws.join(", "), key.1))));
            }
        }
    }
    out
}

/// Pairs the entries of `a` (reference) and `b` (target).
pub fn pair(a: &TensorSource, b: &TensorSource, mapping: &Mapping, step: Option<u32>) -> Pairing {
    let mut rules = BTreeMap::new();
    let ca = candidates(a, Side::A, mapping, step, &mut rules);
    let cb = candidates(b, Side::B, mapping, step, &mut rules);
    if a.is_single_tensor_file() && b.is_single_tensor_file() && ca.len() == 1 && cb.len() == 1 {
        let (x, mut y) = (ca[0].clone(), cb[0].clone());
        y.name = x.name.clone();
        return Pairing { pairs: vec![(x, y)], ..Pairing::default() };
    }
    let mut p = Pairing { rules: rules.into_iter().map(|(r, n)| (r.to_string(), n)).collect(), ..Pairing::default() };
    let ca = split_fused_qkv(ca, a, &cb, b, &mut p.unpaired_a);
    let cb = split_fused_qkv(cb, b, &ca, a, &mut p.unpaired_b);
    let ia = index(&ca, &mut p.unpaired_a);
    let ib = index(&cb, &mut p.unpaired_b);
    let mut used_b = vec![false; cb.len()];
    let mut order: Vec<usize> = ia.values().copied().collect();
    order.sort_by_key(|&i| (ca[i].step, ca[i].order));
    for i in order {
        let c = &ca[i];
        match ib.get(&(c.step, c.name.clone())) {
            Some(&j) => {
                used_b[j] = true;
                p.pairs.push((c.clone(), cb[j].clone()));
            }
            None => p.unpaired_a.push(unpaired(c, None)),
        }
    }
    // Report in execution order: the target's when only the target knows it (a MAX flat
    // directory is sorted by name, a loupe dump by execution).
    if !a.ordered && b.ordered {
        p.pairs.sort_by_key(|(_, y)| (y.step, y.order));
    }
    let mut rest: Vec<usize> = ib.values().copied().filter(|&j| !used_b[j]).collect();
    rest.sort_by_key(|&j| (cb[j].step, cb[j].order));
    p.unpaired_b.extend(rest.into_iter().map(|j| unpaired(&cb[j], None)));
    p
}
