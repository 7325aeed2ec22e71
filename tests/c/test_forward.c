/* test_forward.c: fmha_forward against the float64 reference, for every
 * strategy (auto, tiled, dense, portable) under every instruction set this
 * CPU runs (fmha_cpu_force_isa). Shapes: random ones from the printed seed
 * (tails that are not multiples of 16/64/128, Sq != Skv, GQA, MQA, D != Dv,
 * every layout, both causal alignments, default and explicit scale) plus
 * fixed ones: decode (Sq = 1), GQA 8/2, MQA 8/1, every D of interest (head
 * dims past 256 up to FMHA_MAX_HEAD_DIM: 320, 512, MLA's 576 / 512), one
 * S = 600 problem, V the tiled forward copies, fully masked rows, broadcast (stride 0) K/V, and logits
 * near the float32 limit. Caller workspaces of exactly the queried size at
 * misaligned addresses are used in turn with NULL.
 *
 * Tolerances (float32 library vs float64 reference):
 *   O:   |x - r| <= atol + rtol |r| with atol = 1e-5 max|V|, rtol = 1e-4,
 *        and ||x - r|| / (||r|| + max|V|) <= 1e-5 over the whole tensor.
 *        O is a convex mix of V rows, so its error scale is max|V| times
 *        the softmax's relative error (a few float32 epsilons times the
 *        score size); max|V| in the denominator keeps an O whose norm
 *        cancels to near 0 (one element, say) from dividing by it, and is
 *        negligible against ||r|| for tensors of many rows.
 *   lse: |x - r| <= 1e-5 (1 + smax) + 1e-5 |r|, smax = scale max_i |q_i| max_j
 *        |k_j| (Cauchy-Schwarz bound of the scores): a float32 dot product's
 *        error is a few epsilons of smax.
 *   Fully masked rows: O exactly 0 and lse exactly -inf.
 *   Outputs: padding of O and the words after lse keep their sentinel. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/cpu.h"
#include "fmha_ref.h"
#include "test_util.h"

#define O_ATOL_V 1e-5 /* times max |V| */
#define O_RTOL 1e-4
#define O_REL_L2 1e-5
#define LSE_TOL 1e-5
#define LSE_GUARD 16 /* sentinel floats after lse */

/* The ISAs of the registry (src/config/cpu.c), in its order; isa_ok: those this
 * CPU runs. */
#define MAX_ISA 16
static int n_isa;
static int isa_ok[MAX_ISA];
static const char *isa_name(int i) { return fmha_isa_at((size_t)i)->name; }
static const char *isa_default;

/* worst [strategy][isa]: O ratio, O rel L2, lse ratio */
static double worst[4][MAX_ISA][3];

static float sentinel(void) {
    uint32_t u = 0x7fc0beefu;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Per-row L2 norm bound of a tensor: max over (b, s, h) of ||x[b, s, h, :]||. */
static double max_row_norm(const fmha_problem *p, const float *x, char which) {
    int64_t n[4];
    const int64_t *st = tu_shape(p, which, n);
    double m = 0.0;
    for (int64_t b = 0; b < n[0]; b++)
        for (int64_t s = 0; s < n[1]; s++)
            for (int64_t h = 0; h < n[2]; h++) {
                double acc = 0.0;
                for (int64_t d = 0; d < n[3]; d++) {
                    double e = *tu_elem((float *)x, st, b, s, h, d);
                    acc += e * e;
                }
                if (acc > m) m = acc;
            }
    return sqrt(m);
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

/* Workspace mode 0: NULL; 1, 2: exactly the queried size at base + 1 / + 4,
 * followed by guard bytes that must survive. */
static fmha_status call_forward(const fmha_problem *p, const float *q, const float *k,
                                const float *v, float *o, float *lse, int ws_mode,
                                const char *what) {
    if (ws_mode == 0) return tu_forward(p, q, k, v, o, lse, NULL, 0);
    size_t bytes = 0;
    fmha_status st = fmha_forward_workspace_size(p, &bytes);
    if (!tu_check(st == FMHA_OK, "%s: workspace size query gave %d", what, (int)st)) return st;
    const size_t off = ws_mode == 1 ? 1 : 4, guard = 64;
    unsigned char *base = malloc(bytes + off + guard);
    memset(base + off + bytes, 0xA5, guard);
    st = tu_forward(p, q, k, v, o, lse, base + off, bytes);
    size_t bad = 0;
    for (size_t i = 0; i < guard; i++) bad += base[off + bytes + i] != 0xA5;
    tu_check(bad == 0, "%s: %zu bytes written past the workspace", what, bad);
    free(base);
    return st;
}

static int case_index;
static int verbose; /* FMHA_TEST_VERBOSE=1 prints every case's worst errors */

/* Runs p (sizes, options and strides set) on q, k, v under every ISA and
 * strategy and compares with the reference. */
static void run_case(const char *name, const fmha_problem *p, const float *q, const float *k,
                     const float *v) {
    int64_t no[4];
    const int64_t *ost = tu_shape(p, 'o', no);
    const size_t n_o = tu_numel(no), n_l = (size_t)(p->batch * p->heads_q * p->seq_q);
    /* ref_o [B, Sq, Hq, Dv], ref_lse [B, Hq, Sq] in double; got_o the same in float */
    double *ref_o = malloc(n_o * sizeof(double)), *ref_lse = malloc(n_l * sizeof(double));
    float *got_o = malloc(n_o * sizeof(float));
    if (fmha_ref_forward(p, q, k, v, ref_o, ref_lse) != 0) abort();
    const double vmax = max_abs_tensor(p, v, 'v');
    const double atol = O_ATOL_V * (vmax > 0 ? vmax : 1.0);
    const double smax =
        fmha_ref_scale(p) * max_row_norm(p, q, 'q') * max_row_norm(p, k, 'k');
    const float sent = sentinel();
    const int ws_mode = case_index++ % 3;
    int printed = 0;
    double case_worst[3] = {0, 0, 0};

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
            float *o = tu_new_output(&pp, 'o', sent);
            /* lse [B, Hq, Sq] + LSE_GUARD sentinel floats */
            float *lse = malloc((n_l + LSE_GUARD) * sizeof(float));
            for (size_t i = 0; i < n_l + LSE_GUARD; i++) lse[i] = sent;
            fmha_status st = call_forward(&pp, q, k, v, o, lse, ws_mode, what);
            if (!tu_check(st == FMHA_OK, "%s: status %d (%s)", what, (int)st,
                          fmha_status_string(st))) {
                free(o), free(lse);
                continue;
            }
            tu_gather(o, ost, no, got_o);
            const double ratio = tu_worst_ratio(got_o, ref_o, n_o, atol, O_RTOL);
            const double o_scale = tu_norm_l2(ref_o, n_o) + vmax;
            const double rel = tu_err_l2(got_o, ref_o, n_o) / (o_scale > 0 ? o_scale : 1.0);
            tu_check(ratio <= 1.0, "%s: O worst ratio %.3g", what, ratio);
            tu_check(rel <= O_REL_L2, "%s: O L2 error / (||O|| + max|V|) %.3g", what, rel);
            tu_check(tu_padding_changed(o, ost, no, sent) == 0, "%s: O padding written", what);
            tu_check(tu_count_not(lse + n_l, LSE_GUARD, sent) == 0,
                     "%s: written past the end of lse", what);
            /* lse, and the exact values of fully masked rows */
            double lse_ratio = 0.0;
            int masked_ok = 1;
            for (int64_t b = 0; b < p->batch; b++)
                for (int64_t h = 0; h < p->heads_q; h++)
                    for (int64_t i = 0; i < p->seq_q; i++) {
                        const size_t li = (size_t)((b * p->heads_q + h) * p->seq_q + i);
                        const double r = ref_lse[li], x = lse[li];
                        if (r == -INFINITY) {
                            masked_ok &= x == -INFINITY;
                            const float *oi = got_o + ((b * p->seq_q + i) * p->heads_q + h) * no[3];
                            for (int64_t c = 0; c < no[3]; c++) masked_ok &= oi[c] == 0.0f;
                            continue;
                        }
                        double t = isfinite(x) ? fabs(x - r) / (LSE_TOL * (1 + smax) + LSE_TOL * fabs(r))
                                               : INFINITY;
                        if (t > lse_ratio) lse_ratio = t;
                    }
            tu_check(lse_ratio <= 1.0, "%s: lse worst ratio %.3g", what, lse_ratio);
            tu_check(masked_ok, "%s: fully masked rows are not O = 0, lse = -inf", what);
            double *w = worst[s][ii];
            if (ratio > w[0]) w[0] = ratio;
            if (rel > w[1]) w[1] = rel;
            if (lse_ratio > w[2]) w[2] = lse_ratio;
            if (ratio > case_worst[0]) case_worst[0] = ratio;
            if (rel > case_worst[1]) case_worst[1] = rel;
            if (lse_ratio > case_worst[2]) case_worst[2] = lse_ratio;
            if (!printed && (ratio > 1.0 || rel > O_REL_L2 || lse_ratio > 1.0)) {
                printf("  %s: B %lld Hq %lld Hkv %lld Sq %lld Skv %lld D %lld Dv %lld scale %g "
                       "causal %s\n",
                       name, (long long)p->batch, (long long)p->heads_q, (long long)p->heads_kv,
                       (long long)p->seq_q, (long long)p->seq_kv, (long long)p->head_dim,
                       (long long)p->head_dim_v, (double)p->scale, tu_causal_name(p->causal));
                printed = 1;
            }
            /* lse is optional: O must not depend on it */
            if (s == FMHA_STRATEGY_AUTO) {
                float *o2 = tu_new_output(&pp, 'o', sent);
                st = tu_forward(&pp, q, k, v, o2, NULL, NULL, 0);
                tu_gather(o2, ost, no, got_o);
                tu_check(st == FMHA_OK && tu_worst_ratio(got_o, ref_o, n_o, atol, O_RTOL) <= 1.0,
                         "%s: O wrong without lse (status %d)", what, (int)st);
                free(o2);
            }
            free(o), free(lse);
        }
    }
    fmha_cpu_force_isa(isa_default);
    if (verbose)
        printf("  %-48s O ratio %.3f  rel L2 %.2e  lse ratio %.3f\n", name, case_worst[0],
               case_worst[1], case_worst[2]);
    free(ref_o), free(ref_lse), free(got_o);
}

/* Allocates inputs U(-amp, amp) for p and runs the case. */
static void run_random(const char *name, const fmha_problem *p, double amp) {
    float *q = tu_new_input(p, 'q', -amp, amp), *k = tu_new_input(p, 'k', -amp, amp);
    float *v = tu_new_input(p, 'v', -1, 1);
    run_case(name, p, q, k, v);
    free(q), free(k), free(v);
}

static void make(fmha_problem *p, int64_t B, int64_t hq, int64_t hkv, int64_t sq, int64_t skv,
                 int64_t d, int64_t dv, fmha_causal causal, float scale, int layout) {
    fmha_problem_init(p, B, hq, hkv, sq, skv, d, dv, FMHA_LAYOUT_BSHD);
    p->causal = causal;
    p->scale = scale;
    tu_set_layout(p, layout);
}

/* fmha_problem_init gives the strides the tests' layouts assume. */
static void check_problem_init(void) {
    for (int layout = 0; layout < 2; layout++) {
        fmha_problem a, b;
        fmha_problem_init(&a, 2, 6, 3, 5, 7, 9, 11, (fmha_layout)layout);
        tu_problem(&b, 2, 6, 3, 5, 7, 9, 11);
        tu_set_layout(&b, layout == 0 ? TU_LAYOUT_BSHD : TU_LAYOUT_BHSD);
        tu_check(!memcmp(a.q_strides, b.q_strides, sizeof a.q_strides) &&
                     !memcmp(a.k_strides, b.k_strides, sizeof a.k_strides) &&
                     !memcmp(a.v_strides, b.v_strides, sizeof a.v_strides) &&
                     !memcmp(a.o_strides, b.o_strides, sizeof a.o_strides) &&
                     a.scale == 0.0f && a.causal == FMHA_CAUSAL_NONE &&
                     a.strategy == FMHA_STRATEGY_AUTO && a.dtype == FMHA_DTYPE_F32,
                 "fmha_problem_init layout %d", layout);
    }
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
        /* keep each case near 10 M multiply-adds for the reference (2 M under FMHA_TEST_QUICK) */
        while (B * hq * sq * skv * (d + dv) > tu_quick_pick(10000000, 2000000)) {
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
                 (long long)d, (long long)dv, tu_causal_name(p.causal),
                 tu_layout_name(layout));
        run_random(name, &p, tu_int(0, 2) ? 1.0 : 2.0);
    }
}

static void fixed_cases(void) {
    fmha_problem p;
    /* decode: one query against a long cache */
    for (int causal = 0; causal < 3; causal++) {
        make(&p, 2, 8, 2, 1, 517, 128, 128, (fmha_causal)causal, 0.0f, TU_LAYOUT_BSHD);
        run_random("decode Sq 1, Skv 517, GQA 8/2", &p, 1.0);
    }
    make(&p, 1, 8, 1, 3, 1000, 64, 64, FMHA_CAUSAL_BOTTOM_RIGHT, 0.0f, TU_LAYOUT_BHSD);
    run_random("decode-like Sq 3, Skv 1000, MQA 8/1", &p, 1.0);
    make(&p, 1, 8, 1, 33, 70, 64, 80, FMHA_CAUSAL_TOP_LEFT, 0.0f, TU_LAYOUT_BHSD);
    run_random("MQA 8/1, D 64, Dv 80", &p, 1.0);
    make(&p, 2, 8, 2, 100, 37, 96, 96, FMHA_CAUSAL_BOTTOM_RIGHT, 0.3f, TU_LAYOUT_PADDED);
    run_random("GQA 8/2, Sq 100 > Skv 37 bottom-right", &p, 1.0);
    /* every D of interest, with a different Dv */
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
    /* head dims past 256 (Gemma's 512, MLA's D 576 with Dv 512): two query
     * blocks of the widest NR, two key tiles of the largest Bc */
    static const int64_t wide[][2] = {{320, 320}, {512, 512}, {576, 512}, {576, 576}, {320, 576}};
    for (int i = 0; i < 5; i++) {
        char name[64];
        snprintf(name, sizeof name, "wide D %lld, Dv %lld", (long long)wide[i][0], (long long)wide[i][1]);
        int64_t hq = i == 2 ? 2 : 1; /* MLA's shape with two query heads on one kv head */
        make(&p, 1, hq, 1, 67, 131, wide[i][0], wide[i][1], (fmha_causal)(i % 3), 0.0f, i % TU_LAYOUT_COUNT);
        run_random(name, &p, 1.0);
    }
    /* one larger problem */
    const int64_t s_long = tu_quick_pick(600, 300); /* several key blocks either way */
    make(&p, 1, 2, 1, s_long, s_long, 64, 64, FMHA_CAUSAL_TOP_LEFT, 0.0f, TU_LAYOUT_BSHD);
    run_random("long S, D 64, causal", &p, 1.0);
    /* V the tiled forward copies (a head's V >= 256 KiB, rows an even
     * number of lines apart or not unit-stride): once per call for every
     * (batch, kv head), or tile by tile when the copy serves few query
     * blocks */
    make(&p, 1, 4, 2, 200, 1100, 64, 64, FMHA_CAUSAL_NONE, 0.0f, TU_LAYOUT_BSHD);
    run_random("V copied per call: GQA 4/2, Sq 200, Skv 1100", &p, 1.0);
    make(&p, 1, 2, 2, 20, 1100, 32, 64, FMHA_CAUSAL_BOTTOM_RIGHT, 0.0f, TU_LAYOUT_BSHD);
    run_random("V copied per tile: Sq 20, Skv 1100", &p, 1.0);
    make(&p, 2, 2, 1, 130, 1030, 64, 72, FMHA_CAUSAL_TOP_LEFT, 0.0f, TU_LAYOUT_BSHD);
    /* V [B, H, D, S]: element stride Skv, rows adjacent */
    p.v_strides[3] = 1030, p.v_strides[1] = 1, p.v_strides[2] = 1030 * 72, p.v_strides[0] = 1030 * 72;
    run_random("V copied per call from [B, H, Dv, S] (column stride Skv)", &p, 1.0);
    /* fully masked rows: bottom-right with Sq > Skv, every layout */
    for (int layout = 0; layout < TU_LAYOUT_COUNT; layout++) {
        make(&p, 2, 3, 3, 40, 9, 16, 24, FMHA_CAUSAL_BOTTOM_RIGHT, 0.0f, layout);
        run_random("masked rows: Sq 40 > Skv 9 bottom-right", &p, 1.0);
    }
    make(&p, 1, 2, 2, 70, 1, 8, 8, FMHA_CAUSAL_BOTTOM_RIGHT, 0.0f, TU_LAYOUT_BHSD);
    run_random("masked rows: Skv 1, Sq 70 bottom-right", &p, 1.0);
    /* K and V broadcast over the batch (stride 0) */
    make(&p, 3, 4, 2, 21, 50, 32, 32, FMHA_CAUSAL_NONE, 0.0f, TU_LAYOUT_BSHD);
    p.k_strides[0] = 0;
    p.v_strides[0] = 0;
    run_random("K, V batch stride 0", &p, 1.0);
}

/* Scores of magnitude ~1e30 .. 1e37: softmax must not overflow (exp of the
 * raw score) or produce inf - inf. */
static void large_logit_cases(void) {
    static const struct { int64_t d, dv, sq, skv; float scale; double target; } cs[] = {
        {64, 64, 70, 130, 0.0f, 1e37},  {16, 32, 33, 200, 0.25f, 1e37},
        {256, 64, 20, 71, 0.0f, 5e36},  {1, 1, 50, 50, 0.0f, 1e37},
        {64, 80, 129, 65, 0.0f, 1e30},  {7, 7, 40, 90, 0.5f, -1.0},
    };
    for (int c = 0; c < (int)(sizeof cs / sizeof cs[0]); c++)
        for (int causal = 0; causal < 3; causal++) {
            fmha_problem p;
            make(&p, 2, 4, 2, cs[c].sq, cs[c].skv, cs[c].d, cs[c].dv, (fmha_causal)causal,
                 cs[c].scale, (c + causal) % TU_LAYOUT_COUNT);
            float *q = tu_new_input(&p, 'q', -1, 1), *k = tu_new_input(&p, 'k', -1, 1);
            float *v = tu_new_input(&p, 'v', -1, 1);
            char name[128];
            if (cs[c].target > 0) {
                tu_fill_argmax_logits(&p, q, k, cs[c].target);
                snprintf(name, sizeof name, "large logits ~%.0e (D %lld, %s)", cs[c].target,
                         (long long)cs[c].d, tu_causal_name(causal));
            } else {
                tu_fill_tied_logits(&p, q, k);
                snprintf(name, sizeof name, "tied logits +-2^123 (D %lld, %s)",
                         (long long)cs[c].d, tu_causal_name(causal));
            }
            run_case(name, &p, q, k, v);
            free(q), free(k), free(v);
        }
    /* tied logits with the default scale and D = 64: +-2^121 */
    fmha_problem p;
    make(&p, 1, 2, 1, 77, 77, 64, 64, FMHA_CAUSAL_TOP_LEFT, 0.0f, TU_LAYOUT_BHSD);
    float *q = tu_new_input(&p, 'q', -1, 1), *k = tu_new_input(&p, 'k', -1, 1);
    float *v = tu_new_input(&p, 'v', -1, 1);
    tu_fill_tied_logits(&p, q, k);
    run_case("tied logits +-2^121 (D 64)", &p, q, k, v);
    free(q), free(k), free(v);
}

/* scale -0.0 is a zero scale: every visible key gets the same weight (O is
 * the mean of the visible V rows), where +0.0 selects 1/sqrt(D); the
 * smallest subnormal scale gives the same equal weights. */
static void zero_scale_cases(void) {
    const float scales[] = {-0.0f, 1.4e-45f};
    for (int c = 0; c < 2; c++)
        for (int causal = 0; causal < 2; causal++) {
            fmha_problem p;
            make(&p, 1, 2, 1, 37, 70, 32, 16, causal ? FMHA_CAUSAL_BOTTOM_RIGHT : FMHA_CAUSAL_NONE, scales[c],
                 TU_LAYOUT_BSHD);
            float *q = tu_new_input(&p, 'q', -4, 4), *k = tu_new_input(&p, 'k', -4, 4);
            float *v = tu_new_input(&p, 'v', -1, 1);
            char name[96];
            snprintf(name, sizeof name, "scale %s (%s)", c ? "1.4e-45" : "-0.0", tu_causal_name(p.causal));
            run_case(name, &p, q, k, v);
            /* not the default scale's output: row 0 of head 0 is the mean of
             * the V rows it sees */
            float *o = tu_new_output(&p, 'o', 0.0f);
            tu_check(tu_forward(&p, q, k, v, o, NULL, NULL, 0) == FMHA_OK, "%s runs", name);
            int64_t seen = causal ? 70 - 37 + 1 : 70;
            double worst = 0.0;
            for (int64_t d = 0; d < 16; d++) {
                double mean = 0.0;
                for (int64_t j = 0; j < seen; j++) mean += *tu_elem(v, p.v_strides, 0, j, 0, d);
                mean /= (double)seen;
                double err = fabs(*tu_elem(o, p.o_strides, 0, 0, 0, d) - mean);
                worst = err > worst ? err : worst;
            }
            tu_check(worst < 1e-5, "%s: row 0 is the mean of its %lld visible V rows (worst error %.3g)", name,
                     (long long)seen, worst);
            free(q), free(k), free(v), free(o);
        }
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
    check_problem_init();
    fixed_cases();
    large_logit_cases();
    zero_scale_cases();
    random_cases(tu_emulated() ? 5 : (int)tu_quick_pick(40, 10));
    printf("worst per strategy and ISA: O ratio (<= 1), O rel L2 (<= %.0e), lse ratio (<= 1)\n",
           O_REL_L2);
    for (int s = 0; s < 4; s++)
        for (int i = 0; i < n_isa; i++)
            if (isa_ok[i])
                printf("  %-8s %-10s  %.3f  %.2e  %.3f\n", tu_strategy_name(s), isa_name(i),
                       worst[s][i][0], worst[s][i][1], worst[s][i][2]);
    return tu_finish();
}
