/* test_backward.c: fmha_backward and fmha_forward_backward against the
 * float64 reference gradients, for every strategy under every instruction
 * set this CPU runs. Coverage follows test_forward.c: random shapes from the
 * printed seed (tails, Sq != Skv, GQA, MQA, D != Dv, every layout, both
 * causal alignments, default and explicit scale), decode (Sq = 1), every D of
 * interest (up to FMHA_MAX_HEAD_DIM: 320, 512, MLA's 576 / 512), one S = 600 problem, fully masked rows and never-seen keys
 * (exactly zero gradient, no NaN), and logits near the float32 limit. The
 * backward gets the library's own O and lse from fmha_forward. Also: bitwise
 * identical dQ, dK, dV for 1, 2 and 7 threads, and the backward's argument
 * errors (lse NULL, d_o NULL, dq overlapping an input).
 *
 * Tolerances, for each of dQ, dK, dV against the reference r:
 *   ||x - r|| / ||r|| <= 2e-5, and elementwise |x - r| <= atol + 1e-4 |r|,
 *   atol = max(1e-5 max|r|, 1e-6 N), N the natural size of the tensor:
 *   N = scale Dv max|dO| max|V| max|K| for dQ (max|Q| for dK), a bound of
 *   scale |dP| |K|; N = max|dO| for dV.
 *   The absolute term follows the tensor's largest entry because
 *   dS = P (dP - rowsum(dO O)) cancels: small entries carry the rounding of
 *   large ones, so their own relative error is unbounded. The floor 1e-6 N
 *   covers rows where the cancellation is total: a query that sees one key
 *   (or a one-hot softmax) has exact dS = 0, and float32 leaves the rounding
 *   of dP - rowsum(dO O), a few ulps of Dv max|dO| max|V|. When r is all zero
 *   the relative L2 check is skipped and the elementwise one decides; where
 *   such rows outweigh the rest (a key seen by a row that sees only it and
 *   by one that sees a few, whose true dK is small), ||x - r|| <= 1e-6 N
 *   passes in its place: every instruction set, the scalar one too, leaves
 *   that much there.
 *   Logits near the float32 limit (one-hot softmax, exact dQ = dK = 0): the
 *   floor for dQ and dK is 1e-4 N, still far below the size of a real error
 *   (a wrong P moves dQ by ~N); dV is held to the usual bar. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/cpu.h"
#include "fmha_ref.h"
#include "test_util.h"

#define G_REL_L2 2e-5
#define G_ATOL_MAX 1e-5 /* times max |r| */
#define G_RTOL 1e-4
#define G_FLOOR 1e-6  /* times the natural size N, see above */
#define G_ONEHOT 1e-4 /* the floor for dQ, dK with a one-hot softmax */

/* The ISAs of the registry (src/config/cpu.c), in its order; isa_ok: those this
 * CPU runs. */
#define MAX_ISA 16
static int n_isa;
static int isa_ok[MAX_ISA];
static const char *isa_name(int i) { return fmha_isa_at((size_t)i)->name; }
static const char *isa_default;
static int verbose; /* FMHA_TEST_VERBOSE=1 prints every case's worst errors */
static int case_index;

/* worst [strategy][isa][dq, dk, dv]: elementwise ratio and rel L2 */
static double worst_ratio[4][MAX_ISA][3], worst_rel[4][MAX_ISA][3];

static float sentinel(void) {
    uint32_t u = 0x7fc0beefu;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static double max_abs_tensor(const fmha_problem *p, const float *x, char which) {
    int64_t n[4];
    const int64_t *st = tu_shape(p, which, n);
    float *g = malloc(tu_numel(n) * sizeof(float));
    tu_gather(x, st, n, g);
    double m = tu_max_abs(g, tu_numel(n));
    free(g);
    return m;
}

/* Backward with workspace mode 0: NULL; 1, 2: exactly the queried size at
 * base + 1 / + 4, followed by guard bytes that must survive. */
static fmha_status call_backward(const fmha_problem *p, const float *q, const float *k,
                                 const float *v, const float *o, const float *d_o,
                                 const float *lse, float *dq, float *dk, float *dv, int ws_mode,
                                 const char *what) {
    if (ws_mode == 0) return tu_backward(p, q, k, v, o, d_o, lse, dq, dk, dv, NULL, NULL, 0);
    size_t bytes = 0;
    fmha_status st = fmha_backward_workspace_size(p, &bytes);
    if (!tu_check(st == FMHA_OK, "%s: workspace size query gave %d", what, (int)st)) return st;
    const size_t off = ws_mode == 1 ? 1 : 4, guard = 64;
    unsigned char *base = malloc(bytes + off + guard);
    memset(base + off + bytes, 0xA5, guard);
    st = tu_backward(p, q, k, v, o, d_o, lse, dq, dk, dv, NULL, base + off, bytes);
    size_t bad = 0;
    for (size_t i = 0; i < guard; i++) bad += base[off + bytes + i] != 0xA5;
    tu_check(bad == 0, "%s: %zu bytes written past the workspace", what, bad);
    free(base);
    return st;
}

/* The reference of one case and what the checks derive from it. */
typedef struct ref_case {
    const fmha_problem *p;
    const float *q, *k, *v, *d_o;
    double *g[3];           /* dq [B,Sq,Hq,D], dk [B,Skv,Hkv,D], dv [B,Skv,Hkv,Dv] */
    double *o, *lse;        /* o [B,Sq,Hq,Dv], lse [B,Hq,Sq] */
    size_t n[3], n_o, n_l;
    double atol[3];
    double floor[3];        /* the error that total cancellation leaves (above) */
    int onehot;             /* logits near the float32 limit */
    int all_zero[3];        /* r is exactly zero: no relative L2 check */
    unsigned char *q_seen;  /* [Sq]: query i sees some key */
    unsigned char *k_seen;  /* [Skv]: key j is seen by some query */
} ref_case;

/* Compares gradients dq, dk, dv (strided, strides of q, k, v) with the
 * reference; returns the worst ratio and rel L2 per tensor in ratio[3], rel[3]. */
static int check_grads(const ref_case *c, const char *what, float *const grads[3],
                       double ratio[3], double rel[3]) {
    const fmha_problem *p = c->p;
    const char which[3] = {'q', 'k', 'v'};
    const float sent = sentinel();
    int ok = 1;
    for (int t = 0; t < 3; t++) {
        int64_t n[4];
        const int64_t *st = tu_shape(p, which[t], n);
        /* got [numel]: the gradient, contiguous */
        float *got = malloc(c->n[t] * sizeof(float));
        tu_gather(grads[t], st, n, got);
        ok &= tu_check(!tu_has_nan(got, c->n[t]), "%s: d%c has NaN", what, which[t]);
        ok &= tu_check(tu_padding_changed(grads[t], st, n, sent) == 0, "%s: d%c padding written",
                       what, which[t]);
        ratio[t] = tu_worst_ratio(got, c->g[t], c->n[t], c->atol[t], G_RTOL);
        rel[t] = c->all_zero[t] || (c->onehot && t < 2) ? 0.0 : tu_rel_l2(got, c->g[t], c->n[t]);
        ok &= tu_check(ratio[t] <= 1.0, "%s: d%c worst ratio %.3g", what, which[t], ratio[t]);
        /* the L2 error within 2e-5 of ||r||, or within the floor where the
         * rows of total cancellation outweigh the rest (a few keys, each
         * seen by a row of one key and a row of several) */
        const double err = tu_err_l2(got, c->g[t], c->n[t]);
        ok &= tu_check(rel[t] <= G_REL_L2 || err <= c->floor[t],
                       "%s: d%c relative L2 error %.3g (L2 error %.3g, floor %.3g)", what, which[t], rel[t], err,
                       c->floor[t]);
        /* exact zeros: dq of queries that see nothing, dk and dv of keys nobody sees */
        int zeros = 1;
        for (int64_t b = 0; b < n[0]; b++)
            for (int64_t s = 0; s < n[1]; s++) {
                if (t == 0 ? c->q_seen[s] : c->k_seen[s]) continue;
                for (int64_t h = 0; h < n[2]; h++)
                    for (int64_t d = 0; d < n[3]; d++)
                        zeros &= got[((b * n[1] + s) * n[2] + h) * n[3] + d] == 0.0f;
            }
        ok &= tu_check(zeros, "%s: d%c not exactly 0 where nothing is visible", what, which[t]);
        free(got);
    }
    return ok;
}

static void record(const char *what, const ref_case *c, int s, int ii, const double ratio[3],
                   const double rel[3], double case_worst[2], int ok, int *printed) {
    for (int t = 0; t < 3; t++) {
        if (ratio[t] > worst_ratio[s][ii][t]) worst_ratio[s][ii][t] = ratio[t];
        if (rel[t] > worst_rel[s][ii][t]) worst_rel[s][ii][t] = rel[t];
        if (ratio[t] > case_worst[0]) case_worst[0] = ratio[t];
        if (rel[t] > case_worst[1]) case_worst[1] = rel[t];
    }
    if (!ok && !*printed) {
        const fmha_problem *p = c->p;
        printf("  %s: B %lld Hq %lld Hkv %lld Sq %lld Skv %lld D %lld Dv %lld scale %g causal %s\n",
               what, (long long)p->batch, (long long)p->heads_q, (long long)p->heads_kv,
               (long long)p->seq_q, (long long)p->seq_kv, (long long)p->head_dim,
               (long long)p->head_dim_v, (double)p->scale, tu_causal_name(p->causal));
        *printed = 1;
    }
}

static void run_case(const char *name, const fmha_problem *p, const float *q, const float *k,
                     const float *v, const float *d_o, int onehot) {
    ref_case c = {.p = p, .q = q, .k = k, .v = v, .d_o = d_o, .onehot = onehot};
    int64_t n[4];
    const char which[3] = {'q', 'k', 'v'};
    for (int t = 0; t < 3; t++) {
        tu_shape(p, which[t], n);
        c.n[t] = tu_numel(n);
        c.g[t] = malloc(c.n[t] * sizeof(double));
    }
    tu_shape(p, 'o', n);
    c.n_o = tu_numel(n);
    c.n_l = (size_t)(p->batch * p->heads_q * p->seq_q);
    c.o = malloc(c.n_o * sizeof(double));
    c.lse = malloc(c.n_l * sizeof(double));
    if (fmha_ref_backward(p, q, k, v, d_o, c.g[0], c.g[1], c.g[2]) != 0 ||
        fmha_ref_forward(p, q, k, v, c.o, c.lse) != 0)
        abort();
    const double scale = fmha_ref_scale(p), mdo = max_abs_tensor(p, d_o, 'o');
    const double mv = max_abs_tensor(p, v, 'v');
    const double dpmax = (double)p->head_dim_v * mdo * mv;
    const double natural[3] = {scale * dpmax * max_abs_tensor(p, k, 'k'),
                               scale * dpmax * max_abs_tensor(p, q, 'q'), mdo};
    for (int t = 0; t < 3; t++) {
        const double m = tu_max_abs_d(c.g[t], c.n[t]);
        const double floor = (onehot && t < 2 ? G_ONEHOT : G_FLOOR) * natural[t];
        c.floor[t] = floor;
        c.atol[t] = G_ATOL_MAX * m > floor ? G_ATOL_MAX * m : floor;
        if (c.atol[t] == 0.0) c.atol[t] = 1e-30;
        c.all_zero[t] = m == 0.0;
    }
    c.q_seen = calloc((size_t)p->seq_q, 1);
    c.k_seen = calloc((size_t)p->seq_kv, 1);
    for (int64_t i = 0; i < p->seq_q; i++)
        for (int64_t j = 0; j < p->seq_kv; j++)
            if (fmha_ref_visible(p, i, j)) c.q_seen[i] = c.k_seen[j] = 1;

    const float sent = sentinel();
    const int ws_mode = case_index++ % 3;
    double case_worst[2] = {0, 0};
    int printed = 0;
    int64_t no[4];
    const int64_t *ost = tu_shape(p, 'o', no);
    for (int ii = 0; ii < n_isa; ii++) {
        if (!isa_ok[ii]) continue;
        fmha_cpu_force_isa(isa_name(ii));
        for (int s = 0; s < 4; s++) {
            if (tu_strategy_skipped(s) || tu_strategy_repeats(s)) continue;
            char what[256];
            snprintf(what, sizeof what, "%s [%s, %s, ws %d]", name, tu_strategy_name(s),
                     isa_name(ii), ws_mode);
            fmha_problem pp = *p;
            pp.strategy = (fmha_strategy)s;
            /* o, lse from the library's forward; gradients start as sentinel */
            float *o = tu_new_output(&pp, 'o', sent), *lse = malloc(c.n_l * sizeof(float));
            float *grads[3] = {tu_new_output(&pp, 'q', sent), tu_new_output(&pp, 'k', sent),
                               tu_new_output(&pp, 'v', sent)};
            fmha_status st = tu_forward(&pp, q, k, v, o, lse, NULL, 0);
            if (tu_check(st == FMHA_OK, "%s: forward status %d", what, (int)st)) {
                st = call_backward(&pp, q, k, v, o, d_o, lse, grads[0], grads[1], grads[2],
                                   ws_mode, what);
                if (tu_check(st == FMHA_OK, "%s: backward status %d (%s)", what, (int)st,
                             fmha_status_string(st))) {
                    double ratio[3], rel[3];
                    int ok = check_grads(&c, what, grads, ratio, rel);
                    record(what, &c, s, ii, ratio, rel, case_worst, ok, &printed);
                }
            }
            /* forward_backward, once per strategy under the default ISA (the
             * native runs: the entry point is the drivers', not a table's) */
            if (!strcmp(isa_name(ii), isa_default) && !tu_emulated()) {
                float *o2 = tu_new_output(&pp, 'o', sent), *lse2 = malloc(c.n_l * sizeof(float));
                float *g2[3] = {tu_new_output(&pp, 'q', sent), tu_new_output(&pp, 'k', sent),
                                tu_new_output(&pp, 'v', sent)};
                char what2[280];
                snprintf(what2, sizeof what2, "%s (forward_backward)", what);
                st = tu_forward_backward(&pp, q, k, v, d_o, o2, lse2, g2[0], g2[1], g2[2], NULL);
                if (tu_check(st == FMHA_OK, "%s: status %d", what2, (int)st)) {
                    double ratio[3], rel[3];
                    int ok = check_grads(&c, what2, g2, ratio, rel);
                    record(what2, &c, s, ii, ratio, rel, case_worst, ok, &printed);
                    /* its O and lse are the forward's (checked loosely here;
                     * test_forward.c holds the forward to its bar) */
                    float *og = malloc(c.n_o * sizeof(float));
                    tu_gather(o2, ost, no, og);
                    tu_check(tu_worst_ratio(og, c.o, c.n_o, 1e-5 * (mv > 0 ? mv : 1), 1e-4) <= 1.0,
                             "%s: O", what2);
                    int lse_ok = 1;
                    for (size_t i = 0; i < c.n_l; i++)
                        lse_ok &= c.lse[i] == -INFINITY
                                      ? lse2[i] == -INFINITY
                                      : fabs(lse2[i] - c.lse[i]) <= 1e-4 * (1 + fabs(c.lse[i]));
                    tu_check(lse_ok, "%s: lse", what2);
                    free(og);
                }
                free(o2), free(lse2), free(g2[0]), free(g2[1]), free(g2[2]);
            }
            free(o), free(lse), free(grads[0]), free(grads[1]), free(grads[2]);
        }
    }
    fmha_cpu_force_isa(isa_default);
    if (verbose)
        printf("  %-52s ratio %.3f  rel L2 %.2e\n", name, case_worst[0], case_worst[1]);
    for (int t = 0; t < 3; t++) free(c.g[t]);
    free(c.o), free(c.lse), free(c.q_seen), free(c.k_seen);
}

static void run_random(const char *name, const fmha_problem *p, double amp) {
    float *q = tu_new_input(p, 'q', -amp, amp), *k = tu_new_input(p, 'k', -amp, amp);
    float *v = tu_new_input(p, 'v', -1, 1), *d_o = tu_new_input(p, 'o', -1, 1);
    run_case(name, p, q, k, v, d_o, 0);
    free(q), free(k), free(v), free(d_o);
}

static void make(fmha_problem *p, int64_t B, int64_t hq, int64_t hkv, int64_t sq, int64_t skv,
                 int64_t d, int64_t dv, fmha_causal causal, float scale, int layout) {
    fmha_problem_init(p, B, hq, hkv, sq, skv, d, dv, FMHA_LAYOUT_BSHD);
    p->causal = causal;
    p->scale = scale;
    tu_set_layout(p, layout);
}

static void random_cases(int count) {
    static const int64_t dims[] = {1, 7, 64, 80, 96, 128, 256};
    for (int c = 0; c < count; c++) {
        fmha_problem p;
        int64_t hkv = tu_int(1, 3), group = tu_int(1, 4);
        int64_t B = tu_int(1, 2), hq = hkv * group;
        int64_t sq = tu_int(0, 5) == 0 ? 1 : tu_int(1, 150);
        int64_t skv = tu_int(0, 4) == 0 ? sq : tu_int(1, 150);
        int64_t d = tu_int(0, 3) == 0 ? tu_int(1, 256) : dims[tu_int(0, 6)];
        int64_t dv = tu_int(0, 1) ? d : dims[tu_int(0, 6)];
        /* keep each case near 5 M multiply-adds per pass (1 M under FMHA_TEST_QUICK) */
        while (B * hq * sq * skv * (d + dv) > tu_quick_pick(5000000, 1000000)) {
            if (sq > 16) sq = sq * 2 / 3;
            else if (skv > 16) skv = skv * 2 / 3;
            else break;
        }
        /* explicit scales keep the scores' spread near the default's */
        float scale = tu_int(0, 1) ? 0.0f : (float)(tu_uniform(0.3, 1.5) / sqrt((double)d));
        int layout = (int)tu_int(0, TU_LAYOUT_COUNT - 1);
        make(&p, B, hq, hkv, sq, skv, d, dv, (fmha_causal)tu_int(0, 2), scale, layout);
        char name[160];
        snprintf(name, sizeof name, "random %d (B%lld H%lld/%lld S%lld/%lld D%lld/%lld %s %s)", c,
                 (long long)B, (long long)hq, (long long)hkv, (long long)sq, (long long)skv,
                 (long long)d, (long long)dv, tu_causal_name(p.causal), tu_layout_name(layout));
        run_random(name, &p, tu_int(0, 2) ? 1.0 : 2.0);
    }
}

static void fixed_cases(void) {
    fmha_problem p;
    for (int causal = 0; causal < 3; causal++) {
        make(&p, 2, 8, 2, 1, 517, 128, 128, (fmha_causal)causal, 0.0f, TU_LAYOUT_BSHD);
        run_random("decode Sq 1, Skv 517, GQA 8/2", &p, 1.0);
    }
    make(&p, 1, 8, 1, 33, 70, 64, 80, FMHA_CAUSAL_TOP_LEFT, 0.0f, TU_LAYOUT_BHSD);
    run_random("MQA 8/1, D 64, Dv 80, top-left (unseen keys)", &p, 1.0);
    make(&p, 2, 8, 2, 100, 37, 96, 96, FMHA_CAUSAL_BOTTOM_RIGHT, 0.1f, TU_LAYOUT_PADDED);
    run_random("GQA 8/2, Sq 100 > Skv 37 bottom-right", &p, 1.0);
    static const int64_t dims[] = {1, 7, 64, 80, 96, 128, 256};
    /* query lengths of the cases below; FMHA_TEST_QUICK: fewer query blocks, the same key blocks */
    const int64_t sq_a = tu_quick_pick(67, 35), sq_b = tu_quick_pick(129, 40);
    for (int i = 0; i < 7; i++) {
        char name[64];
        int64_t dv = dims[(i + 3) % 7];
        snprintf(name, sizeof name, "D %lld, Dv %lld", (long long)dims[i], (long long)dv);
        make(&p, 1, 2, 1, sq_a, 131, dims[i], dv, (fmha_causal)(i % 3), 0.0f, i % TU_LAYOUT_COUNT);
        run_random(name, &p, 1.0);
        snprintf(name, sizeof name, "D = Dv = %lld", (long long)dims[i]);
        make(&p, 1, 1, 1, sq_b, 65, dims[i], dims[i], (fmha_causal)((i + 1) % 3), 0.0f,
             (i + 1) % TU_LAYOUT_COUNT);
        run_random(name, &p, 1.0);
    }
    /* head dims past 256: two query blocks, two key blocks */
    static const int64_t wide[][2] = {{320, 320}, {512, 512}, {576, 512}, {576, 576}, {320, 576}};
    for (int i = 0; i < 5; i++) {
        char name[64];
        snprintf(name, sizeof name, "wide D %lld, Dv %lld", (long long)wide[i][0], (long long)wide[i][1]);
        int64_t hq = i == 2 ? 2 : 1; /* MLA's shape with two query heads on one kv head */
        make(&p, 1, hq, 1, 67, 131, wide[i][0], wide[i][1], (fmha_causal)(i % 3), 0.0f, i % TU_LAYOUT_COUNT);
        run_random(name, &p, 1.0);
    }
    const int64_t s_long = tu_quick_pick(600, 300); /* several key blocks either way */
    make(&p, 1, 2, 1, s_long, s_long, 64, 64, FMHA_CAUSAL_TOP_LEFT, 0.0f, TU_LAYOUT_BSHD);
    run_random("long S, D 64, causal", &p, 1.0);
    for (int layout = 0; layout < TU_LAYOUT_COUNT; layout++) {
        make(&p, 2, 3, 3, 40, 9, 16, 24, FMHA_CAUSAL_BOTTOM_RIGHT, 0.0f, layout);
        run_random("masked rows: Sq 40 > Skv 9 bottom-right", &p, 1.0);
    }
    make(&p, 1, 2, 2, 70, 1, 8, 8, FMHA_CAUSAL_BOTTOM_RIGHT, 0.0f, TU_LAYOUT_BHSD);
    run_random("masked rows: Skv 1, Sq 70 bottom-right", &p, 1.0);
    make(&p, 1, 4, 2, 5, 90, 32, 16, FMHA_CAUSAL_TOP_LEFT, 0.0f, TU_LAYOUT_PADDED2);
    run_random("unseen keys: Sq 5, Skv 90 top-left", &p, 1.0);
}

/* One-hot softmax from scores ~1e30 .. 1e37 (exact in float32, see
 * tu_fill_argmax_logits): dV = the dO rows routed to each argmax key. */
static void large_logit_cases(void) {
    static const struct { int64_t d, dv, sq, skv; float scale; double target; } cs[] = {
        {64, 64, 70, 130, 0.0f, 1e37}, {16, 32, 33, 200, 0.25f, 1e37},
        {256, 64, 20, 71, 0.0f, 5e36}, {1, 1, 50, 50, 0.0f, 1e37},
        {64, 80, 129, 65, 0.0f, 1e30},
    };
    for (int c = 0; c < (int)(sizeof cs / sizeof cs[0]); c++)
        for (int causal = 0; causal < 3; causal++) {
            fmha_problem p;
            make(&p, 2, 4, 2, cs[c].sq, cs[c].skv, cs[c].d, cs[c].dv, (fmha_causal)causal,
                 cs[c].scale, (c + causal) % TU_LAYOUT_COUNT);
            float *q = tu_new_input(&p, 'q', -1, 1), *k = tu_new_input(&p, 'k', -1, 1);
            float *v = tu_new_input(&p, 'v', -1, 1), *d_o = tu_new_input(&p, 'o', -1, 1);
            tu_fill_argmax_logits(&p, q, k, cs[c].target);
            char name[128];
            snprintf(name, sizeof name, "large logits ~%.0e (D %lld, %s)", cs[c].target,
                     (long long)cs[c].d, tu_causal_name(causal));
            run_case(name, &p, q, k, v, d_o, 1);
            free(q), free(k), free(v), free(d_o);
        }
}

/* dQ, dK, dV bitwise identical for 1, 2 and 7 threads, every strategy and ISA. */
static void determinism(void) {
    static const struct { int64_t B, hq, hkv, sq, skv, d, dv; fmha_causal causal; int layout; } cs[] = {
        {2, 4, 2, 77, 131, 40, 24, FMHA_CAUSAL_TOP_LEFT, TU_LAYOUT_BSHD},
        {1, 3, 1, 200, 45, 64, 64, FMHA_CAUSAL_BOTTOM_RIGHT, TU_LAYOUT_BHSD},
        {1, 8, 2, 1, 700, 64, 32, FMHA_CAUSAL_NONE, TU_LAYOUT_PADDED},
        {1, 1, 1, 333, 333, 96, 96, FMHA_CAUSAL_TOP_LEFT, TU_LAYOUT_BSHD},
    };
    /* FMHA_TEST_QUICK: lengths past 200 cut to 200 (still two key blocks) */
    const int64_t s_max = tu_quick_pick(INT64_MAX, 200);
    const int threads[3] = {1, 7, 2}; /* FMHA_TEST_QUICK: 1 and 7 */
    const int n_threads = (int)tu_quick_pick(3, 2);
    const float sent = sentinel();
    for (int c = 0; c < (int)(sizeof cs / sizeof cs[0]); c++) {
        fmha_problem p;
        make(&p, cs[c].B, cs[c].hq, cs[c].hkv, cs[c].sq < s_max ? cs[c].sq : s_max,
             cs[c].skv < s_max ? cs[c].skv : s_max, cs[c].d, cs[c].dv, cs[c].causal, 0.0f, cs[c].layout);
        float *q = tu_new_input(&p, 'q', -1, 1), *k = tu_new_input(&p, 'k', -1, 1);
        float *v = tu_new_input(&p, 'v', -1, 1), *d_o = tu_new_input(&p, 'o', -1, 1);
        const char which[3] = {'q', 'k', 'v'};
        size_t span[3];
        for (int t = 0; t < 3; t++) {
            int64_t n[4];
            const int64_t *st = tu_shape(&p, which[t], n);
            span[t] = tu_span(st, n);
        }
        for (int ii = 0; ii < n_isa; ii++) {
            if (!isa_ok[ii]) continue;
            fmha_cpu_force_isa(isa_name(ii));
            for (int s = 0; s < 4; s++) {
                if (tu_strategy_skipped(s) || tu_strategy_repeats(s)) continue;
                p.strategy = (fmha_strategy)s;
                /* o, lse from one forward, shared by every thread count */
                float *o = tu_new_output(&p, 'o', sent);
                float *lse = malloc((size_t)(p.batch * p.heads_q * p.seq_q) * sizeof(float));
                fmha_set_num_threads(1);
                tu_forward(&p, q, k, v, o, lse, NULL, 0);
                float *first[3] = {NULL, NULL, NULL};
                int same = 1;
                for (int ti = 0; ti < n_threads; ti++) {
                    fmha_set_num_threads(threads[ti]);
                    float *g[3] = {tu_new_output(&p, 'q', sent), tu_new_output(&p, 'k', sent),
                                   tu_new_output(&p, 'v', sent)};
                    fmha_status st = tu_backward(&p, q, k, v, o, d_o, lse, g[0], g[1], g[2],
                                                   NULL, NULL, 0);
                    tu_check(st == FMHA_OK, "determinism case %d: status %d", c, (int)st);
                    for (int t = 0; t < 3; t++) {
                        if (ti == 0) first[t] = g[t];
                        else {
                            same &= !memcmp(first[t], g[t], span[t] * sizeof(float));
                            free(g[t]);
                        }
                    }
                }
                tu_check(same, "determinism case %d [%s, %s]: gradients differ across 1/7/2 threads",
                         c, tu_strategy_name(s), isa_name(ii));
                for (int t = 0; t < 3; t++) free(first[t]);
                free(o), free(lse);
            }
        }
        fmha_set_num_threads(0);
        fmha_cpu_force_isa(isa_default);
        free(q), free(k), free(v), free(d_o);
    }
}

/* The backward's own argument errors; nothing written. */
static void errors(void) {
    fmha_problem p;
    make(&p, 1, 2, 1, 9, 11, 8, 8, FMHA_CAUSAL_NONE, 0.0f, TU_LAYOUT_BSHD);
    const float sent = sentinel();
    float *q = tu_new_input(&p, 'q', -1, 1), *k = tu_new_input(&p, 'k', -1, 1);
    float *v = tu_new_input(&p, 'v', -1, 1), *d_o = tu_new_input(&p, 'o', -1, 1);
    float *o = tu_new_output(&p, 'o', sent), *lse = malloc(18 * sizeof(float));
    tu_forward(&p, q, k, v, o, lse, NULL, 0);
    float *g[3] = {tu_new_output(&p, 'q', sent), tu_new_output(&p, 'k', sent),
                   tu_new_output(&p, 'v', sent)};
    const size_t nq = 9 * 2 * 8, nk = 11 * 8;
    tu_check(tu_backward(&p, q, k, v, o, d_o, NULL, g[0], g[1], g[2], NULL, NULL, 0) ==
                 FMHA_ERR_NULL_POINTER,
             "backward with lse NULL");
    tu_check(tu_backward(&p, q, k, v, o, NULL, lse, g[0], g[1], g[2], NULL, NULL, 0) ==
                 FMHA_ERR_NULL_POINTER,
             "backward with d_o NULL");
    tu_check(tu_backward(&p, q, k, v, o, d_o, lse, q, g[1], g[2], NULL, NULL, 0) ==
                 FMHA_ERR_OVERLAP,
             "backward with dq = q");
    tu_check(tu_backward(&p, q, k, v, o, d_o, lse, g[0], k, g[2], NULL, NULL, 0) ==
                 FMHA_ERR_OVERLAP,
             "backward with dk = k");
    tu_check(tu_backward(&p, q, k, v, o, d_o, lse, g[0], g[1], (float *)d_o + 3, NULL, NULL, 0) ==
                 FMHA_ERR_OVERLAP,
             "backward with dv inside d_o");
    tu_check(tu_count_not(g[0], nq, sent) == 0 && tu_count_not(g[1], nk, sent) == 0 &&
                 tu_count_not(g[2], nk, sent) == 0,
             "backward errors wrote a gradient");
    for (int t = 0; t < 3; t++) free(g[t]);
    free(q), free(k), free(v), free(d_o), free(o), free(lse);
}

int main(void) {
    tu_seed();
    verbose = getenv("FMHA_TEST_VERBOSE") != NULL;
    n_isa = (int)fmha_isa_count();
    if (!tu_check(n_isa <= MAX_ISA, "%d registered ISAs, room for %d", n_isa, MAX_ISA))
        return tu_finish();
    printf("ISAs:");
    for (int i = 0; i < n_isa; i++)
        if ((isa_ok[i] = tu_isa_runs(fmha_isa_at((size_t)i)))) printf(" %s", isa_name(i));
    for (int i = 0; i < n_isa; i++)
        if (!isa_ok[i]) printf(" [%s: not run here, skipped]", isa_name(i));
    isa_default = fmha_cpu_kernels()->isa;
    printf(" (default %s), threads %d\n", isa_default, fmha_get_num_threads());
    errors();
    fixed_cases();
    large_logit_cases();
    random_cases(tu_emulated() ? 4 : (int)tu_quick_pick(30, 8));
    determinism();
    printf("worst per strategy and ISA: ratio (<= 1) and rel L2 (<= %.0e) of dQ, dK, dV\n",
           G_REL_L2);
    for (int s = 0; s < 4; s++)
        for (int i = 0; i < n_isa; i++)
            if (isa_ok[i])
                printf("  %-8s %-10s  dq %.3f %.2e  dk %.3f %.2e  dv %.3f %.2e\n",
                       tu_strategy_name(s), isa_name(i), worst_ratio[s][i][0], worst_rel[s][i][0],
                       worst_ratio[s][i][1], worst_rel[s][i][1], worst_ratio[s][i][2],
                       worst_rel[s][i][2]);
    return tu_finish();
}
