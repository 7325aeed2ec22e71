/* avx512bf16/table.c: the ISA of CPUs with AVX512_BF16 and AVX512-VBMI
 * (and AVX512-VNNI, which every one of them has): the AVX-512 parts
 * (avx512/parts.h: same MR, NR and tile sizes) with avx512vnni's integer
 * kernels and this directory's float8 kernels (decode_bf16.c: bf16 scores
 * of float8 keys, float8 rows loaded and values taken through their bf16
 * table) in the cache parts, plus the bf16 part of its vdpbf16ps kernels. */
#include "../avx512/decode.h"
#include "../avx512/f32.h"
#include "../avx512/parts.h"
#include "../avx512vnni/decode.h"
#include "bf16.h"

/* float8 rows loaded and their values taken through the bf16 table
 * (decode_bf16.c), their float32-query scores avx512's */
#define AVX512BF16_FP8(name) \
    fmha_widen_##name##__avx512bf16, fmha_##name##kv_decode_scores__avx512, fmha_##name##kv_decode_values__avx512bf16
/* and their scores on the bf16 query (FAST), by 4 x 4 blocks and with 16 rows in the lanes, and
 * P V on bf16 P */
#define AVX512BF16_FP8_PAIRS(name)                                                                                     \
    .scores_bf16 = fmha_##name##kv_scores_bf16__avx512bf16,                                                           \
    .scores_bf16_qt = fmha_##name##kv_scores_bf16_qt__avx512bf16, .values_bf16 = fmha_##name##kv_values_bf16__avx512bf16
const fmha_uk_cache fmha_uk_caches__avx512bf16[FMHA_FORMAT_COUNT] =
    FMHA_AVX512_CACHES(FMHA_AVX512VNNI_INTEGER(int8), FMHA_AVX512VNNI_INTEGER(q8_0), FMHA_AVX512VNNI_INTEGER(q4_0),
                       AVX512BF16_FP8_PAIRS(e4m3), AVX512BF16_FP8_PAIRS(e5m2), AVX512BF16_FP8(e4m3),
                       AVX512BF16_FP8(e5m2),
                       .scores_bf16 = fmha_bf16kv_scores_bf16__avx512bf16,
                       .scores_bf16_qt = fmha_bf16kv_scores_bf16_qt__avx512bf16,
                       .values_bf16 = fmha_bf16kv_values_bf16__avx512bf16);

_Static_assert((int)FMHA_AVX512BF16_MR == (int)FMHA_AVX512_MR &&
                   (int)FMHA_AVX512BF16_NR == (int)FMHA_AVX512_NR,
               "the bf16 and float32 kernels of a table share MR and NR");

static const fmha_uk_bf16 avx512bf16_pairs = {
    .gemm = fmha_bf16_gemm_ukernel_6x64__avx512bf16,
    .pair_rows = fmha_bf16_pair_rows_ukernel_64__avx512bf16,
    .pair_rows_split = fmha_bf16_pair_rows_split_ukernel_64__avx512bf16,
    .pack_rows = fmha_bf16_pack_rows_ukernel__avx512bf16,
    .softmax_pairs = fmha_bf16_softmax_pairs_ukernel_64__avx512bf16,
};

const fmha_isa_parts fmha_isa_avx512bf16 = {
    .isa = "avx512bf16",
    .tile = &fmha_uk_tile__avx512,
    .bf16 = &avx512bf16_pairs,
    .rows = &fmha_uk_rows__avx512,
    .decode = &fmha_uk_decode__avx512,
    .cache = FMHA_CACHE_PARTS(fmha_uk_caches__avx512bf16),
};
