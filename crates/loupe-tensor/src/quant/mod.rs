//! GGML block quantization: dequantize, quantize, and quantized dot products.
//!
//! Data flow of a quantized linear layer (`y = x @ W^T`, see `crate::linear`):
//! the weight rows stay in their GGUF block type; each activation row is quantized
//! once to the weight's [`vec_dot_type`] (Q8_0, Q8_1 or Q8_K, as ggml does); then
//! [`vec_dot`] multiplies one weight row by one activation row with integer
//! arithmetic per block and one f32 scale multiply per block.
//!
//! Every dot kernel has a scalar reference (`scalar.rs`); AVX2 (`avx2.rs`) and
//! AVX-512 VNNI (`avx512.rs`) versions are picked at run time by [`Isa::active`]
//! and tested against the reference over every ISA this CPU has. Matmul uses
//! register-tiled variants (`avx512_tile.rs`, `avx512_wide.rs`, `avx512_ftile.rs`, `avx512_ktile.rs`: several weight
//! rows x several activation rows per call) where they exist.
//!
//! | weight | activations | scalar | AVX2 | AVX-512 | AVX-512 tile |
//! | --- | --- | --- | --- | --- | --- |
//! | F32, F16, BF16 | F32 | yes | yes | yes | 4 x 4 |
//! | Q4_0, Q5_0, Q8_0 | Q8_0 | yes | yes | yes (VNNI) | 4 x 2, 2 x 10 (same bits) |
//! | Q4_1, Q5_1 | Q8_1 | yes | yes | yes (VNNI) | 4 x 2 |
//! | Q8_1 | Q8_1 | yes | - | - | - |
//! | Q4_K, Q6_K | Q8_K | yes | yes (lanes; 1 x 4 tiles) | (AVX2) | 4 x 2, 1 x 8 (lanes, same bits) |
//! | Q5_K | Q8_K | yes | yes | (AVX2) | - |
//! | Q2_K, Q3_K | Q8_K | yes | - | - | - |
//! | Q8_K | Q8_K | yes | - | - | - |
//!
//! Quantizing activations: scalar for every type, AVX-512 for Q8_0 and Q8_1
//! (byte-identical).

pub mod blocks;
pub(crate) mod dequant;
mod isa;
mod quantize;
mod scalar;

/// A tile instantiation's arguments: those of [`TileFn`] without the tile shape.
#[cfg(target_arch = "x86_64")]
type TileArgs = (*const u8, usize, *const u8, usize, usize, *mut f32, usize);

/// Defines `dispatch::<F: $bound>`, the [`TileFn`] of a tile file: it runs `$tile::<F, RW,
/// CA>(TileArgs)` for the edge tile `nw x na` among the `(RW, CA)` shapes listed (the
/// callers never ask for more than the file's `MAX_RW x MAX_CA`).
#[cfg(target_arch = "x86_64")]
macro_rules! tile_dispatch {
    ($bound:path, $tile:ident, $(($r:literal, $c:literal)),* $(,)?) => {
        /// Picks the instantiation for an edge tile of `nw x na`.
        #[allow(clippy::too_many_arguments)] // the TileFn signature
        unsafe fn dispatch<F: $bound>(
            w: *const u8,
            w_stride: usize,
            nw: usize,
            a: *const u8,
            a_stride: usize,
            na: usize,
            n: usize,
            out: *mut f32,
            out_stride: usize,
        ) {
            let args: super::TileArgs = (w, w_stride, a, a_stride, n, out, out_stride);
            match (nw, na) {
                $(($r, $c) => $tile::<F, $r, $c>(args),)*
                _ => unreachable!("tile {nw} x {na} exceeds {MAX_RW} x {MAX_CA} (checked by the caller)"),
            }
        }
    };
}

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx2_klanes;
#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(target_arch = "x86_64")]
mod avx512_ftile;
#[cfg(target_arch = "x86_64")]
mod avx512_ktile;
#[cfg(target_arch = "x86_64")]
mod avx512_tile;
#[cfg(target_arch = "x86_64")]
mod avx512_wide;

#[cfg(target_endian = "big")]
compile_error!("loupe reads GGML blocks in place as little-endian; big-endian targets are unsupported");

pub use isa::{vendor_is_amd, Isa};

use crate::TensorError;
use loupe_core::GgmlType;

/// A dot-product kernel: `(weight_row, activation_row, n_elements) -> sum`.
/// The rows are raw bytes of `n` elements of the weight type and of its
/// [`vec_dot_type`]; both may sit at any alignment.
pub type VecDotFn = fn(&[u8], &[u8], usize) -> f32;

/// The type activations are quantized to before a dot product with weights of
/// type `ty` (ggml's `type_traits_cpu[ty].vec_dot_type`). Float weights take f32
/// activations as they are.
pub fn vec_dot_type(ty: GgmlType) -> GgmlType {
    match ty {
        GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 => GgmlType::Q8_0,
        GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q8_1 => GgmlType::Q8_1,
        GgmlType::Q2K | GgmlType::Q3K | GgmlType::Q4K => GgmlType::Q8K,
        GgmlType::Q5K | GgmlType::Q6K | GgmlType::Q8K => GgmlType::Q8K,
        // F32, F16, BF16 (and any float type added to GgmlType later).
        _ => GgmlType::F32,
    }
}

/// [`vec_dot_type`] as a method on [`GgmlType`].
pub trait GgmlTypeExt {
    /// See [`vec_dot_type`].
    fn vec_dot_type(self) -> GgmlType;
}

impl GgmlTypeExt for GgmlType {
    fn vec_dot_type(self) -> GgmlType {
        vec_dot_type(self)
    }
}

/// Bytes of one row of `n` elements of `ty`, or a shape error naming `op` when `n`
/// is not a whole number of blocks.
pub fn row_bytes(op: &'static str, ty: GgmlType, n: usize) -> Result<usize, TensorError> {
    ty.bytes_for(n as u64).map(|b| b as usize).ok_or_else(|| TensorError::Shape {
        op,
        detail: format!("{n} elements is not a multiple of the {ty} block size {}", ty.block_size()),
    })
}

fn check_len(op: &'static str, ty: GgmlType, elements: usize, got: usize) -> Result<(), TensorError> {
    let expected = row_bytes(op, ty, elements)?;
    if got != expected {
        return Err(TensorError::ByteLength { op, dtype: ty, elements, expected, got });
    }
    Ok(())
}

/// Converts `dst.len()` elements of type `ty` from `src` (exactly that many
/// elements' bytes, any alignment) to f32. Results are bit-identical to
/// gguf-py's `quants.dequantize` and ggml's `dequantize_row_*`.
pub fn dequantize_row(ty: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<(), TensorError> {
    check_len("dequantize_row", ty, dst.len(), src.len())?;
    match ty {
        GgmlType::F32 => dequant::f32_row(src, dst),
        GgmlType::F16 => dequant::f16_row(src, dst),
        GgmlType::BF16 => dequant::bf16_row(src, dst),
        GgmlType::Q4_0 => dequant::q4_0(src, dst),
        GgmlType::Q4_1 => dequant::q4_1(src, dst),
        GgmlType::Q5_0 => dequant::q5_0(src, dst),
        GgmlType::Q5_1 => dequant::q5_1(src, dst),
        GgmlType::Q8_0 => dequant::q8_0(src, dst),
        GgmlType::Q8_1 => dequant::q8_1(src, dst),
        GgmlType::Q2K => dequant::q2_k(src, dst),
        GgmlType::Q3K => dequant::q3_k(src, dst),
        GgmlType::Q4K => dequant::q4_k(src, dst),
        GgmlType::Q5K => dequant::q5_k(src, dst),
        GgmlType::Q6K => dequant::q6_k(src, dst),
        GgmlType::Q8K => dequant::q8_k(src, dst),
        GgmlType::Mxfp4 => dequant::mxfp4(src, dst),
        GgmlType::Nvfp4 => dequant::nvfp4(src, dst),
        GgmlType::Fp8E4M3 => dequant::fp8_e4m3(src, dst),
        _ => return Err(TensorError::UnsupportedType { op: "dequantize_row", dtype: ty }),
    }
    Ok(())
}

/// Quantizes `src` into `dst` (exactly the bytes for `src.len()` elements of
/// `ty`), as ggml's `quantize_row_*_ref` would. Supported: F32, F16, BF16, Q4_0,
/// Q4_1, Q5_0, Q5_1, Q8_0, Q8_1, Q8_K, MXFP4, NVFP4, FP8 E4M3 and Q4_K; the other K-quant weight
/// types are not.
pub fn quantize_row(ty: GgmlType, src: &[f32], dst: &mut [u8]) -> Result<(), TensorError> {
    quantize_row_with(Isa::active(), ty, src, dst)
}

/// [`quantize_row`] on the kernels of a given ISA level. Every level produces the
/// same bytes; only speed differs (Q8_0 and Q8_1, the activation types of the
/// legacy quants, have AVX-512 versions).
///
/// # Panics
/// If this CPU does not support `isa`.
pub fn quantize_row_with(isa: Isa, ty: GgmlType, src: &[f32], dst: &mut [u8]) -> Result<(), TensorError> {
    assert!(isa.is_supported(), "quantize_row_with: this CPU does not support {isa}");
    check_len("quantize_row", ty, src.len(), dst.len())?;
    #[cfg(target_arch = "x86_64")]
    if isa >= Isa::Avx512 && matches!(ty, GgmlType::Q8_0 | GgmlType::Q8_1) {
        // SAFETY: the CPU supports AVX-512 (asserted above); lengths checked.
        unsafe { avx512::quantize_q8(src, dst, ty == GgmlType::Q8_1) };
        return Ok(());
    }
    match ty {
        GgmlType::F32 => quantize::f32_row(src, dst),
        GgmlType::F16 => quantize::f16_row(src, dst),
        GgmlType::BF16 => quantize::bf16_row(src, dst),
        GgmlType::Q4_0 => quantize::q4_0(src, dst),
        GgmlType::Q4_1 => quantize::q4_1(src, dst),
        GgmlType::Q5_0 => quantize::q5_0(src, dst),
        GgmlType::Q5_1 => quantize::q5_1(src, dst),
        GgmlType::Q8_0 => quantize::q8_0(src, dst),
        GgmlType::Q8_1 => quantize::q8_1(src, dst),
        GgmlType::Q8K => quantize::q8_k(src, dst),
        GgmlType::Mxfp4 => quantize::mxfp4(src, dst),
        GgmlType::Nvfp4 => quantize::nvfp4(src, dst),
        GgmlType::Fp8E4M3 => quantize::fp8_e4m3(src, dst),
        GgmlType::Q4K => quantize::q4_k(src, dst),
        _ => return Err(TensorError::UnsupportedType { op: "quantize_row", dtype: ty }),
    }
    Ok(())
}

/// Whether [`quantize_row`] supports `ty`.
pub fn can_quantize(ty: GgmlType) -> bool {
    !matches!(ty, GgmlType::Q2K | GgmlType::Q3K | GgmlType::Q5K | GgmlType::Q6K) && GgmlType::ALL.contains(&ty)
}

/// Dot product of `n` elements: a weight row of type `wty` with an activation row
/// already quantized to `vec_dot_type(wty)` (for float weights: f32 bytes).
///
/// Uses the kernels of [`Isa::active`]. Activation rows must come from
/// [`quantize_row`]: the kernels that multiply signed by signed bytes with the
/// `|w| * (a * sign(w))` trick (AVX2 Q4_0/Q5_0/Q8_0, AVX-512 Q8_0) need activation
/// quants in -127..=127, which the quantizers guarantee (-128 would negate to
/// itself).
///
/// # Panics
/// If `n` is not a multiple of the block size or a row is shorter than `n`
/// elements.
pub fn vec_dot(wty: GgmlType, w_row: &[u8], act_row: &[u8], n: usize) -> f32 {
    vec_dot_fn(Isa::active(), wty)(w_row, act_row, n)
}

/// [`vec_dot`] with the kernels of a given ISA level (for tests and bisecting).
///
/// # Panics
/// As [`vec_dot`], and if this CPU does not support `isa`.
pub fn vec_dot_with(isa: Isa, wty: GgmlType, w_row: &[u8], act_row: &[u8], n: usize) -> f32 {
    vec_dot_fn(isa, wty)(w_row, act_row, n)
}

/// The dot kernel for weights of type `wty` at ISA level `isa`: the most
/// specialized kernel at or below that level. Fetch it once per matmul, call it
/// per row.
///
/// # Panics
/// If this CPU does not support `isa` (the returned function would execute
/// unsupported instructions) or `wty` is not a type loupe knows.
pub fn vec_dot_fn(isa: Isa, wty: GgmlType) -> VecDotFn {
    assert!(isa.is_supported(), "vec_dot_fn: this CPU does not support {isa}");
    #[cfg(target_arch = "x86_64")]
    {
        if isa >= Isa::Avx512 {
            if let Some(f) = avx512::dot_fn(wty) {
                return f;
            }
        }
        if isa >= Isa::Avx2 {
            if let Some(f) = avx2::dot_fn(wty) {
                return f;
            }
        }
    }
    scalar::dot_fn(wty)
}

/// How far ahead of their loads the float dot kernels (one row and [`float_rows`]) prefetch
/// the weights into L2, in bytes. Without it the hardware prefetcher fell behind the weight
/// stream, the more so with several activation rows per weight row; 4 KiB is about half a
/// microsecond of one core's share of the read bandwidth (BENCHMARKS.md, "Q4_0 decode and
/// fast drafts", for the measurements).
const FLOAT_ROWS_PREFETCH: usize = 4096;

/// One float weight row (F32, F16 or BF16, `k` elements) against the `x.len() / k`
/// activation rows of `x`: `store(i, dot)` for each row `i`, each dot bit for bit what
/// [`vec_dot_fn`]`(isa, ty)` gives for that row alone (the same kernel, run on several rows
/// at once so the weights are loaded and widened once for all of them): what keeps a
/// float model's batched rows (speculative verification, the batched engine) identical to
/// its one-row decode.
///
/// # Panics
/// If this CPU does not support `isa`, `ty` is not a float type, or `w_row` and `x` are not
/// whole rows of `k`.
pub(crate) fn float_rows(isa: Isa, ty: GgmlType, w_row: &[u8], x: &[f32], k: usize, mut store: impl FnMut(usize, f32)) {
    assert!(isa.is_supported(), "float_rows: this CPU does not support {isa}");
    let size = float_size("float_rows", ty);
    assert!(
        k > 0 && w_row.len() == k * size && x.len().is_multiple_of(k),
        "float_rows: {} weight bytes and {} activations are not rows of {k}",
        w_row.len(),
        x.len()
    );
    let m = x.len() / k;
    #[cfg(target_arch = "x86_64")]
    if isa >= Isa::Avx2 {
        let (w, a) = (w_row.as_ptr(), x.as_ptr());
        macro_rules! rows {
            ($module:ident, $most:expr, [$($na:literal),*]) => {{
                let mut i = 0;
                while i < m {
                    let na = (m - i).min($most);
                    // SAFETY: the CPU supports the module's ISA (asserted above, `isa` at
                    // least that level); the weight row holds `k` elements and rows `i..i +
                    // na` of `x` lie within it (checked above).
                    let ai = unsafe { a.add(i * k) };
                    let dots: &[f32] = match (ty, na) {
                        $(
                            (GgmlType::F32, $na) => &unsafe { $module::dot_f32_rows::<$na>(w, ai, k, k) },
                            (GgmlType::F16, $na) => &unsafe { $module::dot_f16_rows::<$na>(w, ai, k, k) },
                            (_, $na) => &unsafe { $module::dot_bf16_rows::<$na>(w, ai, k, k) },
                        )*
                        _ => unreachable!("row counts are 1..={}", $most),
                    };
                    for (r, &v) in dots.iter().enumerate() {
                        store(i + r, v);
                    }
                    i += na;
                }
            }};
        }
        if isa >= Isa::Avx512 {
            rows!(avx512, 6, [1, 2, 3, 4, 5, 6]);
        } else {
            rows!(avx2, 3, [1, 2, 3]);
        }
        return;
    }
    let dot = vec_dot_fn(isa, ty);
    for (i, xi) in x.chunks_exact(k).enumerate() {
        store(i, dot(w_row, f32_bytes(xi), k));
    }
}

/// Elements of `k` the segmented float kernels (`avx512::dot_f16_segmented` and kin) advance a
/// group of weight rows' chains by before the next segment: 6 activation rows of 1,024 f32
/// (24 KiB) stay in a 32 KiB L1 while the group's rows pass over them.
const FLOAT_SEGMENT: usize = 1024;

/// Weight rows whose chains the segmented float kernels carry across segments (their
/// accumulators, 1.5 KiB per row at 6 activation rows on AVX-512, wait in L1 and L2): the
/// smallest group with which an f16 4864-wide down_proj at 5 activation rows streamed at its
/// best, 1.7x one row at a time (BENCHMARKS.md, "Float weights' verification rows").
const FLOAT_SEGMENT_GROUP: usize = 16;

/// The body of both ISAs' `$segmented` float kernels (their `float_kernel!`): groups of
/// [`FLOAT_SEGMENT_GROUP`] weight rows, each group's chains (`$chains`, vectors of `$lanes`
/// f32 made by `$zero`) advanced a segment at a time, then `$finish`ed row by row into `$out`.
#[cfg(target_arch = "x86_64")]
macro_rules! float_segmented_body {
    ($chains:ident, $finish:ident, $zero:expr, $lanes:expr, $wsize:expr,
     $w:ident, $wstride:ident, $rows:ident, $a:ident, $n:ident, $stride:ident, $out:ident) => {{
        const GROUP: usize = super::FLOAT_SEGMENT_GROUP;
        let whole = $n / $lanes * $lanes;
        let mut j0 = 0;
        while j0 < $rows {
            let g = ($rows - j0).min(GROUP);
            let mut acc = [[[$zero; 4]; NA]; GROUP];
            let mut s = 0;
            while s < whole {
                let e = (s + super::FLOAT_SEGMENT).min(whole);
                // Prefetched while a row runs a segment: its next segment, or after its last,
                // the start of the next group's row in its place (the order rows are read in).
                let ahead = if e < whole { super::FLOAT_SEGMENT * $wsize } else { GROUP * $wstride - s * $wsize };
                for j in 0..g {
                    $chains::<NA>($w.add((j0 + j) * $wstride), $a, $stride, s..e, ahead, &mut acc[j]);
                }
                s = e;
            }
            for j in 0..g {
                let dots = $finish::<NA>($w.add((j0 + j) * $wstride), $a, $n, $stride, whole, &acc[j]);
                $out[(j0 + j) * NA..(j0 + j + 1) * NA].copy_from_slice(&dots);
            }
            j0 += g;
        }
    }};
}
#[cfg(target_arch = "x86_64")]
pub(crate) use float_segmented_body;

/// Rows of `k` from which [`float_rows_band`] takes the segmented kernels: below, a few
/// activation rows of `k` fit L1 whole.
const FLOAT_SEGMENT_MIN_K: usize = 2 * FLOAT_SEGMENT;

/// [`float_rows`] for each of the `w_rows.len() / (k * size)` consecutive weight rows of
/// `w_rows`: `store(i, j, dot)` for activation row `i` and weight row `j`, each dot bit for bit
/// [`float_rows`]'s. Several activation rows of a long `k` go through the segmented kernels,
/// which advance the same chains a segment at a time over a group of weight rows, so the
/// activations' segment is read from L1 by every row of the group.
///
/// # Panics
/// As [`float_rows`], and if `w_rows` is not whole rows of `k`.
pub(crate) fn float_rows_band(
    isa: Isa,
    ty: GgmlType,
    w_rows: &[u8],
    x: &[f32],
    k: usize,
    mut store: impl FnMut(usize, usize, f32),
) {
    let row_bytes = k * float_size("float_rows_band", ty);
    assert!(
        k > 0 && w_rows.len().is_multiple_of(row_bytes) && x.len().is_multiple_of(k),
        "float_rows_band: {} weight bytes and {} activations are not rows of {k}",
        w_rows.len(),
        x.len()
    );
    let (n, m) = (w_rows.len() / row_bytes, x.len() / k);
    #[cfg(target_arch = "x86_64")]
    if isa >= Isa::Avx2 && m > 1 && k >= FLOAT_SEGMENT_MIN_K {
        assert!(isa.is_supported(), "float_rows_band: this CPU does not support {isa}");
        /// Weight rows per call of a segmented kernel (its outputs on the stack); more than 6
        /// activation rows pass over them in turn while they are in L2 (311 KiB of F16 rows
        /// of 4864).
        const ROWS: usize = 32;
        let mut out = [0f32; ROWS * 6];
        macro_rules! segmented {
            ($module:ident, $most:expr, [$($na:literal),*]) => {{
                let mut j = 0;
                while j < n {
                    let rows = (n - j).min(ROWS);
                    let mut i = 0;
                    while i < m {
                        let na = (m - i).min($most);
                        let (w, a) = (w_rows[j * row_bytes..].as_ptr(), x[i * k..].as_ptr());
                        let out = &mut out[..rows * na];
                        // SAFETY: the CPU supports the module's ISA (asserted above); weight rows
                        // `j..j + rows` and activation rows `i..i + na` lie within `w_rows` and
                        // `x` (whole rows of `k`, checked above); `out` holds `rows * na` values.
                        match (ty, na) {
                            $(
                                (GgmlType::F32, $na) => unsafe { $module::dot_f32_segmented::<$na>(w, row_bytes, rows, a, k, k, out) },
                                (GgmlType::F16, $na) => unsafe { $module::dot_f16_segmented::<$na>(w, row_bytes, rows, a, k, k, out) },
                                (_, $na) => unsafe { $module::dot_bf16_segmented::<$na>(w, row_bytes, rows, a, k, k, out) },
                            )*
                            _ => unreachable!("row counts are 1..={}", $most),
                        }
                        for (jr, dots) in out.chunks_exact(na).enumerate() {
                            for (r, &v) in dots.iter().enumerate() {
                                store(i + r, j + jr, v);
                            }
                        }
                        i += na;
                    }
                    j += rows;
                }
            }};
        }
        if isa >= Isa::Avx512 {
            segmented!(avx512, 6, [1, 2, 3, 4, 5, 6]);
        } else {
            segmented!(avx2, 3, [1, 2, 3]);
        }
        return;
    }
    for j in 0..n {
        float_rows(isa, ty, &w_rows[j * row_bytes..(j + 1) * row_bytes], x, k, |i, v| store(i, j, v));
    }
}

/// Bytes per element of a float weight type (F32, F16, BF16).
///
/// # Panics
/// If `ty` is not one of them (`op` names the caller).
fn float_size(op: &str, ty: GgmlType) -> usize {
    match ty {
        GgmlType::F32 => 4,
        GgmlType::F16 | GgmlType::BF16 => 2,
        _ => panic!("{op}: {ty} is not a float type"),
    }
}

/// `x` as its bytes (the activation side of a float [`VecDotFn`]).
pub(crate) fn f32_bytes(x: &[f32]) -> &[u8] {
    // SAFETY: any f32 is 4 initialized bytes; u8 has alignment 1.
    unsafe { std::slice::from_raw_parts(x.as_ptr().cast::<u8>(), std::mem::size_of_val(x)) }
}

/// A register-tiled dot kernel (the matmul microkernel): for `r < nw` weight rows
/// and `c < na` activation rows, `out[c * out_stride + r] = dot(w_r, a_c)`, where
/// `w_r = w + r * w_stride` and `a_c = a + c * a_stride` are rows of `n` elements.
///
/// # Safety
/// `1 <= nw <= max_rw`, `1 <= na <= max_ca` of the [`Tile`] it came from; every row
/// named must be readable for `n` elements of its type, and every `out` element
/// named must be writable and not aliased by anything else during the call.
pub(crate) type TileFn = unsafe fn(
    w: *const u8,
    w_stride: usize,
    nw: usize,
    a: *const u8,
    a_stride: usize,
    na: usize,
    n: usize,
    out: *mut f32,
    out_stride: usize,
);

/// Writes one quantized activation row of `k` elements (at the first pointer) in a wide
/// tile's prepared layout (at the second, [`WideTile::row_bytes`] bytes).
///
/// # Safety
/// The CPU supports the tile's ISA; both pointers are valid for those lengths.
pub(crate) type PrepareFn = unsafe fn(*const u8, usize, *mut u8);

/// A [`TileFn`] with its largest tile.
#[derive(Clone, Copy)]
pub(crate) struct Tile {
    pub f: TileFn,
    pub max_rw: usize,
    pub max_ca: usize,
    /// Rearranges activation rows (quantized to `vec_dot_type`, whole rows) into the order
    /// the kernel reads, in place, once per matmul before any tile runs; `None` when it
    /// reads them as quantized.
    pub arrange: Option<fn(&mut [u8])>,
    /// A tile for many activation rows, with the same bits per output, where one exists.
    pub wide: Option<WideTile>,
}

/// A wide tile (`avx512_wide`): `max_rw` weight rows x `min_ca..=max_ca` activation rows
/// per call, reading activation rows that [`WideTile::prepare`] wrote once per matmul. Each
/// output has the bits [`Tile::f`] gives it.
#[derive(Clone, Copy)]
pub(crate) struct WideTile {
    /// A [`TileFn`] whose `a` rows are prepared rows, `a_stride` apart (64-byte aligned).
    pub f: TileFn,
    pub max_rw: usize,
    pub min_ca: usize,
    pub max_ca: usize,
    /// Bytes of one prepared row of `k` elements (a multiple of 64).
    pub row_bytes: fn(usize) -> usize,
    pub prepare: PrepareFn,
}

/// The tiled kernel for weights of type `wty` at ISA level `isa`, where one exists
/// (AVX-512: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K, F32, F16, BF16; AVX2: Q4_K, Q5_K,
/// Q6_K);
/// otherwise matmul calls
/// [`vec_dot_fn`] per output.
///
/// # Panics
/// If this CPU does not support `isa`.
pub(crate) fn tile_fn(isa: Isa, wty: GgmlType) -> Option<Tile> {
    assert!(isa.is_supported(), "tile_fn: this CPU does not support {isa}");
    #[cfg(target_arch = "x86_64")]
    if isa >= Isa::Avx512 {
        if let Some(f) = avx512_ktile::tile_fn(wty) {
            let arrange = avx512_ktile::arrange_fn(wty);
            return Some(Tile { f, max_rw: avx512_ktile::MAX_RW, max_ca: avx512_ktile::MAX_CA, arrange, wide: None });
        }
        if let Some(f) = avx512_tile::tile_fn(wty) {
            let wide = avx512_wide::tile_fn(wty).map(|(f, prepare)| WideTile {
                f,
                max_rw: avx512_wide::MAX_RW,
                min_ca: avx512_wide::MIN_CA,
                max_ca: avx512_wide::MAX_CA,
                row_bytes: avx512_wide::row_bytes,
                prepare,
            });
            return Some(Tile { f, max_rw: avx512_tile::MAX_RW, max_ca: avx512_tile::MAX_CA, arrange: None, wide });
        }
        if let Some(f) = avx512_ftile::tile_fn(wty) {
            let (max_rw, max_ca) = (avx512_ftile::MAX_RW, avx512_ftile::MAX_CA);
            return Some(Tile { f, max_rw, max_ca, arrange: None, wide: None });
        }
    }
    #[cfg(target_arch = "x86_64")]
    if isa >= Isa::Avx2 {
        if let Some(f) = avx2_klanes::tile_fn(wty) {
            return Some(Tile {
                f,
                max_rw: avx2_klanes::MAX_RW,
                max_ca: avx2_klanes::MAX_CA,
                arrange: None,
                wide: None,
            });
        }
    }
    let _ = wty;
    None
}

/// Checks the row lengths a dot kernel is about to read; the SIMD kernels read
/// through raw pointers after this.
#[inline]
fn check_dot(wty: GgmlType, w: &[u8], a: &[u8], n: usize) {
    let bs = wty.block_size();
    assert!(n.is_multiple_of(bs), "vec_dot: n = {n} is not a multiple of the {wty} block size {bs}");
    let aty = vec_dot_type(wty);
    let (wb, ab) = (n / bs * wty.type_size(), n / aty.block_size() * aty.type_size());
    assert!(
        w.len() >= wb && a.len() >= ab,
        "vec_dot: {wty} x {aty} over {n} elements needs {wb} + {ab} bytes, got {} + {}",
        w.len(),
        a.len()
    );
}

#[cfg(test)]
mod tests;
