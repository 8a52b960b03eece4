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

use crate::ModelError;

/// Types `loupe quantize --type` writes.
pub const TARGETS: [GgmlType; 9] =
    [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1, GgmlType::Q8_0, GgmlType::Mxfp4, GgmlType::F16, GgmlType::BF16, GgmlType::F32];

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
    let total = file.tensors.len();
    for (i, info) in file.tensors.iter().enumerate() {
        let data = file.tensor_data(info);
        report.bytes_in += data.len() as u64;
        let cols = info.dims.first().copied().unwrap_or(0) as usize;
        let tensor_error = |source| ModelError::Tensor { path: input.to_path_buf(), name: info.name.clone(), source };
        let (ty, bytes, fate) = if info.dims.len() < 2 {
            (info.ggml_type, data.to_vec(), TensorFate::Kept { reason: "one-dimensional" })
        } else if keep_embeddings && EMBEDDINGS.contains(&info.name.as_str()) && bits(info.ggml_type) > bits(target) {
            (info.ggml_type, data.to_vec(), TensorFate::Kept { reason: "embedding kept at its higher precision (--all quantizes it)" })
        } else if info.ggml_type == target {
            (target, data.to_vec(), TensorFate::Copied)
        } else if cols == 0 || !cols.is_multiple_of(target.block_size()) || !cols.is_multiple_of(info.ggml_type.block_size()) {
            (info.ggml_type, data.to_vec(), TensorFate::Kept { reason: "rows do not split into the target's blocks" })
        } else {
            let rows = (info.n_elements() as usize) / cols;
            let in_row = cols / info.ggml_type.block_size() * info.ggml_type.type_size();
            let out_row = cols / target.block_size() * target.type_size();
            let mut out = vec![0u8; rows.checked_mul(out_row).ok_or_else(|| tensor_error(loupe_tensor::TensorError::Shape { op: "quantize", detail: format!("{rows} rows of {out_row} bytes overflow") }))?];
            let mut row = vec![0f32; cols];
            for (src, dst) in data.chunks_exact(in_row).zip(out.chunks_exact_mut(out_row)) {
                dequantize_row(info.ggml_type, src, &mut row).map_err(tensor_error)?;
                quantize_row(target, &row, dst).map_err(tensor_error)?;
            }
            (target, out, TensorFate::Quantized { from: info.ggml_type })
        };
        if !matches!(fate, TensorFate::Kept { .. }) {
            report.matrix_elements += info.n_elements();
            report.matrix_bytes_out += bytes.len() as u64;
        }
        report.bytes_out += bytes.len() as u64;
        writer.add_tensor(info.name.clone(), &info.dims, ty, bytes);
        report.tensors.push((info.name.clone(), fate));
        progress(i + 1, total);
    }
    writer.write_to_path(output)?;
    Ok(report)
}
