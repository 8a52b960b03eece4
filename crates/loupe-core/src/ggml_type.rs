//! GGML tensor element types as stored in GGUF files.
//!
//! Type ids and block geometry follow ggml's `enum ggml_type` and `ggml_type_traits`
//! (ggml/include/ggml.h, ggml/src/ggml.c). A "block" is the unit of quantization:
//! `block_size` elements stored in `type_size` bytes.

/// An element type of a GGUF tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum GgmlType {
    F32,
    F16,
    BF16,
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q8_1,
    Q2K,
    Q3K,
    Q4K,
    Q5K,
    Q6K,
    Q8K,
    /// OCP microscaling FP4 (gpt-oss's weights): blocks of 32 E2M1 values sharing an E8M0
    /// power-of-two scale (ggml's `block_mxfp4`: 1 exponent byte + 16 nibble bytes).
    Mxfp4,
    /// NVIDIA FP4 as ggml stores it (`block_nvfp4`, type 40): blocks of 64 E2M1 values in four
    /// sub-blocks of 16, each with an unsigned E4M3 ("UE4M3") scale byte; 4 scale bytes + 32
    /// nibble bytes. NVFP4's second level, a per-tensor f32 scale, is not in the block: GGUF
    /// files carry it as a sidecar tensor `<name>.scale` (llama.cpp's convention).
    Nvfp4,
    /// FP8 E4M3 (OCP `e4m3fn`) weights in blocks of 32 sharing an f16 scale: 2 bytes `d` +
    /// 32 E4M3 codes, value `d * e4m3(q)`, the `Q8_0`-shaped layout llama.cpp PR #25336
    /// proposes. **Not a ggml type** (ggml has no FP8 type yet): loupe writes and reads it
    /// under [`FP8_E4M3_TYPE_ID`], outside ggml's range, so other GGUF readers refuse such
    /// a file ("invalid ggml type") instead of misreading it.
    Fp8E4M3,
}

/// The on-disk id loupe gives [`GgmlType::Fp8E4M3`]: far past ggml's last type (40 in
/// 2026), so it can never collide with an id ggml assigns later.
pub const FP8_E4M3_TYPE_ID: u32 = 1000;

/// Elements per super-block of the K-quants (ggml's `QK_K`).
pub const QK_K: usize = 256;

impl GgmlType {
    /// Every type loupe can read, in id order.
    pub const ALL: [GgmlType; 18] = [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
        GgmlType::Q8_1,
        GgmlType::Q2K,
        GgmlType::Q3K,
        GgmlType::Q4K,
        GgmlType::Q5K,
        GgmlType::Q6K,
        GgmlType::Q8K,
        GgmlType::BF16,
        GgmlType::Mxfp4,
        GgmlType::Nvfp4,
        GgmlType::Fp8E4M3,
    ];

    /// The id used on disk (`ggml_type`).
    pub fn id(self) -> u32 {
        match self {
            GgmlType::F32 => 0,
            GgmlType::F16 => 1,
            GgmlType::Q4_0 => 2,
            GgmlType::Q4_1 => 3,
            GgmlType::Q5_0 => 6,
            GgmlType::Q5_1 => 7,
            GgmlType::Q8_0 => 8,
            GgmlType::Q8_1 => 9,
            GgmlType::Q2K => 10,
            GgmlType::Q3K => 11,
            GgmlType::Q4K => 12,
            GgmlType::Q5K => 13,
            GgmlType::Q6K => 14,
            GgmlType::Q8K => 15,
            GgmlType::BF16 => 30,
            GgmlType::Mxfp4 => 39,
            GgmlType::Nvfp4 => 40,
            GgmlType::Fp8E4M3 => FP8_E4M3_TYPE_ID,
        }
    }

    /// The type for an on-disk id, or `None` for ids loupe does not support
    /// (removed types 4/5, the IQ family, ternary types...).
    pub fn from_id(id: u32) -> Option<GgmlType> {
        GgmlType::ALL.iter().copied().find(|t| t.id() == id)
    }

    /// ggml's name for the type (`q4_1`, `q4_K`, ...), as `gguf-dump` prints it.
    pub fn name(self) -> &'static str {
        match self {
            GgmlType::F32 => "f32",
            GgmlType::F16 => "f16",
            GgmlType::BF16 => "bf16",
            GgmlType::Q4_0 => "q4_0",
            GgmlType::Q4_1 => "q4_1",
            GgmlType::Q5_0 => "q5_0",
            GgmlType::Q5_1 => "q5_1",
            GgmlType::Q8_0 => "q8_0",
            GgmlType::Q8_1 => "q8_1",
            GgmlType::Q2K => "q2_K",
            GgmlType::Q3K => "q3_K",
            GgmlType::Q4K => "q4_K",
            GgmlType::Q5K => "q5_K",
            GgmlType::Q6K => "q6_K",
            GgmlType::Q8K => "q8_K",
            GgmlType::Mxfp4 => "mxfp4",
            GgmlType::Nvfp4 => "nvfp4",
            GgmlType::Fp8E4M3 => "fp8_e4m3",
        }
    }

    /// Elements per block.
    pub fn block_size(self) -> usize {
        match self {
            GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => 1,
            GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q5_0 | GgmlType::Q5_1 => 32,
            GgmlType::Q8_0 | GgmlType::Q8_1 | GgmlType::Mxfp4 | GgmlType::Fp8E4M3 => 32,
            GgmlType::Q2K | GgmlType::Q3K | GgmlType::Q4K | GgmlType::Q5K => QK_K,
            GgmlType::Q6K | GgmlType::Q8K => QK_K,
            GgmlType::Nvfp4 => 64,
        }
    }

    /// Bytes per block (sizes of ggml's `block_*` structs).
    pub fn type_size(self) -> usize {
        match self {
            GgmlType::F32 => 4,
            GgmlType::F16 | GgmlType::BF16 => 2,
            GgmlType::Q4_0 => 18,    // f16 d + 16 nibble bytes
            GgmlType::Q4_1 => 20,    // f16 d, f16 m + 16
            GgmlType::Q5_0 => 22,    // f16 d + 4 (qh) + 16
            GgmlType::Q5_1 => 24,    // f16 d, f16 m + 4 + 16
            GgmlType::Q8_0 => 34,    // f16 d + 32
            GgmlType::Q8_1 => 36,    // f16 d, f16 s + 32
            GgmlType::Q2K => 84,     // 16 scales + 64 qs + 2*f16
            GgmlType::Q3K => 110,    // 32 hmask + 64 qs + 12 scales + f16
            GgmlType::Q4K => 144,    // 2*f16 + 12 scales + 128 qs
            GgmlType::Q5K => 176,    // 2*f16 + 12 scales + 32 qh + 128 qs
            GgmlType::Q6K => 210,    // 128 ql + 64 qh + 16 scales + f16
            GgmlType::Q8K => 292,    // f32 d + 256 qs + 16*i16 bsums
            GgmlType::Mxfp4 => 17,   // u8 e (E8M0) + 16 nibble bytes
            GgmlType::Nvfp4 => 36,   // 4 UE4M3 sub-block scales + 32 nibble bytes
            GgmlType::Fp8E4M3 => 34, // f16 d + 32 E4M3 codes
        }
    }

    /// Whether the type is a block-quantized type (as opposed to a float type).
    pub fn is_quantized(self) -> bool {
        !matches!(self, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16)
    }

    /// Bytes needed for `n_elements` elements, or `None` when `n_elements` is not a
    /// multiple of the block size or the size overflows.
    pub fn bytes_for(self, n_elements: u64) -> Option<u64> {
        let bs = self.block_size() as u64;
        if !n_elements.is_multiple_of(bs) {
            return None;
        }
        (n_elements / bs).checked_mul(self.type_size() as u64)
    }
}

impl std::fmt::Display for GgmlType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip() {
        for t in GgmlType::ALL {
            assert_eq!(GgmlType::from_id(t.id()), Some(t));
        }
        assert_eq!(GgmlType::from_id(4), None);
        assert_eq!(GgmlType::from_id(u32::MAX), None);
    }

    #[test]
    fn bytes_for_checks_block_multiple_and_overflow() {
        assert_eq!(GgmlType::Q4_1.bytes_for(64), Some(40));
        assert_eq!(GgmlType::Q4_1.bytes_for(33), None);
        assert_eq!(GgmlType::F32.bytes_for(u64::MAX), None);
    }
}
