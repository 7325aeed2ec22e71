/* neondot/decode_q8.c: integer scores of int8, q8_0 and q4_0 keys on the
 * query quantized as q8_0 (fmha_cache_scores_q8_ukernel_fn; contract and
 * specification in ../ukernel.h and ../scalar/decode.c) with the Armv8.2
 * dot product (SDOT, FEAT_DotProd).
 *
 * Keys in the lanes, as the x86 kernels: 4 keys a block of 32 values, each
 * 16-byte half transposed into 4 vectors of one dword (4 values) of the 4
 * keys, and the indexed SDOT multiplies each by the query's matching dword
 * (a lane of the query's 16 bytes), so an int32 lane sums one key's block
 * exactly; signed by signed, no offsets (q4_0's nibbles less 8 first).
 * Then the specification's float32 steps lane by lane. */
#include <arm_neon.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "neondot.h"

#define FMHA_INLINE static inline __attribute__((always_inline))

enum { Q8_INT8 = FMHA_FORMAT_INT8, Q8_Q8_0 = FMHA_FORMAT_Q8_0, Q8_Q4_0 = FMHA_FORMAT_Q4_0 };

/* x[g] (key g's 16 bytes) -> y[c], lane g holding dword c of key g. */
FMHA_INLINE void transpose4(const int8x16_t x[4], int8x16_t y[4]) {
    const int32x4_t a0 = vtrn1q_s32(vreinterpretq_s32_s8(x[0]), vreinterpretq_s32_s8(x[1]));
    const int32x4_t a1 = vtrn2q_s32(vreinterpretq_s32_s8(x[0]), vreinterpretq_s32_s8(x[1]));
    const int32x4_t a2 = vtrn1q_s32(vreinterpretq_s32_s8(x[2]), vreinterpretq_s32_s8(x[3]));
    const int32x4_t a3 = vtrn2q_s32(vreinterpretq_s32_s8(x[2]), vreinterpretq_s32_s8(x[3]));
    y[0] = vreinterpretq_s8_s64(vtrn1q_s64(vreinterpretq_s64_s32(a0), vreinterpretq_s64_s32(a2)));
    y[1] = vreinterpretq_s8_s64(vtrn1q_s64(vreinterpretq_s64_s32(a1), vreinterpretq_s64_s32(a3)));
    y[2] = vreinterpretq_s8_s64(vtrn2q_s64(vreinterpretq_s64_s32(a0), vreinterpretq_s64_s32(a2)));
    y[3] = vreinterpretq_s8_s64(vtrn2q_s64(vreinterpretq_s64_s32(a1), vreinterpretq_s64_s32(a3)));
}

/* The 4 keys' integers of block b: t[c] lane i holds values 4c..4c+3 of
 * key i (t[4 + c]: values 16 + 4c..), each paired with lane c of the
 * query's first (second) 16 bytes. */
FMHA_INLINE void block_dwords(const int kind, const uint8_t *const kr[4], size_t b, int8x16_t t[8]) {
    const size_t at = b * fmha_int_block_bytes(kind) + fmha_int_block_values_at(kind);
    int8x16_t x[4];
    if (kind == Q8_Q4_0) {
        int8x16_t d[4];
#pragma GCC unroll 4
        for (int g = 0; g < 4; g++) x[g] = vreinterpretq_s8_u8(vld1q_u8(kr[g] + at));
        transpose4(x, d);
#pragma GCC unroll 4
        for (int c = 0; c < 4; c++) {
            const uint8x16_t n = vreinterpretq_u8_s8(d[c]);
            t[c] = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(n, vdupq_n_u8(15))), vdupq_n_s8(8));
            t[4 + c] = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(n, 4)), vdupq_n_s8(8));
        }
        return;
    }
#pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {
#pragma GCC unroll 4
        for (int g = 0; g < 4; g++) x[g] = vld1q_s8((const int8_t *)kr[g] + at + 16 * h);
        transpose4(x, t + 4 * h);
    }
}

/* The 4 keys' half scales of block b as float32 (q8_0, q4_0). */
FMHA_INLINE float32x4_t block_scales(const int kind, const uint8_t *const kr[4], size_t b) {
    uint16_t hs[4];
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) memcpy(&hs[i], kr[i] + b * fmha_int_block_bytes(kind), 2);
    return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(hs)));
}

/* Rows [0, G) of q (G = 4, 2 or 1) against 4 keys (kr; keys past nj
 * repeat the last, not stored). */
FMHA_INLINE void rows_block(const int kind, const int G, size_t nj, size_t d, const fmha_q8_rows *q,
                            const uint8_t *const kr[4], float *s, size_t lds, float scale) {
    const size_t ldd = q->ld / 32;
    float32x4_t acc[4];
#pragma GCC unroll 4
    for (int r = 0; r < G; r++) acc[r] = vdupq_n_f32(0.0f);
    for (size_t b = 0; b < d / 32; b++) {
        int8x16_t t[8];
        block_dwords(kind, kr, b, t);
        const float32x4_t kd = kind == Q8_INT8 ? vdupq_n_f32(1.0f) : block_scales(kind, kr, b);
#pragma GCC unroll 4
        for (int r = 0; r < G; r++) {
            const int8x16_t q0 = vld1q_s8(q->q + r * q->ld + 32 * b), q1 = vld1q_s8(q->q + r * q->ld + 32 * b + 16);
            int32x4_t sum = vdupq_n_s32(0);
            sum = vdotq_laneq_s32(sum, t[0], q0, 0);
            sum = vdotq_laneq_s32(sum, t[1], q0, 1);
            sum = vdotq_laneq_s32(sum, t[2], q0, 2);
            sum = vdotq_laneq_s32(sum, t[3], q0, 3);
            sum = vdotq_laneq_s32(sum, t[4], q1, 0);
            sum = vdotq_laneq_s32(sum, t[5], q1, 1);
            sum = vdotq_laneq_s32(sum, t[6], q1, 2);
            sum = vdotq_laneq_s32(sum, t[7], q1, 3);
            acc[r] = vfmaq_f32(acc[r], vcvtq_f32_s32(sum), vmulq_n_f32(kd, q->d[r * ldd + b]));
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < G; r++) {
        const float32x4_t x = vmulq_n_f32(acc[r], scale);
        if (nj == 4) {
            vst1q_f32(s + r * lds, x);
        } else {
            float tmp[4];
            vst1q_f32(tmp, x);
            memcpy(s + r * lds, tmp, nj * sizeof(float));
        }
    }
}

/* Keys in groups of 4, rows in groups of 4, then 2, 1. */
FMHA_INLINE void scores_q8(const int kind, size_t rows, size_t nk, size_t d, const fmha_q8_rows *q, const void *k,
                           size_t ldk, float *s, size_t lds, float scale) {
    const uint8_t *k8 = k;
    for (size_t j0 = 0; j0 < nk; j0 += 4) {
        const size_t nj = nk - j0 < 4 ? nk - j0 : 4;
        const uint8_t *kr[4];
        for (size_t i = 0; i < 4; i++) kr[i] = k8 + (j0 + (i < nj ? i : nj - 1)) * ldk;
        size_t r = 0;
        for (; r + 4 <= rows; r += 4) {
            const fmha_q8_rows qr = {q->q + r * q->ld, q->d + r * (q->ld / 32), q->sum + r * (q->ld / 32), q->ld, NULL};
            rows_block(kind, 4, nj, d, &qr, kr, s + r * lds + j0, lds, scale);
        }
        if (rows - r >= 2) {
            const fmha_q8_rows qr = {q->q + r * q->ld, q->d + r * (q->ld / 32), q->sum + r * (q->ld / 32), q->ld, NULL};
            rows_block(kind, 2, nj, d, &qr, kr, s + r * lds + j0, lds, scale);
            r += 2;
        }
        if (rows - r == 1) {
            const fmha_q8_rows qr = {q->q + r * q->ld, q->d + r * (q->ld / 32), q->sum + r * (q->ld / 32), q->ld, NULL};
            rows_block(kind, 1, nj, d, &qr, kr, s + r * lds + j0, lds, scale);
        }
    }
}

void fmha_int8kv_scores_q8__neondot(size_t rows, size_t nk, size_t d, const fmha_q8_rows *q, const void *k, size_t ldk,
                                    float *s, size_t lds, float scale) {
    scores_q8(Q8_INT8, rows, nk, d, q, k, ldk, s, lds, scale);
}

void fmha_q8_0kv_scores_q8__neondot(size_t rows, size_t nk, size_t d, const fmha_q8_rows *q, const void *k, size_t ldk,
                                    float *s, size_t lds, float scale) {
    scores_q8(Q8_Q8_0, rows, nk, d, q, k, ldk, s, lds, scale);
}

void fmha_q4_0kv_scores_q8__neondot(size_t rows, size_t nk, size_t d, const fmha_q8_rows *q, const void *k, size_t ldk,
                                    float *s, size_t lds, float scale) {
    scores_q8(Q8_Q4_0, rows, nk, d, q, k, ldk, s, lds, scale);
}
