/* error.h: the detail of a failing call. Every place that returns a status
 * other than FMHA_OK returns fmha_fail(status, ...), which records a
 * sentence naming the argument, what it must be and what it was, for
 * fmha_last_error_message on the calling thread; public entry points clear
 * it first, so it always describes the thread's last call. */
#ifndef FMHA_ERROR_H
#define FMHA_ERROR_H

#include "fmha.h"

/* Records the message (printf format) and returns st. */
fmha_status fmha_fail(fmha_status st, const char *format, ...) __attribute__((format(printf, 2, 3)));

/* FMHA_OK when every pointer is set, else FMHA_ERR_NULL_POINTER naming the
 * NULL ones; names lists the pointers' names, comma-separated, in order. */
fmha_status fmha_check_pointers(const char *names, int n, const void *const *ptrs);
#define FMHA_CHECK_POINTERS(names, ...)                                                                            \
    fmha_check_pointers(names, (int)(sizeof((const void *[]){__VA_ARGS__}) / sizeof(const void *)),              \
                        (const void *[]){__VA_ARGS__})

/* Forgets the last message (at the start of a public call). */
void fmha_error_clear(void);

#endif /* FMHA_ERROR_H */
