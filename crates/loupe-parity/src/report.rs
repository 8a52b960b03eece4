//! Rendering a [`Report`]: the terminal table and verdict block, and the JSON document.
//!
//! JSON schema (`format` = `loupe-compare`, `version` = 1; fields are only ever added):
//! ```text
//! {
//!   "format": "loupe-compare", "version": 1,
//!   "a": {"path", "kind", "tensors", "producer"}, "b": {...},      // a = reference
//!   "verdict": "match" | "divergence",
//!   "first_divergence": name | "prompt_tokens" | null, "first_divergence_step": int | null,
//!   "likely_cause": string | null,
//!   "signature": {"id", "signature", "first_check"} | null,
//!   "false_cliffs": [{"kind": "layer_offset"|"decode_mask"|"double_hook", "message", "names": [..]}],
//!   "token0": {"tensor", "step", "token0_cosine", "worst_later_token", "worst_later_cosine", "conclusion"} | null,
//!   "next_step": string | null,
//!   "pairs": [{
//!     "name", "step", "name_a", "name_b", "shape_a", "shape_b", "shape",
//!     "status": "match" | "diverged" | "shape_mismatch" | "skipped",
//!     "reasons": ["cosine"|"nmse"|"norm_ratio"|"non_finite"|"mismatches"|"argmax"|"last_token"],
//!     "note"?: string,
//!     // metrics (absent for shape_mismatch / skipped):
//!     "numel", "cosine", "max_abs_diff", "max_abs_index": [..], "max_abs_a", "max_abs_b",
//!     "max_rel_diff", "max_rel_index": [..], "mean_abs_diff", "nmse", "rel_norm_error",
//!     "norm_ratio", "sqnr_db", "mismatches", "nan_a", "inf_a", "nan_b", "inf_b",
//!     "nonfinite_mismatches", "absmax_a", "absmax_b",
//!     "tokens"?: {"rows", "token0_cosine", "worst_later_token", "worst_later_cosine", "last_token_cosine"},
//!     "token_cosines"?: [..] (--per-token), "dim_cosines"?: [..] (--per-dim),
//!     "logits"?: {"rows", "vocab", "argmax_agreement", "top_k", "top_k_overlap", "kl_mean",
//!                 "kl_max", "kl_max_row", "argmax_mismatches": [{"row", "reference_top",
//!                 "target_top", "reference_gap"}], "argmax_mismatch_count"},
//!     "floor"?: {"nmse", "cosine", "norm_ratio", "last_token_cosine", "argmax_mismatches",
//!                "error_over_floor"}            // calibrated comparisons (--calibrate)
//!   }],
//!   "unpaired_a": [{"name", "step", "raw"?, "reason"?}], "unpaired_b": [...],
//!   "thresholds": {"cos", "nmse", "norm_ratio_tol", "rtol", "atol", "mismatches_fail", "top_k"},
//!   "calibration"?: {"high", "low", "factor", "floors"},
//!   "layer_shifts": [{"layer", "step", "own_cosine", "vs_next", "vs_prev"}],
//!   "naming_rules"?: [["rule", tensors], ...]   // MAX's PrintHook names recognized (max_names)
//! }
//! ```
//! Non-finite numbers (an infinite SQNR for identical tensors, an infinite NMSE against an
//! all-zero reference) are written as `null`.

use std::fmt::Write;

use crate::compare::Report;
use crate::result::{PairReport, Reason, Status};

/// The report as pretty JSON.
pub fn to_json(r: &Report) -> String {
    serde_json::to_string_pretty(r).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
}

fn num(x: f64) -> String {
    if x == 0.0 {
        "0".into()
    } else if !x.is_finite() {
        if x.is_nan() {
            "nan".into()
        } else if x > 0.0 {
            "inf".into()
        } else {
            "-inf".into()
        }
    } else if (1e-3..1e4).contains(&x.abs()) {
        format!("{x:.4}")
    } else {
        format!("{x:.3e}")
    }
}

/// An error-over-floor ratio: one decimal below 100.
fn ratio(x: f64) -> String {
    if x.is_finite() && x < 100.0 {
        format!("{x:.1}")
    } else {
        num(x)
    }
}

fn index(i: &[usize]) -> String {
    format!("({})", i.iter().map(|v| v.to_string()).collect::<Vec<_>>().join(", "))
}

fn reason_word(r: Reason) -> &'static str {
    match r {
        Reason::Cosine => "cosine",
        Reason::Nmse => "nmse",
        Reason::NormRatio => "norm",
        Reason::NonFinite => "nan/inf",
        Reason::Mismatches => "isclose",
        Reason::Argmax => "argmax",
        Reason::LastToken => "last token",
    }
}

fn status(p: &PairReport) -> String {
    match p.status {
        Status::Diverged => {
            format!("DIVERGED ({})", p.reasons.iter().map(|r| reason_word(*r)).collect::<Vec<_>>().join(", "))
        }
        s => s.label().to_string(),
    }
}

/// Options of the terminal rendering.
#[derive(Debug, Clone, Copy, Default)]
pub struct RenderOptions {
    pub per_token: bool,
    pub per_dim: bool,
}

/// The table and the verdict block.
pub fn render(r: &Report, o: RenderOptions) -> String {
    let mut out = String::new();
    let src = |s: &crate::compare::SourceInfo| {
        let p = s.producer.as_deref().map(|p| format!(", {p}")).unwrap_or_default();
        format!("{} ({}{p}, {} tensors)", s.path, s.kind, s.tensors)
    };
    let _ = writeln!(out, "reference (A): {}\ntarget    (B): {}\n", src(&r.a), src(&r.b));
    let steps = r.pairs.iter().map(|p| p.step).collect::<std::collections::BTreeSet<_>>();
    let label = |p: &PairReport| if steps.len() > 1 { format!("[{}] {}", p.step, p.name) } else { p.name.clone() };
    let w = r.pairs.iter().map(|p| label(p).len()).max().unwrap_or(4).clamp(4, 60);
    let rows: Vec<[String; 6]> = r
        .pairs
        .iter()
        .map(|p| {
            let shape =
                if p.shape.is_empty() { format!("{:?}|{:?}", p.shape_a, p.shape_b) } else { format!("{:?}", p.shape) };
            match &p.metrics {
                Some(m) => [
                    shape,
                    format!("{:.6}", m.cosine),
                    format!(
                        "{} @ {} ({} | {})",
                        num(m.max_abs_diff),
                        index(&m.max_abs_index),
                        num(m.max_abs_a),
                        num(m.max_abs_b)
                    ),
                    match &p.floor {
                        Some(f) => format!("{} [{}x]", num(m.nmse), ratio(f.error_over_floor)),
                        None if r.calibration.is_some() => format!("{} [no floor]", num(m.nmse)),
                        None => num(m.nmse),
                    },
                    format!("{}/{}", m.mismatches, m.numel),
                    status(p),
                ],
                None => [shape, "-".into(), "-".into(), "-".into(), "-".into(), status(p)],
            }
        })
        .collect();
    let widths: Vec<usize> = (0..5).map(|c| rows.iter().map(|r| r[c].len()).max().unwrap_or(0)).collect();
    let nmse_head = if r.calibration.is_some() { "nmse [error / floor]" } else { "nmse" };
    let head = ["shape", "cosine", "max |a-b| @ (t, d) (a | b)", nmse_head, "mismatch"];
    let widths: Vec<usize> = widths.iter().zip(head).map(|(w, h)| (*w).max(h.len())).collect();
    let _ = writeln!(
        out,
        "{:<w$}  {:<w1$}  {:>w2$}  {:<w3$}  {:>w4$}  {:>w5$}  status",
        "name",
        head[0],
        head[1],
        head[2],
        head[3],
        head[4],
        w1 = widths[0],
        w2 = widths[1],
        w3 = widths[2],
        w4 = widths[3],
        w5 = widths[4]
    );
    for (p, row) in r.pairs.iter().zip(&rows) {
        let _ = writeln!(
            out,
            "{:<w$}  {:<w1$}  {:>w2$}  {:<w3$}  {:>w4$}  {:>w5$}  {}",
            label(p),
            row[0],
            row[1],
            row[2],
            row[3],
            row[4],
            row[5],
            w1 = widths[0],
            w2 = widths[1],
            w3 = widths[2],
            w4 = widths[3],
            w5 = widths[4]
        );
        if let Some(note) = &p.note {
            let _ = writeln!(out, "    note: {note}");
        }
        if let Some(l) = &p.logits {
            let _ = writeln!(
                out,
                "    logits: argmax agreement {:.1}% ({} of {} rows differ), top-{} overlap {:.3}, KL mean {} max {} (row {})",
                100.0 * l.argmax_agreement, l.argmax_mismatch_count, l.rows, l.top_k, l.top_k_overlap, num(l.kl_mean), num(l.kl_max), l.kl_max_row
            );
        }
        let show = p.status.is_failure() || r.pairs.len() <= 8;
        if let (true, true, Some(c)) = (o.per_token, show, &p.token_cosines) {
            let list: Vec<String> = c.iter().enumerate().map(|(t, v)| format!("t{t} {v:.4}")).collect();
            let _ = writeln!(out, "    per-token cosine: {}", list.join("  "));
        }
        if let (true, true, Some(c)) = (o.per_dim, show, &p.dim_cosines) {
            let mut worst: Vec<(usize, f64)> = c.iter().copied().enumerate().collect();
            worst.sort_by(|a, b| a.1.total_cmp(&b.1));
            let list: Vec<String> = worst.iter().take(10).map(|(d, v)| format!("d{d} {v:.4}")).collect();
            let _ = writeln!(out, "    worst per-dim cosines: {}", list.join("  "));
        }
    }
    if r.pairs.is_empty() {
        let _ = writeln!(out, "No matching tensors found.");
    }
    let v = &r.verdict;
    let failing = r.pairs.iter().filter(|p| p.status.is_failure()).count();
    let _ = writeln!(out);
    let _ =
        writeln!(out, "verdict: {} ({failing} of {} pairs out of tolerance)", v.verdict.to_uppercase(), r.pairs.len());
    if let Some(f) = &v.first_divergence {
        let _ = writeln!(out, "first divergence: {f} (step {})", v.first_divergence_step.unwrap_or(0));
    }
    if let Some(c) = &v.likely_cause {
        let _ = writeln!(out, "likely cause: {c}");
    }
    if let Some(s) = &v.signature {
        let _ = writeln!(out, "signature: {} [{}]; first check: {}", s.signature, s.id, s.first_check);
    }
    if let Some(t) = &v.token0 {
        let later = match (t.worst_later_token, t.worst_later_cosine) {
            (Some(i), Some(c)) => format!(", worst later token {i}: {c:.4}"),
            _ => String::new(),
        };
        let _ = writeln!(
            out,
            "token-0 invariant ({}): token 0 cosine {:.4}{later}; {}",
            t.tensor, t.token0_cosine, t.conclusion
        );
    }
    for c in &v.false_cliffs {
        let _ = writeln!(out, "false cliff [{}]: {}", c.kind, c.message);
    }
    if let Some(n) = &v.next_step {
        let _ = writeln!(out, "next: {n}");
    }
    for (rule, n) in &r.naming_rules {
        let _ = writeln!(out, "MAX naming ({n} tensors): {rule}");
    }
    for (side, list) in [("A", &r.unpaired_a), ("B", &r.unpaired_b)] {
        if !list.is_empty() {
            let names: Vec<String> = list
                .iter()
                .take(12)
                .map(|u| {
                    let step = if steps.len() > 1 || u.step > 0 { format!("[{}] ", u.step) } else { String::new() };
                    let why = u.reason.as_deref().map(|r| format!(" ({r})")).unwrap_or_default();
                    format!("{step}{}{why}", u.raw.as_deref().unwrap_or(&u.name))
                })
                .collect();
            let more = if list.len() > 12 { format!(", ... {} more", list.len() - 12) } else { String::new() };
            let _ = writeln!(out, "unpaired in {side} ({}): {}{more}", list.len(), names.join(", "));
        }
    }
    if let Some(c) = &r.calibration {
        let bare = r.pairs.iter().filter(|p| p.metrics.is_some() && p.floor.is_none()).count();
        let rest = if bare > 0 {
            format!("; {bare} compared tensors have no floor and use the thresholds below")
        } else {
            String::new()
        };
        let _ = writeln!(
            out,
            "calibrated: a tensor diverges when its relative error sqrt(nmse) or its norm ratio is more than {}x its noise floor (cosine distance {}x); floors of {} tensors from {} vs {}{rest}",
            c.factor,
            c.factor * c.factor,
            c.floors,
            c.high,
            c.low
        );
    }
    let t = &r.thresholds;
    let _ = writeln!(
        out,
        "thresholds: cosine >= {}, nmse <= {}, |norm ratio - 1| <= {}, isclose rtol {} atol {}{}",
        t.cos,
        t.nmse,
        t.norm_ratio_tol,
        t.rtol,
        t.atol,
        if t.mismatches_fail { " (mismatches fail)" } else { " (mismatches informational)" }
    );
    out
}
