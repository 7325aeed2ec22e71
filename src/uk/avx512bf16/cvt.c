/* avx512bf16/cvt.c: float32 rows split into bf16 pairs plus the pairs of
 * their rounding residuals, so that the P V product of the forward keeps
 * float32-like accuracy on vdpbf16ps. Contract in ../ukernel.h
 * (fmha_bf16_pair_rows_split_ukernel_fn). */
#include <immintrin.h>

#include "bf16.h"

/* Two float32 rows a, b (b NULL: zeros) as bf16 pairs hi[i] = (bf16(a[i]),
 * bf16(b[i])) plus the pairs of what rounding left out, lo[i] = (bf16(a[i] -
 * hi_a[i]), bf16(b[i] - hi_b[i])): hi + lo carries about 16 significant bits,
 * so a GEMM over both is nearly float32-accurate at twice the bf16 cost. */
void fmha_bf16_pair_rows_split_ukernel_64__avx512bf16(const float *a, const float *b, uint32_t *hi,
                                                      uint32_t *lo) {
    float ra[64], rb[64];
    fmha_bf16_pair_rows_ukernel_64__avx512bf16(a, b, hi);
    const __m512i low_half = _mm512_set1_epi32(0xffff), high_half = _mm512_set1_epi32((int)0xffff0000u);
    for (int v = 0; v < 4; v++) {
        __m512i w = _mm512_loadu_si512((const void *)(hi + 16 * v));
        __m512 a_hi = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_and_si512(w, low_half), 16));
        __m512 b_hi = _mm512_castsi512_ps(_mm512_and_si512(w, high_half));
        _mm512_storeu_ps(ra + 16 * v, _mm512_sub_ps(_mm512_loadu_ps(a + 16 * v), a_hi));
        __m512 bv = b ? _mm512_loadu_ps(b + 16 * v) : _mm512_setzero_ps();
        _mm512_storeu_ps(rb + 16 * v, _mm512_sub_ps(bv, b_hi));
    }
    fmha_bf16_pair_rows_ukernel_64__avx512bf16(ra, rb, lo);
}
