//! The block geometry of the types the Act16 kernels take (Q4_1, Q8_0, Q5_0, Q6_K, Q4_K, Q4_0,
//! Q5_K),
//! as `const` kind codes the SIMD kernels are generic over: where a 32-element block's
//! bytes and scale sit inside a weight row, and whether the type has an offset term.
//! ISA-neutral: every kernel family reads it.

use crate::GgmlType;

/// The block formats of the AVX2 Act16 kernels, as a const parameter (`KIND`).
pub(crate) const Q4_1: u8 = 0;

pub(crate) const Q8_0: u8 = 1;

pub(crate) const Q5_0: u8 = 2;

pub(crate) const Q6_K: u8 = 3;

pub(crate) const Q4_K: u8 = 4;

pub(crate) const Q4_0: u8 = 5;

pub(crate) const Q5_K: u8 = 6;

/// Whether `KIND` adds an offset term (`m * sum` per block, Q4_1, Q4_K and Q5_K).
#[inline(always)]
pub(crate) const fn has_offset(kind: u8) -> bool {
    kind == Q4_1 || kind == Q4_K || kind == Q5_K
}

/// Whether `KIND` is a K type of 256-element super-blocks (8 Act16 blocks each), which the
/// kernels walk a super-block at a time.
#[inline(always)]
pub(crate) const fn is_k(kind: u8) -> bool {
    kind == Q6_K || kind == Q4_K || kind == Q5_K
}

/// Whether `KIND` scales each 32-element sub-block by its super-block's 6-bit scale and min,
/// `d' = d * sc` and `m' = -(dmin * m)` (Q4_K and Q5_K: the same 16-byte head).
#[inline(always)]
pub(crate) const fn has_k_scales(kind: u8) -> bool {
    kind == Q4_K || kind == Q5_K
}

/// Q4_K / Q5_K: bytes per super-block (`d`, `dmin` and the 6-bit scales and mins first,
/// the same 16 bytes in both, then Q5_K's fifth bits and the nibbles).
#[inline(always)]
pub(crate) const fn k_super_bytes(kind: u8) -> usize {
    if kind == Q5_K {
        176
    } else {
        144
    }
}

/// The `KIND` of `ty` if the Act16 kernels (one-row, GEMV, batch-invariant) take it: the one
/// list of those types. A type added here needs its arms in every `match` on a kind below
/// and in the kernels' unpackers (ARCHITECTURE.md, "Add a weight type's kernel").
pub(crate) fn act16_kind(ty: GgmlType) -> Option<u8> {
    match ty {
        GgmlType::Q4_1 => Some(Q4_1),
        GgmlType::Q8_0 => Some(Q8_0),
        GgmlType::Q5_0 => Some(Q5_0),
        GgmlType::Q6K => Some(Q6_K),
        GgmlType::Q4K => Some(Q4_K),
        GgmlType::Q4_0 => Some(Q4_0),
        GgmlType::Q5K => Some(Q5_K),
        _ => None,
    }
}

/// The `KIND` of a type the caller has routed to the Act16 kernels ([`act16_kind`] is
/// `Some`); other types read as Q8_0, which no caller passes.
pub(crate) fn kind(ty: GgmlType) -> u8 {
    act16_kind(ty).unwrap_or(Q8_0)
}

/// Bytes per 32-element block of `KIND` (Q6_K: 26, its 210 bytes per 256 elements
/// rounded down; only the prefetch distance uses it there, see [`block_at`]; Q5_K: 176 / 8).
#[inline(always)]
pub(crate) const fn block_bytes(kind: u8) -> usize {
    match kind {
        Q4_1 => 20,
        Q5_0 | Q5_K => 22,
        Q6_K => 26,
        Q4_K | Q4_0 => 18,
        _ => 34,
    }
}

/// Byte offset in a row of `KIND` of 32-element block `b`'s data (Q6_K: of the
/// 1/8 of its super-block it falls at, for prefetching).
#[inline(always)]
pub(crate) const fn block_at(kind: u8, b: usize) -> usize {
    match kind {
        Q6_K => b * 210 / 8,
        _ => b * block_bytes(kind),
    }
}

/// Byte offset in a row of `KIND` of the f16 `d` that scales 32-element block `b`
/// (Q6_K: its super-block's, at byte 208).
#[inline(always)]
pub(crate) const fn d_at(kind: u8, b: usize) -> usize {
    match kind {
        Q6_K => b / 8 * 210 + 208,
        Q5_K => b / 8 * 176,
        _ => b * block_bytes(kind),
    }
}
