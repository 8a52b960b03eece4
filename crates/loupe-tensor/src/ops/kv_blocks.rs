//! [`KvBlocks`]: a layer's cached keys or values as the attention kernels read them (f32, f16
//! or FP8 rows), contiguous or paged, and the widening of narrow rows to f32.

use half::f16;

/// Largest head dimension the kernel converts on the stack.
pub const MAX_HEAD_DIM: usize = 512;

/// One layer's cached keys or values, read-only.
#[derive(Debug, Clone, Copy)]
pub enum KvBlocks<'a> {
    F32(&'a [f32]),
    F16(&'a [f16]),
    /// FP8 E4M3 codes; element `i` is `decode(codes[i]) · scales[i / group]`, one guarded
    /// scale per `group` consecutive elements of a cached row ([`crate::fp8::quantize_rows_e4m3`];
    /// groups never cross rows).
    Fp8 {
        codes: &'a [u8],
        scales: &'a [f32],
        group: usize,
    },
}

/// One layer's cached keys or values, for writing.
#[derive(Debug)]
pub enum KvBlocksMut<'a> {
    F32(&'a mut [f32]),
    F16(&'a mut [f16]),
    /// As [`KvBlocks::Fp8`].
    Fp8 {
        codes: &'a mut [u8],
        scales: &'a mut [f32],
        group: usize,
    },
}

impl KvBlocks<'_> {
    pub fn len(&self) -> usize {
        match self {
            KvBlocks::F32(d) => d.len(),
            KvBlocks::F16(d) => d.len(),
            KvBlocks::Fp8 { codes, .. } => codes.len(),
        }
    }

    /// Whether rows are narrower than f32 (widened on the way into the kernels).
    pub fn is_narrow(&self) -> bool {
        !matches!(self, KvBlocks::F32(_))
    }

    /// Widens elements `start..start + out.len()` into `out` (exact for f16; FP8 codes
    /// times their row's scale).
    pub fn widen_into(&self, start: usize, out: &mut [f32]) {
        let n = out.len();
        match self {
            KvBlocks::F32(d) => out.copy_from_slice(&d[start..start + n]),
            KvBlocks::F16(d) => crate::f16_rows::widen_into(&d[start..start + n], out),
            KvBlocks::Fp8 { codes, scales, group } => {
                // Group by group: a range may cross groups, each with its own scale.
                let mut i = 0;
                while i < n {
                    let at = start + i;
                    let end = ((at / group + 1) * group).min(start + n);
                    crate::fp8::dequantize_e4m3(&codes[at..end], scales[at / group], &mut out[i..end - start]);
                    i = end - start;
                }
            }
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The rows widened to f32, for taps and tests.
    pub fn to_f32_vec(&self) -> Vec<f32> {
        let mut out = vec![0.0; self.len()];
        self.widen_into(0, &mut out);
        out
    }
}
