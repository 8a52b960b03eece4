// read-bandwidth: how fast T threads can stream a buffer from memory, the ceiling of a
// memory-bound decode (every weight byte is read once per token). Used for BENCHMARKS.md.
//
//   cc -O2 -march=native -pthread scripts/read-bandwidth.c -o /tmp/read-bandwidth
//   /tmp/read-bandwidth [threads=2] [MiB=1024] [passes=10] [pages=huge|4k]
//
// Pages: loupe loads weights into transparent huge pages (crates/loupe-tensor/src/hugepages.rs),
// so the ceiling it is compared with is measured on huge pages too (`huge`, the default: the
// buffer is 2 MiB-aligned and advised MADV_HUGEPAGE before it is touched). `4k` measures
// ordinary pages, as llama.cpp reads its weights.
//
// Each thread sums its own contiguous slice (touched once first, so pages are resident); the
// figure is total bytes / wall time of a pass, best and median of the passes. The buffer
// should dwarf the last-level cache (default 1 GiB) so the reads come from DRAM.
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

struct slice {
    const uint64_t *p;
    size_t n;
    uint64_t sum;
};

static void *sum_slice(void *arg) {
    struct slice *s = arg;
    // Four independent accumulators so the adds do not serialize; the compiler vectorizes.
    uint64_t a = 0, b = 0, c = 0, d = 0;
    for (size_t i = 0; i + 4 <= s->n; i += 4) {
        a += s->p[i];
        b += s->p[i + 1];
        c += s->p[i + 2];
        d += s->p[i + 3];
    }
    s->sum = a + b + c + d;
    return NULL;
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static int cmp(const void *x, const void *y) {
    double a = *(const double *)x, b = *(const double *)y;
    return (a > b) - (a < b);
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 2;
    size_t mib = argc > 2 ? (size_t)atol(argv[2]) : 1024;
    int passes = argc > 3 ? atoi(argv[3]) : 10;
    const char *pages = argc > 4 ? argv[4] : "huge";
    int huge = strcmp(pages, "huge") == 0;
    if (threads < 1 || threads > 256 || mib < 1 || passes < 1 || (!huge && strcmp(pages, "4k") != 0)) {
        fprintf(stderr, "usage: read-bandwidth [threads>=1] [MiB>=1] [passes>=1] [huge|4k]\n");
        return 2;
    }
    size_t bytes = mib << 20, words = bytes / 8;
    uint64_t *buf = aligned_alloc(2u << 20, bytes);
    if (!buf) {
        fprintf(stderr, "read-bandwidth: cannot allocate %zu MiB\n", mib);
        return 2;
    }
#ifdef MADV_HUGEPAGE
    if (huge && madvise(buf, bytes, MADV_HUGEPAGE) != 0) perror("read-bandwidth: madvise(MADV_HUGEPAGE) (measuring on ordinary pages)");
#endif
    memset(buf, 1, bytes);
    struct slice s[256];
    pthread_t tid[256];
    double gbs[1024];
    if (passes > 1024) passes = 1024;
    uint64_t check = 0;
    for (int pass = 0; pass < passes; pass++) {
        double t0 = now();
        for (int t = 0; t < threads; t++) {
            size_t lo = words * t / threads, hi = words * (t + 1) / threads;
            s[t] = (struct slice){buf + lo, hi - lo, 0};
            pthread_create(&tid[t], NULL, sum_slice, &s[t]);
        }
        for (int t = 0; t < threads; t++) {
            pthread_join(tid[t], NULL);
            check += s[t].sum;
        }
        gbs[pass] = bytes / (now() - t0) / 1e9;
    }
    qsort(gbs, passes, sizeof gbs[0], cmp);
    printf("threads %d, %zu MiB, %s pages, %d passes: read bandwidth best %.1f GB/s, median %.1f GB/s (checksum %llu)\n", threads, mib, huge ? "huge" : "4k",
           passes, gbs[passes - 1], gbs[passes / 2], (unsigned long long)(check & 0xff));
    free(buf);
    return 0;
}
