//! Weight sources: a GGUF file or a Hugging Face safetensors checkpoint, both looked up
//! by Hugging Face parameter name and delivered in the precision the user chose.
//!
//! GGUF names map to HF names by [`gguf_name`]. For Llama, llama.cpp's converter permutes
//! the rows of `attn_q`/`attn_k` (weights and biases) so that its interleaved RoPE works
//! (convert_hf_to_gguf.py, `LlamaModel.permute`); [`unpermute_rows`] undoes that, so q/k
//! projections here equal PyTorch's element for element and one split-half RoPE kernel
//! serves both sources. Families llama.cpp runs with NeoX RoPE (Qwen2) are stored unpermuted
//! ([`crate::family::Family::gguf_permutes_qk`]).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use loupe_formats::safetensors_file::SafetensorsCheckpoint;
use loupe_formats::storage::SharedBytes;
use loupe_formats::{GgmlType, GgufFile};
use loupe_graph::{Weight, WeightData};
use loupe_tensor::hugepages::{WeightArena, WeightBytes};
use loupe_tensor::linear::QMatrix;
use loupe_tensor::quant::dequantize_row;
use rayon::prelude::*;
use safetensors::Dtype;

use crate::error::{ModelError, TensorMismatch};

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
    /// FP8 E4M3 weights (one guarded scale per output row) and activations (one guarded
    /// scale per token, computed as they arrive) for the decoder layers' linear layers, the
    /// products accumulated in f32: the numerics of an FP8 W8A8 GEMM, emulated on the f32
    /// kernels (values rounded to FP8 and widened), so as fast as `F32`, not faster. The
    /// embedding and `lm_head` stay in their own precision, as FP8 recipes keep them.
    Fp8,
    /// The default of generate, bench and serve: blocks kept as `Native`, and per weight
    /// type the faster arithmetic whose teacher-forced argmax agreement with f32 stays at
    /// least 99% on every model's goldens: `Q8`'s 8-bit activation blocks for Q4_K and Q5_K
    /// (and for Q5_0's decode rows on AVX-512 CPUs without AMX), `Native`'s 16-bit ones for
    /// the others (`loupe_graph::passes::precision::auto_takes_q8`, `auto_decode_q8`).
    Auto,
}

impl Precision {
    /// The name a precision is shown and written with (`f32`, `native`, `q8`, `fp8`): the
    /// CLI's `--precision` values and a dump manifest's `precision`.
    pub fn name(self) -> &'static str {
        match self {
            Precision::F32 => "f32",
            Precision::Native => "native",
            Precision::Q8 => "q8",
            Precision::Fp8 => "fp8",
            Precision::Auto => "auto",
        }
    }
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
    gguf_name_in(crate::family::Family::Llama, hf_name)
}

/// The GGUF tensor name of a Hugging Face parameter name in `family`'s layout: llama.cpp
/// calls the MLP's input norm `ffn_norm` in every family, which is `post_attention_layernorm`
/// in Llama-style layers and `pre_feedforward_layernorm` in Gemma's (whose
/// `post_attention_layernorm` is `post_attention_norm`).
pub fn gguf_name_in(family: crate::family::Family, hf_name: &str) -> Option<String> {
    let sandwich = family.sandwich_norms();
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
        "self_attn.q_norm" => "attn_q_norm",
        "self_attn.k_norm" => "attn_k_norm",
        "self_attn.o_proj" => "attn_output",
        "post_attention_layernorm" if sandwich => "post_attention_norm",
        "post_attention_layernorm" => "ffn_norm",
        "pre_feedforward_layernorm" if sandwich => "ffn_norm",
        "post_feedforward_layernorm" if sandwich => "post_ffw_norm",
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

/// Applies llama.cpp's q/k permutation (convert_hf_to_gguf.py, `LlamaModel.permute`): within
/// each head, HF row `j * head_dim/2 + i` goes to GGUF row `2i + j`; rows are `row_len`
/// elements of any type (values, or bytes of an encoding). The inverse of [`unpermute_rows`].
pub fn permute_rows<T: Copy + Default>(data: &[T], n_heads: usize, row_len: usize) -> Vec<T> {
    let mut out = vec![T::default(); data.len()];
    for_each_qk_row(data.len() / row_len.max(1), n_heads, |hf, gg| {
        out[gg * row_len..(gg + 1) * row_len].copy_from_slice(&data[hf * row_len..(hf + 1) * row_len]);
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
/// `tensor_scale` multiplies every element (NVFP4's per-tensor scale; 1 otherwise): kept
/// beside the blocks at native precision, folded into the f32 values otherwise.
/// Kept blocks are used where they lie when `in_place` is the mapping `bytes` lie in (the
/// placement module decides); otherwise they are copied into `arena` (huge pages, see
/// [`loupe_tensor::hugepages`]), `copied` told each range of `bytes` as it is in place (the
/// caller releases the file's pages).
#[allow(clippy::too_many_arguments)]
fn make_weight(
    path: &Path,
    name: &str,
    ty: GgmlType,
    shape: &[usize],
    bytes: &[u8],
    precision: Precision,
    tensor_scale: f32,
    in_place: Option<&Arc<SharedBytes>>,
    arena: &WeightArena,
    copied: &mut dyn FnMut(std::ops::Range<usize>),
) -> Result<Weight, ModelError> {
    let tensor_err = |e| ModelError::Tensor { path: path.to_path_buf(), name: name.to_string(), source: e };
    let cols = *shape.last().unwrap_or(&1);
    let rows: usize = shape.iter().product::<usize>() / cols.max(1);
    let keep_blocks = !matches!(precision, Precision::F32 | Precision::Fp8) && shape.len() == 2 && ty != GgmlType::F32;
    // Rounded here, and flagged so `choose-precision` gives its matmuls FP8 activations
    // from the weight itself (the graph never matches names).
    let fp8 = precision == Precision::Fp8 && shape.len() == 2 && is_fp8_linear(name);
    let data = if keep_blocks {
        let kept = match in_place.filter(|m| lies_within(bytes, m)) {
            // SAFETY: `bytes` lies inside the mapping (checked just above), a read-only map
            // of the file that the Arc keeps mapped and nothing writes.
            Some(map) => unsafe { WeightBytes::in_place(Arc::clone(map) as _, bytes) },
            None => arena.copy_in_pieces(bytes, copied),
        };
        WeightData::Quant(Arc::new(
            QMatrix::new(ty, rows, cols, kept).map_err(tensor_err)?.with_tensor_scale(tensor_scale),
        ))
    } else {
        let row_bytes = bytes.len() / rows.max(1);
        let mut out = vec![0f32; rows * cols];
        out.par_chunks_mut(cols.max(1))
            .zip(bytes.par_chunks(row_bytes.max(1)))
            .try_for_each(|(dst, src)| dequantize_row(ty, src, dst))
            .map_err(tensor_err)?;
        if tensor_scale != 1.0 {
            out.par_iter_mut().for_each(|v| *v *= tensor_scale);
        }
        if fp8 {
            out = loupe_tensor::fp8::round_trip_rows_e4m3(&out, cols.max(1)).map_err(tensor_err)?;
        }
        WeightData::F32(Arc::new(out))
    };
    Ok(Weight { name: name.to_string(), shape: shape.to_vec(), data, source_type: ty, fp8 })
}

/// Whether the slice `inner` lies inside `outer`'s bytes (by address).
fn lies_within(inner: &[u8], outer: &SharedBytes) -> bool {
    let (start, end) = (outer.address(), outer.address() + outer.len());
    let at = inner.as_ptr() as usize;
    at >= start && at.checked_add(inner.len()).is_some_and(|e| e <= end)
}

/// Whether `--precision fp8` applies to the linear layer of HF weight `name`: the decoder
/// layers' projections (`model.layers.*`), as FP8 checkpoints' recipes quantize them and keep
/// the embedding and `lm_head` in 16 bits. The loader rounds these weights and marks them
/// ([`loupe_graph::Weight::fp8`]); nothing asks the name after loading.
pub fn is_fp8_linear(name: &str) -> bool {
    name.starts_with("model.layers.")
}

/// The name of the sidecar tensor holding the per-tensor scale of NVFP4 tensor `gguf_name`
/// (`blk.0.attn_q.weight` -> `blk.0.attn_q.scale`, llama.cpp's `tn(..., "scale")`).
pub fn nvfp4_scale_name(gguf_name: &str) -> String {
    format!("{}.scale", gguf_name.strip_suffix(".weight").unwrap_or(gguf_name))
}

/// The per-tensor scale of an NVFP4 tensor: its sidecar's one f32, or 1 when the file has
/// none (a file quantized without the second level, as ggml's own quantizer writes them). A
/// sidecar that is not one finite f32 is an error naming it.
pub fn nvfp4_tensor_scale(gguf: &GgufFile, gguf_name: &str) -> Result<f32, ModelError> {
    let name = nvfp4_scale_name(gguf_name);
    let Some(info) = gguf.tensor(&name) else { return Ok(1.0) };
    let bad =
        |reason: String| ModelError::InvalidConfig { source_file: gguf.path.clone(), field: name.clone(), reason };
    if info.ggml_type != GgmlType::F32 || info.n_elements() != 1 {
        return Err(bad(format!(
            "the per-tensor scale of NVFP4 tensor {gguf_name} must be one f32, found {} element(s) of {}",
            info.n_elements(),
            info.ggml_type
        )));
    }
    let b = gguf.tensor_data(info);
    let v = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    if !v.is_finite() {
        return Err(bad(format!("the per-tensor scale of NVFP4 tensor {gguf_name} is {v}")));
    }
    Ok(v)
}

/// Weights from a GGUF file.
pub struct GgufSource<'a> {
    pub gguf: &'a GgufFile,
    pub precision: Precision,
    pub n_heads: usize,
    pub n_kv_heads: usize,
    /// Decides the GGUF names, whether llama.cpp's q/k row permutation is undone
    /// ([`crate::family::Family::gguf_permutes_qk`], see the module docs) and Gemma's norm offset.
    pub family: crate::family::Family,
    pub progress: Option<Progress<'a>>,
    /// Where the kept blocks go (one per model load) unless `in_place`.
    arena: WeightArena,
    /// The file's mapping, when its kept blocks are read in place (the placement module's
    /// decision, `new`'s `in_place`).
    in_place: Option<Arc<SharedBytes>>,
    done: u64,
    total: u64,
}

impl<'a> GgufSource<'a> {
    pub fn new(
        gguf: &'a GgufFile,
        precision: Precision,
        config: &crate::config::DecoderConfig,
        progress: Option<Progress<'a>>,
        in_place: bool,
    ) -> Self {
        let total = gguf.tensors.iter().map(|t| t.size_bytes).sum();
        let (n_heads, n_kv_heads) = (config.num_attention_heads, config.num_key_value_heads);
        let in_place = in_place.then(|| Arc::new(gguf.shared_bytes()));
        GgufSource {
            gguf,
            precision,
            n_heads,
            n_kv_heads,
            family: config.family,
            progress,
            arena: WeightArena::new(),
            in_place,
            done: 0,
            total,
        }
    }

    /// Whether the kept blocks are read in place from the file's mapping.
    pub fn weights_in_place(&self) -> bool {
        self.in_place.is_some()
    }
}

impl WeightSource for GgufSource<'_> {
    fn load(&mut self, hf_name: &str, shape: &[usize]) -> Result<Weight, ModelError> {
        let path = &self.gguf.path;
        let gname = gguf_name_in(self.family, hf_name)
            .ok_or_else(|| ModelError::MissingWeight { path: path.clone(), name: hf_name.to_string() })?;
        let info = self
            .gguf
            .tensor(&gname)
            .ok_or_else(|| ModelError::MissingWeight { path: path.clone(), name: gname.clone() })?;
        if info.shape() != shape {
            return Err(ModelError::WeightShape {
                path: path.clone(),
                name: gname,
                found: info.shape(),
                expected: shape.to_vec(),
            });
        }
        match (&self.in_place, self.gguf.tensor_bytes_range(info)) {
            // Read where it lies: its pages mapped now, so the first token takes no faults.
            (Some(map), Some(range)) => {
                map.populate(range);
            }
            _ => self.gguf.prefetch_tensor(info),
        }
        let mut bytes = std::borrow::Cow::Borrowed(self.gguf.tensor_data(info));
        let heads = if !self.family.gguf_permutes_qk() {
            None
        } else if gname.ends_with("attn_q.weight") || gname.ends_with("attn_q.bias") {
            Some(self.n_heads)
        } else if gname.ends_with("attn_k.weight") || gname.ends_with("attn_k.bias") {
            Some(self.n_kv_heads)
        } else {
            None
        };
        if let Some(n) = heads {
            bytes = std::borrow::Cow::Owned(unpermute_rows(&bytes, n, bytes.len() / shape[0]));
        }
        let scale = if info.ggml_type == GgmlType::Nvfp4 { nvfp4_tensor_scale(self.gguf, &gname)? } else { 1.0 };
        let gguf = self.gguf;
        let mapped = matches!(bytes, std::borrow::Cow::Borrowed(_));
        let mut release = |r: std::ops::Range<usize>| {
            if mapped {
                gguf.release_tensor_part(info, r);
            }
        };
        let in_place = if mapped { self.in_place.as_ref() } else { None };
        let mut w = make_weight(
            path,
            hf_name,
            info.ggml_type,
            shape,
            &bytes,
            self.precision,
            scale,
            in_place,
            &self.arena,
            &mut release,
        )?;
        // Unless it reads the file in place, the weight holds its own copy now (arena blocks
        // or f32 values): drop the file's pages from the resident set so the weights are not
        // held twice at any moment.
        drop(bytes);
        if !matches!(&w.data, WeightData::Quant(q) if q.data.is_in_place()) {
            self.gguf.release_tensor(info);
        }
        // llama.cpp's converter stores Gemma's norm weights plus one (it runs a plain RMSNorm);
        // subtract it in f32, as transformers' GGUF loader does (`Gemma2TensorProcessor`), so
        // the weight is in Hugging Face's convention and the builder forms `1 + w` as
        // transformers does.
        if self.family.norm_unit_offset() && gname.ends_with("norm.weight") {
            if let WeightData::F32(d) = &mut w.data {
                *d = Arc::new(d.iter().map(|v| v - 1.0).collect());
            }
        }
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
        dequantize_row(info.ggml_type, self.gguf.tensor_data(info), &mut out).map_err(|e| ModelError::Tensor {
            path: self.gguf.path.clone(),
            name: info.name.clone(),
            source: e,
        })?;
        Ok(Some(out))
    }

    fn path(&self) -> &Path {
        &self.gguf.path
    }
}

/// The dtype a Hugging Face `config.json` says the checkpoint's weights are in (`dtype`, or
/// `torch_dtype` before transformers 4.56): `float32`, `float16` or `bfloat16`; `None` when it
/// names none of them (absent, `auto`).
pub fn config_dtype(config_json: &Path) -> Result<Option<Dtype>, ModelError> {
    let text = std::fs::read_to_string(config_json)
        .map_err(|e| ModelError::Io { path: config_json.to_path_buf(), source: e })?;
    let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| ModelError::InvalidConfig {
        source_file: config_json.to_path_buf(),
        field: "config.json".into(),
        reason: e.to_string(),
    })?;
    let name = v.get("dtype").or_else(|| v.get("torch_dtype")).and_then(serde_json::Value::as_str).unwrap_or("");
    Ok(match name.trim_start_matches("torch.") {
        "float32" => Some(Dtype::F32),
        "float16" => Some(Dtype::F16),
        "bfloat16" => Some(Dtype::BF16),
        _ => None,
    })
}

pub(crate) fn ggml_type_of(dtype: Dtype) -> Option<GgmlType> {
    match dtype {
        Dtype::F32 => Some(GgmlType::F32),
        Dtype::F16 => Some(GgmlType::F16),
        Dtype::BF16 => Some(GgmlType::BF16),
        _ => None,
    }
}

/// Weights from a Hugging Face safetensors checkpoint (already in HF naming and layout).
///
/// The auto-cast rule: each tensor is loaded as the dtype the model computes with, the
/// *expected* dtype: f32 at `--precision f32`, else the config's `dtype` (or the stored one
/// when the config names none). A stored dtype that differs is converted (bf16/f16 widened to
/// f32 exactly; f32 rounded to bf16/f16 to nearest even, as `tensor.to(dtype)` does when
/// transformers loads the checkpoint in its configured dtype) when the shapes match; when
/// they do not, the load fails naming the tensor and both dtypes and shapes.
pub struct SafetensorsSource<'a> {
    pub checkpoint: &'a SafetensorsCheckpoint,
    pub dir: PathBuf,
    pub precision: Precision,
    pub progress: Option<Progress<'a>>,
    /// The config's dtype (see the type's docs); `None`: each tensor's stored dtype.
    pub config_dtype: Option<Dtype>,
    /// Tensors stored in another dtype than the config's, with their stored dtype.
    pub converted: Vec<(String, Dtype)>,
    /// Where the kept blocks go (one per model load).
    arena: WeightArena,
    done: u64,
    total: u64,
}

impl<'a> SafetensorsSource<'a> {
    pub fn new(
        checkpoint: &'a SafetensorsCheckpoint,
        dir: PathBuf,
        precision: Precision,
        progress: Option<Progress<'a>>,
    ) -> Self {
        let total = checkpoint
            .names()
            .filter_map(|n| checkpoint.tensor(n))
            .map(|(_, i)| (i.data_offsets.1 - i.data_offsets.0) as u64)
            .sum();
        SafetensorsSource {
            checkpoint,
            dir,
            precision,
            progress,
            config_dtype: None,
            converted: Vec::new(),
            arena: WeightArena::new(),
            done: 0,
            total,
        }
    }

    /// The same source with the config's dtype (see [`config_dtype`]).
    pub fn with_config_dtype(mut self, dtype: Option<Dtype>) -> Self {
        self.config_dtype = dtype;
        self
    }

    /// The dtype a tensor stored as `stored` is loaded as.
    pub fn expected_dtype(&self, stored: Dtype) -> Dtype {
        if matches!(self.precision, Precision::F32 | Precision::Fp8) {
            Dtype::F32
        } else {
            self.config_dtype.unwrap_or(stored)
        }
    }
}

impl WeightSource for SafetensorsSource<'_> {
    fn load(&mut self, hf_name: &str, shape: &[usize]) -> Result<Weight, ModelError> {
        let (file, info) = self
            .checkpoint
            .tensor(hf_name)
            .ok_or_else(|| ModelError::MissingWeight { path: self.dir.clone(), name: hf_name.to_string() })?;
        let expected = self.expected_dtype(info.dtype);
        if info.shape != shape {
            return Err(ModelError::WeightMismatch {
                path: self.dir.clone(),
                name: hf_name.to_string(),
                tensors: Box::new(TensorMismatch {
                    found: info.shape.clone(),
                    found_dtype: format!("{:?}", info.dtype),
                    expected: shape.to_vec(),
                    expected_dtype: format!("{expected:?}"),
                }),
            });
        }
        let unsupported = |d: Dtype| ModelError::InvalidConfig {
            source_file: self.dir.clone(),
            field: hf_name.to_string(),
            reason: format!("unsupported dtype {d:?} (loupe reads F32, F16 and BF16 checkpoints)"),
        };
        let stored_ty = ggml_type_of(info.dtype).ok_or_else(|| unsupported(info.dtype))?;
        file.prefetch_tensor(info);
        let bytes = file.tensor_data(info);
        let w = if expected == info.dtype || expected == Dtype::F32 {
            // Same dtype, or a widening make_weight does exactly (f32 compute).
            make_weight(
                &self.dir,
                hf_name,
                stored_ty,
                shape,
                bytes,
                self.precision,
                1.0,
                None,
                &self.arena,
                &mut |r| file.release_tensor_part(info, r),
            )?
        } else {
            let ty = ggml_type_of(expected).ok_or_else(|| unsupported(expected))?;
            let tensor_err = |e| ModelError::Tensor { path: self.dir.clone(), name: hf_name.to_string(), source: e };
            let n = bytes.len() / stored_ty.type_size();
            let mut wide = vec![0f32; n];
            dequantize_row(stored_ty, bytes, &mut wide).map_err(tensor_err)?;
            let mut narrow = vec![0u8; n * ty.type_size()];
            loupe_tensor::quant::quantize_row(ty, &wide, &mut narrow).map_err(tensor_err)?;
            make_weight(&self.dir, hf_name, ty, shape, &narrow, self.precision, 1.0, None, &self.arena, &mut |_| {})?
        };
        // Recorded: tensors stored unlike the checkpoint's own config (widening everything
        // to f32 at --precision f32 is the precision, not a cast worth reporting).
        if self.config_dtype.is_some_and(|c| c != info.dtype) {
            self.converted.push((hf_name.to_string(), info.dtype));
        }
        self.done += bytes.len() as u64;
        // The weight holds its own copy: the file's pages leave the resident set.
        file.release_tensor(info);
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
        assert_eq!(
            gguf_name("model.layers.0.post_attention_layernorm.weight").as_deref(),
            Some("blk.0.ffn_norm.weight")
        );
        assert_eq!(gguf_name("model.embed_tokens.weight").as_deref(), Some("token_embd.weight"));
        assert_eq!(gguf_name("model.layers.x.mlp.up_proj.weight"), None);
        assert_eq!(gguf_name("model.layers.0.pre_feedforward_layernorm.weight"), None);
        let gemma = |n: &str| gguf_name_in(crate::family::Family::Gemma3, n);
        assert_eq!(
            gemma("model.layers.2.post_attention_layernorm.weight").as_deref(),
            Some("blk.2.post_attention_norm.weight")
        );
        assert_eq!(gemma("model.layers.2.pre_feedforward_layernorm.weight").as_deref(), Some("blk.2.ffn_norm.weight"));
        assert_eq!(
            gemma("model.layers.2.post_feedforward_layernorm.weight").as_deref(),
            Some("blk.2.post_ffw_norm.weight")
        );
        assert_eq!(gemma("model.layers.2.self_attn.q_norm.weight").as_deref(), Some("blk.2.attn_q_norm.weight"));
    }

    /// The auto-cast rule on a checkpoint whose config says bfloat16 but which stores one
    /// matrix in f32 and one in bf16: at native precision the f32 one is rounded to bf16 (the
    /// values transformers computes with after `.to(bfloat16)`), at f32 both are widened
    /// exactly; a shape mismatch fails naming the tensor and both dtypes.
    #[test]
    fn stored_dtypes_are_cast_to_the_expected_one_and_shapes_are_never_guessed() {
        use half::bf16;
        use safetensors::tensor::TensorView;
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("config.json"),
            r#"{"architectures": ["LlamaForCausalLM"], "torch_dtype": "bfloat16"}"#,
        )
        .unwrap();
        // 1 + 2^-10 is not a bf16 value (8 mantissa bits): it rounds to 1.0.
        let f32_vals: Vec<f32> = vec![1.0 + 1.0 / 1024.0, -3.5, 0.1, 2.0e-3];
        let f32_bytes: Vec<u8> = f32_vals.iter().flat_map(|v| v.to_le_bytes()).collect();
        let bf_vals: Vec<f32> = vec![0.5, -1.25, 3.0, 0.0];
        let bf_bytes: Vec<u8> = bf_vals.iter().flat_map(|v| bf16::from_f32(*v).to_le_bytes()).collect();
        let tensors = vec![
            ("a.weight", TensorView::new(Dtype::F32, vec![2, 2], &f32_bytes).unwrap()),
            ("b.weight", TensorView::new(Dtype::BF16, vec![2, 2], &bf_bytes).unwrap()),
        ];
        safetensors::serialize_to_file(tensors, None, &dir.path().join("model.safetensors")).unwrap();
        assert_eq!(config_dtype(&dir.path().join("config.json")).unwrap(), Some(Dtype::BF16));
        let ck = SafetensorsCheckpoint::open(dir.path()).unwrap();
        let values = |w: &Weight| match &w.data {
            WeightData::F32(v) => v.to_vec(),
            WeightData::Quant(q) => q.dequantize(),
        };

        let mut native = SafetensorsSource::new(&ck, dir.path().to_path_buf(), Precision::Native, None)
            .with_config_dtype(Some(Dtype::BF16));
        let a = native.load("a.weight", &[2, 2]).unwrap();
        assert_eq!(a.source_type, GgmlType::BF16, "cast to the config's dtype");
        assert_eq!(values(&a), f32_vals.iter().map(|v| bf16::from_f32(*v).to_f32()).collect::<Vec<_>>());
        assert_eq!(values(&a)[0], 1.0);
        let b = native.load("b.weight", &[2, 2]).unwrap();
        assert_eq!((b.source_type, values(&b)), (GgmlType::BF16, bf_vals.clone()));
        assert_eq!(native.converted, vec![("a.weight".to_string(), Dtype::F32)]);

        let mut wide = SafetensorsSource::new(&ck, dir.path().to_path_buf(), Precision::F32, None)
            .with_config_dtype(Some(Dtype::BF16));
        assert_eq!(values(&wide.load("a.weight", &[2, 2]).unwrap()), f32_vals, "f32 compute keeps f32 values exactly");
        assert_eq!(values(&wide.load("b.weight", &[2, 2]).unwrap()), bf_vals);

        let err = native.load("a.weight", &[4, 1]).unwrap_err().to_string();
        for part in ["'a.weight'", "F32 [2, 2]", "expects BF16 [4, 1]", "cannot be cast"] {
            assert!(err.contains(part), "{part:?} missing from: {err}");
        }
    }

    #[test]
    fn unpermute_inverts_the_converters_permutation() {
        // one head of 4 rows, one byte per row: HF rows [a, b, c, d] are stored as [a, c, b, d]
        let gguf = [0u8, 2, 1, 3];
        assert_eq!(unpermute_rows(&gguf, 1, 1), vec![0, 1, 2, 3]);
        let two_heads = [0u8, 2, 1, 3, 4, 6, 5, 7];
        assert_eq!(unpermute_rows(&two_heads, 2, 1), vec![0, 1, 2, 3, 4, 5, 6, 7]);
        let rows: Vec<u8> = (0..16).collect();
        assert_eq!(unpermute_rows(&permute_rows(&rows, 2, 2), 2, 2), rows, "two heads of 4 rows of 2 bytes");
    }
}
