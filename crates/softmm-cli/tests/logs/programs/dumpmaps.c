/* Preloaded into every traced process (LD_PRELOAD, set with strace -E):
 * at exit, appends the process's /proc/self/maps to $SOFTMM_MAPS_OUT as
 * "== pid N" and the lines, in one write (O_APPEND), so that a test can
 * compare each process's final mappings with the replay's.
 * Build: cc -O2 -shared -fPIC -o dumpmaps.so dumpmaps.c */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char buf[1 << 20];

__attribute__((destructor)) static void dump(void) {
    const char *out = getenv("SOFTMM_MAPS_OUT");
    if (!out)
        return;
    int n = snprintf(buf, sizeof buf, "== pid %d\n", (int)getpid());
    int m = open("/proc/self/maps", O_RDONLY);
    ssize_t r;
    while (m >= 0 && n < (int)sizeof buf && (r = read(m, buf + n, sizeof buf - n)) > 0)
        n += r;
    close(m);
    int o = open(out, O_WRONLY | O_APPEND | O_CREAT, 0644);
    write(o, buf, n);
    close(o);
}
