/* neonbf16/table.c: the ISA of aarch64 CPUs with FEAT_BF16 (Armv8.6, or
 * 8.2 with BF16: Neoverse V1/V2/N2, Graviton 3/4, Grace; every one has the
 * dot product too): the neon parts (neon/parts.h: same MR, NR and tile
 * sizes, the decode and cache kernels, whose contract asks for the float32
 * kernels' bits on widened rows) with neondot's integer scores, plus a
 * bf16 part of this directory's BFMMLA GEMM and BFCVTN conversions, and
 * to_bf16 on BFCVTN in the neon row kernels' place. */
#include "../neon/neon.h"
#include "../neon/parts.h"
#include "../neondot/neondot.h"
#include "neonbf16.h"

_Static_assert((int)FMHA_NEONBF16_MR == (int)FMHA_NEON_MR && (int)FMHA_NEONBF16_NR == (int)FMHA_NEON_NR,
               "the bf16 and float32 kernels of a table share MR and NR");

static const fmha_uk_bf16 neonbf16_pairs = {
    .gemm = fmha_bf16_gemm_ukernel_6x16__neonbf16,
    .pair_rows = fmha_bf16_pair_rows_ukernel_16__neonbf16,
    .pair_rows_split = fmha_bf16_pair_rows_split_ukernel_16__neonbf16,
    .pack_rows = fmha_bf16_pack_rows_ukernel__neonbf16,
    .softmax_pairs = fmha_bf16_softmax_pairs_ukernel_16__neonbf16,
};

static const fmha_uk_rows neonbf16_rows = {
    .add_transposed = fmha_f32_add_transposed_ukernel__neon,
    .finish = fmha_f32_finish_ukernel__neon,
    .transpose = fmha_f32_transpose_ukernel__neon,
    .to_bf16 = fmha_f32_to_bf16_ukernel__neonbf16,
    .interleave_u16 = fmha_u16_interleave_ukernel__neon,
};

const fmha_isa_parts fmha_isa_neonbf16 = {
    .isa = "neonbf16",
    .tile = &fmha_uk_tile__neon,
    .bf16 = &neonbf16_pairs,
    .rows = &neonbf16_rows,
    .decode = &fmha_uk_decode__neon,
    .cache = FMHA_NEONDOT_CACHE_PARTS,
};
