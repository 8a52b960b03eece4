//! Rendering an [`Explanation`]: a table for the terminal and a JSON document.

use std::fmt::Write;

use serde_json::{json, Value};

use super::{Explanation, Metrics, Verdict};

fn num(x: f64) -> Value {
    if x.is_finite() {
        json!(x)
    } else {
        // JSON has no NaN/inf; say which it was.
        json!(x.to_string())
    }
}

fn metrics_json(m: &Metrics) -> Value {
    json!({"cos": num(m.cos), "nmse": num(m.nmse), "max_abs_diff": num(m.max_abs)})
}

pub fn to_json(e: &Explanation) -> Value {
    let verdict = match &e.verdict {
        Verdict::Hypothesis(id) => json!({"kind": "hypothesis", "id": id}),
        Verdict::Correct => json!({"kind": "correct"}),
        Verdict::Unexplained => json!({"kind": "unexplained"}),
    };
    json!({
        "tensor": e.tensor,
        "step": e.step,
        "op": e.op,
        "inputs": e.inputs.iter().map(|i| json!({"name": i.name, "target_vs_reference": i.metrics.as_ref().map(metrics_json)})).collect::<Vec<_>>(),
        "hypotheses": e.ranked.iter().enumerate().map(|(rank, h)| {
            let mut v = json!({"rank": rank + 1, "id": h.id, "label": h.label, "correct": h.is_correct(), "cause": h.cause});
            if let (Some(obj), Value::Object(m)) = (v.as_object_mut(), metrics_json(&h.metrics)) {
                obj.extend(m);
            }
            v
        }).collect::<Vec<_>>(),
        "verdict": verdict,
        "conclusion": e.conclusion,
    })
}

pub fn render(e: &Explanation) -> String {
    let mut s = String::new();
    let _ = writeln!(s, "explain `{}` (step {})", e.tensor, e.step);
    let _ = writeln!(s, "op: {}", e.op);
    for i in &e.inputs {
        match &i.metrics {
            Some(m) => {
                let _ = writeln!(s, "input `{}`: target vs reference cos {:.6}, NMSE {:.2e}", i.name, m.cos, m.nmse);
            }
            None => {
                let _ = writeln!(s, "input `{}`: not in the target dump", i.name);
            }
        }
    }
    let _ = writeln!(s, "hypotheses, each computed from the reference's inputs and compared with the target:");
    let width =
        e.ranked.iter().map(|h| h.label.len() + if h.is_correct() { 10 } else { 0 }).max().unwrap_or(10).max(10);
    let _ =
        writeln!(s, "  {:>4}  {:<width$}  {:>10}  {:>9}  {:>10}", "rank", "hypothesis", "cosine", "NMSE", "max|diff|");
    for (rank, h) in e.ranked.iter().enumerate() {
        let label = if h.is_correct() { format!("{} (correct)", h.label) } else { h.label.clone() };
        let m = &h.metrics;
        let _ =
            writeln!(s, "  {:>4}  {label:<width$}  {:>10.6}  {:>9.2e}  {:>10.3e}", rank + 1, m.cos, m.nmse, m.max_abs);
    }
    let _ = writeln!(s, "{}", e.conclusion);
    s
}
