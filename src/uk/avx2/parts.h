/* avx2/parts.h: the AVX2 ISA's parts (f32.c), shared by the tables built
 * on AVX2 (avx2, avx2vnni). */
#ifndef FMHA_UK_AVX2_PARTS_H
#define FMHA_UK_AVX2_PARTS_H

#include "../ukernel.h"
#include "decode.h"

extern const fmha_uk_tile fmha_uk_tile__avx2;
extern const fmha_uk_decode fmha_uk_decode__avx2;
extern const fmha_uk_cache fmha_uk_caches__avx2[FMHA_FORMAT_COUNT];

/* Every format's AVX2 kernels, an fmha_uk_cache [FMHA_FORMAT_COUNT]
 * initializer: float32's scores and values, the other formats' loads
 * (their rows are staged as float32), with the integer scores of int8,
 * q8_0 and q4_0 keys (NULL: none). */
#define FMHA_AVX2_CACHES(int8_q8, q8_0_q8, q4_0_q8)                                                                    \
    {                                                                                                                  \
        [FMHA_FORMAT_F32] = {.scores = fmha_f32_decode_scores__avx2, .values = fmha_f32_decode_values__avx2},         \
        [FMHA_FORMAT_BF16] = {.load = fmha_widen_bf16__avx2}, [FMHA_FORMAT_F16] = {.load = fmha_widen_f16__avx2},     \
        [FMHA_FORMAT_INT8] = {.load = fmha_widen_int8__avx2, .scores_q8 = int8_q8},                                    \
        [FMHA_FORMAT_FP8_E4M3] = {.load = fmha_widen_e4m3__avx2},                                                      \
        [FMHA_FORMAT_FP8_E5M2] = {.load = fmha_widen_e5m2__avx2},                                                      \
        [FMHA_FORMAT_Q8_0] = {.load = fmha_widen_q8_0__avx2, .scores_q8 = q8_0_q8},                                    \
        [FMHA_FORMAT_Q4_0] = {.load = fmha_widen_q4_0__avx2, .scores_q8 = q4_0_q8},                                    \
    }

#endif /* FMHA_UK_AVX2_PARTS_H */
