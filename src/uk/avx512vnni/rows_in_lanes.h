/* avx512vnni/rows_in_lanes.h: what the integer scores with 16 rows in
 * the lanes share, on AVX-512 (decode_q8.c) and on AMX tiles
 * (amx/decode_q8.c): the keys' values laid out as bytes, 64 a key, their
 * block scales read key by key, and the accumulators [key][16 rows]
 * scaled and stored as s [rows][keys].
 * Static inline, compiled into each. */
#ifndef FMHA_UK_AVX512VNNI_ROWS_IN_LANES_H
#define FMHA_UK_AVX512VNNI_ROWS_IN_LANES_H

#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>

#include "../avx512/transpose.h"
#include "../ukernel.h"

/* a [16][64]: keys kr[i]'s values of blocks 2c and 2c + 1 (zeros past the
 * row's nb blocks): int8 and q8_0 bytes as stored, or plus 128 (flip:
 * their top bit flipped, for vpdpbusd's unsigned side); q4_0's nibbles
 * as stored (value + 8), low nibbles then high. */
static inline __attribute__((always_inline)) void fmha_q8_keys_pack(const int kind, const uint8_t *const kr[16],
                                                                   size_t c, size_t nb, int flip, uint8_t *a) {
    const __m256i top = _mm256_set1_epi8(flip ? (char)0x80 : 0);
    for (int i = 0; i < 16; i++)
        for (size_t h = 0; h < 2; h++) {
            uint8_t *to = a + 64 * i + 32 * h;
            const size_t b = 2 * c + h;
            if (b >= nb) {
                _mm256_storeu_si256((__m256i *)to, _mm256_setzero_si256());
                continue;
            }
            const uint8_t *from = kr[i] + b * fmha_int_block_bytes(kind) + fmha_int_block_values_at(kind);
            if (kind != FMHA_FORMAT_Q4_0) {
                _mm256_storeu_si256((__m256i *)to, _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)from), top));
                continue;
            }
            const __m128i x = _mm_loadu_si128((const __m128i *)from), nib = _mm_set1_epi8(15);
            _mm_storeu_si128((__m128i *)to, _mm_and_si128(x, nib));
            _mm_storeu_si128((__m128i *)(to + 16), _mm_and_si128(_mm_srli_epi16(x, 4), nib));
        }
}

/* The 16 keys' (kr) half scales of block b (q8_0, q4_0) as float32, key
 * by key (where no gather serves). */
static inline __attribute__((always_inline)) __m512 fmha_q8_key_halves(const int kind, const uint8_t *const kr[16],
                                                                      size_t b) {
    uint16_t hs[16];
    for (int i = 0; i < 16; i++) __builtin_memcpy(&hs[i], kr[i] + b * fmha_int_block_bytes(kind), 2);
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)hs));
}

/* s [n][lds] (n < nr, keys j < nj) = scale * acc[j][n]; acc is clobbered. */
static inline __attribute__((always_inline)) void fmha_q8_store_rows(__m512 acc[16], float scale, size_t nj,
                                                                    size_t nr, float *s, size_t lds) {
    const __m512 sv = _mm512_set1_ps(scale);
#pragma GCC unroll 16
    for (int m = 0; m < 16; m++) acc[m] = _mm512_mul_ps(acc[m], sv);
    fmha_avx512_transpose16(acc); /* acc[n]: row n's 16 keys */
    const __mmask16 keys = (__mmask16)((1u << nj) - 1u);
    for (size_t n = 0; n < nr; n++) _mm512_mask_storeu_ps(s + n * lds, keys, acc[n]);
}

#endif /* FMHA_UK_AVX512VNNI_ROWS_IN_LANES_H */
