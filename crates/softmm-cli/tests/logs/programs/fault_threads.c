// Four threads each map 128 KiB, write every page (32 page faults), and
// unmap it, 48 times: page faults on one thread while the others' mmap and
// munmap change the address space, as a multi-threaded allocator does.
// The headline's replay row (`softmm bench` with no workload) replays it
// with its faults.
#include <pthread.h>
#include <stdio.h>
#include <sys/mman.h>

enum { THREADS = 4, ROUNDS = 48, PAGES = 32, PAGE = 4096 };

static void *worker(void *arg) {
    long sum = (long)arg;
    for (int r = 0; r < ROUNDS; r++) {
        char *p = mmap(NULL, PAGES * PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED)
            return NULL;
        for (int i = 0; i < PAGES; i++)
            p[i * PAGE] = (char)(r + i);
        for (int i = 0; i < PAGES; i++)
            sum += p[i * PAGE];
        munmap(p, PAGES * PAGE);
    }
    return (void *)sum;
}

int main(void) {
    pthread_t t[THREADS];
    long total = 0;
    for (long i = 0; i < THREADS; i++)
        pthread_create(&t[i], NULL, worker, (void *)i);
    for (int i = 0; i < THREADS; i++) {
        void *r;
        pthread_join(t[i], &r);
        total += (long)r;
    }
    printf("%ld\n", total);
    return 0;
}
