/* dropout.c (AVX-512): the dropout kernel (contract and scalar
 * specification: ukernel.h, uk/scalar/dropout.c), 16 lanes a step: two
 * vectors of 8 64-bit counters hashed with vpmullq (AVX-512 DQ), their
 * keep masks joined into one 16-lane mask for the multiply. */
#include <immintrin.h>

#include "../ukernel.h"

static inline __m512i mix64x8(__m512i z) {
    z = _mm512_mullo_epi64(_mm512_xor_si512(z, _mm512_srli_epi64(z, 30)),
                           _mm512_set1_epi64((long long)0xbf58476d1ce4e5b9ULL));
    z = _mm512_mullo_epi64(_mm512_xor_si512(z, _mm512_srli_epi64(z, 27)),
                           _mm512_set1_epi64((long long)0x94d049bb133111ebULL));
    return _mm512_xor_si512(z, _mm512_srli_epi64(z, 31));
}

void fmha_f32_dropout_ukernel__avx512(size_t rows, size_t lanes, float *s, size_t lds,
                                      const uint64_t *counter, uint64_t seed_mix, uint64_t threshold,
                                      float scale) {
    if (lanes % 16) { /* not a driver shape: the specification serves it */
        fmha_f32_dropout_ukernel__scalar(rows, lanes, s, lds, counter, seed_mix, threshold, scale);
        return;
    }
    const __m512i mixv = _mm512_set1_epi64((long long)seed_mix);
    const __m512i thr = _mm512_set1_epi64((long long)threshold);
    const __m512 sc = _mm512_set1_ps(scale);
    for (size_t i = 0; i < lanes; i += 16) {
        const __m512i c0 = _mm512_loadu_si512(counter + i), c1 = _mm512_loadu_si512(counter + i + 8);
        for (size_t r = 0; r < rows; r++) {
            const __m512i rv = _mm512_set1_epi64((long long)r);
            __m512i z0 = mix64x8(_mm512_xor_si512(_mm512_add_epi64(c0, rv), mixv));
            __m512i z1 = mix64x8(_mm512_xor_si512(_mm512_add_epi64(c1, rv), mixv));
            __mmask8 k0 = _mm512_cmpge_epu64_mask(_mm512_srli_epi64(z0, 32), thr);
            __mmask8 k1 = _mm512_cmpge_epu64_mask(_mm512_srli_epi64(z1, 32), thr);
            __mmask16 keep = (__mmask16)((unsigned)k0 | ((unsigned)k1 << 8));
            float *row = s + r * lds + i;
            /* kept: x * scale; dropped: x * 0 (NaN stays NaN, as in the scalar loop) */
            __m512 x = _mm512_loadu_ps(row);
            __m512 factor = _mm512_maskz_mov_ps(keep, sc);
            _mm512_storeu_ps(row, _mm512_mul_ps(x, factor));
        }
    }
}
