//! One query row of one head against cached keys and values (decode and paged rows), and
//! the per-key dot and axpy it is built from, dispatched by ISA to `avx512` / `avx2`.

use half::slice::HalfFloatSliceExt;

use super::{avx2, avx512};
use crate::ops::kv_blocks::KvBlocks;
use crate::pool;
use crate::quant::Isa;

/// The cached keys and values one query row of one head reads: `start_of(p)` is the first
/// element of that head's row at position `p` in both (contiguous or paged).
pub(crate) struct CachedRows<'a, 'b, F: Fn(usize) -> usize> {
    pub keys: &'a KvBlocks<'b>,
    pub values: &'a KvBlocks<'b>,
    pub start_of: F,
}

/// One query head's row among the heads that read the same cached rows (the query heads
/// of one kv head at one position): its query, its scores (at least `visible.end` long)
/// and its output (as long as the query).
pub(crate) struct HeadRow<'a> {
    pub q: &'a [f32],
    pub scores: &'a mut [f32],
    pub o: &'a mut [f32],
}

impl HeadRow<'_> {
    /// A slot of a fixed array of heads that holds none (callers pass the filled prefix),
    /// so decode builds its groups without allocating.
    pub(crate) fn empty() -> Self {
        HeadRow { q: &[], scores: &mut [], o: &mut [] }
    }
}

/// The most query heads of one kv head an attention task runs (the slots decode fills
/// without allocating); larger GQA groups (multi-query models) split into more tasks.
pub(crate) const MAX_HEADS_PER_TASK: usize = 8;

/// Attention tasks a call needs per compute thread before it splits GQA groups: one, since
/// a head costs about half as much inside a group as alone (Qwen2.5 shapes,
/// `examples/paged_attention`), so splitting further only pays for idle threads.
const TASKS_PER_THREAD: usize = 1;

/// A GQA group of `group` query heads split into parts, one per attention task, of
/// near-equal sizes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct GroupParts {
    group: usize,
    parts: usize,
}

impl GroupParts {
    /// Parts for a call of `units` tasks before any split (sequences x kv heads x row
    /// chunks). A group stays whole, so its heads read each cached row from memory once
    /// (a second kernel call finds the rows in L2), unless the call has too few units to
    /// keep every thread busy (one sequence of Gemma 3's single kv head on 2 threads: 2 heads
    /// per task).
    pub(crate) fn new(group: usize, units: usize) -> Self {
        let group = group.max(1);
        let want = (TASKS_PER_THREAD * pool::threads()).div_ceil(units.max(1));
        GroupParts { group, parts: want.clamp(group.div_ceil(MAX_HEADS_PER_TASK), group) }
    }

    pub(crate) fn count(self) -> usize {
        self.parts
    }

    /// Indices within the group (`0..group`) of part `part`'s heads.
    pub(crate) fn heads(self, part: usize) -> std::ops::Range<usize> {
        part * self.group / self.parts..(part + 1) * self.group / self.parts
    }
}

/// Query rows of heads that share the cached rows `rows` (a GQA group at one position) over
/// the keys at positions `visible`: each head's raw scores into `scores[visible]`, their
/// softmax in place, and `o = sum_p scores[p] v_p`. `wide_row` (one head's length) is
/// scratch for the per-key path.
///
/// Every head's bits are those of the per-key loop of [`dot_cached`] and [`axpy_cached`]
/// run for that head alone. Where the ISA has a row kernel for the head size (AVX-512:
/// multiples of 16, AVX2: of 8) and the rows are f32 or f16, one call runs every key for up
/// to [`max_heads`] heads with each head's accumulators in the same order as the per-key
/// loop: each key row is loaded and widened once for the heads instead of once per head,
/// there is no call per key, and the outputs stay in registers across keys. Elsewhere the
/// per-key loop runs head by head.
#[allow(clippy::too_many_arguments)]
pub(crate) fn attend_heads<F: Fn(usize) -> usize>(
    isa: Isa,
    heads: &mut [HeadRow<'_>],
    rows: &CachedRows<'_, '_, F>,
    visible: std::ops::Range<usize>,
    scale: f32,
    softcap: Option<f32>,
    wide_row: &mut [f32],
) {
    let Some(n) = heads.first().map(|h| h.q.len()) else { return };
    let fits = heads.iter().all(|h| h.q.len() == n && h.o.len() == n && visible.end <= h.scores.len());
    // Decided once for every head and both passes: the checks walk every visible key.
    let kernel = row_kernel(isa, n, rows, visible.clone()).filter(|_| fits);
    // Split into the fewest calls the kernel serves, of near-equal sizes (7 heads: 4 + 3).
    let calls = heads.len().div_ceil(kernel.map_or(1, max_heads));
    let mut rest = heads;
    for call in 0..calls {
        let (now, later) = rest.split_at_mut(rest.len().div_ceil(calls - call));
        attend_call(isa, kernel, now, rows, visible.clone(), scale, softcap, wide_row);
        rest = later;
    }
}

/// [`attend_heads`] for at most [`max_heads`] heads of one kernel call.
#[allow(clippy::too_many_arguments)]
fn attend_call<F: Fn(usize) -> usize>(
    isa: Isa,
    kernel: Option<RowKernel>,
    heads: &mut [HeadRow<'_>],
    rows: &CachedRows<'_, '_, F>,
    visible: std::ops::Range<usize>,
    scale: f32,
    softcap: Option<f32>,
    wide_row: &mut [f32],
) {
    let start_of = &rows.start_of;
    // SAFETY (both passes): row_kernel checked the ISA, the head size and every visible row's
    // range in both the keys and the values; attend_heads checked every head's lengths.
    if !kernel
        .is_some_and(|k| unsafe { row_kernel_pass(k, RowPass::Scores, heads, rows.keys, start_of, visible.clone()) })
    {
        for head in heads.iter_mut() {
            for j in visible.clone() {
                head.scores[j] = dot_cached(isa, head.q, rows.keys, start_of(j), wide_row);
            }
        }
    }
    for head in heads.iter_mut() {
        softmax_row(&mut head.scores[visible.clone()], scale, softcap);
        head.o.fill(0.0);
    }
    if !kernel.is_some_and(|k| unsafe {
        row_kernel_pass(k, RowPass::WeightedSum, heads, rows.values, start_of, visible.clone())
    }) {
        for head in heads.iter_mut() {
            for j in visible.clone() {
                axpy_cached(isa, head.scores[j], rows.values, start_of(j), wide_row, head.o);
            }
        }
    }
}

/// Which row kernel serves rows of `n` elements under `isa`, if any: the vector width of the
/// per-key path at that ISA, for head sizes that are whole vectors of it (at AVX-512 that
/// path is the 16-lane one with scalar tails, so the 8-lane kernel serves AVX2 alone), and
/// rows `start_of(p)..+n` inside both the keys and the values for every `p` in `keys`.
#[derive(Debug, Clone, Copy)]
enum RowKernel {
    Lanes16,
    Lanes8,
}

/// The most heads one call of `kernel` runs: four accumulator vectors per head and the key's
/// vectors must stay in registers (32 zmm on AVX-512: 4 heads use 16 + 4 + 1 broadcast;
/// 16 ymm on AVX2: 3 heads use 12 + 1 + 1).
fn max_heads(kernel: RowKernel) -> usize {
    match kernel {
        RowKernel::Lanes16 => 4,
        RowKernel::Lanes8 => 3,
    }
}

fn row_kernel<F: Fn(usize) -> usize>(
    isa: Isa,
    n: usize,
    rows: &CachedRows<'_, '_, F>,
    keys: std::ops::Range<usize>,
) -> Option<RowKernel> {
    let kernel = match isa {
        _ if !cfg!(target_arch = "x86_64") || n == 0 => return None,
        Isa::Avx512 | Isa::Amx if n.is_multiple_of(16) => RowKernel::Lanes16,
        Isa::Avx2 if n.is_multiple_of(8) => RowKernel::Lanes8,
        _ => return None,
    };
    let len = rows.keys.len().min(rows.values.len());
    keys.into_iter().all(|p| (rows.start_of)(p).checked_add(n).is_some_and(|end| end <= len)).then_some(kernel)
}

/// One pass of [`attend_heads`] over the keys: raw scores (`scores[p] = q . row(p)`) or the
/// probability-weighted sum of the values (`o = sum_p scores[p] row(p)`), for every head.
#[derive(Debug, Clone, Copy)]
enum RowPass {
    Scores,
    WeightedSum,
}

/// Runs `pass` over `keys` with `kernel` for every head of `heads`; false, having written
/// nothing, for rows it does not read (FP8, which callers widen first) or more heads than
/// [`max_heads`].
///
/// # Safety
/// `kernel` is [`row_kernel`]'s answer for these rows, this head size and `keys`; every head's
/// query and output are that size and its scores at least `keys.end` long.
unsafe fn row_kernel_pass(
    kernel: RowKernel,
    pass: RowPass,
    heads: &mut [HeadRow<'_>],
    rows: &KvBlocks<'_>,
    start_of: &impl Fn(usize) -> usize,
    keys: std::ops::Range<usize>,
) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        let n = heads.first().map_or(0, |h| h.q.len());
        macro_rules! run_heads {
            ($simd:ident, $rows:expr, $g:literal) => {{
                let q: [*const f32; $g] = std::array::from_fn(|g| heads[g].q.as_ptr());
                match pass {
                    RowPass::Scores => {
                        let scores: [*mut f32; $g] = std::array::from_fn(|g| heads[g].scores.as_mut_ptr());
                        $simd::scores(q, n, $rows, start_of, keys, scores)
                    }
                    RowPass::WeightedSum => {
                        let w: [*const f32; $g] = std::array::from_fn(|g| heads[g].scores.as_ptr());
                        let o: [*mut f32; $g] = std::array::from_fn(|g| heads[g].o.as_mut_ptr());
                        $simd::weighted_sum(w, n, $rows, start_of, keys, o)
                    }
                }
            }};
        }
        macro_rules! run {
            ($simd:ident, $rows:expr) => {
                match heads.len() {
                    1 => run_heads!($simd, $rows, 1),
                    2 => run_heads!($simd, $rows, 2),
                    3 => run_heads!($simd, $rows, 3),
                    4 if matches!(kernel, RowKernel::Lanes16) => run_heads!($simd, $rows, 4),
                    _ => return false,
                }
            };
        }
        // SAFETY: the caller's contract (the ISA's features, which include F16C; whole
        // vectors; rows, keys and every head's slices in range).
        unsafe {
            match (kernel, rows) {
                (RowKernel::Lanes16, KvBlocks::F32(d)) => run!(avx512, d),
                (RowKernel::Lanes16, KvBlocks::F16(d)) => run!(avx512, d),
                (RowKernel::Lanes8, KvBlocks::F32(d)) => run!(avx2, d),
                (RowKernel::Lanes8, KvBlocks::F16(d)) => run!(avx2, d),
                (_, KvBlocks::Fp8 { .. }) => return false,
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (kernel, pass, heads, rows, start_of, keys);
    true
}

/// Scales raw scores `q . k` by `scale`, soft-caps them when `softcap` says so (as
/// `eager_attention_forward` does before adding the mask), and turns them into
/// probabilities in place (max-subtracted exp, as torch.softmax does, in f32). Every
/// attention path (prefill, decode, paged) goes through here, so the cap applies alike.
pub(crate) fn softmax_row(scores: &mut [f32], scale: f32, softcap: Option<f32>) {
    if let Some(cap) = softcap {
        for s in scores.iter_mut() {
            *s = crate::ops::soft_cap_one(*s * scale, cap);
        }
        crate::ops::activation::softmax_in_place(scores);
    } else {
        crate::ops::activation::scaled_softmax_in_place(scores, scale);
    }
}

/// `a . b` (equal lengths): four vector accumulators (AVX-512: 16 lanes, AVX2: 8) when
/// the ISA has them, else the scalar reference [`dot_scalar`].
#[inline]
pub(crate) fn dot(isa: Isa, a: &[f32], b: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if a.len() == b.len() {
        if isa >= Isa::Avx512 {
            // SAFETY: the CPU has AVX-512F and F16C (Isa::Avx512); equal lengths checked.
            return unsafe { super::avx512::dot_f32(a, b) };
        }
        if isa >= Isa::Avx2 {
            // SAFETY: the CPU has AVX2, FMA and F16C (Isa::Avx2); equal lengths checked.
            return unsafe { super::avx2::dot_f32(a, b) };
        }
    }
    let _ = isa;
    dot_scalar(a, b)
}

/// Reference dot product, summed left to right.
pub fn dot_scalar(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// `y += alpha * x` (equal lengths).
#[inline]
pub(crate) fn axpy(isa: Isa, alpha: f32, x: &[f32], y: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if x.len() == y.len() {
        if isa >= Isa::Avx512 {
            // SAFETY: the CPU has AVX-512F and F16C; equal lengths checked.
            return unsafe { super::avx512::axpy_f32(alpha, x, y) };
        }
        if isa >= Isa::Avx2 {
            // SAFETY: the CPU has AVX2, FMA and F16C; equal lengths checked.
            return unsafe { super::avx2::axpy_f32(alpha, x, y) };
        }
    }
    let _ = isa;
    for (acc, &v) in y.iter_mut().zip(x) {
        *acc += alpha * v;
    }
}

/// `q . row` for the cached row at `start`: f32 rows go straight to [`dot`]; f16 rows are
/// widened in registers by a twin of that dot with the same accumulators in the same
/// order (so the result equals widening first, then the f32 dot, bit for bit). `scratch`
/// (`q.len()` floats) holds the widened row where no SIMD twin runs.
#[inline]
pub(crate) fn dot_cached(isa: Isa, q: &[f32], rows: &KvBlocks<'_>, start: usize, scratch: &mut [f32]) -> f32 {
    match rows {
        KvBlocks::F32(d) => dot(isa, q, &d[start..start + q.len()]),
        KvBlocks::F16(d) => {
            let k = &d[start..start + q.len()];
            #[cfg(target_arch = "x86_64")]
            {
                if isa >= Isa::Avx512 {
                    // SAFETY: AVX-512F and F16C are available (Isa::Avx512); equal lengths.
                    return unsafe { super::avx512::dot_f16(q, k) };
                }
                if isa >= Isa::Avx2 {
                    // SAFETY: AVX2, FMA and F16C are available (Isa::Avx2); equal lengths.
                    return unsafe { super::avx2::dot_f16(q, k) };
                }
            }
            k.convert_to_f32_slice(scratch);
            dot(isa, q, scratch)
        }
        KvBlocks::Fp8 { .. } => {
            let n = q.len();
            rows.widen_into(start, &mut scratch[..n]);
            dot(isa, q, &scratch[..n])
        }
    }
}

/// `out += w * row` for the cached row at `start` (see [`dot_cached`]).
#[inline]
pub(crate) fn axpy_cached(isa: Isa, w: f32, rows: &KvBlocks<'_>, start: usize, scratch: &mut [f32], out: &mut [f32]) {
    match rows {
        KvBlocks::F32(d) => axpy(isa, w, &d[start..start + out.len()], out),
        KvBlocks::F16(d) => {
            let v = &d[start..start + out.len()];
            #[cfg(target_arch = "x86_64")]
            {
                if isa >= Isa::Avx512 {
                    // SAFETY: as in dot_cached.
                    return unsafe { super::avx512::axpy_f16(w, v, out) };
                }
                if isa >= Isa::Avx2 {
                    // SAFETY: as in dot_cached.
                    return unsafe { super::avx2::axpy_f16(w, v, out) };
                }
            }
            v.convert_to_f32_slice(scratch);
            axpy(isa, w, scratch, out)
        }
        KvBlocks::Fp8 { .. } => {
            let n = out.len();
            rows.widen_into(start, &mut scratch[..n]);
            axpy(isa, w, &scratch[..n], out)
        }
    }
}
