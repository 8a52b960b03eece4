//! The paged KV cache of the batched engine: per attention layer, `n_blocks` blocks of
//! `block_size` positions, keys and values stored as f16 (default) or f32. A block id
//! names the same block in every layer, so a sequence's one block table serves all its
//! layers, and allocating, sharing or freeing a block does so for every layer together.
//! Which blocks a sequence owns is the runtime's business (its block manager); this type
//! only stores rows and hands the kernels views of them.

use std::fmt;
use std::str::FromStr;

use half::slice::HalfBitsSliceExt;
use loupe_tensor::ops::paged_attention::{write_paged, KvBlocks, KvBlocksMut};
use loupe_tensor::TensorError;

/// Element type of the paged cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub enum KvDtype {
    /// Half the memory of f32, so twice the sequences per budget; keys and values rounded
    /// to nearest even (relative error under 2^-11, well below Q4 weight noise).
    #[default]
    F16,
    F32,
}

impl KvDtype {
    pub fn bytes(self) -> usize {
        match self {
            KvDtype::F16 => 2,
            KvDtype::F32 => 4,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            KvDtype::F16 => "f16",
            KvDtype::F32 => "f32",
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
            other => Err(format!("unknown KV cache dtype '{other}' (expected f16 or f32)")),
        }
    }
}

#[derive(Debug)]
enum Store {
    F32(Vec<f32>),
    /// f16 bit patterns: a `vec![0u16; n]` is allocated zeroed by the OS (pages mapped on
    /// first write), where `vec![f16::ZERO; n]` would touch every page up front.
    F16(Vec<u16>),
}

impl Store {
    fn zeros(dtype: KvDtype, len: usize) -> Store {
        match dtype {
            KvDtype::F32 => Store::F32(vec![0.0; len]),
            KvDtype::F16 => Store::F16(vec![0u16; len]),
        }
    }

    fn view(&self) -> KvBlocks<'_> {
        match self {
            Store::F32(d) => KvBlocks::F32(d),
            Store::F16(d) => KvBlocks::F16(d.reinterpret_cast()),
        }
    }

    fn view_mut(&mut self) -> KvBlocksMut<'_> {
        match self {
            Store::F32(d) => KvBlocksMut::F32(d),
            Store::F16(d) => KvBlocksMut::F16(d.reinterpret_cast_mut()),
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
        layers.saturating_mul(2).saturating_mul(block_size).saturating_mul(width).saturating_mul(dtype.bytes())
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
            keys: (0..layers).map(|_| Store::zeros(dtype, len)).collect(),
            values: (0..layers).map(|_| Store::zeros(dtype, len)).collect(),
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
    pub fn write(&mut self, layer: usize, blocks: &[u32], past: usize, k: &[f32], v: &[f32]) -> Result<(), TensorError> {
        let (width, bs) = (self.width, self.block_size);
        let (Some(keys), Some(values)) = (self.keys.get_mut(layer), self.values.get_mut(layer)) else {
            return Err(TensorError::Shape { op: "kv write", detail: format!("layer {layer} of a {}-layer cache", self.keys.len()) });
        };
        write_paged(&mut keys.view_mut(), width, bs, blocks, past, k)?;
        write_paged(&mut values.view_mut(), width, bs, blocks, past, v)
    }

    /// One layer's keys and values, for the attention kernel.
    pub fn layer(&self, layer: usize) -> Option<(KvBlocks<'_>, KvBlocks<'_>)> {
        Some((self.keys.get(layer)?.view(), self.values.get(layer)?.view()))
    }

    /// Copies block `src` over block `dst` in every layer (copy-on-write of a shared block).
    pub fn copy_block(&mut self, src: u32, dst: u32) {
        let n = self.block_size * self.width;
        let (s, d) = (src as usize * n, dst as usize * n);
        for store in self.keys.iter_mut().chain(self.values.iter_mut()) {
            match store {
                Store::F32(v) => v.copy_within(s..s + n, d),
                Store::F16(v) => v.copy_within(s..s + n, d),
            }
        }
    }
}
