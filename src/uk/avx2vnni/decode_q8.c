/* avx2vnni/decode_q8.c: integer scores of int8, q8_0 and q4_0 keys on the
 * query quantized as q8_0 (fmha_cache_scores_q8_ukernel_fn; contract and
 * specification in ../ukernel.h and ../scalar/decode.c) with AVX-VNNI's
 * 256-bit vpdpbusd, for AVX2 cores that have it (Alder Lake and later,
 * Zen 5). As avx512vnni/decode_q8.c with 8 lanes: 8 keys a block of 32
 * values, transposed into 8 vectors of one dword of the 8 keys; the keys
 * the unsigned side (+128 by the top bit, q4_0's nibbles as stored), each
 * row's int32 sum started at -offset times its block's sum of q. */
#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>

#include "decode.h"

#define FMHA_INLINE static inline __attribute__((always_inline))

enum { Q8_INT8 = FMHA_FORMAT_INT8, Q8_Q8_0 = FMHA_FORMAT_Q8_0, Q8_Q4_0 = FMHA_FORMAT_Q4_0 };

/* The 8 keys' values of block b as unsigned bytes: t[c] lane i holds
 * dword c (values 4c..4c+3) of key i. */
FMHA_INLINE void block_dwords(const int kind, const uint8_t *const kr[8], size_t b, __m256i t[8]) {
    const size_t at = b * fmha_int_block_bytes(kind) + fmha_int_block_values_at(kind);
    if (kind == Q8_Q4_0) {
        /* w[g]: keys g (low lane) and 4 + g (high lane), 16 bytes each */
        __m256i w[4];
#pragma GCC unroll 4
        for (int g = 0; g < 4; g++)
            w[g] = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(kr[g] + at))),
                                           _mm_loadu_si128((const __m128i *)(kr[4 + g] + at)), 1);
        /* a 4 x 4 dword transpose in each lane: d[c] lane l = dword c of keys 4l..4l+3 */
        const __m256i a0 = _mm256_unpacklo_epi32(w[0], w[1]), a1 = _mm256_unpackhi_epi32(w[0], w[1]);
        const __m256i a2 = _mm256_unpacklo_epi32(w[2], w[3]), a3 = _mm256_unpackhi_epi32(w[2], w[3]);
        const __m256i d[4] = {_mm256_unpacklo_epi64(a0, a2), _mm256_unpackhi_epi64(a0, a2),
                              _mm256_unpacklo_epi64(a1, a3), _mm256_unpackhi_epi64(a1, a3)};
        const __m256i nib = _mm256_set1_epi8(15);
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++) {
            t[c] = _mm256_and_si256(d[c], nib);
            t[4 + c] = _mm256_and_si256(_mm256_srli_epi16(d[c], 4), nib);
        }
        return;
    }
    /* v[i]: key i's 32 bytes + 128 */
    const __m256i flip = _mm256_set1_epi8((char)0x80);
    __m256i v[8];
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++) v[i] = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(kr[i] + at)), flip);
    /* 4 x 4 dword transposes in each lane of keys 0-3 (p) and 4-7 (q):
     * p[c] lane l = dword 4l + c of keys 0-3 */
    __m256i p[4], q[4];
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
        const __m256i *x = v + 4 * h;
        const __m256i a0 = _mm256_unpacklo_epi32(x[0], x[1]), a1 = _mm256_unpackhi_epi32(x[0], x[1]);
        const __m256i a2 = _mm256_unpacklo_epi32(x[2], x[3]), a3 = _mm256_unpackhi_epi32(x[2], x[3]);
        __m256i *y = h ? q : p;
        y[0] = _mm256_unpacklo_epi64(a0, a2), y[1] = _mm256_unpackhi_epi64(a0, a2);
        y[2] = _mm256_unpacklo_epi64(a1, a3), y[3] = _mm256_unpackhi_epi64(a1, a3);
    }
    /* dword c from the low lanes, 4 + c from the high ones: keys 0-3, 4-7 */
#pragma GCC unroll 4
    for (int c = 0; c < 4; c++) {
        t[c] = _mm256_permute2x128_si256(p[c], q[c], 0x20);
        t[4 + c] = _mm256_permute2x128_si256(p[c], q[c], 0x31);
    }
}

/* The 8 keys' half scales of block b as float32 (q8_0, q4_0). */
FMHA_INLINE __m256 block_scales(const int kind, const uint8_t *const kr[8], size_t b) {
    const size_t at = b * fmha_int_block_bytes(kind);
    uint16_t hs[8];
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++) __builtin_memcpy(&hs[i], kr[i] + at, 2);
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)hs));
}

/* Rows [0, G) of q (G = 4, 2 or 1) against 8 keys (kr; keys past nj
 * repeat the last, their lanes not stored). */
FMHA_INLINE void rows_block(const int kind, const int G, size_t nj, size_t d, const fmha_q8_rows *q,
                            const uint8_t *const kr[8], float *s, size_t lds, float scale) {
    const int32_t offset = kind == Q8_Q4_0 ? 8 : 128;
    const size_t ldd = q->ld / 32;
    __m256 acc[4];
#pragma GCC unroll 4
    for (int r = 0; r < G; r++) acc[r] = _mm256_setzero_ps();
    for (size_t b = 0; b < d / 32; b++) {
        __m256i t[8];
        block_dwords(kind, kr, b, t);
        const __m256 kd = kind == Q8_INT8 ? _mm256_set1_ps(1.0f) : block_scales(kind, kr, b);
#pragma GCC unroll 4
        for (int r = 0; r < G; r++) {
            const int8_t *qr = q->q + r * q->ld + 32 * b;
            __m256i sum = _mm256_set1_epi32(-offset * q->sum[r * ldd + b]);
#pragma GCC unroll 8
            for (int c = 0; c < 8; c++) {
                int32_t qd4;
                __builtin_memcpy(&qd4, qr + 4 * c, 4);
                sum = _mm256_dpbusd_avx_epi32(sum, t[c], _mm256_set1_epi32(qd4));
            }
            const __m256 qd = _mm256_set1_ps(q->d[r * ldd + b]);
            acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), kind == Q8_INT8 ? qd : _mm256_mul_ps(qd, kd), acc[r]);
        }
    }
    const __m256i keys = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)nj), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    const __m256 sv = _mm256_set1_ps(scale);
#pragma GCC unroll 4
    for (int r = 0; r < G; r++) _mm256_maskstore_ps(s + r * lds, keys, _mm256_mul_ps(acc[r], sv));
}

/* Keys in groups of 8, rows in groups of 4, then 2, 1. */
FMHA_INLINE void scores_q8(const int kind, size_t rows, size_t nk, size_t d, const fmha_q8_rows *q, const void *k,
                           size_t ldk, float *s, size_t lds, float scale) {
    const uint8_t *k8 = k;
    for (size_t j0 = 0; j0 < nk; j0 += 8) {
        const size_t nj = nk - j0 < 8 ? nk - j0 : 8;
        const uint8_t *kr[8];
        for (size_t i = 0; i < 8; i++) kr[i] = k8 + (j0 + (i < nj ? i : nj - 1)) * ldk;
        size_t r = 0;
        for (int g = 4; g >= 1; g /= 2)
            while (rows - r >= (size_t)g) {
                const fmha_q8_rows qr = {q->q + r * q->ld, q->d + r * (q->ld / 32), q->sum + r * (q->ld / 32), q->ld, NULL};
                if (g == 4) rows_block(kind, 4, nj, d, &qr, kr, s + r * lds + j0, lds, scale);
                else if (g == 2) rows_block(kind, 2, nj, d, &qr, kr, s + r * lds + j0, lds, scale);
                else rows_block(kind, 1, nj, d, &qr, kr, s + r * lds + j0, lds, scale);
                r += (size_t)g;
                if (g < 4) break;
            }
    }
}

void fmha_int8kv_scores_q8__avx2vnni(size_t rows, size_t nk, size_t d, const fmha_q8_rows *q, const void *k,
                                     size_t ldk, float *s, size_t lds, float scale) {
    scores_q8(Q8_INT8, rows, nk, d, q, k, ldk, s, lds, scale);
}

void fmha_q8_0kv_scores_q8__avx2vnni(size_t rows, size_t nk, size_t d, const fmha_q8_rows *q, const void *k,
                                     size_t ldk, float *s, size_t lds, float scale) {
    scores_q8(Q8_Q8_0, rows, nk, d, q, k, ldk, s, lds, scale);
}

void fmha_q4_0kv_scores_q8__avx2vnni(size_t rows, size_t nk, size_t d, const fmha_q8_rows *q, const void *k,
                                     size_t ldk, float *s, size_t lds, float scale) {
    scores_q8(Q8_Q4_0, rows, nk, d, q, k, ldk, s, lds, scale);
}
