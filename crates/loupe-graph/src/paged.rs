//! The paged KV cache of the batched engine: per attention layer, `n_blocks` blocks of
//! `block_size` positions, keys and values stored as f16 (default), f32 or FP8 E4M3 with a
//! scale per 32 elements. A block id
//! names the same block in every layer, so a sequence's one block table serves all its
//! layers, and allocating, sharing or freeing a block does so for every layer together.
//! Which blocks a sequence owns is the runtime's business (its block manager); this type
//! only stores rows and hands the kernels views of them.

use std::fmt;
use std::str::FromStr;

use half::slice::HalfBitsSliceExt;
use loupe_tensor::ops::{write_paged, KvBlocks, KvBlocksMut};
use loupe_tensor::TensorError;

/// Element type of the paged cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub enum KvDtype {
    /// Half the memory of f32, so twice the sequences per budget; keys and values rounded
    /// to nearest even (relative error under 2^-11, well below Q4 weight noise).
    #[default]
    F16,
    F32,
    /// FP8 E4M3 with one guarded f32 scale per group of [`KvDtype::fp8_group`] (32)
    /// elements of a cached row: 1.125 bytes per element. Rows are quantized as they are
    /// written and widened to f32 as attention reads them ([`loupe_tensor::fp8`]).
    /// Teacher-forced argmax agreement with the transformers goldens on SmolLM2 f32: 96.1%
    /// (one scale per whole row: 95.7%; f16 or f32 rows: 100%), the cost of E4M3's 3
    /// mantissa bits (tests/native_agreement.rs).
    Fp8E4M3,
}

impl KvDtype {
    /// Bytes of one element (FP8: without its row's scale; see [`KvDtype::row_bytes`]).
    pub fn bytes(self) -> usize {
        match self {
            KvDtype::F16 => 2,
            KvDtype::F32 => 4,
            KvDtype::Fp8E4M3 => 1,
        }
    }

    /// Bytes of one cached row of `width` elements, scales included.
    pub fn row_bytes(self, width: usize) -> usize {
        match self {
            KvDtype::Fp8E4M3 => width + 4 * (width / KvDtype::fp8_group(width)),
            other => width * other.bytes(),
        }
    }

    /// Elements per FP8 scale in rows of `width`: 32 (as MX formats group), or the largest
    /// of 16 and 8 that divides the row, else the whole row.
    pub fn fp8_group(width: usize) -> usize {
        [32, 16, 8].into_iter().find(|g| width.is_multiple_of(*g)).unwrap_or(width.max(1))
    }

    pub fn name(self) -> &'static str {
        match self {
            KvDtype::F16 => "f16",
            KvDtype::F32 => "f32",
            KvDtype::Fp8E4M3 => "fp8_e4m3",
        }
    }
}

impl fmt::Display for KvDtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for KvDtype {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "f16" => Ok(KvDtype::F16),
            "f32" => Ok(KvDtype::F32),
            "fp8_e4m3" | "fp8" => Ok(KvDtype::Fp8E4M3),
            other => Err(format!("unknown KV cache dtype '{other}' (expected f16, f32 or fp8_e4m3)")),
        }
    }
}

#[derive(Debug)]
enum Store {
    F32(Vec<f32>),
    /// f16 bit patterns: a `vec![0u16; n]` is allocated zeroed by the OS (pages mapped on
    /// first write), where `vec![f16::ZERO; n]` would touch every page up front.
    F16(Vec<u16>),
    /// E4M3 codes and one scale per `group` elements.
    Fp8 {
        codes: Vec<u8>,
        scales: Vec<f32>,
        group: usize,
    },
}

impl Store {
    fn zeros(dtype: KvDtype, len: usize, width: usize) -> Store {
        match dtype {
            KvDtype::F32 => Store::F32(vec![0.0; len]),
            KvDtype::F16 => Store::F16(vec![0u16; len]),
            KvDtype::Fp8E4M3 => {
                let group = KvDtype::fp8_group(width);
                Store::Fp8 { codes: vec![0u8; len], scales: vec![0.0; len / group], group }
            }
        }
    }

    fn view(&self) -> KvBlocks<'_> {
        match self {
            Store::F32(d) => KvBlocks::F32(d),
            Store::F16(d) => KvBlocks::F16(d.reinterpret_cast()),
            Store::Fp8 { codes, scales, group } => KvBlocks::Fp8 { codes, scales, group: *group },
        }
    }

    fn view_mut(&mut self) -> KvBlocksMut<'_> {
        match self {
            Store::F32(d) => KvBlocksMut::F32(d),
            Store::F16(d) => KvBlocksMut::F16(d.reinterpret_cast_mut()),
            Store::Fp8 { codes, scales, group } => KvBlocksMut::Fp8 { codes, scales, group: *group },
        }
    }
}

/// Keys and values of every layer, in blocks.
#[derive(Debug)]
pub struct PagedKvCache {
    dtype: KvDtype,
    block_size: usize,
    width: usize,
    n_blocks: usize,
    keys: Vec<Store>,
    values: Vec<Store>,
}

impl PagedKvCache {
    /// Bytes one block takes across all layers (keys and values).
    pub fn bytes_per_block(layers: usize, width: usize, block_size: usize, dtype: KvDtype) -> usize {
        layers.saturating_mul(2).saturating_mul(block_size).saturating_mul(dtype.row_bytes(width))
    }

    /// A cache of `n_blocks` blocks for `layers` layers of rows `width` wide. The memory is
    /// requested zeroed, so the OS maps pages only as blocks are first written.
    pub fn new(layers: usize, width: usize, block_size: usize, n_blocks: usize, dtype: KvDtype) -> PagedKvCache {
        let len = n_blocks * block_size * width;
        PagedKvCache {
            dtype,
            block_size,
            width,
            n_blocks,
            keys: (0..layers).map(|_| Store::zeros(dtype, len, width)).collect(),
            values: (0..layers).map(|_| Store::zeros(dtype, len, width)).collect(),
        }
    }

    pub fn dtype(&self) -> KvDtype {
        self.dtype
    }

    pub fn block_size(&self) -> usize {
        self.block_size
    }

    pub fn n_blocks(&self) -> usize {
        self.n_blocks
    }

    pub fn width(&self) -> usize {
        self.width
    }

    pub fn layers(&self) -> usize {
        self.keys.len()
    }

    /// Writes keys and values of positions `past..past + rows` of a sequence into its blocks.
    pub fn write(
        &mut self,
        layer: usize,
        blocks: &[u32],
        past: usize,
        k: &[f32],
        v: &[f32],
    ) -> Result<(), TensorError> {
        let (width, bs) = (self.width, self.block_size);
        let (Some(keys), Some(values)) = (self.keys.get_mut(layer), self.values.get_mut(layer)) else {
            return Err(TensorError::Shape {
                op: "kv write",
                detail: format!("layer {layer} of a {}-layer cache", self.keys.len()),
            });
        };
        write_paged(&mut keys.view_mut(), width, bs, blocks, past, k)?;
        write_paged(&mut values.view_mut(), width, bs, blocks, past, v)
    }

    /// One layer's keys and values, for the attention kernel.
    pub fn layer(&self, layer: usize) -> Option<(KvBlocks<'_>, KvBlocks<'_>)> {
        Some((self.keys.get(layer)?.view(), self.values.get(layer)?.view()))
    }

    /// Bytes [`PagedKvCache::read_block`] writes for one block: every layer's keys and values.
    pub fn block_bytes(&self) -> usize {
        PagedKvCache::bytes_per_block(self.layers(), self.width, self.block_size, self.dtype)
    }

    /// Appends block `block` of every layer to `out` (the batched engine's disk tier):
    /// per layer its keys then its values, each as the store holds them, little-endian
    /// (f32 or f16 bits per element; FP8: the codes, then the block's scales as f32).
    /// [`PagedKvCache::block_bytes`] bytes in all.
    pub fn read_block(&self, block: u32, out: &mut Vec<u8>) -> Result<(), TensorError> {
        let (s, n) = self.block_range(block)?;
        let mut at = out.len();
        out.resize(at + self.block_bytes(), 0);
        // Element by element into fixed-size chunks: a plain copy on little-endian machines.
        fn put<const W: usize, T: Copy>(out: &mut [u8], src: &[T], bytes: impl Fn(T) -> [u8; W]) -> usize {
            for (d, &x) in out.chunks_exact_mut(W).zip(src) {
                d.copy_from_slice(&bytes(x));
            }
            W * src.len()
        }
        for store in self.keys.iter().zip(&self.values).flat_map(|(k, v)| [k, v]) {
            match store {
                Store::F32(v) => at += put(&mut out[at..], &v[s..s + n], f32::to_le_bytes),
                Store::F16(v) => at += put(&mut out[at..], &v[s..s + n], u16::to_le_bytes),
                Store::Fp8 { codes, scales, group } => {
                    out[at..at + n].copy_from_slice(&codes[s..s + n]);
                    at += n;
                    at += put(&mut out[at..], &scales[s / *group..(s + n) / *group], f32::to_le_bytes);
                }
            }
        }
        Ok(())
    }

    /// Overwrites block `block` of every layer with `bytes` as [`PagedKvCache::read_block`]
    /// wrote them; refused (nothing written) unless `bytes` is exactly one block long.
    pub fn write_block(&mut self, block: u32, bytes: &[u8]) -> Result<(), TensorError> {
        let (s, n) = self.block_range(block)?;
        if bytes.len() != self.block_bytes() {
            return Err(TensorError::Shape {
                op: "kv block write",
                detail: format!("{} bytes for a block of {}", bytes.len(), self.block_bytes()),
            });
        }
        let mut at = 0;
        let mut take = |len: usize| {
            let part = &bytes[at..at + len];
            at += len;
            part
        };
        let layers = self.keys.len();
        for layer in 0..layers {
            for store in [&mut self.keys[layer], &mut self.values[layer]] {
                match store {
                    Store::F32(v) => {
                        for (x, b) in v[s..s + n].iter_mut().zip(take(4 * n).chunks_exact(4)) {
                            *x = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                        }
                    }
                    Store::F16(v) => {
                        for (x, b) in v[s..s + n].iter_mut().zip(take(2 * n).chunks_exact(2)) {
                            *x = u16::from_le_bytes([b[0], b[1]]);
                        }
                    }
                    Store::Fp8 { codes, scales, group } => {
                        codes[s..s + n].copy_from_slice(take(n));
                        let g = *group;
                        for (x, b) in scales[s / g..(s + n) / g].iter_mut().zip(take(4 * (n / g)).chunks_exact(4)) {
                            *x = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// The element range of block `block` in every store.
    fn block_range(&self, block: u32) -> Result<(usize, usize), TensorError> {
        if block as usize >= self.n_blocks {
            return Err(TensorError::Shape {
                op: "kv block copy",
                detail: format!("block {block} of a {}-block cache", self.n_blocks),
            });
        }
        let n = self.block_size * self.width;
        Ok((block as usize * n, n))
    }

    /// Copies block `src` over block `dst` in every layer (copy-on-write of a shared block).
    pub fn copy_block(&mut self, src: u32, dst: u32) {
        let n = self.block_size * self.width;
        let (s, d) = (src as usize * n, dst as usize * n);
        for store in self.keys.iter_mut().chain(self.values.iter_mut()) {
            match store {
                Store::F32(v) => v.copy_within(s..s + n, d),
                Store::F16(v) => v.copy_within(s..s + n, d),
                Store::Fp8 { codes, scales, group } => {
                    codes.copy_within(s..s + n, d);
                    scales.copy_within(s / *group..(s + n) / *group, d / *group);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_block_read_out_and_written_back_is_the_same_block_in_every_dtype() {
        for dtype in [KvDtype::F16, KvDtype::F32, KvDtype::Fp8E4M3] {
            let (layers, width, bs) = (3, 64, 4);
            let mut kv = PagedKvCache::new(layers, width, bs, 3, dtype);
            let rows: Vec<f32> = (0..bs * width).map(|i| (i as f32 * 0.37).sin() * 3.0).collect();
            for layer in 0..layers {
                let v: Vec<f32> = rows.iter().map(|x| x * (layer + 2) as f32).collect();
                kv.write(layer, &[1], 0, &rows, &v).unwrap();
            }
            let mut a = Vec::new();
            kv.read_block(1, &mut a).unwrap();
            assert_eq!(a.len(), kv.block_bytes(), "{dtype}");
            assert!(a.iter().any(|&b| b != 0));
            kv.write_block(2, &a).unwrap();
            let mut b = Vec::new();
            kv.read_block(2, &mut b).unwrap();
            assert_eq!(a, b, "{dtype}");
            // The same bytes as copying the block in memory.
            kv.copy_block(1, 0);
            let mut c = Vec::new();
            kv.read_block(0, &mut c).unwrap();
            assert_eq!(a, c, "{dtype}");
            assert!(kv.write_block(0, &a[1..]).is_err(), "a short block is refused");
            assert!(kv.write_block(3, &a).is_err() && kv.read_block(3, &mut b).is_err(), "no block 3");
        }
    }
}
