/* avx2/decode.c: the AVX2 decode microkernels (keys in the lanes). As the
 * AVX-512 ones with 8 lanes: scores keep 8 accumulators for one query row
 * against 8 keys and reduce them with one transposing hadd tree; values keep
 * up to 6 rows x 16 value dims; softmax runs the exported vector exp.
 * Contract in ../ukernel.h; ../scalar/decode.c is the specification. */
#include <immintrin.h>
#include <math.h>
#include <stddef.h>

#include "../scalar/decode.h"
#include "decode.h"

#define FMHA_INLINE static inline __attribute__((always_inline))

/* Lanes [0, n) set (n <= 8), for maskload/maskstore. */
FMHA_INLINE __m256i lanes(size_t n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* 8 vectors a[0..7] -> one vector whose lane j is the sum of a[j]'s lanes. */
FMHA_INLINE __m256 reduce8(const __m256 a[8]) {
    /* per 128-bit half: [a0 a0 a1 a1], then [a0 a1 a2 a3] partial sums */
    __m256 h01 = _mm256_hadd_ps(a[0], a[1]), h23 = _mm256_hadd_ps(a[2], a[3]);
    __m256 h45 = _mm256_hadd_ps(a[4], a[5]), h67 = _mm256_hadd_ps(a[6], a[7]);
    __m256 q0 = _mm256_hadd_ps(h01, h23), q1 = _mm256_hadd_ps(h45, h67);
    /* low halves + high halves: lanes 0-3 keys 0-3, lanes 4-7 keys 4-7 */
    __m256 lo = _mm256_permute2f128_ps(q0, q1, 0x20), hi = _mm256_permute2f128_ps(q0, q1, 0x31);
    return _mm256_add_ps(lo, hi);
}

void fmha_f32_decode_scores__avx2(size_t rows, size_t nk, size_t d, const float *q, size_t ldq,
                                  const void *k_row0, size_t ldk, float *s, size_t lds, float scale) {
    const float *k = k_row0;
    const __m256 sv = _mm256_set1_ps(scale);
    const size_t d_full = d / 8 * 8;
    const __m256i d_tail = lanes(d % 8);
    for (size_t j0 = 0; j0 < nk; j0 += 8) {
        size_t nj = nk - j0 < 8 ? nk - j0 : 8;
        /* keys past nk repeat the last one; their lanes are not stored */
        const float *kr[8];
        for (size_t jj = 0; jj < 8; jj++) kr[jj] = k + (j0 + (jj < nj ? jj : nj - 1)) * ldk;
        /* the next 8 keys (rows a page apart defeat the hardware prefetcher) */
        for (size_t jj = 0; jj < 8; jj++)
            for (size_t e = 0; e < d; e += 16)
                _mm_prefetch((const char *)(kr[jj] + 8 * ldk + e), _MM_HINT_T0);
        for (size_t r = 0; r < rows; r++) {
            const float *qr = q + r * ldq;
            __m256 acc[8];
#pragma GCC unroll 8
            for (int jj = 0; jj < 8; jj++) acc[jj] = _mm256_setzero_ps();
            size_t e = 0;
            for (; e < d_full; e += 8) {
                const __m256 qv = _mm256_loadu_ps(qr + e);
#pragma GCC unroll 8
                for (int jj = 0; jj < 8; jj++)
                    acc[jj] = _mm256_fmadd_ps(qv, _mm256_loadu_ps(kr[jj] + e), acc[jj]);
            }
            if (d % 8) {
                const __m256 qv = _mm256_maskload_ps(qr + e, d_tail);
#pragma GCC unroll 8
                for (int jj = 0; jj < 8; jj++)
                    acc[jj] = _mm256_fmadd_ps(qv, _mm256_maskload_ps(kr[jj] + e, d_tail), acc[jj]);
            }
            _mm256_maskstore_ps(s + r * lds + j0, lanes(nj), _mm256_mul_ps(reduce8(acc), sv));
        }
    }
}

/* Largest and sum of the 8 lanes. */
FMHA_INLINE float hmax8(__m256 x) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}

FMHA_INLINE float hsum8(__m256 x) {
    __m128 m = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    m = _mm_add_ps(m, _mm_movehl_ps(m, m));
    m = _mm_add_ss(m, _mm_movehdup_ps(m));
    return _mm_cvtss_f32(m);
}

void fmha_f32_decode_softmax__avx2(size_t rows, size_t nk, float *s, size_t lds, float *m, float *l,
                                   float *alpha) {
    const __m256 neg_inf = _mm256_set1_ps(-INFINITY);
    for (size_t r = 0; r < rows; r++) {
        float *row = s + r * lds;
        __m256 mx = _mm256_set1_ps(m[r]), nan = _mm256_setzero_ps(); /* nan: lanes that met a NaN */
        size_t j = 0;
        for (; j + 8 <= nk; j += 8) {
            const __m256 x = _mm256_loadu_ps(row + j);
            mx = _mm256_max_ps(mx, x);
            nan = _mm256_or_ps(nan, _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
        }
        const __m256i tail = lanes(nk - j);
        const __m256 xt = _mm256_blendv_ps(neg_inf, _mm256_maskload_ps(row + j, tail), _mm256_castsi256_ps(tail));
        mx = _mm256_max_ps(mx, xt);
        nan = _mm256_or_ps(nan, _mm256_cmp_ps(xt, xt, _CMP_UNORD_Q));
        /* a NaN score (or a NaN running max) makes the row NaN */
        const float m_new = _mm256_movemask_ps(nan) || isnan(m[r]) ? NAN : hmax8(mx);
        const float m_use = m_new == -INFINITY ? 0.0f : m_new;
        const __m256 mu = _mm256_set1_ps(m_use);
        /* s - m_use in place, then exp in place; -inf - m_use stays -inf -> 0 */
        for (j = 0; j + 8 <= nk; j += 8) _mm256_storeu_ps(row + j, _mm256_sub_ps(_mm256_loadu_ps(row + j), mu));
        _mm256_maskstore_ps(row + j, tail, _mm256_sub_ps(_mm256_maskload_ps(row + j, tail), mu));
        fmha_f32_exp__avx2(nk, row, row);
        __m256 sum = _mm256_setzero_ps();
        for (j = 0; j + 8 <= nk; j += 8) sum = _mm256_add_ps(sum, _mm256_loadu_ps(row + j));
        sum = _mm256_add_ps(sum, _mm256_maskload_ps(row + j, tail));
        float a = m[r] - m_use;
        fmha_f32_exp__avx2(1, &a, &a);
        alpha[r] = a;
        l[r] = l[r] * a + hsum8(sum);
        m[r] = m_new;
    }
}

enum { VAL_ROWS = 6, VAL_VECS = 2 };

/* Rows [0, n) (n <= 6) of o, value dims [c0, c0 + 16) with lane masks per vector. */
FMHA_INLINE void values_block(size_t n, size_t nk, size_t c0, const __m256i cm[VAL_VECS], const float *p,
                              size_t ldp, const float *v, size_t ldv, float *o, size_t ldo,
                              const float *alpha, int prefetch) {
    __m256 acc[VAL_ROWS][VAL_VECS];
    const float *pr[VAL_ROWS];
#pragma GCC unroll 6
    for (size_t r = 0; r < VAL_ROWS; r++) {
        pr[r] = p + (r < n ? r : n - 1) * ldp;
#pragma GCC unroll 2
        for (int c = 0; c < VAL_VECS; c++) acc[r][c] = _mm256_setzero_ps();
    }
    for (size_t j = 0; j < nk; j++) {
        const float *vr = v + j * ldv + c0;
        if (prefetch) _mm_prefetch((const char *)(vr + 8 * ldv), _MM_HINT_T0); /* 8 keys ahead */
        __m256 vv[VAL_VECS];
#pragma GCC unroll 2
        for (int c = 0; c < VAL_VECS; c++) vv[c] = _mm256_maskload_ps(vr + 8 * c, cm[c]);
#pragma GCC unroll 6
        for (size_t r = 0; r < VAL_ROWS; r++) {
            const __m256 pv = _mm256_broadcast_ss(pr[r] + j);
#pragma GCC unroll 2
            for (int c = 0; c < VAL_VECS; c++) acc[r][c] = _mm256_fmadd_ps(pv, vv[c], acc[r][c]);
        }
    }
#pragma GCC unroll 6
    for (size_t r = 0; r < VAL_ROWS; r++) {
        if (r >= n) break;
        const __m256 a = _mm256_set1_ps(alpha[r]);
        float *orow = o + r * ldo + c0;
#pragma GCC unroll 2
        for (int c = 0; c < VAL_VECS; c++) {
            const __m256 old = _mm256_maskload_ps(orow + 8 * c, cm[c]);
            _mm256_maskstore_ps(orow + 8 * c, cm[c], _mm256_fmadd_ps(old, a, acc[r][c]));
        }
    }
}

void fmha_f32_decode_values__avx2(size_t rows, size_t nk, size_t dv, const float *p, size_t ldp,
                                  const void *v_row0, size_t ldv, float *o, size_t ldo, const float *alpha) {
    const float *v = v_row0;
    for (size_t c0 = 0; c0 < dv; c0 += 8 * VAL_VECS) {
        __m256i cm[VAL_VECS];
        for (int c = 0; c < VAL_VECS; c++) {
            size_t lo = c0 + 8 * (size_t)c, left = dv > lo ? dv - lo : 0;
            cm[c] = lanes(left < 8 ? left : 8);
        }
        for (size_t r0 = 0; r0 < rows; r0 += VAL_ROWS) {
            size_t n = rows - r0 < VAL_ROWS ? rows - r0 : VAL_ROWS;
            values_block(n, nk, c0, cm, p + r0 * ldp, ldp, v, ldv, o + r0 * ldo, ldo, alpha + r0,
                         r0 == 0);
        }
    }
}

void fmha_widen_bf16__avx2(size_t n, const void *src_row, float *dst) {
    const uint16_t *src = src_row;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256i x = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(src + i)));
        _mm256_storeu_ps(dst + i, _mm256_castsi256_ps(_mm256_slli_epi32(x, 16)));
    }
    for (; i < n; i++) {
        uint32_t u = (uint32_t)src[i] << 16;
        float f;
        __builtin_memcpy(&f, &u, 4);
        dst[i] = f;
    }
}

void fmha_widen_f16__avx2(size_t n, const void *src_row, float *dst) {
    const uint16_t *src = src_row;
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
    if (i < n) {
        uint16_t t[8] = {0};
        float f[8];
        for (size_t j = 0; j < n - i; j++) t[j] = src[i + j];
        _mm256_storeu_ps(f, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)t)));
        for (size_t j = 0; j < n - i; j++) dst[i + j] = f[j];
    }
}

/* ---- 8-bit and GGUF cache rows, widened 8 values at a time (the decode
 * driver then runs the float32 kernels on them; tails by the scalar part) */

/* 8 fp8 bytes as float32: E5M2 is a half's top byte; E4M3FN moved into a
 * half's exponent and mantissa is the value / 2^8, S.1111.111 its NaN. */
FMHA_INLINE __m256 widen_fp8x8(int e4m3, const uint8_t *src) {
    const __m128i b = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)src));
    if (!e4m3) return _mm256_cvtph_ps(_mm_slli_epi16(b, 8));
    const __m128i mag = _mm_and_si128(b, _mm_set1_epi16(0x7f));
    const __m128i h = _mm_or_si128(_mm_slli_epi16(mag, 7), _mm_slli_epi16(_mm_srli_epi16(b, 7), 15));
    const __m256 x = _mm256_mul_ps(_mm256_cvtph_ps(h), _mm256_set1_ps(256.0f));
    const __m256 nan = _mm256_castsi256_ps(_mm256_cvtepi16_epi32(_mm_cmpeq_epi16(mag, _mm_set1_epi16(0x7f))));
    return _mm256_blendv_ps(x, _mm256_set1_ps(NAN), nan);
}

void fmha_widen_int8__avx2(size_t n, const void *src_row, float *dst) {
    const int8_t *src = src_row;
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(src + i)))));
    if (i < n) fmha_load_int8__scalar(n - i, src + i, dst + i);
}

void fmha_widen_e4m3__avx2(size_t n, const void *src_row, float *dst) {
    const uint8_t *src = src_row;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, widen_fp8x8(1, src + i));
    if (i < n) fmha_load_e4m3__scalar(n - i, src + i, dst + i);
}

void fmha_widen_e5m2__avx2(size_t n, const void *src_row, float *dst) {
    const uint8_t *src = src_row;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, widen_fp8x8(0, src + i));
    if (i < n) fmha_load_e5m2__scalar(n - i, src + i, dst + i);
}

/* GGUF blocks of 32 (n a multiple of 32): q8_0 = d * q, q4_0 = d * (nibble - 8) */
void fmha_widen_q8_0__avx2(size_t n, const void *src_row, float *dst) {
    const uint8_t *blk = src_row;
    for (size_t i = 0; i < n; i += FMHA_GGUF_BLOCK, blk += FMHA_Q8_0_BLOCK_BYTES) {
        uint16_t dh;
        __builtin_memcpy(&dh, blk, 2);
        const __m256 d = _mm256_cvtph_ps(_mm_set1_epi16((short)dh));
        for (int v = 0; v < 4; v++) {
            const __m256i q = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(blk + 2 + 8 * v)));
            _mm256_storeu_ps(dst + i + 8 * v, _mm256_mul_ps(_mm256_cvtepi32_ps(q), d));
        }
    }
}

void fmha_widen_q4_0__avx2(size_t n, const void *src_row, float *dst) {
    const uint8_t *blk = src_row;
    for (size_t i = 0; i < n; i += FMHA_GGUF_BLOCK, blk += FMHA_Q4_0_BLOCK_BYTES) {
        uint16_t dh;
        __builtin_memcpy(&dh, blk, 2);
        const __m256 d = _mm256_cvtph_ps(_mm_set1_epi16((short)dh));
        for (int v = 0; v < 4; v++) { /* values 0..15 the low nibbles, 16..31 the high */
            const __m256i bytes = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(blk + 2 + 8 * (v % 2))));
            const __m256i nib = v < 2 ? _mm256_and_si256(bytes, _mm256_set1_epi32(15)) : _mm256_srli_epi32(bytes, 4);
            const __m256i q = _mm256_sub_epi32(nib, _mm256_set1_epi32(8));
            _mm256_storeu_ps(dst + i + 8 * v, _mm256_mul_ps(_mm256_cvtepi32_ps(q), d));
        }
    }
}
