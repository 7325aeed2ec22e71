/* test_tuning.c: tunings per microarchitecture (src/config/tuning.h) and the
 * FMHA_TUNING override. ctest runs this program six times: without
 * FMHA_TUNING; with small tiles, K copied, no dense crossover, the decode
 * driver's prefetch on any size, one sub-block ahead, and small decode splits (block_kv=32,
 * k_copy_bytes=1,dense_max_scores=1,decode_prefetch_bytes=1,
 * decode_prefetch_f32_bytes=1,decode_prefetch_h16_bytes=1,decode_split_keys=128,
 * decode_split_keys_16rows=128,decode_prefetch_ahead_bytes=0); with large tiles on the 14 x 32 float32 tile
 * (block_kv=256,tile_mr=14,tile_nr=32,k_copy_bytes=4096); on the 12 x 32
 * tile (tile_mr=12,tile_nr=32,k_copy_bytes=1); and with an invalid text
 * (block_kv=48, ignored). Every table also runs on each float32 tile shape
 * its tile part lists, under its tuning with that shape
 * (tu_each_isa_shape). Each run checks
 *   - the parser on valid and invalid texts (nothing applied on error),
 *   - that every table of the registry runs the tuning the environment
 *     asks for (or its CPU's when the text is invalid), and that
 *     fmha_plan_describe names it,
 *   - forward and backward on every ISA this CPU runs, keys spanning
 *     several tiles with causal and key-length masks, against the float64
 *     reference: O within 2e-5 + 2e-5 |ref|, lse within 1e-5 + 1e-5 |ref|,
 *     dQ, dK, dV within a relative L2 error of 2e-5 (test_backward's bar);
 *     bf16 forward and backward (FAST) within a relative L2 error of 1e-2
 *     (test_lowp's), the lse within 1e-4 + 1e-4 |ref|,
 *   - bitwise identical results for 1, 2 and 3 threads.
 * A fifth run sets the matrix driver's schedule away from the generic one
 * (matrix_block_kv=32, matrix_rescale_log2=0, matrix_overlap=0), which the
 * bf16 cases run on tables with a matrix part. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/convert.h"
#include "config/cpu.h"
#include "fmha_ref_masks.h"
#include "test_util.h"
#include "config/tuning.h"

/* The fields' table and the one check of every source (fmha_tuning_apply). */
static void test_parse(void) {
    fmha_tuning base = fmha_tuning_generic;
    base.block_kv = 128, base.dense_max_scores = 5;
    fmha_tuning t = base;
    char err[160];
    tu_check(fmha_tuning_apply("block_kv=64", &t, err, sizeof err) == 0 && t.block_kv == 64 &&
                 t.dense_max_scores == 5,
             "apply block_kv=64");
    t = base;
    tu_check(fmha_tuning_apply("dense_max_scores=0,block_kv=1024", &t, err, sizeof err) == 0 && t.block_kv == 1024 &&
                 t.dense_max_scores == 0,
             "apply two keys");
    t = base;
    tu_check(fmha_tuning_apply("decode_prefetch_bytes=1", &t, err, sizeof err) == 0 && t.decode_prefetch_bytes == 1 &&
                 t.block_kv == 128,
             "apply decode_prefetch_bytes");
    t = base;
    tu_check(fmha_tuning_apply("decode_prefetch_f32_bytes=0", &t, err, sizeof err) == 0 &&
                 t.decode_prefetch_f32_bytes == 0 && t.decode_prefetch_bytes == base.decode_prefetch_bytes,
             "apply decode_prefetch_f32_bytes (the other formats' threshold kept)");
    t = base;
    tu_check(fmha_tuning_apply("decode_prefetch_h16_bytes=0", &t, err, sizeof err) == 0 &&
                 t.decode_prefetch_h16_bytes == 0 && t.decode_prefetch_bytes == base.decode_prefetch_bytes &&
                 t.decode_prefetch_f32_bytes == base.decode_prefetch_f32_bytes,
             "apply decode_prefetch_h16_bytes (the other thresholds kept)");
    t = base;
    tu_check(fmha_tuning_apply("matrix_block_kv=64,matrix_rescale_log2=0,matrix_overlap=0", &t, err, sizeof err) ==
                     0 &&
                 t.matrix_block_kv == 64 && t.matrix_rescale_log2 == 0 && t.matrix_overlap == 0 && t.block_kv == 128,
             "apply the matrix driver's fields");
    t = base;
    tu_check(fmha_tuning_apply("tile_mr=12,tile_nr=32,k_copy_bytes=1,decode_split_keys=256", &t, err, sizeof err) ==
                     0 &&
                 t.tile_mr == 12 && t.tile_nr == 32 && t.k_copy_bytes == 1 && t.decode_split_keys == 256 &&
                 t.block_kv == 128,
             "apply the tile shape, K's copy and decode's split");
    t = base;
    tu_check(fmha_tuning_apply("decode_split_keys_16rows=1024", &t, err, sizeof err) == 0 &&
                 t.decode_split_keys_16rows == 1024 && t.decode_split_keys == base.decode_split_keys,
             "apply decode's split of many rows (the other split kept)");
    t = base;
    tu_check(fmha_tuning_apply("decode_prefetch_ahead_bytes=4096", &t, err, sizeof err) == 0 &&
                 t.decode_prefetch_ahead_bytes == 4096 && t.decode_prefetch_bytes == base.decode_prefetch_bytes,
             "apply decode's prefetch distance (the thresholds kept)");
    t = base;
    tu_check(fmha_tuning_apply("generic", &t, err, sizeof err) == 0 && t.block_kv == FMHA_TUNING_OF_TABLE &&
                 t.dense_max_scores == fmha_tuning_generic.dense_max_scores,
             "apply generic: every field at its default");
    t = base;
    tu_check(fmha_tuning_apply("", &t, err, sizeof err) == 0 && !memcmp(&t, &base, sizeof t), "apply nothing");
    /* every field has its default in range (or the table's), and its candidates too */
    size_t n_fields;
    const fmha_tuning_field *f = fmha_tuning_fields(&n_fields);
    for (size_t j = 0; j < n_fields; j++) {
        int ok = f[j].dflt == FMHA_TUNING_OF_TABLE || (f[j].dflt >= f[j].lo && f[j].dflt <= f[j].hi &&
                                                       f[j].dflt % f[j].multiple == 0);
        for (size_t c = 0; c < f[j].n_candidates; c++)
            ok &= f[j].candidates[c] >= f[j].lo && f[j].candidates[c] <= f[j].hi &&
                  f[j].candidates[c] % f[j].multiple == 0;
        tu_check(ok && fmha_tuning_field_named(f[j].key, strlen(f[j].key)) == &f[j] &&
                     fmha_tuning_get(&fmha_tuning_generic, &f[j]) == f[j].dflt,
                 "field %s: default and candidates in range", f[j].key);
    }
    static const char *const bad[] = {"block_kv=48",  "block_kv=0",   "block_kv=2048", "block_kv=",
                                      "block_kv=6x4", "block_kv",     "blockkv=64",    "block_kv=64,",
                                      ",block_kv=64", "block_kv=-32", "dense_max_scores=1e9",
                                      "block_kv=64,mr=4", "GENERIC",  "block_kv=99999999999999999999",
                                      "decode_prefetch_bytes=-1", "decode_prefetch=1", "matrix_block_kv=48",
                                      "matrix_block_kv=544", "matrix_block_kv=0", "matrix_rescale_log2=17",
                                      "matrix_overlap=2", "matrix_overlap", "tile_nr=24", "tile_nr=80",
                                      "tile_mr=17", "tile_mr=0", "k_copy_bytes=-1", "decode_split_keys=100",
                                      "decode_split_keys=0", "decode_split_keys=2097152", "matrix_decode_rows=0",
                                      "decode_split_keys_16rows=100", "decode_split_keys_16rows=0",
                                      "decode_prefetch_ahead_bytes=-1", "decode_prefetch_ahead_bytes=67108865",
                                      "matrix_backward_split=2", "matrix_backward_split=-1",
                                      "matrix_backward_accurate=2", "matrix_backward_accurate=-1"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        t = base;
        t.block_kv = 7;
        err[0] = '\0';
        tu_check(fmha_tuning_apply(bad[i], &t, err, sizeof err) == -1 && t.block_kv == 7 && err[0],
                 "apply refuses \"%s\" and changes nothing (%s)", bad[i], err);
    }
}

/* Every table runs its CPU's tuning with FMHA_TUNING applied when valid,
 * every field resolved (the table's own where the default says so). */
static void test_registry(void) {
    const char *env = getenv("FMHA_TUNING");
    for (size_t i = 0; i < fmha_isa_count(); i++) {
        const fmha_isa *isa = fmha_isa_at(i);
        const fmha_tuning *used = isa->table->tuning;
        fmha_tuning want;
        char base_name[48], err[160];
        fmha_tuning_lookup(isa->name, &want, base_name, sizeof base_name);
        const fmha_tuning_source base_source = want.source;
        int applied = env && *env && fmha_tuning_apply(env, &want, err, sizeof err) == 0;
        if (!tu_check(used != NULL, "%s has a tuning", isa->name)) continue;
        size_t n_fields, differ = 0, unresolved = 0;
        const fmha_tuning_field *f = fmha_tuning_fields(&n_fields);
        for (size_t j = 0; j < n_fields; j++) {
            const int64_t u = fmha_tuning_get(used, &f[j]), w = fmha_tuning_get(&want, &f[j]);
            unresolved += u == FMHA_TUNING_OF_TABLE;
            differ += w != FMHA_TUNING_OF_TABLE && u != w;
        }
        char want_name[64];
        snprintf(want_name, sizeof want_name, "%s%s", !applied ? base_name : strcmp(env, "generic") ? base_name : "generic",
                 applied && strcmp(env, "generic") ? "+FMHA_TUNING" : "");
        tu_check(!strcmp(used->name, want_name) && differ == 0 && unresolved == 0 &&
                     used->source == (applied ? FMHA_TUNING_ENV : base_source),
                 "%s runs tuning %s (block_kv %lld, %zu fields differ, %zu unresolved), FMHA_TUNING %s", isa->name,
                 used->name, (long long)used->block_kv, differ, unresolved, env ? env : "unset");
        tu_check(isa->table->tile.block_kv == (size_t)used->block_kv, "%s: keys per tile %zu, the tuning's %lld",
                 isa->name, isa->table->tile.block_kv, (long long)used->block_kv);
    }
    fmha_problem p;
    fmha_problem_init(&p, 1, 2, 1, 40, 300, 32, 32, FMHA_LAYOUT_BSHD);
    p.strategy = FMHA_STRATEGY_TILED;
    fmha_plan *plan;
    if (!tu_check(fmha_plan_create(&p, &plan) == FMHA_OK, "plan_create")) return;
    char line[1024], want[96];
    fmha_plan_describe(plan, line, sizeof line);
    snprintf(want, sizeof want, " tuning=%s", fmha_cpu_kernels()->tuning->name);
    const char *at = strstr(line, want);
    tu_check(at && (at[strlen(want)] == '\0' || at[strlen(want)] == ' '), "describe names the tuning: %s", line);
    snprintf(want, sizeof want, "block_kv=%zu ", fmha_cpu_kernels()->tile.block_kv);
    tu_check(strstr(line, want) != NULL, "describe gives the tuning's keys per tile: %s", line);
    printf("%s\n", line);
    fmha_plan_destroy(plan);
}

typedef struct tuning_case {
    int64_t B, hq, hkv, sq, skv, d;
    fmha_causal causal;
    int ragged; /* key lengths [B]: ragged (0 keys in one), else none */
} tuning_case;

/* Keys across several tiles for every block_kv in 32..256. */
static const tuning_case cases[] = {
    {1, 2, 1, 70, 257, 40, FMHA_CAUSAL_BOTTOM_RIGHT, 0},
    {3, 2, 2, 33, 300, 64, FMHA_CAUSAL_NONE, 1},
    {1, 3, 1, 96, 96, 24, FMHA_CAUSAL_TOP_LEFT, 0},
    {2, 1, 1, 1, 600, 64, FMHA_CAUSAL_BOTTOM_RIGHT, 1},
};

static void float_case(const tuning_case *c, const char *isa) {
    fmha_problem p;
    fmha_problem_init(&p, c->B, c->hq, c->hkv, c->sq, c->skv, c->d, c->d, FMHA_LAYOUT_BSHD);
    p.causal = c->causal;
    int32_t kv_len[3];
    if (c->ragged) {
        tu_ragged_kv_lengths(c->B, c->skv, kv_len);
        p.masks.kv_lengths = kv_len;
    }
    const size_t nq = (size_t)(c->B * c->sq * c->hq * c->d), nk = (size_t)(c->B * c->skv * c->hkv * c->d);
    const size_t nl = (size_t)(c->B * c->hq * c->sq);
    float *q = tu_new_input(&p, 'q', -1, 1), *k = tu_new_input(&p, 'k', -1, 1), *v = tu_new_input(&p, 'v', -1, 1);
    float *d_o = tu_new_input(&p, 'o', -1, 1);
    double *ro = malloc(nq * sizeof(double)), *rl = malloc(nl * sizeof(double));
    double *rdq = malloc(nq * sizeof(double)), *rdk = malloc(nk * sizeof(double)), *rdv = malloc(nk * sizeof(double));
    fmha_ref_forward_full(&p, q, k, v, ro, rl);
    fmha_ref_backward_full(&p, q, k, v, d_o, rdq, rdk, rdv, NULL, NULL, NULL);
    float *first[6] = {0};
    for (int threads = 1; threads <= 3; threads++) {
        fmha_set_num_threads(threads);
        for (int s = FMHA_STRATEGY_AUTO; s <= FMHA_STRATEGY_TILED; s++) {
            fmha_problem ps = p;
            ps.strategy = (fmha_strategy)s;
            float *o = malloc(nq * sizeof(float)), *lse = malloc(nl * sizeof(float));
            float *dq = malloc(nq * sizeof(float)), *dk = malloc(nk * sizeof(float)), *dv = malloc(nk * sizeof(float));
            fmha_status st = tu_forward_backward(&ps, q, k, v, d_o, o, lse, dq, dk, dv, NULL);
            if (tu_check(st == FMHA_OK, "%s %s: status %d (%s)", isa, tu_strategy_name(s), (int)st,
                         fmha_last_error_message())) {
                size_t bad_lse = 0;
                for (size_t i = 0; i < nl; i++)
                    bad_lse += isinf(rl[i]) ? !(lse[i] == rl[i]) : !(fabs(lse[i] - rl[i]) <= 1e-5 + 1e-5 * fabs(rl[i]));
                tu_check(tu_worst_ratio(o, ro, nq, 2e-5, 2e-5) <= 1.0 && bad_lse == 0 &&
                             tu_rel_l2(dq, rdq, nq) <= 2e-5 && tu_rel_l2(dk, rdk, nk) <= 2e-5 &&
                             tu_rel_l2(dv, rdv, nk) <= 2e-5,
                         "%s %s threads %d Sq %lld Skv %lld D %lld: O %.3g of tol, %zu lse off, dQ %.2g dK %.2g "
                         "dV %.2g rel L2",
                         isa, tu_strategy_name(s), threads, (long long)c->sq, (long long)c->skv, (long long)c->d,
                         tu_worst_ratio(o, ro, nq, 2e-5, 2e-5), bad_lse, tu_rel_l2(dq, rdq, nq),
                         tu_rel_l2(dk, rdk, nk), tu_rel_l2(dv, rdv, nk));
            }
            float *got[3] = {o, dq, dk};
            const size_t n[3] = {nq, nq, nk};
            for (int t = 0; t < 3; t++) {
                float **keep = &first[3 * (s - FMHA_STRATEGY_AUTO) + t];
                if (!*keep) {
                    *keep = got[t];
                    got[t] = NULL;
                } else {
                    tu_check(!memcmp(*keep, got[t], n[t] * sizeof(float)),
                             "%s %s: %s at %d threads has the bits of 1 thread", isa, tu_strategy_name(s),
                             t == 0 ? "O" : t == 1 ? "dQ" : "dK", threads);
                }
            }
            free(got[0]), free(got[1]), free(got[2]), free(lse), free(dv);
        }
    }
    fmha_set_num_threads(0);
    for (int i = 0; i < 6; i++) free(first[i]);
    free(q), free(k), free(v), free(d_o), free(ro), free(rl), free(rdq), free(rdk), free(rdv);
}

/* bf16 Q, K, V and O, the default (FAST) precision, tiled. */
static void bf16_case(const tuning_case *c, const char *isa) {
    fmha_problem p;
    fmha_problem_init(&p, c->B, c->hq, c->hkv, c->sq, c->skv, c->d, c->d, FMHA_LAYOUT_BSHD);
    p.causal = c->causal;
    p.strategy = FMHA_STRATEGY_TILED;
    int32_t kv_len[3];
    if (c->ragged) {
        tu_ragged_kv_lengths(c->B, c->skv, kv_len);
        p.masks.kv_lengths = kv_len;
    }
    const size_t nq = (size_t)(c->B * c->sq * c->hq * c->d), nk = (size_t)(c->B * c->skv * c->hkv * c->d);
    const size_t nl = (size_t)(c->B * c->hq * c->sq);
    float *x[3] = {tu_new_input(&p, 'q', -1, 1), tu_new_input(&p, 'k', -1, 1), tu_new_input(&p, 'v', -1, 1)};
    uint16_t *h[3];
    for (int t = 0; t < 3; t++) {
        size_t n = t ? nk : nq;
        h[t] = malloc(n * sizeof(uint16_t));
        for (size_t i = 0; i < n; i++) {
            h[t][i] = fmha_f32_to_bf16(x[t][i]);
            x[t][i] = fmha_bf16_to_f32(h[t][i]);
        }
    }
    double *ro = malloc(nq * sizeof(double)), *rl = malloc(nl * sizeof(double));
    /* dO, and the reference gradients [B, S, H, D] */
    float *d_of = tu_new_input(&p, 'o', -1, 1);
    uint16_t *d_o = malloc(nq * sizeof(uint16_t));
    for (size_t i = 0; i < nq; i++) {
        d_o[i] = fmha_f32_to_bf16(d_of[i]);
        d_of[i] = fmha_bf16_to_f32(d_o[i]);
    }
    double *rg[3] = {malloc(nq * sizeof(double)), malloc(nk * sizeof(double)), malloc(nk * sizeof(double))};
    fmha_problem rp = p;
    rp.dtype = FMHA_DTYPE_F32;
    fmha_ref_forward_full(&rp, x[0], x[1], x[2], ro, rl);
    fmha_ref_backward_full(&rp, x[0], x[1], x[2], d_of, rg[0], rg[1], rg[2], NULL, NULL, NULL);
    p.dtype = FMHA_DTYPE_BF16;
    uint16_t *o = malloc(nq * sizeof(uint16_t)), *o1 = malloc(nq * sizeof(uint16_t));
    float *of = malloc(nq * sizeof(float)), *lse = malloc(nl * sizeof(float)), *lse1 = malloc(nl * sizeof(float));
    /* dQ, dK, dV and their bits at 1 thread */
    const size_t ng[3] = {nq, nk, nk};
    uint16_t *g[3], *g1[3];
    for (int t = 0; t < 3; t++) g[t] = malloc(ng[t] * 2), g1[t] = malloc(ng[t] * 2);
    for (int threads = 1; threads <= 3; threads++) {
        fmha_set_num_threads(threads);
        fmha_status st = tu_forward(&p, h[0], h[1], h[2], o, lse, NULL, 0);
        if (!tu_check(st == FMHA_OK, "%s bf16: status %d", isa, (int)st)) break;
        st = tu_backward(&p, h[0], h[1], h[2], o, d_o, lse, g[0], g[1], g[2], NULL, NULL, 0);
        if (!tu_check(st == FMHA_OK, "%s bf16 backward: status %d", isa, (int)st)) break;
        if (threads == 1) {
            for (size_t i = 0; i < nq; i++) of[i] = fmha_bf16_to_f32(o[i]);
            double rel = tu_rel_l2(of, ro, nq);
            size_t bad_lse = 0;
            for (size_t i = 0; i < nl; i++)
                bad_lse += isinf(rl[i]) ? !(lse[i] == rl[i]) : !(fabs(lse[i] - rl[i]) <= 1e-4 + 1e-4 * fabs(rl[i]));
            tu_check(rel <= 1e-2 && bad_lse == 0, "%s bf16 Sq %lld Skv %lld D %lld: O rel L2 %.3g, %zu lse off",
                     isa, (long long)c->sq, (long long)c->skv, (long long)c->d, rel, bad_lse);
            memcpy(o1, o, nq * sizeof(uint16_t));
            memcpy(lse1, lse, nl * sizeof(float));
            for (int t = 0; t < 3; t++) {
                float *gf = malloc(ng[t] * sizeof(float));
                for (size_t i = 0; i < ng[t]; i++) gf[i] = fmha_bf16_to_f32(g[t][i]);
                const double grel = tu_rel_l2(gf, rg[t], ng[t]);
                tu_check(grel <= 1e-2, "%s bf16 Sq %lld Skv %lld D %lld: d%c rel L2 %.3g", isa, (long long)c->sq,
                         (long long)c->skv, (long long)c->d, "QKV"[t], grel);
                memcpy(g1[t], g[t], ng[t] * 2);
                free(gf);
            }
        } else {
            tu_check(!memcmp(o, o1, nq * sizeof(uint16_t)) && !memcmp(lse, lse1, nl * sizeof(float)),
                     "%s bf16: O and lse at %d threads have the bits of 1 thread", isa, threads);
            tu_check(!memcmp(g[0], g1[0], nq * 2) && !memcmp(g[1], g1[1], nk * 2) && !memcmp(g[2], g1[2], nk * 2),
                     "%s bf16: dQ, dK, dV at %d threads have the bits of 1 thread", isa, threads);
        }
    }
    fmha_set_num_threads(0);
    for (int t = 0; t < 3; t++) free(x[t]), free(h[t]), free(rg[t]), free(g[t]), free(g1[t]);
    free(ro), free(rl), free(o), free(o1), free(of), free(lse), free(lse1), free(d_o), free(d_of);
}

static void run_isa(const char *isa) {
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        float_case(&cases[i], isa);
        if (cases[i].sq > 1) bf16_case(&cases[i], isa);
    }
}

int main(void) {
    tu_seed();
    printf("FMHA_TUNING=%s\n", getenv("FMHA_TUNING") ? getenv("FMHA_TUNING") : "(unset)");
    test_parse();
    test_registry();
    tu_each_isa_shape(run_isa);
    return tu_finish();
}
