/* sve/f32.c: the SVE float32 tile microkernels, vector-length agnostic
 * (sve.h: W = VL / 32 lanes per vector, NR = 4 W). The 6 x NR GEMM tile
 * keeps 24 accumulators in Z registers; A is read as the strides allow (a
 * column of 4 + 2 rows at once when a_rs = 1, 4 k-steps of each row at once
 * when a_cs = 1, both by LD1RQ and applied by lane, FMLA by element; else
 * one element at a time, LD1RW), B by whole vectors (LD1W, VL-scaled
 * offsets). Each accumulator sums
 * its k products from zero in order and is combined with C and ab_scale by
 * one operation at the end: the scalar specification's bits. The softmax,
 * exp(s - lse) and dS run one vector of lanes at a time over the rows; the
 * exp is neon/exp.h's algorithm, operation for operation. ACLE sizeless
 * vectors cannot be array elements, hence the named accumulators. */
#include <arm_sve.h>

#include "sve.h"

#define FMHA_INLINE static inline __attribute__((always_inline))

/* Lanes of a vector: W = VL / 32 (at most 16: fmha_sve_usable). */
FMHA_INLINE size_t sve_lanes(void) { return svcntw(); }

size_t fmha_sve_nr(void) { return 4 * sve_lanes(); }

int fmha_sve_usable(void) { return svcntw() >= 4 && svcntw() <= 16; }

/* exp(x) over the whole float range, as neon_exp_f32: x clamped to [-104,
 * 89] (FMAX/FMIN keep a NaN), n = round(x log2 e), r = x - n ln2 (two-part
 * ln2), a degree-6 polynomial, then 2^n as two exponent-built factors so
 * that n = 128 and subnormal results are exact to the final rounding. */
FMHA_INLINE svfloat32_t sve_exp_f32(svbool_t pg, svfloat32_t x) {
    x = svmin_n_f32_x(pg, svmax_n_f32_x(pg, x, -104.0f), 89.0f);
    const svfloat32_t n = svrintn_f32_x(pg, svmul_n_f32_x(pg, x, 0x1.715476p+0f));
    svfloat32_t r = svmls_n_f32_x(pg, x, n, 0x1.62e430p-1f);
    r = svmls_n_f32_x(pg, r, n, -0x1.05c610p-29f);
    svfloat32_t p = svmla_n_f32_x(pg, svdup_n_f32(0x1.126fa6p-7f), r, 0x1.6d7532p-10f);
    p = svmad_n_f32_x(pg, p, r, 0x1.5554acp-5f);
    p = svmad_n_f32_x(pg, p, r, 0x1.555404p-3f);
    p = svmad_n_f32_x(pg, p, r, 0.5f);
    p = svmad_n_f32_x(pg, p, r, 1.0f);
    p = svmad_n_f32_x(pg, p, r, 1.0f);
    const svint32_t ni = svcvt_s32_f32_x(pg, n); /* NaN converts to 0: p carries the NaN */
    const svint32_t n1 = svasr_n_s32_x(pg, ni, 1), n2 = svsub_s32_x(pg, ni, n1);
    const svfloat32_t s1 = svreinterpret_f32_s32(svlsl_n_s32_x(pg, svadd_n_s32_x(pg, n1, 127), 23));
    const svfloat32_t s2 = svreinterpret_f32_s32(svlsl_n_s32_x(pg, svadd_n_s32_x(pg, n2, 127), 23));
    return svmul_f32_x(pg, svmul_f32_x(pg, p, s1), s2);
}

/* ---------------------------------------------------------------- GEMM */

/* One finished vector of C: STORE acc s; ACCUMULATE c + acc s;
 * RESCALE c col + acc s (one rounding for each product and fma). */
FMHA_INLINE void store_c(svbool_t pg, float *cv, svfloat32_t acc, int mode, const float *col, float s) {
    if (mode == FMHA_UK_STORE) svst1_f32(pg, cv, svmul_n_f32_x(pg, acc, s));
    else if (mode == FMHA_UK_ACCUMULATE) svst1_f32(pg, cv, svmla_n_f32_x(pg, svld1_f32(pg, cv), acc, s));
    else
        svst1_f32(pg, cv, svmla_n_f32_x(pg, svmul_f32_x(pg, svld1_f32(pg, cv), svld1_f32(pg, col)), acc, s));
}

#define SVE_ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5)
#define ACC_DECL(r) svfloat32_t c##r##0 = zero, c##r##1 = zero, c##r##2 = zero, c##r##3 = zero;
/* row r += B * x (x a vector of one A element) */
#define ACC_FMA(r, x)                                                                                                \
    do {                                                                                                             \
        c##r##0 = svmla_f32_x(pg, c##r##0, b0, x);                                                                   \
        c##r##1 = svmla_f32_x(pg, c##r##1, b1, x);                                                                   \
        c##r##2 = svmla_f32_x(pg, c##r##2, b2, x);                                                                   \
        c##r##3 = svmla_f32_x(pg, c##r##3, b3, x);                                                                   \
    } while (0);
#define ROW_ELEMENT(r)                                                                                               \
    if ((r) < m) {                                                                                                   \
        const svfloat32_t x = svdup_n_f32(a[(ptrdiff_t)(r) * a_rs]);                                                 \
        ACC_FMA(r, x)                                                                                                \
    }
/* row r += B * column lane r % 4 of the quadword q (rows 0-3) or q_hi */
#define ROW_LANE(r)                                                                                                  \
    if ((r) < m) {                                                                                                   \
        const svfloat32_t q = (r) < 4 ? q_lo : q_hi;                                                                 \
        c##r##0 = svmla_lane_f32(c##r##0, b0, q, (r) % 4);                                                           \
        c##r##1 = svmla_lane_f32(c##r##1, b1, q, (r) % 4);                                                           \
        c##r##2 = svmla_lane_f32(c##r##2, b2, q, (r) % 4);                                                           \
        c##r##3 = svmla_lane_f32(c##r##3, b3, q, (r) % 4);                                                           \
    }
/* row r += B vector v * lane kk of row r's quadword of 4 k-steps */
#define ROW_QUAD(r, v, kk)                                                                                           \
    if ((r) < m) c##r##v = svmla_lane_f32(c##r##v, bv, a##r, kk);
#define ROWS_QUAD(v, kk) ROW_QUAD(0, v, kk) ROW_QUAD(1, v, kk) ROW_QUAD(2, v, kk) ROW_QUAD(3, v, kk) \
    ROW_QUAD(4, v, kk) ROW_QUAD(5, v, kk)
/* one k-step kk of 4: B row by vectors, each applied to every row */
#define KSTEP_QUAD(kk)                                                                                               \
    do {                                                                                                             \
        const float *bk = b + (kk) * ldb;                                                                            \
        svfloat32_t bv = svld1_f32(pg, bk);                                                                          \
        ROWS_QUAD(0, kk)                                                                                             \
        bv = svld1_vnum_f32(pg, bk, 1);                                                                              \
        ROWS_QUAD(1, kk)                                                                                             \
        bv = svld1_vnum_f32(pg, bk, 2);                                                                              \
        ROWS_QUAD(2, kk)                                                                                             \
        bv = svld1_vnum_f32(pg, bk, 3);                                                                              \
        ROWS_QUAD(3, kk)                                                                                             \
    } while (0)
#define ROW_STORE(r)                                                                                                 \
    if ((r) < m) {                                                                                                   \
        float *cr = c + (size_t)(r) * ldc;                                                                           \
        store_c(pg, cr, c##r##0, mode, col_scale, ab_scale);                                                         \
        store_c(pg, cr + w, c##r##1, mode, col_scale ? col_scale + w : NULL, ab_scale);                              \
        store_c(pg, cr + 2 * w, c##r##2, mode, col_scale ? col_scale + 2 * w : NULL, ab_scale);                      \
        store_c(pg, cr + 3 * w, c##r##3, mode, col_scale ? col_scale + 3 * w : NULL, ab_scale);                      \
    }

/* C[m x NR] (op)= ab_scale A[m x k] B[k x NR] with m and the A pattern
 * compile-time constants (a_columns: a_rs = 1, m > 1; a_rows: a_cs = 1, the
 * k % 4 last steps by elements). */
FMHA_INLINE void gemm_tile(const size_t m, const int a_columns, const int a_rows, size_t k, const float *a, ptrdiff_t a_rs,
                           ptrdiff_t a_cs, const float *b, size_t ldb, float *c, size_t ldc, int mode,
                           const float *col_scale, float ab_scale) {
    const size_t w = sve_lanes();
    const svbool_t pg = svptrue_b32();
    const svfloat32_t zero = svdup_n_f32(0.0f);
    SVE_ROWS(ACC_DECL)
    /* rows 0-3 and 4-5 of a column of A; never reads past row m - 1 */
    const svbool_t lo_rows = svwhilelt_b32_u64(0, m < 4 ? m : 4), hi_rows = svwhilelt_b32_u64(0, m > 4 ? m - 4 : 0);
    if (a_rows) { /* a_cs = 1: 4 k-steps of each row at once (LD1RQ), applied by lane */
        /* row r at a + r a_rs, r < m (row 0's pointer for the rows past m) */
        const float *ar0 = a, *ar1 = m > 1 ? a + a_rs : a, *ar2 = m > 2 ? a + 2 * a_rs : a;
        const float *ar3 = m > 3 ? a + 3 * a_rs : a, *ar4 = m > 4 ? a + 4 * a_rs : a, *ar5 = m > 5 ? a + 5 * a_rs : a;
        size_t p = 0;
        for (; p + 4 <= k; p += 4) {
            const svfloat32_t a0 = svld1rq_f32(pg, ar0 + p);
            const svfloat32_t a1 = m > 1 ? svld1rq_f32(pg, ar1 + p) : zero;
            const svfloat32_t a2 = m > 2 ? svld1rq_f32(pg, ar2 + p) : zero;
            const svfloat32_t a3 = m > 3 ? svld1rq_f32(pg, ar3 + p) : zero;
            const svfloat32_t a4 = m > 4 ? svld1rq_f32(pg, ar4 + p) : zero;
            const svfloat32_t a5 = m > 5 ? svld1rq_f32(pg, ar5 + p) : zero;
            KSTEP_QUAD(0);
            KSTEP_QUAD(1);
            KSTEP_QUAD(2);
            KSTEP_QUAD(3);
            b += 4 * ldb;
        }
        a += p;
        k -= p;
    }
    for (; k != 0; k--) {
        const svfloat32_t b0 = svld1_f32(pg, b), b1 = svld1_vnum_f32(pg, b, 1);
        const svfloat32_t b2 = svld1_vnum_f32(pg, b, 2), b3 = svld1_vnum_f32(pg, b, 3);
        if (a_columns) {
            const svfloat32_t q_lo = svld1rq_f32(lo_rows, a);
            const svfloat32_t q_hi = m > 4 ? svld1rq_f32(hi_rows, a + 4) : zero;
            SVE_ROWS(ROW_LANE)
        } else {
            SVE_ROWS(ROW_ELEMENT)
        }
        a += a_cs;
        b += ldb;
    }
    SVE_ROWS(ROW_STORE)
}

#define GEMM_KIND(M, COLUMNS, ROWS) \
    gemm_tile(M, COLUMNS, ROWS, k, a, a_rs, a_cs, b, ldb, c, ldc, mode, col_scale, ab_scale)
#define GEMM_CASE(M)                                                                                                 \
    case M:                                                                                                          \
        if (a_rs == 1 && (M) > 1) GEMM_KIND(M, 1, 0);                                                                \
        else if (a_cs == 1 && k >= 4) GEMM_KIND(M, 0, 1);                                                            \
        else GEMM_KIND(M, 0, 0);                                                                                     \
        break

/* C[m x NR] (op)= ab_scale A[m x k] B[k x NR], 1 <= m <= 6; contract in
 * ukernel.h. */
void fmha_f32_gemm_ukernel_6xnr__sve(size_t m, size_t k, const float *a, ptrdiff_t a_rs, ptrdiff_t a_cs,
                                     const float *b, size_t ldb, float *c, size_t ldc, int mode,
                                     const float *col_scale, float ab_scale) {
    FMHA_UK_SWITCH_ROWS_6(m, GEMM_CASE)
}

/* ------------------------------------------------------------- softmax */

void fmha_f32_exp__sve(size_t n, const float *x, float *y) {
    for (size_t i = 0; i < n; i += svcntw()) {
        const svbool_t pg = svwhilelt_b32_u64(i, n);
        svst1_f32(pg, y + i, sve_exp_f32(pg, svld1_f32(pg, x + i)));
    }
}

/* Online-softmax step over S^T [rows][NR], one vector of lanes at a time;
 * contract in ukernel.h. The max is FMAX's (NaN when either operand is),
 * two rows a step; P = exp(s - m_use) is summed in row order; a lane whose
 * max is -inf (every score masked) uses 0 for it. */
void fmha_f32_softmax_ukernel_nr__sve(size_t rows, float *s, size_t lds, float *m, float *l, float *alpha) {
    const size_t w = sve_lanes();
    const svbool_t pg = svptrue_b32();
    const float neg_inf = -__builtin_inff();
    for (size_t j = 0; j < 4 * w; j += w) {
        svfloat32_t mx = svld1_f32(pg, m + j), mx2 = svdup_n_f32(neg_inf);
        size_t r = 0;
        for (; r + 2 <= rows; r += 2) {
            mx = svmax_f32_x(pg, mx, svld1_f32(pg, s + r * lds + j));
            mx2 = svmax_f32_x(pg, mx2, svld1_f32(pg, s + (r + 1) * lds + j));
        }
        if (r < rows) mx = svmax_f32_x(pg, mx, svld1_f32(pg, s + r * lds + j));
        mx = svmax_f32_x(pg, mx, mx2);
        const svfloat32_t m_use = svsel_f32(svcmpeq_n_f32(pg, mx, neg_inf), svdup_n_f32(0.0f), mx);
        svfloat32_t sum = svdup_n_f32(0.0f);
        for (r = 0; r < rows; r++) {
            float *sv = s + r * lds + j;
            const svfloat32_t p = sve_exp_f32(pg, svsub_f32_x(pg, svld1_f32(pg, sv), m_use));
            sum = svadd_f32_x(pg, sum, p);
            svst1_f32(pg, sv, p);
        }
        const svfloat32_t a = sve_exp_f32(pg, svsub_f32_x(pg, svld1_f32(pg, m + j), m_use));
        svst1_f32(pg, alpha + j, a);
        svst1_f32(pg, l + j, svmla_f32_x(pg, sum, svld1_f32(pg, l + j), a));
        svst1_f32(pg, m + j, mx);
    }
}

/* Backward: s = exp(s - sub) lane-wise, in place; a lane whose sub is -inf
 * gives 0 whatever s is; NaN in s or sub gives NaN. */
void fmha_f32_exp_sub_ukernel_nr__sve(size_t rows, float *s, size_t lds, const float *sub) {
    const size_t w = sve_lanes();
    const svbool_t pg = svptrue_b32();
    for (size_t j = 0; j < 4 * w; j += w) {
        const svfloat32_t sub_v = svld1_f32(pg, sub + j);
        const svbool_t masked = svcmpeq_n_f32(pg, sub_v, -__builtin_inff()); /* false for a NaN sub */
        for (size_t r = 0; r < rows; r++) {
            float *sv = s + r * lds + j;
            const svfloat32_t p = sve_exp_f32(pg, svsub_f32_x(pg, svld1_f32(pg, sv), sub_v));
            svst1_f32(pg, sv, svsel_f32(masked, svdup_n_f32(0.0f), p));
        }
    }
}

/* Backward: dp = p * (dp - dsum) lane-wise, in place. */
void fmha_f32_ds_ukernel_nr__sve(size_t rows, const float *p, float *dp, size_t lds, const float *dsum) {
    const size_t w = sve_lanes();
    const svbool_t pg = svptrue_b32();
    for (size_t j = 0; j < 4 * w; j += w) {
        const svfloat32_t dsum_v = svld1_f32(pg, dsum + j);
        for (size_t r = 0; r < rows; r++) {
            float *dv = dp + r * lds + j;
            const svfloat32_t d = svsub_f32_x(pg, svld1_f32(pg, dv), dsum_v);
            svst1_f32(pg, dv, svmul_f32_x(pg, svld1_f32(pg, p + r * lds + j), d));
        }
    }
}
