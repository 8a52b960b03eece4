//! Weight sources: a GGUF file or a Hugging Face safetensors checkpoint, both looked up
//! by Hugging Face parameter name and delivered in the precision the user chose.
//!
//! GGUF names map to HF names by [`gguf_name`]. llama.cpp's converter permutes the rows of
//! `attn_q`/`attn_k` so that its interleaved RoPE works (convert_hf_to_gguf.py,
//! `LlamaModel.permute`); [`unpermute_rows`] undoes that, so q/k projections here equal
//! PyTorch's element for element and one split-half RoPE kernel serves both sources.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use loupe_formats::safetensors_file::SafetensorsCheckpoint;
use safetensors::Dtype;
use loupe_formats::{GgmlType, GgufFile};
use loupe_graph::{Weight, WeightData};
use loupe_tensor::matmul::QMatrix;
use loupe_tensor::quant::dequantize_row;
use rayon::prelude::*;

use crate::ModelError;

/// How weights are held and computed with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Precision {
    /// Dequantize at load; compute in f32 (closest to the PyTorch reference).
    F32,
    /// Keep GGML blocks (4-8 bits per weight in memory); multiply weights dequantized in
    /// registers by f32 activations. As fast as 8-bit activations where decode is bound by
    /// memory bandwidth, without their rounding.
    Native,
    /// Keep GGML blocks and quantize activations to 8-bit blocks for integer dot products,
    /// as llama.cpp does (to compare with llama.cpp's numbers).
    Q8,
}

/// Where a model's weights come from.
pub trait WeightSource {
    /// Loads the parameter `hf_name` (e.g. `model.layers.0.mlp.up_proj.weight`), checking
    /// it has `shape` (`[out, in]` for matrices).
    fn load(&mut self, hf_name: &str, shape: &[usize]) -> Result<Weight, ModelError>;
    /// Llama-3 RoPE frequency divisors stored as a tensor (GGUF `rope_freqs.weight`).
    fn rope_freq_factors(&mut self) -> Result<Option<Vec<f32>>, ModelError>;
    fn path(&self) -> &Path;
}

/// Progress reports: bytes of weights processed so far and the total.
pub type Progress<'a> = &'a (dyn Fn(u64, u64) + Sync);

/// The GGUF tensor name of a Hugging Face Llama parameter name.
pub fn gguf_name(hf_name: &str) -> Option<String> {
    let fixed = match hf_name {
        "model.embed_tokens.weight" => Some("token_embd.weight"),
        "model.norm.weight" => Some("output_norm.weight"),
        "lm_head.weight" => Some("output.weight"),
        _ => None,
    };
    if let Some(f) = fixed {
        return Some(f.to_string());
    }
    let rest = hf_name.strip_prefix("model.layers.")?;
    let (layer, module) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    let (module, suffix) = module.rsplit_once('.')?;
    let g = match module {
        "input_layernorm" => "attn_norm",
        "self_attn.q_proj" => "attn_q",
        "self_attn.k_proj" => "attn_k",
        "self_attn.v_proj" => "attn_v",
        "self_attn.o_proj" => "attn_output",
        "post_attention_layernorm" => "ffn_norm",
        "mlp.gate_proj" => "ffn_gate",
        "mlp.up_proj" => "ffn_up",
        "mlp.down_proj" => "ffn_down",
        _ => return None,
    };
    Some(format!("blk.{layer}.{g}.{suffix}"))
}

/// Reorders the rows of a q/k projection from llama.cpp's interleaved layout back to
/// Hugging Face's: within each head, GGUF row `2i + j` holds HF row `j * head_dim/2 + i`.
/// `row_bytes` is the size of one row in whatever encoding `data` has.
pub fn unpermute_rows(data: &[u8], n_heads: usize, row_bytes: usize) -> Vec<u8> {
    let mut out = vec![0u8; data.len()];
    for_each_qk_row(data.len() / row_bytes.max(1), n_heads, |hf, gg| {
        out[hf * row_bytes..(hf + 1) * row_bytes].copy_from_slice(&data[gg * row_bytes..(gg + 1) * row_bytes]);
    });
    out
}

/// The row map of llama.cpp's q/k permutation, shared by [`unpermute_rows`] and the tiny
/// model's writer: calls `f(hf_row, gguf_row)` for every row of a `rows`-row matrix of
/// `n_heads` heads (within each head, GGUF row `2i + j` is HF row `j * head_dim/2 + i`).
pub(crate) fn for_each_qk_row(rows: usize, n_heads: usize, mut f: impl FnMut(usize, usize)) {
    let head_dim = rows / n_heads.max(1);
    let half = head_dim / 2;
    for h in 0..n_heads {
        for j in 0..2 {
            for i in 0..half {
                f(h * head_dim + j * half + i, h * head_dim + 2 * i + j);
            }
        }
    }
}

/// Turns raw tensor bytes of type `ty` and row-major `shape` into a weight.
fn make_weight(path: &Path, name: &str, ty: GgmlType, shape: &[usize], bytes: &[u8], precision: Precision) -> Result<Weight, ModelError> {
    let tensor_err = |e| ModelError::Tensor { path: path.to_path_buf(), name: name.to_string(), source: e };
    let cols = *shape.last().unwrap_or(&1);
    let rows: usize = shape.iter().product::<usize>() / cols.max(1);
    let keep_blocks = precision != Precision::F32 && shape.len() == 2 && ty != GgmlType::F32;
    let data = if keep_blocks {
        WeightData::Quant(Arc::new(QMatrix::new(ty, rows, cols, bytes.to_vec()).map_err(tensor_err)?))
    } else {
        let row_bytes = bytes.len() / rows.max(1);
        let mut out = vec![0f32; rows * cols];
        out.par_chunks_mut(cols.max(1))
            .zip(bytes.par_chunks(row_bytes.max(1)))
            .try_for_each(|(dst, src)| dequantize_row(ty, src, dst))
            .map_err(tensor_err)?;
        WeightData::F32(Arc::new(out))
    };
    Ok(Weight { name: name.to_string(), shape: shape.to_vec(), data, source_type: ty })
}

/// Weights from a GGUF file.
pub struct GgufSource<'a> {
    pub gguf: &'a GgufFile,
    pub precision: Precision,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub progress: Option<Progress<'a>>,
    done: u64,
    total: u64,
}

impl<'a> GgufSource<'a> {
    pub fn new(gguf: &'a GgufFile, precision: Precision, n_heads: usize, n_kv_heads: usize, progress: Option<Progress<'a>>) -> Self {
        let total = gguf.tensors.iter().map(|t| t.size_bytes).sum();
        GgufSource { gguf, precision, n_heads, n_kv_heads, progress, done: 0, total }
    }
}

impl WeightSource for GgufSource<'_> {
    fn load(&mut self, hf_name: &str, shape: &[usize]) -> Result<Weight, ModelError> {
        let path = &self.gguf.path;
        let gname = gguf_name(hf_name).ok_or_else(|| ModelError::MissingWeight { path: path.clone(), name: hf_name.to_string() })?;
        let info = self.gguf.tensor(&gname).ok_or_else(|| ModelError::MissingWeight { path: path.clone(), name: gname.clone() })?;
        if info.shape() != shape {
            return Err(ModelError::WeightShape { path: path.clone(), name: gname, found: info.shape(), expected: shape.to_vec() });
        }
        let mut bytes = std::borrow::Cow::Borrowed(self.gguf.tensor_data(info));
        let heads = if gname.ends_with("attn_q.weight") {
            Some(self.n_heads)
        } else if gname.ends_with("attn_k.weight") {
            Some(self.n_kv_heads)
        } else {
            None
        };
        if let Some(n) = heads {
            bytes = std::borrow::Cow::Owned(unpermute_rows(&bytes, n, bytes.len() / shape[0]));
        }
        let w = make_weight(path, hf_name, info.ggml_type, shape, &bytes, self.precision)?;
        self.done += info.size_bytes;
        if let Some(p) = self.progress {
            p(self.done, self.total);
        }
        Ok(w)
    }

    fn rope_freq_factors(&mut self) -> Result<Option<Vec<f32>>, ModelError> {
        let Some(info) = self.gguf.tensor("rope_freqs.weight") else { return Ok(None) };
        let n = info.n_elements() as usize;
        let mut out = vec![0f32; n];
        dequantize_row(info.ggml_type, self.gguf.tensor_data(info), &mut out)
            .map_err(|e| ModelError::Tensor { path: self.gguf.path.clone(), name: info.name.clone(), source: e })?;
        Ok(Some(out))
    }

    fn path(&self) -> &Path {
        &self.gguf.path
    }
}

/// Weights from a Hugging Face safetensors checkpoint (already in HF naming and layout).
pub struct SafetensorsSource<'a> {
    pub checkpoint: &'a SafetensorsCheckpoint,
    pub dir: PathBuf,
    pub precision: Precision,
    pub progress: Option<Progress<'a>>,
    done: u64,
    total: u64,
}

impl<'a> SafetensorsSource<'a> {
    pub fn new(checkpoint: &'a SafetensorsCheckpoint, dir: PathBuf, precision: Precision, progress: Option<Progress<'a>>) -> Self {
        let total = checkpoint.names().filter_map(|n| checkpoint.tensor(n)).map(|(_, i)| (i.data_offsets.1 - i.data_offsets.0) as u64).sum();
        SafetensorsSource { checkpoint, dir, precision, progress, done: 0, total }
    }
}

impl WeightSource for SafetensorsSource<'_> {
    fn load(&mut self, hf_name: &str, shape: &[usize]) -> Result<Weight, ModelError> {
        let (file, info) = self.checkpoint.tensor(hf_name).ok_or_else(|| ModelError::MissingWeight { path: self.dir.clone(), name: hf_name.to_string() })?;
        if info.shape != shape {
            return Err(ModelError::WeightShape { path: self.dir.clone(), name: hf_name.to_string(), found: info.shape.clone(), expected: shape.to_vec() });
        }
        let ty = match info.dtype {
            Dtype::F32 => GgmlType::F32,
            Dtype::F16 => GgmlType::F16,
            Dtype::BF16 => GgmlType::BF16,
            other => return Err(ModelError::InvalidConfig { source_file: self.dir.clone(), field: hf_name.to_string(), reason: format!("unsupported dtype {other:?} (loupe reads F32, F16 and BF16 checkpoints)") }),
        };
        let bytes = file.tensor_data(info);
        let w = make_weight(&self.dir, hf_name, ty, shape, bytes, self.precision)?;
        self.done += bytes.len() as u64;
        if let Some(p) = self.progress {
            p(self.done, self.total);
        }
        Ok(w)
    }

    fn rope_freq_factors(&mut self) -> Result<Option<Vec<f32>>, ModelError> {
        Ok(None)
    }

    fn path(&self) -> &Path {
        &self.dir
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_map_to_gguf() {
        assert_eq!(gguf_name("model.layers.12.self_attn.o_proj.weight").as_deref(), Some("blk.12.attn_output.weight"));
        assert_eq!(gguf_name("model.layers.0.post_attention_layernorm.weight").as_deref(), Some("blk.0.ffn_norm.weight"));
        assert_eq!(gguf_name("model.embed_tokens.weight").as_deref(), Some("token_embd.weight"));
        assert_eq!(gguf_name("model.layers.x.mlp.up_proj.weight"), None);
    }

    #[test]
    fn unpermute_inverts_the_converters_permutation() {
        // one head of 4 rows, one byte per row: HF rows [a, b, c, d] are stored as [a, c, b, d]
        let gguf = [0u8, 2, 1, 3];
        assert_eq!(unpermute_rows(&gguf, 1, 1), vec![0, 1, 2, 3]);
        let two_heads = [0u8, 2, 1, 3, 4, 6, 5, 7];
        assert_eq!(unpermute_rows(&two_heads, 2, 1), vec![0, 1, 2, 3, 4, 5, 6, 7]);
    }
}
