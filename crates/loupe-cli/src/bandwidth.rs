//! The machine's read bandwidth, the ceiling of a memory-bound decode: every weight byte
//! is read once per token, so tokens/s can never exceed bandwidth / bytes per token.
//! The same measurement as `scripts/read-bandwidth.c` (which BENCHMARKS.md cites), so
//! `loupe bench` can say how close decode runs to it on the machine it runs on.

use std::hint::black_box;
use std::time::Instant;

/// Read bandwidth of `threads` threads, each summing its own contiguous slice of a
/// buffer, in GB/s (1e9 bytes).
#[derive(Clone, Copy, Debug)]
pub struct ReadBandwidth {
    pub threads: usize,
    pub buffer_bytes: usize,
    pub passes: usize,
    pub best_gb_per_s: f64,
    pub median_gb_per_s: f64,
    /// Whether the buffer was advised into huge pages, as the weights are (see [`measure`]).
    pub huge_pages: bool,
}

/// Default buffer: 1 GiB, as `read-bandwidth.c`; it must dwarf the last-level cache
/// (up to 260 MiB on the Xeons these figures come from) so the reads come from DRAM.
pub const DEFAULT_BUFFER_BYTES: usize = 1 << 30;
/// Timed passes over the buffer; the first one is preceded by an untimed touch.
pub const DEFAULT_PASSES: usize = 7;

/// Measures with a fresh buffer of `buffer_bytes` (rounded down to whole `u64` slices per
/// thread), which is freed before returning. The buffer is on huge pages where the weights
/// are (`loupe_tensor::hugepages`: unless `LOUPE_HUGEPAGES=0`), since the ceiling must be
/// read as decode reads: on this page size a stream runs faster (AMD EPYC Zen 3,
/// `scripts/read-bandwidth.c`: 1 thread 12.4 GB/s on 4 KiB pages, 15.5 on huge pages). `threads` and `passes` are at least 1. `None`
/// when the buffer cannot be allocated (a small machine): the caller reports no ceiling.
pub fn measure(threads: usize, buffer_bytes: usize, passes: usize) -> Option<ReadBandwidth> {
    let threads = threads.max(1);
    let passes = passes.max(1);
    let per_thread = (buffer_bytes / 8 / threads).max(4);
    let len = per_thread.checked_mul(threads)?;
    let mut buf: Vec<u64> = Vec::new();
    buf.try_reserve_exact(len).ok()?;
    let huge_pages =
        loupe_tensor::hugepages::enabled() && loupe_tensor::hugepages::advise_interior(buf.as_ptr().cast(), len * 8);
    // Non-zero contents, written once, so every page is resident (and not the shared
    // zero page) before the timed passes.
    buf.extend(0..len as u64);
    let mut rates = Vec::with_capacity(passes);
    for _ in 0..passes {
        let start = Instant::now();
        std::thread::scope(|s| {
            for slice in buf.chunks(per_thread) {
                s.spawn(move || black_box(sum(slice)));
            }
        });
        let secs = start.elapsed().as_secs_f64();
        rates.push((per_thread * threads * 8) as f64 / secs / 1e9);
    }
    rates.sort_by(f64::total_cmp);
    Some(ReadBandwidth {
        threads,
        buffer_bytes: per_thread * threads * 8,
        passes,
        best_gb_per_s: rates[rates.len() - 1],
        median_gb_per_s: rates[rates.len() / 2],
        huge_pages,
    })
}

/// Four independent accumulators, so the adds do not serialize and the loop is bound by
/// the loads alone (as in `read-bandwidth.c`).
fn sum(v: &[u64]) -> u64 {
    let mut acc = [0u64; 4];
    let chunks = v.chunks_exact(4);
    let tail: u64 = chunks.remainder().iter().fold(0, |a, &x| a.wrapping_add(x));
    for c in chunks {
        for (a, &x) in acc.iter_mut().zip(c) {
            *a = a.wrapping_add(x);
        }
    }
    acc.iter().fold(tail, |a, &x| a.wrapping_add(x))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sum_is_the_wrapping_sum() {
        let v: Vec<u64> = (0..1003).map(|i| i * 0x9E37_79B9_7F4A_7C15).collect();
        assert_eq!(sum(&v), v.iter().fold(0u64, |a, &x| a.wrapping_add(x)));
    }

    #[test]
    fn a_small_measurement_is_positive_and_ordered() {
        let bw = measure(2, 8 << 20, 3).expect("8 MiB");
        assert!(bw.best_gb_per_s > 0.0 && bw.best_gb_per_s.is_finite());
        assert!(bw.median_gb_per_s <= bw.best_gb_per_s);
        assert_eq!(bw.buffer_bytes, 8 << 20);
    }
}
