/* tuning.c: choosing a tuning for an ISA on this CPU (tuning.h), and the
 * FMHA_TUNING override's parser. The tunings themselves live with their
 * architecture (cpu_x86.c), beside the checks that name the CPU. */
#include "tuning.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu.h"

const fmha_tuning fmha_tuning_generic = {.name = "generic"};

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
        long long v;
        if (klen == 8 && !memcmp(s, "block_kv", 8)) {
            if ((v = tuning_value(eq + 1, end, 32, 1024)) < 0 || v % 32) return -1;
            t.block_kv = (size_t)v;
        } else if (klen == 16 && !memcmp(s, "dense_max_scores", 16)) {
            if ((v = tuning_value(eq + 1, end, 0, (long long)1 << 40)) < 0) return -1;
            t.dense_max_scores = v;
        } else if (klen == 21 && !memcmp(s, "decode_prefetch_bytes", 21)) {
            if ((v = tuning_value(eq + 1, end, 0, (long long)1 << 50)) < 0) return -1;
            t.decode_prefetch_bytes = v;
        } else {
            return -1;
        }
        if (*end && !end[1]) return -1; /* a trailing comma */
        s = *end ? end + 1 : end;
    }
    snprintf(name, name_size, "%s+FMHA_TUNING", base->name);
    *out = t;
    return 0;
}
