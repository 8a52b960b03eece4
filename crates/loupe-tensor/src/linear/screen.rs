//! Logits read only for their argmax (greedy rows, verified drafts): the native argmax at
//! 8-bit arithmetic's price.
//!
//! Every row is first multiplied with 8-bit activation blocks ([`matmul_q`], half the multiply
//! instructions of native's 16-bit ones). For the types whose native dot has no term on the
//! raw activations (Q8_0, Q4_0, Q5_0, Q6_K: weights `w_i` times dequantized activations),
//! native computes `sum_i w_i a_i` and 8-bit `sum_i w_i b_i` in exact arithmetic, `a` and `b`
//! the row's 16-bit and 8-bit activations as dequantized (both known here). So for weight row
//! `j`, by Cauchy-Schwarz, `|native_j - q8_j| <= |w_j|_2 (|a - b|_2 + 2e-4 max(|a|_2, |b|_2))`:
//! the second term covers both sides' f32 accumulation (relative 2^-24 per operation, under
//! 2e-5 of `sum_i |w_i a_i|` for rows of at most [`MAX_COLS`]). A row `j` with `q8_j + E_j`
//! below `max_k (q8_k - E_k)` cannot be native's argmax; every other row (the candidates) is
//! recomputed with native's own dot ([`dot_row_act16`], the GEMV's bits) and written in
//! place. The argmax of the result, first index on ties, is native's argmax, bit for bit:
//! non-candidates keep their 8-bit values, all strictly below the best candidate's native
//! value.
//!
//! Only the argmax is native's: the other values are not logits anyone may read (sampling,
//! log-probabilities, penalties, grammar masks need [`crate::linear::matmul_wq_invariant`]).

use std::sync::Mutex;

use super::act16::Act16;
use super::decode::dot_row_act16;
use super::q8::{matmul_q, q8_rows_invariant};
use super::qmatrix::QMatrix;
use crate::quant::{self, dequantize_row, Isa};
use crate::{GgmlType, TensorError};

/// The widest row the float-error term of the bound is sized for (see the module docs).
pub const MAX_COLS: usize = 16384;

/// The bound's allowance for both sides' f32 rounding, relative to `|w|_2 |a|_2`.
const ROUNDING: f64 = 2e-4;

/// Whether rows of `w` can be screened: a type whose native dot multiplies dequantized
/// 16-bit activations only (`dot_row_act16`, no offset term on the raw activations), 8-bit
/// activation kernels whose rows do not depend on the batch, no tensor-wide scale, and rows
/// of at most [`MAX_COLS`].
pub fn can_screen(w: &QMatrix) -> bool {
    matches!(w.ty, GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 | GgmlType::Q6K)
        && q8_rows_invariant(w.ty)
        && w.tensor_scale == 1.0
        && w.cols <= MAX_COLS
        && w.cols.is_multiple_of(w.ty.block_size())
}

/// Per weight row, the L2 norm of its dequantized values (summed in f64, rounded up): the
/// weight side of the screen's bound. One pass over the matrix on the compute pool (its
/// callers keep the result: ~40 ms for Qwen2.5's 151,936-row `lm_head` on 2 cores).
pub fn row_norms(w: &QMatrix) -> Result<Vec<f32>, TensorError> {
    const CHUNK: usize = 1024;
    let mut out = vec![0f32; w.rows];
    let chunks: Vec<Mutex<(usize, &mut [f32])>> =
        out.chunks_mut(CHUNK).enumerate().map(|(c, part)| Mutex::new((c * CHUNK, part))).collect();
    let failed: Mutex<Option<TensorError>> = Mutex::new(None);
    crate::pool::run(chunks.len(), &|c| {
        let mut guard = chunks[c].lock().unwrap_or_else(|e| e.into_inner());
        let (first, part) = &mut *guard;
        let mut row = vec![0f32; w.cols];
        for (i, norm) in part.iter_mut().enumerate() {
            if let Err(e) = dequantize_row(w.ty, w.row(*first + i), &mut row) {
                *failed.lock().unwrap_or_else(|e| e.into_inner()) = Some(e);
                return;
            }
            let sq: f64 = row.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
            *norm = (sq.sqrt() * (1.0 + 1e-6)) as f32;
        }
    });
    drop(chunks);
    match failed.into_inner().unwrap_or_else(|e| e.into_inner()) {
        Some(e) => Err(e),
        None => Ok(out),
    }
}

/// [`row_norms`] of `w`, computed on first use and kept with the matrix (and its clones).
pub fn screen_norms(w: &QMatrix) -> Result<&[f32], TensorError> {
    w.screen_norms_with(row_norms)
}

/// `y[m, n] = x[m, k] W^T` with each row's argmax (first on ties) that of native arithmetic
/// ([`crate::linear::matmul_wq_invariant`]'s bits) and nothing else promised; `norms` is
/// [`row_norms`] of `w`. Returns how many values were recomputed natively (all rows).
pub fn screened_argmax_logits(
    x: &[f32],
    w: &QMatrix,
    norms: &[f32],
    y: &mut [f32],
    m: usize,
    scratch: &mut Vec<u8>,
) -> Result<usize, TensorError> {
    let (n, k) = (w.rows, w.cols);
    if !can_screen(w) || norms.len() != n || x.len() != m * k || y.len() != m * n {
        return Err(TensorError::Shape {
            op: "screened_argmax_logits",
            detail: format!(
                "{} weights of {n}x{k}, {} row norms, x {} and y {} elements for {m} rows",
                w.ty,
                norms.len(),
                x.len(),
                y.len()
            ),
        });
    }
    matmul_q(x, w, y, m, scratch)?;
    let isa = Isa::active();
    let rows: Vec<Mutex<(&[f32], &mut [f32])>> = x.chunks_exact(k).zip(y.chunks_exact_mut(n)).map(Mutex::new).collect();
    let results: Vec<Mutex<Result<usize, TensorError>>> = (0..m).map(|_| Mutex::new(Ok(0))).collect();
    let run = |r: usize| {
        let mut guard = rows[r].lock().unwrap_or_else(|e| e.into_inner());
        let (xr, yr) = &mut *guard;
        let done = screen_row(isa, xr, w, norms, yr);
        *results[r].lock().unwrap_or_else(|e| e.into_inner()) = done;
    };
    crate::pool::run(m, &run);
    results.into_iter().map(|r| r.into_inner().unwrap_or_else(|e| e.into_inner())).sum()
}

/// One row: the candidates' native values written over their 8-bit ones.
fn screen_row(isa: Isa, x: &[f32], w: &QMatrix, norms: &[f32], y: &mut [f32]) -> Result<usize, TensorError> {
    let k = x.len();
    let mut q = vec![0i16; k];
    let mut scale_sum = vec![0f32; k / 16];
    let act = Act16::quantize(x, &mut q, &mut scale_sum);
    // The 8-bit activations as `matmul_q` quantized them, dequantized.
    let aty = quant::vec_dot_type(w.ty);
    let mut packed = vec![0u8; quant::row_bytes("screened_argmax_logits", aty, k)?];
    quant::quantize_row(aty, x, &mut packed)?;
    let mut b = vec![0f32; k];
    dequantize_row(aty, &packed, &mut b)?;
    let (mut diff, mut a_sq, mut b_sq) = (0f64, 0f64, 0f64);
    for (i, &bi) in b.iter().enumerate() {
        let ai = f64::from(act.q[i]) * f64::from(act.scale_sum[2 * (i / 32)]);
        let bi = f64::from(bi);
        diff += (ai - bi) * (ai - bi);
        a_sq += ai * ai;
        b_sq += bi * bi;
    }
    let per_norm = diff.sqrt() * (1.0 + 1e-6) + ROUNDING * a_sq.max(b_sq).sqrt();
    if !per_norm.is_finite() || y.iter().any(|v| !v.is_finite()) {
        // No bound holds: every row natively.
        for (j, v) in y.iter_mut().enumerate() {
            *v = dot_row_act16(isa, w.ty, w.row(j), &act)?;
        }
        return Ok(y.len());
    }
    let threshold =
        y.iter().zip(norms).map(|(&v, &n)| f64::from(v) - f64::from(n) * per_norm).fold(f64::NEG_INFINITY, f64::max);
    let mut recomputed = 0;
    for (j, (v, &n)) in y.iter_mut().zip(norms).enumerate() {
        if f64::from(*v) + f64::from(n) * per_norm >= threshold {
            *v = dot_row_act16(isa, w.ty, w.row(j), &act)?;
            recomputed += 1;
        }
    }
    Ok(recomputed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::linear::matmul_wq_invariant;
    use crate::testing::{activations, quant_matrix, SplitMix64};

    /// Rows whose logits crowd the top: copies of four rows with small perturbations, so
    /// 8-bit and 16-bit activations disagree on the argmax of some inputs.
    fn crowded_matrix(ty: GgmlType, n: usize, k: usize, seed: u64) -> QMatrix {
        let mut rng = SplitMix64::new(seed);
        let base: Vec<f32> = (0..4 * k).map(|_| rng.uniform_f32(-0.05, 0.05)).collect();
        let mut w = Vec::with_capacity(n * k);
        for j in 0..n {
            let b = &base[(j % 4) * k..(j % 4 + 1) * k];
            w.extend(b.iter().map(|v| v + rng.uniform_f32(-0.002, 0.002)));
        }
        QMatrix::quantize(ty, n, k, &w).expect("quantize")
    }

    fn argmax(v: &[f32]) -> usize {
        let mut best = 0;
        for (i, &x) in v.iter().enumerate() {
            if x > v[best] {
                best = i;
            }
        }
        best
    }

    /// Per row: the screened argmax is native's, with native's bits; returns how many rows
    /// 8-bit arithmetic alone got wrong.
    fn check(w: &QMatrix, x: &[f32], m: usize, label: &str) -> usize {
        let n = w.rows;
        let norms = row_norms(w).unwrap();
        let mut native = vec![0f32; m * n];
        matmul_wq_invariant(x, w, &mut native, m).unwrap();
        let mut q8 = vec![0f32; m * n];
        matmul_q(x, w, &mut q8, m, &mut Vec::new()).unwrap();
        let mut screened = vec![0f32; m * n];
        screened_argmax_logits(x, w, &norms, &mut screened, m, &mut Vec::new()).unwrap();
        let mut wrong = 0;
        for r in 0..m {
            let (nat, s, q) = (&native[r * n..][..n], &screened[r * n..][..n], &q8[r * n..][..n]);
            let best = argmax(nat);
            assert_eq!(argmax(s), best, "{label}, row {r}");
            assert_eq!(s[best].to_bits(), nat[best].to_bits(), "{label}, row {r}: the argmax has native's bits");
            wrong += (argmax(q) != best) as usize;
        }
        wrong
    }

    #[test]
    fn screened_argmax_is_native_argmax_where_8_bit_argmax_is_not() {
        let (n, k, m) = (512, 512, 6);
        let mut wrong = 0;
        for (t, ty) in [GgmlType::Q8_0, GgmlType::Q5_0, GgmlType::Q4_0].into_iter().enumerate() {
            let w = crowded_matrix(ty, n, k, 11 + t as u64);
            for round in 0..20u32 {
                let x = activations(m * k, 100 * (t as u32 + 1) + round);
                wrong += check(&w, &x, m, &format!("{ty}, round {round}"));
            }
        }
        // The screen mattered: 8-bit arithmetic alone picked another token somewhere.
        assert!(wrong > 0, "no input separated 8-bit from native argmax; the test proves nothing");
    }

    #[test]
    fn screened_argmax_holds_for_k_quants() {
        for ty in [GgmlType::Q6K] {
            let (w, _) = quant_matrix(ty, 256, 512, 5);
            for round in 0..4u32 {
                check(&w, &activations(3 * 512, 40 + round), 3, &format!("{ty}, round {round}"));
            }
        }
    }

    /// Where logits spread as a vocabulary's do, few values are recomputed (what makes the
    /// screen pay).
    #[test]
    fn spread_logits_recompute_few_values() {
        let (w, _) = quant_matrix(GgmlType::Q8_0, 4096, 512, 9);
        let norms = row_norms(&w).unwrap();
        let x = activations(4 * 512, 77);
        let mut y = vec![0f32; 4 * 4096];
        let recomputed = screened_argmax_logits(&x, &w, &norms, &mut y, 4, &mut Vec::new()).unwrap();
        assert!(recomputed * 20 < y.len(), "{recomputed} of {} values recomputed", y.len());
    }

    #[test]
    fn norms_are_computed_once_and_shared_by_clones() {
        let w = crowded_matrix(GgmlType::Q8_0, 64, 256, 3);
        let first = screen_norms(&w).unwrap();
        assert_eq!(first, row_norms(&w).unwrap().as_slice());
        let clone = w.clone();
        assert!(std::ptr::eq(screen_norms(&clone).unwrap(), first), "the clone computed its own");
    }

    #[test]
    fn non_finite_activations_fall_back_to_native_values() {
        let w = crowded_matrix(GgmlType::Q8_0, 64, 256, 3);
        let norms = row_norms(&w).unwrap();
        let mut x = vec![0.5f32; 256];
        x[7] = f32::INFINITY;
        let mut y = vec![0f32; 64];
        let recomputed = screened_argmax_logits(&x, &w, &norms, &mut y, 1, &mut Vec::new()).unwrap();
        assert_eq!(recomputed, 64);
    }

    #[test]
    fn mismatched_shapes_are_errors() {
        let w = crowded_matrix(GgmlType::Q8_0, 64, 256, 3);
        let mut y = vec![0f32; 64];
        assert!(screened_argmax_logits(&[0.0; 256], &w, &[1.0; 63], &mut y, 1, &mut Vec::new()).is_err());
        assert!(screened_argmax_logits(&[0.0; 255], &w, &[1.0; 64], &mut y, 1, &mut Vec::new()).is_err());
    }
}
