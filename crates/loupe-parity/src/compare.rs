//! The comparison driver: open both inputs, pair their tensors, measure each pair (one
//! pair in memory at a time), look for layer-offset false cliffs, and decide the verdict.

use crate::progress::Progress;
use std::collections::HashMap;
use std::path::Path;

use regex::Regex;
use serde::Serialize;

use crate::calibrate::{self, Calibration, CalibrationInfo};
use crate::error::ParityError;
use crate::evidence::{Evidence, LayerShift};
use crate::logits;
use crate::mapping::{Mapping, Side};
use crate::metrics::{self, MetricOptions};
use crate::names::{is_layer_output, is_logits_name, layer_index};
use crate::pairing::{pair, Candidate, Unpaired};
use crate::result::{judge, token_summary, PairKey, PairReport, Reason, Status, Thresholds};
use crate::source::TensorSource;
use crate::tensor::{Op, Tensor};
use crate::verdict::{decide, Verdict};

/// Diverged layer outputs checked for a layer offset (each costs two extra loads).
const MAX_SHIFT_CHECKS: usize = 4;

/// What to compare and how.
#[derive(Debug, Clone, Default)]
pub struct CompareOptions {
    pub mapping: Mapping,
    pub thresholds: Thresholds,
    /// Compare one token row only.
    pub token_index: Option<usize>,
    /// Keep per-token cosines in the report.
    pub per_token: bool,
    /// Compute per-dimension cosines.
    pub per_dim: bool,
    /// Reshape the target to the reference's shape when element counts agree.
    pub allow_reshape: bool,
    /// Compare only pairs whose name matches.
    pub only: Option<Regex>,
    /// Compare only this step.
    pub step: Option<u32>,
    /// Noise floors: a tensor that has one is judged against it instead of `thresholds`.
    pub calibration: Option<Calibration>,
}

/// One input, as the report describes it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SourceInfo {
    pub path: String,
    pub kind: &'static str,
    pub tensors: usize,
    pub producer: Option<String>,
}

/// The whole result (the JSON report; `report.rs` documents the schema).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    pub format: &'static str,
    pub version: u32,
    pub a: SourceInfo,
    pub b: SourceInfo,
    #[serde(flatten)]
    pub verdict: Verdict,
    pub pairs: Vec<PairReport>,
    pub unpaired_a: Vec<Unpaired>,
    pub unpaired_b: Vec<Unpaired>,
    pub thresholds: Thresholds,
    /// Where the noise floors came from (calibrated comparisons only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub calibration: Option<CalibrationInfo>,
    pub layer_shifts: Vec<LayerShift>,
    /// MAX's built-in naming rules that applied (crate::max_names) and how many tensors each
    /// touched; empty when none did.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub naming_rules: Vec<(String, usize)>,
}

impl Report {
    /// 0 within tolerance, 1 divergence (including "nothing paired").
    pub fn exit_code(&self) -> u8 {
        u8::from(self.verdict.verdict != "match")
    }
}

fn info(s: &TensorSource) -> SourceInfo {
    SourceInfo {
        path: s.path.display().to_string(),
        kind: s.kind.name(),
        tensors: s.entries.len(),
        producer: s.manifest.as_ref().and_then(|m| m.producer.as_ref()).map(|p| match &p.version {
            Some(v) => format!("{} {v}", p.engine),
            None => p.engine.clone(),
        }),
    }
}

/// Opens `a` (reference) and `b` (target) and compares them.
pub fn compare(a: &Path, b: &Path, opts: &CompareOptions, progress: &mut dyn Progress) -> Result<Report, ParityError> {
    let sa = TensorSource::open(a)?;
    let sb = TensorSource::open(b)?;
    compare_sources(&sa, &sb, opts, progress)
}

/// Loads a candidate and applies its transforms; split parts must cover their axis.
fn load(src: &TensorSource, side: Side, c: &Candidate, mapping: &Mapping) -> Result<Tensor, ParityError> {
    let mut t = src.load(c.entry)?;
    for op in &c.ops {
        if let (Op::Slice { axis, .. }, Some((_, extent))) = (op, mapping.split_extent(side, &c.raw)) {
            let r = t.shape.len() as isize;
            let ax = if *axis < 0 { axis + r } else { *axis };
            let len = usize::try_from(ax).ok().and_then(|a| t.shape.get(a)).copied();
            if len != Some(extent) {
                return Err(ParityError::Transform {
                    name: c.raw.clone(),
                    reason: format!(
                        "split parts cover {extent} along axis {axis}, the tensor of shape {:?} has {len:?}",
                        t.shape
                    ),
                });
            }
        }
        t = t.apply(op, &c.raw)?;
    }
    Ok(t)
}

/// Attention probabilities `[head, query, key]` whose key axes differ because one side's
/// sliding-window cache keeps only the last keys (transformers' `DynamicSlidingWindowLayer`
/// during decode) while the other holds the whole context with zeros outside the window: the
/// longer side is cropped to the trailing keys when every key it drops has exactly zero
/// probability (`Ok(note)`); otherwise the shorter side dropped keys the longer one attends
/// to (`Err(note)`). `None`: not such a pair.
fn align_window_keys(name: &str, ta: &mut Tensor, tb: &mut Tensor) -> Option<Result<String, String>> {
    if !name.ends_with(".attn_probs")
        || ta.shape.len() != 3
        || tb.shape.len() != 3
        || ta.shape[..2] != tb.shape[..2]
        || ta.shape[2] == tb.shape[2]
    {
        return None;
    }
    let a_longer = ta.shape[2] > tb.shape[2];
    let (long, short, long_side, short_side) =
        if a_longer { (ta, tb, "reference", "target") } else { (tb, ta, "target", "reference") };
    let (lk, sk) = (long.shape[2], short.shape[2]);
    let dropped = lk - sk;
    let mass: f32 =
        long.data.chunks_exact(lk).map(|row| row[..dropped].iter().map(|v| v.abs()).sum::<f32>()).fold(0.0, f32::max);
    if mass != 0.0 {
        return Some(Err(format!(
            "key axes differ: the {short_side} holds {sk} keys, the {long_side} {lk}, and the {long_side} puts up to {mass:.3e} probability on the {dropped} leading keys the {short_side} does not have (a sliding window applied on one side only?)"
        )));
    }
    let cropped: Vec<f32> = long.data.chunks_exact(lk).flat_map(|row| row[dropped..].iter().copied()).collect();
    *long = Tensor::new(vec![long.shape[0], long.shape[1], sk], cropped);
    Some(Ok(format!("the {short_side}'s cache keeps the last {sk} of {lk} keys (a sliding window); the {long_side}'s {dropped} leading keys all have probability 0 and were dropped")))
}

/// Measures one pair.
pub fn evaluate(
    key: PairKey,
    mut ta: Tensor,
    mut tb: Tensor,
    opts: &CompareOptions,
    vocab: Option<usize>,
) -> PairReport {
    let (shape_a, shape_b) = (ta.shape.clone(), tb.shape.clone());
    let bare = |status, note: String| PairReport::bare(key, shape_a.clone(), shape_b.clone(), status, note);
    ta.squeeze_leading();
    tb.squeeze_leading();
    let mut note = None;
    if let Some(aligned) = align_window_keys(key.name, &mut ta, &mut tb) {
        match aligned {
            Ok(n) => note = Some(n),
            Err(n) => return bare(Status::ShapeMismatch, n),
        }
    }
    if ta.shape != tb.shape {
        if opts.allow_reshape && ta.data.len() == tb.data.len() {
            note = Some(format!("target reshaped from {:?} to {:?} (--allow-reshape)", tb.shape, ta.shape));
            tb.shape = ta.shape.clone();
        } else {
            let hint = if ta.data.len() == tb.data.len() {
                "; element counts agree: --allow-reshape or a --map transform"
            } else {
                ""
            };
            return bare(Status::ShapeMismatch, format!("shapes differ: {:?} vs {:?}{hint}", ta.shape, tb.shape));
        }
    }
    if let Some(i) = opts.token_index {
        if ta.shape.len() < 2 {
            return bare(Status::Skipped, "--token-index: no token axis".into());
        }
        let rows = ta.rows();
        if i >= rows {
            return bare(Status::Skipped, format!("--token-index {i} out of range ({rows} rows)"));
        }
        let cols = ta.cols();
        let row_shape = ta.shape[1..].to_vec();
        ta = Tensor::new(row_shape.clone(), ta.data[i * cols..(i + 1) * cols].to_vec());
        tb = Tensor::new(row_shape, tb.data[i * cols..(i + 1) * cols].to_vec());
    }
    let t = &opts.thresholds;
    let mo = MetricOptions { rtol: t.rtol, atol: t.atol, per_dim: opts.per_dim };
    let mut m = metrics::compute(&ta, &tb, &mo);
    let tokens = if ta.shape.len() >= 2 { token_summary(&m.row_cosines) } else { None };
    let is_logits = is_logits_name(key.name) || vocab.is_some_and(|v| ta.shape.last() == Some(&v));
    let lg = if is_logits { logits::compute(&ta, &tb, t.top_k) } else { None };
    let calibrated = opts.calibration.as_ref().and_then(|c| Some((c.floor(key.step, key.name)?, c.factor()?)));
    let (mut reasons, floor) = match calibrated {
        Some((f, factor)) => {
            let (r, report) =
                calibrate::judge(&m, tokens.as_ref(), lg.as_ref().map(|l| l.argmax_mismatch_count), f, factor);
            (r, Some(report))
        }
        None => (judge(&m, tokens.as_ref(), lg.as_ref(), t), None),
    };
    if floor.is_some() && t.mismatches_fail && m.mismatches > 0 && !reasons.contains(&Reason::Mismatches) {
        reasons.push(Reason::Mismatches);
    }
    let token_cosines = opts.per_token.then(|| std::mem::take(&mut m.row_cosines));
    let dim_cosines = m.dim_cosines.take();
    PairReport {
        name: key.name.into(),
        step: key.step,
        name_a: key.name_a.into(),
        name_b: key.name_b.into(),
        shape: ta.shape.clone(),
        shape_a,
        shape_b,
        status: if reasons.is_empty() { Status::Match } else { Status::Diverged },
        reasons,
        note,
        metrics: Some(m),
        tokens,
        token_cosines,
        dim_cosines,
        logits: lg,
        floor,
    }
}

/// Compares two opened sources.
pub fn compare_sources(
    sa: &TensorSource,
    sb: &TensorSource,
    opts: &CompareOptions,
    progress: &mut dyn Progress,
) -> Result<Report, ParityError> {
    let mut pairing = pair(sa, sb, &opts.mapping, opts.step);
    if let Some(re) = &opts.only {
        pairing.pairs.retain(|(a, _)| re.is_match(&a.name));
        pairing.unpaired_a.retain(|u| re.is_match(&u.name));
        pairing.unpaired_b.retain(|u| re.is_match(&u.name));
    }
    // Logits may be named anything; a last axis as long as lm_head's marks them too.
    let vocab = pairing
        .pairs
        .iter()
        .find(|(a, _)| a.name == "lm_head" || a.name == "logits")
        .and_then(|(a, _)| sa.entries.get(a.entry)?.shape.as_ref()?.last().copied());
    let bytes: u64 = pairing.pairs.iter().map(|(a, b)| sa.entries[a.entry].bytes + sb.entries[b.entry].bytes).sum();
    progress.start(pairing.pairs.len(), bytes);
    let mut reports = Vec::with_capacity(pairing.pairs.len());
    for (ca, cb) in &pairing.pairs {
        let mut ta = load(sa, Side::A, ca, &opts.mapping)?;
        let mut tb = load(sb, Side::B, cb, &opts.mapping)?;
        let last = if ca.max.last_token || cb.max.last_token { last_token_only(&mut ta, &mut tb) } else { None };
        let key = PairKey { name: &ca.name, step: ca.step, name_a: &ca.raw, name_b: &cb.raw };
        let mut r = evaluate(key, ta, tb, opts, vocab);
        if let Some(n) = last {
            r.note = Some(match r.note.take() {
                Some(other) => format!("{n}; {other}"),
                None => n,
            });
        }
        reports.push(r);
        progress.tick(&ca.name, sa.entries[ca.entry].bytes + sb.entries[cb.entry].bytes);
    }
    progress.finish();
    let layer_shifts = layer_shifts(sa, sb, &pairing.pairs, &reports, opts)?;
    let prompt_tokens = match (sa.manifest.as_ref(), sb.manifest.as_ref()) {
        (Some(x), Some(y)) => x.prompt_tokens.clone().zip(y.prompt_tokens.clone()),
        _ => None,
    };
    let ev = Evidence {
        pairs: &reports,
        thresholds: opts.thresholds.clone(),
        prompt_tokens,
        layer_shifts: layer_shifts.clone(),
        names_a: sa.entries.iter().map(|e| e.name.clone()).collect(),
        names_b: sb.entries.iter().map(|e| e.name.clone()).collect(),
    };
    let verdict = decide(&ev);
    Ok(Report {
        format: "loupe-compare",
        version: 1,
        a: info(sa),
        b: info(sb),
        verdict,
        pairs: reports,
        unpaired_a: pairing.unpaired_a,
        unpaired_b: pairing.unpaired_b,
        thresholds: opts.thresholds.clone(),
        calibration: opts.calibration.as_ref().and_then(|c| c.info.clone()),
        layer_shifts,
        naming_rules: pairing.rules,
    })
}

/// MAX's Llama runs `model.norm` and the head on the last token only: when one side of such
/// a pair holds one row and the other `T` rows of the same width, the longer side is cut to
/// its last row. The note says so.
fn last_token_only(ta: &mut Tensor, tb: &mut Tensor) -> Option<String> {
    ta.squeeze_leading();
    tb.squeeze_leading();
    let one_row = |t: &Tensor| t.shape.len() == 1;
    let (long, short, long_side, short_side) = match (one_row(ta), one_row(tb)) {
        (false, true) => (ta, &*tb, "reference", "target"),
        (true, false) => (tb, &*ta, "target", "reference"),
        _ => return None,
    };
    let (rows, cols) = (long.rows(), long.cols());
    if long.shape.len() != 2 || cols != short.data.len() || rows < 2 {
        return None;
    }
    let last = long.data[(rows - 1) * cols..].to_vec();
    *long = Tensor::new(short.shape.clone(), last);
    Some(format!(
        "the {short_side} holds the last token only (MAX): compared with the {long_side}'s last of {rows} rows"
    ))
}

/// For the first few diverged layer outputs: cosine of the target against the
/// reference's previous and next layer (false cliff 1, docs/parity-protocol.md).
fn layer_shifts(
    sa: &TensorSource,
    sb: &TensorSource,
    pairs: &[(Candidate, Candidate)],
    reports: &[PairReport],
    opts: &CompareOptions,
) -> Result<Vec<LayerShift>, ParityError> {
    let by_name: HashMap<(u32, &str), &Candidate> = pairs.iter().map(|(a, _)| ((a.step, a.name.as_str()), a)).collect();
    let mut out = Vec::new();
    for ((_, cb), r) in pairs.iter().zip(reports) {
        if out.len() >= MAX_SHIFT_CHECKS {
            break;
        }
        if r.status != Status::Diverged || !is_layer_output(&r.name) {
            continue;
        }
        let Some(l) = layer_index(&r.name) else { continue };
        let mut target = load(sb, Side::B, cb, &opts.mapping)?;
        target.squeeze_leading();
        let against = |other: &str| -> Result<Option<f64>, ParityError> {
            let Some(ca) = by_name.get(&(r.step, other)) else { return Ok(None) };
            let mut t = load(sa, Side::A, ca, &opts.mapping)?;
            t.squeeze_leading();
            if t.shape != target.shape {
                return Ok(None);
            }
            let mo = MetricOptions { rtol: 0.0, atol: 0.0, per_dim: false };
            Ok(Some(metrics::compute(&t, &target, &mo).cosine))
        };
        let vs_next = against(&format!("model.layers.{}", l + 1))?;
        let prev = if l == 0 { "model.embed_tokens".to_string() } else { format!("model.layers.{}", l - 1) };
        let vs_prev = against(&prev)?;
        out.push(LayerShift { layer: l, step: r.step, own_cosine: r.cosine().unwrap_or(0.0), vs_next, vs_prev });
    }
    Ok(out)
}

#[cfg(test)]
mod window_tests {
    use super::*;

    /// One head, one query: the reference's sliding-window cache kept the last 2 of 4 keys.
    #[test]
    fn trailing_window_keys_align_only_when_the_dropped_keys_have_no_mass() {
        let name = "model.layers.0.self_attn.attn_probs";
        let mut reference = Tensor::new(vec![1, 1, 2], vec![0.25, 0.75]);
        let mut target = Tensor::new(vec![1, 1, 4], vec![0.0, 0.0, 0.25, 0.75]);
        let note = align_window_keys(name, &mut reference, &mut target).expect("a window pair").expect("aligned");
        assert!(note.contains("last 2 of 4 keys"), "{note}");
        assert_eq!((target.shape.clone(), target.data.clone()), (vec![1, 1, 2], vec![0.25, 0.75]));
        // The target attends to a key the reference's window dropped: a real difference.
        let mut reference = Tensor::new(vec![1, 1, 2], vec![0.25, 0.75]);
        let mut target = Tensor::new(vec![1, 1, 4], vec![0.1, 0.0, 0.2, 0.7]);
        let e = align_window_keys(name, &mut reference, &mut target)
            .expect("a window pair")
            .expect_err("mass on dropped keys");
        assert!(e.contains("sliding window applied on one side only"), "{e}");
        // Other values and equal shapes are left alone.
        let mut a = Tensor::new(vec![1, 1, 2], vec![0.0; 2]);
        let mut b = Tensor::new(vec![1, 1, 4], vec![0.0; 4]);
        assert!(align_window_keys("model.layers.0.mlp", &mut a, &mut b).is_none());
    }
}
