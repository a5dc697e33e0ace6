/* Descriptors whose first mmap fails, for `softmm replay`: each later use
 * of the same descriptor succeeds on Linux, so a replay must not take a
 * failed first call for a closed descriptor. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

static int file(const char *tag, long size, int mode) {
    char path[64];
    snprintf(path, sizeof path, "/tmp/softmm-fd-%s-XXXXXX", tag);
    int fd = mkstemp(path);
    ftruncate(fd, size);
    if (mode != O_RDWR) {
        int ro = open(path, mode);
        close(fd);
        fd = ro;
    }
    unlink(path);
    return fd;
}

int main(void) {
    long pg = 4096;
    /* ENOMEM: no room for 2^47 bytes. */
    int a = file("enomem", 4 * pg, O_RDWR);
    mmap(NULL, 1L << 47, PROT_READ, MAP_SHARED, a, 0);
    char *pa = mmap(NULL, 4 * pg, PROT_READ | PROT_WRITE, MAP_SHARED, a, 0);
    /* EINVAL: a zero length, then no mapping type. (glibc refuses an
     * unaligned offset itself: no system call.) */
    int b = file("einval", 4 * pg, O_RDWR);
    mmap(NULL, 0, PROT_READ, MAP_SHARED, b, 0);
    mmap(NULL, pg, PROT_READ, 0, b, 0);
    char *pb = mmap(NULL, 2 * pg, PROT_READ, MAP_PRIVATE, b, pg);
    /* EEXIST: a fixed-noreplace mapping over pa, longer than the file;
     * then ENOMEM for 2^40 bytes over it. */
    int c = file("eexist", 4 * pg, O_RDWR);
    mmap(pa, 8 * pg, PROT_READ, MAP_SHARED | MAP_FIXED_NOREPLACE, c, 0);
    mmap(pa, 1L << 40, PROT_READ, MAP_SHARED | MAP_FIXED_NOREPLACE, c, 0);
    char *pc = mmap(NULL, 4 * pg, PROT_READ | PROT_WRITE, MAP_SHARED, c, 0);
    /* EOVERFLOW: offset + length past the page offset range. */
    int d = file("eoverflow", 4 * pg, O_RDONLY);
    mmap(NULL, 4 * pg, PROT_READ, MAP_PRIVATE, d, 0x7ffffffffffff000L);
    char *pd = mmap(NULL, 4 * pg, PROT_READ, MAP_PRIVATE, d, 0);
    /* EACCES first on a read-only descriptor, then a read-only mapping. */
    int e = file("eacces", 4 * pg, O_RDONLY);
    mmap(NULL, pg, PROT_READ | PROT_WRITE, MAP_SHARED, e, 0);
    char *pe = mmap(NULL, pg, PROT_READ, MAP_SHARED, e, 0);
    pa[0] = pb[0] + pc[0] + pd[0] + pe[0];
    munmap(pa, 4 * pg);
    munmap(pb, 2 * pg);
    munmap(pc, 4 * pg);
    munmap(pd, 4 * pg);
    munmap(pe, pg);
    return 0;
}
