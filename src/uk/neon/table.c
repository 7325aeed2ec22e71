/* neon/table.c: the NEON ISA's parts, each defined once (parts.h shares
 * them with neonbf16 and sve): float32 tiles (6 x 16), row kernels,
 * decoding and the cache formats' kernels (every format read in place). No bf16 part: bf16
 * runs on widened float32 tiles; dropout takes the scalar kernel (64-bit
 * multiplies, which NEON lacks). */
#include "neon.h"
#include "parts.h"

const fmha_uk_tile fmha_uk_tile__neon = {
    .mr = FMHA_NEON_MR,
    .nr = FMHA_NEON_NR,
    .block_kv = FMHA_NEON_BLOCK_KV,
    .gemm = fmha_f32_gemm_ukernel_6x16__neon,
    .softmax = fmha_f32_softmax_ukernel_16__neon,
    .exp_sub = fmha_f32_exp_sub_ukernel_16__neon,
    .ds = fmha_f32_ds_ukernel_16__neon,
};

const fmha_uk_rows fmha_uk_rows__neon = {
    .add_transposed = fmha_f32_add_transposed_ukernel__neon,
    .finish = fmha_f32_finish_ukernel__neon,
    .transpose = fmha_f32_transpose_ukernel__neon,
    .to_bf16 = fmha_f32_to_bf16_ukernel__neon,
    .interleave_u16 = fmha_u16_interleave_ukernel__neon,
};

const fmha_uk_decode fmha_uk_decode__neon = {.softmax = fmha_f32_decode_softmax__neon};

const fmha_uk_cache fmha_uk_cache_f32__neon = {
    .scores = fmha_f32_decode_scores__neon,
    .values = fmha_f32_decode_values__neon,
};
const fmha_uk_cache fmha_uk_cache_bf16__neon = {
    .load = fmha_widen_bf16__neon,
    .scores = fmha_bf16kv_decode_scores__neon,
    .values = fmha_bf16kv_decode_values__neon,
};
const fmha_uk_cache fmha_uk_cache_f16__neon = {
    .load = fmha_widen_f16__neon,
    .scores = fmha_f16kv_decode_scores__neon,
    .values = fmha_f16kv_decode_values__neon,
};

/* 8-bit and GGUF formats: in-place kernels; rows load with the scalar
 * part's kernels where a driver needs them as float32. */
#define NEON_FORMAT_PART(name)                                                                                         \
    const fmha_uk_cache fmha_uk_cache_##name##__neon = {                                                               \
        .scores = fmha_##name##kv_decode_scores__neon,                                                                 \
        .values = fmha_##name##kv_decode_values__neon,                                                                 \
    };
NEON_FORMAT_PART(int8)
NEON_FORMAT_PART(e4m3)
NEON_FORMAT_PART(e5m2)
NEON_FORMAT_PART(q8_0)
NEON_FORMAT_PART(q4_0)

const fmha_isa_parts fmha_isa_neon = {
    .isa = "neon",
    .tile = &fmha_uk_tile__neon,
    .rows = &fmha_uk_rows__neon,
    .decode = &fmha_uk_decode__neon,
    .cache = FMHA_NEON_CACHE_PARTS,
};
