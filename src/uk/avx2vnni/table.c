/* avx2vnni/table.c: the ISA of AVX2 cores with AVX-VNNI (and no AVX-512:
 * Alder Lake, Arrow Lake, Sierra Forest): the AVX2 parts, with integer
 * scores for int8, q8_0 and q4_0 keys (decode_q8.c) under precision FAST. */
#include "../avx2/parts.h"
#include "decode.h"

static const fmha_uk_cache avx2vnni_caches[FMHA_FORMAT_COUNT] = FMHA_AVX2_CACHES(
    fmha_int8kv_scores_q8__avx2vnni, fmha_q8_0kv_scores_q8__avx2vnni, fmha_q4_0kv_scores_q8__avx2vnni);

const fmha_isa_parts fmha_isa_avx2vnni = {
    .isa = "avx2vnni",
    .tile = &fmha_uk_tile__avx2,
    .decode = &fmha_uk_decode__avx2,
    .cache = FMHA_CACHE_PARTS(avx2vnni_caches),
};
