/* test_limits.c: arguments at the ends of int64. fmha.h allows any window
 * >= -1 and any size, so the library must do its index arithmetic without
 * signed overflow (this binary runs under UBSan in the test build, where an
 * overflow aborts) and must answer huge sizes and strides with an error.
 *
 *   windows   INT64_MAX, INT64_MAX - 1, 2^62 and sizes just past the
 *             sequences, each side, with and without causal masking (both
 *             alignments), key lengths, Sq != Skv, every strategy: forward
 *             and backward against the float64 reference (fmha_ref_masks.h).
 *             Tolerances: per element |x - r| <= 1e-5 + 1e-4 |r| for O and
 *             lse, 1e-4 (1 + max|r|) for dQ, dK, dV; fully masked rows
 *             exactly O = 0, lse = -inf. Problems are tiny (D <= 8, <= 40
 *             keys), so float32 errors stay near 1e-6.
 *   decode    the same windows on shapes the decode driver serves (Sq 2-3,
 *             Skv 24): window_right near INT64_MAX, and window_left
 *             INT64_MAX under bottom-right alignment with key lengths of 1
 *             and 0; against the reference, and auto (decode) against the
 *             tiled strategy to the same tolerance.
 *   sizes     fmha_problem_init with every int64 extreme for every size
 *             (no overflow; the check then answers FMHA_ERR_BAD_SIZE or
 *             another size error), head dims up to FMHA_MAX_HEAD_DIM (576)
 *             and no further, batch x heads_q and Sq x Skv products
 *             beyond int64.
 *   unit dims INT64_MAX strides on every dimension of extent 1 (allowed: such
 *             a stride never multiplies a nonzero index), with a dense mask
 *             and bias: results as the reference's (to the same tolerances).
 *   extents   dense masks, dense biases and dense bias gradients whose
 *             strides reach past int64 (B = 4, stride 2^62): FMHA_ERR_BAD_SIZE
 *             from every entry point, nothing written. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/attn.h"
#include "fmha_ref_masks.h"
#include "test_util.h"

static void *xmalloc(size_t n) {
    void *x = malloc(n ? n : 1);
    if (!x) abort();
    return x;
}

/* Contiguous [B, Sq, Hq, D] problem and its tensors (float32). */
typedef struct lim_case {
    fmha_problem p;
    float *q, *k, *v, *d_o;
    int32_t kv_len[4];
} lim_case;

static void case_init(lim_case *c, int64_t B, int64_t sq, int64_t skv, int64_t d) {
    fmha_problem_init(&c->p, B, 1, 1, sq, skv, d, d, FMHA_LAYOUT_BSHD);
    c->q = tu_new_input(&c->p, 'q', -1, 1);
    c->k = tu_new_input(&c->p, 'k', -1, 1);
    c->v = tu_new_input(&c->p, 'v', -1, 1);
    c->d_o = tu_new_input(&c->p, 'o', -1, 1);
}

static void case_free(lim_case *c) { free(c->q), free(c->k), free(c->v), free(c->d_o); }

/* Forward and backward of c->p against the reference. */
static void window_case(const char *what, lim_case *c) {
    const fmha_problem *p = &c->p;
    int64_t no = p->batch * p->seq_q * p->heads_q * p->head_dim_v;
    int64_t nl = p->batch * p->heads_q * p->seq_q;
    int64_t nq = p->batch * p->seq_q * p->heads_q * p->head_dim;
    int64_t nk = p->batch * p->seq_kv * p->heads_kv * p->head_dim;
    double *ro = xmalloc(no * sizeof(double)), *rl = xmalloc(nl * sizeof(double));
    double *rdq = xmalloc(nq * sizeof(double)), *rdk = xmalloc(nk * sizeof(double));
    double *rdv = xmalloc(nk * sizeof(double));
    if (fmha_ref_forward_full(p, c->q, c->k, c->v, ro, rl) != 0 ||
        fmha_ref_backward_full(p, c->q, c->k, c->v, c->d_o, rdq, rdk, rdv, NULL, NULL, NULL) != 0)
        abort();
    float *o = xmalloc(no * sizeof(float)), *lse = xmalloc(nl * sizeof(float));
    float *dq = xmalloc(nq * sizeof(float)), *dk = xmalloc(nk * sizeof(float));
    float *dv = xmalloc(nk * sizeof(float));
    for (int s = 0; s < 4; s++) {
        if (tu_strategy_skipped(s)) continue;
        fmha_problem ps = *p;
        ps.strategy = (fmha_strategy)s;
        fmha_status st = fmha_forward(&ps, c->q, c->k, c->v, o, lse, NULL, 0);
        if (!tu_check(st == FMHA_OK, "%s [%s]: forward status %d", what, tu_strategy_name(s), (int)st))
            continue;
        tu_check(tu_worst_ratio(o, ro, no, 1e-5, 1e-4) <= 1.0, "%s [%s]: O differs from the reference",
                 what, tu_strategy_name(s));
        tu_check(tu_worst_ratio(lse, rl, nl, 1e-5, 1e-4) <= 1.0,
                 "%s [%s]: lse differs from the reference", what, tu_strategy_name(s));
        st = fmha_backward(&ps, c->q, c->k, c->v, o, c->d_o, lse, dq, dk, dv, NULL, NULL, 0);
        if (!tu_check(st == FMHA_OK, "%s [%s]: backward status %d", what, tu_strategy_name(s), (int)st))
            continue;
        const float *g[3] = {dq, dk, dv};
        const double *r[3] = {rdq, rdk, rdv};
        const int64_t n[3] = {nq, nk, nk};
        const char *names[3] = {"dQ", "dK", "dV"};
        for (int t = 0; t < 3; t++) {
            double atol = 1e-4 * (1.0 + tu_max_abs_d(r[t], (size_t)n[t]));
            tu_check(tu_worst_ratio(g[t], r[t], (size_t)n[t], atol, 0.0) <= 1.0,
                     "%s [%s]: %s differs from the reference", what, tu_strategy_name(s), names[t]);
        }
    }
    free(ro), free(rl), free(rdq), free(rdk), free(rdv);
    free(o), free(lse), free(dq), free(dk), free(dv);
}

static void check_windows(void) {
    /* the reported case: one side unbounded in all but name, a partial tile */
    lim_case c;
    case_init(&c, 1, 20, 20, 8);
    c.kv_len[0] = 13;
    c.p.masks.kv_lengths = c.kv_len;
    c.p.masks.window_left = INT64_MAX;
    window_case("window_left INT64_MAX, kv_lengths 13", &c);
    case_free(&c);

    const int64_t wins[] = {-1, 0, 3, 21, 40, 41, (int64_t)1 << 40, (int64_t)1 << 62, INT64_MAX - 1,
                            INT64_MAX};
    const int nw = (int)(sizeof wins / sizeof wins[0]);
    const int64_t shapes[3][2] = {{20, 20}, {7, 33}, {33, 7}};
    for (int sh = 0; sh < 3; sh++)
        for (int causal = 0; causal < 3; causal++)
            for (int wl = 0; wl < nw; wl++) {
                /* every left window, each with a few right ones (extremes included) */
                const int rights[4] = {0, 2, nw - 2, nw - 1};
                for (int ri = 0; ri < 4; ri++) {
                    int wr = rights[ri];
                    if (wins[wl] < (int64_t)1 << 40 && wins[wr] < (int64_t)1 << 40) continue;
                    case_init(&c, 2, shapes[sh][0], shapes[sh][1], 4);
                    c.p.causal = (fmha_causal)causal;
                    c.p.masks.window_left = wins[wl];
                    c.p.masks.window_right = wins[wr];
                    c.kv_len[0] = (int32_t)(shapes[sh][1] - 3);
                    c.kv_len[1] = (int32_t)shapes[sh][1];
                    if ((wl + ri) % 2) c.p.masks.kv_lengths = c.kv_len;
                    char what[160];
                    snprintf(what, sizeof what, "Sq %lld Skv %lld %s window (%lld, %lld)%s",
                             (long long)shapes[sh][0], (long long)shapes[sh][1],
                             tu_causal_name(causal), (long long)wins[wl], (long long)wins[wr],
                             c.p.masks.kv_lengths ? " kv_lengths" : "");
                    window_case(what, &c);
                    case_free(&c);
                }
            }
}

/* A window case on a shape the decode driver serves: the reference checks
 * of window_case, then auto (the decode driver) against tiled. */
static void decode_window_case(const char *what, lim_case *c) {
    fmha_plan plan;
    tu_check(fmha_plan_init(&c->p, &plan) == FMHA_OK && plan.driver == &fmha_fwd_driver_decode, "%s: the decode driver serves it", what);
    window_case(what, c);
    const fmha_problem *p = &c->p;
    int64_t no = p->batch * p->seq_q * p->heads_q * p->head_dim_v, nl = p->batch * p->heads_q * p->seq_q;
    /* [B, Sq, Hq, Dv] and [B, Hq, Sq] of each strategy; ref_* the tiled ones in double */
    float *o[2], *lse[2];
    double *ref_o = xmalloc((size_t)no * sizeof(double)), *ref_l = xmalloc((size_t)nl * sizeof(double));
    const fmha_strategy strategies[2] = {FMHA_STRATEGY_TILED, FMHA_STRATEGY_AUTO};
    for (int s = 0; s < 2; s++) {
        fmha_problem ps = *p;
        ps.strategy = strategies[s];
        o[s] = xmalloc((size_t)no * sizeof(float)), lse[s] = xmalloc((size_t)nl * sizeof(float));
        tu_check(fmha_forward(&ps, c->q, c->k, c->v, o[s], lse[s], NULL, 0) == FMHA_OK, "%s [%s]: status", what,
                 tu_strategy_name(strategies[s]));
    }
    for (int64_t e = 0; e < no; e++) ref_o[e] = o[0][e];
    for (int64_t e = 0; e < nl; e++) ref_l[e] = lse[0][e];
    tu_check(tu_worst_ratio(o[1], ref_o, (size_t)no, 1e-5, 1e-4) <= 1.0, "%s: auto's O differs from tiled's", what);
    int same_inf = 1; /* -inf rows of one are -inf rows of the other */
    for (int64_t e = 0; e < nl; e++) same_inf &= (lse[0][e] == -INFINITY) == (lse[1][e] == -INFINITY);
    tu_check(same_inf && tu_worst_ratio(lse[1], ref_l, (size_t)nl, 1e-5, 1e-4) <= 1.0,
             "%s: auto's lse differs from tiled's", what);
    for (int s = 0; s < 2; s++) free(o[s]), free(lse[s]);
    free(ref_o), free(ref_l);
}

/* The decode driver's band: window edges whose sums with a query index
 * and the alignment offset leave int64. */
static void check_decode_windows(void) {
    lim_case c;
    const int64_t rights[] = {INT64_MAX - 1, INT64_MAX - 2, INT64_MAX - 30, (int64_t)1 << 62};
    for (int r = 0; r < 4; r++)
        for (int align = 0; align < 2; align++) {
            case_init(&c, 2, 3, 24, 8);
            c.p.masks.window_right = rights[r];
            c.p.masks.window_left = r % 2 ? 5 : -1;
            c.p.alignment = align ? FMHA_ALIGN_BOTTOM_RIGHT : FMHA_ALIGN_CAUSAL;
            char what[128];
            snprintf(what, sizeof what, "decode Sq 3 Skv 24 window (%lld, %lld)%s", (long long)c.p.masks.window_left,
                     (long long)rights[r], align ? " bottom-right" : "");
            decode_window_case(what, &c);
            case_free(&c);
        }
    /* window_left INT64_MAX, bottom-right, key lengths 1 and 0: off = 1 - 3, 0 - 3 */
    for (int causal = 0; causal < 2; causal++)
        for (int sq = 2; sq <= 3; sq++) {
            case_init(&c, 2, sq, 24, 8);
            c.kv_len[0] = 1, c.kv_len[1] = 0;
            c.p.masks.kv_lengths = c.kv_len;
            c.p.masks.window_left = INT64_MAX;
            if (causal) c.p.causal = FMHA_CAUSAL_BOTTOM_RIGHT;
            else c.p.alignment = FMHA_ALIGN_BOTTOM_RIGHT;
            char what[128];
            snprintf(what, sizeof what, "decode Sq %d Skv 24 window_left INT64_MAX %s, kv_lengths 1, 0", sq,
                     causal ? "causal bottom-right" : "aligned bottom-right");
            decode_window_case(what, &c);
            case_free(&c);
        }
}

/* fmha_problem_init and fmha_problem_check on extreme sizes: no overflow,
 * and a size error for anything out of range. */
static void check_sizes(void) {
    const int64_t vals[] = {INT64_MIN, INT64_MIN + 1, -1, 0, 1, 2, 3, 256, 257, 576, 577,
                            (int64_t)1 << 31, (int64_t)1 << 32, (int64_t)1 << 40,
                            ((int64_t)1 << 40) + 1, (int64_t)1 << 62, INT64_MAX - 1, INT64_MAX};
    const int nv = (int)(sizeof vals / sizeof vals[0]);
    fmha_problem p;
    /* the reported case */
    fmha_problem_init(&p, 1, 2, 1, INT64_MAX, 1, 2, 2, FMHA_LAYOUT_BSHD);
    tu_check(fmha_problem_check(&p) == FMHA_ERR_BAD_SIZE, "seq_q INT64_MAX: status %d",
             (int)fmha_problem_check(&p));
    /* every value in every position (the others valid), both layouts */
    for (int layout = 0; layout < 2; layout++)
        for (int field = 0; field < 7; field++)
            for (int i = 0; i < nv; i++) {
                int64_t sz[7] = {2, 2, 1, 3, 5, 4, 4};
                sz[field] = vals[i];
                fmha_problem_init(&p, sz[0], sz[1], sz[2], sz[3], sz[4], sz[5], sz[6],
                                  (fmha_layout)layout);
                fmha_status st = fmha_problem_check(&p);
                size_t bytes = 7;
                fmha_status sw = fmha_forward_workspace_size(&p, &bytes);
                tu_check(sw == st, "size %d = %lld: workspace query %d, check %d", field,
                         (long long)vals[i], (int)sw, (int)st);
                int64_t v = vals[i];
                int in_range = field >= 5 ? (v >= 1 && v <= FMHA_MAX_HEAD_DIM)
                                          : (v >= 1 && v <= (int64_t)1 << 40);
                if (field == 2 && v >= 1 && 2 % v != 0) in_range = 0; /* heads_q 2 must be a multiple */
                if (in_range) continue; /* may be fine or too big for memory: no claim */
                tu_check(st == FMHA_ERR_BAD_SIZE || st == FMHA_ERR_BAD_HEADS ||
                             st == FMHA_ERR_BAD_HEAD_DIM,
                         "size %d = %lld (layout %d): status %d, want a size error", field,
                         (long long)v, layout, (int)st);
            }
    /* all seven huge at once: every product of init overflows */
    for (int i = 0; i < nv; i++) {
        fmha_problem_init(&p, vals[i], vals[i], vals[i], vals[i], vals[i], vals[i], vals[i],
                          FMHA_LAYOUT_BHSD);
        fmha_status st = fmha_problem_check(&p);
        tu_check(vals[i] <= FMHA_MAX_HEAD_DIM || st != FMHA_OK, "all sizes %lld: status %d", (long long)vals[i],
                 (int)st);
    }
    /* head dims: 576 (D and Dv, MLA's 576 / 512 too) accepted, 577 refused */
    tu_check(FMHA_MAX_HEAD_DIM == 576, "FMHA_MAX_HEAD_DIM %d", FMHA_MAX_HEAD_DIM);
    const int64_t dims[][2] = {{576, 576}, {576, 512}, {512, 576}, {577, 512}, {576, 577}, {577, 577}};
    for (int i = 0; i < 6; i++) {
        fmha_problem_init(&p, 1, 2, 1, 3, 5, dims[i][0], dims[i][1], FMHA_LAYOUT_BSHD);
        fmha_status want = i < 3 ? FMHA_OK : FMHA_ERR_BAD_HEAD_DIM;
        tu_check(fmha_problem_check(&p) == want, "head dims %lld / %lld: status %d, want %d", (long long)dims[i][0],
                 (long long)dims[i][1], (int)fmha_problem_check(&p), (int)want);
    }
    /* batch x heads_q beyond int64 (each below the 2^40 size limit) */
    fmha_problem_init(&p, 1, 1, 1, 4, 4, 8, 8, FMHA_LAYOUT_BSHD);
    p.batch = (int64_t)1 << 32;
    p.heads_q = (int64_t)1 << 33;
    tu_check(fmha_problem_check(&p) == FMHA_ERR_BAD_SIZE, "batch 2^32 x heads_q 2^33: status %d",
             (int)fmha_problem_check(&p));
    /* Sq x Skv beyond int64: K and V broadcast (stride 0) so only the score count is huge */
    fmha_problem_init(&p, 1, 1, 1, (int64_t)1 << 30, (int64_t)1 << 40, 8, 8, FMHA_LAYOUT_BSHD);
    for (int i = 0; i < 4; i++) p.k_strides[i] = p.v_strides[i] = 0;
    size_t bytes = 7;
    fmha_status st = fmha_forward_workspace_size(&p, &bytes);
    tu_check(st == FMHA_ERR_BAD_SIZE && bytes == 7, "Sq 2^30 x Skv 2^40: status %d", (int)st);
}

/* Dense masks, biases and bias gradients whose strides reach past int64. */
static void check_extents(void) {
    lim_case c;
    case_init(&c, 4, 5, 6, 4);
    fmha_problem *p = &c.p;
    const int64_t n_o = 4 * 5 * 4, n_l = 4 * 5, n_g = 4 * 5 * 4;
    float *o = xmalloc(n_o * sizeof(float)), *lse = xmalloc(n_l * sizeof(float));
    float *dq = xmalloc(n_g * sizeof(float)), *dk = xmalloc(4 * 6 * 4 * sizeof(float));
    float *dv = xmalloc(4 * 6 * 4 * sizeof(float));
    uint8_t mask[1] = {1};
    float bias[1] = {0.0f}, d_bias[1];
    const float sent = -1234.5f;
    const int64_t huge = (int64_t)1 << 62;
    for (int which = 0; which < 3; which++) {
        for (int dim = 0; dim < 4; dim++) {
            fmha_problem e = *p;
            fmha_param_grads g = {0};
            const fmha_param_grads *gp = NULL;
            int64_t *st;
            if (which == 0) {
                e.masks.dense = mask;
                st = e.masks.dense_strides;
            } else {
                e.biases.dense = bias;
                st = e.biases.dense_strides;
                if (which == 2) {
                    g.d_dense = d_bias;
                    gp = &g;
                }
            }
            /* broadcast everywhere but dim, whose stride is huge (for the gradient,
             * the bias has stride 1 there: the broadcast patterns agree) */
            for (int i = 0; i < 4; i++) st[i] = 0;
            st[dim] = huge;
            if (which == 2) {
                for (int i = 0; i < 4; i++) g.d_dense_strides[i] = 0;
                g.d_dense_strides[dim] = huge;
                e.biases.dense_strides[dim] = 1; /* the bias itself is fine */
            }
            /* dims of extent 1 (heads) accept any stride */
            int64_t ext[4] = {e.batch, e.heads_q, e.seq_q, e.seq_kv};
            fmha_status want = ext[dim] > 1 ? FMHA_ERR_BAD_SIZE : FMHA_OK;
            const char *names[3] = {"dense mask", "dense bias", "dense bias gradient"};
            if (which < 2)
                tu_check(fmha_problem_check(&e) == want, "%s stride[%d] 2^62: check %d, want %d",
                         names[which], dim, (int)fmha_problem_check(&e), (int)want);
            if (want == FMHA_OK) continue;
            float *outs[5] = {o, lse, dq, dk, dv};
            const int64_t lens[5] = {n_o, n_l, n_g, 4 * 6 * 4, 4 * 6 * 4};
            for (int t = 0; t < 5; t++)
                for (int64_t i = 0; i < lens[t]; i++) outs[t][i] = sent;
            d_bias[0] = sent;
            fmha_status s1 = which == 2 ? want : fmha_forward(&e, c.q, c.k, c.v, o, lse, NULL, 0);
            fmha_status s2 = fmha_backward(&e, c.q, c.k, c.v, o, c.d_o, lse, dq, dk, dv, gp, NULL, 0);
            fmha_status s3 = fmha_forward_backward(&e, c.q, c.k, c.v, c.d_o, o, lse, dq, dk, dv, gp);
            size_t untouched = d_bias[0] == sent;
            for (int t = 0; t < 5; t++) untouched &= tu_count_not(outs[t], (size_t)lens[t], sent) == 0;
            tu_check(s1 == want && s2 == want && s3 == want && untouched,
                     "%s stride[%d] 2^62: forward %d, backward %d, forward_backward %d, want %d; "
                     "outputs %s", names[which], dim, (int)s1, (int)s2, (int)s3, (int)want,
                     untouched ? "untouched" : "WRITTEN");
        }
    }
    /* the gradient is checked before the sizes: any batch, no overflow */
    const int64_t batches[3] = {INT64_MIN, 0, INT64_MAX};
    for (int i = 0; i < 3; i++) {
        fmha_problem e = *p;
        fmha_param_grads g = {0};
        e.batch = batches[i];
        e.biases.dense = bias;
        e.biases.dense_strides[0] = 1;
        g.d_dense = d_bias;
        g.d_dense_strides[0] = 1;
        fmha_status st = fmha_backward(&e, c.q, c.k, c.v, o, c.d_o, lse, dq, dk, dv, &g, NULL, 0);
        tu_check(st == FMHA_ERR_BAD_SIZE, "batch %lld with a dense bias gradient: status %d",
                 (long long)batches[i], (int)st);
    }
    free(o), free(lse), free(dq), free(dk), free(dv);
    case_free(&c);
}

/* Dimensions of extent 1 accept any stride: INT64_MAX on every one of them
 * (Q, K, V, O, dense mask and bias) gives the results of contiguous strides. */
static void check_unit_strides(void) {
    const int64_t shapes[3][3] = {{1, 9, 8}, {9, 1, 8}, {5, 7, 1}}; /* Sq, Skv, D */
    for (int sh = 0; sh < 3; sh++) {
        lim_case c;
        case_init(&c, 1, shapes[sh][0], shapes[sh][1], shapes[sh][2]);
        fmha_problem *p = &c.p;
        int64_t nsc = p->seq_q * p->seq_kv;
        uint8_t *mask = malloc((size_t)nsc);
        float *bias = malloc((size_t)nsc * sizeof(float));
        if (!mask || !bias) abort();
        for (int64_t i = 0; i < nsc; i++) mask[i] = (uint8_t)(i % 3 != 1), bias[i] = (float)tu_uniform(-1, 1);
        /* [1, 1, Sq, Skv] row-major, INT64_MAX on the extent-1 dims */
        int64_t ms[4] = {INT64_MAX, INT64_MAX, p->seq_kv, 1};
        if (p->seq_q == 1) ms[2] = INT64_MAX;
        if (p->seq_kv == 1) ms[3] = INT64_MAX, ms[2] = 1;
        p->masks.dense = mask;
        p->biases.dense = bias;
        memcpy(p->masks.dense_strides, ms, sizeof ms);
        memcpy(p->biases.dense_strides, ms, sizeof ms);
        int64_t *sts[4] = {p->q_strides, p->k_strides, p->v_strides, p->o_strides};
        for (int t = 0; t < 4; t++) {
            int64_t n[4];
            tu_shape(p, "qkvo"[t], n);
            for (int i = 0; i < 4; i++)
                if (n[i] == 1) sts[t][i] = INT64_MAX;
        }
        char what[96];
        snprintf(what, sizeof what, "INT64_MAX strides on extent-1 dims, Sq %lld Skv %lld D %lld",
                 (long long)shapes[sh][0], (long long)shapes[sh][1], (long long)shapes[sh][2]);
        window_case(what, &c);
        free(mask), free(bias);
        case_free(&c);
    }
}

int main(void) {
    tu_seed();
    check_unit_strides();
    check_windows();
    check_decode_windows();
    check_sizes();
    check_extents();
    return tu_finish();
}
