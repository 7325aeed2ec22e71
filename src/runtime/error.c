/* error.c: the thread's last failure message (error.h). */
#include "runtime/error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

static _Thread_local char error_message[512];

fmha_status fmha_fail(fmha_status st, const char *format, ...) {
    va_list ap;
    va_start(ap, format);
    vsnprintf(error_message, sizeof error_message, format, ap);
    va_end(ap);
    return st;
}

fmha_status fmha_check_pointers(const char *names, int n, const void *const *ptrs) {
    char null_names[256] = "";
    size_t used = 0;
    const char *name = names;
    for (int i = 0; i < n && name; i++) {
        const char *comma = strchr(name, ',');
        size_t len = comma ? (size_t)(comma - name) : strlen(name);
        if (!ptrs[i] && used + len + 3 < sizeof null_names) {
            if (used) used += (size_t)snprintf(null_names + used, sizeof null_names - used, ", ");
            used += (size_t)snprintf(null_names + used, sizeof null_names - used, "%.*s", (int)len, name);
        }
        name = comma ? comma + 1 + (comma[1] == ' ') : NULL;
    }
    if (!used) return FMHA_OK;
    return fmha_fail(FMHA_ERR_NULL_POINTER, "%s must not be NULL", null_names);
}

void fmha_error_clear(void) { error_message[0] = '\0'; }

const char *fmha_last_error_message(void) { return error_message; }
