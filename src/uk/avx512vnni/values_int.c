/* avx512vnni/values_int.c: P V in integers for int8, q8_0 and q4_0 values
 * (fmha_cache_values_int_ukernel_fn; contract and specification in
 * ../ukernel.h and ../scalar/decode.c) with AVX512-VNNI's vpdpwssd.
 *
 * Each row's P, times each block's scale, is quantized to 16 bits per
 * block of 32 columns (int8: one scale for the row), as pairs of keys in
 * a dword; V's bytes widen to 16 bits and two keys' rows interleave, so
 * that one vpdpwssd adds two keys' products for 16 columns (int8 and
 * q8_0 in the order the 16-bit unpacks leave them: 0-3, 8-11, 16-19,
 * 24-27 and 4-7, 12-15, 20-23, 28-31 of a block, put back in order once
 * at the end; q4_0's nibbles in order, by one byte shuffle a key, their
 * offset of 8 taken off the sums as 8 times the row's sum of P').
 * Blocks of 4 rows x 64 columns keep 16 int32 accumulators. */
#include <immintrin.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "../avx512/unpack.h"
#include "decode.h"
#include "values_int.h"

#define FMHA_INLINE static inline __attribute__((always_inline))

/* Columns [32 b, 32 b + 32) of row x as 16-bit integers (int8: the lanes
 * of cm, the others 0); q4_0 takes nibble_pairs instead. */
FMHA_INLINE __m512i widen_block(const int kind, const uint8_t *x, size_t b, __mmask32 cm) {
    if (kind == V_INT8) return _mm512_cvtepi8_epi16(_mm256_maskz_loadu_epi8(cm, x + 32 * b));
    const uint8_t *at = x + b * fmha_int_block_bytes(kind) + fmha_int_block_values_at(kind);
    return _mm512_cvtepi8_epi16(_mm256_loadu_si256((const __m256i *)at));
}

/* q4_0's block b of rows x0 and x1 as the nibbles themselves (value + 8):
 * lo's dword i holds column i of x0 (low word) and of x1 (high word), hi's
 * column 16 + i. Each row's 16 bytes go to every 128-bit lane, where one
 * byte shuffle puts byte 4 L + i of lane L at its word (x0: byte 4 i, x1:
 * byte 4 i + 2) and zeros the rest; the columns come out in order. */
FMHA_INLINE void nibble_pairs(const uint8_t *x0, const uint8_t *x1, size_t b, __m512i *lo, __m512i *hi) {
    const size_t at = b * fmha_int_block_bytes(FMHA_FORMAT_Q4_0) + fmha_int_block_values_at(FMHA_FORMAT_Q4_0);
    const __m512i b0 = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(x0 + at)));
    const __m512i b1 = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(x1 + at)));
    /* lane L, dword i: byte 4 L + i to the low byte, the others zero (0x80) */
    const __m512i at0 = _mm512_or_si512(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                        _mm512_set1_epi32((int)0x80808000u));
    const __m512i at1 = _mm512_rol_epi32(at0, 16); /* the same bytes to the high word */
    const __m512i s0 = _mm512_shuffle_epi8(b0, at0), s1 = _mm512_shuffle_epi8(b1, at1);
    /* (s0 | s1) & mask: 0xa8 */
    *lo = _mm512_ternarylogic_epi32(s0, s1, _mm512_set1_epi32(0x000f000f), 0xa8);
    *hi = _mm512_srli_epi16(_mm512_ternarylogic_epi32(s0, s1, _mm512_set1_epi32(0x00f000f0), 0xa8), 4);
}

/* Block b of rows x0 and x1 as pairs of 16-bit integers, a dword a column:
 * q4_0's nibbles in order (value + 8), the others widened and unpacked
 * (columns 0-3, 8-11, 16-19, 24-27 in lo, the rest in hi). */
FMHA_INLINE void pair_block(const int kind, const uint8_t *x0, const uint8_t *x1, size_t b, __mmask32 cm,
                            __m512i *lo, __m512i *hi) {
    if (kind == V_Q4_0) {
        nibble_pairs(x0, x1, b, lo, hi);
        return;
    }
    const __m512i a0 = widen_block(kind, x0, b, cm), a1 = widen_block(kind, x1, b, cm);
    *lo = _mm512_unpacklo_epi16(a0, a1), *hi = _mm512_unpackhi_epi16(a0, a1);
}

/* Rows [0, R) (R = 4 or 1; rows past nr repeat the last, not stored),
 * columns [c0, c0 + 64): blocks b0 = c0 / 32 and b0 + 1 (if any). q4_0's
 * sums start from -8 times the row's sum of P' (psum), which cancels the
 * nibbles' offset exactly. */
FMHA_INLINE void values_block(const int kind, const int R, size_t nr, size_t nk, size_t dv, size_t c0,
                              const void *const *v_rows, int32_t pw[4][MAX_BLOCKS][MAX_KEYS / 2],
                              const float s[4][MAX_BLOCKS], const int32_t psum[4][MAX_BLOCKS], float *o, size_t ldo,
                              const float *alpha) {
    const size_t b0 = c0 / 32, nb = dv - c0 > 32 ? 2 : 1; /* blocks in these columns */
    const size_t pb0 = kind == V_INT8 ? 0 : b0, pb1 = kind == V_INT8 ? 0 : b0 + 1; /* their P' */
    const __mmask32 cm0 = dv - c0 >= 32 ? (__mmask32)0xffffffffu : (__mmask32)((1u << (dv - c0)) - 1u);
    const __mmask32 cm1 = nb < 2 ? 0 : dv - c0 >= 64 ? (__mmask32)0xffffffffu : (__mmask32)((1u << (dv - c0 - 32)) - 1u);
    __m512i acc[4][4];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
        if (kind == V_Q4_0) {
            acc[r][0] = acc[r][1] = _mm512_set1_epi32(-8 * psum[r][pb0]);
            acc[r][2] = acc[r][3] = _mm512_set1_epi32(nb > 1 ? -8 * psum[r][pb1] : 0);
        } else
            acc[r][0] = acc[r][1] = acc[r][2] = acc[r][3] = _mm512_setzero_si512();
    }
    for (size_t j = 0; j < nk; j += 2) {
        const uint8_t *x0 = v_rows[j], *x1 = j + 1 < nk ? v_rows[j + 1] : x0; /* the pad's P' is 0 */
        __m512i lo0, hi0;
        pair_block(kind, x0, x1, b0, cm0, &lo0, &hi0);
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            const __m512i pr = _mm512_set1_epi32(pw[r][pb0][j / 2]);
            acc[r][0] = _mm512_dpwssd_epi32(acc[r][0], lo0, pr);
            acc[r][1] = _mm512_dpwssd_epi32(acc[r][1], hi0, pr);
        }
        if (nb > 1) {
            __m512i lo1, hi1;
            pair_block(kind, x0, x1, b0 + 1, cm1, &lo1, &hi1);
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) {
                const __m512i pr = _mm512_set1_epi32(pw[r][pb1][j / 2]);
                acc[r][2] = _mm512_dpwssd_epi32(acc[r][2], lo1, pr);
                acc[r][3] = _mm512_dpwssd_epi32(acc[r][3], hi1, pr);
            }
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
        if ((size_t)r >= nr) break;
        const __m512 a = _mm512_set1_ps(alpha[r]);
#pragma GCC unroll 2
        for (int bb = 0; bb < 2; bb++) { /* each block: its int32 sums, times its scale */
            if ((size_t)bb >= nb) break;
            const __m512 sv = _mm512_set1_ps(s[r][bb ? pb1 : pb0]);
            const __m512 lo = _mm512_mul_ps(_mm512_cvtepi32_ps(acc[r][2 * bb]), sv);
            const __m512 hi = _mm512_mul_ps(_mm512_cvtepi32_ps(acc[r][2 * bb + 1]), sv);
#pragma GCC unroll 2
            for (int h = 0; h < 2; h++) { /* 16 columns at a time, in order */
                const size_t c = c0 + 32 * (size_t)bb + 16 * (size_t)h;
                if (c >= dv) break;
                const __mmask16 cm = dv - c >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (dv - c)) - 1u);
                float *orow = o + r * ldo + c;
                const __m512 old = _mm512_maskz_loadu_ps(cm, orow);
                _mm512_mask_storeu_ps(orow, cm, _mm512_fmadd_ps(old, a, kind == V_Q4_0 ? (h ? hi : lo) : fmha_avx512_unpacked_in_order(lo, hi, h)));
            }
        }
    }
}

/* Rows in blocks of 4 (the last 1-3 one at a time), each block's P'
 * quantized once, then 64 columns at a time. */
FMHA_INLINE void values_int(const int kind, size_t rows, size_t nk, size_t dv, const float *p, size_t ldp,
                            const void *const *v_rows, float *o, size_t ldo, const float *alpha) {
    const size_t nb = value_p_blocks(kind, dv); /* blocks with a P' of their own */
    /* the keys' block scales, 16 keys a vector (int8: ones), and each block's largest */
    __m512 vd[MAX_BLOCKS][MAX_KEYS / 16];
    float dm[MAX_BLOCKS];
    value_block_scales(kind, nk, dv, v_rows, vd, dm);
    int32_t pw[4][MAX_BLOCKS][MAX_KEYS / 2], psum[4][MAX_BLOCKS];
    float s[4][MAX_BLOCKS];
    for (size_t r0 = 0; r0 < rows; r0 += 4) {
        const size_t nr = rows - r0 < 4 ? rows - r0 : 4;
        for (size_t r = 0; r < nr; r++) {
            const float pm = abs_max(nk, p + (r0 + r) * ldp);
            for (size_t b = 0; b < nb; b++) quantize_row(nk, p + (r0 + r) * ldp, vd[b], pm, dm[b], pw[r][b], &s[r][b],
                                                      kind == V_Q4_0 ? &psum[r][b] : NULL); /* q4_0's offset */
        }
        for (size_t c0 = 0; c0 < dv; c0 += 64) {
            if (nr == 4) values_block(kind, 4, 4, nk, dv, c0, v_rows, pw, s, psum, o + r0 * ldo, ldo, alpha + r0);
            else
                for (size_t r = 0; r < nr; r++) /* one row: its P' moved to the first slot */
                    values_block(kind, 1, 1, nk, dv, c0, v_rows, (int32_t(*)[MAX_BLOCKS][MAX_KEYS / 2])pw[r],
                                 (const float(*)[MAX_BLOCKS])s[r], (const int32_t(*)[MAX_BLOCKS])psum[r],
                                 o + (r0 + r) * ldo, ldo, alpha + r0 + r);
        }
    }
}

void fmha_int8kv_values_int__avx512vnni(size_t rows, size_t nk, size_t dv, const float *p, size_t ldp,
                                        const void *const *v_rows, float *o, size_t ldo, const float *alpha) {
    values_int(V_INT8, rows, nk, dv, p, ldp, v_rows, o, ldo, alpha);
}

void fmha_q8_0kv_values_int__avx512vnni(size_t rows, size_t nk, size_t dv, const float *p, size_t ldp,
                                        const void *const *v_rows, float *o, size_t ldo, const float *alpha) {
    values_int(V_Q8_0, rows, nk, dv, p, ldp, v_rows, o, ldo, alpha);
}

void fmha_q4_0kv_values_int__avx512vnni(size_t rows, size_t nk, size_t dv, const float *p, size_t ldp,
                                        const void *const *v_rows, float *o, size_t ldo, const float *alpha) {
    values_int(V_Q4_0, rows, nk, dv, p, ldp, v_rows, o, ldo, alpha);
}
