//! The kernel unit tests' data, all from loupe-core's seeded [`SplitMix64`] (the one
//! generator of the workspace's tests, sampling and fuzz corpora), so every kernel test
//! draws from the same reproducible stream and no test carries its own generator.

pub(crate) use loupe_core::SplitMix64;

/// `n` values uniform in `[lo, hi)` from `seed`'s stream.
pub(crate) fn uniform(n: usize, seed: u64, lo: f32, hi: f32) -> Vec<f32> {
    let mut rng = SplitMix64::new(seed);
    (0..n).map(|_| rng.uniform_f32(lo, hi)).collect()
}

/// `n` values uniform in `[-1, 1)`: weights and activations of the kernel tests.
pub(crate) fn signed(n: usize, seed: u32) -> Vec<f32> {
    uniform(n, seed.into(), -1.0, 1.0)
}

/// `n` activation-like values: uniform in `[-0.5, 0.5)` with one in about 61 scaled by 40,
/// the outliers real hidden states have (they set a block's scale, so they exercise the
/// quantizers' range).
pub(crate) fn activations(n: usize, seed: u32) -> Vec<f32> {
    let mut rng = SplitMix64::new(seed.into());
    (0..n)
        .map(|_| {
            let u = rng.uniform_f32(-0.5, 0.5);
            if rng.below(61) == 0 {
                u * 40.0
            } else {
                u
            }
        })
        .collect()
}
