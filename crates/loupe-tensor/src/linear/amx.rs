//! AMX int8 tile kernels for prefill: `y[m, n] = x[m, k] @ W^T` for Q4_1, Q8_0 and Q5_0 weights
//! against activations quantized to 16-bit blocks ([`Act16`]), on Intel CPUs with AMX
//! (Sapphire Rapids and later; [`Isa::Amx`]).
//!
//! **Arithmetic.** Each output is computed exactly as [`crate::linear::dot_row_act16_scalar`]
//! computes it, bit for bit (tested): per block of 32, the exact integer dot of the weight
//! codes with the activation's 16-bit codes, then `acc += d * scale * dot + m * sum` in f32
//! (Q8_0: no offset term), blocks in order from `+0.0`. So prefill on AMX has decode's
//! precision (16-bit activations, under 2^-16 of a block's largest value) and the bits of
//! the portable reference; it does not depend on `m`, the thread count or the tiling.
//!
//! **How a 16-bit activation meets an 8-bit tile.** AMX multiplies bytes. Each code is split
//! as `a = 256 * hi + lo` (`hi = a >> 8` signed, `lo = a & 0xFF` unsigned) and each block is
//! two tile products, `dot = 256 * (hi . w) + (lo . w)`, both exact in i32 (|hi . w| <=
//! 128 * 128 * 32), combined in AVX-512 before the f32 step. The activations are the A
//! operand: per tile of 16 rows and block, 16 x 32 hi bytes and 16 x 32 lo bytes, packed
//! contiguously once per call. The weights are the B operand in the VNNI layout (four
//! consecutive codes of one weight row per dword, 16 rows per panel), unpacked from their
//! nibbles or bytes once per call by the task that owns the panel. `tdpbsud`/`tdpbuud` take
//! Q4_1's unsigned codes, `tdpbssd`/`tdpbusd` the signed codes of Q8_0 and Q5_0. The product tiles' lanes
//! are weight rows, so the f32 step runs 16 outputs per vector with `d` and `m` as vectors
//! and the activation's scale and sum broadcast, and each activation row's 16 outputs are
//! one store.
//!
//! **Where the time goes.** The tile instructions and the exact f32 step take about the same
//! time per tile-block (16 activation rows x 16 weight rows x one block of 32) and add up
//! rather than overlap; the reorderings and formulas tried are in BENCHMARKS.md,
//! "Measurements once in doc comments", and `examples/amx_tile_block.rs` times the kernel. The floor is the
//! contract: 16-bit activations take two 8-bit products per block, and decode's bits take 8
//! vector operations per 16 outputs per block; llama.cpp's AMX path multiplies 8-bit
//! activations, one product per block.
//! Tasks own groups of panels and run every activation tile over the group, so an
//! activation tile's 18-48 KiB stay in L1 while the group's weights stream from L2; the
//! products of consecutive blocks alternate between two tile pairs so a store never waits
//! on the product just issued.
//!
//! **Permission.** Linux gives a process the 8 KiB of tile state only after
//! `arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)` (the kernel's
//! Documentation/arch/x86/xstate.rst); [`tiles_usable`] asks once. Each pool task loads the
//! tile configuration before its tiles and releases them after (`tilerelease`), so a thread
//! between jobs carries no tile state through context switches.
//!
//! The instructions are written with `asm!` (Rust's AMX intrinsics and target features are
//! unstable); the rest of the kernel is AVX-512 F/BW/VL, which every AMX CPU has.

use crate::linear::qmatrix::QMatrix;
use crate::quant::Isa;
use crate::{GgmlType, TensorError};

/// Fewest activation rows worth a tile pass: one AMX tile is 16 rows, and below that
/// the padding wastes most of each product (the f32 path stays faster).
pub const AMX_MIN_ROWS: usize = 16;

/// The weight types the tile kernels unpack.
fn tile_type(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::Q4_1 | GgmlType::Q8_0 | GgmlType::Q5_0)
}

/// Whether [`matmul_wq_amx`] takes `w` at `m` activation rows.
pub fn can_take(w: &QMatrix, m: usize) -> bool {
    m >= AMX_MIN_ROWS && tile_type(w.ty) && w.cols > 0 && w.cols.is_multiple_of(32)
}

/// `y[m, n] = x[m, k] @ W^T` on AMX tiles for Q4_1 / Q8_0 / Q5_0 `W` (`n = w.rows`, `k = w.cols`,
/// a multiple of 32), each output bit-identical to [`crate::linear::dot_row_act16_scalar`] of
/// its activation row quantized by [`Act16::quantize`]. Does not apply `w.tensor_scale`
/// (the caller does, as for every kernel).
///
/// Errors if the shapes disagree, if `w` is another type, or if this CPU or OS cannot run
/// AMX tiles ([`Isa::Amx`] not detected).
pub fn matmul_wq_amx(x: &[f32], w: &QMatrix, y: &mut [f32], m: usize) -> Result<(), TensorError> {
    matmul_wq_amx_group(x, &[w], &mut [y], m)
}

/// Most matrices one [`matmul_wq_amx_group`] call takes (q/k/v need 3).
pub const MAX_GROUP: usize = 4;

/// [`matmul_wq_amx`] for several matrices that share their input (q/k/v, gate/up):
/// `ys[i] = x @ ws[i]^T`, the activations quantized and packed once and every matrix's
/// panels run as one pool job. Each output is bit-identical to [`matmul_wq_amx`] on its
/// matrix alone.
pub fn matmul_wq_amx_group(x: &[f32], ws: &[&QMatrix], ys: &mut [&mut [f32]], m: usize) -> Result<(), TensorError> {
    let op = "matmul_wq_amx";
    if ws.is_empty() || ws.len() != ys.len() || ws.len() > MAX_GROUP {
        return Err(TensorError::Shape {
            op,
            detail: format!("{} matrices and {} outputs (equal, 1 to {MAX_GROUP})", ws.len(), ys.len()),
        });
    }
    let k = ws[0].cols;
    for (w, y) in ws.iter().zip(ys.iter()) {
        if w.cols != k || m.checked_mul(k) != Some(x.len()) || m.checked_mul(w.rows) != Some(y.len()) {
            return Err(TensorError::Shape {
                op,
                detail: format!(
                    "x has {} elements and y {}, expected {m}x{} and {m}x{}",
                    x.len(),
                    y.len(),
                    w.cols,
                    w.rows
                ),
            });
        }
        if !tile_type(w.ty) {
            return Err(TensorError::UnsupportedType { op, dtype: w.ty });
        }
    }
    if !k.is_multiple_of(32) {
        return Err(TensorError::Shape { op, detail: format!("{k} columns is not a multiple of 32") });
    }
    if Isa::detected() < Isa::Amx {
        return Err(TensorError::Shape { op, detail: "this CPU or OS cannot run AMX tiles".into() });
    }
    if m == 0 || k == 0 {
        return Ok(());
    }
    #[cfg(target_arch = "x86_64")]
    {
        x86::matmul(x, ws, ys, m);
        Ok(())
    }
    #[cfg(not(target_arch = "x86_64"))]
    unreachable!("Isa::Amx is only detected on x86_64")
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::asm;
    use std::arch::x86_64::*;
    use std::cell::RefCell;

    use crate::linear::act16::Act16;
    use crate::linear::qmatrix::QMatrix;
    use crate::pool;
    use crate::pool::OutPtr;
    use crate::GgmlType;

    /// Rows of one tile: activation rows per A tile, weight rows per B panel.
    const TILE: usize = 16;
    /// Blocks ahead whose tiles are prefetched into L1.
    const PREFETCH_BLOCKS: usize = 4;
    /// Most panels one task unpacks and runs together.
    const MAX_GROUP_PANELS: usize = 16;

    /// 64 bytes, 64-aligned: one tile row.
    #[derive(Clone, Copy)]
    #[repr(C, align(64))]
    struct Line([u8; 64]);

    const ZERO_LINE: Line = Line([0; 64]);

    /// The activation side of one call, built by the calling thread's tasks; `mp` rows
    /// (`m` rounded up to a tile), the rows past `m` zero.
    #[derive(Default)]
    struct ActScratch {
        /// Act16 `(scale, sum)` per block, row-major `[mp][2 * blocks]`.
        ss: Vec<f32>,
        /// The A tiles, per activation tile `t` and block `b` (at `(t * blocks + b) * 16`
        /// lines): 8 lines of the codes' high bytes (`a >> 8`, signed), row `r` at byte
        /// `32 r`, then 8 of their low bytes (`a & 0xFF`). Contiguous, so a tile load streams.
        tiles: Vec<Line>,
    }

    /// One task's weight side: a group of panels of 16 weight rows.
    #[derive(Default)]
    struct PanelScratch {
        /// The panel's codes unpacked to bytes, `[16][k]`.
        rows: Vec<u8>,
        /// Per panel and block, the B tile: 8 lines, line `r` holding codes `4r..4r + 4` of
        /// each of the 16 rows (the VNNI layout).
        vnni: Vec<Line>,
        /// Per panel and block, 16 `d` then 16 `m` (Q4_1; zero for Q8_0 and Q5_0), as f32.
        dm: Vec<f32>,
        /// Two buffers of a block's two product tiles (hi, lo), 16 rows x 16 i32 each.
        c: Vec<Line>,
    }

    thread_local! {
        static ACT: RefCell<ActScratch> = RefCell::new(ActScratch::default());
        /// One row's Act16 codes, per thread (the caller's `ACT` is borrowed for the call, so
        /// its tasks need a buffer of their own).
        static CODES: RefCell<Vec<i16>> = const { RefCell::new(Vec::new()) };
        static PANEL: RefCell<PanelScratch> = RefCell::new(PanelScratch::default());
    }

    /// The tile configuration (palette 1): tmm0/1 the activation tile's hi/lo bytes (16
    /// rows x 32 bytes), tmm2 the weight panel (8 rows x 64 bytes), tmm4/5 and tmm6/7 two
    /// sets of products (16 rows x 16 i32).
    fn config() -> Line {
        let mut c = [0u8; 64];
        c[0] = 1;
        let tiles: [(u8, u16); 8] = [(16, 32), (16, 32), (8, 64), (0, 0), (16, 64), (16, 64), (16, 64), (16, 64)];
        for (t, (rows, colsb)) in tiles.into_iter().enumerate() {
            c[16 + 2 * t..18 + 2 * t].copy_from_slice(&colsb.to_le_bytes());
            c[48 + t] = rows;
        }
        Line(c)
    }

    pub(crate) fn matmul(x: &[f32], ws: &[&QMatrix], ys: &mut [&mut [f32]], m: usize) {
        ACT.with(|cell| match cell.try_borrow_mut() {
            Ok(mut s) => matmul_in(x, ws, ys, m, &mut s),
            Err(_) => matmul_in(x, ws, ys, m, &mut ActScratch::default()),
        })
    }

    fn matmul_in(x: &[f32], ws: &[&QMatrix], ys: &mut [&mut [f32]], m: usize, s: &mut ActScratch) {
        let k = ws[0].cols;
        let blocks = k / 32;
        let tiles_m = m.div_ceil(TILE);
        let mp = tiles_m * TILE;
        // Rows below m are overwritten by their task; only the padding rows of the last
        // tile are zeroed (clearing the whole buffer cost ~2% of a prefill).
        s.ss.resize(mp * 2 * blocks, 0.0);
        s.ss[m * 2 * blocks..].fill(0.0);
        s.tiles.resize(tiles_m * blocks * 16, ZERO_LINE);
        if m < mp {
            let t = tiles_m - 1;
            for b in 0..blocks {
                let tile = &mut s.tiles[(t * blocks + b) * 16..][..16];
                for r in m - t * TILE..TILE {
                    // Row r's 32 hi bytes in lines 0..8 and 32 lo bytes in lines 8..16.
                    tile[r / 2].0[(r % 2) * 32..][..32].fill(0);
                    tile[8 + r / 2].0[(r % 2) * 32..][..32].fill(0);
                }
            }
        }
        let (ssp, tp) = (OutPtr(s.ss.as_mut_ptr()), OutPtr(s.tiles.as_mut_ptr().cast::<u8>()));
        // One task per activation tile: quantize its rows (each alone, by the one-row
        // quantizer) and split the codes.
        pool::run(tiles_m, &|t| {
            CODES.with(|cell| {
                let mut local = Vec::new();
                let mut guard = cell.try_borrow_mut();
                let q = match guard {
                    Ok(ref mut g) => &mut **g,
                    Err(_) => &mut local,
                };
                q.resize(k, 0);
                for i in t * TILE..((t + 1) * TILE).min(m) {
                    // SAFETY: row i of ss (mp x 2*blocks) and the tiles of activation tile t
                    // belong to this task alone; the buffers were sized above; the CPU has
                    // AVX-512 BW (Isa::Amx implies it).
                    unsafe {
                        let ss = std::slice::from_raw_parts_mut(ssp.get().add(i * 2 * blocks), 2 * blocks);
                        Act16::quantize(&x[i * k..(i + 1) * k], q, ss);
                        split_row(q.as_ptr(), blocks, tp.get().add(t * blocks * 1024 + (i - t * TILE) * 32));
                    }
                }
            })
        });
        let s = &*s;
        // Tasks own groups of panels of one matrix: each unpacks its group once, then runs
        // every activation tile over the whole group while the tile's codes stay in L1 (a
        // group of 16 panels of k = 1536 is 384 KiB of unpacked weights, in L2). Task t of
        // the job is task t - firsts[i] of matrix i.
        let mut outs = [OutPtr(std::ptr::null_mut()); super::MAX_GROUP];
        let (mut group, mut firsts) = ([1usize; super::MAX_GROUP], [0usize; super::MAX_GROUP + 1]);
        for (i, (w, y)) in ws.iter().zip(ys.iter_mut()).enumerate() {
            outs[i] = OutPtr(y.as_mut_ptr());
            let panels = w.rows.div_ceil(TILE);
            group[i] = panels.div_ceil(pool::threads() * 2).clamp(1, MAX_GROUP_PANELS);
            firsts[i + 1] = firsts[i] + panels.div_ceil(group[i]);
        }
        pool::run(firsts[ws.len()], &|task| {
            let i = (0..ws.len()).rfind(|&i| firsts[i] <= task).unwrap_or(0);
            let (w, p, n) = (ws[i], task - firsts[i], ws[i].rows);
            let panels = n.div_ceil(TILE);
            PANEL.with(|cell| {
                let mut local = PanelScratch::default();
                let mut guard = cell.try_borrow_mut();
                let panel = match guard {
                    Ok(ref mut g) => &mut **g,
                    Err(_) => &mut local,
                };
                panel.rows.resize(TILE * k, 0);
                let first = p * group[i];
                let count = group[i].min(panels - first);
                panel.vnni.resize(count * blocks * 8, ZERO_LINE);
                panel.dm.resize(count * blocks * 2 * TILE, 0.0);
                panel.c.resize(4 * TILE, ZERO_LINE);
                // SAFETY: Isa::Amx was detected (checked by the caller): AMX-TILE/INT8 with
                // the tile state granted, AVX-512 F/BW/VL and F16C; the activation side
                // holds mp rows of k; the columns of panels first..first+count of ys[i]
                // (m x n) belong to this task.
                unsafe {
                    for g in 0..count {
                        unpack_panel(w, (first + g) * TILE, blocks, g, panel);
                    }
                    panels_times_rows(w.ty == GgmlType::Q4_1, s, m, n, k, first * TILE, count, panel, outs[i]);
                }
            })
        });
    }

    /// Splits the codes at `q` (`blocks` blocks of one row) into high bytes (`a >> 8`) and
    /// low bytes, block `b`'s at `dst + 1024 b` and `dst + 1024 b + 512` (see `ActScratch::tiles`).
    #[target_feature(enable = "avx512f,avx512bw")]
    unsafe fn split_row(q: *const i16, blocks: usize, dst: *mut u8) {
        for b in 0..blocks {
            let v = _mm512_loadu_si512(q.add(32 * b) as *const _);
            _mm256_storeu_si256(dst.add(1024 * b) as *mut __m256i, _mm512_cvtepi16_epi8(_mm512_srai_epi16::<8>(v)));
            _mm256_storeu_si256(dst.add(1024 * b + 512) as *mut __m256i, _mm512_cvtepi16_epi8(v));
        }
    }

    /// Unpacks weight rows `j0..j0 + 16` (zeros past `w.rows`) into `panel`: the codes as
    /// bytes (Q4_1: 0..15, low nibbles first; Q8_0: the signed bytes; Q5_0: -16..15, the
    /// nibbles with bit j of `qh` as bit 4, minus 16), rearranged into one VNNI B tile per
    /// block, and the f16 `d` (and Q4_1's `m`) as f32.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
    unsafe fn unpack_panel(w: &QMatrix, j0: usize, blocks: usize, slot: usize, panel: &mut PanelScratch) {
        let q4_1 = w.ty == GgmlType::Q4_1;
        let q5_0 = w.ty == GgmlType::Q5_0;
        let bytes = w.ty.type_size();
        let k = blocks * 32;
        let rows = panel.rows.as_mut_ptr();
        let dm = panel.dm.as_mut_ptr().add(slot * blocks * 2 * TILE);
        let mask = _mm_set1_epi8(0x0F);
        for r in 0..TILE {
            let j = j0 + r;
            let dst = rows.add(r * k);
            if j >= w.rows {
                std::ptr::write_bytes(dst, 0, k);
                for b in 0..blocks {
                    *dm.add(b * 2 * TILE + r) = 0.0;
                    *dm.add(b * 2 * TILE + TILE + r) = 0.0;
                }
                continue;
            }
            let row = w.row(j).as_ptr();
            for b in 0..blocks {
                let blk = row.add(b * bytes);
                let at = dst.add(b * 32);
                let dmv = _mm_cvtph_ps(_mm_cvtsi32_si128(std::ptr::read_unaligned(blk as *const i32)));
                *dm.add(b * 2 * TILE + r) = _mm_cvtss_f32(dmv);
                if q4_1 {
                    *dm.add(b * 2 * TILE + TILE + r) = _mm_cvtss_f32(_mm_movehdup_ps(dmv));
                    let qs = _mm_loadu_si128(blk.add(4) as *const __m128i);
                    _mm_storeu_si128(at as *mut __m128i, _mm_and_si128(qs, mask));
                    _mm_storeu_si128(at.add(16) as *mut __m128i, _mm_and_si128(_mm_srli_epi16::<4>(qs), mask));
                } else if q5_0 {
                    *dm.add(b * 2 * TILE + TILE + r) = 0.0;
                    let qh = std::ptr::read_unaligned(blk.add(2) as *const u32);
                    let qs = _mm_loadu_si128(blk.add(6) as *const __m128i);
                    let nib = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16::<4>(qs), mask), _mm_and_si128(qs, mask));
                    let high = _mm256_and_si256(_mm256_movm_epi8(qh), _mm256_set1_epi8(0x10));
                    _mm256_storeu_si256(
                        at as *mut __m256i,
                        _mm256_sub_epi8(_mm256_or_si256(nib, high), _mm256_set1_epi8(16)),
                    );
                } else {
                    *dm.add(b * 2 * TILE + TILE + r) = 0.0;
                    _mm256_storeu_si256(at as *mut __m256i, _mm256_loadu_si256(blk.add(2) as *const __m256i));
                }
            }
        }
        // Line l of block b's tile: dword l of each row's block (dword index r*k/4 + 8b + l).
        let rows_i32 = rows as *const i32;
        let stride = _mm512_mullo_epi32(
            _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
            _mm512_set1_epi32((k / 4) as i32),
        );
        let vnni = panel.vnni.as_mut_ptr().cast::<u8>().add(slot * blocks * 512);
        for b in 0..blocks {
            for l in 0..8 {
                let idx = _mm512_add_epi32(stride, _mm512_set1_epi32((8 * b + l) as i32));
                _mm512_storeu_si512(
                    vnni.add((b * 8 + l) * 64) as *mut _,
                    _mm512_i32gather_epi32::<4>(idx, rows_i32 as *const _),
                );
            }
        }
    }

    macro_rules! tdp {
        ($op:literal, $c:literal, $a:literal, $b:literal) => {
            asm!(concat!($op, " tmm", $c, ", tmm", $a, ", tmm", $b), options(nomem, nostack, preserves_flags))
        };
    }
    macro_rules! tileload {
        ($t:literal, $p:expr, $stride:expr) => {
            asm!(concat!("tileloadd tmm", $t, ", [{p} + {s}*1]"), p = in(reg) $p, s = in(reg) $stride, options(readonly, nostack, preserves_flags))
        };
    }
    macro_rules! tilestore {
        ($t:literal, $p:expr) => {
            asm!(concat!("tilestored [{p} + {s}*1], tmm", $t), p = in(reg) $p, s = in(reg) 64usize, options(nostack, preserves_flags))
        };
    }

    /// The `count` panels unpacked in `panel` (weight rows from `j0`) against every
    /// activation tile; lanes are weight rows, so each activation row's 16 outputs of a
    /// panel are one store.
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    unsafe fn panels_times_rows(
        q4_1: bool,
        s: &ActScratch,
        m: usize,
        n: usize,
        k: usize,
        j0: usize,
        count: usize,
        panel: &mut PanelScratch,
        out: OutPtr,
    ) {
        let cfg = config();
        asm!("ldtilecfg [{}]", in(reg) cfg.0.as_ptr(), options(readonly, nostack, preserves_flags));
        let blocks = k / 32;
        let c = panel.c.as_mut_ptr().cast::<u8>();
        for (t, g) in (0..m.div_ceil(TILE)).flat_map(|t| (0..count).map(move |g| (t, g))) {
            let vnni = panel.vnni.as_ptr().cast::<u8>().add(g * blocks * 512);
            let dms = panel.dm.as_ptr().add(g * blocks * 2 * TILE);
            let jg = j0 + g * TILE;
            let cols = (n - jg).min(TILE);
            let col_mask: __mmask16 = if cols == TILE { !0 } else { (1u16 << cols) - 1 };
            let mut acc = [_mm512_setzero_ps(); TILE];
            let at = s.tiles.as_ptr().cast::<u8>().add(t * blocks * 1024);
            let ss = s.ss.as_ptr().add(t * TILE * 2 * blocks);
            // A three-stage pipeline over the blocks, so no load waits on a tile store just
            // issued: step `p` multiplies block `p` into product set `p % 2` (tmm4/5 or
            // tmm6/7), stores block `p - 1`'s products to buffer `(p - 1) % 2`, and runs
            // the f32 step of block `p - 2`, stored a whole step earlier.
            for p in 0..blocks + 2 {
                if p + PREFETCH_BLOCKS < blocks {
                    // Tile loads stall on L2 (an activation tile of k = 1536 is 48 KiB,
                    // L1's size): bring the block a few steps ahead into L1.
                    let (a, w) = (at.add((p + PREFETCH_BLOCKS) * 1024), vnni.add((p + PREFETCH_BLOCKS) * 512));
                    for l in 0..16 {
                        _mm_prefetch::<_MM_HINT_T0>(a.add(64 * l) as *const i8);
                    }
                    for l in 0..8 {
                        _mm_prefetch::<_MM_HINT_T0>(w.add(64 * l) as *const i8);
                    }
                }
                if p < blocks {
                    tileload!("0", at.add(p * 1024), 32usize);
                    tileload!("1", at.add(p * 1024 + 512), 32usize);
                    tileload!("2", vnni.add(p * 512), 64usize);
                    // Block p's hi and lo products into the pair (tmm4/5 or tmm6/7), from
                    // zero: unsigned weight codes (Q4_1) or signed (Q8_0, Q5_0).
                    macro_rules! products {
                        ($hi:literal, $lo:literal) => {{
                            asm!(
                                concat!("tilezero tmm", $hi),
                                concat!("tilezero tmm", $lo),
                                options(nomem, nostack, preserves_flags)
                            );
                            if q4_1 {
                                tdp!("tdpbsud", $hi, "0", "2");
                                tdp!("tdpbuud", $lo, "1", "2");
                            } else {
                                tdp!("tdpbssd", $hi, "0", "2");
                                tdp!("tdpbusd", $lo, "1", "2");
                            }
                        }};
                    }
                    if p % 2 == 0 {
                        products!("4", "5");
                    } else {
                        products!("6", "7");
                    }
                }
                if (1..=blocks).contains(&p) {
                    if (p - 1) % 2 == 0 {
                        tilestore!("4", c);
                        tilestore!("5", c.add(1024));
                    } else {
                        tilestore!("6", c.add(2048));
                        tilestore!("7", c.add(3072));
                    }
                }
                if p < 2 {
                    continue;
                }
                let b = p - 2;
                let (chi, clo) = (c.add(2048 * (b % 2)) as *const i32, c.add(2048 * (b % 2) + 1024) as *const i32);
                let d = _mm512_loadu_ps(dms.add(b * 2 * TILE));
                let mw = _mm512_loadu_ps(dms.add(b * 2 * TILE + TILE));
                // Written out row by row (not a loop) so the 16 accumulators stay in registers.
                macro_rules! row {
                    ($i:literal) => {{
                        let dot = _mm512_add_epi32(
                            _mm512_slli_epi32::<8>(_mm512_loadu_si512(chi.add($i * 16) as *const _)),
                            _mm512_loadu_si512(clo.add($i * 16) as *const _),
                        );
                        let (scale, sum) = (*ss.add($i * 2 * blocks + 2 * b), *ss.add($i * 2 * blocks + 2 * b + 1));
                        // dot_row_act16_scalar: acc += d * scale * dot as f32 (+ m * sum), as
                        // separate f32 roundings in that order.
                        let mut v = _mm512_mul_ps(_mm512_mul_ps(d, _mm512_set1_ps(scale)), _mm512_cvtepi32_ps(dot));
                        if q4_1 {
                            v = _mm512_add_ps(v, _mm512_mul_ps(mw, _mm512_set1_ps(sum)));
                        }
                        acc[$i] = _mm512_add_ps(acc[$i], v);
                    }};
                }
                row!(0);
                row!(1);
                row!(2);
                row!(3);
                row!(4);
                row!(5);
                row!(6);
                row!(7);
                row!(8);
                row!(9);
                row!(10);
                row!(11);
                row!(12);
                row!(13);
                row!(14);
                row!(15);
            }
            for (i, a) in acc.iter().enumerate().take((m - t * TILE).min(TILE)) {
                _mm512_mask_storeu_ps(out.get().add((t * TILE + i) * n + jg), col_mask, *a);
            }
        }
        asm!("tilerelease", options(nomem, nostack, preserves_flags));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::linear::act16::Act16;
    use crate::linear::decode::dot_row_act16_scalar;
    use crate::testing::SplitMix64;

    /// Random raw blocks: every code value, f16 scales of either sign (Q4_1's `m` too),
    /// so the products reach the extremes of the hi/lo split (Q8_0's -128 included).
    fn raw_matrix(ty: GgmlType, rows: usize, cols: usize, seed: u32) -> QMatrix {
        let mut rng = SplitMix64::new(seed.into());
        let bytes = ty.type_size();
        let mut data = vec![0u8; rows * cols / 32 * bytes];
        for blk in data.chunks_mut(bytes) {
            for v in blk.iter_mut() {
                *v = rng.next_u64() as u8;
            }
            let d = rng.uniform_f32(-0.01, 0.01);
            blk[..2].copy_from_slice(&half::f16::from_f32(d).to_le_bytes());
            if ty == GgmlType::Q4_1 {
                let m = rng.uniform_f32(-0.05, 0.05);
                blk[2..4].copy_from_slice(&half::f16::from_f32(m).to_le_bytes());
            }
        }
        QMatrix::new(ty, rows, cols, data).unwrap()
    }

    /// Activations spanning magnitudes, with all-zero blocks and a block holding one
    /// large value (codes of +-32767 and of 0 side by side).
    fn activations(m: usize, k: usize, seed: u32) -> Vec<f32> {
        let mut x = crate::testing::uniform(m * k, seed.into(), -4.0, 4.0);
        for i in 0..m {
            if i % 5 == 1 {
                x[i * k..i * k + 32].fill(0.0);
            }
            if i % 7 == 2 && k >= 64 {
                x[i * k + 32..i * k + 64].fill(1e-3);
                x[i * k + 40] = -300.0;
            }
        }
        x
    }

    fn reference(x: &[f32], w: &QMatrix, m: usize) -> Vec<f32> {
        let (n, k) = (w.rows, w.cols);
        let mut y = vec![0f32; m * n];
        let (mut q, mut ss) = (vec![0i16; k], vec![0f32; k / 16]);
        for i in 0..m {
            let act = Act16::quantize(&x[i * k..(i + 1) * k], &mut q, &mut ss);
            for j in 0..n {
                y[i * n + j] = dot_row_act16_scalar(w.ty, w.row(j), &act).unwrap();
            }
        }
        y
    }

    /// Without AMX the tests check what can be checked (not a pass in disguise): the kernel
    /// refuses, single and grouped, and says why.
    fn assert_refuses_without_amx() {
        let w = raw_matrix(GgmlType::Q4_1, 16, 32, 1);
        let err = matmul_wq_amx(&[0.0; 16 * 32], &w, &mut [0.0; 16 * 16], 16).unwrap_err();
        assert!(err.to_string().contains("cannot run AMX tiles"), "{err}");
        let err = matmul_wq_amx_group(
            &[0.0; 16 * 32],
            &[&w, &w],
            &mut [&mut [0.0; 16 * 16][..], &mut [0.0; 16 * 16][..]],
            16,
        )
        .unwrap_err();
        assert!(err.to_string().contains("cannot run AMX tiles"), "{err}");
        eprintln!("amx: this CPU ({}) has no usable AMX tiles: checked the refusal only", Isa::detected());
    }

    #[test]
    fn amx_matmul_is_bit_identical_to_the_scalar_act16_reference() {
        if Isa::detected() < Isa::Amx {
            assert_refuses_without_amx();
            return;
        }
        // Tails in every dimension: m not a multiple of 16, n not of 32 (and below 16),
        // k of one block and of SmolLM2's widths.
        for (m, n, k) in [(16, 32, 32), (1, 16, 64), (17, 40, 96), (33, 8, 32), (48, 96, 576), (20, 200, 1536)] {
            for ty in [GgmlType::Q4_1, GgmlType::Q8_0, GgmlType::Q5_0] {
                let w = raw_matrix(ty, n, k, (m * 31 + n * 7 + k) as u32);
                let x = activations(m, k, (m + n + k) as u32);
                let mut y = vec![f32::NAN; m * n];
                matmul_wq_amx(&x, &w, &mut y, m).unwrap();
                let want = reference(&x, &w, m);
                for (e, (g, r)) in y.iter().zip(&want).enumerate() {
                    assert_eq!(
                        g.to_bits(),
                        r.to_bits(),
                        "{ty} m={m} n={n} k={k} at ({}, {}): {g} vs {r}",
                        e / n,
                        e % n
                    );
                }
            }
        }
    }

    #[test]
    fn amx_group_gives_each_matrix_its_own_bits() {
        if Isa::detected() < Isa::Amx {
            assert_refuses_without_amx();
            return;
        }
        let (m, k) = (37, 128);
        let ws = [
            raw_matrix(GgmlType::Q4_1, 72, k, 1),
            raw_matrix(GgmlType::Q8_0, 16, k, 2),
            raw_matrix(GgmlType::Q5_0, 300, k, 3),
        ];
        let x = activations(m, k, 5);
        let mut ys: Vec<Vec<f32>> = ws.iter().map(|w| vec![f32::NAN; m * w.rows]).collect();
        let refs: Vec<&QMatrix> = ws.iter().collect();
        let mut outs: Vec<&mut [f32]> = ys.iter_mut().map(|y| y.as_mut_slice()).collect();
        matmul_wq_amx_group(&x, &refs, &mut outs, m).unwrap();
        for (w, y) in ws.iter().zip(&ys) {
            let mut alone = vec![0f32; m * w.rows];
            matmul_wq_amx(&x, w, &mut alone, m).unwrap();
            assert!(alone.iter().zip(y).all(|(a, b)| a.to_bits() == b.to_bits()), "{} x {} {}", w.rows, w.cols, w.ty);
        }
        let mut short = [0f32; 3];
        assert!(matmul_wq_amx_group(&x, &refs[..1], &mut [&mut short[..]], m).is_err());
    }

    #[test]
    fn amx_results_do_not_depend_on_the_thread_count() {
        if Isa::detected() < Isa::Amx {
            assert_refuses_without_amx();
            return;
        }
        let w = raw_matrix(GgmlType::Q4_1, 100, 128, 9);
        let x = activations(40, 128, 3);
        let mut a = vec![0f32; 40 * 100];
        let mut b = vec![0f32; 40 * 100];
        matmul_wq_amx(&x, &w, &mut a, 40).unwrap();
        crate::pool::run_serially(|| matmul_wq_amx(&x, &w, &mut b, 40)).unwrap();
        assert!(a.iter().zip(&b).all(|(p, q)| p.to_bits() == q.to_bits()));
    }

    #[test]
    fn amx_refuses_other_types_and_bad_shapes() {
        let w = raw_matrix(GgmlType::Q4_1, 16, 64, 2);
        assert!(matmul_wq_amx(&[0.0; 10], &w, &mut [0.0; 16], 1).is_err());
        let f = QMatrix::new(GgmlType::F32, 2, 32, vec![0u8; 2 * 32 * 4]).unwrap();
        let err = matmul_wq_amx(&[0.0; 32 * 16], &f, &mut [0.0; 32], 16).unwrap_err();
        assert!(err.to_string().contains("unsupported dtype"), "{err}");
        assert!(!can_take(&w, AMX_MIN_ROWS - 1) && can_take(&w, AMX_MIN_ROWS) && !can_take(&f, 64));
    }
}
