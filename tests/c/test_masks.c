/* test_masks.c: masks and biases of fmha_forward and fmha_backward (with
 * fmha_param_grads) against the float64 reference fmha_ref_masks.h, for
 * every strategy (auto, tiled, dense, portable) under every instruction set
 * this CPU runs (fmha_cpu_force_isa).
 *
 * Cases: each source alone and in combinations (window + causal, lengths +
 * rel table, segments + dense bias, dense masks [B,Hq,Sq,Skv], [1,1,Sq,Skv]
 * and [B,1,1,Skv], ALiBi + softcap, a mask callback reproducing causal
 * masking, a bias callback whose accumulate_grad sums into per-thread
 * accumulators, fully masked rows from q_lengths 0, kv_lengths 0 and
 * windows), dense bias gradients of broadcast shapes [1,Hq,Sq,Skv] and
 * [B,1,1,Skv] against the full reference gradient summed over the broadcast
 * dims, then random combinations; shapes are random from the printed seed
 * (tails off every block size, Sq != Skv, GQA, D != Dv, every layout).
 * Also: block skipping proven by counting computed tiles, the rel-table
 * gradient's precision at S = 4096 (1024 under FMHA_TEST_QUICK), fmha_rel_bucket on hand-computed values,
 * and bad arguments (each rejected with nothing written).
 *
 * Tolerances (float32 library vs float64 reference):
 *   O, dQ, dK, dV, dense bias gradient: ||x - r|| / ||r|| <= 2e-5, and per
 *     element |x - r| <= atol + rtol |r| with O: atol = 1e-5 max|V|, rtol
 *     1e-4; gradients: atol = 2e-5 max|r|, rtol = 2e-4. Each element is a
 *     float32 sum of up to Skv (or Sq) products whose error is a few float32
 *     epsilons (6e-8) of the largest terms; biases of size ~10 in the scores
 *     add a few epsilons of 10 to each score. dQ, dK and the dense bias
 *     gradient sum dS = P (dP - sum P dP), which cancels when a row is nearly
 *     one-hot (large ALiBi slopes, one or two visible keys): there ||r|| and
 *     max|r| are floored at 0.05 of the same norms of m, the size of the
 *     terms (dS replaced by P (|dP| + |sum P dP|), q and k by |q| and |k|).
 *     Observed: error / ||m|| <= 6e-7 everywhere; ||r|| / ||m|| is 0.2 at the
 *     median and below 0.05 in ~3% of comparisons, down to 0.002, where the
 *     plain relative error reaches 1e-5 from float32 rounding of O alone.
 *   lse: |x - r| <= 1e-5 (1 + smax) + 1e-5 |r|, smax = max |lse| + 10, the
 *     size of the scores that matter (float32 scores are exact to a few
 *     epsilons of their size).
 *   ALiBi, rel-table and callback-bias parameter gradients: ||x - r|| <=
 *     1e-5 ||m||, m[e] the sum over the scores entry e collects of P (|dP| +
 *     |sum P dP|) (times |a| for ALiBi), the size of the terms dS = P (dP -
 *     sum P dP) subtracts. An entry's dS may cancel exactly (a bucket holding
 *     whole rows sums to 0; a row with one visible key has dS = 0), so float32
 *     is accurate only relative to m. The S = 4096 rel-table check, whose
 *     buckets each sum up to a sixteenth of the S^2 scores, holds the sums'
 *     accumulation itself: ||x - r|| <= 4e-9 ||m|| (about 2^-24 / 15).
 *     Measured 2.1e-10 to 9.6e-10 ||m|| (35 seeds; up to 1.5e-9 at the quick
 *     S = 1024); one float32 sum a bucket over every score errs 1.0e-8 to
 *     1.7e-8 ||m|| (3.7e-9 to 3.2e-8 at S = 1024), float32 sums per row
 *     3.7e-10 to 6.5e-10. The plain ||x - r|| / ||r|| (printed) is that
 *     over ||r|| / ||m||, 7.7e-5 to 4.6e-4 on those draws: it measures the
 *     draw's cancellation (sums per row reach 8.4e-6 on one), not the sum.
 *   Fully masked rows: O and dQ exactly 0, lse exactly -inf; keys no query
 *     sees: dK, dV exactly 0; masked scores: dense bias gradient exactly 0.
 *   Every output's padding and the words after lse and the parameter
 *   gradients keep their sentinel. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/attn.h"
#include "config/cpu.h"
#include "fmha_ref_masks.h"
#include "test_util.h"

#define O_ATOL_V 1e-5 /* times max |V| */
#define O_RTOL 1e-4
#define REL_L2 2e-5
#define G_ATOL 2e-5 /* times max |r| of the tensor */
#define G_RTOL 2e-4
#define PARAM_REL 1e-5
#define REL_SUM_M 4e-9 /* the S = 4096 rel-table gradient, of its terms' size */
#define MAG_FLOOR 0.05 /* see the tolerances above */
#define LSE_TOL 1e-5
#define GUARD 16 /* sentinel floats after lse and the parameter gradients */

/* The ISAs of the registry (src/config/cpu.c), in its order; isa_ok: those this
 * CPU runs, less tables whose float32 kernels an earlier one already runs
 * (this test is float32 only). */
#define MAX_ISA 16
static int n_isa;
static int isa_ok[MAX_ISA];
static const char *isa_name(int i) { return fmha_isa_at((size_t)i)->name; }
static const char *isa_default;
static int nthreads;
static int verbose; /* FMHA_TEST_VERBOSE=1 prints every case's worst errors; 2 also each
                     * comparison's conditioning ||r|| / ||m|| */

static float sentinel(void) {
    uint32_t u = 0x7fc0beefu;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) abort();
    return p;
}

/* n floats of sentinel followed by GUARD more. */
static float *new_guarded(size_t n) {
    float *x = xmalloc((n + GUARD) * sizeof(float));
    const float s = sentinel();
    for (size_t i = 0; i < n + GUARD; i++) x[i] = s;
    return x;
}

/* ---- worst errors ---------------------------------------------------------
 * per label and per (strategy, isa): O rel L2, gradient rel L2 (dQ, dK, dV,
 * dense bias), parameter gradient error (ALiBi, table, callback; relative to
 * its scale, see param_err), elementwise ratio */
enum { W_O, W_GRAD, W_PARAM, W_RATIO, W_N };
#define MAX_LABELS 64
static char labels[MAX_LABELS][64];
static double worst_label[MAX_LABELS][W_N];
static int n_labels;
static double worst_si[4][MAX_ISA][W_N];
static double case_worst[W_N];

static int label_index(const char *label) {
    for (int i = 0; i < n_labels; i++)
        if (!strcmp(labels[i], label)) return i;
    if (n_labels == MAX_LABELS) return MAX_LABELS - 1;
    snprintf(labels[n_labels], sizeof labels[0], "%s", label);
    return n_labels++;
}

static void note(int li, int s, int ii, int what, double x) {
    if (x > case_worst[what]) case_worst[what] = x;
    if (x > worst_label[li][what]) worst_label[li][what] = x;
    if (x > worst_si[s][ii][what]) worst_si[s][ii][what] = x;
}

/* ---- callbacks ------------------------------------------------------------ */

/* Mask callback reproducing causal masking at offset off: key j visible from
 * query i iff i + off - j >= 0. */
typedef struct causal_cb {
    int64_t off;
} causal_cb;

static int causal_classify(void *ctx, const fmha_tile *t) {
    const causal_cb *c = ctx;
    int64_t a_max = t->q0 + t->nq - 1 + c->off - t->k0, a_min = t->q0 + c->off - (t->k0 + t->nk - 1);
    if (a_max < 0) return FMHA_TILE_CLASS_EMPTY;
    if (a_min >= 0) return FMHA_TILE_CLASS_FULL;
    return FMHA_TILE_CLASS_PARTIAL;
}

static void causal_fill(void *ctx, const fmha_tile *t, uint8_t *vis) {
    const causal_cb *c = ctx;
    for (int64_t i = 0; i < t->nq; i++)
        for (int64_t r = 0; r < t->nk; r++)
            if (t->q0 + i + c->off - (t->k0 + r) < 0) vis[i * t->q_stride + r * t->k_stride] = 0;
}

static int classify_seven(void *ctx, const fmha_tile *t) {
    (void)ctx, (void)t;
    return 7;
}

/* Bias callback: bias(b, h, i, j) = w[h][(3 i + 5 j) mod CB_NP]; its
 * gradient summed per thread into acc [threads][Hq][CB_NP]. */
#define CB_NP 13
typedef struct bias_cb {
    const float *w; /* [Hq][CB_NP] */
    double *acc;    /* [nthreads][Hq][CB_NP] */
    int64_t hq;
    int bad_thread; /* set to 1 when a tile's thread index is out of range */
} bias_cb;

static int cb_index(int64_t i, int64_t j) { return (int)((3 * i + 5 * j) % CB_NP); }

static void bias_fill(void *ctx, const fmha_tile *t, float *scores) {
    const bias_cb *c = ctx;
    for (int64_t i = 0; i < t->nq; i++)
        for (int64_t r = 0; r < t->nk; r++)
            scores[i * t->q_stride + r * t->k_stride] += c->w[t->head_q * CB_NP + cb_index(t->q0 + i, t->k0 + r)];
}

static void bias_grad(void *ctx, const fmha_tile *t, const float *ds) {
    bias_cb *c = ctx;
    if (t->thread < 0 || t->thread >= nthreads) {
        c->bad_thread = 1;
        return;
    }
    double *acc = c->acc + ((size_t)t->thread * (size_t)c->hq + (size_t)t->head_q) * CB_NP;
    for (int64_t i = 0; i < t->nq; i++)
        for (int64_t r = 0; r < t->nk; r++)
            acc[cb_index(t->q0 + i, t->k0 + r)] += ds[i * t->q_stride + r * t->k_stride];
}

/* ---- a case: a problem with its inputs and the buffers its masks use ---- */
enum {
    S_WINDOW = 1 << 0,
    S_KVLEN = 1 << 1,
    S_QLEN = 1 << 2,
    S_SEG = 1 << 3,
    S_DMASK = 1 << 4,   /* dense mask, shape mask_shape */
    S_CBMASK = 1 << 5,  /* causal mask callback */
    S_CBMASK_NC = 1 << 6, /* the same without classify */
    S_BIAS = 1 << 7,    /* dense bias, shape bias_shape */
    S_ALIBI = 1 << 8,
    S_REL = 1 << 9,     /* bidirectional table */
    S_REL_UNI = 1 << 10,
    S_SOFTCAP = 1 << 11,
    S_CBBIAS = 1 << 12,
    S_ALL = (1 << 13) - 1,
    S_ALIGN_BR = 1 << 13 /* fmha_problem.alignment bottom-right (causal NONE or BOTTOM_RIGHT) */
};

/* Broadcast shapes of a dense mask or bias: full (permuted strides), [1, Hq,
 * Sq, Skv], [B, 1, 1, Skv], [1, 1, Sq, Skv]. */
enum { SH_FULL, SH_1HSK, SH_B11K, SH_11SK };
static const char *shape_names[4] = {"[B,Hq,Sq,Skv]", "[1,Hq,Sq,Skv]", "[B,1,1,Skv]", "[1,1,Sq,Skv]"};

typedef struct mcase {
    fmha_problem p;
    float *q, *k, *v, *d_o;
    int32_t *kv_len, *q_len, *qseg, *kvseg;
    uint8_t *dmask;
    float *bias, *slopes, *table, *cbw;
    causal_cb cbm;
    bias_cb cbb;
    int bias_shape;
} mcase;

/* Strides of a [B, Hq, Sq, Skv] tensor of broadcast shape sh. */
static void shape_strides(const fmha_problem *p, int sh, int64_t st[4]) {
    const int64_t hq = p->heads_q, sq = p->seq_q, skv = p->seq_kv;
    switch (sh) {
    case SH_FULL: /* stored [B][Sq][Hq][Skv + 1] */
        st[3] = 1, st[1] = skv + 1, st[2] = hq * (skv + 1), st[0] = sq * hq * (skv + 1);
        break;
    case SH_1HSK: st[0] = 0, st[1] = sq * skv, st[2] = skv, st[3] = 1; break;
    case SH_B11K: st[0] = skv, st[1] = 0, st[2] = 0, st[3] = 1; break;
    default: st[0] = 0, st[1] = 0, st[2] = skv, st[3] = 1; break;
    }
}

static size_t span4(const fmha_problem *p, const int64_t st[4]) {
    const int64_t n[4] = {p->batch, p->heads_q, p->seq_q, p->seq_kv};
    size_t s = 1;
    for (int a = 0; a < 4; a++) s += (size_t)((n[a] - 1) * st[a]);
    return s;
}

static void mcase_free(mcase *c) {
    free(c->q), free(c->k), free(c->v), free(c->d_o), free(c->kv_len), free(c->q_len);
    free(c->qseg), free(c->kvseg), free(c->dmask), free(c->bias), free(c->slopes);
    free(c->table), free(c->cbw);
    memset(c, 0, sizeof *c);
}

/* Monotone segment ids [n]: nseg nonempty runs of ids 0 .. nseg-1. */
static void packed_ids(int32_t *ids, int64_t n, int64_t nseg) {
    if (nseg > n) nseg = n;
    /* cuts: nseg - 1 distinct positions in 1 .. n-1, chosen by a random walk */
    int64_t seg = 0;
    for (int64_t i = 0; i < n; i++) {
        int64_t left = n - i, need = nseg - 1 - seg;
        if (seg < nseg - 1 && i > 0 && (left <= need || tu_int(0, n / nseg) == 0)) seg++;
        ids[i] = (int32_t)seg;
    }
}

/* A random integer in [lo, hi], half the time one next to a block edge
 * (multiples of 16, 64, 128, and the ends of the range). */
static int64_t edgy_int(int64_t lo, int64_t hi) {
    static const int64_t edges[] = {0, 1, 15, 16, 17, 63, 64, 65, 127, 128, 129};
    if (tu_int(0, 1)) return tu_int(lo, hi);
    int64_t pick = tu_int(0, 12);
    int64_t v = pick == 11 ? hi : pick == 12 ? hi - 1 : edges[pick];
    return v < lo ? lo : v > hi ? hi : v;
}

/* Builds a case: sizes, causal, the sources in flags (random parameters). */
static void mcase_build(mcase *c, int64_t B, int64_t hq, int64_t hkv, int64_t sq, int64_t skv,
                        int64_t d, int64_t dv, fmha_causal causal, int flags, int mask_shape,
                        int bias_shape, int layout) {
    memset(c, 0, sizeof *c);
    fmha_problem *p = &c->p;
    fmha_problem_init(p, B, hq, hkv, sq, skv, d, dv, FMHA_LAYOUT_BSHD);
    tu_set_layout(p, layout);
    p->causal = causal;
    if (flags & S_ALIGN_BR) p->alignment = FMHA_ALIGN_BOTTOM_RIGHT;
    c->q = tu_new_input(p, 'q', -1.5, 1.5), c->k = tu_new_input(p, 'k', -1.5, 1.5);
    c->v = tu_new_input(p, 'v', -1, 1), c->d_o = tu_new_input(p, 'o', -1, 1);
    if (tu_int(0, 3) == 0) p->scale = (float)tu_uniform(0.05, 0.6);
    if (flags & S_WINDOW) {
        p->masks.window_left = edgy_int(0, skv / 2 + 1);
        p->masks.window_right = tu_int(0, 2) ? edgy_int(0, skv / 3 + 1) : -1;
    }
    if (flags & S_KVLEN) {
        c->kv_len = xmalloc((size_t)B * sizeof(int32_t));
        for (int64_t b = 0; b < B; b++) c->kv_len[b] = (int32_t)edgy_int(1, skv);
        p->masks.kv_lengths = c->kv_len;
    }
    if (flags & S_QLEN) {
        c->q_len = xmalloc((size_t)B * sizeof(int32_t));
        for (int64_t b = 0; b < B; b++) c->q_len[b] = (int32_t)edgy_int(0, sq);
        p->masks.q_lengths = c->q_len;
    }
    if (flags & S_SEG) {
        c->qseg = xmalloc((size_t)(B * sq) * sizeof(int32_t));
        c->kvseg = xmalloc((size_t)(B * skv) * sizeof(int32_t));
        int random_ids = tu_int(0, 2) == 0;
        for (int64_t b = 0; b < B; b++) {
            int64_t nseg = tu_int(1, 4);
            if (random_ids) {
                for (int64_t i = 0; i < sq; i++) c->qseg[b * sq + i] = (int32_t)tu_int(0, 2);
                for (int64_t j = 0; j < skv; j++) c->kvseg[b * skv + j] = (int32_t)tu_int(0, 2);
            } else {
                packed_ids(c->qseg + b * sq, sq, nseg);
                packed_ids(c->kvseg + b * skv, skv, nseg);
            }
        }
        p->masks.q_segment_ids = c->qseg, p->masks.kv_segment_ids = c->kvseg;
    }
    if (flags & S_DMASK) {
        int64_t st[4];
        shape_strides(p, mask_shape, st);
        size_t n = span4(p, st) + 1;
        c->dmask = xmalloc(n);
        for (size_t e = 0; e < n; e++) c->dmask[e] = (uint8_t)(tu_int(0, 3) != 0 ? 1 + tu_int(0, 254) : 0);
        if (mask_shape == SH_FULL) /* the padding key of each row hides, if ever read */
            for (int64_t e = skv; e < (int64_t)n; e += skv + 1) c->dmask[e] = 0;
        p->masks.dense = c->dmask;
        memcpy(p->masks.dense_strides, st, sizeof st);
    }
    if (flags & (S_CBMASK | S_CBMASK_NC)) {
        c->cbm.off = causal == FMHA_CAUSAL_BOTTOM_RIGHT ? skv - sq : tu_int(0, 2) ? 0 : skv - sq;
        p->masks.callback = (fmha_mask_callback){(flags & S_CBMASK) ? causal_classify : NULL,
                                                 causal_fill, &c->cbm};
    }
    c->bias_shape = bias_shape;
    if (flags & S_BIAS) {
        int64_t st[4];
        shape_strides(p, bias_shape, st);
        size_t n = span4(p, st) + 1;
        c->bias = xmalloc(n * sizeof(float));
        tu_fill(c->bias, n, -2, 2);
        if (bias_shape == SH_FULL) /* the padding key of each row is NaN */
            for (int64_t e = skv; e < (int64_t)n; e += skv + 1) c->bias[e] = NAN;
        p->biases.dense = c->bias;
        memcpy(p->biases.dense_strides, st, sizeof st);
    }
    if (flags & S_ALIBI) {
        c->slopes = xmalloc((size_t)hq * sizeof(float));
        for (int64_t h = 0; h < hq; h++) c->slopes[h] = (float)ldexp(1.0, -(int)(1 + (8 * h) / hq)) * (float)tu_uniform(0.2, 1.0);
        p->biases.alibi_slopes = c->slopes;
    }
    if (flags & (S_REL | S_REL_UNI)) {
        static const int32_t nbs[4] = {8, 16, 32, 5}, mds[4] = {16, 64, 128, 7};
        p->biases.rel_num_buckets = nbs[tu_int(0, 3)];
        p->biases.rel_max_distance = mds[tu_int(0, 3)];
        p->biases.rel_bidirectional = (flags & S_REL) != 0;
        c->table = xmalloc((size_t)(hq * p->biases.rel_num_buckets) * sizeof(float));
        tu_fill(c->table, (size_t)(hq * p->biases.rel_num_buckets), -1.5, 1.5);
        p->biases.rel_table = c->table;
    }
    if (flags & S_SOFTCAP) p->biases.softcap = (float)tu_uniform(1.0, 4.0);
    if (flags & S_CBBIAS) {
        c->cbw = xmalloc((size_t)(hq * CB_NP) * sizeof(float));
        tu_fill(c->cbw, (size_t)(hq * CB_NP), -1, 1);
        c->cbb = (bias_cb){c->cbw, NULL, hq, 0};
        p->biases.callback = (fmha_bias_callback){bias_fill, bias_grad, &c->cbb};
    }
}

/* Gathers a strided tensor (or the elements of its extents) into contiguous floats. */
static float *gather(const fmha_problem *p, const float *x, char which) {
    int64_t n[4];
    const int64_t *st = tu_shape(p, which, n);
    float *g = xmalloc(tu_numel(n) * sizeof(float));
    tu_gather(x, st, n, g);
    return g;
}

/* Compares x with r (n elements) and records the worst; returns 1 if it passes. */
static int compare(const char *what, const char *field, const float *x, const double *r,
                   const double *mag, size_t n, double atol_rel, double rtol, int li, int s, int ii,
                   int kind) {
    double rmax = tu_max_abs_d(r, n), rnorm = 0.0, mnorm = 0.0, mmax = 0.0, num = 0.0;
    for (size_t t = 0; t < n; t++) {
        double d = (double)x[t] - r[t];
        num += isfinite(r[t]) ? d * d : 0.0;
        rnorm += isfinite(r[t]) ? r[t] * r[t] : 0.0;
        if (mag) {
            mnorm += mag[t] * mag[t];
            if (mag[t] > mmax) mmax = mag[t];
        }
    }
    rnorm = sqrt(rnorm), mnorm = sqrt(mnorm);
    /* the floors: MAG_FLOOR of the size of the terms (see run_case) */
    double scale = rmax > MAG_FLOOR * mmax ? rmax : MAG_FLOOR * mmax;
    double den = rnorm > MAG_FLOOR * mnorm ? rnorm : MAG_FLOOR * mnorm;
    double atol = atol_rel * (scale > 0 ? scale : 1.0);
    double ratio = tu_worst_ratio(x, r, n, atol, rtol);
    double rel = den > 0 ? sqrt(num) / den : sqrt(num);
    if (!isfinite(ratio) || tu_has_nan(x, n)) rel = INFINITY;
    if (verbose > 1 && mag) printf("COND %s %s r/mag %.3g plain %.3g rel %.3g\n", what, field, rnorm / (mnorm > 0 ? mnorm : 1), tu_rel_l2(x, r, n), rel);
    note(li, s, ii, kind, rel);
    note(li, s, ii, W_RATIO, ratio);
    int ok = tu_check(rel <= REL_L2, "%s: %s relative L2 error %.3g", what, field, rel);
    ok &= tu_check(ratio <= 1.0, "%s: %s worst elementwise ratio %.3g", what, field, ratio);
    return ok;
}

/* Error of a parameter gradient x against r [n]: ||x - r|| / ||mag||, where
 * mag[e] sums, over the scores entry e collects, the size of the terms of dS
 * (P (|dP| + |sum P dP|), times |a| for ALiBi; >= |r[e]|). Each entry is a
 * sum of dS over many scores that can cancel exactly (a bucket holding whole
 * rows sums to 0; a row with one visible key has dS = 0), so its attainable
 * float32 accuracy is relative to mag, not to r. On failure prints the entries. */
static double param_err(const char *what, const char *field, const float *x, const double *r,
                        const double *mag, size_t n) {
    double num = 0.0, den = 0.0;
    for (size_t t = 0; t < n; t++) {
        double d = (double)x[t] - r[t];
        num += d * d;
        den += mag[t] * mag[t];
    }
    double e = den > 0.0 ? sqrt(num / den) : sqrt(num);
    if (!(e <= PARAM_REL)) {
        printf("  %s: %s (plain relative L2 %.3g), library / reference / scale:", what, field,
               tu_rel_l2(x, r, n));
        for (size_t t = 0; t < n && t < 40; t++) printf(" [%zu] %.7g / %.7g / %.3g", t, (double)x[t], r[t], mag[t]);
        printf("\n");
    }
    return e;
}

/* Extents of the dense bias of c (1 where it broadcasts) and the gradient's
 * strides: 0 there, else contiguous in [B][Hq][Sq][Skv + 2] order. */
static void dgrad_layout(const mcase *c, int64_t ext[4], int64_t gst[4]) {
    const fmha_problem *p = &c->p;
    const int64_t n[4] = {p->batch, p->heads_q, p->seq_q, p->seq_kv};
    for (int a = 0; a < 4; a++) ext[a] = p->biases.dense_strides[a] ? n[a] : 1;
    int64_t cur = 1;
    for (int a = 3; a >= 0; a--) {
        gst[a] = p->biases.dense_strides[a] ? cur : 0;
        if (p->biases.dense_strides[a]) cur *= ext[a] + (a == 3 ? 2 : 0);
    }
}

/* One case under every ISA and strategy. */
static void run_case(const char *label, const char *name, mcase *c) {
    const fmha_problem *p = &c->p;
    const int li = label_index(label);
    const int64_t B = p->batch, hq = p->heads_q, hkv = p->heads_kv, sq = p->seq_q, skv = p->seq_kv;
    const int64_t group = hq / hkv;
    int64_t nq4[4], nk4[4], nv4[4], no4[4];
    const int64_t *qst = tu_shape(p, 'q', nq4), *kst = tu_shape(p, 'k', nk4);
    const int64_t *vst = tu_shape(p, 'v', nv4), *ost = tu_shape(p, 'o', no4);
    const size_t n_q = tu_numel(nq4), n_k = tu_numel(nk4), n_v = tu_numel(nv4), n_o = tu_numel(no4);
    const size_t n_l = (size_t)(B * hq * sq), n_full = (size_t)(B * hq * sq * skv);
    const int nb = p->biases.rel_num_buckets;
    const int want_bias = p->biases.dense || p->biases.callback.fill || p->biases.alibi_slopes ||
                          p->biases.rel_table;
    /* reference: o [B,Sq,Hq,Dv], lse [B,Hq,Sq], dq/dk/dv as the tensors,
     * dfull [B,Hq,Sq,Skv], dal [Hq], drel [Hq,nb], dcb [Hq,CB_NP] */
    double *ro = xmalloc(n_o * sizeof(double)), *rl = xmalloc(n_l * sizeof(double));
    double *rdq = xmalloc(n_q * sizeof(double)), *rdk = xmalloc(n_k * sizeof(double));
    double *rdv = xmalloc(n_v * sizeof(double));
    double *dfull = want_bias ? xmalloc(n_full * sizeof(double)) : NULL;
    double *dal = p->biases.alibi_slopes ? xmalloc((size_t)hq * sizeof(double)) : NULL;
    double *drel = p->biases.rel_table ? xmalloc((size_t)(hq * nb) * sizeof(double)) : NULL;
    double *dcb = NULL;
    /* dsc [B,Hq,Sq,Skv]: the size of the terms of each dS (see param_err) */
    double *dsc = xmalloc(n_full * sizeof(double));
    if (fmha_ref_forward_full(p, c->q, c->k, c->v, ro, rl) != 0 ||
        fmha_ref_backward_full_ex(p, c->q, c->k, c->v, c->d_o, rdq, rdk, rdv, dfull, dal, drel, dsc, NULL) != 0)
        abort();
    /* dense bias gradient reduced to the gradient's layout: rdd [ext], contiguous */
    int64_t ext[4] = {1, 1, 1, 1}, gst[4] = {0, 0, 0, 0};
    double *rdd = NULL;
    size_t n_dd = 0, span_dd = 0;
    if (p->biases.dense) {
        dgrad_layout(c, ext, gst);
        n_dd = (size_t)(ext[0] * ext[1] * ext[2] * ext[3]);
        rdd = calloc(n_dd, sizeof(double));
        size_t u = 0;
        for (int64_t b = 0; b < B; b++)
            for (int64_t h = 0; h < hq; h++)
                for (int64_t i = 0; i < sq; i++)
                    for (int64_t j = 0; j < skv; j++, u++) {
                        int64_t e[4] = {ext[0] > 1 ? b : 0, ext[1] > 1 ? h : 0, ext[2] > 1 ? i : 0,
                                        ext[3] > 1 ? j : 0};
                        rdd[((e[0] * ext[1] + e[1]) * ext[2] + e[2]) * ext[3] + e[3]] += dfull[u];
                    }
        span_dd = 1;
        for (int a = 0; a < 4; a++) span_dd += (size_t)((ext[a] - 1) * gst[a]);
    }
    if (p->biases.callback.accumulate_grad) {
        dcb = calloc((size_t)(hq * CB_NP), sizeof(double));
        size_t u = 0;
        for (int64_t b = 0; b < B; b++)
            for (int64_t h = 0; h < hq; h++)
                for (int64_t i = 0; i < sq; i++)
                    for (int64_t j = 0; j < skv; j++) dcb[h * CB_NP + cb_index(i, j)] += dfull[u++];
    }
    /* error scales of the parameter gradients: mal [Hq], mrel [Hq, nb], mcb [Hq, CB_NP] */
    double *mal = dal ? calloc((size_t)hq, sizeof(double)) : NULL;
    double *mrel = drel ? calloc((size_t)(hq * nb), sizeof(double)) : NULL;
    double *mcb = dcb ? calloc((size_t)(hq * CB_NP), sizeof(double)) : NULL;
    if (dfull && (mal || mrel || mcb)) {
        size_t u = 0;
        for (int64_t b = 0; b < B; b++)
            for (int64_t h = 0; h < hq; h++)
                for (int64_t i = 0; i < sq; i++)
                    for (int64_t j = 0; j < skv; j++, u++) {
                        /* bottom-right aligns each sequence's own lengths */
                        const int64_t kv_len = p->masks.kv_lengths ? p->masks.kv_lengths[b] : skv;
                        const int64_t q_len = p->masks.q_lengths ? p->masks.q_lengths[b] : sq;
                        const int64_t off = p->causal == FMHA_CAUSAL_BOTTOM_RIGHT ||
                                                    p->alignment == FMHA_ALIGN_BOTTOM_RIGHT
                                                ? kv_len - q_len
                                                : 0;
                        const double x = dsc[u];
                        const int64_t a = i + off - j;
                        if (mal) mal[h] += x * (double)(a < 0 ? -a : a);
                        if (mrel)
                            mrel[h * nb + fmha_rel_bucket(-a, nb, p->biases.rel_max_distance,
                                                          p->biases.rel_bidirectional)] += x;
                        if (mcb) mcb[h * CB_NP + cb_index(i, j)] += x;
                    }
    }
    /* sizes of the terms of dQ, dK and the dense bias gradient: mdq, mdk as
     * rdq, rdk; mdd as rdd (dsc in place of dS, |q|, |k| in place of q, k) */
    double *mdq = calloc(n_q, sizeof(double)), *mdk = calloc(n_k, sizeof(double));
    double *mdd = rdd ? calloc(n_dd, sizeof(double)) : NULL;
    {
        const int64_t D = p->head_dim;
        const double scale = fmha_ref_full_scale(p);
        size_t u = 0;
        for (int64_t b = 0; b < B; b++)
            for (int64_t h = 0; h < hq; h++)
                for (int64_t i = 0; i < sq; i++)
                    for (int64_t j = 0; j < skv; j++, u++) {
                        const double w = scale * dsc[u];
                        if (w == 0.0) continue;
                        double *gq = mdq + ((b * sq + i) * hq + h) * D;
                        double *gk = mdk + ((b * skv + j) * hkv + h / group) * D;
                        for (int64_t e = 0; e < D; e++) {
                            gq[e] += w * fabs((double)*tu_elem(c->k, p->k_strides, b, j, h / group, e));
                            gk[e] += w * fabs((double)*tu_elem(c->q, p->q_strides, b, i, h, e));
                        }
                        if (mdd) {
                            int64_t e4[4] = {ext[0] > 1 ? b : 0, ext[1] > 1 ? h : 0, ext[2] > 1 ? i : 0,
                                             ext[3] > 1 ? j : 0};
                            mdd[((e4[0] * ext[1] + e4[1]) * ext[2] + e4[2]) * ext[3] + e4[3]] += dsc[u];
                        }
                    }
    }
    /* rows no key is visible from, keys no query sees (per b, kv head) */
    unsigned char *key_seen = calloc((size_t)(B * hkv * skv), 1);
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < hq; h++)
            for (int64_t i = 0; i < sq; i++)
                for (int64_t j = 0; j < skv; j++)
                    if (fmha_ref_full_visible(p, b, h, i, j)) key_seen[(b * hkv + h / group) * skv + j] = 1;
    /* smax: bound of |score| for the lse tolerance */
    double smax = 0.0;
    for (size_t t = 0; t < n_l; t++)
        if (isfinite(rl[t]) && fabs(rl[t]) > smax) smax = fabs(rl[t]);
    smax += 10.0;
    double vmax = 0.0;
    {
        float *gv = gather(p, c->v, 'v');
        vmax = tu_max_abs(gv, n_v);
        free(gv);
    }
    const float sent = sentinel();
    int printed = 0;
    memset(case_worst, 0, sizeof case_worst);

    for (int ii = 0; ii < n_isa; ii++) {
        if (!isa_ok[ii]) continue;
        fmha_cpu_force_isa(isa_name(ii));
        for (int s = 0; s < 4; s++) {
            if (tu_strategy_skipped(s) || tu_strategy_repeats(s)) continue;
            char what[320];
            snprintf(what, sizeof what, "%s [%s, %s]", name, tu_strategy_name(s), isa_name(ii));
            fmha_problem pp = *p;
            pp.strategy = (fmha_strategy)s;
            int ok = 1;
            /* forward */
            float *o = tu_new_output(&pp, 'o', sent), *lse = new_guarded(n_l);
            fmha_status st = tu_forward(&pp, c->q, c->k, c->v, o, lse, NULL, 0);
            if (!tu_check(st == FMHA_OK, "%s: forward status %d (%s)", what, (int)st, fmha_status_string(st))) {
                free(o), free(lse);
                continue;
            }
            float *go = gather(&pp, o, 'o');
            ok &= compare(what, "O", go, ro, NULL, n_o, O_ATOL_V * (vmax > 0 ? vmax : 1) /
                          (tu_max_abs_d(ro, n_o) > 0 ? tu_max_abs_d(ro, n_o) : 1), O_RTOL, li, s, ii, W_O);
            ok &= tu_check(tu_padding_changed(o, ost, no4, sent) == 0, "%s: O padding written", what);
            ok &= tu_check(tu_count_not(lse + n_l, GUARD, sent) == 0, "%s: written past lse", what);
            double lse_ratio = 0.0;
            int masked_ok = 1;
            for (int64_t b = 0; b < B; b++)
                for (int64_t h = 0; h < hq; h++)
                    for (int64_t i = 0; i < sq; i++) {
                        size_t t = (size_t)((b * hq + h) * sq + i);
                        if (rl[t] == -INFINITY) {
                            masked_ok &= lse[t] == -INFINITY;
                            const float *oi = go + ((b * sq + i) * hq + h) * p->head_dim_v;
                            for (int64_t e = 0; e < p->head_dim_v; e++) masked_ok &= oi[e] == 0.0f;
                            continue;
                        }
                        double x = lse[t];
                        double r = isfinite(x) ? fabs(x - rl[t]) / (LSE_TOL * (1 + smax) + LSE_TOL * fabs(rl[t])) : INFINITY;
                        if (!(r <= lse_ratio)) lse_ratio = r;
                    }
            ok &= tu_check(lse_ratio <= 1.0, "%s: lse worst ratio %.3g", what, lse_ratio);
            ok &= tu_check(masked_ok, "%s: fully masked rows are not O = 0, lse = -inf", what);

            /* backward with every parameter gradient the case has */
            float *dq = tu_new_output(&pp, 'q', sent), *dk = tu_new_output(&pp, 'k', sent);
            float *dv = tu_new_output(&pp, 'v', sent);
            fmha_param_grads g;
            memset(&g, 0, sizeof g);
            float *gdd = NULL, *gal = NULL, *grel = NULL;
            if (p->biases.dense) {
                gdd = new_guarded(span_dd);
                g.d_dense = gdd;
                memcpy(g.d_dense_strides, gst, sizeof gst);
            }
            if (dal) g.d_alibi = gal = new_guarded((size_t)hq);
            if (drel) g.d_rel_table = grel = new_guarded((size_t)(hq * nb));
            if (dcb) {
                c->cbb.acc = calloc((size_t)nthreads * (size_t)(hq * CB_NP), sizeof(double));
                c->cbb.bad_thread = 0;
            }
            st = tu_backward(&pp, c->q, c->k, c->v, o, c->d_o, lse, dq, dk, dv,
                               (gdd || gal || grel) ? &g : NULL, NULL, 0);
            if (tu_check(st == FMHA_OK, "%s: backward status %d (%s)", what, (int)st, fmha_status_string(st))) {
                float *gdq = gather(&pp, dq, 'q'), *gdk = gather(&pp, dk, 'k'), *gdv = gather(&pp, dv, 'v');
                ok &= compare(what, "dQ", gdq, rdq, mdq, n_q, G_ATOL, G_RTOL, li, s, ii, W_GRAD);
                ok &= compare(what, "dK", gdk, rdk, mdk, n_k, G_ATOL, G_RTOL, li, s, ii, W_GRAD);
                ok &= compare(what, "dV", gdv, rdv, NULL, n_v, G_ATOL, G_RTOL, li, s, ii, W_GRAD);
                ok &= tu_check(tu_padding_changed(dq, qst, nq4, sent) == 0 &&
                                   tu_padding_changed(dk, kst, nk4, sent) == 0 &&
                                   tu_padding_changed(dv, vst, nv4, sent) == 0,
                               "%s: gradient padding written", what);
                /* exact zeros: rows that see nothing, keys nobody sees */
                int zero_ok = 1;
                for (int64_t b = 0; b < B; b++)
                    for (int64_t h = 0; h < hq; h++)
                        for (int64_t i = 0; i < sq; i++)
                            if (rl[(b * hq + h) * sq + i] == -INFINITY)
                                for (int64_t e = 0; e < p->head_dim; e++)
                                    zero_ok &= gdq[((b * sq + i) * hq + h) * p->head_dim + e] == 0.0f;
                for (int64_t b = 0; b < B; b++)
                    for (int64_t g2 = 0; g2 < hkv; g2++)
                        for (int64_t j = 0; j < skv; j++) {
                            if (key_seen[(b * hkv + g2) * skv + j]) continue;
                            for (int64_t e = 0; e < p->head_dim; e++)
                                zero_ok &= gdk[((b * skv + j) * hkv + g2) * p->head_dim + e] == 0.0f;
                            for (int64_t e = 0; e < p->head_dim_v; e++)
                                zero_ok &= gdv[((b * skv + j) * hkv + g2) * p->head_dim_v + e] == 0.0f;
                        }
                ok &= tu_check(zero_ok, "%s: masked rows or unseen keys have nonzero gradients", what);
                if (gdd) {
                    /* gathered [ext] from the gradient's layout */
                    float *x = xmalloc(n_dd * sizeof(float));
                    size_t u = 0;
                    int zero_masked = 1;
                    for (int64_t b = 0; b < ext[0]; b++)
                        for (int64_t h = 0; h < ext[1]; h++)
                            for (int64_t i = 0; i < ext[2]; i++)
                                for (int64_t j = 0; j < ext[3]; j++, u++) {
                                    x[u] = gdd[b * gst[0] + h * gst[1] + i * gst[2] + j * gst[3]];
                                    if (c->bias_shape == SH_FULL && !fmha_ref_full_visible(p, b, h, i, j))
                                        zero_masked &= x[u] == 0.0f;
                                }
                    ok &= compare(what, "dense bias gradient", x, rdd, mdd, n_dd, G_ATOL, G_RTOL, li, s, ii, W_GRAD);
                    ok &= tu_check(zero_masked, "%s: dense bias gradient nonzero at masked scores", what);
                    ok &= tu_check(tu_count_not(gdd + span_dd, GUARD, sent) == 0, "%s: written past d_dense", what);
                    /* positions of the span that are not elements keep the sentinel */
                    unsigned char *is_el = calloc(span_dd, 1);
                    for (int64_t b = 0; b < ext[0]; b++)
                        for (int64_t h = 0; h < ext[1]; h++)
                            for (int64_t i = 0; i < ext[2]; i++)
                                for (int64_t j = 0; j < ext[3]; j++)
                                    is_el[b * gst[0] + h * gst[1] + i * gst[2] + j * gst[3]] = 1;
                    size_t bad = 0;
                    for (size_t e = 0; e < span_dd; e++)
                        if (!is_el[e] && memcmp(&gdd[e], &sent, sizeof sent)) bad++;
                    ok &= tu_check(bad == 0, "%s: d_dense padding written (%zu)", what, bad);
                    free(is_el), free(x);
                }
                if (gal) {
                    double e = param_err(what, "d_alibi", gal, dal, mal, (size_t)hq);
                    note(li, s, ii, W_PARAM, e);
                    ok &= tu_check(e <= PARAM_REL, "%s: d_alibi error %.3g (of its scale)", what, e);
                    ok &= tu_check(tu_count_not(gal + hq, GUARD, sent) == 0, "%s: written past d_alibi", what);
                }
                if (grel) {
                    double e = param_err(what, "d_rel_table", grel, drel, mrel, (size_t)(hq * nb));
                    note(li, s, ii, W_PARAM, e);
                    ok &= tu_check(e <= PARAM_REL, "%s: d_rel_table error %.3g (of its scale)", what, e);
                    ok &= tu_check(tu_count_not(grel + hq * nb, GUARD, sent) == 0, "%s: written past d_rel_table", what);
                }
                if (dcb) {
                    /* reduce the per-thread accumulators in thread order */
                    float *x = xmalloc((size_t)(hq * CB_NP) * sizeof(float));
                    for (int64_t e = 0; e < hq * CB_NP; e++) {
                        double sum = 0.0;
                        for (int t = 0; t < nthreads; t++) sum += c->cbb.acc[(size_t)t * (size_t)(hq * CB_NP) + (size_t)e];
                        x[e] = (float)sum;
                    }
                    double e = param_err(what, "callback bias gradient", x, dcb, mcb, (size_t)(hq * CB_NP));
                    note(li, s, ii, W_PARAM, e);
                    ok &= tu_check(e <= PARAM_REL, "%s: callback bias gradient error %.3g (of its scale)", what, e);
                    ok &= tu_check(!c->cbb.bad_thread, "%s: callback thread index out of range", what);
                    free(x);
                }
                free(gdq), free(gdk), free(gdv);
            }
            if (dcb) free(c->cbb.acc), c->cbb.acc = NULL;
            if (!ok && !printed) {
                printf("  %s: B %lld Hq %lld Hkv %lld Sq %lld Skv %lld D %lld Dv %lld scale %g causal %s "
                       "window (%lld, %lld)\n",
                       name, (long long)B, (long long)hq, (long long)hkv, (long long)sq, (long long)skv,
                       (long long)p->head_dim, (long long)p->head_dim_v, (double)p->scale,
                       tu_causal_name(p->causal), (long long)p->masks.window_left,
                       (long long)p->masks.window_right);
                printed = 1;
            }
            free(go), free(o), free(lse), free(dq), free(dk), free(dv), free(gdd), free(gal), free(grel);
        }
    }
    fmha_cpu_force_isa(isa_default);
    if (verbose)
        printf("  %-100.100s O %.2e grad %.2e param %.2e ratio %.3f\n", name, case_worst[W_O],
               case_worst[W_GRAD], case_worst[W_PARAM], case_worst[W_RATIO]);
    free(ro), free(rl), free(rdq), free(rdk), free(rdv), free(dfull), free(dal), free(drel);
    free(dcb), free(rdd), free(key_seen), free(mal), free(mrel), free(mcb), free(dsc);
    free(mdq), free(mdk), free(mdd);
}

/* ---- cases ---------------------------------------------------------------- */

static int64_t pick(const int64_t *xs, int n) { return xs[tu_int(0, n - 1)]; }

/* Random sizes with tails: B 1-2, GQA groups 1-3, Sq 1-150, Skv 1-200. */
static void random_sizes(int64_t sz[7]) {
    static const int64_t dims[6] = {4, 8, 16, 24, 40, 64};
    sz[0] = tu_int(1, 2);
    sz[2] = tu_int(1, 2);
    sz[1] = sz[2] * tu_int(1, 3);
    sz[3] = tu_int(0, 4) == 0 ? tu_int(1, 9) : tu_int(10, tu_quick_pick(150, 80));
    sz[4] = tu_int(0, 4) == 0 ? tu_int(1, 9) : tu_int(10, tu_quick_pick(200, 150)); /* past a 128-key block */
    sz[5] = pick(dims, 6);
    sz[6] = tu_int(0, 1) ? sz[5] : pick(dims, 6);
}

/* 1 if at least an eighth of the rows (and one) see two or more keys: rows
 * with one key have dS = 0 exactly, and a case of only such rows (or of
 * fully masked ones) has no gradient to compare against. */
static int enough_rows(const fmha_problem *p) {
    int64_t rows = 0, total = p->batch * p->heads_q * p->seq_q;
    for (int64_t b = 0; b < p->batch; b++)
        for (int64_t h = 0; h < p->heads_q; h++)
            for (int64_t i = 0; i < p->seq_q; i++) {
                int n = 0;
                for (int64_t j = 0; j < p->seq_kv && n < 2; j++) n += fmha_ref_full_visible(p, b, h, i, j);
                rows += n >= 2;
            }
    return rows >= 1 && rows * 8 >= total;
}

static void run_sources(const char *label, fmha_causal causal, int flags, int mask_shape, int bias_shape) {
    int64_t sz[7];
    mcase c;
    int layout;
    /* random sizes and mask parameters, drawn again while they leave too little visible */
    for (int tries = 0;; tries++) {
        random_sizes(sz);
        layout = (int)tu_int(0, TU_LAYOUT_COUNT - 1);
        mcase_build(&c, sz[0], sz[1], sz[2], sz[3], sz[4], sz[5], sz[6], causal, flags, mask_shape,
                    bias_shape, layout);
        if (tries == 50 || enough_rows(&c.p)) break;
        mcase_free(&c);
    }
    char name[256];
    snprintf(name, sizeof name, "%s (flags 0x%x, mask %s, bias %s, %s; B %lld Hq %lld/%lld Sq %lld Skv %lld D %lld/%lld %s)",
             label, (unsigned)flags, (flags & S_DMASK) ? shape_names[mask_shape] : "-",
             (flags & S_BIAS) ? shape_names[bias_shape] : "-", tu_causal_name(causal), (long long)sz[0],
             (long long)sz[1], (long long)sz[2], (long long)sz[3], (long long)sz[4], (long long)sz[5],
             (long long)sz[6], tu_layout_name(layout));
    run_case(label, name, &c);
    mcase_free(&c);
}

static void fixed_cases(void) {
    const fmha_causal N = FMHA_CAUSAL_NONE, TL = FMHA_CAUSAL_TOP_LEFT, BR = FMHA_CAUSAL_BOTTOM_RIGHT;
    run_sources("plain", N, 0, 0, 0);
    run_sources("causal top-left", TL, 0, 0, 0);
    run_sources("causal bottom-right", BR, 0, 0, 0);
    run_sources("window", N, S_WINDOW, 0, 0);
    run_sources("window + causal top-left", TL, S_WINDOW, 0, 0);
    run_sources("window + causal bottom-right", BR, S_WINDOW, 0, 0);
    run_sources("kv_lengths", N, S_KVLEN, 0, 0);
    run_sources("q_lengths", N, S_QLEN, 0, 0);
    run_sources("lengths + rel table", N, S_KVLEN | S_QLEN | S_REL, 0, 0);
    run_sources("kv_lengths + rel table unidirectional + causal", BR, S_KVLEN | S_REL_UNI, 0, 0);
    run_sources("segments", N, S_SEG, 0, 0);
    run_sources("segments + dense bias", N, S_SEG | S_BIAS, 0, SH_FULL);
    run_sources("dense mask [B,Hq,Sq,Skv]", N, S_DMASK, SH_FULL, 0);
    run_sources("dense mask [1,1,Sq,Skv]", N, S_DMASK, SH_11SK, 0);
    run_sources("dense mask [B,1,1,Skv]", TL, S_DMASK, SH_B11K, 0);
    run_sources("dense bias [B,Hq,Sq,Skv]", N, S_BIAS, 0, SH_FULL);
    run_sources("dense bias [1,Hq,Sq,Skv]", N, S_BIAS, 0, SH_1HSK);
    run_sources("dense bias [B,1,1,Skv]", BR, S_BIAS, 0, SH_B11K);
    run_sources("alibi", N, S_ALIBI, 0, 0);
    run_sources("alibi + softcap", TL, S_ALIBI | S_SOFTCAP, 0, 0);
    run_sources("softcap", N, S_SOFTCAP, 0, 0);
    run_sources("rel table", N, S_REL, 0, 0);
    run_sources("softcap + dense bias [1,Hq,Sq,Skv] + rel", BR, S_SOFTCAP | S_BIAS | S_REL, 0, SH_1HSK);
    run_sources("mask callback (causal)", N, S_CBMASK, 0, 0);
    run_sources("mask callback without classify", N, S_CBMASK_NC, 0, 0);
    run_sources("bias callback", N, S_CBBIAS, 0, 0);
    run_sources("callbacks + window + segments", N, S_CBMASK | S_CBBIAS | S_WINDOW | S_SEG, 0, 0);
    run_sources("everything", BR, S_ALL & ~S_CBMASK_NC, SH_B11K, SH_B11K);
    /* bottom-right alignment without causal masking (FlashAttention's windows and ALiBi) */
    run_sources("window, bottom-right alignment", N, S_WINDOW | S_ALIGN_BR, 0, 0);
    run_sources("alibi, bottom-right alignment", N, S_ALIBI | S_ALIGN_BR, 0, 0);
    run_sources("window + alibi + lengths, bottom-right alignment", N,
                S_WINDOW | S_ALIBI | S_KVLEN | S_QLEN | S_ALIGN_BR, 0, 0);
    run_sources("rel table + softcap, bottom-right alignment", N, S_REL | S_SOFTCAP | S_ALIGN_BR, 0, 0);
    run_sources("window + causal bottom-right, alignment bottom-right", BR, S_WINDOW | S_ALIGN_BR, 0, 0);
}

/* Fully masked rows from q_lengths 0, kv_lengths 0 and a window. */
static void masked_row_cases(void) {
    mcase c;
    mcase_build(&c, 3, 2, 1, 37, 70, 16, 8, FMHA_CAUSAL_NONE, S_QLEN | S_KVLEN | S_ALIBI | S_BIAS, 0,
                SH_1HSK, TU_LAYOUT_PADDED);
    c.q_len[0] = 0, c.q_len[1] = 37, c.q_len[2] = 20;
    c.kv_len[0] = 50, c.kv_len[1] = 0, c.kv_len[2] = 33;
    run_case("lengths 0", "q_lengths {0, 37, 20}, kv_lengths {50, 0, 33} + alibi + bias [1,Hq,Sq,Skv]", &c);
    mcase_free(&c);
    /* lengths one off every block edge (16, 64, 128 and the end) */
    static const int32_t kv_edges[6] = {199, 63, 65, 127, 129, 1}, q_edges[6] = {99, 15, 17, 63, 65, 0};
    for (int which = 0; which < 3; which++) {
        mcase_build(&c, 6, 2, 1, 100, 200, 16, 16, FMHA_CAUSAL_NONE,
                    (which != 1 ? S_KVLEN : 0) | (which != 0 ? S_QLEN : 0) | (which == 2 ? S_ALIBI : 0),
                    0, 0, TU_LAYOUT_BSHD);
        for (int b = 0; b < 6; b++) {
            if (c.kv_len) c.kv_len[b] = kv_edges[b];
            if (c.q_len) c.q_len[b] = q_edges[b];
        }
        static const char *names[3] = {"kv_lengths {199, 63, 65, 127, 129, 1} of 200",
                                       "q_lengths {99, 15, 17, 63, 65, 0} of 100",
                                       "both lengths at block edges + alibi"};
        run_case("lengths at block edges", names[which], &c);
        mcase_free(&c);
    }
    /* window (2, 0) without causal, kv_lengths 30: rows i >= 33 see nothing */
    mcase_build(&c, 1, 3, 3, 90, 90, 8, 8, FMHA_CAUSAL_NONE, S_KVLEN | S_REL, 0, 0, TU_LAYOUT_BHSD);
    c.p.masks.window_left = 2, c.p.masks.window_right = 0;
    c.kv_len[0] = 30;
    run_case("window empties rows", "window (2, 0) + kv_lengths 30: rows 33.. empty", &c);
    mcase_free(&c);
    /* bottom-right with Sq > Skv and a window: the first Sq - Skv rows see nothing */
    mcase_build(&c, 2, 2, 2, 150, 40, 16, 16, FMHA_CAUSAL_BOTTOM_RIGHT, S_SOFTCAP | S_BIAS, 0,
                SH_FULL, TU_LAYOUT_PADDED2);
    c.p.masks.window_left = 5, c.p.masks.window_right = -1;
    run_case("window empties rows", "bottom-right Sq 150 > Skv 40, window (5, -1)", &c);
    mcase_free(&c);
}

/* Random combinations of sources. */
static void random_cases(int n) {
    for (int t = 0; t < n; t++) {
        int flags = (int)(tu_next() & (uint64_t)S_ALL);
        if ((flags & S_CBMASK) && (flags & S_CBMASK_NC)) flags &= ~S_CBMASK_NC;
        if ((flags & S_REL) && (flags & S_REL_UNI)) flags &= ~S_REL_UNI;
        int causal = (int)tu_int(0, 2);
        if (causal != FMHA_CAUSAL_TOP_LEFT && tu_int(0, 2) == 0) flags |= S_ALIGN_BR;
        char label[64];
        snprintf(label, sizeof label, "random combination");
        run_sources(label, (fmha_causal)causal, flags, (int)tu_int(0, 3), (int)tu_int(0, 2));
    }
}

/* ---- fmha_rel_bucket on hand-computed values -------------------------------
 * bidirectional, 32 buckets (16 per side, exact below 8), max distance 128:
 * rel = j - i; n = -rel looks back. Log buckets: 8 + floor(log(n/8) / log(16) * 8). */
static void check_rel_bucket(void) {
    static const struct { int64_t rel; int32_t want; } bi[] = {
        {0, 0}, {-1, 1}, {1, 17}, {-7, 7}, {-8, 8}, {-16, 10}, {-200, 15}, {200, 31},
        {7, 23}, {-32, 12}, {-127, 15}, {-128, 15}, {100000, 31}};
    int bad = 0;
    for (size_t t = 0; t < sizeof bi / sizeof bi[0]; t++) {
        int32_t got = fmha_rel_bucket(bi[t].rel, 32, 128, 1);
        bad += !tu_check(got == bi[t].want, "fmha_rel_bucket(%lld, 32, 128, bi) = %d, want %d",
                         (long long)bi[t].rel, got, bi[t].want);
    }
    /* unidirectional: keys after the query share bucket 0; 32 buckets, exact below 16 */
    static const struct { int64_t rel; int32_t want; } uni[] = {
        {5, 0}, {1, 0}, {0, 0}, {-1, 1}, {-15, 15}, {-16, 16}, {-32, 21}, {-1000, 31}};
    for (size_t t = 0; t < sizeof uni / sizeof uni[0]; t++) {
        int32_t got = fmha_rel_bucket(uni[t].rel, 32, 128, 0);
        bad += !tu_check(got == uni[t].want, "fmha_rel_bucket(%lld, 32, 128, uni) = %d, want %d",
                         (long long)uni[t].rel, got, uni[t].want);
    }
    /* every bucket in range for small tables */
    for (int32_t nbk = 1; nbk <= 6; nbk++)
        for (int32_t md = 1; md <= 4; md++)
            for (int bid = 0; bid < 2; bid++)
                for (int64_t rel = -20; rel <= 20; rel++) {
                    int32_t got = fmha_rel_bucket(rel, nbk, md, bid);
                    if (got < 0 || got >= nbk)
                        bad += !tu_check(0, "fmha_rel_bucket(%lld, %d, %d, %d) = %d out of range",
                                         (long long)rel, nbk, md, bid, got);
                }
    /* int64's ends: the farthest buckets, no overflow; no buckets: -1 */
    static const struct { int64_t rel; int32_t nb; int bid; int32_t want; } ends[] = {
        {INT64_MIN, 32, 1, 15}, {INT64_MAX, 32, 1, 31}, {INT64_MIN, 32, 0, 31}, {INT64_MAX, 32, 0, 0},
        {INT64_MIN + 1, 32, 1, 15}, {5, 0, 1, -1}, {5, -4, 0, -1}, {INT64_MIN, 1, 1, 0}};
    for (size_t t = 0; t < sizeof ends / sizeof ends[0]; t++) {
        int32_t got = fmha_rel_bucket(ends[t].rel, ends[t].nb, 128, ends[t].bid);
        bad += !tu_check(got == ends[t].want, "fmha_rel_bucket(%lld, %d, 128, %d) = %d, want %d",
                         (long long)ends[t].rel, ends[t].nb, ends[t].bid, got, ends[t].want);
    }
    printf("fmha_rel_bucket: %s\n", bad ? "FAILED" : "hand-computed values match");
}

/* ---- block skipping: computed tiles = tiles the mask does not rule out ---- */

/* Tiles of the grid (NR queries x block_kv keys, per batch and query head)
 * with at least one visible score under p's masks. */
static long long expected_tiles(const fmha_problem *p, int64_t nr, int64_t bc) {
    long long n = 0;
    for (int64_t b = 0; b < p->batch; b++)
        for (int64_t h = 0; h < p->heads_q; h++)
            for (int64_t q0 = 0; q0 < p->seq_q; q0 += nr)
                for (int64_t k0 = 0; k0 < p->seq_kv; k0 += bc) {
                    int any = 0;
                    for (int64_t i = q0; i < q0 + nr && i < p->seq_q && !any; i++)
                        for (int64_t j = k0; j < k0 + bc && j < p->seq_kv && !any; j++)
                            any = fmha_ref_full_visible(p, b, h, i, j);
                    n += any;
                }
    return n;
}

static void tile_case(const char *name, const fmha_problem *p0, const float *q, const float *k,
                      const float *v, const float *d_o) {
    for (int ii = 0; ii < n_isa; ii++) {
        if (!isa_ok[ii]) continue;
        fmha_cpu_force_isa(isa_name(ii));
        for (int s = FMHA_STRATEGY_TILED; s <= FMHA_STRATEGY_PORTABLE; s += 2) {
            if (tu_strategy_skipped(s)) continue;
            /* the scalar kernels whatever the ISA: run once */
            if (s == FMHA_STRATEGY_PORTABLE && fmha_isa_at((size_t)ii)->table != fmha_cpu_kernels_for("scalar"))
                continue;
            fmha_problem p = *p0;
            p.strategy = (fmha_strategy)s;
            const fmha_ukernels *uk = s == FMHA_STRATEGY_PORTABLE ? fmha_cpu_kernels_for("scalar") : fmha_cpu_kernels();
            const int64_t nr = (int64_t)uk->tile.nr, bc = (int64_t)uk->tile.block_kv;
            long long want = expected_tiles(&p, nr, bc);
            long long all = p.batch * p.heads_q * ((p.seq_q + nr - 1) / nr) * ((p.seq_kv + bc - 1) / bc);
            size_t n_o = (size_t)(p.batch * p.seq_q * p.heads_q * p.head_dim_v);
            float *o = xmalloc(n_o * sizeof(float)), *lse = xmalloc((size_t)(p.batch * p.heads_q * p.seq_q) * sizeof(float));
            float *dq = xmalloc((size_t)(p.batch * p.seq_q * p.heads_q * p.head_dim) * sizeof(float));
            float *dk = xmalloc((size_t)(p.batch * p.seq_kv * p.heads_kv * p.head_dim) * sizeof(float));
            float *dv = xmalloc((size_t)(p.batch * p.seq_kv * p.heads_kv * p.head_dim_v) * sizeof(float));
            fmha_tiles_reset();
            fmha_status st = tu_forward(&p, q, k, v, o, lse, NULL, 0);
            long long fwd = fmha_tiles_computed();
            fmha_tiles_reset();
            fmha_status st2 = tu_backward(&p, q, k, v, o, d_o, lse, dq, dk, dv, NULL, NULL, 0);
            long long bwd = fmha_tiles_computed();
            tu_check(st == FMHA_OK && st2 == FMHA_OK, "tiles %s: status %d / %d", name, (int)st, (int)st2);
            tu_check(fwd == want && bwd == want,
                     "tiles %s [%s, %s]: forward %lld, backward %lld computed, expected %lld of %lld",
                     name, tu_strategy_name(s), isa_name(ii), fwd, bwd, want, all);
            printf("  tiles %-34s [%-8s %-6s grid %2lldx%-3lld]: %6lld of %6lld (fwd %lld, bwd %lld)\n",
                   name, tu_strategy_name(s), isa_name(ii), (long long)nr, (long long)bc, want, all, fwd, bwd);
            free(o), free(lse), free(dq), free(dk), free(dv);
        }
    }
    fmha_cpu_force_isa(isa_default);
}

static void check_tile_counts(void) {
    /* contiguous BSHD, B 2, Hq 2 / Hkv 1, Sq = Skv = 700 (tails off 16, 64 and 128) */
    fmha_problem p;
    fmha_problem_init(&p, 2, 2, 1, 700, 700, 16, 16, FMHA_LAYOUT_BSHD);
    float *q = tu_new_input(&p, 'q', -1, 1), *k = tu_new_input(&p, 'k', -1, 1);
    float *v = tu_new_input(&p, 'v', -1, 1), *d_o = tu_new_input(&p, 'o', -1, 1);
    tile_case("plain (every tile)", &p, q, k, v, d_o);
    fmha_problem pc = p;
    pc.causal = FMHA_CAUSAL_TOP_LEFT;
    tile_case("causal top-left", &pc, q, k, v, d_o);
    pc = p;
    pc.masks.window_left = 100, pc.masks.window_right = 0;
    tile_case("window (100, 0)", &pc, q, k, v, d_o);
    pc = p;
    pc.masks.window_left = 40, pc.masks.window_right = 40;
    tile_case("window (40, 40)", &pc, q, k, v, d_o);
    int32_t kvl[2] = {333, 129};
    pc = p;
    pc.masks.kv_lengths = kvl;
    tile_case("kv_lengths {333, 129}", &pc, q, k, v, d_o);
    int32_t ql[2] = {70, 700};
    pc = p;
    pc.masks.q_lengths = ql;
    tile_case("q_lengths {70, 700}", &pc, q, k, v, d_o);
    /* packed sequences: same segment boundaries for queries and keys */
    int32_t *seg = xmalloc(2 * 700 * sizeof(int32_t));
    static const int64_t cuts[2][4] = {{150, 300, 560, 700}, {90, 400, 410, 700}};
    for (int64_t b = 0; b < 2; b++)
        for (int64_t i = 0, s = 0; i < 700; i++) {
            while (i >= cuts[b][s]) s++;
            seg[b * 700 + i] = (int32_t)s;
        }
    pc = p;
    pc.masks.q_segment_ids = seg, pc.masks.kv_segment_ids = seg;
    tile_case("segments", &pc, q, k, v, d_o);
    causal_cb cb = {0};
    pc = p;
    pc.masks.callback = (fmha_mask_callback){causal_classify, causal_fill, &cb};
    tile_case("mask callback (causal)", &pc, q, k, v, d_o);
    free(seg), free(q), free(k), free(v), free(d_o);
    /* bottom-right, Sq 300 < Skv 700 */
    fmha_problem_init(&p, 1, 2, 2, 300, 700, 16, 16, FMHA_LAYOUT_BSHD);
    p.causal = FMHA_CAUSAL_BOTTOM_RIGHT;
    q = tu_new_input(&p, 'q', -1, 1), k = tu_new_input(&p, 'k', -1, 1);
    v = tu_new_input(&p, 'v', -1, 1), d_o = tu_new_input(&p, 'o', -1, 1);
    tile_case("causal bottom-right 300 x 700", &p, q, k, v, d_o);
    free(q), free(k), free(v), free(d_o);
}

/* ---- precision of the rel-table gradient at long S --------------------------------- */
static void check_rel_table_precision(void) {
    const int64_t S = tu_quick_pick(4096, 1024); /* quick: still 8x the distance of the last bucket */
    fmha_problem p;
    fmha_problem_init(&p, 1, 2, 1, S, S, 16, 16, FMHA_LAYOUT_BSHD);
    float table[2 * 32];
    tu_fill(table, 64, -1, 1);
    p.biases.rel_table = table;
    p.biases.rel_num_buckets = 32, p.biases.rel_max_distance = 128, p.biases.rel_bidirectional = 1;
    float *q = tu_new_input(&p, 'q', -1, 1), *k = tu_new_input(&p, 'k', -1, 1);
    float *v = tu_new_input(&p, 'v', -1, 1), *d_o = tu_new_input(&p, 'o', -1, 1);
    double t0 = now();
    /* reference: dq [S, 2, 16], dk [S, 1, 16], dv [S, 1, 16], drel and
     * the size of its terms mrel [2, 32] */
    double *rdq = xmalloc((size_t)(S * 2 * 16) * sizeof(double)), *rdk = xmalloc((size_t)(S * 16) * sizeof(double));
    double *rdv = xmalloc((size_t)(S * 16) * sizeof(double)), drel[64], mrel[64];
    if (fmha_ref_backward_full_ex(&p, q, k, v, d_o, rdq, rdk, rdv, NULL, NULL, drel, NULL, mrel) != 0) abort();
    double m_norm = 0.0, r_norm = 0.0;
    for (int t = 0; t < 64; t++) m_norm += mrel[t] * mrel[t], r_norm += drel[t] * drel[t];
    m_norm = sqrt(m_norm), r_norm = sqrt(r_norm);
    double t_ref = now() - t0;
    float *o = xmalloc((size_t)(S * 2 * 16) * sizeof(float)), *lse = xmalloc((size_t)(2 * S) * sizeof(float));
    float *dq = xmalloc((size_t)(S * 2 * 16) * sizeof(float)), *dk = xmalloc((size_t)(S * 16) * sizeof(float));
    float *dv = xmalloc((size_t)(S * 16) * sizeof(float));
    for (int ii = 0; ii < n_isa; ii++) {
        if (!isa_ok[ii]) continue;
        fmha_cpu_force_isa(isa_name(ii));
        float grel[64];
        fmha_param_grads g;
        memset(&g, 0, sizeof g);
        g.d_rel_table = grel;
        fmha_status st = tu_forward(&p, q, k, v, o, lse, NULL, 0);
        fmha_status st2 = tu_backward(&p, q, k, v, o, d_o, lse, dq, dk, dv, &g, NULL, 0);
        if (!tu_check(st == FMHA_OK && st2 == FMHA_OK, "S %lld [%s]: status %d / %d", (long long)S, isa_name(ii), (int)st, (int)st2))
            continue;
        double e = tu_rel_l2(grel, drel, 64), err = 0.0;
        for (int t = 0; t < 64; t++) err += ((double)grel[t] - drel[t]) * ((double)grel[t] - drel[t]);
        const double e_m = sqrt(err) / m_norm;
        double eq = tu_rel_l2(dq, rdq, (size_t)(S * 32)), ek = tu_rel_l2(dk, rdk, (size_t)(S * 16));
        double ev = tu_rel_l2(dv, rdv, (size_t)(S * 16));
        tu_check(e_m <= REL_SUM_M, "S %lld [%s]: d_rel_table error %.3g of its terms' size (relative L2 %.3g)",
                 (long long)S, isa_name(ii), e_m, e);
        tu_check(eq <= REL_L2 && ek <= REL_L2 && ev <= REL_L2,
                 "S %lld [%s]: dQ %.3g dK %.3g dV %.3g relative L2", (long long)S, isa_name(ii), eq, ek, ev);
        printf("rel-table gradient at S = %lld [%s]: %.2e of its terms' size (relative L2 %.2e; ||r|| %.2e of it), "
               "dQ %.1e dK %.1e dV %.1e\n",
               (long long)S, isa_name(ii), e_m, e, r_norm / m_norm, eq, ek, ev);
    }
    fmha_cpu_force_isa(isa_default);
    printf("  (reference took %.1f s)\n", t_ref);
    free(q), free(k), free(v), free(d_o), free(rdq), free(rdk), free(rdv);
    free(o), free(lse), free(dq), free(dk), free(dv);
}

/* ---- bad arguments: the status, and nothing written ----------------------- */

typedef struct bad_env {
    fmha_problem p;
    float *q, *k, *v, *d_o, *o_in, *lse_in;     /* valid inputs (o, lse from a good forward) */
    float *o, *lse, *dq, *dk, *dv;              /* outputs, sentinel */
    float dd[2 * 2 * 5 * 7 + GUARD], dal[2 + GUARD], drel[2 * 4 + GUARD];
} bad_env;

static void bad_reset(bad_env *e) {
    const float s = sentinel();
    size_t n_o = (size_t)(2 * 5 * 2 * 4), n_l = (size_t)(2 * 2 * 5);
    for (size_t i = 0; i < n_o; i++) e->o[i] = s;
    for (size_t i = 0; i < n_l + GUARD; i++) e->lse[i] = s;
    for (size_t i = 0; i < (size_t)(2 * 5 * 2 * 4); i++) e->dq[i] = s;
    for (size_t i = 0; i < (size_t)(2 * 7 * 1 * 4); i++) e->dk[i] = e->dv[i] = s;
    for (size_t i = 0; i < sizeof e->dd / sizeof(float); i++) e->dd[i] = s;
    for (size_t i = 0; i < sizeof e->dal / sizeof(float); i++) e->dal[i] = s;
    for (size_t i = 0; i < sizeof e->drel / sizeof(float); i++) e->drel[i] = s;
}

static int bad_untouched(const bad_env *e) {
    const float s = sentinel();
    return tu_count_not(e->o, 2 * 5 * 2 * 4, s) == 0 && tu_count_not(e->lse, 2 * 2 * 5 + GUARD, s) == 0 &&
           tu_count_not(e->dq, 2 * 5 * 2 * 4, s) == 0 && tu_count_not(e->dk, 2 * 7 * 4, s) == 0 &&
           tu_count_not(e->dv, 2 * 7 * 4, s) == 0 && tu_count_not(e->dd, sizeof e->dd / sizeof(float), s) == 0 &&
           tu_count_not(e->dal, sizeof e->dal / sizeof(float), s) == 0 &&
           tu_count_not(e->drel, sizeof e->drel / sizeof(float), s) == 0;
}

/* Forward and backward of p (with grads g) must both return want and write nothing. */
static void expect_bad(bad_env *e, const char *what, const fmha_problem *p, const fmha_param_grads *g,
                       fmha_status want, int forward_too) {
    bad_reset(e);
    fmha_status sf = forward_too ? tu_forward(p, e->q, e->k, e->v, e->o, e->lse, NULL, 0) : want;
    fmha_status sb = tu_backward(p, e->q, e->k, e->v, e->o_in, e->d_o, e->lse_in, e->dq, e->dk, e->dv, g, NULL, 0);
    int untouched = bad_untouched(e);
    char fwd[96] = "not called";
    if (forward_too) snprintf(fwd, sizeof fwd, "%d (%s)", (int)sf, fmha_status_string(sf));
    tu_check(sf == want && sb == want && untouched,
             "bad input: %s: forward %s, backward %d (%s), expected %d (%s); outputs %s", what, fwd,
             (int)sb, fmha_status_string(sb), (int)want, fmha_status_string(want),
             untouched ? "untouched" : "WRITTEN");
}

static void check_bad_inputs(void) {
    bad_env e;
    memset(&e, 0, sizeof e);
    fmha_problem_init(&e.p, 2, 2, 1, 5, 7, 4, 4, FMHA_LAYOUT_BSHD);
    e.q = tu_new_input(&e.p, 'q', -1, 1), e.k = tu_new_input(&e.p, 'k', -1, 1);
    e.v = tu_new_input(&e.p, 'v', -1, 1), e.d_o = tu_new_input(&e.p, 'o', -1, 1);
    e.o_in = xmalloc(2 * 5 * 2 * 4 * sizeof(float)), e.lse_in = xmalloc(2 * 2 * 5 * sizeof(float));
    e.o = xmalloc(2 * 5 * 2 * 4 * sizeof(float)), e.lse = xmalloc((2 * 2 * 5 + GUARD) * sizeof(float));
    e.dq = xmalloc(2 * 5 * 2 * 4 * sizeof(float)), e.dk = xmalloc(2 * 7 * 4 * sizeof(float));
    e.dv = xmalloc(2 * 7 * 4 * sizeof(float));
    tu_check(tu_forward(&e.p, e.q, e.k, e.v, e.o_in, e.lse_in, NULL, 0) == FMHA_OK, "bad input: valid forward");

    int32_t kvl[2] = {7, 7}, ql[2] = {5, 5}, seg_q[10] = {0}, seg_k[14] = {0};
    uint8_t dmask[7] = {1, 1, 1, 1, 1, 1, 1};
    float bias[2 * 7], table[8] = {0};
    fmha_problem p;

    p = e.p, p.alignment = 3;
    expect_bad(&e, "alignment 3", &p, NULL, FMHA_ERR_BAD_OPTION, 1);
    p = e.p, p.alignment = -1;
    expect_bad(&e, "alignment -1", &p, NULL, FMHA_ERR_BAD_OPTION, 1);
    p = e.p, p.causal = FMHA_CAUSAL_TOP_LEFT, p.alignment = FMHA_ALIGN_BOTTOM_RIGHT;
    expect_bad(&e, "causal top-left with alignment bottom-right", &p, NULL, FMHA_ERR_BAD_OPTION, 1);
    p = e.p, p.causal = FMHA_CAUSAL_BOTTOM_RIGHT, p.alignment = FMHA_ALIGN_TOP_LEFT;
    expect_bad(&e, "causal bottom-right with alignment top-left", &p, NULL, FMHA_ERR_BAD_OPTION, 1);
    p = e.p, kvl[1] = -1, p.masks.kv_lengths = kvl;
    expect_bad(&e, "kv_lengths -1", &p, NULL, FMHA_ERR_BAD_MASK, 1);
    p = e.p, kvl[1] = 8, p.masks.kv_lengths = kvl;
    expect_bad(&e, "kv_lengths Skv + 1", &p, NULL, FMHA_ERR_BAD_MASK, 1);
    p = e.p, ql[0] = -1, p.masks.q_lengths = ql;
    expect_bad(&e, "q_lengths -1", &p, NULL, FMHA_ERR_BAD_MASK, 1);
    p = e.p, ql[0] = 6, p.masks.q_lengths = ql;
    expect_bad(&e, "q_lengths Sq + 1", &p, NULL, FMHA_ERR_BAD_MASK, 1);
    p = e.p, p.masks.q_segment_ids = seg_q;
    expect_bad(&e, "q_segment_ids without kv_segment_ids", &p, NULL, FMHA_ERR_BAD_MASK, 1);
    p = e.p, p.masks.kv_segment_ids = seg_k;
    expect_bad(&e, "kv_segment_ids without q_segment_ids", &p, NULL, FMHA_ERR_BAD_MASK, 1);
    /* fmha.h: FMHA_ERR_BAD_STRIDE is "a negative stride" */
    p = e.p, p.masks.dense = dmask + 6;
    p.masks.dense_strides[0] = 0, p.masks.dense_strides[1] = 0, p.masks.dense_strides[2] = 0;
    p.masks.dense_strides[3] = -1;
    expect_bad(&e, "dense mask key stride -1", &p, NULL, FMHA_ERR_BAD_STRIDE, 1);
    p = e.p, p.biases.dense = bias + 6;
    p.biases.dense_strides[0] = 7, p.biases.dense_strides[1] = 0, p.biases.dense_strides[2] = 0;
    p.biases.dense_strides[3] = -1;
    tu_fill(bias, 14, -1, 1);
    expect_bad(&e, "dense bias key stride -1", &p, NULL, FMHA_ERR_BAD_STRIDE, 1);
    p = e.p, p.masks.callback = (fmha_mask_callback){classify_seven, causal_fill, &(causal_cb){0}};
    expect_bad(&e, "mask callback classify returns 7", &p, NULL, FMHA_ERR_CALLBACK, 1);
    p = e.p, p.biases.rel_table = table, p.biases.rel_num_buckets = 0, p.biases.rel_max_distance = 8;
    expect_bad(&e, "rel_num_buckets 0", &p, NULL, FMHA_ERR_BAD_MASK, 1);
    p = e.p, p.biases.rel_table = table, p.biases.rel_num_buckets = 4, p.biases.rel_max_distance = 0;
    expect_bad(&e, "rel_max_distance 0", &p, NULL, FMHA_ERR_BAD_MASK, 1);
    p = e.p, p.biases.softcap = -1.0f;
    expect_bad(&e, "softcap -1", &p, NULL, FMHA_ERR_BAD_MASK, 1);
    p = e.p, p.biases.softcap = NAN;
    expect_bad(&e, "softcap NaN", &p, NULL, FMHA_ERR_BAD_MASK, 1);
    p = e.p, p.masks.window_left = -2;
    expect_bad(&e, "window_left -2", &p, NULL, FMHA_ERR_BAD_MASK, 1);
    fmha_param_grads g;
    memset(&g, 0, sizeof g);
    g.d_alibi = e.dal;
    expect_bad(&e, "d_alibi without alibi", &e.p, &g, FMHA_ERR_BAD_MASK, 0);
    /* d_dense broadcasting over queries where the bias [B, 1, 1, Skv] does
     * not... is allowed (the bias broadcasts there); over keys it is not:
     * its elements would overlap, which fmha.h calls FMHA_ERR_BAD_STRIDE */
    p = e.p, p.biases.dense = bias;
    p.biases.dense_strides[0] = 7, p.biases.dense_strides[1] = 0, p.biases.dense_strides[2] = 0;
    p.biases.dense_strides[3] = 1;
    memset(&g, 0, sizeof g);
    g.d_dense = e.dd;
    g.d_dense_strides[0] = 7, g.d_dense_strides[1] = 0, g.d_dense_strides[2] = 0, g.d_dense_strides[3] = 0;
    expect_bad(&e, "d_dense key stride 0 where the bias has 1", &p, &g, FMHA_ERR_BAD_STRIDE, 0);
    /* the same problem with a matching d_dense works (control) */
    g.d_dense_strides[3] = 1;
    bad_reset(&e);
    fmha_status st = tu_backward(&p, e.q, e.k, e.v, e.o_in, e.d_o, e.lse_in, e.dq, e.dk, e.dv, &g, NULL, 0);
    tu_check(st == FMHA_OK, "bad input control: matching d_dense gives %d", (int)st);
    free(e.q), free(e.k), free(e.v), free(e.d_o), free(e.o_in), free(e.lse_in);
    free(e.o), free(e.lse), free(e.dq), free(e.dk), free(e.dv);
    printf("bad inputs checked\n");
}

/* ---- summary ---- */
static void print_summary(void) {
    printf("\nworst errors per case label (over strategies and ISAs):\n");
    printf("  %-50s %9s %9s %9s %7s\n", "label", "O relL2", "grad rel", "param rel", "ratio");
    for (int i = 0; i < n_labels; i++)
        printf("  %-50s %9.2e %9.2e %9.2e %7.3f\n", labels[i], worst_label[i][W_O], worst_label[i][W_GRAD],
               worst_label[i][W_PARAM], worst_label[i][W_RATIO]);
    printf("worst errors per strategy and ISA:\n");
    for (int s = 0; s < 4; s++)
        for (int ii = 0; ii < n_isa; ii++) {
            if (!isa_ok[ii]) continue;
            const double *w = worst_si[s][ii];
            printf("  %-8s %-6s O %.2e  grad %.2e  param %.2e  ratio %.3f\n", tu_strategy_name(s),
                   isa_name(ii), w[W_O], w[W_GRAD], w[W_PARAM], w[W_RATIO]);
        }
}

/* Two tables with the same float32 kernels and tiles run float32 alike. */
static int same_f32_kernels(const fmha_ukernels *a, const fmha_ukernels *b) {
    const fmha_uk_tile *x = &a->tile, *y = &b->tile;
    return x->mr == y->mr && x->nr == y->nr && x->block_kv == y->block_kv && x->gemm == y->gemm &&
           x->softmax == y->softmax && x->exp_sub == y->exp_sub && x->ds == y->ds &&
           a->rows.add_transposed == b->rows.add_transposed;
}

int main(void) {
    tu_seed();
    isa_default = fmha_cpu_kernels()->isa;
    n_isa = (int)fmha_isa_count();
    if (!tu_check(n_isa <= MAX_ISA, "%d registered ISAs, room for %d", n_isa, MAX_ISA))
        return tu_finish();
    for (int i = 0; i < n_isa; i++) {
        const fmha_ukernels *u = fmha_isa_at((size_t)i)->table;
        isa_ok[i] = tu_isa_runs(fmha_isa_at((size_t)i));
        if (!isa_ok[i]) printf("%s: not run here, skipped\n", isa_name(i));
        for (int j = 0; j < i && isa_ok[i]; j++)
            if (isa_ok[j] && same_f32_kernels(u, fmha_isa_at((size_t)j)->table)) {
                printf("%s: the float32 kernels of %s, skipped\n", isa_name(i), isa_name(j));
                isa_ok[i] = 0;
            }
    }
    nthreads = fmha_get_num_threads();
    verbose = getenv("FMHA_TEST_VERBOSE") ? atoi(getenv("FMHA_TEST_VERBOSE")) : 0;
    printf("threads %d, default ISA %s\n", nthreads, isa_default);
    double t0 = now();
    check_rel_bucket();
    check_bad_inputs();
    fixed_cases();
    masked_row_cases();
    random_cases(tu_emulated() ? 5 : (int)tu_quick_pick(40, 10));
    double t1 = now();
    print_summary();
    printf("tile counts:\n");
    check_tile_counts();
    double t2 = now();
    check_rel_table_precision();
    printf("time: cases %.1f s, tiles %.1f s, long S %.1f s\n", t1 - t0, t2 - t1, now() - t2);
    return tu_finish();
}
