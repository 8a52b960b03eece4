//! What the AVX-512 kernels of every layer share: the 16-lane horizontal sum in a fixed
//! order, two Act16 blocks unpacked into one 512-bit vector pair with the AVX2
//! arithmetic's bits (Q4_1 on AMX CPUs, Q5_0, Q4_0; Q6_K's [`q6_k_pair`]), and the panel packers' gather of one dword
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

/// One block pair's step of the pairs kernels: the exact i32 lanes of blocks `b` (low half)
/// and `b + 1` (high half) from the weights `w` and activations `x` unpacked alike, converted and
/// FMA'd with `[*s0; 8] ++ [*s1; 8]` (each block's `d * scale`) into `acc`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
pub(crate) unsafe fn pair_fma(
    acc: __m512,
    w: (__m512i, __m512i),
    x: (__m512i, __m512i),
    s0: *const f32,
    s1: *const f32,
) -> __m512 {
    let dot = _mm512_add_epi32(_mm512_madd_epi16(w.0, x.0), _mm512_madd_epi16(w.1, x.1));
    let scale = _mm512_mask_broadcastss_ps(_mm512_set1_ps(*s0), 0xFF00, _mm_load_ss(s1));
    _mm512_fmadd_ps(scale, _mm512_cvtepi32_ps(dot), acc)
}

/// The activations of blocks `b` and `b + 1` at `at` (64 in a row) as the pairs kernels take
/// them: `[x_b 0..16 | x_b+1 0..16]` and `[x_b 16..32 | x_b+1 16..32]`.
#[inline]
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn pair_acts(at: *const i16) -> (__m512i, __m512i) {
    let (xa, xb) = (_mm512_loadu_si512(at as *const _), _mm512_loadu_si512(at.add(32) as *const _));
    (_mm512_shuffle_i64x2::<0x44>(xa, xb), _mm512_shuffle_i64x2::<0xEE>(xa, xb))
}

/// Q6_K's blocks `b = 8 s + 2 T` and `b + 1` of the super-block at `sb` as the AVX2 kernel's
/// vectors of each (`simd::avx2::q6_k`), joined as [`unpack_pair`] joins them: words 0..16 of
/// the first result are block `b`'s elements 0..16 as `(q - 32) * scale` and words 16..32
/// block `b + 1`'s; the second holds elements 16..32 alike. The same exact i16 values, so the
/// same `vpmaddwd` lanes, from one unpacking of both blocks in place of two.
///
/// Both blocks take their low 4 bits from nibble `T % 2` of `ql[64 h..][..64]` (`h = T / 2`:
/// block `b` the first 32 bytes, `b + 1` the next) and their top 2 from the same 32 bytes
/// `qh[32 h..]`, bits `4 (T % 2)` and `4 (T % 2) + 2`: each 128-bit half of a vector below
/// holds one block (elements 0..16 or 16..32), so one variable shift per half brings each
/// block's bit pair to bits 4-5 (16-bit shifts move bits across the byte boundary only into
/// bits the mask clears). The four sub-block scales are `scales[8 h + 4 (T % 2)..][..4]`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx2")]
pub(crate) unsafe fn q6_k_pair<const T: usize>(sb: *const u8) -> (__m512i, __m512i) {
    let (h, nib) = (T / 2, T % 2);
    let halves = |a: *const u8, b: *const u8| {
        _mm256_inserti128_si256::<1>(
            _mm256_castsi128_si256(_mm_loadu_si128(a as *const __m128i)),
            _mm_loadu_si128(b as *const __m128i),
        )
    };
    let ql = sb.add(64 * h);
    let (mut lo, mut hi) = (halves(ql, ql.add(32)), halves(ql.add(16), ql.add(48)));
    if nib == 1 {
        lo = _mm256_srli_epi16::<4>(lo);
        hi = _mm256_srli_epi16::<4>(hi);
    }
    let qh = sb.add(128 + 32 * h);
    let (hlo, hhi) = (
        _mm256_broadcastsi128_si256(_mm_loadu_si128(qh as *const __m128i)),
        _mm256_broadcastsi128_si256(_mm_loadu_si128(qh.add(16) as *const __m128i)),
    );
    // Bits 2j, 2j + 1 (block b, j = 2 nib, the low half) and 2j + 2, 2j + 3 (block b + 1, the
    // high half) to bits 4, 5.
    let top = |v: __m256i| {
        if nib == 0 {
            _mm256_sllv_epi16(v, _mm256_setr_epi16(4, 4, 4, 4, 4, 4, 4, 4, 2, 2, 2, 2, 2, 2, 2, 2))
        } else {
            _mm256_srlv_epi16(v, _mm256_setr_epi16(0, 0, 0, 0, 0, 0, 0, 0, 2, 2, 2, 2, 2, 2, 2, 2))
        }
    };
    let (low4, top2, bias) = (_mm256_set1_epi8(0x0F), _mm256_set1_epi8(0x30), _mm256_set1_epi8(32));
    // low | (top & 0x30) (`vpternlogd`: A | (B & C)), minus 32: codes -32..=31.
    let code = |l: __m256i, t: __m256i| {
        _mm256_sub_epi8(_mm256_ternarylogic_epi32::<0xF8>(_mm256_and_si256(l, low4), t, top2), bias)
    };
    let (clo, chi) = (code(lo, top(hlo)), code(hi, top(hhi)));
    // Words s0..s16 of the super-block's scales; block b's halves take scales 8h + 2j and
    // 8h + 2j + 1, block b + 1's the next two.
    let sc = _mm512_castsi256_si512(_mm256_cvtepi8_epi16(_mm_loadu_si128(sb.add(192) as *const __m128i)));
    let s = (8 * h + 4 * nib) as i16;
    let pick = |a: i16, b: i16| {
        _mm512_permutexvar_epi16(
            _mm512_set_epi16(
                b, b, b, b, b, b, b, b, b, b, b, b, b, b, b, b, a, a, a, a, a, a, a, a, a, a, a, a, a, a, a, a,
            ),
            sc,
        )
    };
    (
        _mm512_mullo_epi16(_mm512_cvtepi8_epi16(clo), pick(s, s + 2)),
        _mm512_mullo_epi16(_mm512_cvtepi8_epi16(chi), pick(s + 1, s + 3)),
    )
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
