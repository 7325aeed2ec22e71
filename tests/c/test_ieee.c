/* test_ieee.c: NaN, infinity and extreme values reach the outputs as IEEE
 * arithmetic says, the same on every instruction set and strategy:
 *   a NaN in Q, or in K at a key a row sees, makes that row's O and lse NaN;
 *   a NaN in V makes the O column it reaches NaN and leaves lse alone, and
 *   never reaches a row a mask hides its key from;
 *   +inf in K gives the rows that see it NaN, -inf hides the key;
 *   keys at or past kv_lengths[b] are never read (NaN there changes nothing);
 *   a large finite scale with representable logits does not overflow;
 * and outputs aliasing the bias, the bias gradients or the length arrays are
 * refused with nothing written. Finite rows are checked against the float64
 * reference (relative 2e-5 + absolute 1e-6); NaN patterns must match it. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/cpu.h"
#include "fmha_ref_masks.h"
#include "test_util.h"

/* AUTO takes the decode driver for few queries against many keys */
static const int strategies[] = {FMHA_STRATEGY_AUTO, FMHA_STRATEGY_TILED, FMHA_STRATEGY_DENSE,
                                 FMHA_STRATEGY_PORTABLE};

typedef struct ieee_case {
    fmha_problem p;
    float *q, *k, *v;
    int64_t nq[4], nk[4], nv[4], no[4];
} ieee_case;

static void case_new_sized(ieee_case *c, int64_t hq, int64_t sq, int64_t skv, int causal, double q_hi,
                           double k_hi) {
    fmha_problem_init(&c->p, 1, hq, 1, sq, skv, 16, 16, FMHA_LAYOUT_BSHD);
    c->p.causal = causal ? FMHA_CAUSAL_TOP_LEFT : FMHA_CAUSAL_NONE;
    c->q = tu_new_input(&c->p, 'q', -q_hi, q_hi);
    c->k = tu_new_input(&c->p, 'k', -k_hi, k_hi);
    c->v = tu_new_input(&c->p, 'v', -1, 1);
    tu_shape(&c->p, 'q', c->nq);
    tu_shape(&c->p, 'k', c->nk);
    tu_shape(&c->p, 'v', c->nv);
    tu_shape(&c->p, 'o', c->no);
}

static void case_new(ieee_case *c, int causal, double q_hi, double k_hi) {
    case_new_sized(c, 2, 70, 150, causal, q_hi, k_hi);
}

static void case_free(ieee_case *c) { free(c->q), free(c->k), free(c->v); }

/* Forward on every ISA and strategy against the reference: equal NaN
 * patterns (O and lse), finite values within tolerance. */
static void check_forward_tol(const char *what, const ieee_case *c, double atol, double rtol) {
    size_t no = tu_numel(c->no), nl = (size_t)(c->p.batch * c->p.heads_q * c->p.seq_q);
    double *ro = malloc(no * sizeof(double)), *rl = malloc(nl * sizeof(double));
    float *o = malloc(no * sizeof(float)), *lse = malloc(nl * sizeof(float));
    fmha_ref_forward_full(&c->p, c->q, c->k, c->v, ro, rl);
    char isa[64];
    for (size_t r = 0; tu_isa_run(r, 1, isa, sizeof isa); r++) {
        for (size_t si = 0; si < sizeof strategies / sizeof strategies[0]; si++) {
            if (strategies[si] == FMHA_STRATEGY_PORTABLE && strcmp(isa, "scalar")) continue; /* once */
            fmha_problem p = c->p;
            p.strategy = (fmha_strategy)strategies[si];
            fmha_status st = tu_forward(&p, c->q, c->k, c->v, o, lse, NULL, 0);
            if (!tu_check(st == FMHA_OK, "%s %s %s: status %d", what, isa, tu_strategy_name(p.strategy), st))
                continue;
            size_t bad = 0, first = (size_t)-1;
            for (size_t e = 0; e < no; e++) {
                int ok = isnan(ro[e])   ? isnan(o[e])
                         : isinf(ro[e]) ? o[e] == ro[e]
                                        : !isnan(o[e]) && fabs(o[e] - ro[e]) <= atol + rtol * fabs(ro[e]);
                if (!ok && bad++ == 0) first = e;
            }
            for (size_t e = 0; e < nl; e++) {
                int ok = isnan(rl[e]) ? isnan(lse[e])
                         : isinf(rl[e]) ? lse[e] == rl[e]
                                        : !isnan(lse[e]) && fabs(lse[e] - rl[e]) <= 10 * atol + rtol * fabs(rl[e]);
                bad += !ok;
            }
            tu_check(bad == 0, "%s %s %s: %zu values differ from the reference (first O[%zu] = %g, ref %g)", what,
                     isa, tu_strategy_name(p.strategy), bad, first == (size_t)-1 ? 0 : first,
                     first == (size_t)-1 ? 0.0 : o[first], first == (size_t)-1 ? 0.0 : ro[first]);
        }
    }
    free(ro), free(rl), free(o), free(lse);
}

static void check_forward(const char *what, const ieee_case *c) { check_forward_tol(what, c, 1e-6, 2e-5); }

/* Decoding shapes (2 queries, 4 heads of one kv head, 300 keys): NaN in Q,
 * K and V, and NaN past the key length, through the decode driver. */
static void test_nan_decode(void) {
    ieee_case c;
    case_new_sized(&c, 4, 2, 300, 0, 1, 1);
    *tu_elem(c.q, c.p.q_strides, 0, 1, 2, 3) = NAN;
    check_forward("decode: NaN in Q", &c);
    *tu_elem(c.q, c.p.q_strides, 0, 1, 2, 3) = 0.5f;
    *tu_elem(c.k, c.p.k_strides, 0, 200, 0, 1) = NAN;
    check_forward("decode: NaN in K", &c);
    *tu_elem(c.k, c.p.k_strides, 0, 200, 0, 1) = 0.5f;
    *tu_elem(c.v, c.p.v_strides, 0, 17, 0, 4) = NAN;
    check_forward("decode: NaN in V", &c);
    *tu_elem(c.v, c.p.v_strides, 0, 17, 0, 4) = 0.5f;
    /* bottom-right causal: key 299 is row 1's alone; row 0 must stay finite */
    c.p.causal = FMHA_CAUSAL_BOTTOM_RIGHT;
    *tu_elem(c.v, c.p.v_strides, 0, 299, 0, 4) = NAN;
    check_forward("decode: NaN in V at a key the band hides from row 0", &c);
    *tu_elem(c.v, c.p.v_strides, 0, 299, 0, 4) = 0.5f;
    c.p.causal = FMHA_CAUSAL_NONE;
    int32_t kv_lengths[1] = {250};
    c.p.masks.kv_lengths = kv_lengths;
    for (int64_t d = 0; d < 16; d++) {
        *tu_elem(c.k, c.p.k_strides, 0, 260, 0, d) = NAN;
        *tu_elem(c.v, c.p.v_strides, 0, 255, 0, d) = NAN;
    }
    check_forward("decode: NaN past kv_lengths", &c);
    case_free(&c);
}

/* Counts NaN rows of O (a row: Dv values of (b, i, h)) and checks which. */
static size_t ref_nan_rows(const ieee_case *c) {
    size_t no = tu_numel(c->no), rows = 0;
    double *ro = malloc(no * sizeof(double));
    fmha_ref_forward_full(&c->p, c->q, c->k, c->v, ro, NULL);
    for (size_t r = 0; r < no / 16; r++) rows += isnan(ro[r * 16]);
    free(ro);
    return rows;
}

static void test_nan_in_q(void) {
    ieee_case c;
    case_new(&c, 0, 1, 1);
    *tu_elem(c.q, c.p.q_strides, 0, 5, 1, 3) = NAN;
    tu_check(ref_nan_rows(&c) == 1, "the reference: a NaN in Q makes its one row NaN");
    check_forward("NaN in Q", &c);
    case_free(&c);
}

static void test_nan_in_k(void) {
    ieee_case c;
    case_new(&c, 1, 1, 1);
    *tu_elem(c.k, c.p.k_strides, 0, 40, 0, 2) = NAN;
    tu_check(ref_nan_rows(&c) == 2 * 30, "the reference: rows 40.. of both heads see the NaN key");
    check_forward("NaN in K, causal", &c);
    case_free(&c);
}

/* Every row sees key 40; then, causal, only rows 40.. do: the rows of the
 * same blocks that the band hides it from stay finite. */
static void test_nan_in_v(void) {
    ieee_case c;
    case_new(&c, 0, 1, 1);
    *tu_elem(c.v, c.p.v_strides, 0, 40, 0, 5) = NAN;
    check_forward("NaN in V", &c);
    c.p.causal = FMHA_CAUSAL_TOP_LEFT;
    check_forward("NaN in V, causal", &c);
    *tu_elem(c.v, c.p.v_strides, 0, 40, 0, 5) = INFINITY;
    check_forward("+inf in V, causal", &c);
    case_free(&c);
}

static void test_infinities_in_k(void) {
    ieee_case c;
    case_new(&c, 0, 1, 1);
    *tu_elem(c.k, c.p.k_strides, 0, 10, 0, 0) = INFINITY;
    *tu_elem(c.k, c.p.k_strides, 0, 77, 0, 4) = -INFINITY;
    check_forward("+inf and -inf in K", &c);
    case_free(&c);
}

/* Keys past a sequence's length are never read, NaN or not. */
static void test_nan_past_kv_lengths(void) {
    ieee_case c;
    case_new(&c, 0, 1, 1);
    int32_t kv_lengths[1] = {120};
    c.p.masks.kv_lengths = kv_lengths;
    for (int64_t j = 120; j < 150; j++)
        for (int64_t d = 0; d < 16; d++) {
            *tu_elem(c.k, c.p.k_strides, 0, j, 0, d) = NAN;
            *tu_elem(c.v, c.p.v_strides, 0, j, 0, d) = NAN;
        }
    tu_check(ref_nan_rows(&c) == 0, "the reference never reads keys past the length");
    check_forward("NaN past kv_lengths", &c);

    /* backward: gradients finite, dK and dV zero past the length */
    fmha_problem *p = &c.p;
    size_t nq = tu_span(p->q_strides, c.nq), nk = tu_span(p->k_strides, c.nk), no = tu_span(p->o_strides, c.no);
    float *d_o = tu_new_input(p, 'o', -1, 1), *o = malloc(no * sizeof(float));
    float *lse = malloc((size_t)(2 * 70) * sizeof(float));
    float *dq = malloc(nq * sizeof(float)), *dk = malloc(nk * sizeof(float)), *dv = malloc(nk * sizeof(float));
    tu_check(tu_forward_backward(p, c.q, c.k, c.v, d_o, o, lse, dq, dk, dv, NULL) == FMHA_OK, "backward runs");
    size_t nan = 0, nonzero = 0;
    for (size_t e = 0; e < nq; e++) nan += isnan(dq[e]);
    for (int64_t j = 0; j < 150; j++)
        for (int64_t d = 0; d < 16; d++) {
            float a = *tu_elem(dk, p->k_strides, 0, j, 0, d), b = *tu_elem(dv, p->v_strides, 0, j, 0, d);
            nan += isnan(a) + isnan(b);
            if (j >= 120) nonzero += (a != 0.0f) + (b != 0.0f);
        }
    tu_check(nan == 0 && nonzero == 0, "backward past kv_lengths: %zu NaN, %zu nonzero dK/dV past the length",
             nan, nonzero);
    free(d_o), free(o), free(lse), free(dq), free(dk), free(dv);
    case_free(&c);
}

/* A NaN in one row of Q: that row's dQ is NaN, the other rows' dQ finite. */
static void test_nan_backward(void) {
    ieee_case c;
    case_new(&c, 1, 1, 1);
    fmha_problem *p = &c.p;
    *tu_elem(c.q, p->q_strides, 0, 50, 0, 1) = NAN;
    size_t nq = tu_span(p->q_strides, c.nq), nk = tu_span(p->k_strides, c.nk), no = tu_span(p->o_strides, c.no);
    float *d_o = tu_new_input(p, 'o', -1, 1), *o = malloc(no * sizeof(float));
    float *lse = malloc((size_t)(2 * 70) * sizeof(float));
    float *dq = malloc(nq * sizeof(float)), *dk = malloc(nk * sizeof(float)), *dv = malloc(nk * sizeof(float));
    tu_check(tu_forward_backward(p, c.q, c.k, c.v, d_o, o, lse, dq, dk, dv, NULL) == FMHA_OK, "backward runs");
    size_t wrong = 0;
    for (int64_t i = 0; i < 70; i++)
        for (int64_t h = 0; h < 2; h++)
            for (int64_t d = 0; d < 16; d++)
                wrong += isnan(*tu_elem(dq, p->q_strides, 0, i, h, d)) != (i == 50 && h == 0);
    tu_check(isnan(lse[50]) && wrong == 0, "NaN in Q row 50: its lse and dQ row NaN, other dQ rows finite (%zu wrong)",
             wrong);
    size_t dv_nan = 0;
    for (int64_t d = 0; d < 16; d++) dv_nan += isnan(*tu_elem(dv, p->v_strides, 0, 0, 0, d));
    tu_check(dv_nan == 16, "NaN in Q row 50 reaches dV of the keys it sees");
    free(d_o), free(o), free(lse), free(dq), free(dk), free(dv);
    case_free(&c);
}

/* Causal: NaN in V at key 40 and in K at key 41 (then -inf in V, +inf in K).
 * Rows 0..39 see neither, so their dQ must equal (1e-5 + 1e-4 |r|) that of the
 * clean inputs, on every ISA: hidden entries stay out of the gradients. */
static void test_nan_hidden_backward(void) {
    ieee_case c;
    case_new(&c, 1, 1, 1);
    fmha_problem *p = &c.p;
    size_t nq = tu_span(p->q_strides, c.nq), nk = tu_span(p->k_strides, c.nk), no = tu_span(p->o_strides, c.no);
    float *d_o = tu_new_input(p, 'o', -1, 1), *o = malloc(no * sizeof(float));
    float *lse = malloc((size_t)(2 * 70) * sizeof(float)), *clean = malloc(nq * sizeof(float));
    float *dq = malloc(nq * sizeof(float)), *dk = malloc(nk * sizeof(float)), *dv = malloc(nk * sizeof(float));
    const float poison[][2] = {{NAN, NAN}, {-INFINITY, INFINITY}};
    char isa[64];
    for (size_t run = 0; tu_isa_run(run / 2, 1, isa, sizeof isa); run++) {
        const size_t pi = run % 2; /* poison */
        float *v40 = tu_elem(c.v, p->v_strides, 0, 40, 0, 5), *k41 = tu_elem(c.k, p->k_strides, 0, 41, 0, 2);
        float v_keep = *v40, k_keep = *k41;
        tu_check(tu_forward_backward(p, c.q, c.k, c.v, d_o, o, lse, clean, dk, dv, NULL) == FMHA_OK, "clean");
        *v40 = poison[pi][0];
        *k41 = poison[pi][1];
        tu_check(tu_forward_backward(p, c.q, c.k, c.v, d_o, o, lse, dq, dk, dv, NULL) == FMHA_OK, "with NaN");
        *v40 = v_keep;
        *k41 = k_keep;
        size_t wrong = 0, nan_seen = 0;
        for (int64_t i = 0; i < 70; i++)
            for (int64_t h = 0; h < 2; h++)
                for (int64_t d = 0; d < 16; d++) {
                    float a = *tu_elem(dq, p->q_strides, 0, i, h, d), r = *tu_elem(clean, p->q_strides, 0, i, h, d);
                    if (i < 40) wrong += !(fabsf(a - r) <= 1e-5f + 1e-4f * fabsf(r));
                    else nan_seen += isnan(a);
                }
        tu_check(wrong == 0 && nan_seen > 0,
                 "%s: %s K/V at keys 40, 41 hidden from rows 0..39: %zu of their dQ differ, %zu NaN after", isa,
                 pi ? "inf" : "NaN", wrong, nan_seen);
    }
    free(d_o), free(o), free(lse), free(clean), free(dq), free(dk), free(dv);
    case_free(&c);
}

/* scale * q.k is representable, scale * q alone is not: q up to 4, k = +-2^-126,
 * scale 2e38, scores up to ~50 (so float32 logits carry ~1e-5 absolute
 * error: tolerance 1e-4 relative). */
static void test_large_scale(void) {
    ieee_case c;
    case_new(&c, 1, 4, 1);
    for (int64_t j = 0; j < 150; j++)
        for (int64_t d = 0; d < 16; d++) {
            float *x = tu_elem(c.k, c.p.k_strides, 0, j, 0, d);
            *x = ldexpf(*x < 0 ? -1.0f : 1.0f, -126);
        }
    c.p.scale = 2e38f;
    check_forward_tol("scale 2e38", &c, 1e-5, 1e-4);
    case_free(&c);
}

/* Outputs aliasing an input of the masks and biases, or each other. */
static void test_aliasing(void) {
    fmha_problem p;
    fmha_problem_init(&p, 1, 1, 1, 8, 8, 4, 4, FMHA_LAYOUT_BSHD);
    float *q = tu_new_input(&p, 'q', -1, 1), *k = tu_new_input(&p, 'k', -1, 1), *v = tu_new_input(&p, 'v', -1, 1);
    float *d_o = tu_new_input(&p, 'o', -1, 1);
    float bias[64 + 8], slopes[1] = {0.5f};
    for (int i = 0; i < 72; i++) bias[i] = 7.0f;
    p.biases.dense = bias;
    p.biases.dense_strides[2] = 8;
    p.biases.dense_strides[3] = 1;
    p.biases.alibi_slopes = slopes;
    float o[32], lse[8], dq[32], dk[32], dv[32];
    float lse_ok[8];
    tu_check(tu_forward(&p, q, k, v, bias, lse_ok, NULL, 0) == FMHA_ERR_OVERLAP, "O over the dense bias");
    tu_check(tu_forward(&p, q, k, v, o, bias + 60, NULL, 0) == FMHA_ERR_OVERLAP, "lse over the dense bias");
    tu_check(tu_forward(&p, q, k, v, slopes, NULL, NULL, 0) == FMHA_ERR_OVERLAP, "O over the ALiBi slopes");
    size_t written = 0;
    for (int i = 0; i < 72; i++) written += bias[i] != 7.0f;
    tu_check(written == 0, "the bias stays unwritten (%zu values changed)", written);
    tu_check(tu_forward(&p, q, k, v, o, lse, NULL, 0) == FMHA_OK, "a valid forward");
    fmha_param_grads g = {0};
    g.d_dense_strides[2] = 8;
    g.d_dense_strides[3] = 1;
    g.d_dense = dq;
    tu_check(tu_backward(&p, q, k, v, o, d_o, lse, dq, dk, dv, &g, NULL, 0) == FMHA_ERR_OVERLAP, "d_dense over dQ");
    g.d_dense = bias;
    tu_check(tu_backward(&p, q, k, v, o, d_o, lse, dq, dk, dv, &g, NULL, 0) == FMHA_ERR_OVERLAP, "d_dense over the bias");
    g.d_dense = q;
    tu_check(tu_backward(&p, q, k, v, o, d_o, lse, dq, dk, dv, &g, NULL, 0) == FMHA_ERR_OVERLAP, "d_dense over Q");
    g.d_dense = NULL;
    g.d_alibi = slopes;
    tu_check(tu_backward(&p, q, k, v, o, d_o, lse, dq, dk, dv, &g, NULL, 0) == FMHA_ERR_OVERLAP, "d_alibi over the slopes");
    g.d_alibi = dk + 3;
    tu_check(tu_backward(&p, q, k, v, o, d_o, lse, dq, dk, dv, &g, NULL, 0) == FMHA_ERR_OVERLAP, "d_alibi over dK");
    int32_t lens[1] = {8};
    p.biases.dense = NULL;
    p.biases.alibi_slopes = NULL;
    p.masks.kv_lengths = lens;
    tu_check(tu_forward(&p, q, k, v, o, (float *)lens, NULL, 0) == FMHA_ERR_OVERLAP, "lse over kv_lengths");
    tu_check(lens[0] == 8 && slopes[0] == 0.5f && q[0] == q[0], "refused calls wrote nothing");
    free(q), free(k), free(v), free(d_o);
}

int main(void) {
    tu_seed();
    test_nan_in_q();
    test_nan_in_k();
    test_nan_in_v();
    test_nan_decode();
    test_infinities_in_k();
    test_nan_past_kv_lengths();
    test_nan_backward();
    test_nan_hidden_backward();
    test_large_scale();
    test_aliasing();
    return tu_finish();
}
