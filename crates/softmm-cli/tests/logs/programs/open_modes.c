/* Open modes for `softmm replay`: descriptors of one file opened read-write,
 * read-only, write-only and O_PATH, a reused descriptor number, a dup, a
 * memfd, a fork child and an exec that keeps one descriptor and closes a
 * close-on-exec one. With its descriptor lines a replay knows every mode;
 * without them it must infer (and cannot tell the reused number's mode). */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#define PG 4096L
#define W ((char *)0x300000000)
#define RW (PROT_READ | PROT_WRITE)

static void *map(char *at, long pages, int prot, int flags, int fd) {
    return mmap(at, pages * PG, prot, flags | MAP_FIXED_NOREPLACE, fd, 0);
}

int main(int argc, char **argv) {
    if (argc == 3) {
        /* After exec: argv[1] is a kept read-write descriptor, argv[2] a
         * close-on-exec one (now closed: EBADF). */
        map(W + 100 * PG, 2, RW, MAP_SHARED, atoi(argv[1]));
        map(W + 104 * PG, 2, PROT_READ, MAP_SHARED, atoi(argv[2]));
        return 0;
    }
    char path[] = "/tmp/softmm-modes-XXXXXX";
    int a = mkstemp(path); /* O_RDWR */
    ftruncate(a, 16 * PG);
    int b = open(path, O_RDONLY | O_CLOEXEC);
    /* Read-only descriptor, shared, then write added over a hole: the first
     * VMA refuses (EACCES). */
    map(W, 4, PROT_READ, MAP_SHARED, b);
    mprotect(W, 8 * PG, RW);
    /* Read-write descriptor, same: the hole is met first (ENOMEM). */
    map(W + 16 * PG, 4, PROT_READ, MAP_SHARED, a);
    mprotect(W + 16 * PG, 8 * PG, RW);
    /* The number of `a` reused for a read-only open: write refused. */
    int keep = dup(a);
    close(a);
    int a2 = open(path, O_RDONLY);
    map(W + 32 * PG, 2, PROT_READ, MAP_SHARED, a2);
    mprotect(W + 32 * PG, 2 * PG, RW);
    /* Write-only: no mapping at all (EACCES). O_PATH: EBADF. */
    int wo = open(path, O_WRONLY);
    map(W + 40 * PG, 2, PROT_READ, MAP_PRIVATE, wo);
    int po = open(path, O_PATH);
    map(W + 44 * PG, 2, PROT_READ, MAP_PRIVATE, po);
    /* A dup of the read-only descriptor. */
    int d = dup(b);
    map(W + 48 * PG, 2, PROT_READ, MAP_SHARED, d);
    mprotect(W + 48 * PG, 2 * PG, RW);
    /* A memfd. */
    int m = memfd_create("modes", MFD_CLOEXEC);
    ftruncate(m, 4 * PG);
    map(W + 56 * PG, 4, RW, MAP_SHARED, m);
    /* A fork child maps its copy of `keep` (read-write) shared writable. */
    pid_t c = fork();
    if (c == 0) {
        map(W + 64 * PG, 2, RW, MAP_SHARED, keep);
        _exit(0);
    }
    waitpid(c, NULL, 0);
    /* Exec this program again with `keep` and the close-on-exec `b`. */
    char k[16], cb[16];
    snprintf(k, sizeof k, "%d", keep);
    snprintf(cb, sizeof cb, "%d", b);
    unlink(path);
    execl("/proc/self/exe", argv[0], k, cb, (char *)0);
    return 1;
}
