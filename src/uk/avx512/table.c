/* avx512/table.c: the AVX-512 ISA's parts, each defined once: float32
 * tiles (6 x 64, and the shapes a tuning may pick instead: 12 x 32,
 * 14 x 32), row kernels, decoding and the cache formats' kernels (2-byte
 * caches read in place). The avx512 table is these parts alone;
 * avx512bf16 adds its bf16 part to them. */
#include "decode.h"
#include "f32.h"
#include "parts.h"

/* The tall tiles (f32_tall.c): 32 lanes, MR 12 or 14. */
#define TALL_TILE(MR)                                                                                                  \
    {                                                                                                                  \
        .mr = MR, .nr = FMHA_AVX512_TALL_NR, .block_kv = FMHA_AVX512_BLOCK_KV,                                        \
        .gemm = fmha_f32_gemm_ukernel_##MR##x32__avx512, .softmax = fmha_f32_softmax_ukernel_32__avx512,               \
        .exp_sub = fmha_f32_exp_sub_ukernel_32__avx512, .ds = fmha_f32_ds_ukernel_32__avx512,                          \
        .softmax_lowp = fmha_f32_softmax_lowp_ukernel_32__avx512,                                                      \
        .exp_sub_lowp = fmha_f32_exp_sub_lowp_ukernel_32__avx512,                                                      \
    }
static const fmha_uk_tile avx512_tile_12x32 = TALL_TILE(12);
static const fmha_uk_tile avx512_tile_14x32 = TALL_TILE(14);

/* Every table on this tile part (avx512, avx512vnni, avx512bf16, amx,
 * amx_emu) may run its float32 plans on these shapes: a tuning's tile_mr x
 * tile_nr picks one (config/cpu.c). A shape is one line here. */
static const fmha_uk_tile *const avx512_tile_shapes[] = {
    &fmha_uk_tile__avx512,
    &avx512_tile_12x32,
    &avx512_tile_14x32,
    NULL,
};

const fmha_uk_tile fmha_uk_tile__avx512 = {
    .mr = FMHA_AVX512_MR,
    .nr = FMHA_AVX512_NR,
    .block_kv = FMHA_AVX512_BLOCK_KV,
    .gemm = fmha_f32_gemm_ukernel_6x64__avx512,
    .softmax = fmha_f32_softmax_ukernel_64__avx512,
    .exp_sub = fmha_f32_exp_sub_ukernel_64__avx512,
    .ds = fmha_f32_ds_ukernel_64__avx512,
    .softmax_lowp = fmha_f32_softmax_lowp_ukernel_64__avx512,
    .exp_sub_lowp = fmha_f32_exp_sub_lowp_ukernel_64__avx512,
    .shapes = avx512_tile_shapes,
};

const fmha_uk_rows fmha_uk_rows__avx512 = {
    .add_transposed = fmha_f32_add_transposed_ukernel__avx512,
    .finish = fmha_f32_finish_ukernel__avx512,
    .transpose = fmha_f32_transpose_ukernel__avx512,
    .to_bf16 = fmha_f32_to_bf16_ukernel__avx512,
    .interleave_u16 = fmha_u16_interleave_ukernel__avx512,
    .dropout = fmha_f32_dropout_ukernel__avx512,
    .axpy = fmha_f32_axpy_ukernel__avx512,
    .scale_columns = fmha_f32_scale_columns_ukernel__avx512,
    .nonfinite = fmha_f32_nonfinite_ukernel__avx512,
};

const fmha_uk_decode fmha_uk_decode__avx512 = {
    .softmax = fmha_f32_decode_softmax__avx512, .scores_qt = fmha_f32_decode_scores_qt__avx512, .qt_rows = 16};

/* every format read in place, widened in registers */
const fmha_uk_cache fmha_uk_caches__avx512[FMHA_FORMAT_COUNT] = FMHA_AVX512_CACHES(
    FMHA_NO_INTEGER, FMHA_NO_INTEGER, FMHA_NO_INTEGER, FMHA_NO_FP8_PAIRS, FMHA_NO_FP8_PAIRS, FMHA_AVX512_FORMAT(e4m3),
    FMHA_AVX512_FORMAT(e5m2), FMHA_NO_BF16_PAIRS);

const fmha_isa_parts fmha_isa_avx512 = {
    .isa = "avx512",
    .tile = &fmha_uk_tile__avx512,
    .rows = &fmha_uk_rows__avx512,
    .decode = &fmha_uk_decode__avx512,
    .cache = FMHA_CACHE_PARTS(fmha_uk_caches__avx512),
};
