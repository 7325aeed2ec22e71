/* amx/table.c: the ISA of CPUs with AMX-BF16: the AVX-512 parts, the
 * avx512bf16 pair kernels, and a bf16 part whose GEMM runs on the tiles
 * (16 x 64, amx.c), with the thread part that configures and releases
 * them around each job. */
#include "../avx512/f32.h"
#include "../avx512/parts.h"
#include "../avx512bf16/bf16.h"
#include "amx.h"

_Static_assert((int)FMHA_AMX_NR == (int)FMHA_AVX512_NR, "the tile GEMM has the table's lanes");

static const fmha_uk_bf16 amx_pairs = {
    .mr = FMHA_AMX_MR,
    .gemm = fmha_bf16_gemm_ukernel_16x64__amx,
    .pair_rows = fmha_bf16_pair_rows_ukernel_64__avx512bf16,
    .pair_rows_split = fmha_bf16_pair_rows_split_ukernel_64__avx512bf16,
    .pack_rows = fmha_bf16_pack_rows_ukernel__avx512bf16,
    .softmax_pairs = fmha_bf16_softmax_pairs_ukernel_64__avx512bf16,
};

static const fmha_uk_thread amx_thread = {fmha_amx_thread_begin, fmha_amx_thread_end, fmha_amx_thread_foreign};

const fmha_isa_parts fmha_isa_amx = {
    .isa = "amx",
    .tile = &fmha_uk_tile__avx512,
    .bf16 = &amx_pairs,
    .rows = &fmha_uk_rows__avx512,
    .decode = &fmha_uk_decode__avx512,
    .cache = FMHA_AVX512_CACHE_PARTS,
    .thread = &amx_thread,
};
