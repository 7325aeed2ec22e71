/* avx2vnni/decode.h: the AVX-VNNI decode microkernels (integer scores on
 * the q8_0 query, decode_q8.c) for the avx2vnni table. */
#ifndef FMHA_UK_AVX2VNNI_DECODE_H
#define FMHA_UK_AVX2VNNI_DECODE_H

#include "../ukernel.h"

void fmha_int8kv_scores_q8__avx2vnni(size_t rows, size_t nk, size_t d, const fmha_q8_rows *q, const void *k,
                                     size_t ldk, float *s, size_t lds, float scale);
void fmha_q8_0kv_scores_q8__avx2vnni(size_t rows, size_t nk, size_t d, const fmha_q8_rows *q, const void *k,
                                     size_t ldk, float *s, size_t lds, float scale);
void fmha_q4_0kv_scores_q8__avx2vnni(size_t rows, size_t nk, size_t d, const fmha_q8_rows *q, const void *k,
                                     size_t ldk, float *s, size_t lds, float scale);

#endif /* FMHA_UK_AVX2VNNI_DECODE_H */
