//! `loupe quantize`: a GGUF rewritten with its weight matrices in another GGML type.
//!
//! Every tensor of two or more dimensions whose rows split into the target's blocks is
//! widened to f32 row by row (any type loupe reads, K-quants included) and quantized to the
//! target as ggml's reference quantizers do ([`loupe_tensor::quant::quantize_row`]); a tensor
//! already in the target type is copied unchanged (requantizing its own values could only add
//! error). One-dimensional tensors (norm weights, biases) and matrices whose rows do not split
//! into blocks are copied as they are, as llama.cpp's quantizer keeps them; so are the token
//! embedding and output projection when they hold more bits than the target (unless asked
//! otherwise): in their own type when it is a block type (a Q8_0 or Q6_K embedding), in Q8_0
//! when they are f32, f16 or bf16 and the target has fewer bits (llama.cpp's converter and
//! quantizer keep them at 6-8 bits, not 16-32), in the target otherwise. The metadata is
//! copied, with `general.file_type` set to the target's llama.cpp file type.
//!
//! The input is a [`TensorSource`]: a GGUF file ([`GgufInput`]) or a Hugging Face checkpoint
//! directory ([`crate::convert::HfCheckpoint`], whose tensors and metadata are converted to
//! llama.cpp's layout on the way); the quantization is the same code for both.

use std::borrow::Cow;
use std::path::Path;

use loupe_core::GgmlType;
use loupe_formats::{GgufFile, GgufValue, GgufWriter};
use loupe_tensor::quant::{dequantize_row, quantize_row};

use crate::error::ModelError;
use crate::weights::{nvfp4_scale_name, nvfp4_tensor_scale};

/// Types `loupe quantize --type` writes.
pub const TARGETS: [GgmlType; 12] = [
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q4K,
    GgmlType::Mxfp4,
    GgmlType::Nvfp4,
    GgmlType::Fp8E4M3,
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::F32,
];

/// The largest magnitude NVFP4's two levels hold below the per-tensor scale: the top E2M1
/// value (6) times the top E4M3 block scale (448) (NVIDIA's NVFP4 recipe: the per-tensor
/// scale maps the tensor's largest magnitude there, so the block scales use E4M3's range).
const NVFP4_TOP: f32 = 6.0 * 448.0;

/// The per-tensor scale NVFP4 quantization divides a tensor by, from its largest magnitude:
/// `amax / (6 * 448)`, kept a normal f32 (an all-zero tensor gets 1) so dividing by it is
/// finite and exact to within rounding.
pub fn nvfp4_tensor_scale_for(amax: f32) -> f32 {
    if !amax.is_finite() || amax <= 0.0 {
        return 1.0;
    }
    (amax / NVFP4_TOP).max(f32::MIN_POSITIVE)
}

/// llama.cpp's `llama_ftype` for a file mostly of `ty` (`general.file_type`; llama.h).
fn file_type(ty: GgmlType) -> u32 {
    match ty {
        GgmlType::F32 => 0,
        GgmlType::F16 => 1,
        GgmlType::Q4_0 => 2,
        GgmlType::Q4_1 => 3,
        GgmlType::Q8_0 => 7,
        GgmlType::Q5_0 => 8,
        GgmlType::Q5_1 => 9,
        GgmlType::BF16 => 32,
        GgmlType::Mxfp4 => 38, // LLAMA_FTYPE_MOSTLY_MXFP4_MOE, as gpt-oss files say
        GgmlType::Nvfp4 => 39, // LLAMA_FTYPE_MOSTLY_NVFP4
        GgmlType::Q4K => 14,   // LLAMA_FTYPE_MOSTLY_Q4_K_S: every matrix Q4_K
        // Not a llama.cpp file type (ggml has no FP8 type): loupe's id for the tensor type.
        GgmlType::Fp8E4M3 => loupe_core::FP8_E4M3_TYPE_ID,
        _ => 0,
    }
}

/// What happened to one tensor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TensorFate {
    Quantized {
        from: GgmlType,
    },
    Copied,
    /// Kept in its type: one-dimensional, or rows not a multiple of the target's block.
    Kept {
        reason: &'static str,
    },
    /// An embedding (see [`EMBEDDINGS`]) stored in f32/f16/bf16 written in `to` (Q8_0) rather
    /// than in a target with fewer bits.
    Embedding {
        from: GgmlType,
        to: GgmlType,
    },
}

/// The summary of a quantization.
#[derive(Debug, Clone)]
pub struct QuantizeReport {
    pub target: GgmlType,
    pub tensors: Vec<(String, TensorFate)>,
    pub bytes_in: u64,
    pub bytes_out: u64,
    /// Elements of the quantized or copied matrices, and their bits per weight after.
    pub matrix_elements: u64,
    pub matrix_bytes_out: u64,
}

impl QuantizeReport {
    pub fn bits_per_weight(&self) -> f64 {
        if self.matrix_elements == 0 {
            return 0.0;
        }
        8.0 * self.matrix_bytes_out as f64 / self.matrix_elements as f64
    }
}

/// Bits per weight of a type's blocks.
fn bits(ty: GgmlType) -> f64 {
    8.0 * ty.type_size() as f64 / ty.block_size() as f64
}

/// The token embedding and the output projection: the tensors llama.cpp's quantizer keeps
/// at higher precision than the body (its `output.weight` gets Q6_K in the 4- and 5-bit
/// mixes), because every token's input and every logit goes through them.
pub const EMBEDDINGS: [&str; 2] = ["token_embd.weight", "output.weight"];

/// The type an f32/f16/bf16 embedding is written in when it keeps more bits than a target
/// with fewer bits than this (see the module docs); above it, the target.
pub const FLOAT_EMBEDDING_TYPE: GgmlType = GgmlType::Q8_0;

/// One tensor of a quantization's input, in GGUF naming and layout.
pub struct InputTensor<'a> {
    pub name: String,
    /// ggml order: `dims[0]` is the row length.
    pub dims: Vec<u64>,
    pub ty: GgmlType,
    pub data: Cow<'a, [u8]>,
    /// NVFP4's per-tensor scale (1 for every other type).
    pub scale: f32,
}

impl InputTensor<'_> {
    fn n_elements(&self) -> u64 {
        self.dims.iter().product()
    }
}

/// What `loupe quantize` reads: metadata and tensors in GGUF naming and layout.
pub trait TensorSource {
    /// The input, for error messages.
    fn path(&self) -> &Path;
    /// Every metadata key to write except `general.file_type`.
    fn metadata(&self) -> Vec<(String, GgufValue)>;
    /// How many tensors [`TensorSource::tensor`] numbers.
    fn tensor_count(&self) -> usize;
    /// Bytes of tensor data the input holds.
    fn bytes_in(&self) -> u64;
    /// Tensor `i`; `None` for one that travels with another (NVFP4's scale sidecars).
    fn tensor(&self, i: usize) -> Result<Option<InputTensor<'_>>, ModelError>;
}

/// A GGUF file as a [`TensorSource`]: its metadata and tensors as they are.
pub struct GgufInput {
    file: GgufFile,
    /// NVFP4's per-tensor scales travel with their tensors, never on their own.
    sidecars: Vec<String>,
}

impl GgufInput {
    pub fn open(path: &Path) -> Result<GgufInput, ModelError> {
        let file = GgufFile::open(path)?;
        let sidecars =
            file.tensors.iter().filter(|t| t.ggml_type == GgmlType::Nvfp4).map(|t| nvfp4_scale_name(&t.name)).collect();
        Ok(GgufInput { file, sidecars })
    }
}

impl TensorSource for GgufInput {
    fn path(&self) -> &Path {
        &self.file.path
    }

    fn metadata(&self) -> Vec<(String, GgufValue)> {
        self.file
            .metadata
            .iter()
            .filter(|(k, _)| k.as_str() != "general.file_type")
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }

    fn tensor_count(&self) -> usize {
        self.file.tensors.len()
    }

    fn bytes_in(&self) -> u64 {
        self.file.tensors.iter().map(|t| self.file.tensor_data(t).len() as u64).sum()
    }

    fn tensor(&self, i: usize) -> Result<Option<InputTensor<'_>>, ModelError> {
        let info = &self.file.tensors[i];
        if self.sidecars.contains(&info.name) {
            return Ok(None);
        }
        let scale = if info.ggml_type == GgmlType::Nvfp4 { nvfp4_tensor_scale(&self.file, &info.name)? } else { 1.0 };
        Ok(Some(InputTensor {
            name: info.name.clone(),
            dims: info.dims.clone(),
            ty: info.ggml_type,
            data: Cow::Borrowed(self.file.tensor_data(info)),
            scale,
        }))
    }
}

/// Writes `input` with its matrices in `target` to `output`; with `keep_embeddings`, the
/// [`EMBEDDINGS`] keep more bits than `target` where they have them (see the module docs).
/// `progress(done, total)` after each tensor.
pub fn quantize_gguf(
    input: &Path,
    output: &Path,
    target: GgmlType,
    keep_embeddings: bool,
    progress: impl FnMut(usize, usize),
) -> Result<QuantizeReport, ModelError> {
    check_target(target, output)?;
    quantize_source(&GgufInput::open(input)?, output, target, keep_embeddings, progress)
}

fn check_target(target: GgmlType, output: &Path) -> Result<(), ModelError> {
    if TARGETS.contains(&target) {
        return Ok(());
    }
    let names: Vec<&str> = TARGETS.iter().map(|t| t.name()).collect();
    Err(ModelError::NotAModel {
        path: output.to_path_buf(),
        reason: format!("cannot write {} (quantize writes {})", target.name(), names.join(", ")),
    })
}

/// [`quantize_gguf`] for any [`TensorSource`].
pub fn quantize_source(
    source: &dyn TensorSource,
    output: &Path,
    target: GgmlType,
    keep_embeddings: bool,
    mut progress: impl FnMut(usize, usize),
) -> Result<QuantizeReport, ModelError> {
    check_target(target, output)?;
    let mut writer = GgufWriter::new().with_label(output);
    for (key, value) in source.metadata() {
        writer.add(key, value);
    }
    writer.add("general.file_type", GgufValue::U32(file_type(target)));
    let mut report = QuantizeReport {
        target,
        tensors: Vec::new(),
        bytes_in: source.bytes_in(),
        bytes_out: 0,
        matrix_elements: 0,
        matrix_bytes_out: 0,
    };
    let total = source.tensor_count();
    for i in 0..total {
        let Some(t) = source.tensor(i)? else {
            progress(i + 1, total);
            continue;
        };
        let cols = t.dims.first().copied().unwrap_or(0) as usize;
        let splits =
            |ty: GgmlType| cols != 0 && cols.is_multiple_of(ty.block_size()) && cols.is_multiple_of(t.ty.block_size());
        let kept_embedding = keep_embeddings && EMBEDDINGS.contains(&t.name.as_str()) && bits(t.ty) > bits(target);
        let float = matches!(t.ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16);
        let (ty, bytes, fate, out_scale) = if t.dims.len() < 2 {
            (t.ty, t.data.to_vec(), TensorFate::Kept { reason: "one-dimensional" }, t.scale)
        } else if kept_embedding && float && bits(target) < bits(FLOAT_EMBEDDING_TYPE) && splits(FLOAT_EMBEDDING_TYPE) {
            let (bytes, scale) = convert(source.path(), &t, FLOAT_EMBEDDING_TYPE)?;
            (FLOAT_EMBEDDING_TYPE, bytes, TensorFate::Embedding { from: t.ty, to: FLOAT_EMBEDDING_TYPE }, scale)
        } else if kept_embedding && !float {
            (
                t.ty,
                t.data.to_vec(),
                TensorFate::Kept { reason: "embedding kept at its higher precision (--all quantizes it)" },
                t.scale,
            )
        } else if t.ty == target {
            (target, t.data.to_vec(), TensorFate::Copied, t.scale)
        } else if !splits(target) {
            (t.ty, t.data.to_vec(), TensorFate::Kept { reason: "rows do not split into the target's blocks" }, t.scale)
        } else {
            let (bytes, scale) = convert(source.path(), &t, target)?;
            (target, bytes, TensorFate::Quantized { from: t.ty }, scale)
        };
        if !matches!(fate, TensorFate::Kept { .. }) {
            report.matrix_elements += t.n_elements();
            report.matrix_bytes_out += bytes.len() as u64;
        }
        report.bytes_out += bytes.len() as u64;
        writer.add_tensor(t.name.clone(), &t.dims, ty, bytes);
        report.tensors.push((t.name.clone(), fate));
        if ty == GgmlType::Nvfp4 {
            let name = nvfp4_scale_name(&t.name);
            writer.add_tensor(name.clone(), &[1], GgmlType::F32, out_scale.to_le_bytes().to_vec());
            report.bytes_out += 4;
            report.tensors.push((name, TensorFate::Kept { reason: "NVFP4 per-tensor scale" }));
        }
        progress(i + 1, total);
    }
    writer.write_to_path(output)?;
    Ok(report)
}

/// Tensor `t` (whose rows split into `to`'s blocks) widened row by row to f32 and quantized
/// to `to`; with NVFP4's per-tensor scale for `to` (1 for other types).
fn convert(path: &Path, t: &InputTensor<'_>, to: GgmlType) -> Result<(Vec<u8>, f32), ModelError> {
    let tensor_error = |source| ModelError::Tensor { path: path.to_path_buf(), name: t.name.clone(), source };
    let cols = t.dims[0] as usize;
    let rows = (t.n_elements() as usize) / cols;
    let in_row = cols / t.ty.block_size() * t.ty.type_size();
    let out_row = cols / to.block_size() * to.type_size();
    let mut out = vec![
        0u8;
        rows.checked_mul(out_row).ok_or_else(|| tensor_error(loupe_tensor::TensorError::Shape {
            op: "quantize",
            detail: format!("{rows} rows of {out_row} bytes overflow")
        }))?
    ];
    let mut row = vec![0f32; cols];
    let widen = |src: &[u8], row: &mut [f32]| -> Result<(), ModelError> {
        dequantize_row(t.ty, src, row).map_err(tensor_error)?;
        if t.scale != 1.0 {
            row.iter_mut().for_each(|v| *v *= t.scale);
        }
        Ok(())
    };
    let out_scale = if to == GgmlType::Nvfp4 {
        // The second level needs the whole tensor's largest magnitude first.
        let mut amax = 0f32;
        for src in t.data.chunks_exact(in_row) {
            widen(src, &mut row)?;
            amax = row.iter().fold(amax, |m, v| m.max(v.abs()));
        }
        nvfp4_tensor_scale_for(amax)
    } else {
        1.0
    };
    for (src, dst) in t.data.chunks_exact(in_row).zip(out.chunks_exact_mut(out_row)) {
        widen(src, &mut row)?;
        if out_scale != 1.0 {
            row.iter_mut().for_each(|v| *v /= out_scale);
        }
        quantize_row(to, &row, dst).map_err(tensor_error)?;
    }
    Ok((out, out_scale))
}
