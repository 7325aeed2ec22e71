/* scalar/bf16.h: plain-C specifications of the bf16 microkernels (the
 * pair-packed GEMM with vdpbf16ps's arithmetic and with Arm BFDOT's, the two
 * pair-row kernels and the row packing), in the tile of the scalar
 * table (MR = 4, NR = 16). The SIMD bf16 kernels are tested against them.
 * They are not in fmha_ukernels_scalar: the portable strategy runs bf16
 * through widened float32 tiles. Contracts in ../ukernel.h. */
#ifndef FMHA_UK_SCALAR_BF16_H
#define FMHA_UK_SCALAR_BF16_H

#include <stddef.h>
#include <stdint.h>

enum { FMHA_SCALAR_BF16_MR = 4, FMHA_SCALAR_BF16_NR = 16 };

/* float32 -> bf16 bits, round to nearest even (normals, subnormals and
 * overflow to inf alike); a NaN keeps its sign and top payload bits and
 * gets the quiet bit, so it stays NaN. */
uint16_t fmha_bf16_round__scalar(float x);

/* The float32 value of bf16 bits (exact). */
float fmha_bf16_widen__scalar(uint16_t h);

/* C[m x 16] (op)= ab_scale * A[m x 2kp] B[2kp x 16], 1 <= m <= 4
 * (fmha_bf16_gemm_ukernel_fn). */
void fmha_bf16_gemm_ukernel_4x16__scalar(size_t m, size_t kp, const uint32_t *a, ptrdiff_t a_rs,
                                         ptrdiff_t a_cs, const uint32_t *b, size_t ldb, float *c,
                                         size_t ldc, int mode, const float *col_scale,
                                         float ab_scale);

/* Arm's BFDotAdd (BFDOT, and each of BFMMLA's two steps, without
 * FEAT_EBF16): acc + (a_lo b_lo + a_hi b_hi) for the bf16 halves of the
 * words a and b, where each product, their sum and the addition to acc is
 * rounded to odd in float32, subnormal inputs (bf16 halves and acc) and
 * results below 2^-126 become zeros of their sign, results of 2^128 and
 * above infinities, any NaN and inf - inf or 0 x inf the default NaN
 * (0x7FC00000), and an exact zero sum of nonzero terms +0. FPCR plays no
 * part. */
float fmha_bf16_dot_add__arm(float acc, uint32_t a, uint32_t b);

/* The pair GEMM of fmha_bf16_gemm_ukernel_fn with that arithmetic: each
 * accumulator starts at +0 and takes the pair-steps in order, then C is
 * finished as fmha_bf16_gemm_ukernel_4x16__scalar finishes it. The
 * specification of the neonbf16 GEMM, bit for bit. */
void fmha_bf16_gemm_ukernel_4x16__arm(size_t m, size_t kp, const uint32_t *a, ptrdiff_t a_rs, ptrdiff_t a_cs,
                                      const uint32_t *b, size_t ldb, float *c, size_t ldc, int mode,
                                      const float *col_scale, float ab_scale);

/* dst[i] = (bf16(lo[i]), bf16(hi[i])) for i < 16 (fmha_bf16_pair_rows_ukernel_fn). */
void fmha_bf16_pair_rows_ukernel_16__scalar(const float *lo, const float *hi, uint32_t *dst);

/* Rows of n float32 as pairs of adjacent elements (fmha_bf16_pack_rows_ukernel_fn). */
void fmha_bf16_pack_rows_ukernel__scalar(size_t rows, size_t n, const float *src, size_t lds,
                                         uint32_t *dst, size_t ldd);

/* hi = pairs of bf16(a), bf16(b); lo = pairs of the rounding residuals, for
 * i < 16 (fmha_bf16_pair_rows_split_ukernel_fn). */
void fmha_bf16_pair_rows_split_ukernel_16__scalar(const float *a, const float *b, uint32_t *hi,
                                                  uint32_t *lo);

#endif /* FMHA_UK_SCALAR_BF16_H */
