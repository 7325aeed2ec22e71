/* neon/decode.c: the NEON decode microkernels (keys in the lanes). Scores
 * run up to 4 query rows against 4 keys with 16 accumulators over the head
 * dimension and reduce them with one pairwise-add tree; values keep up to 6
 * rows x 16 value dims, each an fma chain over the keys in order (the
 * scalar kernel's bits); the softmax runs the vector exp along the rows.
 * The bf16 and f16 formats' kernels are the float32 ones with their rows
 * widened in registers (bf16: a shift, f16: FCVTL, both exact), so they
 * give the float32 kernels' bits on the loaded rows. Contract in
 * ../ukernel.h; ../scalar/decode.c is the specification. */
#include <arm_neon.h>
#include <math.h>
#include <string.h>

#include "../../convert.h"
#include "exp.h"
#include "neon.h"

#define FMHA_INLINE static inline __attribute__((always_inline))

/* Bytes of one element of a format. */
FMHA_INLINE size_t elem_bytes(const int fmt) { return fmt == FMHA_FORMAT_F32 ? 4 : 2; }

/* Elements [e, e + 4) of a row of the format, as float32. */
FMHA_INLINE float32x4_t load4(const int fmt, const void *row, size_t e) {
    if (fmt == FMHA_FORMAT_F32) return vld1q_f32((const float *)row + e);
    const uint16x4_t h = vld1_u16((const uint16_t *)row + e);
    if (fmt == FMHA_FORMAT_BF16) return vreinterpretq_f32_u32(vshll_n_u16(h, 16));
    return vcvt_f32_f16(vreinterpret_f16_u16(h));
}

/* Elements [e, e + n) of a row (n < 4), zeros after them; reads only those. */
FMHA_INLINE float32x4_t load_part(const int fmt, const void *row, size_t e, size_t n) {
    uint8_t t[16] = {0};
    memcpy(t, (const char *)row + e * elem_bytes(fmt), n * elem_bytes(fmt));
    return load4(fmt, t, 0);
}

/* Rows [0, R) of q against keys [j0, j0 + nj) (nj <= 4): s = scale * q . k. */
FMHA_INLINE void scores_block(const int fmt, const size_t R, size_t nj, size_t d, const float *q, size_t ldq,
                              const char *k, size_t ldk_bytes, float *s, size_t lds, float scale) {
    /* keys past nj repeat the last one; their lanes are not stored */
    const char *kr[4];
#pragma GCC unroll 4
    for (size_t j = 0; j < 4; j++) kr[j] = k + (j < nj ? j : nj - 1) * ldk_bytes;
    float32x4_t acc[4][4];
#pragma GCC unroll 4
    for (size_t r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) acc[r][j] = vdupq_n_f32(0.0f);
    size_t e = 0;
    for (; e + 4 <= d; e += 4) {
        float32x4_t kv[4];
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) kv[j] = load4(fmt, kr[j], e);
#pragma GCC unroll 4
        for (size_t r = 0; r < R; r++) {
            const float32x4_t qv = vld1q_f32(q + r * ldq + e);
#pragma GCC unroll 4
            for (int j = 0; j < 4; j++) acc[r][j] = vfmaq_f32(acc[r][j], qv, kv[j]);
        }
    }
    if (e < d) {
        float32x4_t kv[4];
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) kv[j] = load_part(fmt, kr[j], e, d - e);
#pragma GCC unroll 4
        for (size_t r = 0; r < R; r++) {
            const float32x4_t qv = load_part(FMHA_FORMAT_F32, q + r * ldq, e, d - e);
#pragma GCC unroll 4
            for (int j = 0; j < 4; j++) acc[r][j] = vfmaq_f32(acc[r][j], qv, kv[j]);
        }
    }
    const float32x4_t sv = vdupq_n_f32(scale);
#pragma GCC unroll 4
    for (size_t r = 0; r < R; r++) {
        /* lane j: the sum of acc[r][j]'s lanes */
        const float32x4_t dot = vpaddq_f32(vpaddq_f32(acc[r][0], acc[r][1]), vpaddq_f32(acc[r][2], acc[r][3]));
        const float32x4_t x = vmulq_f32(dot, sv);
        if (nj == 4) vst1q_f32(s + r * lds, x);
        else {
            float t[4];
            vst1q_f32(t, x);
            memcpy(s + r * lds, t, nj * sizeof(float));
        }
    }
}

FMHA_INLINE void scores(const int fmt, size_t rows, size_t nk, size_t d, const float *q, size_t ldq, const void *k,
                        size_t ldk, float *s, size_t lds, float scale) {
    const size_t ldk_bytes = ldk * elem_bytes(fmt);
    for (size_t j0 = 0; j0 < nk; j0 += 4) {
        const size_t nj = nk - j0 < 4 ? nk - j0 : 4;
        const char *kj = (const char *)k + j0 * ldk_bytes;
        size_t r = 0;
        for (; r + 4 <= rows; r += 4) scores_block(fmt, 4, nj, d, q + r * ldq, ldq, kj, ldk_bytes, s + r * lds + j0, lds, scale);
        switch (rows - r) {
        case 3: scores_block(fmt, 3, nj, d, q + r * ldq, ldq, kj, ldk_bytes, s + r * lds + j0, lds, scale); break;
        case 2: scores_block(fmt, 2, nj, d, q + r * ldq, ldq, kj, ldk_bytes, s + r * lds + j0, lds, scale); break;
        case 1: scores_block(fmt, 1, nj, d, q + r * ldq, ldq, kj, ldk_bytes, s + r * lds + j0, lds, scale); break;
        default: break;
        }
    }
}

enum { VAL_ROWS = 6, VAL_VECS = 4 };

/* Rows [0, R) of o, value dims [c0, c0 + 4 VECS) (the last vector holding
 * `tail` < 4 dims when tail != 0): o = o alpha + sum_j p[r][j] V(j, c),
 * each lane an fma chain over j from zero, then one fma with o alpha. */
FMHA_INLINE void values_block(const int fmt, const size_t R, const int VECS, size_t tail, size_t nk, size_t c0,
                              const float *p, size_t ldp, const char *v, size_t ldv_bytes, float *o, size_t ldo,
                              const float *alpha) {
    float32x4_t acc[VAL_ROWS][VAL_VECS];
#pragma GCC unroll 6
    for (size_t r = 0; r < R; r++)
#pragma GCC unroll 4
        for (int c = 0; c < VECS; c++) acc[r][c] = vdupq_n_f32(0.0f);
    for (size_t j = 0; j < nk; j++) {
        const char *vr = v + j * ldv_bytes;
        float32x4_t vv[VAL_VECS];
#pragma GCC unroll 4
        for (int c = 0; c < VECS; c++)
            vv[c] = tail && c == VECS - 1 ? load_part(fmt, vr, c0 + 4 * (size_t)c, tail)
                                          : load4(fmt, vr, c0 + 4 * (size_t)c);
#pragma GCC unroll 6
        for (size_t r = 0; r < R; r++) {
            const float32x4_t pv = vld1q_dup_f32(p + r * ldp + j);
#pragma GCC unroll 4
            for (int c = 0; c < VECS; c++) acc[r][c] = vfmaq_f32(acc[r][c], pv, vv[c]);
        }
    }
#pragma GCC unroll 6
    for (size_t r = 0; r < R; r++) {
        const float32x4_t a = vld1q_dup_f32(alpha + r);
        float *orow = o + r * ldo + c0;
#pragma GCC unroll 4
        for (int c = 0; c < VECS; c++) {
            if (tail && c == VECS - 1) {
                float t[4] = {0};
                memcpy(t, orow + 4 * c, tail * sizeof(float));
                vst1q_f32(t, vfmaq_f32(acc[r][c], vld1q_f32(t), a));
                memcpy(orow + 4 * c, t, tail * sizeof(float));
            } else {
                vst1q_f32(orow + 4 * c, vfmaq_f32(acc[r][c], vld1q_f32(orow + 4 * c), a));
            }
        }
    }
}

/* All rows of one column chunk, R rows per block with R a constant. */
#define VALUES_ROWS(VECS, TAIL)                                                                                        \
    do {                                                                                                               \
        size_t r = 0;                                                                                                  \
        for (; r + VAL_ROWS <= rows; r += VAL_ROWS)                                                                    \
            values_block(fmt, VAL_ROWS, VECS, TAIL, nk, c0, p + r * ldp, ldp, v, ldv_bytes, o + r * ldo, ldo,         \
                         alpha + r);                                                                                   \
        switch (rows - r) {                                                                                            \
        case 5: values_block(fmt, 5, VECS, TAIL, nk, c0, p + r * ldp, ldp, v, ldv_bytes, o + r * ldo, ldo, alpha + r); break; \
        case 4: values_block(fmt, 4, VECS, TAIL, nk, c0, p + r * ldp, ldp, v, ldv_bytes, o + r * ldo, ldo, alpha + r); break; \
        case 3: values_block(fmt, 3, VECS, TAIL, nk, c0, p + r * ldp, ldp, v, ldv_bytes, o + r * ldo, ldo, alpha + r); break; \
        case 2: values_block(fmt, 2, VECS, TAIL, nk, c0, p + r * ldp, ldp, v, ldv_bytes, o + r * ldo, ldo, alpha + r); break; \
        case 1: values_block(fmt, 1, VECS, TAIL, nk, c0, p + r * ldp, ldp, v, ldv_bytes, o + r * ldo, ldo, alpha + r); break; \
        default: break;                                                                                                \
        }                                                                                                              \
    } while (0)

FMHA_INLINE void values(const int fmt, size_t rows, size_t nk, size_t dv, const float *p, size_t ldp, const void *v,
                        size_t ldv, float *o, size_t ldo, const float *alpha) {
    const size_t ldv_bytes = ldv * elem_bytes(fmt);
    size_t c0 = 0;
    for (; c0 + 4 * VAL_VECS <= dv; c0 += 4 * VAL_VECS) VALUES_ROWS(VAL_VECS, 0);
    /* the last < 16 dims: whole vectors, then a part of one */
    for (; c0 + 4 <= dv; c0 += 4) VALUES_ROWS(1, 0);
    if (c0 < dv) VALUES_ROWS(1, dv - c0);
}

void fmha_f32_decode_scores__neon(size_t rows, size_t nk, size_t d, const float *q, size_t ldq, const void *k,
                                  size_t ldk, float *s, size_t lds, float scale) {
    scores(FMHA_FORMAT_F32, rows, nk, d, q, ldq, k, ldk, s, lds, scale);
}
void fmha_bf16kv_decode_scores__neon(size_t rows, size_t nk, size_t d, const float *q, size_t ldq, const void *k,
                                     size_t ldk, float *s, size_t lds, float scale) {
    scores(FMHA_FORMAT_BF16, rows, nk, d, q, ldq, k, ldk, s, lds, scale);
}
void fmha_f16kv_decode_scores__neon(size_t rows, size_t nk, size_t d, const float *q, size_t ldq, const void *k,
                                    size_t ldk, float *s, size_t lds, float scale) {
    scores(FMHA_FORMAT_F16, rows, nk, d, q, ldq, k, ldk, s, lds, scale);
}
void fmha_f32_decode_values__neon(size_t rows, size_t nk, size_t dv, const float *p, size_t ldp, const void *v,
                                  size_t ldv, float *o, size_t ldo, const float *alpha) {
    values(FMHA_FORMAT_F32, rows, nk, dv, p, ldp, v, ldv, o, ldo, alpha);
}
void fmha_bf16kv_decode_values__neon(size_t rows, size_t nk, size_t dv, const float *p, size_t ldp, const void *v,
                                     size_t ldv, float *o, size_t ldo, const float *alpha) {
    values(FMHA_FORMAT_BF16, rows, nk, dv, p, ldp, v, ldv, o, ldo, alpha);
}
void fmha_f16kv_decode_values__neon(size_t rows, size_t nk, size_t dv, const float *p, size_t ldp, const void *v,
                                    size_t ldv, float *o, size_t ldo, const float *alpha) {
    values(FMHA_FORMAT_F16, rows, nk, dv, p, ldp, v, ldv, o, ldo, alpha);
}

/* Row-wise online-softmax step; contract in ukernel.h. FMAX and FMAXV
 * return NaN when an operand is, so a NaN score or running max makes the
 * row's max NaN (the scalar kernel's NaN, bit for bit); the tail of a row
 * is padded with -inf, whose exp is 0. */
void fmha_f32_decode_softmax__neon(size_t rows, size_t nk, float *s, size_t lds, float *m, float *l, float *alpha) {
    const size_t nk4 = nk / 4 * 4, tail = nk - nk4;
    for (size_t r = 0; r < rows; r++) {
        float *row = s + r * lds;
        float32x4_t mx = vdupq_n_f32(m[r]);
        for (size_t j = 0; j < nk4; j += 4) mx = vmaxq_f32(mx, vld1q_f32(row + j));
        float t[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
        memcpy(t, row + nk4, tail * sizeof(float));
        mx = vmaxq_f32(mx, vld1q_f32(t));
        float m_new = vmaxvq_f32(mx);
        if (isnan(m_new)) m_new = NAN;
        const float m_use = m_new == -INFINITY ? 0.0f : m_new;
        const float32x4_t mu = vdupq_n_f32(m_use);
        float32x4_t sum = vdupq_n_f32(0.0f);
        for (size_t j = 0; j < nk4; j += 4) {
            const float32x4_t p = neon_exp_f32(vsubq_f32(vld1q_f32(row + j), mu));
            vst1q_f32(row + j, p);
            sum = vaddq_f32(sum, p);
        }
        const float32x4_t pt = neon_exp_f32(vsubq_f32(vld1q_f32(t), mu));
        vst1q_f32(t, pt);
        memcpy(row + nk4, t, tail * sizeof(float));
        sum = vaddq_f32(sum, pt);
        const float a = vgetq_lane_f32(neon_exp_f32(vdupq_n_f32(m[r] - m_use)), 0);
        alpha[r] = a;
        l[r] = l[r] * a + vaddvq_f32(sum);
        m[r] = m_new;
    }
}

/* bf16 to float32: each 16-bit pattern shifted into the top half (exact). */
void fmha_widen_bf16__neon(size_t n, const void *src_row, float *dst) {
    const uint16_t *src = src_row;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const uint16x8_t h = vld1q_u16(src + i);
        vst1q_f32(dst + i, vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(h), 16)));
        vst1q_f32(dst + i + 4, vreinterpretq_f32_u32(vshll_high_n_u16(h, 16)));
    }
    for (; i < n; i++) dst[i] = fmha_bf16_to_f32(src[i]);
}

/* f16 to float32 with FCVTL (exact; a signalling NaN comes back quiet). */
void fmha_widen_f16__neon(size_t n, const void *src_row, float *dst) {
    const uint16_t *src = src_row;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const float16x8_t h = vreinterpretq_f16_u16(vld1q_u16(src + i));
        vst1q_f32(dst + i, vcvt_f32_f16(vget_low_f16(h)));
        vst1q_f32(dst + i + 4, vcvt_high_f32_f16(h));
    }
    for (; i < n; i++) dst[i] = fmha_f16_to_f32(src[i]);
}
