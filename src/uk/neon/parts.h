/* neon/parts.h: the NEON ISA's parts (table.c), shared by every table
 * built on Advanced SIMD (neon, neonbf16, sve). */
#ifndef FMHA_UK_NEON_PARTS_H
#define FMHA_UK_NEON_PARTS_H

#include "../ukernel.h"

extern const fmha_uk_tile fmha_uk_tile__neon;
extern const fmha_uk_rows fmha_uk_rows__neon;
extern const fmha_uk_decode fmha_uk_decode__neon;
/* the cache formats' in-place kernels */
extern const fmha_uk_cache fmha_uk_cache_f32__neon, fmha_uk_cache_bf16__neon, fmha_uk_cache_f16__neon;
extern const fmha_uk_cache fmha_uk_cache_int8__neon, fmha_uk_cache_e4m3__neon, fmha_uk_cache_e5m2__neon;
extern const fmha_uk_cache fmha_uk_cache_q8_0__neon, fmha_uk_cache_q4_0__neon;

/* The cache parts of a table built on NEON: every format. */
#define FMHA_NEON_CACHE_PARTS                                                                                          \
    {                                                                                                                  \
        [FMHA_FORMAT_F32] = &fmha_uk_cache_f32__neon, [FMHA_FORMAT_BF16] = &fmha_uk_cache_bf16__neon,                  \
        [FMHA_FORMAT_F16] = &fmha_uk_cache_f16__neon, [FMHA_FORMAT_INT8] = &fmha_uk_cache_int8__neon,                  \
        [FMHA_FORMAT_FP8_E4M3] = &fmha_uk_cache_e4m3__neon, [FMHA_FORMAT_FP8_E5M2] = &fmha_uk_cache_e5m2__neon,        \
        [FMHA_FORMAT_Q8_0] = &fmha_uk_cache_q8_0__neon, [FMHA_FORMAT_Q4_0] = &fmha_uk_cache_q4_0__neon                 \
    }

#endif /* FMHA_UK_NEON_PARTS_H */
