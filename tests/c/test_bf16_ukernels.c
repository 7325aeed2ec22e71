/* test_bf16_ukernels.c: the bf16 microkernels of every registered table
 * that has them (and this CPU runs), and their scalar specifications
 * (src/uk/scalar/bf16.c) themselves: the pair-packed GEMM against a float64
 * computation on the same bf16 inputs at every m, several pair counts, every
 * mode and both stride patterns, with NaN padding and sentinels around C,
 * and against the scalar specification; the pair-row kernel bit for bit
 * against the scalar round-to-nearest-even (ties, carries into the next
 * binade, overflow, infinities, NaN, signed zeros, subnormals), with and
 * without a high row; the split pair-row kernel against its specification;
 * the row-packing kernel half for half against the same rounding, at every
 * length up to NR + 3, with sentinels past each row's pairs; the scalar
 * rounding against hand-worked values; the fused softmax step bit for bit
 * against the softmax and pair-row kernels it fuses. Tables with Arm BFDOT's
 * arithmetic (neonbf16) are held to its specification bit for bit, on
 * operands of every class too, after that specification's own hand-worked
 * cases; the zero halves kernels make, and the registry's choice. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/cpu.h"
#include "test_util.h"
#include "uk/scalar/bf16.h"
#include "uk/ukernel.h"

#define SENTINEL 1234.5678f    /* never a kernel output here */
#define NAN_PAIR 0x7FC07FC0u   /* a pair of bf16 quiet NaNs: padding of A and B */
#define SENTINEL_WORD 0xA5A5A5A5u

enum { SPEC_MR = FMHA_SCALAR_BF16_MR, SPEC_NR = FMHA_SCALAR_BF16_NR };

/* The scalar specifications as tables of their own, so the same cases run
 * on them and on the registered tables: vdpbf16ps's arithmetic, and Arm
 * BFDOT's (round to odd, flushes, the default NaN). */
#define SPEC_TABLE(NAME, GEMM)                                                                                         \
    {                                                                                                                  \
        .isa = NAME, .tile = {.mr = SPEC_MR, .nr = SPEC_NR},                                                           \
        .bf16 = {.mr = SPEC_MR,                                                                                        \
                 .gemm = GEMM,                                                                                         \
                 .pair_rows = fmha_bf16_pair_rows_ukernel_16__scalar,                                                  \
                 .pair_rows_split = fmha_bf16_pair_rows_split_ukernel_16__scalar,                                      \
                 .pack_rows = fmha_bf16_pack_rows_ukernel__scalar},                                                    \
    }
static const fmha_ukernels bf16_spec = SPEC_TABLE("scalar spec", fmha_bf16_gemm_ukernel_4x16__scalar);
static const fmha_ukernels bf16_spec_arm = SPEC_TABLE("scalar arm spec", fmha_bf16_gemm_ukernel_4x16__arm);

/* Does u's GEMM have Arm BFDOT's arithmetic (the neonbf16 table and its
 * specification)? Its specification is then fmha_bf16_gemm_ukernel_4x16__arm,
 * bit for bit, and each rounding errs by up to an ulp (to odd), not half. */
static int arm_arithmetic(const fmha_ukernels *u) {
    return u == &bf16_spec_arm || !strcmp(u->isa, "neonbf16");
}

static void *alloc(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) {
        fprintf(stderr, "out of memory\n");
        exit(2);
    }
    return p;
}

static uint32_t float_bits(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

static float bits_float(uint32_t u) {
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

static int same_bits(float x, float y) { return float_bits(x) == float_bits(y); }

static double bf16_value(uint16_t h) { return (double)fmha_bf16_widen__scalar(h); }

/* The pair-row specification over nr lanes (a multiple of 16). */
static void spec_pair_rows(size_t nr, const float *lo, const float *hi, uint32_t *dst) {
    for (size_t j = 0; j < nr; j += SPEC_NR)
        fmha_bf16_pair_rows_ukernel_16__scalar(lo + j, hi ? hi + j : NULL, dst + j);
}

/* float64 reference of the GEMM over nr lanes: ref = init + ab_scale * sum
 * over 2 kp products, init = 0, C or C * col_scale by mode; mag = |init| +
 * |ab_scale| sum |product|, the scale of the rounding error of any float32
 * order. */
static void gemm_float64(size_t m, size_t nr, size_t kp, const uint32_t *a, ptrdiff_t a_rs,
                         ptrdiff_t a_cs, const uint32_t *b, size_t ldb, const float *c, size_t ldc,
                         int mode, const float *col_scale, float ab_scale, double *ref,
                         double *mag) {
    for (size_t r = 0; r < m; r++)
        for (size_t j = 0; j < nr; j++) {
            double c0 = c[r * ldc + j];
            double init = mode == FMHA_UK_STORE        ? 0.0
                          : mode == FMHA_UK_ACCUMULATE ? c0
                                                       : c0 * (double)col_scale[j];
            double sum = 0.0, sum_abs = 0.0;
            for (size_t p = 0; p < kp; p++) {
                uint32_t wa = a[(ptrdiff_t)r * a_rs + (ptrdiff_t)p * a_cs], wb = b[p * ldb + j];
                double lo = bf16_value((uint16_t)wa) * bf16_value((uint16_t)wb);
                double hi = bf16_value((uint16_t)(wa >> 16)) * bf16_value((uint16_t)(wb >> 16));
                sum += lo + hi;
                sum_abs += fabs(lo) + fabs(hi);
            }
            ref[r * nr + j] = init + (double)ab_scale * sum;
            mag[r * nr + j] = fabs(init) + fabs((double)ab_scale) * sum_abs;
        }
}

/* -------------------------------------------------------- bf16 rounding */

/* Inputs with a known rounding, as float32 bit patterns, and the bf16 bits
 * of round-to-nearest-even worked out by hand. */
static const struct {
    uint32_t in;
    uint16_t want;
} special_cases[] = {
    {0x3F800000u, 0x3F80u}, /* 1.0, exact */
    {0x3F808000u, 0x3F80u}, /* tie between 0x3F80 (even) and 0x3F81: down */
    {0x3F818000u, 0x3F82u}, /* tie between 0x3F81 (odd) and 0x3F82: up */
    {0xBF808000u, 0xBF80u}, /* negative tie: down in magnitude */
    {0xBF818000u, 0xBF82u}, /* negative tie: up in magnitude */
    {0x3F808001u, 0x3F81u}, /* just above a tie: up */
    {0x3F807FFFu, 0x3F80u}, /* just below a tie: down */
    {0x3FFFFFFFu, 0x4000u}, /* carries into the next binade: 2.0 */
    {0x3FFF8000u, 0x4000u}, /* tie with odd mantissa at the binade top: 2.0 */
    {0xBF7F8000u, 0xBF80u}, /* negative tie carrying into -1.0 */
    {0x7F7FFFFFu, 0x7F80u}, /* FLT_MAX: rounds up to +inf */
    {0x7F7F8000u, 0x7F80u}, /* tie at the top, odd: +inf */
    {0x7F7F7FFFu, 0x7F7Fu}, /* just below that tie: largest finite bf16 */
    {0xFF7FFFFFu, 0xFF80u}, /* -FLT_MAX: -inf */
    {0x7F800000u, 0x7F80u}, /* +inf */
    {0xFF800000u, 0xFF80u}, /* -inf */
    {0x7FC00000u, 0x7FC0u}, /* quiet NaN */
    {0xFFC00000u, 0xFFC0u}, /* negative quiet NaN */
    {0x7F800001u, 0x7FC0u}, /* signalling NaN whose payload is all in the low half */
    {0xFF800001u, 0xFFC0u}, /* negative of that */
    {0x7FFFFFFFu, 0x7FFFu}, /* NaN that a naive rounding would carry into the sign */
    {0xFFFFFFFFu, 0xFFFFu}, /* negative NaN with all payload bits */
    {0x00000000u, 0x0000u}, /* +0 */
    {0x80000000u, 0x8000u}, /* -0 */
    {0x00800000u, 0x0080u}, /* smallest normal */
    {0x80808000u, 0x8080u}, /* negative tiny normal tie: down */
    {0x00000001u, 0x0000u}, /* smallest subnormal */
    {0x007FFFFFu, 0x0080u}, /* largest subnormal (RNE: smallest normal) */
    {0x807FFFFFu, 0x8080u}, /* its negative */
    {0x00408000u, 0x0040u}, /* subnormal tie */
    {0x40490FDBu, 0x4049u}, /* pi */
    {0xC2F6E979u, 0xC2F7u}, /* -123.456 */
};
enum { N_SPECIAL = sizeof special_cases / sizeof special_cases[0] };

/* The scalar rounding against the hand-worked values. */
static void test_round_spec(void) {
    size_t wrong = 0;
    for (size_t i = 0; i < N_SPECIAL; i++) {
        uint16_t got = fmha_bf16_round__scalar(bits_float(special_cases[i].in));
        if (got != special_cases[i].want) {
            printf("  bf16 round 0x%08X -> 0x%04X, want 0x%04X\n", (unsigned)special_cases[i].in,
                   got, special_cases[i].want);
            wrong++;
        }
    }
    tu_check(wrong == 0, "scalar bf16 rounding: %zu of %d hand-worked values wrong", wrong,
             (int)N_SPECIAL);
}

/* Arm's BFDotAdd against hand-worked results: each row is acc, the words
 * a and b (low half: element 2p), and the bits wanted. */
static const struct {
    uint32_t acc, a, b, want;
    const char *what;
} bfdot_cases[] = {
    {0x3F800000u, 0x3300u, 0x3F80u, 0x3F800001u, "1 + 2^-25: inexact, to odd (nearest even gives 1)"},
    {0x3F800000u, 0xB300u, 0x3F80u, 0x3F7FFFFFu, "1 - 2^-25: between 1 - 2^-24 (odd) and 1"},
    {0x4E800000u, 0xB080u, 0x3F80u, 0x4E7FFFFFu, "2^30 - 2^-30: the float below 2^30, odd"},
    {0x7F7FFFFFu, 0x7300u, 0x3F80u, 0x7F7FFFFFu, "FLT_MAX + 2^103 (a tie): stays finite and odd"},
    {0x7F7FFFFFu, 0x7380u, 0x3F80u, 0x7F800000u, "FLT_MAX + 2^104 = 2^128: infinity"},
    {0x00000000u, 0x7F00u, 0x4000u, 0x7F800000u, "product 2^127 x 2 overflows to infinity"},
    {0x3F800000u, 0x0D80u, 0x3080u, 0x3F800000u, "product 2^-130 flushed: 1 exactly"},
    {0x3F800000u, 0x0040u, 0x7180u, 0x3F800000u, "subnormal bf16 input flushed: 1 exactly"},
    {0x00000001u, 0x8000u, 0x3F80u, 0x00000000u, "subnormal accumulator flushed: +0"},
    {0x80000000u, 0x80008000u, 0x3F803F80u, 0x80000000u, "-0 + (-0 + -0): -0"},
    {0x3F800000u, 0xBF80u, 0x3F80u, 0x00000000u, "1 - 1: +0"},
    {0x3F800000u, 0xFFC1u, 0x3F80u, 0x7FC00000u, "a NaN gives the default NaN"},
    {0x7FC12345u, 0x3F80u, 0x3F80u, 0x7FC00000u, "a NaN accumulator too"},
    {0x3F800000u, 0x7F80u, 0x0000u, 0x7FC00000u, "inf x 0: the default NaN"},
    {0x3F800000u, 0x7F807F80u, 0xBF803F80u, 0x7FC00000u, "-inf + inf: the default NaN"},
    {0xFF800000u, 0x7F80u, 0x3F80u, 0x7FC00000u, "acc -inf + inf: the default NaN"},
    {0x40400000u, 0x3F803FC0u, 0x40003F80u, 0x40D00000u, "3 + (1.5 + 2) = 6.5 exactly"},
};
enum { N_BFDOT = sizeof bfdot_cases / sizeof bfdot_cases[0] };

static void test_bfdot_spec(void) {
    size_t wrong = 0;
    for (size_t i = 0; i < N_BFDOT; i++) {
        uint32_t got = float_bits(fmha_bf16_dot_add__arm(bits_float(bfdot_cases[i].acc), bfdot_cases[i].a,
                                                          bfdot_cases[i].b));
        if (got != bfdot_cases[i].want) {
            printf("  BFDotAdd %s: 0x%08X, want 0x%08X\n", bfdot_cases[i].what, (unsigned)got,
                   (unsigned)bfdot_cases[i].want);
            wrong++;
        }
    }
    tu_check(wrong == 0, "Arm BFDotAdd specification: %zu of %d hand-worked cases wrong", wrong, (int)N_BFDOT);
}

/* ----------------------------------------------------------------- GEMM */

static const char *const mode_names[] = {"store", "accumulate", "rescale"};

/* A random pair of bf16 values in [-1, 1] (normal or zero: the instruction
 * flushes subnormal inputs and results, which the bound below excludes). */
static uint32_t random_pair(void) {
    uint16_t lo = fmha_bf16_round__scalar((float)tu_uniform(-1.0, 1.0));
    uint16_t hi = fmha_bf16_round__scalar((float)tu_uniform(-1.0, 1.0));
    return (uint32_t)lo | (uint32_t)hi << 16;
}

/* The Arm specification on u's operands, per 4 x 16 piece, from C's initial
 * values c_init: the number of elements of the m x NR tile whose bits
 * differ from u's result c (a NaN must be the same NaN). */
static size_t spec_gemm_differs(const fmha_ukernels *u, size_t m, size_t kp, const uint32_t *a, ptrdiff_t a_rs,
                                ptrdiff_t a_cs, const uint32_t *b, size_t ldb, const float *c_init,
                                const float *c, size_t ldc, int mode, const float *scale, float ab_scale) {
    const size_t nr = u->tile.nr;
    float *c_spec = alloc(m * ldc * sizeof *c_spec);
    memcpy(c_spec, c_init, m * ldc * sizeof *c_spec);
    for (size_t r0 = 0; r0 < m; r0 += SPEC_MR)
        for (size_t j0 = 0; j0 < nr; j0 += SPEC_NR) {
            size_t rows = m - r0 < SPEC_MR ? m - r0 : SPEC_MR;
            fmha_bf16_gemm_ukernel_4x16__arm(rows, kp, a + (ptrdiff_t)r0 * a_rs, a_rs, a_cs, b + j0, ldb,
                                             c_spec + r0 * ldc + j0, ldc, mode,
                                             mode == FMHA_UK_RESCALE ? scale + j0 : NULL, ab_scale);
        }
    size_t differ = 0;
    for (size_t r = 0; r < m; r++)
        for (size_t j = 0; j < nr; j++) {
            int bad = !same_bits(c[r * ldc + j], c_spec[r * ldc + j]);
            if (bad && differ < 4)
                printf("  %s C[%zu][%zu] = %a (0x%08X), specification %a (0x%08X)\n", u->isa, r, j,
                       (double)c[r * ldc + j], (unsigned)float_bits(c[r * ldc + j]), (double)c_spec[r * ldc + j],
                       (unsigned)float_bits(c_spec[r * ldc + j]));
            differ += (size_t)bad;
        }
    free(c_spec);
    return differ;
}

/* One GEMM call of u at (m, kp, mode, pattern) against float64 and (for a
 * SIMD table) the scalar specification run per 4 x 16 piece.
 * pattern 0: a_cs = 1, a_rs = kp + 3; pattern 1: a_rs = 1, a_cs = m + 2.
 * ldb = NR + 5 and ldc = NR + 3, so rows are not 64-byte aligned. A and B
 * padding holds NaN pairs (a read shows in C); buffers are exactly as long
 * as the operands, so ASan sees overreads.
 * Tolerance: bf16 products are exact in float32, so the only errors are the
 * roundings of the sums: at most 2 per vdpbf16ps (2 kp in all), up to 2
 * adding the accumulator sets, one each for ab_scale, C * col_scale and the
 * final fma. With u = 2^-24:
 *   |c - ref| <= (2 kp + 5) u mag
 * an absolute bound that holds under cancellation (atol = (2 kp + 5) u mag,
 * rtol = 0), where a relative one would not. Kernel and specification each
 * meet it, so they differ by at most (4 kp + 10) u mag. Arm's BFDOT rounds
 * to odd, an error below one ulp (2u relative) rather than half: (4 kp + 5)
 * u mag, and its kernels equal their specification bit for bit. */
static double gemm_case(const fmha_ukernels *u, size_t m, size_t kp, int mode, int pattern,
                        float ab_scale) {
    const size_t nr = u->tile.nr, mr = u->bf16.mr, ldb = nr + 5, ldc = nr + 3, c_len = (mr + 1) * ldc;
    ptrdiff_t a_rs, a_cs;
    size_t a_len;
    if (pattern == 0) {
        a_cs = 1;
        a_rs = (ptrdiff_t)kp + 3;
        a_len = (m - 1) * (size_t)a_rs + kp;
    } else {
        a_rs = 1;
        a_cs = (ptrdiff_t)m + 2;
        a_len = kp ? (kp - 1) * (size_t)a_cs + m : 0;
    }
    const size_t b_len = kp ? (kp - 1) * ldb + nr : 0;
    uint32_t *a = alloc(a_len * sizeof *a), *b = alloc(b_len * sizeof *b);
    float *scale = alloc(nr * sizeof *scale), *c = alloc(c_len * sizeof *c);
    float *c_init = alloc(c_len * sizeof *c_init), *c_spec = alloc(c_len * sizeof *c_spec);
    double *ref = alloc(m * nr * sizeof *ref), *mag = alloc(m * nr * sizeof *mag);

    for (size_t i = 0; i < a_len; i++) a[i] = NAN_PAIR;
    for (size_t r = 0; r < m; r++)
        for (size_t p = 0; p < kp; p++)
            a[(ptrdiff_t)r * a_rs + (ptrdiff_t)p * a_cs] = random_pair();
    for (size_t i = 0; i < b_len; i++) b[i] = NAN_PAIR;
    for (size_t p = 0; p < kp; p++)
        for (size_t j = 0; j < nr; j++) b[p * ldb + j] = random_pair();
    tu_fill(scale, nr, 0.0, 2.0);
    /* STORE must not read C: its rows start as NaN. Outside the m x NR tile
     * everything is a sentinel that must survive. */
    for (size_t i = 0; i < c_len; i++) c_init[i] = SENTINEL;
    for (size_t r = 0; r < m; r++)
        for (size_t j = 0; j < nr; j++)
            c_init[r * ldc + j] = mode == FMHA_UK_STORE ? NAN : (float)tu_uniform(-4.0, 4.0);
    memcpy(c, c_init, c_len * sizeof *c);

    gemm_float64(m, nr, kp, a, a_rs, a_cs, b, ldb, c_init, ldc, mode, scale, ab_scale, ref, mag);
    u->bf16.gemm(m, kp, a, a_rs, a_cs, b, ldb, c, ldc, mode,
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
            double tol = (double)((arm_arithmetic(u) ? 4 : 2) * kp + 5) * 0x1p-24 * mag[r * nr + j] + 1e-30;
            double ratio = isfinite(x) ? fabs((double)x - ref[r * nr + j]) / tol : INFINITY;
            if (ratio > worst) worst = ratio;
        }
    tu_check(worst <= 1.0 && clobbered == 0,
             "%s bf16 gemm m=%zu kp=%zu %s %s ab_scale=%g: worst error/tolerance %.3g, "
             "%zu sentinels overwritten",
             u->isa, m, kp, mode_names[mode], pattern ? "a_rs=1" : "a_cs=1", (double)ab_scale,
             worst, clobbered);

    if (arm_arithmetic(u) && u != &bf16_spec_arm) {
        size_t differ = spec_gemm_differs(u, m, kp, a, a_rs, a_cs, b, ldb, c_init, c, ldc, mode, scale, ab_scale);
        tu_check(differ == 0, "%s bf16 gemm m=%zu kp=%zu %s %s ab_scale=%g: %zu elements differ from the Arm BFDOT "
                 "specification", u->isa, m, kp, mode_names[mode], pattern ? "a_rs=1" : "a_cs=1", (double)ab_scale,
                 differ);
    } else if (u != &bf16_spec && u != &bf16_spec_arm) {
        memcpy(c_spec, c_init, c_len * sizeof *c_spec);
        for (size_t r0 = 0; r0 < m; r0 += SPEC_MR)
            for (size_t j0 = 0; j0 < nr; j0 += SPEC_NR) {
                size_t rows = m - r0 < SPEC_MR ? m - r0 : SPEC_MR;
                fmha_bf16_gemm_ukernel_4x16__scalar(
                    rows, kp, a + (ptrdiff_t)r0 * a_rs, a_rs, a_cs, b + j0, ldb,
                    c_spec + r0 * ldc + j0, ldc, mode, mode == FMHA_UK_RESCALE ? scale + j0 : NULL,
                    ab_scale);
            }
        double worst_vs_spec = 0.0;
        for (size_t r = 0; r < m; r++)
            for (size_t j = 0; j < nr; j++) {
                double tol = (double)(4 * kp + 10) * 0x1p-24 * mag[r * nr + j] + 1e-30;
                double d = fabs((double)c[r * ldc + j] - (double)c_spec[r * ldc + j]) / tol;
                if (!(d <= worst_vs_spec)) worst_vs_spec = isnan(d) ? INFINITY : d;
            }
        tu_check(worst_vs_spec <= 1.0,
                 "%s bf16 gemm m=%zu kp=%zu %s %s ab_scale=%g vs scalar spec: worst "
                 "difference/tolerance %.3g",
                 u->isa, m, kp, mode_names[mode], pattern ? "a_rs=1" : "a_cs=1",
                 (double)ab_scale, worst_vs_spec);
    }
    free(a);
    free(b);
    free(scale);
    free(c);
    free(c_init);
    free(c_spec);
    free(ref);
    free(mag);
    return worst;
}

static void test_gemm(const fmha_ukernels *u) {
    static const size_t kps[] = {0, 1, 3, 32, 64, 128};
    static const float scales[] = {0.08838835f, -1.75f, 3.0f};
    double worst = 0.0;
    int cases = 0;
    for (size_t m = 1; m <= u->bf16.mr; m++)
        for (size_t ki = 0; ki < sizeof kps / sizeof kps[0]; ki++)
            for (int mode = 0; mode < 3; mode++)
                for (int pattern = 0; pattern < 2; pattern++) {
                    float s = scales[(m + ki + (size_t)mode + (size_t)pattern) % 3];
                    double w = gemm_case(u, m, kps[ki], mode, pattern, s);
                    if (w > worst) worst = w;
                    cases++;
                }
    printf("%s bf16 gemm: %d cases, worst error/tolerance %.3g\n", u->isa, cases, worst);
}

/* A bf16 of any class: random bits, a special value, a normal next to the
 * overflow or flush thresholds of a product, or one in [-1, 1]. */
static uint16_t any_bf16(void) {
    static const uint16_t specials[] = {0x0000u, 0x8000u, 0x7F80u, 0xFF80u, 0x7FC0u, 0xFFC1u, 0x7F81u,
                                        0x0001u, 0x8040u, 0x7F7Fu, 0x0080u, 0x3F80u, 0xBF80u};
    switch (tu_int(0, 3)) {
    case 0: return (uint16_t)tu_next();
    case 1: return specials[tu_int(0, (int64_t)(sizeof specials / sizeof specials[0]) - 1)];
    case 2: {
        uint16_t exp = (uint16_t)(tu_int(0, 1) ? tu_int(1, 20) : tu_int(235, 254));
        return (uint16_t)((uint16_t)(tu_int(0, 1) << 15) | (uint16_t)(exp << 7) | (uint16_t)tu_int(0, 127));
    }
    default: return fmha_bf16_round__scalar((float)tu_uniform(-1.0, 1.0));
    }
}

/* Arm tables: the GEMM bit for bit against its specification on operands
 * of every class (NaN payloads, infinities, subnormals, products that
 * overflow or flush, exact cancellations), every m, odd and even pair
 * counts, every mode, both stride patterns. */
static void test_gemm_special_bits(const fmha_ukernels *u) {
    if (!arm_arithmetic(u) || u == &bf16_spec_arm) return;
    static const size_t kps[] = {1, 2, 3, 5, 8, 17};
    const size_t nr = u->tile.nr, ldb = nr + 1, ldc = nr + 2;
    size_t bad_cases = 0, cases = 0;
    for (size_t m = 1; m <= u->bf16.mr; m++)
        for (size_t ki = 0; ki < sizeof kps / sizeof kps[0]; ki++)
            for (int mode = 0; mode < 3; mode++)
                for (int pattern = 0; pattern < 2; pattern++) {
                    const size_t kp = kps[ki];
                    const ptrdiff_t a_rs = pattern ? 1 : (ptrdiff_t)kp, a_cs = pattern ? (ptrdiff_t)m : 1;
                    uint32_t *a = alloc(m * kp * sizeof *a), *b = alloc(kp * ldb * sizeof *b);
                    float *c = alloc(m * ldc * sizeof *c), *c_init = alloc(m * ldc * sizeof *c_init);
                    float *scale = alloc(nr * sizeof *scale);
                    /* half the cases from a few values, so that sums cancel exactly */
                    const int few = (int)((m + ki + (size_t)mode) % 2);
                    for (size_t i = 0; i < m * kp; i++)
                        a[i] = few ? (tu_int(0, 1) ? 0x3F80BF80u : 0xBF803F80u)
                                   : (uint32_t)any_bf16() | (uint32_t)any_bf16() << 16;
                    for (size_t i = 0; i < kp * ldb; i++)
                        b[i] = few ? (tu_int(0, 1) ? 0x3F803F80u : 0x80004000u)
                                   : (uint32_t)any_bf16() | (uint32_t)any_bf16() << 16;
                    tu_fill(c_init, m * ldc, -4.0, 4.0);
                    tu_fill(scale, nr, 0.0, 2.0);
                    memcpy(c, c_init, m * ldc * sizeof *c);
                    const float ab_scale = mode == FMHA_UK_ACCUMULATE ? 1.0f : 0.375f;
                    u->bf16.gemm(m, kp, a, a_rs, a_cs, b, ldb, c, ldc, mode,
                                 mode == FMHA_UK_RESCALE ? scale : NULL, ab_scale);
                    size_t differ =
                        spec_gemm_differs(u, m, kp, a, a_rs, a_cs, b, ldb, c_init, c, ldc, mode, scale, ab_scale);
                    if (differ && bad_cases++ < 4)
                        printf("  %s special bits m=%zu kp=%zu %s %s: %zu elements differ\n", u->isa, m, kp,
                               mode_names[mode], pattern ? "a_rs=1" : "a_cs=1", differ);
                    cases++;
                    free(a);
                    free(b);
                    free(c);
                    free(c_init);
                    free(scale);
                }
    tu_check(bad_cases == 0, "%s bf16 gemm on every class of operand vs the Arm specification: %zu of %zu cases differ",
             u->isa, bad_cases, cases);
}

/* The kernels on a realistic forward tile: P^T rows (probabilities) paired
 * by u's pair-row kernel as B, V^T pairs as A, RESCALE with alpha; checks
 * the two kernels agree on the layout (low half = even key). */
static void test_pair_then_gemm(const fmha_ukernels *u) {
    enum { KEYS = 64 };
    const size_t nr = u->tile.nr, rows = u->bf16.mr;
    float *p_t = alloc(KEYS * nr * sizeof *p_t);
    uint32_t *b = alloc(KEYS / 2 * nr * sizeof *b), *v_t = alloc(rows * KEYS / 2 * sizeof *v_t);
    float *c = alloc(rows * nr * sizeof *c), *c_init = alloc(rows * nr * sizeof *c_init);
    float *alpha = alloc(nr * sizeof *alpha);
    double *ref = alloc(rows * nr * sizeof *ref), *mag = alloc(rows * nr * sizeof *mag);
    tu_fill(p_t, KEYS * nr, 0.0, 1.0);
    for (size_t i = 0; i < rows * KEYS / 2; i++) v_t[i] = random_pair();
    tu_fill(c_init, rows * nr, -2.0, 2.0);
    tu_fill(alpha, nr, 0.0, 1.0);
    for (size_t p = 0; p < KEYS / 2; p++)
        u->bf16.pair_rows(p_t + 2 * p * nr, p_t + (2 * p + 1) * nr, b + p * nr);
    memcpy(c, c_init, rows * nr * sizeof *c);
    u->bf16.gemm(rows, KEYS / 2, v_t, KEYS / 2, 1, b, nr, c, nr, FMHA_UK_RESCALE, alpha, 1.0f);
    /* The reference pairs P with the specification, so it also checks the
     * pairing. */
    uint32_t *b_spec = alloc(KEYS / 2 * nr * sizeof *b_spec);
    for (size_t p = 0; p < KEYS / 2; p++)
        spec_pair_rows(nr, p_t + 2 * p * nr, p_t + (2 * p + 1) * nr, b_spec + p * nr);
    gemm_float64(rows, nr, KEYS / 2, v_t, KEYS / 2, 1, b_spec, nr, c_init, nr, FMHA_UK_RESCALE,
                 alpha, 1.0f, ref, mag);
    double worst = 0.0;
    for (size_t i = 0; i < rows * nr; i++) {
        double tol = (double)((arm_arithmetic(u) ? 2 : 1) * KEYS + 5) * 0x1p-24 * mag[i] + 1e-30;
        double ratio = isfinite(c[i]) ? fabs((double)c[i] - ref[i]) / tol : INFINITY;
        if (ratio > worst) worst = ratio;
    }
    tu_check(memcmp(b, b_spec, KEYS / 2 * nr * sizeof *b) == 0 && worst <= 1.0,
             "%s bf16 pair rows then gemm (P V): worst error/tolerance %.3g", u->isa, worst);
    free(p_t);
    free(b);
    free(b_spec);
    free(v_t);
    free(c);
    free(c_init);
    free(alpha);
    free(ref);
    free(mag);
}

/* ------------------------------------------------------------ pair rows */

static int is_nan_bf16(uint16_t h) { return (h & 0x7F80u) == 0x7F80u && (h & 0x007Fu) != 0; }

static int is_subnormal_f32(uint32_t u) { return (u & 0x7F800000u) == 0 && (u & 0x007FFFFFu) != 0; }

/* Does the kernel's half `got` for input bits `u` meet the specification?
 * NaN must stay NaN with its sign; a float32 subnormal may also become a
 * zero of its sign (vcvtne2ps2bf16 treats subnormal inputs as zero). */
static int half_ok(uint32_t u, uint16_t got) {
    uint16_t want = fmha_bf16_round__scalar(bits_float(u));
    if (is_nan_bf16(want)) return is_nan_bf16(got) && (got & 0x8000u) == (want & 0x8000u);
    if (got == want) return 1;
    return is_subnormal_f32(u) && got == (uint16_t)((u >> 16) & 0x8000u);
}

static int subnormals_flushed;

/* One pair-row call of u on lo and hi (hi may be NULL), with the rows and
 * dst at `offset` floats past an exact-size allocation and sentinels around
 * dst. Returns the number of wrong halves. */
static size_t pair_case(const fmha_ukernels *u, const uint32_t *lo_bits, const uint32_t *hi_bits,
                        size_t offset, const char *what) {
    const size_t nr = u->tile.nr;
    float *lo_buf = alloc((nr + offset) * sizeof(float));
    float *hi_buf = alloc((nr + offset) * sizeof(float));
    uint32_t *dst_buf = alloc((nr + offset + 1) * sizeof(uint32_t));
    float *lo = lo_buf + offset, *hi = hi_bits ? hi_buf + offset : NULL;
    uint32_t *dst = dst_buf + offset;
    memset(lo_buf, 0, (nr + offset) * sizeof(float));
    memset(hi_buf, 0, (nr + offset) * sizeof(float));
    for (size_t i = 0; i < nr; i++) {
        lo[i] = bits_float(lo_bits[i]);
        if (hi) hi[i] = bits_float(hi_bits[i]);
    }
    for (size_t i = 0; i < nr + offset + 1; i++) dst_buf[i] = SENTINEL_WORD;

    u->bf16.pair_rows(lo, hi, dst);

    size_t wrong = 0, clobbered = 0;
    for (size_t i = 0; i < offset; i++) clobbered += dst_buf[i] != SENTINEL_WORD;
    clobbered += dst[nr] != SENTINEL_WORD;
    for (size_t i = 0; i < nr; i++) {
        uint16_t got_lo = (uint16_t)dst[i], got_hi = (uint16_t)(dst[i] >> 16);
        int ok = half_ok(lo_bits[i], got_lo) && (hi ? half_ok(hi_bits[i], got_hi) : got_hi == 0);
        if (is_subnormal_f32(lo_bits[i]) && got_lo != fmha_bf16_round__scalar(lo[i]))
            subnormals_flushed = 1;
        if (!ok && wrong++ < 4)
            printf("  %s word %zu: lo 0x%08X -> 0x%04X (spec 0x%04X), hi 0x%08X -> 0x%04X "
                   "(spec 0x%04X)\n",
                   what, i, (unsigned)lo_bits[i], got_lo, fmha_bf16_round__scalar(lo[i]),
                   hi ? (unsigned)hi_bits[i] : 0u, got_hi,
                   hi ? fmha_bf16_round__scalar(hi[i]) : 0u);
    }
    tu_check(wrong == 0 && clobbered == 0,
             "%s bf16 pair rows %s (%s, offset %zu): %zu wrong words, %zu sentinels overwritten",
             u->isa, what, hi ? "two rows" : "hi NULL", offset, wrong, clobbered);
    free(lo_buf);
    free(hi_buf);
    free(dst_buf);
    return wrong;
}

static void test_pair_rows(const fmha_ukernels *u) {
    const size_t nr = u->tile.nr;
    uint32_t *lo = alloc(nr * sizeof *lo), *hi = alloc(nr * sizeof *hi);
    /* Every special value in both halves, against every other one. */
    for (size_t shift = 0; shift < N_SPECIAL; shift += 5)
        for (size_t offset = 0; offset < 2; offset++) {
            for (size_t i = 0; i < nr; i++) {
                lo[i] = special_cases[i % N_SPECIAL].in;
                hi[i] = special_cases[(i + shift + 1) % N_SPECIAL].in;
            }
            pair_case(u, lo, hi, offset, "special values");
            pair_case(u, lo, NULL, offset, "special values");
        }
    /* Random bit patterns (every class), and values on or next to a tie. */
    for (int round = 0; round < 200; round++) {
        for (size_t i = 0; i < nr; i++) {
            lo[i] = (uint32_t)tu_next();
            hi[i] = (uint32_t)tu_next();
        }
        pair_case(u, lo, hi, (size_t)round % 2, "random bits");
        for (size_t i = 0; i < nr; i++) {
            uint32_t low16 = 0x8000u + (uint32_t)tu_int(-1, 1);
            lo[i] = ((uint32_t)tu_next() & 0xFFFF0000u) | low16;
            hi[i] = ((uint32_t)tu_next() & 0xFFFF0000u) | (0x8000u + (uint32_t)tu_int(-1, 1));
        }
        pair_case(u, lo, hi, (size_t)round % 2, "near ties");
        pair_case(u, lo, NULL, (size_t)round % 2, "near ties");
    }
    free(lo);
    free(hi);
}

/* ------------------------------------------------------ split pair rows */

/* A float32 with no subnormal in sight: |x| in [2^-60, 2^61), its bf16
 * rounding residual normal too; 1 in 16 an infinity, NaN or zero. */
static float split_input(void) {
    static const float specials[] = {INFINITY, -INFINITY, NAN, 0.0f, -0.0f};
    if (tu_int(0, 15) == 0) return specials[tu_int(0, 4)];
    double x = ldexp(tu_uniform(1.0, 2.0), (int)tu_int(-60, 60));
    return (float)(tu_int(0, 1) ? -x : x);
}

/* Equal halves, or both NaN. */
static int same_pair(uint32_t got, uint32_t want) {
    for (int half = 0; half < 2; half++) {
        uint16_t g = (uint16_t)(got >> (16 * half)), w = (uint16_t)(want >> (16 * half));
        if (is_nan_bf16(w) ? !is_nan_bf16(g) : g != w) return 0;
    }
    return 1;
}

/* u's split pair-row kernel against the specification, with b and without. */
static void test_pair_rows_split(const fmha_ukernels *u) {
    const size_t nr = u->tile.nr;
    float *a = alloc(nr * sizeof *a), *b = alloc(nr * sizeof *b);
    uint32_t *hi = alloc(nr * sizeof *hi), *lo = alloc(nr * sizeof *lo);
    uint32_t *hi_spec = alloc(nr * sizeof *hi_spec), *lo_spec = alloc(nr * sizeof *lo_spec);
    size_t wrong = 0;
    for (int round = 0; round < 100; round++) {
        for (size_t i = 0; i < nr; i++) {
            a[i] = split_input();
            b[i] = split_input();
        }
        const float *bb = round % 4 == 3 ? NULL : b;
        u->bf16.pair_rows_split(a, bb, hi, lo);
        for (size_t j = 0; j < nr; j += SPEC_NR)
            fmha_bf16_pair_rows_split_ukernel_16__scalar(a + j, bb ? bb + j : NULL, hi_spec + j,
                                                         lo_spec + j);
        for (size_t i = 0; i < nr; i++) {
            int ok = same_pair(hi[i], hi_spec[i]) && same_pair(lo[i], lo_spec[i]);
            if (!ok && wrong++ < 4)
                printf("  %s split word %zu: a %a b %a -> hi 0x%08X lo 0x%08X (spec 0x%08X "
                       "0x%08X)\n",
                       u->isa, i, (double)a[i], bb ? (double)b[i] : 0.0, (unsigned)hi[i],
                       (unsigned)lo[i], (unsigned)hi_spec[i], (unsigned)lo_spec[i]);
        }
    }
    tu_check(wrong == 0, "%s bf16 split pair rows vs scalar spec: %zu wrong words", u->isa, wrong);
    free(a);
    free(b);
    free(hi);
    free(lo);
    free(hi_spec);
    free(lo_spec);
}

/* ------------------------------------------------------------ pack rows */

/* u's row-packing kernel on 3 rows of every length n <= NR + 3 (strides
 * past the row, specials and random bits): each half as pair_rows rounds
 * it, the odd tail's high half 0, the words past (n + 1) / 2 untouched. */
static void test_pack_rows(const fmha_ukernels *u) {
    enum { ROWS = 3 };
    const size_t max_n = u->tile.nr + 3, lds = max_n + 5, ldd = max_n / 2 + 7;
    float *src = alloc(ROWS * lds * sizeof *src);
    uint32_t *bits = alloc(ROWS * lds * sizeof *bits), *dst = alloc(ROWS * ldd * sizeof *dst);
    size_t wrong = 0, clobbered = 0;
    for (size_t n = 1; n <= max_n; n++) {
        for (size_t i = 0; i < ROWS * lds; i++) {
            bits[i] = i % 3 == 0 ? special_cases[(i + n) % N_SPECIAL].in : (uint32_t)tu_next();
            src[i] = bits_float(bits[i]);
        }
        for (size_t i = 0; i < ROWS * ldd; i++) dst[i] = SENTINEL_WORD;
        u->bf16.pack_rows(ROWS, n, src, lds, dst, ldd);
        for (size_t r = 0; r < ROWS; r++)
            for (size_t p = 0; p < ldd; p++) {
                uint32_t w = dst[r * ldd + p];
                if (2 * p >= n) {
                    clobbered += w != SENTINEL_WORD;
                    continue;
                }
                const uint32_t *x = bits + r * lds + 2 * p;
                int ok = half_ok(x[0], (uint16_t)w) &&
                         (2 * p + 1 < n ? half_ok(x[1], (uint16_t)(w >> 16)) : (w >> 16) == 0);
                if (!ok && wrong++ < 4)
                    printf("  %s pack rows n %zu row %zu word %zu: 0x%08X 0x%08X -> 0x%08X\n", u->isa, n,
                           r, p, (unsigned)x[0], 2 * p + 1 < n ? (unsigned)x[1] : 0u, (unsigned)w);
            }
    }
    tu_check(wrong == 0 && clobbered == 0, "%s bf16 pack rows: %zu wrong words, %zu sentinels overwritten",
             u->isa, wrong, clobbered);
    free(src);
    free(bits);
    free(dst);
}

/* ------------------------------------------------------ softmax pairs */

/* u's fused softmax step against its definition: the table's own
 * softmax_lowp_f32 then pair_rows_bf16, bit for bit in m, l, alpha and every
 * pair word (sentinels past the last pair-row stay), s untouched. Rows 1 to
 * 2 Bc + 1 (odd counts pair their last row with 0), a fresh and a running
 * state, and lanes of every kind: finite scores, all -inf (masked), a NaN
 * score (the NaN lanes the kernel mends after its pass), a +inf score with
 * and without a NaN beside it, and a NaN running max. */
static void test_softmax_pairs(const fmha_ukernels *u) {
    if (!u->bf16.softmax_pairs) return;
    tu_check(u->tile.softmax_lowp && u->bf16.pair_rows, "%s: softmax_pairs_bf16 comes with its two parts",
             u->isa);
    const size_t nr = u->tile.nr, max_rows = 2 * u->tile.block_kv + 1, lds = nr + 16;
    if (!tu_check(nr <= 64, "%s: NR %zu fits the softmax pairs test's state arrays", u->isa, nr)) return;
    float *s = alloc(max_rows * lds * sizeof *s), *s_ref = alloc(max_rows * lds * sizeof *s_ref);
    float *s_copy = alloc(max_rows * lds * sizeof *s_copy);
    uint32_t *pairs = alloc((max_rows / 2 + 2) * nr * sizeof *pairs);
    uint32_t *pairs_ref = alloc((max_rows / 2 + 2) * nr * sizeof *pairs_ref);
    float m[3][64], l[3][64], alpha[3][64];
    size_t wrong = 0, cases = 0;
    static const size_t row_counts[] = {1, 2, 3, 6, 7, 64, 127, 128, 129, 256, 257};
    for (size_t ri = 0; ri < sizeof row_counts / sizeof row_counts[0]; ri++) {
        size_t rows = row_counts[ri];
        if (rows > max_rows) continue;
        for (int scenario = 0; scenario < 6; scenario++) {
            for (size_t r = 0; r < rows; r++)
                for (size_t i = 0; i < lds; i++) s[r * lds + i] = (float)tu_uniform(-12.0, 12.0);
            for (size_t i = 0; i < nr; i++) {
                int kind = scenario == 0 ? 0 : (int)(i % 6);
                size_t r = (size_t)tu_int(0, (long)rows - 1);
                if (kind == 1)
                    for (size_t k = 0; k < rows; k++) s[k * lds + i] = -INFINITY;
                if (kind == 2) s[r * lds + i] = NAN;
                if (kind == 3) s[r * lds + i] = INFINITY;
                if (kind == 4) {
                    s[r * lds + i] = INFINITY;
                    s[(r + 1) % rows * lds + i] = NAN;
                }
                /* running state: fresh (scenario 1), else a finite one, a NaN m in kind 5 */
                m[0][i] = scenario == 1 ? -INFINITY : kind == 5 ? NAN : (float)tu_uniform(-4.0, 4.0);
                l[0][i] = scenario == 1 ? 0.0f : (float)tu_uniform(0.5, 30.0);
            }
            memcpy(s_ref, s, rows * lds * sizeof *s);
            memcpy(s_copy, s, rows * lds * sizeof *s);
            memcpy(m[1], m[0], sizeof m[0]);
            memcpy(l[1], l[0], sizeof l[0]);
            memcpy(m[2], m[0], sizeof m[0]);
            memcpy(l[2], l[0], sizeof l[0]);
            size_t words = (rows + 1) / 2 * nr;
            for (size_t w = 0; w < words + nr; w++) pairs[w] = pairs_ref[w] = SENTINEL_WORD;
            u->bf16.softmax_pairs(rows, s, lds, m[1], l[1], alpha[1], pairs);
            u->tile.softmax_lowp(rows, s_ref, lds, m[2], l[2], alpha[2]);
            for (size_t r = 0; r < rows; r += 2)
                u->bf16.pair_rows(s_ref + r * lds, r + 1 < rows ? s_ref + (r + 1) * lds : NULL,
                                  pairs_ref + r / 2 * nr);
            cases++;
            size_t bad = 0;
            for (size_t i = 0; i < nr; i++)
                bad += !same_bits(m[1][i], m[2][i]) || !same_bits(l[1][i], l[2][i]) ||
                       !same_bits(alpha[1][i], alpha[2][i]);
            for (size_t w = 0; w < words + nr; w++) bad += pairs[w] != pairs_ref[w];
            bad += memcmp(s, s_copy, rows * lds * sizeof *s) != 0;
            if (bad && wrong++ < 4)
                printf("  %s softmax pairs: rows %zu scenario %d: %zu differences\n", u->isa, rows, scenario, bad);
        }
    }
    tu_check(wrong == 0, "%s softmax_pairs_bf16 vs softmax_lowp_f32 + pair_rows_bf16: %zu of %zu cases differ",
             u->isa, wrong, cases);
    free(s);
    free(s_ref);
    free(s_copy);
    free(pairs);
    free(pairs_ref);
}

/* Zero halves made by the kernels themselves (no input holds them): the
 * high halves of pair_rows without a high row, of split pairs without b and
 * of pack_rows' odd tail, and the last pair-row of an odd softmax_pairs, on
 * rows of 1.0 (bf16 0x3F80). A kernel that built its zero as a constant bf16
 * vector, which GCC 12 can miscompile, would show here. */
static void test_zero_halves(const fmha_ukernels *u) {
    const size_t nr = u->tile.nr;
    float *ones = alloc(3 * nr * sizeof *ones), *m = alloc(nr * sizeof *m), *l = alloc(nr * sizeof *l);
    float *alpha = alloc(nr * sizeof *alpha);
    uint32_t *w = alloc(2 * nr * sizeof *w), *w2 = alloc(nr * sizeof *w2);
    for (size_t i = 0; i < 3 * nr; i++) ones[i] = 1.0f;
    size_t wrong = 0;
    u->bf16.pair_rows(ones, NULL, w);
    for (size_t i = 0; i < nr; i++) wrong += w[i] != 0x00003F80u;
    u->bf16.pair_rows_split(ones, NULL, w, w2);
    for (size_t i = 0; i < nr; i++) wrong += w[i] != 0x00003F80u || w2[i] != 0u;
    for (size_t n = 1; n < nr; n += 2) {
        for (size_t i = 0; i < nr; i++) w[i] = SENTINEL_WORD;
        u->bf16.pack_rows(1, n, ones, nr, w, nr);
        for (size_t p = 0; p < nr; p++)
            wrong += w[p] != (2 * p + 1 < n ? 0x3F803F80u : 2 * p < n ? 0x00003F80u : SENTINEL_WORD);
    }
    if (u->bf16.softmax_pairs) {
        for (size_t i = 0; i < nr; i++) {
            m[i] = -INFINITY;
            l[i] = 0.0f;
        }
        for (size_t i = 0; i < 2 * nr; i++) w[i] = SENTINEL_WORD;
        u->bf16.softmax_pairs(3, ones, nr, m, l, alpha, w); /* P = exp(0) = 1 in every lane */
        for (size_t i = 0; i < nr; i++) wrong += w[i] != 0x3F803F80u || w[nr + i] != 0x00003F80u;
    }
    tu_check(wrong == 0, "%s: the zero halves the bf16 kernels make (hi NULL, b NULL, odd n, odd rows): %zu wrong",
             u->isa, wrong);
    free(ones);
    free(m);
    free(l);
    free(alpha);
    free(w);
    free(w2);
}

/* Every bf16 kernel of u. */
static void test_table(const fmha_ukernels *u) {
    test_pair_rows(u);
    test_pair_rows_split(u);
    test_pack_rows(u);
    test_zero_halves(u);
    test_gemm(u);
    test_gemm_special_bits(u);
    test_pair_then_gemm(u);
    test_softmax_pairs(u);
}

/* 1 when the registry never chooses the ISA `name` itself, only FMHA_ISA
 * does (fmha_arch_isa.by_name_only: amx_emu, the float32 variants). */
static int chosen_by_name_only(const char *name) {
    for (size_t i = 0; i < fmha_arch_isa_count(); i++)
        if (!strcmp(fmha_arch_isa_at(i)->name, name)) return fmha_arch_isa_at(i)->by_name_only;
    return 0;
}

/* The registry's choice: without FMHA_ISA the table in use is the first
 * supported ISA that is not by name only (scalar when FMHA_TEST_ISAS leaves
 * none, e.g. amx_emu alone); forcing one this CPU lacks fails (-1) and
 * changes nothing (scalar, which FMHA_TEST_ISAS leaves available by name,
 * aside). */
static void test_dispatch(void) {
    const fmha_ukernels *in_use = fmha_cpu_kernels();
    if (!getenv("FMHA_ISA")) {
        const fmha_ukernels *first = NULL;
        for (size_t i = 0; i < fmha_isa_count() && !first; i++)
            if (fmha_isa_supported(fmha_isa_at(i)) && !chosen_by_name_only(fmha_isa_at(i)->name))
                first = fmha_isa_at(i)->table;
        if (!first) first = fmha_cpu_kernels_for("scalar");
        tu_check(in_use == first, "the table in use (%s) is the registry's first choice (%s)", in_use->isa,
                 first ? first->isa : "none");
    }
    for (size_t i = 0; i < fmha_isa_count(); i++) {
        const fmha_isa *isa = fmha_isa_at(i);
        if (fmha_isa_supported(isa) || !strcmp(isa->name, "scalar")) continue;
        tu_check(fmha_cpu_force_isa(isa->name) == -1 && fmha_cpu_kernels() == in_use,
                 "forcing %s, which this CPU lacks, fails and keeps %s", isa->name, in_use->isa);
    }
    printf("table in use: %s\n", in_use->isa);
}

int main(void) {
    tu_seed();
    test_round_spec();
    test_bfdot_spec();
    test_dispatch();
    test_table(&bf16_spec);
    test_table(&bf16_spec_arm);
    /* every bf16 part the build has is whole: composition drops a partial one */
    for (size_t i = 0; i < fmha_arch_isa_count(); i++) {
        const fmha_uk_bf16 *b = fmha_arch_isa_at(i)->parts->bf16;
        tu_check(!b || (b->gemm && b->pair_rows && b->pair_rows_split && b->pack_rows),
                 "%s: a bf16 part has all four pair kernels", fmha_arch_isa_at(i)->name);
    }
    for (size_t i = 0; i < fmha_isa_count(); i++) {
        const fmha_isa *isa = fmha_isa_at(i);
        const fmha_ukernels *u = isa->table;
        if (!u->bf16.gemm) continue;
        if (!fmha_isa_supported(isa)) {
            printf("%s: not supported by this CPU, skipped\n", isa->name);
            continue;
        }
        tu_check(u->tile.nr % SPEC_NR == 0, "%s: NR a multiple of 16", isa->name);
        subnormals_flushed = 0;
        test_table(u);
        printf("%s bf16 pair rows: float32 subnormal inputs %s\n", isa->name,
               subnormals_flushed ? "become signed zeros (DAZ)" : "rounded like normals");
    }
    return tu_finish();
}
