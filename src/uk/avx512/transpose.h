/* avx512/transpose.h: the 16 x 16 float32 transposition in registers,
 * shared by the packing copy (f32.c) and the rows-in-lanes decode scores
 * (decode.c; the integer ones through avx512vnni/rows_in_lanes.h), whose
 * accumulators hold keys by row and leave rows by key. */
#ifndef FMHA_UK_AVX512_TRANSPOSE_H
#define FMHA_UK_AVX512_TRANSPOSE_H

#include <immintrin.h>

/* Transposes 16 rows of 16 floats in registers: on return x[c][l] is the
 * old x[l][c]. Unpack pairs, shuffle quads within 128-bit lanes, then move
 * 128-bit lanes across the four row groups. */
static inline __attribute__((always_inline)) void fmha_avx512_transpose16(__m512 x[16]) {
    __m512 t[16], u[16];
    /* fully unrolled, so x, t and u live in registers (-O2 does not unroll) */
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++) {
        t[2 * i] = _mm512_unpacklo_ps(x[2 * i], x[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(x[2 * i], x[2 * i + 1]);
    }
    /* u[4g + k], 128-bit lane L: column 4L + k of rows 4g .. 4g + 3 */
#pragma GCC unroll 4
    for (int g = 0; g < 4; g++) {
        u[4 * g + 0] = _mm512_shuffle_ps(t[4 * g + 0], t[4 * g + 2], _MM_SHUFFLE(1, 0, 1, 0));
        u[4 * g + 1] = _mm512_shuffle_ps(t[4 * g + 0], t[4 * g + 2], _MM_SHUFFLE(3, 2, 3, 2));
        u[4 * g + 2] = _mm512_shuffle_ps(t[4 * g + 1], t[4 * g + 3], _MM_SHUFFLE(1, 0, 1, 0));
        u[4 * g + 3] = _mm512_shuffle_ps(t[4 * g + 1], t[4 * g + 3], _MM_SHUFFLE(3, 2, 3, 2));
    }
#pragma GCC unroll 4
    for (int k = 0; k < 4; k++) {
        __m512 s0 = _mm512_shuffle_f32x4(u[k], u[4 + k], _MM_SHUFFLE(2, 0, 2, 0));
        __m512 s1 = _mm512_shuffle_f32x4(u[k], u[4 + k], _MM_SHUFFLE(3, 1, 3, 1));
        __m512 s2 = _mm512_shuffle_f32x4(u[8 + k], u[12 + k], _MM_SHUFFLE(2, 0, 2, 0));
        __m512 s3 = _mm512_shuffle_f32x4(u[8 + k], u[12 + k], _MM_SHUFFLE(3, 1, 3, 1));
        x[k + 0] = _mm512_shuffle_f32x4(s0, s2, _MM_SHUFFLE(2, 0, 2, 0));
        x[k + 8] = _mm512_shuffle_f32x4(s0, s2, _MM_SHUFFLE(3, 1, 3, 1));
        x[k + 4] = _mm512_shuffle_f32x4(s1, s3, _MM_SHUFFLE(2, 0, 2, 0));
        x[k + 12] = _mm512_shuffle_f32x4(s1, s3, _MM_SHUFFLE(3, 1, 3, 1));
    }
}

#endif /* FMHA_UK_AVX512_TRANSPOSE_H */
