/* scalar/f32.c: the plain-C float32 microkernels, the specification that
 * every SIMD kernel is tested against, and the kernels of the `portable`
 * strategy. Compiled with no ISA flags: runs on any CPU. */
#include <math.h>
#include <string.h>

#include "runtime/convert.h"
#include "../ukernel.h"
#include "decode.h"
#include "fma.h"

enum { SCALAR_MR = 4, SCALAR_NR = 16 };

/* One row of a B panel, read as one object. */
typedef struct scalar_row {
    float v[SCALAR_NR];
} scalar_row;

/* C[m x 16] (op)= ab_scale * A[m x k] B[k x 16]; contract in ukernel.h. The
 * product is summed from zero, then scaled and combined with C by one fma. */
FMHA_SCALAR_FMA_CLONES static void fmha_f32_gemm_ukernel_4x16__scalar(size_t m, size_t k, const float *a, ptrdiff_t a_rs,
                                               ptrdiff_t a_cs, const float *b, size_t ldb,
                                               float *c, size_t ldc, int mode,
                                               const float *col_scale, float ab_scale) {
    for (size_t r = 0; r < m; r++) {
        /* acc [NR]: A B for one row of the tile; brow: B's row p, read as
         * one object (one check in the sanitized builds, not 16). The loops
         * over them unrolled: constant indices, in registers. */
        float acc[SCALAR_NR] = {0};
        for (size_t p = 0; p < k; p++) {
            const float x = a[(ptrdiff_t)r * a_rs + (ptrdiff_t)p * a_cs];
            const scalar_row brow = *(const scalar_row *)(b + p * ldb);
#pragma GCC unroll 16
            for (size_t j = 0; j < SCALAR_NR; j++) acc[j] = fmaf(x, brow.v[j], acc[j]);
        }
#pragma GCC unroll 16
        for (size_t j = 0; j < SCALAR_NR; j++) {
            float *cj = &c[r * ldc + j];
            *cj = mode == FMHA_UK_STORE        ? acc[j] * ab_scale
                  : mode == FMHA_UK_ACCUMULATE ? fmaf(acc[j], ab_scale, *cj)
                                               : fmaf(acc[j], ab_scale, *cj * col_scale[j]);
        }
    }
}

/* max(a, b) that is NaN when either is (fmaxf would ignore a NaN). */
static float max_nan(float a, float b) {
    if (isnan(a)) return a;
    return isnan(b) || b > a ? b : a;
}

/* Online-softmax step over S^T [rows][16]; contract in ukernel.h. A NaN
 * score or running max makes the lane's max NaN, so its P, alpha and l are
 * NaN; +inf follows IEEE (exp(inf - inf) = NaN). */
static void fmha_f32_softmax_ukernel_16__scalar(size_t rows, float *s, size_t lds, float *m,
                                                float *l, float *alpha) {
    for (size_t j = 0; j < SCALAR_NR; j++) {
        float mx = m[j];
        for (size_t r = 0; r < rows; r++) mx = max_nan(mx, s[r * lds + j]);
        float m_use = mx == -INFINITY ? 0.0f : mx;
        float a = expf(m[j] - m_use);
        float sum = 0.0f;
        for (size_t r = 0; r < rows; r++) {
            float p = expf(s[r * lds + j] - m_use);
            s[r * lds + j] = p;
            sum += p;
        }
        alpha[j] = a;
        l[j] = l[j] * a + sum;
        m[j] = mx;
    }
}

/* s = exp(s - sub) lane-wise; contract in ukernel.h. A lane whose sub is
 * -inf gives 0 whatever s holds (NaN and inf included). */
static void fmha_f32_exp_sub_ukernel_16__scalar(size_t rows, float *s, size_t lds,
                                                const float *sub) {
    for (size_t j = 0; j < SCALAR_NR; j++)
        for (size_t r = 0; r < rows; r++)
            s[r * lds + j] = sub[j] == -INFINITY ? 0.0f : expf(s[r * lds + j] - sub[j]);
}

/* dp = p * (dp - dsum) lane-wise; contract in ukernel.h. */
static void fmha_f32_ds_ukernel_16__scalar(size_t rows, const float *p, float *dp, size_t lds,
                                           const float *dsum) {
    for (size_t r = 0; r < rows; r++)
        for (size_t j = 0; j < SCALAR_NR; j++)
            dp[r * lds + j] = p[r * lds + j] * (dp[r * lds + j] - dsum[j]);
}

/* st[r][i] += src[i * q_stride + r] for r < nk, i < nq; contract in
 * ukernel.h. One addition per element, so the result is the driver's plain
 * loop's, bit for bit. */
static void fmha_f32_add_transposed_ukernel__scalar(size_t nk, size_t nq, const float *src,
                                                   ptrdiff_t q_stride, float *st, size_t lds) {
    for (size_t i = 0; i < nq; i++) {
        const float *srow = src + (ptrdiff_t)i * q_stride;
        for (size_t r = 0; r < nk; r++) st[r * lds + i] += srow[r];
    }
}

/* y += a x, one fmaf each (fmha_f32_axpy_ukernel_fn): the specification. */
FMHA_SCALAR_FMA_CLONES void fmha_f32_axpy_ukernel__scalar(size_t n, float a, const float *x, float *y) {
    for (size_t i = 0; i < n; i++) y[i] = fmaf(a, x[i], y[i]);
}

/* x[r][j] *= sc[j] (fmha_f32_scale_columns_ukernel_fn): the specification. */
FMHA_SCALAR_FMA_CLONES void fmha_f32_scale_columns_ukernel__scalar(size_t rows, size_t n, const float *sc, float *x,
                                                                   size_t ldx) {
    for (size_t r = 0; r < rows; r++)
        for (size_t j = 0; j < n; j++) x[r * ldx + j] *= sc[j];
}

/* Any NaN or infinity (fmha_f32_nonfinite_ukernel_fn): the specification,
 * on the bits (an exponent of all ones). */
FMHA_SCALAR_FMA_CLONES int fmha_f32_nonfinite_ukernel__scalar(size_t rows, size_t n, const float *x, size_t ldx) {
    uint32_t any = 0;
    for (size_t r = 0; r < rows; r++)
        for (size_t j = 0; j < n; j++) {
            uint32_t u;
            memcpy(&u, x + r * ldx + j, sizeof u);
            any |= (u & 0x7F800000u) == 0x7F800000u;
        }
    return (int)any;
}

/* A transposing copy (fmha_f32_transpose_ukernel_fn): the specification. */
void fmha_f32_transpose_ukernel__scalar(size_t rows, size_t cols, const float *src, size_t lds, float *dst,
                                        size_t ldd) {
    for (size_t r = 0; r < rows; r++)
        for (size_t c = 0; c < cols; c++) memcpy(dst + c * ldd + r, src + r * lds + c, sizeof(float)); /* bits */
}

/* float32 to bf16 (fmha_f32_to_bf16_ukernel_fn): the specification. */
void fmha_f32_to_bf16_ukernel__scalar(size_t n, const float *src, uint16_t *dst) {
    for (size_t i = 0; i < n; i++) dst[i] = fmha_f32_to_bf16(src[i]);
}

/* Two 16-bit rows into 32-bit pairs (fmha_u16_interleave_ukernel_fn): the specification. */
void fmha_u16_interleave_ukernel__scalar(size_t n, const uint16_t *lo, const uint16_t *hi, uint32_t *dst) {
    for (size_t i = 0; i < n; i++) dst[i] = (uint32_t)lo[i] | (hi ? (uint32_t)hi[i] << 16 : 0u);
}

/* The forward's epilogue (fmha_f32_finish_ukernel_fn): the specification. */
uint64_t fmha_f32_finish_ukernel__scalar(size_t rows, size_t cols, const float *ot, size_t ldt,
                                         const float *scale, float *o, size_t ldo) {
    uint64_t bad = 0;
    for (size_t i = 0; i < rows; i++)
        for (size_t c = 0; c < cols; c++) {
            float x = ot[c * ldt + i] * scale[i];
            o[i * ldo + c] = x;
            if (!isfinite(x)) bad |= (uint64_t)1 << i;
        }
    return bad;
}

/* ---- the scalar ISA's parts: every fallback of the other tables ---- */
static const fmha_uk_tile scalar_tile = {
    .mr = SCALAR_MR,
    .nr = SCALAR_NR,
    .block_kv = 64,
    .gemm = fmha_f32_gemm_ukernel_4x16__scalar,
    .softmax = fmha_f32_softmax_ukernel_16__scalar,
    .exp_sub = fmha_f32_exp_sub_ukernel_16__scalar,
    .ds = fmha_f32_ds_ukernel_16__scalar,
};

static const fmha_uk_rows scalar_rows = {
    .add_transposed = fmha_f32_add_transposed_ukernel__scalar,
    .finish = fmha_f32_finish_ukernel__scalar,
    .transpose = fmha_f32_transpose_ukernel__scalar,
    .to_bf16 = fmha_f32_to_bf16_ukernel__scalar,
    .interleave_u16 = fmha_u16_interleave_ukernel__scalar,
    .dropout = fmha_f32_dropout_ukernel__scalar,
    .axpy = fmha_f32_axpy_ukernel__scalar,
    .scale_columns = fmha_f32_scale_columns_ukernel__scalar,
    .nonfinite = fmha_f32_nonfinite_ukernel__scalar,
};

static const fmha_uk_decode scalar_decode = {.softmax = fmha_f32_decode_softmax__scalar};
static const fmha_uk_cache scalar_f32 = {
    .load = fmha_load_f32__scalar,
    .scores = fmha_f32_decode_scores__scalar,
    .values = fmha_f32_decode_values__scalar,
};
static const fmha_uk_cache scalar_bf16 = {.load = fmha_widen_bf16__scalar};
static const fmha_uk_cache scalar_f16 = {.load = fmha_widen_f16__scalar};
static const fmha_uk_cache scalar_int8 = {.load = fmha_load_int8__scalar, .scores_q8 = fmha_int8kv_scores_q8__scalar,
                                          .values_int = fmha_int8kv_values_int__scalar};
static const fmha_uk_cache scalar_e4m3 = {.load = fmha_load_e4m3__scalar,
                                          .scores_bf16 = fmha_e4m3kv_scores_bf16__scalar,
                                          .scores_bf16_qt = fmha_e4m3kv_scores_bf16_qt__scalar};
static const fmha_uk_cache scalar_e5m2 = {.load = fmha_load_e5m2__scalar,
                                          .scores_bf16 = fmha_e5m2kv_scores_bf16__scalar,
                                          .scores_bf16_qt = fmha_e5m2kv_scores_bf16_qt__scalar};
static const fmha_uk_cache scalar_q8_0 = {.load = fmha_load_q8_0__scalar, .scores_q8 = fmha_q8_0kv_scores_q8__scalar,
                                          .values_int = fmha_q8_0kv_values_int__scalar};
static const fmha_uk_cache scalar_q4_0 = {.load = fmha_load_q4_0__scalar, .scores_q8 = fmha_q4_0kv_scores_q8__scalar,
                                          .values_int = fmha_q4_0kv_values_int__scalar};

const fmha_isa_parts fmha_isa_scalar = {
    .isa = "scalar",
    .tile = &scalar_tile,
    .rows = &scalar_rows,
    .decode = &scalar_decode,
    .cache = {[FMHA_FORMAT_F32] = &scalar_f32,
              [FMHA_FORMAT_BF16] = &scalar_bf16,
              [FMHA_FORMAT_F16] = &scalar_f16,
              [FMHA_FORMAT_INT8] = &scalar_int8,
              [FMHA_FORMAT_FP8_E4M3] = &scalar_e4m3,
              [FMHA_FORMAT_FP8_E5M2] = &scalar_e5m2,
              [FMHA_FORMAT_Q8_0] = &scalar_q8_0,
              [FMHA_FORMAT_Q4_0] = &scalar_q4_0},
};
