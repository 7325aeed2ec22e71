/* avx512bf16/decode_bf16.c: decoding in bf16 pairs with vdpbf16ps: the
 * scores of float8 keys (OCP e4m3fn, e5m2) on the query rounded to bf16
 * and of bf16 keys on a bf16 query (fmha_cache_scores_bf16_ukernel_fn),
 * P V on P rounded to bf16 for bf16 and float8 values (fmha_cache_values_
 * bf16_ukernel_fn), and float8 values and loads widened through the
 * float8 table to float32; contracts and specifications in ../ukernel.h
 * and ../scalar/decode.c.
 *
 * Every float8 value is a bf16 value (3 or 2 mantissa bits, exponents
 * inside bf16's), so 64 bytes of a row become 64 bf16 exactly, in order:
 * each byte's magnitude (7 bits) indexes the high and the low bytes of a
 * 128-entry table of bf16 bits (NaN and inf codes included) with two
 * vpermi2b (AVX512-VBMI), its sign bit is or-ed in, and two byte unpacks
 * make the words (fp8x64_to_bf16). A block of 4 rows x 4 keys (or 1 row x
 * 16 keys) keeps 16 accumulators over the head dim, one vdpbf16ps per 32
 * values a (row, key), and ends with avx512/decode.c's transposing sum. */
#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>

#include "../avx512/reduce.h"
#include "../avx512/transpose.h"
#include "../avx512/unpack.h"
#include "bf16.h"

#define FMHA_INLINE static inline __attribute__((always_inline))

/* bf16 bits of every float8 magnitude m < 128: fmha_fp8_e4m3_to_f32(m)
 * and fmha_fp8_e5m2_to_f32(m) (format.c), NaN as 0x7fc0 */
static const uint16_t e4m3_bf16[128] __attribute__((aligned(64))) = {
    0x0000, 0x3b00, 0x3b80, 0x3bc0, 0x3c00, 0x3c20, 0x3c40, 0x3c60, 0x3c80, 0x3c90, 0x3ca0, 0x3cb0, 0x3cc0, 0x3cd0,
    0x3ce0, 0x3cf0, 0x3d00, 0x3d10, 0x3d20, 0x3d30, 0x3d40, 0x3d50, 0x3d60, 0x3d70, 0x3d80, 0x3d90, 0x3da0, 0x3db0,
    0x3dc0, 0x3dd0, 0x3de0, 0x3df0, 0x3e00, 0x3e10, 0x3e20, 0x3e30, 0x3e40, 0x3e50, 0x3e60, 0x3e70, 0x3e80, 0x3e90,
    0x3ea0, 0x3eb0, 0x3ec0, 0x3ed0, 0x3ee0, 0x3ef0, 0x3f00, 0x3f10, 0x3f20, 0x3f30, 0x3f40, 0x3f50, 0x3f60, 0x3f70,
    0x3f80, 0x3f90, 0x3fa0, 0x3fb0, 0x3fc0, 0x3fd0, 0x3fe0, 0x3ff0, 0x4000, 0x4010, 0x4020, 0x4030, 0x4040, 0x4050,
    0x4060, 0x4070, 0x4080, 0x4090, 0x40a0, 0x40b0, 0x40c0, 0x40d0, 0x40e0, 0x40f0, 0x4100, 0x4110, 0x4120, 0x4130,
    0x4140, 0x4150, 0x4160, 0x4170, 0x4180, 0x4190, 0x41a0, 0x41b0, 0x41c0, 0x41d0, 0x41e0, 0x41f0, 0x4200, 0x4210,
    0x4220, 0x4230, 0x4240, 0x4250, 0x4260, 0x4270, 0x4280, 0x4290, 0x42a0, 0x42b0, 0x42c0, 0x42d0, 0x42e0, 0x42f0,
    0x4300, 0x4310, 0x4320, 0x4330, 0x4340, 0x4350, 0x4360, 0x4370, 0x4380, 0x4390, 0x43a0, 0x43b0, 0x43c0, 0x43d0,
    0x43e0, 0x7fc0};
static const uint16_t e5m2_bf16[128] __attribute__((aligned(64))) = {
    0x0000, 0x3780, 0x3800, 0x3840, 0x3880, 0x38a0, 0x38c0, 0x38e0, 0x3900, 0x3920, 0x3940, 0x3960, 0x3980, 0x39a0,
    0x39c0, 0x39e0, 0x3a00, 0x3a20, 0x3a40, 0x3a60, 0x3a80, 0x3aa0, 0x3ac0, 0x3ae0, 0x3b00, 0x3b20, 0x3b40, 0x3b60,
    0x3b80, 0x3ba0, 0x3bc0, 0x3be0, 0x3c00, 0x3c20, 0x3c40, 0x3c60, 0x3c80, 0x3ca0, 0x3cc0, 0x3ce0, 0x3d00, 0x3d20,
    0x3d40, 0x3d60, 0x3d80, 0x3da0, 0x3dc0, 0x3de0, 0x3e00, 0x3e20, 0x3e40, 0x3e60, 0x3e80, 0x3ea0, 0x3ec0, 0x3ee0,
    0x3f00, 0x3f20, 0x3f40, 0x3f60, 0x3f80, 0x3fa0, 0x3fc0, 0x3fe0, 0x4000, 0x4020, 0x4040, 0x4060, 0x4080, 0x40a0,
    0x40c0, 0x40e0, 0x4100, 0x4120, 0x4140, 0x4160, 0x4180, 0x41a0, 0x41c0, 0x41e0, 0x4200, 0x4220, 0x4240, 0x4260,
    0x4280, 0x42a0, 0x42c0, 0x42e0, 0x4300, 0x4320, 0x4340, 0x4360, 0x4380, 0x43a0, 0x43c0, 0x43e0, 0x4400, 0x4420,
    0x4440, 0x4460, 0x4480, 0x44a0, 0x44c0, 0x44e0, 0x4500, 0x4520, 0x4540, 0x4560, 0x4580, 0x45a0, 0x45c0, 0x45e0,
    0x4600, 0x4620, 0x4640, 0x4660, 0x4680, 0x46a0, 0x46c0, 0x46e0, 0x4700, 0x4720, 0x4740, 0x4760, 0x7f80, 0x7fc0,
    0x7fc0, 0x7fc0};

/* A format's table in 4 vectors of 32 entries. */
typedef struct fp8_table {
    __m512i t[4];
} fp8_table;

FMHA_INLINE fp8_table table_of(const uint16_t *bits) {
    fp8_table tb;
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) tb.t[i] = _mm512_load_si512((const void *)(bits + 32 * i));
    return tb;
}

/* The same table as bytes for vpermi2b (AVX512-VBMI): hi[m] and lo[m],
 * the high and low bytes of magnitude m's bf16 bits, 64 entries a vector,
 * and the byte order that makes vpunpck{l,h}bw's words come out in order
 * (element 8 l + i of 32 words at byte 16 l + i, element 32 + 8 l + i at
 * byte 16 l + 8 + i, l the 128-bit lane). */
typedef struct fp8_bytes {
    __m512i hi0, hi1, lo0, lo1, order;
} fp8_bytes;

/* byte 16 l + 8 h + i takes element 32 h + 8 l + i */
static const uint8_t unpack_order[64] __attribute__((aligned(64))) = {
    0,  1,  2,  3,  4,  5,  6,  7,  32, 33, 34, 35, 36, 37, 38, 39, 8,  9,  10, 11, 12, 13,
    14, 15, 40, 41, 42, 43, 44, 45, 46, 47, 16, 17, 18, 19, 20, 21, 22, 23, 48, 49, 50, 51,
    52, 53, 54, 55, 24, 25, 26, 27, 28, 29, 30, 31, 56, 57, 58, 59, 60, 61, 62, 63};

FMHA_INLINE __m512i bytes_of(const __m512i w0, const __m512i w1, const int shift) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm512_cvtepi16_epi8(_mm512_srli_epi16(w0, shift))),
                              _mm512_cvtepi16_epi8(_mm512_srli_epi16(w1, shift)), 1);
}

FMHA_INLINE fp8_bytes bytes_table_of(const uint16_t *bits) {
    const fp8_table tb = table_of(bits);
    fp8_bytes b;
    b.hi0 = bytes_of(tb.t[0], tb.t[1], 8);
    b.hi1 = bytes_of(tb.t[2], tb.t[3], 8);
    b.lo0 = bytes_of(tb.t[0], tb.t[1], 0);
    b.lo1 = bytes_of(tb.t[2], tb.t[3], 0);
    b.order = _mm512_load_si512((const void *)unpack_order);
    return b;
}

/* 64 float8 bytes as 64 bf16 in order: *lo elements 0-31, *hi 32-63.
 * One vpermb puts the bytes in unpack order, two vpermi2b look up the
 * bf16's high and low bytes by the magnitude (index bits 6:0; bit 7, the
 * sign, is ignored), the sign is or-ed into the high byte, and two unpacks
 * make the words: 3 permutes where the word table takes 6 (per 32 words
 * two vpermt2w and the zero extension) and a blend. */
FMHA_INLINE void fp8x64_to_bf16(const fp8_bytes *tb, __m512i bytes, __m512i *lo, __m512i *hi) {
    const __m512i b = _mm512_permutexvar_epi8(tb->order, bytes);
    const __m512i sign = _mm512_and_si512(b, _mm512_set1_epi8((char)0x80));
    const __m512i h = _mm512_or_si512(_mm512_permutex2var_epi8(tb->hi0, b, tb->hi1), sign);
    const __m512i l = _mm512_permutex2var_epi8(tb->lo0, b, tb->lo1);
    *lo = _mm512_unpacklo_epi8(l, h);
    *hi = _mm512_unpackhi_epi8(l, h);
}

/* Values [e, e + 64) of a float8 row with d values (d a multiple of 32):
 * the 64 bytes, or the last 32 with the upper half 0 (e + 64 > d). */
FMHA_INLINE __m512i load_fp8x64(const uint8_t *row, size_t e, size_t d) {
    if (e + 64 <= d) return _mm512_loadu_si512((const void *)(row + e));
    return _mm512_zextsi256_si512(_mm256_loadu_si256((const __m256i *)(row + e)));
}

/* Key rows: float8 bytes through a table, or bf16 as stored. */
enum { KEY_FP8, KEY_BF16 };

/* acc[r * J + jj] += q_r . k_jj over one step of 32 values. */
FMHA_INLINE void step(const int R, const int J, const __m512bh qv[4], const __m512bh kv[16], __m512 acc[16]) {
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 16
        for (int jj = 0; jj < J; jj++) acc[r * J + jj] = _mm512_dpbf16_ps(acc[r * J + jj], qv[r], kv[jj]);
}

/* acc[r * J + jj] (J = 16 / R) += row r's bf16 pairs (qr[r]) . key jj's
 * row (kr[jj]) over the head dim: bf16 keys in steps of 32 values; float8
 * keys in steps of 64 (fp8x64_to_bf16), each accumulator taking the
 * step's first 32 and then its second 32, the specification's order; a
 * last 32 alone. */
FMHA_INLINE void accumulate(const int kind, const int R, const fp8_bytes *tb, size_t d, const uint32_t *const qr[4],
                            const uint8_t *const kr[16], __m512 acc[16]) {
    const int J = 16 / R;
#pragma GCC unroll 16
    for (int x = 0; x < 16; x++) acc[x] = _mm512_setzero_ps();
    if (kind == KEY_BF16) {
        for (size_t e = 0; e < d; e += 32) {
            __m512bh qv[4], kv[16];
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) qv[r] = (__m512bh)_mm512_loadu_si512(qr[r] + e / 2);
#pragma GCC unroll 16
            for (int jj = 0; jj < J; jj++) kv[jj] = (__m512bh)_mm512_loadu_si512((const void *)(kr[jj] + 2 * e));
            step(R, J, qv, kv, acc);
        }
        return;
    }
    for (size_t e = 0; e < d; e += 64) {
        const int two = e + 64 <= d; /* else the last 32 */
        __m512bh qlo[4], qhi[4];
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            qlo[r] = (__m512bh)_mm512_loadu_si512(qr[r] + e / 2);
            qhi[r] = two ? (__m512bh)_mm512_loadu_si512(qr[r] + e / 2 + 16) : qlo[r];
        }
#pragma GCC unroll 16
        for (int jj = 0; jj < J; jj++) {
            __m512i lo, hi;
            fp8x64_to_bf16(tb, load_fp8x64(kr[jj], e, d), &lo, &hi);
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) {
                acc[r * J + jj] = _mm512_dpbf16_ps(acc[r * J + jj], qlo[r], (__m512bh)lo);
                if (two) acc[r * J + jj] = _mm512_dpbf16_ps(acc[r * J + jj], qhi[r], (__m512bh)hi);
            }
        }
    }
}

/* R rows x 16 / R keys (R = 4 or 1; rows past nr and keys past nj repeat
 * the last, not stored); row r's keys in lanes [r * J, (r + 1) * J) after
 * the reduction. */
FMHA_INLINE void scores_block(const int kind, const int R, const fp8_bytes *tb, size_t nr, size_t nj, size_t d,
                              const uint32_t *q, size_t ldq, const uint8_t *k, size_t ldk, float *s, size_t lds,
                              float scale) {
    const int J = 16 / R;
    const size_t unit = kind == KEY_BF16 ? 2 : 1; /* bytes a storage unit */
    const uint32_t *qr[4];
    const uint8_t *kr[16];
    for (int r = 0; r < R; r++) qr[r] = q + ((size_t)r < nr ? (size_t)r : nr - 1) * ldq;
    for (int jj = 0; jj < J; jj++) kr[jj] = k + ((size_t)jj < nj ? (size_t)jj : nj - 1) * ldk * unit;
    __m512 acc[16];
    accumulate(kind, R, tb, d, qr, kr, acc);
    const __m512 sum = _mm512_mul_ps(fmha_avx512_reduce16(acc), _mm512_set1_ps(scale));
    const __mmask16 keys = (__mmask16)((1u << nj) - 1u);
    if (R == 1) {
        _mm512_mask_storeu_ps(s, keys, sum);
        return;
    }
    _mm_mask_storeu_ps(s, (__mmask8)keys, _mm512_castps512_ps128(sum));
    if (nr > 1) _mm_mask_storeu_ps(s + lds, (__mmask8)keys, _mm512_extractf32x4_ps(sum, 1));
    if (nr > 2) _mm_mask_storeu_ps(s + 2 * lds, (__mmask8)keys, _mm512_extractf32x4_ps(sum, 2));
    if (nr > 3) _mm_mask_storeu_ps(s + 3 * lds, (__mmask8)keys, _mm512_extractf32x4_ps(sum, 3));
}

/* A whole block (nr = R, nj = 16 / R): scores_block's sums, bit for bit,
 * without the repeats and the masked stores, called in a loop of its own
 * (scores_bf16) so that its pointers stay in registers: Zen 4, 4 rows,
 * D 128, L1, bf16 keys 9.0 -> 5.9 ns a key (their 16 vdpbf16ps: 4.4). A
 * flag on scores_block in the same place gave 7.8-8.6 (the avx512 float32
 * kernels found the same, ../avx512/decode.c). */
FMHA_INLINE void scores_block_whole(const int kind, const int R, const fp8_bytes *tb, size_t d, const uint32_t *q,
                                    size_t ldq, const uint8_t *k, size_t ldk, float *s, size_t lds, __m512 sv) {
    const int J = 16 / R;
    const size_t unit = kind == KEY_BF16 ? 2 : 1;
    const uint32_t *qr[4];
    const uint8_t *kr[16];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) qr[r] = q + (size_t)r * ldq;
#pragma GCC unroll 16
    for (int jj = 0; jj < J; jj++) kr[jj] = k + (size_t)jj * ldk * unit;
    __m512 acc[16];
    accumulate(kind, R, tb, d, qr, kr, acc);
    const __m512 sum = _mm512_mul_ps(fmha_avx512_reduce16(acc), sv);
    if (R == 1) {
        _mm512_storeu_ps(s, sum);
        return;
    }
    _mm_storeu_ps(s, _mm512_castps512_ps128(sum));
    _mm_storeu_ps(s + lds, _mm512_extractf32x4_ps(sum, 1));
    _mm_storeu_ps(s + 2 * lds, _mm512_extractf32x4_ps(sum, 2));
    _mm_storeu_ps(s + 3 * lds, _mm512_extractf32x4_ps(sum, 3));
}

/* Rows in blocks of 4 (a last block of 3 with a repeated row) against 4
 * keys at a time, then the rows left one at a time against 16. */
FMHA_INLINE void scores_bf16(const int kind, const uint16_t *bits, size_t rows, size_t nk, size_t d,
                             const uint32_t *q, size_t ldq, const void *k, size_t ldk, float *s, size_t lds,
                             float scale) {
    fp8_bytes tb;
    if (kind == KEY_FP8) tb = bytes_table_of(bits);
    const size_t unit = kind == KEY_BF16 ? 2 : 1;
    const uint8_t *k8 = k;
    const size_t blocked = rows >= 3 ? (rows + 1) / 4 * 4 : 0;
    const __m512 sv = _mm512_set1_ps(scale);
    for (size_t r0 = 0; r0 < blocked; r0 += 4) {
        const size_t nr = rows - r0 < 4 ? rows - r0 : 4;
        size_t j0 = 0;
        if (nr == 4)
            for (; j0 + 4 <= nk; j0 += 4)
                scores_block_whole(kind, 4, &tb, d, q + r0 * ldq, ldq, k8 + j0 * ldk * unit, ldk, s + r0 * lds + j0,
                                   lds, sv);
        for (; j0 < nk; j0 += 4)
            scores_block(kind, 4, &tb, nr, nk - j0 < 4 ? nk - j0 : 4, d, q + r0 * ldq, ldq, k8 + j0 * ldk * unit, ldk,
                         s + r0 * lds + j0, lds, scale);
    }
    for (size_t r = blocked; r < rows; r++) {
        size_t j0 = 0;
        for (; j0 + 16 <= nk; j0 += 16)
            scores_block_whole(kind, 1, &tb, d, q + r * ldq, ldq, k8 + j0 * ldk * unit, ldk, s + r * lds + j0, lds,
                               sv);
        for (; j0 < nk; j0 += 16)
            scores_block(kind, 1, &tb, 1, nk - j0 < 16 ? nk - j0 : 16, d, q + r * ldq, ldq, k8 + j0 * ldk * unit,
                         ldk, s + r * lds + j0, lds, scale);
    }
}

void fmha_e4m3kv_scores_bf16__avx512bf16(size_t rows, size_t nk, size_t d, const uint32_t *q, size_t ldq,
                                         const void *k, size_t ldk, float *s, size_t lds, float scale) {
    scores_bf16(KEY_FP8, e4m3_bf16, rows, nk, d, q, ldq, k, ldk, s, lds, scale);
}

void fmha_e5m2kv_scores_bf16__avx512bf16(size_t rows, size_t nk, size_t d, const uint32_t *q, size_t ldq,
                                         const void *k, size_t ldk, float *s, size_t lds, float scale) {
    scores_bf16(KEY_FP8, e5m2_bf16, rows, nk, d, q, ldq, k, ldk, s, lds, scale);
}

/* ---- 16 rows in the lanes (scores_bf16_qt) ----
 * 16 keys' rows become bf16 pairs once (kb [16][d / 2], float8 through the
 * byte table, bf16 copied: a cache's rows lie a row of heads apart, all in
 * a few sets of L1, where kb's do not), then each pair p of the query's
 * tile (16 rows' pair p) meets each key's pair p broadcast from kb: one
 * vdpbf16ps for 16 rows, 16 independent chains, no transposing sum; one
 * 16 x 16 transpose at the end gives s [rows][keys]. */
enum { QT_MAX_PAIRS = 288 }; /* d <= 576 */

FMHA_INLINE void scores_bf16_qt(const int kind, const uint16_t *bits, size_t rows, size_t nk, size_t d,
                                const uint32_t *qt, const void *k, size_t ldk, float *s, size_t lds, float scale) {
    fp8_bytes tb;
    if (kind == KEY_FP8) tb = bytes_table_of(bits);
    const size_t unit = kind == KEY_BF16 ? 2 : 1; /* bytes a storage unit */
    _Alignas(64) uint32_t kb[16][QT_MAX_PAIRS]; /* 16 keys' pairs */
    const __m512 sv = _mm512_set1_ps(scale);
    for (size_t j0 = 0; j0 < nk; j0 += 16) {
        const size_t nj = nk - j0 < 16 ? nk - j0 : 16;
        for (size_t jj = 0; jj < 16; jj++) { /* keys past nj repeat the last, not stored */
            const uint8_t *row = (const uint8_t *)k + (j0 + (jj < nj ? jj : nj - 1)) * ldk * unit;
            if (kind == KEY_BF16) {
                for (size_t e = 0; e < d; e += 32) /* d a multiple of 32 */
                    _mm512_store_si512((void *)(kb[jj] + e / 2), _mm512_loadu_si512((const void *)(row + 2 * e)));
                continue;
            }
            for (size_t e = 0; e < d; e += 64) {
                __m512i lo, hi;
                fp8x64_to_bf16(&tb, load_fp8x64(row, e, d), &lo, &hi);
                _mm512_store_si512((void *)(kb[jj] + e / 2), lo);
                if (e + 64 <= d) _mm512_store_si512((void *)(kb[jj] + e / 2 + 16), hi);
            }
        }
        __m512 acc[16];
#pragma GCC unroll 16
        for (int jj = 0; jj < 16; jj++) acc[jj] = _mm512_setzero_ps();
        for (size_t p = 0; p < d / 2; p++) {
            const __m512bh qv = (__m512bh)_mm512_loadu_si512(qt + 16 * p);
#pragma GCC unroll 16
            for (int jj = 0; jj < 16; jj++)
                acc[jj] = _mm512_dpbf16_ps(acc[jj], qv, (__m512bh)_mm512_set1_epi32((int)kb[jj][p]));
        }
#pragma GCC unroll 16
        for (int jj = 0; jj < 16; jj++) acc[jj] = _mm512_mul_ps(acc[jj], sv);
        fmha_avx512_transpose16(acc); /* acc[r]: row r's 16 keys */
        const __mmask16 keys = (__mmask16)((1u << nj) - 1u);
        for (size_t r = 0; r < rows; r++) _mm512_mask_storeu_ps(s + r * lds + j0, keys, acc[r]);
    }
}

void fmha_e4m3kv_scores_bf16_qt__avx512bf16(size_t rows, size_t nk, size_t d, const uint32_t *qt, const void *k,
                                            size_t ldk, float *s, size_t lds, float scale) {
    scores_bf16_qt(KEY_FP8, e4m3_bf16, rows, nk, d, qt, k, ldk, s, lds, scale);
}

void fmha_e5m2kv_scores_bf16_qt__avx512bf16(size_t rows, size_t nk, size_t d, const uint32_t *qt, const void *k,
                                            size_t ldk, float *s, size_t lds, float scale) {
    scores_bf16_qt(KEY_FP8, e5m2_bf16, rows, nk, d, qt, k, ldk, s, lds, scale);
}

void fmha_bf16kv_scores_bf16__avx512bf16(size_t rows, size_t nk, size_t d, const uint32_t *q, size_t ldq,
                                         const void *k, size_t ldk, float *s, size_t lds, float scale) {
    scores_bf16(KEY_BF16, NULL, rows, nk, d, q, ldq, k, ldk, s, lds, scale);
}

void fmha_bf16kv_scores_bf16_qt__avx512bf16(size_t rows, size_t nk, size_t d, const uint32_t *qt, const void *k,
                                            size_t ldk, float *s, size_t lds, float scale) {
    scores_bf16_qt(KEY_BF16, NULL, rows, nk, d, qt, k, ldk, s, lds, scale);
}

/* The value columns [c, c + 32) below dv, as a lane mask. */
FMHA_INLINE __mmask32 block_lanes(size_t dv, size_t c) {
    const size_t left = dv > c ? dv - c : 0;
    return left >= 32 ? 0xffffffffu : (__mmask32)((1u << left) - 1u);
}

/* o[r][c0 + c] = o alpha[r] + the sums of rows r < n (of R), columns [c0,
 * c0 + 64) below dv, from acc[r][2 bb + u]: block bb's lo (u 0) and hi
 * (u 1) unpack's columns, put back in order. */
FMHA_INLINE void finish_unpacked(const int R, size_t n, size_t dv, size_t c0, __m512 acc[4][4], float *o, size_t ldo,
                                 const float *alpha) {
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
        if ((size_t)r >= n) break;
        const __m512 a = _mm512_set1_ps(alpha[r]);
#pragma GCC unroll 4
        for (int h = 0; h < 4; h++) { /* 16 columns at a time, in order */
            const size_t c = c0 + 16 * (size_t)h;
            if (c >= dv) break;
            const __mmask16 cm = dv - c >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (dv - c)) - 1u);
            float *orow = o + (size_t)r * ldo + c;
            const __m512 sum = fmha_avx512_unpacked_in_order(acc[r][h / 2 * 2], acc[r][h / 2 * 2 + 1], h % 2);
            _mm512_mask_storeu_ps(orow, cm, _mm512_fmadd_ps(_mm512_maskz_loadu_ps(cm, orow), a, sum));
        }
    }
}

/* ---- P V on bf16 P ----
 * Two keys' V rows (by address: a call may span pages; float8 rows made
 * bf16 through the table, 64 columns at a time) interleave by
 * vpunpcklwd / vpunpckhwd (a block of 32 columns in avx512/unpack.h's
 * order, put back at the end of a call) and meet the row's pair of bf16
 * P, one vdpbf16ps for 16 columns and 2 keys: half the FMAs'
 * instructions, no widening. P is rounded to bf16 pairs once a call: pp
 * [rows][nk / 2 rounded up] words (P of key 2i in the low half); an odd
 * nk's last pair meets a zero row of V. */
enum { VBF_MAX_KEYS = 128 }; /* the contract's nk */

/* 32 columns of row x from c (the lanes of m; the others 0). */
FMHA_INLINE __m512i load_bf16_cols(const uint16_t *x, size_t c, __mmask32 m) {
    return _mm512_maskz_loadu_epi16(m, x + c);
}

/* The value columns [c, c + 64) below dv, as a lane mask of bytes. */
FMHA_INLINE __mmask64 block_lanes64(size_t dv, size_t c) {
    return (__mmask64)block_lanes(dv, c) | (__mmask64)block_lanes(dv, c + 32) << 32;
}

/* Columns [c0, c0 + 64) of V's row x (the lanes of bm, the others 0) as 64
 * bf16 in order, w[0] the first 32: bf16 as stored (kind KEY_BF16), or
 * float8 bytes made bf16 through the table tb (KEY_FP8: exact). */
FMHA_INLINE void value_cols_bf16(const int kind, const fp8_bytes *tb, const void *x, size_t c0, __mmask64 bm,
                                 __m512i w[2]) {
    if (kind == KEY_FP8) {
        const uint8_t *at = (const uint8_t *)x + c0;
        fp8x64_to_bf16(tb, ~bm ? _mm512_maskz_loadu_epi8(bm, at) : _mm512_loadu_si512((const void *)at), &w[0],
                       &w[1]);
        return;
    }
    w[0] = load_bf16_cols(x, c0, (__mmask32)bm);
    w[1] = load_bf16_cols(x, c0 + 32, (__mmask32)(bm >> 32));
}

/* Rows [0, R) (R = 4 or 1; rows past n repeat the last, not stored),
 * columns [c0, c0 + 64): acc[r][2 bb + u], block bb's lo (u 0) and hi
 * (u 1) unpack's columns (value_cols_bf16 reads V). */
FMHA_INLINE void values_bf16_block(const int kind, const fp8_bytes *tb, const int R, size_t n, size_t nk, size_t dv,
                                   size_t c0, const uint32_t *pp, size_t ldpp, const void *const *v_rows, float *o,
                                   size_t ldo, const float *alpha) {
    const __mmask64 bm = block_lanes64(dv, c0);
    const uint32_t *pr[4];
    __m512 acc[4][4];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
        pr[r] = pp + ((size_t)r < n ? (size_t)r : n - 1) * ldpp;
        acc[r][0] = acc[r][1] = acc[r][2] = acc[r][3] = _mm512_setzero_ps();
    }
    for (size_t j = 0; j < nk; j += 2) {
        const int pair = j + 1 < nk; /* else the second row is zeros */
        __m512i a[2], b[2] = {_mm512_setzero_si512(), _mm512_setzero_si512()};
        value_cols_bf16(kind, tb, v_rows[j], c0, bm, a);
        if (pair) value_cols_bf16(kind, tb, v_rows[j + 1], c0, bm, b);
        __m512bh vv[4];
#pragma GCC unroll 2
        for (int bb = 0; bb < 2; bb++) {
            vv[2 * bb] = (__m512bh)_mm512_unpacklo_epi16(a[bb], b[bb]);
            vv[2 * bb + 1] = (__m512bh)_mm512_unpackhi_epi16(a[bb], b[bb]);
        }
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            const __m512bh pv = (__m512bh)_mm512_set1_epi32((int)pr[r][j / 2]);
#pragma GCC unroll 4
            for (int u = 0; u < 4; u++) acc[r][u] = _mm512_dpbf16_ps(acc[r][u], pv, vv[u]);
        }
    }
    finish_unpacked(R, n, dv, c0, acc, o, ldo, alpha);
}

/* pp [rows][ldpp] = row r's P in bf16 pairs, keys past nk 0 (round to
 * nearest even: fmha_f32_to_bf16's, NaN quieted). */
FMHA_INLINE void round_pairs(size_t rows, size_t nk, const float *p, size_t ldp, uint32_t *pp, size_t ldpp) {
    for (size_t r = 0; r < rows; r++)
        for (size_t j = 0; j < nk; j += 32) {
            const size_t left = nk - j;
            const __mmask16 m0 = left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1u);
            const __mmask16 m1 = left >= 32 ? (__mmask16)0xffff : left > 16 ? (__mmask16)((1u << (left - 16)) - 1u) : 0;
            const __m512 a = _mm512_maskz_loadu_ps(m0, p + r * ldp + j), b = _mm512_maskz_loadu_ps(m1, p + r * ldp + j + 16);
            /* vcvtne2ps2bf16: b's 16 in the high half, a's in the low, each a pair's element in order */
            const __m512i w = (__m512i)_mm512_cvtne2ps_pbh(b, a);
            const size_t words = (left >= 32 ? 32 : left + 1) / 2;
            _mm512_mask_storeu_epi32(pp + r * ldpp + j / 2, (__mmask16)((1u << words) - 1u), w);
        }
}

FMHA_INLINE void values_bf16(const int kind, const uint16_t *bits, size_t rows, size_t nk, size_t dv, const float *p,
                             size_t ldp, const void *const *v_rows, float *o, size_t ldo, const float *alpha) {
    fp8_bytes tb;
    if (kind == KEY_FP8) tb = bytes_table_of(bits);
    uint32_t pp[4 * VBF_MAX_KEYS / 2]; /* [4][VBF_MAX_KEYS / 2]: a block of rows' P pairs */
    for (size_t r0 = 0; r0 < rows; r0 += 4) {
        const size_t nr = rows - r0 < 4 ? rows - r0 : 4;
        round_pairs(nr, nk, p + r0 * ldp, ldp, pp, VBF_MAX_KEYS / 2);
        for (size_t c0 = 0; c0 < dv; c0 += 64) {
            if (nr == 4) {
                values_bf16_block(kind, &tb, 4, 4, nk, dv, c0, pp, VBF_MAX_KEYS / 2, v_rows, o + r0 * ldo, ldo,
                                  alpha + r0);
                continue;
            }
            for (size_t r = 0; r < nr; r++)
                values_bf16_block(kind, &tb, 1, 1, nk, dv, c0, pp + r * (VBF_MAX_KEYS / 2), VBF_MAX_KEYS / 2, v_rows,
                                  o + (r0 + r) * ldo, ldo, alpha + r0 + r);
        }
    }
}

void fmha_bf16kv_values_bf16__avx512bf16(size_t rows, size_t nk, size_t dv, const float *p, size_t ldp,
                                         const void *const *v_rows, float *o, size_t ldo, const float *alpha) {
    values_bf16(KEY_BF16, NULL, rows, nk, dv, p, ldp, v_rows, o, ldo, alpha);
}

void fmha_e4m3kv_values_bf16__avx512bf16(size_t rows, size_t nk, size_t dv, const float *p, size_t ldp,
                                         const void *const *v_rows, float *o, size_t ldo, const float *alpha) {
    values_bf16(KEY_FP8, e4m3_bf16, rows, nk, dv, p, ldp, v_rows, o, ldo, alpha);
}

void fmha_e5m2kv_values_bf16__avx512bf16(size_t rows, size_t nk, size_t dv, const float *p, size_t ldp,
                                         const void *const *v_rows, float *o, size_t ldo, const float *alpha) {
    values_bf16(KEY_FP8, e5m2_bf16, rows, nk, dv, p, ldp, v_rows, o, ldo, alpha);
}

/* ---- float8 values read through the table ----
 * The in-place AVX-512 values kernel widens e4m3 in 9 µops a vector of 16
 * and e5m2 in 4 (avx512/decode.c). Here 64 bytes become 64 bf16
 * (fp8x64_to_bf16: 3 permutes and 4 other µops) and each bf16 a float32 by
 * one unpack with zeros (vpunpck lwd / hwd), about 2.75 µops a vector;
 * the unpacks leave a block's columns in avx512/unpack.h's order, which
 * the end of a call puts back. The values are the same float32 values and
 * each column's chain of FMAs over the keys the same, so the bits are
 * avx512's kernel's. */

/* Rows [0, R) of o (R = 4 or 1; rows past n repeat the last, not stored),
 * columns [c0, c0 + 64): acc[r][2 bb + u], block bb's lo (u 0) and hi (u
 * 1) unpack's columns. */
FMHA_INLINE void fp8_values_block(const int R, const fp8_bytes *tb, size_t n, size_t nk, size_t dv, size_t c0,
                                  const float *p, size_t ldp, const uint8_t *v, size_t ldv, float *o, size_t ldo,
                                  const float *alpha) {
    const __mmask64 bm = block_lanes64(dv, c0);
    const float *pr[4];
    __m512 acc[4][4];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
        pr[r] = p + ((size_t)r < n ? (size_t)r : n - 1) * ldp;
        acc[r][0] = acc[r][1] = acc[r][2] = acc[r][3] = _mm512_setzero_ps();
    }
    const __m512i zero = _mm512_setzero_si512();
    for (size_t j = 0; j < nk; j++) {
        __m512i w[2];
        value_cols_bf16(KEY_FP8, tb, v + j * ldv, c0, bm, w);
        __m512 vv[4];
        vv[0] = _mm512_castsi512_ps(_mm512_unpacklo_epi16(zero, w[0]));
        vv[1] = _mm512_castsi512_ps(_mm512_unpackhi_epi16(zero, w[0]));
        vv[2] = _mm512_castsi512_ps(_mm512_unpacklo_epi16(zero, w[1]));
        vv[3] = _mm512_castsi512_ps(_mm512_unpackhi_epi16(zero, w[1]));
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            const __m512 pv = _mm512_set1_ps(pr[r][j]);
#pragma GCC unroll 4
            for (int u = 0; u < 4; u++) acc[r][u] = _mm512_fmadd_ps(pv, vv[u], acc[r][u]);
        }
    }
    finish_unpacked(R, n, dv, c0, acc, o, ldo, alpha);
}

FMHA_INLINE void fp8_values(const uint16_t *bits, size_t rows, size_t nk, size_t dv, const float *p, size_t ldp,
                            const void *v, size_t ldv, float *o, size_t ldo, const float *alpha) {
    const fp8_bytes tb = bytes_table_of(bits);
    const size_t blocked = rows >= 3 ? (rows + 1) / 4 * 4 : 0;
    for (size_t c0 = 0; c0 < dv; c0 += 64) {
        for (size_t r0 = 0; r0 < blocked; r0 += 4)
            fp8_values_block(4, &tb, rows - r0 < 4 ? rows - r0 : 4, nk, dv, c0, p + r0 * ldp, ldp, v, ldv,
                             o + r0 * ldo, ldo, alpha + r0);
        for (size_t r = blocked; r < rows; r++)
            fp8_values_block(1, &tb, 1, nk, dv, c0, p + r * ldp, ldp, v, ldv, o + r * ldo, ldo, alpha + r);
    }
}

/* dst[i] = value i of a float8 row, i < n: 64 at a time through the
 * table, each bf16 zero-extended and shifted into a float32 (the load
 * kernel's contract; the values are exact, so the bits are avx512's). */
FMHA_INLINE void widen_fp8_row(const uint16_t *bits, size_t n, const void *src_row, float *dst) {
    const fp8_bytes tb = bytes_table_of(bits);
    const uint8_t *src = src_row;
    for (size_t i = 0; i < n; i += 64) {
        const size_t left = n - i;
        const __mmask64 m = left >= 64 ? ~(__mmask64)0 : ((__mmask64)1 << left) - 1;
        __m512i w[2];
        fp8x64_to_bf16(&tb, _mm512_maskz_loadu_epi8(m, src + i), &w[0], &w[1]);
#pragma GCC unroll 4
        for (int q = 0; q < 4; q++) { /* 16 values from i + 16 q */
            const __m256i h = q % 2 ? _mm512_extracti64x4_epi64(w[q / 2], 1) : _mm512_castsi512_si256(w[q / 2]);
            const __m512 f = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
            const size_t at = 16 * (size_t)q;
            if (left >= at + 16)
                _mm512_storeu_ps(dst + i + at, f);
            else if (left > at)
                _mm512_mask_storeu_ps(dst + i + at, (__mmask16)((1u << (left - at)) - 1u), f);
        }
    }
}

/* A float8 format's values and load kernels. */
#define FP8_TABLE_KERNELS(name)                                                                                        \
    void fmha_##name##kv_decode_values__avx512bf16(size_t rows, size_t nk, size_t dv, const float *p, size_t ldp,     \
                                                   const void *v, size_t ldv, float *o, size_t ldo,                   \
                                                   const float *alpha) {                                              \
        fp8_values(name##_bf16, rows, nk, dv, p, ldp, v, ldv, o, ldo, alpha);                                          \
    }                                                                                                                  \
    void fmha_widen_##name##__avx512bf16(size_t n, const void *src_row, float *dst) {                                 \
        widen_fp8_row(name##_bf16, n, src_row, dst);                                                                   \
    }
FP8_TABLE_KERNELS(e4m3)
FP8_TABLE_KERNELS(e5m2)
