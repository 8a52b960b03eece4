//! Rotary position embedding in Hugging Face's "split-half" convention
//! (`rotate_half` in transformers' `modeling_llama.py`): within each head, element
//! `i` is paired with element `i + head_dim/2`. The "interleaved" convention (GPT-J,
//! Meta's original Llama code, llama.cpp's `LLAMA_ROPE_TYPE_NORM`) pairs `2i` with `2i+1`
//! instead; it is here because applying one convention to weights laid out for the other is
//! a classic porting bug, and the parity tools plant and recognise it.
//!
//! GGUF files from llama.cpp's converter store q/k projection rows permuted for
//! its interleaved convention; the model loader undoes that permutation, so this
//! one kernel serves both GGUF and safetensors checkpoints and q/k values line
//! up with PyTorch's element for element.

use crate::TensorError;

/// How the base frequencies are adjusted for long context.
#[derive(Debug, Clone, PartialEq)]
pub enum RopeScaling {
    None,
    /// Positions divided by `factor` (transformers' `rope_type="linear"`).
    Linear {
        factor: f32,
    },
    /// Llama 3.1's frequency-dependent scaling (transformers'
    /// `_compute_llama3_parameters`).
    Llama3 {
        factor: f32,
        low_freq_factor: f32,
        high_freq_factor: f32,
        original_max_position_embeddings: f32,
    },
    /// Per-frequency divisors read from a GGUF `rope_freqs.weight` tensor
    /// (llama.cpp's encoding of the same Llama 3 scaling).
    FreqFactors(Vec<f32>),
    /// Phi-3's LongRoPE (transformers' `_compute_longrope_parameters` and
    /// `dynamic_rope_update`'s `longrope_frequency_update`): `inv_freq[i] = 1 / (f[i] *
    /// theta^(2i / rotary_dim))` with `f = short_factor` while a call's last position + 1 is
    /// at most `original_max_position_embeddings`, `long_factor` beyond; cos and sin are
    /// multiplied by `attention_factor` (both sets).
    LongRope {
        short_factor: Vec<f32>,
        long_factor: Vec<f32>,
        original_max_position_embeddings: usize,
        attention_factor: f32,
    },
}

/// Which elements of a head rotate together; pair `i` always turns at frequency `i`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RopeMode {
    /// `(i, i + head_dim/2)`: transformers' `rotate_half` (GPT-NeoX style).
    #[default]
    SplitHalf,
    /// `(2i, 2i + 1)`: GPT-J / original Llama style.
    Interleaved,
}

impl RopeMode {
    pub fn name(self) -> &'static str {
        match self {
            RopeMode::SplitHalf => "split-half",
            RopeMode::Interleaved => "interleaved",
        }
    }
}

/// Inverse frequencies for one head size, and the rotation they define.
#[derive(Debug, Clone)]
pub struct RopeTable {
    head_dim: usize,
    /// The leading elements of each head that rotate (`head_dim` unless the model has a
    /// `partial_rotary_factor`); the rest pass through unchanged.
    rotary_dim: usize,
    inv_freq: Vec<f32>,
    position_scale: f32,
    /// cos and sin are multiplied by this (LongRoPE's attention factor; 1 otherwise).
    attention_factor: f32,
    /// LongRoPE's long-context frequencies and the length past which a call uses them.
    long: Option<(Vec<f32>, usize)>,
    /// cos and sin of the positions seen so far ([`RopeTable::cached`]).
    cache: CosSinCache,
}

/// Most bytes of cos/sin a table caches (positions beyond it compute theirs per call):
/// 8 MiB is 32768 positions of a 64-wide head.
const COS_SIN_CACHE_BYTES: usize = 8 << 20;

/// cos and sin per position, `[position][rotary_dim / 2]`, of one frequency set, computed
/// by [`RopeTable::cos_sin`] itself, so a cached value has the bits of a fresh one. Each
/// rope call used to compute them for each of its rows: `rotary_dim / 2` sin/cos pairs per
/// row and call, ~3% of SmolLM2's pp512 and ~1% of its decode step.
#[derive(Default)]
struct CosSinCache(std::sync::RwLock<CosSin>);

#[derive(Default)]
struct CosSin {
    /// Which set: LongRoPE's long factors (else the table's only or short set).
    long: bool,
    positions: usize,
    cos: Vec<f32>,
    sin: Vec<f32>,
}

impl Clone for CosSinCache {
    /// A clone starts empty (and fills on its first call).
    fn clone(&self) -> Self {
        CosSinCache::default()
    }
}

impl std::fmt::Debug for CosSinCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CosSinCache")
    }
}

impl RopeTable {
    /// `inv_freq[i] = 1 / theta^(2i / head_dim)`, computed in f32 as PyTorch does,
    /// then adjusted by `scaling`; every element of a head rotates.
    pub fn new(head_dim: usize, theta: f32, scaling: &RopeScaling) -> Result<RopeTable, TensorError> {
        RopeTable::partial(head_dim, head_dim, theta, scaling)
    }

    /// The inverse frequency of each rotated pair, scaling applied (LongRoPE: the short set).
    pub fn inv_freq(&self) -> &[f32] {
        &self.inv_freq
    }

    /// A table that rotates only the first `rotary_dim` elements of each head and passes
    /// the others through, with frequencies over `rotary_dim` (`inv_freq[i] = 1 /
    /// theta^(2i / rotary_dim)`): transformers' `partial_rotary_factor`
    /// (`compute_default_rope_parameters`' `dim`, and `apply_rotary_pos_emb`'s
    /// `q[..., :rotary_dim]` / `q[..., rotary_dim:]`).
    pub fn partial(
        head_dim: usize,
        rotary_dim: usize,
        theta: f32,
        scaling: &RopeScaling,
    ) -> Result<RopeTable, TensorError> {
        if head_dim == 0 || !head_dim.is_multiple_of(2) {
            return Err(TensorError::Shape {
                op: "rope",
                detail: format!("head_dim {head_dim} must be even and non-zero"),
            });
        }
        if rotary_dim == 0 || !rotary_dim.is_multiple_of(2) || rotary_dim > head_dim {
            return Err(TensorError::Shape {
                op: "rope",
                detail: format!("rotary_dim {rotary_dim} must be even, non-zero and at most head_dim {head_dim}"),
            });
        }
        let half = rotary_dim / 2;
        let exponent = |i: usize| (2 * i) as f32 / rotary_dim as f32;
        let mut inv_freq: Vec<f32> = (0..half).map(|i| 1.0 / theta.powf(exponent(i))).collect();
        let mut position_scale = 1.0;
        let mut attention_factor = 1.0;
        let mut long = None;
        match scaling {
            RopeScaling::None => {}
            RopeScaling::Linear { factor } => position_scale = 1.0 / factor,
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings: old_ctx,
            } => {
                let low_freq_wavelen = old_ctx / low_freq_factor;
                let high_freq_wavelen = old_ctx / high_freq_factor;
                for f in inv_freq.iter_mut() {
                    let wavelen = 2.0 * std::f32::consts::PI / *f;
                    if wavelen > low_freq_wavelen {
                        *f /= factor;
                    } else if wavelen >= high_freq_wavelen {
                        let smooth = (old_ctx / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
                        *f = (1.0 - smooth) * *f / factor + smooth * *f;
                    }
                }
            }
            RopeScaling::FreqFactors(factors) => {
                if factors.len() != half {
                    return Err(TensorError::Shape {
                        op: "rope",
                        detail: format!(
                            "{} frequency factors for head_dim {head_dim} (expected {half})",
                            factors.len()
                        ),
                    });
                }
                for (f, &d) in inv_freq.iter_mut().zip(factors) {
                    *f /= d;
                }
            }
            RopeScaling::LongRope {
                short_factor,
                long_factor,
                original_max_position_embeddings,
                attention_factor: af,
            } => {
                for (what, factors) in [("short_factor", short_factor), ("long_factor", long_factor)] {
                    if factors.len() != half {
                        return Err(TensorError::Shape {
                            op: "rope",
                            detail: format!(
                                "{} {what} entries for rotary_dim {rotary_dim} (expected {half})",
                                factors.len()
                            ),
                        });
                    }
                }
                if !(af.is_finite() && *af > 0.0) || *original_max_position_embeddings == 0 {
                    return Err(TensorError::Shape { op: "rope", detail: format!("longrope attention factor {af} and original length {original_max_position_embeddings} must be positive") });
                }
                // `1.0 / (ext_factors * base**inv_freq_shape)`, each step in f32 as torch.
                let scaled = |factors: &[f32]| -> Vec<f32> {
                    factors.iter().enumerate().map(|(i, &e)| 1.0 / (e * theta.powf(exponent(i)))).collect()
                };
                inv_freq = scaled(short_factor);
                long = Some((scaled(long_factor), *original_max_position_embeddings));
                attention_factor = *af;
            }
        }
        Ok(RopeTable {
            head_dim,
            rotary_dim,
            inv_freq,
            position_scale,
            attention_factor,
            long,
            cache: CosSinCache::default(),
        })
    }

    pub fn head_dim(&self) -> usize {
        self.head_dim
    }

    /// The leading elements of each head that rotate.
    pub fn rotary_dim(&self) -> usize {
        self.rotary_dim
    }

    /// The factor cos and sin are multiplied by (LongRoPE's attention factor, else 1).
    pub fn attention_factor(&self) -> f32 {
        self.attention_factor
    }

    /// LongRoPE's switch: a call whose last position + 1 exceeds this length rotates with
    /// the long factors (`None`: the table has one set of frequencies).
    pub fn long_after(&self) -> Option<usize> {
        self.long.as_ref().map(|(_, n)| *n)
    }

    /// The frequencies of a call whose positions end at `end` (exclusive): LongRoPE picks
    /// the long set for the whole call when `end` exceeds the original length, as
    /// `longrope_frequency_update` does with `seq_len = max(position_ids) + 1`.
    fn inv_freq_for(&self, end: usize) -> &[f32] {
        match &self.long {
            Some((long, original)) if end > *original => long,
            _ => &self.inv_freq,
        }
    }

    /// cos and sin at `position` within a call whose positions end at `end` (exclusive),
    /// each `rotary_dim / 2` long, times the attention factor (`emb.cos() *
    /// self.attention_scaling` in `Phi3RotaryEmbedding.forward`).
    pub fn cos_sin(&self, position: usize, end: usize, cos: &mut [f32], sin: &mut [f32]) {
        let pos = position as f32 * self.position_scale;
        for ((c, s), &f) in cos.iter_mut().zip(sin.iter_mut()).zip(self.inv_freq_for(end)) {
            let angle = f * pos;
            *c = angle.cos() * self.attention_factor;
            *s = angle.sin() * self.attention_factor;
        }
    }

    /// Rotates `x` (`[tokens, n_heads * head_dim]`) in place in the split-half convention;
    /// row `t` is at position `first_position + t`.
    pub fn apply(&self, x: &mut [f32], n_heads: usize, first_position: usize) -> Result<(), TensorError> {
        self.apply_mode(x, n_heads, first_position, RopeMode::SplitHalf)
    }

    /// [`RopeTable::apply`] with the pairing of `mode`.
    pub fn apply_mode(
        &self,
        x: &mut [f32],
        n_heads: usize,
        first_position: usize,
        mode: RopeMode,
    ) -> Result<(), TensorError> {
        self.rotate(None, x, n_heads, first_position, mode)
    }

    /// [`RopeTable::apply_mode`] of a copy of `src` written into `out` (same length): each
    /// pool task copies its own rows before rotating them (a copy on the calling thread first
    /// was most of a prefill's rope time, with the other compute thread idle).
    pub fn apply_mode_into(
        &self,
        src: &[f32],
        out: &mut [f32],
        n_heads: usize,
        first_position: usize,
        mode: RopeMode,
    ) -> Result<(), TensorError> {
        if src.len() != out.len() {
            return Err(TensorError::Shape {
                op: "rope",
                detail: format!("{} elements into {}", src.len(), out.len()),
            });
        }
        self.rotate(Some(src), out, n_heads, first_position, mode)
    }

    /// Rotates `x` in place, or a copy of `src` into `x` when given.
    fn rotate(
        &self,
        src: Option<&[f32]>,
        x: &mut [f32],
        n_heads: usize,
        first_position: usize,
        mode: RopeMode,
    ) -> Result<(), TensorError> {
        let width = n_heads * self.head_dim;
        if width == 0 || !x.len().is_multiple_of(width) {
            return Err(TensorError::Shape {
                op: "rope",
                detail: format!("{} elements is not a multiple of {n_heads} heads x {}", x.len(), self.head_dim),
            });
        }
        let end = first_position + x.len() / width;
        let half = self.rotary_dim / 2;
        let copy_in = |r: &std::ops::Range<usize>, rows: &mut [f32]| {
            if let Some(src) = src {
                rows.copy_from_slice(&src[r.clone()]);
            }
        };
        // Rows are independent: a prefill's rows go over the pool (serial, this was ~3% of
        // SmolLM2's pp512 with the other compute thread idle).
        if let Some(cache) = self.cached(end) {
            super::par_chunks_mut(x, width, &|r, rows| {
                copy_in(&r, rows);
                for (t, row) in rows.chunks_exact_mut(width).enumerate() {
                    let at = (first_position + r.start / width + t) * half;
                    self.rotate_row(row, &cache.cos[at..at + half], &cache.sin[at..at + half], mode);
                }
            });
            return Ok(());
        }
        super::par_chunks_mut(x, width, &|r, rows| {
            copy_in(&r, rows);
            // On the stack for head_dim <= 512 (every model we know), so decode allocates
            // nothing; the heap beyond.
            let (mut cos_stack, mut sin_stack) = ([0.0f32; 256], [0.0f32; 256]);
            let (mut cos_heap, mut sin_heap) = (Vec::new(), Vec::new());
            let (cos, sin): (&mut [f32], &mut [f32]) = if half <= 256 {
                (&mut cos_stack[..half], &mut sin_stack[..half])
            } else {
                cos_heap.resize(half, 0.0);
                sin_heap.resize(half, 0.0);
                (&mut cos_heap, &mut sin_heap)
            };
            for (t, row) in rows.chunks_exact_mut(width).enumerate() {
                self.cos_sin(first_position + r.start / width + t, end, cos, sin);
                self.rotate_row(row, cos, sin, mode);
            }
        });
        Ok(())
    }

    /// The cache, holding positions `0..end` of the frequency set of a call ending at `end`
    /// (computed now if missing); `None` past [`COS_SIN_CACHE_BYTES`].
    fn cached(&self, end: usize) -> Option<std::sync::RwLockReadGuard<'_, CosSin>> {
        let half = self.rotary_dim / 2;
        let cap = COS_SIN_CACHE_BYTES / (8 * half.max(1));
        if end > cap {
            return None;
        }
        let long = matches!(&self.long, Some((_, original)) if end > *original);
        {
            let c = self.cache.0.read().ok()?;
            if c.long == long && c.positions >= end {
                return Some(c);
            }
        }
        {
            let mut c = self.cache.0.write().ok()?;
            if c.long != long {
                *c = CosSin { long, ..CosSin::default() };
            }
            if c.positions < end {
                // Grown in powers of two, so decode's one new position per step does not
                // take the write lock each time.
                let target = end.next_power_of_two().max(64).min(cap).max(end);
                // Any end past the original length selects the long set, any other the short.
                let set_end = if long { usize::MAX } else { 0 };
                let (mut cos, mut sin) = (vec![0f32; half], vec![0f32; half]);
                for p in c.positions..target {
                    self.cos_sin(p, set_end, &mut cos, &mut sin);
                    c.cos.extend_from_slice(&cos);
                    c.sin.extend_from_slice(&sin);
                }
                c.positions = target;
            }
        }
        self.cache.0.read().ok().filter(|c| c.long == long && c.positions >= end)
    }

    /// Rotates one row (every head) by `cos`/`sin` (`rotary_dim / 2` each).
    #[inline]
    fn rotate_row(&self, row: &mut [f32], cos: &[f32], sin: &[f32], mode: RopeMode) {
        let half = self.rotary_dim / 2;
        for head in row.chunks_exact_mut(self.head_dim) {
            // Elements past rotary_dim pass through (`q_pass`).
            let head = &mut head[..self.rotary_dim];
            match mode {
                RopeMode::SplitHalf => {
                    let (lo, hi) = head.split_at_mut(half);
                    for i in 0..half {
                        let (a, b) = (lo[i], hi[i]);
                        // q*cos + rotate_half(q)*sin, rotate_half(q) = [-q2, q1]
                        lo[i] = a * cos[i] - b * sin[i];
                        hi[i] = b * cos[i] + a * sin[i];
                    }
                }
                RopeMode::Interleaved => {
                    for (i, pair) in head.chunks_exact_mut(2).enumerate() {
                        let (a, b) = (pair[0], pair[1]);
                        pair[0] = a * cos[i] - b * sin[i];
                        pair[1] = b * cos[i] + a * sin[i];
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn position_zero_is_identity() {
        let t = RopeTable::new(4, 10000.0, &RopeScaling::None).unwrap();
        let mut x = [1.0f32, 2.0, 3.0, 4.0];
        t.apply(&mut x, 1, 0).unwrap();
        assert_eq!(x, [1.0, 2.0, 3.0, 4.0]);
    }

    #[test]
    fn rotation_preserves_pair_norms_and_uses_split_half_pairs() {
        let t = RopeTable::new(4, 10000.0, &RopeScaling::None).unwrap();
        let mut x = [1.0f32, 0.0, 0.0, 0.0];
        t.apply(&mut x, 1, 1).unwrap();
        // frequency 0 is 1 rad/position: (1, 0) rotates to (cos 1, sin 1) across the halves
        assert!((x[0] - 1.0f32.cos()).abs() < 1e-6);
        assert!((x[2] - 1.0f32.sin()).abs() < 1e-6);
        assert_eq!(x[1], 0.0);
    }

    #[test]
    fn interleaved_pairs_adjacent_elements() {
        let t = RopeTable::new(4, 10000.0, &RopeScaling::None).unwrap();
        let mut x = [1.0f32, 0.0, 0.0, 0.0];
        t.apply_mode(&mut x, 1, 1, RopeMode::Interleaved).unwrap();
        // frequency 0 turns (x0, x1): (1, 0) -> (cos 1, sin 1); x2, x3 untouched
        assert!((x[0] - 1.0f32.cos()).abs() < 1e-6);
        assert!((x[1] - 1.0f32.sin()).abs() < 1e-6);
        assert_eq!(&x[2..], &[0.0, 0.0]);
    }

    #[test]
    fn interleaved_is_split_half_on_permuted_elements() {
        // Interleaved RoPE equals split-half RoPE applied after moving element 2i to i and
        // 2i+1 to i + hd/2 (the permutation llama.cpp's converter applies to q/k rows).
        let hd = 8;
        let t = RopeTable::new(hd, 10000.0, &RopeScaling::None).unwrap();
        let x: Vec<f32> = (0..hd).map(|i| (i as f32 * 0.37).sin()).collect();
        let mut inter = x.clone();
        t.apply_mode(&mut inter, 1, 5, RopeMode::Interleaved).unwrap();
        let mut perm = vec![0.0; hd];
        for i in 0..hd / 2 {
            perm[i] = x[2 * i];
            perm[i + hd / 2] = x[2 * i + 1];
        }
        t.apply(&mut perm, 1, 5).unwrap();
        for i in 0..hd / 2 {
            assert!((inter[2 * i] - perm[i]).abs() < 1e-6);
            assert!((inter[2 * i + 1] - perm[i + hd / 2]).abs() < 1e-6);
        }
    }

    /// The rotation of one head by the formula, in f64: pairs (i, i + rotary/2) over the
    /// first `rotary` elements turn by `pos * inv_freq[i]`, cos and sin scaled by `af`.
    fn reference_head(x: &[f32], pos: usize, inv_freq: &[f64], af: f64) -> Vec<f32> {
        let half = inv_freq.len();
        let mut out = x.to_vec();
        for i in 0..half {
            let (a, b) = (x[i] as f64, x[i + half] as f64);
            let (c, s) = ((pos as f64 * inv_freq[i]).cos() * af, (pos as f64 * inv_freq[i]).sin() * af);
            out[i] = (a * c - b * s) as f32;
            out[i + half] = (b * c + a * s) as f32;
        }
        out
    }

    fn close(a: &[f32], b: &[f32], what: &str) {
        for (i, (x, y)) in a.iter().zip(b).enumerate() {
            assert!((x - y).abs() <= 1e-5 * (1.0 + y.abs()), "{what}: element {i}: {x} vs {y}");
        }
    }

    /// `partial_rotary_factor`: only the first rotary_dim elements of each head turn, with
    /// frequencies over rotary_dim; the rest of the head is passed through bit for bit.
    #[test]
    fn partial_rotary_turns_the_leading_elements_only() {
        let (hd, rd, theta) = (12, 8, 10000.0f32);
        let t = RopeTable::partial(hd, rd, theta, &RopeScaling::None).unwrap();
        assert_eq!((t.head_dim(), t.rotary_dim(), t.long_after()), (hd, rd, None));
        let x: Vec<f32> = (0..2 * hd * 3).map(|i| ((i as f32) * 0.61).sin()).collect();
        let mut y = x.clone();
        t.apply(&mut y, 2, 5).unwrap();
        let inv: Vec<f64> = (0..rd / 2).map(|i| 1.0 / (theta as f64).powf(2.0 * i as f64 / rd as f64)).collect();
        for (r, (xr, yr)) in x.chunks(2 * hd).zip(y.chunks(2 * hd)).enumerate() {
            for (xh, yh) in xr.chunks(hd).zip(yr.chunks(hd)) {
                close(&yh[..rd], &reference_head(&xh[..rd], 5 + r, &inv, 1.0), "rotated part");
                assert_eq!(&yh[rd..], &xh[rd..], "the pass-through part changed");
            }
        }
        for (hd, rd) in [(8, 0), (8, 3), (8, 10)] {
            assert!(RopeTable::partial(hd, rd, theta, &RopeScaling::None).is_err(), "{hd}/{rd}");
        }
    }

    /// LongRoPE: a call whose last position + 1 is at most the original length turns with
    /// the short factors, a longer one with the long factors at every row (also its first),
    /// and cos/sin carry the attention factor; factor lists of the wrong length are refused.
    /// Rows rotated through the cos/sin cache (grown across calls, shared by a prefill on
    /// the pool and single decode rows) and past its cap have the bits of cos/sin computed
    /// for the row alone.
    #[test]
    fn cached_cos_sin_give_the_bits_of_fresh_ones() {
        let (hd, heads) = (64, 3);
        let t = RopeTable::new(hd, 10000.0, &RopeScaling::Linear { factor: 2.0 }).unwrap();
        let cap = COS_SIN_CACHE_BYTES / (8 * hd / 2);
        let row: Vec<f32> = (0..hd * heads).map(|i| (i as f32 * 0.37).sin() * 3.0).collect();
        let fresh = |pos: usize, mode: RopeMode| {
            let (mut c, mut s) = (vec![0f32; hd / 2], vec![0f32; hd / 2]);
            t.cos_sin(pos, pos + 1, &mut c, &mut s);
            let mut r = row.clone();
            t.rotate_row(&mut r, &c, &s, mode);
            r
        };
        for mode in [RopeMode::SplitHalf, RopeMode::Interleaved] {
            // A prefill large enough for the pool, then decode steps across a growth of the
            // cache, then positions past the cap (computed per call).
            let rows = 300;
            let mut x: Vec<f32> = row.iter().cycle().take(row.len() * rows).copied().collect();
            t.apply_mode(&mut x, heads, 0, mode).unwrap();
            for (p, r) in x.chunks(row.len()).enumerate() {
                assert_eq!(r, &fresh(p, mode)[..], "{mode:?} prefill row {p}");
            }
            for p in (rows..rows + 300).chain([cap - 1, cap, cap + 5]) {
                let mut r = row.clone();
                t.apply_mode(&mut r, heads, p, mode).unwrap();
                assert_eq!(r, fresh(p, mode), "{mode:?} position {p}");
            }
            // A clone starts with an empty cache and gives the same bits.
            let mut r = row.clone();
            t.clone().apply_mode(&mut r, heads, 7, mode).unwrap();
            assert_eq!(r, fresh(7, mode));
            // Out of place (each pool task copies its rows, then rotates them): the in-place
            // bits, cached and past the cap, and a length mismatch is an error.
            let src: Vec<f32> = row.iter().cycle().take(row.len() * rows).copied().collect();
            for first in [0, cap - 10] {
                let mut inplace = src.clone();
                t.apply_mode(&mut inplace, heads, first, mode).unwrap();
                let mut out = vec![f32::NAN; src.len()];
                t.apply_mode_into(&src, &mut out, heads, first, mode).unwrap();
                assert_eq!(out, inplace, "{mode:?} out of place from {first}");
            }
            assert!(t.apply_mode_into(&src, &mut vec![0.0; src.len() - 1], heads, 0, mode).is_err());
        }
    }

    /// A head so wide that the cache holds fewer than 64 positions (a corrupt or hostile
    /// config) still rotates, cached up to the cap and computed past it.
    #[test]
    fn a_huge_head_caches_what_fits() {
        let hd = 1 << 16;
        let t = RopeTable::new(hd, 10000.0, &RopeScaling::None).unwrap();
        let cap = COS_SIN_CACHE_BYTES / (8 * hd / 2);
        assert!(cap < 64);
        for p in [0, cap - 1, cap, cap + 3] {
            let mut x = vec![1.0f32; hd];
            t.apply(&mut x, 1, p).unwrap();
            let (mut c, mut s) = (vec![0f32; hd / 2], vec![0f32; hd / 2]);
            t.cos_sin(p, p + 1, &mut c, &mut s);
            assert_eq!((x[1], x[hd / 2 + 1]), (c[1] - s[1], c[1] + s[1]), "position {p}");
        }
    }

    #[test]
    fn longrope_picks_its_factors_by_the_call_end() {
        let (hd, rd, theta, orig, af) = (8, 4, 10000.0f32, 4, 1.25f32);
        let (short, long) = (vec![1.0f32, 1.5], vec![3.0f32, 7.0]);
        let s = RopeScaling::LongRope {
            short_factor: short.clone(),
            long_factor: long.clone(),
            original_max_position_embeddings: orig,
            attention_factor: af,
        };
        let t = RopeTable::partial(hd, rd, theta, &s).unwrap();
        assert_eq!((t.long_after(), t.attention_factor()), (Some(orig), af));
        let inv = |f: &[f32]| -> Vec<f64> {
            f.iter()
                .enumerate()
                .map(|(i, &e)| 1.0 / (e as f64 * (theta as f64).powf(2.0 * i as f64 / rd as f64)))
                .collect()
        };
        let x: Vec<f32> = (0..hd).map(|i| 0.3 + (i as f32 * 0.77).cos()).collect();
        // (first position, rows, which factors)
        for (first, rows, factors) in
            [(0usize, 4usize, &short), (0, 5, &long), (3, 1, &short), (4, 1, &long), (2, 2, &short), (2, 3, &long)]
        {
            let mut y: Vec<f32> = x.iter().cycle().take(hd * rows).copied().collect();
            t.apply(&mut y, 1, first).unwrap();
            for (r, row) in y.chunks(hd).enumerate() {
                let want = reference_head(&x[..rd], first + r, &inv(factors), af as f64);
                close(&row[..rd], &want, &format!("call at {first} of {rows}, row {r}"));
                assert_eq!(&row[rd..], &x[rd..]);
            }
        }
        let bad = RopeScaling::LongRope {
            short_factor: vec![1.0; 3],
            long_factor: long.clone(),
            original_max_position_embeddings: orig,
            attention_factor: af,
        };
        assert!(RopeTable::partial(hd, rd, theta, &bad).unwrap_err().to_string().contains("short_factor"));
        let bad = RopeScaling::LongRope {
            short_factor: short,
            long_factor: long,
            original_max_position_embeddings: orig,
            attention_factor: f32::NAN,
        };
        assert!(RopeTable::partial(hd, rd, theta, &bad).is_err());
    }

    #[test]
    fn llama3_scaling_leaves_high_frequencies_alone() {
        let s = RopeScaling::Llama3 {
            factor: 8.0,
            low_freq_factor: 1.0,
            high_freq_factor: 4.0,
            original_max_position_embeddings: 8192.0,
        };
        let plain = RopeTable::new(128, 500000.0, &RopeScaling::None).unwrap();
        let scaled = RopeTable::new(128, 500000.0, &s).unwrap();
        assert_eq!(plain.inv_freq[0], scaled.inv_freq[0]);
        assert!((scaled.inv_freq[63] - plain.inv_freq[63] / 8.0).abs() < 1e-12);
    }
}
