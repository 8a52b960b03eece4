use super::scalar::quantize_blocks;
use super::*;
use crate::testing::signed;

/// The vectorized quantizer writes the scalar one's bits: random rows (1..=20 blocks,
/// so 8-block groups and tails), ties at exactly half a code, zero, -0.0, denormal,
/// infinite and NaN blocks.
#[test]
fn act16_quantize_simd_equals_scalar_bit_for_bit() {
    for isa in Isa::available().into_iter().filter(|&i| i > Isa::Scalar) {
        let mut rows: Vec<Vec<f32>> = (1..=40).map(|b| signed(32 * b, b as u32)).collect();
        let mut special = signed(32 * 9, 77);
        special[..32].fill(0.0);
        special[32..64].fill(-0.0);
        special[64..96].iter_mut().for_each(|v| *v *= 1e-41);
        special[96] = f32::INFINITY;
        special[130] = f32::NAN;
        special[160] = f32::NEG_INFINITY;
        special[161] = f32::NAN;
        // Ties: amax 32767 makes inv exactly 1, so k + 0.5 is a tie in both directions.
        for (i, v) in special[192..224].iter_mut().enumerate() {
            *v = if i == 0 { 32767.0 } else { (i as f32 - 16.0) + 0.5 };
        }
        special[224..256].iter_mut().enumerate().for_each(|(i, v)| *v = -(i as f32) * 1e5);
        rows.push(special);
        for x in rows {
            let (mut q1, mut s1) = (vec![0i16; x.len()], vec![0f32; x.len() / 16]);
            let (mut q2, mut s2) = (vec![0i16; x.len()], vec![0f32; x.len() / 16]);
            quantize_blocks(&x, &mut q1, &mut s1);
            quantize_at(isa, &x, &mut q2, &mut s2);
            assert_eq!(q1, q2, "{isa}: codes of a {}-element row", x.len());
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&s1), bits(&s2), "{isa}: scales and sums of a {}-element row", x.len());
        }
    }
}
