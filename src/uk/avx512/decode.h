/* avx512/decode.h: the AVX-512 decode microkernels (decode.c) for the
 * AVX-512 tables. */
#ifndef FMHA_UK_AVX512_DECODE_H
#define FMHA_UK_AVX512_DECODE_H

#include "../ukernel.h"

void fmha_f32_decode_scores__avx512(size_t rows, size_t nk, size_t d, const float *q, size_t ldq,
                                    const void *k, size_t ldk, float *s, size_t lds, float scale);
void fmha_f32_decode_scores_qt__avx512(size_t rows, size_t nk, size_t d, const float *qt, const float *k,
                                       size_t ldk, float *s, size_t lds, float scale);
void fmha_f32_decode_softmax__avx512(size_t rows, size_t nk, float *s, size_t lds, float *m,
                                     float *l, float *alpha);
void fmha_f32_decode_values__avx512(size_t rows, size_t nk, size_t dv, const float *p, size_t ldp,
                                    const void *v, size_t ldv, float *o, size_t ldo,
                                    const float *alpha);
void fmha_bf16kv_decode_scores__avx512(size_t rows, size_t nk, size_t d, const float *q, size_t ldq,
                                       const void *k, size_t ldk, float *s, size_t lds, float scale);
void fmha_f16kv_decode_scores__avx512(size_t rows, size_t nk, size_t d, const float *q, size_t ldq,
                                      const void *k, size_t ldk, float *s, size_t lds, float scale);
void fmha_bf16kv_decode_values__avx512(size_t rows, size_t nk, size_t dv, const float *p, size_t ldp,
                                       const void *v, size_t ldv, float *o, size_t ldo, const float *alpha);
void fmha_f16kv_decode_values__avx512(size_t rows, size_t nk, size_t dv, const float *p, size_t ldp,
                                      const void *v, size_t ldv, float *o, size_t ldo, const float *alpha);
void fmha_widen_bf16__avx512(size_t n, const void *src_row, float *dst);
void fmha_widen_f16__avx512(size_t n, const void *src_row, float *dst);
/* int8, fp8 and GGUF rows read in place: scores, values, load */
#define FMHA_AVX512_FORMAT_DECLS(name)                                                                                 \
    void fmha_##name##kv_decode_scores__avx512(size_t rows, size_t nk, size_t d, const float *q, size_t ldq,          \
                                               const void *k, size_t ldk, float *s, size_t lds, float scale);        \
    void fmha_##name##kv_decode_values__avx512(size_t rows, size_t nk, size_t dv, const float *p, size_t ldp,         \
                                               const void *v, size_t ldv, float *o, size_t ldo, const float *alpha);  \
    void fmha_widen_##name##__avx512(size_t n, const void *src_row, float *dst);
FMHA_AVX512_FORMAT_DECLS(int8)
FMHA_AVX512_FORMAT_DECLS(e4m3)
FMHA_AVX512_FORMAT_DECLS(e5m2)
FMHA_AVX512_FORMAT_DECLS(q8_0)
FMHA_AVX512_FORMAT_DECLS(q4_0)
/* Every format's AVX-512 kernels, an fmha_uk_cache [FMHA_FORMAT_COUNT]
 * initializer (float32 rows need no load kernel: the scalar copy), with
 * the integer kernels (scores_q8, values_int) of int8, q8_0 and q4_0 rows
 * (each a pair; FMHA_NO_INTEGER: none), the bf16 scores of float8 keys
 * (designated scores_bf16 and scores_bf16_qt; FMHA_NO_FP8_PAIRS: none),
 * the load, scores and values kernels of e4m3 and e5m2 rows
 * (FMHA_AVX512_FORMAT(e4m3), (e5m2): this directory's), and the bf16
 * format's pair kernels (the last arguments: designated scores_bf16 and
 * values_bf16; FMHA_NO_BF16_PAIRS: none). widen_rows by the
 * widening's µops a vector (decode.c):
 * e4m3 9 from 8 rows, e5m2 4 and q8_0, q4_0 5-7 from 16, the 2-µop
 * formats from 32, measured on a model 207 Xeon (design.md, "Decode"). */
#define FMHA_NO_INTEGER NULL, NULL
#define FMHA_NO_FP8_PAIRS .scores_bf16 = NULL
#define FMHA_AVX512_FORMAT(name) \
    fmha_widen_##name##__avx512, fmha_##name##kv_decode_scores__avx512, fmha_##name##kv_decode_values__avx512
#define FMHA_NO_BF16_PAIRS .values_bf16 = NULL
#define FMHA_AVX512_CACHES(int8_int, q8_0_int, q4_0_int, e4m3_pairs, e5m2_pairs, e4m3_kernels, e5m2_kernels, ...)     \
    {                                                                                                                  \
        [FMHA_FORMAT_F32] = {.scores = fmha_f32_decode_scores__avx512, .values = fmha_f32_decode_values__avx512},     \
        [FMHA_FORMAT_BF16] = {FMHA_AVX512_FORMAT(bf16), .widen_rows = 32, __VA_ARGS__},                               \
        [FMHA_FORMAT_F16] = {FMHA_AVX512_FORMAT(f16), .widen_rows = 32},                                              \
        [FMHA_FORMAT_INT8] = {FMHA_AVX512_FORMAT(int8), int8_int, .widen_rows = 32},                                   \
        [FMHA_FORMAT_FP8_E4M3] = {e4m3_kernels, e4m3_pairs, .widen_rows = 8},                                          \
        [FMHA_FORMAT_FP8_E5M2] = {e5m2_kernels, e5m2_pairs, .widen_rows = 16},                                         \
        [FMHA_FORMAT_Q8_0] = {FMHA_AVX512_FORMAT(q8_0), q8_0_int, .widen_rows = 16},                                   \
        [FMHA_FORMAT_Q4_0] = {FMHA_AVX512_FORMAT(q4_0), q4_0_int, .widen_rows = 16}                                    \
    }

/* y[i] = exp(x[i]) (f32.c) */
void fmha_f32_exp__avx512(size_t n, const float *x, float *y);

#endif /* FMHA_UK_AVX512_DECODE_H */
