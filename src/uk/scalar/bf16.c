/* scalar/bf16.c: the plain-C specifications of the bf16 microkernels, with
 * the arithmetic of vdpbf16ps spelled out: each pair-step adds two bf16
 * products (exact in float32) to a float32 accumulator, one rounding each.
 * Compiled with no ISA flags: runs on any CPU. */
#include "bf16.h"

#include <math.h>
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
        for (size_t j = 0; j < NR; j++) {
            float *cj = &c[r * ldc + j];
            *cj = mode == FMHA_UK_STORE        ? acc[j] * ab_scale
                  : mode == FMHA_UK_ACCUMULATE ? fmaf(acc[j], ab_scale, *cj)
                                               : fmaf(acc[j], ab_scale, *cj * col_scale[j]);
        }
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
