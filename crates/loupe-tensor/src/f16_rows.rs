//! f32 <-> f16 conversion of whole buffers (the KV cache's rows), 16 or 8 values per
//! instruction (`vcvtps2ph`/`vcvtph2ps`) and on the compute pool when long
//! ([`crate::ops::par_ranges`], as the elementwise ops split).
//!
//! **Why.** `half`'s slice conversions take four values per call behind a runtime feature
//! check, on the calling thread while the other compute thread waits: widening a SmolLM2
//! pp512's cached keys and values for attention took ~5 ms per pass (Sapphire Rapids class, 2
//! threads; 1.5-2 ms here, for the values alone, as the key transposition widens keys itself).
//!
//! **Bits.** Rounding to nearest even, as `half::f16::from_f32` (which itself uses F16C where
//! the CPU has it); NaNs stay NaNs of the same sign with their payload's top bits and the
//! quiet bit set, infinities and overflow give infinities, tiny values round to f16
//! subnormals or zero. Widening is exact. Every ISA gives `half`'s bits (tested).

use half::f16;

use crate::pool::OutPtr;
use crate::quant::Isa;

/// Values per pool task's range (whole vectors at every width).
const UNIT: usize = 1024;

/// `dst[i] = f16(src[i])`, rounded to nearest even. Panics if the lengths differ.
pub fn narrow_into(src: &[f32], dst: &mut [f16]) {
    assert_eq!(src.len(), dst.len(), "narrow_into: {} values into {}", src.len(), dst.len());
    // SAFETY: dst is writable for src.len() values.
    unsafe { narrow_to_ptr(src, dst.as_mut_ptr().cast::<u16>()) };
}

/// Appends `f16(src[i])` (as bits) to `dst`, writing the new values straight into its spare
/// capacity rather than zeroing it first (`resize`): a second pass over the cache lines a
/// prefill writes cold.
pub fn narrow_extend(src: &[f32], dst: &mut Vec<u16>) {
    dst.reserve(src.len());
    let len = dst.len();
    // SAFETY: reserve made room for src.len() values past len; narrow_to_ptr writes every one
    // of them before set_len exposes them.
    unsafe {
        narrow_to_ptr(src, dst.as_mut_ptr().add(len));
        dst.set_len(len + src.len());
    }
}

/// # Safety
/// `dst` is writable for `src.len()` values (initialized or not).
unsafe fn narrow_to_ptr(src: &[f32], dst: *mut u16) {
    let isa = Isa::active();
    let out = OutPtr(dst.cast::<f32>());
    crate::ops::par_ranges(src.len(), UNIT, &|r| {
        // SAFETY: r lies within 0..src.len(), writable at dst by the contract; par_ranges
        // hands out disjoint ranges, so each is written by one task alone.
        unsafe { narrow_raw(isa, &src[r.clone()], out.get().cast::<u16>().add(r.start)) };
    });
}

/// `dst[i] = src[i] as f32` (exact). Panics if the lengths differ.
pub fn widen_into(src: &[f16], dst: &mut [f32]) {
    assert_eq!(src.len(), dst.len(), "widen_into: {} values into {}", src.len(), dst.len());
    let isa = Isa::active();
    let out = OutPtr(dst.as_mut_ptr());
    crate::ops::par_ranges(src.len(), UNIT, &|r| {
        // SAFETY: r lies within dst (same length as src); par_ranges hands out disjoint
        // ranges, so this range of dst is written by this task alone while dst is borrowed
        // mutably.
        let dst = unsafe { std::slice::from_raw_parts_mut(out.get().add(r.start), r.len()) };
        widen_at(isa, &src[r], dst);
    });
}

/// [`narrow_into`] on the calling thread with `isa`'s instructions (for tests and callers
/// already on the pool).
pub fn narrow_at(isa: Isa, src: &[f32], dst: &mut [f16]) {
    let n = src.len().min(dst.len());
    // SAFETY: dst is writable for n values.
    unsafe { narrow_raw(isa, &src[..n], dst.as_mut_ptr().cast::<u16>()) };
}

/// # Safety
/// `dst` is writable for `src.len()` values.
unsafe fn narrow_raw(isa: Isa, src: &[f32], dst: *mut u16) {
    let n = src.len();
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: each kernel runs only where the CPU has its features (Isa::Avx2 implies
        // F16C, Isa::Avx512 AVX-512 F); it writes dst[..n] alone (the contract).
        if isa >= Isa::Avx512 && Isa::detected() >= Isa::Avx512 {
            done = unsafe { x86::narrow_avx512(src.as_ptr(), dst, n) };
        } else if isa >= Isa::Avx2 && Isa::detected() >= Isa::Avx2 {
            done = unsafe { x86::narrow_avx2(src.as_ptr(), dst, n) };
        }
    }
    let _ = isa;
    for (i, s) in src.iter().enumerate().skip(done) {
        // SAFETY: i < n, within the contract.
        unsafe { dst.add(i).write(f16::from_f32(*s).to_bits()) };
    }
}

/// [`widen_into`] on the calling thread with `isa`'s instructions.
pub fn widen_at(isa: Isa, src: &[f16], dst: &mut [f32]) {
    let n = src.len().min(dst.len());
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: each kernel runs only where the CPU has its features (Isa::Avx2 implies
        // F16C, Isa::Avx512 AVX-512 F); it reads src[..n] and writes dst[..n] alone.
        if isa >= Isa::Avx512 && Isa::detected() >= Isa::Avx512 {
            done = unsafe { x86::widen_avx512(src.as_ptr().cast(), dst.as_mut_ptr(), n) };
        } else if isa >= Isa::Avx2 && Isa::detected() >= Isa::Avx2 {
            done = unsafe { x86::widen_avx2(src.as_ptr().cast(), dst.as_mut_ptr(), n) };
        }
    }
    let _ = isa;
    for (d, s) in dst[done..n].iter_mut().zip(&src[done..n]) {
        *d = s.to_f32();
    }
}

/// `dst[i]` = the bf16 `src[i]` (as bits) as f32, `half::bf16::to_f32`'s bits: its 16 bits on
/// top of 16 zero bits, a NaN made quiet (its top mantissa bit set). On the calling thread with
/// `isa`'s instructions.
pub fn widen_bf16_at(isa: Isa, src: &[u16], dst: &mut [f32]) {
    let n = src.len().min(dst.len());
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: each kernel runs only where the CPU has its features; it reads src[..n] and
        // writes dst[..n] alone.
        if isa >= Isa::Avx512 && Isa::detected() >= Isa::Avx512 {
            done = unsafe { x86::widen_bf16_avx512(src.as_ptr(), dst.as_mut_ptr(), n) };
        } else if isa >= Isa::Avx2 && Isa::detected() >= Isa::Avx2 {
            done = unsafe { x86::widen_bf16_avx2(src.as_ptr(), dst.as_mut_ptr(), n) };
        }
    }
    let _ = isa;
    for (d, &s) in dst[done..n].iter_mut().zip(&src[done..n]) {
        *d = half::bf16::from_bits(s).to_f32();
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// Whole vectors of 16; returns how many values it converted.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn narrow_avx512(src: *const f32, dst: *mut u16, n: usize) -> usize {
        let mut i = 0;
        while i + 16 <= n {
            let h = _mm512_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm512_loadu_ps(src.add(i)));
            _mm256_storeu_si256(dst.add(i) as *mut __m256i, h);
            i += 16;
        }
        i
    }

    #[target_feature(enable = "avx2,f16c")]
    pub(super) unsafe fn narrow_avx2(src: *const f32, dst: *mut u16, n: usize) -> usize {
        let mut i = 0;
        while i + 8 <= n {
            let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(_mm256_loadu_ps(src.add(i)));
            _mm_storeu_si128(dst.add(i) as *mut __m128i, h);
            i += 8;
        }
        i
    }

    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn widen_avx512(src: *const u16, dst: *mut f32, n: usize) -> usize {
        let mut i = 0;
        while i + 16 <= n {
            _mm512_storeu_ps(dst.add(i), _mm512_cvtph_ps(_mm256_loadu_si256(src.add(i) as *const __m256i)));
            i += 16;
        }
        i
    }

    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn widen_bf16_avx512(src: *const u16, dst: *mut f32, n: usize) -> usize {
        let mut i = 0;
        while i + 16 <= n {
            let v = _mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(_mm256_loadu_si256(src.add(i) as *const __m256i)));
            // NaNs (magnitude above infinity's bits) made quiet, as `half` does.
            let nan = _mm512_cmpgt_epi32_mask(
                _mm512_and_si512(v, _mm512_set1_epi32(0x7FFF_FFFF)),
                _mm512_set1_epi32(0x7F80_0000),
            );
            let v = _mm512_mask_or_epi32(v, nan, v, _mm512_set1_epi32(0x0040_0000));
            _mm512_storeu_ps(dst.add(i), _mm512_castsi512_ps(v));
            i += 16;
        }
        i
    }

    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn widen_bf16_avx2(src: *const u16, dst: *mut f32, n: usize) -> usize {
        let mut i = 0;
        while i + 8 <= n {
            let v = _mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(_mm_loadu_si128(src.add(i) as *const __m128i)));
            let nan =
                _mm256_cmpgt_epi32(_mm256_and_si256(v, _mm256_set1_epi32(0x7FFF_FFFF)), _mm256_set1_epi32(0x7F80_0000));
            let v = _mm256_or_si256(v, _mm256_and_si256(nan, _mm256_set1_epi32(0x0040_0000)));
            _mm256_storeu_ps(dst.add(i), _mm256_castsi256_ps(v));
            i += 8;
        }
        i
    }

    #[target_feature(enable = "avx2,f16c")]
    pub(super) unsafe fn widen_avx2(src: *const u16, dst: *mut f32, n: usize) -> usize {
        let mut i = 0;
        while i + 8 <= n {
            _mm256_storeu_ps(dst.add(i), _mm256_cvtph_ps(_mm_loadu_si128(src.add(i) as *const __m128i)));
            i += 8;
        }
        i
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Values that exercise every rounding case: ties to even at the f16 grid (normal and
    /// subnormal), the overflow edge (65504, 65520), underflow to zero, signed zeros,
    /// infinities, quiet and signalling NaNs with payloads, plus a dense sweep of bit patterns.
    fn edge_values() -> Vec<f32> {
        let mut v = vec![
            0.0,
            -0.0,
            1.0,
            -1.0,
            65504.0,
            65519.996,
            65520.0,
            -65520.0,
            1e9,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            -f32::NAN,
            f32::from_bits(0x7F80_0001),
            f32::from_bits(0xFFC0_1234),
            f32::from_bits(0x7FBF_FFFF),
            6.0e-8,
            5.96e-8,
            2.98e-8,
            2.99e-8,
            1e-10,
            -1e-10,
            f32::MIN_POSITIVE,
            6.1035156e-5,
            6.097555e-5,
        ];
        // Halfway between consecutive f16 values (1 + 2^-11: a tie, rounds to even 1.0;
        // 1 + 3 * 2^-11: rounds up to the odd neighbour's even successor).
        v.extend([1.0 + 2f32.powi(-11), 1.0 + 3.0 * 2f32.powi(-11), 2048.0 + 1.0, 2048.0 + 3.0]);
        let mut rng = crate::testing::SplitMix64::new(0x1234_5678);
        for _ in 0..20_000 {
            v.push(f32::from_bits(rng.next_u64() as u32));
        }
        // A length that leaves a tail at every vector width.
        v.truncate(v.len() - v.len() % 16 + 13);
        v
    }

    #[test]
    fn narrowing_gives_halfs_bits_on_every_isa() {
        let src = edge_values();
        let want: Vec<u16> = src.iter().map(|x| f16::from_f32(*x).to_bits()).collect();
        for isa in Isa::available() {
            let mut got = vec![f16::ZERO; src.len()];
            narrow_at(isa, &src, &mut got);
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert_eq!(
                    g.to_bits(),
                    *w,
                    "{isa:?}: {:e} ({:#010x}) -> {:#06x}, half gives {w:#06x}",
                    src[i],
                    src[i].to_bits(),
                    g.to_bits()
                );
            }
        }
        let mut pooled = vec![f16::ZERO; src.len() * 4];
        let long: Vec<f32> = src.iter().cycle().take(pooled.len()).copied().collect();
        narrow_into(&long, &mut pooled);
        assert!(
            pooled.iter().zip(&long).all(|(g, x)| g.to_bits() == f16::from_f32(*x).to_bits()),
            "the pooled conversion differs"
        );
        // Appending keeps what was there and adds the same bits.
        let mut appended = vec![7u16, 9];
        narrow_extend(&long, &mut appended);
        narrow_extend(&src[..5], &mut appended);
        assert_eq!(&appended[..2], &[7, 9]);
        assert!(
            appended[2..].iter().zip(long.iter().chain(&src[..5])).all(|(g, x)| *g == f16::from_f32(*x).to_bits()),
            "narrow_extend differs"
        );
        assert_eq!(appended.len(), 2 + long.len() + 5);
    }

    #[test]
    fn bf16_widening_is_exact_on_every_isa() {
        let src: Vec<u16> = (0..=u16::MAX).chain(0..11).collect();
        for isa in Isa::available() {
            let mut got = vec![0f32; src.len()];
            widen_bf16_at(isa, &src, &mut got);
            for (&b, g) in src.iter().zip(&got) {
                let want = half::bf16::from_bits(b).to_f32();
                assert_eq!(g.to_bits(), want.to_bits(), "{isa:?}: {b:#06x} -> {g:e}, half gives {want:e}");
            }
        }
    }

    #[test]
    fn widening_is_exact_on_every_isa() {
        // Every f16 bit pattern, plus a tail.
        let src: Vec<f16> = (0..=u16::MAX).chain(0..11).map(f16::from_bits).collect();
        for isa in Isa::available() {
            let mut got = vec![0f32; src.len()];
            widen_at(isa, &src, &mut got);
            for (h, g) in src.iter().zip(&got) {
                let w = h.to_f32();
                assert!(
                    g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan() && g.to_bits() >> 31 == w.to_bits() >> 31),
                    "{isa:?}: {:#06x} -> {g:e}, half gives {w:e}",
                    h.to_bits()
                );
            }
        }
        let mut pooled = vec![0f32; src.len()];
        widen_into(&src, &mut pooled);
        assert!(pooled
            .iter()
            .zip(&src)
            .all(|(g, h)| g.to_bits() == h.to_f32().to_bits() || (g.is_nan() && h.is_nan())));
    }
}
