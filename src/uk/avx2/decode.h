/* avx2/decode.h: the AVX2 decode microkernels (decode.c) for the AVX2 table. */
#ifndef FMHA_UK_AVX2_DECODE_H
#define FMHA_UK_AVX2_DECODE_H

#include "../ukernel.h"

void fmha_f32_decode_scores__avx2(size_t rows, size_t nk, size_t d, const float *q, size_t ldq,
                                  const void *k_row0, size_t ldk, float *s, size_t lds, float scale);
void fmha_f32_decode_softmax__avx2(size_t rows, size_t nk, float *s, size_t lds, float *m, float *l,
                                   float *alpha);
void fmha_f32_decode_values__avx2(size_t rows, size_t nk, size_t dv, const float *p, size_t ldp,
                                  const void *v_row0, size_t ldv, float *o, size_t ldo, const float *alpha);
void fmha_widen_bf16__avx2(size_t n, const void *src_row, float *dst);
void fmha_widen_f16__avx2(size_t n, const void *src_row, float *dst);
void fmha_widen_int8__avx2(size_t n, const void *src_row, float *dst);
void fmha_widen_e4m3__avx2(size_t n, const void *src_row, float *dst);
void fmha_widen_e5m2__avx2(size_t n, const void *src_row, float *dst);
void fmha_widen_q8_0__avx2(size_t n, const void *src_row, float *dst);
void fmha_widen_q4_0__avx2(size_t n, const void *src_row, float *dst);
/* y[i] = exp(x[i]) (f32.c) */
void fmha_f32_exp__avx2(size_t n, const float *x, float *y);

#endif /* FMHA_UK_AVX2_DECODE_H */
