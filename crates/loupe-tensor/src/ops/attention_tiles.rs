//! Prefill attention's two products on AVX-512 and AVX2: for a chunk of query rows of one
//! head, the raw scores `q k^T` against every key the chunk sees, and (after the softmax) the
//! outputs `s v`. Register-blocked FMA kernels in place of two `gemm` calls per chunk.
//!
//! **Why.** With `gemm`, SmolLM2's pp512 spent ~23% of its graph time in attention at ~125
//! GFLOP/s on two Sapphire Rapids cores (`loupe bench --profile`): each call of a 32-row chunk
//! packed its head's keys (up to 512 x 64) again before a product of only 32 rows, and that
//! repacking (`gemm_common`'s packing loops) was a quarter of the gemm time in perf.
//!
//! **Layout.** The keys are transposed once per call, `[kv head][d][key]` with the key
//! count rounded up to [`KEY_BLOCK`] (zeros past the cache), so a vector of consecutive keys
//! at one `d` is one load, and the score kernel broadcasts each query element against it:
//! `R` rows x two vectors of keys accumulate in registers over `d`. The output kernel
//! broadcasts each score against a row of values: `R` rows x up to four vectors of the head.
//!
//! **Arithmetic.** Each score is `fma(q[d], k[d], acc)` over `d` in order from `+0.0`, each
//! output element `fma(s[j], v[j], acc)` over the keys in order from `+0.0`: the bits depend
//! on neither the blocking, the chunking nor the thread count, but they are not `gemm`'s (its
//! own summation order); the tests hold both within f32 rounding of an f64 reference.
//! Decode keeps its own row kernel ([`super::attention::rows::attend_heads`]).

use crate::quant::Isa;

/// Keys per score block (two vectors at AVX-512, four at AVX2); the transposed keys are
/// padded to a multiple of it.
pub(crate) const KEY_BLOCK: usize = 32;

/// Whether the kernels take heads of `head_dim` at `isa`: whole vectors of the head (the
/// output kernel's columns), AVX-512 at 16 lanes, AVX2 at 8.
pub(crate) fn usable(isa: Isa, head_dim: usize) -> bool {
    cfg!(target_arch = "x86_64")
        && head_dim > 0
        && match isa {
            Isa::Avx512 | Isa::Amx => head_dim.is_multiple_of(16),
            Isa::Avx2 => head_dim.is_multiple_of(8),
            _ => false,
        }
}

/// Keys rounded up to whole score blocks.
pub(crate) fn padded_keys(n: usize) -> usize {
    n.div_ceil(KEY_BLOCK) * KEY_BLOCK
}

/// Keys per transposition task: 64 keys of one kv head write 64 runs of 256 bytes per
/// dimension row, 16 KiB at head_dim 64, so the writes stay in L1.
const TRANSPOSE_KEYS: usize = 64;

/// Transposes keys `0..ctx` of every kv head of `k` (`[ctx][n_kv_heads * head_dim]`, rows of
/// any cache element type, narrow ones widened as `KvBlocks::widen_into` widens them) into
/// `kt` (`[n_kv_heads][head_dim][padded_keys(ctx)]`, zeros past `ctx`); on the pool in tasks
/// of [`TRANSPOSE_KEYS`] keys of one kv head.
///
/// Panics on narrow rows of a head over [`super::kv_blocks::MAX_HEAD_DIM`] (the
/// caller checks it).
pub(crate) fn transpose_keys(
    k: super::kv_blocks::KvBlocks<'_>,
    ctx: usize,
    n_kv_heads: usize,
    head_dim: usize,
    kt: &mut Vec<f32>,
) {
    use super::kv_blocks::{KvBlocks, MAX_HEAD_DIM};
    let stride = padded_keys(ctx);
    let kv_width = n_kv_heads * head_dim;
    let len = n_kv_heads * head_dim * stride;
    // Every element below ctx of each row is written by a task; only the padding is zeroed.
    if kt.len() < len {
        kt.resize(len, 0.0);
    }
    kt.truncate(len);
    let chunks = ctx.div_ceil(TRANSPOSE_KEYS).max(1);
    let out = crate::pool::OutPtr(kt.as_mut_ptr());
    crate::pool::run(n_kv_heads * chunks, &|task| {
        let (h, c) = (task / chunks, task % chunks);
        let keys = c * TRANSPOSE_KEYS..((c + 1) * TRANSPOSE_KEYS).min(ctx);
        let base = h * head_dim * stride;
        let mut wide = [0f32; MAX_HEAD_DIM];
        for j in keys.clone() {
            let at = j * kv_width + h * head_dim;
            let row: &[f32] = match k {
                KvBlocks::F32(d) => &d[at..at + head_dim],
                _ => {
                    k.widen_into(at, &mut wide[..head_dim]);
                    &wide[..head_dim]
                }
            };
            for (d, &x) in row.iter().enumerate() {
                // SAFETY: base + d * stride + j < len: kv head h's region (head_dim rows of
                // stride) and j < ctx <= stride; key j's column of this head is written by
                // this task alone (tasks own disjoint key ranges of one head).
                unsafe { *out.get().add(base + d * stride + j) = x };
            }
        }
        if c + 1 == chunks {
            for d in 0..head_dim {
                // SAFETY: the padding columns ctx..stride of head h's rows belong to the
                // task holding the head's last keys.
                unsafe {
                    std::slice::from_raw_parts_mut(out.get().add(base + d * stride + ctx), stride - ctx).fill(0.0)
                };
            }
        }
    });
}

/// Raw scores of `rows` query rows (row `r` at `q + r * q_stride`, `head_dim` long) against
/// keys `0..n_keys` of one head's transposed keys (`kt`, row `d` at `kt + d * kt_stride`):
/// `s[r * s_stride + j]` for `j < padded_keys(n_keys)` (the padding's scores are 0).
///
/// # Safety
/// [`usable`]`(isa, head_dim)`; `kt` readable for `head_dim` rows of `padded_keys(n_keys) <=
/// kt_stride` floats; `s` writable for `rows` rows of `padded_keys(n_keys) <= s_stride`; `q`
/// readable as described.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn scores(
    isa: Isa,
    q: *const f32,
    q_stride: usize,
    rows: usize,
    head_dim: usize,
    kt: *const f32,
    kt_stride: usize,
    n_keys: usize,
    s: *mut f32,
    s_stride: usize,
) {
    #[cfg(target_arch = "x86_64")]
    match isa {
        Isa::Avx512 | Isa::Amx => {
            x86::z::scores(q, q_stride, rows, head_dim, kt, kt_stride, padded_keys(n_keys), s, s_stride)
        }
        _ => x86::y::scores(q, q_stride, rows, head_dim, kt, kt_stride, padded_keys(n_keys), s, s_stride),
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (isa, q, q_stride, rows, head_dim, kt, kt_stride, n_keys, s, s_stride);
}

/// `out[r * out_stride + c] = sum_j s[r * s_stride + j] * v[j * v_stride + c]` for `r <
/// rows`, `c < head_dim`, over keys `j < n_keys` in order.
///
/// # Safety
/// [`usable`]`(isa, head_dim)`; `s` readable for `rows` rows of `n_keys`, `v` for `n_keys`
/// rows of `head_dim`, `out` writable for `rows` rows of `head_dim`, at the given strides.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn weighted_values(
    isa: Isa,
    s: *const f32,
    s_stride: usize,
    rows: usize,
    n_keys: usize,
    v: *const f32,
    v_stride: usize,
    head_dim: usize,
    out: *mut f32,
    out_stride: usize,
) {
    #[cfg(target_arch = "x86_64")]
    match isa {
        Isa::Avx512 | Isa::Amx => {
            x86::z::weighted_values(s, s_stride, rows, n_keys, v, v_stride, head_dim, out, out_stride)
        }
        _ => x86::y::weighted_values(s, s_stride, rows, n_keys, v, v_stride, head_dim, out, out_stride),
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (isa, s, s_stride, rows, n_keys, v, v_stride, head_dim, out, out_stride);
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    /// One ISA's kernels: `$vec` of `$lanes` floats; score blocks of `$rows_s` rows x
    /// `KEY_BLOCK` keys, output blocks of `$rows_v` rows x up to `$cols_v` vectors of the head.
    macro_rules! tile_kernels {
        ($features:literal, $lanes:literal, $vec:ty, $zero:ident, $fmadd:ident, $loadf:ident, $storef:ident, $set1:ident, $rows_s:literal, $rows_v:literal, $cols_v:literal) => {
            use std::arch::x86_64::*;

            use super::super::KEY_BLOCK;

            const KEY_VECS: usize = KEY_BLOCK / $lanes;

            #[allow(clippy::too_many_arguments)]
            #[target_feature(enable = $features)]
            pub(crate) unsafe fn scores(
                q: *const f32,
                q_stride: usize,
                rows: usize,
                head_dim: usize,
                kt: *const f32,
                kt_stride: usize,
                keys: usize,
                s: *mut f32,
                s_stride: usize,
            ) {
                let mut r = 0;
                while r < rows {
                    let (q, s) = (q.add(r * q_stride), s.add(r * s_stride));
                    // Whole blocks of rows, then the rest one row count at a time.
                    match (rows - r).min($rows_s) {
                        $rows_s => score_rows::<$rows_s>(q, q_stride, head_dim, kt, kt_stride, keys, s, s_stride),
                        n => {
                            for i in 0..n {
                                score_rows::<1>(
                                    q.add(i * q_stride),
                                    q_stride,
                                    head_dim,
                                    kt,
                                    kt_stride,
                                    keys,
                                    s.add(i * s_stride),
                                    s_stride,
                                );
                            }
                        }
                    }
                    r += $rows_s;
                }
            }

            #[allow(clippy::too_many_arguments)]
            #[inline]
            #[target_feature(enable = $features)]
            unsafe fn score_rows<const R: usize>(
                q: *const f32,
                q_stride: usize,
                head_dim: usize,
                kt: *const f32,
                kt_stride: usize,
                keys: usize,
                s: *mut f32,
                s_stride: usize,
            ) {
                let mut j = 0;
                while j < keys {
                    let mut acc = [[$zero(); KEY_VECS]; R];
                    for d in 0..head_dim {
                        let krow = kt.add(d * kt_stride + j);
                        let mut kv = [$zero(); KEY_VECS];
                        for (c, kv) in kv.iter_mut().enumerate() {
                            *kv = $loadf(krow.add(c * $lanes));
                        }
                        for (i, acc) in acc.iter_mut().enumerate() {
                            let qv = $set1(*q.add(i * q_stride + d));
                            for (a, kv) in acc.iter_mut().zip(&kv) {
                                *a = $fmadd(qv, *kv, *a);
                            }
                        }
                    }
                    for (i, acc) in acc.iter().enumerate() {
                        for (c, a) in acc.iter().enumerate() {
                            $storef(s.add(i * s_stride + j + c * $lanes), *a);
                        }
                    }
                    j += KEY_BLOCK;
                }
            }

            #[allow(clippy::too_many_arguments)]
            #[target_feature(enable = $features)]
            pub(crate) unsafe fn weighted_values(
                s: *const f32,
                s_stride: usize,
                rows: usize,
                n_keys: usize,
                v: *const f32,
                v_stride: usize,
                head_dim: usize,
                out: *mut f32,
                out_stride: usize,
            ) {
                let mut r = 0;
                while r < rows {
                    let (s, out) = (s.add(r * s_stride), out.add(r * out_stride));
                    match (rows - r).min($rows_v) {
                        $rows_v => value_rows::<$rows_v>(s, s_stride, n_keys, v, v_stride, head_dim, out, out_stride),
                        n => {
                            for i in 0..n {
                                value_rows::<1>(
                                    s.add(i * s_stride),
                                    s_stride,
                                    n_keys,
                                    v,
                                    v_stride,
                                    head_dim,
                                    out.add(i * out_stride),
                                    out_stride,
                                );
                            }
                        }
                    }
                    r += $rows_v;
                }
            }

            #[allow(clippy::too_many_arguments)]
            #[inline]
            #[target_feature(enable = $features)]
            unsafe fn value_rows<const R: usize>(
                s: *const f32,
                s_stride: usize,
                n_keys: usize,
                v: *const f32,
                v_stride: usize,
                head_dim: usize,
                out: *mut f32,
                out_stride: usize,
            ) {
                let mut c = 0;
                while c < head_dim {
                    let vecs = ((head_dim - c) / $lanes).min($cols_v);
                    // The full width of columns, or the head's last vectors one at a time.
                    if vecs == $cols_v {
                        value_cols::<R, $cols_v>(s, s_stride, n_keys, v.add(c), v_stride, out.add(c), out_stride);
                    } else {
                        for x in 0..vecs {
                            value_cols::<R, 1>(
                                s,
                                s_stride,
                                n_keys,
                                v.add(c + x * $lanes),
                                v_stride,
                                out.add(c + x * $lanes),
                                out_stride,
                            );
                        }
                    }
                    c += vecs * $lanes;
                }
            }

            #[allow(clippy::too_many_arguments)]
            #[inline]
            #[target_feature(enable = $features)]
            unsafe fn value_cols<const R: usize, const C: usize>(
                s: *const f32,
                s_stride: usize,
                n_keys: usize,
                v: *const f32,
                v_stride: usize,
                out: *mut f32,
                out_stride: usize,
            ) {
                let mut acc = [[$zero(); C]; R];
                for j in 0..n_keys {
                    let vrow = v.add(j * v_stride);
                    let mut vv = [$zero(); C];
                    for (x, vv) in vv.iter_mut().enumerate() {
                        *vv = $loadf(vrow.add(x * $lanes));
                    }
                    for (i, acc) in acc.iter_mut().enumerate() {
                        let sv = $set1(*s.add(i * s_stride + j));
                        for (a, vv) in acc.iter_mut().zip(&vv) {
                            *a = $fmadd(sv, *vv, *a);
                        }
                    }
                }
                for (i, acc) in acc.iter().enumerate() {
                    for (x, a) in acc.iter().enumerate() {
                        $storef(out.add(i * out_stride + x * $lanes), *a);
                    }
                }
            }
        };
    }

    /// AVX-512: 8 rows x 2 vectors of keys, 4 rows x 4 vectors of the head (16 accumulators).
    pub(super) mod z {
        tile_kernels!(
            "avx512f",
            16,
            __m512,
            _mm512_setzero_ps,
            _mm512_fmadd_ps,
            _mm512_loadu_ps,
            _mm512_storeu_ps,
            _mm512_set1_ps,
            8,
            4,
            4
        );
    }

    /// AVX2 (16 registers): 2 rows x 4 vectors of keys, 4 rows x 2 vectors of the head (8 accumulators).
    pub(super) mod y {
        tile_kernels!(
            "avx2,fma",
            8,
            __m256,
            _mm256_setzero_ps,
            _mm256_fmadd_ps,
            _mm256_loadu_ps,
            _mm256_storeu_ps,
            _mm256_set1_ps,
            2,
            4,
            2
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gen(n: usize, seed: usize) -> Vec<f32> {
        crate::testing::uniform(n, seed as u64, -1.0, 1.0)
    }

    /// Both kernels on every ISA this CPU has, against f64 products: odd row counts (whole
    /// blocks and tails), key counts off the block size, heads of one to many vectors, with
    /// strides wider than the rows; nothing is written outside the rows and columns asked.
    #[test]
    fn kernels_match_f64_products_on_every_isa() {
        // Every ISA this CPU has; those without the kernels (scalar) fail `usable` below.
        for isa in Isa::available() {
            for head_dim in [8, 16, 24, 64, 80, 256] {
                if !usable(isa, head_dim) {
                    continue;
                }
                for (rows, n_keys) in [(1, 1), (3, 31), (8, 32), (11, 45), (32, 100)] {
                    let (q_stride, ctx) = (head_dim * 3 + 5, n_keys + 7);
                    let q = gen(rows * q_stride, 1);
                    let k = gen(ctx * head_dim * 2, 2);
                    let mut kt = Vec::new();
                    transpose_keys(super::super::kv_blocks::KvBlocks::F32(&k), ctx, 2, head_dim, &mut kt);
                    let kt_stride = padded_keys(ctx);
                    let s_stride = padded_keys(n_keys) + 3;
                    let mut s = vec![f32::NAN; rows * s_stride];
                    // SAFETY: usable(isa, head_dim) and this CPU has isa; the buffers are
                    // sized as the contracts ask (kv head 1's transposed keys).
                    unsafe {
                        scores(
                            isa,
                            q.as_ptr(),
                            q_stride,
                            rows,
                            head_dim,
                            kt.as_ptr().add(head_dim * kt_stride),
                            kt_stride,
                            n_keys,
                            s.as_mut_ptr(),
                            s_stride,
                        )
                    };
                    for r in 0..rows {
                        for j in 0..n_keys {
                            let want: f64 = (0..head_dim)
                                .map(|d| q[r * q_stride + d] as f64 * k[j * 2 * head_dim + head_dim + d] as f64)
                                .sum();
                            let got = s[r * s_stride + j] as f64;
                            assert!(
                                (got - want).abs() <= 1e-5 * (1.0 + want.abs()),
                                "{isa:?} hd {head_dim} rows {rows} keys {n_keys}: s[{r}][{j}] {got} vs {want}"
                            );
                        }
                        assert!(
                            s[r * s_stride + padded_keys(n_keys)..(r + 1) * s_stride].iter().all(|x| x.is_nan()),
                            "wrote past the padded keys"
                        );
                    }
                    // Outputs from those scores (any weights do), values at a wider stride.
                    let v_stride = head_dim * 2;
                    let v = gen(n_keys * v_stride, 3);
                    let out_stride = head_dim + 9;
                    let mut out = vec![f32::NAN; rows * out_stride];
                    // SAFETY: as above; s holds rows x n_keys scores at s_stride.
                    unsafe {
                        weighted_values(
                            isa,
                            s.as_ptr(),
                            s_stride,
                            rows,
                            n_keys,
                            v.as_ptr(),
                            v_stride,
                            head_dim,
                            out.as_mut_ptr(),
                            out_stride,
                        )
                    };
                    for r in 0..rows {
                        for c in 0..head_dim {
                            let want: f64 =
                                (0..n_keys).map(|j| s[r * s_stride + j] as f64 * v[j * v_stride + c] as f64).sum();
                            let got = out[r * out_stride + c] as f64;
                            assert!(
                                (got - want).abs() <= 1e-4 * (1.0 + want.abs()),
                                "{isa:?} hd {head_dim} rows {rows} keys {n_keys}: out[{r}][{c}] {got} vs {want}"
                            );
                        }
                        assert!(
                            out[r * out_stride + head_dim..(r + 1) * out_stride].iter().all(|x| x.is_nan()),
                            "wrote past the head"
                        );
                    }
                }
            }
        }
    }

    /// The blocking does not change a score's bits: a row computed in a block of rows equals
    /// the same row computed alone (each score's order is fixed, d = 0, 1, ...).
    #[test]
    fn a_row_has_the_same_bits_in_a_block_and_alone() {
        for isa in Isa::available() {
            let (head_dim, rows, n_keys) = (64, 13, 70);
            if !usable(isa, head_dim) {
                continue;
            }
            let q = gen(rows * head_dim, 4);
            let k = gen(n_keys * head_dim, 5);
            let mut kt = Vec::new();
            transpose_keys(super::super::kv_blocks::KvBlocks::F32(&k), n_keys, 1, head_dim, &mut kt);
            let stride = padded_keys(n_keys);
            let mut block = vec![0f32; rows * stride];
            // SAFETY: usable and sized as the contract asks.
            unsafe {
                scores(
                    isa,
                    q.as_ptr(),
                    head_dim,
                    rows,
                    head_dim,
                    kt.as_ptr(),
                    stride,
                    n_keys,
                    block.as_mut_ptr(),
                    stride,
                )
            };
            for r in 0..rows {
                let mut alone = vec![0f32; stride];
                // SAFETY: as above, one row.
                unsafe {
                    scores(
                        isa,
                        q.as_ptr().add(r * head_dim),
                        head_dim,
                        1,
                        head_dim,
                        kt.as_ptr(),
                        stride,
                        n_keys,
                        alone.as_mut_ptr(),
                        stride,
                    )
                };
                assert_eq!(
                    alone[..n_keys].iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                    block[r * stride..r * stride + n_keys].iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                    "{isa:?} row {r}"
                );
            }
        }
    }
}
