/* tuning.c: choosing a tuning for an ISA on this CPU (tuning.h), and the
 * FMHA_TUNING override's parser. The tunings themselves live with their
 * architecture (cpu_x86.c), beside the checks that name the CPU. */
#include "tuning.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu.h"

/* Zero fields are the tables' and drivers' own values, but for the
 * matrix driver's schedule, which is explicit here: rescale past 2^8 (P
 * stays <= 256, far inside bf16's range; O's row and l are scaled about
 * once a row instead of at every new maximum) and the software-pipelined
 * schedule (measured on a Xeon with AMX: design.md, "The matrix driver"). */
const fmha_tuning fmha_tuning_generic = {.name = "generic", .matrix_rescale_log2 = 8, .matrix_overlap = 1};

#define FIELD(key, lo, hi, multiple) {#key, offsetof(fmha_tuning, key), lo, hi, multiple}
static const fmha_tuning_field tuning_fields[] = {
    FIELD(block_kv, 32, 1024, 32),
    FIELD(dense_max_scores, 0, (int64_t)1 << 40, 1),
    FIELD(decode_prefetch_bytes, 0, (int64_t)1 << 50, 1),
    FIELD(matrix_block_kv, 0, 512, 32),
    FIELD(matrix_rescale_log2, 0, 16, 1),
    FIELD(matrix_overlap, 0, 1, 1),
    FIELD(matrix_decode_rows, 0, (int64_t)1 << 20, 1),
};
#undef FIELD

const fmha_tuning_field *fmha_tuning_fields(size_t *n) {
    *n = sizeof tuning_fields / sizeof tuning_fields[0];
    return tuning_fields;
}

const fmha_tuning *fmha_arch_tuning_for(const char *isa) {
    char vendor[16] = {0};
    unsigned family = 0, model = 0;
    fmha_arch_cpu_id(vendor, sizeof vendor, &family, &model);
    size_t n = 0;
    const fmha_arch_tuning *t = fmha_arch_tunings(&n);
    for (size_t i = 0; i < n; i++)
        if (!strcmp(t[i].isa, isa) && !strcmp(t[i].vendor, vendor) && t[i].family == family &&
            model >= t[i].model_lo && model <= t[i].model_hi)
            return &t[i].tuning;
    return &fmha_tuning_generic;
}

/* A decimal value in lo..hi from [s, end), or -1. */
static long long tuning_value(const char *s, const char *end, long long lo, long long hi) {
    if (s == end || end - s > 18) return -1;
    long long v = 0;
    for (const char *c = s; c < end; c++) {
        if (*c < '0' || *c > '9') return -1;
        v = v * 10 + (*c - '0');
    }
    return v >= lo && v <= hi ? v : -1;
}

int fmha_tuning_parse(const char *text, const fmha_tuning *base, fmha_tuning *out, char *name, size_t name_size) {
    fmha_tuning t = *base;
    if (!strcmp(text, "generic")) {
        *out = fmha_tuning_generic;
        snprintf(name, name_size, "generic");
        return 0;
    }
    for (const char *s = text; *s;) {
        const char *end = strchr(s, ',');
        if (!end) end = s + strlen(s);
        const char *eq = memchr(s, '=', (size_t)(end - s));
        if (!eq) return -1;
        const size_t klen = (size_t)(eq - s);
        size_t n_fields;
        const fmha_tuning_field *f = fmha_tuning_fields(&n_fields), *field = NULL;
        for (size_t i = 0; i < n_fields && !field; i++)
            if (strlen(f[i].key) == klen && !memcmp(s, f[i].key, klen)) field = &f[i];
        if (!field) return -1;
        long long v = tuning_value(eq + 1, end, field->lo, field->hi);
        if (v < 0 || v % field->multiple) return -1;
        *fmha_tuning_at(&t, field) = v;
        if (*end && !end[1]) return -1; /* a trailing comma */
        s = *end ? end + 1 : end;
    }
    snprintf(name, name_size, "%s+FMHA_TUNING", base->name);
    *out = t;
    return 0;
}
