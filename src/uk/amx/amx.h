/* amx/amx.h: the AMX kernels (amx.c) for the amx table and the tests. Only
 * callable on CPUs with AMX-TILE and AMX-BF16, once Linux has granted the
 * tile data (the registry's check asks). */
#ifndef FMHA_UK_AMX_H
#define FMHA_UK_AMX_H

#include <stddef.h>
#include <stdint.h>

#include "../ukernel.h"

/* Rows and lanes of the tile GEMM. */
enum { FMHA_AMX_MR = 16, FMHA_AMX_NR = 64 };

/* C[m x 64] (op)= ab_scale * A[m x 2kp] B[2kp x 64], 1 <= m <= 16, kp >= 0
 * (fmha_bf16_gemm_ukernel_fn) on tdpbf16ps. */
void fmha_bf16_gemm_ukernel_16x64__amx(size_t m, size_t kp, const uint32_t *a, ptrdiff_t a_rs, ptrdiff_t a_cs,
                                       const uint32_t *b, size_t ldb, float *c, size_t ldc, int mode,
                                       const float *col_scale, float ab_scale);

/* The thread part: the tile configuration loaded, then released. */
void fmha_amx_thread_begin(void);
void fmha_amx_thread_end(void);
/* A caller's callback ran on the thread: configure again before the next tile instruction. */
void fmha_amx_thread_foreign(void);

#endif /* FMHA_UK_AMX_H */
