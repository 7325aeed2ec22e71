/* avx512bf16/table.c: the kernel table of CPUs with AVX512_BF16: the
 * AVX-512 float32 kernels (same MR, NR and tile sizes as the avx512 table)
 * plus the bf16 pair kernels of this directory. A table of its own, so that
 * every ISA of the registry in src/cpu.c is one constant table. */
#include "../avx512/decode.h"
#include "../avx512/f32.h"
#include "../ukernel.h"
#include "bf16.h"

_Static_assert((int)FMHA_AVX512BF16_MR == (int)FMHA_AVX512_MR &&
                   (int)FMHA_AVX512BF16_NR == (int)FMHA_AVX512_NR,
               "the bf16 and float32 kernels of a table share MR and NR");

const fmha_ukernels fmha_ukernels_avx512bf16 = {
    .isa = "avx512bf16",
    .mr = FMHA_AVX512_MR,
    .nr = FMHA_AVX512_NR,
    .block_kv = FMHA_AVX512_BLOCK_KV,
    .gemm_f32 = fmha_f32_gemm_ukernel_6x64__avx512,
    .softmax_f32 = fmha_f32_softmax_ukernel_64__avx512,
    .exp_sub_f32 = fmha_f32_exp_sub_ukernel_64__avx512,
    .exp_sub_lowp_f32 = fmha_f32_exp_sub_lowp_ukernel_64__avx512,
    .ds_f32 = fmha_f32_ds_ukernel_64__avx512,
    .add_transposed_f32 = fmha_f32_add_transposed_ukernel__avx512,
    .finish_f32 = fmha_f32_finish_ukernel__avx512,
    .transpose_f32 = fmha_f32_transpose_ukernel__avx512,
    .to_bf16 = fmha_f32_to_bf16_ukernel__avx512,
    .interleave_u16 = fmha_u16_interleave_ukernel__avx512,
    .gemm_bf16 = fmha_bf16_gemm_ukernel_6x64__avx512bf16,
    .pair_rows_bf16 = fmha_bf16_pair_rows_ukernel_64__avx512bf16,
    .pair_rows_split_bf16 = fmha_bf16_pair_rows_split_ukernel_64__avx512bf16,
    .pack_rows_bf16 = fmha_bf16_pack_rows_ukernel__avx512bf16,
    .softmax_lowp_f32 = fmha_f32_softmax_lowp_ukernel_64__avx512,
    .softmax_pairs_bf16 = fmha_bf16_softmax_pairs_ukernel_64__avx512bf16,
    .decode_scores_f32 = fmha_f32_decode_scores__avx512,
    .decode_softmax_f32 = fmha_f32_decode_softmax__avx512,
    .decode_values_f32 = fmha_f32_decode_values__avx512,
    .widen_bf16 = fmha_widen_bf16__avx512,
    .widen_f16 = fmha_widen_f16__avx512,
    .decode_scores_bf16kv = fmha_bf16kv_decode_scores__avx512,
    .decode_scores_f16kv = fmha_f16kv_decode_scores__avx512,
    .decode_values_bf16kv = fmha_bf16kv_decode_values__avx512,
    .decode_values_f16kv = fmha_f16kv_decode_values__avx512,
    .dropout_f32 = fmha_f32_dropout_ukernel__avx512,
};
