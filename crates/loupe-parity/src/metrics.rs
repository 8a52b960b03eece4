//! Error metrics of one tensor pair, accumulated in f64 in one pass over the flattened
//! data. `a` is the reference, `b` the target (docs/parity-protocol.md, step 2).
//!
//! | metric | definition | source |
//! | --- | --- | --- |
//! | cosine | a.b / (‖a‖‖b‖ + 1e-20) | docs/parity-protocol.md step 2 |
//! | max abs diff | max \|a-b\|, with its index and both values | MAX compare_tensors |
//! | max rel diff | max \|a-b\| / max(\|a\|, 1e-10) | MAX compare_tensors |
//! | NMSE | Σ(a-b)² / Σa² | llama.cpp conversion scripts (pass < 1e-2) |
//! | relative norm error | ‖a-b‖ / ‖a‖ (= √NMSE) | torch.ao "normalized L2" |
//! | norm ratio | ‖b‖ / ‖a‖ | scale bugs keep cosine at 1 and move this |
//! | SQNR | 10 log10(Σa² / Σ(a-b)²) dB | torch.ao numeric suite |
//! | mismatches | elements failing \|a-b\| <= atol + rtol·\|a\| | torch.isclose / MAX |
//!
//! Non-finite elements are counted per side and left out of the sums; a position where
//! the sides disagree on finiteness (or on which infinity) is a non-finite mismatch. NaN
//! never equals NaN (isclose's default `equal_nan=False`).

use serde::Serialize;

use crate::tensor::Tensor;

/// Added to the cosine denominator (docs/parity-protocol.md, step 2).
pub const COS_EPS: f64 = 1e-20;
/// Floor of the relative-difference denominator (MAX compare_tensors).
pub const REL_FLOOR: f64 = 1e-10;

/// Options of one metric pass.
#[derive(Debug, Clone, Copy)]
pub struct MetricOptions {
    pub rtol: f64,
    pub atol: f64,
    /// Keep per-column (per-dimension) cosines.
    pub per_dim: bool,
}

/// The metrics of one pair. Infinite values (NMSE with an all-zero reference, SQNR of
/// identical tensors) serialize as JSON `null`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Metrics {
    pub numel: usize,
    pub cosine: f64,
    pub max_abs_diff: f64,
    /// Multi-index of the largest absolute difference (`[t, d]` for `[tokens, features]`).
    pub max_abs_index: Vec<usize>,
    /// Reference and target values there.
    pub max_abs_a: f64,
    pub max_abs_b: f64,
    pub max_rel_diff: f64,
    pub max_rel_index: Vec<usize>,
    pub mean_abs_diff: f64,
    pub nmse: f64,
    pub rel_norm_error: f64,
    pub norm_ratio: f64,
    pub sqnr_db: f64,
    pub mismatches: u64,
    pub nan_a: u64,
    pub inf_a: u64,
    pub nan_b: u64,
    pub inf_b: u64,
    /// Positions where one side is non-finite and the other differs.
    pub nonfinite_mismatches: u64,
    /// Largest |value| on each side (spikes: docs/parity-protocol.md signature table).
    pub absmax_a: f64,
    pub absmax_b: f64,
    /// Cosine of each row (token) when read as `[rows, cols]`.
    #[serde(skip)]
    pub row_cosines: Vec<f64>,
    /// Cosine of each column (feature), when asked for.
    #[serde(skip)]
    pub dim_cosines: Option<Vec<f64>>,
}

/// Cosine with the protocol's epsilon; two all-zero vectors are identical, so their
/// cosine is 1 (the bare formula would give 0 and fail padding rows of zeros).
fn cosine(ab: f64, aa: f64, bb: f64) -> f64 {
    if aa == 0.0 && bb == 0.0 {
        return 1.0;
    }
    ab / (aa.sqrt() * bb.sqrt() + COS_EPS)
}

/// The multi-index of flat position `i` in `shape`.
pub fn unravel(mut i: usize, shape: &[usize]) -> Vec<usize> {
    let mut idx = vec![0; shape.len()];
    for (k, &d) in shape.iter().enumerate().rev() {
        if d > 0 {
            idx[k] = i % d;
            i /= d;
        }
    }
    idx
}

/// Lanes of the hot loop: independent partial sums break the serial dependency of one
/// f64 accumulator and let the compiler use SIMD. (The sums are added in another order
/// than a plain loop's; both are f64, far below f32 noise.)
const L: usize = 8;
/// Elements per block: the positions of the largest differences are found by rescanning
/// only the blocks whose maximum beats the best so far, which keeps index bookkeeping out
/// of the hot loop.
const BLOCK: usize = 4096;

/// Sums and maxima of one all-finite block.
#[derive(Default)]
struct Block {
    ab: f64,
    aa: f64,
    bb: f64,
    sad: f64,
    sd2: f64,
    max_abs: f64,
    max_rel: f64,
    amax_a: f64,
    amax_b: f64,
    mism: u64,
}

#[inline(always)]
fn rel_diff(x: f64, y: f64) -> f64 {
    (y - x).abs() / x.abs().max(REL_FLOOR)
}

/// The hot loop over one block; `None` when the block holds a non-finite value (the
/// caller then takes the careful path; checking here saves a separate pass).
fn block(xa: &[f32], xb: &[f32], o: &MetricOptions) -> Option<Block> {
    let mut bad = [false; L];
    let (mut ab, mut aa, mut bb, mut sad, mut sd2) = ([0f64; L], [0f64; L], [0f64; L], [0f64; L], [0f64; L]);
    let (mut mabs, mut mrel, mut ama, mut amb, mut mism) = ([0f64; L], [0f64; L], [0f64; L], [0f64; L], [0u64; L]);
    // One element into lane j's partial sums and maxima.
    let mut add = |j: usize, fa: f32, fb: f32| {
        bad[j] |= !(fa.is_finite() & fb.is_finite());
        let (x, y) = (f64::from(fa), f64::from(fb));
        let d = y - x;
        let (ad, ax) = (d.abs(), x.abs());
        ab[j] += x * y;
        aa[j] += x * x;
        bb[j] += y * y;
        sad[j] += ad;
        sd2[j] += d * d;
        mabs[j] = mabs[j].max(ad);
        mrel[j] = mrel[j].max(ad / ax.max(REL_FLOOR));
        ama[j] = ama[j].max(ax);
        amb[j] = amb[j].max(y.abs());
        mism[j] += u64::from(ad > o.atol + o.rtol * ax);
    };
    let (ca, cb) = (xa.chunks_exact(L), xb.chunks_exact(L));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (pa, pb) in ca.zip(cb) {
        for j in 0..L {
            add(j, pa[j], pb[j]);
        }
    }
    for (j, (&fa, &fb)) in ra.iter().zip(rb).enumerate() {
        add(j, fa, fb);
    }
    if bad.iter().any(|&b| b) {
        return None;
    }
    let sum = |v: [f64; L]| v.iter().sum::<f64>();
    let max = |v: [f64; L]| v.iter().fold(0f64, |m, &x| m.max(x));
    Some(Block {
        ab: sum(ab),
        aa: sum(aa),
        bb: sum(bb),
        sad: sum(sad),
        sd2: sum(sd2),
        max_abs: max(mabs),
        max_rel: max(mrel),
        amax_a: max(ama),
        amax_b: max(amb),
        mism: mism.iter().sum(),
    })
}

/// Computes the metrics of reference `a` and target `b`, which must hold the same number
/// of elements (`a`'s shape names the indices).
pub fn compute(a: &Tensor, b: &Tensor, o: &MetricOptions) -> Metrics {
    let n = a.data.len().min(b.data.len());
    let rows = a.rows().max(1);
    let cols = if n == 0 { 0 } else { a.cols().max(1) };
    let (mut ab, mut aa, mut bb, mut sad, mut sd2) = (0f64, 0f64, 0f64, 0f64, 0f64);
    let (mut max_abs, mut max_abs_i, mut max_rel, mut max_rel_i) = (-1f64, 0usize, -1f64, 0usize);
    let (mut mism, mut nan_a, mut inf_a, mut nan_b, mut inf_b, mut nf_mism) = (0u64, 0u64, 0u64, 0u64, 0u64, 0u64);
    let (mut absmax_a, mut absmax_b, mut finite) = (0f64, 0f64, 0usize);
    let mut row_cos = Vec::with_capacity(rows);
    let mut dims = o.per_dim.then(|| vec![[0f64; 3]; cols]);
    for r in 0..rows {
        let start = (r * cols).min(n);
        let end = ((r + 1) * cols).min(n);
        let (mut rab, mut raa, mut rbb) = (0f64, 0f64, 0f64);
        let mut c0 = start;
        while c0 < end {
            let c1 = (c0 + BLOCK).min(end);
            let (xa, xb) = (&a.data[c0..c1], &b.data[c0..c1]);
            let fast = if dims.is_none() { block(xa, xb, o) } else { None };
            if let Some(s) = fast {
                rab += s.ab;
                raa += s.aa;
                rbb += s.bb;
                sad += s.sad;
                sd2 += s.sd2;
                mism += s.mism;
                finite += xa.len();
                absmax_a = absmax_a.max(s.amax_a);
                absmax_b = absmax_b.max(s.amax_b);
                // Rescan for positions only when this block holds a new maximum; the
                // first strictly greater element keeps the earliest position on ties.
                if s.max_abs > max_abs {
                    max_abs = s.max_abs;
                    max_abs_i = c0
                        + xa.iter()
                            .zip(xb)
                            .position(|(&x, &y)| (f64::from(y) - f64::from(x)).abs() == s.max_abs)
                            .unwrap_or(0);
                }
                if s.max_rel > max_rel {
                    max_rel = s.max_rel;
                    max_rel_i = c0
                        + xa.iter()
                            .zip(xb)
                            .position(|(&x, &y)| rel_diff(f64::from(x), f64::from(y)) == s.max_rel)
                            .unwrap_or(0);
                }
            } else {
                for (k, (&fa, &fb)) in xa.iter().zip(xb).enumerate() {
                    let (x, y) = (f64::from(fa), f64::from(fb));
                    if !(x.is_finite() && y.is_finite()) {
                        nan_a += u64::from(x.is_nan());
                        inf_a += u64::from(x.is_infinite());
                        nan_b += u64::from(y.is_nan());
                        inf_b += u64::from(y.is_infinite());
                        // Equal infinities are close (isclose); NaN is never equal.
                        if x != y {
                            nf_mism += 1;
                            mism += 1;
                        }
                        continue;
                    }
                    finite += 1;
                    let d = y - x;
                    let ad = d.abs();
                    rab += x * y;
                    raa += x * x;
                    rbb += y * y;
                    sad += ad;
                    sd2 += d * d;
                    if ad > max_abs {
                        max_abs = ad;
                        max_abs_i = c0 + k;
                    }
                    let rel = rel_diff(x, y);
                    if rel > max_rel {
                        max_rel = rel;
                        max_rel_i = c0 + k;
                    }
                    mism += u64::from(ad > o.atol + o.rtol * x.abs());
                    absmax_a = absmax_a.max(x.abs());
                    absmax_b = absmax_b.max(y.abs());
                    if let Some(dc) = dims.as_mut().and_then(|v| v.get_mut(c0 + k - start)) {
                        dc[0] += x * y;
                        dc[1] += x * x;
                        dc[2] += y * y;
                    }
                }
            }
            c0 = c1;
        }
        ab += rab;
        aa += raa;
        bb += rbb;
        row_cos.push(cosine(rab, raa, rbb));
    }
    let (max_abs, max_rel) = (max_abs.max(0.0), max_rel.max(0.0));
    let shape = &a.shape;
    let nmse = if aa > 0.0 {
        sd2 / aa
    } else if sd2 == 0.0 {
        0.0
    } else {
        f64::INFINITY
    };
    Metrics {
        numel: n,
        cosine: cosine(ab, aa, bb),
        max_abs_diff: max_abs,
        max_abs_index: unravel(max_abs_i, shape),
        max_abs_a: a.data.get(max_abs_i).map_or(0.0, |&v| f64::from(v)),
        max_abs_b: b.data.get(max_abs_i).map_or(0.0, |&v| f64::from(v)),
        max_rel_diff: max_rel,
        max_rel_index: unravel(max_rel_i, shape),
        mean_abs_diff: if finite > 0 { sad / finite as f64 } else { 0.0 },
        nmse,
        rel_norm_error: nmse.sqrt(),
        norm_ratio: if aa > 0.0 {
            (bb / aa).sqrt()
        } else if bb == 0.0 {
            1.0
        } else {
            f64::INFINITY
        },
        sqnr_db: if sd2 > 0.0 { 10.0 * (aa / sd2).log10() } else { f64::INFINITY },
        mismatches: mism,
        nan_a,
        inf_a,
        nan_b,
        inf_b,
        nonfinite_mismatches: nf_mism,
        absmax_a,
        absmax_b,
        row_cosines: row_cos,
        dim_cosines: dims.map(|v| v.iter().map(|d| cosine(d[0], d[1], d[2])).collect()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const O: MetricOptions = MetricOptions { rtol: 1e-3, atol: 1e-5, per_dim: true };

    fn t(shape: &[usize], v: &[f32]) -> Tensor {
        Tensor::new(shape.to_vec(), v.to_vec())
    }

    #[test]
    fn hand_computed_values() {
        // a = [[1, 2], [3, 4]], b = [[1, 2], [3, 5]]
        let a = t(&[2, 2], &[1., 2., 3., 4.]);
        let b = t(&[2, 2], &[1., 2., 3., 5.]);
        let m = compute(&a, &b, &O);
        // a.b = 1 + 4 + 9 + 20 = 34; |a|² = 30; |b|² = 39.
        let cos = 34.0 / (30f64.sqrt() * 39f64.sqrt());
        assert!((m.cosine - cos).abs() < 1e-15);
        assert_eq!((m.max_abs_diff, m.max_abs_index.clone(), m.max_abs_a, m.max_abs_b), (1.0, vec![1, 1], 4.0, 5.0));
        assert_eq!((m.max_rel_diff, m.max_rel_index.clone()), (0.25, vec![1, 1]));
        assert_eq!(m.mean_abs_diff, 0.25);
        assert!((m.nmse - 1.0 / 30.0).abs() < 1e-15);
        assert!((m.rel_norm_error - (1.0f64 / 30.0).sqrt()).abs() < 1e-15);
        assert!((m.norm_ratio - (39.0f64 / 30.0).sqrt()).abs() < 1e-15);
        assert!((m.sqnr_db - 10.0 * 30f64.log10()).abs() < 1e-12);
        assert_eq!(m.mismatches, 1);
        assert!((m.row_cosines[0] - 1.0).abs() < 1e-15);
        let row1 = 29.0 / (25f64.sqrt() * 34f64.sqrt());
        assert!((m.row_cosines[1] - row1).abs() < 1e-15);
        let dims = m.dim_cosines.expect("per-dim");
        let d1 = 24.0 / (20f64.sqrt() * 29f64.sqrt()); // column 1: a = [2, 4], b = [2, 5]
        assert!((dims[1] - d1).abs() < 1e-15);
        assert_eq!(m.absmax_a, 4.0);
        assert_eq!(m.absmax_b, 5.0);
    }

    #[test]
    fn identical_zero_and_scaled_tensors() {
        let a = t(&[3], &[1., -2., 3.]);
        let m = compute(&a, &a, &O);
        assert_eq!((m.nmse, m.max_abs_diff, m.mismatches), (0.0, 0.0, 0));
        assert!(m.sqnr_db.is_infinite());
        assert!((m.cosine - 1.0).abs() < 1e-15);
        // Scale bug: cosine stays 1, the norm ratio moves.
        let b = t(&[3], &[2., -4., 6.]);
        let m = compute(&a, &b, &O);
        assert!((m.cosine - 1.0).abs() < 1e-15);
        assert!((m.norm_ratio - 2.0).abs() < 1e-15);
        assert!((m.nmse - 1.0).abs() < 1e-15);
        let z = t(&[2], &[0., 0.]);
        let m = compute(&z, &z, &O);
        assert_eq!((m.cosine, m.nmse, m.norm_ratio), (1.0, 0.0, 1.0));
        assert_eq!(compute(&z, &t(&[2], &[1., 0.]), &O).cosine, 0.0);
        assert!(compute(&z, &t(&[2], &[1., 0.]), &O).nmse.is_infinite());
    }

    #[test]
    fn non_finite_values_are_counted_not_summed() {
        let a = t(&[4], &[1., f32::NAN, f32::INFINITY, 2.]);
        let b = t(&[4], &[1., f32::NAN, f32::INFINITY, f32::NAN]);
        let m = compute(&a, &b, &O);
        assert_eq!((m.nan_a, m.inf_a, m.nan_b, m.inf_b), (1, 1, 2, 1));
        // NaN vs NaN and 2 vs NaN mismatch; inf vs inf does not.
        assert_eq!((m.nonfinite_mismatches, m.mismatches), (2, 2));
        assert!(m.cosine.is_finite() && m.nmse.is_finite());
        let all_nan = t(&[2], &[f32::NAN, f32::NAN]);
        let m = compute(&all_nan, &all_nan, &O);
        assert_eq!((m.nan_a, m.nonfinite_mismatches), (2, 2));
    }

    #[test]
    fn unravel_indices() {
        assert_eq!(unravel(5, &[2, 3]), [1, 2]);
        assert_eq!(unravel(7, &[2, 2, 2]), [1, 1, 1]);
        assert_eq!(unravel(0, &[]), Vec::<usize>::new());
    }
}
