/* sve/table.c: the SVE ISA's parts: its own float32 tile part (NR = 4 W
 * lanes, W = VL / 32: sve.h) and the neon parts for the
 * rest, which do not depend on NR (row kernels, decoding with keys in the
 * lanes, the cache formats' kernels). No bf16 part: bf16 runs on widened
 * float32 tiles; dropout takes the scalar kernel. */
#include "../neon/parts.h"
#include "sve.h"

/* nr is read at run time (fmha_sve_nr), when the registry composes the
 * table on a CPU with SVE; 16 until then. */
static const fmha_uk_tile sve_tile = {
    .mr = FMHA_SVE_MR,
    .nr = 16,
    .nr_at_run_time = fmha_sve_nr,
    .block_kv = FMHA_SVE_BLOCK_KV,
    .gemm = fmha_f32_gemm_ukernel_6xnr__sve,
    .softmax = fmha_f32_softmax_ukernel_nr__sve,
    .exp_sub = fmha_f32_exp_sub_ukernel_nr__sve,
    .ds = fmha_f32_ds_ukernel_nr__sve,
};

const fmha_isa_parts fmha_isa_sve = {
    .isa = "sve",
    .tile = &sve_tile,
    .rows = &fmha_uk_rows__neon,
    .decode = &fmha_uk_decode__neon,
    .cache = FMHA_NEON_CACHE_PARTS,
};
