/* avx512/tile.h: the AVX-512 float32 tile kernels as inline templates over
 * the tile's shape, so that one source serves every tile of the AVX-512
 * tables: f32.c instantiates today's 6 x 64 (NR = 4 zmm), f32_tall.c the
 * taller, narrower tiles of the Intel variants (12 x 32, 14 x 32). Each
 * shape argument is a compile-time constant at every use (always_inline),
 * so the loops unroll and the accumulators live in registers. Contracts in
 * ../ukernel.h; the scalar kernels are the specification, and every shape
 * gives their bits (the same operations in the same order per lane). */
#ifndef FMHA_UK_AVX512_TILE_H
#define FMHA_UK_AVX512_TILE_H

#include <immintrin.h>
#include <stddef.h>

#include "../ukernel.h"
#include "exp.h"

#define FMHA_TILE_INLINE static inline __attribute__((always_inline))

/* The largest MR and NR / 16 of any AVX-512 tile (accumulators [MR][VECS]). */
enum { TILE_MAX_MR = 14, TILE_MAX_VECS = 4 };

/* C[m x 16 vecs] (op)= ab_scale * A[m x k] B[k x 16 vecs], m, vecs and
 * prefetch compile-time constants (m <= TILE_MAX_MR, vecs <= 4). The
 * product is summed from zero and combined with C and ab_scale once at the
 * end (one fma per accumulator), so scaling costs per tile, not per
 * k-step, and C is read once. With ab_scale == 1, ACCUMULATE and RESCALE
 * start from C (or C * col_scale) instead and store the sum as it is, which
 * spares that last pass (measured: about 2% of a forward, whose P V product
 * runs RESCALE with ab_scale 1). prefetch > 0 asks for B's row `prefetch`
 * k-steps ahead (prefetcht0, one line per 16 lanes) at every k-step. */
FMHA_TILE_INLINE void gemm_f32_tile(const int vecs, const size_t m, const int prefetch, size_t k, const float *a,
                                    ptrdiff_t a_rs, ptrdiff_t a_cs, const float *b, size_t ldb, float *c,
                                    size_t ldc, int mode, const float *col_scale, float ab_scale) {
    __m512 acc[TILE_MAX_MR][TILE_MAX_VECS];
    float *c_row[TILE_MAX_MR];
#pragma GCC unroll 16
    for (size_t r = 0; r < m; r++) c_row[r] = c + r * ldc;
    const int from_c = mode != FMHA_UK_STORE && ab_scale == 1.0f;
    if (!from_c) {
#pragma GCC unroll 16
        for (size_t r = 0; r < m; r++)
#pragma GCC unroll 4
            for (int v = 0; v < vecs; v++) acc[r][v] = _mm512_setzero_ps();
    } else if (mode == FMHA_UK_ACCUMULATE) {
#pragma GCC unroll 16
        for (size_t r = 0; r < m; r++)
#pragma GCC unroll 4
            for (int v = 0; v < vecs; v++) acc[r][v] = _mm512_loadu_ps(c_row[r] + 16 * v);
    } else {
#pragma GCC unroll 16
        for (size_t r = 0; r < m; r++)
#pragma GCC unroll 4
            for (int v = 0; v < vecs; v++)
                acc[r][v] = _mm512_mul_ps(_mm512_loadu_ps(c_row[r] + 16 * v), _mm512_loadu_ps(col_scale + 16 * v));
    }

    for (; k != 0; k--) {
        __m512 brow[TILE_MAX_VECS];
#pragma GCC unroll 4
        for (int v = 0; v < vecs; v++) brow[v] = _mm512_loadu_ps(b + 16 * v);
        if (prefetch) {
#pragma GCC unroll 4
            for (int v = 0; v < vecs; v++) _mm_prefetch((const char *)(b + (size_t)prefetch * ldb + 16 * v), _MM_HINT_T0);
        }
#pragma GCC unroll 16
        for (size_t r = 0; r < m; r++) {
            const __m512 ar = _mm512_set1_ps(a[(ptrdiff_t)r * a_rs]);
#pragma GCC unroll 4
            for (int v = 0; v < vecs; v++) acc[r][v] = _mm512_fmadd_ps(ar, brow[v], acc[r][v]);
        }
        a += a_cs;
        b += ldb;
    }

    const __m512 s = _mm512_set1_ps(ab_scale);
    if (from_c) {
#pragma GCC unroll 16
        for (size_t r = 0; r < m; r++)
#pragma GCC unroll 4
            for (int v = 0; v < vecs; v++) _mm512_storeu_ps(c_row[r] + 16 * v, acc[r][v]);
    } else if (mode == FMHA_UK_STORE) {
#pragma GCC unroll 16
        for (size_t r = 0; r < m; r++)
#pragma GCC unroll 4
            for (int v = 0; v < vecs; v++) _mm512_storeu_ps(c_row[r] + 16 * v, _mm512_mul_ps(acc[r][v], s));
    } else if (mode == FMHA_UK_ACCUMULATE) {
#pragma GCC unroll 16
        for (size_t r = 0; r < m; r++)
#pragma GCC unroll 4
            for (int v = 0; v < vecs; v++) {
                float *cv = c_row[r] + 16 * v;
                _mm512_storeu_ps(cv, _mm512_fmadd_ps(acc[r][v], s, _mm512_loadu_ps(cv)));
            }
    } else {
        __m512 scale[TILE_MAX_VECS];
#pragma GCC unroll 4
        for (int v = 0; v < vecs; v++) scale[v] = _mm512_loadu_ps(col_scale + 16 * v);
#pragma GCC unroll 16
        for (size_t r = 0; r < m; r++)
#pragma GCC unroll 4
            for (int v = 0; v < vecs; v++) {
                float *cv = c_row[r] + 16 * v;
                const __m512 c_scaled = _mm512_mul_ps(_mm512_loadu_ps(cv), scale[v]);
                _mm512_storeu_ps(cv, _mm512_fmadd_ps(acc[r][v], s, c_scaled));
            }
    }
}

/* A GEMM microkernel (fmha_f32_gemm_ukernel_fn) of MR x 16 VECS: the
 * switch on m makes each row count its own unrolled tile. */
#define TILE_GEMM_CASE(M, VECS, PF)                                                                                    \
    case M:                                                                                                            \
        gemm_f32_tile(VECS, M, PF, k, a, a_rs, a_cs, b, ldb, c, ldc, mode, col_scale, ab_scale);                       \
        break
#define TILE_GEMM_CASES_6(VECS, PF)                                                                                    \
    TILE_GEMM_CASE(6, VECS, PF);                                                                                       \
    TILE_GEMM_CASE(5, VECS, PF);                                                                                       \
    TILE_GEMM_CASE(4, VECS, PF);                                                                                       \
    TILE_GEMM_CASE(3, VECS, PF);                                                                                       \
    TILE_GEMM_CASE(2, VECS, PF);                                                                                       \
    TILE_GEMM_CASE(1, VECS, PF)
#define TILE_GEMM_CASES_12(VECS, PF)                                                                                   \
    TILE_GEMM_CASE(12, VECS, PF);                                                                                      \
    TILE_GEMM_CASE(11, VECS, PF);                                                                                      \
    TILE_GEMM_CASE(10, VECS, PF);                                                                                      \
    TILE_GEMM_CASE(9, VECS, PF);                                                                                       \
    TILE_GEMM_CASE(8, VECS, PF);                                                                                       \
    TILE_GEMM_CASE(7, VECS, PF);                                                                                       \
    TILE_GEMM_CASES_6(VECS, PF)
#define TILE_GEMM_CASES_14(VECS, PF)                                                                                   \
    TILE_GEMM_CASE(14, VECS, PF);                                                                                      \
    TILE_GEMM_CASE(13, VECS, PF);                                                                                      \
    TILE_GEMM_CASES_12(VECS, PF)
#define TILE_GEMM_FN(NAME, MR, VECS, PF)                                                                               \
    void NAME(size_t m, size_t k, const float *a, ptrdiff_t a_rs, ptrdiff_t a_cs, const float *b, size_t ldb,         \
              float *c, size_t ldc, int mode, const float *col_scale, float ab_scale) {                                \
        switch (m) {                                                                                                   \
            TILE_GEMM_CASES_##MR(VECS, PF);                                                                            \
        default:                                                                                                       \
            break;                                                                                                     \
        }                                                                                                              \
    }

/* Backward: s = exp(s - sub) lane-wise, in place, over 16 vecs lanes;
 * contract in ukernel.h. A lane whose sub is -inf gives 0 (zero-masked in
 * the exp), whatever s is; NaN in s or sub gives NaN. lowp: exp_f32_lowp. */
FMHA_TILE_INLINE void exp_sub_tile(const int vecs, size_t rows, float *s, size_t lds, const float *sub, int lowp) {
    const __m512 x_max = _mm512_set1_ps(89.0f);
    __m512 sub_v[TILE_MAX_VECS];
    __mmask16 keep[TILE_MAX_VECS];
#pragma GCC unroll 4
    for (int v = 0; v < vecs; v++) {
        sub_v[v] = _mm512_loadu_ps(sub + 16 * v);
        keep[v] = _mm512_cmp_ps_mask(sub_v[v], _mm512_set1_ps(-__builtin_inff()), _CMP_NEQ_UQ);
    }
    for (size_t r = 0; r < rows; r++) {
        float *srow = s + r * lds;
#pragma GCC unroll 4
        for (int v = 0; v < vecs; v++) {
            const __m512 x = _mm512_min_ps(x_max, _mm512_sub_ps(_mm512_loadu_ps(srow + 16 * v), sub_v[v]));
            _mm512_storeu_ps(srow + 16 * v, lowp ? exp_f32_lowp_keep(keep[v], x) : exp_f32_keep(keep[v], x));
        }
    }
}

/* Backward: dp = p * (dp - dsum) lane-wise over 16 vecs lanes, in place;
 * contract in ukernel.h. */
FMHA_TILE_INLINE void ds_tile(const int vecs, size_t rows, const float *p, float *dp, size_t lds, const float *dsum) {
    __m512 dsum_v[TILE_MAX_VECS];
#pragma GCC unroll 4
    for (int v = 0; v < vecs; v++) dsum_v[v] = _mm512_loadu_ps(dsum + 16 * v);
    for (size_t r = 0; r < rows; r++) {
        const float *prow = p + r * lds;
        float *dprow = dp + r * lds;
#pragma GCC unroll 4
        for (int v = 0; v < vecs; v++) {
            const __m512 d = _mm512_sub_ps(_mm512_loadu_ps(dprow + 16 * v), dsum_v[v]);
            _mm512_storeu_ps(dprow + 16 * v, _mm512_mul_ps(_mm512_loadu_ps(prow + 16 * v), d));
        }
    }
}

#endif /* FMHA_UK_AVX512_TILE_H */
