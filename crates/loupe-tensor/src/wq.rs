//! Weight-only quantization: `y = x @ W^T` with `W` kept in GGML blocks and `x` in f32.
//!
//! Unlike [`crate::matmul::matmul_q`], which quantizes activations to 8-bit blocks as
//! llama.cpp does, these kernels dequantize weights in registers and multiply by the f32
//! activations. The weight bytes read per token are the same (the memory-bound decode
//! costs the same), but no activation rounding is added: on SmolLM2 Q4_1, teacher-forced
//! argmax agreement with the f32 PyTorch reference is ~100% instead of ~96% with 8-bit
//! activations (see BENCHMARKS.md / the engine issue's closing note).
//!
//! * decode (`m == 1`): a fused dequantize-and-dot per weight row, rows split over threads;
//!   for Q4_1/Q8_0/Q5_0/Q6_K/Q4_K the activation row is first quantized to 16-bit blocks ([`Act16`]),
//!   exact integer products with error under 2^-16 of each block's largest activation
//!   (100% argmax agreement on the goldens through the decode path, see
//!   `tests/native_agreement.rs`), for half the vector work of widening weights to f32;
//! * prefill (`m > 1`): each task dequantizes a tile of weight rows into an L2-sized f32
//!   buffer and multiplies it with all of `x` through `gemm`.
//!   Not batch invariant (gemm's reduction order depends on `m`): a continuous-batching
//!   decode step uses [`matmul_wq_invariant`] (`crate::batch`), whose `m == 1` path is the
//!   decode path here, and whose rows are bit-identical to it for any `m`.

use std::cell::RefCell;

pub use crate::batch::{
    matmul_f32_invariant, matmul_f32_invariant_with, matmul_wq_invariant, matmul_wq_invariant_with,
};
use crate::matmul::{gemm_x_wt, OutPtr, QMatrix};
use crate::pool;
use crate::quant::{dequantize_row, Isa};
use crate::{GgmlType, TensorError};

/// Weight rows per prefill task: 64 rows x 1536 columns of f32 is 384 KiB, inside a
/// 1-2 MiB L2 (Zen 4: 1 MiB, Sapphire Rapids: 2 MiB), next to the activations it is
/// multiplied with.
const PREFILL_TILE_ROWS: usize = 64;
thread_local! {
    static SCRATCH: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// y[m, n] = x[m, k] @ W^T for a block-quantized `W` (`n = w.rows`, `k = w.cols`), with f32
/// activations.
pub fn matmul_wq(x: &[f32], w: &QMatrix, y: &mut [f32], m: usize) -> Result<(), TensorError> {
    let (n, k) = (w.rows, w.cols);
    if x.len() != m * k || y.len() != m * n {
        return Err(TensorError::Shape {
            op: "matmul_wq",
            detail: format!("x has {} elements and y {}, expected {m}x{k} and {m}x{n}", x.len(), y.len()),
        });
    }
    if m == 0 || n == 0 {
        return Ok(());
    }
    if m == 1 {
        // Decode: the batch-invariant kernels' single-row path (one fused dot per weight
        // row), so a sequence decoded alone and one decoded in a batch get the same bits.
        return matmul_wq_invariant_with(Isa::active(), x, w, y, 1);
    }
    if Isa::active() >= Isa::Amx && crate::amx::can_take(w, m) {
        // Q4_1 / Q8_0 / Q5_0 on AMX tiles: 16-bit activation blocks, the arithmetic of
        // dot_row_act16_scalar (crate::amx).
        return matmul_wq_prefill_group(x, &[w], &mut [y], m);
    }
    let tiles = n.div_ceil(PREFILL_TILE_ROWS);
    let out = OutPtr(y.as_mut_ptr());
    pool::try_run(tiles, &|t| {
        let j0 = t * PREFILL_TILE_ROWS;
        let rows = PREFILL_TILE_ROWS.min(n - j0);
        SCRATCH.with(|s| {
            let mut s = s.borrow_mut();
            s.resize(PREFILL_TILE_ROWS * k, 0.0);
            for r in 0..rows {
                dequantize_row_fast(w.ty, w.row(j0 + r), &mut s[r * k..(r + 1) * k])?;
            }
            // SAFETY: x is m x k; the tile holds `rows` dequantized rows of k; the
            // destination is columns j0..j0+rows of y (m x n), disjoint between tasks.
            unsafe { gemm_x_wt(m, rows, k, out.get().add(j0), n, x.as_ptr(), k, s.as_ptr(), k) };
            Ok(())
        })
    })?;
    w.apply_tensor_scale(y);
    Ok(())
}

/// Whether prefill of `m` rows through `w` (against `k` activations) can join a grouped
/// [`matmul_wq_prefill_group`]: Q4_1 / Q8_0 / Q5_0 on AMX tiles ([`crate::amx`]).
pub fn can_group_prefill(w: &QMatrix, k: usize, m: usize) -> bool {
    w.cols == k && Isa::active() >= Isa::Amx && crate::amx::can_take(w, m)
}

/// Prefill (`m` rows of `x`) through several matrices that share it (q/k/v, gate/up), each
/// taken by [`can_group_prefill`]: the activations are quantized once and all matrices run
/// as one fork-join. Each output is bit-identical to [`matmul_wq`] on its matrix alone.
pub fn matmul_wq_prefill_group(x: &[f32], ws: &[&QMatrix], ys: &mut [&mut [f32]], m: usize) -> Result<(), TensorError> {
    crate::amx::matmul_wq_amx_group(x, ws, ys, m)?;
    for (w, y) in ws.iter().zip(ys.iter_mut()) {
        w.apply_tensor_scale(y);
    }
    Ok(())
}

/// One activation row quantized to 16-bit blocks of 32: `x[i] ~= scale[b] * q[i]` for
/// `i` in block `b`, with `scale = max|x_b| / 32767`. `scale_sum` interleaves each
/// block's scale and its exact f32 sum (the sum feeds Q4_1's offset term `m * sum(x)`),
/// so one 8-byte load fetches both.
#[derive(Clone, Copy)]
pub struct Act16<'a> {
    pub q: &'a [i16],
    pub scale_sum: &'a [f32],
}

impl<'a> Act16<'a> {
    /// Quantizes `x` (a multiple of 32 long) into `q` (same length) and `scale_sum`
    /// (two per block).
    pub fn quantize(x: &[f32], q: &'a mut [i16], scale_sum: &'a mut [f32]) -> Act16<'a> {
        quantize_at(Isa::detected(), x, q, scale_sum);
        Act16 { q, scale_sum }
    }
}

/// [`Act16::quantize`]'s body by the widest kernel `isa` allows (every one writes the
/// scalar [`quantize_blocks`]'s bits, tested; so the quantizer follows the CPU, not
/// `LOUPE_ISA`). `isa` must be supported by this CPU.
fn quantize_at(isa: Isa, x: &[f32], q: &mut [i16], scale_sum: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if isa >= Isa::Avx2 && x.len().is_multiple_of(32) && q.len() == x.len() && scale_sum.len() == x.len() / 16 {
        if isa >= Isa::Avx512 {
            // SAFETY: the CPU has AVX-512 F/BW/VL (Isa::Avx512, the caller's contract);
            // lengths checked.
            unsafe { quantize_avx512(x, q, scale_sum) };
        } else {
            // SAFETY: the CPU has AVX2, FMA and F16C (Isa::Avx2, the caller's contract);
            // `x` is a multiple of 32 long and `q`, `scale_sum` its length and two per block.
            unsafe { quantize_avx2(x, q, scale_sum) };
        }
        return;
    }
    let _ = isa;
    quantize_blocks(x, q, scale_sum);
}

/// [`quantize_avx2`] 16 lanes wide, with the same bits: each block's codes in two vectors
/// instead of four (the rounding emulation was most of the quantizer's time in a SmolLM2
/// prefill's perf profile, where the quantizer took ~5%), and the block sums 16 blocks at a
/// time, the last group's missing lanes masked off. Measured (Sapphire Rapids class, one
/// thread, 512 rows): 1536-wide rows 18.1-19.5 -> 15.5 ns per block, 576-wide rows alike
/// (~18; the block's serial chain, max -> divide -> codes, and the gathered sums remain).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn quantize_avx512(x: &[f32], q: &mut [i16], scale_sum: &mut [f32]) {
    use std::arch::x86_64::*;
    let blocks = x.len() / 32;
    let (xp, qp, sp) = (x.as_ptr(), q.as_mut_ptr(), scale_sum.as_mut_ptr());
    let abs_mask = _mm512_set1_epi32(0x7FFF_FFFF);
    let sign_mask = _mm512_set1_epi32(i32::MIN);
    let (half, one, lim) = (_mm512_set1_ps(0.5), _mm512_set1_epi32(1.0f32.to_bits() as i32), _mm512_set1_ps(32767.0));
    let abs = |v: __m512| _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(v), abs_mask));
    for b in 0..blocks {
        let p = xp.add(b * 32);
        let (x0, x1) = (_mm512_loadu_ps(p), _mm512_loadu_ps(p.add(16)));
        // max(|x|, m) keeps m for a NaN x, as f32::max ignores NaN; max is exact in any order.
        let m = _mm512_max_ps(abs(x1), _mm512_max_ps(abs(x0), _mm512_setzero_ps()));
        let amax = _mm512_reduce_max_ps(m);
        let scale = amax / 32767.0;
        let inv = if amax > 0.0 { 32767.0 / amax } else { 0.0 };
        let vinv = _mm512_set1_ps(inv);
        for (c, xc) in [x0, x1].into_iter().enumerate() {
            let t = _mm512_mul_ps(xc, vinv);
            // NaN (inf * 0) to +0.0, as `NaN as i16 == 0`.
            let t = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask::<_CMP_ORD_Q>(t, t), t);
            let r = _mm512_roundscale_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(t);
            let tie_or_more = _mm512_cmp_ps_mask::<_CMP_GE_OQ>(abs(_mm512_sub_ps(t, r)), half);
            let signed_one =
                _mm512_castsi512_ps(_mm512_or_si512(one, _mm512_and_si512(_mm512_castps_si512(t), sign_mask)));
            let r = _mm512_mask_add_ps(r, tie_or_more, r, signed_one);
            let r = _mm512_min_ps(_mm512_max_ps(r, _mm512_sub_ps(_mm512_setzero_ps(), lim)), lim);
            _mm256_storeu_si256(qp.add(b * 32 + 16 * c) as *mut __m256i, _mm512_cvtepi32_epi16(_mm512_cvttps_epi32(r)));
        }
        *sp.add(2 * b) = scale;
    }
    // Sequential sums from the value `Iterator::sum` starts from (-0.0), one block per lane.
    let start: f32 = std::iter::empty::<f32>().sum();
    let lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    // Lane l reads block b + l (32 elements apart) and writes scale_sum[2 (b + l) + 1].
    let (idx, out_idx) =
        (_mm512_slli_epi32::<5>(lane), _mm512_add_epi32(_mm512_slli_epi32::<1>(lane), _mm512_set1_epi32(1)));
    let mut b = 0;
    while b < blocks {
        let lanes = (blocks - b).min(16);
        let mask: __mmask16 = if lanes == 16 { !0 } else { (1u16 << lanes) - 1 };
        let p = xp.add(b * 32);
        let mut acc = _mm512_set1_ps(start);
        for i in 0..32 {
            acc = _mm512_mask_add_ps(
                acc,
                mask,
                acc,
                _mm512_mask_i32gather_ps::<4>(_mm512_setzero_ps(), mask, idx, p.add(i)),
            );
        }
        _mm512_mask_i32scatter_ps::<4>(sp.add(2 * b), mask, out_idx, acc);
        b += 16;
    }
}

/// [`quantize_blocks`] vectorized, with the same bits (tested against it):
/// - `amax`: `max` is exact in any order; `_mm256_max_ps(|x|, m)` returns `m` for a NaN
///   `x`, as `f32::max` ignores NaN;
/// - the codes: the same `x * inv`, rounded half away from zero as `trunc` plus a
///   carry when the (exact) fraction is at least 0.5, NaN to 0 as `as i16` does, then
///   clamped;
/// - the block sums stay sequential (element 0 first) but run 8 blocks at a time, one
///   block per lane: the scalar sum is a chain of 32 dependent adds per block, which on
///   the decode path left the other compute thread idle for ~1.5 µs per 576-wide row.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn quantize_avx2(x: &[f32], q: &mut [i16], scale_sum: &mut [f32]) {
    use std::arch::x86_64::*;
    let blocks = x.len() / 32;
    let (xp, qp, sp) = (x.as_ptr(), q.as_mut_ptr(), scale_sum.as_mut_ptr());
    let abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFF_FFFF));
    let sign_mask = _mm256_castsi256_ps(_mm256_set1_epi32(i32::MIN));
    let (half, one, lim) = (_mm256_set1_ps(0.5), _mm256_set1_ps(1.0), _mm256_set1_ps(32767.0));
    for b in 0..blocks {
        let p = xp.add(b * 32);
        let mut m = _mm256_setzero_ps();
        for c in 0..4 {
            m = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(p.add(8 * c)), abs_mask), m);
        }
        let h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
        let h = _mm_max_ps(h, _mm_movehl_ps(h, h));
        let amax = _mm_cvtss_f32(_mm_max_ss(h, _mm_movehdup_ps(h)));
        let scale = amax / 32767.0;
        let inv = if amax > 0.0 { 32767.0 / amax } else { 0.0 };
        let vinv = _mm256_set1_ps(inv);
        let mut codes = [_mm256_setzero_si256(); 4];
        for (c, code) in codes.iter_mut().enumerate() {
            let t = _mm256_mul_ps(_mm256_loadu_ps(p.add(8 * c)), vinv);
            // NaN (inf * 0) to +0.0, as `NaN as i16 == 0`.
            let t = _mm256_and_ps(t, _mm256_cmp_ps::<_CMP_ORD_Q>(t, t));
            let r = _mm256_round_ps::<{ _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC }>(t);
            let frac = _mm256_and_ps(_mm256_sub_ps(t, r), abs_mask);
            let carry =
                _mm256_and_ps(_mm256_cmp_ps::<_CMP_GE_OQ>(frac, half), _mm256_or_ps(one, _mm256_and_ps(t, sign_mask)));
            let r = _mm256_min_ps(_mm256_max_ps(_mm256_add_ps(r, carry), _mm256_sub_ps(_mm256_setzero_ps(), lim)), lim);
            *code = _mm256_cvttps_epi32(r);
        }
        // packs interleaves 128-bit lanes: [a0..4, b0..4, a4..8, b4..8]; the permute
        // restores element order.
        let lo = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packs_epi32(codes[0], codes[1]));
        let hi = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packs_epi32(codes[2], codes[3]));
        _mm256_storeu_si256(qp.add(b * 32) as *mut __m256i, lo);
        _mm256_storeu_si256(qp.add(b * 32 + 16) as *mut __m256i, hi);
        *sp.add(2 * b) = scale;
    }
    // The value `Iterator::sum` starts from (-0.0 in current Rust), so an all -0.0 block
    // keeps its sign exactly as in the scalar code.
    let start: f32 = std::iter::empty::<f32>().sum();
    let idx = _mm256_setr_epi32(0, 32, 64, 96, 128, 160, 192, 224);
    let mut b = 0;
    while b + 8 <= blocks {
        let p = xp.add(b * 32);
        let mut acc = _mm256_set1_ps(start);
        for i in 0..32 {
            acc = _mm256_add_ps(acc, _mm256_i32gather_ps::<4>(p.add(i), idx));
        }
        let mut lanes = [0f32; 8];
        _mm256_storeu_ps(lanes.as_mut_ptr(), acc);
        for (l, v) in lanes.into_iter().enumerate() {
            *sp.add(2 * (b + l) + 1) = v;
        }
        b += 8;
    }
    for b in b..blocks {
        *sp.add(2 * b + 1) = x[b * 32..(b + 1) * 32].iter().sum();
    }
}

/// The body of [`Act16::quantize`], for every ISA.
#[inline(always)]
fn quantize_blocks(x: &[f32], q: &mut [i16], scale_sum: &mut [f32]) {
    {
        for ((xb, qb), ss) in x.chunks_exact(32).zip(q.chunks_exact_mut(32)).zip(scale_sum.chunks_exact_mut(2)) {
            let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
            let scale = amax / 32767.0;
            let inv = if amax > 0.0 { 32767.0 / amax } else { 0.0 };
            for (d, &v) in qb.iter_mut().zip(xb) {
                *d = (v * inv).round().clamp(-32767.0, 32767.0) as i16;
            }
            ss[0] = scale;
            ss[1] = xb.iter().sum();
        }
    }
}

/// Dot of one Q4_1, Q8_0, Q5_0, Q6_K or Q4_K weight row with 16-bit activation blocks (the
/// K types: rows of whole 256-element super-blocks). Q5_0, Q6_K and Q4_K have AVX2 kernels only: at
/// [`Isa::Avx512`] they run those, as `gemv` and `batch` do for them.
pub fn dot_row_act16(isa: Isa, ty: GgmlType, w_row: &[u8], act: &Act16<'_>) -> Result<f32, TensorError> {
    let blocks = act.q.len() / 32;
    let per = ty.block_size();
    let takes = per == 32 || matches!(ty, GgmlType::Q6K | GgmlType::Q4K);
    if !act.q.len().is_multiple_of(32)
        || act.scale_sum.len() != 2 * blocks
        || !takes
        || !act.q.len().is_multiple_of(per)
        || w_row.len() != act.q.len() / per * ty.type_size()
    {
        return Err(TensorError::Shape {
            op: "dot_row_act16",
            detail: format!("{} bytes of {ty} against {} activations", w_row.len(), act.q.len()),
        });
    }
    #[cfg(target_arch = "x86_64")]
    if isa >= Isa::Avx512 {
        match ty {
            // On AMX CPUs the AVX2 kernel, as gemv and batch run it (`batch::avx2_kernels_at`).
            // SAFETY: Isa::Amx implies AVX2, FMA and F16C; lengths checked above.
            GgmlType::Q4_1 if crate::batch::avx2_kernels_at(isa, ty) => {
                return Ok(unsafe { crate::batch::avx2::dot_q4_1_act16(w_row, act.q, act.scale_sum) })
            }
            // SAFETY: the CPU supports AVX-512 F/BW and F16C (Isa::Avx512); lengths checked above.
            GgmlType::Q4_1 => return Ok(unsafe { avx512::dot_q4_1_act16(w_row, act.q, act.scale_sum) }),
            GgmlType::Q8_0 => return Ok(unsafe { avx512::dot_q8_0_act16(w_row, act.q, act.scale_sum) }),
            // SAFETY: Isa::Avx512 implies AVX2, FMA and F16C; lengths checked above.
            GgmlType::Q5_0 => return Ok(unsafe { crate::batch::avx2::dot_q5_0_act16(w_row, act.q, act.scale_sum) }),
            // SAFETY: as above (whole super-blocks checked above).
            GgmlType::Q6K => return Ok(unsafe { crate::batch::avx2::dot_q6_k_act16(w_row, act.q, act.scale_sum) }),
            // SAFETY: as above (whole super-blocks checked above).
            GgmlType::Q4K => return Ok(unsafe { crate::batch::avx2::dot_q4_k_act16(w_row, act.q, act.scale_sum) }),
            _ => {}
        }
    } else if isa >= Isa::Avx2 {
        match ty {
            // SAFETY: the CPU supports AVX2, FMA and F16C (Isa::Avx2); lengths checked above.
            GgmlType::Q4_1 => return Ok(unsafe { crate::batch::avx2::dot_q4_1_act16(w_row, act.q, act.scale_sum) }),
            GgmlType::Q8_0 => return Ok(unsafe { crate::batch::avx2::dot_q8_0_act16(w_row, act.q, act.scale_sum) }),
            // SAFETY: as above.
            GgmlType::Q5_0 => return Ok(unsafe { crate::batch::avx2::dot_q5_0_act16(w_row, act.q, act.scale_sum) }),
            // SAFETY: as above (whole super-blocks checked above).
            GgmlType::Q6K => return Ok(unsafe { crate::batch::avx2::dot_q6_k_act16(w_row, act.q, act.scale_sum) }),
            // SAFETY: as above (whole super-blocks checked above).
            GgmlType::Q4K => return Ok(unsafe { crate::batch::avx2::dot_q4_k_act16(w_row, act.q, act.scale_sum) }),
            _ => {}
        }
    }
    let _ = isa;
    dot_row_act16_scalar(ty, w_row, act)
}

/// Reference for [`dot_row_act16`]: exact integer dot per block, then
/// `d * scale * dot (+ m * sum)` in f32 (Q5_0's weights are `q - 16`, no offset term).
///
/// Q6_K: per 32-element Act16 block (two 16-element sub-blocks with i8 scales `sc0`,
/// `sc1`), the exact integer `sc0 * isum0 + sc1 * isum1` (at most 32 * 32 * 128 * 32767
/// < 2^32 in magnitude, so summed in i64) rounded once to f32, times `d * scale` with
/// `d` the super-block's. The AVX2 kernels compute the same integer split over 8 i32
/// lanes (each exact, < 2^29) and round each lane, so they agree within f32 rounding.
pub fn dot_row_act16_scalar(ty: GgmlType, w_row: &[u8], act: &Act16<'_>) -> Result<f32, TensorError> {
    if ty == GgmlType::Q6K {
        return Ok(dot_q6_k_act16_scalar(w_row, act));
    }
    if ty == GgmlType::Q4K {
        return Ok(dot_q4_k_act16_scalar(w_row, act));
    }
    let bytes = ty.type_size();
    let mut acc = 0f32;
    for (b, wb) in w_row.chunks_exact(bytes).enumerate() {
        let xq = &act.q[b * 32..(b + 1) * 32];
        let (scale, sum) = (act.scale_sum[2 * b], act.scale_sum[2 * b + 1]);
        let d = half::f16::from_le_bytes([wb[0], wb[1]]).to_f32();
        match ty {
            GgmlType::Q4_1 => {
                let m = half::f16::from_le_bytes([wb[2], wb[3]]).to_f32();
                let qs = &wb[4..20];
                let dot: i32 = (0..16)
                    .map(|i| (qs[i] & 0x0F) as i32 * xq[i] as i32 + (qs[i] >> 4) as i32 * xq[i + 16] as i32)
                    .sum();
                acc += d * scale * dot as f32 + m * sum;
            }
            GgmlType::Q8_0 => {
                let dot: i32 = wb[2..34].iter().zip(xq).map(|(&w, &x)| w as i8 as i32 * x as i32).sum();
                acc += d * scale * dot as f32;
            }
            GgmlType::Q5_0 => {
                let qh = u32::from_le_bytes([wb[2], wb[3], wb[4], wb[5]]);
                let qs = &wb[6..22];
                let w = |j: usize| {
                    let nibble = if j < 16 { qs[j] & 0x0F } else { qs[j - 16] >> 4 };
                    (nibble as i32 | ((qh >> j) as i32 & 1) << 4) - 16
                };
                let dot: i32 = (0..32).map(|j| w(j) * xq[j] as i32).sum();
                acc += d * scale * dot as f32;
            }
            _ => return Err(TensorError::UnsupportedType { op: "dot_row_act16", dtype: ty }),
        }
    }
    Ok(acc)
}

/// [`dot_row_act16_scalar`] for Q6_K (super-blocks of 210 bytes, see
/// `batch::avx2::q6_k` for the layout); extra activations past the row's super-blocks are
/// not read.
fn dot_q6_k_act16_scalar(w_row: &[u8], act: &Act16<'_>) -> f32 {
    let mut acc = 0f32;
    for (s, sb) in w_row.chunks_exact(210).enumerate() {
        let (ql, qh, sc) = (&sb[..128], &sb[128..192], &sb[192..208]);
        let d = half::f16::from_le_bytes([sb[208], sb[209]]).to_f32();
        for i in 0..8 {
            let b = 8 * s + i;
            let (h, j) = (i / 4, i % 4);
            let xq = &act.q[b * 32..(b + 1) * 32];
            let dot: i64 = (0..32)
                .map(|l| {
                    let low = (ql[64 * h + 32 * (j % 2) + l] >> (4 * (j / 2))) & 0x0F;
                    let high = (qh[32 * h + l] >> (2 * j)) & 3;
                    let q = (low | high << 4) as i64 - 32;
                    q * sc[8 * h + 2 * j + l / 16] as i8 as i64 * xq[l] as i64
                })
                .sum();
            acc += d * act.scale_sum[2 * b] * dot as f32;
        }
    }
    acc
}

/// [`dot_row_act16_scalar`] for Q4_K (super-blocks of 144 bytes): per 32-element sub-block
/// `j`, `d' = d * sc` and `m' = -(dmin * m)` (exact in f32), the exact integer dot of the
/// 4-bit codes, and `acc += d' * scale * dot + m' * sum`, Q4_1's form.
fn dot_q4_k_act16_scalar(w_row: &[u8], act: &Act16<'_>) -> f32 {
    let mut acc = 0f32;
    for (s, sb) in w_row.chunks_exact(144).enumerate() {
        let d = half::f16::from_le_bytes([sb[0], sb[1]]).to_f32();
        let dmin = half::f16::from_le_bytes([sb[2], sb[3]]).to_f32();
        let (sc, mn) = crate::quant::blocks::scale_min_k4(sb[4..16].try_into().unwrap());
        for j in 0..8 {
            let b = 8 * s + j;
            let xq = &act.q[b * 32..(b + 1) * 32];
            let qs = &sb[16 + 32 * (j / 2)..16 + 32 * (j / 2) + 32];
            let dot: i32 = qs.iter().zip(xq).map(|(&q, &x)| ((q >> (4 * (j % 2))) & 0x0F) as i32 * x as i32).sum();
            let (dp, mp) = (d * sc[j] as f32, -(dmin * mn[j] as f32));
            acc += dp * act.scale_sum[2 * b] * dot as f32 + mp * act.scale_sum[2 * b + 1];
        }
    }
    acc
}

/// Dot of one weight row with f32 `x`; `sums` holds the sum of `x` over each weight block
/// (used by types with an offset term, Q4_1/Q5_1).
pub fn dot_row(isa: Isa, ty: GgmlType, w_row: &[u8], x: &[f32], sums: &[f32]) -> Result<f32, TensorError> {
    #[cfg(target_arch = "x86_64")]
    if isa >= Isa::Avx512 {
        match ty {
            // SAFETY: the CPU supports AVX-512 F/BW (Isa::Avx512); lengths are checked inside.
            GgmlType::Q4_1 => return unsafe { avx512::dot_q4_1(w_row, x, sums) },
            GgmlType::Q8_0 => return unsafe { avx512::dot_q8_0(w_row, x) },
            _ => {}
        }
    }
    #[cfg(target_arch = "x86_64")]
    if isa >= Isa::Avx2
        && matches!(
            ty,
            GgmlType::Mxfp4
                | GgmlType::Nvfp4
                | GgmlType::Fp8E4M3
                | GgmlType::Q4_0
                | GgmlType::Q5_0
                | GgmlType::Q5_1
                | GgmlType::Q4K
                | GgmlType::Q6K
        )
    {
        let blocks = whole_blocks(ty, w_row.len(), x.len())?;
        if ty == GgmlType::Q5_1 && sums.len() != blocks {
            return Err(TensorError::Shape {
                op: "dot_row",
                detail: format!("{} block sums for {blocks} blocks", sums.len()),
            });
        }
        // SAFETY: the CPU supports AVX2, FMA and F16C (Isa::Avx2); `w_row` is whole blocks
        // (super-blocks for Q4_K/Q6_K) covering exactly `x`, and Q5_1 has one block sum per
        // block (checked just above).
        return Ok(unsafe {
            match ty {
                GgmlType::Mxfp4 => small_avx2::dot_mxfp4(w_row, x),
                GgmlType::Nvfp4 => small_avx2::dot_nvfp4(w_row, x),
                GgmlType::Fp8E4M3 => small_avx2::dot_fp8_e4m3(w_row, x),
                GgmlType::Q4_0 => small_avx2::dot_q4_0(w_row, x),
                GgmlType::Q5_0 => small_avx2::dot_q5::<false>(w_row, x, sums),
                GgmlType::Q4K => kquant_avx2::dot_q4_k(w_row, x),
                GgmlType::Q6K => kquant_avx2::dot_q6_k(w_row, x),
                _ => small_avx2::dot_q5::<true>(w_row, x, sums),
            }
        });
    }
    let _ = (isa, sums);
    dot_row_scalar(ty, w_row, x)
}

/// The number of `ty` blocks in `w_bytes` when they are whole and cover exactly `n_values`
/// values. The product test `bytes * block == values * type_size` alone would accept a row
/// that is not whole blocks when the counts happen to balance (9 bytes of Q4_K, whose blocks
/// are 144 bytes of 256 values, against 16 values), and the dot would then be over nothing.
fn whole_blocks(ty: GgmlType, w_bytes: usize, n_values: usize) -> Result<usize, TensorError> {
    let (block, bytes) = (ty.block_size(), ty.type_size());
    if w_bytes.is_multiple_of(bytes) && (w_bytes / bytes).checked_mul(block) == Some(n_values) {
        Ok(w_bytes / bytes)
    } else {
        Err(TensorError::Shape { op: "dot_row", detail: format!("{w_bytes} bytes of {ty} against {n_values} activations (whole {bytes}-byte blocks of {block} values expected)") })
    }
}

/// Reference: dequantize block by block, multiply in f32.
pub fn dot_row_scalar(ty: GgmlType, w_row: &[u8], x: &[f32]) -> Result<f32, TensorError> {
    let (block, bytes) = (ty.block_size(), ty.type_size());
    whole_blocks(ty, w_row.len(), x.len())?;
    let mut buf = [0f32; 256];
    let mut acc = 0f32;
    for (wb, xb) in w_row.chunks_exact(bytes).zip(x.chunks_exact(block)) {
        let vals = &mut buf[..block];
        dequantize_row(ty, wb, vals)?;
        acc += vals.iter().zip(xb).map(|(a, b)| a * b).sum::<f32>();
    }
    Ok(acc)
}

/// Dequantizes one row, with AVX-512 for the types SmolLM2 uses and AVX2 for Q4_K/Q6_K;
/// bit-identical to [`dequantize_row`].
pub fn dequantize_row_fast(ty: GgmlType, src: &[u8], dst: &mut [f32]) -> Result<(), TensorError> {
    #[cfg(target_arch = "x86_64")]
    if Isa::active() >= Isa::Avx512
        && matches!(ty, GgmlType::Q4_1 | GgmlType::Q8_0)
        && whole_blocks(ty, src.len(), dst.len()).is_ok()
    {
        // SAFETY: AVX-512 is available; lengths were checked just above.
        unsafe { avx512::dequant(ty, src, dst) };
        return Ok(());
    }
    #[cfg(target_arch = "x86_64")]
    if Isa::active() >= Isa::Avx2
        && matches!(ty, GgmlType::Q4K | GgmlType::Q6K)
        && dst.len().is_multiple_of(ty.block_size())
        && src.len() == dst.len() / ty.block_size() * ty.type_size()
    {
        // SAFETY: the CPU supports AVX2 and FMA (Isa::Avx2); `src` is whole super-blocks,
        // exactly those of `dst` (checked just above).
        unsafe {
            match ty {
                GgmlType::Q4K => kquant_avx2::dequant_q4_k(src, dst),
                _ => kquant_avx2::dequant_q6_k(src, dst),
            }
        }
        return Ok(());
    }
    dequantize_row(ty, src, dst)
}

/// Q4_K and Q6_K dots and dequantizers (AVX2), in their own file.
#[cfg(target_arch = "x86_64")]
#[path = "wq_kquant.rs"]
pub(crate) mod kquant_avx2;

/// Q4_0, Q5_0, Q5_1, MXFP4 and NVFP4 rows against f32 activations, dequantized in
/// registers: each block's 32 (sub-block's 16) values become exact small integers as i8
/// (nibbles minus 8; nibbles with their fifth bit, minus 16 for Q5_0; MXFP4/NVFP4 nibbles
/// through `vpshufb` on ggml's doubled `kvalues_mxfp4`), are widened to f32 and FMA'd with
/// the activations, and each block's sum is multiplied by its scale once (Q5_1 adds `m`
/// times the block's activation sum). The scalar reference dequantizes block by block
/// through `dequantize_row` (one call per 32 or 64 weights), which decoded these formats at
/// 8-11 tokens/s on SmolLM2 (AMD EPYC Zen 3, 2 threads). Q5_0's decode and batched decode
/// run the Act16 kernels instead ([`dot_row_act16`]); its f32 dot here is left to rows too
/// long for them (over `batch::MAX_STACK_BLOCKS` blocks).
#[cfg(target_arch = "x86_64")]
mod small_avx2 {
    use std::arch::x86_64::*;

    use crate::batch::avx2::{f16_at, hsum};
    use crate::quant::dequant::{e8m0_half, ue4m3_half, MXFP4_VALUES};

    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn table() -> __m128i {
        _mm_loadu_si128(MXFP4_VALUES.as_ptr().cast())
    }

    /// The i8 lanes 0..8 of `v` as f32, times the 8 floats at `x`, added to `acc`.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn fma8(v: __m128i, x: *const f32, acc: __m256) -> __m256 {
        _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v)), _mm256_loadu_ps(x), acc)
    }

    /// The low and high nibbles of the bytes of `q`, each as a byte (0..16).
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn nibbles(q: __m128i) -> (__m128i, __m128i) {
        let mask = _mm_set1_epi8(0x0F);
        (_mm_and_si128(q, mask), _mm_and_si128(_mm_srli_epi16::<4>(q), mask))
    }

    /// A 32-element block as i8 values, elements 0..16 in `lo` and 16..32 in `hi`, times
    /// the 32 floats at `x`: 8 f32 partial sums.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn block32(lo: __m128i, hi: __m128i, x: *const f32) -> __m256 {
        let mut s = fma8(lo, x, _mm256_setzero_ps());
        s = fma8(_mm_srli_si128::<8>(lo), x.add(8), s);
        s = fma8(hi, x.add(16), s);
        fma8(_mm_srli_si128::<8>(hi), x.add(24), s)
    }

    /// `block_q4_0 { f16 d; u8 qs[16] }` (18 bytes): element `j` in the low nibble of
    /// `qs[j]`, `j + 16` in the high one; value `d * (q - 8)`.
    ///
    /// # Safety
    /// AVX2 + FMA + F16C; `w` whole blocks, `x` 32 floats per block.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn dot_q4_0(w: &[u8], x: &[f32]) -> f32 {
        let eight = _mm_set1_epi8(8);
        let mut acc = _mm256_setzero_ps();
        for (b, blk) in w.chunks_exact(18).enumerate() {
            let (lo, hi) = nibbles(_mm_loadu_si128(blk.as_ptr().add(2).cast()));
            let s = block32(_mm_sub_epi8(lo, eight), _mm_sub_epi8(hi, eight), x.as_ptr().add(32 * b));
            acc = _mm256_fmadd_ps(_mm256_set1_ps(f16_at(blk.as_ptr())), s, acc);
        }
        hsum(acc)
    }

    /// `block_q5_0 { f16 d; u8 qh[4]; u8 qs[16] }` (22 bytes), value `d * (q - 16)`, and
    /// `block_q5_1 { f16 d; f16 m; u8 qh[4]; u8 qs[16] }` (24 bytes), value `d * q + m`
    /// (`OFFSET`, whose `m` multiplies the block's activation sum `sums[b]`, as Q4_1's does):
    /// the low 4 bits of element `j` as in Q4_0, bit 4 is bit `j` of `qh`.
    ///
    /// # Safety
    /// AVX2 + FMA + F16C; `w` whole blocks, `x` 32 floats per block, and with `OFFSET`
    /// `sums` one float per block.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn dot_q5<const OFFSET: bool>(w: &[u8], x: &[f32], sums: &[f32]) -> f32 {
        let bytes = if OFFSET { 24 } else { 22 };
        let qh_at = if OFFSET { 4 } else { 2 };
        let sixteen = _mm_set1_epi8(16);
        // Byte j of a 16-byte vector tests bit j % 8 of its qh byte.
        let bit = _mm_set1_epi64x(0x8040_2010_0804_0201_u64 as i64);
        let mut acc = _mm256_setzero_ps();
        let mut offset = 0f32;
        for (b, blk) in w.chunks_exact(bytes).enumerate() {
            let p = blk.as_ptr();
            let qh = std::ptr::read_unaligned(p.add(qh_at) as *const u32);
            // Bits 0..16 (elements 0..16) and 16..32 (elements 16..32) spread one per byte:
            // byte j holds qh byte j / 8, then 0x10 where its bit j % 8 is set.
            let spread = |bits: u32| {
                let v = _mm_shuffle_epi8(_mm_cvtsi32_si128(bits as i32), _mm_set_epi64x(0x0101_0101_0101_0101, 0));
                _mm_and_si128(_mm_cmpeq_epi8(_mm_and_si128(v, bit), bit), sixteen)
            };
            let (lo4, hi4) = nibbles(_mm_loadu_si128(p.add(qh_at + 4).cast()));
            let mut lo = _mm_or_si128(lo4, spread(qh & 0xFFFF));
            let mut hi = _mm_or_si128(hi4, spread(qh >> 16));
            if !OFFSET {
                lo = _mm_sub_epi8(lo, sixteen);
                hi = _mm_sub_epi8(hi, sixteen);
            }
            let s = block32(lo, hi, x.as_ptr().add(32 * b));
            acc = _mm256_fmadd_ps(_mm256_set1_ps(f16_at(p)), s, acc);
            if OFFSET {
                offset += f16_at(p.add(2)) * *sums.get_unchecked(b);
            }
        }
        hsum(acc) + offset
    }

    /// `block_mxfp4 { u8 e; u8 qs[16] }` (17 bytes, 32 weights): element `j` in the low
    /// nibble of `qs[j]`, `j + 16` in the high one; value `kvalues[q] * e8m0_half(e)`.
    ///
    /// # Safety
    /// AVX2 + FMA; `w` whole blocks, `x` 32 floats per block.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn dot_mxfp4(w: &[u8], x: &[f32]) -> f32 {
        let kv = table();
        let mut acc = _mm256_setzero_ps();
        for (b, blk) in w.chunks_exact(17).enumerate() {
            let (lo, hi) = nibbles(_mm_loadu_si128(blk.as_ptr().add(1).cast()));
            let s = block32(_mm_shuffle_epi8(kv, lo), _mm_shuffle_epi8(kv, hi), x.as_ptr().add(32 * b));
            acc = _mm256_fmadd_ps(_mm256_set1_ps(e8m0_half(blk[0])), s, acc);
        }
        hsum(acc)
    }

    /// `GgmlType::Fp8E4M3` (34 bytes: f16 `d`, then 32 E4M3 codes), value `d * e4m3(q)`.
    /// Each code becomes the f16 of its value / 256 by moving bits (`(q & 0x7f) << 7` is
    /// the magnitude, E4M3's exponent field landing in f16's, whose bias is 8 more, normals
    /// and subnormals alike; the sign to bit 15; the NaN codes to an f16 NaN), F16C widens
    /// it exactly, and the block's sum is multiplied by `256 * d` (a power-of-two scaling,
    /// exact): the values of the scalar reference, summed in another order.
    ///
    /// # Safety
    /// AVX2 + FMA + F16C; `w` whole blocks, `x` 32 floats per block.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn dot_fp8_e4m3(w: &[u8], x: &[f32]) -> f32 {
        let magnitude = _mm256_set1_epi16(0x7f);
        let sign = _mm256_set1_epi16(0x80);
        let nan = _mm256_set1_epi16(0x7e00);
        let mut acc = _mm256_setzero_ps();
        for (b, blk) in w.chunks_exact(34).enumerate() {
            let xp = x.as_ptr().add(32 * b);
            let mut s = _mm256_setzero_ps();
            for part in 0..2 {
                let c = _mm256_cvtepu8_epi16(_mm_loadu_si128(blk.as_ptr().add(2 + 16 * part).cast()));
                let m = _mm256_and_si256(c, magnitude);
                let h = _mm256_or_si256(_mm256_slli_epi16::<7>(m), _mm256_slli_epi16::<8>(_mm256_and_si256(c, sign)));
                let h = _mm256_blendv_epi8(h, nan, _mm256_cmpeq_epi16(m, magnitude));
                s = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm256_castsi256_si128(h)), _mm256_loadu_ps(xp.add(16 * part)), s);
                s = _mm256_fmadd_ps(
                    _mm256_cvtph_ps(_mm256_extracti128_si256::<1>(h)),
                    _mm256_loadu_ps(xp.add(16 * part + 8)),
                    s,
                );
            }
            acc = _mm256_fmadd_ps(_mm256_set1_ps(f16_at(blk.as_ptr()) * 256.0), s, acc);
        }
        hsum(acc)
    }

    /// `block_nvfp4 { u8 d[4]; u8 qs[32] }` (36 bytes, 64 weights): sub-block `s` is
    /// `qs[8s..8s + 8]`, byte `j` holding element `16s + j` (low nibble) and `16s + j + 8`
    /// (high); value `kvalues[q] * ue4m3_half(d[s])`. The per-tensor scale is applied by
    /// the caller, as for every NVFP4 path.
    ///
    /// # Safety
    /// AVX2 + FMA; `w` whole blocks, `x` 64 floats per block.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn dot_nvfp4(w: &[u8], x: &[f32]) -> f32 {
        let kv = table();
        let mut acc = _mm256_setzero_ps();
        for (b, blk) in w.chunks_exact(36).enumerate() {
            for s in 0..4 {
                let xp = x.as_ptr().add(64 * b + 16 * s);
                let (lo, hi) = nibbles(_mm_loadl_epi64(blk.as_ptr().add(4 + 8 * s).cast()));
                let sum =
                    fma8(_mm_shuffle_epi8(kv, hi), xp.add(8), fma8(_mm_shuffle_epi8(kv, lo), xp, _mm256_setzero_ps()));
                acc = _mm256_fmadd_ps(_mm256_set1_ps(ue4m3_half(blk[s])), sum, acc);
            }
        }
        hsum(acc)
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    //! Block layouts (ggml-common.h): `block_q4_1 { f16 d; f16 m; u8 qs[16] }`, element `j`
    //! in the low nibble of `qs[j]` and element `j + 16` in the high nibble, value
    //! `d * q + m`; `block_q8_0 { f16 d; i8 qs[32] }`, value `d * q`.
    use std::arch::x86_64::*;

    use half::f16;

    use crate::batch::avx512::hsum;
    use crate::{GgmlType, TensorError};

    fn f16_at(b: &[u8], i: usize) -> f32 {
        f16::from_le_bytes([b[i], b[i + 1]]).to_f32()
    }

    fn check(w: &[u8], x: &[f32], bytes: usize) -> Result<usize, TensorError> {
        let blocks = x.len() / 32;
        if !x.len().is_multiple_of(32) || w.len() != blocks * bytes {
            return Err(TensorError::Shape {
                op: "dot_row",
                detail: format!("{} weight bytes against {} activations", w.len(), x.len()),
            });
        }
        Ok(blocks)
    }

    /// The 32 nibbles of a Q4_1 block as two vectors of 16 f32.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn nibbles(qs: *const u8) -> (__m512, __m512) {
        let raw = _mm_loadu_si128(qs as *const __m128i);
        let lo = _mm_and_si128(raw, _mm_set1_epi8(0x0F));
        let hi = _mm_and_si128(_mm_srli_epi16(raw, 4), _mm_set1_epi8(0x0F));
        (_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(lo)), _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(hi)))
    }

    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn bytes_i8(qs: *const u8) -> (__m512, __m512) {
        let a = _mm_loadu_si128(qs as *const __m128i);
        let b = _mm_loadu_si128(qs.add(16) as *const __m128i);
        (_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(a)), _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b)))
    }

    /// An f16 at `p` (unaligned), converted with F16C.
    #[inline]
    #[target_feature(enable = "f16c")]
    unsafe fn f16_ptr(p: *const u8) -> f32 {
        let bits = std::ptr::read_unaligned(p as *const u16);
        _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32)))
    }

    /// `sum_b d_b * (q_b . x_b) + m_b * sum(x_b)`. Two accumulators hide FMA latency.
    #[target_feature(enable = "avx512f,avx512bw,f16c")]
    pub unsafe fn dot_q4_1(w: &[u8], x: &[f32], sums: &[f32]) -> Result<f32, TensorError> {
        let blocks = check(w, x, 20)?;
        if sums.len() != blocks {
            return Err(TensorError::Shape {
                op: "dot_row",
                detail: format!("{} block sums for {blocks} blocks", sums.len()),
            });
        }
        let (wp, xp, sp) = (w.as_ptr(), x.as_ptr(), sums.as_ptr());
        let block = |b: usize, acc: __m512| {
            let blk = wp.add(b * 20);
            let (lo, hi) = nibbles(blk.add(4));
            let xb = xp.add(b * 32);
            let s = _mm512_fmadd_ps(lo, _mm512_loadu_ps(xb), _mm512_mul_ps(hi, _mm512_loadu_ps(xb.add(16))));
            (_mm512_fmadd_ps(_mm512_set1_ps(f16_ptr(blk)), s, acc), f16_ptr(blk.add(2)) * *sp.add(b))
        };
        let (mut acc0, mut acc1) = (_mm512_setzero_ps(), _mm512_setzero_ps());
        let (mut off0, mut off1) = (0f32, 0f32);
        let mut b = 0;
        while b + 2 <= blocks {
            let (a, o) = block(b, acc0);
            acc0 = a;
            off0 += o;
            let (a, o) = block(b + 1, acc1);
            acc1 = a;
            off1 += o;
            b += 2;
        }
        if b < blocks {
            let (a, o) = block(b, acc0);
            acc0 = a;
            off0 += o;
        }
        Ok(_mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1)) + (off0 + off1))
    }

    #[target_feature(enable = "avx512f,avx512bw,f16c")]
    pub unsafe fn dot_q8_0(w: &[u8], x: &[f32]) -> Result<f32, TensorError> {
        let blocks = check(w, x, 34)?;
        let (wp, xp) = (w.as_ptr(), x.as_ptr());
        let block = |b: usize, acc: __m512| {
            let blk = wp.add(b * 34);
            let (a, c) = bytes_i8(blk.add(2));
            let xb = xp.add(b * 32);
            let s = _mm512_fmadd_ps(a, _mm512_loadu_ps(xb), _mm512_mul_ps(c, _mm512_loadu_ps(xb.add(16))));
            _mm512_fmadd_ps(_mm512_set1_ps(f16_ptr(blk)), s, acc)
        };
        let (mut acc0, mut acc1) = (_mm512_setzero_ps(), _mm512_setzero_ps());
        let mut b = 0;
        while b + 2 <= blocks {
            acc0 = block(b, acc0);
            acc1 = block(b + 1, acc1);
            b += 2;
        }
        if b < blocks {
            acc0 = block(b, acc0);
        }
        Ok(_mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1)))
    }

    /// Q4_1 row x 16-bit activations: per block, the 32 nibbles widened to i16 and
    /// multiplied pairwise with `vpmaddwd` (exact in i32), converted once, scaled by
    /// `d * scale`; `m * sum` accumulates in lane 1 of an xmm register. Lengths are
    /// checked by the caller (`q.len() == 32 * blocks`, `w.len() == 20 * blocks`,
    /// `ss.len() == 2 * blocks`).
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
    pub unsafe fn dot_q4_1_act16(w: &[u8], q: &[i16], ss: &[f32]) -> f32 {
        let blocks = q.len() / 32;
        let (wp, qp, sp) = (w.as_ptr(), q.as_ptr(), ss.as_ptr());
        let mask = _mm256_set1_epi8(0x0F);
        // The 16 bytes go to both halves of a ymm; the low half keeps the low nibbles
        // (elements 0..16), the high half shifts to the high ones (16..32).
        let shifts = _mm256_set_epi16(4, 4, 4, 4, 4, 4, 4, 4, 0, 0, 0, 0, 0, 0, 0, 0);
        let block = |b: usize, acc: __m512, off: __m128| {
            let blk = wp.add(b * 20);
            let both = _mm256_broadcastsi128_si256(_mm_loadu_si128(blk.add(4) as *const __m128i));
            let w16 = _mm512_cvtepu8_epi16(_mm256_and_si256(_mm256_srlv_epi16(both, shifts), mask));
            let dot = _mm512_madd_epi16(w16, _mm512_loadu_si512(qp.add(b * 32) as *const _));
            let dm = _mm_cvtph_ps(_mm_cvtsi32_si128(std::ptr::read_unaligned(blk as *const i32)));
            let scale_sum = _mm_castpd_ps(_mm_load_sd(sp.add(2 * b) as *const f64));
            let prod = _mm_mul_ps(dm, scale_sum); // [d * scale, m * sum, 0, 0]
            (_mm512_fmadd_ps(_mm512_broadcastss_ps(prod), _mm512_cvtepi32_ps(dot), acc), _mm_add_ps(off, prod))
        };
        let (mut acc0, mut acc1) = (_mm512_setzero_ps(), _mm512_setzero_ps());
        let mut off = _mm_setzero_ps();
        let mut b = 0;
        while b + 2 <= blocks {
            (acc0, off) = block(b, acc0, off);
            (acc1, off) = block(b + 1, acc1, off);
            b += 2;
        }
        if b < blocks {
            (acc0, off) = block(b, acc0, off);
        }
        // The fixed-order sum the multi-row kernels (crate::batch) repeat per row.
        hsum(_mm512_add_ps(acc0, acc1)) + _mm_cvtss_f32(_mm_movehdup_ps(off))
    }

    /// Q8_0 row x 16-bit activations (see [`dot_q4_1_act16`]; no offset term).
    #[target_feature(enable = "avx512f,avx512bw,f16c")]
    pub unsafe fn dot_q8_0_act16(w: &[u8], q: &[i16], ss: &[f32]) -> f32 {
        let blocks = q.len() / 32;
        let (wp, qp, sp) = (w.as_ptr(), q.as_ptr(), ss.as_ptr());
        let block = |b: usize, acc: __m512| {
            let blk = wp.add(b * 34);
            let w16 = _mm512_cvtepi8_epi16(_mm256_loadu_si256(blk.add(2) as *const __m256i));
            let dot = _mm512_madd_epi16(w16, _mm512_loadu_si512(qp.add(b * 32) as *const _));
            let d = f16_ptr(blk);
            _mm512_fmadd_ps(_mm512_set1_ps(d * *sp.add(2 * b)), _mm512_cvtepi32_ps(dot), acc)
        };
        let (mut acc0, mut acc1) = (_mm512_setzero_ps(), _mm512_setzero_ps());
        let mut b = 0;
        while b + 2 <= blocks {
            acc0 = block(b, acc0);
            acc1 = block(b + 1, acc1);
            b += 2;
        }
        if b < blocks {
            acc0 = block(b, acc0);
        }
        hsum(_mm512_add_ps(acc0, acc1))
    }

    /// Dequantizes a Q4_1 or Q8_0 row; lengths checked by the caller. The value is formed
    /// as a separate multiply and add (`d * q + m`, no FMA), as gguf-py's numpy code does,
    /// so the f32 weights equal those the PyTorch reference computes with.
    #[target_feature(enable = "avx512f,avx512bw")]
    pub unsafe fn dequant(ty: GgmlType, src: &[u8], dst: &mut [f32]) {
        let blocks = dst.len() / 32;
        for b in 0..blocks {
            let out = dst.as_mut_ptr().add(b * 32);
            match ty {
                GgmlType::Q4_1 => {
                    let blk = &src[b * 20..b * 20 + 20];
                    let (lo, hi) = nibbles(blk.as_ptr().add(4));
                    let d = _mm512_set1_ps(f16_at(blk, 0));
                    let m = _mm512_set1_ps(f16_at(blk, 2));
                    _mm512_storeu_ps(out, _mm512_add_ps(_mm512_mul_ps(d, lo), m));
                    _mm512_storeu_ps(out.add(16), _mm512_add_ps(_mm512_mul_ps(d, hi), m));
                }
                _ => {
                    let blk = &src[b * 34..b * 34 + 34];
                    let (a, c) = bytes_i8(blk.as_ptr().add(2));
                    let d = _mm512_set1_ps(f16_at(blk, 0));
                    _mm512_storeu_ps(out, _mm512_mul_ps(d, a));
                    _mm512_storeu_ps(out.add(16), _mm512_mul_ps(d, c));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::quantize_row;

    fn data(n: usize, seed: u32) -> Vec<f32> {
        let mut s = seed;
        (0..n)
            .map(|_| {
                s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                ((s >> 8) as f32 / (1u32 << 24) as f32) * 2.0 - 1.0
            })
            .collect()
    }

    fn qmatrix(ty: GgmlType, rows: usize, cols: usize) -> (QMatrix, Vec<f32>) {
        let w = data(rows * cols, 7);
        let row_bytes = cols / ty.block_size() * ty.type_size();
        let mut bytes = vec![0u8; rows * row_bytes];
        for (r, chunk) in bytes.chunks_mut(row_bytes).enumerate() {
            quantize_row(ty, &w[r * cols..(r + 1) * cols], chunk).unwrap();
        }
        let mut deq = vec![0f32; rows * cols];
        for (r, chunk) in bytes.chunks(row_bytes).enumerate() {
            dequantize_row(ty, chunk, &mut deq[r * cols..(r + 1) * cols]).unwrap();
        }
        (QMatrix::new(ty, rows, cols, bytes).unwrap(), deq)
    }

    #[test]
    fn simd_dequant_equals_reference_bit_for_bit() {
        for ty in [GgmlType::Q4_1, GgmlType::Q8_0] {
            let (q, deq) = qmatrix(ty, 3, 128);
            let mut fast = vec![0f32; 128];
            for r in 0..3 {
                dequantize_row_fast(ty, q.row(r), &mut fast).unwrap();
                assert_eq!(fast, deq[r * 128..(r + 1) * 128], "{ty} row {r}");
            }
        }
    }

    /// Q4_K and Q6_K rows of raw random bytes (every f16 bit pattern for the scales: zero,
    /// subnormal, infinite, NaN) and of small finite scales: the AVX2 dequantizer writes
    /// exactly the scalar one's bits, through `dequantize_row_fast` and called directly
    /// (so the comparison runs under `LOUPE_ISA=scalar` too).
    #[test]
    fn kquant_simd_dequant_equals_reference_bit_for_bit() {
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        for ty in [GgmlType::Q4K, GgmlType::Q6K] {
            for (k, seed) in [(256, 1), (512, 2), (4864, 3), (4864, 4)] {
                // Seed 4: any f16 pattern in the scale fields, NaN and infinity included.
                let row = raw_kquant_row(ty, k, seed, seed != 4);
                let mut want = vec![0f32; k];
                dequantize_row(ty, &row, &mut want).unwrap();
                let mut got = vec![f32::NAN; k];
                dequantize_row_fast(ty, &row, &mut got).unwrap();
                assert_eq!(bits(&got), bits(&want), "{ty} k={k} seed {seed}");
                #[cfg(target_arch = "x86_64")]
                if Isa::detected() >= Isa::Avx2 {
                    let mut direct = vec![f32::NAN; k];
                    // SAFETY: AVX2 and FMA checked above; `row` is k / 256 whole super-blocks.
                    unsafe {
                        match ty {
                            GgmlType::Q4K => kquant_avx2::dequant_q4_k(&row, &mut direct),
                            _ => kquant_avx2::dequant_q6_k(&row, &mut direct),
                        }
                    }
                    assert_eq!(bits(&direct), bits(&want), "{ty} k={k} seed {seed}, AVX2 kernel");
                }
            }
            // Not whole super-blocks: an error, as from dequantize_row, never a partial write.
            let row = raw_kquant_row(ty, 512, 5, true);
            assert!(dequantize_row_fast(ty, &row[..row.len() - 1], &mut vec![0f32; 512]).is_err());
            assert!(dequantize_row_fast(ty, &row, &mut vec![0f32; 256]).is_err());
            assert!(dequantize_row_fast(ty, &row[..9], &mut [0f32; 16]).is_err());
        }
    }

    /// The AVX2 dot's word-wise unpacking of Q4_K's packed 6-bit scales and mins equals
    /// the byte-wise `scale_min_k4` that the scalar dequantizer uses.
    #[test]
    fn q4k_scale_unpacking_matches_scale_min_k4() {
        #[cfg(target_arch = "x86_64")]
        if Isa::detected() >= Isa::Avx2 {
            let row = raw_kquant_row(GgmlType::Q8_0, 32 * 4096, 7, false);
            let mut cases: Vec<[u8; 12]> = row.chunks_exact(12).map(|c| c.try_into().unwrap()).collect();
            cases.extend([[0u8; 12], [0xFF; 12], [0xC0; 12], [0x3F; 12], [0xF0; 12], [0x0F; 12]]);
            for packed in cases {
                let (sc, mn) = crate::quant::blocks::scale_min_k4(&packed);
                let (mut got_sc, mut got_mn) = ([0f32; 8], [0f32; 8]);
                // SAFETY: AVX2 checked above; `packed` is 12 readable bytes.
                unsafe {
                    use std::arch::x86_64::_mm256_storeu_ps;
                    let (s, m) = kquant_avx2::scales_mins_q4k(packed.as_ptr());
                    _mm256_storeu_ps(got_sc.as_mut_ptr(), s);
                    _mm256_storeu_ps(got_mn.as_mut_ptr(), m);
                }
                assert_eq!(got_sc, sc.map(f32::from), "scales of {packed:02x?}");
                assert_eq!(got_mn, mn.map(f32::from), "mins of {packed:02x?}");
            }
        }
    }

    /// A Q4_K / Q6_K row of `k` elements of random bytes; with `sane_scales` its f16 scales
    /// (Q4_K's `d` and `dmin`, Q6_K's `d`) are near +-1.
    fn raw_kquant_row(ty: GgmlType, k: usize, seed: u32, sane_scales: bool) -> Vec<u8> {
        let mut s = 0x9e37_79b9u32 ^ seed.wrapping_mul(0x85eb_ca6b);
        let mut byte = || {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            (s >> 8) as u8
        };
        let bytes = ty.type_size();
        (0..k / ty.block_size() * bytes)
            .map(|i| match (ty, i % bytes) {
                (GgmlType::Q4K, 1 | 3) | (GgmlType::Q6K, 209) if sane_scales => (0x3B + byte() % 3) | (byte() & 0x80),
                _ => byte(),
            })
            .collect()
    }

    /// Q4_K / Q6_K rows of raw random bytes (every 4- and 6-bit code, every 6-bit scale and
    /// min, every signed 8-bit scale) at 1, 2 and 19 super-blocks: each ISA's dot stays
    /// within f32 rounding of the super-block-by-super-block reference and of an f64 dot of
    /// the dequantized row; bad lengths are errors.
    #[test]
    fn kquant_dots_of_raw_blocks_match_the_scalar_reference() {
        for ty in [GgmlType::Q4K, GgmlType::Q6K] {
            for (k, seed) in [(256, 1), (512, 2), (4864, 3), (4864, 4)] {
                let row = raw_kquant_row(ty, k, seed, true);
                let x = data(k, 11 + seed);
                let sums: Vec<f32> = x.chunks(256).map(|c| c.iter().sum()).collect();
                let reference = dot_row_scalar(ty, &row, &x).unwrap();
                let mut deq = vec![0f32; k];
                dequantize_row(ty, &row, &mut deq).unwrap();
                let exact: f64 = deq.iter().zip(&x).map(|(&a, &b)| a as f64 * b as f64).sum();
                let magnitude: f32 = deq.iter().zip(&x).map(|(a, b)| (a * b).abs()).sum();
                assert!(
                    (reference as f64 - exact).abs() <= 1e-5 * (1.0 + magnitude as f64),
                    "{ty} k={k}: reference {reference} vs exact {exact}"
                );
                for isa in Isa::ALL.into_iter().filter(|&i| i <= Isa::detected()) {
                    let got = dot_row(isa, ty, &row, &x, &sums).unwrap();
                    assert!(
                        got.is_finite() && (got - reference).abs() <= 1e-5 * (1.0 + magnitude),
                        "{ty} k={k} {isa:?}: {got} vs {reference}"
                    );
                    assert!(
                        (got as f64 - exact).abs() <= 1e-5 * (1.0 + magnitude as f64),
                        "{ty} k={k} {isa:?}: {got} vs exact {exact}"
                    );
                }
            }
            let row = raw_kquant_row(ty, 512, 6, true);
            let x = data(512, 6);
            for isa in Isa::ALL.into_iter().filter(|&i| i <= Isa::detected()) {
                assert!(
                    dot_row(isa, ty, &row[1..], &x[1..], &[]).is_err(),
                    "{ty} {isa:?}: a partial super-block is an error"
                );
                assert!(
                    dot_row(isa, ty, &row[..row.len() - 1], &x, &[]).is_err(),
                    "{ty} {isa:?}: a short row is an error"
                );
                assert!(
                    dot_row(isa, ty, &row, &x[..256], &[]).is_err(),
                    "{ty} {isa:?}: too few activations are an error"
                );
                assert!(
                    dot_row(isa, ty, &row[..ty.type_size()], &x, &[]).is_err(),
                    "{ty} {isa:?}: too many activations are an error"
                );
                assert_eq!(dot_row(isa, ty, &[], &[], &[]).unwrap(), 0.0, "{ty} {isa:?}: an empty row");
            }
        }
    }

    /// An E4M3 NaN code (0x7f or 0xff) in a weight makes the row's dot NaN at every ISA, as
    /// the reference's widening does (the AVX2 kernel's bit moves would otherwise read it
    /// as 1.875 * 2^8).
    #[test]
    fn fp8_e4m3_nan_codes_give_nan_at_every_isa() {
        for nan in [0x7fu8, 0xff] {
            let mut row = vec![0u8; 2 * 34];
            for blk in row.chunks_exact_mut(34) {
                blk[..2].copy_from_slice(&half::f16::from_f32(0.5).to_le_bytes());
                for (j, c) in blk[2..].iter_mut().enumerate() {
                    *c = (j as u8 * 7) % 0x70;
                }
            }
            row[34 + 2 + 9] = nan;
            let x = data(64, 5);
            assert!(dot_row_scalar(GgmlType::Fp8E4M3, &row, &x).unwrap().is_nan());
            for isa in Isa::ALL.into_iter().filter(|&i| i <= Isa::detected()) {
                assert!(dot_row(isa, GgmlType::Fp8E4M3, &row, &x, &[]).unwrap().is_nan(), "code {nan:#x} {isa:?}");
            }
        }
    }

    #[test]
    fn rows_that_are_not_whole_blocks_are_errors_even_when_the_counts_balance() {
        // 9 bytes against 16 values: 9 * 256 == 16 * 144 for Q4_K, 9 * 32 == 16 * 18 for
        // Q8_0 (34-byte blocks: no), so pick, per type, a byte count that balances.
        for ty in [GgmlType::Q4K, GgmlType::Q6K, GgmlType::Q4_1, GgmlType::Q8_0, GgmlType::Q5_0] {
            let (block, bytes) = (ty.block_size(), ty.type_size());
            // Half a block's bytes against half its values: the products balance.
            let (b, n) = if bytes % 2 == 0 && block % 2 == 0 { (bytes / 2, block / 2) } else { continue };
            assert_eq!(b * block, n * bytes);
            let row = vec![0x11u8; b];
            let x = vec![1f32; n];
            assert!(dot_row_scalar(ty, &row, &x).is_err(), "{ty}: {b} bytes against {n} values");
            for isa in Isa::ALL.into_iter().filter(|&i| i <= Isa::detected()) {
                assert!(dot_row(isa, ty, &row, &x, &[0.0; 1]).is_err(), "{ty} {isa:?}");
            }
            let mut dst = vec![7f32; n];
            assert!(
                dequantize_row_fast(ty, &row, &mut dst).is_err() || dst.iter().all(|&v| v != 7.0),
                "{ty}: neither an error nor written"
            );
        }
    }

    #[test]
    fn every_isa_dot_matches_the_scalar_reference() {
        for ty in [
            GgmlType::Q4_1,
            GgmlType::Q8_0,
            GgmlType::Q4_0,
            GgmlType::Q5_0,
            GgmlType::Q5_1,
            GgmlType::Mxfp4,
            GgmlType::Nvfp4,
            GgmlType::Fp8E4M3,
            GgmlType::Q4K,
            GgmlType::Q6K,
        ] {
            let (q, _) = qmatrix_or_random(ty, 2, 256);
            let x = data(256, 3);
            let sums: Vec<f32> = x.chunks(32).map(|c| c.iter().sum()).collect();
            let reference = dot_row_scalar(ty, q.row(1), &x).unwrap();
            for isa in Isa::ALL.into_iter().filter(|&i| i <= Isa::detected()) {
                let got = dot_row(isa, ty, q.row(1), &x, &sums).unwrap();
                assert!(
                    (got - reference).abs() <= 1e-4 * (1.0 + reference.abs()),
                    "{ty} {isa:?}: {got} vs {reference}"
                );
            }
        }
    }

    /// Q4_0 / Q5_0 / Q5_1 / MXFP4 / NVFP4 / FP8 E4M3 rows of raw random bytes (every nibble
    /// and high bit, f16 scales and E8M0 exponents around 1, every UE4M3 byte including 0x00
    /// and the NaN code 0x7F, every finite E4M3 code): each ISA's dot stays within f32
    /// rounding of the block-by-block reference.
    #[test]
    fn small_block_dots_of_raw_blocks_match_the_scalar_reference() {
        let mut s = 0x9e37_79b9u32;
        let mut byte = || {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            (s >> 8) as u8
        };
        for (ty, blocks) in [
            (GgmlType::Mxfp4, 24),
            (GgmlType::Nvfp4, 12),
            (GgmlType::Fp8E4M3, 24),
            (GgmlType::Q4_0, 24),
            (GgmlType::Q5_0, 24),
            (GgmlType::Q5_1, 24),
        ] {
            let k = blocks * ty.block_size();
            let mut row = vec![0u8; blocks * ty.type_size()];
            for (i, b) in row.iter_mut().enumerate() {
                let at = i % ty.type_size();
                *b = match (ty, at) {
                    // f16 scales (and Q5_1's minimum) near 1: exponent bits 0x3C +- 1.
                    (GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q5_1 | GgmlType::Fp8E4M3, 1) | (GgmlType::Q5_1, 3) => {
                        (0x3B + byte() % 3) | (byte() & 0x80)
                    }
                    // Every E4M3 code but the two NaN codes (subnormals, zeros, +-448 included).
                    (GgmlType::Fp8E4M3, 2..) => match byte() {
                        c if c & 0x7f == 0x7f => c ^ 1,
                        c => c,
                    },
                    (GgmlType::Mxfp4, 0) => 112 + byte() % 32,
                    (GgmlType::Nvfp4, 0..=3) if i / ty.type_size() == 0 => [0x00, 0x7F, 0x01, 0x7E][at],
                    (GgmlType::Nvfp4, 0..=3) => byte() & 0x7F,
                    _ => byte(),
                };
            }
            let x = data(k, 11);
            let sums: Vec<f32> = x.chunks(ty.block_size()).map(|c| c.iter().sum()).collect();
            let reference = dot_row_scalar(ty, &row, &x).unwrap();
            let magnitude: f32 = {
                let mut deq = vec![0f32; k];
                dequantize_row(ty, &row, &mut deq).unwrap();
                deq.iter().zip(&x).map(|(a, b)| (a * b).abs()).sum()
            };
            for isa in Isa::ALL.into_iter().filter(|&i| i <= Isa::detected()) {
                let got = dot_row(isa, ty, &row, &x, &sums).unwrap();
                assert!(
                    got.is_finite() && (got - reference).abs() <= 1e-5 * (1.0 + magnitude),
                    "{ty} {isa:?}: {got} vs {reference}"
                );
            }
            assert!(
                dot_row(Isa::detected(), ty, &row[1..], &x[1..], &sums).is_err(),
                "{ty}: a partial block is an error"
            );
        }
    }

    /// The vectorized quantizer writes the scalar one's bits: random rows (1..=20 blocks,
    /// so 8-block groups and tails), ties at exactly half a code, zero, -0.0, denormal,
    /// infinite and NaN blocks.
    #[test]
    fn act16_quantize_simd_equals_scalar_bit_for_bit() {
        for isa in Isa::available().into_iter().filter(|&i| i > Isa::Scalar) {
            let mut rows: Vec<Vec<f32>> = (1..=40).map(|b| data(32 * b, b as u32)).collect();
            let mut special = data(32 * 9, 77);
            special[..32].fill(0.0);
            special[32..64].fill(-0.0);
            special[64..96].iter_mut().for_each(|v| *v *= 1e-41);
            special[96] = f32::INFINITY;
            special[130] = f32::NAN;
            special[160] = f32::NEG_INFINITY;
            special[161] = f32::NAN;
            // Ties: amax 32767 makes inv exactly 1, so k + 0.5 is a tie in both directions.
            for (i, v) in special[192..224].iter_mut().enumerate() {
                *v = if i == 0 { 32767.0 } else { (i as f32 - 16.0) + 0.5 };
            }
            special[224..256].iter_mut().enumerate().for_each(|(i, v)| *v = -(i as f32) * 1e5);
            rows.push(special);
            for x in rows {
                let (mut q1, mut s1) = (vec![0i16; x.len()], vec![0f32; x.len() / 16]);
                let (mut q2, mut s2) = (vec![0i16; x.len()], vec![0f32; x.len() / 16]);
                quantize_blocks(&x, &mut q1, &mut s1);
                quantize_at(isa, &x, &mut q2, &mut s2);
                assert_eq!(q1, q2, "{isa}: codes of a {}-element row", x.len());
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&s1), bits(&s2), "{isa}: scales and sums of a {}-element row", x.len());
            }
        }
    }

    #[test]
    fn act16_dot_matches_scalar_reference_and_f32() {
        for ty in [GgmlType::Q4_1, GgmlType::Q8_0, GgmlType::Q5_0, GgmlType::Q6K, GgmlType::Q4K] {
            let ks: &[usize] =
                if matches!(ty, GgmlType::Q6K | GgmlType::Q4K) { &[256, 768, 1536] } else { &[32, 64, 576, 1536] };
            for &k in ks {
                let (q, deq) = qmatrix_or_random(ty, 3, k);
                let x = data(k, 3);
                let (mut xq, mut ss) = (vec![0i16; k], vec![0f32; 2 * k / 32]);
                let act = Act16::quantize(&x, &mut xq, &mut ss);
                for r in 0..3 {
                    let reference = dot_row_act16_scalar(ty, q.row(r), &act).unwrap();
                    let exact: f64 = (0..k).map(|c| x[c] as f64 * deq[r * k + c] as f64).sum();
                    let mag: f64 = (0..k).map(|c| (x[c] as f64 * deq[r * k + c] as f64).abs()).sum();
                    // 16-bit activations: within ~2^-15 of the magnitude of the terms.
                    assert!(
                        (reference as f64 - exact).abs() <= 4e-5 * mag,
                        "{ty} k={k} row {r}: {reference} vs exact {exact}"
                    );
                    for isa in Isa::available() {
                        let got = dot_row_act16(isa, ty, q.row(r), &act).unwrap();
                        assert!(
                            (got - reference).abs() <= 1e-5 * (1.0 + mag as f32),
                            "{ty} k={k} {isa:?}: {got} vs {reference}"
                        );
                    }
                }
            }
        }
        // Mismatched lengths are an error, not a panic or an out-of-bounds read.
        let (q, _) = qmatrix(GgmlType::Q4_1, 1, 64);
        let (mut xq, mut ss) = (vec![0i16; 32], vec![0f32; 2]);
        let act = Act16::quantize(&data(32, 1), &mut xq, &mut ss);
        assert!(dot_row_act16(Isa::active(), GgmlType::Q4_1, q.row(0), &act).is_err());
        // Q6_K / Q4_K: only whole super-blocks against exactly their activations.
        for ty in [GgmlType::Q6K, GgmlType::Q4K] {
            let row = raw_kquant_row(ty, 1024, 3, true);
            for k in [896, 768, 1280, 32] {
                let (mut xq, mut ss) = (vec![0i16; k], vec![0f32; 2 * k / 32]);
                let act = Act16::quantize(&data(k, 1), &mut xq, &mut ss);
                for isa in Isa::available() {
                    assert!(dot_row_act16(isa, ty, &row, &act).is_err(), "{ty} row of 1024 against {k} at {isa}");
                    assert!(
                        dot_row_act16(isa, ty, &row[..row.len() - 1], &act).is_err(),
                        "short {ty} row against {k} at {isa}"
                    );
                }
            }
        }
    }

    /// The AVX2 unpacking of a Q6_K Act16 block (the one every AVX2 Act16 path uses) gives
    /// exactly `(q - 32) * scale` for every element of raw random super-blocks (every code
    /// and signed scale) with `d = 1` (dequantized exactly as `1 * scale * (q - 32)`).
    #[test]
    fn q6_k_unpacking_matches_dequantize() {
        #[cfg(target_arch = "x86_64")]
        if Isa::detected() >= Isa::Avx2 {
            let mut row = raw_kquant_row(GgmlType::Q6K, 256 * 64, 5, false);
            // Extreme scales and codes too.
            let mut extreme = vec![0xFFu8; 210];
            extreme[192..208].copy_from_slice(&[
                0x80, 0x7F, 0x80, 0x01, 0xFF, 0x00, 0x80, 0x80, 0x7F, 0x7F, 0x81, 0x80, 0x80, 0x7F, 0x02, 0x80,
            ]);
            row.extend(&extreme);
            row.extend(vec![0u8; 192]);
            row.extend([0x80u8; 16]);
            row.extend([0, 0]);
            for sb in row.chunks_exact_mut(210) {
                sb[208..].copy_from_slice(&half::f16::ONE.to_le_bytes());
                let mut want = [0f32; 256];
                dequantize_row(GgmlType::Q6K, sb, &mut want).unwrap();
                for b in 0..8 {
                    let mut got = [0i16; 32];
                    // SAFETY: AVX2 checked above; `sb` is one whole 210-byte super-block
                    // holding blocks 0..8.
                    unsafe {
                        use std::arch::x86_64::{__m256i, _mm256_storeu_si256};
                        let (lo, hi) = crate::batch::avx2::q6_k(sb.as_ptr(), b);
                        _mm256_storeu_si256(got.as_mut_ptr() as *mut __m256i, lo);
                        _mm256_storeu_si256(got.as_mut_ptr().add(16) as *mut __m256i, hi);
                    }
                    assert_eq!(got.map(f32::from), want[32 * b..32 * b + 32], "block {b} of {sb:02x?}");
                }
            }
        }
    }

    /// The AVX2 unpacking of a Q4_K Act16 block gives its 4-bit codes and [`q4_k_dm`] its
    /// `(d * sc, -(dmin * m))`: with them, `d' q + m'` is the dequantized value bit for bit
    /// (`quant::dequant::q4_k` rounds `d * sc`, `dmin * m` (both exact), then `dl q - ml`),
    /// on raw random super-blocks (every code, scale and min).
    #[test]
    fn q4_k_unpacking_matches_dequantize() {
        #[cfg(target_arch = "x86_64")]
        if Isa::detected() >= Isa::Avx2 {
            let mut row = raw_kquant_row(GgmlType::Q4K, 256 * 64, 7, true);
            row.extend(vec![0xFFu8; 144]);
            let last = row.len() - 144;
            row[last..last + 4].copy_from_slice(&[0x00, 0x3C, 0x00, 0xBC]);
            for sb in row.chunks_exact(144) {
                let mut want = [0f32; 256];
                dequantize_row(GgmlType::Q4K, sb, &mut want).unwrap();
                for b in 0..8 {
                    let mut got = [0i16; 32];
                    // SAFETY: AVX2 checked above; `sb` is one whole 144-byte super-block
                    // holding blocks 0..8.
                    let (d, m) = unsafe {
                        use std::arch::x86_64::{__m256i, _mm256_storeu_si256};
                        let (lo, hi) = crate::batch::avx2::q4_k(sb.as_ptr(), b);
                        _mm256_storeu_si256(got.as_mut_ptr() as *mut __m256i, lo);
                        _mm256_storeu_si256(got.as_mut_ptr().add(16) as *mut __m256i, hi);
                        let (ds, ms) = crate::batch::avx2::q4_k_dms(sb.as_ptr());
                        let dm = crate::batch::avx2::q4_k_dm(sb.as_ptr(), b);
                        assert_eq!(
                            (ds[b].to_bits(), ms[b].to_bits()),
                            (dm.0.to_bits(), dm.1.to_bits()),
                            "block {b}: q4_k_dms vs q4_k_dm"
                        );
                        dm
                    };
                    assert!(got.iter().all(|&q| (0..16).contains(&q)), "block {b}: codes {got:?}");
                    let value: Vec<f32> = got.iter().map(|&q| d * q as f32 + m).collect();
                    assert_eq!(value, want[32 * b..32 * b + 32], "block {b} of {sb:02x?}");
                }
            }
        }
    }

    /// Q4_K and Q6_K rows of raw random super-blocks (every code, every scale, `d` and
    /// `dmin` near +-1) at 1, 3 and 19 super-blocks: the Act16 dot of every ISA is within
    /// the 16-bit activation error of the f32 reference `dot_row_scalar` (and of an f64
    /// dot), the decode and batched paths give its bits; a 896-wide matrix is refused.
    #[test]
    fn kquant_act16_dot_of_raw_blocks_matches_the_f32_reference() {
        for ty in [GgmlType::Q4K, GgmlType::Q6K] {
            assert!(
                QMatrix::new(ty, 1, 896, vec![0u8; 896 / 256 * ty.type_size()]).is_err(),
                "{ty}: 896 columns are not whole super-blocks"
            );
            for (k, seed) in [(256, 1), (768, 2), (4864, 3)] {
                let n = 5;
                let w = QMatrix::new(ty, n, k, raw_kquant_row(ty, n * k, seed, true)).unwrap();
                check_act16_raw(&w, seed);
            }
        }
    }

    /// The body of the raw-block Act16 tests: `w` against three activation rows (the last
    /// two with outliers) at every ISA.
    fn check_act16_raw(w: &QMatrix, seed: u32) {
        let (ty, n, k) = (w.ty, w.rows, w.cols);
        let mut x = data(3 * k, 20 + seed);
        for v in x[k..].iter_mut().step_by(61) {
            *v *= 40.0;
        }
        for (i, xi) in x.chunks(k).enumerate() {
            let (mut xq, mut ss) = (vec![0i16; k], vec![0f32; 2 * k / 32]);
            let act = Act16::quantize(xi, &mut xq, &mut ss);
            for isa in Isa::available() {
                let mut batched = vec![0f32; 3 * n];
                matmul_wq_invariant_with(isa, &x, w, &mut batched, 3).unwrap();
                let mut decode = vec![0f32; n];
                matmul_wq_invariant_with(isa, xi, w, &mut decode, 1).unwrap();
                for j in 0..n {
                    let row = w.row(j);
                    let mut deq = vec![0f32; k];
                    dequantize_row(ty, row, &mut deq).unwrap();
                    let exact: f64 = deq.iter().zip(xi).map(|(&a, &b)| a as f64 * b as f64).sum();
                    let mag: f64 = deq.iter().zip(xi).map(|(&a, &b)| (a as f64 * b as f64).abs()).sum();
                    let reference = dot_row_scalar(ty, row, xi).unwrap();
                    let got = dot_row_act16(isa, ty, row, &act).unwrap();
                    // Each activation is rounded to within half a code, 2^-16 of its block's
                    // largest: the error is at most sum |w| * amax_b / 65534, plus f32
                    // rounding (Q6_K's lanes past 2^24 round once more, 2^-24 relative).
                    let act_err: f64 = deq
                        .chunks(32)
                        .zip(xi.chunks(32))
                        .map(|(wb, xb)| {
                            wb.iter().map(|v| v.abs() as f64).sum::<f64>()
                                * xb.iter().fold(0f64, |m, v| m.max(v.abs() as f64))
                                / 65534.0
                        })
                        .sum();
                    let tol = if i == 0 { 4e-5 * mag } else { act_err + 1e-5 * mag };
                    assert!(
                        got.is_finite() && (got as f64 - reference as f64).abs() <= tol,
                        "{ty} k={k} {isa} x{i} row {j}: {got} vs f32 {reference}"
                    );
                    assert!((got as f64 - exact).abs() <= tol, "{ty} k={k} {isa} x{i} row {j}: {got} vs exact {exact}");
                    let scalar = dot_row_act16_scalar(ty, row, &act).unwrap();
                    assert!(
                        (got - scalar).abs() <= 1e-5 * (1.0 + mag as f32),
                        "{ty} k={k} {isa} x{i} row {j}: {got} vs scalar Act16 {scalar}"
                    );
                    assert_eq!(
                        decode[j].to_bits(),
                        got.to_bits(),
                        "{ty} k={k} {isa} x{i} row {j}: decode vs the single-row dot"
                    );
                    assert_eq!(
                        batched[i * n + j].to_bits(),
                        got.to_bits(),
                        "{ty} k={k} {isa} x{i} row {j}: batched vs the single-row dot"
                    );
                }
            }
        }
    }

    /// `rows` Q5_0 rows of `k` elements of raw random bytes (every nibble and `qh` bit),
    /// with f16 scales `d` small and finite (2^-5 .. 2^-3, either sign).
    fn raw_q5_0_rows(rows: usize, k: usize, seed: u32) -> Vec<u8> {
        let mut s = 0x9e37_79b9u32 ^ seed.wrapping_mul(0x85eb_ca6b);
        let mut byte = || {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            (s >> 8) as u8
        };
        (0..rows * k / 32 * 22)
            .map(|i| if i % 22 == 1 { (0x28 + byte() % 8) | (byte() & 0x80) } else { byte() })
            .collect()
    }

    /// The AVX2 unpacking of a Q5_0 block (the one every AVX2 Act16 path uses) gives
    /// exactly `q - 16` for every element, on raw random blocks and all-zero / all-one
    /// bit patterns.
    #[test]
    fn q5_0_unpacking_matches_dequantize() {
        #[cfg(target_arch = "x86_64")]
        if Isa::detected() >= Isa::Avx2 {
            let mut blocks = raw_q5_0_rows(1, 32 * 256, 9);
            for fill in [0x00, 0xFF, 0xAA, 0x0F] {
                blocks.extend([0x00, 0x3C]);
                blocks.extend([fill; 20]);
            }
            for blk in blocks.chunks_exact_mut(22) {
                blk[..2].copy_from_slice(&half::f16::ONE.to_le_bytes());
                let mut want = [0f32; 32];
                dequantize_row(GgmlType::Q5_0, blk, &mut want).unwrap();
                let mut got = [0i16; 32];
                // SAFETY: AVX2 checked above; `blk` is one whole 22-byte block.
                unsafe {
                    use std::arch::x86_64::{__m256i, _mm256_storeu_si256};
                    let (lo, hi) = crate::batch::avx2::q5_0(blk.as_ptr());
                    _mm256_storeu_si256(got.as_mut_ptr() as *mut __m256i, lo);
                    _mm256_storeu_si256(got.as_mut_ptr().add(16) as *mut __m256i, hi);
                }
                assert_eq!(got.map(f32::from), want, "block {blk:02x?}");
            }
        }
    }

    /// Q5_0 rows of raw random blocks at Qwen2.5-0.5B's widths: the Act16 dot of every ISA
    /// is within the 16-bit activation error of the f32 reference `dot_row_scalar` (and of
    /// an f64 dot), and the decode and batched paths give its bits.
    #[test]
    fn q5_0_act16_dot_of_raw_blocks_matches_the_f32_reference() {
        for (k, seed) in [(896, 1), (4864, 2), (96, 3)] {
            let n = 5;
            let w = QMatrix::new(GgmlType::Q5_0, n, k, raw_q5_0_rows(n, k, seed)).unwrap();
            check_act16_raw(&w, seed);
        }
    }

    #[test]
    fn matmul_equals_dequantized_f32_matmul() {
        for (m, n, k) in [(1, 70, 64), (5, 130, 96), (17, 64, 32)] {
            for ty in [GgmlType::Q4_1, GgmlType::Q8_0, GgmlType::Q5_0, GgmlType::Q6K] {
                let k = if ty == GgmlType::Q6K { 256 } else { k };
                let (q, deq) = qmatrix_or_random(ty, n, k);
                let x = data(m * k, 11);
                let mut y = vec![0f32; m * n];
                matmul_wq(&x, &q, &mut y, m).unwrap();
                for i in 0..m {
                    for j in 0..n {
                        let want: f64 = (0..k).map(|c| x[i * k + c] as f64 * deq[j * k + c] as f64).sum();
                        let got = y[i * n + j] as f64;
                        assert!(
                            (got - want).abs() < 1e-3 * (1.0 + want.abs()),
                            "{ty} m={m} ({i},{j}): {got} vs {want}"
                        );
                    }
                }
            }
        }
    }

    /// Types without a quantizer get random bytes with sane f16 scales.
    fn qmatrix_or_random(ty: GgmlType, rows: usize, cols: usize) -> (QMatrix, Vec<f32>) {
        if crate::quant::can_quantize(ty) {
            return qmatrix(ty, rows, cols);
        }
        let row_bytes = cols / ty.block_size() * ty.type_size();
        let mut bytes: Vec<u8> = data(rows * row_bytes, 5).iter().map(|v| ((v + 1.0) * 127.0) as u8).collect();
        // Q6_K ends each block with an f16 scale: make it small and finite.
        for blk in bytes.chunks_mut(ty.type_size()) {
            let n = blk.len();
            blk[n - 2..].copy_from_slice(&half::f16::from_f32(0.01).to_le_bytes());
        }
        let mut deq = vec![0f32; rows * cols];
        for (r, chunk) in bytes.chunks(row_bytes).enumerate() {
            dequantize_row(ty, chunk, &mut deq[r * cols..(r + 1) * cols]).unwrap();
        }
        (QMatrix::new(ty, rows, cols, bytes).unwrap(), deq)
    }
}
