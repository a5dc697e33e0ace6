/* A program whose final mappings depend on its page faults (anon_vma):
 * it dumps its own /proc/self/maps before it exits, with raw calls only,
 * so that nothing maps or unmaps after the dump. `softmm replay --run`
 * with perf replays it and compares with that dump (tests/replay_faults.rs). */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static char buf[1 << 16];

int main(int argc, char **argv)
{
	long pg = 4096;
	/* Two neighbours with different protections, each written: each gets
	 * its own anon_vma, so making them alike does not merge them. */
	char *a = mmap(NULL, 8 * pg, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (a == MAP_FAILED)
		return 1;
	mprotect(a + 4 * pg, 4 * pg, PROT_READ | PROT_WRITE | PROT_EXEC);
	a[0] = 1;
	a[5 * pg] = 1;
	mprotect(a + 4 * pg, 4 * pg, PROT_READ | PROT_WRITE);
	/* The same without the second write: one anon_vma, merged. */
	char *b = mmap(NULL, 8 * pg, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	mprotect(b + 4 * pg, 4 * pg, PROT_READ);
	b[0] = 1;
	volatile char c = b[5 * pg];
	(void)c;
	mprotect(b + 4 * pg, 4 * pg, PROT_READ | PROT_WRITE);
	/* A written VMA moved with MREMAP_DONTUNMAP beside an unfaulted one. */
	char *d = mmap(NULL, 4 * pg, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	d[0] = 1;
	char *e = mmap(NULL, 8 * pg, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	munmap(e + 4 * pg, 4 * pg);
	mprotect(e, 4 * pg, PROT_READ | PROT_WRITE);
	e[0] = 1;
	mremap(d, 4 * pg, 4 * pg, MREMAP_MAYMOVE | MREMAP_FIXED | MREMAP_DONTUNMAP, e + 4 * pg);
	/* The heap grown by brk and written. */
	char *h = sbrk(0);
	if (sbrk(16 * pg) != (void *)-1)
		h[8 * pg] = 1;

	if (argc < 2)
		return 0;
	int in = open("/proc/self/maps", O_RDONLY);
	int out = open(argv[1], O_WRONLY | O_CREAT | O_TRUNC, 0644);
	ssize_t n;
	while ((n = read(in, buf, sizeof buf)) > 0)
		write(out, buf, n);
	return 0;
}
