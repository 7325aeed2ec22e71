/* sve/sve.h: the SVE float32 tile microkernels (f32.c), exported for the
 * table's parts (table.c) and the tests. Contracts in ../ukernel.h.
 *
 * Vector-length agnostic from 128 to 512 bits: a vector is W = VL / 32
 * lanes and NR = 4 W (16, 32 or 64 lanes at 128, 256 and 512 bits), read
 * when the registry composes the table (fmha_sve_nr). Longer vectors would
 * make NR exceed FMHA_MAX_NR (64): there the table is not used (no such
 * core ships; A64FX's vectors are 512 bits). A thread must keep the vector
 * length it had then (prctl PR_SVE_SET_VL). */
#ifndef FMHA_UK_SVE_H
#define FMHA_UK_SVE_H

#include <stddef.h>
#include <stdint.h>

#include "../ukernel.h"

/* Rows of the GEMM tile; keys per tile of the tiled forward. */
enum { FMHA_SVE_MR = 6, FMHA_SVE_BLOCK_KV = 128 };

/* NR on this CPU: 4 VL / 32; whether the table serves this vector length
 * (128 to 512 bits). Only on a CPU with SVE. */
size_t fmha_sve_nr(void);
int fmha_sve_usable(void);

void fmha_f32_gemm_ukernel_6xnr__sve(size_t m, size_t k, const float *a, ptrdiff_t a_rs, ptrdiff_t a_cs,
                                     const float *b, size_t ldb, float *c, size_t ldc, int mode,
                                     const float *col_scale, float ab_scale);
void fmha_f32_softmax_ukernel_nr__sve(size_t rows, float *s, size_t lds, float *m, float *l, float *alpha);
void fmha_f32_exp_sub_ukernel_nr__sve(size_t rows, float *s, size_t lds, const float *sub);
void fmha_f32_ds_ukernel_nr__sve(size_t rows, const float *p, float *dp, size_t lds, const float *dsum);
/* y[i] = exp(x[i]) over any n: the exp of these kernels, for the tests. */
void fmha_f32_exp__sve(size_t n, const float *x, float *y);

#endif /* FMHA_UK_SVE_H */
