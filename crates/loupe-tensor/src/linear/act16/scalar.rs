//! The portable Act16 quantizer, the reference every SIMD one matches bit for bit.

/// The body of [`Act16::quantize`], for every ISA.
#[inline(always)]
pub(crate) fn quantize_blocks(x: &[f32], q: &mut [i16], scale_sum: &mut [f32]) {
    {
        for ((xb, qb), ss) in x.chunks_exact(32).zip(q.chunks_exact_mut(32)).zip(scale_sum.chunks_exact_mut(2)) {
            let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
            let scale = amax / 32767.0;
            let inv = if amax > 0.0 { 32767.0 / amax } else { 0.0 };
            for (d, &v) in qb.iter_mut().zip(xb) {
                *d = (v * inv).round().clamp(-32767.0, 32767.0) as i16;
            }
            ss[0] = scale;
            ss[1] = xb.iter().sum();
        }
    }
}
