//! What the AVX-512 kernels of every layer share: the 16-lane horizontal sum in a fixed
//! order, two Act16 blocks unpacked into one 512-bit vector pair with the AVX2
//! arithmetic's bits (Q4_1 on AMX CPUs, Q5_0, Q4_0), and the panel packers' gather of one dword
//! from each of 16 weight rows.

use std::arch::x86_64::*;

use crate::linear::kinds::*;
pub(crate) use crate::reduce::avx512::hsum;

/// A pair of consecutive Q4_1, Q5_0 or Q4_0 blocks at `blk` as the AVX2 kernel's two vectors
/// of each, joined: words 0..16 of the first result are block `b`'s elements 0..16 and
/// words 16..32 block `b + 1`'s; the second result holds elements 16..32 alike. The
/// qs bytes widened to words give the low nibbles (elements 0..16) and high ones
/// (16..32); for Q5_0, where an element's fifth bit (bit `j` of its block's `qh`) is
/// clear, 16 is subtracted (`(nibble | bit << 4) - 16`, ggml's `dequantize_row_q5_0`); for
/// Q4_0, 8 from every one (`nibble - 8`).
/// Used by this module's [`tile_pairs`] and the decode GEMV's `group_avx512_pairs`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2")]
pub(crate) unsafe fn unpack_pair<const KIND: u8>(blk: *const u8) -> (__m512i, __m512i) {
    let (bytes, qs) = (
        block_bytes(KIND),
        match KIND {
            Q4_1 => 4,
            Q4_0 => 2,
            _ => 6,
        },
    );
    let nxt = blk.add(bytes);
    let both = _mm256_inserti128_si256::<1>(
        _mm256_castsi128_si256(_mm_loadu_si128(blk.add(qs) as *const __m128i)),
        _mm_loadu_si128(nxt.add(qs) as *const __m128i),
    );
    let w16 = _mm512_cvtepu8_epi16(both);
    let (lo, hi) = (_mm512_and_si512(w16, _mm512_set1_epi16(0x0F)), _mm512_srli_epi16::<4>(w16));
    if KIND == Q4_1 {
        return (lo, hi);
    }
    if KIND == Q4_0 {
        let eight = _mm512_set1_epi16(8);
        return (_mm512_sub_epi16(lo, eight), _mm512_sub_epi16(hi, eight));
    }
    let qh = |blk: *const u8| std::ptr::read_unaligned(blk.add(2) as *const u32);
    let (h0, h1) = (qh(blk), qh(nxt));
    // Bit j of a mask: word j's element has its fifth bit clear.
    let clear_lo: __mmask32 = !((h0 & 0xFFFF) | (h1 << 16));
    let clear_hi: __mmask32 = !((h0 >> 16) | (h1 & 0xFFFF_0000));
    let sixteen = _mm512_set1_epi16(16);
    (_mm512_mask_sub_epi16(lo, clear_lo, lo, sixteen), _mm512_mask_sub_epi16(hi, clear_hi, hi, sixteen))
}

/// The panel packers' gather (`qpanel`, `prompt16`): the dword at the same offset of each of
/// up to 16 weight rows `row_bytes` apart, row `r` in lane `r`; lanes of missing rows are 0
/// and their addresses are not read.
#[derive(Clone, Copy)]
pub(crate) struct RowGather {
    /// One bit per row present.
    pub(crate) mask: __mmask16,
    /// Row `r`'s offset (`r * row_bytes`) in lane `r`.
    offsets: __m512i,
}

impl RowGather {
    /// For `cols <= 16` rows of `row_bytes` each; `16 * row_bytes` must fit an i32.
    #[inline]
    #[target_feature(enable = "avx512f")]
    pub(crate) unsafe fn new(row_bytes: usize, cols: usize) -> RowGather {
        let offsets = _mm512_mullo_epi32(
            _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
            _mm512_set1_epi32(row_bytes as i32),
        );
        RowGather { mask: ((1u32 << cols) - 1) as __mmask16, offsets }
    }

    /// The dword at `at` in the first row and at the same offset in the others.
    ///
    /// # Safety
    /// Each present row's 4 bytes at that offset are readable; the CPU has AVX-512 F.
    #[inline]
    #[target_feature(enable = "avx512f")]
    pub(crate) unsafe fn at(self, at: *const u8) -> __m512i {
        _mm512_mask_i32gather_epi32::<1>(_mm512_setzero_si512(), self.mask, self.offsets, at.cast())
    }
}
