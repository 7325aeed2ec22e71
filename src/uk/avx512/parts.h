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


#endif /* FMHA_UK_AVX512_PARTS_H */
