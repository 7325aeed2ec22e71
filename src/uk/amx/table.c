/* amx/table.c: the ISA of CPUs with AMX-BF16: the AVX-512 parts, the
 * avx512bf16 pair kernels, a bf16 part whose GEMM runs on the tiles
 * (16 x 64, amx.c), the matrix part (attention on the tiles, attn.c), and
 * the thread part that configures and releases them around each job.
 * Compiled again as amx_emu over the software tile unit, for the test
 * builds (src/uk/amx_emu/CMakeLists.txt). */
#include "../avx512/decode.h"
#include "../avx512/f32.h"
#include "../avx512/parts.h"
#include "../avx512bf16/bf16.h"
#include "../avx512vnni/decode.h"
#include "amx.h"

#if FMHA_AMX_EMULATED
#define AMX_TABLE fmha_isa_amx_emu
#define AMX_ISA_NAME "amx_emu"
#else
#define AMX_TABLE fmha_isa_amx
#define AMX_ISA_NAME "amx"
#endif

_Static_assert((int)FMHA_AMX_NR == (int)FMHA_AVX512_NR, "the tile GEMM has the table's lanes");

static const fmha_uk_bf16 amx_pairs = {
    .mr = FMHA_AMX_MR,
    .gemm = FMHA_AMX_FN(fmha_bf16_gemm_ukernel_16x64),
    .pair_rows = fmha_bf16_pair_rows_ukernel_64__avx512bf16,
    .pair_rows_split = fmha_bf16_pair_rows_split_ukernel_64__avx512bf16,
    .pack_rows = fmha_bf16_pack_rows_ukernel__avx512bf16,
    .softmax_pairs = fmha_bf16_softmax_pairs_ukernel_64__avx512bf16,
};

static const fmha_uk_matrix amx_matrix = {
    .pack_q = FMHA_AMX_FN(fmha_matrix_pack_q),
    .pack_k = FMHA_AMX_FN(fmha_matrix_pack_k),
    .pack_v = FMHA_AMX_FN(fmha_matrix_pack_v),
    .forward = FMHA_AMX_FN(fmha_matrix_forward),
    .pack_t = FMHA_AMX_FN(fmha_matrix_pack_t),
    .backward = FMHA_AMX_FN(fmha_matrix_backward),
    .nonfinite = FMHA_AMX_FN(fmha_matrix_nonfinite),
    .pack_qt = FMHA_AMX_FN(fmha_matrix_pack_qt),
    .decode = FMHA_AMX_FN(fmha_matrix_decode),
};

/* avx512vnni's cache parts, with the integer scores and P V on tiles (from 16 rows) */
#define AMX_INTEGER(name)                                                                                              \
    FMHA_AMX_FN(fmha_##name##kv_scores_q8), FMHA_AMX_FN(fmha_##name##kv_values_int), .q8_tiles = 1
static const fmha_uk_cache amx_caches[FMHA_FORMAT_COUNT] =
    FMHA_AVX512_CACHES(AMX_INTEGER(int8), AMX_INTEGER(q8_0), AMX_INTEGER(q4_0), FMHA_NO_FP8_PAIRS, FMHA_NO_FP8_PAIRS,
                       FMHA_AVX512_FORMAT(e4m3), FMHA_AVX512_FORMAT(e5m2), FMHA_NO_BF16_PAIRS);

static const fmha_uk_thread amx_thread = {FMHA_AMX_FN(fmha_amx_thread_begin), FMHA_AMX_FN(fmha_amx_thread_end),
                                          FMHA_AMX_FN(fmha_amx_thread_foreign)};

const fmha_isa_parts AMX_TABLE = {
    .isa = AMX_ISA_NAME,
    .tile = &fmha_uk_tile__avx512,
    .bf16 = &amx_pairs,
    .rows = &fmha_uk_rows__avx512,
    .decode = &fmha_uk_decode__avx512,
    .cache = FMHA_CACHE_PARTS(amx_caches),
    .thread = &amx_thread,
    .matrix = &amx_matrix,
};
