/* tune.c: fmha_tune, the planner that measures. It times the kernel table
 * in use under trial tunings (a trial context of cpu.c's, which its calls
 * plan on explicitly: the registry and other calls do not see it) on the
 * problems each field matters to (tuning.h's table: each field's rows and
 * candidates), field after field from generic (coordinate
 * descent, FFTW's "measure" in spirit): every candidate value of a field
 * runs every row of that field back to back with the others, five rounds
 * (compare: a paired comparison, since the machine may be shared), and
 * replaces the incumbent when it runs in under 0.97 of its time in the
 * median round and faster in every round, its outputs agreeing with
 * generic's (a variant that computes wrong is never kept). Then tuned and
 * generic are timed once more, alternating, for the wisdom file's rows,
 * which is written with the fields that differ from generic (wisdom.h's
 * format), keeping the file's other entries.
 *
 * Budget: the rows are sized for about 60 s on 2 cores of a Xeon; a field
 * whose turn comes after the budget is spent keeps its incumbent. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/attn.h"
#include "runtime/convert.h"
#include "config/cpu.h"
#include "runtime/error.h"
#include "fmha.h"
#include "api/tune.h"
#include "config/tuning.h"
#include "config/wisdom.h"

enum { TUNE_ROUNDS = 5, TUNE_CALLS = 1, TUNE_MAX_ROWS = 20, TUNE_MAX_CANDIDATES = 8 };
_Static_assert(TUNE_MAX_ROWS <= 32, "a row set is a bit mask of unsigned");
#define TUNE_DEFAULT_BUDGET_S 90.0
#define TUNE_KEEP 0.97 /* a candidate must run in 97% of the incumbent's time */

/* One problem the tuner times. */
typedef struct tune_row {
    char what[80];        /* "float32 fwd S=1024 D=128" */
    fmha_problem p;
    int backward;         /* forward+backward */
    int bf16;             /* operands bf16, else float32 */
    void *q, *k, *v, *d_o, *o, *dq, *dk, *dv;
    float *lse;
    size_t o_elems;
    float *o_generic;     /* O under generic (float32), for the agreement check */
    double generic_ms, tuned_ms;
} tune_row;

/* A field's rows: bits of row indices. */
typedef unsigned tune_rows;

typedef struct tuner {
    const char *isa;
    double t0, budget_s;
    fmha_tune_progress_fn progress;
    void *user;
    tune_row rows[TUNE_MAX_ROWS];
    int n_rows;
    tune_rows f32_rows, bf16_rows, dense_rows, decode_rows, decode_f32_rows, decode_quant_rows, decode_16_rows;
    tune_rows split_rows;    /* float32 at BF16X3, forward + backward */
    tune_rows accurate_rows; /* bf16 at ACCURATE, forward + backward */
    int64_t shrink;       /* sequence lengths divided by this (tests: tune.h) */
} tuner;

static double tune_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static void say(const tuner *tn, const char *format, ...) {
    if (!tn->progress) return;
    char line[512];
    const double s = tune_now() - tn->t0;
    int n = snprintf(line, sizeof line, "[tune %d:%02d of ~%d:%02d] ", (int)s / 60, (int)s % 60, (int)tn->budget_s / 60,
                     (int)tn->budget_s % 60);
    va_list ap;
    va_start(ap, format);
    vsnprintf(line + n, sizeof line - (size_t)n, format, ap);
    va_end(ap);
    tn->progress(tn->user, line);
}

/* ---- rows ---- */

static uint64_t tune_rng = 0x9E3779B97F4A7C15ull;
static float tune_uniform(void) {
    tune_rng = tune_rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)(tune_rng >> 40) / (float)(1 << 24) * 2.0f - 1.0f;
}

static void *tune_fill(size_t n, int bf16) {
    void *x = malloc(n * (bf16 ? 2 : 4));
    if (!x) return NULL;
    for (size_t i = 0; i < n; i++) {
        const float u = tune_uniform();
        if (bf16) ((uint16_t *)x)[i] = fmha_f32_to_bf16(u);
        else ((float *)x)[i] = u;
    }
    return x;
}

/* rows x d values as q8_0 blocks (uniform int8 values, every block's half
 * scale 2^-7: a valid cache, so a row times the quantized decode path). */
static uint8_t *tune_fill_q8_0(size_t rows, int64_t d) {
    const size_t n = rows * fmha_kv_format_row_bytes(FMHA_KV_FORMAT_Q8_0, d);
    uint8_t *x = malloc(n);
    if (!x) return NULL;
    for (size_t at = 0; at < n; at += FMHA_Q8_0_BLOCK_BYTES) { /* block_q8_0: half d, then 32 int8 */
        x[at] = 0x00, x[at + 1] = 0x20;
        for (int e = 0; e < FMHA_GGUF_BLOCK; e++) x[at + 2 + e] = (uint8_t)(int8_t)lrintf(127.0f * tune_uniform());
    }
    return x;
}

static void row_free(tune_row *r) {
    void *all[] = {r->q, r->k, r->v, r->d_o, r->o, r->dq, r->dk, r->dv, r->lse, r->o_generic};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) free(all[i]);
}

/* Adds a row of B 1, hq heads (hkv for K and V), Sq x Skv (each divided by
 * the tuner's shrink, at least 16; a decode step's Sq < Skv kept), D, K
 * and V of the operands' dtype or (q8_0) q8_0 caches; returns its index,
 * or -1 when memory ran out or the rows are full (TUNE_MAX_ROWS). */
static int add_row(tuner *tn, int bf16, int backward, int64_t hq, int64_t hkv, int64_t sq, int64_t skv, int64_t d,
                   int q8_0) {
    if (tn->n_rows >= TUNE_MAX_ROWS) return -1; /* a defect: add_rows asks for more than it holds */
    tune_row *r = &tn->rows[tn->n_rows];
    *r = (tune_row){.backward = backward, .bf16 = bf16};
    const int decode = sq < skv; /* a decode step keeps its query length */
    if (!decode) sq = sq / tn->shrink < 16 ? 16 : sq / tn->shrink;
    skv = skv / tn->shrink < 16 ? 16 : skv / tn->shrink;
    if (decode)
        snprintf(r->what, sizeof r->what, "%s decode Sq=%lld Skv=%lld Hq=%lld Hkv=%lld D=%lld",
                 q8_0 ? "q8_0" : bf16 ? "bfloat16" : "float32", (long long)sq, (long long)skv, (long long)hq, (long long)hkv,
                 (long long)d);
    else
        snprintf(r->what, sizeof r->what, "%s %s S=%lld D=%lld", bf16 ? "bfloat16" : "float32",
                 backward ? "fwdbwd" : "fwd", (long long)sq, (long long)d);
    fmha_problem_init(&r->p, 1, hq, hkv, sq, skv, d, d, FMHA_LAYOUT_BSHD);
    r->p.dtype = bf16 ? FMHA_DTYPE_BF16 : FMHA_DTYPE_F32;
    const size_t nq = (size_t)(sq * hq * d), nk = (size_t)(skv * hkv * d), es = bf16 ? 2 : 4;
    r->o_elems = nq;
    r->q = tune_fill(nq, bf16);
    if (q8_0) { /* K and V as q8_0 caches: byte strides of whole rows */
        const int64_t row = (int64_t)fmha_kv_format_row_bytes(FMHA_KV_FORMAT_Q8_0, d);
        r->k = tune_fill_q8_0((size_t)(skv * hkv), d);
        r->v = tune_fill_q8_0((size_t)(skv * hkv), d);
        r->p.k_format = r->p.v_format = FMHA_KV_FORMAT_Q8_0;
        for (int t = 0; t < 2; t++) {
            int64_t *st = t ? r->p.v_strides : r->p.k_strides;
            st[0] = skv * hkv * row, st[1] = hkv * row, st[2] = row, st[3] = 1;
        }
    } else {
        r->k = tune_fill(nk, bf16);
        r->v = tune_fill(nk, bf16);
    }
    r->o = malloc(nq * es);
    r->lse = malloc((size_t)(hq * sq) * sizeof(float));
    r->o_generic = malloc(nq * sizeof(float));
    if (backward) {
        r->d_o = tune_fill(nq, bf16);
        r->dq = malloc(nq * es);
        r->dk = malloc(nk * es);
        r->dv = malloc(nk * es);
    }
    if (!r->q || !r->k || !r->v || !r->o || !r->lse || !r->o_generic ||
        (backward && (!r->d_o || !r->dq || !r->dk || !r->dv))) {
        row_free(r);
        return -1;
    }
    return tn->n_rows++;
}

static fmha_status row_call(const fmha_context *ctx, tune_row *r) {
    if (r->backward)
        return fmha_forward_backward_in(ctx, &r->p, r->q, r->k, r->v, r->d_o, r->o, r->lse, r->dq, r->dk, r->dv,
                                        NULL);
    return fmha_forward_in(ctx, &r->p, r->q, r->k, r->v, r->o, r->lse, NULL, 0);
}

/* O as float32 into dst. */
static void row_output(const tune_row *r, float *dst) {
    for (size_t i = 0; i < r->o_elems; i++)
        dst[i] = r->bf16 ? fmha_bf16_to_f32(((const uint16_t *)r->o)[i]) : ((const float *)r->o)[i];
}

/* 1 when O agrees with generic's: relative L2 within 1e-4 (float32; the
 * tunings change summation orders only) or 2e-2 (bf16, whose P is rounded
 * at other points). */
static int row_agrees(const tune_row *r) {
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < r->o_elems; i++) {
        const double x = r->bf16 ? fmha_bf16_to_f32(((const uint16_t *)r->o)[i]) : ((const float *)r->o)[i];
        const double y = r->o_generic[i];
        num += (x - y) * (x - y);
        den += y * y;
    }
    return isfinite(num) && num <= (r->bf16 ? 4e-4 : 1e-8) * (den > 0.0 ? den : 1.0);
}

/* ---- timing under a trial tuning ---- */

/* Runs row r under tuning t: the fastest of TUNE_CALLS calls in ms, after
 * a first call when `warm` (which also checks agreement when `check`);
 * -1 when the call fails or disagrees. */
static double time_row(const char *isa, const fmha_tuning *t, tune_row *r, int warm, int check) {
    fmha_trial *trial = malloc(sizeof *trial);
    if (!trial || fmha_cpu_trial(isa, t, trial)) {
        free(trial);
        return -1.0;
    }
    double best = -1.0;
    if (warm && (row_call(&trial->ctx, r) != FMHA_OK || (check && !row_agrees(r)))) goto done;
    for (int c = 0; c < TUNE_CALLS; c++) {
        const double s = tune_now();
        if (row_call(&trial->ctx, r) != FMHA_OK) {
            best = -1.0;
            goto done;
        }
        const double ms = 1e3 * (tune_now() - s);
        if (best < 0.0 || ms < best) best = ms;
    }
done:
    free(trial);
    return best;
}

static int compare_doubles(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Candidates of one field (or the tile pair), cand[0] the incumbent: a
 * paired comparison, robust to a machine shared with other work. Each
 * round times every row under every candidate back to back (the order
 * rotating), so a burst of other work meets them all alike; a round's
 * ratio of a candidate is the geometric mean over the rows of its time
 * over the incumbent's in that round. A candidate is kept when the median
 * of its rounds' ratios is below TUNE_KEEP and no round had it slower than
 * the incumbent. Returns the index kept. */
static int compare(tuner *tn, const char *field, fmha_tuning *cand, const char *const *labels, int n, tune_rows rows) {
    double ratio[TUNE_MAX_CANDIDATES][TUNE_ROUNDS], ms[TUNE_MAX_CANDIDATES];
    int ok[TUNE_MAX_CANDIDATES];
    for (int c = 0; c < n; c++) ok[c] = 1;
    for (int round = 0; round < TUNE_ROUNDS; round++) {
        double log_sum[TUNE_MAX_CANDIDATES] = {0};
        int counted = 0;
        for (int i = 0; i < tn->n_rows; i++) {
            if (!(rows >> i & 1)) continue;
            for (int k = 0; k < n; k++) {
                const int c = (k + round) % n;
                ms[c] = ok[c] ? time_row(tn->isa, &cand[c], &tn->rows[i], round == 0, round == 0) : -1.0;
                if (ms[c] < 0.0) ok[c] = c == 0; /* the incumbent stays a candidate */
            }
            if (ms[0] <= 0.0) continue;
            for (int c = 0; c < n; c++)
                if (ok[c]) log_sum[c] += log(ms[c] / ms[0]);
            counted++;
        }
        for (int c = 0; c < n; c++) ratio[c][round] = counted ? exp(log_sum[c] / counted) : INFINITY;
    }
    int keep = 0;
    double best = 1.0;
    char line[384];
    int at = snprintf(line, sizeof line, "%s:", field);
    for (int c = 0; c < n; c++) {
        qsort(ratio[c], TUNE_ROUNDS, sizeof(double), compare_doubles);
        const double median = ratio[c][TUNE_ROUNDS / 2], worst = ratio[c][TUNE_ROUNDS - 1];
        if (at < (int)sizeof line)
            at += ok[c] ? snprintf(line + at, sizeof line - (size_t)at, " %s %.3f", labels[c], median)
                        : snprintf(line + at, sizeof line - (size_t)at, " %s (disagrees or fails)", labels[c]);
        if (ok[c] && c > 0 && median < TUNE_KEEP && worst < 1.0 && median < best) {
            best = median;
            keep = c;
        }
    }
    say(tn, "%s; keeps %s", line, labels[keep]);
    return keep;
}

static int spent(const tuner *tn) { return tune_now() - tn->t0 > tn->budget_s; }

/* One integer field: candidates its incumbent then the field's own (tuning.h). */
static void tune_field(tuner *tn, fmha_tuning *t, const fmha_tuning_field *f, tune_rows rows) {
    if (!rows || !f->n_candidates || spent(tn)) return;
    const int64_t *values = f->candidates;
    const int n = (int)f->n_candidates;
    fmha_tuning cand[TUNE_MAX_CANDIDATES];
    char text[TUNE_MAX_CANDIDATES][24];
    const char *labels[TUNE_MAX_CANDIDATES];
    int m = 0;
    cand[m] = *t;
    if (*fmha_tuning_at(t, f) == FMHA_TUNING_OF_TABLE) snprintf(text[m], sizeof text[m], "table's");
    else snprintf(text[m], sizeof text[m], "%lld", (long long)*fmha_tuning_at(t, f));
    labels[m] = text[m];
    m++;
    for (int i = 0; i < n && m < TUNE_MAX_CANDIDATES; i++) {
        if (values[i] == *fmha_tuning_at(t, f)) continue;
        cand[m] = *t;
        *fmha_tuning_at(&cand[m], f) = values[i];
        snprintf(text[m], sizeof text[m], "%lld", (long long)values[i]);
        labels[m] = text[m];
        m++;
    }
    *t = cand[compare(tn, f->key, cand, labels, m, rows)];
}

/* The float32 tile: the table's own and each other shape its tile part
 * lists (fmha_cpu_f32_tile_at). */
static void tune_tile(tuner *tn, fmha_tuning *t) {
    if (!tn->f32_rows || spent(tn)) return;
    fmha_tuning cand[TUNE_MAX_CANDIDATES];
    char text[TUNE_MAX_CANDIDATES][24];
    const char *labels[TUNE_MAX_CANDIDATES];
    const fmha_ukernels *own = fmha_cpu_kernels();
    int m = 0;
    const fmha_uk_tile *shape;
    for (size_t i = 0; (shape = fmha_cpu_f32_tile_at(own, i)) != NULL && m < TUNE_MAX_CANDIDATES; i++) {
        cand[m] = *t;
        if (i > 0) cand[m].tile_mr = (int64_t)shape->mr, cand[m].tile_nr = (int64_t)shape->nr;
        snprintf(text[m], sizeof text[m], "%zux%zu", shape->mr, shape->nr);
        labels[m] = text[m];
        m++;
    }
    if (m > 1) *t = cand[compare(tn, "float32 tile", cand, labels, m, tn->f32_rows)];
}

/* ---- the wisdom file ---- */

static void json_string(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"' || *s == '\\') fprintf(f, "\\%c", *s);
        else if ((unsigned char)*s < 0x20) fprintf(f, "\\u%04x", (unsigned char)*s);
        else fputc(*s, f);
    }
    fputc('"', f);
}

/* A time, or null for a row that failed (no number in JSON). */
static void json_ms(FILE *f, double ms) {
    if (isfinite(ms)) fprintf(f, "%.4g", ms);
    else fprintf(f, "null");
}

/* Writes old's other entries and this one to path (through path.tmp). */
static fmha_status write_wisdom(const tuner *tn, const char *path, const fmha_wisdom *old, const fmha_tuning *t) {
    char vendor[16] = {0}, cpu[256], tmp[600];
    unsigned family = 0, model = 0;
    fmha_arch_cpu_id(vendor, sizeof vendor, &family, &model);
    fmha_arch_describe(cpu, sizeof cpu);
    if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp)
        return fmha_fail(FMHA_ERR_BAD_FILE, "the wisdom path is too long");
    FILE *f = fopen(tmp, "w");
    if (!f) return fmha_fail(FMHA_ERR_BAD_FILE, "cannot write %s: %s", tmp, strerror(errno));
    fprintf(f, "{\n  \"fmha_wisdom\": %d,\n  \"entries\": [\n", FMHA_WISDOM_VERSION);
    for (size_t i = 0; i < old->n_entries; i++) {
        const fmha_wisdom_entry *e = &old->entries[i];
        if (!strcmp(e->vendor, vendor) && e->family == family && e->model == model && !strcmp(e->isa, tn->isa))
            continue;
        fprintf(f, "    %.*s,\n", (int)e->text_len, old->text + e->text_at);
    }
    fprintf(f, "    {\"vendor\": ");
    json_string(f, vendor);
    fprintf(f, ", \"family\": %u, \"model\": %u, \"isa\": ", family, model);
    json_string(f, tn->isa);
    fprintf(f, ",\n     \"cpu\": ");
    json_string(f, cpu);
    fprintf(f, ",\n     \"library\": \"%s\", \"threads\": %d, \"seconds\": %.1f,\n     \"fields\": {",
            fmha_version_string(), fmha_get_num_threads(), tune_now() - tn->t0);
    size_t n_fields;
    const fmha_tuning_field *fields = fmha_tuning_fields(&n_fields);
    int first = 1;
    for (size_t i = 0; i < n_fields; i++) {
        const int64_t v = *fmha_tuning_at((fmha_tuning *)t, &fields[i]);
        if (v == *fmha_tuning_at((fmha_tuning *)&fmha_tuning_generic, &fields[i])) continue;
        fprintf(f, "%s\"%s\": %lld", first ? "" : ", ", fields[i].key, (long long)v);
        first = 0;
    }
    fprintf(f, "},\n     \"rows\": [");
    for (int i = 0; i < tn->n_rows; i++) {
        const tune_row *r = &tn->rows[i];
        fprintf(f, "%s\n       {\"row\": ", i ? "," : "");
        json_string(f, r->what);
        fprintf(f, ", \"generic_ms\": ");
        json_ms(f, r->generic_ms);
        fprintf(f, ", \"tuned_ms\": ");
        json_ms(f, r->tuned_ms);
        fprintf(f, "}");
    }
    fprintf(f, "]}\n  ]\n}\n");
    const int bad = ferror(f) | (fclose(f) != 0);
    if (bad || rename(tmp, path) != 0) {
        remove(tmp);
        return fmha_fail(FMHA_ERR_BAD_FILE, "cannot write %s", path);
    }
    return FMHA_OK;
}

/* mkdir -p of path's directory. */
static void make_parent(const char *path) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s", path);
    for (char *s = dir + 1; *s; s++)
        if (*s == '/') {
            *s = '\0';
            mkdir(dir, 0755);
            *s = '/';
        }
}

/* A forward + backward row, S 1024, D 128, at a precision of its own,
 * marked in *rows; -1 when it could not be added. */
static int add_backward_row(tuner *tn, int bf16, fmha_precision precision, const char *what, tune_rows *rows) {
    const int i = add_row(tn, bf16, 1, 8, 8, 1024, 1024, 128, 0);
    if (i < 0) return -1;
    tune_row *r = &tn->rows[i];
    r->p.precision = precision;
    snprintf(r->what, sizeof r->what, "%s fwdbwd S=%lld D=128", what, (long long)r->p.seq_q);
    *rows |= 1u << i;
    return 0;
}

/* ---- fmha_tune ---- */

/* The rows: float32 S 128..2048, D 64 and 128, forward and
 * forward+backward; bf16 on tables with bf16 kernels; two small heads for
 * AUTO's crossover; one decode step against 256 MiB of bf16 cache (past
 * the prefetch threshold), one against 512 MiB of float32 and one against
 * 142 MiB of q8_0; a float32 BF16X3 forward + backward and a bf16
 * ACCURATE one where the table has a matrix backward. */
static int add_rows(tuner *tn, const fmha_ukernels *uk) {
    static const struct { int bf16, backward; int64_t s, d; } tiled[] = {
        {0, 0, 128, 64},  {0, 0, 1024, 64},  {0, 0, 1024, 128}, {0, 0, 2048, 128},
        {0, 1, 1024, 64}, {0, 1, 1024, 128}, {1, 0, 1024, 128}, {1, 0, 2048, 64}, {1, 1, 1024, 128},
    };
    const int bf16_kernels = uk->bf16.gemm || uk->matrix.forward;
    for (size_t i = 0; i < sizeof tiled / sizeof tiled[0]; i++) {
        if (tiled[i].bf16 && !bf16_kernels) continue;
        const int r = add_row(tn, tiled[i].bf16, tiled[i].backward, 8, 8, tiled[i].s, tiled[i].s, tiled[i].d, 0);
        if (r < 0) return -1;
        if (tiled[i].bf16) tn->bf16_rows |= 1u << r;
        else tn->f32_rows |= 1u << r;
    }
    static const int64_t dense[] = {96, 160};
    for (size_t i = 0; i < sizeof dense / sizeof dense[0]; i++) {
        const int r = add_row(tn, 0, 0, 8, 8, dense[i], dense[i], 64, 0);
        if (r < 0) return -1;
        tn->dense_rows |= 1u << r;
    }
    if (uk->decode.softmax) {
        /* 256 MiB: a step's cache out of the caches (64 MiB of float32 stayed
         * in a Xeon's L3 and chose no prefetch, which made a bf16 cache
         * that is not 1.5x slower) */
        const int r = add_row(tn, 1, 0, 32, 8, 1, 65536, 128, 0);
        if (r < 0) return -1;
        tn->decode_rows |= 1u << r;
        /* and 512 MiB of float32 cache, its own threshold's row */
        const int r32 = add_row(tn, 0, 0, 32, 8, 1, 65536, 128, 0);
        if (r32 < 0) return -1;
        tn->decode_f32_rows |= 1u << r32;
        /* and 142 MiB of q8_0 cache (float32 query), the quantized formats'
         * threshold (decode_prefetch_bytes) */
        const int rq = add_row(tn, 0, 0, 32, 8, 1, 65536, 128, 1);
        if (rq < 0) return -1;
        tn->decode_quant_rows |= 1u << rq;
        /* 4 positions of GQA 4 (16 rows a kv head), a bf16 step of 67
         * MiB: the chunks' threshold of many rows */
        const int r16 = add_row(tn, 1, 0, 32, 8, 4, 16384, 128, 0);
        if (r16 < 0) return -1;
        tn->decode_16_rows |= 1u << r16;
    }
    if (uk->matrix.backward) {
        /* float32 at BF16X3 forward + backward: the split backward on the
         * tiles or on the FMA path (matrix_backward_split); bf16 at
         * ACCURATE: its P and dS residuals there or on the FMA path
         * (matrix_backward_accurate) */
        if (add_backward_row(tn, 0, FMHA_PRECISION_BF16X3, "float32 bf16x3", &tn->split_rows) ||
            add_backward_row(tn, 1, FMHA_PRECISION_ACCURATE, "bfloat16 accurate", &tn->accurate_rows))
            return -1;
    }
    return 0;
}

fmha_status fmha_tune(const char *path, double budget_s, fmha_tune_progress_fn progress, void *user) {
    fmha_error_clear();
    return fmha_tune_shrunk(path, budget_s, progress, user, 1);
}

fmha_status fmha_tune_shrunk(const char *path, double budget_s, fmha_tune_progress_fn progress, void *user,
                             int64_t shrink) {
    char user_path[512];
    if (!path) {
        if (fmha_wisdom_user_path(user_path, sizeof user_path))
            return fmha_fail(FMHA_ERR_BAD_FILE, "no path given, and neither XDG_CACHE_HOME nor HOME is set");
        make_parent(user_path);
        path = user_path;
    }
    fmha_wisdom old;
    char reason[256];
    if (fmha_wisdom_load(path, &old, reason, sizeof reason) < 0)
        return fmha_fail(FMHA_ERR_BAD_FILE, "%s is not a wisdom file this library can extend (%s); nothing written",
                         path, reason);
    tuner *tn = calloc(1, sizeof *tn);
    if (!tn) {
        fmha_wisdom_free(&old);
        return fmha_fail(FMHA_ERR_OUT_OF_MEMORY, "the tuner's state could not be allocated");
    }
    const fmha_ukernels *uk = fmha_cpu_kernels();
    tn->isa = uk->isa;
    tn->t0 = tune_now();
    tn->budget_s = budget_s > 0.0 ? budget_s : TUNE_DEFAULT_BUDGET_S;
    tn->progress = progress;
    tn->user = user;
    tn->shrink = shrink > 1 ? shrink : 1;
    fmha_status st = FMHA_OK;
    if (add_rows(tn, uk)) {
        st = fmha_fail(FMHA_ERR_OUT_OF_MEMORY, "the tuner's problems could not be allocated");
        goto done;
    }
    say(tn, "%s on %d threads: %d problems", tn->isa, fmha_get_num_threads(), tn->n_rows);
    fmha_tuning generic = fmha_tuning_generic, t = generic;
    for (int i = 0; i < tn->n_rows; i++) { /* generic's outputs, the agreement check's reference */
        if (time_row(tn->isa, &generic, &tn->rows[i], 1, 0) < 0.0) {
            st = fmha_fail(FMHA_ERR_UNSUPPORTED, "the tuner's problem \"%s\" failed under the generic tuning",
                           tn->rows[i].what);
            goto done;
        }
        row_output(&tn->rows[i], tn->rows[i].o_generic);
    }
    const tune_rows tiled = tn->f32_rows | tn->bf16_rows;
    tune_tile(tn, &t);
    size_t n_fields;
    const fmha_tuning_field *fields = fmha_tuning_fields(&n_fields);
    for (size_t i = 0; i < n_fields; i++) { /* each field on its rows, with its candidates */
        const fmha_tuning_field *f = &fields[i];
        const tune_rows rows = f->rows == FMHA_TUNE_F32      ? tn->f32_rows
                               : f->rows == FMHA_TUNE_TILED  ? (uk->matrix.forward ? tn->f32_rows : tiled)
                               : f->rows == FMHA_TUNE_MATRIX ? (uk->matrix.forward ? tn->bf16_rows : 0)
                               : f->rows == FMHA_TUNE_DENSE  ? tn->dense_rows
                               : f->rows == FMHA_TUNE_DECODE ? tn->decode_rows
                               : f->rows == FMHA_TUNE_DECODE_F32 ? tn->decode_f32_rows
                               : f->rows == FMHA_TUNE_DECODE_QUANT ? tn->decode_quant_rows
                               : f->rows == FMHA_TUNE_DECODE_ROWS ? tn->decode_16_rows
                               : f->rows == FMHA_TUNE_MATRIX_BWD ? tn->split_rows
                               : f->rows == FMHA_TUNE_MATRIX_BWD_BF16 ? tn->accurate_rows
                                                             : 0;
        tune_field(tn, &t, f, rows);
    }
    /* the rows of the file: tuned against generic, alternating */
    for (int i = 0; i < tn->n_rows; i++) tn->rows[i].generic_ms = tn->rows[i].tuned_ms = INFINITY;
    for (int round = 0; round < TUNE_ROUNDS; round++)
        for (int i = 0; i < tn->n_rows; i++) {
            tune_row *r = &tn->rows[i];
            const double g = time_row(tn->isa, &generic, r, round == 0, 0), u = time_row(tn->isa, &t, r, round == 0, 0);
            if (g >= 0.0 && g < r->generic_ms) r->generic_ms = g;
            if (u >= 0.0 && u < r->tuned_ms) r->tuned_ms = u;
        }
    for (int i = 0; i < tn->n_rows; i++)
        say(tn, "%-48s generic %8.3f ms  tuned %8.3f ms  (%.2fx)", tn->rows[i].what, tn->rows[i].generic_ms,
            tn->rows[i].tuned_ms, tn->rows[i].generic_ms / tn->rows[i].tuned_ms);
    st = write_wisdom(tn, path, &old, &t);
    if (st == FMHA_OK) say(tn, "wrote %s", path);
done:
    for (int i = 0; i < tn->n_rows; i++) row_free(&tn->rows[i]);
    free(tn);
    fmha_wisdom_free(&old);
    return st;
}
