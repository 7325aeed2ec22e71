/* test_bf16_ukernels.c: the AVX-512 BF16 microkernels against their scalar
 * specifications, which live here: the pair-packed GEMM against a float64
 * computation on the same bf16 inputs at every m, several pair counts, every
 * mode and both stride patterns, with NaN padding and sentinels around C;
 * the pair-row kernel bit for bit against a scalar round-to-nearest-even
 * (ties, carries into the next binade, overflow, infinities, NaN, signed
 * zeros, subnormals), with and without a high row. On CPUs or builds
 * without AVX512_BF16 it prints why and reports "0 passed, 0 failed". */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_util.h"
#include "uk/ukernel.h"

#if defined(__x86_64__)
#include "uk/avx512bf16/bf16.h"

#define SENTINEL 1234.5678f    /* never a kernel output here */
#define NAN_PAIR 0x7FC07FC0u   /* a pair of bf16 quiet NaNs: padding of A and B */
#define SENTINEL_WORD 0xA5A5A5A5u

enum { MR = FMHA_AVX512BF16_MR, NR = FMHA_AVX512BF16_NR };

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

/* ------------------------------------------------- scalar specifications */

/* float32 -> bf16, round to nearest even on the bit pattern (exact for
 * normals, subnormals and overflow to inf alike); a NaN keeps its sign and
 * top payload bits and gets the quiet bit, so it stays NaN. */
static uint16_t bf16_round_spec(float x) {
    uint32_t u = float_bits(x);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((u >> 16) | 0x0040u);
    u += 0x7FFFu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static double bf16_value(uint16_t h) { return (double)bits_float((uint32_t)h << 16); }

/* Pair-row specification: dst[i] = (bf16(lo[i]), bf16(hi[i])), hi NULL -> 0. */
static void pair_rows_spec(const float *lo, const float *hi, uint32_t *dst) {
    for (size_t i = 0; i < NR; i++)
        dst[i] = (uint32_t)bf16_round_spec(lo[i]) |
                 (hi ? (uint32_t)bf16_round_spec(hi[i]) << 16 : 0u);
}

/* GEMM specification in float64: ref = init + ab_scale * sum over 2 kp
 * products, init = 0, C or C * col_scale by mode; mag = |init| + |ab_scale|
 * sum |product|, the scale of the rounding error of any float32 order. */
static void gemm_spec(size_t m, size_t kp, const uint32_t *a, ptrdiff_t a_rs, ptrdiff_t a_cs,
                      const uint32_t *b, size_t ldb, const float *c, size_t ldc, int mode,
                      const float *col_scale, float ab_scale, double *ref, double *mag) {
    for (size_t r = 0; r < m; r++)
        for (size_t j = 0; j < NR; j++) {
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
            ref[r * NR + j] = init + (double)ab_scale * sum;
            mag[r * NR + j] = fabs(init) + fabs((double)ab_scale) * sum_abs;
        }
}

/* ----------------------------------------------------------------- GEMM */

static const char *const mode_names[] = {"store", "accumulate", "rescale"};

/* A random pair of bf16 values in [-1, 1] (normal or zero: the instruction
 * flushes subnormal inputs and results, which the bound below excludes). */
static uint32_t random_pair(void) {
    uint16_t lo = bf16_round_spec((float)tu_uniform(-1.0, 1.0));
    uint16_t hi = bf16_round_spec((float)tu_uniform(-1.0, 1.0));
    return (uint32_t)lo | (uint32_t)hi << 16;
}

/* One GEMM call at (m, kp, mode, pattern) against the float64 spec.
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
 * rtol = 0), where a relative one would not. */
static double gemm_case(size_t m, size_t kp, int mode, int pattern, float ab_scale) {
    const size_t ldb = NR + 5, ldc = NR + 3, c_len = (MR + 1) * ldc;
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
    const size_t b_len = kp ? (kp - 1) * ldb + NR : 0;
    uint32_t *a = alloc(a_len * sizeof *a), *b = alloc(b_len * sizeof *b);
    float *scale = alloc(NR * sizeof *scale), *c = alloc(c_len * sizeof *c);
    float *c_init = alloc(c_len * sizeof *c_init);
    double *ref = alloc(m * NR * sizeof *ref), *mag = alloc(m * NR * sizeof *mag);

    for (size_t i = 0; i < a_len; i++) a[i] = NAN_PAIR;
    for (size_t r = 0; r < m; r++)
        for (size_t p = 0; p < kp; p++)
            a[(ptrdiff_t)r * a_rs + (ptrdiff_t)p * a_cs] = random_pair();
    for (size_t i = 0; i < b_len; i++) b[i] = NAN_PAIR;
    for (size_t p = 0; p < kp; p++)
        for (size_t j = 0; j < NR; j++) b[p * ldb + j] = random_pair();
    tu_fill(scale, NR, 0.0, 2.0);
    /* STORE must not read C: its rows start as NaN. Outside the m x NR tile
     * everything is a sentinel that must survive. */
    for (size_t i = 0; i < c_len; i++) c_init[i] = SENTINEL;
    for (size_t r = 0; r < m; r++)
        for (size_t j = 0; j < NR; j++)
            c_init[r * ldc + j] = mode == FMHA_UK_STORE ? NAN : (float)tu_uniform(-4.0, 4.0);
    memcpy(c, c_init, c_len * sizeof *c);

    gemm_spec(m, kp, a, a_rs, a_cs, b, ldb, c_init, ldc, mode, scale, ab_scale, ref, mag);
    fmha_bf16_gemm_ukernel_6x64__avx512bf16(m, kp, a, a_rs, a_cs, b, ldb, c, ldc, mode,
                                            mode == FMHA_UK_RESCALE ? scale : NULL, ab_scale);

    double worst = 0.0;
    size_t clobbered = 0;
    for (size_t r = 0; r < MR + 1; r++)
        for (size_t j = 0; j < ldc; j++) {
            float x = c[r * ldc + j];
            if (r >= m || j >= NR) {
                clobbered += !same_bits(x, c_init[r * ldc + j]);
                continue;
            }
            double tol = (double)(2 * kp + 5) * 0x1p-24 * mag[r * NR + j] + 1e-30;
            double ratio = isfinite(x) ? fabs((double)x - ref[r * NR + j]) / tol : INFINITY;
            if (ratio > worst) worst = ratio;
        }
    tu_check(worst <= 1.0 && clobbered == 0,
             "bf16 gemm m=%zu kp=%zu %s %s ab_scale=%g: worst error/tolerance %.3g, "
             "%zu sentinels overwritten",
             m, kp, mode_names[mode], pattern ? "a_rs=1" : "a_cs=1", (double)ab_scale, worst,
             clobbered);
    free(a);
    free(b);
    free(scale);
    free(c);
    free(c_init);
    free(ref);
    free(mag);
    return worst;
}

static void test_gemm(void) {
    static const size_t kps[] = {0, 1, 3, 32, 64, 128};
    static const float scales[] = {0.08838835f, -1.75f, 3.0f};
    double worst = 0.0;
    int cases = 0;
    for (size_t m = 1; m <= MR; m++)
        for (size_t ki = 0; ki < sizeof kps / sizeof kps[0]; ki++)
            for (int mode = 0; mode < 3; mode++)
                for (int pattern = 0; pattern < 2; pattern++) {
                    float s = scales[(m + ki + (size_t)mode + (size_t)pattern) % 3];
                    double w = gemm_case(m, kps[ki], mode, pattern, s);
                    if (w > worst) worst = w;
                    cases++;
                }
    printf("bf16 gemm: %d cases, worst error/tolerance %.3g\n", cases, worst);
}

/* The kernel on a realistic forward tile: P^T rows (probabilities) paired
 * by the pair-row kernel as B, V^T pairs as A, RESCALE with alpha; checks
 * the two kernels agree on the layout (low half = even key). */
static void test_pair_then_gemm(void) {
    enum { KEYS = 64, ROWS = MR };
    float *p_t = alloc(KEYS * NR * sizeof *p_t);
    uint32_t *b = alloc(KEYS / 2 * NR * sizeof *b), *v_t = alloc(ROWS * KEYS / 2 * sizeof *v_t);
    float *c = alloc(ROWS * NR * sizeof *c), *c_init = alloc(ROWS * NR * sizeof *c_init);
    float *alpha = alloc(NR * sizeof *alpha);
    double *ref = alloc(ROWS * NR * sizeof *ref), *mag = alloc(ROWS * NR * sizeof *mag);
    tu_fill(p_t, KEYS * NR, 0.0, 1.0);
    for (size_t i = 0; i < ROWS * KEYS / 2; i++) v_t[i] = random_pair();
    tu_fill(c_init, ROWS * NR, -2.0, 2.0);
    tu_fill(alpha, NR, 0.0, 1.0);
    for (size_t p = 0; p < KEYS / 2; p++)
        fmha_bf16_pair_rows_ukernel_64__avx512bf16(p_t + 2 * p * NR, p_t + (2 * p + 1) * NR,
                                                   b + p * NR);
    memcpy(c, c_init, ROWS * NR * sizeof *c);
    fmha_bf16_gemm_ukernel_6x64__avx512bf16(ROWS, KEYS / 2, v_t, KEYS / 2, 1, b, NR, c, NR,
                                            FMHA_UK_RESCALE, alpha, 1.0f);
    /* The reference rounds P itself, so it also checks the pairing. */
    uint32_t *b_spec = alloc(KEYS / 2 * NR * sizeof *b_spec);
    for (size_t p = 0; p < KEYS / 2; p++)
        pair_rows_spec(p_t + 2 * p * NR, p_t + (2 * p + 1) * NR, b_spec + p * NR);
    gemm_spec(ROWS, KEYS / 2, v_t, KEYS / 2, 1, b_spec, NR, c_init, NR, FMHA_UK_RESCALE, alpha,
              1.0f, ref, mag);
    double worst = 0.0;
    for (size_t i = 0; i < ROWS * NR; i++) {
        double tol = (double)(KEYS + 5) * 0x1p-24 * mag[i] + 1e-30;
        double ratio = isfinite(c[i]) ? fabs((double)c[i] - ref[i]) / tol : INFINITY;
        if (ratio > worst) worst = ratio;
    }
    tu_check(memcmp(b, b_spec, KEYS / 2 * NR * sizeof *b) == 0 && worst <= 1.0,
             "bf16 pair rows then gemm (P V): worst error/tolerance %.3g", worst);
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

/* Inputs with a known rounding, as float32 bit patterns. */
static const uint32_t special_bits[] = {
    0x3F800000u, /* 1.0, exact */
    0x3F808000u, /* tie between 0x3F80 (even) and 0x3F81: down */
    0x3F818000u, /* tie between 0x3F81 (odd) and 0x3F82: up */
    0xBF808000u, /* negative tie: down in magnitude */
    0xBF818000u, /* negative tie: up in magnitude */
    0x3F808001u, /* just above a tie: up */
    0x3F807FFFu, /* just below a tie: down */
    0x3FFFFFFFu, /* carries into the next binade: 2.0 */
    0x3FFF8000u, /* tie with odd mantissa at the binade top: 2.0 */
    0xBF7F8000u, /* negative tie carrying into -1.0 */
    0x7F7FFFFFu, /* FLT_MAX: rounds up to +inf */
    0x7F7F8000u, /* tie at the top, odd: +inf */
    0x7F7F7FFFu, /* just below that tie: largest finite bf16 */
    0xFF7FFFFFu, /* -FLT_MAX: -inf */
    0x7F800000u, /* +inf */
    0xFF800000u, /* -inf */
    0x7FC00000u, /* quiet NaN */
    0xFFC00000u, /* negative quiet NaN */
    0x7F800001u, /* signalling NaN whose payload is all in the low half */
    0xFF800001u, /* negative of that */
    0x7FFFFFFFu, /* NaN that a naive rounding would carry into the sign */
    0xFFFFFFFFu, /* negative NaN with all payload bits */
    0x00000000u, /* +0 */
    0x80000000u, /* -0 */
    0x00800000u, /* smallest normal */
    0x80808000u, /* negative tiny normal tie: down */
    0x00000001u, /* smallest subnormal */
    0x007FFFFFu, /* largest subnormal (RNE: smallest normal) */
    0x807FFFFFu, /* its negative */
    0x00408000u, /* subnormal tie */
    0x40490FDBu, /* pi */
    0xC2F6E979u, /* -123.456 */
};

static int is_nan_bf16(uint16_t h) { return (h & 0x7F80u) == 0x7F80u && (h & 0x007Fu) != 0; }

static int is_subnormal_f32(uint32_t u) { return (u & 0x7F800000u) == 0 && (u & 0x007FFFFFu) != 0; }

/* Does the kernel's half `got` for input bits `u` meet the specification?
 * NaN must stay NaN with its sign; a float32 subnormal may also become a
 * zero of its sign (vcvtne2ps2bf16 treats subnormal inputs as zero). */
static int half_ok(uint32_t u, uint16_t got) {
    uint16_t want = bf16_round_spec(bits_float(u));
    if (is_nan_bf16(want)) return is_nan_bf16(got) && (got & 0x8000u) == (want & 0x8000u);
    if (got == want) return 1;
    return is_subnormal_f32(u) && got == (uint16_t)((u >> 16) & 0x8000u);
}

static int subnormals_flushed;

/* One pair-row call on lo and hi (hi may be NULL), with the rows and dst
 * at `offset` floats past an exact-size allocation and sentinels around
 * dst. Returns the number of wrong halves. */
static size_t pair_case(const uint32_t *lo_bits, const uint32_t *hi_bits, size_t offset,
                        const char *what) {
    float *lo_buf = alloc((NR + offset) * sizeof(float));
    float *hi_buf = alloc((NR + offset) * sizeof(float));
    uint32_t *dst_buf = alloc((NR + offset + 1) * sizeof(uint32_t));
    float *lo = lo_buf + offset, *hi = hi_bits ? hi_buf + offset : NULL;
    uint32_t *dst = dst_buf + offset;
    for (size_t i = 0; i < NR; i++) {
        lo[i] = bits_float(lo_bits[i]);
        if (hi) hi[i] = bits_float(hi_bits[i]);
    }
    for (size_t i = 0; i < NR + offset + 1; i++) dst_buf[i] = SENTINEL_WORD;

    fmha_bf16_pair_rows_ukernel_64__avx512bf16(lo, hi, dst);

    size_t wrong = 0, clobbered = 0;
    for (size_t i = 0; i < offset; i++) clobbered += dst_buf[i] != SENTINEL_WORD;
    clobbered += dst[NR] != SENTINEL_WORD;
    for (size_t i = 0; i < NR; i++) {
        uint16_t got_lo = (uint16_t)dst[i], got_hi = (uint16_t)(dst[i] >> 16);
        int ok = half_ok(lo_bits[i], got_lo) && (hi ? half_ok(hi_bits[i], got_hi) : got_hi == 0);
        if (is_subnormal_f32(lo_bits[i]) && got_lo != bf16_round_spec(lo[i]))
            subnormals_flushed = 1;
        if (!ok && wrong++ < 4)
            printf("  %s word %zu: lo 0x%08X -> 0x%04X (spec 0x%04X), hi 0x%08X -> 0x%04X "
                   "(spec 0x%04X)\n",
                   what, i, (unsigned)lo_bits[i], got_lo, bf16_round_spec(lo[i]),
                   hi ? (unsigned)hi_bits[i] : 0u, got_hi,
                   hi ? bf16_round_spec(hi[i]) : 0u);
    }
    tu_check(wrong == 0 && clobbered == 0,
             "bf16 pair rows %s (%s, offset %zu): %zu wrong words, %zu sentinels overwritten",
             what, hi ? "two rows" : "hi NULL", offset, wrong, clobbered);
    free(lo_buf);
    free(hi_buf);
    free(dst_buf);
    return wrong;
}

static void test_pair_rows(void) {
    const size_t n_special = sizeof special_bits / sizeof special_bits[0];
    uint32_t lo[NR], hi[NR];
    /* Every special value in both halves, against every other one. */
    for (size_t shift = 0; shift < n_special; shift += 5)
        for (size_t offset = 0; offset < 2; offset++) {
            for (size_t i = 0; i < NR; i++) {
                lo[i] = special_bits[i % n_special];
                hi[i] = special_bits[(i + shift + 1) % n_special];
            }
            pair_case(lo, hi, offset, "special values");
            pair_case(lo, NULL, offset, "special values");
        }
    /* Random bit patterns (every class), and values on or next to a tie. */
    for (int round = 0; round < 200; round++) {
        for (size_t i = 0; i < NR; i++) {
            lo[i] = (uint32_t)tu_next();
            hi[i] = (uint32_t)tu_next();
        }
        pair_case(lo, hi, (size_t)round % 2, "random bits");
        for (size_t i = 0; i < NR; i++) {
            uint32_t low16 = 0x8000u + (uint32_t)tu_int(-1, 1);
            lo[i] = ((uint32_t)tu_next() & 0xFFFF0000u) | low16;
            hi[i] = ((uint32_t)tu_next() & 0xFFFF0000u) | (0x8000u + (uint32_t)tu_int(-1, 1));
        }
        pair_case(lo, hi, (size_t)round % 2, "near ties");
        pair_case(lo, NULL, (size_t)round % 2, "near ties");
    }
    printf("bf16 pair rows: float32 subnormal inputs %s\n",
           subnormals_flushed ? "become signed zeros (DAZ)" : "rounded like normals");
}

static int cpu_has_avx512bf16(void) {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512bf16");
}

int main(void) {
    if (!cpu_has_avx512bf16()) {
        printf("skipped: this CPU lacks AVX512_BF16\n");
        return tu_finish();
    }
    tu_seed();
    test_pair_rows();
    test_gemm();
    test_pair_then_gemm();
    return tu_finish();
}

#else /* not x86-64: the library has no AVX-512 BF16 kernels */

int main(void) {
    printf("skipped: AVX512_BF16 kernels are built on x86-64 only\n");
    return tu_finish();
}

#endif
