/* avx512vnni/values_int.h: what the integer P V kernels share (this
 * directory's vpdpwssd kernel, values_int.c, and the tiles', amx/values_int.c):
 * V's block scales and each row's P quantized to 16 bits, so that both
 * take the same integers (fmha_cache_values_int_ukernel_fn, ../ukernel.h).
 * Static inline, compiled into each. */
#ifndef FMHA_UK_AVX512VNNI_VALUES_INT_H
#define FMHA_UK_AVX512VNNI_VALUES_INT_H

#include <immintrin.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "decode.h"

enum { V_INT8 = FMHA_FORMAT_INT8, V_Q8_0 = FMHA_FORMAT_Q8_0, V_Q4_0 = FMHA_FORMAT_Q4_0 };
enum { MAX_KEYS = 64, MAX_BLOCKS = 18 }; /* the contract's nk; D <= 576 */

/* P's blocks with a P' of their own: one a block of 32 columns, int8's one
 * for the row (its per-key scale is the driver's, already in P). */
static inline __attribute__((always_inline)) size_t value_p_blocks(const int kind, size_t dv) {
    return kind == V_INT8 ? 1 : dv / 32;
}

/* Halves of 16 keys' rows, 4 blocks' scales a key, made block-major:
 * k0 (keys 0-7) and k1 (keys 8-15) hold key jj's 4 halves in qword jj % 8;
 * the result's 16-word halves are block 0, 1 (first) and 2, 3 (second)
 * of the 16 keys. */
static inline __attribute__((always_inline)) void keys_to_blocks(__m512i k0, __m512i k1, __m512i *b01,
                                                                 __m512i *b23) {
    /* word 16 b + jj of the pair takes word 4 jj + b of k0:k1 */
    const __m512i t01 = _mm512_set_epi16(61, 57, 53, 49, 45, 41, 37, 33, 29, 25, 21, 17, 13, 9, 5, 1, 60, 56, 52, 48,
                                         44, 40, 36, 32, 28, 24, 20, 16, 12, 8, 4, 0);
    const __m512i t23 = _mm512_add_epi16(t01, _mm512_set1_epi16(2));
    *b01 = _mm512_permutex2var_epi16(k0, t01, k1);
    *b23 = _mm512_permutex2var_epi16(k0, t23, k1);
}

/* n <= 8 rows' 4 halves (the group of blocks from byte off: bytes m0,
 * then m1 from off + 64) each in the qword of its key, the rest 0. */
static inline __attribute__((always_inline)) __m512i key_scales8(const int kind, const void *const *v_rows, size_t n,
                                                                 size_t off, __mmask64 m0, __mmask64 m1, __m512i at) {
    __m512i k = _mm512_setzero_si512();
    for (size_t jj = 0; jj < n; jj++) {
        const uint8_t *row = (const uint8_t *)v_rows[jj] + off;
        const __m512i lo = _mm512_maskz_loadu_epi8(m0, row);
        const __m512i hi = kind == V_Q8_0 && m1 ? _mm512_maskz_loadu_epi8(m1, row + 64) : lo;
        k = _mm512_mask_broadcastq_epi64(k, (__mmask8)(1u << jj), _mm512_castsi512_si128(_mm512_permutex2var_epi16(lo, at, hi)));
    }
    return k;
}

/* vd[b][c]: the block scales of keys [16 c, 16 c + 16) in block b (int8:
 * ones, lanes past nk 0), dm[b] the largest |scale| of the block (NaN when
 * one is NaN), b < value_p_blocks. V's row j at v_rows[j]: for each group
 * of 4 blocks a key's bytes are loaded (masked to the row) and one word
 * permute gathers its 4 halves into a qword, 8 keys to a vector; two
 * permutes make 16 keys of each block (copying the halves one by one
 * into a block-major array took a quarter of q8_0's P V in L1; design.md,
 * "Decode", the integer kernels' account). */
static inline __attribute__((always_inline)) void value_block_scales(const int kind, size_t nk, size_t dv,
                                                                     const void *const *v_rows,
                                                                     __m512 vd[MAX_BLOCKS][MAX_KEYS / 16],
                                                                     float dm[MAX_BLOCKS]) {
    if (kind == V_INT8) {
        for (size_t c = 0; c * 16 < nk; c++) vd[0][c] = _mm512_set1_ps(1.0f);
        dm[0] = 1.0f;
        return;
    }
    const size_t nb = value_p_blocks(kind, dv), bytes = fmha_int_block_bytes(kind), row_bytes = nb * bytes;
    const short w = (short)(bytes / 2); /* words from one block's scale to the next */
    /* words 0-3: the 4 scales of a group in a window of 128 bytes (q4_0's 4 x 18 bytes fit the first 64) */
    const __m512i at = _mm512_set_epi16(0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
                                        0, 0, (short)(3 * w), (short)(2 * w), w, 0);
    __m512 m[MAX_BLOCKS];
    __mmask16 nan[MAX_BLOCKS];
    for (size_t b = 0; b < nb; b++) m[b] = _mm512_setzero_ps(), nan[b] = 0;
    for (size_t g = 0; 4 * g < nb; g++) {
        const size_t off = 4 * g * bytes, left = row_bytes - off; /* the group's bytes to the row's end */
        const __mmask64 m0 = left >= 64 ? ~(__mmask64)0 : ((__mmask64)1 << left) - 1;
        const __mmask64 m1 = kind != V_Q8_0 || left <= 64 ? 0 : left >= 128 ? ~(__mmask64)0 : ((__mmask64)1 << (left - 64)) - 1;
        for (size_t c = 0; c * 16 < nk; c++) {
            const size_t n = nk - 16 * c < 16 ? nk - 16 * c : 16;
            const __m512i k0 = key_scales8(kind, v_rows + 16 * c, n < 8 ? n : 8, off, m0, m1, at);
            const __m512i k1 = n > 8 ? key_scales8(kind, v_rows + 16 * c + 8, n - 8, off, m0, m1, at) : _mm512_setzero_si512();
            __m512i pair[2];
            keys_to_blocks(k0, k1, &pair[0], &pair[1]);
            for (size_t i = 0; i < 4 && 4 * g + i < nb; i++) {
                const size_t b = 4 * g + i;
                const __m256i h = i % 2 ? _mm512_extracti64x4_epi64(pair[i / 2], 1) : _mm512_castsi512_si256(pair[i / 2]);
                vd[b][c] = _mm512_cvtph_ps(h);
                nan[b] |= _mm512_cmp_ps_mask(vd[b][c], vd[b][c], _CMP_UNORD_Q);
                m[b] = _mm512_max_ps(m[b], _mm512_abs_ps(vd[b][c]));
            }
        }
    }
    for (size_t b = 0; b < nb; b++) dm[b] = nan[b] ? NAN : _mm512_reduce_max_ps(m[b]);
}

/* Row r's P' for block b (keys in pairs: pw [nk / 2 rounded up] dwords, the
 * pad 0) and its scale *s, from the row's largest |P| pm and the block's
 * largest |scale| dm; where sum is not NULL, *sum their sum (|P'| <=
 * 32767, so exact for 64 keys). vd: the 16-key chunks' block scales
 * (int8: ones). */
static inline __attribute__((always_inline)) void quantize_row(size_t nk, const float *p,
                                                               const __m512 vd[MAX_KEYS / 16], float pm, float dm,
                                                               int32_t *pw, float *s, int32_t *sum) {
    const float mx = pm * dm;
    const int finite = mx <= 3.40282347e38f;
    *s = finite ? mx / 32767.0f : NAN;
    const __m512 inv = _mm512_set1_ps(finite && mx >= 0x1p-100f ? 32767.0f / mx : 0.0f);
    __m512i total = _mm512_setzero_si512();
    for (size_t c = 0; c * 16 < nk; c++) {
        const __mmask16 keys = nk - 16 * c >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (nk - 16 * c)) - 1u);
        const __m512 w = _mm512_mul_ps(_mm512_maskz_loadu_ps(keys, p + 16 * c), vd[c]);
        const __m512i q = finite ? _mm512_cvtps_epi32(_mm512_mul_ps(w, inv)) : _mm512_setzero_si512();
        _mm256_storeu_si256((__m256i *)((int16_t *)pw + 16 * c), _mm512_cvtepi32_epi16(q));
        if (sum) total = _mm512_add_epi32(total, q);
    }
    if (sum) *sum = _mm512_reduce_add_epi32(total);
}

/* The largest |x_i| of n <= MAX_KEYS floats, NaN when one is NaN. */
static inline __attribute__((always_inline)) float abs_max(size_t n, const float *x) {
    __m512 m = _mm512_setzero_ps();
    __mmask16 nan = 0;
    for (size_t c = 0; c * 16 < n; c++) {
        const __mmask16 keys = n - 16 * c >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - 16 * c)) - 1u);
        const __m512 v = _mm512_maskz_loadu_ps(keys, x + 16 * c);
        nan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
        m = _mm512_max_ps(m, _mm512_abs_ps(v));
    }
    return nan ? NAN : _mm512_reduce_max_ps(m);
}

#endif /* FMHA_UK_AVX512VNNI_VALUES_INT_H */
