//! Tolerances calibrated from the reference's own noise (docs/parity-protocol.md,
//! "Tolerances"): the reference run at two precisions — f32 and bf16 for a target that
//! rounds (native, q8), f64 and f32 for an f32 target — disagrees by each tensor's natural
//! noise. That disagreement is the tensor's *noise floor*, and a target value diverges
//! only when its error is well outside its own floor.
//!
//! This replaces hand-set cosine thresholds (0.99 is far too loose for an f32 port and can
//! be too tight for a deep bf16 one) and catches scale-only bugs that cosine cannot see:
//! a value scaled by 1.03 has cosine 1, an NMSE of 9e-4 and a norm ratio 3% off, inside
//! every default threshold, yet hundreds of times its f32 floor.
//!
//! The rule, per tensor, with `F` the factor (default [`DEFAULT_FACTOR`]) and the floor's
//! relative error `e₀ = √NMSE(high, low)`, floored at [`MIN_REL_ERROR`]:
//! - relative error `√NMSE(a, b) > F·e₀` (reason `nmse`);
//! - `|‖b‖/‖a‖ − 1| > F·e₀` (reason `norm_ratio`: the magnitude is off);
//! - cosine distance `1 − cos > F²·max(1 − cos₀, e₀²/2)` (reason `cosine`: the direction is off;
//!   a distance is quadratic in the error, hence `F²`);
//! - the last token row likewise against the floor's last row (reason `last_token`);
//! - more rows whose argmax differs than the floor pair has (reason `argmax`);
//! - any non-finite mismatch (reason `non_finite`), as without calibration.
//!
//! Tensors the calibration dumps do not hold keep the hand-set thresholds; the report says
//! how many.

use std::collections::HashMap;
use std::path::Path;

use serde::Serialize;

use crate::error::ParityError;
use crate::logits;
use crate::mapping::Mapping;
use crate::metrics::{self, MetricOptions, Metrics};
use crate::names::is_logits_name;
use crate::pairing::pair;
use crate::progress::Progress;
use crate::result::{Floor, FloorReport, Reason, TokenSummary};
use crate::source::TensorSource;

/// How far outside its noise floor a tensor's error may be, in units of the floor's
/// relative error. Measured on SmolLM2-135M by `scripts/calibration-table`
/// (docs/parity-protocol.md, "Calibrated tolerances"): the worst tensor of a correct loupe
/// run sits at 1.2x (f32 against f64/f32 floors), 0.4x (native against f32/f16) and 4.4x (q8
/// against f32/bf16); the smallest planted fault the matching floor resolves, at 11x.
pub const DEFAULT_FACTOR: f64 = 8.0;

/// The smallest relative error a floor may claim: f32's unit roundoff, 2⁻²⁴. Values both
/// precisions compute exactly (embedding rows of f32 weights) have a floor of zero; a
/// target may still differ from them by a rounding.
pub const MIN_REL_ERROR: f64 = 5.960_464_477_539_063e-8;

impl Floor {
    fn of(m: &Metrics, tokens: Option<&TokenSummary>, argmax_mismatches: Option<usize>) -> Floor {
        Floor {
            nmse: m.nmse,
            cosine: m.cosine,
            norm_ratio: m.norm_ratio,
            last_token_cosine: tokens.filter(|t| t.rows >= 2).map(|t| t.last_token_cosine),
            argmax_mismatches,
        }
    }

    /// The floor's relative error `√NMSE`, at least [`MIN_REL_ERROR`] (a NaN floor, from a
    /// reference that overflowed at low precision, counts as no floor at all: infinite).
    pub fn rel_error(&self) -> f64 {
        if self.nmse.is_nan() {
            return f64::INFINITY;
        }
        self.nmse.sqrt().max(MIN_REL_ERROR)
    }
}

/// Summary of the calibration in the report.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CalibrationInfo {
    /// The two reference runs the floors came from.
    pub high: String,
    pub low: String,
    pub factor: f64,
    /// Tensors with a floor.
    pub floors: usize,
}

/// Noise floors by (step, name), from two runs of the reference.
#[derive(Debug, Clone, Default)]
pub struct Calibration {
    pub info: Option<CalibrationInfo>,
    floors: HashMap<(u32, String), Floor>,
}

impl Calibration {
    /// Measures every tensor the two runs share. `factor` must be a finite number ≥ 1.
    pub fn from_paths(
        high: &Path,
        low: &Path,
        factor: f64,
        progress: &mut dyn Progress,
    ) -> Result<Calibration, ParityError> {
        let (sh, sl) = (TensorSource::open(high)?, TensorSource::open(low)?);
        Calibration::from_sources(&sh, &sl, factor, progress)
    }

    /// As [`Calibration::from_paths`], from opened sources.
    pub fn from_sources(
        high: &TensorSource,
        low: &TensorSource,
        factor: f64,
        progress: &mut dyn Progress,
    ) -> Result<Calibration, ParityError> {
        check_factor(factor)?;
        if let (Some(a), Some(b)) = (high.prompt_tokens(), low.prompt_tokens()) {
            if a != b {
                return Err(ParityError::input(
                    &low.path,
                    format!(
                        "its prompt tokens differ from {}'s: a noise floor needs the same input at both precisions",
                        high.path.display()
                    ),
                ));
            }
        }
        // Both runs come from the same reference, so their names are the same: no mapping.
        let pairing = pair(high, low, &Mapping::default(), None);
        let bytes = pairing.pairs.iter().map(|(a, b)| high.entries[a.entry].bytes + low.entries[b.entry].bytes).sum();
        progress.start(pairing.pairs.len(), bytes);
        let opts = MetricOptions { rtol: 0.0, atol: 0.0, per_dim: false };
        let mut floors = HashMap::new();
        for (ca, cb) in &pairing.pairs {
            let mut ta = high.load(ca.entry)?;
            let mut tb = low.load(cb.entry)?;
            ta.squeeze_leading();
            tb.squeeze_leading();
            progress.tick(&ca.name, high.entries[ca.entry].bytes + low.entries[cb.entry].bytes);
            if ta.shape != tb.shape {
                continue;
            }
            let m = metrics::compute(&ta, &tb, &opts);
            let tokens = if ta.shape.len() >= 2 { crate::result::token_summary(&m.row_cosines) } else { None };
            let argmax = if is_logits_name(&ca.name) {
                logits::compute(&ta, &tb, 1).map(|l| l.argmax_mismatch_count)
            } else {
                None
            };
            floors.insert((ca.step, ca.name.clone()), Floor::of(&m, tokens.as_ref(), argmax));
        }
        progress.finish();
        if floors.is_empty() {
            return Err(ParityError::input(
                &low.path,
                format!(
                    "no tensor pairs with {}: the calibration runs must be two dumps of the same reference",
                    high.path.display()
                ),
            ));
        }
        Ok(Calibration {
            info: Some(CalibrationInfo {
                high: high.path.display().to_string(),
                low: low.path.display().to_string(),
                factor,
                floors: floors.len(),
            }),
            floors,
        })
    }

    pub fn factor(&self) -> Option<f64> {
        self.info.as_ref().map(|i| i.factor)
    }

    pub fn floor(&self, step: u32, name: &str) -> Option<&Floor> {
        self.floors.get(&(step, name.to_string()))
    }
}

/// A factor must be a finite number ≥ 1 (below 1, a correct target fails its own floor).
pub fn check_factor(factor: f64) -> Result<(), ParityError> {
    if factor.is_finite() && factor >= 1.0 {
        Ok(())
    } else {
        Err(ParityError::Usage(format!("calibration factor {factor}: must be a number >= 1")))
    }
}

/// The divergence rule against a noise floor (the module docs state it). The tests are
/// written `!(x <= limit)` on purpose: a NaN metric fails them.
#[allow(clippy::neg_cmp_op_on_partial_ord)]
pub fn judge(
    m: &Metrics,
    tokens: Option<&TokenSummary>,
    argmax_mismatches: Option<usize>,
    floor: &Floor,
    factor: f64,
) -> (Vec<Reason>, FloorReport) {
    let e0 = floor.rel_error();
    let rel = m.nmse.sqrt();
    let cos_floor = |c: f64| (1.0 - c).max(e0 * e0 / 2.0);
    let mut r = Vec::new();
    if m.nonfinite_mismatches > 0 {
        r.push(Reason::NonFinite);
    }
    if !(1.0 - m.cosine <= factor * factor * cos_floor(floor.cosine)) {
        r.push(Reason::Cosine);
    }
    if !(rel <= factor * e0) {
        r.push(Reason::Nmse);
    }
    if !((m.norm_ratio - 1.0).abs() <= factor * e0) {
        r.push(Reason::NormRatio);
    }
    if argmax_mismatches.is_some_and(|n| n > floor.argmax_mismatches.unwrap_or(0)) {
        r.push(Reason::Argmax);
    }
    if let (Some(t), Some(c0)) = (tokens, floor.last_token_cosine) {
        if t.rows >= 2
            && !r.contains(&Reason::Cosine)
            && !(1.0 - t.last_token_cosine <= factor * factor * cos_floor(c0))
        {
            r.push(Reason::LastToken);
        }
    }
    (r, FloorReport { floor: floor.clone(), error_over_floor: rel / e0 })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor::Tensor;
    use loupe_core::SplitMix64;

    /// Uniform in [-1, 1).
    fn uniform(rng: &mut SplitMix64) -> f32 {
        (rng.next_u64() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }

    fn noisy(base: &[f32], scale: f32, noise: f32, seed: u64) -> Tensor {
        let mut rng = SplitMix64::new(seed);
        let data = base.iter().map(|&x| scale * x + noise * uniform(&mut rng)).collect();
        Tensor::new(vec![8, base.len() / 8], data)
    }

    fn base() -> Vec<f32> {
        let mut rng = SplitMix64::new(7);
        (0..512).map(|_| uniform(&mut rng)).collect()
    }

    fn floor_of(a: &Tensor, b: &Tensor) -> Floor {
        let m = metrics::compute(a, b, &MetricOptions { rtol: 0.0, atol: 0.0, per_dim: false });
        let t = crate::result::token_summary(&m.row_cosines);
        Floor::of(&m, t.as_ref(), None)
    }

    fn verdict(a: &Tensor, b: &Tensor, floor: &Floor) -> (Vec<Reason>, FloorReport) {
        let m = metrics::compute(a, b, &MetricOptions { rtol: 0.0, atol: 0.0, per_dim: false });
        let t = crate::result::token_summary(&m.row_cosines);
        judge(&m, t.as_ref(), None, floor, DEFAULT_FACTOR)
    }

    #[test]
    fn noise_at_the_floor_passes_and_a_scale_the_thresholds_miss_fails() {
        let x = base();
        let high = Tensor::new(vec![8, 64], x.clone());
        let floor = floor_of(&high, &noisy(&x, 1.0, 1e-4, 1));
        // A target with noise of the floor's size (other draws) is clean.
        let (reasons, fr) = verdict(&high, &noisy(&x, 1.0, 1e-4, 2), &floor);
        assert!(reasons.is_empty(), "{reasons:?} at {:.2}x the floor", fr.error_over_floor);
        assert!(fr.error_over_floor > 0.5 && fr.error_over_floor < 2.0, "{}", fr.error_over_floor);
        // 3% too large: cosine 1, NMSE 9e-4, norm 3% off: the default thresholds pass it...
        let scaled = noisy(&x, 1.03, 1e-4, 3);
        let m = metrics::compute(&high, &scaled, &MetricOptions { rtol: 1e-3, atol: 1e-5, per_dim: false });
        let t = crate::result::token_summary(&m.row_cosines);
        assert!(crate::result::judge(&m, t.as_ref(), None, &crate::Thresholds::default()).is_empty());
        // ... the floor does not.
        let (reasons, fr) = verdict(&high, &scaled, &floor);
        assert!(reasons.contains(&Reason::Nmse) && reasons.contains(&Reason::NormRatio), "{reasons:?}");
        assert!(!reasons.contains(&Reason::Cosine), "a scale keeps the direction: {reasons:?}");
        assert!(fr.error_over_floor > 50.0, "{}", fr.error_over_floor);
    }

    #[test]
    fn a_direction_error_fails_on_cosine_and_a_bad_last_row_on_last_token() {
        let x = base();
        let high = Tensor::new(vec![8, 64], x.clone());
        let floor = floor_of(&high, &noisy(&x, 1.0, 1e-4, 1));
        let (reasons, _) = verdict(&high, &noisy(&x, 1.0, 1e-2, 4), &floor);
        assert!(reasons.contains(&Reason::Cosine), "{reasons:?}");
        // Only the last row wrong (its sign flipped): caught whichever test sees it first.
        let mut last = noisy(&x, 1.0, 1e-4, 5);
        for v in &mut last.data[7 * 64..] {
            *v = -*v;
        }
        let (reasons, _) = verdict(&high, &last, &floor);
        assert!(reasons.contains(&Reason::Cosine) || reasons.contains(&Reason::LastToken), "{reasons:?}");
    }

    #[test]
    fn an_exact_floor_still_allows_a_rounding_and_a_nan_floor_allows_anything_finite() {
        let x = base();
        let high = Tensor::new(vec![8, 64], x.clone());
        let floor = floor_of(&high, &high);
        assert_eq!(floor.nmse, 0.0);
        assert_eq!(floor.rel_error(), MIN_REL_ERROR);
        let rounded = Tensor::new(vec![8, 64], x.iter().map(|v| f32::from_bits(v.to_bits() ^ 1)).collect());
        assert!(verdict(&high, &rounded, &floor).0.is_empty());
        assert!(!verdict(&high, &noisy(&x, 1.0, 1e-5, 6), &floor).0.is_empty());
        let nan_floor = Floor {
            nmse: f64::NAN,
            cosine: f64::NAN,
            norm_ratio: f64::NAN,
            last_token_cosine: None,
            argmax_mismatches: None,
        };
        assert_eq!(nan_floor.rel_error(), f64::INFINITY);
    }

    #[test]
    fn a_target_nan_fails_whatever_the_floor() {
        let x = base();
        let high = Tensor::new(vec![8, 64], x.clone());
        let floor = floor_of(&high, &noisy(&x, 1.0, 1e-2, 1));
        let mut bad = high.clone();
        bad.data[3] = f32::NAN;
        let (reasons, _) = verdict(&high, &bad, &floor);
        assert!(reasons.contains(&Reason::NonFinite), "{reasons:?}");
    }

    #[test]
    fn factors_below_one_or_not_finite_are_refused() {
        for f in [0.5, f64::NAN, f64::INFINITY, -2.0] {
            let err = check_factor(f).unwrap_err();
            assert!(err.to_string().contains("must be a number >= 1"), "{err}");
        }
        assert!(check_factor(1.0).is_ok() && check_factor(DEFAULT_FACTOR).is_ok());
    }
}
