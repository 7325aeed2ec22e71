/* test_dropout.c: dropout on the attention weights (fmha_problem.dropout_p).
 *   kernels     every ISA's dropout kernel against the scalar specification,
 *               bit for bit (NaN inputs included), and against
 *               fmha_dropout_keep
 *   reference   forward O and lse, backward dQ, dK, dV against the float64
 *               reference with the same mask: p 0.1 / 0.5 / 0.9, causal,
 *               lengths, GQA, every ISA and strategy, float32 and bf16
 *   repeatable  the same seed gives the same bits for 1 and 3 threads and in
 *               the fused call; another seed or offset another mask
 *   statistics  the kept fraction is 1 - p, and O averaged over seeds is the
 *               O without dropout, within 5 standard errors
 *   errors      p outside [0, 1) or NaN, and dropout on a paged cache. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/attn.h"
#include "runtime/convert.h"
#include "config/cpu.h"
#include "fmha_ref_masks.h"
#include "test_util.h"


static void test_kernels(void) {
    for (size_t ii = 0; ii < fmha_isa_count(); ii++) {
        const fmha_ukernels *uk = fmha_cpu_kernels_for(fmha_isa_at(ii)->name);
        if (!uk) continue;
        for (int c = 0; c < 20; c++) {
            size_t rows = (size_t)tu_int(1, 70), lanes = uk->tile.nr, lds = lanes + (size_t)tu_int(0, 5);
            uint64_t counter[FMHA_MAX_NR], mix = tu_next(), thr = tu_next() >> 32;
            for (size_t i = 0; i < lanes; i++) counter[i] = tu_next();
            float *a = malloc(rows * lds * sizeof(float)), *b = malloc(rows * lds * sizeof(float));
            tu_fill(a, rows * lds, -2, 2);
            a[0] = NAN;
            memcpy(b, a, rows * lds * sizeof(float));
            uk->rows.dropout(rows, lanes, a, lds, counter, mix, thr, 1.75f);
            fmha_f32_dropout_ukernel__scalar(rows, lanes, b, lds, counter, mix, thr, 1.75f);
            tu_check(!memcmp(a, b, rows * lds * sizeof(float)), "dropout kernel %s rows %zu: the scalar bits",
                     uk->isa, rows);
            free(a), free(b);
        }
    }
    /* the scalar kernel keeps what fmha_dropout_keep keeps */
    fmha_problem p;
    fmha_problem_init(&p, 2, 3, 3, 5, 40, 8, 8, FMHA_LAYOUT_BSHD);
    p.dropout_p = 0.3f;
    p.dropout_seed = 12345;
    p.dropout_offset = 777;
    fmha_plan *plan = NULL;
    int ok = fmha_plan_create(&p, &plan) == FMHA_OK, same = 1;
    for (int64_t b = 0; ok && b < 2; b++)
        for (int64_t h = 0; h < 3; h++) {
            float ones[40 * FMHA_MAX_NR];
            size_t nr = plan->uk->tile.nr;
            for (size_t x = 0; x < 40 * nr; x++) ones[x] = 1.0f;
            fmha_tile_pos t = {b, h, 0, 5, 0, 40};
            fmha_dropout_tile(plan, &t, ones, nr);
            for (int64_t i = 0; i < 5; i++)
                for (int64_t j = 0; j < 40; j++)
                    same &= (ones[(size_t)j * nr + (size_t)i] != 0.0f) == fmha_dropout_keep(&p, b, h, i, j);
        }
    tu_check(ok && same, "the dropout tile keeps what fmha_dropout_keep keeps");
    fmha_plan_destroy(plan);
}

/* ---- against the reference ---- */

typedef struct drop_case {
    int64_t B, hq, hkv, sq, skv, D;
    float p;
    fmha_causal causal;
    int lengths;
    fmha_dtype dtype;
} drop_case;

static void run_case(const drop_case *dc) {
    fmha_problem p;
    fmha_problem_init(&p, dc->B, dc->hq, dc->hkv, dc->sq, dc->skv, dc->D, dc->D, FMHA_LAYOUT_BSHD);
    p.dtype = dc->dtype;
    p.causal = dc->causal;
    p.dropout_p = dc->p;
    p.dropout_seed = tu_next();
    p.dropout_offset = tu_next() >> 8;
    int32_t kv_len[2] = {(int32_t)dc->skv, (int32_t)(dc->skv / 2)};
    if (dc->lengths) p.masks.kv_lengths = kv_len;
    size_t nq = (size_t)(dc->B * dc->sq * dc->hq * dc->D), nk = (size_t)(dc->B * dc->skv * dc->hkv * dc->D);
    size_t nl = (size_t)(dc->B * dc->hq * dc->sq), es = fmha_dtype_size(dc->dtype);
    /* inputs in the dtype, and their float values for the reference */
    float *qf = malloc(nq * sizeof(float)), *kf = malloc(nk * sizeof(float)), *vf = malloc(nk * sizeof(float));
    float *dof = malloc(nq * sizeof(float));
    void *q = malloc(nq * es), *k = malloc(nk * es), *v = malloc(nk * es), *d_o = malloc(nq * es);
    struct { float *f; void *t; size_t n; } in[4] = {{qf, q, nq}, {kf, k, nk}, {vf, v, nk}, {dof, d_o, nq}};
    for (int x = 0; x < 4; x++)
        for (size_t i = 0; i < in[x].n; i++) {
            fmha_store(in[x].t, dc->dtype, (int64_t)i, (float)tu_uniform(-1, 1));
            in[x].f[i] = fmha_load(in[x].t, dc->dtype, (int64_t)i);
        }
    fmha_problem pf = p;
    pf.dtype = FMHA_DTYPE_F32;
    double *ro = malloc(nq * sizeof(double)), *rl = malloc(nl * sizeof(double));
    double *rdq = malloc(nq * sizeof(double)), *rdk = malloc(nk * sizeof(double)), *rdv = malloc(nk * sizeof(double));
    fmha_ref_forward_full(&pf, qf, kf, vf, ro, rl);
    fmha_ref_backward_full(&pf, qf, kf, vf, dof, rdq, rdk, rdv, NULL, NULL, NULL);
    void *o = malloc(nq * es), *dq = malloc(nq * es), *dk = malloc(nk * es), *dv = malloc(nk * es);
    float *lse = malloc(nl * sizeof(float)), *got = malloc((nq > nk ? nq : nk) * sizeof(float));
    int f32 = dc->dtype == FMHA_DTYPE_F32;
    double otol = f32 ? 2e-5 : 1e-2, gtol = f32 ? 1e-4 : 5e-2;
    static const fmha_strategy strategies[] = {FMHA_STRATEGY_AUTO, FMHA_STRATEGY_TILED, FMHA_STRATEGY_DENSE,
                                               FMHA_STRATEGY_PORTABLE};
    for (int si = 0; si < 4; si++) {
        p.strategy = strategies[si];
        fmha_status st = tu_forward_backward(&p, q, k, v, d_o, o, lse, dq, dk, dv, NULL);
        double worst[4];
        struct { void *x; const double *r; size_t n; double tol; } out[4] = {
            {o, ro, nq, otol}, {dq, rdq, nq, gtol}, {dk, rdk, nk, gtol}, {dv, rdv, nk, gtol}};
        int ok = st == FMHA_OK;
        for (int x = 0; x < 4; x++) {
            for (size_t i = 0; i < out[x].n; i++) got[i] = fmha_load(out[x].x, dc->dtype, (int64_t)i);
            worst[x] = tu_worst_ratio(got, out[x].r, out[x].n, out[x].tol, out[x].tol);
            ok &= worst[x] <= 1.0;
        }
        for (size_t i = 0; i < nl; i++)
            ok &= rl[i] == -INFINITY ? lse[i] == -INFINITY : fabs(lse[i] - rl[i]) <= 1e-5 * (1 + fabs(rl[i]));
        tu_check(ok, "dropout %g %s %s Sq %lld Skv %lld Hq %lld/%lld %s%s: status %d, O %.3g dQ %.3g dK %.3g dV %.3g",
                 (double)dc->p, f32 ? "f32" : "bf16", fmha_isa_name(), (long long)dc->sq, (long long)dc->skv,
                 (long long)dc->hq, (long long)dc->hkv, tu_causal_name(dc->causal), dc->lengths ? " lengths" : "",
                 (int)st, worst[0], worst[1], worst[2], worst[3]);
        (void)tu_strategy_name(si);
    }
    free(qf), free(kf), free(vf), free(dof), free(q), free(k), free(v), free(d_o), free(ro), free(rl);
    free(rdq), free(rdk), free(rdv), free(o), free(dq), free(dk), free(dv), free(lse), free(got);
}

static void test_reference(void) {
    const char *isa_default = fmha_isa_name();
    for (size_t ii = 0; ii < fmha_isa_count(); ii++) {
        if (!tu_isa_runs(fmha_isa_at(ii)) || fmha_cpu_force_isa(fmha_isa_at(ii)->name) != 0) continue;
        static const float ps[] = {0.1f, 0.5f, 0.9f};
        for (int pi = 0; pi < 3; pi++) {
            drop_case dc = {2, 4, 2, 37, 53, 16, ps[pi], FMHA_CAUSAL_NONE, 0, FMHA_DTYPE_F32};
            run_case(&dc);
            dc = (drop_case){2, 2, 2, 70, 70, 24, ps[pi], FMHA_CAUSAL_TOP_LEFT, 1, FMHA_DTYPE_F32};
            run_case(&dc);
        }
        drop_case dc = {1, 4, 1, 65, 130, 32, 0.25f, FMHA_CAUSAL_BOTTOM_RIGHT, 0, FMHA_DTYPE_BF16};
        run_case(&dc);
    }
    fmha_cpu_force_isa(isa_default);
}

/* ---- repeatable, and the statistics of the mask ---- */

static void test_repeatable(void) {
    fmha_problem p;
    const int64_t B = 1, H = 4, S = 150, D = 32;
    fmha_problem_init(&p, B, H, H, S, S, D, D, FMHA_LAYOUT_BSHD);
    p.dropout_p = 0.2f;
    p.dropout_seed = 99;
    size_t n = (size_t)(B * S * H * D), nl = (size_t)(B * H * S);
    float *q = malloc(n * 4), *k = malloc(n * 4), *v = malloc(n * 4), *d_o = malloc(n * 4);
    tu_fill(q, n, -1, 1), tu_fill(k, n, -1, 1), tu_fill(v, n, -1, 1), tu_fill(d_o, n, -1, 1);
    float *o1 = malloc(n * 4), *o3 = malloc(n * 4), *o_other = malloc(n * 4), *lse = malloc(nl * 4);
    float *g1 = malloc(3 * n * 4), *g3 = malloc(3 * n * 4), *o_fused = malloc(n * 4);
    int threads = fmha_get_num_threads();
    fmha_set_num_threads(1);
    int ok = fmha_forward(&p, q, k, v, o1, lse, NULL, 0) == FMHA_OK &&
             fmha_backward(&p, q, k, v, o1, d_o, lse, g1, g1 + n, g1 + 2 * n, NULL, NULL, 0) == FMHA_OK;
    fmha_set_num_threads(3);
    ok &= fmha_forward(&p, q, k, v, o3, lse, NULL, 0) == FMHA_OK &&
          fmha_backward(&p, q, k, v, o3, d_o, lse, g3, g3 + n, g3 + 2 * n, NULL, NULL, 0) == FMHA_OK &&
          fmha_forward_backward(&p, q, k, v, d_o, o_fused, lse, g3, g3 + n, g3 + 2 * n, NULL) == FMHA_OK;
    fmha_set_num_threads(threads);
    tu_check(ok && !memcmp(o1, o3, n * 4) && !memcmp(g1, g3, 3 * n * 4) && !memcmp(o1, o_fused, n * 4),
             "dropout: the same bits for 1 and 3 threads and in the fused call");
    fmha_problem other = p;
    other.dropout_seed = 100;
    fmha_forward(&other, q, k, v, o_other, NULL, NULL, 0);
    tu_check(memcmp(o1, o_other, n * 4) != 0, "dropout: another seed, another result");
    other = p;
    other.dropout_offset = (uint64_t)(B * H * S * S);
    fmha_forward(&other, q, k, v, o_other, NULL, NULL, 0);
    tu_check(memcmp(o1, o_other, n * 4) != 0, "dropout: another offset, another result");

    /* kept fraction over every score of 200 problems' worth of indices */
    double kept = 0.0, total = 0.0;
    for (int64_t h = 0; h < H; h++)
        for (int64_t i = 0; i < S; i++)
            for (int64_t j = 0; j < S; j++) {
                kept += fmha_dropout_keep(&p, 0, h, i, j);
                total += 1.0;
            }
    double frac = kept / total, sd = sqrt(0.2 * 0.8 / total);
    tu_check(fabs(frac - 0.8) <= 5 * sd, "dropout: kept fraction %.4f for p 0.2 (5 sd %.4f)", frac, 5 * sd);

    /* E[O] over seeds is O without dropout: mean of 300 seeds within 5 standard errors */
    const int seeds = 300;
    double *sum = calloc(n, sizeof(double)), *sum2 = calloc(n, sizeof(double));
    fmha_problem none = p;
    none.dropout_p = 0.0f;
    fmha_forward(&none, q, k, v, o_other, NULL, NULL, 0);
    for (int s = 0; s < seeds; s++) {
        other = p;
        other.dropout_seed = (uint64_t)s * 7919u + 1u;
        fmha_forward(&other, q, k, v, o1, NULL, NULL, 0);
        for (size_t i = 0; i < n; i++) {
            sum[i] += o1[i];
            sum2[i] += (double)o1[i] * o1[i];
        }
    }
    size_t outside = 0;
    for (size_t i = 0; i < n; i++) {
        double mean = sum[i] / seeds, var = sum2[i] / seeds - mean * mean;
        double se = sqrt(var > 0 ? var / seeds : 0) + 1e-7;
        outside += fabs(mean - o_other[i]) > 5 * se;
    }
    tu_check(outside <= n / 1000, "dropout: mean O over %d seeds is O without dropout (%zu of %zu outside 5 se)",
             seeds, outside, n);
    free(q), free(k), free(v), free(d_o), free(o1), free(o3), free(o_other), free(lse), free(g1), free(g3);
    free(o_fused), free(sum), free(sum2);
}

static void test_errors(void) {
    fmha_problem p;
    fmha_problem_init(&p, 1, 2, 2, 8, 8, 8, 8, FMHA_LAYOUT_BSHD);
    float q[128], o[128];
    tu_fill(q, 128, -1, 1);
    static const float bad[] = {1.0f, 1.5f, -0.1f, NAN, INFINITY};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        p.dropout_p = bad[i];
        for (int x = 0; x < 128; x++) o[x] = 7.0f;
        tu_check(fmha_forward(&p, q, q, q, o, NULL, NULL, 0) == FMHA_ERR_BAD_OPTION && tu_count_not(o, 128, 7.0f) == 0,
                 "dropout_p %g is FMHA_ERR_BAD_OPTION, nothing written", (double)bad[i]);
    }
    /* a paged cache has no dropout */
    int32_t table[2] = {0, 1};
    p.dropout_p = 0.5f;
    p.seq_q = 1;
    p.block_table = table;
    p.block_table_stride = 2;
    p.page_size = 4;
    p.num_pages = 2;
    tu_check(fmha_forward(&p, q, q, q, o, NULL, NULL, 0) == FMHA_ERR_UNSUPPORTED,
             "dropout on a paged cache is FMHA_ERR_UNSUPPORTED");
    tu_check(fmha_dropout_keep(NULL, 0, 0, 0, 0) == 1, "fmha_dropout_keep(NULL) keeps");
}

int main(void) {
    tu_seed();
    test_kernels();
    test_reference();
    test_repeatable();
    test_errors();
    return tu_finish();
}
