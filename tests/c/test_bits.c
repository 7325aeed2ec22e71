/* test_bits.c: the bits of fixed problems on every table, held to a record
 * (tests/c/bits_record.txt) taken before the configuration layer was
 * rewritten: a refactor of planning, tuning or drivers must not change one
 * output bit. Each problem (forward and, where it has one, backward; every
 * driver: tiled, dense, decode, matrix, matrix_decode, the fold; float32,
 * bf16, f16, bf16x3, a q8_0 cache) runs on every table this CPU runs, at
 * the generic tuning (FMHA_TUNING=generic, which ctest sets: a CPU's own
 * tuning may change keys per tile), and its outputs' FNV-1a hash must be
 * the record's for that table and problem. A change to a kernel's
 * arithmetic that is meant to change bits retakes that table's lines
 * (FMHA_BITS_RECORD, below), and its commit says why. The record's avx512_12x32 and
 * avx512_14x32 lines, taken when those float32 tile shapes were tables of
 * their own (avx512's parts with the tall tile), hold the avx512 table run
 * under the generic tuning with tile_mr x tile_nr that shape: each other
 * shape avx512's tile part lists runs so, as "avx512_<MR>x<NR>". A table
 * the record lacks (one this CPU runs that the recording CPU did not) is
 * reported, not failed. FMHA_BITS_RECORD=path writes the record instead. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/convert.h"
#include "config/cpu.h"
#include "core/attn.h"
#include "test_util.h"

typedef struct bits_problem {
    const char *name;
    int64_t B, hq, hkv, sq, skv, d;
    fmha_dtype dtype;
    fmha_kv_format kv_format; /* 0: dtype */
    fmha_precision precision;
    fmha_strategy strategy;
    fmha_causal causal;
    int backward;
} bits_problem;

static const bits_problem problems[] = {
    {"f32_causal_tiled", 1, 4, 2, 77, 93, 64, FMHA_DTYPE_F32, 0, FMHA_PRECISION_FAST, FMHA_STRATEGY_TILED,
     FMHA_CAUSAL_BOTTOM_RIGHT, 1},
    {"f32_dense", 2, 2, 1, 40, 50, 32, FMHA_DTYPE_F32, 0, FMHA_PRECISION_FAST, FMHA_STRATEGY_AUTO, FMHA_CAUSAL_NONE, 1},
    {"bf16_matrix", 1, 2, 2, 96, 160, 64, FMHA_DTYPE_BF16, 0, FMHA_PRECISION_FAST, FMHA_STRATEGY_TILED,
     FMHA_CAUSAL_TOP_LEFT, 1},
    {"bf16_accurate", 1, 2, 1, 70, 130, 64, FMHA_DTYPE_BF16, 0, FMHA_PRECISION_ACCURATE, FMHA_STRATEGY_TILED,
     FMHA_CAUSAL_NONE, 1},
    {"f16", 1, 2, 1, 64, 100, 64, FMHA_DTYPE_F16, 0, FMHA_PRECISION_FAST, FMHA_STRATEGY_TILED, FMHA_CAUSAL_NONE, 1},
    {"f32_bf16x3", 1, 2, 1, 64, 128, 64, FMHA_DTYPE_F32, 0, FMHA_PRECISION_BF16X3, FMHA_STRATEGY_TILED,
     FMHA_CAUSAL_NONE, 1},
    {"f32_decode", 2, 8, 2, 1, 700, 64, FMHA_DTYPE_F32, 0, FMHA_PRECISION_FAST, FMHA_STRATEGY_AUTO,
     FMHA_CAUSAL_BOTTOM_RIGHT, 0},
    {"bf16_matrix_decode", 1, 16, 4, 4, 1000, 64, FMHA_DTYPE_BF16, 0, FMHA_PRECISION_FAST, FMHA_STRATEGY_AUTO,
     FMHA_CAUSAL_BOTTOM_RIGHT, 0},
    {"q8_0_decode_fast", 1, 8, 2, 2, 600, 64, FMHA_DTYPE_F32, FMHA_KV_FORMAT_Q8_0, FMHA_PRECISION_FAST,
     FMHA_STRATEGY_AUTO, FMHA_CAUSAL_NONE, 0},
    {"bf16_fold", 1, 96, 1, 1, 300, 64, FMHA_DTYPE_BF16, 0, FMHA_PRECISION_FAST, FMHA_STRATEGY_AUTO, FMHA_CAUSAL_NONE,
     0},
};

static uint64_t fnv(uint64_t h, const void *x, size_t n) {
    const unsigned char *c = x;
    for (size_t i = 0; i < n; i++) h = (h ^ c[i]) * 0x100000001b3ull;
    return h;
}

/* Deterministic values in [-1, 1): every table and run sees the same. */
static void fill(void *x, size_t n, fmha_dtype t, uint64_t seed) {
    for (size_t i = 0; i < n; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        fmha_store(x, t, (int64_t)i, (float)((double)(seed >> 40) / (double)(1ull << 23) - 1.0));
    }
}

/* The hash of a problem's outputs on context ctx; 0 when it failed. */
static uint64_t run_problem(const bits_problem *b, const fmha_context *ctx) {
    fmha_problem p;
    fmha_problem_init(&p, b->B, b->hq, b->hkv, b->sq, b->skv, b->d, b->d, FMHA_LAYOUT_BSHD);
    p.dtype = b->dtype;
    p.precision = b->precision;
    p.strategy = b->strategy;
    p.causal = b->causal;
    const size_t es = fmha_dtype_size(b->dtype), nq = (size_t)(b->B * b->sq * b->hq * b->d);
    const size_t nk = (size_t)(b->B * b->skv * b->hkv * b->d), nl = (size_t)(b->B * b->hq * b->sq);
    void *q = malloc(nq * es), *o = calloc(nq, es), *d_o = malloc(nq * es), *dq = calloc(nq, es);
    void *k = malloc(nk * es), *v = malloc(nk * es), *dk = calloc(nk, es), *dv = calloc(nk, es);
    float *lse = calloc(nl, sizeof(float));
    fill(q, nq, b->dtype, 1), fill(k, nk, b->dtype, 2), fill(v, nk, b->dtype, 3), fill(d_o, nq, b->dtype, 4);
    void *kq = NULL, *vq = NULL;
    if (b->kv_format) { /* K and V as the format's rows [B, Skv, Hkv, row] */
        const size_t row = fmha_kv_format_row_bytes(b->kv_format, b->d);
        float *x = malloc(nk * sizeof(float));
        fill(x, nk, FMHA_DTYPE_F32, 5);
        kq = malloc(nk / (size_t)b->d * row), vq = malloc(nk / (size_t)b->d * row);
        const int64_t xs[3] = {b->hkv * b->d, b->d, 1}, vs[3] = {b->hkv * (int64_t)row, (int64_t)row, 1};
        fmha_kv_quantize(b->kv_format, b->B * b->skv, b->hkv, b->d, x, xs, kq, vs, NULL, NULL);
        fill(x, nk, FMHA_DTYPE_F32, 6);
        fmha_kv_quantize(b->kv_format, b->B * b->skv, b->hkv, b->d, x, xs, vq, vs, NULL, NULL);
        free(x);
        p.k_format = p.v_format = b->kv_format;
        const int64_t st[4] = {b->skv * b->hkv * (int64_t)row, b->hkv * (int64_t)row, (int64_t)row, 1};
        memcpy(p.k_strides, st, sizeof st), memcpy(p.v_strides, st, sizeof st);
    }
    uint64_t h = 0xcbf29ce484222325ull;
    fmha_status st = b->backward ? fmha_forward_backward_in(ctx, &p, q, k, v, d_o, o, lse, dq, dk, dv, NULL)
                                 : fmha_forward_in(ctx, &p, q, kq ? kq : k, vq ? vq : v, o, lse, NULL, 0);
    if (st == FMHA_OK) {
        h = fnv(h, o, nq * es), h = fnv(h, lse, nl * sizeof(float));
        if (b->backward) h = fnv(h, dq, nq * es), h = fnv(h, dk, nk * es), h = fnv(h, dv, nk * es);
    } else {
        h = 0;
    }
    free(q), free(o), free(d_o), free(dq), free(k), free(v), free(dk), free(dv), free(lse), free(kq), free(vq);
    return h;
}

int main(int argc, char **argv) {
    tu_seed();
    const char *record = getenv("FMHA_BITS_RECORD");
    /* the record beside this source file (or argv[1]) */
    char path[1024];
    snprintf(path, sizeof path, "%s", argc > 1 ? argv[1] : __FILE__);
    if (argc <= 1) {
        char *slash = strrchr(path, '/');
        snprintf(slash ? slash + 1 : path, sizeof path - (size_t)(slash ? slash + 1 - path : 0), "bits_record.txt");
    }
    FILE *out = record ? fopen(record, "w") : NULL;
    FILE *in = record ? NULL : fopen(path, "r");
    if (!tu_check(record ? out != NULL : in != NULL, "the record %s opens", record ? record : path)) return tu_finish();
    char (*lines)[128] = NULL;
    size_t n_lines = 0;
    for (char line[128]; in && fgets(line, sizeof line, in);) {
        lines = realloc(lines, (n_lines + 1) * sizeof *lines);
        snprintf(lines[n_lines++], sizeof *lines, "%s", line);
    }
    fmha_set_num_threads(2);
    size_t checked = 0, unrecorded = 0;
    /* every table this CPU runs, then avx512's other float32 tile shapes */
    const fmha_isa *avx512 = NULL;
    for (size_t ii = 0; ii < fmha_isa_count(); ii++)
        if (!strcmp(fmha_isa_at(ii)->name, "avx512") && fmha_isa_supported(fmha_isa_at(ii))) avx512 = fmha_isa_at(ii);
    static fmha_trial trial;
    for (size_t run = 0; run < fmha_isa_count() + 8; run++) { /* 8: more shapes than a tile part lists */
        char table[64];
        const fmha_context *ctx = NULL;
        if (run < fmha_isa_count()) {
            const fmha_isa *isa = fmha_isa_at(run);
            if (!tu_isa_runs(isa)) continue;
            snprintf(table, sizeof table, "%s", isa->name);
            ctx = fmha_cpu_context_for(isa->name);
        } else {
            const size_t shape = run - fmha_isa_count() + 1;
            const fmha_uk_tile *t = avx512 ? fmha_cpu_f32_tile_at(avx512->table, shape) : NULL;
            if (!t) continue;
            snprintf(table, sizeof table, "avx512_%zux%zu", t->mr, t->nr);
            if (!tu_check(tu_isa_shape(avx512, shape, &trial) == 0, "%s: a trial on the shape", table)) continue;
            ctx = &trial.ctx;
        }
        if (!tu_check(ctx != NULL, "%s: a context", table)) continue;
        for (size_t i = 0; i < sizeof problems / sizeof problems[0]; i++) {
            char key[96], want[128];
            const uint64_t h = run_problem(&problems[i], ctx);
            snprintf(key, sizeof key, "%s %s ", table, problems[i].name);
            snprintf(want, sizeof want, "%s%016llx\n", key, (unsigned long long)h);
            if (out) {
                fputs(want, out);
                continue;
            }
            const char *found = NULL;
            for (size_t l = 0; l < n_lines && !found; l++)
                if (!strncmp(lines[l], key, strlen(key))) found = lines[l];
            if (!found) {
                unrecorded++;
                continue;
            }
            checked++;
            tu_check(!strcmp(found, want), "%s: bits %016llx, the record's %s", key, (unsigned long long)h,
                     found + strlen(key));
        }
    }
    fmha_set_num_threads(0);
    if (out) fclose(out);
    if (in) fclose(in);
    free(lines);
    printf("%zu outputs held to the record, %zu of tables it lacks\n", checked, unrecorded);
    /* the record holds x86-64's tables (it was taken on one); elsewhere
     * the tables it lacks are reported above, not failed */
    if (!record && FMHA_HAVE_X86) tu_check(checked > 0, "the record holds this CPU's tables");
    return tu_finish();
}
