//! The candidates of one sampled draw, sorted only as far as the draw reads them.
//!
//! Sorting a 150k-token vocabulary for every sampled token was most of the cost of sampling
//! (~7% of a batched Qwen2.5 serving run's CPU time, on the engine thread while the other
//! compute threads waited; BENCHMARKS.md). Top-p and min-p read the probabilities from the
//! most likely down and stop early, and a draw from the whole vocabulary needs no order at
//! all, so the list is sorted lazily: a prefix at a time, each found by a histogram pass and
//! a selection over the few candidates near the top.

use std::cell::RefCell;
use std::cmp::Ordering;

/// Least candidates sorted at once: one selection then covers a typical top-p or min-p cut.
const SORT_CHUNK: usize = 64;

/// Histogram bins per unit of `logit / temperature` in [`near_top`], and how many units below
/// the top the histogram covers.
const BINS_PER_UNIT: f32 = 8.0;
const UNITS: usize = 32;

/// Most likely first, ties by lower id.
pub(super) fn by_logit(a: &(u32, f32), b: &(u32, f32)) -> Ordering {
    b.1.total_cmp(&a.1).then(a.0.cmp(&b.0))
}

/// `(token, logit / temperature)` for every candidate; `list[..sorted]` holds the `sorted`
/// most likely in order (ties: lower id first), the rest follow in no particular order.
pub(super) struct Candidates<'a> {
    list: &'a mut Vec<(u32, f32)>,
    /// `exp(l - max)` of `list[i]` while `aligned` (until the list is reordered).
    weights: &'a mut Vec<f64>,
    aligned: bool,
    sorted: usize,
    max: f64,
    /// Sum of every candidate's weight, in list order.
    sum: f64,
}

/// A candidate list (`(token, logit / temperature)`) and its weights.
type Scratch = (Vec<(u32, f32)>, Vec<f64>);

thread_local! {
    /// The candidate list and its weights, per thread: a vocabulary's worth each (2.4 MB at
    /// 150k tokens), which every sequence's sampler would otherwise hold for its lifetime.
    static SCRATCH: RefCell<Scratch> = const { RefCell::new((Vec::new(), Vec::new())) };
}

/// `f` on every token of `logits` as candidates (scaled by `temperature`), in this thread's
/// scratch buffers.
pub(super) fn with_candidates<R>(logits: &[f32], temperature: f32, f: impl FnOnce(&mut Candidates<'_>) -> R) -> R {
    SCRATCH.with(|cell| match cell.try_borrow_mut() {
        Ok(mut scratch) => {
            let (list, weights) = &mut *scratch;
            f(&mut Candidates::new(list, weights, logits, temperature))
        }
        // Re-entered on this thread (never in practice): fresh buffers.
        Err(_) => f(&mut Candidates::new(&mut Vec::new(), &mut Vec::new(), logits, temperature)),
    })
}

impl<'a> Candidates<'a> {
    /// Every token of `logits`, in token order.
    fn new(
        list: &'a mut Vec<(u32, f32)>,
        weights: &'a mut Vec<f64>,
        logits: &[f32],
        temperature: f32,
    ) -> Candidates<'a> {
        list.clear();
        list.extend(logits.iter().enumerate().map(|(i, &l)| (i as u32, l / temperature)));
        let mut c = Candidates { list, weights, aligned: false, sorted: 0, max: 0.0, sum: 0.0 };
        c.weigh();
        c
    }

    /// Keeps the `k` most likely candidates, sorted.
    pub(super) fn keep_top(&mut self, k: usize) {
        self.list.select_nth_unstable_by(k - 1, by_logit);
        self.list.truncate(k);
        self.list.sort_unstable_by(by_logit);
        self.sorted = k;
        self.weigh();
    }

    /// The maximum, every weight and their sum, for the list as it lies.
    fn weigh(&mut self) {
        self.max = self.list.iter().map(|c| c.1).fold(f32::NEG_INFINITY, f32::max) as f64;
        let max = self.max;
        self.weights.clear();
        self.weights.extend(self.list.iter().map(|&(_, l)| (l as f64 - max).exp()));
        self.sum = self.weights.iter().sum();
        self.aligned = true;
    }

    pub(super) fn len(&self) -> usize {
        self.list.len()
    }

    /// Sorts until the first `n` candidates are the `n` most likely, in order.
    fn sort_to(&mut self, n: usize) {
        if n <= self.sorted {
            return;
        }
        let len = self.list.len();
        let end = n.max(2 * self.sorted).max(SORT_CHUNK).min(len);
        let need = end - self.sorted;
        let rest = &mut self.list[self.sorted..];
        if end < len {
            // The top `need` of the rest are among the candidates `near_top` moves to the
            // front, so selecting among those gives what selecting among all would.
            let front = near_top(rest, self.max, need);
            rest[..front].select_nth_unstable_by(need - 1, by_logit);
        }
        rest[..need].sort_unstable_by(by_logit);
        self.sorted = end;
        self.aligned = false;
    }

    /// The unnormalized weight of `list[i]`, as the list lies now.
    fn weight_at(&self, i: usize) -> f64 {
        if self.aligned {
            self.weights[i]
        } else {
            (self.list[i].1 as f64 - self.max).exp()
        }
    }

    /// The probability of the `i`-th most likely candidate.
    pub(super) fn prob(&mut self, i: usize) -> f64 {
        self.sort_to(i + 1);
        self.weight_at(i) / self.sum
    }

    /// The summed weight of the `keep` most likely candidates (all of them: `self.sum`).
    pub(super) fn kept_weight(&mut self, keep: usize) -> f64 {
        if keep == self.list.len() {
            return self.sum;
        }
        self.sort_to(keep);
        (0..keep).map(|i| self.weight_at(i)).sum()
    }

    /// `token`'s weight if it is among the `keep` most likely candidates, else 0.
    pub(super) fn weight_if_kept(&mut self, token: u32, keep: usize) -> f64 {
        if keep == self.list.len() && self.sorted == 0 {
            // Still in token order: the token is its own index.
            return if (token as usize) < keep { self.weight_at(token as usize) } else { 0.0 };
        }
        self.sort_to(keep);
        match self.list[..keep].iter().position(|&(t, _)| t == token) {
            Some(i) => self.weight_at(i),
            None => 0.0,
        }
    }

    /// Walks the `keep` kept candidates (the most likely first when they are a cut, else in
    /// list order) subtracting weights from `r` and returns the token whose weight exceeds
    /// what is left of it, skipping `rejected`; the last one when rounding leaves some.
    pub(super) fn walk(&mut self, keep: usize, mut r: f64, rejected: Option<u32>) -> u32 {
        if keep < self.list.len() {
            self.sort_to(keep);
        }
        for i in 0..keep {
            let (token, q) = (self.list[i].0, self.weight_at(i));
            if Some(token) == rejected {
                continue;
            }
            if r < q {
                return token;
            }
            r -= q;
        }
        self.list[keep - 1].0
    }
}

/// Moves the candidates nearest the top to the front of `list` and returns how many: every
/// candidate down to the histogram bin (1/8 of a unit wide, counted down from `max`) that
/// brings the count to `need`, and none below it, so each candidate left behind is below
/// each one moved. Returns `list.len()` (nothing moved) when fewer than `need` lie within
/// 32 units of `max`, a value is NaN, or `max` is not finite.
fn near_top(list: &mut [(u32, f32)], max: f64, need: usize) -> usize {
    let top = max as f32;
    if !top.is_finite() {
        return list.len();
    }
    let bin = |l: f32| (top - l) * BINS_PER_UNIT;
    let mut hist = [0usize; UNITS * BINS_PER_UNIT as usize];
    for c in list.iter() {
        let d = bin(c.1);
        if d.is_nan() {
            return list.len();
        }
        if let Some(h) = hist.get_mut(d as usize) {
            *h += 1;
        }
    }
    let mut count = 0;
    for (b, &h) in hist.iter().enumerate() {
        count += h;
        if count >= need {
            let within = (b + 1) as f32;
            let mut front = 0;
            for i in 0..list.len() {
                if bin(list[i].1) < within {
                    list.swap(front, i);
                    front += 1;
                }
            }
            return front;
        }
    }
    list.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn near_top_moves_a_prefix_that_holds_the_top() {
        let mut list: Vec<(u32, f32)> = (0..5000u32).map(|i| (i, ((i * 7919) % 5000) as f32 * 0.01 - 20.0)).collect();
        let max = list.iter().map(|c| c.1).fold(f32::NEG_INFINITY, f32::max) as f64;
        let front = near_top(&mut list, max, 100);
        assert!((100..5000).contains(&front), "moved {front}");
        let lowest_moved = list[..front].iter().map(|c| c.1).fold(f32::INFINITY, f32::min);
        assert!(list[front..].iter().all(|c| c.1 < lowest_moved));
        // Too few within 32 units, a NaN, or an infinite top: nothing moved.
        let mut sparse = vec![(0, 100.0f32), (1, 0.0), (2, -1.0)];
        assert_eq!(near_top(&mut sparse, 100.0, 2), 3);
        let mut nan = vec![(0, 1.0f32), (1, f32::NAN), (2, 0.5)];
        assert_eq!(near_top(&mut nan, 1.0, 1), 3);
        assert_eq!(near_top(&mut [(0, f32::INFINITY)], f64::INFINITY, 1), 1);
    }

    #[test]
    fn sorting_in_chunks_gives_the_sorted_order() {
        let mut list = Vec::new();
        let mut weights = Vec::new();
        let logits: Vec<f32> = (0..3000u32).map(|i| ((i * 104_729) % 3001) as f32 * 0.003).collect();
        let mut c = Candidates::new(&mut list, &mut weights, &logits, 1.0);
        for n in [1, 70, 200, 3000] {
            c.sort_to(n);
        }
        let mut want: Vec<(u32, f32)> = logits.iter().enumerate().map(|(i, &l)| (i as u32, l)).collect();
        want.sort_unstable_by(by_logit);
        assert_eq!(*c.list, want);
    }
}
