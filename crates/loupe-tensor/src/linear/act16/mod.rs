//! [`Act16`]: one activation row quantized to 16-bit blocks of 32, the activation side of
//! `--precision native`'s integer kernels (decode, GEMV, batch-invariant and AMX prefill).
//! The quantizer follows the CPU (every ISA writes [`scalar::quantize_blocks`]'s bits).

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
mod scalar;
#[cfg(test)]
mod tests;

use std::mem::MaybeUninit;

use crate::quant::Isa;

/// One activation row quantized to 16-bit blocks of 32: `x[i] ~= scale[b] * q[i]` for
/// `i` in block `b`, with `scale = max|x_b| / 32767`. `scale_sum` interleaves each
/// block's scale and its exact f32 sum (the sum feeds Q4_1's offset term `m * sum(x)`),
/// so one 8-byte load fetches both.
#[derive(Clone, Copy)]
pub struct Act16<'a> {
    pub q: &'a [i16],
    pub scale_sum: &'a [f32],
}

impl<'a> Act16<'a> {
    /// Quantizes `x` (a multiple of 32 long) into `q` (same length) and `scale_sum`
    /// (two per block).
    pub fn quantize(x: &[f32], q: &'a mut [i16], scale_sum: &'a mut [f32]) -> Act16<'a> {
        quantize_at(Isa::detected(), x, q, scale_sum);
        Act16 { q, scale_sum }
    }
}

/// [`Act16::quantize`]'s body by the widest kernel `isa` allows (every one writes the
/// scalar [`quantize_blocks`]'s bits, tested; so the quantizer follows the CPU, not
/// `LOUPE_ISA`). `isa` must be supported by this CPU.
fn quantize_at(isa: Isa, x: &[f32], q: &mut [i16], scale_sum: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if isa >= Isa::Avx2 && x.len().is_multiple_of(32) && q.len() == x.len() && scale_sum.len() == x.len() / 16 {
        if isa >= Isa::Avx512 {
            // SAFETY: the CPU has AVX-512 F/BW/VL (Isa::Avx512, the caller's contract);
            // lengths checked.
            unsafe { avx512::quantize_avx512(x, q, scale_sum) };
        } else {
            // SAFETY: the CPU has AVX2, FMA and F16C (Isa::Avx2, the caller's contract);
            // `x` is a multiple of 32 long and `q`, `scale_sum` its length and two per block.
            unsafe { avx2::quantize_avx2(x, q, scale_sum) };
        }
        return;
    }
    let _ = isa;
    scalar::quantize_blocks(x, q, scale_sum);
}

/// The first `len` elements of a stack buffer, zeroed; the rest stays uninitialized. Decode
/// sizes its stack buffers for the widest row it takes ([`MAX_STACK_BLOCKS`]): zeroing all
/// 36 KiB of them on every call was ~2% of a SmolLM2 decode step, on the calling thread
/// while the other compute thread waited (perf, `loupe bench -p 0 -n 128`).
pub(crate) fn zeroed_prefix<T: Copy + Default, const N: usize>(buf: &mut [MaybeUninit<T>; N], len: usize) -> &mut [T] {
    let part = &mut buf[..len];
    for e in part.iter_mut() {
        e.write(T::default());
    }
    // SAFETY: the `len` elements of `part` were initialized just above, and MaybeUninit<T>
    // has the layout of T.
    unsafe { std::slice::from_raw_parts_mut(part.as_mut_ptr().cast::<T>(), len) }
}
