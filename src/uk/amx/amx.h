/* amx/amx.h: the AMX kernels (amx.c), built twice: for the tiles
 * (suffix __amx; callable on CPUs with AMX-TILE and AMX-BF16 once Linux
 * has granted the tile data, which the registry's check asks) and for the
 * software tile unit (suffix __amx_emu, the test builds' amx_emu table:
 * src/uk/amx_emu; any AVX512_BF16 CPU). */
#ifndef FMHA_UK_AMX_H
#define FMHA_UK_AMX_H

#include <stddef.h>
#include <stdint.h>

#include "../ukernel.h"
#include "tile.h"

/* Rows and lanes of the tile GEMM. */
enum { FMHA_AMX_MR = 16, FMHA_AMX_NR = 64 };

#define FMHA_AMX_DECLARE(SUFFIX)                                                                                       \
    /* C[m x 64] (op)= ab_scale * A[m x 2kp] B[2kp x 64], 1 <= m <= 16, kp >= 0                                        \
     * (fmha_bf16_gemm_ukernel_fn) on tdpbf16ps. */                                                                    \
    void fmha_bf16_gemm_ukernel_16x64__##SUFFIX(size_t m, size_t kp, const uint32_t *a, ptrdiff_t a_rs,                 \
                                                ptrdiff_t a_cs, const uint32_t *b, size_t ldb, float *c, size_t ldc,    \
                                                int mode, const float *col_scale, float ab_scale);                      \
    /* The thread part: the tile configuration loaded, then released; after                                           \
     * a caller's callback, configured again before the next tile instruction. */                                     \
    void fmha_amx_thread_begin__##SUFFIX(void);                                                                        \
    void fmha_amx_thread_end__##SUFFIX(void);                                                                          \
    void fmha_amx_thread_foreign__##SUFFIX(void);                                                                      \
    /* The configuration every kernel loads (tests read it back), and its                                             \
     * loading where this thread has not loaded it yet. */                                                             \
    const fmha_tile_config *fmha_amx_tile_config__##SUFFIX(void);                                                      \
    void fmha_amx_ready__##SUFFIX(void);                                                                               \
    /* The matrix part (attn.c; contract in ukernel.h). */                                                             \
    void fmha_matrix_pack_q__##SUFFIX(size_t nq, size_t d, const void *const *rows, int src, ptrdiff_t cs, int negate, \
                                      uint32_t *hi, uint32_t *lo);                                                     \
    void fmha_matrix_pack_k__##SUFFIX(size_t nk, size_t d, const void *k, int src, ptrdiff_t rs, ptrdiff_t cs,         \
                                      uint32_t *hi, uint32_t *lo);                                                     \
    void fmha_matrix_pack_v__##SUFFIX(size_t nk, size_t dv, const void *v, int src, ptrdiff_t rs, ptrdiff_t cs,        \
                                      uint32_t *hi, uint32_t *lo);                                                     \
    void fmha_matrix_forward__##SUFFIX(fmha_matrix_fwd_args *a);                                                      \
    /* The matrix part's backward (attn_bwd.c). */                                                                    \
    void fmha_matrix_pack_t__##SUFFIX(size_t nq, size_t d, const void *x, int src, ptrdiff_t rs, ptrdiff_t cs,         \
                                      uint32_t *xt, uint32_t *xt_lo);                                                  \
    void fmha_matrix_backward__##SUFFIX(const fmha_matrix_bwd_args *a);                                                \
    int fmha_matrix_nonfinite__##SUFFIX(size_t n, size_t d, const void *x, int src, ptrdiff_t rs, ptrdiff_t cs);      \
    /* The matrix part's decode (attn_dec.c). */                                                                      \
    void fmha_matrix_pack_qt__##SUFFIX(size_t nq, size_t d, const void *const *rows, int src, ptrdiff_t cs,            \
                                       int negate, uint32_t *qt);                                                      \
    void fmha_matrix_decode__##SUFFIX(fmha_matrix_dec_args *a);                                                       \
    /* Integer scores on tiles from 16 rows (decode_q8.c; fmha_cache_scores_q8_ukernel_fn,                             \
     * reading the query's tiles). */                                                                                  \
    void fmha_int8kv_scores_q8__##SUFFIX(size_t rows, size_t nk, size_t d, const fmha_q8_rows *q, const void *k,        \
                                         size_t ldk, float *s, size_t lds, float scale);                               \
    void fmha_q8_0kv_scores_q8__##SUFFIX(size_t rows, size_t nk, size_t d, const fmha_q8_rows *q, const void *k,        \
                                         size_t ldk, float *s, size_t lds, float scale);                               \
    void fmha_q4_0kv_scores_q8__##SUFFIX(size_t rows, size_t nk, size_t d, const fmha_q8_rows *q, const void *k,        \
                                         size_t ldk, float *s, size_t lds, float scale);                               \
    /* Integer P V on tiles from 16 rows (values_int.c; fmha_cache_values_int_ukernel_fn). */                         \
    void fmha_int8kv_values_int__##SUFFIX(size_t rows, size_t nk, size_t dv, const float *p, size_t ldp,               \
                                          const void *const *v_rows, float *o, size_t ldo, const float *alpha);        \
    void fmha_q8_0kv_values_int__##SUFFIX(size_t rows, size_t nk, size_t dv, const float *p, size_t ldp,               \
                                          const void *const *v_rows, float *o, size_t ldo, const float *alpha);        \
    void fmha_q4_0kv_values_int__##SUFFIX(size_t rows, size_t nk, size_t dv, const float *p, size_t ldp,               \
                                          const void *const *v_rows, float *o, size_t ldo, const float *alpha);

FMHA_AMX_DECLARE(amx)
FMHA_AMX_DECLARE(amx_emu)

#endif /* FMHA_UK_AMX_H */
