//! `loupe quantize`: a GGUF rewritten with its weight matrices in another GGML type.
//!
//! Every tensor of two or more dimensions whose rows split into the target's blocks is
//! widened to f32 row by row (any type loupe reads, K-quants included) and quantized to the
//! target as ggml's reference quantizers do ([`loupe_tensor::quant::quantize_row`]); a tensor
//! already in the target type is copied unchanged (requantizing its own values could only add
//! error). One-dimensional tensors (norm weights, biases) and matrices whose rows do not split
//! into blocks are copied as they are, as llama.cpp's quantizer keeps them; so are the token
//! embedding and output projection when they hold more bits than the target (unless asked
//! otherwise). The metadata is
//! copied, with `general.file_type` set to the target's llama.cpp file type.

use std::path::Path;

use loupe_core::GgmlType;
use loupe_formats::{GgufFile, GgufValue, GgufWriter};
use loupe_tensor::quant::{dequantize_row, quantize_row};

use crate::weights::{nvfp4_scale_name, nvfp4_tensor_scale};
use crate::ModelError;

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
    if !(amax > 0.0) || !amax.is_finite() {
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
    Quantized { from: GgmlType },
    Copied,
    /// Kept in its type: one-dimensional, or rows not a multiple of the target's block.
    Kept { reason: &'static str },
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

/// Writes `input` with its matrices in `target` to `output`; with `keep_embeddings`, the
/// [`EMBEDDINGS`] stay in their type where it has more bits than `target`.
/// `progress(done, total)` after each tensor.
/// Bits per weight of a type's blocks.
fn bits(ty: GgmlType) -> f64 {
    8.0 * ty.type_size() as f64 / ty.block_size() as f64
}

/// The token embedding and the output projection: the tensors llama.cpp's quantizer keeps
/// at higher precision than the body (its `output.weight` gets Q6_K in the 4- and 5-bit
/// mixes), because every token's input and every logit goes through them.
pub const EMBEDDINGS: [&str; 2] = ["token_embd.weight", "output.weight"];

pub fn quantize_gguf(input: &Path, output: &Path, target: GgmlType, keep_embeddings: bool, mut progress: impl FnMut(usize, usize)) -> Result<QuantizeReport, ModelError> {
    if !TARGETS.contains(&target) {
        let names: Vec<&str> = TARGETS.iter().map(|t| t.name()).collect();
        return Err(ModelError::NotAModel { path: output.to_path_buf(), reason: format!("cannot write {} (quantize writes {})", target.name(), names.join(", ")) });
    }
    let file = GgufFile::open(input)?;
    let mut writer = GgufWriter::new().with_label(output);
    for (key, value) in &file.metadata {
        if key == "general.file_type" {
            continue;
        }
        writer.add(key.clone(), value.clone());
    }
    writer.add("general.file_type", GgufValue::U32(file_type(target)));
    let mut report = QuantizeReport { target, tensors: Vec::new(), bytes_in: 0, bytes_out: 0, matrix_elements: 0, matrix_bytes_out: 0 };
    // NVFP4's per-tensor scales travel with their tensors (below), never on their own.
    let sidecars: Vec<String> = file.tensors.iter().filter(|t| t.ggml_type == GgmlType::Nvfp4).map(|t| nvfp4_scale_name(&t.name)).collect();
    let total = file.tensors.len();
    for (i, info) in file.tensors.iter().enumerate() {
        let data = file.tensor_data(info);
        report.bytes_in += data.len() as u64;
        if sidecars.contains(&info.name) {
            progress(i + 1, total);
            continue;
        }
        let cols = info.dims.first().copied().unwrap_or(0) as usize;
        let tensor_error = |source| ModelError::Tensor { path: input.to_path_buf(), name: info.name.clone(), source };
        // The input's own per-tensor scale (NVFP4 inputs; 1 for every other type).
        let in_scale = if info.ggml_type == GgmlType::Nvfp4 { nvfp4_tensor_scale(&file, &info.name)? } else { 1.0 };
        let (ty, bytes, fate, out_scale) = if info.dims.len() < 2 {
            (info.ggml_type, data.to_vec(), TensorFate::Kept { reason: "one-dimensional" }, in_scale)
        } else if keep_embeddings && EMBEDDINGS.contains(&info.name.as_str()) && bits(info.ggml_type) > bits(target) {
            (info.ggml_type, data.to_vec(), TensorFate::Kept { reason: "embedding kept at its higher precision (--all quantizes it)" }, in_scale)
        } else if info.ggml_type == target {
            (target, data.to_vec(), TensorFate::Copied, in_scale)
        } else if cols == 0 || !cols.is_multiple_of(target.block_size()) || !cols.is_multiple_of(info.ggml_type.block_size()) {
            (info.ggml_type, data.to_vec(), TensorFate::Kept { reason: "rows do not split into the target's blocks" }, in_scale)
        } else {
            let rows = (info.n_elements() as usize) / cols;
            let in_row = cols / info.ggml_type.block_size() * info.ggml_type.type_size();
            let out_row = cols / target.block_size() * target.type_size();
            let mut out = vec![0u8; rows.checked_mul(out_row).ok_or_else(|| tensor_error(loupe_tensor::TensorError::Shape { op: "quantize", detail: format!("{rows} rows of {out_row} bytes overflow") }))?];
            let mut row = vec![0f32; cols];
            let widen = |src: &[u8], row: &mut [f32]| -> Result<(), ModelError> {
                dequantize_row(info.ggml_type, src, row).map_err(tensor_error)?;
                if in_scale != 1.0 {
                    row.iter_mut().for_each(|v| *v *= in_scale);
                }
                Ok(())
            };
            let out_scale = if target == GgmlType::Nvfp4 {
                // The second level needs the whole tensor's largest magnitude first.
                let mut amax = 0f32;
                for src in data.chunks_exact(in_row) {
                    widen(src, &mut row)?;
                    amax = row.iter().fold(amax, |m, v| m.max(v.abs()));
                }
                nvfp4_tensor_scale_for(amax)
            } else {
                1.0
            };
            for (src, dst) in data.chunks_exact(in_row).zip(out.chunks_exact_mut(out_row)) {
                widen(src, &mut row)?;
                if out_scale != 1.0 {
                    row.iter_mut().for_each(|v| *v /= out_scale);
                }
                quantize_row(target, &row, dst).map_err(tensor_error)?;
            }
            (target, out, TensorFate::Quantized { from: info.ggml_type }, out_scale)
        };
        if !matches!(fate, TensorFate::Kept { .. }) {
            report.matrix_elements += info.n_elements();
            report.matrix_bytes_out += bytes.len() as u64;
        }
        report.bytes_out += bytes.len() as u64;
        writer.add_tensor(info.name.clone(), &info.dims, ty, bytes);
        report.tensors.push((info.name.clone(), fate));
        if ty == GgmlType::Nvfp4 {
            let name = nvfp4_scale_name(&info.name);
            writer.add_tensor(name.clone(), &[1], GgmlType::F32, out_scale.to_le_bytes().to_vec());
            report.bytes_out += 4;
            report.tensors.push((name, TensorFate::Kept { reason: "NVFP4 per-tensor scale" }));
        }
        progress(i + 1, total);
    }
    writer.write_to_path(output)?;
    Ok(report)
}
