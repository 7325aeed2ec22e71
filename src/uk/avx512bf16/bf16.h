/* avx512bf16/bf16.h: the AVX-512 BF16 microkernels (vdpbf16ps GEMM on
 * pair-packed operands, and the float32 -> bf16 pair-row rounding), exported
 * so a kernel table and the tests can reference them. Contract in
 * ../ukernel.h (fmha_bf16_gemm_ukernel_fn, fmha_bf16_pair_rows_ukernel_fn).
 * Only callable on CPUs with AVX512F, AVX512BW and AVX512_BF16. */
#ifndef FMHA_UK_AVX512BF16_BF16_H
#define FMHA_UK_AVX512BF16_BF16_H

#include <stddef.h>
#include <stdint.h>

/* Tile of the GEMM: MR rows (keys / output rows), NR lanes (queries). */
enum { FMHA_AVX512BF16_MR = 6, FMHA_AVX512BF16_NR = 64 };

/* C[m x 64] (op)= ab_scale * A[m x 2kp] B[2kp x 64], 1 <= m <= 6, kp >= 0. */
void fmha_bf16_gemm_ukernel_6x64__avx512bf16(size_t m, size_t kp, const uint32_t *a,
                                             ptrdiff_t a_rs, ptrdiff_t a_cs, const uint32_t *b,
                                             size_t ldb, float *c, size_t ldc, int mode,
                                             const float *col_scale, float ab_scale);

/* dst[i] = (bf16(lo[i]), bf16(hi[i])) for i < 64, round to nearest even;
 * hi == NULL pairs with +0. NaN stays NaN (quieted); float32 subnormal
 * inputs become a signed zero (the instruction's fixed DAZ). */
void fmha_bf16_pair_rows_ukernel_64__avx512bf16(const float *lo, const float *hi, uint32_t *dst);

/* Rows of n float32 rounded and paired in place order (cvt.c). */
void fmha_bf16_pack_rows_ukernel__avx512bf16(size_t rows, size_t n, const float *src, size_t lds,
                                             uint32_t *dst, size_t ldd);

/* hi = pairs of bf16(a), bf16(b); lo = pairs of the rounding residuals (cvt.c). */
void fmha_bf16_pair_rows_split_ukernel_64__avx512bf16(const float *a, const float *b, uint32_t *hi,
                                                      uint32_t *lo);

/* The online-softmax step of softmax_lowp_f32 (avx512/f32.c) with P written
 * as bf16 pair-rows of pair_rows_bf16 instead of in place (bf16.c). */
void fmha_bf16_softmax_pairs_ukernel_64__avx512bf16(size_t rows, const float *s, size_t lds, float *m, float *l,
                                                    float *alpha, uint32_t *pairs);

/* Scores of float8 and bf16 keys on the bf16 query (by 4 x 4 blocks and
 * with 16 rows in the lanes), P V on bf16 P (decode_bf16.c;
 * fmha_cache_scores_bf16_ukernel_fn, fmha_cache_scores_bf16_qt_ukernel_fn,
 * fmha_cache_values_bf16_ukernel_fn). */
void fmha_bf16kv_scores_bf16__avx512bf16(size_t rows, size_t nk, size_t d, const uint32_t *q, size_t ldq,
                                         const void *k, size_t ldk, float *s, size_t lds, float scale);
void fmha_bf16kv_scores_bf16_qt__avx512bf16(size_t rows, size_t nk, size_t d, const uint32_t *qt, const void *k,
                                            size_t ldk, float *s, size_t lds, float scale);
void fmha_bf16kv_values_bf16__avx512bf16(size_t rows, size_t nk, size_t dv, const float *p, size_t ldp,
                                         const void *const *v_rows, float *o, size_t ldo, const float *alpha);
void fmha_e4m3kv_values_bf16__avx512bf16(size_t rows, size_t nk, size_t dv, const float *p, size_t ldp,
                                         const void *const *v_rows, float *o, size_t ldo, const float *alpha);
void fmha_e5m2kv_values_bf16__avx512bf16(size_t rows, size_t nk, size_t dv, const float *p, size_t ldp,
                                         const void *const *v_rows, float *o, size_t ldo, const float *alpha);
void fmha_e4m3kv_scores_bf16__avx512bf16(size_t rows, size_t nk, size_t d, const uint32_t *q, size_t ldq,
                                         const void *k, size_t ldk, float *s, size_t lds, float scale);
void fmha_e4m3kv_scores_bf16_qt__avx512bf16(size_t rows, size_t nk, size_t d, const uint32_t *qt, const void *k,
                                            size_t ldk, float *s, size_t lds, float scale);
void fmha_e5m2kv_scores_bf16_qt__avx512bf16(size_t rows, size_t nk, size_t d, const uint32_t *qt, const void *k,
                                            size_t ldk, float *s, size_t lds, float scale);
/* float8 values read in place through the bf16 table (fmha_cache_values_ukernel_fn;
 * the bits of avx512's values kernels) */
void fmha_e4m3kv_decode_values__avx512bf16(size_t rows, size_t nk, size_t dv, const float *p, size_t ldp,
                                           const void *v, size_t ldv, float *o, size_t ldo, const float *alpha);
void fmha_e5m2kv_decode_values__avx512bf16(size_t rows, size_t nk, size_t dv, const float *p, size_t ldp,
                                           const void *v, size_t ldv, float *o, size_t ldo, const float *alpha);
/* float8 rows widened to float32 through the bf16 table (fmha_load_ukernel_fn) */
void fmha_widen_e4m3__avx512bf16(size_t n, const void *src_row, float *dst);
void fmha_widen_e5m2__avx512bf16(size_t n, const void *src_row, float *dst);
void fmha_e5m2kv_scores_bf16__avx512bf16(size_t rows, size_t nk, size_t d, const uint32_t *q, size_t ldq,
                                         const void *k, size_t ldk, float *s, size_t lds, float scale);

/* every cache format's kernels (table.c): avx512vnni's, with the bf16
 * scores of float8 keys (not the amx table's: on Sapphire Rapids
 * vdpbf16ps issues at a quarter of the FMA's rate, a product pair taking
 * twice an FMA's time) */
#include "../ukernel.h"
extern const fmha_uk_cache fmha_uk_caches__avx512bf16[FMHA_FORMAT_COUNT];

#endif /* FMHA_UK_AVX512BF16_BF16_H */
