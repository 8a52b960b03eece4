//! Elementwise activations and arithmetic.

/// SiLU (`x * sigmoid(x)`, torch.nn.functional.silu) in place.
pub fn silu(x: &mut [f32]) {
    for v in x {
        *v = *v / (1.0 + (-*v).exp());
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
