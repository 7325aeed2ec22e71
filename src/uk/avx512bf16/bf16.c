/* avx512bf16/bf16.c: the AVX-512 BF16 microkernels (NR = 64 lanes = 4 zmm).
 * The 6x64 GEMM keeps 24 float32 accumulators and one pair-row of B (4 zmm)
 * in registers and broadcasts one 32-bit A pair per row and pair-step into
 * vdpbf16ps; tiles of 1-3 rows split the pair-steps over 2-3 accumulator
 * sets to cover the instruction's latency. The pair-row kernel rounds two
 * float32 rows with vcvtne2ps2bf16 and interleaves them with one vpermw;
 * the fused softmax step (avx512/softmax.h) does the same on registers.
 * Contract in ../ukernel.h; the scalar specifications are in
 * ../scalar/bf16.c. */
#include "bf16.h"

#include <immintrin.h>

#include "../avx512/softmax.h"
#include "../ukernel.h"

enum { MR = FMHA_AVX512BF16_MR, NR = FMHA_AVX512BF16_NR, VECS = NR / 16 };

#define FMHA_INLINE static inline __attribute__((always_inline))

/* acc[m][4] += A pair-step (one 32-bit word per row) x one B pair-row.
 * The empty asm keeps the B pair-row in registers: without it GCC, short
 * of registers at m = 3 with two sets, reloads B for every row and the loop
 * becomes load-bound. */
FMHA_INLINE void pair_step(const size_t m, __m512 acc[][VECS], const uint32_t *a, ptrdiff_t a_rs,
                           const uint32_t *b) {
    __m512bh brow[VECS];
#pragma GCC unroll 4
    for (int v = 0; v < VECS; v++) {
        brow[v] = (__m512bh)_mm512_loadu_si512(b + 16 * v);
        __asm__("" : "+v"(brow[v]));
    }
#pragma GCC unroll 8
    for (size_t r = 0; r < m; r++) {
        const __m512bh ar = (__m512bh)_mm512_set1_epi32((int)a[(ptrdiff_t)r * a_rs]);
#pragma GCC unroll 4
        for (int v = 0; v < VECS; v++) acc[r][v] = _mm512_dpbf16_ps(acc[r][v], ar, brow[v]);
    }
}

/* C[m x 64] (op)= ab_scale * A B with m a compile-time constant. The product
 * is summed from zero and folded into C once at the end, so C is read once
 * and ab_scale costs one fma per vector. With few rows, 4 m dependency
 * chains cannot hide the vdpbf16ps latency, so `sets` accumulator sets take
 * alternate pair-steps and are added at the end. */
FMHA_INLINE void gemm_bf16_tile(const size_t m, const size_t sets, size_t kp, const uint32_t *a,
                                ptrdiff_t a_rs, ptrdiff_t a_cs, const uint32_t *b, size_t ldb,
                                float *c, size_t ldc, int mode, const float *col_scale,
                                float ab_scale) {
    __m512 acc[3][MR][VECS];
#pragma GCC unroll 3
    for (size_t t = 0; t < sets; t++)
#pragma GCC unroll 8
        for (size_t r = 0; r < m; r++)
#pragma GCC unroll 4
            for (int v = 0; v < VECS; v++) acc[t][r][v] = _mm512_setzero_ps();

    for (; kp >= sets; kp -= sets) {
#pragma GCC unroll 3
        for (size_t t = 0; t < sets; t++) {
            pair_step(m, acc[t], a, a_rs, b);
            a += a_cs;
            b += ldb;
        }
    }
    for (; kp != 0; kp--) {
        pair_step(m, acc[0], a, a_rs, b);
        a += a_cs;
        b += ldb;
    }
#pragma GCC unroll 3
    for (size_t t = 1; t < sets; t++)
#pragma GCC unroll 8
        for (size_t r = 0; r < m; r++)
#pragma GCC unroll 4
            for (int v = 0; v < VECS; v++)
                acc[0][r][v] = _mm512_add_ps(acc[0][r][v], acc[t][r][v]);

    const __m512 s = _mm512_set1_ps(ab_scale);
    if (mode == FMHA_UK_STORE) {
#pragma GCC unroll 8
        for (size_t r = 0; r < m; r++)
#pragma GCC unroll 4
            for (int v = 0; v < VECS; v++)
                _mm512_storeu_ps(c + r * ldc + 16 * v, _mm512_mul_ps(acc[0][r][v], s));
    } else if (mode == FMHA_UK_ACCUMULATE) {
#pragma GCC unroll 8
        for (size_t r = 0; r < m; r++)
#pragma GCC unroll 4
            for (int v = 0; v < VECS; v++) {
                float *cv = c + r * ldc + 16 * v;
                _mm512_storeu_ps(cv, _mm512_fmadd_ps(acc[0][r][v], s, _mm512_loadu_ps(cv)));
            }
    } else {
        __m512 scale[VECS];
#pragma GCC unroll 4
        for (int v = 0; v < VECS; v++) scale[v] = _mm512_loadu_ps(col_scale + 16 * v);
#pragma GCC unroll 8
        for (size_t r = 0; r < m; r++)
#pragma GCC unroll 4
            for (int v = 0; v < VECS; v++) {
                float *cv = c + r * ldc + 16 * v;
                const __m512 c_scaled = _mm512_mul_ps(_mm512_loadu_ps(cv), scale[v]);
                _mm512_storeu_ps(cv, _mm512_fmadd_ps(acc[0][r][v], s, c_scaled));
            }
    }
}

#define GEMM_CASE(M, SETS)                                                                     \
    case M:                                                                                    \
        gemm_bf16_tile(M, SETS, kp, a, a_rs, a_cs, b, ldb, c, ldc, mode, col_scale, ab_scale); \
        break

/* C[m x 64] (op)= ab_scale * A B, 1 <= m <= 6; contract in ukernel.h. */
void fmha_bf16_gemm_ukernel_6x64__avx512bf16(size_t m, size_t kp, const uint32_t *a,
                                             ptrdiff_t a_rs, ptrdiff_t a_cs, const uint32_t *b,
                                             size_t ldb, float *c, size_t ldc, int mode,
                                             const float *col_scale, float ab_scale) {
    switch (m) {
        GEMM_CASE(6, 1);
        GEMM_CASE(5, 1);
        GEMM_CASE(4, 1);
        GEMM_CASE(3, 2);
        GEMM_CASE(2, 2);
        GEMM_CASE(1, 3);
    default:
        break;
    }
}

/* Word j of the result takes bf16 j / 2 of the low row (j even) or of the
 * high row (j odd); vcvtne2ps2bf16 leaves the low row in bf16 0..15 and the
 * high row in 16..31. */
static const uint16_t interleave_rows[32] __attribute__((aligned(64))) = {
    0, 16, 1, 17, 2,  18, 3,  19, 4,  20, 5,  21, 6,  22, 7,  23,
    8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};

/* dst[i] = (bf16(lo[v][i % 16]), bf16(hi[v][i % 16])), v = i / 16: two rows
 * in registers as one pair-row. The pair-row kernel below and the fused
 * softmax step's pair-store (avx512/softmax.h). */
static void store_pair_row(const __m512 lo[4], const __m512 hi[4], uint32_t *dst) {
    const __m512i idx = _mm512_load_si512(interleave_rows);
#pragma GCC unroll 4
    for (int v = 0; v < VECS; v++) {
        const __m512i both = (__m512i)_mm512_cvtne2ps_pbh(hi[v], lo[v]);
        _mm512_storeu_si512(dst + 16 * v, _mm512_permutexvar_epi16(idx, both));
    }
}

/* dst[i] = (bf16(lo[i]), bf16(hi[i])) for i < 64; contract in ukernel.h. */
void fmha_bf16_pair_rows_ukernel_64__avx512bf16(const float *lo, const float *hi, uint32_t *dst) {
    __m512 lo_v[VECS], hi_v[VECS];
#pragma GCC unroll 4
    for (int v = 0; v < VECS; v++) {
        lo_v[v] = _mm512_loadu_ps(lo + 16 * v);
        hi_v[v] = hi ? _mm512_loadu_ps(hi + 16 * v) : _mm512_setzero_ps();
    }
    store_pair_row(lo_v, hi_v, dst);
}

/* softmax_lowp_f32 then pair_rows_bf16 in one pass; contract in ukernel.h. */
void fmha_bf16_softmax_pairs_ukernel_64__avx512bf16(size_t rows, const float *s, size_t lds, float *m, float *l,
                                                    float *alpha, uint32_t *pairs) {
    softmax_64(rows, s, lds, m, l, alpha, 1, NULL, store_pair_row, pairs);
}
