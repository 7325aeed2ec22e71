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

/* vd[b][c]: the block scales of keys [16 c, 16 c + 16) in block b (int8:
 * ones, lanes past nk 0), dm[b] the largest |scale| of the block (NaN when
 * one is NaN), b < value_p_blocks. V's row j at v_rows[j]: its halves are
 * read a row at a time into hs[b][j] (plain loads: as fast as a gather a
 * block, with no bound on the rows' offsets), then taken 16 keys at a
 * time. */
static inline __attribute__((always_inline)) void value_block_scales(const int kind, size_t nk, size_t dv,
                                                                     const void *const *v_rows,
                                                                     __m512 vd[MAX_BLOCKS][MAX_KEYS / 16],
                                                                     float dm[MAX_BLOCKS]) {
    if (kind == V_INT8) {
        for (size_t c = 0; c * 16 < nk; c++) vd[0][c] = _mm512_set1_ps(1.0f);
        dm[0] = 1.0f;
        return;
    }
    const size_t nb = value_p_blocks(kind, dv), bytes = fmha_int_block_bytes(kind);
    _Alignas(64) uint16_t hs[MAX_BLOCKS][MAX_KEYS]; /* [block][key] */
    for (size_t j = 0; j < nk; j++) {
        const uint8_t *row = v_rows[j];
        for (size_t b = 0; b < nb; b++) __builtin_memcpy(&hs[b][j], row + b * bytes, 2);
    }
    for (size_t b = 0; b < nb; b++) {
        __m512 m = _mm512_setzero_ps();
        __mmask16 nan = 0;
        for (size_t c = 0; c * 16 < nk; c++) {
            const __mmask16 keys = nk - 16 * c >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (nk - 16 * c)) - 1u);
            vd[b][c] = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(keys, hs[b] + 16 * c));
            nan |= _mm512_cmp_ps_mask(vd[b][c], vd[b][c], _CMP_UNORD_Q);
            m = _mm512_max_ps(m, _mm512_abs_ps(vd[b][c]));
        }
        dm[b] = nan ? NAN : _mm512_reduce_max_ps(m);
    }
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
