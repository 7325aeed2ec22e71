/* test_lowp.c: bfloat16 and float16 inputs and gradients against the float64
 * reference run on the same (rounded) inputs, upcast exactly, for every
 * strategy and every instruction set this CPU runs (the avx512bf16 table
 * takes the pair-packed vdpbf16ps path, the others widen to float32).
 *
 * Accuracy bars (relative L2 error of O and of each of dQ, dK, dV):
 *   bf16: below 1e-2, and at most 1.5x the error of rounding the exact
 *         result to bf16 (the best any bf16 output can do);
 *   bf16 with FMHA_PRECISION_FAST (P rounded to bf16 in P V): below 1e-2 and
 *         at most 2x that rounding error (the header promises about 1.6x);
 *   bf16 gradients at ACCURATE (float32 products, or on the tiles P and dS
 *         as bf16 plus their residuals): at most 1.1x that rounding error
 *         (measured at most 1.008x; P and dS rounded to bf16 give 1.4-1.6x);
 *   f16:  below 2e-3, and at most 1.25x the error of rounding the exact
 *         result to f16 (the tiles split f16 into bf16 hi + lo, three
 *         terms a product: measured at most 1.09x; one term, 5x and more).
 * Head dims past 256 (D 320; MLA's D 576 / Dv 512) in bf16 and f16.
 * Also: fully masked rows (O = 0, lse = -inf, zero gradients, no NaN),
 * NaN in K and V rows past kv_lengths leaving O's bits as they were,
 * logits near 1e30 in bf16 (float32's range: no overflow), tails, GQA,
 * K in strided and misaligned layouts giving the same bits, a NaN key kept
 * out of the dQ of rows it is hidden from; bf16 forward + backward the
 * same bits at 1, 3 and 7 threads; float16 and float32 at BF16X3
 * gradients under lengths, a window and causal masking. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/convert.h"
#include "config/cpu.h"
#include "fmha_ref.h"
#include "fmha_ref_masks.h"
#include "test_util.h"

#define BF16_MAX_REL 1e-2
#define BF16_MAX_VS_ROUNDING 1.5
#define BF16_FAST_MAX_VS_ROUNDING 2.0
#define BF16_GRAD_ACCURATE_MAX_VS_ROUNDING 1.1
#define F16_MAX_REL 2e-3
#define F16_MAX_VS_ROUNDING 1.25

static const char *strategy_names[] = {"auto", "tiled", "dense", "portable"};

static uint16_t to_low(fmha_dtype t, float x) {
    return t == FMHA_DTYPE_BF16 ? fmha_f32_to_bf16(x) : fmha_f32_to_f16(x);
}

static float from_low(fmha_dtype t, uint16_t h) {
    return t == FMHA_DTYPE_BF16 ? fmha_bf16_to_f32(h) : fmha_f16_to_f32(h);
}

/* One contiguous BSHD tensor in both forms: low-precision bits and their exact float values. */
typedef struct low_tensor {
    size_t n;
    uint16_t *bits;
    float *value;
} low_tensor;

static low_tensor low_new(fmha_dtype t, size_t n, double lo, double hi) {
    low_tensor x = {n, malloc(n * sizeof(uint16_t)), malloc(n * sizeof(float))};
    for (size_t i = 0; i < n; i++) {
        x.bits[i] = to_low(t, (float)tu_uniform(lo, hi));
        x.value[i] = from_low(t, x.bits[i]);
    }
    return x;
}

static void low_free(low_tensor *x) {
    free(x->bits);
    free(x->value);
}

/* Relative L2 error of low-precision output bits against r, and the error of
 * r itself rounded to the dtype (the floor any output of that dtype has). */
static void low_errors(fmha_dtype t, const uint16_t *bits, const double *r, size_t n, double *err,
                       double *rounding) {
    double num = 0.0, rnum = 0.0, den = 0.0;
    for (size_t i = 0; i < n; i++) {
        double x = from_low(t, bits[i]), y = from_low(t, to_low(t, (float)r[i]));
        num += (x - r[i]) * (x - r[i]);
        rnum += (y - r[i]) * (y - r[i]);
        den += r[i] * r[i];
    }
    *err = den > 0 ? sqrt(num / den) : sqrt(num);
    *rounding = den > 0 ? sqrt(rnum / den) : sqrt(rnum);
}

static int all_finite(fmha_dtype t, const uint16_t *bits, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!isfinite(from_low(t, bits[i]))) return 0;
    return 1;
}

/* Forward + backward of one problem (BSHD) at dtype t; qk_scale scales the
 * Q and K values to push logits toward the float32 range. */
static void check_problem(fmha_dtype t, int64_t B, int64_t Hq, int64_t Hkv, int64_t Sq, int64_t Skv,
                          int64_t D, int64_t Dv, fmha_causal causal, double qk_mag, const char *isa,
                          int strategy, fmha_precision precision) {
    fmha_problem p;
    fmha_problem_init(&p, B, Hq, Hkv, Sq, Skv, D, Dv, FMHA_LAYOUT_BSHD);
    p.dtype = t;
    p.causal = causal;
    p.strategy = (fmha_strategy)strategy;
    p.precision = precision;
    double vs_rounding = precision == FMHA_PRECISION_FAST ? BF16_FAST_MAX_VS_ROUNDING : BF16_MAX_VS_ROUNDING;
    size_t nq = (size_t)(B * Sq * Hq * D), nk = (size_t)(B * Skv * Hkv * D);
    size_t nv = (size_t)(B * Skv * Hkv * Dv), no = (size_t)(B * Sq * Hq * Dv);
    low_tensor q = low_new(t, nq, -qk_mag, qk_mag), k = low_new(t, nk, -qk_mag, qk_mag);
    low_tensor v = low_new(t, nv, -1, 1), d_o = low_new(t, no, -1, 1);
    uint16_t *o = malloc(no * 2), *dq = malloc(nq * 2), *dk = malloc(nk * 2), *dv = malloc(nv * 2);
    float *lse = malloc((size_t)(B * Hq * Sq) * sizeof(float));
    double *ro = malloc(no * 8), *rlse = malloc((size_t)(B * Hq * Sq) * 8);
    double *rq = malloc(nq * 8), *rk = malloc(nk * 8), *rv = malloc(nv * 8);

    fmha_status st = tu_forward_backward(&p, q.bits, k.bits, v.bits, d_o.bits, o, lse, dq, dk, dv, NULL);
    fmha_ref_forward(&p, q.value, k.value, v.value, ro, rlse);
    fmha_ref_backward(&p, q.value, k.value, v.value, d_o.value, rq, rk, rv);

    const char *tn = t == FMHA_DTYPE_BF16 ? "bf16" : "f16";
    char what[200];
    snprintf(what, sizeof what, "%s%s %s/%s B%lld H%lld/%lld Sq%lld Skv%lld D%lld/%lld causal%d mag%g", tn,
             precision == FMHA_PRECISION_FAST ? " fast" : "", isa, strategy_names[strategy], (long long)B, (long long)Hq, (long long)Hkv, (long long)Sq,
             (long long)Skv, (long long)D, (long long)Dv, (int)causal, qk_mag);
    /* bf16 at FAST and at ACCURATE (P and dS with their residuals) and f16
     * (split into bf16 hi + lo) take the tiles' backward on a table with
     * one (the portable strategy excepted), so the bars below hold it */
    const fmha_ukernels *uk = fmha_cpu_kernels();
    if (uk->matrix.backward && strategy != FMHA_STRATEGY_PORTABLE) {
        char line[1024];
        tu_plan_line(&p, line, sizeof line);
        const int tiles = t == FMHA_DTYPE_BF16 ? precision == FMHA_PRECISION_FAST || uk->tuning->matrix_backward_accurate
                                               : uk->tuning->matrix_backward_split;
        tu_check(strstr(line, tiles ? " backward=matrix " : " backward=tiled ") != NULL, "%s: describe %s", what, line);
    }
    if (tu_check(st == FMHA_OK, "%s: status %d (%s)", what, st, fmha_status_string(st))) {
        const uint16_t *out[4] = {o, dq, dk, dv};
        const double *ref[4] = {ro, rq, rk, rv};
        size_t n[4] = {no, nq, nk, nv};
        const char *name[4] = {"O", "dQ", "dK", "dV"};
        for (int i = 0; i < 4; i++) {
            double err, rounding;
            low_errors(t, out[i], ref[i], n[i], &err, &rounding);
            tu_check(all_finite(t, out[i], n[i]), "%s: %s has inf or NaN", what, name[i]);
            if (t == FMHA_DTYPE_BF16) {
                tu_check(err < BF16_MAX_REL, "%s: %s relative error %.3g >= %g", what, name[i], err, BF16_MAX_REL);
                const double bar = i > 0 && precision == FMHA_PRECISION_ACCURATE ? BF16_GRAD_ACCURATE_MAX_VS_ROUNDING
                                                                                   : vs_rounding;
                tu_check(err <= bar * rounding + 1e-12, "%s: %s relative error %.3g > %.2f x rounding error %.3g", what,
                         name[i], err, bar, rounding);
            } else {
                tu_check(err < F16_MAX_REL, "%s: %s relative error %.3g >= %g", what, name[i], err, F16_MAX_REL);
                tu_check(err <= F16_MAX_VS_ROUNDING * rounding + 1e-12,
                         "%s: %s relative error %.3g > %.2f x rounding error %.3g", what, name[i], err,
                         F16_MAX_VS_ROUNDING, rounding);
            }
        }
        /* lse: float32 output, within float32-of-the-logits of the reference */
        double lse_worst = 0.0;
        int lse_ok = 1;
        for (size_t i = 0; i < (size_t)(B * Hq * Sq); i++) {
            if (isinf(rlse[i])) {
                lse_ok &= isinf(lse[i]) && lse[i] < 0;
                continue;
            }
            double e = fabs(lse[i] - rlse[i]) / (1.0 + fabs(rlse[i]));
            if (e > lse_worst) lse_worst = e;
        }
        tu_check(lse_ok && lse_worst < 1e-4, "%s: lse error %.3g (fully masked rows ok: %d)", what, lse_worst, lse_ok);
        /* fully masked rows (bottom-right with Sq > Skv): exactly zero O and dQ */
        if (causal == FMHA_CAUSAL_BOTTOM_RIGHT && Sq > Skv) {
            int zero = 1;
            for (int64_t b = 0; b < B; b++)
                for (int64_t i = 0; i < Sq - Skv; i++)
                    for (int64_t h = 0; h < Hq; h++) {
                        for (int64_t e = 0; e < Dv; e++) zero &= o[((b * Sq + i) * Hq + h) * Dv + e] == 0;
                        for (int64_t e = 0; e < D; e++) zero &= (dq[((b * Sq + i) * Hq + h) * D + e] & 0x7fff) == 0;
                    }
            tu_check(zero, "%s: fully masked rows are not exactly zero", what);
        }
    }
    low_free(&q); low_free(&k); low_free(&v); low_free(&d_o);
    free(o); free(dq); free(dk); free(dv); free(lse);
    free(ro); free(rlse); free(rq); free(rk); free(rv);
}

/* float32 inputs at FMHA_PRECISION_BF16X3 and _BF16: on a table with a
 * matrix part (AMX tiles) the forward splits (hi + lo bf16, three
 * products) or rounds its operands; elsewhere BF16 rounds them on the
 * bf16 pairs (vdpbf16ps) where the table has them and float32 runs its FMA
 * path otherwise. O within the precision's bound against float64 (BF16X3: relative L2
 * 2e-5, element 1e-4 + 1e-4 |ref|; BF16: relative L2 1e-2), lse within
 * the largest score's bound (BF16X3: 2^-16 of its products' magnitude, as
 * fmha.h states, twice, plus 1e-6 of 1 + |ref|) or 1e-2 of 1 + |ref|
 * (BF16: Q and K rounded to bf16 move each score by up to 2^-8 of its
 * terms' magnitude), fully masked rows zero
 * with lse -inf, the same bits at 1 and 3 threads, and
 * fmha_plan_describe naming the precision the driver runs (off the
 * matrix driver: BF16 on the bf16 pairs where the table has them, else
 * float32, as for BF16X3). */
static void check_f32_precision(fmha_precision prec, int64_t B, int64_t Hq, int64_t Hkv, int64_t Sq, int64_t Skv,
                                int64_t D, int64_t Dv, fmha_causal causal, const char *isa) {
    fmha_problem p;
    fmha_problem_init(&p, B, Hq, Hkv, Sq, Skv, D, Dv, FMHA_LAYOUT_BSHD);
    p.causal = causal;
    p.precision = prec;
    float *q = tu_new_input(&p, 'q', -2, 2), *k = tu_new_input(&p, 'k', -2, 2), *v = tu_new_input(&p, 'v', -1, 1);
    const size_t no = (size_t)(B * Sq * Hq * Dv), nl = (size_t)(B * Hq * Sq);
    float *o = malloc(no * 4), *o3 = malloc(no * 4), *lse = malloc(nl * 4), *lse3 = malloc(nl * 4);
    double *ro = malloc(no * 8), *rlse = malloc(nl * 8);
    fmha_ref_forward(&p, q, k, v, ro, rlse);
    const int x3 = prec == FMHA_PRECISION_BF16X3;
    char what[160];
    snprintf(what, sizeof what, "float32 %s %s B%lld H%lld/%lld Sq%lld Skv%lld D%lld/%lld causal%d", x3 ? "bf16x3" : "bf16",
             isa, (long long)B, (long long)Hq, (long long)Hkv, (long long)Sq, (long long)Skv, (long long)D,
             (long long)Dv, (int)causal);
    fmha_set_num_threads(1);
    fmha_status st = tu_forward(&p, q, k, v, o, lse, NULL, 0);
    fmha_set_num_threads(3);
    fmha_status st3 = tu_forward(&p, q, k, v, o3, lse3, NULL, 0);
    fmha_set_num_threads(0);
    if (tu_check(st == FMHA_OK && st3 == FMHA_OK, "%s: status %d, %d", what, (int)st, (int)st3)) {
        const double rel = tu_rel_l2(o, ro, no), worst = tu_worst_ratio(o, ro, no, 1e-4, 1e-4);
        tu_check(x3 ? rel <= 2e-5 && worst <= 1.0 : rel <= 1e-2, "%s: O relative L2 %.3g, worst element %.3g of 1e-4",
                 what, rel, worst);
        /* BF16X3: each score within 2^-16 of its products' magnitude
         * (fmha.h), so lse = log sum exp within the largest score's bound:
         * 2 x 2^-16 |scale| max_j sum_d |q_d k_jd| (the split's residuals
         * and float32 sums within the factor 2), plus 1e-6 of 1 + |lse| */
        const double lse_tol = x3 ? 1e-6 : 1e-2;
        const float scale = p.scale != 0.0f ? fabsf(p.scale) : 1.0f / sqrtf((float)D);
        size_t bad_lse = 0;
        for (int64_t b = 0; b < B; b++)
            for (int64_t h = 0; h < Hq; h++)
                for (int64_t i = 0; i < Sq; i++) {
                    const size_t at = (size_t)((b * Hq + h) * Sq + i);
                    double bound = lse_tol * (1 + fabs(rlse[at]));
                    if (x3) {
                        double widest = 0.0;
                        const float *qr = q + ((b * Sq + i) * Hq + h) * D;
                        for (int64_t j = 0; j < Skv; j++) {
                            const float *kr = k + ((b * Skv + j) * Hkv + h / (Hq / Hkv)) * D;
                            double m = 0.0;
                            for (int64_t d = 0; d < D; d++) m += fabs((double)qr[d] * kr[d]);
                            widest = m > widest ? m : widest;
                        }
                        bound += 2.0 * 0x1p-16 * scale * widest;
                    }
                    bad_lse += isinf(rlse[at]) ? !(isinf(lse[at]) && lse[at] < 0) : !(fabs(lse[at] - rlse[at]) <= bound);
                }
        tu_check(bad_lse == 0, "%s: %zu lse off by more than %s", what, bad_lse,
                 x3 ? "2^-15 |scale| max_j sum |q k_j| + 1e-6 (1 + |lse|)" : "1e-2 (1 + |lse|)");
        tu_check(!memcmp(o, o3, no * 4) && !memcmp(lse, lse3, nl * 4), "%s: 3 threads differ from 1", what);
        char line[1024];
        tu_plan_line(&p, line, sizeof line);
        const int matrix = strstr(line, "driver=matrix ") != NULL;
        const int tiled_on_matrix_table = fmha_cpu_kernels()->matrix.forward && strstr(line, "driver=tiled ");
        /* BF16 off the matrix driver: the bf16 pairs where the table has them */
        const int pairs = !x3 && fmha_cpu_kernels()->bf16.gemm;
        tu_check(matrix ? strstr(line, x3 ? " precision=bf16x3 " : " precision=bf16 ") != NULL
                 : pairs ? strstr(line, " path=bf16 precision=bf16 ") != NULL && !tiled_on_matrix_table
                         : strstr(line, " precision=float32 ") != NULL && !tiled_on_matrix_table,
                 "%s: describe %s", what, line);
    }
    free(q), free(k), free(v), free(o), free(o3), free(lse), free(lse3), free(ro), free(rlse);
}

/* float32 gradients at FMHA_PRECISION_BF16X3 and _BF16: on a table with a
 * matrix backward (AMX tiles) every operand is split into bf16 hi + lo
 * (three terms a product; P and dS too) or rounded to bf16; elsewhere
 * float32 runs its FMA path. Each of dQ, dK, dV within its bound against
 * float64 (relative L2: BF16X3 2e-4, measured at most 6.3e-5 on amx_emu
 * where BF16's rounding gives 3-5e-3 and the FMA path 3-6e-7; BF16 1e-2),
 * the same bits at 1 and 3 threads, and the tiles' backward named by
 * fmha_plan_describe where the table has one (the FMA path's under
 * FMHA_TUNING=matrix_backward_split=0). */
#define BF16X3_GRAD_REL 2e-4
static void check_f32_precision_grads(fmha_precision prec, int64_t B, int64_t Hq, int64_t Hkv, int64_t Sq,
                                      int64_t Skv, int64_t D, int64_t Dv, fmha_causal causal, const char *isa) {
    fmha_problem p;
    fmha_problem_init(&p, B, Hq, Hkv, Sq, Skv, D, Dv, FMHA_LAYOUT_BSHD);
    p.causal = causal;
    p.precision = prec;
    float *q = tu_new_input(&p, 'q', -2, 2), *k = tu_new_input(&p, 'k', -2, 2), *v = tu_new_input(&p, 'v', -1, 1);
    float *d_o = tu_new_input(&p, 'o', -1, 1);
    const size_t nq = (size_t)(B * Sq * Hq * D), nk = (size_t)(B * Skv * Hkv * D), nv = (size_t)(B * Skv * Hkv * Dv);
    const size_t no = (size_t)(B * Sq * Hq * Dv), nl = (size_t)(B * Hq * Sq);
    const size_t n[3] = {nq, nk, nv};
    float *o = malloc(no * 4), *lse = malloc(nl * 4), *g[2][3];
    for (int t = 0; t < 2; t++)
        for (int i = 0; i < 3; i++) g[t][i] = malloc(n[i] * 4);
    double *r[3] = {malloc(nq * 8), malloc(nk * 8), malloc(nv * 8)};
    fmha_ref_backward(&p, q, k, v, d_o, r[0], r[1], r[2]);
    const int x3 = prec == FMHA_PRECISION_BF16X3;
    char what[160];
    snprintf(what, sizeof what, "float32 %s gradients %s B%lld H%lld/%lld Sq%lld Skv%lld D%lld/%lld causal%d",
             x3 ? "bf16x3" : "bf16", isa, (long long)B, (long long)Hq, (long long)Hkv, (long long)Sq, (long long)Skv,
             (long long)D, (long long)Dv, (int)causal);
    fmha_status st[2];
    const int threads[2] = {1, 3};
    for (int t = 0; t < 2; t++) {
        fmha_set_num_threads(threads[t]);
        st[t] = tu_forward_backward(&p, q, k, v, d_o, o, lse, g[t][0], g[t][1], g[t][2], NULL);
    }
    fmha_set_num_threads(0);
    if (tu_check(st[0] == FMHA_OK && st[1] == FMHA_OK, "%s: status %d, %d", what, (int)st[0], (int)st[1])) {
        const char *name[3] = {"dQ", "dK", "dV"};
        for (int i = 0; i < 3; i++) {
            const double rel = tu_rel_l2(g[0][i], r[i], n[i]);
            tu_check(rel <= (x3 ? BF16X3_GRAD_REL : 1e-2), "%s: %s relative L2 %.3g", what, name[i], rel);
            tu_check(!memcmp(g[0][i], g[1][i], n[i] * 4), "%s: %s at 3 threads differs from 1", what, name[i]);
        }
        const fmha_ukernels *uk = fmha_cpu_kernels();
        if (uk->matrix.backward) {
            char line[1024];
            tu_plan_line(&p, line, sizeof line);
            tu_check(strstr(line, uk->tuning->matrix_backward_split ? " backward=matrix " : " backward=tiled ") != NULL,
                     "%s: describe %s", what, line);
        }
    }
    for (int t = 0; t < 2; t++)
        for (int i = 0; i < 3; i++) free(g[t][i]);
    for (int i = 0; i < 3; i++) free(r[i]);
    free(q), free(k), free(v), free(d_o), free(o), free(lse);
}

/* 1 when batch element 1's rows [from, sq) of a [2, sq, row] BSHD tensor
 * of elem-byte elements are all +0 (every byte zero). */
static int rows_past_zero(const void *x, size_t elem, int64_t sq, int64_t from, int64_t row) {
    const unsigned char *at = (const unsigned char *)x + (size_t)((sq + from) * row) * elem;
    int zero = 1;
    for (size_t i = 0; i < (size_t)((sq - from) * row) * elem; i++) zero &= at[i] == 0;
    return zero;
}

/* The masks the tiles' backward takes (lengths, a sliding window, causal)
 * on split operands: float16 gradients within F16_MAX_VS_ROUNDING of the
 * rounding error, float32 at BF16X3 within BF16X3_GRAD_REL, rows past
 * q_lengths exactly zero. */
static void check_split_masks(const char *isa) {
    const int64_t B = 2, Hq = 4, Hkv = 2, Sq = 130, Skv = 260, D = 64;
    static const int32_t q_len[2] = {130, 47}, kv_len[2] = {260, 101};
    for (int dt = 0; dt < 2; dt++) {
        fmha_problem p;
        fmha_problem_init(&p, B, Hq, Hkv, Sq, Skv, D, D, FMHA_LAYOUT_BSHD);
        p.causal = FMHA_CAUSAL_BOTTOM_RIGHT;
        p.masks.window_left = 70;
        p.masks.q_lengths = q_len;
        p.masks.kv_lengths = kv_len;
        const size_t nq = (size_t)(B * Sq * Hq * D), nk = (size_t)(B * Skv * Hkv * D), n[3] = {nq, nk, nk};
        double *r[3] = {malloc(nq * 8), malloc(nk * 8), malloc(nk * 8)};
        const char *name[3] = {"dQ", "dK", "dV"};
        char what[96];
        fmha_status st;
        if (dt == 0) { /* float16 */
            p.dtype = FMHA_DTYPE_F16;
            low_tensor q = low_new(FMHA_DTYPE_F16, nq, -1, 1), k = low_new(FMHA_DTYPE_F16, nk, -1, 1);
            low_tensor v = low_new(FMHA_DTYPE_F16, nk, -1, 1), d_o = low_new(FMHA_DTYPE_F16, nq, -1, 1);
            uint16_t *o = malloc(nq * 2), *g[3] = {malloc(nq * 2), malloc(nk * 2), malloc(nk * 2)};
            float *lse = malloc((size_t)(B * Hq * Sq) * sizeof(float));
            st = tu_forward_backward(&p, q.bits, k.bits, v.bits, d_o.bits, o, lse, g[0], g[1], g[2], NULL);
            fmha_ref_backward_full(&p, q.value, k.value, v.value, d_o.value, r[0], r[1], r[2], NULL, NULL, NULL);
            snprintf(what, sizeof what, "f16 %s lengths, window and causal", isa);
            if (tu_check(st == FMHA_OK, "%s: status %d", what, (int)st)) {
                for (int i = 0; i < 3; i++) {
                    double err, rounding;
                    low_errors(FMHA_DTYPE_F16, g[i], r[i], n[i], &err, &rounding);
                    tu_check(err <= F16_MAX_VS_ROUNDING * rounding + 1e-12,
                             "%s: %s relative error %.3g > %.2f x rounding error %.3g", what, name[i], err,
                             F16_MAX_VS_ROUNDING, rounding);
                }
                tu_check(rows_past_zero(g[0], 2, Sq, q_len[1], Hq * D), "%s: dQ of rows past q_lengths not zero", what);
            }
            low_free(&q); low_free(&k); low_free(&v); low_free(&d_o);
            free(o), free(lse);
            for (int i = 0; i < 3; i++) free(g[i]);
        } else { /* float32 at BF16X3 */
            p.precision = FMHA_PRECISION_BF16X3;
            float *q = tu_new_input(&p, 'q', -2, 2), *k = tu_new_input(&p, 'k', -2, 2);
            float *v = tu_new_input(&p, 'v', -1, 1), *d_o = tu_new_input(&p, 'o', -1, 1);
            float *o = malloc(nq * 4), *g[3] = {malloc(nq * 4), malloc(nk * 4), malloc(nk * 4)};
            float *lse = malloc((size_t)(B * Hq * Sq) * sizeof(float));
            st = tu_forward_backward(&p, q, k, v, d_o, o, lse, g[0], g[1], g[2], NULL);
            fmha_ref_backward_full(&p, q, k, v, d_o, r[0], r[1], r[2], NULL, NULL, NULL);
            snprintf(what, sizeof what, "float32 bf16x3 %s lengths, window and causal", isa);
            if (tu_check(st == FMHA_OK, "%s: status %d", what, (int)st)) {
                for (int i = 0; i < 3; i++) {
                    const double rel = tu_rel_l2(g[i], r[i], n[i]);
                    tu_check(rel <= BF16X3_GRAD_REL, "%s: %s relative L2 %.3g", what, name[i], rel);
                }
                tu_check(rows_past_zero(g[0], 4, Sq, q_len[1], Hq * D), "%s: dQ of rows past q_lengths not zero", what);
            }
            free(q), free(k), free(v), free(d_o), free(o), free(lse);
            for (int i = 0; i < 3; i++) free(g[i]);
        }
        for (int i = 0; i < 3; i++) free(r[i]);
    }
}

/* bf16 forward + backward at FAST and ACCURATE: the same bits of O, lse,
 * dQ, dK and dV at 1, 3 and 7 threads (the tiles' backward sums dQ over
 * fixed key groups in order, as the tiled one does). GQA, two key blocks,
 * several query blocks a kv head. */
static void check_bf16_threads(const char *isa, fmha_precision precision) {
    fmha_problem p;
    fmha_problem_init(&p, 1, 4, 2, 100, 300, 64, 64, FMHA_LAYOUT_BSHD);
    p.dtype = FMHA_DTYPE_BF16;
    p.precision = precision;
    p.causal = FMHA_CAUSAL_BOTTOM_RIGHT;
    const size_t nq = (size_t)(100 * 4 * 64), nk = (size_t)(300 * 2 * 64), nl = 4 * 100;
    low_tensor q = low_new(FMHA_DTYPE_BF16, nq, -1, 1), k = low_new(FMHA_DTYPE_BF16, nk, -1, 1);
    low_tensor v = low_new(FMHA_DTYPE_BF16, nk, -1, 1), d_o = low_new(FMHA_DTYPE_BF16, nq, -1, 1);
    const int threads[3] = {1, 3, 7};
    uint16_t *out[3][4];
    float *lse[3];
    int same = 1, ok = 1;
    for (int t = 0; t < 3; t++) {
        out[t][0] = malloc(nq * 2), out[t][1] = malloc(nq * 2), out[t][2] = malloc(nk * 2), out[t][3] = malloc(nk * 2);
        lse[t] = malloc(nl * sizeof(float));
        fmha_set_num_threads(threads[t]);
        ok &= tu_forward_backward(&p, q.bits, k.bits, v.bits, d_o.bits, out[t][0], lse[t], out[t][1], out[t][2],
                                  out[t][3], NULL) == FMHA_OK;
        if (t > 0) {
            same &= !memcmp(out[t][0], out[0][0], nq * 2) && !memcmp(out[t][1], out[0][1], nq * 2);
            same &= !memcmp(out[t][2], out[0][2], nk * 2) && !memcmp(out[t][3], out[0][3], nk * 2);
            same &= !memcmp(lse[t], lse[0], nl * sizeof(float));
        }
    }
    fmha_set_num_threads(0);
    tu_check(ok && same, "bf16%s %s: O, lse and gradients the same bits at 1, 3 and 7 threads (status ok %d)",
             precision == FMHA_PRECISION_FAST ? " fast" : "", isa, ok);
    for (int t = 0; t < 3; t++) {
        for (int i = 0; i < 4; i++) free(out[t][i]);
        free(lse[t]);
    }
    low_free(&q); low_free(&k); low_free(&v); low_free(&d_o);
}

/* bf16 scores near 1e30 must neither overflow nor give NaN (float32 range). */
static void check_large_logits(const char *isa) {
    fmha_problem p;
    int64_t S = 37, D = 8;
    fmha_problem_init(&p, 1, 2, 1, S, S, D, D, FMHA_LAYOUT_BSHD);
    p.dtype = FMHA_DTYPE_BF16;
    p.scale = 1.0f;
    size_t nq = (size_t)(S * 2 * D), nk = (size_t)(S * D);
    uint16_t *q = malloc(nq * 2), *k = malloc(nk * 2), *v = malloc(nk * 2), *o = malloc(nq * 2);
    float *qf = malloc(nq * 4), *kf = malloc(nk * 4), *vf = malloc(nk * 4);
    /* one component carries the magnitude: q.k = +-1e15 * +-1e15 = +-1e30 */
    for (size_t i = 0; i < nq; i++) q[i] = fmha_f32_to_bf16(i % (size_t)D == 0 ? (float)tu_uniform(-1e15, 1e15) : 0.0f);
    for (size_t i = 0; i < nk; i++) {
        k[i] = fmha_f32_to_bf16(i % (size_t)D == 0 ? (float)tu_uniform(-1e15, 1e15) : 0.0f);
        v[i] = fmha_f32_to_bf16((float)tu_uniform(-1, 1));
    }
    for (size_t i = 0; i < nq; i++) qf[i] = fmha_bf16_to_f32(q[i]);
    for (size_t i = 0; i < nk; i++) {
        kf[i] = fmha_bf16_to_f32(k[i]);
        vf[i] = fmha_bf16_to_f32(v[i]);
    }
    double *ro = malloc(nq * 8);
    fmha_status st = tu_forward(&p, q, k, v, o, NULL, NULL, 0);
    fmha_ref_forward(&p, qf, kf, vf, ro, NULL);
    double err, rounding;
    if (tu_check(st == FMHA_OK, "bf16 logits 1e30 %s: status %d", isa, st)) {
        low_errors(FMHA_DTYPE_BF16, o, ro, nq, &err, &rounding);
        tu_check(all_finite(FMHA_DTYPE_BF16, o, nq) && err < BF16_MAX_REL,
                 "bf16 logits 1e30 %s: relative error %.3g or non-finite output", isa, err);
    }
    free(q); free(k); free(v); free(o); free(qf); free(kf); free(vf); free(ro);
}

/* Keys past a batch element's kv length are never seen: a bf16 or f16
 * forward with NaN in those K and V rows gives the bits it gives with finite
 * ones (an odd length and an even one, so that a pair of V^T holds one key
 * inside and one past the length). */
static void check_lengths_hide_nan(fmha_dtype t, const char *isa, int strategy) {
    fmha_problem p;
    const int64_t B = 2, H = 2, Sq = 40, Skv = 75, D = 32;
    fmha_problem_init(&p, B, H, H, Sq, Skv, D, D, FMHA_LAYOUT_BSHD);
    p.dtype = t;
    p.strategy = (fmha_strategy)strategy;
    const int32_t kv_len[2] = {37, 50};
    p.masks.kv_lengths = kv_len;
    size_t nq = (size_t)(B * Sq * H * D), nk = (size_t)(B * Skv * H * D);
    low_tensor q = low_new(t, nq, -1, 1), k = low_new(t, nk, -1, 1), v = low_new(t, nk, -1, 1);
    uint16_t *k_nan = malloc(nk * 2), *v_nan = malloc(nk * 2), *o = malloc(nq * 2), *o_nan = malloc(nq * 2);
    memcpy(k_nan, k.bits, nk * 2);
    memcpy(v_nan, v.bits, nk * 2);
    const uint16_t nan = t == FMHA_DTYPE_BF16 ? 0x7fc1 : 0x7e01;
    for (int64_t b = 0; b < B; b++)
        for (int64_t j = kv_len[b]; j < Skv; j++)
            for (int64_t e = 0; e < H * D; e++) k_nan[(b * Skv + j) * H * D + e] = v_nan[(b * Skv + j) * H * D + e] = nan;
    fmha_status s1 = fmha_forward(&p, q.bits, k.bits, v.bits, o, NULL, NULL, 0);
    fmha_status s2 = fmha_forward(&p, q.bits, k_nan, v_nan, o_nan, NULL, NULL, 0);
    tu_check(s1 == FMHA_OK && s2 == FMHA_OK && all_finite(t, o_nan, nq) && !memcmp(o, o_nan, nq * 2),
             "%s %s/%s: NaN in K, V rows past kv_lengths changed O", t == FMHA_DTYPE_BF16 ? "bf16" : "f16", isa,
             strategy_names[strategy]);
    low_free(&q); low_free(&k); low_free(&v);
    free(k_nan); free(v_nan); free(o); free(o_nan);
}

/* A NaN in K at key 100 of a causal (top-left) problem: the rows it is
 * hidden from (i < 100) keep finite dQ within the bf16 bars of the
 * reference run on K with that key zeroed (their dQ does not depend on it),
 * the rows that see it get NaN. The key block holding it runs the guarded
 * dQ (float32 K rows). */
static void check_guarded_dq(fmha_dtype t, const char *isa, int strategy, fmha_precision precision) {
    const int64_t S = 150, D = 32, nan_key = 100;
    fmha_problem p;
    fmha_problem_init(&p, 1, 2, 1, S, S, D, D, FMHA_LAYOUT_BSHD);
    p.dtype = t;
    p.strategy = (fmha_strategy)strategy;
    p.precision = precision;
    p.causal = FMHA_CAUSAL_TOP_LEFT;
    size_t nq = (size_t)(S * 2 * D), nk = (size_t)(S * D);
    low_tensor q = low_new(t, nq, -1, 1), k = low_new(t, nk, -1, 1), v = low_new(t, nk, -1, 1);
    low_tensor d_o = low_new(t, nq, -1, 1);
    for (int64_t e = 0; e < D; e++) {
        k.bits[nan_key * D + e] = t == FMHA_DTYPE_BF16 ? 0x7fc1 : 0x7e01;
        k.value[nan_key * D + e] = 0.0f;
    }
    uint16_t *o = malloc(nq * 2), *dq = malloc(nq * 2), *dk = malloc(nk * 2), *dv = malloc(nk * 2);
    float *lse = malloc((size_t)(2 * S) * sizeof(float));
    double *rq = malloc(nq * 8), *rk = malloc(nk * 8), *rv = malloc(nk * 8);
    fmha_status st = tu_forward_backward(&p, q.bits, k.bits, v.bits, d_o.bits, o, lse, dq, dk, dv, NULL);
    fmha_ref_backward(&p, q.value, k.value, v.value, d_o.value, rq, rk, rv);
    size_t hidden = (size_t)(nan_key * 2 * D); /* dQ rows 0..99 of both heads, [S][H][D] */
    double err, rounding;
    low_errors(t, dq, rq, hidden, &err, &rounding);
    int nan_seen = 1;
    for (size_t i = hidden; i < nq; i++) nan_seen &= isnan(from_low(t, dq[i]));
    double bar = t == FMHA_DTYPE_BF16 ? BF16_MAX_REL : F16_MAX_REL;
    tu_check(st == FMHA_OK && all_finite(t, dq, hidden) && err < bar && nan_seen,
             "%s%s %s/%s: NaN key hidden from rows < %lld: their dQ error %.3g (bar %g), finite %d, rows that "
             "see it NaN %d (status %d)", t == FMHA_DTYPE_BF16 ? "bf16" : "f16",
             precision == FMHA_PRECISION_FAST ? " fast" : "", isa, strategy_names[strategy], (long long)nan_key,
             err, bar, all_finite(t, dq, hidden), nan_seen, st);
    low_free(&q); low_free(&k); low_free(&v); low_free(&d_o);
    free(o); free(dq); free(dk); free(dv); free(lse); free(rq); free(rk); free(rv);
}

/* K read where it is (unit stride, even strides, 4-byte aligned) or packed
 * first (any other layout) carries the same bits: O is bitwise the same for
 * K contiguous, with padded rows of even and odd stride, and one element off
 * its alignment (B 2, GQA 2/1, causal, D 64). */
static void check_k_layouts(fmha_dtype t, const char *isa, int strategy) {
    const int64_t B = 2, H = 2, Sq = 70, Skv = 150, D = 64;
    fmha_problem p;
    fmha_problem_init(&p, B, H, 1, Sq, Skv, D, D, FMHA_LAYOUT_BSHD);
    p.dtype = t;
    p.strategy = (fmha_strategy)strategy;
    p.causal = FMHA_CAUSAL_BOTTOM_RIGHT;
    size_t nq = (size_t)(B * Sq * H * D), nk = (size_t)(B * Skv * D);
    low_tensor q = low_new(t, nq, -1, 1), k = low_new(t, nk, -1, 1), v = low_new(t, nk, -1, 1);
    uint16_t *o_ref = malloc(nq * 2), *o = malloc(nq * 2);
    fmha_status st = fmha_forward(&p, q.bits, k.bits, v.bits, o_ref, NULL, NULL, 0);
    tu_check(st == FMHA_OK, "%s: K layouts: status %d", isa, st);
    const int64_t row_strides[3] = {D, D + 2, D + 1};
    for (int c = 0; c < 4 && st == FMHA_OK; c++) {
        int64_t rs = row_strides[c < 3 ? c : 0], off = c == 3; /* case 3: one element off */
        uint16_t *buf = malloc((size_t)(B * Skv * rs + 1) * 2);
        for (int64_t b = 0; b < B; b++)
            for (int64_t j = 0; j < Skv; j++)
                for (int64_t e = 0; e < rs; e++)
                    buf[off + (b * Skv + j) * rs + e] = e < D ? k.bits[(b * Skv + j) * D + e] : 0x7fc1;
        fmha_problem pk = p;
        /* one kv head: its stride is never used, 0 keeps it even so that
         * only the row stride decides whether K is read in place */
        pk.k_strides[0] = Skv * rs, pk.k_strides[1] = rs, pk.k_strides[2] = 0, pk.k_strides[3] = 1;
        memset(o, 0, nq * 2);
        fmha_status s2 = fmha_forward(&pk, q.bits, buf + off, v.bits, o, NULL, NULL, 0);
        tu_check(s2 == FMHA_OK && !memcmp(o, o_ref, nq * 2),
                 "%s %s/%s: O differs with K rows of stride %lld%s (status %d)", t == FMHA_DTYPE_BF16 ? "bf16" : "f16",
                 isa, strategy_names[strategy], (long long)rs, off ? ", one element off" : "", s2);
        free(buf);
    }
    low_free(&q); low_free(&k); low_free(&v);
    free(o_ref); free(o);
}

/* A float32 problem at FMHA_PRECISION_BF16 on a table with bf16 pairs and
 * no matrix forward runs the bf16 operand path, rounding Q, K and V as it
 * packs them: its O rounded to bf16 and its lse must be, bit for bit, the
 * bf16 problem's on the rounded inputs (precision FAST, the same path),
 * for the tiled and dense strategies, an odd head dim, and Q, K, V read
 * through element strides of 2 (the rounding's gathers). */
static void check_f32_bf16_pairs(const char *isa) {
    const fmha_ukernels *uk = fmha_cpu_kernels();
    if (!uk->bf16.gemm || uk->matrix.forward) return;
    const int64_t B = 2, Hq = 4, Hkv = 2, Sq = 77, Skv = 150, dims[2] = {40, 33};
    for (int di = 0; di < 2; di++)
        for (int s = FMHA_STRATEGY_TILED; s <= FMHA_STRATEGY_DENSE; s++)
            for (int strided = 0; strided < 2; strided++) {
                const int64_t D = dims[di];
                fmha_problem p;
                fmha_problem_init(&p, B, Hq, Hkv, Sq, Skv, D, D, FMHA_LAYOUT_BSHD);
                p.strategy = (fmha_strategy)s;
                p.causal = FMHA_CAUSAL_TOP_LEFT;
                const size_t nq = (size_t)(B * Sq * Hq * D), nk = (size_t)(B * Skv * Hkv * D), nl = (size_t)(B * Hq * Sq);
                const size_t n[3] = {nq, nk, nk};
                float *x32[3];
                uint16_t *x16[3];
                for (int t = 0; t < 3; t++) {
                    const size_t step = strided ? 2 : 1; /* element e at 2 e: the other half NaN, never read */
                    x32[t] = malloc(n[t] * step * sizeof(float));
                    x16[t] = malloc(n[t] * sizeof(uint16_t));
                    for (size_t e = 0; e < n[t]; e++) {
                        const float f = (float)tu_uniform(t == 2 ? -1 : -2, t == 2 ? 1 : 2);
                        x32[t][e * step] = f;
                        if (strided) x32[t][e * step + 1] = NAN;
                        x16[t][e] = fmha_f32_to_bf16(f);
                    }
                }
                fmha_problem p16 = p, p32 = p;
                p16.dtype = FMHA_DTYPE_BF16;
                p32.precision = FMHA_PRECISION_BF16;
                if (strided)
                    for (int d = 0; d < 4; d++) p32.q_strides[d] *= 2, p32.k_strides[d] *= 2, p32.v_strides[d] *= 2;
                float *o32 = malloc(nq * sizeof(float)), *l32 = malloc(nl * sizeof(float)), *l16 = malloc(nl * sizeof(float));
                uint16_t *o16 = malloc(nq * sizeof(uint16_t));
                const fmha_status a = fmha_forward(&p32, x32[0], x32[1], x32[2], o32, l32, NULL, 0);
                const fmha_status b = fmha_forward(&p16, x16[0], x16[1], x16[2], o16, l16, NULL, 0);
                size_t off = 0;
                for (size_t e = 0; e < nq; e++) off += fmha_f32_to_bf16(o32[e]) != o16[e];
                char line[1024];
                tu_plan_line(&p32, line, sizeof line);
                tu_check(a == FMHA_OK && b == FMHA_OK && off == 0 && !memcmp(l32, l16, nl * sizeof(float)) &&
                             strstr(line, " path=bf16 precision=bf16 ") != NULL,
                         "float32 at bf16 %s/%s D%lld%s: status %d / %d, %zu O elements differ from the bf16 "
                         "problem's, lse %s; describe %s",
                         isa, strategy_names[s], (long long)D, strided ? " strided" : "", (int)a, (int)b, off,
                         memcmp(l32, l16, nl * sizeof(float)) ? "differs" : "same", line);
                for (int t = 0; t < 3; t++) free(x32[t]), free(x16[t]);
                free(o32), free(l32), free(l16), free(o16);
            }
}

int main(void) {
    tu_seed();
    /* every ISA of the registry that this CPU runs */
    for (size_t ii = 0; ii < fmha_isa_count(); ii++) {
        const char *isa = fmha_isa_at(ii)->name;
        if (!tu_isa_runs(fmha_isa_at(ii))) {
            printf("skip ISA %s: not run here (unsupported, or another table has its kernels)\n", isa);
            continue;
        }
        fmha_cpu_force_isa(isa);
        for (int t = FMHA_DTYPE_BF16; t <= FMHA_DTYPE_F16; t++)
            for (int s = 0; s < 4; s++) {
                if (tu_strategy_skipped(s) || tu_strategy_repeats(s)) continue;
                for (int pr = FMHA_PRECISION_ACCURATE; pr <= FMHA_PRECISION_FAST; pr++) {
                    fmha_precision prec = (fmha_precision)pr;
                    /* FMHA_TEST_QUICK: fewer queries and one batch element, keys still past a block */
                    check_problem((fmha_dtype)t, 1, 2, 2, tu_quick_pick(150, 40), 131, 64, 64, FMHA_CAUSAL_NONE, 1.0,
                                  isa, s, prec);
                    check_problem((fmha_dtype)t, tu_quick_pick(2, 1), 4, 2, 77, 200, 33, 40, FMHA_CAUSAL_TOP_LEFT, 1.0,
                                  isa, s, prec);
                    check_problem((fmha_dtype)t, 1, 3, 1, 90, 61, 16, 7, FMHA_CAUSAL_BOTTOM_RIGHT, 2.0, isa, s, prec);
                    check_problem((fmha_dtype)t, 1, 2, 1, 1, 300, 128, 128, FMHA_CAUSAL_BOTTOM_RIGHT, 1.0, isa, s, prec);
                    check_problem((fmha_dtype)t, 1, 2, 1, 9, 131, 576, 512, FMHA_CAUSAL_BOTTOM_RIGHT, 1.0, isa, s, prec);
                    check_problem((fmha_dtype)t, 1, 1, 1, 67, 40, 320, 320, FMHA_CAUSAL_NONE, 1.0, isa, s, prec);
                }
            }
        for (int t = FMHA_DTYPE_BF16; t <= FMHA_DTYPE_F16; t++)
            for (int s = 0; s < 4; s++) {
                if (tu_strategy_skipped(s) || tu_strategy_repeats(s)) continue;
                check_lengths_hide_nan((fmha_dtype)t, isa, s);
                check_k_layouts((fmha_dtype)t, isa, s);
                for (int pr = FMHA_PRECISION_ACCURATE; pr <= FMHA_PRECISION_FAST; pr++)
                    check_guarded_dq((fmha_dtype)t, isa, s, (fmha_precision)pr);
            }
        check_large_logits(isa);
        check_split_masks(isa);
        check_bf16_threads(isa, FMHA_PRECISION_ACCURATE);
        check_bf16_threads(isa, FMHA_PRECISION_FAST);
        check_f32_bf16_pairs(isa);
        for (int pr = FMHA_PRECISION_BF16X3; pr <= FMHA_PRECISION_BF16; pr++) {
            check_f32_precision((fmha_precision)pr, 2, 4, 2, 150, 300, 64, 64, FMHA_CAUSAL_NONE, isa);
            check_f32_precision((fmha_precision)pr, 1, 2, 1, 77, 200, 33, 40, FMHA_CAUSAL_TOP_LEFT, isa);
            check_f32_precision((fmha_precision)pr, 1, 3, 3, 90, 61, 128, 96, FMHA_CAUSAL_BOTTOM_RIGHT, isa);
            check_f32_precision_grads((fmha_precision)pr, 1, 4, 2, 150, 300, 64, 64, FMHA_CAUSAL_NONE, isa);
            check_f32_precision_grads((fmha_precision)pr, 1, 2, 1, 77, 200, 33, 40, FMHA_CAUSAL_TOP_LEFT, isa);
            check_f32_precision_grads((fmha_precision)pr, 1, 3, 3, 90, 61, 128, 96, FMHA_CAUSAL_BOTTOM_RIGHT, isa);
        }
    }
    return tu_finish();
}
