/* avx512/decode.c: the AVX-512 decode microkernels (keys in the lanes).
 * Scores: a block of R rows x 16/R keys (R = 4 or 1) keeps 16 accumulators,
 * one per (row, key), over the head dim, so each K vector feeds R FMAs; one
 * transposing reduction turns them into the block's 16 scores. Values: 4
 * rows x 64 value dims of accumulators (rows left over one at a time), a row
 * of V loaded once per key and one broadcast of P per row. K and V rows are
 * float32, or bf16 / f16 widened in registers (one body per kind).
 * Softmax: row-wise max, then the inlined vector exp (exp.h) in the same
 * pass as the sum. Contract in ../ukernel.h; the scalar kernels
 * (../scalar/decode.c) are the specification. */
#include <immintrin.h>
#include <math.h>
#include <stddef.h>

#include "decode.h"
#include "exp.h"
#include "reduce.h"
#include "transpose.h"

#define FMHA_INLINE static inline __attribute__((always_inline))

/* The element type of K or V rows: float32, or a narrower format widened
 * in registers (bf16: the bits shifted up; half: vcvtph2ps; int8: sign
 * extension; fp8: moved into a half; GGUF blocks: their values times the
 * block's half scale). Widening is exact (the blocks' product is the
 * specification's one rounding), so every kind runs the float32 arithmetic
 * on the format's values. */
enum { KV_F32, KV_BF16, KV_F16, KV_I8, KV_E4M3, KV_E5M2, KV_Q8_0, KV_Q4_0 };

/* Bytes of the storage unit row strides count. */
FMHA_INLINE size_t kv_unit(const int kind) { return kind == KV_F32 ? 4 : kind <= KV_F16 ? 2 : 1; }

/* bf16: one word permute puts element i in word 2 i + 1 and zeros the
 * rest (widening and shift in one µop; Zen 4, 4 rows, D 128, L1: scores
 * 11.4 -> 10.8 ns a key, values at 64 keys 9.9 -> 9.5). */
FMHA_INLINE __m512 widen_kv(const int kind, __m256i h) {
    if (kind == KV_BF16) {
        const __m512i high_words = _mm512_set_epi16(15, 0, 14, 0, 13, 0, 12, 0, 11, 0, 10, 0, 9, 0, 8, 0, 7, 0, 6, 0,
                                                    5, 0, 4, 0, 3, 0, 2, 0, 1, 0, 0, 0);
        return _mm512_castsi512_ps(
            _mm512_maskz_permutexvar_epi16((__mmask32)0xAAAAAAAAu, high_words, _mm512_castsi256_si512(h)));
    }
    return _mm512_cvtph_ps(h);
}

/* 16 fp8 bytes as float32. E5M2 is the top byte of a half. E4M3FN
 * sign-extended and shifted left by 7 is a half of the value / 2^8
 * (subnormals too) once bit 14, a copy of the sign, is cleared: 9 µops
 * with the NaN (S.1111.111) against 11 with the sign moved on its own. */
FMHA_INLINE __m512 widen_fp8(const int kind, __m128i b8) {
    if (kind == KV_E5M2) return _mm512_cvtph_ps(_mm256_slli_epi16(_mm256_cvtepu8_epi16(b8), 8));
    const __m256i h = _mm256_and_si256(_mm256_slli_epi16(_mm256_cvtepi8_epi16(b8), 7), _mm256_set1_epi16((short)0xBF80));
    const __m512 x = _mm512_mul_ps(_mm512_cvtph_ps(h), _mm512_set1_ps(256.0f));
    const __m256i nan_bits = _mm256_set1_epi16(0x3F80); /* the magnitude's 7 bits */
    const __mmask16 nan = _mm256_cmpeq_epi16_mask(_mm256_and_si256(h, nan_bits), nan_bits);
    return _mm512_mask_mov_ps(x, nan, _mm512_set1_ps(NAN));
}

/* The 16 values from value e (a multiple of 16) of a run of GGUF blocks. */
FMHA_INLINE __m512 load_block(const int kind, const void *x, size_t e) {
    const size_t bytes = kind == KV_Q8_0 ? FMHA_Q8_0_BLOCK_BYTES : FMHA_Q4_0_BLOCK_BYTES;
    const uint8_t *blk = (const uint8_t *)x + e / FMHA_GGUF_BLOCK * bytes;
    uint16_t dh;
    __builtin_memcpy(&dh, blk, 2);
    const __m512 d = _mm512_cvtph_ps(_mm256_set1_epi16((short)dh));
    __m512i q;
    if (kind == KV_Q8_0) {
        q = _mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(blk + 2 + e % 32)));
    } else { /* values 0..15 the low nibbles, 16..31 the high ones */
        const __m512i bytes16 = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(blk + 2)));
        const __m512i nib = e % 32 ? _mm512_srli_epi32(bytes16, 4) : _mm512_and_si512(bytes16, _mm512_set1_epi32(15));
        q = _mm512_sub_epi32(nib, _mm512_set1_epi32(8));
    }
    return _mm512_mul_ps(_mm512_cvtepi32_ps(q), d);
}

/* 16 elements of a row (x, element e on). */
FMHA_INLINE __m512 load_kv(const int kind, const void *x, size_t e) {
    if (kind == KV_F32) return _mm512_loadu_ps((const float *)x + e);
    if (kind == KV_BF16 || kind == KV_F16)
        return widen_kv(kind, _mm256_loadu_si256((const __m256i *)((const uint16_t *)x + e)));
    if (kind == KV_Q8_0 || kind == KV_Q4_0) return load_block(kind, x, e);
    const __m128i b = _mm_loadu_si128((const __m128i *)((const uint8_t *)x + e));
    if (kind == KV_I8) return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b));
    return widen_fp8(kind, b);
}

/* The same, only the lanes of m (the others 0). Block formats see whole
 * vectors of a row (D a multiple of 32): m is all lanes or none. */
FMHA_INLINE __m512 maskz_load_kv(const int kind, __mmask16 m, const void *x, size_t e) {
    if (kind == KV_F32) return _mm512_maskz_loadu_ps(m, (const float *)x + e);
    if (kind == KV_BF16 || kind == KV_F16)
        return widen_kv(kind, _mm256_maskz_loadu_epi16(m, (const uint16_t *)x + e));
    if (kind == KV_Q8_0 || kind == KV_Q4_0) return m ? load_block(kind, x, e) : _mm512_setzero_ps();
    const __m128i b = _mm_maskz_loadu_epi8(m, (const uint8_t *)x + e);
    if (kind == KV_I8) return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b));
    return _mm512_maskz_mov_ps(m, widen_fp8(kind, b));
}

/* Row r of x (rows ld storage units apart). */
FMHA_INLINE const void *row_at(const int kind, const void *x, size_t r, size_t ld) {
    return (const char *)x + r * ld * kv_unit(kind);
}

/* acc[r * J + jj] += qv[r] kv[jj], the R x J products of one head-dim step. */
FMHA_INLINE void scores_step(const int R, const int J, const __m512 qv[4], const __m512 kv[16], __m512 acc[16]) {
#pragma GCC unroll 4
    for (int r = 0; r < R; r++)
#pragma GCC unroll 16
        for (int jj = 0; jj < J; jj++) acc[r * J + jj] = _mm512_fmadd_ps(qv[r], kv[jj], acc[r * J + jj]);
}

/* acc[r * J + jj] (J = 16 / R) = row r of q (qr[r]) . key jj's row (kr[jj])
 * over the head dim, in 16 lanes: whole vectors, then a tail of d % 16
 * (none when tail is 0 at compile time: d a multiple of 16). */
FMHA_INLINE void accumulate(const int kind, const int R, const int tail_too, size_t d, const float *const qr[4],
                            const void *const kr[16], __m512 acc[16]) {
    const int J = 16 / R;
#pragma GCC unroll 16
    for (int x = 0; x < 16; x++) acc[x] = _mm512_setzero_ps();
    const size_t d_full = tail_too ? d / 16 * 16 : d;
    size_t e = 0;
    for (; e < d_full; e += 16) {
        __m512 qv[4], kv[16];
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) qv[r] = _mm512_loadu_ps(qr[r] + e);
#pragma GCC unroll 16
        for (int jj = 0; jj < J; jj++) kv[jj] = load_kv(kind, kr[jj], e);
        scores_step(R, J, qv, kv, acc);
    }
    if (tail_too && e < d) {
        const __mmask16 tail = (__mmask16)((1u << (d - e)) - 1u);
        __m512 qv[4], kv[16];
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) qv[r] = _mm512_maskz_loadu_ps(tail, qr[r] + e);
#pragma GCC unroll 16
        for (int jj = 0; jj < J; jj++) kv[jj] = maskz_load_kv(kind, tail, kr[jj], e);
        scores_step(R, J, qv, kv, acc);
    }
}

/* Scores of R rows x (16 / R) keys (R = 4 or 1): 16 accumulators, one per
 * (row, key), so that each K vector loaded feeds R FMAs and each query
 * vector 16 / R. The reduction leaves row r's keys in lanes
 * [r * 16 / R, (r + 1) * 16 / R). nr <= R rows and nj <= 16 / R keys are
 * stored; the rest repeat the last row or key. */
FMHA_INLINE void scores_block(const int kind, const int R, size_t nr, size_t nj, size_t d, const float *q,
                              size_t ldq, const void *k, size_t ldk, float *s, size_t lds, __m512 sv) {
    const int J = 16 / R;
    const float *qr[4];
    const void *kr[16];
    for (int r = 0; r < R; r++) qr[r] = q + ((size_t)r < nr ? (size_t)r : nr - 1) * ldq;
    for (int jj = 0; jj < J; jj++) kr[jj] = row_at(kind, k, (size_t)jj < nj ? (size_t)jj : nj - 1, ldk);
    __m512 acc[16];
    accumulate(kind, R, 1, d, qr, kr, acc);
    const __m512 sum = _mm512_mul_ps(fmha_avx512_reduce16(acc), sv);
    const __mmask16 keys = (__mmask16)((1u << nj) - 1u);
    if (R == 1) {
        _mm512_mask_storeu_ps(s, keys, sum);
    } else {
        _mm_mask_storeu_ps(s, (__mmask8)keys, _mm512_castps512_ps128(sum));
        if (nr > 1) _mm_mask_storeu_ps(s + lds, (__mmask8)keys, _mm512_extractf32x4_ps(sum, 1));
        if (nr > 2) _mm_mask_storeu_ps(s + 2 * lds, (__mmask8)keys, _mm512_extractf32x4_ps(sum, 2));
        if (nr > 3) _mm_mask_storeu_ps(s + 3 * lds, (__mmask8)keys, _mm512_extractf32x4_ps(sum, 3));
    }
}

/* A whole block (R rows x 16 / R keys, d a multiple of 16): scores_block's
 * sums, bit for bit, without its repeated rows and keys, its tail and its
 * masked stores. Called in a
 * loop of its own, it keeps the block's pointers and counters in
 * registers: Zen 4, 4 rows, D 128, 64 keys, L1, 12.8 -> 9.4 ns a key (the
 * FMAs alone: 8.7); folding the same shortcut into scores_block as a flag
 * gave 11.9, the loop's counters spilled. */
FMHA_INLINE void scores_block_whole(const int kind, const int R, size_t d, const float *q, size_t ldq, const void *k,
                                    size_t ldk, float *s, size_t lds, __m512 sv) {
    const int J = 16 / R;
    const float *qr[4];
    const void *kr[16];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) qr[r] = q + (size_t)r * ldq;
#pragma GCC unroll 16
    for (int jj = 0; jj < J; jj++) kr[jj] = row_at(kind, k, (size_t)jj, ldk);
    __m512 acc[16];
    accumulate(kind, R, 0, d, qr, kr, acc);
    const __m512 sum = _mm512_mul_ps(fmha_avx512_reduce16(acc), sv);
    if (R == 1) {
        _mm512_storeu_ps(s, sum);
    } else {
        _mm_storeu_ps(s, _mm512_castps512_ps128(sum));
        _mm_storeu_ps(s + lds, _mm512_extractf32x4_ps(sum, 1));
        _mm_storeu_ps(s + 2 * lds, _mm512_extractf32x4_ps(sum, 2));
        _mm_storeu_ps(s + 3 * lds, _mm512_extractf32x4_ps(sum, 3));
    }
}

/* Rows in blocks of 4 (a last block of 3 as 4 x 4 with a repeated row)
 * against keys in blocks of 4, then the rows left (1 or 2) one at a time
 * against keys in blocks of 16: two block shapes, each inlined twice per
 * element kind, whole (scores_block_whole) and partial (compile time
 * under the sanitizers grows fast with more). Measured on Zen 5 (D = 128,
 * 32 keys, data in L1): 4 rows cost 2.7x 1 row. */
FMHA_INLINE void decode_scores(const int kind, size_t rows, size_t nk, size_t d, const float *q, size_t ldq,
                               const void *k, size_t ldk, float *s, size_t lds, float scale) {
    const __m512 sv = _mm512_set1_ps(scale);
    const size_t blocked = rows >= 3 ? (rows + 1) / 4 * 4 : 0; /* rows in 4-row blocks */
    for (size_t r0 = 0; r0 < blocked; r0 += 4) {
        const size_t nr = rows - r0 < 4 ? rows - r0 : 4;
        size_t j0 = 0;
        if (nr == 4 && d % 16 == 0)
            for (; j0 + 4 <= nk; j0 += 4)
                scores_block_whole(kind, 4, d, q + r0 * ldq, ldq, row_at(kind, k, j0, ldk), ldk, s + r0 * lds + j0,
                                   lds, sv);
        for (; j0 < nk; j0 += 4)
            scores_block(kind, 4, nr, nk - j0 < 4 ? nk - j0 : 4, d, q + r0 * ldq, ldq, row_at(kind, k, j0, ldk), ldk,
                         s + r0 * lds + j0, lds, sv);
    }
    for (size_t r = blocked; r < rows; r++) {
        size_t j0 = 0;
        if (d % 16 == 0)
            for (; j0 + 16 <= nk; j0 += 16)
                scores_block_whole(kind, 1, d, q + r * ldq, ldq, row_at(kind, k, j0, ldk), ldk, s + r * lds + j0, lds, sv);
        for (; j0 < nk; j0 += 16)
            scores_block(kind, 1, 1, nk - j0 < 16 ? nk - j0 : 16, d, q + r * ldq, ldq, row_at(kind, k, j0, ldk), ldk,
                         s + r * lds + j0, lds, sv);
    }
}

void fmha_f32_decode_scores__avx512(size_t rows, size_t nk, size_t d, const float *q, size_t ldq,
                                    const void *k, size_t ldk, float *s, size_t lds, float scale) {
    decode_scores(KV_F32, rows, nk, d, q, ldq, k, ldk, s, lds, scale);
}

void fmha_bf16kv_decode_scores__avx512(size_t rows, size_t nk, size_t d, const float *q, size_t ldq,
                                       const void *k, size_t ldk, float *s, size_t lds, float scale) {
    decode_scores(KV_BF16, rows, nk, d, q, ldq, k, ldk, s, lds, scale);
}

void fmha_f16kv_decode_scores__avx512(size_t rows, size_t nk, size_t d, const float *q, size_t ldq,
                                      const void *k, size_t ldk, float *s, size_t lds, float scale) {
    decode_scores(KV_F16, rows, nk, d, q, ldq, k, ldk, s, lds, scale);
}

/* Rows in the lanes: per block of 16 keys, acc[jj] lane r = row r's score
 * of key jj, one fmaf chain over e, each FMA's K operand an element
 * broadcast from memory. 16 query vectors (a 64-byte line of each key's
 * row) are held while every key of the block takes its 16 FMAs, so a
 * key's line is read once: key rows a multiple of 4 KiB apart (a cache of
 * [B, S, H, D]) share one set of L1, and a walk that took 4 elements of
 * every key in turn evicted each line before its next 4 (2x the time on
 * Zen 4). */
void fmha_f32_decode_scores_qt__avx512(size_t rows, size_t nk, size_t d, const float *qt, const float *k,
                                       size_t ldk, float *s, size_t lds, float scale) {
    const __m512 sv = _mm512_set1_ps(scale);
    const size_t d16 = d / 16 * 16;
    for (size_t j0 = 0; j0 < nk; j0 += 16) {
        const size_t nj = nk - j0 < 16 ? nk - j0 : 16;
        const float *kr[16];
        for (size_t jj = 0; jj < 16; jj++) kr[jj] = k + (j0 + (jj < nj ? jj : nj - 1)) * ldk;
        __m512 acc[16];
#pragma GCC unroll 16
        for (int jj = 0; jj < 16; jj++) acc[jj] = _mm512_setzero_ps();
        size_t e = 0;
        for (; e < d16; e += 16) {
            __m512 qv[16];
#pragma GCC unroll 16
            for (int t = 0; t < 16; t++) qv[t] = _mm512_loadu_ps(qt + (e + (size_t)t) * 16);
#pragma GCC unroll 16
            for (int jj = 0; jj < 16; jj++) {
                const float *x = kr[jj] + e;
                __m512 a = acc[jj];
#pragma GCC unroll 16
                for (int t = 0; t < 16; t++) a = _mm512_fmadd_ps(qv[t], _mm512_set1_ps(x[t]), a);
                acc[jj] = a;
            }
        }
        for (; e < d; e++) {
            const __m512 q0 = _mm512_loadu_ps(qt + e * 16);
#pragma GCC unroll 16
            for (int jj = 0; jj < 16; jj++) acc[jj] = _mm512_fmadd_ps(q0, _mm512_set1_ps(kr[jj][e]), acc[jj]);
        }
#pragma GCC unroll 16
        for (int jj = 0; jj < 16; jj++) acc[jj] = _mm512_mul_ps(acc[jj], sv);
        fmha_avx512_transpose16(acc); /* acc[r]: row r's 16 keys */
        const __mmask16 keys = (__mmask16)((1u << nj) - 1u);
        for (size_t r = 0; r < rows; r++) _mm512_mask_storeu_ps(s + r * lds + j0, keys, acc[r]);
    }
}

void fmha_f32_decode_softmax__avx512(size_t rows, size_t nk, float *s, size_t lds, float *m,
                                     float *l, float *alpha) {
    const size_t full = nk / 16 * 16;
    const __mmask16 tail = (__mmask16)((1u << (nk - full)) - 1u);
    for (size_t r = 0; r < rows; r++) {
        float *row = s + r * lds;
        __m512 mx = _mm512_set1_ps(m[r]);
        __mmask16 nan = 0; /* lanes that met a NaN score */
        for (size_t j = 0; j < full; j += 16) {
            const __m512 x = _mm512_loadu_ps(row + j);
            mx = _mm512_max_ps(mx, x);
            nan |= _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
        }
        if (tail) {
            const __m512 xt = _mm512_mask_loadu_ps(mx, tail, row + full);
            mx = _mm512_max_ps(mx, xt);
            nan |= _mm512_cmp_ps_mask(xt, xt, _CMP_UNORD_Q);
        }
        /* a NaN score (or a NaN running max) makes the row NaN */
        const float m_new = nan || isnan(m[r]) ? NAN : _mm512_reduce_max_ps(mx);
        const __m512 mu = _mm512_set1_ps(m_new == -INFINITY ? 0.0f : m_new);
        /* exp(s - m_use) in place; -inf - m_use stays -inf -> 0 */
        __m512 sum = _mm512_setzero_ps();
        for (size_t j = 0; j < full; j += 16) {
            const __m512 p = exp_f32(_mm512_sub_ps(_mm512_loadu_ps(row + j), mu));
            _mm512_storeu_ps(row + j, p);
            sum = _mm512_add_ps(sum, p);
        }
        if (tail) {
            const __m512 p = exp_f32_keep(tail, _mm512_sub_ps(_mm512_maskz_loadu_ps(tail, row + full), mu));
            _mm512_mask_storeu_ps(row + full, tail, p);
            sum = _mm512_add_ps(sum, p);
        }
        /* alpha = exp(m_old - m_use), from lane 0 */
        const float a = _mm512_cvtss_f32(exp_f32(_mm512_sub_ps(_mm512_set1_ps(m[r]), mu)));
        alpha[r] = a;
        l[r] = l[r] * a + _mm512_reduce_add_ps(sum);
        m[r] = m_new;
    }
}

enum { VAL_VECS = 4 };

/* Rows [0, n) of o (n <= NR, NR = 4 or 1 at compile time; rows past n
 * repeat the last and are not stored), value dims [c0, c0 + 64) with masks
 * per vector: NR x 4 accumulators, a row of V loaded once per key and NR
 * broadcasts of P. */
FMHA_INLINE void values_block(const int kind, const size_t NR, size_t n, size_t nk, size_t c0,
                              const __mmask16 cm[VAL_VECS], const float *p, size_t ldp, const void *v, size_t ldv,
                              float *o, size_t ldo, const float *alpha) {
    __m512 acc[4][VAL_VECS];
    const float *pr[4];
#pragma GCC unroll 4
    for (size_t r = 0; r < NR; r++) {
        pr[r] = p + (r < n ? r : n - 1) * ldp;
#pragma GCC unroll 4
        for (int c = 0; c < VAL_VECS; c++) acc[r][c] = _mm512_setzero_ps();
    }
    for (size_t j = 0; j < nk; j++) {
        const void *vr = row_at(kind, v, j, ldv);
        __m512 vv[VAL_VECS];
#pragma GCC unroll 4
        for (int c = 0; c < VAL_VECS; c++) vv[c] = maskz_load_kv(kind, cm[c], vr, c0 + 16 * (size_t)c);
#pragma GCC unroll 4
        for (size_t r = 0; r < NR; r++) {
            const __m512 pv = _mm512_set1_ps(pr[r][j]);
#pragma GCC unroll 4
            for (int c = 0; c < VAL_VECS; c++) acc[r][c] = _mm512_fmadd_ps(pv, vv[c], acc[r][c]);
        }
    }
#pragma GCC unroll 4
    for (size_t r = 0; r < NR; r++) {
        if (r >= n) break;
        const __m512 a = _mm512_set1_ps(alpha[r]);
        float *orow = o + r * ldo + c0;
#pragma GCC unroll 4
        for (int c = 0; c < VAL_VECS; c++) {
            const __m512 old = _mm512_maskz_loadu_ps(cm[c], orow + 16 * c);
            _mm512_mask_storeu_ps(orow + 16 * c, cm[c], _mm512_fmadd_ps(old, a, acc[r][c]));
        }
    }
}

/* Rows in blocks of 4 (16 accumulators; a last block of 3 with a repeated
 * row), then the rows left one at a time: two block shapes a kind. */
FMHA_INLINE void decode_values(const int kind, size_t rows, size_t nk, size_t dv, const float *p, size_t ldp,
                               const void *v, size_t ldv, float *o, size_t ldo, const float *alpha) {
    const size_t blocked = rows >= 3 ? (rows + 1) / 4 * 4 : 0;
    for (size_t c0 = 0; c0 < dv; c0 += 16 * VAL_VECS) {
        __mmask16 cm[VAL_VECS];
        for (int c = 0; c < VAL_VECS; c++) {
            size_t lo = c0 + 16 * (size_t)c, left = dv > lo ? dv - lo : 0;
            cm[c] = left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1u);
        }
        for (size_t r0 = 0; r0 < blocked; r0 += 4)
            values_block(kind, 4, rows - r0 < 4 ? rows - r0 : 4, nk, c0, cm, p + r0 * ldp, ldp, v, ldv, o + r0 * ldo,
                         ldo, alpha + r0);
        for (size_t r = blocked; r < rows; r++)
            values_block(kind, 1, 1, nk, c0, cm, p + r * ldp, ldp, v, ldv, o + r * ldo, ldo, alpha + r);
    }
}

void fmha_f32_decode_values__avx512(size_t rows, size_t nk, size_t dv, const float *p, size_t ldp,
                                    const void *v, size_t ldv, float *o, size_t ldo,
                                    const float *alpha) {
    decode_values(KV_F32, rows, nk, dv, p, ldp, v, ldv, o, ldo, alpha);
}

void fmha_bf16kv_decode_values__avx512(size_t rows, size_t nk, size_t dv, const float *p, size_t ldp,
                                       const void *v, size_t ldv, float *o, size_t ldo, const float *alpha) {
    decode_values(KV_BF16, rows, nk, dv, p, ldp, v, ldv, o, ldo, alpha);
}

void fmha_f16kv_decode_values__avx512(size_t rows, size_t nk, size_t dv, const float *p, size_t ldp,
                                      const void *v, size_t ldv, float *o, size_t ldo, const float *alpha) {
    decode_values(KV_F16, rows, nk, dv, p, ldp, v, ldv, o, ldo, alpha);
}

/* dst[i] = value i of a row of kind, i < n (a multiple of 32 for blocks). */
FMHA_INLINE void widen_row(const int kind, size_t n, const void *src, float *dst) {
    size_t i = 0;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(dst + i, load_kv(kind, src, i));
    if (i < n) {
        const __mmask16 tail = (__mmask16)((1u << (n - i)) - 1u);
        _mm512_mask_storeu_ps(dst + i, tail, maskz_load_kv(kind, tail, src, i));
    }
}

/* The kernels of one narrow format, read in place: scores, values and the
 * load into float32 rows. */
#define FORMAT_KERNELS(name, kind)                                                                                     \
    void fmha_##name##kv_decode_scores__avx512(size_t rows, size_t nk, size_t d, const float *q, size_t ldq,          \
                                               const void *k, size_t ldk, float *s, size_t lds, float scale) {       \
        decode_scores(kind, rows, nk, d, q, ldq, k, ldk, s, lds, scale);                                               \
    }                                                                                                                  \
    void fmha_##name##kv_decode_values__avx512(size_t rows, size_t nk, size_t dv, const float *p, size_t ldp,         \
                                               const void *v, size_t ldv, float *o, size_t ldo, const float *alpha) { \
        decode_values(kind, rows, nk, dv, p, ldp, v, ldv, o, ldo, alpha);                                              \
    }                                                                                                                  \
    void fmha_widen_##name##__avx512(size_t n, const void *src_row, float *dst) { widen_row(kind, n, src_row, dst); }
FORMAT_KERNELS(int8, KV_I8)
FORMAT_KERNELS(e4m3, KV_E4M3)
FORMAT_KERNELS(e5m2, KV_E5M2)
FORMAT_KERNELS(q8_0, KV_Q8_0)
FORMAT_KERNELS(q4_0, KV_Q4_0)

void fmha_widen_bf16__avx512(size_t n, const void *src_row, float *dst) {
    const uint16_t *src = src_row;
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512i x = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(src + i)));
        _mm512_storeu_ps(dst + i, _mm512_castsi512_ps(_mm512_slli_epi32(x, 16)));
    }
    if (i < n) {
        const __mmask16 tail = (__mmask16)((1u << (n - i)) - 1u);
        __m512i x = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(tail, src + i));
        _mm512_mask_storeu_ps(dst + i, tail, _mm512_castsi512_ps(_mm512_slli_epi32(x, 16)));
    }
}

void fmha_widen_f16__avx512(size_t n, const void *src_row, float *dst) {
    const uint16_t *src = src_row;
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(src + i))));
    if (i < n) {
        const __mmask16 tail = (__mmask16)((1u << (n - i)) - 1u);
        _mm512_mask_storeu_ps(dst + i, tail, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(tail, src + i)));
    }
}
