//! loupe-explain (`loupe explain`): step 4 of docs/parity-protocol.md, "verify hypotheses
//! numerically before changing code".
//!
//! For the op that produces a suspect tensor, each hypothesis is a way of computing that op
//! (the correct one, and the usual porting bugs: interleaved RoPE, a transposed weight,
//! another epsilon, ...). Every hypothesis is evaluated on the REFERENCE dump's inputs of the
//! op (so upstream error cannot blur the picture, step 3) and compared with the TARGET's
//! tensor. The hypothesis that reproduces the target, far better than the correct op does,
//! names what the target computes wrongly.
//!
//! It sits above loupe-parity (dumps are read with its reader, [`loupe_parity::TensorSource`])
//! and loupe-models (which op makes a value and from which inputs comes from the builder's
//! own description, [`loupe_models::roles`]; weights and hyper-parameters from the model).
//!
//! [`bisect`] is step 5 of the same protocol, `loupe bisect`: which subsystem (graph, KV
//! cache, batched engine, server) first diverges, over loupe-runtime's engines and a served
//! rung spoken to through loupe-client.
//!
//! [`taps`] runs a model under taps into a dump (`loupe dump`, loupe's side of `loupe parity`
//! and of bisect's graph rung): it needs loupe-runtime's engine and loupe-parity's writer, and
//! this is the crate above both.

pub mod bisect;
pub mod dump;
mod error;
pub mod ops;
pub mod report;
pub mod taps;

use std::path::{Path, PathBuf};

use loupe_models::{DecoderConfig, HiddenAct, LoadOptions, Model, ModelConfig, Precision};

use dump::Dump;
pub use error::ExplainError;
pub use loupe_parity::Tensor;

/// Similarity of two tensors, in f64 (docs/parity-protocol.md, step 2).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Metrics {
    /// Cosine over the flattened tensors (denominator + 1e-20).
    pub cos: f64,
    /// `sum((x - target)^2) / sum(target^2)`: the target's energy is the denominator, the
    /// same for every hypothesis, so ranking by NMSE is ranking by squared error.
    pub nmse: f64,
    pub max_abs: f64,
}

pub fn metrics(x: &[f32], target: &[f32]) -> Metrics {
    let (mut dot, mut xx, mut tt, mut err, mut max_abs) = (0f64, 0f64, 0f64, 0f64, 0f64);
    for (&a, &b) in x.iter().zip(target) {
        let (a, b) = (a as f64, b as f64);
        dot += a * b;
        xx += a * a;
        tt += b * b;
        let d = a - b;
        err += d * d;
        // NaN anywhere makes max_abs NaN rather than being skipped by f64::max.
        max_abs = if d.abs().is_nan() { f64::NAN } else { max_abs.max(d.abs()) };
    }
    let cos = dot / ((xx.sqrt() * tt.sqrt()) + 1e-20);
    let nmse = if tt > 0.0 {
        err / tt
    } else if err == 0.0 {
        0.0
    } else {
        f64::INFINITY
    };
    Metrics { cos, nmse, max_abs }
}

/// One way of computing the op, evaluated.
#[derive(Debug, Clone)]
pub struct Hypothesis {
    /// Stable id: `correct`, or the fault class it reproduces (`rope-interleaved`, `bf16`...)
    /// or another known bug (`gelu-erf`, `no-scale`...).
    pub id: &'static str,
    /// What was computed, for the table ("RMSNorm eps = 1e-1").
    pub label: String,
    /// The likely cause if this hypothesis is the one that matches.
    pub cause: String,
    pub metrics: Metrics,
}

impl Hypothesis {
    pub fn is_correct(&self) -> bool {
        self.id == "correct"
    }
}

/// One input of the op: the reference's vs the target's copy.
#[derive(Debug, Clone)]
pub struct InputCheck {
    pub name: String,
    /// `None` when the target dump does not hold it.
    pub metrics: Option<Metrics>,
}

/// What explain concluded.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    /// This hypothesis (not the correct op) reproduces the target.
    Hypothesis(&'static str),
    /// The correct op reproduces the target: this op is not at fault.
    Correct,
    /// Nothing reproduces the target.
    Unexplained,
}

#[derive(Debug, Clone)]
pub struct Explanation {
    pub tensor: String,
    pub step: usize,
    /// The op the tensor comes from, in words.
    pub op: String,
    pub inputs: Vec<InputCheck>,
    /// Best first.
    pub ranked: Vec<Hypothesis>,
    pub verdict: Verdict,
    pub conclusion: String,
}

/// A hypothesis reproduces the target below this NMSE (cosine about 0.9995 and better)...
pub const MATCH_NMSE: f64 = 1e-3;
/// ...and beats the correct op when its NMSE is this many times smaller.
pub const MARGIN: f64 = 100.0;
/// An input whose reference and target copies are further apart than this is said to carry
/// upstream error.
pub const INPUT_NMSE: f64 = 1e-4;

/// The decoder config of `model`, or an error naming it as an encoder: the hypotheses that
/// read heads, RoPE or RMSNorm epsilon are decoder ops.
pub fn decoder_config(model: &Model) -> Result<&DecoderConfig, ExplainError> {
    model.config.decoder().ok_or_else(|| ExplainError::Encoder { path: model.path.clone() })
}

/// Everything the hypotheses can draw on.
pub struct Context<'a> {
    pub reference: &'a Dump,
    pub step: usize,
    model_path: PathBuf,
    model: Option<Model>,
    loaded_layers: usize,
}

impl<'a> Context<'a> {
    pub fn new(reference: &'a Dump, step: usize, model_path: PathBuf) -> Context<'a> {
        Context { reference, step, model_path, model: None, loaded_layers: 0 }
    }

    /// The model with at least `layers` decoder layers, loaded in f32 on first use (only
    /// hypotheses that need weights or hyper-parameters ask).
    pub fn model(&mut self, layers: usize) -> Result<&Model, ExplainError> {
        let layers = layers.max(1);
        if self.model.is_none() || self.loaded_layers < layers {
            let opts = LoadOptions { precision: Precision::F32, layers: Some(layers), ..LoadOptions::default() };
            self.model = Some(loupe_models::load(&self.model_path, opts)?);
            self.loaded_layers = layers;
        }
        // Just set above when absent.
        self.model
            .as_ref()
            .ok_or_else(|| ExplainError::Manifest { path: self.model_path.clone(), reason: "model not loaded".into() })
    }

    /// The decoder's config (the hypotheses rebuild decoder ops; an encoder has none).
    pub fn config(&mut self) -> Result<DecoderConfig, ExplainError> {
        Ok(decoder_config(self.model(1)?)?.clone())
    }

    /// The activation the model's config names (decoder or encoder).
    pub fn hidden_act(&mut self) -> Result<HiddenAct, ExplainError> {
        Ok(match &self.model(1)?.config {
            ModelConfig::Decoder(c) => c.hidden_act,
            ModelConfig::Encoder(c) => c.hidden_act,
        })
    }

    /// The reference's `name` at the explained step.
    pub fn reference(&self, name: &str) -> Result<Tensor, ExplainError> {
        self.reference.tensor(name, self.step)
    }

    /// Position of the first row of the explained step: 0 for the prompt, then one per
    /// decode step after it.
    pub fn first_position(&self) -> Result<usize, ExplainError> {
        if self.step == 0 {
            return Ok(0);
        }
        let n = self.reference.prompt_len.ok_or_else(|| ExplainError::Manifest {
            path: self.reference.dir.join("manifest.json"),
            reason: "no prompt_tokens: cannot place a decode step".into(),
        })?;
        Ok(n + self.step - 1)
    }
}

/// Explains `name` at `step`: reference dump `a`, target dump `b`.
pub fn explain(a: &Path, b: &Path, name: &str, step: usize, model_path: PathBuf) -> Result<Explanation, ExplainError> {
    let reference = Dump::open(a)?;
    let target_dump = Dump::open(b)?;
    let target = target_dump.tensor(name, step)?;
    let mut ctx = Context::new(&reference, step, model_path);
    let mut plan = ops::plan(&mut ctx, name)?;
    if let Some(c) = plan.candidates.iter().find(|c| c.id == "correct" && c.data.len() == target.data.len()) {
        plan.candidates.extend(scaled(&c.data, &target.data));
    }

    let mut ranked = Vec::with_capacity(plan.candidates.len());
    for c in plan.candidates {
        if c.data.len() != target.data.len() {
            return Err(ExplainError::Shape {
                what: format!(
                    "'{name}': hypothesis '{}' gives {} elements, the target holds {} (shape {:?})",
                    c.label,
                    c.data.len(),
                    target.data.len(),
                    target.shape
                ),
            });
        }
        ranked.push(Hypothesis { id: c.id, label: c.label, cause: c.cause, metrics: metrics(&c.data, &target.data) });
    }
    // NaN sorts last; ties keep the listed order (the correct op first).
    ranked.sort_by(|x, y| {
        let key = |h: &Hypothesis| if h.metrics.nmse.is_nan() { f64::INFINITY } else { h.metrics.nmse };
        key(x).total_cmp(&key(y))
    });

    let mut inputs = Vec::new();
    for input in &plan.inputs {
        let r = ctx.reference(input)?;
        let m = match target_dump.tensor(input, step) {
            Ok(t) if t.data.len() == r.data.len() => Some(metrics(&t.data, &r.data)),
            _ => None,
        };
        inputs.push(InputCheck { name: input.clone(), metrics: m });
    }
    let (verdict, conclusion) = conclude(name, &ranked, &inputs);
    Ok(Explanation { tensor: name.to_string(), step, op: plan.op, inputs, ranked, verdict, conclusion })
}

/// The least-squares multiple of the correct op's output that best fits the target, as a
/// hypothesis of its own when the multiple explains the error: a value off by a constant
/// factor (a stray or missing multiplier) keeps its direction, so no op-level hypothesis
/// reproduces it, while this one does to rounding. A fitted factor that removes less than
/// [`SCALE_MIN_GAIN`] of the error is noise being fitted, not a multiplier, and is not
/// proposed (it would only blur the verdict between near-equal fits).
fn scaled(correct: &[f32], target: &[f32]) -> Option<ops::Candidate> {
    let (mut ct, mut cc) = (0f64, 0f64);
    for (&c, &t) in correct.iter().zip(target) {
        ct += c as f64 * t as f64;
        cc += c as f64 * c as f64;
    }
    let s = ct / cc;
    if !s.is_finite() {
        return None;
    }
    let data: Vec<f32> = correct.iter().map(|&c| (c as f64 * s) as f32).collect();
    let (before, after) = (metrics(correct, target).nmse, metrics(&data, target).nmse);
    (before > 0.0 && after * SCALE_MIN_GAIN <= before).then(|| ops::Candidate {
        id: "scale",
        label: format!("the correct op x {s:.5}"),
        cause: format!("the value is the correct one times {s:.5}: a stray or missing constant multiplier (embedding scale, residual or attention multiplier, logit scaling) or a norm weight off by a constant"),
        data,
    })
}

/// The fitted multiple must cut the error (NMSE) by this factor to be proposed: the same
/// margin a hypothesis needs to beat the correct op.
pub const SCALE_MIN_GAIN: f64 = MARGIN;

/// The verdict and its one-line summary.
fn conclude(name: &str, ranked: &[Hypothesis], inputs: &[InputCheck]) -> (Verdict, String) {
    let fmt = |m: &Metrics| format!("cos {:.5}, NMSE {:.1e}", m.cos, m.nmse);
    let correct = ranked.iter().find(|h| h.is_correct());
    let Some(best) = ranked.first() else {
        return (Verdict::Unexplained, format!("`{name}`: no hypothesis applies"));
    };
    let matches = best.metrics.nmse <= MATCH_NMSE;
    if best.is_correct() && matches {
        return (
            Verdict::Correct,
            format!(
                "`{name}`: the target matches the correct op ({}): this op is not at fault here",
                fmt(&best.metrics)
            ),
        );
    }
    if !best.is_correct() && matches {
        let far_better = match correct {
            Some(c) => c.metrics.nmse.is_nan() || best.metrics.nmse * MARGIN <= c.metrics.nmse,
            None => true,
        };
        if far_better {
            let than =
                correct.map(|c| format!(" far better than the correct op ({})", fmt(&c.metrics))).unwrap_or_default();
            return (
                Verdict::Hypothesis(best.id),
                format!(
                    "`{name}`: the target matches '{}' ({}){than} — likely cause: {}",
                    best.label,
                    fmt(&best.metrics),
                    best.cause
                ),
            );
        }
    }
    let upstream: Vec<String> = inputs
        .iter()
        .filter_map(|i| {
            i.metrics.filter(|m| m.nmse > INPUT_NMSE || m.nmse.is_nan()).map(|m| format!("`{}` {}", i.name, fmt(&m)))
        })
        .collect();
    let tail = if upstream.is_empty() {
        "the cause is none of these hypotheses".to_string()
    } else {
        format!("its inputs already differ ({}): explain the first divergent tensor upstream", upstream.join("; "))
    };
    (
        Verdict::Unexplained,
        format!(
            "`{name}`: no hypothesis clearly reproduces the target (best: '{}', {}); {tail}",
            best.label,
            fmt(&best.metrics)
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(id: &'static str, nmse: f64) -> Hypothesis {
        Hypothesis {
            id,
            label: id.into(),
            cause: format!("cause of {id}"),
            metrics: Metrics { cos: 1.0 - nmse, nmse, max_abs: 0.0 },
        }
    }

    #[test]
    fn metrics_of_identical_and_opposite() {
        let m = metrics(&[1.0, 2.0], &[1.0, 2.0]);
        assert!((m.cos - 1.0).abs() < 1e-12 && m.nmse == 0.0 && m.max_abs == 0.0);
        let m = metrics(&[-1.0, -2.0], &[1.0, 2.0]);
        assert!((m.cos + 1.0).abs() < 1e-12 && (m.nmse - 4.0).abs() < 1e-12);
        assert!(metrics(&[f32::NAN], &[1.0]).max_abs.is_nan());
    }

    #[test]
    fn a_fitted_scale_is_proposed_only_when_it_explains_the_error() {
        let correct: Vec<f32> = (0..256).map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0).collect();
        let scaled_target: Vec<f32> = correct.iter().map(|c| c * 1.03125).collect();
        let c = scaled(&correct, &scaled_target).expect("a 3% multiplier is proposed");
        assert_eq!(c.id, "scale");
        assert!(c.label.contains("1.03125"), "{}", c.label);
        assert!(metrics(&c.data, &scaled_target).nmse < 1e-12);
        // Noise without a multiplier: the fit barely helps, so nothing is proposed.
        let noisy: Vec<f32> =
            correct.iter().enumerate().map(|(i, c)| c + if i % 2 == 0 { 1e-3 } else { -1e-3 }).collect();
        assert!(scaled(&correct, &noisy).is_none());
        assert!(scaled(&correct, &correct).is_none(), "an exact target needs no multiplier");
    }

    #[test]
    fn verdicts() {
        let (v, line) = conclude("t", &[h("rope-interleaved", 1e-9), h("correct", 0.4)], &[]);
        assert_eq!(v, Verdict::Hypothesis("rope-interleaved"));
        assert!(line.contains("likely cause: cause of rope-interleaved"), "{line}");
        assert_eq!(conclude("t", &[h("correct", 1e-12), h("bf16", 1e-6)], &[]).0, Verdict::Correct);
        // matching but not far better than the correct op: no verdict for it
        assert_eq!(conclude("t", &[h("bf16", 1e-6), h("correct", 2e-6)], &[]).0, Verdict::Unexplained);
        let inputs = [InputCheck { name: "x".into(), metrics: Some(Metrics { cos: 0.5, nmse: 0.5, max_abs: 1.0 }) }];
        let (v, line) = conclude("t", &[h("correct", 0.3)], &inputs);
        assert_eq!(v, Verdict::Unexplained);
        assert!(line.contains("inputs already differ"), "{line}");
    }
}
