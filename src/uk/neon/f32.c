/* neon/f32.c: the NEON float32 tile microkernels (NR = 16 lanes = 4 q
 * registers). A 6x16 GEMM tile keeps 24 accumulators and 4 B rows of the 32
 * vector registers; A is read as the strides allow (a column of 4 + 2 rows
 * at once when a_rs = 1, a row of 4 k-steps at once when a_cs = 1, one
 * element per row and k-step otherwise) and applied by lane (FMLA by
 * element). The online softmax (its pieces in softmax.h) and the
 * backward's exp(s - lse) run the vector exp of exp.h; dS = P (dP - Dsum)
 * is plain lane-wise. Contract in ../ukernel.h; the scalar kernels are the
 * specification. */
#include <arm_neon.h>
#include <stddef.h>

#include "exp.h"
#include "neon.h"
#include "softmax.h"

enum { NEON_MR = FMHA_NEON_MR, NEON_NR = FMHA_NEON_NR, NEON_VECS = NEON_NR / 4 };

#define FMHA_INLINE static inline __attribute__((always_inline))

/* How the GEMM reads A: one element at a time, a column of rows at once
 * (a_rs = 1), or a row of 4 k-steps at once (a_cs = 1). */
enum { A_ELEMENTS, A_COLUMNS, A_ROWS };

/* acc + b * a[lane], lane a constant once unrolled (FMLA by element). */
FMHA_INLINE float32x4_t fma_lane(float32x4_t acc, float32x4_t b, float32x4_t a, const int lane) {
    return vfmaq_f32(acc, b, vdupq_n_f32(a[lane]));
}

/* Rows [0, m) of one column of A (element r at a[r]) as lanes: rows 0-3 in
 * col[0], rows 4-5 in col[1]; never reads past row m - 1. */
FMHA_INLINE void load_column(const size_t m, const float *a, float32x4_t col[2]) {
    if (m >= 4) col[0] = vld1q_f32(a);
    else if (m == 3) col[0] = vcombine_f32(vld1_f32(a), vld1_dup_f32(a + 2));
    else if (m == 2) col[0] = vcombine_f32(vld1_f32(a), vdup_n_f32(0.0f));
    else col[0] = vld1q_dup_f32(a);
    if (m == 6) col[1] = vcombine_f32(vld1_f32(a + 4), vdup_n_f32(0.0f));
    else if (m == 5) col[1] = vld1q_dup_f32(a + 4);
}

/* C[m x 16] (op)= ab_scale * A[m x k] B[k x 16] with m and the A pattern
 * compile-time constants. Each accumulator sums its k products from zero in
 * order (the scalar kernel's fmaf chain) and is combined with C and ab_scale
 * once at the end. With ab_scale == 1, ACCUMULATE and RESCALE start from C
 * (or C * col_scale) instead and store the sum as it is. */
FMHA_INLINE void gemm_f32_tile(const size_t m, const int a_kind, size_t k, const float *a, ptrdiff_t a_rs,
                               ptrdiff_t a_cs, const float *b, size_t ldb, float *c, size_t ldc, int mode,
                               const float *col_scale, float ab_scale) {
    float32x4_t acc[NEON_MR][NEON_VECS];
    float *c_row[NEON_MR];
#pragma GCC unroll 8
    for (size_t r = 0; r < m; r++) c_row[r] = c + r * ldc;
    const int from_c = mode != FMHA_UK_STORE && ab_scale == 1.0f;
    if (!from_c) {
#pragma GCC unroll 8
        for (size_t r = 0; r < m; r++)
#pragma GCC unroll 4
            for (int v = 0; v < NEON_VECS; v++) acc[r][v] = vdupq_n_f32(0.0f);
    } else if (mode == FMHA_UK_ACCUMULATE) {
#pragma GCC unroll 8
        for (size_t r = 0; r < m; r++)
#pragma GCC unroll 4
            for (int v = 0; v < NEON_VECS; v++) acc[r][v] = vld1q_f32(c_row[r] + 4 * v);
    } else {
#pragma GCC unroll 8
        for (size_t r = 0; r < m; r++)
#pragma GCC unroll 4
            for (int v = 0; v < NEON_VECS; v++)
                acc[r][v] = vmulq_f32(vld1q_f32(c_row[r] + 4 * v), vld1q_f32(col_scale + 4 * v));
    }

    float32x4_t brow[NEON_VECS];
    if (a_kind == A_COLUMNS) {
        for (; k != 0; k--) {
            float32x4_t col[2] = {vdupq_n_f32(0.0f), vdupq_n_f32(0.0f)};
            load_column(m, a, col);
#pragma GCC unroll 4
            for (int v = 0; v < NEON_VECS; v++) brow[v] = vld1q_f32(b + 4 * v);
#pragma GCC unroll 8
            for (size_t r = 0; r < m; r++)
#pragma GCC unroll 4
                for (int v = 0; v < NEON_VECS; v++)
                    acc[r][v] = fma_lane(acc[r][v], brow[v], col[r / 4], (int)(r % 4));
            a += a_cs;
            b += ldb;
        }
    }
    if (a_kind == A_ROWS) {
        for (; k >= 4; k -= 4) {
            float32x4_t arow[NEON_MR];
#pragma GCC unroll 8
            for (size_t r = 0; r < m; r++) arow[r] = vld1q_f32(a + (ptrdiff_t)r * a_rs);
#pragma GCC unroll 4
            for (int kk = 0; kk < 4; kk++) {
#pragma GCC unroll 4
                for (int v = 0; v < NEON_VECS; v++) brow[v] = vld1q_f32(b + (size_t)kk * ldb + 4 * v);
#pragma GCC unroll 8
                for (size_t r = 0; r < m; r++)
#pragma GCC unroll 4
                    for (int v = 0; v < NEON_VECS; v++)
                        acc[r][v] = fma_lane(acc[r][v], brow[v], arow[r], kk);
            }
            a += 4;
            b += 4 * ldb;
        }
    }
    /* one element of A per row and k-step (and the k % 4 of A_ROWS) */
    for (; k != 0; k--) {
#pragma GCC unroll 4
        for (int v = 0; v < NEON_VECS; v++) brow[v] = vld1q_f32(b + 4 * v);
#pragma GCC unroll 8
        for (size_t r = 0; r < m; r++) {
            const float32x4_t ar = vld1q_dup_f32(a + (ptrdiff_t)r * a_rs);
#pragma GCC unroll 4
            for (int v = 0; v < NEON_VECS; v++) acc[r][v] = vfmaq_f32(acc[r][v], brow[v], ar);
        }
        a += a_cs;
        b += ldb;
    }

    const float32x4_t s = vdupq_n_f32(ab_scale);
    if (from_c) {
#pragma GCC unroll 8
        for (size_t r = 0; r < m; r++)
#pragma GCC unroll 4
            for (int v = 0; v < NEON_VECS; v++) vst1q_f32(c_row[r] + 4 * v, acc[r][v]);
    } else if (mode == FMHA_UK_STORE) {
#pragma GCC unroll 8
        for (size_t r = 0; r < m; r++)
#pragma GCC unroll 4
            for (int v = 0; v < NEON_VECS; v++) vst1q_f32(c_row[r] + 4 * v, vmulq_f32(acc[r][v], s));
    } else if (mode == FMHA_UK_ACCUMULATE) {
#pragma GCC unroll 8
        for (size_t r = 0; r < m; r++)
#pragma GCC unroll 4
            for (int v = 0; v < NEON_VECS; v++) {
                float *cv = c_row[r] + 4 * v;
                vst1q_f32(cv, vfmaq_f32(vld1q_f32(cv), acc[r][v], s));
            }
    } else {
#pragma GCC unroll 8
        for (size_t r = 0; r < m; r++)
#pragma GCC unroll 4
            for (int v = 0; v < NEON_VECS; v++) {
                float *cv = c_row[r] + 4 * v;
                const float32x4_t c_scaled = vmulq_f32(vld1q_f32(cv), vld1q_f32(col_scale + 4 * v));
                vst1q_f32(cv, vfmaq_f32(c_scaled, acc[r][v], s));
            }
    }
}

#define GEMM_KIND(M, KIND) gemm_f32_tile(M, KIND, k, a, a_rs, a_cs, b, ldb, c, ldc, mode, col_scale, ab_scale)
#define GEMM_CASE(M)                                                                           \
    case M:                                                                                    \
        if (a_rs == 1 && (M) > 1) GEMM_KIND(M, A_COLUMNS);                                     \
        else if (a_cs == 1 && k >= 4) GEMM_KIND(M, A_ROWS);                                    \
        else GEMM_KIND(M, A_ELEMENTS);                                                         \
        break

/* Six rows read by rows of A would need 24 accumulators + 6 A rows + 4 B
 * rows, two registers more than there are: two tiles of three rows (B read
 * twice from L1) spill nothing. */
#define GEMM_ROWS_SPLIT_6                                                                      \
    do {                                                                                       \
        gemm_f32_tile(3, A_ROWS, k, a, a_rs, a_cs, b, ldb, c, ldc, mode, col_scale, ab_scale);\
        gemm_f32_tile(3, A_ROWS, k, a + 3 * a_rs, a_rs, a_cs, b, ldb, c + 3 * ldc, ldc, mode,  \
                      col_scale, ab_scale);                                                    \
    } while (0)

/* C[m x 16] (op)= ab_scale * A[m x k] B[k x 16], 1 <= m <= MR; contract in
 * ukernel.h. */
void fmha_f32_gemm_ukernel_6x16__neon(size_t m, size_t k, const float *a, ptrdiff_t a_rs, ptrdiff_t a_cs,
                                      const float *b, size_t ldb, float *c, size_t ldc, int mode,
                                      const float *col_scale, float ab_scale) {
    switch (m) {
    case 6:
        if (a_rs == 1) GEMM_KIND(6, A_COLUMNS);
        else if (a_cs == 1 && k >= 4) GEMM_ROWS_SPLIT_6;
        else GEMM_KIND(6, A_ELEMENTS);
        break;
        GEMM_CASE(5);
        GEMM_CASE(4);
        GEMM_CASE(3);
        GEMM_CASE(2);
        GEMM_CASE(1);
    default:
        break;
    }
}

/* y[i] = exp(x[i]) over any n: the exp of these kernels, for the tests
 * and the decode softmax. */
void fmha_f32_exp__neon(size_t n, const float *x, float *y) {
    size_t i = 0;
    for (; i + 4 <= n; i += 4) vst1q_f32(y + i, neon_exp_f32(vld1q_f32(x + i)));
    if (i < n) {
        float t[4] = {0};
        for (size_t j = 0; j < n - i; j++) t[j] = x[i + j];
        vst1q_f32(t, neon_exp_f32(vld1q_f32(t)));
        for (size_t j = 0; j < n - i; j++) y[i + j] = t[j];
    }
}

/* Online-softmax step over S^T [rows][16]; contract in ukernel.h. The
 * pieces are softmax.h's: the lane-wise max (NaN-propagating), P = exp(S -
 * m_use) in place with its lane-wise sum in row order, the running state. */
void fmha_f32_softmax_ukernel_16__neon(size_t rows, float *s, size_t lds, float *m, float *l, float *alpha) {
    float32x4_t mx[NEON_VECS], m_use[NEON_VECS], sum[NEON_VECS], p[NEON_VECS];
    neon_softmax_max(rows, s, lds, m, mx, m_use, sum);
    for (size_t r = 0; r < rows; r++) {
        float *srow = s + r * lds;
        neon_softmax_row(srow, m_use, sum, p);
#pragma GCC unroll 4
        for (int v = 0; v < NEON_VECS; v++) vst1q_f32(srow + 4 * v, p[v]);
    }
    neon_softmax_update(m, l, alpha, mx, m_use, sum);
}

/* Backward: s = exp(s - sub) lane-wise, in place; contract in ukernel.h.
 * A lane whose sub is -inf gives 0 whatever s is; NaN in s or sub gives
 * NaN (the comparison with -inf is false for a NaN sub). */
void fmha_f32_exp_sub_ukernel_16__neon(size_t rows, float *s, size_t lds, const float *sub) {
    float32x4_t sub_v[NEON_VECS];
    uint32x4_t masked[NEON_VECS];
#pragma GCC unroll 4
    for (int v = 0; v < NEON_VECS; v++) {
        sub_v[v] = vld1q_f32(sub + 4 * v);
        masked[v] = vceqq_f32(sub_v[v], vdupq_n_f32(-__builtin_inff()));
    }
    for (size_t r = 0; r < rows; r++) {
        float *srow = s + r * lds;
#pragma GCC unroll 4
        for (int v = 0; v < NEON_VECS; v++) {
            const float32x4_t p = neon_exp_f32(vsubq_f32(vld1q_f32(srow + 4 * v), sub_v[v]));
            vst1q_f32(srow + 4 * v, vreinterpretq_f32_u32(vbicq_u32(vreinterpretq_u32_f32(p), masked[v])));
        }
    }
}

/* Backward: dp = p * (dp - dsum) lane-wise, in place; contract in ukernel.h. */
void fmha_f32_ds_ukernel_16__neon(size_t rows, const float *p, float *dp, size_t lds, const float *dsum) {
    float32x4_t dsum_v[NEON_VECS];
#pragma GCC unroll 4
    for (int v = 0; v < NEON_VECS; v++) dsum_v[v] = vld1q_f32(dsum + 4 * v);
    for (size_t r = 0; r < rows; r++) {
        const float *prow = p + r * lds;
        float *dprow = dp + r * lds;
#pragma GCC unroll 4
        for (int v = 0; v < NEON_VECS; v++) {
            const float32x4_t d = vsubq_f32(vld1q_f32(dprow + 4 * v), dsum_v[v]);
            vst1q_f32(dprow + 4 * v, vmulq_f32(vld1q_f32(prow + 4 * v), d));
        }
    }
}
