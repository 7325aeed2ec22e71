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

#include "../avx512/transpose.h"
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

/* ---- 16 rows in the lanes (q4_0) ----
 * From 16 rows a call (steps of several positions under GQA) a V pair is
 * unpacked once for all 16 rows instead of once a block of 4: the lanes
 * hold the rows, a vector of P' pairs (lane r: row r's P' of the two
 * keys) meets each column's pair of values broadcast from memory, one
 * vpdpwssd for 16 rows, and a 16 x 16 transposition a half block puts
 * the rows back. P is quantized in the lanes too: each key's P of the 16
 * rows times the key's block scale, times each row's 32767 / m, the same
 * products and rounding as quantize_row, so the integers, and the bits,
 * are the 4-row blocks' (and the specification's). It pays where the
 * 4-row blocks repeat the most per key: q4_0's nibble unpack and its P'
 * per block. Zen 4, 16 rows, 64 keys, D 128, ns a key (L1), 4-row blocks
 * / these: q4_0 35.0 / 31.5, q8_0 29.7 / 30.6, int8 23.0 / 27.0 (the
 * unpacked pairs' stores and the transpositions cost more than the
 * repeated unpack saves); a step of 4 positions, 16384 keys: q4_0 0.94x
 * the time, q8_0 1.09x, int8 1.05x. */

/* pt[j] lane r = P[r][j] of the 16 rows at p (keys past nk 0); *pm lane r
 * the row's largest |P| (abs_max's: NaN when one is NaN). */
FMHA_INLINE void transpose_p16(size_t nk, const float *p, size_t ldp, __m512 pt[MAX_KEYS], __m512 *pm) {
    __m512 m = _mm512_setzero_ps();
    __mmask16 nan = 0;
    for (size_t c = 0; c * 16 < nk; c++) {
        const __mmask16 keys = nk - 16 * c >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (nk - 16 * c)) - 1u);
        __m512 *x = pt + 16 * c;
#pragma GCC unroll 16
        for (int r = 0; r < 16; r++) x[r] = _mm512_maskz_loadu_ps(keys, p + (size_t)r * ldp + 16 * c);
        fmha_avx512_transpose16(x); /* x[jj] lane r: P[r][16 c + jj] */
#pragma GCC unroll 16
        for (int jj = 0; jj < 16; jj++) {
            nan |= _mm512_cmp_ps_mask(x[jj], x[jj], _CMP_UNORD_Q);
            m = _mm512_max_ps(m, _mm512_abs_ps(x[jj]));
        }
    }
    *pm = _mm512_mask_blend_ps(nan, m, _mm512_set1_ps(NAN));
}

/* Block b's P' of the 16 rows in pairs of keys: pw[i] lane r = row r's
 * P' of keys 2i (low word) and 2i + 1 (high), the pad 0; *s lane r its
 * scale (quantize_row's s, NaN where not finite), *psum the sum of its P'
 * (q4_0's offset). vd: the keys' block scales (value_block_scales). */
FMHA_INLINE void quantize_p16(size_t nk, const __m512 pt[MAX_KEYS], __m512 pm, const __m512 vd[MAX_KEYS / 16],
                              float dm, __m512i pw[MAX_KEYS / 2], __m512 *s, __m512i *psum) {
    const __m512 mx = _mm512_mul_ps(pm, _mm512_set1_ps(dm));
    const __mmask16 finite = _mm512_cmp_ps_mask(mx, _mm512_set1_ps(3.40282347e38f), _CMP_LE_OQ);
    const __mmask16 big = finite & _mm512_cmp_ps_mask(mx, _mm512_set1_ps(0x1p-100f), _CMP_GE_OQ);
    const __m512 k = _mm512_set1_ps(32767.0f);
    *s = _mm512_mask_div_ps(_mm512_set1_ps(NAN), finite, mx, k);
    const __m512 inv = _mm512_maskz_div_ps(big, k, mx);
    const float *d = (const float *)vd; /* key j's block scale */
    __m512i total = _mm512_setzero_si512();
    for (size_t i = 0; 2 * i < nk; i++) {
        __m512i q[2];
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            const size_t j = 2 * i + (size_t)h;
            const __m512 w = _mm512_mul_ps(pt[j], _mm512_set1_ps(j < nk ? d[j] : 0.0f));
            q[h] = _mm512_maskz_cvtps_epi32(finite, _mm512_mul_ps(w, inv));
            total = _mm512_add_epi32(total, q[h]);
        }
        pw[i] = _mm512_mask_blend_epi16((__mmask32)0xaaaaaaaau, q[0], _mm512_slli_epi32(q[1], 16));
    }
    *psum = total;
}

/* Rows [0, 16) of o, columns [32 cb, 32 cb + 32) of q4_0 values: the
 * block's nibble pairs unpacked once (vb), then each half's 16 columns
 * against the P' pairs pw, with its scale s (lanes: rows), each sum
 * starting from -8 times the row's psum (the nibbles' offset). */
FMHA_INLINE void block_rows16_q4_0(size_t nk, size_t cb, const void *const *v_rows, const __m512i pw[MAX_KEYS / 2],
                                   __m512 s, __m512i psum, float *o, size_t ldo, const float *alpha) {
    const size_t c0 = 32 * cb, pairs = (nk + 1) / 2;
    /* vb [pairs][32]: the pair's columns 0-15 (nibble_pairs' lo), then 16-31 */
    _Alignas(64) int32_t vb[MAX_KEYS / 2][32];
    for (size_t i = 0; i < pairs; i++) {
        const uint8_t *x0 = v_rows[2 * i], *x1 = 2 * i + 1 < nk ? v_rows[2 * i + 1] : x0; /* the pad's P' is 0 */
        __m512i lo, hi;
        nibble_pairs(x0, x1, cb, &lo, &hi);
        _mm512_store_si512(vb[i], lo);
        _mm512_store_si512(vb[i] + 16, hi);
    }
    const __m512i start = _mm512_mullo_epi32(psum, _mm512_set1_epi32(-8));
    _Alignas(64) float out[16][32]; /* [row][column] */
#pragma GCC unroll 1
    for (int h = 0; h < 2; h++) {
        __m512i acc[16];
#pragma GCC unroll 16
        for (int c = 0; c < 16; c++) acc[c] = start;
        for (size_t i = 0; i < pairs; i++) {
            const __m512i pv = pw[i];
#pragma GCC unroll 16
            for (int c = 0; c < 16; c++) acc[c] = _mm512_dpwssd_epi32(acc[c], pv, _mm512_set1_epi32(vb[i][16 * h + c]));
        }
        __m512 f[16];
#pragma GCC unroll 16
        for (int c = 0; c < 16; c++) f[c] = _mm512_mul_ps(_mm512_cvtepi32_ps(acc[c]), s);
        fmha_avx512_transpose16(f); /* f[r]: row r's 16 sums */
#pragma GCC unroll 16
        for (int r = 0; r < 16; r++) _mm512_store_ps(out[r] + 16 * h, f[r]);
    }
    for (size_t r = 0; r < 16; r++) {
        const __m512 a = _mm512_set1_ps(alpha[r]);
        float *orow = o + r * ldo + c0;
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++)
            _mm512_storeu_ps(orow + 16 * h, _mm512_fmadd_ps(_mm512_loadu_ps(orow + 16 * h), a, _mm512_load_ps(out[r] + 16 * h)));
    }
}

/* Rows [0, 16) of q4_0 values (dv a multiple of 32): P in the lanes,
 * then each block of 32 columns with its own P'. */
FMHA_INLINE void values_rows16_q4_0(size_t nk, size_t dv, const float *p, size_t ldp, const void *const *v_rows,
                                    const __m512 vd[MAX_BLOCKS][MAX_KEYS / 16], const float dm[MAX_BLOCKS], float *o,
                                    size_t ldo, const float *alpha) {
    __m512 pt[MAX_KEYS], pm, s;
    __m512i pw[MAX_KEYS / 2], psum;
    transpose_p16(nk, p, ldp, pt, &pm);
    for (size_t cb = 0; cb < dv / 32; cb++) {
        quantize_p16(nk, pt, pm, vd[cb], dm[cb], pw, &s, &psum);
        block_rows16_q4_0(nk, cb, v_rows, pw, s, psum, o, ldo, alpha);
    }
}

/* q4_0: whole groups of 16 rows in the lanes (values_rows16_q4_0); then the
 * rows in blocks of 4 (the last 1-3 one at a time), each block's P'
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
    size_t r0 = 0;
    for (; kind == V_Q4_0 && r0 + 16 <= rows; r0 += 16)
        values_rows16_q4_0(nk, dv, p + r0 * ldp, ldp, v_rows, vd, dm, o + r0 * ldo, ldo, alpha + r0);
    for (; r0 < rows; r0 += 4) {
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
