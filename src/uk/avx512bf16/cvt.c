/* avx512bf16/cvt.c: one float32 row of 64 lanes rounded to bf16 (nearest
 * even, vcvtneps2bf16), the layout the backward's bf16 GEMMs read as pairs
 * along queries. Contract in ../ukernel.h (fmha_bf16_cvt_row_ukernel_fn). */
#include <immintrin.h>

#include "bf16.h"

void fmha_bf16_cvt_row_ukernel_64__avx512bf16(const float *src, uint16_t *dst) {
    for (int v = 0; v < 4; v++) {
        __m256bh h = _mm512_cvtneps_pbh(_mm512_loadu_ps(src + 16 * v));
        _mm256_storeu_si256((__m256i *)(dst + 16 * v), (__m256i)h);
    }
}
