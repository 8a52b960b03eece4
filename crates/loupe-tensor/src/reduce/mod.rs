//! Horizontal sums, one definition per ISA, that every kernel ends its reductions with. The
//! lane order is part of the bit-identity contract: the one-row dot, the GEMV, the
//! batch-invariant kernels and attention's row kernels give equal bits only because they all
//! reduce in this order, so it is written once, here.

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2;
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512;

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use std::arch::x86_64::*;

    use crate::quant::Isa;
    use crate::testing::uniform;

    /// The 8-lane sum is `((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7))`, the order the
    /// scalar references of the AVX2 kernels repeat.
    #[test]
    fn avx2_sum_has_the_documented_order() {
        if !Isa::Avx2.is_supported() {
            panic!("this test needs an AVX2 CPU (every CPU loupe's CI runs on has one)");
        }
        for seed in 0..200 {
            let l = uniform(8, seed, -1e4, 1e4);
            let want = ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
            // SAFETY: AVX2 and FMA checked above; `l` holds 8 floats.
            let got = unsafe { super::avx2::hsum(_mm256_loadu_ps(l.as_ptr())) };
            assert_eq!(got.to_bits(), want.to_bits(), "seed {seed}");
        }
    }

    /// The written-out 16-lane sum equals the standard library's `_mm512_reduce_add_ps`
    /// bit for bit, so attention's row kernels and the linear kernels agree with it. Runs
    /// where the CPU has AVX-512, as every kernel test runs the ISAs the CPU has.
    #[test]
    fn avx512_sum_equals_the_intrinsic() {
        for seed in (0..200).filter(|_| Isa::available().contains(&Isa::Avx512)) {
            let l = uniform(16, seed, -1e4, 1e4);
            // SAFETY: AVX-512 F checked above; `l` holds 16 floats.
            let (got, want) = unsafe {
                let v = _mm512_loadu_ps(l.as_ptr());
                (super::avx512::hsum(v), _mm512_reduce_add_ps(v))
            };
            assert_eq!(got.to_bits(), want.to_bits(), "seed {seed}");
        }
    }
}
