#include <stdio.h>
#include <stdlib.h>
#include <string.h>
int main(void) {
    size_t cap = 16, len = 0;
    char *buf = malloc(cap);
    unsigned long sum = 0;
    for (int i = 0; i < 200000; i++) {
        while (len + 64 > cap) {
            cap *= 2;
            buf = realloc(buf, cap);
            if (!buf) return 1;
        }
        memset(buf + len, i & 0xff, 64);
        len += 64;
    }
    for (size_t i = 0; i < len; i += 4096) sum += buf[i];
    printf("grew to %zu bytes (sum %lu)\n", cap, sum);
    buf = realloc(buf, 1 << 16);
    free(buf);
    return 0;
}
