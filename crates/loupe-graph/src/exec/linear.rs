//! The matmul kernels a node's [`Matmul`] names, run: linears and the routed experts.
//!
//! Each kernel has a single-sequence form and a batch-invariant one (a batched step's rows
//! each computed alone, so a sequence's bits do not depend on the batch beside it); the
//! selection says which arithmetic, the step says which form.

use loupe_tensor::linear::{
    can_screen, matmul_f32, matmul_f32_invariant, matmul_q, matmul_q_prompt, matmul_wq, matmul_wq_invariant,
    matmul_wq_prompt, q8_rows_invariant, screen_norms, screened_argmax_logits, QMatrix,
};
use loupe_tensor::ops::{add_in_place, expert_id, gelu, mul_in_place, silu};
use loupe_tensor::TensorError;

use super::step::Scratch;
use crate::ir::{ExpertWeights, Graph, Weight, WeightData, WeightId};
use crate::kernel::{Matmul, MatmulPrecision};

/// What a matmul computes on: the selected kernel's weights as it takes them.
enum Weights<'a> {
    F32(&'a [f32]),
    Q8(&'a QMatrix),
    Native(&'a QMatrix),
    /// Native decode rows, 8-bit prompt rows ([`MatmulPrecision::NativeQ8Prompt`]).
    NativeQ8Prompt(&'a QMatrix),
    /// 8-bit decode rows, native prompt rows ([`MatmulPrecision::Q8NativePrompt`]).
    Q8NativePrompt(&'a QMatrix),
}

/// The weights of `w` for kernel `m`; a kernel selected for another storage is an error
/// (the graph's weights changed after `select-kernels`).
fn weights<'a>(m: &Matmul, w: &'a Weight) -> Result<Weights<'a>, TensorError> {
    match (m.precision, &w.data) {
        (MatmulPrecision::F32 | MatmulPrecision::Fp8, WeightData::F32(d)) => Ok(Weights::F32(d)),
        (MatmulPrecision::Q8, WeightData::Quant(q)) => Ok(Weights::Q8(q)),
        (MatmulPrecision::Native, WeightData::Quant(q)) => Ok(Weights::Native(q)),
        (MatmulPrecision::NativeQ8Prompt, WeightData::Quant(q)) => Ok(Weights::NativeQ8Prompt(q)),
        (MatmulPrecision::Q8NativePrompt, WeightData::Quant(q)) => Ok(Weights::Q8NativePrompt(q)),
        (_, data) => Err(TensorError::Shape {
            op: "linear",
            detail: format!(
                "kernel {m} was selected for weight {}, stored as {}",
                w.name,
                match data {
                    WeightData::F32(_) => "f32".to_string(),
                    WeightData::Quant(q) => q.ty.to_string(),
                }
            ),
        }),
    }
}

/// `--precision fp8`'s input rounding for kernel `m` (rows of `k`), or `x` as it is.
fn rounded<'a>(m: &Matmul, x: &'a [f32], k: usize, buf: &'a mut Vec<f32>) -> Result<&'a [f32], TensorError> {
    if m.precision != MatmulPrecision::Fp8 {
        return Ok(x);
    }
    *buf = loupe_tensor::fp8::round_trip_rows_e4m3(x, k)?;
    Ok(buf)
}

/// `y[m, n] = x[m, k] W^T` with kernel `kernel`: row-local (batch-invariant) when `batch`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn matmul(
    kernel: &Matmul,
    w: &Weight,
    x: &[f32],
    y: &mut [f32],
    m: usize,
    k: usize,
    n: usize,
    batch: bool,
    scratch: &mut Vec<u8>,
) -> Result<(), TensorError> {
    let mut buf = Vec::new();
    let x = rounded(kernel, x, k, &mut buf)?;
    let w = weights(kernel, w)?;
    if !batch {
        return match w {
            Weights::F32(d) => matmul_f32(x, d, y, m, k, n),
            // Prefill (two rows or more) through the 8-bit prompt panels where the type has
            // them, the arithmetic of the batched engine's prompt rows; decode keeps the dot's.
            Weights::Q8(q) | Weights::NativeQ8Prompt(q) if m >= 2 => matmul_q_prompt(x, q, y, m, scratch),
            Weights::Q8(q) => matmul_q(x, q, y, m, scratch),
            // Q5_0's prompt rows through its 16-bit panels, its decode row at 8 bits.
            Weights::Q8NativePrompt(q) if m == 1 => matmul_q(x, q, y, m, scratch),
            Weights::Native(q) | Weights::NativeQ8Prompt(q) | Weights::Q8NativePrompt(q) => matmul_wq(x, q, y, m),
        };
    }
    if x.len() != m * k || y.len() != m * n {
        return Err(TensorError::Shape {
            op: "linear",
            detail: format!("x has {} elements and y {}, expected {m}x{k} and {m}x{n}", x.len(), y.len()),
        });
    }
    match w {
        Weights::F32(d) => matmul_f32_invariant(x, d, y, m, k, n),
        // Block types: every output of matmul_q has its row's `vec_dot` bits whatever the
        // number of rows (tested in loupe-tensor's `matmul_q_outputs_are_vec_dot_bits_...`),
        // so the rows go through together and each weight tile is read once.
        Weights::Q8(q) | Weights::Q8NativePrompt(q) if q8_rows_invariant(q.ty) => matmul_q(x, q, y, m, scratch),
        // Float weights (a GEMM from some row count on): one row at a time.
        Weights::Q8(q) | Weights::Q8NativePrompt(q) => {
            for (xr, yr) in x.chunks_exact(k).zip(y.chunks_exact_mut(n)) {
                matmul_q(xr, q, yr, 1, scratch)?;
            }
            Ok(())
        }
        Weights::Native(q) | Weights::NativeQ8Prompt(q) => matmul_wq_invariant(x, q, y, m),
    }
}

/// The rows of a batched step a linear computes: with `gather`, those rows of its input
/// (the logits' rows), else all of them; `prompt[r]` says whether step row `r` is a prompt
/// token.
pub(crate) struct BatchRows<'a> {
    pub(crate) gather: Option<&'a [usize]>,
    pub(crate) prompt: &'a [bool],
    /// The gathered rows are logits read only for their argmax ([`screened`]).
    pub(crate) argmax_only: bool,
}

/// A linear node: `x_all` is its input, every token's rows; it computes `rows` rows (the
/// last `rows` of a single sequence's call, or the rows `batch` names of a batched step),
/// then adds the bias.
#[allow(clippy::too_many_arguments)]
pub(crate) fn linear(
    graph: &Graph,
    kernel: &Matmul,
    weight: WeightId,
    bias: Option<WeightId>,
    x_all: &[f32],
    out: &mut [f32],
    rows: usize,
    batch: Option<BatchRows<'_>>,
    scratch: &mut Scratch,
) -> Result<(), TensorError> {
    let Scratch { quant: scratch, gathered } = scratch;
    let w = graph.weight(weight);
    let (n, k) = (w.shape[0], w.shape[1]);
    match batch {
        None => {
            // The logits of generation need only the last token's row.
            let start = x_all.len().checked_sub(rows * k).ok_or_else(|| TensorError::Shape {
                op: "linear",
                detail: format!("input of {} elements for {rows} rows of {k}", x_all.len()),
            })?;
            matmul(kernel, w, &x_all[start..], out, rows, k, n, false, scratch)?;
        }
        Some(BatchRows { gather, prompt, argmax_only }) => {
            match gather {
                // The logits' rows (one per sequence) take decode's arithmetic whatever their
                // class: a prefill's last row through the f32 chains would dequantize the
                // whole output matrix for one row (7x the GEMV's time on Qwen2.5's lm_head,
                // BENCHMARKS.md). This is a rule of the node, so no row's bits depend on its
                // batch, and it is what a single sequence's prefill does (one row).
                Some(logit_rows) => {
                    gathered.clear();
                    for &r in logit_rows {
                        let row = x_all.get(r * k..(r + 1) * k).ok_or_else(|| TensorError::Shape {
                            op: "linear",
                            detail: format!("row {r} of {k} is outside an input of {} elements", x_all.len()),
                        })?;
                        gathered.extend_from_slice(row);
                    }
                    match screened(kernel, w, bias, argmax_only) {
                        Some(q) => {
                            screened_argmax_logits(gathered, q, screen_norms(q)?, out, rows, scratch)?;
                        }
                        None => matmul(kernel, w, gathered, out, rows, k, n, true, scratch)?,
                    }
                }
                None => matmul_rows(kernel, w, x_all, out, rows, k, n, prompt, scratch)?,
            }
        }
    }
    if let Some(b) = bias {
        match &graph.weight(b).data {
            WeightData::F32(b) => out.chunks_exact_mut(n).for_each(|row| add_in_place(row, b)),
            WeightData::Quant(q) => return Err(TensorError::UnsupportedType { op: "linear bias", dtype: q.ty }),
        }
    }
    Ok(())
}

/// The weights of a logits linear whose rows are read only for their argmax, where
/// [`screened_argmax_logits`] gives native's argmax for less: native decode arithmetic
/// (8-bit kernels gain nothing), a type it screens, and no bias (which would move the
/// values it compares).
fn screened<'a>(kernel: &Matmul, w: &'a Weight, bias: Option<WeightId>, argmax_only: bool) -> Option<&'a QMatrix> {
    let native = matches!(kernel.precision, MatmulPrecision::Native | MatmulPrecision::NativeQ8Prompt);
    match &w.data {
        WeightData::Quant(q) if argmax_only && native && bias.is_none() && can_screen(q) => Some(q),
        _ => None,
    }
}

/// A batched step's matmul whose row `i` is a prompt token where `prompt[i]`. At `--precision
/// native` (block-quantized weights, 16-bit activations) prompt rows take [`matmul_wq_prompt`]
/// (16-bit panels on AVX-512, else the f32 chains), which reuse each packed weight panel
/// across all of them (faster than the multi-row decode kernels from a few rows); with 8-bit
/// activations they take [`matmul_q_prompt`] (the 8-bit panels where the type has them).
/// Decode rows keep decode's arithmetic, so a sequence's generated tokens have one set of
/// bits alone, batched, or recomputed after preemption. Both are row-local, so each row's bits
/// still do not depend on the batch. Float weights run every row alike.
#[allow(clippy::too_many_arguments)]
fn matmul_rows(
    kernel: &Matmul,
    w: &Weight,
    x: &[f32],
    y: &mut [f32],
    m: usize,
    k: usize,
    n: usize,
    prompt: &[bool],
    scratch: &mut Vec<u8>,
) -> Result<(), TensorError> {
    type Kernel = fn(&[f32], &QMatrix, &mut [f32], usize, &mut Vec<u8>) -> Result<(), TensorError>;
    let (q, for_prompt, for_decode): (&QMatrix, Kernel, Kernel) = match weights(kernel, w)? {
        Weights::Native(q) => {
            (q, |x, q, y, m, _| matmul_wq_prompt(x, q, y, m), |x, q, y, m, _| matmul_wq_invariant(x, q, y, m))
        }
        Weights::Q8(q) if q8_rows_invariant(q.ty) => (q, matmul_q_prompt, matmul_q),
        Weights::NativeQ8Prompt(q) => (q, matmul_q_prompt, |x, q, y, m, _| matmul_wq_invariant(x, q, y, m)),
        Weights::Q8NativePrompt(q) if q8_rows_invariant(q.ty) => {
            (q, |x, q, y, m, _| matmul_wq_prompt(x, q, y, m), matmul_q)
        }
        _ => return matmul(kernel, w, x, y, m, k, n, true, scratch),
    };
    if prompt.len() != m || x.len() != m * k || y.len() != m * n {
        return Err(TensorError::Shape {
            op: "linear",
            detail: format!(
                "{} row classes, x {} and y {} elements for {m}x{k} and {m}x{n}",
                prompt.len(),
                x.len(),
                y.len()
            ),
        });
    }
    let prompt_count = prompt.iter().filter(|&&p| p).count();
    if prompt_count == 0 {
        return for_decode(x, q, y, m, scratch);
    }
    if prompt_count == m {
        return for_prompt(x, q, y, m, scratch);
    }
    // A step mixing prompt and decode rows: each class gathered, computed, put back, through
    // buffers kept for the next call (a serving step's every linear comes here, and fresh
    // megabyte buffers would be mapped and faulted in each time).
    MIXED_ROWS.with(|cell| {
        let mut bufs = cell.take();
        let (xs, ys) = &mut bufs;
        for class in [true, false] {
            let rows = || (0..m).filter(move |&i| prompt[i] == class);
            xs.clear();
            rows().for_each(|i| xs.extend_from_slice(&x[i * k..(i + 1) * k]));
            let count = rows().count();
            ys.clear();
            ys.resize(count * n, 0.0);
            (if class { for_prompt } else { for_decode })(xs, q, ys, count, scratch)?;
            for (i, row) in rows().zip(ys.chunks_exact(n)) {
                y[i * n..(i + 1) * n].copy_from_slice(row);
            }
        }
        cell.set(bufs);
        Ok(())
    })
}

thread_local! {
    /// [`matmul_rows`]'s gathered inputs and outputs of one row class.
    static MIXED_ROWS: std::cell::Cell<(Vec<f32>, Vec<f32>)> = const { std::cell::Cell::new((Vec::new(), Vec::new())) };
}

/// The routed experts of [`crate::Op::Experts`]: for each expert in ascending id, the rows
/// of the tokens that chose it are gathered and go through `gate`/`up`, the activation,
/// their product and `down` (the selected kernels, row-local in batched steps); each result
/// row, times the token's weight for that expert, is added to the token's output row, which
/// starts at zero (`Qwen3MoeExperts.forward`: `zeros_like`, then `index_add_` expert by
/// expert).
#[allow(clippy::too_many_arguments)]
pub(crate) fn experts(
    graph: &Graph,
    experts: &[ExpertWeights],
    kernels: [&Matmul; 3],
    gelu_tanh: bool,
    x: &[f32],
    ids: &[f32],
    weights: &[f32],
    out: &mut [f32],
    batch: bool,
    scratch: &mut Vec<u8>,
) -> Result<(), TensorError> {
    let shape_err = |detail: String| TensorError::Shape { op: "experts", detail };
    let first = experts.first().ok_or_else(|| shape_err("no experts".into()))?;
    let (inter, d) = match graph.weight(first.gate).shape[..] {
        [inter, d] if d > 0 => (inter, d),
        ref s => return Err(shape_err(format!("gate weight of shape {s:?}"))),
    };
    let tokens = x.len() / d;
    if x.len() != tokens * d
        || out.len() != x.len()
        || tokens == 0
        || !ids.len().is_multiple_of(tokens)
        || weights.len() != ids.len()
    {
        return Err(shape_err(format!(
            "hidden {} (width {d}), ids {}, weights {}, output {}",
            x.len(),
            ids.len(),
            weights.len(),
            out.len()
        )));
    }
    let k = ids.len() / tokens;
    let mut chosen: Vec<Vec<(usize, usize)>> = vec![Vec::new(); experts.len()];
    for (t, row) in ids.chunks_exact(k).enumerate() {
        for (j, &id) in row.iter().enumerate() {
            chosen[expert_id(id, experts.len())?].push((t, j));
        }
    }
    out.iter_mut().for_each(|o| *o = 0.0);
    let [kg, ku, kd] = kernels;
    let (mut xs, mut gate, mut up, mut y) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for (e, rows) in experts.iter().zip(&chosen) {
        if rows.is_empty() {
            continue;
        }
        let m = rows.len();
        xs.clear();
        for &(t, _) in rows {
            xs.extend_from_slice(&x[t * d..(t + 1) * d]);
        }
        gate.resize(m * inter, 0.0);
        up.resize(m * inter, 0.0);
        y.resize(m * d, 0.0);
        matmul(kg, graph.weight(e.gate), &xs, &mut gate, m, d, inter, batch, scratch)?;
        matmul(ku, graph.weight(e.up), &xs, &mut up, m, d, inter, batch, scratch)?;
        if gelu_tanh {
            gelu(&mut gate, true);
        } else {
            silu(&mut gate);
        }
        mul_in_place(&mut gate, &up);
        matmul(kd, graph.weight(e.down), &gate, &mut y, m, inter, d, batch, scratch)?;
        for (r, &(t, j)) in rows.iter().enumerate() {
            let w = weights[t * k + j];
            for (o, v) in out[t * d..(t + 1) * d].iter_mut().zip(&y[r * d..(r + 1) * d]) {
                *o += v * w;
            }
        }
    }
    Ok(())
}
