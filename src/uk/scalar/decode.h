/* scalar/decode.h: the scalar decode microkernels (decode.c), for the
 * scalar table and for SIMD tables that borrow one of them. */
#ifndef FMHA_UK_SCALAR_DECODE_H
#define FMHA_UK_SCALAR_DECODE_H

#include "../ukernel.h"

void fmha_f32_decode_scores__scalar(size_t rows, size_t nk, size_t d, const float *q, size_t ldq,
                                    const void *k_row0, size_t ldk, float *s, size_t lds, float scale);
void fmha_f32_decode_softmax__scalar(size_t rows, size_t nk, float *s, size_t lds, float *m,
                                     float *l, float *alpha);
void fmha_f32_decode_values__scalar(size_t rows, size_t nk, size_t dv, const float *p, size_t ldp,
                                    const void *v_row0, size_t ldv, float *o, size_t ldo,
                                    const float *alpha);
void fmha_load_f32__scalar(size_t n, const void *src_row, float *dst);
void fmha_widen_bf16__scalar(size_t n, const void *src_row, float *dst);
void fmha_widen_f16__scalar(size_t n, const void *src_row, float *dst);
void fmha_load_int8__scalar(size_t n, const void *src_row, float *dst);
void fmha_load_e4m3__scalar(size_t n, const void *src_row, float *dst);
void fmha_load_e5m2__scalar(size_t n, const void *src_row, float *dst);
void fmha_load_q8_0__scalar(size_t n, const void *src_row, float *dst);
void fmha_load_q4_0__scalar(size_t n, const void *src_row, float *dst);

/* integer scores on the q8_0 query (fmha_cache_scores_q8_ukernel_fn) */
void fmha_int8kv_scores_q8__scalar(size_t rows, size_t nk, size_t d, const fmha_q8_rows *q, const void *k, size_t ldk,
                                   float *s, size_t lds, float scale);
void fmha_q8_0kv_scores_q8__scalar(size_t rows, size_t nk, size_t d, const fmha_q8_rows *q, const void *k, size_t ldk,
                                   float *s, size_t lds, float scale);
void fmha_q4_0kv_scores_q8__scalar(size_t rows, size_t nk, size_t d, const fmha_q8_rows *q, const void *k, size_t ldk,
                                   float *s, size_t lds, float scale);
/* P V in integers on 16-bit P (fmha_cache_values_int_ukernel_fn) */
void fmha_int8kv_values_int__scalar(size_t rows, size_t nk, size_t dv, const float *p, size_t ldp,
                                    const void *const *v_rows, float *o, size_t ldo, const float *alpha);
void fmha_q8_0kv_values_int__scalar(size_t rows, size_t nk, size_t dv, const float *p, size_t ldp,
                                    const void *const *v_rows, float *o, size_t ldo, const float *alpha);
void fmha_q4_0kv_values_int__scalar(size_t rows, size_t nk, size_t dv, const float *p, size_t ldp,
                                    const void *const *v_rows, float *o, size_t ldo, const float *alpha);
/* float8 keys on the bf16 query (fmha_cache_scores_bf16_ukernel_fn) */
void fmha_e4m3kv_scores_bf16__scalar(size_t rows, size_t nk, size_t d, const uint32_t *q, size_t ldq, const void *k,
                                     size_t ldk, float *s, size_t lds, float scale);
void fmha_e5m2kv_scores_bf16__scalar(size_t rows, size_t nk, size_t d, const uint32_t *q, size_t ldq, const void *k,
                                     size_t ldk, float *s, size_t lds, float scale);
/* the same, 16 rows in the lanes (fmha_cache_scores_bf16_qt_ukernel_fn) */
void fmha_e4m3kv_scores_bf16_qt__scalar(size_t rows, size_t nk, size_t d, const uint32_t *qt, const void *k, size_t ldk,
                                        float *s, size_t lds, float scale);
void fmha_e5m2kv_scores_bf16_qt__scalar(size_t rows, size_t nk, size_t d, const uint32_t *qt, const void *k, size_t ldk,
                                        float *s, size_t lds, float scale);
/* bf16 keys on the bf16 query (by blocks and with 16 rows in the lanes), and P V
 * on bf16 P (fmha_cache_values_bf16_ukernel_fn) */
void fmha_bf16kv_scores_bf16__scalar(size_t rows, size_t nk, size_t d, const uint32_t *q, size_t ldq, const void *k,
                                     size_t ldk, float *s, size_t lds, float scale);
void fmha_bf16kv_scores_bf16_qt__scalar(size_t rows, size_t nk, size_t d, const uint32_t *qt, const void *k, size_t ldk,
                                        float *s, size_t lds, float scale);
void fmha_bf16kv_values_bf16__scalar(size_t rows, size_t nk, size_t dv, const float *p, size_t ldp,
                                     const void *const *v_rows, float *o, size_t ldo, const float *alpha);
/* float8 values on bf16 P (fmha_cache_values_bf16_ukernel_fn) */
void fmha_e4m3kv_values_bf16__scalar(size_t rows, size_t nk, size_t dv, const float *p, size_t ldp,
                                     const void *const *v_rows, float *o, size_t ldo, const float *alpha);
void fmha_e5m2kv_values_bf16__scalar(size_t rows, size_t nk, size_t dv, const float *p, size_t ldp,
                                     const void *const *v_rows, float *o, size_t ldo, const float *alpha);

#endif /* FMHA_UK_SCALAR_DECODE_H */
