/* avx512/decode.c: the AVX-512 decode microkernels (keys in the lanes).
 * Scores: one query row against 16 keys keeps 16 accumulators over the head
 * dim (the query vector is loaded once per 16 keys), then one transposing
 * reduction turns the 16 accumulators into the 16 keys' scores. Values: up to
 * 6 rows x 64 value dims of accumulators, a row of V loaded once per key and
 * 6 broadcasts of P. Softmax: row-wise max, then the exported vector exp.
 * Contract in ../ukernel.h; the scalar kernels (../scalar/decode.c) are the
 * specification. */
#include <immintrin.h>
#include <math.h>
#include <stddef.h>

#include "decode.h"

#define FMHA_INLINE static inline __attribute__((always_inline))

/* 16 vectors a[0..15] -> one vector whose lane j is the sum of a[j]'s lanes. */
FMHA_INLINE __m512 reduce16(__m512 a[16]) {
    __m512 s2[8], s4[4];
    /* pairs: per 128-bit lane [x0+x2, y0+y2, x1+x3, y1+y3] */
    for (int i = 0; i < 8; i++)
        s2[i] = _mm512_add_ps(_mm512_unpacklo_ps(a[2 * i], a[2 * i + 1]),
                              _mm512_unpackhi_ps(a[2 * i], a[2 * i + 1]));
    /* quads: per 128-bit lane the partial sums of 4 consecutive vectors */
    for (int i = 0; i < 4; i++) {
        __m512d x = _mm512_castps_pd(s2[2 * i]), y = _mm512_castps_pd(s2[2 * i + 1]);
        s4[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)),
                              _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
    }
    /* across the four 128-bit lanes */
    __m512 ab = _mm512_add_ps(_mm512_shuffle_f32x4(s4[0], s4[1], 0x88),
                              _mm512_shuffle_f32x4(s4[0], s4[1], 0xDD));
    __m512 cd = _mm512_add_ps(_mm512_shuffle_f32x4(s4[2], s4[3], 0x88),
                              _mm512_shuffle_f32x4(s4[2], s4[3], 0xDD));
    return _mm512_add_ps(_mm512_shuffle_f32x4(ab, cd, 0x88), _mm512_shuffle_f32x4(ab, cd, 0xDD));
}

void fmha_f32_decode_scores__avx512(size_t rows, size_t nk, size_t d, const float *q, size_t ldq,
                                    const float *k, size_t ldk, float *s, size_t lds, float scale) {
    const __m512 sv = _mm512_set1_ps(scale);
    const size_t d_full = d / 16 * 16;
    const __mmask16 d_tail = (__mmask16)((1u << (d % 16)) - 1u);
    for (size_t j0 = 0; j0 < nk; j0 += 16) {
        size_t nj = nk - j0 < 16 ? nk - j0 : 16;
        /* keys past nk repeat the last one; their lanes are not stored */
        const float *kr[16];
        for (size_t jj = 0; jj < 16; jj++) kr[jj] = k + (j0 + (jj < nj ? jj : nj - 1)) * ldk;
        /* the next 16 keys, for when rows are apart in memory (one row per
         * page in [B, S, H, D] caches defeats the hardware prefetcher); a
         * prefetch past the tensor's end is only a hint, never a read */
        for (size_t jj = 0; jj < 16; jj++)
            for (size_t e = 0; e < d; e += 16)
                _mm_prefetch((const char *)(kr[jj] + 16 * ldk + e), _MM_HINT_T0);
        for (size_t r = 0; r < rows; r++) {
            const float *qr = q + r * ldq;
            __m512 acc[16];
#pragma GCC unroll 16
            for (int jj = 0; jj < 16; jj++) acc[jj] = _mm512_setzero_ps();
            size_t e = 0;
            for (; e < d_full; e += 16) {
                const __m512 qv = _mm512_loadu_ps(qr + e);
#pragma GCC unroll 16
                for (int jj = 0; jj < 16; jj++)
                    acc[jj] = _mm512_fmadd_ps(qv, _mm512_loadu_ps(kr[jj] + e), acc[jj]);
            }
            if (d_tail) {
                const __m512 qv = _mm512_maskz_loadu_ps(d_tail, qr + e);
#pragma GCC unroll 16
                for (int jj = 0; jj < 16; jj++)
                    acc[jj] = _mm512_fmadd_ps(qv, _mm512_maskz_loadu_ps(d_tail, kr[jj] + e), acc[jj]);
            }
            _mm512_mask_storeu_ps(s + r * lds + j0, (__mmask16)((1u << nj) - 1u),
                                  _mm512_mul_ps(reduce16(acc), sv));
        }
    }
}

void fmha_f32_decode_softmax__avx512(size_t rows, size_t nk, float *s, size_t lds, float *m,
                                     float *l, float *alpha) {
    for (size_t r = 0; r < rows; r++) {
        float *row = s + r * lds;
        __m512 mx = _mm512_set1_ps(m[r]);
        __mmask16 nan = 0; /* lanes that met a NaN score */
        size_t j = 0;
        for (; j + 16 <= nk; j += 16) {
            const __m512 x = _mm512_loadu_ps(row + j);
            mx = _mm512_max_ps(mx, x);
            nan |= _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
        }
        const __mmask16 tail = (__mmask16)((1u << (nk - j)) - 1u);
        const __m512 xt = _mm512_mask_loadu_ps(mx, tail, row + j);
        mx = _mm512_max_ps(mx, xt);
        nan |= _mm512_cmp_ps_mask(xt, xt, _CMP_UNORD_Q);
        /* a NaN score (or a NaN running max) makes the row NaN */
        const float m_new = nan || isnan(m[r]) ? NAN : _mm512_reduce_max_ps(mx);
        const float m_use = m_new == -INFINITY ? 0.0f : m_new;
        const __m512 mu = _mm512_set1_ps(m_use);
        /* s - m_use in place, then exp in place; -inf - m_use stays -inf -> 0 */
        for (j = 0; j + 16 <= nk; j += 16)
            _mm512_storeu_ps(row + j, _mm512_sub_ps(_mm512_loadu_ps(row + j), mu));
        _mm512_mask_storeu_ps(row + j, tail, _mm512_sub_ps(_mm512_maskz_loadu_ps(tail, row + j), mu));
        fmha_f32_exp__avx512(nk, row, row);
        __m512 sum = _mm512_setzero_ps();
        for (j = 0; j + 16 <= nk; j += 16) sum = _mm512_add_ps(sum, _mm512_loadu_ps(row + j));
        sum = _mm512_add_ps(sum, _mm512_maskz_loadu_ps(tail, row + j));
        float a = m[r] - m_use;
        fmha_f32_exp__avx512(1, &a, &a);
        alpha[r] = a;
        l[r] = l[r] * a + _mm512_reduce_add_ps(sum);
        m[r] = m_new;
    }
}

enum { VAL_ROWS = 6, VAL_VECS = 4 };

/* Rows [0, n) (n <= 6) of o, value dims [c0, c0 + 64) with masks per vector. */
FMHA_INLINE void values_block(size_t n, size_t nk, size_t c0, const __mmask16 cm[VAL_VECS],
                              const float *p, size_t ldp, const float *v, size_t ldv, float *o,
                              size_t ldo, const float *alpha, int prefetch) {
    __m512 acc[VAL_ROWS][VAL_VECS];
    const float *pr[VAL_ROWS];
#pragma GCC unroll 6
    for (size_t r = 0; r < VAL_ROWS; r++) {
        pr[r] = p + (r < n ? r : n - 1) * ldp;
#pragma GCC unroll 4
        for (int c = 0; c < VAL_VECS; c++) acc[r][c] = _mm512_setzero_ps();
    }
    for (size_t j = 0; j < nk; j++) {
        const float *vr = v + j * ldv + c0;
        /* 16 keys ahead (see the scores kernel) */
        if (prefetch)
#pragma GCC unroll 4
            for (int c = 0; c < VAL_VECS; c++) _mm_prefetch((const char *)(vr + 16 * ldv + 16 * c), _MM_HINT_T0);
        __m512 vv[VAL_VECS];
#pragma GCC unroll 4
        for (int c = 0; c < VAL_VECS; c++) vv[c] = _mm512_maskz_loadu_ps(cm[c], vr + 16 * c);
#pragma GCC unroll 6
        for (size_t r = 0; r < VAL_ROWS; r++) {
            const __m512 pv = _mm512_set1_ps(pr[r][j]);
#pragma GCC unroll 4
            for (int c = 0; c < VAL_VECS; c++) acc[r][c] = _mm512_fmadd_ps(pv, vv[c], acc[r][c]);
        }
    }
#pragma GCC unroll 6
    for (size_t r = 0; r < VAL_ROWS; r++) {
        if (r >= n) break;
        const __m512 a = _mm512_set1_ps(alpha[r]);
        float *orow = o + r * ldo + c0;
#pragma GCC unroll 4
        for (int c = 0; c < VAL_VECS; c++) {
            const __m512 old = _mm512_maskz_loadu_ps(cm[c], orow + 16 * c);
            _mm512_mask_storeu_ps(orow + 16 * c, cm[c], _mm512_fmadd_ps(old, a, acc[r][c]));
        }
    }
}

void fmha_f32_decode_values__avx512(size_t rows, size_t nk, size_t dv, const float *p, size_t ldp,
                                    const float *v, size_t ldv, float *o, size_t ldo,
                                    const float *alpha) {
    for (size_t c0 = 0; c0 < dv; c0 += 16 * VAL_VECS) {
        __mmask16 cm[VAL_VECS];
        for (int c = 0; c < VAL_VECS; c++) {
            size_t lo = c0 + 16 * (size_t)c, left = dv > lo ? dv - lo : 0;
            cm[c] = left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1u);
        }
        for (size_t r0 = 0; r0 < rows; r0 += VAL_ROWS) {
            size_t n = rows - r0 < VAL_ROWS ? rows - r0 : VAL_ROWS;
            values_block(n, nk, c0, cm, p + r0 * ldp, ldp, v, ldv, o + r0 * ldo, ldo, alpha + r0,
                         r0 == 0);
        }
    }
}

void fmha_widen_bf16__avx512(size_t n, const uint16_t *src, float *dst) {
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512i x = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(src + i)));
        _mm512_storeu_ps(dst + i, _mm512_castsi512_ps(_mm512_slli_epi32(x, 16)));
    }
    if (i < n) {
        const __mmask16 tail = (__mmask16)((1u << (n - i)) - 1u);
        __m512i x = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(tail, src + i));
        _mm512_mask_storeu_ps(dst + i, tail, _mm512_castsi512_ps(_mm512_slli_epi32(x, 16)));
    }
}

void fmha_widen_f16__avx512(size_t n, const uint16_t *src, float *dst) {
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(src + i))));
    if (i < n) {
        const __mmask16 tail = (__mmask16)((1u << (n - i)) - 1u);
        _mm512_mask_storeu_ps(dst + i, tail, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(tail, src + i)));
    }
}
