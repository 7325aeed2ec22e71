/* avx512vnni/decode.h: the AVX512-VNNI decode microkernels (integer scores
 * on the q8_0 query, decode_q8.c; P V on 16-bit P, values_int.c) and the cache parts of the tables built
 * on them (avx512vnni, avx512bf16, amx). */
#ifndef FMHA_UK_AVX512VNNI_DECODE_H
#define FMHA_UK_AVX512VNNI_DECODE_H

#include "../ukernel.h"

void fmha_int8kv_scores_q8__avx512vnni(size_t rows, size_t nk, size_t d, const fmha_q8_rows *q, const void *k,
                                       size_t ldk, float *s, size_t lds, float scale);
void fmha_q8_0kv_scores_q8__avx512vnni(size_t rows, size_t nk, size_t d, const fmha_q8_rows *q, const void *k,
                                       size_t ldk, float *s, size_t lds, float scale);
void fmha_q4_0kv_scores_q8__avx512vnni(size_t rows, size_t nk, size_t d, const fmha_q8_rows *q, const void *k,
                                       size_t ldk, float *s, size_t lds, float scale);

void fmha_int8kv_values_int__avx512vnni(size_t rows, size_t nk, size_t dv, const float *p, size_t ldp,
                                        const void *const *v_rows, float *o, size_t ldo, const float *alpha);
void fmha_q8_0kv_values_int__avx512vnni(size_t rows, size_t nk, size_t dv, const float *p, size_t ldp,
                                        const void *const *v_rows, float *o, size_t ldo, const float *alpha);
void fmha_q4_0kv_values_int__avx512vnni(size_t rows, size_t nk, size_t dv, const float *p, size_t ldp,
                                        const void *const *v_rows, float *o, size_t ldo, const float *alpha);

/* every cache format's kernels: AVX-512's, with the integer ones */
extern const fmha_uk_cache fmha_uk_caches__avx512vnni[FMHA_FORMAT_COUNT];

/* The integer kernels of a format (FMHA_AVX512_CACHES's pairs); the
 * scores read the query's tiles from 16 rows a call. */
#define FMHA_AVX512VNNI_INTEGER(name)                                                                   \
    fmha_##name##kv_scores_q8__avx512vnni, fmha_##name##kv_values_int__avx512vnni, .q8_tiles = 1

#endif /* FMHA_UK_AVX512VNNI_DECODE_H */
