//! Observers of the batched engine's steps: the whole step ([`WholeStep`]) or one
//! sequence's rows shaped as a single-sequence run would show them ([`SequenceTap`]).

use loupe_graph::{Observer, ValueInfo};

use super::SeqId;

/// Where one sequence is in a batched step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StepLayout {
    pub seq: SeqId,
    /// Its rows of the step's values.
    pub rows: std::ops::Range<usize>,
    /// Its rows among the step's logits (empty: none; more than one: speculative
    /// verification).
    pub logit_rows: std::ops::Range<usize>,
}

/// An observer of batched steps: told which rows belong to which sequence before each step.
pub trait StepObserver {
    /// The layout of every sequence the coming step runs.
    fn begin_step(&mut self, layout: &[StepLayout]);
    fn as_observer(&mut self) -> &mut dyn Observer;
}

/// Shows every value of a step whole (`[step tokens, ...]`) to an [`Observer`].
pub struct WholeStep<'o>(pub &'o mut dyn Observer);

impl StepObserver for WholeStep<'_> {
    fn begin_step(&mut self, _layout: &[StepLayout]) {}

    fn as_observer(&mut self) -> &mut dyn Observer {
        self.0
    }
}

/// Shows one sequence's rows of every value of a batched step to an [`Observer`], shaped
/// as a single-sequence run would show them (`[its tokens, ...]`; attention probabilities
/// `[heads, its tokens, longest context of the step]`; logits `[rows, vocab]` when it has
/// rows: 1, or the verified rows of a speculative step).
pub struct SequenceTap<'o> {
    seq: SeqId,
    inner: &'o mut dyn Observer,
    rows: Option<std::ops::Range<usize>>,
    logit_rows: Option<std::ops::Range<usize>>,
    step_tokens: usize,
    n_logits: usize,
    buf: Vec<f32>,
}

impl<'o> SequenceTap<'o> {
    pub fn new(seq: SeqId, inner: &'o mut dyn Observer) -> SequenceTap<'o> {
        SequenceTap { seq, inner, rows: None, logit_rows: None, step_tokens: 0, n_logits: 0, buf: Vec::new() }
    }
}

impl StepObserver for SequenceTap<'_> {
    fn begin_step(&mut self, layout: &[StepLayout]) {
        self.rows = None;
        self.logit_rows = None;
        self.step_tokens = layout.iter().map(|l| l.rows.len()).sum();
        self.n_logits = layout.iter().map(|l| l.logit_rows.len()).sum();
        if let Some(l) = layout.iter().find(|l| l.seq == self.seq) {
            self.rows = Some(l.rows.clone());
            self.logit_rows = (!l.logit_rows.is_empty()).then(|| l.logit_rows.clone());
        }
    }

    fn as_observer(&mut self) -> &mut dyn Observer {
        self
    }
}

impl Observer for SequenceTap<'_> {
    fn wants(&mut self, value: &ValueInfo) -> bool {
        self.rows.is_some() && self.inner.wants(value)
    }

    fn observe(&mut self, value: &ValueInfo, shape: &[usize], data: &[f32]) {
        let Some(rows) = self.rows.clone() else { return };
        let mut shape = shape.to_vec();
        self.buf.clear();
        if shape.len() == 3 && shape[1] == self.step_tokens && shape[0] * shape[1] * shape[2] == data.len() {
            // [heads, tokens, context]
            let (heads, ctx) = (shape[0], shape[2]);
            for h in 0..heads {
                self.buf.extend_from_slice(
                    &data[(h * self.step_tokens + rows.start) * ctx..(h * self.step_tokens + rows.end) * ctx],
                );
            }
            shape[1] = rows.len();
        } else if shape.first() == Some(&self.step_tokens) && shape[0] > 0 {
            let width = data.len() / shape[0];
            self.buf.extend_from_slice(&data[rows.start * width..rows.end * width]);
            shape[0] = rows.len();
        } else if shape.first() == Some(&self.n_logits) && shape[0] > 0 {
            let Some(r) = self.logit_rows.clone() else { return };
            let width = data.len() / shape[0];
            self.buf.extend_from_slice(&data[r.start * width..r.end * width]);
            shape[0] = r.len();
        } else {
            self.buf.extend_from_slice(data);
        }
        let buf = std::mem::take(&mut self.buf);
        self.inner.observe(value, &shape, &buf);
        self.buf = buf;
    }
}
