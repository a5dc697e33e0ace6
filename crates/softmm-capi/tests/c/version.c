/* The library's version and texts, from C: the header's version macros
 * match softmm_version(), results have their text, and a configuration
 * softmm_mm_new_config refuses is named. Prints "version ok". */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "softmm.h"

int main(void) {
    char want[32];
    snprintf(want, sizeof want, "%u.%u.%u", SOFTMM_VERSION_MAJOR, SOFTMM_VERSION_MINOR, SOFTMM_VERSION_PATCH);
    if (strcmp(softmm_version(), want) != 0) {
        printf("header %s, library %s\n", want, softmm_version());
        return 1;
    }
    if (strcmp(softmm_strerror(-ENOMEM), "ENOMEM: cannot allocate memory") != 0) {
        printf("strerror(-ENOMEM) = %s\n", softmm_strerror(-ENOMEM));
        return 1;
    }
    softmm_mm_config c;
    softmm_mm_config_default(&c);
    if (softmm_mm_config_check(&c) != NULL) {
        printf("the defaults are refused: %s\n", softmm_mm_config_check(&c));
        return 1;
    }
    c.task_size = 0xffffe000;
    const char *why = softmm_mm_config_check(&c);
    if (why == NULL || strncmp(why, "mmap_base", 9) != 0) {
        printf("a 32-bit task size under the 64-bit layout: %s\n", why ? why : "(accepted)");
        return 1;
    }
    printf("version ok\n");
    return 0;
}
