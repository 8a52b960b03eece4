//! What the ISA files of the row kernels share: the widening of a cached element to f32, and
//! the macros each ISA instantiates (`dot_axpy!`: the per-key dot and axpy; `row_kernels!`:
//! one pass over every key).

use half::f16;

/// An element of a cached row, widened exactly to f32 (the scalar tails of the kernels).
pub(crate) trait Widen: Copy {
    fn widen(self) -> f32;
}

impl Widen for f32 {
    #[inline(always)]
    fn widen(self) -> f32 {
        self
    }
}

impl Widen for f16 {
    #[inline(always)]
    fn widen(self) -> f32 {
        self.to_f32()
    }
}

/// Defines `$dot(a: &[f32], b: &[$elem]) -> f32` and `$axpy(alpha, x: &[$elem], y)` for one
/// vector width: the whole vectors through `row_kernels!`'s `dot_vectors` (four
/// accumulators, then one vector at a time into the first, the fixed reduction
/// `(acc0 + acc1) + (acc2 + acc3)`), then `$hsum`, then a scalar tail. `$load` widens `$lanes` elements of `$elem` to a vector. The f32 and
/// f16 instances differ only in `$load`, which widens exactly, so their results are equal
/// bit for bit on equal (widened) rows.
#[cfg(target_arch = "x86_64")]
macro_rules! dot_axpy {
    ($features:literal, $lanes:literal, $vec:ty, $zero:ident, $fmadd:ident, $add:ident, $loadf:ident, $storef:ident, $set1:ident, $hsum:path,
     $dot:ident, $axpy:ident, $elem:ty, $load:path) => {
        #[target_feature(enable = $features)]
        pub unsafe fn $dot(a: &[f32], b: &[$elem]) -> f32 {
            let n = a.len();
            let mut sum = $hsum(dot_vectors(a.as_ptr(), b.as_ptr(), n));
            let mut i = n - n % $lanes;
            while i < n {
                sum += a[i] * Widen::widen(b[i]);
                i += 1;
            }
            sum
        }

        #[target_feature(enable = $features)]
        pub unsafe fn $axpy(alpha: f32, x: &[$elem], y: &mut [f32]) {
            let n = x.len();
            let (px, py) = (x.as_ptr(), y.as_mut_ptr());
            let va = $set1(alpha);
            let mut i = 0;
            while i + $lanes <= n {
                $storef(py.add(i), $fmadd(va, $load(px.add(i)), $loadf(py.add(i))));
                i += $lanes;
            }
            while i < n {
                y[i] += alpha * Widen::widen(x[i]);
                i += 1;
            }
        }
    };
}

/// Defines the row kernels of [`attend_heads`] for one vector width, each over `G` query
/// heads that share a kv head (one key row loaded once for all of them): `scores` (every
/// key's dot, each with the accumulators, order and reduction of `dot_axpy!`'s dot) and
/// `weighted_sum` (the values' fused multiply-adds of `dot_axpy!`'s axpy in key order, each
/// head's output held in up to four vectors across keys). Callers guarantee the features,
/// a head size that is a whole number of vectors, rows in range and `keys.end` within the
/// scores.
///
/// [`attend_heads`]: super::rows::attend_heads
#[cfg(target_arch = "x86_64")]
macro_rules! row_kernels {
    ($features:literal, $lanes:literal, $vec:ty, $zero:ident, $fmadd:ident, $add:ident, $loadf:ident, $storef:ident, $set1:ident, $hsum:path, $load16:path) => {
        /// A cached element type the kernels widen, `$lanes` at a time.
        pub trait RowElem: Copy {
            /// # Safety
            /// `$lanes` elements at `p` are readable; the CPU has the module's features.
            unsafe fn load(p: *const Self) -> $vec;
        }

        impl RowElem for f32 {
            #[inline]
            #[target_feature(enable = $features)]
            unsafe fn load(p: *const f32) -> $vec {
                $loadf(p)
            }
        }

        impl RowElem for f16 {
            #[inline]
            #[target_feature(enable = $features)]
            unsafe fn load(p: *const f16) -> $vec {
                $load16(p)
            }
        }

        /// The whole vectors of `a . b` over `n` elements (the tail past `n - n % $lanes` is
        /// the caller's): four accumulators over `4 * $lanes` elements per pass, then one
        /// vector at a time into the first, combined as `(acc0 + acc1) + (acc2 + acc3)`.
        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn dot_vectors<E: RowElem>(pa: *const f32, pb: *const E, n: usize) -> $vec {
            let mut acc: [$vec; 4] = [$zero(); 4];
            let mut i = 0;
            while i + 4 * $lanes <= n {
                for (r, acc) in acc.iter_mut().enumerate() {
                    *acc = $fmadd($loadf(pa.add(i + $lanes * r)), E::load(pb.add(i + $lanes * r)), *acc);
                }
                i += 4 * $lanes;
            }
            while i + $lanes <= n {
                acc[0] = $fmadd($loadf(pa.add(i)), E::load(pb.add(i)), acc[0]);
                i += $lanes;
            }
            $add($add(acc[0], acc[1]), $add(acc[2], acc[3]))
        }

        /// Raw scores of `G` query heads sharing a kv head: `scores[g][j] = q[g] . row(j)`
        /// for every `j` in `keys`, each with the accumulators, order and reduction of
        /// [`dot_vectors`]; each key's vectors are loaded (and widened) once for all `G`.
        ///
        /// # Safety
        /// `q[g]` holds `n` floats, `scores[g]` at least `keys.end`; rows `start_of(j)..+n`
        /// are inside `rows`; `n` is a whole number of vectors; the CPU has the features.
        #[target_feature(enable = $features)]
        pub unsafe fn scores<E: RowElem, const G: usize>(
            q: [*const f32; G],
            n: usize,
            rows: &[E],
            start_of: &impl Fn(usize) -> usize,
            keys: std::ops::Range<usize>,
            scores: [*mut f32; G],
        ) {
            for j in keys {
                let pb = rows.as_ptr().add(start_of(j));
                let mut acc: [[$vec; 4]; G] = [[$zero(); 4]; G];
                let mut i = 0;
                while i + 4 * $lanes <= n {
                    for r in 0..4 {
                        let k = E::load(pb.add(i + $lanes * r));
                        for (acc, q) in acc.iter_mut().zip(&q) {
                            acc[r] = $fmadd($loadf(q.add(i + $lanes * r)), k, acc[r]);
                        }
                    }
                    i += 4 * $lanes;
                }
                while i + $lanes <= n {
                    let k = E::load(pb.add(i));
                    for (acc, q) in acc.iter_mut().zip(&q) {
                        acc[0] = $fmadd($loadf(q.add(i)), k, acc[0]);
                    }
                    i += $lanes;
                }
                for (acc, s) in acc.iter().zip(&scores) {
                    *s.add(j) = $hsum($add($add(acc[0], acc[1]), $add(acc[2], acc[3])));
                }
            }
        }

        /// `o[g] = sum_j w[g][j] row(j)` over `keys` for `G` heads sharing a kv head: the
        /// fused multiply-adds of `dot_axpy!`'s axpy in key order, each head's output held
        /// in up to four vectors across keys, each key's vectors loaded once for all `G`.
        ///
        /// # Safety
        /// `o[g]` holds `n` floats, `w[g]` at least `keys.end`; otherwise as [`scores`].
        #[target_feature(enable = $features)]
        pub unsafe fn weighted_sum<E: RowElem, const G: usize>(
            w: [*const f32; G],
            n: usize,
            rows: &[E],
            start_of: &impl Fn(usize) -> usize,
            keys: std::ops::Range<usize>,
            o: [*mut f32; G],
        ) {
            let mut d = 0;
            while d + 4 * $lanes <= n {
                let mut acc: [[$vec; 4]; G] = [[$zero(); 4]; G];
                for j in keys.clone() {
                    let pb = rows.as_ptr().add(start_of(j) + d);
                    for r in 0..4 {
                        let k = E::load(pb.add($lanes * r));
                        for (acc, w) in acc.iter_mut().zip(&w) {
                            acc[r] = $fmadd($set1(*w.add(j)), k, acc[r]);
                        }
                    }
                }
                for (acc, o) in acc.iter().zip(&o) {
                    for (r, acc) in acc.iter().enumerate() {
                        $storef(o.add(d + $lanes * r), *acc);
                    }
                }
                d += 4 * $lanes;
            }
            while d + $lanes <= n {
                let mut acc: [$vec; G] = [$zero(); G];
                for j in keys.clone() {
                    let k = E::load(rows.as_ptr().add(start_of(j) + d));
                    for (acc, w) in acc.iter_mut().zip(&w) {
                        *acc = $fmadd($set1(*w.add(j)), k, *acc);
                    }
                }
                for (acc, o) in acc.iter().zip(&o) {
                    $storef(o.add(d), *acc);
                }
                d += $lanes;
            }
        }
    };
}

#[cfg(target_arch = "x86_64")]
pub(crate) use dot_axpy;
#[cfg(target_arch = "x86_64")]
pub(crate) use row_kernels;
