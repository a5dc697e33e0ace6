/*
 * The inline TLB ABI from C against a native load and against the C API's
 * call per access, in one run; scripts/bench-c-tlb.sh builds it and runs
 * the Rust accessor's twin (examples/tlb_hit.rs) right after, with the
 * same loops. Not a test: it prints figures.
 *
 * Each block is 16 independent 8-byte loads, one location in each of 16
 * pages (byte 256 i + 8 of page i, 16 distinct L1 sets), the addresses
 * read from an array the compiler cannot see through, as the criterion
 * bench `section_read_u64_hit_x16` does. Rows:
 *   native        16 relaxed loads of host memory
 *   inline        softmm_tlb_read_u64 (the header's inline hit) x16
 *   ffi           softmm_section_read_uint x16 (a call per access)
 * each in a section opened per block (begin + 16 accesses + end, what a
 * dispatch loop does) and, for the access cost alone, in one section held
 * open across the run ("open"). Best of REPEATS runs of ITERS blocks; ns
 * per block and per access.
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <time.h>

#include "softmm.h"

#define BLOCK 16
#define ITERS 2000000
#define REPEATS 7
#define PAGE 4096

/* What std::hint::black_box does: the value goes through a register the
 * compiler must assume was changed. */
#define OPAQUE(x) __asm__ volatile("" : "+r"(x))
#define SINK(x) __asm__ volatile("" : : "r"(x) : "memory")

static double now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

static void check(int rc, const char *what) {
    if (rc != 0) {
        fprintf(stderr, "%s: %d\n", what, rc);
        exit(1);
    }
}

static uint64_t *host[BLOCK];
static uint64_t guest[BLOCK];
static softmm_cpu *cpu;

static double native(void) {
    double best = 1e300;
    for (int r = 0; r < REPEATS; r++) {
        double t0 = now_ns();
        for (long i = 0; i < ITERS; i++) {
            uint64_t *const *h = host;
            OPAQUE(h);
            uint64_t sum = 0;
            for (int k = 0; k < BLOCK; k++) sum += __atomic_load_n(h[k], __ATOMIC_RELAXED);
            SINK(sum);
        }
        double t = (now_ns() - t0) / ITERS;
        if (t < best) best = t;
    }
    return best;
}

static uint64_t block_inline(softmm_section *s, const softmm_tlb_entry *table) {
    const uint64_t *g = guest;
    OPAQUE(g);
    uint64_t sum = 0, v;
    for (int k = 0; k < BLOCK; k++) {
        if (softmm_tlb_read_u64(s, table, g[k], &v, NULL) != 0) abort();
        sum += v;
    }
    return sum;
}

static uint64_t block_ffi(softmm_section *s) {
    const uint64_t *g = guest;
    OPAQUE(g);
    uint64_t sum = 0, v;
    for (int k = 0; k < BLOCK; k++) {
        if (softmm_section_read_uint(s, g[k], 8, &v, NULL) != 0) abort();
        sum += v;
    }
    return sum;
}

/* `ffi` 0: inline, 1: a call per access; `open`: one section for the run. */
static double guest_loads(int ffi, int open) {
    softmm_section *s;
    softmm_tlb_abi abi;
    check(softmm_cpu_section_begin(cpu, &s), "section");
    check(softmm_section_tlb_abi(s, &abi), "abi");
    check(softmm_section_end(s), "end");
    double best = 1e300;
    for (int r = 0; r < REPEATS; r++) {
        if (open) check(softmm_cpu_section_begin(cpu, &s), "section");
        double t0 = now_ns();
        for (long i = 0; i < ITERS; i++) {
            if (!open) softmm_cpu_section_begin(cpu, &s);
            uint64_t sum = ffi ? block_ffi(s) : block_inline(s, abi.table);
            SINK(sum);
            if (!open) softmm_section_end(s);
        }
        double t = (now_ns() - t0) / ITERS;
        if (open) check(softmm_section_end(s), "end");
        if (t < best) best = t;
    }
    return best;
}

static void row(const char *name, double block) {
    printf("c      %-22s %8.2f ns/block %7.3f ns/access\n", name, block, block / BLOCK);
}

int main(void) {
    softmm_phys *phys;
    softmm_mm *mm;
    check(softmm_phys_new(16 << 20, &phys), "phys");
    check(softmm_mm_new(phys, &mm), "mm");
    check(softmm_cpu_new(mm, &cpu), "cpu");
    uint64_t *pages = mmap(NULL, BLOCK * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (pages == MAP_FAILED) return 1;
    long long g = softmm_mmap(mm, 0, BLOCK * (PAGE + 256) + PAGE, PROT_READ | PROT_WRITE,
                              MAP_PRIVATE | MAP_ANONYMOUS, NULL, 0);
    if (g < 0) return 1;
    for (int k = 0; k < BLOCK; k++) {
        host[k] = &pages[(k * (PAGE + 256) + 8) / 8];
        *host[k] = 1;
        guest[k] = (uint64_t)g + k * (PAGE + 256) + 8;
        check(softmm_cpu_write_uint(cpu, guest[k], 8, 1, NULL), "write");
    }
    double n = native();
    row("native", n);
    double ib = guest_loads(0, 0), io = guest_loads(0, 1);
    double fb = guest_loads(1, 0), fo = guest_loads(1, 1);
    row("inline section/block", ib);
    row("inline open", io);
    row("ffi section/block", fb);
    row("ffi open", fo);
    printf("c      inline open / native %.2fx; inline section/block / native %.2fx\n", io / n, ib / n);
    softmm_cpu_free(cpu);
    softmm_mm_free(mm);
    softmm_phys_free(phys);
    return 0;
}
