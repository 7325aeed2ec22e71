/* neon/rows.c: the NEON row kernels (any length, no lanes): the bias
 * epilogue's transposing add, the forward's finish, the transposing copy,
 * float32 to bf16 and the pairing of 16-bit rows. Transposes go through
 * 4 x 4 blocks in registers (TRN1/TRN2 on 32- then 64-bit elements); the
 * ragged edges run the scalar specification's arithmetic element by
 * element. Contracts in ../ukernel.h. */
#include <arm_neon.h>
#include <math.h>
#include <string.h>

#include "runtime/convert.h"
#include "neon.h"

#define FMHA_INLINE static inline __attribute__((always_inline))

/* x[i] lane j becomes x[j] lane i. Moves bits only. */
FMHA_INLINE void transpose_4x4(float32x4_t x[4]) {
    const float32x4_t t0 = vtrn1q_f32(x[0], x[1]), t1 = vtrn2q_f32(x[0], x[1]);
    const float32x4_t t2 = vtrn1q_f32(x[2], x[3]), t3 = vtrn2q_f32(x[2], x[3]);
    x[0] = vreinterpretq_f32_f64(vtrn1q_f64(vreinterpretq_f64_f32(t0), vreinterpretq_f64_f32(t2)));
    x[1] = vreinterpretq_f32_f64(vtrn1q_f64(vreinterpretq_f64_f32(t1), vreinterpretq_f64_f32(t3)));
    x[2] = vreinterpretq_f32_f64(vtrn2q_f64(vreinterpretq_f64_f32(t0), vreinterpretq_f64_f32(t2)));
    x[3] = vreinterpretq_f32_f64(vtrn2q_f64(vreinterpretq_f64_f32(t1), vreinterpretq_f64_f32(t3)));
}

/* st[r][i] += src[i * q_stride + r]: 4 queries x 4 keys per block. */
void fmha_f32_add_transposed_ukernel__neon(size_t nk, size_t nq, const float *src, ptrdiff_t q_stride, float *st,
                                           size_t lds) {
    const size_t nq4 = nq / 4 * 4, nk4 = nk / 4 * 4;
    for (size_t i0 = 0; i0 < nq4; i0 += 4) {
        for (size_t r0 = 0; r0 < nk4; r0 += 4) {
            float32x4_t x[4];
#pragma GCC unroll 4
            for (int i = 0; i < 4; i++) x[i] = vld1q_f32(src + (ptrdiff_t)(i0 + (size_t)i) * q_stride + r0);
            transpose_4x4(x);
#pragma GCC unroll 4
            for (int r = 0; r < 4; r++) {
                float *row = st + (r0 + (size_t)r) * lds + i0;
                vst1q_f32(row, vaddq_f32(vld1q_f32(row), x[r]));
            }
        }
        for (size_t i = i0; i < i0 + 4; i++)
            for (size_t r = nk4; r < nk; r++) st[r * lds + i] += src[(ptrdiff_t)i * q_stride + r];
    }
    for (size_t i = nq4; i < nq; i++)
        for (size_t r = 0; r < nk; r++) st[r * lds + i] += src[(ptrdiff_t)i * q_stride + r];
}

/* o[i][c] = ot[c][i] * scale[i]: 4 rows x 4 columns per block, scaled in
 * the lanes (rows), checked (|x| < inf is false for NaN and infinities),
 * transposed and stored as rows. */
uint64_t fmha_f32_finish_ukernel__neon(size_t rows, size_t cols, const float *ot, size_t ldt, const float *scale,
                                       float *o, size_t ldo) {
    uint64_t bad = 0;
    const size_t rows4 = rows / 4 * 4, cols4 = cols / 4 * 4;
    const float32x4_t inf = vdupq_n_f32(INFINITY);
    for (size_t i0 = 0; i0 < rows4; i0 += 4) {
        const float32x4_t sc = vld1q_f32(scale + i0);
        uint32x4_t finite = vdupq_n_u32(~0u);
        for (size_t c0 = 0; c0 < cols4; c0 += 4) {
            float32x4_t x[4];
#pragma GCC unroll 4
            for (int c = 0; c < 4; c++) {
                x[c] = vmulq_f32(vld1q_f32(ot + (c0 + (size_t)c) * ldt + i0), sc);
                finite = vandq_u32(finite, vcltq_f32(vabsq_f32(x[c]), inf));
            }
            transpose_4x4(x);
#pragma GCC unroll 4
            for (int i = 0; i < 4; i++) vst1q_f32(o + (i0 + (size_t)i) * ldo + c0, x[i]);
        }
        uint32_t lane_ok[4];
        vst1q_u32(lane_ok, finite);
        for (size_t i = 0; i < 4; i++) {
            for (size_t c = cols4; c < cols; c++) {
                const float x = ot[c * ldt + i0 + i] * scale[i0 + i];
                o[(i0 + i) * ldo + c] = x;
                if (!isfinite(x)) lane_ok[i] = 0;
            }
            if (!lane_ok[i]) bad |= (uint64_t)1 << (i0 + i);
        }
    }
    for (size_t i = rows4; i < rows; i++)
        for (size_t c = 0; c < cols; c++) {
            const float x = ot[c * ldt + i] * scale[i];
            o[i * ldo + c] = x;
            if (!isfinite(x)) bad |= (uint64_t)1 << i;
        }
    return bad;
}

/* dst[c][r] = src[r][c], 4 x 4 blocks in registers; a copy of the bits. */
void fmha_f32_transpose_ukernel__neon(size_t rows, size_t cols, const float *src, size_t lds, float *dst,
                                      size_t ldd) {
    const size_t rows4 = rows / 4 * 4, cols4 = cols / 4 * 4;
    for (size_t r0 = 0; r0 < rows4; r0 += 4) {
        for (size_t c0 = 0; c0 < cols4; c0 += 4) {
            float32x4_t x[4];
#pragma GCC unroll 4
            for (int r = 0; r < 4; r++) x[r] = vld1q_f32(src + (r0 + (size_t)r) * lds + c0);
            transpose_4x4(x);
#pragma GCC unroll 4
            for (int c = 0; c < 4; c++) vst1q_f32(dst + (c0 + (size_t)c) * ldd + r0, x[c]);
        }
        for (size_t c = cols4; c < cols; c++)
            for (size_t r = r0; r < r0 + 4; r++) memcpy(dst + c * ldd + r, src + r * lds + c, sizeof(float));
    }
    for (size_t r = rows4; r < rows; r++)
        for (size_t c = 0; c < cols; c++) memcpy(dst + c * ldd + r, src + r * lds + c, sizeof(float));
}

/* float32 to bf16 in integer arithmetic, 4 at a time: the specification's
 * steps (round to nearest even on the bits; a NaN keeps its top bits and
 * is made quiet; no flush of subnormals). */
void fmha_f32_to_bf16_ukernel__neon(size_t n, const float *src, uint16_t *dst) {
    const uint32x4_t magnitude = vdupq_n_u32(0x7fffffffu), inf = vdupq_n_u32(0x7f800000u);
    const uint32x4_t half_ulp = vdupq_n_u32(0x7fffu), one = vdupq_n_u32(1u), quiet = vdupq_n_u32(0x40u);
    size_t i = 0;
    for (; i + 4 <= n; i += 4) {
        const uint32x4_t u = vreinterpretq_u32_f32(vld1q_f32(src + i));
        const uint32x4_t top = vshrq_n_u32(u, 16);
        const uint32x4_t nan = vcgtq_u32(vandq_u32(u, magnitude), inf);
        const uint32x4_t rounded = vshrq_n_u32(vaddq_u32(u, vaddq_u32(half_ulp, vandq_u32(top, one))), 16);
        vst1_u16(dst + i, vmovn_u32(vbslq_u32(nan, vorrq_u32(top, quiet), rounded)));
    }
    for (; i < n; i++) dst[i] = fmha_f32_to_bf16(src[i]);
}

/* dst[i] = lo[i] | hi[i] << 16: ST2 stores the two rows interleaved, which
 * on a little-endian CPU is each pair's word. */
void fmha_u16_interleave_ukernel__neon(size_t n, const uint16_t *lo, const uint16_t *hi, uint32_t *dst) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint16x8x2_t pair;
        pair.val[0] = vld1q_u16(lo + i);
        pair.val[1] = hi ? vld1q_u16(hi + i) : vdupq_n_u16(0);
        vst2q_u16((uint16_t *)(dst + i), pair);
    }
    for (; i < n; i++) dst[i] = (uint32_t)lo[i] | (hi ? (uint32_t)hi[i] << 16 : 0u);
}
