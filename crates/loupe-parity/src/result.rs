//! The data a comparison produces: thresholds, per-pair results and their status. These
//! types serialize to the stable JSON report (`report.rs` documents the schema).

use serde::Serialize;

use crate::logits::LogitMetrics;
use crate::metrics::Metrics;

/// Pass/fail thresholds (docs/parity-protocol.md, "Thresholds").
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Thresholds {
    /// A tensor diverges below this cosine (docs/parity-protocol.md: 0.99 per layer; 0.999 for
    /// the dumper guard).
    pub cos: f64,
    /// ... or above this NMSE (llama.cpp's conversion scripts pass below 1e-2). For equal
    /// norms NMSE ≈ 2(1 − cos), so 1e-2 is met by cos ≈ 0.995.
    pub nmse: f64,
    /// ... or when ‖target‖/‖reference‖ is off by more than this fraction (5%): scale bugs
    /// such as a wrong norm epsilon or a missing multiplier keep cosine at 1.
    pub norm_ratio_tol: f64,
    /// isclose tolerances for the mismatch count.
    pub rtol: f64,
    pub atol: f64,
    /// When the user set rtol/atol: any mismatch fails the tensor (MAX compare_tensors).
    pub mismatches_fail: bool,
    /// k of the logits top-k overlap.
    pub top_k: usize,
}

impl Default for Thresholds {
    fn default() -> Thresholds {
        Thresholds {
            cos: 0.99,
            nmse: 1e-2,
            norm_ratio_tol: 0.05,
            rtol: 1e-3,
            atol: 1e-5,
            mismatches_fail: false,
            top_k: 5,
        }
    }
}

/// Outcome of one pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    Match,
    Diverged,
    ShapeMismatch,
    /// Not compared (e.g. `--token-index` on a tensor without a token axis).
    Skipped,
}

impl Status {
    pub fn is_failure(self) -> bool {
        matches!(self, Status::Diverged | Status::ShapeMismatch)
    }
    pub fn label(self) -> &'static str {
        match self {
            Status::Match => "ok",
            Status::Diverged => "DIVERGED",
            Status::ShapeMismatch => "SHAPE",
            Status::Skipped => "skipped",
        }
    }
}

/// Why a pair diverged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Reason {
    Cosine,
    Nmse,
    NormRatio,
    NonFinite,
    Mismatches,
    Argmax,
    LastToken,
}

/// The cosine of the first token row and the worst later one.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TokenSummary {
    pub rows: usize,
    pub token0_cosine: f64,
    /// The worst row after row 0 (`None` for a single row).
    pub worst_later_token: Option<usize>,
    pub worst_later_cosine: Option<f64>,
    pub last_token_cosine: f64,
}

/// One compared pair.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PairReport {
    /// The module path both sides paired on.
    pub name: String,
    pub step: u32,
    pub name_a: String,
    pub name_b: String,
    pub shape_a: Vec<usize>,
    pub shape_b: Vec<usize>,
    /// The shape compared (after squeezing batch dims, transforms, `--token-index`).
    pub shape: Vec<usize>,
    pub status: Status,
    pub reasons: Vec<Reason>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// Flattened into the pair's JSON object (absent for shape mismatches and skips).
    #[serde(flatten)]
    pub metrics: Option<Metrics>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tokens: Option<TokenSummary>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub token_cosines: Option<Vec<f64>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dim_cosines: Option<Vec<f64>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub logits: Option<LogitMetrics>,
    /// The pair's noise floor, when the comparison is calibrated and the calibration runs
    /// hold this tensor.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub floor: Option<FloorReport>,
}

/// Which pair: the name both sides paired on, the step, and each side's raw name.
#[derive(Debug, Clone, Copy)]
pub struct PairKey<'a> {
    pub name: &'a str,
    pub step: u32,
    pub name_a: &'a str,
    pub name_b: &'a str,
}

impl PairReport {
    /// A pair with no metrics (shape mismatch, skipped).
    pub fn bare(k: PairKey, shape_a: Vec<usize>, shape_b: Vec<usize>, status: Status, note: String) -> PairReport {
        PairReport {
            name: k.name.into(),
            step: k.step,
            name_a: k.name_a.into(),
            name_b: k.name_b.into(),
            shape: Vec::new(),
            shape_a,
            shape_b,
            status,
            reasons: Vec::new(),
            note: Some(note),
            metrics: None,
            tokens: None,
            token_cosines: None,
            dim_cosines: None,
            logits: None,
            floor: None,
        }
    }

    pub fn cosine(&self) -> Option<f64> {
        self.metrics.as_ref().map(|m| m.cosine)
    }
}

/// Applies the divergence rule to computed metrics (see [`Thresholds`]).
pub fn judge(m: &Metrics, tokens: Option<&TokenSummary>, logits: Option<&LogitMetrics>, t: &Thresholds) -> Vec<Reason> {
    let mut r = Vec::new();
    if m.nonfinite_mismatches > 0 {
        r.push(Reason::NonFinite);
    }
    // NaN metrics fail: each test is written so that NaN lands on the failing side.
    if m.cosine.is_nan() || m.cosine < t.cos {
        r.push(Reason::Cosine);
    }
    if m.nmse.is_nan() || m.nmse > t.nmse {
        r.push(Reason::Nmse);
    }
    let off = (m.norm_ratio - 1.0).abs();
    if off.is_nan() || off > t.norm_ratio_tol {
        r.push(Reason::NormRatio);
    }
    if t.mismatches_fail && m.mismatches > 0 {
        r.push(Reason::Mismatches);
    }
    if logits.is_some_and(|l| l.argmax_mismatch_count > 0) {
        r.push(Reason::Argmax);
    }
    // docs/parity-protocol.md, signature `last_token`: whole-sequence cosine ~1, last token bad.
    if let Some(tk) = tokens {
        if tk.rows >= 2 && tk.last_token_cosine < t.cos && !r.contains(&Reason::Cosine) {
            r.push(Reason::LastToken);
        }
    }
    r
}

/// Summarizes row cosines.
pub fn token_summary(rows: &[f64]) -> Option<TokenSummary> {
    let first = *rows.first()?;
    let worst = rows.iter().enumerate().skip(1).min_by(|x, y| x.1.total_cmp(y.1));
    Some(TokenSummary {
        rows: rows.len(),
        token0_cosine: first,
        worst_later_token: worst.map(|w| w.0),
        worst_later_cosine: worst.map(|w| *w.1),
        last_token_cosine: *rows.last().unwrap_or(&first),
    })
}

/// The reference's disagreement with itself on one tensor.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Floor {
    /// NMSE of the low-precision reference against the high-precision one.
    pub nmse: f64,
    pub cosine: f64,
    pub norm_ratio: f64,
    /// Cosine of the last token row (tensors with a token axis).
    pub last_token_cosine: Option<f64>,
    /// Rows whose argmax differs (logits only).
    pub argmax_mismatches: Option<usize>,
}

/// What the report says about one pair's floor.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct FloorReport {
    #[serde(flatten)]
    pub floor: Floor,
    /// The pair's relative error over the floor's (`√NMSE / e₀`); the pair diverges above
    /// the factor.
    pub error_over_floor: f64,
}
