/* Edge cases of the mmap family, for `softmm replay`: errors, fixed
 * placement, mremap variants, file mappings, brk. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#ifndef MREMAP_DONTUNMAP
#define MREMAP_DONTUNMAP 4
#endif
int main(void) {
    long pg = 4096;
    char *a = mmap(NULL, 64 * pg, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    memset(a, 1, 64 * pg);
    mprotect(a + 4 * pg, 4 * pg, PROT_READ);
    munmap(a + 16 * pg, 4 * pg);
    mprotect(a + 12 * pg, 8 * pg, PROT_NONE);          /* hole: ENOMEM after applying the first part */
    munmap(a + 1, pg);                                  /* EINVAL */
    mmap(NULL, 0, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0); /* EINVAL */
    mmap(a, pg, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0); /* EEXIST */
    mremap(a + 20 * pg, 4 * pg, 8 * pg, 0);            /* next VMA in the way: ENOMEM */
    char *b = mremap(a + 20 * pg, 4 * pg, 8 * pg, MREMAP_MAYMOVE);
    mremap(b, 8 * pg, 8 * pg, MREMAP_MAYMOVE | MREMAP_FIXED, a + 16 * pg); /* EINVAL? overlaps nothing: moves */
    /* A VMA of its own (a hole above it): softmm mishandles MREMAP_DONTUNMAP
     * of part of a VMA, see the CLI's tests. */
    char *c = mmap(NULL, 9 * pg, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    munmap(c + 8 * pg, pg);
    c[0] = 1;
    mremap(c, 8 * pg, 8 * pg, MREMAP_MAYMOVE | MREMAP_DONTUNMAP, NULL);
    mremap(c, 8 * pg, 16 * pg, MREMAP_DONTUNMAP | MREMAP_MAYMOVE, NULL); /* size change: EINVAL */
    madvise(a, pg, 12345);                              /* EINVAL */
    madvise(a + 15 * pg, 4 * pg, MADV_DONTNEED);         /* partly unmapped?: see result */
    madvise(a, 8 * pg, MADV_FREE);
    char path[] = "/tmp/softmm-edge-XXXXXX";
    int fd = mkstemp(path);
    ftruncate(fd, 10 * pg);
    char *f = mmap(NULL, 16 * pg, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    f[0] = 'x';
    mmap(NULL, pg, PROT_READ, MAP_SHARED, fd, 100);     /* unaligned offset: EINVAL */
    int ro = open(path, O_RDONLY);
    mmap(NULL, pg, PROT_READ | PROT_WRITE, MAP_SHARED, ro, 0); /* EACCES */
    char *r = mmap(NULL, pg, PROT_READ, MAP_SHARED, ro, pg);
    mprotect(r, pg, PROT_READ | PROT_WRITE);            /* EACCES */
    mremap(f, 16 * pg, 32 * pg, MREMAP_MAYMOVE);
    unlink(path);
    mmap(NULL, 4 * pg, PROT_READ, MAP_PRIVATE, 999, 0);  /* EBADF */
    mmap(NULL, 4 * pg, PROT_READ, 0, -1, 0);             /* no type: EINVAL */
    char *g = mmap(NULL, 16 * pg, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_GROWSDOWN, -1, 0);
    mprotect(g + 8 * pg, 4 * pg, PROT_READ | PROT_GROWSDOWN);
    void *cur = sbrk(0);
    brk((char *)cur + 40 * pg);
    brk((char *)cur + 8 * pg);
    brk((char *)cur - (1L << 40));                       /* refused: unchanged */
    mmap((void *)0x1000, pg, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0); /* below mmap_min_addr: EPERM */
    mmap((void *)0x200000000, 2 * pg, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0); /* hint honoured */
    mmap(NULL, 1L << 47, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0); /* ENOMEM */
    munmap(a, 64 * pg);
    return 0;
}
