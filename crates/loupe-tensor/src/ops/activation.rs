//! Elementwise activations and arithmetic.
//!
//! SiLU, SwiGLU and tanh-GELU run on [`exp_f32`], a branch-free `exp` that the compiler
//! vectorizes (libm's `expf`/`tanhf` are calls per element: Gemma 3's GELU took 5.6% of its
//! decode through `tanhf`). The same code is compiled for AVX-512 or AVX2 where the CPU has them, with
//! plain multiplies and adds (Rust never contracts them into FMAs), so every ISA gives the
//! same bits, tested.

use crate::quant::Isa;
use crate::TensorError;

/// `exp(x)` in f32 within 2 ulp for `x` in [-87, 88] (tested against f64 over the range),
/// with no branch and no call, so loops over it vectorize. Outside the range the input is
/// clamped: `exp(-87) ~ 1.6e-38` and `exp(88) ~ 1.7e38` stand in for 0 and infinity, which
/// the activations below turn into the same results to within a denormal. NaN stays NaN.
///
/// Cody-Waite reduction `x = n ln2 + r`, |r| <= ln2 / 2, `n` found by the round-to-nearest
/// magic constant 1.5 * 2^23 (so `n` is also in the float's low mantissa bits), then the
/// degree-7 Taylor polynomial of `exp(r)` (truncation below 2^-28 relative at |r| = ln2/2)
/// and `2^n` built from its exponent bits.
#[inline(always)]
pub fn exp_f32(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    // ln 2 split so that n * LN2_HI is exact for |n| < 2^8 (its low 12 bits are zero).
    const LN2_HI: f32 = 0.693_145_75;
    const LN2_LO: f32 = 1.428_606_8e-6;
    const ROUND: f32 = 12_582_912.0; // 1.5 * 2^23
    let x = x.clamp(-87.0, 88.0);
    let t = x * LOG2E + ROUND;
    let n = t - ROUND;
    let r = x - n * LN2_HI - n * LN2_LO;
    let p = 1.0
        + r * (1.0
            + r * (0.5
                + r * (1.0 / 6.0 + r * (1.0 / 24.0 + r * (1.0 / 120.0 + r * (1.0 / 720.0 + r * (1.0 / 5040.0)))))));
    // n sits in t's low mantissa bits, offset by 2^22 (ROUND's own mantissa).
    let ni = (t.to_bits() as i32).wrapping_sub(ROUND.to_bits() as i32);
    let two_n = f32::from_bits((ni.wrapping_add(127) << 23) as u32);
    p * two_n
}

/// Defines `$name`, which runs the `#[inline(always)]` portable loop `$portable` compiled for
/// AVX-512 or AVX2 where the CPU has them (the same operations, so the same bits as the
/// portable build: the loops vectorize 16 or 8 wide instead of 4). A named wrapper per ISA
/// rather than a closure run inside one: LLVM left the softmax closure un-inlined, so it ran
/// as SSE code (7.8% of SmolLM2's pp512 CPU time in perf, Sapphire Rapids class).
macro_rules! best_isa {
    ($name:ident($($arg:ident: $ty:ty),*) = $portable:ident) => {
        fn $name($($arg: $ty),*) {
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2,fma")]
                unsafe fn avx512($($arg: $ty),*) {
                    $portable($($arg),*)
                }
                #[target_feature(enable = "avx2,fma")]
                unsafe fn avx2($($arg: $ty),*) {
                    $portable($($arg),*)
                }
                if Isa::active() >= Isa::Avx512 {
                    // SAFETY: the CPU supports AVX-512 F/BW/VL, AVX2 and FMA.
                    return unsafe { avx512($($arg),*) };
                }
                if Isa::active() >= Isa::Avx2 {
                    // SAFETY: the CPU supports AVX2 and FMA.
                    return unsafe { avx2($($arg),*) };
                }
            }
            $portable($($arg),*)
        }
    };
}

best_isa!(softmax_best(x: &mut [f32]) = softmax_portable);
best_isa!(scaled_softmax_best(x: &mut [f32], scale: f32) = scaled_softmax_portable);
best_isa!(silu_best(x: &mut [f32]) = silu_portable);
best_isa!(gelu_tanh_best(x: &mut [f32]) = gelu_tanh_portable);
best_isa!(silu_mul_into_best(gate: &[f32], up: &[f32], out: &mut [f32]) = silu_mul_into_portable);

/// Lanes of [`softmax_in_place`]'s max and sum: element `i` goes to lane `i % 16`, each
/// lane a sequential chain, so the bits do not depend on the vector width the loop gets.
const SOFTMAX_LANES: usize = 16;

/// `x = softmax(x)` in place (max-subtracted, as torch.softmax in f32): the max, then
/// `exp(x - max)` on [`exp_f32`] (vectorized; libm's `expf` was a call per score, most of
/// prefill attention's time), summed in [`SOFTMAX_LANES`] fixed lanes added pairwise at the
/// end, then each value times `1 / sum`. The same bits on every ISA.
pub(crate) fn softmax_in_place(x: &mut [f32]) {
    softmax_best(x)
}

/// `x = softmax(scale * x)` in place: the bits of multiplying each value by `scale` and then
/// [`softmax_in_place`], with the multiply in the max's pass (attention's scores, one pass
/// fewer over each row, and vectorized: the separate multiply ran as SSE in its caller).
pub(crate) fn scaled_softmax_in_place(x: &mut [f32], scale: f32) {
    scaled_softmax_best(x, scale)
}

#[inline(always)]
fn softmax_portable(x: &mut [f32]) {
    let mut lanes = [f32::NEG_INFINITY; SOFTMAX_LANES];
    let mut chunks = x.chunks_exact(SOFTMAX_LANES);
    for c in &mut chunks {
        for (l, v) in lanes.iter_mut().zip(c) {
            *l = l.max(*v);
        }
    }
    let max = chunks.remainder().iter().fold(lanes.iter().fold(f32::NEG_INFINITY, |m, v| m.max(*v)), |m, v| m.max(*v));
    exp_normalize(x, max);
}

#[inline(always)]
fn scaled_softmax_portable(x: &mut [f32], scale: f32) {
    let mut lanes = [f32::NEG_INFINITY; SOFTMAX_LANES];
    let mut chunks = x.chunks_exact_mut(SOFTMAX_LANES);
    for c in &mut chunks {
        for (l, v) in lanes.iter_mut().zip(c.iter_mut()) {
            *v *= scale;
            *l = l.max(*v);
        }
    }
    let rest = chunks.into_remainder();
    for v in rest.iter_mut() {
        *v *= scale;
    }
    let max = rest.iter().fold(lanes.iter().fold(f32::NEG_INFINITY, |m, v| m.max(*v)), |m, v| m.max(*v));
    exp_normalize(x, max);
}

/// Softmax's second and third passes over `x` whose maximum is `max`: `exp(x - max)` summed
/// in [`SOFTMAX_LANES`] fixed lanes added pairwise, then each value times `1 / sum`.
#[inline(always)]
fn exp_normalize(x: &mut [f32], max: f32) {
    let mut sums = [0f32; SOFTMAX_LANES];
    let mut chunks = x.chunks_exact_mut(SOFTMAX_LANES);
    for c in &mut chunks {
        for (s, v) in sums.iter_mut().zip(c.iter_mut()) {
            *v = exp_f32(*v - max);
            *s += *v;
        }
    }
    for (s, v) in sums.iter_mut().zip(chunks.into_remainder()) {
        *v = exp_f32(*v - max);
        *s += *v;
    }
    let mut width = SOFTMAX_LANES;
    while width > 1 {
        width /= 2;
        for i in 0..width {
            sums[i] += sums[i + width];
        }
    }
    let inv = 1.0 / sums[0];
    for v in x.iter_mut() {
        *v *= inv;
    }
}

/// SiLU (`x * sigmoid(x)`, torch.nn.functional.silu) in place: `x / (1 + exp(-x))`.
pub fn silu(x: &mut [f32]) {
    par_mut(x, &|x| silu_best(x))
}

/// `f` over ranges of `x`, on the compute pool when large ([`super::par_chunks_mut`]).
fn par_mut(x: &mut [f32], f: &(dyn Fn(&mut [f32]) + Sync)) {
    super::par_chunks_mut(x, 64, &|_, x| f(x))
}

#[inline(always)]
fn silu_portable(x: &mut [f32]) {
    for v in x {
        *v = *v / (1.0 + exp_f32(-*v));
    }
}

/// GELU in place, as `torch.nn.functional.gelu`: with `tanh`, the tanh approximation
/// (`approximate="tanh"`, GPT-2's `gelu_new`, Gemma's `gelu_pytorch_tanh`)
/// `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`; without, the exact
/// `0.5 x (1 + erf(x / sqrt 2))`.
///
/// The tanh form is computed as `x / (1 + exp(-2u))`, `u = sqrt(2/pi) (x + 0.044715 x^3)`:
/// the same function (`1 + tanh(u) = 2 sigmoid(2u)`), without the cancellation of
/// `1 + tanh(u)` at very negative `x` where torch's form loses relative precision (its
/// values there are below 1e-6 in magnitude).
pub fn gelu(x: &mut [f32], tanh: bool) {
    if tanh {
        par_mut(x, &|x| gelu_tanh_best(x))
    } else {
        par_mut(x, &|x| {
            for v in x {
                let e = erf(*v as f64 * std::f64::consts::FRAC_1_SQRT_2) as f32;
                *v = *v * 0.5 * (1.0 + e);
            }
        })
    }
}

#[inline(always)]
fn gelu_tanh_portable(x: &mut [f32]) {
    // PyTorch's kBeta = M_SQRT2 * M_2_SQRTPI * 0.5 = sqrt(2/pi), computed in f32.
    const BETA: f32 = 0.797_884_6;
    const KAPPA: f32 = 0.044_715;
    for v in x {
        let inner = BETA * (*v + KAPPA * *v * *v * *v);
        *v /= 1.0 + exp_f32(-2.0 * inner);
    }
}

/// The error function in f64 (std has none on stable), accurate to a few ulps of f64,
/// far inside f32 rounding.
///
/// Series `erf(x) = 2/sqrt(pi) exp(-x^2) sum_n (2x^2)^n x / (1*3*...*(2n+1))`
/// (Abramowitz & Stegun 7.1.6): every term is positive, so nothing cancels. Beyond |x| = 6,
/// `1 - erf(x) < 2e-17` and the answer is +-1.
pub fn erf(x: f64) -> f64 {
    if x.is_nan() {
        return x;
    }
    let a = x.abs();
    if a >= 6.0 {
        return x.signum();
    }
    let two_x2 = 2.0 * a * a;
    let mut term = a;
    let mut sum = a;
    let mut n = 0.0;
    // The terms grow while 2n+1 < 2x^2 (n < 36 at |x| = 6), then shrink geometrically.
    for _ in 0..400 {
        n += 1.0;
        term *= two_x2 / (2.0 * n + 1.0);
        sum += term;
        if term < sum * 1e-17 {
            break;
        }
    }
    let r = std::f64::consts::FRAC_2_SQRT_PI * (-a * a).exp() * sum;
    r.min(1.0).copysign(x)
}

/// Soft-capping in place, as Gemma 2 applies it to attention scores
/// (`eager_attention_forward`'s `softcap`) and to the final logits
/// (`Gemma2ForCausalLM.forward`'s `final_logit_softcapping`): `cap * tanh(x / cap)`, in f32
/// with a true division (not a multiply by the reciprocal) as torch computes `x / cap`.
/// Values far below `cap` pass almost unchanged; larger ones approach `±cap`.
pub fn soft_cap(x: &mut [f32], cap: f32) {
    for v in x {
        *v = soft_cap_one(*v, cap);
    }
}

/// [`soft_cap`] of one value.
#[inline]
pub fn soft_cap_one(x: f32, cap: f32) -> f32 {
    (x / cap).tanh() * cap
}

/// Rounds each value to the nearest bfloat16 (ties to even, as `tensor.to(torch.bfloat16)`)
/// and widens it back to f32: the numbers a bf16 activation would hold.
pub fn round_bf16(x: &mut [f32]) {
    for v in x {
        *v = half::bf16::from_f32(*v).to_f32();
    }
}

/// `a += b` elementwise (on the compute pool when large).
pub fn add_in_place(a: &mut [f32], b: &[f32]) {
    super::par_zip_mut(a, b, &|a, b| {
        for (x, &y) in a.iter_mut().zip(b) {
            *x += y;
        }
    })
}

/// `a *= b` elementwise (on the compute pool when large).
pub fn mul_in_place(a: &mut [f32], b: &[f32]) {
    super::par_zip_mut(a, b, &|a, b| {
        for (x, &y) in a.iter_mut().zip(b) {
            *x *= y;
        }
    })
}

/// A kernel of [`binary_into`]: `out = f(a, b)` over one range of the three slices.
type BinaryKernel = dyn Fn(&[f32], &[f32], &mut [f32]) + Sync;

/// `out[i] = f(a[i], b[i])` over three slices of one length, on the compute pool when large
/// (the same per-element arithmetic wherever it runs).
fn binary_into(op: &'static str, a: &[f32], b: &[f32], out: &mut [f32], f: &BinaryKernel) -> Result<(), TensorError> {
    if a.len() != out.len() || b.len() != out.len() {
        return Err(TensorError::Shape {
            op,
            detail: format!("inputs of {} and {} elements into {}", a.len(), b.len(), out.len()),
        });
    }
    super::par_chunks_mut(out, 64, &|r, out| f(&a[r.clone()], &b[r], out));
    Ok(())
}

/// SwiGLU's combination `out = silu(gate) * up`, written into a third buffer (the executor's
/// former copy of `gate` into `out` first made prefill's SwiGLU go through its 3 MiB rows three
/// times: fill, copy, combine). Large inputs (prefill) run on the compute pool with the same
/// per-element arithmetic; the bits equal [`silu`] then [`mul_in_place`] (tested).
pub fn silu_mul_into(gate: &[f32], up: &[f32], out: &mut [f32]) -> Result<(), TensorError> {
    binary_into("silu_mul", gate, up, out, &|gate, up, out| silu_mul_into_best(gate, up, out))
}

#[inline(always)]
fn silu_mul_into_portable(gate: &[f32], up: &[f32], out: &mut [f32]) {
    for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
        *o = (g / (1.0 + exp_f32(-g))) * u;
    }
}

/// `out = a + b` elementwise ([`add_in_place`]'s bits into a third buffer).
pub fn add_into(a: &[f32], b: &[f32], out: &mut [f32]) -> Result<(), TensorError> {
    binary_into("add", a, b, out, &|a, b, out| {
        for ((o, &x), &y) in out.iter_mut().zip(a).zip(b) {
            *o = x + y;
        }
    })
}

/// `out = a * b` elementwise ([`mul_in_place`]'s bits into a third buffer).
pub fn mul_into(a: &[f32], b: &[f32], out: &mut [f32]) -> Result<(), TensorError> {
    binary_into("mul", a, b, out, &|a, b, out| {
        for ((o, &x), &y) in out.iter_mut().zip(a).zip(b) {
            *o = x * y;
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The `_into` forms give the bits of the in-place ones (SwiGLU: of silu then mul), on
    /// the pool (large) and off it, and refuse mismatched lengths.
    #[test]
    fn into_forms_equal_the_in_place_forms() {
        for n in [7usize, 100, 300_000] {
            let a: Vec<f32> = (0..n).map(|i| ((i * 37 % 101) as f32 - 50.0) * 0.17).collect();
            let b: Vec<f32> = (0..n).map(|i| ((i * 53 % 97) as f32 - 48.0) * 0.05).collect();
            let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            let mut out = vec![f32::NAN; n];
            let mut want = a.clone();
            silu(&mut want);
            mul_in_place(&mut want, &b);
            silu_mul_into(&a, &b, &mut out).unwrap();
            assert_eq!(bits(&out), bits(&want), "silu_mul n={n}");
            let mut want = a.clone();
            add_in_place(&mut want, &b);
            add_into(&a, &b, &mut out).unwrap();
            assert_eq!(bits(&out), bits(&want), "add n={n}");
            let mut want = a.clone();
            mul_in_place(&mut want, &b);
            mul_into(&a, &b, &mut out).unwrap();
            assert_eq!(bits(&out), bits(&want), "mul n={n}");
        }
        assert!(add_into(&[1.0; 3], &[1.0; 2], &mut [0.0; 3]).is_err());
        assert!(silu_mul_into(&[1.0; 3], &[1.0; 3], &mut [0.0; 4]).is_err());
    }

    #[test]
    fn silu_matches_definition() {
        let mut x = [0.0f32, 1.0, -2.0];
        silu(&mut x);
        assert_eq!(x[0], 0.0);
        assert!((x[1] - 0.731_058_6).abs() < 1e-6);
        assert!((x[2] + 0.238_405_84).abs() < 1e-6);
    }

    /// Values across the activations' range: dense near 0, out to the clamp, both signs.
    fn sweep() -> Vec<f32> {
        let mut xs: Vec<f32> = (-20000..=20000).map(|i| i as f32 * 0.0044).collect();
        xs.extend((-870..=880).map(|i| i as f32 * 0.1 + 0.013));
        xs.extend([0.0, -0.0, 1e-30, -1e-30, 1e-8, -1e-8]);
        xs
    }

    #[test]
    fn exp_is_within_two_ulps_of_f64() {
        for x in sweep().into_iter().filter(|x| (-87.0..=88.0).contains(x)) {
            let want = (x as f64).exp();
            let got = exp_f32(x) as f64;
            let ulp = (want as f32).abs().max(f32::MIN_POSITIVE) as f64 * f32::EPSILON as f64;
            assert!((got - want).abs() <= 2.0 * ulp, "exp({x}) = {got}, f64 says {want}");
        }
        assert!(exp_f32(f32::NAN).is_nan());
        // Clamped beyond the range: finite stand-ins for 0 and infinity.
        assert_eq!(exp_f32(-1000.0), exp_f32(-87.0));
        assert_eq!(exp_f32(1000.0), exp_f32(88.0));
        assert!(exp_f32(f32::INFINITY).is_finite() && exp_f32(f32::NEG_INFINITY) > 0.0);
    }

    /// SiLU, SwiGLU and tanh-GELU against their f64 formulas (torch's definitions): within 4
    /// ulp of the result, or 1e-35 where the true value is below that (`exp`'s clamp makes
    /// such results tiny instead of zero), and the active ISA's build (scripts/test runs
    /// every ISA through LOUPE_ISA) gives the portable build's bits, softmax too.
    #[test]
    fn activations_match_their_f64_formulas_and_every_isa_agrees() {
        let xs = sweep();
        // `cond`: exp's argument rounded in f32 moves the result by |arg| ulp (GELU's inner
        // polynomial is computed in f32, as torch computes it).
        let close = |got: f32, want: f64, what: &str, x: f32, cond: f64| {
            let ulp = (want.abs() as f32).max(f32::MIN_POSITIVE) as f64 * f32::EPSILON as f64;
            assert!((got as f64 - want).abs() <= (4.0 + cond) * ulp + 1e-35, "{what}({x}) = {got}, f64 says {want}");
        };
        let mut s = xs.clone();
        silu(&mut s);
        let mut g = xs.clone();
        gelu(&mut g, true);
        let up: Vec<f32> = xs.iter().map(|x| 1.5 - x * 0.25).collect();
        let mut sm = vec![0f32; xs.len()];
        silu_mul_into(&xs, &up, &mut sm).unwrap();
        for (i, &x) in xs.iter().enumerate() {
            let xd = x as f64;
            let silu_want = xd / (1.0 + (-xd).exp());
            close(s[i], silu_want, "silu", x, 0.0);
            let inner = (0.797_884_6f32 as f64) * (xd + 0.044_715f32 as f64 * xd * xd * xd);
            // torch's form in f64 where it is exact enough; beyond, its 1 + tanh(u) cancels
            // to 0 even in f64 (x = -9.8: the true value is -1e-35), so the identity
            // 1 + tanh(u) = 2 sigmoid(2u) gives the reference.
            let want = if x > -5.0 { 0.5 * xd * (1.0 + inner.tanh()) } else { xd / (1.0 + (-2.0 * inner).exp()) };
            close(g[i], want, "gelu_tanh", x, 2.0 * (2.0 * inner).abs());
            // silu then the product: the f32 product of the silu adds half an ulp.
            close(sm[i], (s[i] * up[i]) as f64, "silu_mul", x, 0.0);
        }
        // The portable loops (what a CPU without AVX2 runs) give the same bits.
        let mut s2 = xs.clone();
        silu_portable(&mut s2);
        let mut g2 = xs.clone();
        gelu_tanh_portable(&mut g2);
        assert!(
            s.iter().zip(&s2).all(|(a, b)| a.to_bits() == b.to_bits()),
            "silu: the active ISA's build and portable differ"
        );
        assert!(
            g.iter().zip(&g2).all(|(a, b)| a.to_bits() == b.to_bits()),
            "gelu: the active ISA's build and portable differ"
        );
        // Softmax over rows of several lengths (tails of the 16 lanes), scores in a plausible range.
        for n in [1usize, 15, 16, 17, 100, 513] {
            let row: Vec<f32> = xs.iter().cycle().take(n).map(|x| x * 0.7).collect();
            let (mut a, mut b) = (row.clone(), row);
            softmax_in_place(&mut a);
            softmax_portable(&mut b);
            assert!(
                a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()),
                "softmax n={n}: the active ISA's build and portable differ"
            );
            // The scaled form: the bits of multiplying first, then the softmax.
            let mut c = a.clone();
            let (mut d, scale) = (xs.iter().cycle().take(n).map(|x| x * 0.7).collect::<Vec<f32>>(), 0.125f32 * 1.3);
            d.iter_mut().for_each(|v| *v *= scale);
            softmax_portable(&mut d);
            c.copy_from_slice(&xs.iter().cycle().take(n).map(|x| x * 0.7).collect::<Vec<f32>>());
            let mut e = c.clone();
            scaled_softmax_in_place(&mut c, scale);
            scaled_softmax_portable(&mut e, scale);
            assert!(
                c.iter().zip(&d).all(|(x, y)| x.to_bits() == y.to_bits()),
                "scaled softmax n={n}: not the bits of scaling first"
            );
            assert!(
                e.iter().zip(&d).all(|(x, y)| x.to_bits() == y.to_bits()),
                "scaled softmax n={n}: portable differs"
            );
        }
        let mut nan = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY];
        silu(&mut nan);
        // -inf / (1 + exp(88)) stays -inf (torch's -inf / (1 + inf) is NaN; both say the
        // activation overflowed).
        assert!(nan[0].is_nan() && nan[1] == f32::INFINITY && nan[2] == f32::NEG_INFINITY, "{nan:?}");
    }

    #[test]
    fn erf_matches_known_values() {
        // erf(0.5), erf(1), erf(2), erf(3) to 15 digits (A&S table 7.1)
        for (x, e) in [
            (0.5, 0.520_499_877_813_046_5),
            (1.0, 0.842_700_792_949_714_9),
            (2.0, 0.995_322_265_018_952_7),
            (3.0, 0.999_977_909_503_001_4),
        ] {
            assert!((erf(x) - e).abs() < 1e-14, "erf({x}) = {}", erf(x));
            assert!((erf(-x) + e).abs() < 1e-14);
        }
        assert_eq!(erf(0.0), 0.0);
        assert_eq!(erf(7.0), 1.0);
    }

    #[test]
    fn gelu_variants_match_pytorch() {
        // torch.nn.functional.gelu(torch.tensor([-1., 0.5, 2.]), approximate=...) in f32
        let mut exact = [-1.0f32, 0.5, 2.0];
        gelu(&mut exact, false);
        let mut tanh = [-1.0f32, 0.5, 2.0];
        gelu(&mut tanh, true);
        for (a, e) in exact.iter().zip([-0.158_655_26f32, 0.345_731_14, 1.954_499_7]) {
            assert!((a - e).abs() < 1e-6, "{a} vs {e}");
        }
        for (a, e) in tanh.iter().zip([-0.158_808f32, 0.345_714, 1.954_597_7]) {
            assert!((a - e).abs() < 2e-6, "{a} vs {e}");
        }
    }

    #[test]
    fn bf16_rounding_is_nearest_even() {
        // 1 + 2^-8 lies halfway between bf16 1.0 and 1 + 2^-7: ties go to even (1.0);
        // 1 + 3*2^-8 lies halfway between 1 + 2^-7 and 1 + 2^-6: goes to 1 + 2^-6.
        let mut x =
            [1.0 + 2f32.powi(-8), 1.0 + 3.0 * 2f32.powi(-8), 1.0 + 2f32.powi(-8) + 2f32.powi(-20), f32::INFINITY];
        round_bf16(&mut x);
        assert_eq!(x, [1.0, 1.0 + 2f32.powi(-6), 1.0 + 2f32.powi(-7), f32::INFINITY]);
        let mut nan = [f32::NAN];
        round_bf16(&mut nan);
        assert!(nan[0].is_nan());
    }

    /// The kernel against the formula in f64 (the scalar reference): within two f32 ulps of
    /// `cap * tanh(x / cap)` over values below, near and far above the cap, both signs.
    #[test]
    fn soft_cap_matches_its_f64_reference() {
        for cap in [5.0f32, 30.0, 50.0, 0.75] {
            let xs: Vec<f32> =
                (-400..=400).map(|i| i as f32 * cap / 37.0).chain([0.0, -0.0, 1e-30, f32::MAX, -f32::MAX]).collect();
            let mut got = xs.clone();
            soft_cap(&mut got, cap);
            for (&x, &g) in xs.iter().zip(&got) {
                let want = (x as f64 / cap as f64).tanh() * cap as f64;
                let ulp = (want.abs() as f32).max(f32::MIN_POSITIVE) * f32::EPSILON;
                assert!((g as f64 - want).abs() <= 2.0 * ulp as f64, "cap {cap}, x {x}: {g} vs {want}");
                assert!(g.abs() <= cap, "cap {cap}, x {x}: {g} exceeds the cap");
                assert_eq!(g.to_bits(), soft_cap_one(x, cap).to_bits());
            }
        }
        // Monotone, so the argmax of capped logits is the argmax of the raw ones, up to ties
        // where tanh saturates in f32.
        let mut row = [1.0f32, 4.0, -3.0, 2.5];
        soft_cap(&mut row, 5.0);
        assert!(row[1] > row[3] && row[3] > row[0] && row[0] > row[2]);
        let mut nan = [f32::NAN];
        soft_cap(&mut nan, 5.0);
        assert!(nan[0].is_nan());
    }

    #[test]
    fn silu_mul_equals_silu_then_mul() {
        let x = [0.5f32, -1.5, 3.0];
        let (mut a, mut b) = ([0f32; 3], x);
        let up = [2.0f32, 0.25, -1.0];
        silu_mul_into(&x, &up, &mut a).unwrap();
        silu(&mut b);
        mul_in_place(&mut b, &up);
        assert_eq!(a, b);
    }
}
