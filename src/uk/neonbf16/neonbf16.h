/* neonbf16/neonbf16.h: the Armv8.6 BF16 microkernels (gemm.c: the pair
 * GEMM on BFMMLA; cvt.c: float32 to bf16 with BFCVTN), exported for the
 * table's parts (table.c) and the tests. Contracts in ../ukernel.h. Only
 * callable on CPUs with FEAT_BF16 (HWCAP2_BF16). */
#ifndef FMHA_UK_NEONBF16_H
#define FMHA_UK_NEONBF16_H

#include <stddef.h>
#include <stdint.h>

/* The GEMM's tile: the neon table's MR and NR. */
enum { FMHA_NEONBF16_MR = 6, FMHA_NEONBF16_NR = 16 };

/* C[m x 16] (op)= ab_scale * A[m x 2kp] B[2kp x 16], 1 <= m <= 6, kp >= 0,
 * with the arithmetic of fmha_bf16_gemm_ukernel_4x16__arm (BFDotAdd: round
 * to odd, flushed subnormals, the default NaN), bit for bit. */
void fmha_bf16_gemm_ukernel_6x16__neonbf16(size_t m, size_t kp, const uint32_t *a, ptrdiff_t a_rs,
                                           ptrdiff_t a_cs, const uint32_t *b, size_t ldb, float *c, size_t ldc,
                                           int mode, const float *col_scale, float ab_scale);

/* dst[i] = (bf16(lo[i]), bf16(hi[i])) for i < 16; hi == NULL pairs with +0. */
void fmha_bf16_pair_rows_ukernel_16__neonbf16(const float *lo, const float *hi, uint32_t *dst);

/* hi = pairs of bf16(a), bf16(b); lo = pairs of the rounding residuals. */
void fmha_bf16_pair_rows_split_ukernel_16__neonbf16(const float *a, const float *b, uint32_t *hi, uint32_t *lo);

/* Rows of n float32 rounded and paired in place order. */
void fmha_bf16_pack_rows_ukernel__neonbf16(size_t rows, size_t n, const float *src, size_t lds, uint32_t *dst,
                                           size_t ldd);

/* The neon table's online-softmax step with P written as pair-rows. */
void fmha_bf16_softmax_pairs_ukernel_16__neonbf16(size_t rows, const float *s, size_t lds, float *m, float *l,
                                                  float *alpha, uint32_t *pairs);

/* float32 to bf16, fmha_f32_to_bf16's bits (the neon kernel when FPCR is
 * not the default). */
void fmha_f32_to_bf16_ukernel__neonbf16(size_t n, const float *src, uint16_t *dst);

#endif /* FMHA_UK_NEONBF16_H */
