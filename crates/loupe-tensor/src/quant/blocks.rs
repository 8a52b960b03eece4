//! GGML block structs, field for field as ggml declares them.
//!
//! Source of truth: `ggml/src/ggml-common.h` (the `block_*` structs, `QK4_0`..`QK_K`).
//! Every struct is `#[repr(C)]` and its size is asserted against
//! [`GgmlType::type_size`]'s table so a layout slip fails the build.
//!
//! GGUF tensor data is mmapped at whatever alignment the file gives (32 bytes for
//! the data section, but a row of 18-byte Q4_0 blocks puts every other block at an
//! odd address), so blocks are never referenced in place: [`read`] copies one out
//! with `read_unaligned`. All fields are plain integers or `f16`, for which every bit
//! pattern is a valid value, which is what makes that copy sound.
//!
//! Multi-byte fields are little-endian on disk; loupe only builds for little-endian
//! targets (see `quant/mod.rs`), so the native layout is the file layout.

use half::f16;
use std::mem::size_of;

/// Elements per block of the "legacy" quants (ggml's `QK4_0`, `QK4_1`, `QK5_0`,
/// `QK5_1`, `QK8_0`, `QK8_1`).
pub const QK: usize = 32;
/// Elements per super-block of the K-quants (ggml's `QK_K`).
pub const QK_K: usize = 256;
/// Packed 6-bit scales of Q4_K/Q5_K (ggml's `K_SCALE_SIZE`).
pub const K_SCALE_SIZE: usize = 12;

/// `block_q4_0`: `x[i] = d * (q[i] - 8)`; `qs[j]` holds element `j` in its low
/// nibble and element `j + 16` in its high nibble.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockQ4_0 {
    pub d: f16,
    pub qs: [u8; QK / 2],
}

/// `block_q4_1`: `x[i] = d * q[i] + m`; nibble order as Q4_0.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockQ4_1 {
    pub d: f16,
    pub m: f16,
    pub qs: [u8; QK / 2],
}

/// `block_q5_0`: `x[i] = d * (q[i] - 16)`; the 5th bit of element `i` is bit `i` of
/// the little-endian `u32` in `qh`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockQ5_0 {
    pub d: f16,
    pub qh: [u8; 4],
    pub qs: [u8; QK / 2],
}

/// `block_q5_1`: `x[i] = d * q[i] + m`; bits as Q5_0.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockQ5_1 {
    pub d: f16,
    pub m: f16,
    pub qh: [u8; 4],
    pub qs: [u8; QK / 2],
}

/// `block_q8_0`: `x[i] = d * qs[i]`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockQ8_0 {
    pub d: f16,
    pub qs: [i8; QK],
}

/// `block_q8_1`: `x[i] = d * qs[i]`, and `s = d * sum(qs)` precomputed so the
/// dot product with a Q4_1/Q5_1 block can add `m * s` instead of summing again.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockQ8_1 {
    pub d: f16,
    pub s: f16,
    pub qs: [i8; QK],
}

/// `block_q2_K`: 16 sub-blocks of 16; `scales[j]` is a 4-bit scale (low) and a
/// 4-bit min (high); `x = d * sc * q - dmin * m`. Note the scales come first and the
/// f16 pair last, unlike Q4_K.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockQ2K {
    pub scales: [u8; QK_K / 16],
    pub qs: [u8; QK_K / 4],
    pub d: f16,
    pub dmin: f16,
}

/// `block_q3_K`: 2 low bits in `qs`, the high bit in `hmask` (a set bit means no
/// -4 offset), 16 signed 6-bit scales packed in 12 bytes (biased by 32).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockQ3K {
    pub hmask: [u8; QK_K / 8],
    pub qs: [u8; QK_K / 4],
    pub scales: [u8; 12],
    pub d: f16,
}

/// `block_q4_K`: 8 sub-blocks of 32 with 6-bit scales and mins packed in 12 bytes;
/// `x = d * sc * q - dmin * m`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockQ4K {
    pub d: f16,
    pub dmin: f16,
    pub scales: [u8; K_SCALE_SIZE],
    pub qs: [u8; QK_K / 2],
}

/// `block_q5_K`: Q4_K plus one high bit per element in `qh` (bit `j` of `qh[l]`
/// belongs to element `32 * j + l`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockQ5K {
    pub d: f16,
    pub dmin: f16,
    pub scales: [u8; K_SCALE_SIZE],
    pub qh: [u8; QK_K / 8],
    pub qs: [u8; QK_K / 2],
}

/// `block_q6_K`: 4 low bits in `ql`, 2 high bits in `qh`, signed 8-bit scales per 16
/// elements; `x = d * scale * (q - 32)`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockQ6K {
    pub ql: [u8; QK_K / 2],
    pub qh: [u8; QK_K / 4],
    pub scales: [i8; QK_K / 16],
    pub d: f16,
}

/// `block_q8_K`: the activation type of the K-quants. `d` is a full f32 and
/// `bsums[j]` is the sum of `qs[16 j .. 16 j + 16]` (for the mins of Q2_K/Q4_K/Q5_K).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct BlockQ8K {
    pub d: f32,
    pub qs: [i8; QK_K],
    pub bsums: [i16; QK_K / 16],
}

// Sizes must equal ggml's (`static_assert`s in ggml-common.h) and loupe-formats'
// `type_size` table, which the length checks use.
const _: () = assert!(size_of::<BlockQ4_0>() == 18);
const _: () = assert!(size_of::<BlockQ4_1>() == 20);
const _: () = assert!(size_of::<BlockQ5_0>() == 22);
const _: () = assert!(size_of::<BlockQ5_1>() == 24);
const _: () = assert!(size_of::<BlockQ8_0>() == 34);
const _: () = assert!(size_of::<BlockQ8_1>() == 36);
const _: () = assert!(size_of::<BlockQ2K>() == 84);
const _: () = assert!(size_of::<BlockQ3K>() == 110);
const _: () = assert!(size_of::<BlockQ4K>() == 144);
const _: () = assert!(size_of::<BlockQ5K>() == 176);
const _: () = assert!(size_of::<BlockQ6K>() == 210);
const _: () = assert!(size_of::<BlockQ8K>() == 292);

/// A GGML block: plain old data, any bit pattern valid.
///
/// # Safety
/// Implementors must be `#[repr(C)]`, contain only integer / `f16` / `f32` fields
/// (every bit pattern valid), and have no padding, so that copying `size_of::<Self>()`
/// arbitrary bytes into one is sound and copying one out yields exactly its bytes.
pub unsafe trait Block: Copy + 'static {
    const SIZE: usize = size_of::<Self>();
}

unsafe impl Block for BlockQ4_0 {}
unsafe impl Block for BlockQ4_1 {}
unsafe impl Block for BlockQ5_0 {}
unsafe impl Block for BlockQ5_1 {}
unsafe impl Block for BlockQ8_0 {}
unsafe impl Block for BlockQ8_1 {}
unsafe impl Block for BlockQ2K {}
unsafe impl Block for BlockQ3K {}
unsafe impl Block for BlockQ4K {}
unsafe impl Block for BlockQ5K {}
unsafe impl Block for BlockQ6K {}
unsafe impl Block for BlockQ8K {}

/// Block `i` of a byte row, copied out (the row may sit at any alignment).
///
/// Panics if the row is too short for block `i`.
#[inline(always)]
pub fn read<B: Block>(row: &[u8], i: usize) -> B {
    let bytes = &row[i * B::SIZE..(i + 1) * B::SIZE];
    // SAFETY: `bytes` is exactly `size_of::<B>()` readable bytes (slice indexing
    // above checked it) and `B: Block` accepts any bit pattern.
    unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<B>()) }
}

/// Stores `block` as block `i` of a byte row.
#[inline(always)]
pub fn write<B: Block>(row: &mut [u8], i: usize, block: &B) {
    let bytes = &mut row[i * B::SIZE..(i + 1) * B::SIZE];
    // SAFETY: `bytes` is exactly `size_of::<B>()` writable bytes, and `B` has no
    // padding (see `Block`), so every byte written is initialized.
    unsafe { std::ptr::write_unaligned(bytes.as_mut_ptr().cast::<B>(), *block) }
}

/// The bytes of a slice of blocks (for tests and writers that build blocks by value).
pub fn as_bytes<B: Block>(blocks: &[B]) -> &[u8] {
    // SAFETY: `B` has no padding and alignment >= 1, so its storage is
    // `len * SIZE` initialized bytes.
    unsafe { std::slice::from_raw_parts(blocks.as_ptr().cast::<u8>(), std::mem::size_of_val(blocks)) }
}

/// Unpacks the 8 six-bit scales and 8 six-bit mins of a Q4_K/Q5_K block
/// (ggml's `get_scale_min_k4`): bytes 0-3 hold scales 0-3 (low 6 bits), bytes 4-7
/// mins 0-3; scales/mins 4-7 keep their low 4 bits in bytes 8-11 (low/high nibble)
/// and their top 2 bits in the spare top bits of bytes 0-3 / 4-7.
#[inline(always)]
pub fn scale_min_k4(scales: &[u8; K_SCALE_SIZE]) -> ([u8; 8], [u8; 8]) {
    let mut sc = [0u8; 8];
    let mut mn = [0u8; 8];
    for j in 0..4 {
        sc[j] = scales[j] & 63;
        mn[j] = scales[j + 4] & 63;
        sc[j + 4] = (scales[j + 8] & 0x0F) | ((scales[j] >> 6) << 4);
        mn[j + 4] = (scales[j + 8] >> 4) | ((scales[j + 4] >> 6) << 4);
    }
    (sc, mn)
}

/// [`scale_min_k4`] four bytes at a time (ggml's `kmask` form in its AVX2 `vec_dot_q4_K`):
/// the little-endian words of `[sc0..4, sc4..8, m0..4, m4..8]`, the same 16 bytes. The
/// byte-wise helper compiles to ~90 scalar instructions per super-block; this to a dozen.
#[inline(always)]
pub fn scale_min_k4_words(scales: &[u8; K_SCALE_SIZE]) -> [u32; 4] {
    const LOW6: u32 = 0x3F3F_3F3F;
    const LOW4: u32 = 0x0F0F_0F0F;
    const LOW2: u32 = 0x0303_0303;
    let word = |i: usize| u32::from_le_bytes([scales[4 * i], scales[4 * i + 1], scales[4 * i + 2], scales[4 * i + 3]]);
    let (a, b, c) = (word(0), word(1), word(2));
    // Scales / mins 4-7: low 4 bits from the low / high nibbles of bytes 8-11, top 2 bits
    // from the top of bytes 0-3 / 4-7.
    let scales_hi = (c & LOW4) | (((a >> 6) & LOW2) << 4);
    let mins_hi = ((c >> 4) & LOW4) | (((b >> 6) & LOW2) << 4);
    [a & LOW6, scales_hi, b & LOW6, mins_hi]
}

/// Unpacks the 16 six-bit scales of a Q3_K block, still biased by 32 (ggml's
/// `dequantize_row_q3_K` aux shuffle): scale `i` has its low 4 bits in nibble
/// `i / 8` of byte `i % 8` and its top 2 bits at bit `2 * (i / 4)` of byte `8 + i % 4`.
#[inline(always)]
pub fn scales_q3k(scales: &[u8; 12]) -> [i8; 16] {
    let mut out = [0i8; 16];
    for (i, o) in out.iter_mut().enumerate() {
        let low = (scales[i % 8] >> (4 * (i / 8))) & 0x0F;
        let high = (scales[8 + i % 4] >> (2 * (i / 4))) & 0x03;
        *o = ((low | (high << 4)) as i8) - 32;
    }
    out
}
