//! The two 8-bit floating-point formats of the OCP 8-bit floating point specification
//! (v1.0, 2023, table 1), bit-exact in both directions, with no dependencies: dump readers
//! widen them, and the kernels' FP8 quantization narrows to them.
//!
//! | format | sign/exp/mantissa | bias | max finite | infinities | NaN |
//! | --- | --- | --- | --- | --- | --- |
//! | E4M3FN | 1/4/3 | 7 | 448 | none | `S.1111.111` |
//! | E5M2 | 1/5/2 | 15 | 57344 | `S.11111.00` | `S.11111.{01,10,11}` |
//!
//! Narrowing rounds to nearest, ties to even, and **saturates**: a finite value beyond the
//! largest finite one, and an infinity, become ±max (the OCP "saturating" conversion, what
//! scaled quantization wants: a value that overflows after scaling is clipped, never turned
//! into NaN or infinity). NaN stays NaN.

/// An 8-bit floating-point format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Fp8Format {
    E4M3,
    E5M2,
}

impl Fp8Format {
    const fn mantissa_bits(self) -> i32 {
        match self {
            Fp8Format::E4M3 => 3,
            Fp8Format::E5M2 => 2,
        }
    }

    const fn bias(self) -> i32 {
        match self {
            Fp8Format::E4M3 => 7,
            Fp8Format::E5M2 => 15,
        }
    }

    /// The largest finite value: 448 (E4M3FN), 57344 (E5M2).
    pub const fn max(self) -> f32 {
        match self {
            Fp8Format::E4M3 => 448.0,
            Fp8Format::E5M2 => 57344.0,
        }
    }

    /// The code of +max.
    pub const fn max_code(self) -> u8 {
        match self {
            Fp8Format::E4M3 => 0x7e,
            Fp8Format::E5M2 => 0x7b,
        }
    }

    /// The (positive) NaN code this module writes.
    pub const fn nan_code(self) -> u8 {
        0x7f
    }

    pub fn name(self) -> &'static str {
        match self {
            Fp8Format::E4M3 => "fp8_e4m3",
            Fp8Format::E5M2 => "fp8_e5m2",
        }
    }

    /// Widens a code to f32 (exact).
    pub fn decode(self, b: u8) -> f32 {
        match self {
            Fp8Format::E4M3 => e4m3fn_to_f32(b),
            Fp8Format::E5M2 => e5m2_to_f32(b),
        }
    }

    /// Narrows to the nearest code, ties to even, saturating (module docs).
    pub fn encode(self, x: f32) -> u8 {
        let sign = if x.is_sign_negative() { 0x80u8 } else { 0 };
        if x.is_nan() {
            return sign | self.nan_code();
        }
        let a = x.abs() as f64;
        if a >= self.max() as f64 {
            return sign | self.max_code();
        }
        if a == 0.0 {
            return sign;
        }
        let m = self.mantissa_bits();
        let min_exp = 1 - self.bias();
        // The exponent of `a` (a is a finite, normal f64: f32 values all are).
        let e = (((a.to_bits() >> 52) & 0x7ff) as i32 - 1023).max(min_exp);
        let step = 2f64.powi(e - m);
        let q = round_half_even(a / step);
        let v = q * step;
        if v > self.max() as f64 {
            return sign | self.max_code();
        }
        if v == 0.0 {
            return sign;
        }
        // Re-read the exponent: rounding up may have carried into the next binade.
        let ev = ((v.to_bits() >> 52) & 0x7ff) as i32 - 1023;
        let code = if ev < min_exp {
            // Subnormal: exponent field 0, mantissa in units of 2^(min_exp - m).
            (v / 2f64.powi(min_exp - m)) as u8
        } else {
            let man = ((v / 2f64.powi(ev) - 1.0) * 2f64.powi(m)) as u8;
            (((ev + self.bias()) as u8) << m) | man
        };
        sign | code
    }
}

/// Rounds to the nearest integer, ties to even.
fn round_half_even(x: f64) -> f64 {
    let r = x.round();
    if (x - x.trunc()).abs() == 0.5 && r % 2.0 != 0.0 {
        r - x.signum()
    } else {
        r
    }
}

/// E4M3FN to f32 (exact).
pub fn e4m3fn_to_f32(b: u8) -> f32 {
    let sign = if b & 0x80 != 0 { -1.0f32 } else { 1.0 };
    let exp = i32::from((b >> 3) & 0x0f);
    let man = f32::from(b & 0x07);
    if exp == 0x0f && (b & 0x07) == 0x07 {
        return f32::NAN;
    }
    if exp == 0 {
        sign * man / 8.0 * 2f32.powi(-6)
    } else {
        sign * (1.0 + man / 8.0) * 2f32.powi(exp - 7)
    }
}

/// E5M2 to f32 (exact; the top byte of an IEEE half).
pub fn e5m2_to_f32(b: u8) -> f32 {
    let sign = if b & 0x80 != 0 { -1.0f32 } else { 1.0 };
    let exp = i32::from((b >> 2) & 0x1f);
    let man = f32::from(b & 0x03);
    match exp {
        0x1f if man == 0.0 => sign * f32::INFINITY,
        0x1f => f32::NAN,
        0 => sign * man / 4.0 * 2f32.powi(-14),
        _ => sign * (1.0 + man / 4.0) * 2f32.powi(exp - 15),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FORMATS: [Fp8Format; 2] = [Fp8Format::E4M3, Fp8Format::E5M2];

    #[test]
    fn the_ocp_table_values() {
        use Fp8Format::*;
        assert_eq!((E4M3.decode(0x38), E4M3.decode(0x7e), E4M3.decode(0x01)), (1.0, 448.0, 2f32.powi(-9)));
        assert!(E4M3.decode(0x7f).is_nan() && E4M3.decode(0xff).is_nan());
        assert_eq!((E5M2.decode(0x3c), E5M2.decode(0x7b), E5M2.decode(0x01)), (1.0, 57344.0, 2f32.powi(-16)));
        assert_eq!(E5M2.decode(0x7c), f32::INFINITY);
        assert!(E5M2.decode(0x7d).is_nan());
        // E4M3's largest normal binade keeps 7 of its 8 codes: 0x78..0x7e are 256..448.
        assert_eq!(E4M3.decode(0x78), 256.0);
    }

    #[test]
    fn every_code_narrows_back_to_itself() {
        for f in FORMATS {
            for c in 0..=255u8 {
                let x = f.decode(c);
                if x.is_nan() {
                    assert!(f.decode(f.encode(x)).is_nan());
                    continue;
                }
                if x.is_infinite() {
                    // Saturating: an infinity becomes ±max.
                    assert_eq!(f.encode(x), (c & 0x80) | f.max_code(), "{f:?} {c:#04x}");
                    continue;
                }
                assert_eq!(f.encode(x), c, "{f:?} code {c:#04x} = {x}");
            }
        }
    }

    #[test]
    fn ties_round_to_even_and_everything_else_to_nearest() {
        for f in FORMATS {
            // Every pair of adjacent positive finite codes: their midpoint goes to the even
            // one, a hair either side to the nearer one.
            let top = f.max_code();
            for c in 0..top {
                let (lo, hi) = (f.decode(c) as f64, f.decode(c + 1) as f64);
                let mid = ((lo + hi) / 2.0) as f32;
                let even = if c % 2 == 0 { c } else { c + 1 };
                assert_eq!(f.encode(mid), even, "{f:?} midpoint of {c:#04x} and {:#04x}", c + 1);
                let eps = ((hi - lo) / 8.0) as f32;
                assert_eq!(f.encode(mid - eps), c, "{f:?}");
                assert_eq!(f.encode(mid + eps), c + 1, "{f:?}");
                assert_eq!(f.encode(-mid - eps), 0x80 | (c + 1), "{f:?} negative");
            }
        }
    }

    #[test]
    fn overflow_saturates_and_nan_stays_nan() {
        for f in FORMATS {
            for x in [f.max() * 1.01, 1e30, f32::MAX, f32::INFINITY] {
                assert_eq!(f.encode(x), f.max_code(), "{f:?} {x}");
                assert_eq!(f.encode(-x), 0x80 | f.max_code(), "{f:?} -{x}");
            }
            assert!(f.decode(f.encode(f32::NAN)).is_nan());
            // Far below the smallest subnormal: zero, keeping the sign.
            assert_eq!((f.encode(1e-30), f.encode(-1e-30)), (0x00, 0x80));
        }
    }
}
