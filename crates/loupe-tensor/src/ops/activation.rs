//! Elementwise activations and arithmetic.

/// SiLU (`x * sigmoid(x)`, torch.nn.functional.silu) in place.
pub fn silu(x: &mut [f32]) {
    for v in x {
        *v = *v / (1.0 + (-*v).exp());
    }
}

/// GELU in place, as `torch.nn.functional.gelu`: with `tanh`, the tanh approximation
/// (`approximate="tanh"`, GPT-2's `gelu_new`, Gemma's `gelu_pytorch_tanh`)
/// `0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`; without, the exact
/// `0.5 x (1 + erf(x / sqrt 2))`.
pub fn gelu(x: &mut [f32], tanh: bool) {
    if tanh {
        // PyTorch's kBeta = M_SQRT2 * M_2_SQRTPI * 0.5 = sqrt(2/pi), computed in f32.
        const BETA: f32 = 0.797_884_6;
        const KAPPA: f32 = 0.044_715;
        for v in x {
            let inner = BETA * (*v + KAPPA * *v * *v * *v);
            *v = 0.5 * *v * (1.0 + inner.tanh());
        }
    } else {
        for v in x {
            let e = erf(*v as f64 * std::f64::consts::FRAC_1_SQRT_2) as f32;
            *v = *v * 0.5 * (1.0 + e);
        }
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

/// SwiGLU's combination `silu(gate) * up`, written into `gate`.
pub fn silu_mul(gate: &mut [f32], up: &[f32]) {
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = (*g / (1.0 + (-*g).exp())) * u;
    }
}

/// `a += b` elementwise.
pub fn add_in_place(a: &mut [f32], b: &[f32]) {
    for (x, &y) in a.iter_mut().zip(b) {
        *x += y;
    }
}

/// `a *= b` elementwise.
pub fn mul_in_place(a: &mut [f32], b: &[f32]) {
    for (x, &y) in a.iter_mut().zip(b) {
        *x *= y;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn silu_matches_definition() {
        let mut x = [0.0f32, 1.0, -2.0];
        silu(&mut x);
        assert_eq!(x[0], 0.0);
        assert!((x[1] - 0.731_058_6).abs() < 1e-6);
        assert!((x[2] + 0.238_405_84).abs() < 1e-6);
    }

    #[test]
    fn erf_matches_known_values() {
        // erf(0.5), erf(1), erf(2), erf(3) to 15 digits (A&S table 7.1)
        for (x, e) in [(0.5, 0.520_499_877_813_046_5), (1.0, 0.842_700_792_949_714_9), (2.0, 0.995_322_265_018_952_7), (3.0, 0.999_977_909_503_001_4)] {
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
        let mut x = [1.0 + 2f32.powi(-8), 1.0 + 3.0 * 2f32.powi(-8), 1.0 + 2f32.powi(-8) + 2f32.powi(-20), f32::INFINITY];
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
            let xs: Vec<f32> = (-400..=400).map(|i| i as f32 * cap / 37.0).chain([0.0, -0.0, 1e-30, f32::MAX, -f32::MAX]).collect();
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
        let mut a = [0.5f32, -1.5, 3.0];
        let mut b = a;
        let up = [2.0f32, 0.25, -1.0];
        silu_mul(&mut a, &up);
        silu(&mut b);
        mul_in_place(&mut b, &up);
        assert_eq!(a, b);
    }
}
