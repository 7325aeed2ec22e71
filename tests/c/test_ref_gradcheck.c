/* test_ref_gradcheck.c: checks the float64 reference itself, since every
 * other test trusts it. The forward against cases with known answers
 * (hand-computed softmax, uniform attention, masks, layouts); the backward
 * against central finite differences of the reference forward's loss
 * L = sum(O * dO), on tiny shapes covering MHA, GQA, MQA, Sq != Skv, D != Dv,
 * both causal alignments and fully masked rows.
 *
 * Finite differences: inputs are multiples of 2^-10 in [-1, 1] and steps are
 * h = 2^-7 and h/2, so x +- h is exact in float32 and the reference sees
 * exactly the perturbed value. Richardson's extrapolation (4 D(h/2) - D(h)) / 3
 * of the two central differences leaves a truncation error O(h^4) with small
 * constants on these O(1) inputs, and rounding error ~ 1e-16 |L| / h ~ 1e-13;
 * the check is
 *   |fd - analytic| <= 1e-9 * max(1, max |analytic|) over each tensor
 * (observed: 1e-13 to 4e-12; a wrong term in the backward gives > 1e-7). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fmha_ref.h"
#include "test_util.h"

#define FD_TOL 1e-9

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
                    *e = (float)(nearbyint(*e * 1024.0) / 1024.0);
                }
    return x;
}

/* L = sum(O * dO) with the reference forward, in double. o: scratch [B, Sq, Hq, Dv]. */
static double loss(const fmha_problem *p, const float *q, const float *k, const float *v,
                   const float *d_o, double *o) {
    if (fmha_ref_forward(p, q, k, v, o, NULL) != 0) abort();
    double l = 0.0;
    size_t t = 0;
    for (int64_t b = 0; b < p->batch; b++)
        for (int64_t i = 0; i < p->seq_q; i++)
            for (int64_t h = 0; h < p->heads_q; h++)
                for (int64_t c = 0; c < p->head_dim_v; c++)
                    l += o[t++] * (double)*tu_elem((float *)d_o, p->o_strides, b, i, h, c);
    return l;
}

/* Compares the analytic gradient g [contiguous, shape of tensor `which`] with
 * Richardson-extrapolated central differences over every element of x. */
static double fd_check(const char *name, const fmha_problem *p, float *q, float *k, float *v,
                       const float *d_o, char which, const double *g, double *o) {
    float *x = which == 'q' ? q : which == 'k' ? k : v;
    int64_t n[4];
    const int64_t *st = tu_shape(p, which, n);
    const double h = 0x1.0p-7;
    double worst = 0.0, gmax = tu_max_abs_d(g, tu_numel(n));
    size_t t = 0;
    for (int64_t b = 0; b < n[0]; b++)
        for (int64_t s = 0; s < n[1]; s++)
            for (int64_t hh = 0; hh < n[2]; hh++)
                for (int64_t d = 0; d < n[3]; d++, t++) {
                    float *e = tu_elem(x, st, b, s, hh, d);
                    const float x0 = *e;
                    double l[4];
                    const double steps[4] = {h, -h, h / 2, -h / 2};
                    for (int u = 0; u < 4; u++) {
                        *e = (float)(x0 + steps[u]);
                        l[u] = loss(p, q, k, v, d_o, o);
                    }
                    *e = x0;
                    const double d1 = (l[0] - l[1]) / (2 * h), d2 = (l[2] - l[3]) / h;
                    const double fd = (4 * d2 - d1) / 3;
                    const double err = fabs(fd - g[t]);
                    if (err > worst) worst = err;
                }
    const double bound = FD_TOL * (gmax > 1.0 ? gmax : 1.0);
    tu_check(worst <= bound, "%s: d%c finite-difference error %.3g > %.3g", name, which, worst,
             bound);
    return worst / (gmax > 1.0 ? gmax : 1.0);
}

static void gradcheck(const char *name, int64_t B, int64_t hq, int64_t hkv, int64_t sq,
                      int64_t skv, int64_t d, int64_t dv, fmha_causal causal, float scale,
                      int layout) {
    fmha_problem p;
    tu_problem(&p, B, hq, hkv, sq, skv, d, dv);
    p.causal = causal;
    p.scale = scale;
    tu_set_layout(&p, layout);
    float *q = grid_input(&p, 'q'), *k = grid_input(&p, 'k'), *v = grid_input(&p, 'v');
    float *d_o = grid_input(&p, 'o');
    /* dq [B, Sq, Hq, D], dk [B, Skv, Hkv, D], dv_ [B, Skv, Hkv, Dv], o [B, Sq, Hq, Dv] */
    double *dq = malloc(sizeof(double) * (size_t)(B * sq * hq * d));
    double *dk = malloc(sizeof(double) * (size_t)(B * skv * hkv * d));
    double *dv_ = malloc(sizeof(double) * (size_t)(B * skv * hkv * dv));
    double *o = malloc(sizeof(double) * (size_t)(B * sq * hq * dv));
    tu_check(fmha_ref_backward(&p, q, k, v, d_o, dq, dk, dv_) == 0, "%s: backward failed", name);
    double w = fd_check(name, &p, q, k, v, d_o, 'q', dq, o);
    double wk = fd_check(name, &p, q, k, v, d_o, 'k', dk, o);
    double wv = fd_check(name, &p, q, k, v, d_o, 'v', dv_, o);
    if (wk > w) w = wk;
    if (wv > w) w = wv;
    /* rows of queries that see no key: exactly zero gradient */
    for (int64_t b = 0; b < B; b++)
        for (int64_t i = 0; i < sq; i++) {
            int any = 0;
            for (int64_t j = 0; j < skv; j++) any |= fmha_ref_visible(&p, i, j);
            if (any) continue;
            for (int64_t h = 0; h < hq; h++)
                for (int64_t c = 0; c < d; c++)
                    tu_check(dq[((b * sq + i) * hq + h) * d + c] == 0.0,
                             "%s: dq of fully masked query %lld is not 0", name, (long long)i);
        }
    printf("%-34s worst |fd - analytic| / max(1, max|g|) = %.2e\n", name, w);
    free(q), free(k), free(v), free(d_o), free(dq), free(dk), free(dv_), free(o);
}

/* ---- forward against known answers -------------------------------------- */

static void check_hand_computed(void) {
    /* Sq = 1, Skv = 2, D = 1, Dv = 1, scale 1: scores (0, 1), V = (1, 3):
     * O = (1 + 3e) / (1 + e), lse = log(1 + e). */
    fmha_problem p;
    tu_problem(&p, 1, 1, 1, 1, 2, 1, 1);
    p.scale = 1.0f;
    float q[1] = {1.0f}, k[2] = {0.0f, 1.0f}, v[2] = {1.0f, 3.0f};
    double o, lse;
    fmha_ref_forward(&p, q, k, v, &o, &lse);
    const double e = exp(1.0);
    tu_check(fabs(o - (1 + 3 * e) / (1 + e)) < 1e-15, "hand-computed O %.17g", o);
    tu_check(fabs(lse - log(1 + e)) < 1e-15, "hand-computed lse %.17g", lse);
    /* default scale: D = 4 gives 1/2, so q . k = 2 is a score of 1 */
    tu_problem(&p, 1, 1, 1, 1, 2, 4, 1);
    float q4[4] = {1, 1, 0, 0}, k4[8] = {0, 0, 0, 0, 1, 1, 0, 0};
    fmha_ref_forward(&p, q4, k4, v, &o, &lse);
    tu_check(fmha_ref_scale(&p) == 0.5, "default scale of D = 4 is %.17g", fmha_ref_scale(&p));
    tu_check(fabs(o - (1 + 3 * e) / (1 + e)) < 1e-15, "default-scale O %.17g", o);
}

static void check_masks_and_uniform(void) {
    /* K = 0: every visible key has score 0, so O is the mean of the visible V
     * rows and lse = log(count); Sq = 5 > Skv = 3 bottom-right leaves queries
     * 0 and 1 fully masked. */
    for (int causal = 0; causal < 3; causal++) {
        fmha_problem p;
        tu_problem(&p, 2, 4, 2, 5, 3, 3, 2);
        p.causal = (fmha_causal)causal;
        float *q = tu_new_input(&p, 'q', -1, 1), *v = tu_new_input(&p, 'v', -1, 1);
        float *k = tu_new_input(&p, 'k', 0, 0);
        double o[2 * 5 * 4 * 2], lse[2 * 4 * 5];
        fmha_ref_forward(&p, q, k, v, o, lse);
        double worst = 0.0;
        int ok_masked = 1;
        for (int64_t b = 0; b < 2; b++)
            for (int64_t h = 0; h < 4; h++)
                for (int64_t i = 0; i < 5; i++) {
                    int count = 0;
                    double mean[2] = {0, 0};
                    for (int64_t j = 0; j < 3; j++) {
                        int vis = fmha_ref_visible(&p, i, j);
                        int expect = causal == 0 ? 1 : causal == 1 ? j <= i : j <= i - 2;
                        tu_check(vis == expect, "visible(%d, %lld, %lld)", causal, (long long)i,
                                 (long long)j);
                        if (!vis) continue;
                        count++;
                        for (int c = 0; c < 2; c++) mean[c] += *tu_elem(v, p.v_strides, b, j, h / 2, c);
                    }
                    const double *oi = o + ((b * 5 + i) * 4 + h) * 2;
                    const double l = lse[(b * 4 + h) * 5 + i];
                    if (count == 0) {
                        ok_masked &= oi[0] == 0.0 && oi[1] == 0.0 && l == -INFINITY;
                        continue;
                    }
                    for (int c = 0; c < 2; c++) {
                        double err = fabs(oi[c] - mean[c] / count);
                        if (err > worst) worst = err;
                    }
                    double err = fabs(l - log((double)count));
                    if (err > worst) worst = err;
                }
        tu_check(worst < 1e-14, "uniform attention (%s): error %.3g", tu_causal_name(causal), worst);
        tu_check(ok_masked, "fully masked rows (%s): O = 0, lse = -inf", tu_causal_name(causal));
        free(q), free(k), free(v);
    }
}

/* The same logical tensors in every layout give bitwise the same result. */
static void check_layouts(void) {
    fmha_problem p0;
    tu_problem(&p0, 2, 4, 2, 7, 9, 5, 3);
    p0.causal = FMHA_CAUSAL_BOTTOM_RIGHT;
    float *x0[4] = {tu_new_input(&p0, 'q', -1, 1), tu_new_input(&p0, 'k', -1, 1),
                    tu_new_input(&p0, 'v', -1, 1), tu_new_input(&p0, 'o', -1, 1)};
    /* reference results of the contiguous layout: o, lse, dq, dk, dv */
    size_t no = 2 * 7 * 4 * 3, nl = 2 * 4 * 7, nq = 2 * 7 * 4 * 5, nk = 2 * 9 * 2 * 5, nv = 2 * 9 * 2 * 3;
    double *r0 = malloc(sizeof(double) * (no + nl + nq + nk + nv));
    double *r1 = malloc(sizeof(double) * (no + nl + nq + nk + nv));
    fmha_ref_forward(&p0, x0[0], x0[1], x0[2], r0, r0 + no);
    fmha_ref_backward(&p0, x0[0], x0[1], x0[2], x0[3], r0 + no + nl, r0 + no + nl + nq,
                      r0 + no + nl + nq + nk);
    for (int layout = 1; layout < TU_LAYOUT_COUNT; layout++) {
        fmha_problem p = p0;
        tu_set_layout(&p, layout);
        float *x[4];
        const char which[4] = {'q', 'k', 'v', 'o'};
        for (int t = 0; t < 4; t++) {
            int64_t n[4];
            const int64_t *st = tu_shape(&p, which[t], n);
            const int64_t *st0 = tu_shape(&p0, which[t], n);
            x[t] = tu_new_input(&p, which[t], 0, 0);
            for (int64_t b = 0; b < n[0]; b++)
                for (int64_t s = 0; s < n[1]; s++)
                    for (int64_t h = 0; h < n[2]; h++)
                        for (int64_t d = 0; d < n[3]; d++)
                            *tu_elem(x[t], st, b, s, h, d) = *tu_elem(x0[t], st0, b, s, h, d);
        }
        fmha_ref_forward(&p, x[0], x[1], x[2], r1, r1 + no);
        fmha_ref_backward(&p, x[0], x[1], x[2], x[3], r1 + no + nl, r1 + no + nl + nq,
                          r1 + no + nl + nq + nk);
        tu_check(!memcmp(r0, r1, sizeof(double) * (no + nl + nq + nk + nv)),
                 "layout %s changes the reference result", tu_layout_name(layout));
        for (int t = 0; t < 4; t++) free(x[t]);
    }
    for (int t = 0; t < 4; t++) free(x0[t]);
    free(r0), free(r1);
}

/* Scores near the float32 limit: finite, one-hot on the largest score. */
static void check_large_logits(void) {
    fmha_problem p;
    tu_problem(&p, 1, 1, 1, 1, 3, 1, 1);
    p.scale = 1.0f;
    float q[1] = {0x1.0p62f}, k[3] = {0x1.0p62f, -0x1.0p62f, 0x1.0p61f}, v[3] = {2, 5, 7};
    double o, lse;
    fmha_ref_forward(&p, q, k, v, &o, &lse);
    tu_check(o == 2.0 && lse == 0x1.0p124, "large logits: O %g, lse %g", o, lse);
    double dq, dk[3], dv[3];
    float d_o[1] = {1.0f};
    fmha_ref_backward(&p, q, k, v, d_o, &dq, dk, dv);
    tu_check(dq == 0.0 && dk[0] == 0.0 && dv[0] == 1.0 && dv[1] == 0.0,
             "large logits: dq %g dk0 %g dv0 %g dv1 %g", dq, dk[0], dv[0], dv[1]);
}

int main(void) {
    tu_seed();
    check_hand_computed();
    check_masks_and_uniform();
    check_layouts();
    check_large_logits();
    gradcheck("mha 2x2 heads, Sq 3, Skv 4, D 3", 2, 2, 2, 3, 4, 3, 3, FMHA_CAUSAL_NONE, 0.0f,
              TU_LAYOUT_BSHD);
    gradcheck("gqa 4/2, top-left, D 2, Dv 3", 1, 4, 2, 3, 3, 2, 3, FMHA_CAUSAL_TOP_LEFT, 0.0f,
              TU_LAYOUT_BHSD);
    gradcheck("mqa 3/1, Sq 2 < Skv 5, bottom-right", 1, 3, 1, 2, 5, 4, 2,
              FMHA_CAUSAL_BOTTOM_RIGHT, 0.0f, TU_LAYOUT_PADDED);
    gradcheck("Sq 5 > Skv 3 bottom-right (masked)", 2, 2, 1, 5, 3, 3, 2,
              FMHA_CAUSAL_BOTTOM_RIGHT, 0.0f, TU_LAYOUT_PADDED2);
    gradcheck("Sq 2 < Skv 4 top-left (unseen keys)", 1, 2, 2, 2, 4, 3, 4, FMHA_CAUSAL_TOP_LEFT,
              0.0f, TU_LAYOUT_BSHD);
    gradcheck("Sq 4 > Skv 2 top-left, scale 1.3", 1, 2, 1, 4, 2, 2, 1, FMHA_CAUSAL_TOP_LEFT,
              1.3f, TU_LAYOUT_PADDED);
    gradcheck("D 1, Dv 5, scale 0.7", 1, 1, 1, 3, 3, 1, 5, FMHA_CAUSAL_NONE, 0.7f,
              TU_LAYOUT_BHSD);
    return tu_finish();
}
