/* neon/parts.h: the NEON ISA's parts (table.c), shared by every table
 * built on Advanced SIMD (neon, neonbf16). */
#ifndef FMHA_UK_NEON_PARTS_H
#define FMHA_UK_NEON_PARTS_H

#include "../ukernel.h"

extern const fmha_uk_tile fmha_uk_tile__neon;
extern const fmha_uk_rows fmha_uk_rows__neon;
extern const fmha_uk_decode fmha_uk_decode__neon;
/* the cache formats with in-place kernels: float32, bf16, f16 */
extern const fmha_uk_cache fmha_uk_cache_f32__neon, fmha_uk_cache_bf16__neon, fmha_uk_cache_f16__neon;

/* The cache parts of a table built on NEON (other formats: NULL, the
 * scalar load kernels into float32 rows). */
#define FMHA_NEON_CACHE_PARTS                                                                                          \
    {                                                                                                                  \
        [FMHA_FORMAT_F32] = &fmha_uk_cache_f32__neon, [FMHA_FORMAT_BF16] = &fmha_uk_cache_bf16__neon,                  \
        [FMHA_FORMAT_F16] = &fmha_uk_cache_f16__neon                                                                   \
    }

#endif /* FMHA_UK_NEON_PARTS_H */
