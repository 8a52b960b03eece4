//! The HTML report (`loupe compare --html FILE`, `loupe parity --html FILE`, and `loupe
//! bisect --html FILE`, whose ladder comes first): one
//! self-contained page, no network, the report embedded as JSON and drawn by inline
//! script (`report.html`): the verdict first (first divergence, likely cause, the evidence
//! it rests on, the token-0 invariant, false cliffs, the next step), then the error along
//! depth on log scales (1 − cosine, NMSE with the calibrated noise floor shaded, max
//! |a − b|) with the first divergence marked, a token × layer heat map of per-token
//! cosines, the first divergent tensor per dimension, and a sortable table of every pair.
//!
//! The page sets `data-rendered="ok"` on `<body>` once everything is drawn; the
//! headless-browser test reads that, and the console, to know it rendered without errors.

use crate::compare::Report;

const TEMPLATE: &str = include_str!("report.html");
const SLOT: &str = "__LOUPE_REPORT_JSON__";
const LADDER_SLOT: &str = "__LOUPE_LADDER_JSON__";

/// Per-dimension cosines are kept for the first divergent tensor only (the page shows no
/// other), and at most this many of them.
pub const MAX_DIMS: usize = 65_536;

/// The page for `r`. Compare with per-token cosines (and per-dimension cosines) on for the
/// heat map and the per-dimension view; without them those sections say so.
pub fn to_html(r: &Report) -> String {
    page(Some(r), None)
}

/// The page of `loupe bisect --html`: the ladder (its JSON report: rungs, tokens, verdict)
/// first, then the per-tensor comparison at the divergent step when one ran.
pub fn bisect_html(ladder: &serde_json::Value, report: Option<&Report>) -> String {
    page(report, Some(ladder))
}

/// JSON that is safe inside a `<script>` element: '<' only occurs inside JSON strings, where
/// \u003c is the same character, so the data can never close its element or open a comment.
fn embed(json: String) -> String {
    json.replace('<', "\\u003c")
}

fn page(r: Option<&Report>, ladder: Option<&serde_json::Value>) -> String {
    let report = r.map_or_else(|| "null".to_string(), report_json);
    let ladder = ladder.map_or_else(|| "null".to_string(), |l| embed(l.to_string()));
    TEMPLATE.replacen(SLOT, &report, 1).replacen(LADDER_SLOT, &ladder, 1)
}

fn report_json(r: &Report) -> String {
    let mut r = r.clone();
    let first = (r.verdict.first_divergence.clone(), r.verdict.first_divergence_step);
    for p in &mut r.pairs {
        let keep = first.0.as_deref() == Some(p.name.as_str()) && first.1 == Some(p.step);
        if !keep || p.dim_cosines.as_ref().is_some_and(|d| d.len() > MAX_DIMS) {
            p.dim_cosines = None;
        }
    }
    embed(serde_json::to_string(&r).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}")))
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_template_has_one_data_slot() {
        assert_eq!(super::TEMPLATE.matches(super::SLOT).count(), 1);
        assert_eq!(super::TEMPLATE.matches(super::LADDER_SLOT).count(), 1);
        // No network: nothing is loaded from elsewhere.
        for needle in ["<link", "src=\"http", "src='http", "@import", "fetch("] {
            assert!(!super::TEMPLATE.contains(needle), "the page must be self-contained: {needle}");
        }
    }
}
