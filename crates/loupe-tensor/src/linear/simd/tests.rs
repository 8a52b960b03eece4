//! The shared unpackings against the dequantizer, on every ISA this CPU has.

use crate::quant::{dequantize_row, Isa};
use crate::testing::raw_kquant_row;
use crate::GgmlType;

/// A pair of Q6_K blocks unpacked as the pairs kernels take it (words 0..16 block `b`'s
/// elements 0..16, words 16..32 block `b + 1`'s; then elements 16..32 alike) is exactly `(q -
/// 32) * scale` of each element, on raw random super-blocks (every code and signed scale) and
/// extreme ones with `d = 1`: at AVX-512 `simd::avx512::q6_k_pair` (the GEMV's and the
/// multi-row kernels'), at AVX2 the two blocks' AVX2 unpackings joined, on every ISA this CPU has.
#[test]
fn q6_k_pair_unpacking_matches_dequantize() {
    #[cfg(target_arch = "x86_64")]
    {
        let mut row = raw_kquant_row(GgmlType::Q6K, 256 * 64, 11, false);
        row.extend(vec![0xFFu8; 210]);
        row.extend(vec![0u8; 192]);
        row.extend([0x80u8; 18]);
        let isas: Vec<Isa> = Isa::available().into_iter().filter(|&i| i >= Isa::Avx2).collect();
        assert!(!isas.is_empty(), "this x86-64 CPU has no AVX2: the Act16 unpackings cannot run");
        for sb in row.chunks_exact_mut(210) {
            sb[208..].copy_from_slice(&half::f16::ONE.to_le_bytes());
            let mut deq = [0f32; 256];
            dequantize_row(GgmlType::Q6K, sb, &mut deq).unwrap();
            for t in 0..4 {
                let (b0, b1) = (64 * t, 64 * t + 32);
                let mut want = [0f32; 64];
                want[..16].copy_from_slice(&deq[b0..b0 + 16]);
                want[16..32].copy_from_slice(&deq[b1..b1 + 16]);
                want[32..48].copy_from_slice(&deq[b0 + 16..b0 + 32]);
                want[48..].copy_from_slice(&deq[b1 + 16..b1 + 32]);
                for &isa in &isas {
                    let mut got = [0i16; 64];
                    // SAFETY: `isa` is available on this CPU (AVX-512 brings AVX2); `sb` is one
                    // whole 210-byte super-block holding blocks 0..8.
                    unsafe {
                        use crate::linear::simd::{avx2, avx512};
                        use std::arch::x86_64::*;
                        let p = sb.as_ptr();
                        if isa >= Isa::Avx512 {
                            let (lo, hi) = match t {
                                0 => avx512::q6_k_pair::<0>(p),
                                1 => avx512::q6_k_pair::<1>(p),
                                2 => avx512::q6_k_pair::<2>(p),
                                _ => avx512::q6_k_pair::<3>(p),
                            };
                            _mm512_storeu_si512(got.as_mut_ptr() as *mut _, lo);
                            _mm512_storeu_si512(got.as_mut_ptr().add(32) as *mut _, hi);
                        } else {
                            let ((l0, h0), (l1, h1)) = (avx2::q6_k(p, 2 * t), avx2::q6_k(p, 2 * t + 1));
                            for (at, v) in [(0, l0), (16, l1), (32, h0), (48, h1)] {
                                _mm256_storeu_si256(got.as_mut_ptr().add(at) as *mut __m256i, v);
                            }
                        }
                    }
                    assert_eq!(got.map(f32::from), want, "{isa}: blocks {} and {} of {sb:02x?}", 2 * t, 2 * t + 1);
                }
            }
        }
    }
}
