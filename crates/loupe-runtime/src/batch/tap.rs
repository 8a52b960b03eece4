//! Observers of the batched engine's steps: the whole step ([`WholeStep`]) or one
//! sequence's rows shaped as a single-sequence run would show them ([`SequenceTap`]).

use loupe_graph::{Observer, ValueInfo};

use super::SeqId;

/// An observer of batched steps: told which rows belong to which sequence before each step.
pub trait StepObserver {
    /// `(sequence, its rows of the step, its row among the step's logits)` for every
    /// sequence the coming step runs.
    fn begin_step(&mut self, layout: &[(SeqId, std::ops::Range<usize>, Option<usize>)]);
    fn as_observer(&mut self) -> &mut dyn Observer;
}

/// Shows every value of a step whole (`[step tokens, ...]`) to an [`Observer`].
pub struct WholeStep<'o>(pub &'o mut dyn Observer);

impl StepObserver for WholeStep<'_> {
    fn begin_step(&mut self, _layout: &[(SeqId, std::ops::Range<usize>, Option<usize>)]) {}

    fn as_observer(&mut self) -> &mut dyn Observer {
        self.0
    }
}

/// Shows one sequence's rows of every value of a batched step to an [`Observer`], shaped
/// as a single-sequence run would show them (`[its tokens, ...]`; attention probabilities
/// `[heads, its tokens, longest context of the step]`; logits `[1, vocab]` when it has a row).
pub struct SequenceTap<'o> {
    seq: SeqId,
    inner: &'o mut dyn Observer,
    rows: Option<std::ops::Range<usize>>,
    logit_row: Option<usize>,
    step_tokens: usize,
    n_logits: usize,
    buf: Vec<f32>,
}

impl<'o> SequenceTap<'o> {
    pub fn new(seq: SeqId, inner: &'o mut dyn Observer) -> SequenceTap<'o> {
        SequenceTap { seq, inner, rows: None, logit_row: None, step_tokens: 0, n_logits: 0, buf: Vec::new() }
    }
}

impl StepObserver for SequenceTap<'_> {
    fn begin_step(&mut self, layout: &[(SeqId, std::ops::Range<usize>, Option<usize>)]) {
        self.rows = None;
        self.logit_row = None;
        self.step_tokens = layout.iter().map(|l| l.1.len()).sum();
        self.n_logits = layout.iter().filter(|l| l.2.is_some()).count();
        if let Some((_, rows, logit)) = layout.iter().find(|l| l.0 == self.seq) {
            self.rows = Some(rows.clone());
            self.logit_row = *logit;
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
            let Some(r) = self.logit_row else { return };
            let width = data.len() / shape[0];
            self.buf.extend_from_slice(&data[r * width..(r + 1) * width]);
            shape[0] = 1;
        } else {
            self.buf.extend_from_slice(data);
        }
        let buf = std::mem::take(&mut self.buf);
        self.inner.observe(value, &shape, &buf);
        self.buf = buf;
    }
}
