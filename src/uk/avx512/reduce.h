/* avx512/reduce.h: the transposing sum of 16 vectors the decode scores
 * kernels end with (decode.c; avx512bf16/decode_bf16.c), one tree: lane j
 * of the result is ((G0 + G1) + (G2 + G3)) over a[j]'s 128-bit groups,
 * Gk = (x4k + x4k+2) + (x4k+1 + x4k+3) of its lanes x. */
#ifndef FMHA_UK_AVX512_REDUCE_H
#define FMHA_UK_AVX512_REDUCE_H

#include <immintrin.h>

/* 16 vectors a[0..15] -> one vector whose lane j is the sum of a[j]'s lanes. */
static inline __attribute__((always_inline)) __m512 fmha_avx512_reduce16(const __m512 a[16]) {
    __m512 s2[8], s4[4];
    /* pairs: per 128-bit lane [x0+x2, y0+y2, x1+x3, y1+y3] */
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++)
        s2[i] = _mm512_add_ps(_mm512_unpacklo_ps(a[2 * i], a[2 * i + 1]),
                              _mm512_unpackhi_ps(a[2 * i], a[2 * i + 1]));
    /* quads: per 128-bit lane the partial sums of 4 consecutive vectors */
#pragma GCC unroll 4
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

#endif /* FMHA_UK_AVX512_REDUCE_H */
