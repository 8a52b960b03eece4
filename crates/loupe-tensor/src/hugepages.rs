//! Weight bytes in transparent huge pages.
//!
//! Decode streams every weight once per token. On 4 KiB pages that is a TLB miss and a
//! restart of the hardware prefetcher (which does not cross a page) every 4 KiB; on 2 MiB
//! pages, one per 2 MiB. Linux gives huge pages to anonymous memory only where asked
//! (`/sys/kernel/mm/transparent_hugepage/enabled` is `madvise` on most distributions,
//! including the machines of BENCHMARKS.md), so large weight buffers are advised
//! `MADV_HUGEPAGE` before their pages are first touched.
//!
//! Measured on an AMD EPYC (Zen 3), one 262,144 x 640 Q8_0 matrix (Gemma 3's 178 MB
//! lm_head) streamed by the decode GEMV (`examples/stream_gemv.rs`, median of 15 passes,
//! alternated): 1 thread 9.1 / 8.3 GB/s on 4 KiB pages against 10.2 / 8.9 on huge pages;
//! 2 threads 14.7 / 15.9 against 17.8 / 16.6. Gemma 3 270M decode (`loupe bench -p 0 -n 64
//! -r 3 -t 2`, alternated three times): 45.7 / 45.7 / 42.7 tok/s with `LOUPE_HUGEPAGES=0`,
//! 57.2 / 50.4 / 54.1 without.
//!
//! `LOUPE_HUGEPAGES=0` turns the advice off (to measure its effect). Elsewhere than Linux,
//! and for buffers under [`MIN_BYTES`], the bytes are copied as they are.

/// Smallest buffer advised: one huge page's worth of interior needs a buffer of twice that,
/// as the allocator places it at no particular 2 MiB boundary.
pub const MIN_BYTES: usize = 4 << 20;

const HUGE_PAGE: usize = 2 << 20;

/// Whether huge pages are asked for (`LOUPE_HUGEPAGES` is not `0`).
pub fn enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("LOUPE_HUGEPAGES").map(|v| v.trim() != "0").unwrap_or(true))
}

/// A copy of `bytes` whose 2 MiB-aligned interior is advised into huge pages before it is
/// written (see the module doc). The advice is a hint: a kernel without transparent huge
/// pages, or one out of them, gives ordinary pages and the copy is the same.
pub fn copy_to_vec(bytes: &[u8]) -> Vec<u8> {
    copy_advised(bytes, enabled())
}

fn copy_advised(bytes: &[u8], huge: bool) -> Vec<u8> {
    let mut v: Vec<u8> = Vec::with_capacity(bytes.len());
    if bytes.len() >= MIN_BYTES && huge {
        advise(v.as_mut_ptr() as usize, bytes.len());
    }
    v.extend_from_slice(bytes);
    v
}

#[cfg(target_os = "linux")]
fn advise(start: usize, len: usize) {
    let (lo, hi) = (start.next_multiple_of(HUGE_PAGE), (start + len) / HUGE_PAGE * HUGE_PAGE);
    if hi > lo {
        // SAFETY: lo..hi lies inside the allocation just made (capacity `len` from
        // `start`), page-aligned; MADV_HUGEPAGE changes no contents and no protection.
        // Failure (EINVAL without THP support) leaves ordinary pages, which is fine.
        unsafe { libc::madvise(lo as *mut libc::c_void, hi - lo, libc::MADV_HUGEPAGE) };
    }
}

#[cfg(not(target_os = "linux"))]
fn advise(_start: usize, _len: usize) {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_are_exact_at_every_size() {
        for len in [0, 1, 4095, MIN_BYTES - 1, MIN_BYTES, MIN_BYTES + 12345, 3 * MIN_BYTES] {
            let src: Vec<u8> = (0..len).map(|i| (i * 31 % 251) as u8).collect();
            assert_eq!(copy_to_vec(&src), src, "len {len}");
        }
    }

    /// On Linux, the interior of a large copy carries the huge-page advice (`hg` in its
    /// mapping's VmFlags; set by the kernel whatever THP's mode, so this holds on every
    /// Linux machine with THP built in), and a small one does not get it.
    #[test]
    #[cfg(target_os = "linux")]
    fn large_copies_are_advised_into_huge_pages() {
        let flags_at = |addr: usize| -> String {
            let smaps = std::fs::read_to_string("/proc/self/smaps").expect("/proc/self/smaps");
            let mut inside = false;
            for line in smaps.lines() {
                let range = line.split_whitespace().next().and_then(|r| r.split_once('-')).and_then(|(a, b)| Some((usize::from_str_radix(a, 16).ok()?, usize::from_str_radix(b, 16).ok()?)));
                if let Some((lo, hi)) = range {
                    inside = (lo..hi).contains(&addr);
                } else if inside {
                    if let Some(f) = line.strip_prefix("VmFlags:") {
                        return f.to_string();
                    }
                }
            }
            panic!("no mapping holds {addr:#x}")
        };
        let big = copy_advised(&vec![7u8; 16 << 20], true);
        let mid = big.as_ptr() as usize + (8 << 20);
        assert!(flags_at(mid).split_whitespace().any(|f| f == "hg"), "16 MiB copy: VmFlags{} lack hg", flags_at(mid));
        assert!(big.iter().all(|&b| b == 7));
        let plain = copy_advised(&vec![7u8; 16 << 20], false);
        let mid = plain.as_ptr() as usize + (8 << 20);
        assert!(!flags_at(mid).split_whitespace().any(|f| f == "hg"), "unadvised copy: VmFlags{} have hg", flags_at(mid));
    }
}
