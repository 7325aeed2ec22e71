/* avx512/unpack.h: the column order that pairing two rows of 16-bit
 * values by vpunpcklwd / vpunpckhwd leaves in a product's outputs, and
 * putting it back. Of a block of 32 columns, the lo unpack's outputs are
 * columns 0-3, 8-11, 16-19, 24-27 and the hi unpack's 4-7, 12-15, 20-23,
 * 28-31 (each 128-bit lane interleaves its own 4 + 4 words). Shared by
 * the integer P V (avx512vnni/values_int.c) and decoding on the tiles
 * (amx/attn_dec.c). */
#ifndef FMHA_UK_AVX512_UNPACK_H
#define FMHA_UK_AVX512_UNPACK_H

#include <immintrin.h>

/* Columns 0-15 (half 0) or 16-31 (half 1) of a block, in order, from the
 * outputs of its lo and hi unpacks. */
static inline __attribute__((always_inline)) __m512 fmha_avx512_unpacked_in_order(__m512 lo, __m512 hi, int half) {
    const __m512i idx = half ? _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31)
                             : _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
    return _mm512_permutex2var_ps(lo, idx, hi);
}

#endif /* FMHA_UK_AVX512_UNPACK_H */
