/* avx2/f32.c: the AVX2+FMA float32 microkernels (NR = 16 lanes = 2 ymm).
 * A 6x16 GEMM tile keeps 12 accumulators, 2 B rows and one broadcast of A in
 * the 16 ymm registers; the online softmax and the backward's exp(s - lse)
 * run a vectorised exp (Cody-Waite reduction, degree-6 polynomial, 2^n built
 * in the exponent bits); dS = P (dP - Dsum) is plain lane-wise. Contract in
 * ../ukernel.h; the scalar kernels are the specification. */
#include <immintrin.h>
#include <stddef.h>

#include "../ukernel.h"
#include "decode.h"
#include "parts.h"

/* MR = 6: 12 accumulators + 2 B rows + 1 broadcast of the 16 ymm. Measured
 * on Zen 5: 6x16 runs at 91-98% of the 256-bit FMA peak, 4x16 at 88-91%. */
enum { AVX2_MR = 6, AVX2_NR = 16, AVX2_VECS = AVX2_NR / 8 };

#define FMHA_INLINE static inline __attribute__((always_inline))

/* C[m x 16] (op)= ab_scale * A[m x k] B[k x 16] with m a compile-time
 * constant. The product is summed from zero and combined with C and ab_scale
 * once at the end (one fma per accumulator), so scaling costs per tile, not
 * per k-step, and C is read once. With ab_scale == 1, ACCUMULATE and
 * RESCALE start from C (or C * col_scale) instead and store the sum as it
 * is, which spares that last pass (measured: about 2% of a forward, whose
 * P V product runs RESCALE with ab_scale 1). */
FMHA_INLINE void gemm_f32_tile(const size_t m, size_t k, const float *a, ptrdiff_t a_rs,
                               ptrdiff_t a_cs, const float *b, size_t ldb, float *c, size_t ldc,
                               int mode, const float *col_scale, float ab_scale) {
    __m256 acc[AVX2_MR][AVX2_VECS];
    float *c_row[AVX2_MR];
#pragma GCC unroll 8
    for (size_t r = 0; r < m; r++) c_row[r] = c + r * ldc;
    const int from_c = mode != FMHA_UK_STORE && ab_scale == 1.0f;
    if (!from_c) {
#pragma GCC unroll 8
        for (size_t r = 0; r < m; r++)
#pragma GCC unroll 2
            for (int v = 0; v < AVX2_VECS; v++) acc[r][v] = _mm256_setzero_ps();
    } else if (mode == FMHA_UK_ACCUMULATE) {
#pragma GCC unroll 8
        for (size_t r = 0; r < m; r++)
#pragma GCC unroll 2
            for (int v = 0; v < AVX2_VECS; v++) acc[r][v] = _mm256_loadu_ps(c_row[r] + 8 * v);
    } else {
#pragma GCC unroll 8
        for (size_t r = 0; r < m; r++)
#pragma GCC unroll 2
            for (int v = 0; v < AVX2_VECS; v++)
                acc[r][v] = _mm256_mul_ps(_mm256_loadu_ps(c_row[r] + 8 * v),
                                          _mm256_loadu_ps(col_scale + 8 * v));
    }

    for (; k != 0; k--) {
        __m256 brow[AVX2_VECS];
#pragma GCC unroll 2
        for (int v = 0; v < AVX2_VECS; v++) brow[v] = _mm256_loadu_ps(b + 8 * v);
#pragma GCC unroll 8
        for (size_t r = 0; r < m; r++) {
            const __m256 ar = _mm256_broadcast_ss(a + (ptrdiff_t)r * a_rs);
#pragma GCC unroll 2
            for (int v = 0; v < AVX2_VECS; v++)
                acc[r][v] = _mm256_fmadd_ps(ar, brow[v], acc[r][v]);
        }
        a += a_cs;
        b += ldb;
    }

    const __m256 s = _mm256_set1_ps(ab_scale);
    if (from_c) {
#pragma GCC unroll 8
        for (size_t r = 0; r < m; r++)
#pragma GCC unroll 2
            for (int v = 0; v < AVX2_VECS; v++) _mm256_storeu_ps(c_row[r] + 8 * v, acc[r][v]);
    } else if (mode == FMHA_UK_STORE) {
#pragma GCC unroll 8
        for (size_t r = 0; r < m; r++)
#pragma GCC unroll 2
            for (int v = 0; v < AVX2_VECS; v++)
                _mm256_storeu_ps(c_row[r] + 8 * v, _mm256_mul_ps(acc[r][v], s));
    } else if (mode == FMHA_UK_ACCUMULATE) {
#pragma GCC unroll 8
        for (size_t r = 0; r < m; r++)
#pragma GCC unroll 2
            for (int v = 0; v < AVX2_VECS; v++) {
                float *cv = c_row[r] + 8 * v;
                _mm256_storeu_ps(cv, _mm256_fmadd_ps(acc[r][v], s, _mm256_loadu_ps(cv)));
            }
    } else {
#pragma GCC unroll 8
        for (size_t r = 0; r < m; r++)
#pragma GCC unroll 2
            for (int v = 0; v < AVX2_VECS; v++) {
                float *cv = c_row[r] + 8 * v;
                const __m256 c_scaled =
                    _mm256_mul_ps(_mm256_loadu_ps(cv), _mm256_loadu_ps(col_scale + 8 * v));
                _mm256_storeu_ps(cv, _mm256_fmadd_ps(acc[r][v], s, c_scaled));
            }
    }
}

#define GEMM_CASE(M)                                                                           \
    case M:                                                                                    \
        gemm_f32_tile(M, k, a, a_rs, a_cs, b, ldb, c, ldc, mode, col_scale, ab_scale);         \
        break

/* C[m x 16] (op)= ab_scale * A[m x k] B[k x 16], 1 <= m <= MR; contract in
 * ukernel.h. */
static void fmha_f32_gemm_ukernel_6x16__avx2(size_t m, size_t k, const float *a, ptrdiff_t a_rs,
                                             ptrdiff_t a_cs, const float *b, size_t ldb,
                                             float *c, size_t ldc, int mode,
                                             const float *col_scale, float ab_scale) {
    FMHA_UK_SWITCH_ROWS_6(m, GEMM_CASE)
}

/* exp(x) = 2^n exp(r), n = round(x log2 e), r = x - n ln2 (two-part ln2),
 * exp(r) by a degree-6 polynomial (Chebyshev fit on [-ln2/2, ln2/2], max
 * relative error 0.2 ulp before rounding).
 * exp_f32(x), for x <= 88.37: x is clamped below at -88, where n = -127 and
 * the biased exponent n + 127 is 0, so the result is exactly 0 from about
 * -87.7 down (results in (-87.7, -87.3) are subnormal); -inf gives 0. The
 * rounding fma against 1.5 * 2^23 + 127 leaves n + 127 in the low mantissa
 * bits, which a shift moves into the exponent field.
 * NaN gives NaN in both exps: the clamps take the constant as the first
 * operand, and vmaxps / vminps return the second one when either is NaN;
 * the polynomial then carries the NaN into the product. */
FMHA_INLINE __m256 exp_poly(__m256 r) {
    __m256 p = _mm256_set1_ps(0x1.6d7532p-10f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0x1.126fa6p-7f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0x1.5554acp-5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0x1.555404p-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    return _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
}

FMHA_INLINE __m256 exp_reduce(__m256 x, __m256 n) {
    const __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0x1.62e430p-1f), x);
    return _mm256_fnmadd_ps(n, _mm256_set1_ps(-0x1.05c610p-29f), r);
}

FMHA_INLINE __m256 exp_f32(__m256 x) {
    const __m256 round_bias = _mm256_set1_ps(0x1.8p23f + 127.0f);
    x = _mm256_max_ps(_mm256_set1_ps(-88.0f), x);
    const __m256 t = _mm256_fmadd_ps(x, _mm256_set1_ps(0x1.715476p+0f), round_bias);
    const __m256 n = _mm256_sub_ps(t, round_bias);
    const __m256 pow2n = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_castps_si256(t), 23));
    return _mm256_mul_ps(exp_poly(exp_reduce(x, n)), pow2n);
}

/* exp over the whole float range (for arguments of either sign): x clamped
 * to [-104, 89] and 2^n applied as two factors, so that n = 128 and
 * subnormal results are exact to the final rounding. */
FMHA_INLINE __m256 exp_f32_full(__m256 x) {
    x = _mm256_min_ps(_mm256_set1_ps(89.0f), _mm256_max_ps(_mm256_set1_ps(-104.0f), x));
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(0x1.715476p+0f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m256i ni = _mm256_cvtps_epi32(n);
    const __m256i n1 = _mm256_srai_epi32(ni, 1), n2 = _mm256_sub_epi32(ni, n1);
    const __m256i bias = _mm256_set1_epi32(127);
    const __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, bias), 23));
    const __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, bias), 23));
    return _mm256_mul_ps(_mm256_mul_ps(exp_poly(exp_reduce(x, n)), s1), s2);
}

/* y[i] = exp(x[i]) over any n (exp_f32_full); the test checks the exp
 * of this file through it. */
void fmha_f32_exp__avx2(size_t n, const float *x, float *y) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, exp_f32_full(_mm256_loadu_ps(x + i)));
    if (i < n) {
        float xt[8] = {0}, yt[8];
        for (size_t j = 0; j < n - i; j++) xt[j] = x[i + j];
        _mm256_storeu_ps(yt, exp_f32_full(_mm256_loadu_ps(xt)));
        for (size_t j = 0; j < n - i; j++) y[i + j] = yt[j];
    }
}

/* A mask of the lanes of `lanes` in which a column of 8 scores holds a
 * NaN: the rare search of the softmax below (out of line, so that its loop
 * stays out of the hot code). */
static __m256 __attribute__((noinline, cold))
nan_score_lanes(size_t rows, const float *s, size_t lds, __m256 lanes) {
    __m256 nan = _mm256_setzero_ps();
    for (size_t r = 0; r < rows; r++) {
        const __m256 sv = _mm256_loadu_ps(s + r * lds);
        nan = _mm256_or_ps(nan, _mm256_cmp_ps(sv, sv, _CMP_UNORD_Q));
    }
    return _mm256_and_ps(nan, lanes);
}

/* Online-softmax step over S^T [rows][16]; contract in ukernel.h.
 * NaN: the max of pass 1 keeps a NaN m (vmaxps returns its second operand,
 * the accumulator, when either is NaN) but passes over a NaN score. Such a
 * score shows after pass 2 as a NaN sum in a lane whose max is below +inf;
 * those lanes (rare) then get a NaN max and NaN P, as the scalar kernel
 * computes them. Where the max is +inf the sum is NaN anyway (inf - inf), so
 * those lanes (rare) are searched for NaN scores before pass 2. */
static void fmha_f32_softmax_ukernel_16__avx2(size_t rows, float *s, size_t lds, float *m,
                                              float *l, float *alpha) {
    const __m256 neg_inf = _mm256_set1_ps(-__builtin_inff());
    const __m256 pos_inf = _mm256_set1_ps(__builtin_inff());
    const __m256 nan = _mm256_set1_ps(__builtin_nanf(""));
    __m256 mx[AVX2_VECS], mx2[AVX2_VECS];
#pragma GCC unroll 2
    for (int v = 0; v < AVX2_VECS; v++) {
        mx[v] = _mm256_loadu_ps(m + 8 * v);
        mx2[v] = neg_inf;
    }
    /* Pass 1: lane-wise max over the keys, two rows per step. */
    size_t r = 0;
    for (; r + 2 <= rows; r += 2) {
        const float *s0 = s + r * lds, *s1 = s0 + lds;
#pragma GCC unroll 2
        for (int v = 0; v < AVX2_VECS; v++) {
            mx[v] = _mm256_max_ps(_mm256_loadu_ps(s0 + 8 * v), mx[v]);
            mx2[v] = _mm256_max_ps(_mm256_loadu_ps(s1 + 8 * v), mx2[v]);
        }
    }
    if (r < rows) {
#pragma GCC unroll 2
        for (int v = 0; v < AVX2_VECS; v++)
            mx[v] = _mm256_max_ps(_mm256_loadu_ps(s + r * lds + 8 * v), mx[v]);
    }
    __m256 inf_lanes[AVX2_VECS];
    int any_inf = 0;
#pragma GCC unroll 2
    for (int v = 0; v < AVX2_VECS; v++) {
        mx[v] = _mm256_max_ps(mx2[v], mx[v]);
        inf_lanes[v] = _mm256_cmp_ps(mx[v], pos_inf, _CMP_EQ_OQ);
        any_inf |= _mm256_movemask_ps(inf_lanes[v]);
    }
    if (__builtin_expect(any_inf != 0, 0)) {
        /* a +inf lane that also holds a NaN score: NaN max */
        for (int v = 0; v < AVX2_VECS; v++)
            if (_mm256_movemask_ps(inf_lanes[v]))
                mx[v] = _mm256_blendv_ps(mx[v], nan,
                                         nan_score_lanes(rows, s + 8 * v, lds, inf_lanes[v]));
    }
    /* m_use: the new maximum, or 0 in lanes where it is -inf. */
    __m256 m_use[AVX2_VECS], sum[AVX2_VECS];
#pragma GCC unroll 2
    for (int v = 0; v < AVX2_VECS; v++) {
        const __m256 all_masked = _mm256_cmp_ps(mx[v], neg_inf, _CMP_EQ_OQ);
        m_use[v] = _mm256_andnot_ps(all_masked, mx[v]);
        sum[v] = _mm256_setzero_ps();
    }
    /* Pass 2: P = exp(S - m_use) in place, and its lane-wise sum. */
    for (r = 0; r < rows; r++) {
        float *srow = s + r * lds;
#pragma GCC unroll 2
        for (int v = 0; v < AVX2_VECS; v++) {
            const __m256 p = exp_f32(_mm256_sub_ps(_mm256_loadu_ps(srow + 8 * v), m_use[v]));
            _mm256_storeu_ps(srow + 8 * v, p);
            sum[v] = _mm256_add_ps(sum[v], p);
        }
    }
    /* A NaN sum under a max below +inf: a NaN score that pass 1 passed over. */
    __m256 nan_lanes[AVX2_VECS];
    int any_nan = 0;
#pragma GCC unroll 2
    for (int v = 0; v < AVX2_VECS; v++) {
        nan_lanes[v] = _mm256_and_ps(_mm256_cmp_ps(mx[v], pos_inf, _CMP_LT_OQ),
                                     _mm256_cmp_ps(sum[v], sum[v], _CMP_UNORD_Q));
        any_nan |= _mm256_movemask_ps(nan_lanes[v]);
    }
    if (__builtin_expect(any_nan != 0, 0)) {
        for (r = 0; r < rows; r++)
            for (int v = 0; v < AVX2_VECS; v++)
                _mm256_maskstore_ps(s + r * lds + 8 * v, _mm256_castps_si256(nan_lanes[v]), nan);
        for (int v = 0; v < AVX2_VECS; v++) {
            mx[v] = _mm256_blendv_ps(mx[v], nan, nan_lanes[v]);
            m_use[v] = _mm256_blendv_ps(m_use[v], nan, nan_lanes[v]);
        }
    }
#pragma GCC unroll 2
    for (int v = 0; v < AVX2_VECS; v++) {
        const __m256 a = exp_f32(_mm256_sub_ps(_mm256_loadu_ps(m + 8 * v), m_use[v]));
        _mm256_storeu_ps(alpha + 8 * v, a);
        _mm256_storeu_ps(l + 8 * v, _mm256_fmadd_ps(_mm256_loadu_ps(l + 8 * v), a, sum[v]));
        _mm256_storeu_ps(m + 8 * v, mx[v]);
    }
}

/* Backward: s = exp(s - sub) lane-wise, in place; contract in ukernel.h.
 * A lane whose sub is -inf gives 0 (the result is masked), whatever s is;
 * NaN in s or sub gives NaN. The argument has no sign here, so the
 * full-range exp. */
static void fmha_f32_exp_sub_ukernel_16__avx2(size_t rows, float *s, size_t lds,
                                              const float *sub) {
    __m256 sub_v[AVX2_VECS], keep[AVX2_VECS];
#pragma GCC unroll 2
    for (int v = 0; v < AVX2_VECS; v++) {
        sub_v[v] = _mm256_loadu_ps(sub + 8 * v);
        keep[v] = _mm256_cmp_ps(sub_v[v], _mm256_set1_ps(-__builtin_inff()), _CMP_NEQ_UQ);
    }
    for (size_t r = 0; r < rows; r++) {
        float *srow = s + r * lds;
#pragma GCC unroll 2
        for (int v = 0; v < AVX2_VECS; v++) {
            const __m256 x = _mm256_sub_ps(_mm256_loadu_ps(srow + 8 * v), sub_v[v]);
            _mm256_storeu_ps(srow + 8 * v, _mm256_and_ps(keep[v], exp_f32_full(x)));
        }
    }
}

/* Backward: dp = p * (dp - dsum) lane-wise, in place; contract in ukernel.h. */
static void fmha_f32_ds_ukernel_16__avx2(size_t rows, const float *p, float *dp, size_t lds,
                                         const float *dsum) {
    __m256 dsum_v[AVX2_VECS];
#pragma GCC unroll 2
    for (int v = 0; v < AVX2_VECS; v++) dsum_v[v] = _mm256_loadu_ps(dsum + 8 * v);
    for (size_t r = 0; r < rows; r++) {
        const float *prow = p + r * lds;
        float *dprow = dp + r * lds;
#pragma GCC unroll 2
        for (int v = 0; v < AVX2_VECS; v++) {
            const __m256 d = _mm256_sub_ps(_mm256_loadu_ps(dprow + 8 * v), dsum_v[v]);
            _mm256_storeu_ps(dprow + 8 * v, _mm256_mul_ps(_mm256_loadu_ps(prow + 8 * v), d));
        }
    }
}

/* ---- the avx2 ISA's float32 tile part, shared with avx2vnni (parts.h;
 * the other parts and the ISA: table.c) ---- */
const fmha_uk_tile fmha_uk_tile__avx2 = {
    .mr = AVX2_MR,
    .nr = AVX2_NR,
    .block_kv = 128,
    .gemm = fmha_f32_gemm_ukernel_6x16__avx2,
    .softmax = fmha_f32_softmax_ukernel_16__avx2,
    .exp_sub = fmha_f32_exp_sub_ukernel_16__avx2,
    .ds = fmha_f32_ds_ukernel_16__avx2,
};
