/* test_merge.c: fmha_merge, two partial results over disjoint key sets
 * combined by their lse.
 *   split      keys split in two, fmha_forward on each part, merged: equal
 *              to the float64 reference on all keys (layouts BSHD, PADDED;
 *              D 16, and MLA's D 576 / Dv 512)
 *   formula    random O and lse against the merge computed in float64, with
 *              rows fully masked on one or both sides, NaN lse, NaN or inf
 *              in an O whose weight underflows (it still reaches O), out of
 *              place and in place (o = o_a or o_b, lse = lse_a or lse_b)
 *   errors     NULL, sizes, Dv, negative strides: status, nothing written. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fmha_ref.h"
#include "test_util.h"

static void test_split(int layout, int64_t D, int64_t Dv) {
    fmha_problem p;
    const int64_t B = 2, Hq = 4, Hkv = 2, S = 37, Skv = 53, k0 = tu_int(1, 52);
    tu_problem(&p, B, Hq, Hkv, S, Skv, D, Dv);
    tu_set_layout(&p, layout);
    float *q = tu_new_input(&p, 'q', -1, 1), *k = tu_new_input(&p, 'k', -1, 1), *v = tu_new_input(&p, 'v', -1, 1);
    float *oa = tu_new_output(&p, 'o', 0), *ob = tu_new_output(&p, 'o', 0);
    const size_t rows = (size_t)(B * Hq * S);
    float *la = malloc(rows * sizeof(float)), *lb = malloc(rows * sizeof(float));
    fmha_problem pa = p, pb = p;
    pa.seq_kv = k0;
    pb.seq_kv = Skv - k0;
    fmha_status sa = fmha_forward(&pa, q, k, v, oa, la, NULL, 0);
    fmha_status sb = fmha_forward(&pb, q, k + k0 * p.k_strides[1], v + k0 * p.v_strides[1], ob, lb, NULL, 0);
    /* merged in place into oa, la */
    fmha_status sm = fmha_merge(B, Hq, S, Dv, p.o_strides, oa, la, ob, lb, oa, la);
    int64_t n[4];
    tu_shape(&p, 'o', n);
    double *ro = malloc(tu_numel(n) * sizeof(double)), *rl = malloc(rows * sizeof(double));
    fmha_ref_forward(&p, q, k, v, ro, rl);
    float *got = malloc(tu_numel(n) * sizeof(float));
    tu_gather(oa, p.o_strides, n, got);
    double e_o = tu_rel_l2(got, ro, tu_numel(n)), e_l = tu_worst_ratio(la, rl, rows, 1e-5, 1e-5);
    /* rel L2 <= 1e-5 for O; lse within 1e-5 absolute + 1e-5 relative */
    tu_check(sa == FMHA_OK && sb == FMHA_OK && sm == FMHA_OK && e_o <= 1e-5 && e_l <= 1,
             "split %s D %lld / %lld at %lld: status %d %d %d, O rel L2 %.3g, lse ratio %.3g", tu_layout_name(layout),
             (long long)D, (long long)Dv, (long long)k0, sa, sb, sm, e_o, e_l);
    free(q), free(k), free(v), free(oa), free(ob), free(la), free(lb), free(ro), free(rl), free(got);
}

/* inplace: 0 out of place, 1 o = o_a and lse = lse_a, 2 o = o_b and lse = lse_b */
static void test_formula(int inplace) {
    const int64_t B = 2, H = 3, S = 11, Dv = 5;
    const int64_t st[4] = {S * H * Dv, H * Dv, Dv, 1};
    const size_t rows = (size_t)(B * H * S), n = rows * (size_t)Dv;
    float *oa = malloc(n * sizeof(float)), *ob = malloc(n * sizeof(float)), *oo = malloc(n * sizeof(float));
    float *la = malloc(rows * sizeof(float)), *lb = malloc(rows * sizeof(float)), *ll = malloc(rows * sizeof(float));
    double *ro = malloc(n * sizeof(double)), *rl = malloc(rows * sizeof(double));
    tu_fill(oa, n, -2, 2), tu_fill(ob, n, -2, 2), tu_fill(la, rows, -30, 30), tu_fill(lb, rows, -30, 30);
    la[1] = -INFINITY;                      /* a fully masked on row 1 */
    lb[2] = -INFINITY;                      /* b on row 2 */
    la[3] = lb[3] = -INFINITY;              /* both on row 3 */
    la[4] = NAN;                            /* NaN row */
    la[5] = 80, lb[5] = -80;                /* far apart: no overflow */
    /* weights that underflow to 0 still carry a NaN or inf of their O
     * (partials.h's rule); a side with lse -inf is not read */
    la[6] = -1000, lb[6] = 0;               /* row 6 = b 0, h 0, i 6 */
    la[7] = -200, lb[7] = 0;
    la[8] = 0, lb[8] = -1000;
    la[9] = -INFINITY, lb[9] = 0;
    for (int64_t d = 0; d < Dv; d++) {
        oa[6 * st[1] + d] = NAN, oa[7 * st[1] + d] = NAN, oa[9 * st[1] + d] = NAN;
        ob[8 * st[1] + d] = d % 2 ? INFINITY : NAN;
    }
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t i = 0; i < S; i++) {
                const size_t r = (size_t)((b * H + h) * S + i);
                const double a = la[r], c = lb[r];
                double l, wa, wb;
                if (isnan(a) || isnan(c)) l = wa = wb = NAN;
                else if (a == -INFINITY && c == -INFINITY) l = -INFINITY, wa = wb = 0;
                else {
                    const double m = fmax(a, c);
                    l = m + log(exp(a - m) + exp(c - m));
                    wa = exp(a - l), wb = exp(c - l);
                }
                rl[r] = l;
                for (int64_t d = 0; d < Dv; d++) {
                    const size_t at = (size_t)(b * st[0] + i * st[1] + h * st[2] + d);
                    ro[at] = (a == -INFINITY ? 0 : wa * oa[at]) + (c == -INFINITY ? 0 : wb * ob[at]);
                }
            }
    float *o = inplace == 1 ? oa : inplace == 2 ? ob : oo;
    float *lse = inplace == 1 ? la : inplace == 2 ? lb : ll;
    fmha_status s = fmha_merge(B, H, S, Dv, st, oa, la, ob, lb, o, lse);
    size_t bad = 0;
    for (size_t r = 0; r < rows; r++) {
        int nan_row = isnan(rl[r]);
        if (nan_row ? !isnan(lse[r]) : !(fabs(lse[r] - rl[r]) <= 1e-6 * (1 + fabs(rl[r])) || lse[r] == rl[r])) bad++;
    }
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++)
            for (int64_t i = 0; i < S; i++)
                for (int64_t d = 0; d < Dv; d++) {
                    const size_t at = (size_t)(b * st[0] + i * st[1] + h * st[2] + d);
                    if (isnan(ro[at]) ? !isnan(o[at]) : !(fabs(o[at] - ro[at]) <= 1e-6 * (1 + fabs(ro[at])))) bad++;
                }
    /* the both-masked row is exactly 0 and -inf; rows 6-8 NaN, row 9 finite */
    int masked_ok = lse[3] == -INFINITY;
    for (int64_t d = 0; d < Dv; d++) {
        masked_ok &= o[3 * st[1] + d] == 0;   /* row 3 = b 0, h 0, i 3 */
        masked_ok &= isnan(o[6 * st[1] + d]) && isnan(o[7 * st[1] + d]) && isnan(o[8 * st[1] + d]);
        masked_ok &= isfinite(o[9 * st[1] + d]);
    }
    tu_check(s == FMHA_OK && bad == 0 && masked_ok, "formula inplace %d: status %d, %zu elements off, masked row %s",
             inplace, s, bad, masked_ok ? "ok" : "wrong");
    free(oa), free(ob), free(oo), free(la), free(lb), free(ll), free(ro), free(rl);
}

static void test_errors(void) {
    const int64_t st[4] = {24, 8, 4, 1}, neg[4] = {24, 8, -4, 1};
    float oa[48], ob[48], o[48], la[12], lb[12], l[12];
    tu_fill(oa, 48, -1, 1), tu_fill(ob, 48, -1, 1), tu_fill(la, 12, -1, 1), tu_fill(lb, 12, -1, 1);
    struct { fmha_status want; fmha_status got; const char *what; } c[] = {
        {FMHA_ERR_NULL_POINTER, fmha_merge(2, 2, 3, 4, st, NULL, la, ob, lb, o, l), "NULL o_a"},
        {FMHA_ERR_NULL_POINTER, fmha_merge(2, 2, 3, 4, st, oa, la, ob, NULL, o, l), "NULL lse_b"},
        {FMHA_ERR_NULL_POINTER, fmha_merge(2, 2, 3, 4, NULL, oa, la, ob, lb, o, l), "NULL strides"},
        {FMHA_ERR_NULL_POINTER, fmha_merge(2, 2, 3, 4, st, oa, la, ob, lb, o, NULL), "NULL lse"},
        {FMHA_ERR_BAD_SIZE, fmha_merge(0, 2, 3, 4, st, oa, la, ob, lb, o, l), "batch 0"},
        {FMHA_ERR_BAD_SIZE, fmha_merge(2, 2, -3, 4, st, oa, la, ob, lb, o, l), "seq -3"},
        {FMHA_ERR_BAD_SIZE, fmha_merge(INT64_MAX / 2, 4, 3, 4, st, oa, la, ob, lb, o, l), "overflow"},
        {FMHA_ERR_BAD_HEAD_DIM, fmha_merge(2, 2, 3, 0, st, oa, la, ob, lb, o, l), "Dv 0"},
        {FMHA_ERR_BAD_HEAD_DIM, fmha_merge(2, 2, 3, FMHA_MAX_HEAD_DIM + 1, st, oa, la, ob, lb, o, l), "Dv too big"},
        {FMHA_ERR_BAD_HEAD_DIM, fmha_merge(2, 2, 3, 577, st, oa, la, ob, lb, o, l), "Dv 577"},
        {FMHA_ERR_BAD_STRIDE, fmha_merge(2, 2, 3, 4, neg, oa, la, ob, lb, o, l), "negative stride"},
    };
    for (size_t i = 0; i < sizeof c / sizeof *c; i++)
        tu_check(c[i].got == c[i].want, "error %s: status %d, want %d (%s)", c[i].what, c[i].got, c[i].want,
                 fmha_status_string(c[i].got));
    /* nothing written: o and l were never initialised by a successful call */
    float so[48], sl[12];
    for (int i = 0; i < 48; i++) so[i] = o[i] = 7.f;
    for (int i = 0; i < 12; i++) sl[i] = l[i] = 7.f;
    fmha_merge(2, 2, 3, 0, st, oa, la, ob, lb, o, l);
    fmha_merge(2, 2, 3, 4, neg, oa, la, ob, lb, o, l);
    tu_check(!memcmp(o, so, sizeof o) && !memcmp(l, sl, sizeof l), "errors leave o and lse unwritten");
}

int main(void) {
    tu_seed();
    for (int rep = 0; rep < 3; rep++) {
        test_split(TU_LAYOUT_BSHD, 16, 16);
        test_split(TU_LAYOUT_PADDED, 16, 16);
    }
    test_split(TU_LAYOUT_BSHD, 576, 512);
    test_split(TU_LAYOUT_PADDED, 576, 576);
    for (int inplace = 0; inplace < 3; inplace++) test_formula(inplace);
    test_errors();
    return tu_finish();
}
