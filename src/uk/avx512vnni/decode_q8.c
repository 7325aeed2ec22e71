/* avx512vnni/decode_q8.c: integer scores of int8, q8_0 and q4_0 keys on
 * the query quantized as q8_0 (fmha_cache_scores_q8_ukernel_fn, contract
 * and specification in ../ukernel.h and ../scalar/decode.c), with
 * AVX512-VNNI's vpdpbusd.
 *
 * Keys in the lanes: 16 keys a block of 32 values, each key's 32 bytes
 * transposed into 8 vectors of one dword (4 values) of the 16 keys, so
 * that an int32 lane sums one key's block exactly and each vector feeds
 * every row of the group (the query's dword broadcast from memory). The
 * block's int32 sums then take the float32 steps of the specification
 * lane by lane: no horizontal reduction, and the specification's bits.
 * vpdpbusd multiplies unsigned by signed bytes: the keys are the unsigned
 * side (int8 and q8_0 values plus 128, by flipping the top bit; q4_0's
 * nibbles as stored, value + 8) and each row's sum starts from -128 (or
 * -8) times its block's sum of q, which cancels the offset exactly. From
 * 16 rows a call, whole groups of 16 rows run with the rows in the lanes
 * on the query's tiles (rows_in_lanes, below; the table asks the driver
 * for them: q8_tiles). */
#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>

#include "decode.h"
#include "rows_in_lanes.h"

#define FMHA_INLINE static inline __attribute__((always_inline))

enum { Q8_INT8 = FMHA_FORMAT_INT8, Q8_Q8_0 = FMHA_FORMAT_Q8_0, Q8_Q4_0 = FMHA_FORMAT_Q4_0 };

/* The 16 keys' values of block b as unsigned bytes, t[c] holding dword c
 * (values 4c..4c+3) of key i in lane i. kr: the keys' rows. */
FMHA_INLINE void block_dwords(const int kind, const uint8_t *const kr[16], size_t b, __m512i t[8]) {
    const size_t at = b * fmha_int_block_bytes(kind) + fmha_int_block_values_at(kind);
    if (kind == Q8_Q4_0) {
        /* w[g] lane l: key 4l + g's 16 bytes (values j and 16 + j in byte j) */
        __m512i w[4];
#pragma GCC unroll 4
        for (int g = 0; g < 4; g++) {
            __m512i x = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(kr[g] + at)));
            x = _mm512_inserti32x4(x, _mm_loadu_si128((const __m128i *)(kr[4 + g] + at)), 1);
            x = _mm512_inserti32x4(x, _mm_loadu_si128((const __m128i *)(kr[8 + g] + at)), 2);
            w[g] = _mm512_inserti32x4(x, _mm_loadu_si128((const __m128i *)(kr[12 + g] + at)), 3);
        }
        /* 4 x 4 dwords in each 128-bit lane: d[c] lane l = dword c of keys 4l..4l+3 */
        const __m512i a0 = _mm512_unpacklo_epi32(w[0], w[1]), a1 = _mm512_unpackhi_epi32(w[0], w[1]);
        const __m512i a2 = _mm512_unpacklo_epi32(w[2], w[3]), a3 = _mm512_unpackhi_epi32(w[2], w[3]);
        const __m512i d[4] = {_mm512_unpacklo_epi64(a0, a2), _mm512_unpackhi_epi64(a0, a2),
                              _mm512_unpacklo_epi64(a1, a3), _mm512_unpackhi_epi64(a1, a3)};
        const __m512i nib = _mm512_set1_epi8(15);
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++) {
            t[c] = _mm512_and_si512(d[c], nib);                             /* values 4c..4c+3 */
            t[4 + c] = _mm512_and_si512(_mm512_srli_epi16(d[c], 4), nib); /* values 16 + 4c.. */
        }
        return;
    }
    /* v[i], i < 4: keys i (low half) and 4 + i (high half); v[4 + i]: keys
     * 8 + i and 12 + i; each value + 128 as an unsigned byte */
    const __m512i flip = _mm512_set1_epi8((char)0x80);
    __m512i v[8];
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++) {
        const int lo = i < 4 ? i : 4 + i, hi = lo + 4;
        __m512i x = _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(kr[lo] + at)));
        x = _mm512_inserti64x4(x, _mm256_loadu_si256((const __m256i *)(kr[hi] + at)), 1);
        v[i] = _mm512_xor_si512(x, flip);
    }
    /* in each 128-bit lane a 4 x 4 dword transpose of vectors 0-3 and 4-7:
     * p[c] (q[c]) lane l holds dword 4 (l % 2) + c of the four keys there */
    __m512i p[4], q[4];
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
        const __m512i *x = v + 4 * h;
        const __m512i a0 = _mm512_unpacklo_epi32(x[0], x[1]), a1 = _mm512_unpackhi_epi32(x[0], x[1]);
        const __m512i a2 = _mm512_unpacklo_epi32(x[2], x[3]), a3 = _mm512_unpackhi_epi32(x[2], x[3]);
        __m512i *y = h ? q : p;
        y[0] = _mm512_unpacklo_epi64(a0, a2), y[1] = _mm512_unpackhi_epi64(a0, a2);
        y[2] = _mm512_unpacklo_epi64(a1, a3), y[3] = _mm512_unpackhi_epi64(a1, a3);
    }
    /* dword c < 4 from lanes 0 and 2, dword 4 + c from lanes 1 and 3:
     * keys 0-3, 4-7 (p), 8-11, 12-15 (q) */
#pragma GCC unroll 4
    for (int c = 0; c < 4; c++) {
        t[c] = _mm512_shuffle_i32x4(p[c], q[c], _MM_SHUFFLE(2, 0, 2, 0));
        t[4 + c] = _mm512_shuffle_i32x4(p[c], q[c], _MM_SHUFFLE(3, 1, 3, 1));
    }
}

/* The 16 keys' half scales of block b as float32 (q8_0, q4_0): one gather
 * of the dword at each block's start (its half and two value bytes) when
 * the offsets fit in 32 bits, else key by key. */
FMHA_INLINE __m512 block_scales(const int kind, const uint8_t *const kr[16], __m512i offsets, int gather, size_t b) {
    if (!gather) return fmha_q8_key_halves(kind, kr, b);
    const size_t at = b * fmha_int_block_bytes(kind);
    return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_i32gather_epi32(offsets, kr[0] + at, 1)));
}

/* Rows [0, G) of q (G = 8, 4, 2 or 1) against 16 keys (kr; keys past nj
 * repeat the last, their lanes not stored): per block, the int32 sums of
 * every row from the block's 8 key vectors, then acc = fma(sum, qd kd, acc). */
FMHA_INLINE void rows_block(const int kind, const int G, size_t nj, size_t d, const fmha_q8_rows *q,
                            const uint8_t *const kr[16], __m512i offsets, int gather, float *s, size_t lds,
                            float scale) {
    const int32_t offset = kind == Q8_Q4_0 ? 8 : 128; /* the keys' bytes are their integers + offset */
    const size_t ldd = q->ld / 32;
    __m512 acc[8];
#pragma GCC unroll 8
    for (int r = 0; r < G; r++) acc[r] = _mm512_setzero_ps();
    for (size_t b = 0; b < d / 32; b++) {
        __m512i t[8];
        block_dwords(kind, kr, b, t);
        __m512i sum[8];
#pragma GCC unroll 8
        for (int r = 0; r < G; r++) sum[r] = _mm512_set1_epi32(-offset * q->sum[r * ldd + b]);
#pragma GCC unroll 8
        for (int c = 0; c < 8; c++) {
#pragma GCC unroll 8
            for (int r = 0; r < G; r++) {
                int32_t qd4;
                __builtin_memcpy(&qd4, q->q + r * q->ld + 32 * b + 4 * c, 4);
                sum[r] = _mm512_dpbusd_epi32(sum[r], t[c], _mm512_set1_epi32(qd4));
            }
        }
        if (kind == Q8_INT8) {
#pragma GCC unroll 8
            for (int r = 0; r < G; r++)
                acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum[r]), _mm512_set1_ps(q->d[r * ldd + b]), acc[r]);
        } else {
            const __m512 kd = block_scales(kind, kr, offsets, gather, b);
#pragma GCC unroll 8
            for (int r = 0; r < G; r++)
                acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum[r]), _mm512_mul_ps(_mm512_set1_ps(q->d[r * ldd + b]), kd),
                                         acc[r]);
        }
    }
    const __mmask16 keys = (__mmask16)((1u << nj) - 1u);
    const __m512 sv = _mm512_set1_ps(scale);
#pragma GCC unroll 8
    for (int r = 0; r < G; r++) _mm512_mask_storeu_ps(s + r * lds, keys, _mm512_mul_ps(acc[r], sv));
}

/* ---- 16 rows in the lanes, on the query's tiles ----
 * From 16 rows a call the keys-in-lanes transposition of each key block
 * is done once per 8 rows; with the rows in the lanes there is none: a
 * vector of the query's tiles (fmha_q8_rows.tiles: a quad of values of 16
 * rows) meets one key's quad broadcast from memory, one vpdpbusd for 16
 * rows, and the block's float32 step runs a key at a time, one 16 x 16
 * transpose giving s [rows][keys] at the end (as amx/decode_q8.c). */

/* 16 keys (kr; nj stored) x 16 rows of the tile group `tiles` (nr stored). */
FMHA_INLINE void rows_in_lanes(const int kind, size_t nj, size_t nr, size_t d, const uint8_t *tiles,
                               const uint8_t *const kr[16], float *s, size_t lds, float scale) {
    const size_t chunks = (d + 63) / 64, nb = d / 32;
    const float *qd = (const float *)(tiles + chunks * 2048);
    const int32_t *qsum = (const int32_t *)(qd + nb * 16);
    const int32_t offset = kind == Q8_Q4_0 ? 8 : 128; /* the keys' bytes are their integers + offset */
    _Alignas(64) uint8_t a[16 * 64];
    _Alignas(64) float kd[16];
    __m512 acc[16]; /* acc[m]: key m's 16 rows */
#pragma GCC unroll 16
    for (int m = 0; m < 16; m++) acc[m] = _mm512_setzero_ps();
    for (size_t c = 0; c < chunks; c++) {
        fmha_q8_keys_pack(kind, kr, c, nb, kind != Q8_Q4_0, a); /* unsigned: + 128 or + 8 */
        for (size_t h = 0; h < 2 && 2 * c + h < nb; h++) {
            const size_t b = 2 * c + h;
            /* tile row 8 h + t: quad t of block b, row n in dword n */
            const uint8_t *qb = tiles + c * 2048 + h * 1024 + 8 * h * 64;
            __m512i qv[8];
#pragma GCC unroll 8
            for (int t = 0; t < 8; t++) qv[t] = _mm512_loadu_si512(qb + 64 * t);
            const __m512i off = _mm512_mullo_epi32(_mm512_loadu_si512(qsum + 16 * b), _mm512_set1_epi32(-offset));
            const __m512 qdv = _mm512_loadu_ps(qd + 16 * b);
            if (kind != Q8_INT8) _mm512_store_ps(kd, fmha_q8_key_halves(kind, kr, b));
#pragma GCC unroll 4
            for (int m = 0; m < 16; m += 4) { /* four keys' chains at a time */
                __m512i sum[4] = {off, off, off, off};
#pragma GCC unroll 8
                for (int t = 0; t < 8; t++)
#pragma GCC unroll 4
                    for (int i = 0; i < 4; i++) {
                        int32_t k4;
                        __builtin_memcpy(&k4, a + 64 * (m + i) + 32 * h + 4 * t, 4);
                        sum[i] = _mm512_dpbusd_epi32(sum[i], _mm512_set1_epi32(k4), qv[t]);
                    }
#pragma GCC unroll 4
                for (int i = 0; i < 4; i++) {
                    const __m512 w = kind == Q8_INT8 ? qdv : _mm512_mul_ps(qdv, _mm512_set1_ps(kd[m + i]));
                    acc[m + i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum[i]), w, acc[m + i]);
                }
            }
        }
    }
    fmha_q8_store_rows(acc, scale, nj, nr, s, lds);
}

/* Keys in groups of 16, rows in groups of 8, then 4, 2, 1. */
FMHA_INLINE void scores_q8(const int kind, size_t rows, size_t nk, size_t d, const fmha_q8_rows *q, const void *k,
                           size_t ldk, float *s, size_t lds, float scale) {
    const uint8_t *k8 = k;
    const int gather = ldk <= (size_t)INT32_MAX / 16;
    for (size_t j0 = 0; j0 < nk; j0 += 16) {
        const size_t nj = nk - j0 < 16 ? nk - j0 : 16;
        const uint8_t *kr[16];
        int32_t off[16];
        for (size_t i = 0; i < 16; i++) {
            const size_t j = i < nj ? i : nj - 1;
            kr[i] = k8 + (j0 + j) * ldk;
            off[i] = gather ? (int32_t)(j * ldk) : 0;
        }
        const __m512i offsets = _mm512_loadu_si512(off);
        size_t r = 0;
        if (q->tiles) /* whole groups of 16 rows in the lanes, the rest below */
            for (; r + 16 <= rows; r += 16)
                rows_in_lanes(kind, nj, 16, d, (const uint8_t *)q->tiles + r / 16 * fmha_q8_tiles_group_bytes(d), kr,
                              s + r * lds + j0, lds, scale);
        for (; r + 8 <= rows; r += 8) {
            const fmha_q8_rows qr = {q->q + r * q->ld, q->d + r * (q->ld / 32), q->sum + r * (q->ld / 32), q->ld, NULL};
            rows_block(kind, 8, nj, d, &qr, kr, offsets, gather, s + r * lds + j0, lds, scale);
        }
        for (int g = 4; g >= 1; g /= 2)
            if (rows - r >= (size_t)g) {
                const fmha_q8_rows qr = {q->q + r * q->ld, q->d + r * (q->ld / 32), q->sum + r * (q->ld / 32), q->ld, NULL};
                if (g == 4) rows_block(kind, 4, nj, d, &qr, kr, offsets, gather, s + r * lds + j0, lds, scale);
                else if (g == 2) rows_block(kind, 2, nj, d, &qr, kr, offsets, gather, s + r * lds + j0, lds, scale);
                else rows_block(kind, 1, nj, d, &qr, kr, offsets, gather, s + r * lds + j0, lds, scale);
                r += (size_t)g;
            }
    }
}

void fmha_int8kv_scores_q8__avx512vnni(size_t rows, size_t nk, size_t d, const fmha_q8_rows *q, const void *k,
                                       size_t ldk, float *s, size_t lds, float scale) {
    scores_q8(Q8_INT8, rows, nk, d, q, k, ldk, s, lds, scale);
}

void fmha_q8_0kv_scores_q8__avx512vnni(size_t rows, size_t nk, size_t d, const fmha_q8_rows *q, const void *k,
                                       size_t ldk, float *s, size_t lds, float scale) {
    scores_q8(Q8_Q8_0, rows, nk, d, q, k, ldk, s, lds, scale);
}

void fmha_q4_0kv_scores_q8__avx512vnni(size_t rows, size_t nk, size_t d, const fmha_q8_rows *q, const void *k,
                                       size_t ldk, float *s, size_t lds, float scale) {
    scores_q8(Q8_Q4_0, rows, nk, d, q, k, ldk, s, lds, scale);
}
