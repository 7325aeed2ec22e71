/* avx512vnni/table.c: the ISA of AVX-512 CPUs with AVX512-VNNI (Ice Lake,
 * Cascade Lake, Zen 4 and later): the AVX-512 parts, and cache parts whose
 * 8-bit and 4-bit rows take integer dot products under precision FAST:
 * scores on the q8_0 query (decode_q8.c), P V on 16-bit P (values_int.c). avx512bf16 and amx build on these cache parts too. */
#include "../avx512/decode.h"
#include "../avx512/parts.h"
#include "decode.h"

/* AVX-512's kernels of each format, and the integer ones (scores on the
 * q8_0 query, P V on 16-bit P) */
const fmha_uk_cache fmha_uk_caches__avx512vnni[FMHA_FORMAT_COUNT] =
    FMHA_AVX512_CACHES(FMHA_AVX512VNNI_INTEGER(int8), FMHA_AVX512VNNI_INTEGER(q8_0), FMHA_AVX512VNNI_INTEGER(q4_0),
                       FMHA_NO_FP8_PAIRS, FMHA_NO_FP8_PAIRS, FMHA_AVX512_FORMAT(e4m3), FMHA_AVX512_FORMAT(e5m2),
                       FMHA_NO_BF16_PAIRS);

const fmha_isa_parts fmha_isa_avx512vnni = {
    .isa = "avx512vnni",
    .tile = &fmha_uk_tile__avx512,
    .rows = &fmha_uk_rows__avx512,
    .decode = &fmha_uk_decode__avx512,
    .cache = FMHA_CACHE_PARTS(fmha_uk_caches__avx512vnni),
};
