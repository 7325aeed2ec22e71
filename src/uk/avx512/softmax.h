/* avx512/softmax.h: the AVX-512 online-softmax step over S^T [rows][NR]
 * (fmha_f32_softmax_ukernel_fn) for NR = 16 vecs lanes, inlined where it is
 * used: the float32 kernels of f32.c (64 lanes) and f32_tall.c (32) write P
 * in place; the bf16 table's fused step
 * (avx512bf16/bf16.c) hands each two rows of P to a pair-store hook that
 * rounds them into one bf16 pair-row, so P never goes through memory as
 * float32. The hook is a constant at each use, so it inlines. */
#ifndef FMHA_UK_AVX512_SOFTMAX_H
#define FMHA_UK_AVX512_SOFTMAX_H

#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>

#include "exp.h"

/* The pair-rows of the bf16 tables: 64 lanes = 4 zmm; the float32 step
 * also runs on 32 lanes (2 zmm: the tall tiles' NR). */
enum { SOFTMAX_NR = 64, SOFTMAX_VECS = 4 };

/* dst[i] = (bf16(lo[i / 16][i % 16]), bf16(hi[..])) for i < 64: two rows of
 * P (4 zmm each) as one pair-row (fmha_bf16_pair_rows_ukernel_fn's words). */
typedef void (*softmax_pair_store_fn)(const __m512 lo[4], const __m512 hi[4], uint32_t *dst);

/* Sets the words of NaN lanes (bit per lane in `lanes`) to NaN pairs: both
 * halves NaN, the last pair-row of an odd `rows` NaN paired with 0 (what the
 * pair-store makes of NaN rows). Rare: out of line. */
static void __attribute__((noinline, cold, unused))
nan_pair_lanes(size_t rows, softmax_pair_store_fn pair_store, uint32_t *pairs, const __mmask16 lanes[4]) {
    __m512 nan[4], zero[4];
    uint32_t both[64], tail[64];
    for (int v = 0; v < 4; v++) {
        nan[v] = _mm512_set1_ps(__builtin_nanf(""));
        zero[v] = _mm512_setzero_ps();
    }
    pair_store(nan, nan, both);
    pair_store(nan, zero, tail);
    for (size_t r = 0; r < rows; r += 2)
        for (int v = 0; v < 4; v++)
            _mm512_mask_storeu_epi32(pairs + (r / 2) * 64 + 16 * v, lanes[v],
                                     _mm512_loadu_si512(r + 1 < rows ? both + 16 * v : tail + 16 * v));
}

/* The lanes of `lanes` in which a column of 16 scores holds a NaN: the
 * rare search of the softmax below (out of line, so that its loop stays out
 * of the hot code). */
static __mmask16 __attribute__((noinline, cold))
nan_score_lanes(size_t rows, const float *s, size_t lds, __mmask16 lanes) {
    __mmask16 nan = 0;
    for (size_t r = 0; r < rows; r++) {
        const __m512 sv = _mm512_loadu_ps(s + r * lds);
        nan |= _mm512_mask_cmp_ps_mask(lanes, sv, sv, _CMP_UNORD_Q);
    }
    return nan;
}

/* Online-softmax step over S^T [rows][16 vecs]; contract in ukernel.h.
 * vecs is a compile-time constant; pair_store (64 lanes) needs vecs == 4.
 * NaN: the max of pass 1 keeps a NaN m (vmaxps returns its second operand,
 * the accumulator, when either is NaN) but passes over a NaN score. Such a
 * score shows after pass 2 as a NaN sum in a lane whose max is below +inf;
 * those lanes (rare) then get a NaN max and NaN P, as the scalar kernel
 * computes them. Where the max is +inf the sum is NaN anyway (inf - inf), so
 * those lanes (rare) are searched for NaN scores before pass 2. */
static inline __attribute__((always_inline)) void
softmax_tile(const int vecs, size_t rows, const float *s, size_t lds, float *m, float *l, float *alpha, int lowp,
           float *p_out, softmax_pair_store_fn pair_store, uint32_t *pairs) {
    const __m512 neg_inf = _mm512_set1_ps(-__builtin_inff());
    const __m512 pos_inf = _mm512_set1_ps(__builtin_inff());
    const __m512 nan = _mm512_set1_ps(__builtin_nanf(""));
    __m512 mx[SOFTMAX_VECS], mx2[SOFTMAX_VECS];
#pragma GCC unroll 4
    for (int v = 0; v < vecs; v++) {
        mx[v] = _mm512_loadu_ps(m + 16 * v);
        mx2[v] = neg_inf;
    }
    /* Pass 1: lane-wise max over the keys, two rows per step. */
    size_t r = 0;
    for (; r + 2 <= rows; r += 2) {
        const float *s0 = s + r * lds, *s1 = s0 + lds;
#pragma GCC unroll 4
        for (int v = 0; v < vecs; v++) {
            mx[v] = _mm512_max_ps(_mm512_loadu_ps(s0 + 16 * v), mx[v]);
            mx2[v] = _mm512_max_ps(_mm512_loadu_ps(s1 + 16 * v), mx2[v]);
        }
    }
    if (r < rows) {
#pragma GCC unroll 4
        for (int v = 0; v < vecs; v++)
            mx[v] = _mm512_max_ps(_mm512_loadu_ps(s + r * lds + 16 * v), mx[v]);
    }
    __mmask16 inf_lanes[SOFTMAX_VECS];
    unsigned any_inf = 0;
#pragma GCC unroll 4
    for (int v = 0; v < vecs; v++) {
        mx[v] = _mm512_max_ps(mx2[v], mx[v]);
        inf_lanes[v] = _mm512_cmp_ps_mask(mx[v], pos_inf, _CMP_EQ_OQ);
        any_inf |= inf_lanes[v];
    }
    if (__builtin_expect(any_inf != 0, 0)) {
        /* a +inf lane that also holds a NaN score: NaN max */
        for (int v = 0; v < vecs; v++)
            if (inf_lanes[v])
                mx[v] = _mm512_mask_mov_ps(
                    mx[v], nan_score_lanes(rows, s + 16 * v, lds, inf_lanes[v]), nan);
    }
    /* m_use: the new maximum, or 0 in lanes where it is -inf. */
    __m512 m_use[SOFTMAX_VECS], sum[SOFTMAX_VECS];
#pragma GCC unroll 4
    for (int v = 0; v < vecs; v++) {
        const __mmask16 all_masked = _mm512_cmp_ps_mask(mx[v], neg_inf, _CMP_EQ_OQ);
        m_use[v] = _mm512_mask_mov_ps(mx[v], all_masked, _mm512_setzero_ps());
        sum[v] = _mm512_setzero_ps();
    }
    /* Pass 2: P = exp(S - m_use) into p_out, and its lane-wise sum. */
    if (!pair_store) {
        for (r = 0; r < rows; r++) {
#pragma GCC unroll 4
            for (int v = 0; v < vecs; v++) {
                const __m512 x = _mm512_sub_ps(_mm512_loadu_ps(s + r * lds + 16 * v), m_use[v]);
                const __m512 p = lowp ? exp_f32_lowp(x) : exp_f32(x);
                _mm512_storeu_ps(p_out + r * lds + 16 * v, p);
                sum[v] = _mm512_add_ps(sum[v], p);
            }
        }
    } else { /* two rows a step, stored as one pair-row; the sum in row order as above */
        for (r = 0; r < rows; r += 2) {
            __m512 p0[SOFTMAX_VECS], p1[SOFTMAX_VECS];
#pragma GCC unroll 4
            for (int v = 0; v < vecs; v++) {
                const __m512 x = _mm512_sub_ps(_mm512_loadu_ps(s + r * lds + 16 * v), m_use[v]);
                p0[v] = lowp ? exp_f32_lowp(x) : exp_f32(x);
                sum[v] = _mm512_add_ps(sum[v], p0[v]);
            }
            if (r + 1 < rows) {
#pragma GCC unroll 4
                for (int v = 0; v < vecs; v++) {
                    const __m512 x = _mm512_sub_ps(_mm512_loadu_ps(s + (r + 1) * lds + 16 * v), m_use[v]);
                    p1[v] = lowp ? exp_f32_lowp(x) : exp_f32(x);
                    sum[v] = _mm512_add_ps(sum[v], p1[v]);
                }
            } else {
#pragma GCC unroll 4
                for (int v = 0; v < vecs; v++) p1[v] = _mm512_setzero_ps();
            }
            pair_store(p0, p1, pairs + (r / 2) * SOFTMAX_NR);
        }
    }
    /* A NaN sum under a max below +inf: a NaN score that pass 1 passed over. */
    __mmask16 nan_lanes[SOFTMAX_VECS];
    unsigned any_nan = 0;
#pragma GCC unroll 4
    for (int v = 0; v < vecs; v++) {
        const __mmask16 below_inf = _mm512_cmp_ps_mask(mx[v], pos_inf, _CMP_LT_OQ);
        nan_lanes[v] = _mm512_mask_cmp_ps_mask(below_inf, sum[v], sum[v], _CMP_UNORD_Q);
        any_nan |= nan_lanes[v];
    }
    if (__builtin_expect(any_nan != 0, 0)) {
        if (pair_store)
            nan_pair_lanes(rows, pair_store, pairs, nan_lanes);
        else
            for (r = 0; r < rows; r++)
                for (int v = 0; v < vecs; v++)
                    _mm512_mask_storeu_ps(p_out + r * lds + 16 * v, nan_lanes[v], nan);
        for (int v = 0; v < vecs; v++) {
            mx[v] = _mm512_mask_mov_ps(mx[v], nan_lanes[v], nan);
            m_use[v] = _mm512_mask_mov_ps(m_use[v], nan_lanes[v], nan);
        }
    }
#pragma GCC unroll 4
    for (int v = 0; v < vecs; v++) {
        const __m512 a = exp_f32(_mm512_sub_ps(_mm512_loadu_ps(m + 16 * v), m_use[v]));
        _mm512_storeu_ps(alpha + 16 * v, a);
        _mm512_storeu_ps(l + 16 * v, _mm512_fmadd_ps(_mm512_loadu_ps(l + 16 * v), a, sum[v]));
        _mm512_storeu_ps(m + 16 * v, mx[v]);
    }
}


/* The step over 64 lanes (the tables' pair-rows). */
static inline __attribute__((always_inline)) void softmax_64(size_t rows, const float *s, size_t lds, float *m,
                                                             float *l, float *alpha, int lowp, float *p_out,
                                                             softmax_pair_store_fn pair_store, uint32_t *pairs) {
    softmax_tile(SOFTMAX_VECS, rows, s, lds, m, l, alpha, lowp, p_out, pair_store, pairs);
}

#endif /* FMHA_UK_AVX512_SOFTMAX_H */
