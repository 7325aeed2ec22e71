/* avx512vnni/table.c: the ISA of AVX-512 CPUs with AVX512-VNNI (Ice Lake,
 * Cascade Lake, Zen 4 and later): the AVX-512 parts, and cache parts whose
 * 8-bit and 4-bit keys take integer scores (decode_q8.c) under precision
 * FAST. avx512bf16 and amx build on these cache parts too. */
#include "../avx512/decode.h"
#include "../avx512/parts.h"
#include "decode.h"

/* AVX-512's kernels of each format, and the integer scores */
const fmha_uk_cache fmha_uk_caches__avx512vnni[FMHA_FORMAT_COUNT] = FMHA_AVX512_CACHES(
    fmha_int8kv_scores_q8__avx512vnni, fmha_q8_0kv_scores_q8__avx512vnni, fmha_q4_0kv_scores_q8__avx512vnni);

const fmha_isa_parts fmha_isa_avx512vnni = {
    .isa = "avx512vnni",
    .tile = &fmha_uk_tile__avx512,
    .rows = &fmha_uk_rows__avx512,
    .decode = &fmha_uk_decode__avx512,
    .cache = FMHA_CACHE_PARTS(fmha_uk_caches__avx512vnni),
};
