/* Calls on memory mapped before tracing began, for `softmm replay`: run by
 * record-attached.sh, which attaches strace only after this program has
 * mapped its window and stopped itself. At the end it prints the window's
 * /proc/self/maps lines, which the replay's final maps must equal.
 *
 * Every mapping left in the window at the end is proven by a traced call
 * (Linux's checks), and some traced calls succeed on ranges Linux does not
 * check (a shrink's or same-size mremap's tail, a multi-VMA move's holes),
 * where a replay must not invent memory. */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>

#define W ((char *)0x300000000)
#define PG 4096L

static void map(char *a, long pages, int prot) {
    mmap(a, pages * PG, prot, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
}

int main(void) {
    /* Before tracing: A [0,2) rw, B [3,5) r, C [8,9) rw, D [16,20) rw,
     * E [24,26) r, F [40,41) rw (pages of W). */
    map(W, 2, PROT_READ | PROT_WRITE);
    map(W + 3 * PG, 2, PROT_READ);
    map(W + 8 * PG, 1, PROT_READ | PROT_WRITE);
    map(W + 16 * PG, 4, PROT_READ | PROT_WRITE);
    map(W + 24 * PG, 2, PROT_READ);
    map(W + 40 * PG, 1, PROT_READ | PROT_WRITE);
    raise(SIGSTOP);
    /* Same size, past C's end and across a hole: only C's first page is
     * looked up. */
    mremap(W + 8 * PG, 6 * PG, 6 * PG, 0);
    /* A shrink whose tail crosses the end of D, a hole and E: unmaps E. */
    mremap(W + 16 * PG, 12 * PG, 2 * PG, 0);
    /* A same-size MREMAP_FIXED move of A, the hole and B to W + 64 pages:
     * the hole moves along. */
    mremap(W, 5 * PG, 5 * PG, MREMAP_MAYMOVE | MREMAP_FIXED, W + 64 * PG);
    /* Proofs of what is left (a replay cannot know the protection of
     * memory it never saw mapped: the calls set it): A and B at their new
     * places, D, and F. */
    mprotect(W + 64 * PG, 2 * PG, PROT_READ | PROT_WRITE);
    mprotect(W + 67 * PG, 2 * PG, PROT_READ);
    madvise(W + 16 * PG, 2 * PG, MADV_NORMAL);
    mprotect(W + 40 * PG, PG, PROT_READ);
    /* munmap of memory never mapped proves nothing. */
    munmap(W + 100 * PG, 8 * PG);
    FILE *m = fopen("/proc/self/maps", "r");
    char line[512];
    while (fgets(line, sizeof line, m)) {
        unsigned long s;
        if (sscanf(line, "%lx-", &s) == 1 && s >= (unsigned long)W && s < (unsigned long)(W + 128 * PG))
            fputs(line, stdout);
    }
    return 0;
}
