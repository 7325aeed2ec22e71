/* neon/neon.h: the NEON microkernels (f32.c, rows.c, decode.c), exported
 * for the table's parts (table.c) and the tests. Contracts in
 * ../ukernel.h. Plain Armv8.0 Advanced SIMD: every aarch64 CPU runs them. */
#ifndef FMHA_UK_NEON_H
#define FMHA_UK_NEON_H

#include <stddef.h>
#include <stdint.h>

#include "../ukernel.h"

/* Tile of the GEMM: MR rows, NR lanes (4 q registers); keys per tile of
 * the tiled forward. */
enum { FMHA_NEON_MR = 6, FMHA_NEON_NR = 16, FMHA_NEON_BLOCK_KV = 128 };

/* tile kernels (f32.c) */
void fmha_f32_gemm_ukernel_6x16__neon(size_t m, size_t k, const float *a, ptrdiff_t a_rs, ptrdiff_t a_cs,
                                      const float *b, size_t ldb, float *c, size_t ldc, int mode,
                                      const float *col_scale, float ab_scale);
void fmha_f32_softmax_ukernel_16__neon(size_t rows, float *s, size_t lds, float *m, float *l, float *alpha);
void fmha_f32_exp_sub_ukernel_16__neon(size_t rows, float *s, size_t lds, const float *sub);
void fmha_f32_ds_ukernel_16__neon(size_t rows, const float *p, float *dp, size_t lds, const float *dsum);
/* y[i] = exp(x[i]) over any n: the exp of these kernels, for the tests. */
void fmha_f32_exp__neon(size_t n, const float *x, float *y);

/* row kernels (rows.c) */
void fmha_f32_add_transposed_ukernel__neon(size_t nk, size_t nq, const float *src, ptrdiff_t q_stride, float *st,
                                           size_t lds);
uint64_t fmha_f32_finish_ukernel__neon(size_t rows, size_t cols, const float *ot, size_t ldt, const float *scale,
                                       float *o, size_t ldo);
void fmha_f32_transpose_ukernel__neon(size_t rows, size_t cols, const float *src, size_t lds, float *dst,
                                      size_t ldd);
void fmha_f32_to_bf16_ukernel__neon(size_t n, const float *src, uint16_t *dst);
void fmha_u16_interleave_ukernel__neon(size_t n, const uint16_t *lo, const uint16_t *hi, uint32_t *dst);

/* decoding (decode.c): the float32 format's kernels, the 2-byte formats'
 * read in place, the softmax along rows and the widening loads */
void fmha_f32_decode_scores__neon(size_t rows, size_t nk, size_t d, const float *q, size_t ldq, const void *k,
                                  size_t ldk, float *s, size_t lds, float scale);
void fmha_f32_decode_values__neon(size_t rows, size_t nk, size_t dv, const float *p, size_t ldp, const void *v,
                                  size_t ldv, float *o, size_t ldo, const float *alpha);
void fmha_bf16kv_decode_scores__neon(size_t rows, size_t nk, size_t d, const float *q, size_t ldq, const void *k,
                                     size_t ldk, float *s, size_t lds, float scale);
void fmha_bf16kv_decode_values__neon(size_t rows, size_t nk, size_t dv, const float *p, size_t ldp, const void *v,
                                     size_t ldv, float *o, size_t ldo, const float *alpha);
void fmha_f16kv_decode_scores__neon(size_t rows, size_t nk, size_t d, const float *q, size_t ldq, const void *k,
                                    size_t ldk, float *s, size_t lds, float scale);
void fmha_f16kv_decode_values__neon(size_t rows, size_t nk, size_t dv, const float *p, size_t ldp, const void *v,
                                    size_t ldv, float *o, size_t ldo, const float *alpha);
/* the 8-bit and GGUF formats (int8, fp8 E4M3/E5M2, q8_0, q4_0), read in place */
#define FMHA_NEON_FORMAT_DECLS(name)                                                                                   \
    void fmha_##name##kv_decode_scores__neon(size_t rows, size_t nk, size_t d, const float *q, size_t ldq,              \
                                             const void *k, size_t ldk, float *s, size_t lds, float scale);            \
    void fmha_##name##kv_decode_values__neon(size_t rows, size_t nk, size_t dv, const float *p, size_t ldp,            \
                                             const void *v, size_t ldv, float *o, size_t ldo, const float *alpha);
FMHA_NEON_FORMAT_DECLS(int8)
FMHA_NEON_FORMAT_DECLS(e4m3)
FMHA_NEON_FORMAT_DECLS(e5m2)
FMHA_NEON_FORMAT_DECLS(q8_0)
FMHA_NEON_FORMAT_DECLS(q4_0)
void fmha_f32_decode_softmax__neon(size_t rows, size_t nk, float *s, size_t lds, float *m, float *l,
                                   float *alpha);
void fmha_widen_bf16__neon(size_t n, const void *src, float *dst);
void fmha_widen_f16__neon(size_t n, const void *src, float *dst);

#endif /* FMHA_UK_NEON_H */
