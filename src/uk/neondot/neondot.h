/* neondot/neondot.h: the Armv8.2 dot-product decode microkernels (integer
 * scores on the q8_0 query, decode_q8.c) and the cache parts of the tables
 * that have them (neondot, neonbf16). */
#ifndef FMHA_UK_NEONDOT_H
#define FMHA_UK_NEONDOT_H

#include "../ukernel.h"

void fmha_int8kv_scores_q8__neondot(size_t rows, size_t nk, size_t d, const fmha_q8_rows *q, const void *k, size_t ldk,
                                    float *s, size_t lds, float scale);
void fmha_q8_0kv_scores_q8__neondot(size_t rows, size_t nk, size_t d, const fmha_q8_rows *q, const void *k, size_t ldk,
                                    float *s, size_t lds, float scale);
void fmha_q4_0kv_scores_q8__neondot(size_t rows, size_t nk, size_t d, const fmha_q8_rows *q, const void *k, size_t ldk,
                                    float *s, size_t lds, float scale);

/* int8's, q8_0's and q4_0's kernels: NEON's, with the integer scores (table.c) */
extern const fmha_uk_cache fmha_uk_cache_int8__neondot, fmha_uk_cache_q8_0__neondot, fmha_uk_cache_q4_0__neondot;

/* The cache parts of a table built on NEON with the dot product. */
#define FMHA_NEONDOT_CACHE_PARTS                                                                                       \
    {                                                                                                                  \
        [FMHA_FORMAT_F32] = &fmha_uk_cache_f32__neon, [FMHA_FORMAT_BF16] = &fmha_uk_cache_bf16__neon,                  \
        [FMHA_FORMAT_F16] = &fmha_uk_cache_f16__neon, [FMHA_FORMAT_INT8] = &fmha_uk_cache_int8__neondot,               \
        [FMHA_FORMAT_FP8_E4M3] = &fmha_uk_cache_e4m3__neon, [FMHA_FORMAT_FP8_E5M2] = &fmha_uk_cache_e5m2__neon,        \
        [FMHA_FORMAT_Q8_0] = &fmha_uk_cache_q8_0__neondot, [FMHA_FORMAT_Q4_0] = &fmha_uk_cache_q4_0__neondot           \
    }

#endif /* FMHA_UK_NEONDOT_H */
