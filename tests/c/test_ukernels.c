/* test_ukernels.c: the float32 microkernels of every registered ISA this
 * CPU runs (src/config/cpu.c) against float64 computations, and each SIMD kernel
 * against the scalar specification: GEMM at every m, several k, every mode,
 * both stride patterns and several ab_scale, with sentinels around C; the
 * online softmax over several tiles with masked (-inf) entries and lanes
 * and extreme scores (and the low-precision one where a table has it, with
 * 5e-6 more on P and l); the backward's exp(s - lse) and dS kernels; NaN and
 * infinities through the softmax, exp(s - lse) and dS kernels as IEEE has
 * them; the vectorised exp across the float range. */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/cpu.h"
#include "test_util.h"
#include "uk/ukernel.h"

#if FMHA_HAVE_X86
/* Vector exp of the SIMD kernel files, exported for this test. */
void fmha_f32_exp__avx2(size_t n, const float *x, float *y);
void fmha_f32_exp__avx512(size_t n, const float *x, float *y);
#elif defined(__aarch64__)
void fmha_f32_exp__neon(size_t n, const float *x, float *y);
#if FMHA_HAVE_SVE
void fmha_f32_exp__sve(size_t n, const float *x, float *y);
#endif
#endif

#define EPS32 0x1p-23        /* float32 ulp of 1 */
#define SENTINEL 1234.5678f  /* never a kernel output here */

static float *floats(size_t n) {
    float *p = malloc((n ? n : 1) * sizeof(float));
    if (!p) {
        fprintf(stderr, "out of memory\n");
        exit(2);
    }
    return p;
}

static double *doubles(size_t n) {
    double *p = malloc((n ? n : 1) * sizeof(double));
    if (!p) {
        fprintf(stderr, "out of memory\n");
        exit(2);
    }
    return p;
}

static void fill_const(float *x, size_t n, float v) {
    for (size_t i = 0; i < n; i++) x[i] = v;
}

static int same_bits(float x, float y) { return memcmp(&x, &y, sizeof x) == 0; }

/* ---------------------------------------------------------------- GEMM */

static const char *const mode_names[] = {"store", "accumulate", "rescale"};

/* One GEMM call of `u` at (m, k, mode, stride pattern, ab_scale) against
 * float64 and, for a SIMD table, against the scalar kernel run per 16-column
 * chunk. The large ab_scale (1e30) comes with operands scaled by 1e-15, so
 * that ab_scale * A B is of order 1 while ab_scale and A B are far from it.
 * pattern 0: a_cs = 1, a_rs = k + 2 (rows strided); pattern 1: a_rs = 1,
 * a_cs = m + 3 (k-steps strided). ldb = NR + 3 and ldc = NR + 5 (rows not
 * aligned). Padding of A and B is NaN, so reading it shows in C; buffers
 * are exactly as long as the operands, so ASan sees overreads.
 * Tolerance: the kernel rounds once per fma, so
 *   |c - ref| <= 1e-6 + 2 (k + 2) 2^-24 (|c_init| + |s| sum_p |a_rp b_pj|),
 * a bound that holds under cancellation, where a relative one would not. */
static void gemm_case(const fmha_ukernels *u, const fmha_ukernels *spec, size_t m, size_t k,
                      int mode, int pattern, float ab_scale) {
    const size_t nr = u->tile.nr, mr = u->tile.mr, ldb = nr + 3, ldc = nr + 5;
    ptrdiff_t a_rs, a_cs;
    size_t a_len;
    if (pattern == 0) {
        a_cs = 1;
        a_rs = (ptrdiff_t)k + 2;
        a_len = (m - 1) * (size_t)a_rs + k;
    } else {
        a_rs = 1;
        a_cs = (ptrdiff_t)m + 3;
        a_len = k ? (k - 1) * (size_t)a_cs + m : 0;
    }
    const size_t b_len = k ? (k - 1) * ldb + nr : 0, c_len = (mr + 1) * ldc;
    float *a = floats(a_len), *b = floats(b_len), *scale = floats(nr);
    float *c = floats(c_len), *c_init = floats(c_len), *c_spec = floats(c_len);
    double *ref = doubles(m * nr), *mag = doubles(m * nr);
    const float op_scale = ab_scale > 1e20f ? 1e-15f : 1.0f;

    fill_const(a, a_len, NAN);
    for (size_t r = 0; r < m; r++)
        for (size_t p = 0; p < k; p++)
            a[(ptrdiff_t)r * a_rs + (ptrdiff_t)p * a_cs] =
                (float)tu_uniform(-1.0, 1.0) * op_scale;
    fill_const(b, b_len, NAN);
    for (size_t p = 0; p < k; p++) {
        tu_fill(b + p * ldb, nr, -1.0, 1.0);
        for (size_t j = 0; j < nr; j++) b[p * ldb + j] *= op_scale;
    }
    tu_fill(scale, nr, 0.0, 2.0);
    /* STORE must not read C: its rows start as NaN. Outside the m x NR tile
     * everything is a sentinel that must survive. */
    fill_const(c_init, c_len, SENTINEL);
    for (size_t r = 0; r < m; r++) {
        if (mode == FMHA_UK_STORE) fill_const(c_init + r * ldc, nr, NAN);
        else tu_fill(c_init + r * ldc, nr, -1.0, 1.0);
    }
    memcpy(c, c_init, c_len * sizeof(float));

    for (size_t r = 0; r < m; r++)
        for (size_t j = 0; j < nr; j++) {
            double c0 = c_init[r * ldc + j];
            double acc = mode == FMHA_UK_STORE        ? 0.0
                         : mode == FMHA_UK_ACCUMULATE ? c0
                                                      : c0 * (double)scale[j];
            double ab = 0.0, ab_abs = 0.0;
            for (size_t p = 0; p < k; p++) {
                double prod = (double)a[(ptrdiff_t)r * a_rs + (ptrdiff_t)p * a_cs] *
                              (double)b[p * ldb + j];
                ab += prod;
                ab_abs += fabs(prod);
            }
            ref[r * nr + j] = acc + (double)ab_scale * ab;
            mag[r * nr + j] = fabs(acc) + fabs((double)ab_scale) * ab_abs;
        }

    u->tile.gemm(m, k, a, a_rs, a_cs, b, ldb, c, ldc, mode,
                mode == FMHA_UK_RESCALE ? scale : NULL, ab_scale);

    double worst = 0.0;
    size_t clobbered = 0;
    for (size_t r = 0; r < mr + 1; r++)
        for (size_t j = 0; j < ldc; j++) {
            float x = c[r * ldc + j];
            if (r >= m || j >= nr) {
                clobbered += !same_bits(x, c_init[r * ldc + j]);
                continue;
            }
            double tol = 1e-6 + 2.0 * (double)(k + 2) * 0x1p-24 * mag[r * nr + j];
            double ratio = isfinite(x) ? fabs((double)x - ref[r * nr + j]) / tol : INFINITY;
            if (ratio > worst) worst = ratio;
        }
    tu_check(worst <= 1.0 && clobbered == 0,
             "%s gemm m=%zu k=%zu %s %s ab_scale=%g: worst error/tolerance %.3g, %zu sentinels "
             "overwritten",
             u->isa, m, k, mode_names[mode], pattern ? "a_rs=1" : "a_cs=1", (double)ab_scale,
             worst, clobbered);

    if (spec && spec != u) {
        /* The scalar specification on the same operands, in MR_s x 16 pieces. */
        memcpy(c_spec, c_init, c_len * sizeof(float));
        for (size_t r0 = 0; r0 < m; r0 += spec->tile.mr)
            for (size_t j0 = 0; j0 < nr; j0 += spec->tile.nr) {
                size_t rows = m - r0 < spec->tile.mr ? m - r0 : spec->tile.mr;
                spec->tile.gemm(rows, k, a + (ptrdiff_t)r0 * a_rs, a_rs, a_cs, b + j0, ldb,
                               c_spec + r0 * ldc + j0, ldc, mode,
                               mode == FMHA_UK_RESCALE ? scale + j0 : NULL, ab_scale);
            }
        double worst_vs_spec = 0.0;
        for (size_t r = 0; r < m; r++)
            for (size_t j = 0; j < nr; j++) {
                double tol = 1e-6 + 2.0 * (double)(k + 2) * 0x1p-24 * mag[r * nr + j];
                double d = fabs((double)c[r * ldc + j] - (double)c_spec[r * ldc + j]) / tol;
                if (!(d <= worst_vs_spec)) worst_vs_spec = isnan(d) ? INFINITY : d;
            }
        tu_check(worst_vs_spec <= 1.0,
                 "%s gemm m=%zu k=%zu %s %s ab_scale=%g vs scalar: worst difference/tolerance "
                 "%.3g",
                 u->isa, m, k, mode_names[mode], pattern ? "a_rs=1" : "a_cs=1", (double)ab_scale,
                 worst_vs_spec);
    }
    free(a);
    free(b);
    free(scale);
    free(c);
    free(c_init);
    free(c_spec);
    free(ref);
    free(mag);
}

static void test_gemm(const fmha_ukernels *u, const fmha_ukernels *spec) {
    static const size_t ks[] = {0, 1, 2, 7, 64, 129, 256};
    static const float ab_scales[] = {1.0f, 0.125f, 1e30f};
    for (size_t m = 1; m <= u->tile.mr; m++)
        for (size_t ki = 0; ki < sizeof ks / sizeof ks[0]; ki++)
            for (int mode = 0; mode < 3; mode++)
                for (int pattern = 0; pattern < 2; pattern++)
                    for (size_t si = 0; si < sizeof ab_scales / sizeof ab_scales[0]; si++)
                        gemm_case(u, spec, m, ks[ki], mode, pattern, ab_scales[si]);
}

/* ------------------------------------------------------------- softmax */

enum { SCORES_RANDOM, SCORES_HUGE, SCORES_FLT_LIMITS, SCORES_EXP_RANGE };
static const char *const scores_names[] = {"random", "+-1e30", "+-FLT_MAX", "exp range"};

/* Relative error allowed for exp(x) computed as exp(float(s - m)): 2 ulp for
 * the exp itself, one more for the float64 comparison, plus |x| 2^-24 from
 * rounding s - m to float. */
static double exp_rtol(double x) { return 3.0 * EPS32 + fabs(x) * 0x1p-24; }

/* One score, by scenario, lane and tile. Lanes j % 8 == 1 are masked in
 * every tile, j % 8 == 2 only in the first tile, j % 8 == 5 only in the
 * second; elsewhere 10% of the scores are -inf. */
static float make_score(int scenario, size_t j, int tile) {
    int kind = (int)(j % 8);
    if (kind == 1 || (kind == 2 && tile == 0) || (kind == 5 && tile == 1)) return -INFINITY;
    if (tu_uniform(0.0, 1.0) < 0.1) return -INFINITY;
    /* Lanes drift up, down or not at all from tile to tile, so alpha < 1 too. */
    double drift = ((double)(j % 3) - 1.0) * 4.0 * tile;
    double sign = tu_uniform(0.0, 1.0) < 0.5 ? -1.0 : 1.0;
    switch (scenario) {
    case SCORES_HUGE:
        if (tu_uniform(0.0, 1.0) < 0.6) return (float)(sign * 1e30 * tu_uniform(0.999, 1.0));
        break;
    case SCORES_FLT_LIMITS:
        if (tu_uniform(0.0, 1.0) < 0.6) return (float)(sign * FLT_MAX * tu_uniform(0.99, 1.0));
        break;
    default:
        break;
    }
    return (float)(tu_uniform(-8.0, 8.0) + drift);
}

/* Tiles of `rows` keys through u's softmax, checking every step against a
 * float64 recurrence (and the scalar kernel, per 16-lane chunk). For
 * SCORES_EXP_RANGE, m starts at 0 and the scores lie in [-104, 0], so P is
 * exp of the exact score: a direct check (2 ulp) of the exp the softmax
 * kernel uses, including the underflow below -87.3 (0 or within FLT_MIN of
 * the true value). */
static void softmax_case(const fmha_ukernels *u, const fmha_ukernels *spec, size_t rows,
                         int scenario, fmha_f32_softmax_ukernel_fn softmax, double p_rtol) {
    const size_t nr = u->tile.nr, lds = nr + 5, s_len = (rows - 1) * lds + nr;
    const int tiles = scenario == SCORES_EXP_RANGE ? 1 : 3;
    const int with_spec = spec && spec != u;
    float *s = floats(s_len), *s_in = floats(s_len), *s_spec = floats(s_len);
    float *m = floats(nr), *l = floats(nr), *alpha = floats(nr);
    float *m_spec = floats(nr), *l_spec = floats(nr), *alpha_spec = floats(nr);
    double *l_ref = doubles(nr), *l_rtol = doubles(nr);
    size_t total_rows = 0;

    for (size_t j = 0; j < nr; j++) {
        m[j] = scenario == SCORES_EXP_RANGE ? 0.0f : -INFINITY;
        l[j] = 0.0f;
        l_ref[j] = 0.0;
        l_rtol[j] = 0.0;
    }
    memcpy(m_spec, m, nr * sizeof(float));
    memcpy(l_spec, l, nr * sizeof(float));

    for (int tile = 0; tile < tiles; tile++) {
        fill_const(s_in, s_len, SENTINEL);
        for (size_t r = 0; r < rows; r++)
            for (size_t j = 0; j < nr; j++)
                s_in[r * lds + j] = scenario == SCORES_EXP_RANGE
                                        ? (float)tu_uniform(r % 4 ? -87.3 : -104.0, 0.0)
                                        : make_score(scenario, j, tile);
        memcpy(s, s_in, s_len * sizeof(float));
        memcpy(s_spec, s_in, s_len * sizeof(float));
        total_rows += rows;

        /* The float64 recurrence: m_new, m_use, alpha, P and l. */
        double worst_p = 0.0, worst_alpha = 0.0, worst_l = 0.0;
        size_t bad_m = 0, nonfinite = 0, clobbered = 0, max_not_one = 0;
        float *m_new = floats(nr);
        double *m_use = doubles(nr), *alpha_ref = doubles(nr);
        for (size_t j = 0; j < nr; j++) {
            float mx = m[j];
            for (size_t r = 0; r < rows; r++)
                if (s_in[r * lds + j] > mx) mx = s_in[r * lds + j];
            m_new[j] = mx;
            m_use[j] = mx == -INFINITY ? 0.0 : (double)mx;
        }
        /* Inputs of the call (m, l) before they are overwritten. */
        float *m_old = floats(nr);
        memcpy(m_old, m, nr * sizeof(float));

        softmax(rows, s, lds, m, l, alpha);
        if (with_spec)
            for (size_t j0 = 0; j0 < nr; j0 += spec->tile.nr)
                spec->tile.softmax(rows, s_spec + j0, lds, m_spec + j0, l_spec + j0,
                                  alpha_spec + j0);

        for (size_t j = 0; j < nr; j++) {
            double xa = (double)m_old[j] - m_use[j];
            alpha_ref[j] = m_old[j] == -INFINITY ? 0.0 : exp(xa);
            double tol_a = FLT_MIN + alpha_ref[j] * exp_rtol(m_old[j] == -INFINITY ? 0.0 : xa);
            double ea = fabs((double)alpha[j] - alpha_ref[j]) / tol_a;
            if (!isfinite(alpha[j])) ea = INFINITY;
            if (ea > worst_alpha) worst_alpha = ea;
            double sum = 0.0, x_max = 0.0;
            if (m_old[j] != -INFINITY && alpha_ref[j] > 1e-30) x_max = fabs(xa);
            for (size_t r = 0; r < rows; r++) {
                float sv = s_in[r * lds + j], p = s[r * lds + j];
                double x = (double)sv - m_use[j];
                double p_ref = sv == -INFINITY ? 0.0 : exp(x);
                /* With m = 0 the argument is exact: 2 ulp of exp alone. */
                double rtol = p_rtol + (scenario == SCORES_EXP_RANGE ? 2.0 * EPS32 : exp_rtol(x));
                double ep = fabs((double)p - p_ref) / (FLT_MIN + p_ref * rtol);
                if (!isfinite(p)) {
                    ep = INFINITY;
                    nonfinite++;
                }
                if (ep > worst_p) worst_p = ep;
                /* exp(0) is exact: the row's largest score gets P = 1 */
                max_not_one += sv == m_new[j] && isfinite(sv) && p != 1.0f;
                if (p_ref > 1e-30 && fabs(x) > x_max) x_max = fabs(x);
                sum += p_ref;
            }
            /* l: positive terms, so a relative bound: the P and alpha errors
             * plus one rounding per row and per tile of the float sums. */
            l_ref[j] = l_ref[j] * alpha_ref[j] + sum;
            l_rtol[j] += p_rtol + exp_rtol(x_max) + (double)(rows + 4) * EPS32;
            double el = fabs((double)l[j] - l_ref[j]) /
                        ((double)total_rows * FLT_MIN + 2.0 * l_ref[j] * l_rtol[j]);
            if (!isfinite(l[j])) {
                el = INFINITY;
                nonfinite++;
            }
            if (el > worst_l) worst_l = el;
            bad_m += !same_bits(m[j], m_new[j]);
        }
        for (size_t r = 0; r < rows; r++)
            for (size_t j = nr; j < lds && r + 1 < rows; j++)
                clobbered += !same_bits(s[r * lds + j], SENTINEL);
        tu_check(worst_p <= 1.0 && worst_alpha <= 1.0 && worst_l <= 1.0 && bad_m == 0 &&
                     nonfinite == 0 && clobbered == 0 && max_not_one == 0,
                 "%s softmax%s rows=%zu %s tile %d: P %.3g, alpha %.3g, l %.3g (error/tolerance), "
                 "%zu wrong m, %zu non-finite, %zu padding overwritten, %zu maxima with P != 1",
                 u->isa, p_rtol > 0 ? " lowp" : "", rows, scores_names[scenario], tile, worst_p, worst_alpha, worst_l, bad_m,
                 nonfinite, clobbered, max_not_one);

        if (with_spec) {
            /* Same inputs, same float m: P and alpha within the exp errors of
             * both, l within the float sums' rounding. */
            double worst = 0.0;
            size_t bad = 0;
            for (size_t j = 0; j < nr; j++) {
                for (size_t r = 0; r < rows; r++) {
                    double p = s[r * lds + j], q = s_spec[r * lds + j];
                    double d = fabs(p - q) / (FLT_MIN + fabs(q) * (p_rtol + 6.0 * EPS32));
                    if (!(d <= worst)) worst = isnan(d) ? INFINITY : d;
                }
                double da = fabs((double)alpha[j] - (double)alpha_spec[j]) /
                            (FLT_MIN + fabs((double)alpha_spec[j]) * 6.0 * EPS32);
                double dl = fabs((double)l[j] - (double)l_spec[j]) /
                            ((double)total_rows * FLT_MIN +
                             fabs((double)l_spec[j]) * (p_rtol + (double)(total_rows + 8) * 6.0 * EPS32));
                if (!(da <= worst)) worst = isnan(da) ? INFINITY : da;
                if (!(dl <= worst)) worst = isnan(dl) ? INFINITY : dl;
                bad += !same_bits(m[j], m_spec[j]);
            }
            tu_check(worst <= 1.0 && bad == 0,
                     "%s softmax%s rows=%zu %s tile %d vs scalar: worst difference/tolerance %.3g, "
                     "%zu m differ",
                     u->isa, p_rtol > 0 ? " lowp" : "", rows, scores_names[scenario], tile, worst, bad);
        }
        free(m_new);
        free(m_use);
        free(alpha_ref);
        free(m_old);
    }
    free(s);
    free(s_in);
    free(s_spec);
    free(m);
    free(l);
    free(alpha);
    free(m_spec);
    free(l_spec);
    free(alpha_spec);
    free(l_ref);
    free(l_rtol);
}

/* The relative error of P that softmax_lowp_f32 may add (ukernel.h). */
#define LOWP_P_RTOL 5e-6

static void test_softmax(const fmha_ukernels *u, const fmha_ukernels *spec) {
    static const size_t row_counts[] = {1, 2, 3, 17, 64, 128, 131};
    for (size_t i = 0; i < sizeof row_counts / sizeof row_counts[0]; i++)
        for (int scenario = 0; scenario < 4; scenario++) {
            softmax_case(u, spec, row_counts[i], scenario, u->tile.softmax, 0.0);
            if (u->tile.softmax_lowp != u->tile.softmax)
                softmax_case(u, spec, row_counts[i], scenario, u->tile.softmax_lowp, LOWP_P_RTOL);
        }
}

/* ------------------------------------------------------ backward kernels */

/* exp_sub: s = exp(s - sub) against float64, lanes j % 8 == 3 with sub =
 * -inf (all 0), 10% of the scores -inf, arguments of both signs. `huge`
 * puts sub near 1e30 and scores at sub (1), just below it or at -1e30 (0):
 * no NaN, no inf. Tolerance as for the softmax. */
static void exp_sub_case(const fmha_ukernels *u, const fmha_ukernels *spec, size_t rows,
                         int huge, fmha_f32_exp_sub_ukernel_fn exp_sub, double extra_rtol) {
    const size_t nr = u->tile.nr, lds = nr + 5, s_len = (rows - 1) * lds + nr;
    float *s = floats(s_len), *s_in = floats(s_len), *s_spec = floats(s_len), *sub = floats(nr);
    for (size_t j = 0; j < nr; j++)
        sub[j] = j % 8 == 3 ? -INFINITY
                 : huge     ? (float)(1e30 * tu_uniform(0.9999, 1.0))
                            : (float)tu_uniform(-5.0, 15.0);
    fill_const(s_in, s_len, SENTINEL);
    for (size_t r = 0; r < rows; r++)
        for (size_t j = 0; j < nr; j++) {
            double u01 = tu_uniform(0.0, 1.0);
            float near = sub[j] == -INFINITY ? 1e30f : sub[j];
            float sv = (float)tu_uniform(-20.0, 10.0);
            if (u01 < 0.1) sv = -INFINITY;
            else if (huge && u01 < 0.3) sv = near;                           /* exp(0) */
            else if (huge && u01 < 0.5) sv = near * (float)tu_uniform(0.999, 0.9999);
            else if (huge && u01 < 0.7) sv = -1e30f;
            s_in[r * lds + j] = sv;
        }
    memcpy(s, s_in, s_len * sizeof(float));
    memcpy(s_spec, s_in, s_len * sizeof(float));
    exp_sub(rows, s, lds, sub);

    double worst = 0.0;
    size_t clobbered = 0;
    for (size_t r = 0; r < rows; r++)
        for (size_t j = 0; j < lds && r * lds + j < s_len; j++) {
            float sv = s_in[r * lds + j], y = s[r * lds + j];
            if (j >= nr) {
                clobbered += !same_bits(y, SENTINEL);
                continue;
            }
            double x = sub[j] == -INFINITY ? -INFINITY : (double)sv - (double)sub[j];
            double e = x == -INFINITY ? 0.0 : exp(x);
            double tol = FLT_MIN + (e > 0.0 ? e * (exp_rtol(x) + extra_rtol) : 0.0);
            double ratio = isfinite(y) ? fabs((double)y - e) / tol : INFINITY;
            if (!(ratio <= worst)) worst = isnan(ratio) ? INFINITY : ratio;
        }
    const char *name = extra_rtol > 0.0 ? "exp_sub_lowp" : "exp_sub";
    tu_check(worst <= 1.0 && clobbered == 0,
             "%s %s rows=%zu%s: worst error/tolerance %.3g, %zu padding overwritten", u->isa, name,
             rows, huge ? " +-1e30" : "", worst, clobbered);

    if (spec && spec != u) {
        for (size_t j0 = 0; j0 < nr; j0 += spec->tile.nr)
            spec->tile.exp_sub(rows, s_spec + j0, lds, sub + j0);
        double worst_vs_spec = 0.0;
        for (size_t r = 0; r < rows; r++)
            for (size_t j = 0; j < nr; j++) {
                double y = s[r * lds + j], q = s_spec[r * lds + j];
                double d = fabs(y - q) / (FLT_MIN + fabs(q) * (6.0 * EPS32 + extra_rtol));
                if (!(d <= worst_vs_spec)) worst_vs_spec = isnan(d) ? INFINITY : d;
            }
        tu_check(worst_vs_spec <= 1.0, "%s %s rows=%zu%s vs scalar: worst %.3g", u->isa, name,
                 rows, huge ? " +-1e30" : "", worst_vs_spec);
    }
    free(s);
    free(s_in);
    free(s_spec);
    free(sub);
}

/* ds: dp = p (dp - dsum) against float64; two roundings, so
 * |y - ref| <= 2^-23 |p| (|dp| + |dsum|) + FLT_MIN. p must stay unchanged. */
static void ds_case(const fmha_ukernels *u, const fmha_ukernels *spec, size_t rows) {
    const size_t nr = u->tile.nr, lds = nr + 5, len = (rows - 1) * lds + nr;
    float *p = floats(len), *p_in = floats(len), *dp = floats(len), *dp_in = floats(len);
    float *dp_spec = floats(len), *dsum = floats(nr);
    fill_const(p_in, len, SENTINEL);
    fill_const(dp_in, len, SENTINEL);
    for (size_t r = 0; r < rows; r++) {
        tu_fill(p_in + r * lds, nr, 0.0, 1.0);
        tu_fill(dp_in + r * lds, nr, -2.0, 2.0);
    }
    tu_fill(dsum, nr, -1.0, 1.0);
    memcpy(p, p_in, len * sizeof(float));
    memcpy(dp, dp_in, len * sizeof(float));
    memcpy(dp_spec, dp_in, len * sizeof(float));
    u->tile.ds(rows, p, dp, lds, dsum);
    if (spec && spec != u)
        for (size_t j0 = 0; j0 < nr; j0 += spec->tile.nr)
            spec->tile.ds(rows, p_in + j0, dp_spec + j0, lds, dsum + j0);

    double worst = 0.0, worst_vs_spec = 0.0;
    size_t clobbered = 0;
    for (size_t r = 0; r < rows; r++)
        for (size_t j = 0; j < lds; j++) {
            size_t i = r * lds + j;
            if (i >= len) break;
            clobbered += !same_bits(p[i], p_in[i]);
            if (j >= nr) {
                clobbered += !same_bits(dp[i], SENTINEL);
                continue;
            }
            double ref = (double)p_in[i] * ((double)dp_in[i] - (double)dsum[j]);
            double tol = FLT_MIN + EPS32 * fabs((double)p_in[i]) *
                                       (fabs((double)dp_in[i]) + fabs((double)dsum[j]));
            double e = fabs((double)dp[i] - ref) / tol;
            double d = fabs((double)dp[i] - (double)dp_spec[i]) / tol;
            if (!(e <= worst)) worst = isnan(e) ? INFINITY : e;
            if (spec && spec != u && !(d <= worst_vs_spec))
                worst_vs_spec = isnan(d) ? INFINITY : d;
        }
    tu_check(worst <= 1.0 && worst_vs_spec <= 1.0 && clobbered == 0,
             "%s ds rows=%zu: worst error/tolerance %.3g, vs scalar %.3g, %zu values clobbered",
             u->isa, rows, worst, worst_vs_spec, clobbered);
    free(p);
    free(p_in);
    free(dp);
    free(dp_in);
    free(dp_spec);
    free(dsum);
}

static void test_backward_kernels(const fmha_ukernels *u, const fmha_ukernels *spec) {
    static const size_t row_counts[] = {1, 2, 3, 17, 64, 128, 131};
    for (size_t i = 0; i < sizeof row_counts / sizeof row_counts[0]; i++) {
        exp_sub_case(u, spec, row_counts[i], 0, u->tile.exp_sub, 0.0);
        exp_sub_case(u, spec, row_counts[i], 1, u->tile.exp_sub, 0.0);
        if (u->tile.exp_sub_lowp != u->tile.exp_sub) {
            exp_sub_case(u, spec, row_counts[i], 0, u->tile.exp_sub_lowp, LOWP_P_RTOL);
            exp_sub_case(u, spec, row_counts[i], 1, u->tile.exp_sub_lowp, LOWP_P_RTOL);
        }
        ds_case(u, spec, row_counts[i]);
    }
}

/* ------------------------------------------------- NaN and infinities */

/* IEEE class of a value: what every ISA must agree on exactly. */
enum { C_NAN, C_NEG_INF, C_POS_INF, C_ZERO, C_FINITE };
static const char *const class_names[] = {"NaN", "-inf", "+inf", "0", "finite"};

static int fclass(double x) {
    return isnan(x) ? C_NAN : x == -INFINITY ? C_NEG_INF : x == INFINITY ? C_POS_INF
                                              : x == 0.0 ? C_ZERO : C_FINITE;
}

/* got matches want: same class, and finite values within rtol. */
static int ieee_match(double got, double want, double rtol) {
    int c = fclass(want);
    if (fclass(got) != c) return 0;
    return c != C_FINITE || fabs(got - want) <= rtol * fabs(want);
}

/* max that is NaN when either operand is (IEEE maximum). */
static double max_nan(double a, double b) { return isnan(a) || isnan(b) ? NAN : a > b ? a : b; }

/* Lane patterns of the special-value softmax test, by j % N_LANE_KINDS. */
enum {
    LANE_FINITE,        /* finite scores only */
    LANE_NAN,           /* one NaN score in tile 0 */
    LANE_POS_INF,       /* one +inf score in tile 0 */
    LANE_TWO_POS_INF,   /* two +inf scores in tile 0 */
    LANE_INF_AND_NAN,   /* +inf and NaN scores in tile 0 */
    LANE_SOME_NEG_INF,  /* finite scores, a third of them -inf */
    LANE_ALL_NEG_INF,   /* every score -inf (a fully masked query) */
    LANE_NEG_INF_NAN,   /* -inf scores and one NaN in tile 1 */
    LANE_NAN_LATE,      /* finite in tile 0, one NaN in tile 1 */
    LANE_POS_INF_LATE,  /* finite in tile 0, one +inf in tile 1 */
    LANE_NEG_INF_FIRST, /* every score -inf in tile 0, finite in tile 1 */
    N_LANE_KINDS
};

static float special_score(int kind, int tile, size_t r, size_t rows, size_t mark) {
    const float finite = (float)tu_uniform(-8.0, 8.0);
    switch (kind) {
    case LANE_NAN: return tile == 0 && r == mark ? NAN : finite;
    case LANE_POS_INF: return tile == 0 && r == mark ? INFINITY : finite;
    case LANE_TWO_POS_INF:
        return tile == 0 && (r == mark || r == rows - 1 - mark) ? INFINITY : finite;
    case LANE_INF_AND_NAN:
        if (tile != 0) return finite;
        return r == mark ? INFINITY : r == (mark + rows / 2) % rows && rows > 1 ? NAN : finite;
    case LANE_SOME_NEG_INF: return r % 3 == 0 ? -INFINITY : finite;
    case LANE_ALL_NEG_INF: return -INFINITY;
    case LANE_NEG_INF_NAN: return tile == 1 && r == mark ? NAN : -INFINITY;
    case LANE_NAN_LATE: return tile == 1 && r == mark ? NAN : finite;
    case LANE_POS_INF_LATE: return tile == 1 && r == mark ? INFINITY : finite;
    case LANE_NEG_INF_FIRST: return tile == 0 ? -INFINITY : finite;
    default: return finite;
    }
}

/* Three softmax tiles of u with NaN, +inf and -inf scores in set lane
 * patterns, against the IEEE recurrence in float64 (m_new = the maximum,
 * NaN if any operand is; m_use = 0 where m_new is -inf; P = exp(s - m_use),
 * alpha = exp(m - m_use), l = l alpha + sum P) and against the scalar
 * kernel: every P, alpha, l and m in the same IEEE class, finite values
 * within 1e-5, m bit for bit unless NaN. Rows with a NaN or +inf of one
 * kind put it at a random row. */
static void softmax_special_case(const fmha_ukernels *u, const fmha_ukernels *spec, size_t rows,
                                  fmha_f32_softmax_ukernel_fn softmax, double rtol) {
    const size_t nr = u->tile.nr, lds = nr + 3, s_len = (rows - 1) * lds + nr;
    const int with_spec = spec && spec != u;
    float *s = floats(s_len), *s_in = floats(s_len), *s_spec = floats(s_len);
    float *m = floats(nr), *l = floats(nr), *alpha = floats(nr);
    float *m_spec = floats(nr), *l_spec = floats(nr), *alpha_spec = floats(nr);
    double *m_ref = doubles(nr), *l_ref = doubles(nr);
    size_t *mark = malloc(nr * sizeof *mark);
    for (size_t j = 0; j < nr; j++) {
        m[j] = m_spec[j] = -INFINITY;
        l[j] = l_spec[j] = 0.0f;
        m_ref[j] = -INFINITY;
        l_ref[j] = 0.0;
        mark[j] = (size_t)tu_int(0, (int64_t)rows - 1);
    }
    for (int tile = 0; tile < 3; tile++) {
        fill_const(s_in, s_len, SENTINEL);
        for (size_t r = 0; r < rows; r++)
            for (size_t j = 0; j < nr; j++)
                s_in[r * lds + j] = special_score((int)(j % N_LANE_KINDS), tile, r, rows, mark[j]);
        memcpy(s, s_in, s_len * sizeof(float));
        memcpy(s_spec, s_in, s_len * sizeof(float));
        softmax(rows, s, lds, m, l, alpha);
        if (with_spec)
            for (size_t j0 = 0; j0 < nr; j0 += spec->tile.nr)
                spec->tile.softmax(rows, s_spec + j0, lds, m_spec + j0, l_spec + j0,
                                  alpha_spec + j0);
        size_t bad_ref = 0, bad_spec = 0;
        for (size_t j = 0; j < nr; j++) {
            double mx = m_ref[j];
            for (size_t r = 0; r < rows; r++) mx = max_nan(mx, (double)s_in[r * lds + j]);
            const double m_use = mx == -INFINITY ? 0.0 : mx;
            const double a_ref = exp(m_ref[j] - m_use);
            double sum = 0.0;
            for (size_t r = 0; r < rows; r++) {
                const double p_ref = exp((double)s_in[r * lds + j] - m_use);
                sum += p_ref;
                int ok = ieee_match(s[r * lds + j], p_ref, rtol);
                if (!ok && bad_ref < 4)
                    printf("  %s lane %zu (kind %zu) row %zu: P %g, want %g\n", u->isa, j,
                           j % N_LANE_KINDS, r, (double)s[r * lds + j], p_ref);
                bad_ref += !ok;
                if (with_spec) bad_spec += !ieee_match(s[r * lds + j], s_spec[r * lds + j], rtol);
            }
            l_ref[j] = l_ref[j] * a_ref + sum;
            m_ref[j] = mx;
            int ok = ieee_match(alpha[j], a_ref, 1e-5) && ieee_match(l[j], l_ref[j], rtol) &&
                     (isnan(mx) ? isnan(m[j]) : same_bits(m[j], (float)mx));
            if (!ok && bad_ref < 4)
                printf("  %s lane %zu (kind %zu): m %g alpha %g l %g, want %g %g %g (%s l)\n",
                       u->isa, j, j % N_LANE_KINDS, (double)m[j], (double)alpha[j], (double)l[j],
                       mx, a_ref, l_ref[j], class_names[fclass(l_ref[j])]);
            bad_ref += !ok;
            if (with_spec)
                bad_spec += !(ieee_match(alpha[j], alpha_spec[j], 1e-5) &&
                              ieee_match(l[j], l_spec[j], rtol) &&
                              (isnan(m_spec[j]) ? isnan(m[j]) : same_bits(m[j], m_spec[j])));
        }
        tu_check(bad_ref == 0 && bad_spec == 0,
                 "%s softmax%s NaN/inf rows=%zu tile %d: %zu values off IEEE, %zu differ from "
                 "scalar",
                 u->isa, rtol > 1e-5 ? " lowp" : "", rows, tile, bad_ref, bad_spec);
    }
    free(s);
    free(s_in);
    free(s_spec);
    free(m);
    free(l);
    free(alpha);
    free(m_spec);
    free(l_spec);
    free(alpha_spec);
    free(m_ref);
    free(l_ref);
    free(mark);
}

/* exp_sub with NaN and infinite scores and sub: a lane whose sub is -inf
 * gives 0 whatever the score; otherwise exp(s - sub) as IEEE has it (NaN in,
 * NaN out; exp(+inf) = +inf; exp(-inf) = 0; overflow +inf), each value in
 * its class and within 1e-5, against float64 and the scalar kernel. */
static void exp_sub_special_case(const fmha_ukernels *u, const fmha_ukernels *spec, size_t rows,
                                 fmha_f32_exp_sub_ukernel_fn exp_sub, double rtol) {
    static const float subs[] = {-INFINITY, NAN, 0.5f, INFINITY, -3.0f};
    static const float scores[] = {NAN, INFINITY, -INFINITY, 100.0f, -100.0f, 2.0f, -7.5f};
    enum { N_SUBS = sizeof subs / sizeof subs[0], N_SCORES = sizeof scores / sizeof scores[0] };
    const size_t nr = u->tile.nr, lds = nr + 1, s_len = (rows - 1) * lds + nr;
    float *s = floats(s_len), *s_in = floats(s_len), *s_spec = floats(s_len), *sub = floats(nr);
    for (size_t j = 0; j < nr; j++) sub[j] = subs[j % N_SUBS];
    fill_const(s_in, s_len, SENTINEL);
    for (size_t r = 0; r < rows; r++)
        for (size_t j = 0; j < nr; j++) s_in[r * lds + j] = scores[(r + j / N_SUBS) % N_SCORES];
    memcpy(s, s_in, s_len * sizeof(float));
    memcpy(s_spec, s_in, s_len * sizeof(float));
    exp_sub(rows, s, lds, sub);
    const int with_spec = spec && spec != u;
    if (with_spec)
        for (size_t j0 = 0; j0 < nr; j0 += spec->tile.nr)
            spec->tile.exp_sub(rows, s_spec + j0, lds, sub + j0);
    size_t bad_ref = 0, bad_spec = 0;
    for (size_t r = 0; r < rows; r++)
        for (size_t j = 0; j < nr; j++) {
            const float x = s_in[r * lds + j];
            const double want =
                sub[j] == -INFINITY ? 0.0 : (double)(float)exp((double)x - (double)sub[j]);
            int ok = ieee_match(s[r * lds + j], want, rtol);
            if (!ok && bad_ref < 4)
                printf("  %s exp_sub(%g - %g) = %g, want %g\n", u->isa, (double)x, (double)sub[j],
                       (double)s[r * lds + j], want);
            bad_ref += !ok;
            if (with_spec) bad_spec += !ieee_match(s[r * lds + j], s_spec[r * lds + j], rtol);
        }
    tu_check(bad_ref == 0 && bad_spec == 0,
             "%s %s NaN/inf rows=%zu: %zu values off IEEE, %zu differ from scalar", u->isa,
             exp_sub == u->tile.exp_sub ? "exp_sub" : "exp_sub_lowp", rows, bad_ref, bad_spec);
    free(s);
    free(s_in);
    free(s_spec);
    free(sub);
}

/* ds with NaN, infinities and zeros in p, dp and dsum: p (dp - dsum) as
 * IEEE has it (0 inf = NaN, inf - inf = NaN), class for class and within
 * 1e-6, against float64 and the scalar kernel. */
static void ds_special_case(const fmha_ukernels *u, const fmha_ukernels *spec, size_t rows) {
    static const float vals[] = {NAN, INFINITY, -INFINITY, 0.0f, 0.75f, -2.0f, 1e30f};
    enum { N_VALS = sizeof vals / sizeof vals[0] };
    const size_t nr = u->tile.nr, lds = nr, len = rows * nr;
    float *p = floats(len), *dp = floats(len), *dp_in = floats(len), *dp_spec = floats(len);
    float *dsum = floats(nr);
    for (size_t j = 0; j < nr; j++) dsum[j] = vals[j % N_VALS];
    for (size_t r = 0; r < rows; r++)
        for (size_t j = 0; j < nr; j++) {
            p[r * lds + j] = vals[(j / N_VALS) % N_VALS];
            dp_in[r * lds + j] = vals[(r + j / (N_VALS * N_VALS)) % N_VALS];
        }
    memcpy(dp, dp_in, len * sizeof(float));
    memcpy(dp_spec, dp_in, len * sizeof(float));
    u->tile.ds(rows, p, dp, lds, dsum);
    const int with_spec = spec && spec != u;
    if (with_spec)
        for (size_t j0 = 0; j0 < nr; j0 += spec->tile.nr)
            spec->tile.ds(rows, p + j0, dp_spec + j0, lds, dsum + j0);
    size_t bad_ref = 0, bad_spec = 0;
    for (size_t i = 0; i < len; i++) {
        const float d = dp_in[i] - dsum[i % nr];
        const double want = (double)(p[i] * d);
        bad_ref += !ieee_match(dp[i], want, 1e-6);
        if (with_spec) bad_spec += !ieee_match(dp[i], dp_spec[i], 1e-6);
    }
    tu_check(bad_ref == 0 && bad_spec == 0,
             "%s ds NaN/inf rows=%zu: %zu values off IEEE, %zu differ from scalar", u->isa, rows,
             bad_ref, bad_spec);
    free(p);
    free(dp);
    free(dp_in);
    free(dp_spec);
    free(dsum);
}

static void test_special_values(const fmha_ukernels *u, const fmha_ukernels *spec) {
    static const size_t row_counts[] = {1, 2, 3, 17, 64, 131};
    for (size_t i = 0; i < sizeof row_counts / sizeof row_counts[0]; i++) {
        softmax_special_case(u, spec, row_counts[i], u->tile.softmax, 1e-5);
        if (u->tile.softmax_lowp != u->tile.softmax)
            softmax_special_case(u, spec, row_counts[i], u->tile.softmax_lowp, 1e-5 + LOWP_P_RTOL);
        exp_sub_special_case(u, spec, row_counts[i], u->tile.exp_sub, 1e-5);
        if (u->tile.exp_sub_lowp)
            exp_sub_special_case(u, spec, row_counts[i], u->tile.exp_sub_lowp, 1e-5 + LOWP_P_RTOL);
        ds_special_case(u, spec, row_counts[i]);
    }
}

/* ----------------------------------------------------------------- exp */
#if FMHA_HAVE_X86 || defined(__aarch64__)

typedef void (*exp_fn)(size_t n, const float *x, float *y);

/* |y - e| in float32 ulps of e (e a normal float32 magnitude). */
static double ulp_error(float y, double e) {
    return fabs((double)y - e) / ldexp(1.0, ilogb(e) - 23);
}

/* exp over [-87, 88.7] within 2 ulp; below, subnormal or 0 results within
 * FLT_MIN of the truth and never negative or NaN; from -104 down (and -inf)
 * 0 or the smallest subnormals; +inf above the float range; NaN for NaN. */
static void test_exp(const char *isa, exp_fn f) {
    const size_t n = 200003; /* not a multiple of any vector width */
    float *x = floats(n), *y = floats(n);
    for (size_t i = 0; i < n; i++)
        x[i] = i % 2 ? (float)tu_uniform(-87.0, 88.7) : (float)(-87.0 + 175.7 * (double)i / n);
    f(n, x, y);
    double worst = 0.0;
    for (size_t i = 0; i < n; i++) {
        double e = ulp_error(y[i], exp((double)x[i]));
        if (!(e <= worst)) worst = isnan(e) ? INFINITY : e;
    }
    tu_check(worst <= 2.0, "%s exp on [-87, 88.7]: worst error %.3g ulp (limit 2)", isa, worst);
    printf("%s exp on [-87, 88.7]: worst error %.3f ulp\n", isa, worst);

    size_t bad_low = 0;
    for (size_t i = 0; i < n; i++) x[i] = (float)(-87.0 - 33.0 * (double)i / n);
    f(n, x, y);
    for (size_t i = 0; i < n; i++) {
        double e = exp((double)x[i]);
        int ok = isfinite(y[i]) && y[i] >= 0.0f && fabs((double)y[i] - e) <= FLT_MIN &&
                 (e >= FLT_MIN ? ulp_error(y[i], e) <= 2.0 : 1) &&
                 (x[i] > -104.0f || y[i] <= 0x1p-148f);
        bad_low += !ok;
    }
    tu_check(bad_low == 0, "%s exp on [-120, -87]: %zu results wrong", isa, bad_low);

    static const float specials_in[] = {-INFINITY, -FLT_MAX, -1e30f, -1e5f, -150.0f,
                                        -104.0f,   0.0f,     -0.0f,  88.72f, 89.0f,
                                        1e30f,     INFINITY, NAN,    -NAN};
    enum { n_specials = sizeof specials_in / sizeof specials_in[0] };
    float ys[n_specials];
    f(n_specials, specials_in, ys);
    size_t bad_special = 0;
    for (size_t i = 0; i < n_specials; i++) {
        float xv = specials_in[i], yv = ys[i];
        int ok;
        if (isnan(xv)) ok = isnan(yv);
        else if (xv <= -104.0f) ok = yv >= 0.0f && yv <= 0x1p-148f;
        else if (xv == 0.0f) ok = yv == 1.0f;
        else if (xv < 88.722f) ok = isfinite(yv) && ulp_error(yv, exp((double)xv)) <= 2.0;
        else ok = yv == INFINITY;
        if (!ok) printf("%s exp(%g) = %g\n", isa, (double)xv, (double)yv);
        bad_special += !ok;
    }
    tu_check(bad_special == 0, "%s exp at special points: %zu wrong", isa, bad_special);
    free(x);
    free(y);
}
#endif

/* The optional transpose-add kernel against its definition, st[r][i] +=
 * src[i * q_stride + r], at edge sizes of both dimensions: exact (one add per
 * element), untouched past nk rows, and padding lanes past nq only get + 0. */
static void test_add_transposed(const fmha_ukernels *u) {
    if (!u->rows.add_transposed) return;
    const size_t nks[] = {1, 5, 15, 16, 17, 33, 64, 128}, nqs[] = {1, 7, 16, 31, 47, 64};
    size_t nr = u->tile.nr, lds = nr + 3;
    for (size_t a = 0; a < sizeof nks / sizeof *nks; a++)
        for (size_t b = 0; b < sizeof nqs / sizeof *nqs; b++) {
            size_t nk = nks[a], nq = nqs[b];
            if (nq > nr) continue;
            ptrdiff_t q_stride = (ptrdiff_t)nk + (ptrdiff_t)tu_int(0, 9);
            size_t src_n = (size_t)q_stride * (nq - 1) + nk, st_n = (nk + 2) * lds;
            float *src = malloc(src_n * sizeof(float)), *st = malloc(st_n * sizeof(float));
            float *want = malloc(st_n * sizeof(float));
            tu_fill(src, src_n, -4, 4);
            tu_fill(st, st_n, -4, 4);
            memcpy(want, st, st_n * sizeof(float));
            for (size_t r = 0; r < nk; r++)
                for (size_t i = 0; i < nq; i++) want[r * lds + i] += src[(ptrdiff_t)i * q_stride + (ptrdiff_t)r];
            u->rows.add_transposed(nk, nq, src, q_stride, st, lds);
            int ok = 1;
            for (size_t e = 0; e < st_n; e++) {
                size_t r = e / lds, i = e % lds;
                /* lanes nq..NR of rows < nk may only have had 0 added */
                ok &= st[e] == want[e] || (r < nk && i >= nq && i < nr && st[e] == want[e] + 0.0f);
            }
            tu_check(ok, "%s: add_transposed nk=%zu nq=%zu q_stride=%td differs from its definition", u->isa,
                     nk, nq, q_stride);
            free(src);
            free(st);
            free(want);
        }
}

/* The optional forward epilogue against its specification: the same bits
 * (one multiplication each), nothing written past rows x cols, and the
 * rows holding a NaN or an infinity (one planted in some rows) reported. */
static void test_finish(const fmha_ukernels *u) {
    if (!u->rows.finish) return;
    const size_t rowss[] = {1, 7, 16, 17, 40, 64}, colss[] = {1, 15, 16, 33, 64, 100};
    for (size_t a = 0; a < sizeof rowss / sizeof *rowss; a++)
        for (size_t c = 0; c < sizeof colss / sizeof *colss; c++) {
            size_t rows = rowss[a], cols = colss[c];
            if (rows > u->tile.nr) continue;
            size_t ldt = u->tile.nr, ldo = cols + (size_t)tu_int(0, 5), o_n = (rows + 1) * ldo;
            /* ot [cols][ldt], scale [rows], o [rows + 1][ldo] (one spare row) */
            float *ot = malloc(cols * ldt * sizeof(float)), scale[64];
            float *got = malloc(o_n * sizeof(float)), *want = malloc(o_n * sizeof(float));
            tu_fill(ot, cols * ldt, -4, 4);
            tu_fill(scale, rows, 0, 2);
            for (size_t i = 0; i < rows; i += 5) /* a non-finite output in some rows */
                ot[(size_t)tu_int(0, (int)cols - 1) * ldt + i] = i % 10 ? NAN : INFINITY;
            if (rows > 3) scale[3] = INFINITY;
            for (size_t e = 0; e < o_n; e++) got[e] = want[e] = -7.0f;
            uint64_t bad_want = fmha_f32_finish_ukernel__scalar(rows, cols, ot, ldt, scale, want, ldo);
            uint64_t bad_got = u->rows.finish(rows, cols, ot, ldt, scale, got, ldo);
            int same = 1;
            for (size_t e = 0; e < o_n; e++) same &= !memcmp(&got[e], &want[e], sizeof(float)) ||
                                                     (isnan(got[e]) && isnan(want[e]));
            tu_check(same && bad_got == bad_want && bad_want != 0, "%s: finish rows=%zu cols=%zu differs from its "
                     "specification (rows flagged %llx, want %llx)", u->isa, rows, cols,
                     (unsigned long long)bad_got, (unsigned long long)bad_want);
            free(ot), free(got), free(want);
        }
}

/* The optional transposing copy against its specification: exact, and
 * nothing written outside rows x cols of dst. */
static void test_transpose(const fmha_ukernels *u) {
    if (!u->rows.transpose) return;
    const size_t rowss[] = {1, 7, 16, 17, 64}, colss[] = {1, 15, 16, 33, 128};
    for (size_t a = 0; a < sizeof rowss / sizeof *rowss; a++)
        for (size_t c = 0; c < sizeof colss / sizeof *colss; c++) {
            size_t rows = rowss[a], cols = colss[c], lds = cols + (size_t)tu_int(0, 5), ldd = rows + 3;
            size_t dst_n = (cols + 1) * ldd;
            /* src [rows][lds], dst [cols + 1][ldd] (one spare row) */
            float *src = malloc(rows * lds * sizeof(float));
            float *got = malloc(dst_n * sizeof(float)), *want = malloc(dst_n * sizeof(float));
            tu_fill(src, rows * lds, -4, 4);
            for (size_t e = 0; e < dst_n; e++) got[e] = want[e] = -7.0f;
            fmha_f32_transpose_ukernel__scalar(rows, cols, src, lds, want, ldd);
            u->rows.transpose(rows, cols, src, lds, got, ldd);
            tu_check(!memcmp(got, want, dst_n * sizeof(float)), "%s: transpose rows=%zu cols=%zu differs from its "
                     "specification", u->isa, rows, cols);
            free(src), free(got), free(want);
        }
}

/* The weighted sum y += a x against its specification, bit for bit (one
 * rounding each: values whose products round, NaN and inf included);
 * nothing written past n. */
static void test_axpy(const fmha_ukernels *u) {
    const size_t ns[] = {0, 1, 15, 16, 17, 64, 100, 131};
    for (size_t t = 0; t < sizeof ns / sizeof *ns; t++) {
        const size_t n = ns[t];
        float x[136], got[136], want[136];
        tu_fill(x, 136, -3, 3);
        tu_fill(want, 136, -3, 3);
        if (n > 2) x[1] = INFINITY, want[2] = NAN;
        memcpy(got, want, sizeof got);
        const float a = (float)tu_uniform(-2, 2);
        fmha_f32_axpy_ukernel__scalar(n, a, x, want);
        u->rows.axpy(n, a, x, got);
        tu_check(!memcmp(got, want, sizeof got), "%s: axpy n=%zu differs from its specification", u->isa, n);
    }
}

/* The per-column scaling and the NaN / infinity check against their
 * specifications: bits for the scaling (NaN and inf among the values and
 * the scales), nothing written past n columns or outside the rows; the
 * check on a lone NaN or inf at every place, and none past n. */
static void test_columns(const fmha_ukernels *u) {
    const size_t ns[] = {0, 1, 15, 16, 17, 33, 64, 100};
    for (size_t t = 0; t < sizeof ns / sizeof *ns; t++) {
        const size_t n = ns[t], rows = 3, ldx = 104;
        float sc[104], got[3 * 104], want[3 * 104];
        tu_fill(sc, 104, -4, 4);
        tu_fill(want, 3 * 104, -3, 3);
        if (n > 3) sc[2] = INFINITY, want[ldx + 1] = NAN, want[2 * ldx + 3] = -INFINITY;
        memcpy(got, want, sizeof got);
        fmha_f32_scale_columns_ukernel__scalar(rows, n, sc, want, ldx);
        u->rows.scale_columns(rows, n, sc, got, ldx);
        tu_check(!memcmp(got, want, sizeof got), "%s: scale_columns n=%zu differs from its specification", u->isa, n);
        float x[3 * 104];
        tu_fill(x, 3 * 104, -1e30, 1e30);
        tu_check(!u->rows.nonfinite(rows, n, x, ldx), "%s: nonfinite n=%zu on finite values", u->isa, n);
        for (size_t r = 0; r < rows; r++)
            for (size_t j = 0; j < n; j++) {
                const float bad[] = {NAN, INFINITY, -INFINITY};
                const float keep = x[r * ldx + j];
                x[r * ldx + j] = bad[(r + j) % 3];
                tu_check(u->rows.nonfinite(rows, n, x, ldx) == 1 && fmha_f32_nonfinite_ukernel__scalar(rows, n, x, ldx) == 1,
                         "%s: nonfinite n=%zu misses row %zu column %zu", u->isa, n, r, j);
                x[r * ldx + j] = keep;
            }
        x[n] = NAN; /* past the columns */
        tu_check(!u->rows.nonfinite(rows, n, x, ldx), "%s: nonfinite n=%zu reads past its columns", u->isa, n);
    }
}

/* The optional 16-bit pairing kernel against its specification, bit for
 * bit (random bit patterns, NaN payloads included), with and without the
 * high row; nothing written past n. */
static void test_interleave(const fmha_ukernels *u) {
    if (!u->rows.interleave_u16) return;
    const size_t ns[] = {0, 1, 15, 16, 17, 64, 100, 256};
    for (size_t a = 0; a < sizeof ns / sizeof *ns; a++)
        for (int with_hi = 0; with_hi < 2; with_hi++) {
            size_t n = ns[a];
            uint16_t lo[256], hi[256];
            uint32_t got[260], want[260];
            for (size_t i = 0; i < 256; i++) {
                lo[i] = (uint16_t)tu_int(0, 0xffff);
                hi[i] = (uint16_t)tu_int(0, 0xffff);
            }
            for (size_t i = 0; i < 260; i++) got[i] = want[i] = 0xdeadbeefu;
            fmha_u16_interleave_ukernel__scalar(n, lo, with_hi ? hi : NULL, want);
            u->rows.interleave_u16(n, lo, with_hi ? hi : NULL, got);
            tu_check(!memcmp(got, want, sizeof got), "%s: interleave_u16 n=%zu%s differs from its specification",
                     u->isa, n, with_hi ? "" : " (no high row)");
        }
}

#if defined(__aarch64__)
/* FPCR (aarch64): read, and set for the calling thread. */
static uint64_t fpcr_get(void) {
    uint64_t x;
    __asm__ volatile("mrs %0, fpcr" : "=r"(x));
    return x;
}
static void fpcr_set(uint64_t x) { __asm__ volatile("msr fpcr, %0" : : "r"(x)); }
#endif

/* The optional float32 -> bf16 kernel against its specification, bit for
 * bit: ties both ways, the largest finite values (rounding to inf),
 * subnormals, infinities and NaNs with payloads; nothing written past n. On
 * aarch64 also with FPCR.FZ set (a caller's flush-to-zero, as XLA's threads
 * run): the specification keeps subnormals in integer arithmetic, so a
 * kernel on BFCVTN, which would flush them, must not use it then. */
static void test_to_bf16_once(const fmha_ukernels *u, const char *env);

static void test_to_bf16(const fmha_ukernels *u) {
    if (!u->rows.to_bf16) return;
    test_to_bf16_once(u, "default FPCR");
#if defined(__aarch64__)
    const uint64_t fpcr = fpcr_get();
    fpcr_set(fpcr | (uint64_t)1 << 24); /* FZ */
    test_to_bf16_once(u, "FPCR.FZ set");
    fpcr_set(fpcr);
#endif
}

static void test_to_bf16_once(const fmha_ukernels *u, const char *env) {
    static const uint32_t special[] = {0x00000000u, 0x80000000u, 0x3f808000u, 0x3f818000u, 0x3f80ffffu,
                                       0x7f7fffffu, 0xff7f8000u, 0x7f7f7fffu, 0x00000001u, 0x807fffffu,
                                       0x00008000u, 0x7f800000u, 0xff800000u, 0x7fc00000u, 0xffc00001u,
                                       0x7f800001u, 0x7fbfffffu, 0xff80ffffu};
    const size_t ns[] = {0, 1, 15, 16, 17, 33, 100};
    for (size_t a = 0; a < sizeof ns / sizeof *ns; a++) {
        size_t n = ns[a];
        float src[100];
        uint16_t got[104], want[104];
        tu_fill(src, 100, -3, 3);
        for (size_t i = 0; i < n; i++)
            if (tu_int(0, 2) == 0) {
                uint32_t w = special[tu_int(0, (int64_t)(sizeof special / sizeof *special) - 1)];
                memcpy(&src[i], &w, sizeof w);
            }
        for (size_t i = 0; i < 104; i++) got[i] = want[i] = 0xabcd;
        fmha_f32_to_bf16_ukernel__scalar(n, src, want);
        u->rows.to_bf16(n, src, got);
        tu_check(!memcmp(got, want, sizeof got), "%s: to_bf16 n=%zu (%s) differs from its specification", u->isa, n,
                 env);
    }
}

/* Composition's fallbacks (ukernel.h): a table of a tile part alone gets
 * the scalar row kernels and cache loads, its exact softmax and exp_sub as
 * the low-precision ones, and no bf16, decode or in-place cache kernels; a
 * partial bf16 part, or a decode part without the float32 format's
 * kernels, counts as none. */
static void test_compose(void) {
    const fmha_ukernels *spec = fmha_cpu_kernels_for("scalar");
    fmha_uk_tile tile = spec->tile;
    tile.softmax_lowp = NULL;
    tile.exp_sub_lowp = NULL;
    fmha_uk_bf16 partial = {0};
    partial.pair_rows = spec->bf16.pair_rows; /* NULL too: the scalar ISA has no bf16 part */
    fmha_uk_decode decode = spec->decode;
    fmha_isa_parts parts = {.isa = "tile only", .tile = &tile, .bf16 = &partial, .decode = &decode};
    fmha_ukernels u;
    fmha_ukernels_compose(&parts, &u);
    tu_check(!strcmp(u.isa, "tile only") && u.tile.gemm == spec->tile.gemm && u.tile.softmax_lowp == u.tile.softmax &&
                 u.tile.exp_sub_lowp == u.tile.exp_sub,
             "compose: the tile part, its exact kernels as the low-precision ones");
    tu_check(!memcmp(&u.rows, &spec->rows, sizeof u.rows), "compose: the scalar row kernels");
    tu_check(!u.bf16.gemm && !u.bf16.pair_rows && !u.decode.softmax && !u.thread.begin && !u.thread.end && !u.thread.foreign,
             "compose: no bf16 part, no decode without the float32 format's kernels, no thread hooks");
    for (int f = 0; f < FMHA_FORMAT_COUNT; f++)
        tu_check(u.cache[f].load == spec->cache[f].load && !u.cache[f].scores && !u.cache[f].values,
                 "compose: format %d loads with the scalar kernel, no in-place kernels", f);
}

/* The float32 tile shapes the table's tile part lists besides its own
 * (avx512's 12 x 32, 14 x 32: a tuning's tile_mr x tile_nr), each held to
 * the specification once (the tables on one tile part share them), on the
 * float32 table of a trial under that shape. */
static void test_tile_shapes(const fmha_isa *isa, const fmha_ukernels *spec) {
    static fmha_f32_gemm_ukernel_fn seen[16];
    static size_t n_seen;
    const fmha_uk_tile *t;
    for (size_t i = 1; (t = fmha_cpu_f32_tile_at(isa->table, i)) != NULL; i++) {
        int done = 0;
        for (size_t j = 0; j < n_seen; j++) done |= seen[j] == t->gemm;
        if (done || n_seen == sizeof seen / sizeof seen[0]) continue;
        seen[n_seen++] = t->gemm;
        static fmha_trial trial;
        if (!tu_check(tu_isa_shape(isa, i, &trial) == 0, "%s: a trial on float32 tile %zux%zu", isa->name, t->mr,
                      t->nr))
            continue;
        const fmha_ukernels *u = trial.ctx.f32;
        printf("%s float32 tile %zux%zu: block_kv=%zu\n", isa->name, u->tile.mr, u->tile.nr, u->tile.block_kv);
        tu_check(u->tile.mr == t->mr && u->tile.nr == t->nr && u->tile.nr % 16 == 0 && u->tile.gemm == t->gemm &&
                     u->tile.softmax && u->tile.exp_sub && u->tile.ds && !t->shapes && !u->bf16.gemm &&
                     !u->matrix.forward,
                 "%s float32 tile %zux%zu: table fields (no shapes of its own, no bf16 or matrix part)", isa->name,
                 t->mr, t->nr);
        test_gemm(u, spec);
        test_softmax(u, spec);
        test_backward_kernels(u, spec);
        test_special_values(u, spec);
    }
}

int main(void) {
    tu_seed();
    const fmha_ukernels *spec = fmha_cpu_kernels_for("scalar");
    test_compose();
    /* every ISA of the registry that this CPU runs */
    for (size_t i = 0; i < fmha_isa_count(); i++) {
        const fmha_isa *isa = fmha_isa_at(i);
        const fmha_ukernels *u = isa->table;
        if (!tu_isa_runs(isa)) {
            printf("%s: not run here (unsupported, or another table has its kernels), skipped\n", isa->name);
            continue;
        }
        printf("%s: MR=%zu NR=%zu block_kv=%zu\n", u->isa, u->tile.mr, u->tile.nr, u->tile.block_kv);
        tu_check(!strcmp(u->isa, isa->name) && fmha_cpu_kernels_for(isa->name) == u &&
                     u->tile.mr >= 1 && u->tile.nr % 16 == 0 && u->tile.block_kv >= 1 && u->tile.gemm &&
                     u->tile.softmax && u->tile.exp_sub && u->tile.ds,
                 "%s: table fields", isa->name);
        test_gemm(u, spec);
        test_softmax(u, spec);
        test_backward_kernels(u, spec);
        test_special_values(u, spec);
        test_tile_shapes(isa, spec);
        test_add_transposed(u);
        test_finish(u);
        test_transpose(u);
        test_axpy(u);
        test_columns(u);
        test_to_bf16(u);
        test_interleave(u);
#if FMHA_HAVE_X86
        if (!strcmp(u->isa, "avx2")) test_exp("avx2", fmha_f32_exp__avx2);
        if (!strcmp(u->isa, "avx512")) test_exp("avx512", fmha_f32_exp__avx512);
#elif defined(__aarch64__)
        if (!strcmp(u->isa, "neon")) test_exp("neon", fmha_f32_exp__neon);
#if FMHA_HAVE_SVE
        if (!strcmp(u->isa, "sve")) test_exp("sve", fmha_f32_exp__sve);
#endif
#endif
    }
    return tu_finish();
}
