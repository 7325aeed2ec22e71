/* avx512/f32.h: the AVX-512 float32 microkernels, exported so that the
 * avx512 and avx512bf16 kernel tables (and the tests) can both reference
 * them. Contracts in ../ukernel.h. Only callable on CPUs with AVX512F, BW,
 * VL and DQ. */
#ifndef FMHA_UK_AVX512_F32_H
#define FMHA_UK_AVX512_F32_H

#include <stddef.h>
#include <stdint.h>

/* Tile of the GEMM: MR rows, NR lanes; keys per tile of the tiled forward. */
enum { FMHA_AVX512_MR = 6, FMHA_AVX512_NR = 64, FMHA_AVX512_BLOCK_KV = 128 };
/* The tall tiles' lanes (f32_tall.c): 12 x 32 and 14 x 32. */
enum { FMHA_AVX512_TALL_NR = 32 };

/* C[m x 64] (op)= ab_scale * A[m x k] B[k x 64], 1 <= m <= 6 (fmha_f32_gemm_ukernel_fn). */
void fmha_f32_gemm_ukernel_6x64__avx512(size_t m, size_t k, const float *a, ptrdiff_t a_rs,
                                        ptrdiff_t a_cs, const float *b, size_t ldb, float *c,
                                        size_t ldc, int mode, const float *col_scale,
                                        float ab_scale);

/* The tall tiles (fmha_f32_gemm_ukernel_fn): C[m x 32], m <= 12 or 14. */
void fmha_f32_gemm_ukernel_12x32__avx512(size_t m, size_t k, const float *a, ptrdiff_t a_rs, ptrdiff_t a_cs,
                                         const float *b, size_t ldb, float *c, size_t ldc, int mode,
                                         const float *col_scale, float ab_scale);
void fmha_f32_gemm_ukernel_14x32__avx512(size_t m, size_t k, const float *a, ptrdiff_t a_rs, ptrdiff_t a_cs,
                                         const float *b, size_t ldb, float *c, size_t ldc, int mode,
                                         const float *col_scale, float ab_scale);
/* Their lane-wise kernels on 32 lanes, as the 64-lane ones below. */
void fmha_f32_softmax_ukernel_32__avx512(size_t rows, float *s, size_t lds, float *m, float *l, float *alpha);
void fmha_f32_softmax_lowp_ukernel_32__avx512(size_t rows, float *s, size_t lds, float *m, float *l,
                                              float *alpha);
void fmha_f32_exp_sub_ukernel_32__avx512(size_t rows, float *s, size_t lds, const float *sub);
void fmha_f32_exp_sub_lowp_ukernel_32__avx512(size_t rows, float *s, size_t lds, const float *sub);
void fmha_f32_ds_ukernel_32__avx512(size_t rows, const float *p, float *dp, size_t lds, const float *dsum);

/* Online-softmax step over S^T [rows][64] (fmha_f32_softmax_ukernel_fn). */
void fmha_f32_softmax_ukernel_64__avx512(size_t rows, float *s, size_t lds, float *m, float *l,
                                         float *alpha);
/* The same with P to 3e-6 relative (softmax_lowp_f32 of the bf16 table). */
void fmha_f32_softmax_lowp_ukernel_64__avx512(size_t rows, float *s, size_t lds, float *m, float *l,
                                              float *alpha);

/* s = exp(s - sub) lane-wise (fmha_f32_exp_sub_ukernel_fn). */
void fmha_f32_exp_sub_ukernel_64__avx512(size_t rows, float *s, size_t lds, const float *sub);
/* The same with P to 3e-6 relative (exp_sub_lowp_f32). */
void fmha_f32_exp_sub_lowp_ukernel_64__avx512(size_t rows, float *s, size_t lds, const float *sub);

/* dp = p (dp - dsum) lane-wise (fmha_f32_ds_ukernel_fn). */
void fmha_f32_ds_ukernel_64__avx512(size_t rows, const float *p, float *dp, size_t lds,
                                    const float *dsum);

/* y += a x, one FMA each (fmha_f32_axpy_ukernel_fn). */
void fmha_f32_axpy_ukernel__avx512(size_t n, float a, const float *x, float *y);
/* x[r][j] *= sc[j] (fmha_f32_scale_columns_ukernel_fn). */
void fmha_f32_scale_columns_ukernel__avx512(size_t rows, size_t n, const float *sc, float *x, size_t ldx);
/* Any NaN or infinity (fmha_f32_nonfinite_ukernel_fn). */
int fmha_f32_nonfinite_ukernel__avx512(size_t rows, size_t n, const float *x, size_t ldx);
/* dst[c][r] = src[r][c] (fmha_f32_transpose_ukernel_fn). */
void fmha_f32_transpose_ukernel__avx512(size_t rows, size_t cols, const float *src, size_t lds, float *dst,
                                        size_t ldd);
/* dst[i] = bf16(src[i]) (fmha_f32_to_bf16_ukernel_fn). */
void fmha_f32_to_bf16_ukernel__avx512(size_t n, const float *src, uint16_t *dst);
/* dst[i] = lo[i] | hi[i] << 16 (fmha_u16_interleave_ukernel_fn). */
void fmha_u16_interleave_ukernel__avx512(size_t n, const uint16_t *lo, const uint16_t *hi, uint32_t *dst);
/* o[i][c] = ot[c][i] scale[i] (fmha_f32_finish_ukernel_fn). */
uint64_t fmha_f32_finish_ukernel__avx512(size_t rows, size_t cols, const float *ot, size_t ldt,
                                         const float *scale, float *o, size_t ldo);
/* st[r][i] += src[i * q_stride + r] (fmha_f32_add_transposed_ukernel_fn). */
void fmha_f32_add_transposed_ukernel__avx512(size_t nk, size_t nq, const float *src,
                                             ptrdiff_t q_stride, float *st, size_t lds);

/* y[i] = exp(x[i]) over any n: the exp of these kernels, for the tests. */
void fmha_f32_exp__avx512(size_t n, const float *x, float *y);

#endif /* FMHA_UK_AVX512_F32_H */
