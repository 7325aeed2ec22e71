/* scalar/bf16.c: the plain-C specifications of the bf16 microkernels, with
 * the arithmetic of vdpbf16ps spelled out: each pair-step adds two bf16
 * products (exact in float32) to a float32 accumulator, one rounding each;
 * and a second pair GEMM with the arithmetic of Arm's BFDOT / BFMMLA
 * without FEAT_EBF16 (BFDotAdd of the Arm ARM: round to odd, subnormals
 * flushed, the default NaN), which the neonbf16 kernels match bit for bit.
 * Compiled with no ISA flags: runs on any CPU. */
#include "bf16.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "../ukernel.h"

enum { MR = FMHA_SCALAR_BF16_MR, NR = FMHA_SCALAR_BF16_NR };

uint16_t fmha_bf16_round__scalar(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((u >> 16) | 0x0040u);
    /* adding 0x7FFF, plus 1 when the kept part is odd, carries exactly when
     * the dropped half is above a tie, or at a tie with an odd kept part */
    u += 0x7FFFu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

float fmha_bf16_widen__scalar(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

/* One row of C from its finished sum A B: scaled and combined with C by
 * one multiply or fma, as the float32 GEMM does. */
static void finish_row(const float acc[NR], float *c, int mode, const float *col_scale, float ab_scale) {
    for (size_t j = 0; j < NR; j++)
        c[j] = mode == FMHA_UK_STORE        ? acc[j] * ab_scale
               : mode == FMHA_UK_ACCUMULATE ? fmaf(acc[j], ab_scale, c[j])
                                            : fmaf(acc[j], ab_scale, c[j] * col_scale[j]);
}

/* C[m x 16] (op)= ab_scale * A B on pair-packed operands; contract in
 * ukernel.h. Per pair-step the high halves' product is added first, then
 * the low halves' (the order of vdpbf16ps's definition); the sum A B is
 * then scaled and combined with C by one multiply or fma, as the float32
 * GEMM does. */
void fmha_bf16_gemm_ukernel_4x16__scalar(size_t m, size_t kp, const uint32_t *a, ptrdiff_t a_rs,
                                         ptrdiff_t a_cs, const uint32_t *b, size_t ldb, float *c,
                                         size_t ldc, int mode, const float *col_scale,
                                         float ab_scale) {
    for (size_t r = 0; r < m; r++) {
        float acc[NR] = {0};
        for (size_t p = 0; p < kp; p++) {
            const uint32_t wa = a[(ptrdiff_t)r * a_rs + (ptrdiff_t)p * a_cs];
            const float a_lo = fmha_bf16_widen__scalar((uint16_t)wa);
            const float a_hi = fmha_bf16_widen__scalar((uint16_t)(wa >> 16));
            for (size_t j = 0; j < NR; j++) {
                const uint32_t wb = b[p * ldb + j];
                const float hi = a_hi * fmha_bf16_widen__scalar((uint16_t)(wb >> 16));
                const float lo = a_lo * fmha_bf16_widen__scalar((uint16_t)wb);
                acc[j] += hi;
                acc[j] += lo;
            }
        }
        finish_row(acc, c + r * ldc, mode, col_scale, ab_scale);
    }
}

/* dst[i] = (bf16(lo[i]), bf16(hi[i])); contract in ukernel.h. */
void fmha_bf16_pair_rows_ukernel_16__scalar(const float *lo, const float *hi, uint32_t *dst) {
    for (size_t i = 0; i < NR; i++)
        dst[i] = (uint32_t)fmha_bf16_round__scalar(lo[i]) |
                 (hi ? (uint32_t)fmha_bf16_round__scalar(hi[i]) << 16 : 0u);
}

/* dst[r][p] = (bf16(src[r][2p]), bf16(src[r][2p + 1])), 0 past n; contract
 * in ukernel.h. */
void fmha_bf16_pack_rows_ukernel__scalar(size_t rows, size_t n, const float *src, size_t lds,
                                         uint32_t *dst, size_t ldd) {
    for (size_t r = 0; r < rows; r++)
        for (size_t p = 0; 2 * p < n; p++) {
            const float *x = src + r * lds + 2 * p;
            dst[r * ldd + p] = (uint32_t)fmha_bf16_round__scalar(x[0]) |
                               (2 * p + 1 < n ? (uint32_t)fmha_bf16_round__scalar(x[1]) << 16 : 0u);
        }
}

/* hi: pairs of bf16(a), bf16(b); lo: pairs of bf16(a - bf16(a)),
 * bf16(b - bf16(b)); b NULL reads as zeros. Contract in ukernel.h. */
void fmha_bf16_pair_rows_split_ukernel_16__scalar(const float *a, const float *b, uint32_t *hi,
                                                  uint32_t *lo) {
    float ra[NR], rb[NR];
    fmha_bf16_pair_rows_ukernel_16__scalar(a, b, hi);
    for (size_t i = 0; i < NR; i++) {
        ra[i] = a[i] - fmha_bf16_widen__scalar((uint16_t)hi[i]);
        rb[i] = (b ? b[i] : 0.0f) - fmha_bf16_widen__scalar((uint16_t)(hi[i] >> 16));
    }
    fmha_bf16_pair_rows_ukernel_16__scalar(ra, rb, lo);
}

/* ---- Arm BF16 (BFDOT, BFMMLA without FEAT_EBF16) ----
 * Values travel as doubles: bf16 products and float32 sums of two are
 * exact in a double plus the rest TwoSum leaves, so every rounding below
 * is the one the Arm ARM's pseudocode makes of the exact value. */

static const uint32_t ARM_DEFAULT_NAN = 0x7FC00000u;

static float arm_bits_float(uint32_t u) {
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

static uint32_t arm_float_bits(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

/* BFUnpack of a float32's bits: a subnormal reads as a zero of its sign. */
static float arm_unpack(uint32_t u) { return (u & 0x7F800000u) == 0 ? arm_bits_float(u & 0x80000000u) : arm_bits_float(u); }

/* BFRound of x = s + e, x != 0 (s: x rounded to double, e: the exact rest):
 * |x| below 2^-126 gives a zero of x's sign (the flush looks at x before
 * rounding), 2^128 and above an infinity; otherwise x truncated to 24
 * significant bits, with the last bit set when that dropped anything
 * (round to odd). Round to odd never carries into the next binade. */
static float arm_round(double s, double e) {
    const uint32_t sign = s < 0 ? 0x80000000u : 0u;
    const double as = fabs(s), ae = s < 0 ? -e : e; /* |x| = as + ae */
    uint32_t bits;
    if (as < 0x1p-126) {
        /* a sum of two float32 below 2^-96 is exact in a double: ae == 0 */
        bits = 0;
    } else if (as >= 0x1p128) {
        bits = as == 0x1p128 && ae < 0 ? 0x7F7FFFFFu : 0x7F800000u;
    } else {
        uint64_t d;
        memcpy(&d, &as, sizeof d);
        d &= ~(((uint64_t)1 << 29) - 1); /* 53 - 24 bits dropped */
        double t;
        memcpy(&t, &d, sizeof t);
        bits = arm_float_bits((float)t); /* exact: a normal float32 */
        const double dropped = as - t;   /* exact */
        if (dropped == 0 && ae < 0) bits -= 1; /* |x| just below t: its truncation is the float below */
        if (dropped != 0 || ae != 0) bits |= 1u;
    }
    return arm_bits_float(sign | bits);
}

static int arm_is_nan(float x) { return x != x; }

/* BFMul of two bf16 (widened, subnormals already flushed). */
static float arm_mul(float x, float y) {
    if (arm_is_nan(x) || arm_is_nan(y) || (isinf(x) && y == 0) || (x == 0 && isinf(y)))
        return arm_bits_float(ARM_DEFAULT_NAN);
    if (isinf(x) || isinf(y) || x == 0 || y == 0) return x * y; /* a signed infinity or zero */
    return arm_round((double)x * (double)y, 0.0);          /* 16 significant bits: exact */
}

/* BFAdd of two float32 (subnormals already flushed). */
static float arm_add(float x, float y) {
    if (arm_is_nan(x) || arm_is_nan(y) || (isinf(x) && isinf(y) && signbit(x) != signbit(y)))
        return arm_bits_float(ARM_DEFAULT_NAN);
    if (isinf(x)) return x;
    if (isinf(y)) return y;
    if (x == 0 && y == 0 && signbit(x) == signbit(y)) return x;
    const double s = (double)x + (double)y, v = s - (double)x;
    const double e = ((double)x - (s - v)) + ((double)y - v); /* TwoSum: s + e == x + y */
    if (s == 0) return 0.0f;                                    /* an exact zero is +0 */
    return arm_round(s, e);
}

float fmha_bf16_dot_add__arm(float acc, uint32_t a, uint32_t b) {
    const float lo = arm_mul(arm_unpack(a << 16), arm_unpack(b << 16));
    const float hi = arm_mul(arm_unpack(a & 0xFFFF0000u), arm_unpack(b & 0xFFFF0000u));
    return arm_add(arm_unpack(arm_float_bits(acc)), arm_add(lo, hi));
}

/* C[m x 16] (op)= ab_scale * A B, each accumulator summed from +0 over the
 * pair-steps in order by BFDotAdd, then finished as the vdpbf16ps
 * specification above finishes it. */
void fmha_bf16_gemm_ukernel_4x16__arm(size_t m, size_t kp, const uint32_t *a, ptrdiff_t a_rs, ptrdiff_t a_cs,
                                      const uint32_t *b, size_t ldb, float *c, size_t ldc, int mode,
                                      const float *col_scale, float ab_scale) {
    for (size_t r = 0; r < m; r++) {
        float acc[NR] = {0};
        for (size_t p = 0; p < kp; p++) {
            const uint32_t wa = a[(ptrdiff_t)r * a_rs + (ptrdiff_t)p * a_cs];
            for (size_t j = 0; j < NR; j++) acc[j] = fmha_bf16_dot_add__arm(acc[j], wa, b[p * ldb + j]);
        }
        finish_row(acc, c + r * ldc, mode, col_scale, ab_scale);
    }
}
