//! What one run of the graph reads and writes keys and values through.

use loupe_tensor::ops::PagedSpan;

use crate::{KvCache, PagedKvCache};

/// Where a run reads and writes keys and values.
pub(crate) enum StepKv<'k, 's> {
    /// One sequence, contiguous cache, `past` positions before the call.
    Single { kv: &'k mut KvCache, past: usize },
    /// Many sequences over a paged cache; `spans[i].rows` are span i's rows of the step,
    /// `logit_rows` the rows whose logits the step returns, `prompt_rows[r]` whether row `r`
    /// is a prompt token (see `BatchSpan::prompt_rows`), `argmax_only` whether the logits
    /// are read only for their argmax (see `BatchSpan::argmax_only`).
    Batch {
        kv: &'k mut PagedKvCache,
        spans: Vec<PagedSpan<'s>>,
        logit_rows: Vec<usize>,
        prompt_rows: Vec<bool>,
        argmax_only: bool,
    },
}

impl StepKv<'_, '_> {
    pub(crate) fn is_batch(&self) -> bool {
        matches!(self, StepKv::Batch { .. })
    }

    /// Whether a batched step has prompt rows (they take the prompt rows' arithmetic).
    pub(crate) fn has_prompt_rows(&self) -> bool {
        matches!(self, StepKv::Batch { prompt_rows, .. } if prompt_rows.contains(&true))
    }
}

/// Scratch buffers the kernels reuse between nodes and calls.
#[derive(Debug, Default)]
pub(crate) struct Scratch {
    /// 8-bit activation blocks (`matmul_q`).
    pub(crate) quant: Vec<u8>,
    /// The rows of the logits' input gathered for a batched step.
    pub(crate) gathered: Vec<f32>,
}
