/* tuning.c: choosing a tuning for an ISA on this CPU (tuning.h's lookup
 * order), the cache-size heuristic, the FMHA_TUNING override's parser and
 * fmha_tuning_status(). The compiled-in tunings live with their
 * architecture (cpu_x86.c, cpu_arm.c), beside the checks that name the
 * CPU; wisdom files are read by wisdom.c. */
#include "tuning.h"

#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu.h"
#include "fmha.h"
#include "wisdom.h"

/* Zero fields are the tables' and drivers' own values, but for the
 * matrix driver's schedule, which is explicit here: rescale past 2^8 (P
 * stays <= 256, far inside bf16's range; O's row and l are scaled about
 * once a row instead of at every new maximum) and the software-pipelined
 * schedule (measured on a Xeon with AMX: design.md, "The matrix driver"). */
const fmha_tuning fmha_tuning_generic = {.name = "generic", .matrix_rescale_log2 = 8, .matrix_overlap = 1};

const char *fmha_tuning_source_name(fmha_tuning_source s) {
    static const char *const names[] = {"generic", "heuristic", "builtin", "wisdom", "env"};
    return (unsigned)s < sizeof names / sizeof names[0] ? names[s] : "generic";
}

#define FIELD(key, lo, hi, multiple) {#key, offsetof(fmha_tuning, key), lo, hi, multiple}
static const fmha_tuning_field tuning_fields[] = {
    FIELD(tile_mr, 0, 16, 1),
    FIELD(tile_nr, 0, 64, 16),
    FIELD(block_kv, 32, 1024, 32),
    FIELD(k_copy_bytes, 0, (int64_t)1 << 40, 1),
    FIELD(dense_max_scores, 0, (int64_t)1 << 40, 1),
    FIELD(decode_prefetch_bytes, 0, (int64_t)1 << 50, 1),
    FIELD(decode_split_keys, 0, (int64_t)1 << 20, 128),
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

const fmha_tuning_field *fmha_tuning_field_named(const char *key, size_t len) {
    for (size_t i = 0; i < sizeof tuning_fields / sizeof tuning_fields[0]; i++)
        if (strlen(tuning_fields[i].key) == len && !memcmp(key, tuning_fields[i].key, len)) return &tuning_fields[i];
    return NULL;
}

/* The cache-size heuristic, for a CPU with no wisdom and no entry of its
 * own. Measured on a Xeon (GenuineIntel family 6 model 167: 48 KiB L1D,
 * 2 MiB L2; float32 forward, 8 heads, one thread): K read in place from
 * [B, S, H, D] (rows 2-4 KiB apart, a page each) cost 11% at S = 2048,
 * D = 128 (1 MiB of K a head) and 3% at S = 1024, D = 64 (256 KiB) against
 * a copy made once per call, and the copy cost 5% at S = 128 (32 KiB): so
 * K is copied past an eighth of L2. The decode driver's prefetch pays once
 * K and V outgrow what the cores' L2 and the L3 keep (measured 8 MiB on
 * Zen 4, 1 MiB of L2 a core): 8 L2. The rest stays generic. */
int fmha_tuning_heuristic(const fmha_cache_sizes *c, fmha_tuning *out) {
    if (c->l2 <= 0) return 0;
    *out = fmha_tuning_generic;
    out->name = "heuristic";
    out->source = FMHA_TUNING_HEURISTIC;
    out->k_copy_bytes = c->l2 / 8;
    out->decode_prefetch_bytes = 8 * c->l2;
    return 1;
}

/* ---- wisdom files, read once ---- */

typedef struct wisdom_file {
    char path[512];
    int state; /* 0 read, 1 not found, -1 refused, 2 none named */
    char reason[256];
    fmha_wisdom w;
} wisdom_file;

static wisdom_file wisdom_env, wisdom_user; /* FMHA_WISDOM's, the per-user one */
static pthread_once_t wisdom_once = PTHREAD_ONCE_INIT;

static void wisdom_read_one(wisdom_file *f, const char *path) {
    if (!path || !*path || snprintf(f->path, sizeof f->path, "%s", path) >= (int)sizeof f->path) {
        f->state = 2;
        return;
    }
    f->state = fmha_wisdom_load(f->path, &f->w, f->reason, sizeof f->reason);
}

static void wisdom_read(void) {
    char user[512];
    wisdom_read_one(&wisdom_env, getenv("FMHA_WISDOM"));
    wisdom_read_one(&wisdom_user, fmha_wisdom_user_path(user, sizeof user) == 0 ? user : NULL);
}

void fmha_tuning_lookup(const char *isa, fmha_tuning *out, char *name, size_t name_size) {
    char vendor[16] = {0};
    unsigned family = 0, model = 0;
    fmha_arch_cpu_id(vendor, sizeof vendor, &family, &model);
    pthread_once(&wisdom_once, wisdom_read);
    const fmha_wisdom_entry *e = fmha_wisdom_find(&wisdom_env.w, vendor, family, model, isa);
    if (!e) e = fmha_wisdom_find(&wisdom_user.w, vendor, family, model, isa);
    if (e) {
        *out = e->tuning;
        snprintf(name, name_size, "wisdom");
        out->name = name;
        return;
    }
    size_t n = 0;
    const fmha_arch_tuning *t = fmha_arch_tunings(&n);
    for (size_t i = 0; i < n; i++)
        if (!strcmp(t[i].isa, isa) && !strcmp(t[i].vendor, vendor) && t[i].family == family &&
            model >= t[i].model_lo && model <= t[i].model_hi) {
            *out = t[i].tuning;
            out->source = FMHA_TUNING_BUILTIN;
            return;
        }
    fmha_cache_sizes c;
    fmha_arch_cache_sizes(&c);
    if (!fmha_tuning_heuristic(&c, out)) *out = fmha_tuning_generic;
}

/* ---- FMHA_TUNING ---- */

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
        out->source = FMHA_TUNING_ENV;
        snprintf(name, name_size, "generic");
        return 0;
    }
    for (const char *s = text; *s;) {
        const char *end = strchr(s, ',');
        if (!end) end = s + strlen(s);
        const char *eq = memchr(s, '=', (size_t)(end - s));
        if (!eq) return -1;
        const fmha_tuning_field *field = fmha_tuning_field_named(s, (size_t)(eq - s));
        if (!field) return -1;
        long long v = tuning_value(eq + 1, end, field->lo, field->hi);
        if (v < 0 || v % field->multiple) return -1;
        *fmha_tuning_at(&t, field) = v;
        if (*end && !end[1]) return -1; /* a trailing comma */
        s = *end ? end + 1 : end;
    }
    snprintf(name, name_size, "%s+FMHA_TUNING", base->name);
    *out = t;
    out->source = FMHA_TUNING_ENV;
    return 0;
}

/* ---- fmha_tuning_status ---- */

static char tuning_status[2048];
static pthread_mutex_t tuning_status_lock = PTHREAD_MUTEX_INITIALIZER;

static void status_of_file(char *buf, size_t size, const char *what, const wisdom_file *f) {
    switch (f->state) {
    case 0: snprintf(buf, size, "%s %s: read, %zu entries", what, f->path, f->w.n_entries); break;
    case 1: snprintf(buf, size, "%s %s: not found", what, f->path); break;
    case 2: snprintf(buf, size, "%s: none", what); break;
    default: snprintf(buf, size, "%s %s: refused, nothing of it used: %s", what, f->path, f->reason); break;
    }
}

void fmha_tuning_set_status(const char *line) {
    pthread_once(&wisdom_once, wisdom_read);
    char env[900], user[700];
    status_of_file(env, sizeof env, "FMHA_WISDOM", &wisdom_env);
    status_of_file(user, sizeof user, "user wisdom", &wisdom_user);
    fmha_cache_sizes c;
    fmha_arch_cache_sizes(&c);
    pthread_mutex_lock(&tuning_status_lock);
    snprintf(tuning_status, sizeof tuning_status, "%s; %s; %s; caches L1d %lld KiB, L2 %lld KiB", line, env, user,
             (long long)(c.l1d >> 10), (long long)(c.l2 >> 10));
    pthread_mutex_unlock(&tuning_status_lock);
}

const char *fmha_tuning_status(void) {
    (void)fmha_cpu_kernels(); /* the registry's first use sets it */
    return tuning_status;
}
