/* avx512/parts.h: the AVX-512 ISA's parts (table.c), shared by every table
 * built on AVX-512 (avx512, avx512bf16). */
#ifndef FMHA_UK_AVX512_PARTS_H
#define FMHA_UK_AVX512_PARTS_H

#include "../ukernel.h"

extern const fmha_uk_tile fmha_uk_tile__avx512;
extern const fmha_uk_rows fmha_uk_rows__avx512;
extern const fmha_uk_decode fmha_uk_decode__avx512;
/* every cache format's kernels, indexed by fmha_cache_format_id */
extern const fmha_uk_cache fmha_uk_caches__avx512[FMHA_FORMAT_COUNT];

/* The cache parts of a table built on AVX-512. */
#define FMHA_AVX512_CACHE_PARTS                                                                                        \
    {                                                                                                                  \
        &fmha_uk_caches__avx512[0], &fmha_uk_caches__avx512[1], &fmha_uk_caches__avx512[2],                            \
            &fmha_uk_caches__avx512[3], &fmha_uk_caches__avx512[4], &fmha_uk_caches__avx512[5],                        \
            &fmha_uk_caches__avx512[6], &fmha_uk_caches__avx512[7]                                                     \
    }
_Static_assert(FMHA_FORMAT_COUNT == 8, "FMHA_AVX512_CACHE_PARTS lists every format");

#endif /* FMHA_UK_AVX512_PARTS_H */
