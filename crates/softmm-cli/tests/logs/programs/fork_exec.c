/* Processes for `softmm replay`: a fork child that changes its copy of the
 * parent's memory without exec, a thread, a vfork + exec. */
#define _GNU_SOURCE
#include <pthread.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#define PG 4096L

static void *thread(void *a) {
    char *p = mmap(NULL, 1 << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    p[0] = 1;
    munmap(p, 1 << 20);
    mprotect(a, PG, PROT_READ | PROT_WRITE); /* the process's memory */
    return 0;
}

int main(void) {
    char *a = mmap(NULL, 16 * PG, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    a[0] = 1;
    pid_t c = fork();
    if (c == 0) {
        /* The child's copy: unmap half, protect the rest. */
        munmap(a + 8 * PG, 8 * PG);
        mprotect(a, 8 * PG, PROT_READ);
        _exit(0);
    }
    waitpid(c, NULL, 0);
    /* The parent's mapping is whole: EEXIST, then an mprotect of all of it. */
    mmap(a + 8 * PG, 8 * PG, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
    mprotect(a, 16 * PG, PROT_READ);
    pthread_t t;
    pthread_create(&t, NULL, thread, a + 15 * PG);
    pthread_join(t, NULL);
    pid_t v = vfork();
    if (v == 0) {
        execl("/bin/true", "true", (char *)0);
        _exit(127);
    }
    waitpid(v, NULL, 0);
    munmap(a, 16 * PG);
    return 0;
}
