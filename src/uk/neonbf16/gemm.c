/* neonbf16/gemm.c: the bf16 pair GEMM on BFMMLA (6 x 16 tile).
 *
 * BFMMLA multiplies a 2 x 4 bf16 matrix by the transpose of another into
 * 2 x 2 float32 accumulators: with 4 bf16 = 2 pair-steps along k,
 *   x = (A[r][p], A[r][p+1], A[r+1][p], A[r+1][p+1])     (32-bit pair words)
 *   y = (B[p][j], B[p+1][j], B[p][j+1], B[p+1][j+1])
 *   acc = (C[r][j], C[r][j+1], C[r+1][j], C[r+1][j+1]) += x y^T,
 * so the tile keeps 3 row pairs x 8 column pairs = 24 accumulators. A row
 * pair's x is two 64-bit loads when a_cs = 1 (the drivers' only pattern)
 * and four 32-bit lane loads otherwise; y is ZIP1/ZIP2 of two pair-rows of
 * B (4 columns each). An odd last pair-step runs on BFDOT with each word
 * duplicated into the same accumulator layout, since a zero fifth and sixth
 * bf16 for BFMMLA would turn a -0 sum into +0. A row pair past m repeats
 * row m - 1 (never read past it); its results are not stored.
 *
 * Arithmetic: BFMMLA is two BFDOT steps in order (BFDotAdd of the Arm ARM),
 * and without FEAT_EBF16 neither reads FPCR: products and sums rounded to
 * odd, subnormal inputs and results flushed, the default NaN. Each
 * accumulator starts at +0 and takes the pair-steps in order, so the GEMM
 * gives the bits of fmha_bf16_gemm_ukernel_4x16__arm (scalar/bf16.c),
 * which the tests check bit for bit. bf16 vectors are only ever made by
 * reinterpreting loaded words (GCC 12 miscompiles constant bf16 vectors). */
#include <arm_neon.h>

#include "../ukernel.h"
#include "neonbf16.h"

enum { MR = FMHA_NEONBF16_MR, NR = FMHA_NEONBF16_NR, ROW_PAIRS = MR / 2, COL_PAIRS = NR / 2 };

#define FMHA_INLINE static inline __attribute__((always_inline))

/* Row pair t's rows: 2t and 2t + 1, the latter clamped to m - 1. */
FMHA_INLINE size_t second_row(const size_t m, size_t t) { return 2 * t + 1 < m ? 2 * t + 1 : m - 1; }

/* x of row pair t for pair-steps p, p + 1 (a at pair-step p). */
FMHA_INLINE bfloat16x8_t a_pairs2(const size_t m, const int unit_cs, size_t t, const uint32_t *a, ptrdiff_t a_rs,
                                  ptrdiff_t a_cs) {
    const uint32_t *r0 = a + (ptrdiff_t)(2 * t) * a_rs, *r1 = a + (ptrdiff_t)second_row(m, t) * a_rs;
    uint32x4_t x;
    if (unit_cs) {
        x = vcombine_u32(vld1_u32(r0), vld1_u32(r1));
    } else {
        x = vld1q_dup_u32(r0);
        x = vld1q_lane_u32(r0 + a_cs, x, 1);
        x = vld1q_lane_u32(r1, x, 2);
        x = vld1q_lane_u32(r1 + a_cs, x, 3);
    }
    return vreinterpretq_bf16_u32(x);
}

/* x of row pair t for one pair-step, each word twice: (A[r][p], A[r][p],
 * A[r+1][p], A[r+1][p]). */
FMHA_INLINE bfloat16x8_t a_pair1(const size_t m, size_t t, const uint32_t *a, ptrdiff_t a_rs) {
    const uint32_t *r0 = a + (ptrdiff_t)(2 * t) * a_rs, *r1 = a + (ptrdiff_t)second_row(m, t) * a_rs;
    return vreinterpretq_bf16_u32(vcombine_u32(vld1_dup_u32(r0), vld1_dup_u32(r1)));
}

/* Row r (0 or 1 within the pair) of two accumulators of column pairs
 * (j, j+1) and (j+2, j+3): four consecutive columns of C. */
FMHA_INLINE float32x4_t c_row(float32x4_t acc0, float32x4_t acc1, int r) {
    const float64x2_t x0 = vreinterpretq_f64_f32(acc0), x1 = vreinterpretq_f64_f32(acc1);
    return vreinterpretq_f32_f64(r ? vzip2q_f64(x0, x1) : vzip1q_f64(x0, x1));
}

/* C[m x 16] (op)= ab_scale * A B with m and the A pattern compile-time
 * constants. */
FMHA_INLINE void gemm_tile(const size_t m, const int unit_cs, size_t kp, const uint32_t *a, ptrdiff_t a_rs,
                           ptrdiff_t a_cs, const uint32_t *b, size_t ldb, float *c, size_t ldc, int mode,
                           const float *col_scale, float ab_scale) {
    const size_t tp = (m + 1) / 2; /* row pairs */
    float32x4_t acc[ROW_PAIRS][COL_PAIRS];
#pragma GCC unroll 3
    for (size_t t = 0; t < tp; t++)
#pragma GCC unroll 8
        for (int j = 0; j < COL_PAIRS; j++) acc[t][j] = vdupq_n_f32(0.0f);

    for (; kp >= 2; kp -= 2) {
        bfloat16x8_t x[ROW_PAIRS];
#pragma GCC unroll 3
        for (size_t t = 0; t < tp; t++) x[t] = a_pairs2(m, unit_cs, t, a, a_rs, a_cs);
#pragma GCC unroll 4
        for (int g = 0; g < NR / 4; g++) {
            const uint32x4_t b0 = vld1q_u32(b + 4 * g), b1 = vld1q_u32(b + ldb + 4 * g);
            const bfloat16x8_t y0 = vreinterpretq_bf16_u32(vzip1q_u32(b0, b1));
            const bfloat16x8_t y1 = vreinterpretq_bf16_u32(vzip2q_u32(b0, b1));
#pragma GCC unroll 3
            for (size_t t = 0; t < tp; t++) {
                acc[t][2 * g] = vbfmmlaq_f32(acc[t][2 * g], x[t], y0);
                acc[t][2 * g + 1] = vbfmmlaq_f32(acc[t][2 * g + 1], x[t], y1);
            }
            /* keeps the next group's B loads here: hoisted above, all
             * eight need registers at once and GCC spills accumulators */
            __asm__ volatile("" ::: "memory");
        }
        a += 2 * a_cs;
        b += 2 * ldb;
    }
    if (kp) {
        bfloat16x8_t x[ROW_PAIRS];
#pragma GCC unroll 3
        for (size_t t = 0; t < tp; t++) x[t] = a_pair1(m, t, a, a_rs);
#pragma GCC unroll 4
        for (int g = 0; g < NR / 4; g++) {
            const uint64x2_t b0 = vreinterpretq_u64_u32(vld1q_u32(b + 4 * g));
            const bfloat16x8_t y0 = vreinterpretq_bf16_u64(vdupq_laneq_u64(b0, 0));
            const bfloat16x8_t y1 = vreinterpretq_bf16_u64(vdupq_laneq_u64(b0, 1));
#pragma GCC unroll 3
            for (size_t t = 0; t < tp; t++) {
                acc[t][2 * g] = vbfdotq_f32(acc[t][2 * g], x[t], y0);
                acc[t][2 * g + 1] = vbfdotq_f32(acc[t][2 * g + 1], x[t], y1);
            }
        }
    }

    const float32x4_t s = vdupq_n_f32(ab_scale);
#pragma GCC unroll 6
    for (size_t r = 0; r < m; r++) {
        float *cr = c + r * ldc;
#pragma GCC unroll 4
        for (int g = 0; g < NR / 4; g++) {
            const float32x4_t v = c_row(acc[r / 2][2 * g], acc[r / 2][2 * g + 1], (int)(r % 2));
            float *cv = cr + 4 * g;
            if (mode == FMHA_UK_STORE) vst1q_f32(cv, vmulq_f32(v, s));
            else if (mode == FMHA_UK_ACCUMULATE) vst1q_f32(cv, vfmaq_f32(vld1q_f32(cv), v, s));
            else vst1q_f32(cv, vfmaq_f32(vmulq_f32(vld1q_f32(cv), vld1q_f32(col_scale + 4 * g)), v, s));
        }
    }
}

#define GEMM_CASE(M)                                                                                   \
    case M:                                                                                            \
        if (a_cs == 1) gemm_tile(M, 1, kp, a, a_rs, a_cs, b, ldb, c, ldc, mode, col_scale, ab_scale);  \
        else gemm_tile(M, 0, kp, a, a_rs, a_cs, b, ldb, c, ldc, mode, col_scale, ab_scale);            \
        break

/* C[m x 16] (op)= ab_scale * A B, 1 <= m <= 6; contract in ukernel.h. */
void fmha_bf16_gemm_ukernel_6x16__neonbf16(size_t m, size_t kp, const uint32_t *a, ptrdiff_t a_rs,
                                           ptrdiff_t a_cs, const uint32_t *b, size_t ldb, float *c, size_t ldc,
                                           int mode, const float *col_scale, float ab_scale) {
    FMHA_UK_SWITCH_ROWS_6(m, GEMM_CASE)
}
