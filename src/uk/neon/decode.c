/* neon/decode.c: the NEON decode microkernels (keys in the lanes). Scores
 * run up to 4 query rows against 4 keys with 16 accumulators over the head
 * dimension and reduce them with one pairwise-add tree; values keep up to 6
 * rows x 16 value dims, each an fma chain over the keys in order (the
 * scalar kernel's bits); the softmax runs the vector exp along the rows.
 * Every cache format's kernels are the float32 ones with their rows
 * widened in registers (bf16: a shift; f16 and fp8: FCVTL from a half;
 * int8: sign extension; GGUF blocks: q times the block's scale, the
 * specification's one rounding), so they give the float32 kernels' bits
 * on the loaded rows. Contract in
 * ../ukernel.h; ../scalar/decode.c is the specification. */
#include <arm_neon.h>
#include <math.h>
#include <string.h>

#include "runtime/convert.h"
#include "exp.h"
#include "neon.h"

#define FMHA_INLINE static inline __attribute__((always_inline))

/* Bytes of a format's storage unit (row strides count them; an element
 * of the non-block formats). */
FMHA_INLINE size_t elem_bytes(const int fmt) {
    return fmt == FMHA_FORMAT_F32 ? 4 : fmt == FMHA_FORMAT_BF16 || fmt == FMHA_FORMAT_F16 ? 2 : 1;
}

FMHA_INLINE int is_block(const int fmt) { return fmt == FMHA_FORMAT_Q8_0 || fmt == FMHA_FORMAT_Q4_0; }

/* Four bytes at p in the low lanes of a vector. */
FMHA_INLINE uint8x8_t load_bytes4(const void *p) {
    uint32_t w;
    memcpy(&w, p, 4);
    return vreinterpret_u8_u32(vdup_n_u32(w));
}

/* Four fp8 values as float32 (exact). E5M2 is the top byte of a half;
 * E4M3FN shifted into a half's exponent and mantissa is the value / 2^8
 * (subnormals too), and S.1111.111 is its NaN. */
FMHA_INLINE float32x4_t widen_fp8(const int fmt, uint8x8_t b8) {
    const uint16x4_t b = vget_low_u16(vmovl_u8(b8));
    if (fmt == FMHA_FORMAT_FP8_E5M2) return vcvt_f32_f16(vreinterpret_f16_u16(vshl_n_u16(b, 8)));
    const uint16x4_t mag = vand_u16(b, vdup_n_u16(0x7f));
    const uint16x4_t h = vorr_u16(vshl_n_u16(mag, 7), vshl_n_u16(vshr_n_u16(b, 7), 15));
    const float32x4_t x = vmulq_n_f32(vcvt_f32_f16(vreinterpret_f16_u16(h)), 256.0f);
    const uint32x4_t nan = vreinterpretq_u32_s32(vmovl_s16(vreinterpret_s16_u16(vceq_u16(mag, vdup_n_u16(0x7f)))));
    return vbslq_f32(nan, vdupq_n_f32(NAN), x);
}

/* The GGUF block holding value e of a run of blocks, and its half scale. */
FMHA_INLINE const uint8_t *block_at(const int fmt, const void *row, size_t e) {
    return (const uint8_t *)row + e / FMHA_GGUF_BLOCK * fmha_int_block_bytes((fmha_cache_format_id)fmt);
}
FMHA_INLINE float block_scale(const int fmt, const void *row, size_t e) {
    uint16_t dh;
    memcpy(&dh, block_at(fmt, row, e), 2);
    return fmha_f16_to_f32(dh);
}

/* Values [e, e + 4) of a run of GGUF blocks (e % 4 == 0) before the
 * scale: q8_0's int8, q4_0's nibble - 8 (values 0..15 the low nibbles of
 * its 16 bytes, 16..31 the high ones), as float32 (exact). */
FMHA_INLINE float32x4_t block_q4(const int fmt, const void *row, size_t e) {
    const uint8_t *blk = block_at(fmt, row, e);
    int32x4_t q;
    if (fmt == FMHA_FORMAT_Q8_0) {
        q = vmovl_s16(vget_low_s16(vmovl_s8(vreinterpret_s8_u8(load_bytes4(blk + 2 + e % 32)))));
    } else {
        const size_t i = e % 32;
        uint8x8_t b = load_bytes4(blk + 2 + i % 16);
        b = i >= 16 ? vshr_n_u8(b, 4) : vand_u8(b, vdup_n_u8(15));
        q = vsubq_s32(vreinterpretq_s32_u32(vmovl_u16(vget_low_u16(vmovl_u8(b)))), vdupq_n_s32(8));
    }
    return vcvtq_f32_s32(q);
}

/* The values themselves: q times the block's scale d, one rounding (the
 * specification's product). The loops below fetch d once a block and call
 * this with it. */
FMHA_INLINE float32x4_t block_values4(const int fmt, const void *row, size_t e, float d) {
    return vmulq_n_f32(block_q4(fmt, row, e), d);
}

/* Elements [e, e + 4) of a row of a non-block format, as float32 (exact
 * widening; the scales kept beside int8 and fp8 rows are the driver's).
 * The block formats go through block_values4 with a scale fetched once a
 * block. */
FMHA_INLINE float32x4_t load4(const int fmt, const void *row, size_t e) {
    if (fmt == FMHA_FORMAT_F32) return vld1q_f32((const float *)row + e);
    if (fmt == FMHA_FORMAT_BF16 || fmt == FMHA_FORMAT_F16) {
        const uint16x4_t h = vld1_u16((const uint16_t *)row + e);
        if (fmt == FMHA_FORMAT_BF16) return vreinterpretq_f32_u32(vshll_n_u16(h, 16));
        return vcvt_f32_f16(vreinterpret_f16_u16(h));
    }
    const uint8x8_t b = load_bytes4((const uint8_t *)row + e);
    if (fmt == FMHA_FORMAT_INT8) return vcvtq_f32_s32(vmovl_s16(vget_low_s16(vmovl_s8(vreinterpret_s8_u8(b)))));
    return widen_fp8(fmt, b);
}

/* Elements [e, e + n) of a row (n < 4; never a block format, whose rows
 * are whole blocks of 32), zeros after them; reads only those. */
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
    float dk[4] = {0}; /* block formats: each key's scale for the block of e */
    for (; e + 4 <= d; e += 4) {
        float32x4_t kv[4];
        if (is_block(fmt) && e % 32 == 0) {
#pragma GCC unroll 4
            for (int j = 0; j < 4; j++) dk[j] = block_scale(fmt, kr[j], e);
        }
#pragma GCC unroll 4
        for (int j = 0; j < 4; j++) kv[j] = is_block(fmt) ? block_values4(fmt, kr[j], e, dk[j]) : load4(fmt, kr[j], e);
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
        /* block formats: dims [c0, c0 + 4 VECS) lie in one block (c0 % 16 == 0, or VECS 1) */
        const float dv_j = is_block(fmt) ? block_scale(fmt, vr, c0) : 0.0f;
        float32x4_t vv[VAL_VECS];
#pragma GCC unroll 4
        for (int c = 0; c < VECS; c++)
            vv[c] = is_block(fmt) ? block_values4(fmt, vr, c0 + 4 * (size_t)c, dv_j)
                    : tail && c == VECS - 1 ? load_part(fmt, vr, c0 + 4 * (size_t)c, tail)
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

/* The 8-bit and GGUF formats' kernels: the float32 ones on rows widened
 * in registers. */
#define FORMAT_KERNELS(name, fmt)                                                                                      \
    void fmha_##name##kv_decode_scores__neon(size_t rows, size_t nk, size_t d, const float *q, size_t ldq,              \
                                             const void *k, size_t ldk, float *s, size_t lds, float scale) {           \
        scores(fmt, rows, nk, d, q, ldq, k, ldk, s, lds, scale);                                                       \
    }                                                                                                                  \
    void fmha_##name##kv_decode_values__neon(size_t rows, size_t nk, size_t dv, const float *p, size_t ldp,            \
                                             const void *v, size_t ldv, float *o, size_t ldo, const float *alpha) {    \
        values(fmt, rows, nk, dv, p, ldp, v, ldv, o, ldo, alpha);                                                      \
    }
FORMAT_KERNELS(int8, FMHA_FORMAT_INT8)
FORMAT_KERNELS(e4m3, FMHA_FORMAT_FP8_E4M3)
FORMAT_KERNELS(e5m2, FMHA_FORMAT_FP8_E5M2)
FORMAT_KERNELS(q8_0, FMHA_FORMAT_Q8_0)
FORMAT_KERNELS(q4_0, FMHA_FORMAT_Q4_0)

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
