/* neondot/table.c: the ISA of aarch64 CPUs with the dot product
 * (FEAT_DotProd, HWCAP_ASIMDDP: Cortex-A55/A76 and later, Neoverse N1 and
 * later, Graviton 2-4, Apple M1 and later): the neon parts, with integer
 * scores for int8, q8_0 and q4_0 keys on SDOT (decode_q8.c) under
 * precision FAST; neonbf16 shares these cache parts. */
#include "../neon/neon.h"
#include "../neon/parts.h"
#include "neondot.h"

/* neon's in-place kernels of a format, with its integer scores */
#define NEONDOT_PART(name)                                                                                             \
    const fmha_uk_cache fmha_uk_cache_##name##__neondot = {.scores = fmha_##name##kv_decode_scores__neon,              \
                                                           .values = fmha_##name##kv_decode_values__neon,              \
                                                           .scores_q8 = fmha_##name##kv_scores_q8__neondot};
NEONDOT_PART(int8)
NEONDOT_PART(q8_0)
NEONDOT_PART(q4_0)

const fmha_isa_parts fmha_isa_neondot = {
    .isa = "neondot",
    .tile = &fmha_uk_tile__neon,
    .rows = &fmha_uk_rows__neon,
    .decode = &fmha_uk_decode__neon,
    .cache = FMHA_NEONDOT_CACHE_PARTS,
};
