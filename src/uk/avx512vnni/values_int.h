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
 * ones), dm[b] the largest |scale| of the block (NaN when one is NaN), b <
 * value_p_blocks. V's row j at v_rows[j]: each 16 keys' halves by one
 * gather on the rows' 32-bit offsets from row 0 (every cache here: the
 * rows within 1 GiB of each other), else row by row. */
static inline __attribute__((always_inline)) void value_block_scales(const int kind, size_t nk, size_t dv,
                                                                     const void *const *v_rows,
                                                                     __m512 vd[MAX_BLOCKS][MAX_KEYS / 16],
                                                                     float dm[MAX_BLOCKS]) {
    const size_t nb = value_p_blocks(kind, dv);
    const uint8_t *v0 = v_rows[0];
    int32_t off[MAX_KEYS] __attribute__((aligned(64)));
    int gather = 1;
    if (kind != V_INT8) {
        const __m512i base = _mm512_set1_epi64((long long)(uintptr_t)v0), lim = _mm512_set1_epi64(1ll << 30);
        for (size_t c = 0; c * 8 < (nk + 15) / 16 * 16; c++) { /* whole 16-key chunks, lanes past nk 0 */
            const size_t left = nk > 8 * c ? nk - 8 * c : 0;
            const __mmask8 keys = left >= 8 ? (__mmask8)0xff : (__mmask8)((1u << left) - 1u);
            const __m512i d = _mm512_maskz_sub_epi64(keys, _mm512_maskz_loadu_epi64(keys, v_rows + 8 * c), base);
            gather &= !_mm512_cmpgt_epi64_mask(_mm512_abs_epi64(d), lim);
            _mm256_store_si256((__m256i *)(off + 8 * c), _mm512_cvtepi64_epi32(d));
        }
    }
    for (size_t b = 0; b < nb; b++) {
        __m512 m = _mm512_setzero_ps();
        __mmask16 nan = 0;
        for (size_t c = 0; c * 16 < nk; c++) {
            const __mmask16 keys = nk - 16 * c >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (nk - 16 * c)) - 1u);
            if (kind == V_INT8) {
                vd[b][c] = _mm512_set1_ps(1.0f);
                continue;
            }
            const uint8_t *at = v0 + b * fmha_int_block_bytes(kind);
            __m256i h;
            if (gather) {
                h = _mm512_cvtepi32_epi16(_mm512_mask_i32gather_epi32(_mm512_setzero_si512(), keys,
                                                                      _mm512_load_si512(off + 16 * c), at, 1));
            } else {
                uint16_t hs[16] = {0};
                for (size_t i = 0; i < 16 && 16 * c + i < nk; i++)
                    __builtin_memcpy(&hs[i], (const uint8_t *)v_rows[16 * c + i] + b * fmha_int_block_bytes(kind), 2);
                h = _mm256_loadu_si256((const __m256i *)hs);
            }
            vd[b][c] = _mm512_cvtph_ps(h);
            nan |= _mm512_cmp_ps_mask(vd[b][c], vd[b][c], _CMP_UNORD_Q);
            m = _mm512_max_ps(m, _mm512_abs_ps(vd[b][c]));
        }
        dm[b] = kind == V_INT8 ? 1.0f : nan ? NAN : _mm512_reduce_max_ps(m);
    }
}

/* Row r's P' for block b (keys in pairs: pw [nk / 2 rounded up] dwords, the
 * pad 0) and its scale *s, from the row's largest |P| pm and the block's
 * largest |scale| dm. vd: the 16-key chunks' block scales (int8: ones). */
static inline __attribute__((always_inline)) void quantize_row(size_t nk, const float *p,
                                                               const __m512 vd[MAX_KEYS / 16], float pm, float dm,
                                                               int32_t *pw, float *s) {
    const float mx = pm * dm;
    const int finite = mx <= 3.40282347e38f;
    *s = finite ? mx / 32767.0f : NAN;
    const __m512 inv = _mm512_set1_ps(finite && mx >= 0x1p-100f ? 32767.0f / mx : 0.0f);
    for (size_t c = 0; c * 16 < nk; c++) {
        const __mmask16 keys = nk - 16 * c >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (nk - 16 * c)) - 1u);
        const __m512 w = _mm512_mul_ps(_mm512_maskz_loadu_ps(keys, p + 16 * c), vd[c]);
        const __m512i q = finite ? _mm512_cvtps_epi32(_mm512_mul_ps(w, inv)) : _mm512_setzero_si512();
        _mm256_storeu_si256((__m256i *)((int16_t *)pw + 16 * c), _mm512_cvtepi32_epi16(q));
    }
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
