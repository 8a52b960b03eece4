//! The HTML report (`loupe compare --html FILE`, `loupe parity --html FILE`): one
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

/// Per-dimension cosines are kept for the first divergent tensor only (the page shows no
/// other), and at most this many of them.
pub const MAX_DIMS: usize = 65_536;

/// The page for `r`. Compare with per-token cosines (and per-dimension cosines) on for the
/// heat map and the per-dimension view; without them those sections say so.
pub fn to_html(r: &Report) -> String {
    let mut r = r.clone();
    let first = (r.verdict.first_divergence.clone(), r.verdict.first_divergence_step);
    for p in &mut r.pairs {
        let keep = first.0.as_deref() == Some(p.name.as_str()) && first.1 == Some(p.step);
        if !keep || p.dim_cosines.as_ref().is_some_and(|d| d.len() > MAX_DIMS) {
            p.dim_cosines = None;
        }
    }
    let json = serde_json::to_string(&r).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"));
    // '<' only occurs inside JSON strings, where \u003c is the same character: the data can
    // never close its <script> element or open a comment.
    let json = json.replace('<', "\\u003c");
    TEMPLATE.replacen(SLOT, &json, 1)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_template_has_one_data_slot() {
        assert_eq!(super::TEMPLATE.matches(super::SLOT).count(), 1);
        // No network: nothing is loaded from elsewhere.
        for needle in ["<link", "src=\"http", "src='http", "@import", "fetch("] {
            assert!(!super::TEMPLATE.contains(needle), "the page must be self-contained: {needle}");
        }
    }
}
