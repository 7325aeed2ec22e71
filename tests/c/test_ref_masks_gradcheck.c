/* test_ref_masks_gradcheck.c: checks the float64 mask-and-bias reference
 * (fmha_ref_masks.h) itself, since test_masks trusts it.
 *
 * Forward: against the plain reference (causal only), against equivalent
 * formulations (a mask callback that reproduces causal masking, a dense mask
 * that reproduces a window, a dense bias holding the ALiBi and table values),
 * the visibility rules on a hand-worked example and fully masked rows.
 *
 * Backward: central finite differences of L = sum(O * dO) from the reference
 * forward against the reference backward on tiny shapes, for dQ, dK, dV,
 * the dense bias (full and broadcast shapes: the full gradient summed over
 * the broadcast dims), the ALiBi slopes, the relative-position table and a
 * callback bias's parameters, with softcap on and off, under combinations of
 * every mask. Inputs are multiples of 2^-10, steps h = 2^-7 and h/2 (exact
 * in float32; h = 2^-10 for the ALiBi slopes, whose loss derivatives grow
 * like |a|^n), Richardson-extrapolated; check:
 *   |fd - analytic| <= 1e-9 * max(1, max |analytic|) over each tensor
 * (truncation O(h^4) and rounding ~1e-13 on O(1) inputs; a wrong term gives
 * errors > 1e-6). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fmha_ref.h"
#include "fmha_ref_masks.h"
#include "test_util.h"

#define FD_TOL 1e-9

static double grid(double x) { return nearbyint(x * 1024.0) / 1024.0; }

/* Inputs on the 2^-10 grid in [-1, 1]. */
static float *grid_input(const fmha_problem *p, char which) {
    int64_t n[4];
    const int64_t *st = tu_shape(p, which, n);
    float *x = tu_new_input(p, which, -1.0, 1.0);
    for (int64_t b = 0; b < n[0]; b++)
        for (int64_t s = 0; s < n[1]; s++)
            for (int64_t h = 0; h < n[2]; h++)
                for (int64_t d = 0; d < n[3]; d++) {
                    float *e = tu_elem(x, st, b, s, h, d);
                    *e = (float)grid(*e);
                }
    return x;
}

/* n grid values uniform in [lo, hi). */
static float *grid_array(size_t n, double lo, double hi) {
    float *x = malloc((n ? n : 1) * sizeof(float));
    if (!x) abort();
    for (size_t i = 0; i < n; i++) x[i] = (float)grid(tu_uniform(lo, hi));
    return x;
}

/* ---- a callback bias: w[h][(3 i + 5 j) mod CB_NP], its gradient via accumulate_grad
 * is not needed here (the reference's d_bias_dense covers it) ---- */
#define CB_NP 7
typedef struct cb_bias {
    float *w; /* [Hq][CB_NP] */
} cb_bias;

static int cb_index(int64_t i, int64_t j) { return (int)((3 * i + 5 * j) % CB_NP); }

static void cb_bias_fill(void *ctx, const fmha_tile *t, float *scores) {
    const cb_bias *c = ctx;
    for (int64_t i = 0; i < t->nq; i++)
        for (int64_t r = 0; r < t->nk; r++)
            scores[i * t->q_stride + r * t->k_stride] +=
                c->w[t->head_q * CB_NP + cb_index(t->q0 + i, t->k0 + r)];
}

/* ---- a mask callback that reproduces top-left causal masking ---- */
static int causal_classify(void *ctx, const fmha_tile *t) {
    (void)ctx;
    if (t->k0 > t->q0 + t->nq - 1) return FMHA_TILE_CLASS_EMPTY;
    if (t->k0 + t->nk - 1 <= t->q0) return FMHA_TILE_CLASS_FULL;
    return FMHA_TILE_CLASS_PARTIAL;
}

static void causal_fill(void *ctx, const fmha_tile *t, uint8_t *vis) {
    (void)ctx;
    for (int64_t i = 0; i < t->nq; i++)
        for (int64_t r = 0; r < t->nk; r++)
            if (t->k0 + r > t->q0 + i) vis[i * t->q_stride + r * t->k_stride] = 0;
}

/* ---- problem description of one gradcheck ---- */
enum {
    G_BIAS = 1 << 0,     /* dense bias */
    G_ALIBI = 1 << 1,
    G_REL = 1 << 2,      /* bidirectional table */
    G_REL_UNI = 1 << 3,  /* unidirectional table */
    G_SOFTCAP = 1 << 4,
    G_CB_BIAS = 1 << 5,
    G_WINDOW = 1 << 6,
    G_KVLEN = 1 << 7,
    G_QLEN = 1 << 8,
    G_SEG = 1 << 9,
    G_DMASK = 1 << 10,   /* dense mask [1, 1, Sq, Skv] */
    G_CB_MASK = 1 << 11
};

/* Bias broadcast shapes: 0 full [B, Hq, Sq, Skv], 1 [1, Hq, Sq, Skv], 2 [B, 1, 1, Skv]. */
static void bias_strides(const fmha_problem *p, int shape, int64_t st[4]) {
    const int64_t sq = p->seq_q, skv = p->seq_kv, hq = p->heads_q;
    if (shape == 0) {
        st[3] = 1, st[2] = skv, st[1] = sq * skv, st[0] = hq * sq * skv;
    } else if (shape == 1) {
        st[3] = 1, st[2] = skv, st[1] = sq * skv, st[0] = 0;
    } else {
        st[3] = 1, st[2] = 0, st[1] = 0, st[0] = skv;
    }
}

/* Elements of a tensor [B, Hq, Sq, Skv] with strides st: 1 + sum (n - 1) st. */
static size_t bias_span(const fmha_problem *p, const int64_t st[4]) {
    const int64_t n[4] = {p->batch, p->heads_q, p->seq_q, p->seq_kv};
    size_t span = 1;
    for (int a = 0; a < 4; a++) span += (size_t)((n[a] - 1) * st[a]);
    return span;
}

/* out[offset(st)] = sum of full [B, Hq, Sq, Skv] over the positions mapping there. */
static void reduce_full(const fmha_problem *p, const double *full, const int64_t st[4], double *out) {
    memset(out, 0, bias_span(p, st) * sizeof(double));
    size_t t = 0;
    for (int64_t b = 0; b < p->batch; b++)
        for (int64_t h = 0; h < p->heads_q; h++)
            for (int64_t i = 0; i < p->seq_q; i++)
                for (int64_t j = 0; j < p->seq_kv; j++)
                    out[b * st[0] + h * st[1] + i * st[2] + j * st[3]] += full[t++];
}

typedef struct gc_case {
    fmha_problem p;
    float *q, *k, *v, *d_o;
    float *bias, *slopes, *table;
    int32_t *kv_len, *q_len, *qseg, *kvseg;
    uint8_t *dmask;
    cb_bias cb;
    double *o; /* scratch [B, Sq, Hq, Dv] */
} gc_case;

/* L = sum(O * dO) with the reference forward. */
static double loss(gc_case *c) {
    const fmha_problem *p = &c->p;
    if (fmha_ref_forward_full(p, c->q, c->k, c->v, c->o, NULL) != 0) abort();
    double l = 0.0;
    size_t t = 0;
    for (int64_t b = 0; b < p->batch; b++)
        for (int64_t i = 0; i < p->seq_q; i++)
            for (int64_t h = 0; h < p->heads_q; h++)
                for (int64_t e = 0; e < p->head_dim_v; e++)
                    l += c->o[t++] * (double)*tu_elem(c->d_o, p->o_strides, b, i, h, e);
    return l;
}

/* Richardson-extrapolated central difference of the loss in *x, step h. */
static double fd_at(gc_case *c, float *x, double h) {
    const double steps[4] = {h, -h, h / 2, -h / 2};
    const float x0 = *x;
    double l[4];
    for (int u = 0; u < 4; u++) {
        *x = (float)(x0 + steps[u]);
        l[u] = loss(c);
    }
    *x = x0;
    const double d1 = (l[0] - l[1]) / (2 * h), d2 = (l[2] - l[3]) / h;
    return (4 * d2 - d1) / 3;
}

/* Checks n analytic values g[t] against the differences (step h) at x[t]. */
static double fd_flat(const char *name, const char *what, gc_case *c, float *x, double h,
                      const double *g, size_t n) {
    double worst = 0.0, gmax = tu_max_abs_d(g, n);
    for (size_t t = 0; t < n; t++) {
        double err = fabs(fd_at(c, x + t, h) - g[t]);
        if (err > worst) worst = err;
    }
    const double norm = gmax > 1.0 ? gmax : 1.0;
    tu_check(worst <= FD_TOL * norm, "%s: %s finite-difference error %.3g > %.3g", name, what,
             worst, FD_TOL * norm);
    return worst / norm;
}

/* The same for a strided tensor 'q', 'k', 'v' (g contiguous in its shape). */
static double fd_tensor(const char *name, gc_case *c, char which, const double *g) {
    float *x = which == 'q' ? c->q : which == 'k' ? c->k : c->v;
    int64_t n[4];
    const int64_t *st = tu_shape(&c->p, which, n);
    double worst = 0.0, gmax = tu_max_abs_d(g, tu_numel(n));
    size_t t = 0;
    for (int64_t b = 0; b < n[0]; b++)
        for (int64_t s = 0; s < n[1]; s++)
            for (int64_t hh = 0; hh < n[2]; hh++)
                for (int64_t d = 0; d < n[3]; d++, t++) {
                    double err = fabs(fd_at(c, tu_elem(x, st, b, s, hh, d), 0x1.0p-7) - g[t]);
                    if (err > worst) worst = err;
                }
    const double norm = gmax > 1.0 ? gmax : 1.0;
    tu_check(worst <= FD_TOL * norm, "%s: d%c finite-difference error %.3g > %.3g", name, which,
             worst, FD_TOL * norm);
    return worst / norm;
}

static void gc_free(gc_case *c) {
    free(c->q), free(c->k), free(c->v), free(c->d_o), free(c->bias), free(c->slopes);
    free(c->table), free(c->kv_len), free(c->q_len), free(c->qseg), free(c->kvseg);
    free(c->dmask), free(c->cb.w), free(c->o);
}

static void gradcheck(const char *name, int64_t B, int64_t hq, int64_t hkv, int64_t sq,
                      int64_t skv, int64_t d, int64_t dv, fmha_causal causal, int flags,
                      int bias_shape, int layout) {
    gc_case c;
    memset(&c, 0, sizeof c);
    fmha_problem *p = &c.p;
    tu_problem(p, B, hq, hkv, sq, skv, d, dv);
    tu_set_layout(p, layout);
    p->causal = causal;
    p->masks.window_left = p->masks.window_right = -1;
    c.q = grid_input(p, 'q'), c.k = grid_input(p, 'k'), c.v = grid_input(p, 'v');
    c.d_o = grid_input(p, 'o');
    c.o = malloc(sizeof(double) * (size_t)(B * sq * hq * dv));
    int64_t bst[4];
    bias_strides(p, bias_shape, bst);
    const size_t nbias = bias_span(p, bst);
    if (flags & G_BIAS) {
        c.bias = grid_array(nbias, -1, 1);
        p->biases.dense = c.bias;
        memcpy(p->biases.dense_strides, bst, sizeof bst);
    }
    if (flags & G_ALIBI) {
        c.slopes = grid_array((size_t)hq, 0.05, 0.5);
        p->biases.alibi_slopes = c.slopes;
    }
    if (flags & (G_REL | G_REL_UNI)) {
        p->biases.rel_num_buckets = 6;
        p->biases.rel_max_distance = 5;
        p->biases.rel_bidirectional = (flags & G_REL) != 0;
        c.table = grid_array((size_t)(hq * 6), -1, 1);
        p->biases.rel_table = c.table;
    }
    if (flags & G_SOFTCAP) p->biases.softcap = 1.25f;
    if (flags & G_CB_BIAS) {
        c.cb.w = grid_array((size_t)(hq * CB_NP), -1, 1);
        p->biases.callback = (fmha_bias_callback){cb_bias_fill, NULL, &c.cb};
    }
    if (flags & G_WINDOW) p->masks.window_left = 2, p->masks.window_right = 1;
    if (flags & G_KVLEN) {
        c.kv_len = malloc((size_t)B * sizeof(int32_t));
        for (int64_t b = 0; b < B; b++) c.kv_len[b] = (int32_t)(skv - 1 - b % 2);
        p->masks.kv_lengths = c.kv_len;
    }
    if (flags & G_QLEN) {
        c.q_len = malloc((size_t)B * sizeof(int32_t));
        for (int64_t b = 0; b < B; b++) c.q_len[b] = (int32_t)(sq - 1 - b % 2);
        p->masks.q_lengths = c.q_len;
    }
    if (flags & G_SEG) {
        c.qseg = malloc((size_t)(B * sq) * sizeof(int32_t));
        c.kvseg = malloc((size_t)(B * skv) * sizeof(int32_t));
        for (int64_t t = 0; t < B * sq; t++) c.qseg[t] = (int32_t)((t % sq) * 2 / sq);
        for (int64_t t = 0; t < B * skv; t++) c.kvseg[t] = (int32_t)((t % skv) * 2 / skv);
        p->masks.q_segment_ids = c.qseg, p->masks.kv_segment_ids = c.kvseg;
    }
    if (flags & G_DMASK) {
        /* [1, 1, Sq, Skv]: key (i + 1) mod Skv hidden from query i */
        c.dmask = malloc((size_t)(sq * skv));
        for (int64_t i = 0; i < sq; i++)
            for (int64_t j = 0; j < skv; j++) c.dmask[i * skv + j] = j != (i + 1) % skv;
        p->masks.dense = c.dmask;
        p->masks.dense_strides[0] = p->masks.dense_strides[1] = 0;
        p->masks.dense_strides[2] = skv, p->masks.dense_strides[3] = 1;
    }
    if (flags & G_CB_MASK) p->masks.callback = (fmha_mask_callback){causal_classify, causal_fill, NULL};

    /* analytic: dq [B, Sq, Hq, D], dk [B, Skv, Hkv, D], dvv [B, Skv, Hkv, Dv],
     * dfull [B, Hq, Sq, Skv], dal [Hq], drel [Hq, 6] */
    double *dq = malloc(sizeof(double) * (size_t)(B * sq * hq * d));
    double *dk = malloc(sizeof(double) * (size_t)(B * skv * hkv * d));
    double *dvv = malloc(sizeof(double) * (size_t)(B * skv * hkv * dv));
    double *dfull = malloc(sizeof(double) * (size_t)(B * hq * sq * skv));
    double *dal = malloc(sizeof(double) * (size_t)hq), *drel = malloc(sizeof(double) * (size_t)(hq * 6));
    int rc = fmha_ref_backward_full(p, c.q, c.k, c.v, c.d_o, dq, dk, dvv, dfull, dal,
                                    c.table ? drel : NULL);
    tu_check(rc == 0, "%s: reference backward failed", name);
    double w = fd_tensor(name, &c, 'q', dq), t;
    if ((t = fd_tensor(name, &c, 'k', dk)) > w) w = t;
    if ((t = fd_tensor(name, &c, 'v', dvv)) > w) w = t;
    if (c.bias) {
        double *dred = malloc(nbias * sizeof(double));
        reduce_full(p, dfull, bst, dred);
        if ((t = fd_flat(name, "dense bias", &c, c.bias, 0x1.0p-7, dred, nbias)) > w) w = t;
        free(dred);
    }
    if (c.slopes && (t = fd_flat(name, "alibi slopes", &c, c.slopes, 0x1.0p-10, dal, (size_t)hq)) > w) w = t;
    if (c.table && (t = fd_flat(name, "rel table", &c, c.table, 0x1.0p-7, drel, (size_t)(hq * 6))) > w) w = t;
    if (c.cb.w) {
        /* d w[h][e] = sum of d bias over the (b, i, j) with cb_index(i, j) == e */
        double *dw = calloc((size_t)(hq * CB_NP), sizeof(double));
        size_t u = 0;
        for (int64_t b = 0; b < B; b++)
            for (int64_t h = 0; h < hq; h++)
                for (int64_t i = 0; i < sq; i++)
                    for (int64_t j = 0; j < skv; j++) dw[h * CB_NP + cb_index(i, j)] += dfull[u++];
        if ((t = fd_flat(name, "callback bias", &c, c.cb.w, 0x1.0p-7, dw, (size_t)(hq * CB_NP))) > w) w = t;
        free(dw);
    }
    /* masked scores have zero bias gradient */
    int masked_zero = 1;
    size_t u = 0;
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < hq; h++)
            for (int64_t i = 0; i < sq; i++)
                for (int64_t j = 0; j < skv; j++, u++)
                    if (!fmha_ref_full_visible(p, b, h, i, j)) masked_zero &= dfull[u] == 0.0;
    tu_check(masked_zero, "%s: masked scores have a nonzero bias gradient", name);
    printf("%-52s worst |fd - analytic| / max(1, max|g|) = %.2e\n", name, w);
    free(dq), free(dk), free(dvv), free(dfull), free(dal), free(drel);
    gc_free(&c);
}

/* ---- forward against equivalent formulations ------------------------------ */

static double max_diff(const double *a, const double *b, size_t n) {
    double m = 0.0;
    for (size_t i = 0; i < n; i++) {
        if (a[i] == b[i]) continue; /* also equal infinities */
        double d = fabs(a[i] - b[i]);
        if (!(d <= m)) m = d; /* NaN propagates */
    }
    return m;
}

/* Runs the full reference on p and p2 and returns the largest difference of o and lse. */
static double compare_problems(const fmha_problem *p, const fmha_problem *p2, const float *q,
                               const float *k, const float *v) {
    size_t no = (size_t)(p->batch * p->seq_q * p->heads_q * p->head_dim_v);
    size_t nl = (size_t)(p->batch * p->heads_q * p->seq_q);
    double *r1 = malloc((no + nl) * sizeof(double)), *r2 = malloc((no + nl) * sizeof(double));
    fmha_ref_forward_full(p, q, k, v, r1, r1 + no);
    fmha_ref_forward_full(p2, q, k, v, r2, r2 + no);
    double m = max_diff(r1, r2, no + nl);
    free(r1), free(r2);
    return m;
}

static void check_equivalences(void) {
    fmha_problem p;
    tu_problem(&p, 2, 4, 2, 37, 53, 8, 6);
    p.masks.window_left = p.masks.window_right = -1;
    float *q = tu_new_input(&p, 'q', -1, 1), *k = tu_new_input(&p, 'k', -1, 1);
    float *v = tu_new_input(&p, 'v', -1, 1);
    size_t no = (size_t)(2 * 37 * 4 * 6), nl = (size_t)(2 * 4 * 37);
    double *r1 = malloc((no + nl) * sizeof(double)), *r2 = malloc((no + nl) * sizeof(double));

    /* the plain reference, each causal alignment */
    for (int causal = 0; causal < 3; causal++) {
        fmha_problem pc = p;
        pc.causal = (fmha_causal)causal;
        fmha_ref_forward(&pc, q, k, v, r1, r1 + no);
        fmha_ref_forward_full(&pc, q, k, v, r2, r2 + no);
        double m = max_diff(r1, r2, no + nl);
        tu_check(m <= 1e-14, "full vs plain reference (%s): %.3g", tu_causal_name(causal), m);
    }
    /* a mask callback reproducing top-left causal masking */
    fmha_problem pa = p, pb = p;
    pa.causal = FMHA_CAUSAL_TOP_LEFT;
    pb.masks.callback = (fmha_mask_callback){causal_classify, causal_fill, NULL};
    double m = compare_problems(&pa, &pb, q, k, v);
    tu_check(m == 0.0, "causal mask callback vs causal: %.3g", m);
    /* a dense mask [Sq, Skv] reproducing window (3, 2) in bottom-right coordinates */
    uint8_t *dm = malloc(37 * 53);
    for (int64_t i = 0; i < 37; i++)
        for (int64_t j = 0; j < 53; j++) {
            int64_t a = i + (53 - 37) - j;
            dm[i * 53 + j] = a <= 3 && a >= -2;
        }
    pa = p, pb = p;
    pa.causal = FMHA_CAUSAL_BOTTOM_RIGHT; /* pb: the dense mask alone */
    pa.masks.window_left = 3, pa.masks.window_right = 2;
    /* causal caps window_right at 0: the dense mask must say a >= 0 too */
    for (int64_t i = 0; i < 37; i++)
        for (int64_t j = 0; j < 53; j++) dm[i * 53 + j] &= i + (53 - 37) - j >= 0;
    pb.masks.dense = dm;
    pb.masks.dense_strides[0] = pb.masks.dense_strides[1] = 0;
    pb.masks.dense_strides[2] = 53, pb.masks.dense_strides[3] = 1;
    m = compare_problems(&pa, &pb, q, k, v);
    tu_check(m == 0.0, "window + causal vs the same dense mask: %.3g", m);
    /* ALiBi + T5 table vs a dense bias [1, Hq, Sq, Skv] holding their values
     * (float32 sums of floats: bias values differ by rounding only) */
    float slopes[4] = {0.5f, 0.25f, 0.125f, 0.0625f}, table[4 * 10];
    for (int e = 0; e < 40; e++) table[e] = (float)tu_uniform(-1, 1);
    float *dense = malloc(sizeof(float) * 4 * 37 * 53);
    for (int64_t h = 0; h < 4; h++)
        for (int64_t i = 0; i < 37; i++)
            for (int64_t j = 0; j < 53; j++) {
                int64_t a = i - j;
                dense[(h * 37 + i) * 53 + j] =
                    (float)(-(double)slopes[h] * (double)(a < 0 ? -a : a) +
                            table[h * 10 + fmha_rel_bucket(-a, 10, 20, 1)]);
            }
    pa = p, pb = p;
    pa.biases.alibi_slopes = slopes;
    pa.biases.rel_table = table;
    pa.biases.rel_num_buckets = 10, pa.biases.rel_max_distance = 20, pa.biases.rel_bidirectional = 1;
    pb.biases.dense = dense;
    pb.biases.dense_strides[0] = 0, pb.biases.dense_strides[1] = 37 * 53;
    pb.biases.dense_strides[2] = 53, pb.biases.dense_strides[3] = 1;
    m = compare_problems(&pa, &pb, q, k, v);
    tu_check(m <= 1e-5, "ALiBi + table vs the same dense bias: %.3g", m);
    /* softcap 1e30 is the identity in double to ~1e-60 */
    pa = p, pb = p;
    pb.biases.softcap = 1e30f;
    m = compare_problems(&pa, &pb, q, k, v);
    tu_check(m <= 1e-14, "softcap 1e30 vs none: %.3g", m);
    free(dm), free(dense), free(r1), free(r2), free(q), free(k), free(v);
}

/* Visibility on a hand-worked example, and fully masked rows. */
static void check_visibility(void) {
    fmha_problem p;
    tu_problem(&p, 2, 1, 1, 4, 6, 2, 2);
    p.masks.window_left = 1, p.masks.window_right = 0;
    /* bottom-right per sequence: off = kv_len[b] - q_len[b], a = i + off - j */
    p.causal = FMHA_CAUSAL_BOTTOM_RIGHT;
    int32_t kvl[2] = {6, 3}, ql[2] = {4, 2};
    p.masks.kv_lengths = kvl, p.masks.q_lengths = ql;
    /* batch 0 (off 2): j in {i + 1, i + 2}; batch 1 (off 1): j in {i, i + 1},
     * j < 3 and i < 2 */
    int bad = 0;
    for (int64_t b = 0; b < 2; b++)
        for (int64_t i = 0; i < 4; i++)
            for (int64_t j = 0; j < 6; j++) {
                int64_t off = kvl[b] - ql[b];
                int expect = (j == i + off - 1 || j == i + off) && j < kvl[b] && i < ql[b];
                bad += fmha_ref_full_visible(&p, b, 0, i, j) != expect;
            }
    tu_check(bad == 0, "hand-worked visibility: %d wrong", bad);
    /* segments and a dense [B, 1, 1, Skv] mask */
    fmha_problem ps;
    tu_problem(&ps, 2, 2, 1, 3, 4, 2, 2);
    ps.masks.window_left = ps.masks.window_right = -1;
    int32_t qs[6] = {0, 0, 1, 5, 5, 5}, ks[8] = {0, 1, 1, 2, 5, 4, 5, 5};
    uint8_t dm[8] = {1, 1, 0, 1, 1, 1, 1, 0};
    ps.masks.q_segment_ids = qs, ps.masks.kv_segment_ids = ks, ps.masks.dense = dm;
    ps.masks.dense_strides[0] = 4, ps.masks.dense_strides[1] = 0;
    ps.masks.dense_strides[2] = 0, ps.masks.dense_strides[3] = 1;
    bad = 0;
    for (int64_t b = 0; b < 2; b++)
        for (int64_t h = 0; h < 2; h++)
            for (int64_t i = 0; i < 3; i++)
                for (int64_t j = 0; j < 4; j++) {
                    int expect = qs[b * 3 + i] == ks[b * 4 + j] && dm[b * 4 + j];
                    bad += fmha_ref_full_visible(&ps, b, h, i, j) != expect;
                }
    tu_check(bad == 0, "segments + dense mask visibility: %d wrong", bad);
    /* rows with nothing visible (batch 1, queries 2 and 3: q_lengths) give
     * O = 0, lse = -inf; every other row sees a key */
    float *q = tu_new_input(&p, 'q', -1, 1), *k = tu_new_input(&p, 'k', -1, 1);
    float *v = tu_new_input(&p, 'v', -1, 1);
    double o[2 * 4 * 2], lse[2 * 4];
    fmha_ref_forward_full(&p, q, k, v, o, lse);
    int ok = 1;
    for (int64_t r = 0; r < 8; r++) {
        if (r == 6 || r == 7) ok &= lse[r] == -INFINITY && o[r * 2] == 0.0 && o[r * 2 + 1] == 0.0;
        else ok &= isfinite(lse[r]);
    }
    tu_check(ok, "fully masked rows: O = 0, lse = -inf");
    free(q), free(k), free(v);
}

int main(void) {
    tu_seed();
    check_visibility();
    check_equivalences();
    gradcheck("biases (dense, alibi, rel, softcap), no mask", 2, 2, 1, 3, 5, 3, 2,
              FMHA_CAUSAL_NONE, G_BIAS | G_ALIBI | G_REL | G_SOFTCAP, 0, TU_LAYOUT_BSHD);
    gradcheck("bias [1,Hq,Sq,Skv] + window + bottom-right + kv_len", 2, 2, 2, 4, 6, 2, 3,
              FMHA_CAUSAL_BOTTOM_RIGHT, G_BIAS | G_WINDOW | G_KVLEN | G_ALIBI, 1, TU_LAYOUT_PADDED);
    gradcheck("bias [B,1,1,Skv] + segments + q_len + mask [1,1,Sq,Skv]", 2, 2, 1, 5, 4, 3, 2,
              FMHA_CAUSAL_NONE, G_BIAS | G_SEG | G_QLEN | G_DMASK | G_REL_UNI, 2, TU_LAYOUT_BHSD);
    gradcheck("callback mask (causal) + callback bias + softcap", 1, 2, 1, 4, 4, 2, 2,
              FMHA_CAUSAL_NONE, G_CB_MASK | G_CB_BIAS | G_SOFTCAP | G_REL, 0, TU_LAYOUT_PADDED2);
    gradcheck("everything, top-left, Sq > Skv", 2, 2, 1, 5, 4, 2, 2, FMHA_CAUSAL_TOP_LEFT,
              G_BIAS | G_ALIBI | G_REL | G_SOFTCAP | G_CB_BIAS | G_WINDOW | G_KVLEN | G_QLEN | G_SEG,
              1, TU_LAYOUT_BSHD);
    return tu_finish();
}
