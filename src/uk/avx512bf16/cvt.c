/* avx512bf16/cvt.c: float32 rows to bf16 pairs beyond the pair-row kernel:
 *   split      bf16 pairs plus the pairs of their rounding residuals, so
 *              that the P V product of the forward keeps float32-like
 *              accuracy on vdpbf16ps
 *   pack rows  rows rounded in place order, adjacent elements paired (the
 *              P^T and dS^T operands of the backward's dV and dK products)
 * Contracts in ../ukernel.h (fmha_bf16_pair_rows_split_ukernel_fn,
 * fmha_bf16_pack_rows_ukernel_fn). */
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

/* Lanes below n of a 16-lane mask (n may exceed 16). */
static __mmask16 first_lanes(size_t n) { return n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << n) - 1); }

/* dst[r][p] = (bf16(src[r][2p]), bf16(src[r][2p + 1])) for p < (n + 1) / 2:
 * 32 floats at a time, one vcvtne2ps2bf16 leaves them in order, which is
 * the pair layout; masked loads read nothing past n (an odd n pairs with 0). */
void fmha_bf16_pack_rows_ukernel__avx512bf16(size_t rows, size_t n, const float *src, size_t lds,
                                             uint32_t *dst, size_t ldd) {
    for (size_t r = 0; r < rows; r++) {
        const float *s = src + r * lds;
        uint32_t *d = dst + r * ldd;
        for (size_t j = 0; j < n; j += 32) {
            const size_t left = n - j;
            const __m512 lo = _mm512_maskz_loadu_ps(first_lanes(left), s + j);
            const __m512 hi = _mm512_maskz_loadu_ps(left > 16 ? first_lanes(left - 16) : 0, s + j + 16);
            const __m512i both = (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
            _mm512_mask_storeu_epi32(d + j / 2, first_lanes((left + 1) / 2), both);
        }
    }
}
