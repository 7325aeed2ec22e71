/* neon/softmax.h: the online-softmax step over S^T [rows][16] in pieces
 * (the lane-wise max, one row's P and its sum, the running state's update),
 * inlined into the float32 softmax (f32.c) and into the neonbf16 step that
 * rounds P into pair-rows on registers, so that both compute the same bits. */
#ifndef FMHA_UK_NEON_SOFTMAX_H
#define FMHA_UK_NEON_SOFTMAX_H

#include <arm_neon.h>
#include <stddef.h>

#include "exp.h"

#define NEON_SOFTMAX_INLINE static inline __attribute__((always_inline))

/* Pass 1: mx = max(m, lane-wise max over the rows), two rows per step; FMAX
 * returns NaN when either operand is NaN, so a NaN score or running max
 * makes the lane's max NaN (the scalar kernel's max_nan). m_use is mx, or 0
 * in lanes whose max is -inf (every score masked); sum starts at 0. */
NEON_SOFTMAX_INLINE void neon_softmax_max(size_t rows, const float *s, size_t lds, const float *m,
                                          float32x4_t mx[4], float32x4_t m_use[4], float32x4_t sum[4]) {
    const float32x4_t neg_inf = vdupq_n_f32(-__builtin_inff());
    float32x4_t mx2[4];
#pragma GCC unroll 4
    for (int v = 0; v < 4; v++) {
        mx[v] = vld1q_f32(m + 4 * v);
        mx2[v] = neg_inf;
    }
    size_t r = 0;
    for (; r + 2 <= rows; r += 2) {
        const float *s0 = s + r * lds, *s1 = s0 + lds;
#pragma GCC unroll 4
        for (int v = 0; v < 4; v++) {
            mx[v] = vmaxq_f32(mx[v], vld1q_f32(s0 + 4 * v));
            mx2[v] = vmaxq_f32(mx2[v], vld1q_f32(s1 + 4 * v));
        }
    }
    if (r < rows) {
#pragma GCC unroll 4
        for (int v = 0; v < 4; v++) mx[v] = vmaxq_f32(mx[v], vld1q_f32(s + r * lds + 4 * v));
    }
#pragma GCC unroll 4
    for (int v = 0; v < 4; v++) {
        mx[v] = vmaxq_f32(mx[v], mx2[v]);
        const uint32x4_t all_masked = vceqq_f32(mx[v], neg_inf);
        m_use[v] = vreinterpretq_f32_u32(vbicq_u32(vreinterpretq_u32_f32(mx[v]), all_masked));
        sum[v] = vdupq_n_f32(0.0f);
    }
}

/* Pass 2, one row: p = exp(s - m_use), added to sum (rows in order). */
NEON_SOFTMAX_INLINE void neon_softmax_row(const float *srow, const float32x4_t m_use[4], float32x4_t sum[4],
                                          float32x4_t p[4]) {
#pragma GCC unroll 4
    for (int v = 0; v < 4; v++) {
        p[v] = neon_exp_f32(vsubq_f32(vld1q_f32(srow + 4 * v), m_use[v]));
        sum[v] = vaddq_f32(sum[v], p[v]);
    }
}

/* The running state: alpha = exp(m - m_use), l = l alpha + sum, m = mx; a
 * +inf max gives exp(inf - inf) = NaN as IEEE has it. */
NEON_SOFTMAX_INLINE void neon_softmax_update(float *m, float *l, float *alpha, const float32x4_t mx[4],
                                             const float32x4_t m_use[4], const float32x4_t sum[4]) {
#pragma GCC unroll 4
    for (int v = 0; v < 4; v++) {
        const float32x4_t a = neon_exp_f32(vsubq_f32(vld1q_f32(m + 4 * v), m_use[v]));
        vst1q_f32(alpha + 4 * v, a);
        vst1q_f32(l + 4 * v, vfmaq_f32(sum[v], vld1q_f32(l + 4 * v), a));
        vst1q_f32(m + 4 * v, mx[v]);
    }
}

#endif /* FMHA_UK_NEON_SOFTMAX_H */
