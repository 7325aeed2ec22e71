/* test_nan_paths.c: fmha.h's NaN rule on the paths that split the keys or
 * take integer scores, as users met it: on every table this CPU runs
 * (amx_emu included), at 1 and 2 threads, with the same bits at both.
 *   matrix_decode (bf16, 2 queries x 32 heads on 8 kv heads, 4096 keys):
 *     a NaN query makes its row's O and lse NaN; a NaN key inside a
 *     2-key window (key 1024 of kv head 7, lengths 1025) makes the rows of
 *     that kv head NaN; MLA's shape (128 heads on one kv head, D 576 / Dv
 *     512) loses no NaN query either;
 *   a q8_0 or q4_0 K whose block d is +inf at key 100 of kv head 3: every
 *     row of that kv head NaN (the key's values are inf x q, NaN where q is
 *     0) and every other row finite, under ACCURATE and FAST, auto and
 *     tiled alike.
 *   split inputs (float16; float32 at BF16X3) with an infinity in Q or K on
 *     the tiled strategy: the float64 reference's NaN and inf pattern and
 *     values (test_split_inf);
 *   a NaN in V at a key every row sees whose P underflows to 0: that column
 *     NaN in every row, on every strategy (test_underflow_nan_value).
 * fmha_merge's underflowing weights are test_merge's. FMHA_TEST_QUICK
 * (the emulated runs) takes fewer keys: 1536, 1024 and 1024, still split. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/cpu.h"
#include "runtime/convert.h"
#include "fmha_ref_masks.h"
#include "test_util.h"

static uint64_t lcg = 1;
static float uniform(void) {
    lcg = lcg * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(lcg >> 40) / (double)(1ull << 23) - 1.0);
}

/* n bf16 values uniform in [-1, 1) */
static uint16_t *bf16_uniform(size_t n) {
    uint16_t *x = malloc(n * sizeof(uint16_t));
    for (size_t i = 0; i < n; i++) x[i] = fmha_f32_to_bf16(uniform());
    return x;
}

/* The forward of p at 1 and 2 threads: the same bits (checked), O as float32
 * [B, Sq, Hq, Dv] into o and lse [B, Hq, Sq] into lse. */
static int run_both(const char *what, const fmha_problem *p, const void *q, const void *k, const void *v, float *o,
                    float *lse) {
    const size_t no = (size_t)(p->batch * p->seq_q * p->heads_q * p->head_dim_v), nl = (size_t)(p->batch * p->heads_q * p->seq_q);
    const size_t es = fmha_dtype_size(p->dtype);
    void *ob[2] = {malloc(no * es), malloc(no * es)};
    float *lb[2] = {malloc(nl * sizeof(float)), malloc(nl * sizeof(float))};
    int ok = 1;
    for (int t = 0; t < 2; t++) {
        fmha_set_num_threads(t + 1);
        ok &= tu_check(fmha_forward(p, q, k, v, ob[t], lb[t], NULL, 0) == FMHA_OK, "%s: status (%s)", what,
                       fmha_last_error_message());
    }
    fmha_set_num_threads(0);
    ok &= tu_check(!memcmp(ob[0], ob[1], no * es) && !memcmp(lb[0], lb[1], nl * sizeof(float)),
                   "%s: 1 and 2 threads give the same bits", what);
    for (size_t i = 0; i < no; i++) o[i] = fmha_load(ob[0], p->dtype, (int64_t)i);
    memcpy(lse, lb[0], nl * sizeof(float));
    free(ob[0]), free(ob[1]), free(lb[0]), free(lb[1]);
    return ok;
}

/* Row (b, i, h) all NaN (O and lse) when want_nan, else all finite. */
static int row_is(const fmha_problem *p, const float *o, const float *lse, int64_t b, int64_t i, int64_t h,
                  int want_nan) {
    const float *r = o + ((b * p->seq_q + i) * p->heads_q + h) * p->head_dim_v;
    const float l = lse[(b * p->heads_q + h) * p->seq_q + i];
    int all_nan = isnan(l), all_finite = isfinite(l);
    for (int64_t e = 0; e < p->head_dim_v; e++) all_nan &= isnan(r[e]) != 0, all_finite &= isfinite(r[e]) != 0;
    return want_nan ? all_nan : all_finite;
}

static void test_matrix_decode(const char *isa) {
    fmha_problem p;
    const int64_t S = tu_quick_pick(4096, 1536); /* chunks of 256 keys or more: split either way */
    fmha_problem_init(&p, 1, 32, 8, 2, S, 128, 128, FMHA_LAYOUT_BSHD);
    p.dtype = FMHA_DTYPE_BF16;
    const size_t nq = 2 * 32 * 128, nk = (size_t)S * 8 * 128;
    uint16_t *q = bf16_uniform(nq), *k = bf16_uniform(nk), *v = bf16_uniform(nk);
    float *o = malloc(nq * sizeof(float)), *lse = malloc(64 * sizeof(float));
    char what[160];
    /* a NaN in query 1 of head 31 */
    q[(1 * 32 + 31) * 128 + 5] = fmha_f32_to_bf16(NAN);
    snprintf(what, sizeof what, "%s: matrix_decode, a NaN query", isa);
    if (run_both(what, &p, q, k, v, o, lse)) {
        int ok = row_is(&p, o, lse, 0, 1, 31, 1);
        for (int64_t i = 0; i < 2; i++)
            for (int64_t h = 0; h < 32; h++)
                if (i != 1 || h != 31) ok &= row_is(&p, o, lse, 0, i, h, 0);
        tu_check(ok, "%s: the NaN query's row NaN, every other finite", what);
    }
    q[(1 * 32 + 31) * 128 + 5] = fmha_f32_to_bf16(0.5f);
    /* a NaN in key 1024 of kv head 7, the rows seeing keys 1023 and 1024 */
    k[((int64_t)1024 * 8 + 7) * 128 + 3] = fmha_f32_to_bf16(NAN);
    int32_t len[1] = {1025};
    p.causal = FMHA_CAUSAL_BOTTOM_RIGHT;
    p.masks.window_left = 1;
    p.masks.window_right = 0;
    p.masks.kv_lengths = len;
    snprintf(what, sizeof what, "%s: matrix_decode, a NaN key in a 2-key window", isa);
    if (run_both(what, &p, q, k, v, o, lse)) {
        int ok = 1;
        for (int64_t h = 0; h < 32; h++) /* query 1 sees keys 1023, 1024; query 0 keys 1022, 1023 */
            ok &= row_is(&p, o, lse, 0, 1, h, h / 4 == 7) && row_is(&p, o, lse, 0, 0, h, 0);
        tu_check(ok, "%s: kv head 7's rows that see the key NaN, every other finite", what);
    }
    free(q), free(k), free(v), free(o), free(lse);
}

static void test_mla(const char *isa) {
    fmha_problem p;
    const int64_t S = tu_quick_pick(2048, 1024);
    fmha_problem_init(&p, 1, 128, 1, 1, S, 576, 512, FMHA_LAYOUT_BSHD);
    p.dtype = FMHA_DTYPE_BF16;
    uint16_t *q = bf16_uniform(128 * 576), *k = bf16_uniform((size_t)S * 576), *v = bf16_uniform((size_t)S * 512);
    float *o = malloc(128 * 512 * sizeof(float)), *lse = malloc(128 * sizeof(float));
    q[5 * 576 + 7] = fmha_f32_to_bf16(NAN);
    char what[160];
    snprintf(what, sizeof what, "%s: MLA shape, a NaN query", isa);
    if (run_both(what, &p, q, k, v, o, lse)) {
        int ok = 1;
        for (int64_t h = 0; h < 128; h++) ok &= row_is(&p, o, lse, 0, 0, h, h == 5);
        tu_check(ok, "%s: head 5's row NaN, every other finite", what);
    }
    free(q), free(k), free(v), free(o), free(lse);
}

static void test_block_scale(const char *isa) {
    static const fmha_kv_format formats[] = {FMHA_KV_FORMAT_Q8_0, FMHA_KV_FORMAT_Q4_0};
    const int64_t S = tu_quick_pick(4096, 1024), H = 8, D = 128;
    float *x = malloc((size_t)(S * H * D) * sizeof(float)), *vf = malloc((size_t)(S * H * D) * sizeof(float));
    float *q = malloc(32 * 128 * sizeof(float)), *o = malloc(32 * 128 * sizeof(float)), *lse = malloc(32 * sizeof(float));
    for (int64_t i = 0; i < S * H * D; i++) x[i] = uniform(), vf[i] = uniform();
    for (int64_t i = 0; i < 32 * 128; i++) q[i] = uniform();
    x[((int64_t)100 * H + 3) * D] = 0.0f; /* a zero in the block whose d turns inf: inf x 0 */
    for (size_t f = 0; f < 2; f++) {
        const size_t row = fmha_kv_format_row_bytes(formats[f], D);
        uint8_t *kc = malloc((size_t)(S * H) * row);
        const int64_t xs[3] = {H * D, D, 1}, cs[3] = {H * (int64_t)row, (int64_t)row, 1};
        fmha_kv_quantize(formats[f], S, H, D, x, xs, kc, cs, NULL, NULL);
        const uint16_t inf = fmha_f32_to_f16(INFINITY);
        memcpy(kc + ((size_t)100 * H + 3) * row, &inf, 2);
        for (int prec = 0; prec < 2; prec++)
            for (int strat = 0; strat < 2; strat++) {
                fmha_problem p;
                fmha_problem_init(&p, 1, 32, 8, 1, S, D, D, FMHA_LAYOUT_BSHD);
                p.k_format = formats[f];
                p.k_strides[0] = S * H * (int64_t)row, p.k_strides[1] = H * (int64_t)row, p.k_strides[2] = (int64_t)row;
                p.k_strides[3] = 1;
                p.precision = prec ? FMHA_PRECISION_FAST : FMHA_PRECISION_ACCURATE;
                p.strategy = strat ? FMHA_STRATEGY_TILED : FMHA_STRATEGY_AUTO;
                char what[160];
                snprintf(what, sizeof what, "%s: %s K, d +inf, %s %s", isa, f ? "q4_0" : "q8_0",
                         prec ? "fast" : "accurate", strat ? "tiled" : "auto");
                if (!run_both(what, &p, q, kc, vf, o, lse)) continue;
                int ok = 1;
                for (int64_t h = 0; h < 32; h++) ok &= row_is(&p, o, lse, 0, 0, h, h / 4 == 3);
                tu_check(ok, "%s: kv head 3's rows NaN, every other finite", what);
            }
        free(kc);
    }
    free(x), free(vf), free(q), free(o), free(lse);
}

/* Split inputs (float16, float32 at BF16X3: hi + lo on the tiles) with one
 * infinity in Q or K, causal top-left, S 64, D 32, on the tiled strategy:
 * the reference's pattern and values (an inf's residual is NaN on the
 * tiles, so such rows are recomputed in float32). The infinity at element
 * 0 of query 0 of head 1 (K's element 0 is 0.5 there: a score of +-inf
 * that row's only key makes NaN or hides), or of key 5 (Q's element 0 is
 * 0.5 everywhere: rows from 5 on NaN for +inf, finite for -inf). */
static void test_split_inf(const char *isa) {
    enum { S = 64, H = 2, D = 32 };
    const size_t n = (size_t)S * H * D;
    float *q = malloc(n * sizeof(float)), *k = malloc(n * sizeof(float)), *v = malloc(n * sizeof(float));
    float *o = malloc(n * sizeof(float)), *lse = malloc(H * S * sizeof(float));
    double *ro = malloc(n * sizeof(double)), *rl = malloc(H * S * sizeof(double));
    void *qt = malloc(n * 4), *kt = malloc(n * 4), *vt = malloc(n * 4);
    for (int dt = 0; dt < 2; dt++)
        for (int where = 0; where < 4; where++) { /* Q -inf, Q +inf, K +inf, K -inf */
            for (size_t i = 0; i < n; i++) q[i] = uniform(), k[i] = uniform(), v[i] = uniform();
            for (size_t j = 0; j < (size_t)S * H; j++) q[j * D] = 0.5f;
            k[0] = 0.5f;
            const float inf = where == 1 || where == 2 ? INFINITY : -INFINITY;
            if (where < 2) q[1 * D] = inf; /* query 0, head 1 */
            else k[5 * D] = inf;           /* key 5 of the one kv head */
            fmha_problem p;
            fmha_problem_init(&p, 1, H, 1, S, S, D, D, FMHA_LAYOUT_BSHD);
            p.causal = FMHA_CAUSAL_TOP_LEFT;
            p.strategy = FMHA_STRATEGY_TILED;
            p.dtype = dt ? FMHA_DTYPE_F32 : FMHA_DTYPE_F16;
            p.precision = dt ? FMHA_PRECISION_BF16X3 : FMHA_PRECISION_ACCURATE;
            for (size_t i = 0; i < n; i++) { /* the values each dtype holds */
                fmha_store(qt, p.dtype, (int64_t)i, q[i]), q[i] = fmha_load(qt, p.dtype, (int64_t)i);
                fmha_store(kt, p.dtype, (int64_t)i, k[i]), k[i] = fmha_load(kt, p.dtype, (int64_t)i);
                fmha_store(vt, p.dtype, (int64_t)i, v[i]), v[i] = fmha_load(vt, p.dtype, (int64_t)i);
            }
            char what[160];
            snprintf(what, sizeof what, "%s: %s split inputs, %cinf in %c", isa, dt ? "f32 bf16x3" : "f16",
                     inf > 0 ? '+' : '-', where < 2 ? 'Q' : 'K');
            if (!run_both(what, &p, qt, kt, vt, o, lse)) continue;
            if (fmha_ref_forward_full(&p, q, k, v, ro, rl) != 0) abort();
            const double tol = dt ? 1e-4 : 2e-3; /* O stored in float16: 2^-11 relative */
            int ok = 1;
            for (size_t i = 0; i < n; i++)
                ok &= isnan(ro[i]) ? isnan(o[i]) != 0 : fabs(o[i] - ro[i]) <= tol * (1 + fabs(ro[i]));
            for (size_t i = 0; i < (size_t)(H * S); i++)
                ok &= isnan(rl[i])   ? isnan(lse[i]) != 0
                      : isinf(rl[i]) ? lse[i] == rl[i]
                                     : fabs(lse[i] - rl[i]) <= 1e-4 * (1 + fabs(rl[i]));
            tu_check(ok, "%s: the reference's NaN and inf pattern and values", what);
        }
    free(q), free(k), free(v), free(o), free(lse), free(ro), free(rl), free(qt), free(kt), free(vt);
}

/* A NaN in V at a key every row sees but whose P underflows to 0 (its
 * score 320 below key 0's): 0 x NaN makes column 3 of every row NaN, the
 * other columns and lse finite, on every strategy, float32 and bf16, a
 * decode shape (Sq 1) and a prefill one (Sq 40). */
static void test_underflow_nan_value(const char *isa) {
    enum { S = 64, H = 2, D = 32 };
    for (int dt = 0; dt < 2; dt++)
        for (int64_t sq = 1; sq <= 40; sq += 39)
            for (int strat = 0; strat < 4; strat++) {
                fmha_problem p;
                fmha_problem_init(&p, 1, H, 1, sq, S, D, D, FMHA_LAYOUT_BSHD);
                p.dtype = dt ? FMHA_DTYPE_BF16 : FMHA_DTYPE_F32;
                p.scale = 1.0f;
                p.strategy = (fmha_strategy)strat;
                const size_t nq = (size_t)(sq * H * D), nk = (size_t)S * D;
                float *q = malloc(nq * 4), *k = malloc(nk * 4), *v = malloc(nk * 4);
                for (size_t i = 0; i < nq; i++) q[i] = 1.0f;
                for (size_t i = 0; i < nk; i++) k[i] = 0.0f, v[i] = uniform();
                for (int e = 0; e < D; e++) k[e] = 10.0f; /* key 0: score 320, every other 0 */
                v[5 * D + 3] = NAN;
                void *qt = malloc(nq * 4), *kt = malloc(nk * 4), *vt = malloc(nk * 4);
                for (size_t i = 0; i < nq; i++) fmha_store(qt, p.dtype, (int64_t)i, q[i]);
                for (size_t i = 0; i < nk; i++) fmha_store(kt, p.dtype, (int64_t)i, k[i]), fmha_store(vt, p.dtype, (int64_t)i, v[i]);
                float *o = malloc(nq * 4), *lse = malloc((size_t)(H * sq) * 4);
                char what[160];
                snprintf(what, sizeof what, "%s: %s Sq %lld %s, a NaN in V where P underflows", isa, dt ? "bf16" : "f32",
                         (long long)sq, tu_strategy_name(strat));
                if (run_both(what, &p, qt, kt, vt, o, lse)) {
                    int ok = 1;
                    for (size_t r = 0; r < (size_t)(sq * H); r++) {
                        for (int e = 0; e < D; e++) ok &= e == 3 ? isnan(o[r * D + e]) != 0 : isfinite(o[r * D + e]) != 0;
                        ok &= isfinite(lse[r]) != 0;
                    }
                    tu_check(ok, "%s: column 3 NaN in every row, the rest and lse finite", what);
                }
                free(q), free(k), free(v), free(qt), free(kt), free(vt), free(o), free(lse);
            }
}

static void each_table(const char *isa) {
    test_split_inf(isa);
    test_underflow_nan_value(isa);
    test_matrix_decode(isa);
    test_mla(isa);
    test_block_scale(isa);
}

int main(void) {
    tu_seed();
    tu_isa_variants = 1; /* the integer scores' tables too (avx512vnni beside avx512) */
    tu_each_isa(each_table);
    return tu_finish();
}
