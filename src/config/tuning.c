/* tuning.c: the tuning fields' table (from FMHA_TUNING_FIELDS), the one
 * check that every source's key=value text passes, and the text of a
 * tuning's fields. Depends on nothing but tuning.h. */
#include "config/tuning.h"

#include <stdio.h>
#include <string.h>

#define FMHA_UNPAREN(...) __VA_ARGS__
/* each field's candidates, after a 0 that gives empty lists a size */
#define TUNING_CANDIDATES(key, dflt, lo, hi, multiple, rows, cands) \
    static const int64_t tuning_candidates_##key[] = {0, FMHA_UNPAREN cands};
FMHA_TUNING_FIELDS(TUNING_CANDIDATES)
#undef TUNING_CANDIDATES

#define TUNING_FIELD(key, dflt, lo, hi, multiple, rows, cands)                                                  \
    {#key, offsetof(fmha_tuning, key), dflt, lo, hi, multiple, rows, tuning_candidates_##key + 1,              \
     sizeof tuning_candidates_##key / sizeof tuning_candidates_##key[0] - 1},
static const fmha_tuning_field tuning_fields[] = {FMHA_TUNING_FIELDS(TUNING_FIELD)};
#undef TUNING_FIELD

#define TUNING_DEFAULT(key, dflt, ...) .key = dflt,
const fmha_tuning fmha_tuning_generic = {.name = "generic", .source = FMHA_TUNING_GENERIC,
                                         FMHA_TUNING_FIELDS(TUNING_DEFAULT)};
#undef TUNING_DEFAULT

enum { TUNING_N_FIELDS = sizeof tuning_fields / sizeof tuning_fields[0] };

const char *fmha_tuning_source_name(fmha_tuning_source s) {
    static const char *const names[] = {"generic", "heuristic", "builtin", "wisdom", "env"};
    return (unsigned)s < sizeof names / sizeof names[0] ? names[s] : "generic";
}

const fmha_tuning_field *fmha_tuning_fields(size_t *n) {
    *n = TUNING_N_FIELDS;
    return tuning_fields;
}

const fmha_tuning_field *fmha_tuning_field_named(const char *key, size_t len) {
    for (size_t i = 0; i < TUNING_N_FIELDS; i++)
        if (strlen(tuning_fields[i].key) == len && !memcmp(key, tuning_fields[i].key, len)) return &tuning_fields[i];
    return NULL;
}

/* A decimal value from [s, end) into *v; -1 when it is not one (or past 18 digits). */
static int tuning_decimal(const char *s, const char *end, int64_t *v) {
    if (s == end || end - s > 18) return -1;
    *v = 0;
    for (const char *c = s; c < end; c++) {
        if (*c < '0' || *c > '9') return -1;
        *v = *v * 10 + (*c - '0');
    }
    return 0;
}

int fmha_tuning_apply(const char *text, fmha_tuning *t, char *err, size_t err_size) {
    fmha_tuning u = *t;
    if (!strcmp(text, "generic")) {
        for (size_t i = 0; i < TUNING_N_FIELDS; i++) *fmha_tuning_at(&u, &tuning_fields[i]) = tuning_fields[i].dflt;
        *t = u;
        return 0;
    }
    for (const char *s = text; *s;) {
        const char *end = strchr(s, ',');
        if (!end) end = s + strlen(s);
        const int len = (int)(end - s);
        const char *eq = memchr(s, '=', (size_t)(end - s));
        if (!eq) {
            snprintf(err, err_size, "\"%.*s\" is not key=value", len, s);
            return -1;
        }
        const fmha_tuning_field *f = fmha_tuning_field_named(s, (size_t)(eq - s));
        if (!f) {
            snprintf(err, err_size, "the unknown key \"%.*s\"", (int)(eq - s), s);
            return -1;
        }
        int64_t v;
        if (tuning_decimal(eq + 1, end, &v) || v < f->lo || v > f->hi || v % f->multiple) {
            snprintf(err, err_size, "%s must be an integer in %lld..%lld, a multiple of %lld, got \"%.*s\"", f->key,
                     (long long)f->lo, (long long)f->hi, (long long)f->multiple, (int)(end - eq - 1), eq + 1);
            return -1;
        }
        *fmha_tuning_at(&u, f) = v;
        if (*end && !end[1]) {
            snprintf(err, err_size, "a trailing comma");
            return -1;
        }
        s = *end ? end + 1 : end;
    }
    *t = u;
    return 0;
}

void fmha_tuning_text(const fmha_tuning *t, const fmha_tuning *base, char *buf, size_t size) {
    size_t at = 0;
    if (size) buf[0] = '\0';
    for (size_t i = 0; i < TUNING_N_FIELDS; i++) {
        const int64_t v = fmha_tuning_get(t, &tuning_fields[i]);
        if (v == fmha_tuning_get(base, &tuning_fields[i])) continue;
        const int n = snprintf(buf + at, at < size ? size - at : 0, "%s%s=%lld", at ? "," : "", tuning_fields[i].key,
                               (long long)v);
        if (n > 0) at += (size_t)n;
    }
}
