//! AMX int8 tile kernels for prefill: `y[m, n] = x[m, k] @ W^T` for Q4_1 and Q8_0 weights
//! against activations quantized to 16-bit blocks ([`Act16`]), on Intel CPUs with AMX
//! (Sapphire Rapids and later; [`Isa::Amx`]).
//!
//! **Arithmetic.** Each output is computed exactly as [`crate::wq::dot_row_act16_scalar`]
//! computes it, bit for bit (tested): per block of 32, the exact integer dot of the weight
//! codes with the activation's 16-bit codes, then `acc += d * scale * dot + m * sum` in f32
//! (Q8_0: no offset term), blocks in order from `+0.0`. So prefill on AMX has decode's
//! precision (16-bit activations, under 2^-16 of a block's largest value) and the bits of
//! the portable reference; it does not depend on `m`, the thread count or the tiling.
//!
//! **How a 16-bit activation meets an 8-bit tile.** AMX multiplies bytes. Each code is split
//! as `a = 256 * hi + lo` (`hi = a >> 8` signed, `lo = a & 0xFF` unsigned) and each block is
//! two tile products, `dot = 256 * (w . hi) + (w . lo)`, both exact in i32 (|w . hi| <=
//! 128 * 128 * 32), combined in AVX-512 before the f32 step. The weights are the A operand
//! (tile rows = weight rows: a block's 32 codes are contiguous, unpacked from their nibbles
//! or bytes per panel of 16 rows), the activations the B operand in the VNNI layout (four
//! consecutive k of one activation row per dword), packed once per call and shared by every
//! weight row. Eight tiles: two weight panels (32 rows) x one activation tile (16 rows), hi
//! and lo: `tdpbusd`/`tdpbuud` for Q4_1's unsigned codes, `tdpbssd`/`tdpbsud` for Q8_0's.
//!
//! **Permission.** Linux gives a process the 8 KiB of tile state only after
//! `arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)` (the kernel's
//! Documentation/arch/x86/xstate.rst); [`tiles_usable`] asks once. Each pool task loads the
//! tile configuration before its tiles and releases them after (`tilerelease`), so a thread
//! between jobs carries no tile state through context switches.
//!
//! The instructions are written with `asm!` (Rust's AMX intrinsics and target features are
//! unstable); the rest of the kernel is AVX-512 F/BW/VL, which every AMX CPU has.

use crate::matmul::QMatrix;
use crate::quant::Isa;
use crate::{GgmlType, TensorError};

/// Fewest activation rows worth a tile pass: one AMX tile is 16 rows, and below that
/// the padding wastes most of each product (the f32 path stays faster).
pub const AMX_MIN_ROWS: usize = 16;

/// Whether this CPU has AMX-TILE and AMX-INT8 and the OS granted this process the tile
/// state (asked once; later calls return the first answer).
pub fn tiles_usable() -> bool {
    static USABLE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *USABLE.get_or_init(request_tiles)
}

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
fn request_tiles() -> bool {
    // CPUID.(EAX=7, ECX=0):EDX bit 24 AMX-TILE, bit 25 AMX-INT8 (Intel SDM vol. 2A, CPUID).
    let leaf7 = std::arch::x86_64::__cpuid_count(7, 0);
    if leaf7.edx & (1 << 24) == 0 || leaf7.edx & (1 << 25) == 0 {
        return false;
    }
    // arch/x86/include/uapi/asm/prctl.h: ARCH_REQ_XCOMP_PERM = 0x1023; XFEATURE_XTILEDATA = 18.
    const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
    const XFEATURE_XTILEDATA: libc::c_long = 18;
    // SAFETY: arch_prctl with these arguments only changes this process's permitted
    // extended state; it reads and writes no memory of ours.
    unsafe { libc::syscall(libc::SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0 }
}

#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
fn request_tiles() -> bool {
    false
}

/// Whether [`matmul_wq_amx`] takes `w` at `m` activation rows.
pub fn can_take(w: &QMatrix, m: usize) -> bool {
    m >= AMX_MIN_ROWS && matches!(w.ty, GgmlType::Q4_1 | GgmlType::Q8_0) && w.cols > 0 && w.cols.is_multiple_of(32)
}

/// `y[m, n] = x[m, k] @ W^T` on AMX tiles for Q4_1 / Q8_0 `W` (`n = w.rows`, `k = w.cols`,
/// a multiple of 32), each output bit-identical to [`crate::wq::dot_row_act16_scalar`] of
/// its activation row quantized by [`Act16::quantize`]. Does not apply `w.tensor_scale`
/// (the caller does, as for every kernel).
///
/// Errors if the shapes disagree, if `w` is another type, or if this CPU or OS cannot run
/// AMX tiles ([`Isa::Amx`] not detected).
pub fn matmul_wq_amx(x: &[f32], w: &QMatrix, y: &mut [f32], m: usize) -> Result<(), TensorError> {
    let (n, k) = (w.rows, w.cols);
    if m.checked_mul(k) != Some(x.len()) || m.checked_mul(n) != Some(y.len()) {
        return Err(TensorError::Shape { op: "matmul_wq_amx", detail: format!("x has {} elements and y {}, expected {m}x{k} and {m}x{n}", x.len(), y.len()) });
    }
    if !matches!(w.ty, GgmlType::Q4_1 | GgmlType::Q8_0) {
        return Err(TensorError::UnsupportedType { op: "matmul_wq_amx", dtype: w.ty });
    }
    if !k.is_multiple_of(32) {
        return Err(TensorError::Shape { op: "matmul_wq_amx", detail: format!("{k} columns is not a multiple of 32") });
    }
    if Isa::detected() < Isa::Amx {
        return Err(TensorError::Shape { op: "matmul_wq_amx", detail: "this CPU or OS cannot run AMX tiles".into() });
    }
    if m == 0 || n == 0 || k == 0 {
        return Ok(());
    }
    #[cfg(target_arch = "x86_64")]
    {
        x86::matmul(x, w, y, m);
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

    use crate::matmul::{OutPtr, QMatrix};
    use crate::pool;
    use crate::wq::Act16;
    use crate::GgmlType;

    /// Rows of one tile (activation rows per B tile, weight rows per A panel).
    const TILE: usize = 16;
    /// Weight rows per task: two A panels share each activation tile.
    const PAIR: usize = 2 * TILE;

    /// 64 bytes, 64-aligned: one tile row, or one line of a packed buffer.
    #[derive(Clone, Copy)]
    #[repr(C, align(64))]
    struct Line([u8; 64]);

    const ZERO_LINE: Line = Line([0; 64]);

    /// The activation side of one call, built by the calling thread's tasks.
    #[derive(Default)]
    struct ActScratch {
        /// Act16 codes, row-major `[m][k]`.
        q: Vec<i16>,
        /// Act16 `(scale, sum)` per block, row-major `[m][2 * blocks]`.
        ss: Vec<f32>,
        /// B tiles: per activation tile `t` and block `b`, 8 lines of hi bytes then 8 of
        /// lo bytes in the VNNI layout (line `r`, bytes `4i..4i+4` = row `16t + i`'s codes
        /// `32b + 4r..32b + 4r + 4`).
        packed: Vec<Line>,
        /// Scales and sums transposed, `[blocks][mp]` (lanes = activation rows; zero past m).
        st: Vec<f32>,
        su: Vec<f32>,
    }

    /// One task's weight side: a pair of 16-row panels unpacked block by block.
    struct PanelScratch {
        /// Per block, 8 lines (16 rows x 32 codes) for panel 0 then 8 for panel 1.
        codes: Vec<Line>,
        /// Per block and panel, 16 `d` then 16 `m` (Q4_1; zero for Q8_0).
        dm: Vec<f32>,
        /// Four 16 x 16 i32 product tiles (panel 0 hi, lo; panel 1 hi, lo).
        c: [Line; 4 * TILE],
    }

    thread_local! {
        static ACT: RefCell<ActScratch> = RefCell::new(ActScratch::default());
        static PANEL: RefCell<Option<Box<PanelScratch>>> = const { RefCell::new(None) };
    }

    /// The tile configuration (palette 1): tmm0/1 the weight panels (16 rows x 32 bytes),
    /// tmm2/3 the activation tile's hi/lo bytes (8 rows x 64 bytes), tmm4-7 the products
    /// (16 rows x 16 i32).
    fn config() -> Line {
        let mut c = [0u8; 64];
        c[0] = 1;
        let tiles: [(u8, u16); 8] = [(16, 32), (16, 32), (8, 64), (8, 64), (16, 64), (16, 64), (16, 64), (16, 64)];
        for (t, (rows, colsb)) in tiles.into_iter().enumerate() {
            c[16 + 2 * t..18 + 2 * t].copy_from_slice(&colsb.to_le_bytes());
            c[48 + t] = rows;
        }
        Line(c)
    }

    pub(super) fn matmul(x: &[f32], w: &QMatrix, y: &mut [f32], m: usize) {
        ACT.with(|cell| match cell.try_borrow_mut() {
            Ok(mut s) => matmul_in(x, w, y, m, &mut s),
            Err(_) => matmul_in(x, w, y, m, &mut ActScratch::default()),
        })
    }

    fn matmul_in(x: &[f32], w: &QMatrix, y: &mut [f32], m: usize, s: &mut ActScratch) {
        let (n, k) = (w.rows, w.cols);
        let blocks = k / 32;
        let tiles_m = m.div_ceil(TILE);
        let mp = tiles_m * TILE;
        s.q.resize(m * k, 0);
        s.ss.resize(m * 2 * blocks, 0.0);
        s.packed.clear();
        s.packed.resize(tiles_m * blocks * 16, ZERO_LINE);
        s.st.clear();
        s.st.resize(blocks * mp, 0.0);
        s.su.clear();
        s.su.resize(blocks * mp, 0.0);
        let (qp, ssp, pk, stp, sup) = (OutPtr(s.q.as_mut_ptr()), OutPtr(s.ss.as_mut_ptr()), OutPtr(s.packed.as_mut_ptr().cast::<u8>()), OutPtr(s.st.as_mut_ptr()), OutPtr(s.su.as_mut_ptr()));
        // One task per activation tile: quantize its rows (each alone, by the one-row
        // quantizer) and pack them.
        pool::run(tiles_m, &|t| {
            for i in t * TILE..((t + 1) * TILE).min(m) {
                // SAFETY: rows i of q (m x k) and ss (m x 2*blocks), the entries b*mp + i of
                // st and su, and the lanes of tile t in `packed` belong to this task alone;
                // the buffers were sized above; the CPU has AVX-512 (Isa::Amx implies it).
                unsafe {
                    let q = std::slice::from_raw_parts_mut(qp.get().add(i * k), k);
                    let ss = std::slice::from_raw_parts_mut(ssp.get().add(i * 2 * blocks), 2 * blocks);
                    Act16::quantize(&x[i * k..(i + 1) * k], q, ss);
                    for b in 0..blocks {
                        *stp.get().add(b * mp + i) = ss[2 * b];
                        *sup.get().add(b * mp + i) = ss[2 * b + 1];
                    }
                    pack_row(q.as_ptr(), blocks, pk.get().add(t * blocks * 1024), i - t * TILE);
                }
            }
        });
        let s = &*s;
        let out = OutPtr(y.as_mut_ptr());
        let pairs = n.div_ceil(PAIR);
        pool::run(pairs, &|p| {
            PANEL.with(|cell| {
                let mut guard = cell.borrow_mut();
                let panel = guard.get_or_insert_with(|| {
                    Box::new(PanelScratch { codes: Vec::new(), dm: Vec::new(), c: [ZERO_LINE; 4 * TILE] })
                });
                panel.codes.resize(blocks * 16, ZERO_LINE);
                panel.dm.resize(blocks * 4 * TILE, 0.0);
                let j0 = p * PAIR;
                // SAFETY: Isa::Amx was detected (checked by the caller): AMX-TILE/INT8 with
                // the tile state granted, AVX-512 F/BW/VL and F16C; the activation side
                // describes m rows of k; columns j0..j0+32 of y (m x n) belong to this task.
                unsafe {
                    unpack_panels(w, j0, blocks, panel);
                    pair(w.ty == GgmlType::Q4_1, s, m, n, blocks, j0, panel, out);
                }
            })
        });
    }

    /// Activation row `r` (0..16) of a tile: its codes at `q` (`blocks` blocks) split into
    /// hi and lo bytes, each 4 consecutive codes one dword of the VNNI layout at `dst`
    /// (`blocks * 1024` bytes: per block 512 hi then 512 lo).
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    unsafe fn pack_row(q: *const i16, blocks: usize, dst: *mut u8, r: usize) {
        let lines = _mm256_setr_epi32(0, 64, 128, 192, 256, 320, 384, 448);
        for b in 0..blocks {
            let v = _mm512_loadu_si512(q.add(b * 32) as *const _);
            let lo = _mm512_cvtepi16_epi8(v);
            let hi = _mm512_cvtepi16_epi8(_mm512_srai_epi16::<8>(v));
            let base = dst.add(b * 1024 + 4 * r);
            _mm256_i32scatter_epi32::<1>(base as *mut i32, lines, hi);
            _mm256_i32scatter_epi32::<1>(base.add(512) as *mut i32, lines, lo);
        }
    }

    /// Unpacks weight rows `j0..j0 + 32` (zeros past `w.rows`) into `panel`: per block, the
    /// 32 codes of each row as bytes (Q4_1: 0..15, low nibbles first; Q8_0: the signed
    /// bytes) and the f16 `d` (and Q4_1's `m`) as f32.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
    unsafe fn unpack_panels(w: &QMatrix, j0: usize, blocks: usize, panel: &mut PanelScratch) {
        let q4_1 = w.ty == GgmlType::Q4_1;
        let bytes = if q4_1 { 20 } else { 34 };
        let codes = panel.codes.as_mut_ptr().cast::<u8>();
        let dm = panel.dm.as_mut_ptr();
        let mask = _mm_set1_epi8(0x0F);
        for pr in 0..PAIR {
            let j = j0 + pr;
            let (pn, r) = (pr / TILE, pr % TILE);
            if j >= w.rows {
                for b in 0..blocks {
                    _mm256_storeu_si256(codes.add(b * 1024 + pn * 512 + r * 32) as *mut __m256i, _mm256_setzero_si256());
                    *dm.add((b * 2 + pn) * 2 * TILE + r) = 0.0;
                    *dm.add((b * 2 + pn) * 2 * TILE + TILE + r) = 0.0;
                }
                continue;
            }
            let row = w.row(j).as_ptr();
            for b in 0..blocks {
                let blk = row.add(b * bytes);
                let at = codes.add(b * 1024 + pn * 512 + r * 32);
                let dmv = _mm_cvtph_ps(_mm_cvtsi32_si128(std::ptr::read_unaligned(blk as *const i32)));
                *dm.add((b * 2 + pn) * 2 * TILE + r) = _mm_cvtss_f32(dmv);
                if q4_1 {
                    *dm.add((b * 2 + pn) * 2 * TILE + TILE + r) = _mm_cvtss_f32(_mm_movehdup_ps(dmv));
                    let qs = _mm_loadu_si128(blk.add(4) as *const __m128i);
                    _mm_storeu_si128(at as *mut __m128i, _mm_and_si128(qs, mask));
                    _mm_storeu_si128(at.add(16) as *mut __m128i, _mm_and_si128(_mm_srli_epi16::<4>(qs), mask));
                } else {
                    *dm.add((b * 2 + pn) * 2 * TILE + TILE + r) = 0.0;
                    _mm256_storeu_si256(at as *mut __m256i, _mm256_loadu_si256(blk.add(2) as *const __m256i));
                }
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

    /// Weight rows `j0..j0 + 32` (unpacked in `panel`) against every activation tile.
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    unsafe fn pair(q4_1: bool, s: &ActScratch, m: usize, n: usize, blocks: usize, j0: usize, panel: &mut PanelScratch, out: OutPtr) {
        let cfg = config();
        asm!("ldtilecfg [{}]", in(reg) cfg.0.as_ptr(), options(readonly, nostack, preserves_flags));
        let mp = m.div_ceil(TILE) * TILE;
        let codes = panel.codes.as_ptr().cast::<u8>();
        let packed = s.packed.as_ptr().cast::<u8>();
        let c = panel.c.as_mut_ptr().cast::<u8>();
        let ci = c as *const i32;
        for t in 0..m.div_ceil(TILE) {
            // Per panel and weight row, 16 accumulators (lanes = activation rows).
            let mut acc = [[_mm512_setzero_ps(); TILE]; 2];
            for b in 0..blocks {
                let a = codes.add(b * 1024);
                let bt = packed.add((t * blocks + b) * 1024);
                tileload!("0", a, 32usize);
                tileload!("1", a.add(512), 32usize);
                tileload!("2", bt, 64usize);
                tileload!("3", bt.add(512), 64usize);
                asm!("tilezero tmm4", "tilezero tmm5", "tilezero tmm6", "tilezero tmm7", options(nomem, nostack, preserves_flags));
                if q4_1 {
                    tdp!("tdpbusd", "4", "0", "2");
                    tdp!("tdpbuud", "5", "0", "3");
                    tdp!("tdpbusd", "6", "1", "2");
                    tdp!("tdpbuud", "7", "1", "3");
                } else {
                    tdp!("tdpbssd", "4", "0", "2");
                    tdp!("tdpbsud", "5", "0", "3");
                    tdp!("tdpbssd", "6", "1", "2");
                    tdp!("tdpbsud", "7", "1", "3");
                }
                tilestore!("4", c);
                tilestore!("5", c.add(1024));
                tilestore!("6", c.add(2048));
                tilestore!("7", c.add(3072));
                let scale = _mm512_loadu_ps(s.st.as_ptr().add(b * mp + t * TILE));
                let sum = _mm512_loadu_ps(s.su.as_ptr().add(b * mp + t * TILE));
                for (pn, acc) in acc.iter_mut().enumerate() {
                    let dm = panel.dm.as_ptr().add((b * 2 + pn) * 2 * TILE);
                    let (hi, lo) = (ci.add(pn * 512), ci.add(pn * 512 + 256));
                    for (r, a) in acc.iter_mut().enumerate() {
                        let dot = _mm512_add_epi32(_mm512_slli_epi32::<8>(_mm512_loadu_si512(hi.add(r * 16) as *const _)), _mm512_loadu_si512(lo.add(r * 16) as *const _));
                        // dot_row_act16_scalar: acc += d * scale * dot as f32 (+ m * sum),
                        // as separate f32 roundings in that order.
                        let mut v = _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(*dm.add(r)), scale), _mm512_cvtepi32_ps(dot));
                        if q4_1 {
                            v = _mm512_add_ps(v, _mm512_mul_ps(_mm512_set1_ps(*dm.add(TILE + r)), sum));
                        }
                        *a = _mm512_add_ps(*a, v);
                    }
                }
            }
            // Lanes are activation rows: write each weight row's 16 outputs down a column.
            let rows = (m - t * TILE).min(TILE);
            for (pn, acc) in acc.iter().enumerate() {
                for (r, a) in acc.iter().enumerate() {
                    let j = j0 + pn * TILE + r;
                    if j >= n {
                        break;
                    }
                    let mut lanes = [0f32; TILE];
                    _mm512_storeu_ps(lanes.as_mut_ptr(), *a);
                    for (i, v) in lanes.iter().take(rows).enumerate() {
                        out.get().add((t * TILE + i) * n + j).write(*v);
                    }
                }
            }
        }
        asm!("tilerelease", options(nomem, nostack, preserves_flags));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wq::{dot_row_act16_scalar, Act16};

    fn lcg(s: &mut u32) -> u32 {
        *s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
        *s >> 8
    }

    /// Random raw blocks: every code value, f16 scales of either sign (Q4_1's `m` too),
    /// so the products reach the extremes of the hi/lo split (Q8_0's -128 included).
    fn raw_matrix(ty: GgmlType, rows: usize, cols: usize, seed: u32) -> QMatrix {
        let mut s = seed;
        let bytes = ty.type_size();
        let mut data = vec![0u8; rows * cols / 32 * bytes];
        for blk in data.chunks_mut(bytes) {
            for v in blk.iter_mut() {
                *v = lcg(&mut s) as u8;
            }
            let d = (lcg(&mut s) as f32 / (1u32 << 24) as f32 - 0.5) * 0.02;
            blk[..2].copy_from_slice(&half::f16::from_f32(d).to_le_bytes());
            if ty == GgmlType::Q4_1 {
                let m = (lcg(&mut s) as f32 / (1u32 << 24) as f32 - 0.5) * 0.1;
                blk[2..4].copy_from_slice(&half::f16::from_f32(m).to_le_bytes());
            }
        }
        QMatrix::new(ty, rows, cols, data).unwrap()
    }

    /// Activations spanning magnitudes, with all-zero blocks and a block holding one
    /// large value (codes of +-32767 and of 0 side by side).
    fn activations(m: usize, k: usize, seed: u32) -> Vec<f32> {
        let mut s = seed;
        let mut x: Vec<f32> = (0..m * k).map(|_| (lcg(&mut s) as f32 / (1u32 << 24) as f32 - 0.5) * 8.0).collect();
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

    #[test]
    fn amx_matmul_is_bit_identical_to_the_scalar_act16_reference() {
        if Isa::detected() < Isa::Amx {
            // Not a pass in disguise: without AMX the kernel must refuse, and says so.
            let w = raw_matrix(GgmlType::Q4_1, 16, 32, 1);
            let err = matmul_wq_amx(&vec![0.0; 16 * 32], &w, &mut vec![0.0; 16 * 16], 16).unwrap_err();
            assert!(err.to_string().contains("cannot run AMX tiles"), "{err}");
            eprintln!("amx: this CPU ({}) has no usable AMX tiles: checked the refusal only", Isa::detected());
            return;
        }
        // Tails in every dimension: m not a multiple of 16, n not of 32 (and below 16),
        // k of one block and of SmolLM2's widths.
        for (m, n, k) in [(16, 32, 32), (1, 16, 64), (17, 40, 96), (33, 8, 32), (48, 96, 576), (20, 200, 1536)] {
            for ty in [GgmlType::Q4_1, GgmlType::Q8_0] {
                let w = raw_matrix(ty, n, k, (m * 31 + n * 7 + k) as u32);
                let x = activations(m, k, (m + n + k) as u32);
                let mut y = vec![f32::NAN; m * n];
                matmul_wq_amx(&x, &w, &mut y, m).unwrap();
                let want = reference(&x, &w, m);
                for (e, (g, r)) in y.iter().zip(&want).enumerate() {
                    assert_eq!(g.to_bits(), r.to_bits(), "{ty} m={m} n={n} k={k} at ({}, {}): {g} vs {r}", e / n, e % n);
                }
            }
        }
    }

    #[test]
    fn amx_results_do_not_depend_on_the_thread_count() {
        if Isa::detected() < Isa::Amx {
            eprintln!("amx: this CPU ({}) has no usable AMX tiles: nothing to compare", Isa::detected());
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
