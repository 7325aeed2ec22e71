/* avx2/table.c: the avx2 ISA's parts besides its float32 tiles (f32.c):
 * the decode part (decode.c) and every format's kernels, and the ISA
 * itself (rows, the scalar part's; no bf16 part, no in-place cache
 * kernels). The decode and cache parts are shared with avx2vnni (parts.h). */
#include "parts.h"

const fmha_uk_decode fmha_uk_decode__avx2 = {.softmax = fmha_f32_decode_softmax__avx2};
const fmha_uk_cache fmha_uk_caches__avx2[FMHA_FORMAT_COUNT] = FMHA_AVX2_CACHES(NULL, NULL, NULL);

const fmha_isa_parts fmha_isa_avx2 = {
    .isa = "avx2",
    .tile = &fmha_uk_tile__avx2,
    .decode = &fmha_uk_decode__avx2,
    .cache = FMHA_CACHE_PARTS(fmha_uk_caches__avx2),
};
