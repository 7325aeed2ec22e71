/* scalar/decode.c: the plain-C decode microkernels (keys in the lanes), the
 * specification the SIMD decode kernels are tested against. Contract in
 * ../ukernel.h. Compiled with no ISA flags. */
#include <math.h>
#include <string.h>

#include "runtime/convert.h"
#include "format/format.h"
#include "decode.h"
#include "fma.h"

/* s[r][j] = scale * q_r . k_j: the dot product is summed from zero, then scaled. */
FMHA_SCALAR_FMA_CLONES static void f32_decode_scores__scalar_fma(size_t rows, size_t nk, size_t d, const float *q, size_t ldq,
                                    const void *k_row0, size_t ldk, float *s, size_t lds, float scale) {
    const float *k = k_row0;
    for (size_t r = 0; r < rows; r++)
        for (size_t j = 0; j < nk; j++) {
            float dot = 0.0f;
            for (size_t e = 0; e < d; e++) dot = fmaf(q[r * ldq + e], k[j * ldk + e], dot);
            s[r * lds + j] = dot * scale;
        }
}

/* (the clones are static: an exported ifunc is not portable across compilers) */
void fmha_f32_decode_scores__scalar(size_t rows, size_t nk, size_t d, const float *q, size_t ldq, const void *k_row0, size_t ldk, float *s,
                                    size_t lds, float scale) {
    f32_decode_scores__scalar_fma(rows, nk, d, q, ldq, k_row0, ldk, s, lds, scale);
}

/* Row-wise online-softmax step. */
void fmha_f32_decode_softmax__scalar(size_t rows, size_t nk, float *s, size_t lds, float *m,
                                     float *l, float *alpha) {
    for (size_t r = 0; r < rows; r++) {
        float *row = s + r * lds;
        float mx = m[r];
        int nan = isnan(mx);
        for (size_t j = 0; j < nk; j++) {
            mx = fmaxf(mx, row[j]);
            nan |= isnan(row[j]);
        }
        if (nan) mx = NAN; /* a NaN score makes the row NaN */
        float m_use = mx == -INFINITY ? 0.0f : mx;
        float sum = 0.0f;
        for (size_t j = 0; j < nk; j++) {
            row[j] = expf(row[j] - m_use);
            sum += row[j];
        }
        alpha[r] = expf(m[r] - m_use);
        l[r] = l[r] * alpha[r] + sum;
        m[r] = mx;
    }
}

/* o[r] = o[r] alpha[r] + sum_j p[r][j] v_j. */
FMHA_SCALAR_FMA_CLONES static void f32_decode_values__scalar_fma(size_t rows, size_t nk, size_t dv, const float *p, size_t ldp,
                                    const void *v_row0, size_t ldv, float *o, size_t ldo,
                                    const float *alpha) {
    const float *v = v_row0;
    for (size_t r = 0; r < rows; r++)
        for (size_t c = 0; c < dv; c++) {
            float acc = 0.0f;
            for (size_t j = 0; j < nk; j++) acc = fmaf(p[r * ldp + j], v[j * ldv + c], acc);
            o[r * ldo + c] = fmaf(o[r * ldo + c], alpha[r], acc);
        }
}

/* (the clones are static: an exported ifunc is not portable across compilers) */
void fmha_f32_decode_values__scalar(size_t rows, size_t nk, size_t dv, const float *p, size_t ldp, const void *v_row0, size_t ldv, float *o,
                                    size_t ldo, const float *alpha) {
    f32_decode_values__scalar_fma(rows, nk, dv, p, ldp, v_row0, ldv, o, ldo, alpha);
}

/* The float32 format's rows: a copy. */
void fmha_load_f32__scalar(size_t n, const void *src_row, float *dst) { memcpy(dst, src_row, n * sizeof(float)); }

void fmha_widen_bf16__scalar(size_t n, const void *src_row, float *dst) {
    const uint16_t *src = src_row;
    for (size_t i = 0; i < n; i++) dst[i] = fmha_bf16_to_f32(src[i]);
}

void fmha_widen_f16__scalar(size_t n, const void *src_row, float *dst) {
    const uint16_t *src = src_row;
    for (size_t i = 0; i < n; i++) dst[i] = fmha_f16_to_f32(src[i]);
}

/* The 8-bit and block formats: their dequantisations (format.c), value by value. */
#define FORMAT_LOAD(name, id)                                                                                          \
    void fmha_load_##name##__scalar(size_t n, const void *src_row, float *dst) {                                      \
        const fmha_cache_format *f = fmha_cache_format_at(id);                                                         \
        for (size_t i = 0; i < n; i++) dst[i] = f->dequant(src_row, (int64_t)i);                                       \
    }
FORMAT_LOAD(int8, FMHA_FORMAT_INT8)
FORMAT_LOAD(e4m3, FMHA_FORMAT_FP8_E4M3)
FORMAT_LOAD(e5m2, FMHA_FORMAT_FP8_E5M2)
FORMAT_LOAD(q8_0, FMHA_FORMAT_Q8_0)
FORMAT_LOAD(q4_0, FMHA_FORMAT_Q4_0)

/* ---- integer scores on the q8_0 query (the specification of every ISA's
 * scores_q8: exact int32 block sums, then the float32 steps in block order) ---- */

/* Key j's integer of element e (kq) and block b's scale (kd) in each format. */
static int32_t kq_int8(const uint8_t *row, size_t e) { return (int8_t)row[e]; }
static float kd_one(const uint8_t *row, size_t b) { return (void)row, (void)b, 1.0f; }
static int32_t kq_q8_0(const uint8_t *row, size_t e) {
    return (int8_t)row[e / FMHA_GGUF_BLOCK * FMHA_Q8_0_BLOCK_BYTES + FMHA_GGUF_VALUES_AT + e % FMHA_GGUF_BLOCK];
}
static int32_t kq_q4_0(const uint8_t *row, size_t e) {
    const uint8_t byte = row[e / FMHA_GGUF_BLOCK * FMHA_Q4_0_BLOCK_BYTES + FMHA_GGUF_VALUES_AT + e % 16];
    return (e % FMHA_GGUF_BLOCK < 16 ? byte & 15 : byte >> 4) - 8;
}
static float half_at(const uint8_t *p) { return fmha_f16_to_f32((uint16_t)(p[0] | p[1] << 8)); }
static float kd_q8_0(const uint8_t *row, size_t b) { return half_at(row + b * FMHA_Q8_0_BLOCK_BYTES); }
static float kd_q4_0(const uint8_t *row, size_t b) { return half_at(row + b * FMHA_Q4_0_BLOCK_BYTES); }

FMHA_SCALAR_FMA_CLONES static void scores_q8(int32_t (*kq)(const uint8_t *, size_t), float (*kd)(const uint8_t *, size_t), size_t rows,
                      size_t nk, size_t d, const fmha_q8_rows *q, const void *k, size_t ldk, float *s, size_t lds,
                      float scale) {
    for (size_t r = 0; r < rows; r++)
        for (size_t j = 0; j < nk; j++) {
            const uint8_t *row = (const uint8_t *)k + j * ldk;
            float acc = 0.0f;
            for (size_t b = 0; b < d / 32; b++) {
                int32_t isum = 0;
                for (size_t e = 32 * b; e < 32 * b + 32; e++) isum += q->q[r * q->ld + e] * kq(row, e);
                acc = fmaf((float)isum, q->d[r * (q->ld / 32) + b] * kd(row, b), acc);
            }
            s[r * lds + j] = acc * scale;
        }
}

#define SCORES_Q8(name)                                                                                               \
    void fmha_##name##kv_scores_q8__scalar(size_t rows, size_t nk, size_t d, const fmha_q8_rows *q, const void *k,    \
                                           size_t ldk, float *s, size_t lds, float scale) {                           \
        scores_q8(kq_##name, KD_##name, rows, nk, d, q, k, ldk, s, lds, scale);                                       \
    }
#define KD_int8 kd_one
#define KD_q8_0 kd_q8_0
#define KD_q4_0 kd_q4_0
SCORES_Q8(int8)
SCORES_Q8(q8_0)
SCORES_Q8(q4_0)

/* ---- P V in integers on 16-bit P (the specification of values_int) ---- */
FMHA_SCALAR_FMA_CLONES static void values_int(int32_t (*vq)(const uint8_t *, size_t), float (*vd)(const uint8_t *, size_t),
                                              size_t rows, size_t nk, size_t dv, const float *p, size_t ldp,
                                              const void *const *v_rows, float *o, size_t ldo, const float *alpha) {
    int32_t pq[64];
    for (size_t r = 0; r < rows; r++)
        for (size_t b = 0; b < (dv + 31) / 32; b++) {
            float w[64], pm = 0.0f, dm = 0.0f;
            for (size_t j = 0; j < nk; j++) {
                const float pj = p[r * ldp + j], dj = vd(v_rows[j], b);
                w[j] = pj * dj;
                pm = isnan(pj) || isnan(pm) ? NAN : fmaxf(pm, fabsf(pj));
                dm = isnan(dj) || isnan(dm) ? NAN : fmaxf(dm, fabsf(dj));
            }
            const float m = pm * dm; /* at least every |w_j| */
            const int finite = m <= 3.40282347e38f;
            /* weights below 2^-100 count as 0 (32767 / m would overflow) */
            const float s = finite ? m / 32767.0f : NAN, inv = finite && m >= 0x1p-100f ? 32767.0f / m : 0.0f;
            for (size_t j = 0; j < nk; j++) pq[j] = finite ? (int32_t)rintf(w[j] * inv) : 0;
            for (size_t c = 32 * b; c < dv && c < 32 * b + 32; c++) {
                int32_t isum = 0;
                for (size_t j = 0; j < nk; j++) isum += pq[j] * vq(v_rows[j], c);
                o[r * ldo + c] = fmaf(o[r * ldo + c], alpha[r], (float)isum * s);
            }
        }
}

#define VALUES_INT(name)                                                                                              \
    void fmha_##name##kv_values_int__scalar(size_t rows, size_t nk, size_t dv, const float *p, size_t ldp,          \
                                            const void *const *v_rows, float *o, size_t ldo, const float *alpha) {  \
        values_int(kq_##name, KD_##name, rows, nk, dv, p, ldp, v_rows, o, ldo, alpha);                              \
    }
VALUES_INT(int8)
VALUES_INT(q8_0)
VALUES_INT(q4_0)

/* ---- float8 keys on the bf16 query (the specification of scores_bf16) ---- */
static float bf16_half(uint32_t w, int hi) {
    const uint32_t u = (hi ? w >> 16 : w & 0xffffu) << 16;
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

/* Element e of a key row: a float8 byte through `value`, or (value NULL)
 * a bf16. */
static float key_value(float (*value)(uint8_t), const void *row, size_t e) {
    if (value) return value(((const uint8_t *)row)[e]);
    return fmha_bf16_to_f32(((const uint16_t *)row)[e]);
}

FMHA_SCALAR_FMA_CLONES static void scores_bf16(float (*value)(uint8_t), size_t rows, size_t nk, size_t d, const uint32_t *q, size_t ldq,
                        const void *k, size_t ldk, float *s, size_t lds, float scale) {
    const size_t unit = value ? 1 : 2; /* bytes a storage unit */
    for (size_t r = 0; r < rows; r++)
        for (size_t j = 0; j < nk; j++) {
            const void *row = (const char *)k + j * ldk * unit;
            float lane[16] = {0};
            for (size_t t = 0; t < d / 32; t++)
                for (size_t i = 0; i < 16; i++) {
                    const uint32_t w = q[r * ldq + 16 * t + i];
                    lane[i] += bf16_half(w, 1) * key_value(value, row, 32 * t + 2 * i + 1);
                    lane[i] += bf16_half(w, 0) * key_value(value, row, 32 * t + 2 * i);
                }
            float g[4];
            for (int x = 0; x < 4; x++) g[x] = (lane[4 * x] + lane[4 * x + 2]) + (lane[4 * x + 1] + lane[4 * x + 3]);
            s[r * lds + j] = ((g[0] + g[1]) + (g[2] + g[3])) * scale;
        }
}

void fmha_e4m3kv_scores_bf16__scalar(size_t rows, size_t nk, size_t d, const uint32_t *q, size_t ldq, const void *k,
                                     size_t ldk, float *s, size_t lds, float scale) {
    scores_bf16(fmha_fp8_e4m3_to_f32, rows, nk, d, q, ldq, k, ldk, s, lds, scale);
}

void fmha_e5m2kv_scores_bf16__scalar(size_t rows, size_t nk, size_t d, const uint32_t *q, size_t ldq, const void *k,
                                     size_t ldk, float *s, size_t lds, float scale) {
    scores_bf16(fmha_fp8_e5m2_to_f32, rows, nk, d, q, ldq, k, ldk, s, lds, scale);
}

/* 16 rows in the lanes (the specification of scores_bf16_qt, float8 or,
 * value NULL, bf16 keys): one sum a (row, key) over the pairs in order */
FMHA_SCALAR_FMA_CLONES static void scores_bf16_qt(float (*value)(uint8_t), size_t rows, size_t nk, size_t d,
                                                  const uint32_t *qt, const void *k, size_t ldk, float *s, size_t lds,
                                                  float scale) {
    const size_t unit = value ? 1 : 2; /* bytes a storage unit */
    for (size_t r = 0; r < rows; r++)
        for (size_t j = 0; j < nk; j++) {
            const void *row = (const char *)k + j * ldk * unit;
            float acc = 0.0f;
            for (size_t p = 0; p < d / 2; p++) {
                const uint32_t w = qt[16 * p + r];
                acc += bf16_half(w, 1) * key_value(value, row, 2 * p + 1);
                acc += bf16_half(w, 0) * key_value(value, row, 2 * p);
            }
            s[r * lds + j] = acc * scale;
        }
}

void fmha_e4m3kv_scores_bf16_qt__scalar(size_t rows, size_t nk, size_t d, const uint32_t *qt, const void *k, size_t ldk,
                                        float *s, size_t lds, float scale) {
    scores_bf16_qt(fmha_fp8_e4m3_to_f32, rows, nk, d, qt, k, ldk, s, lds, scale);
}

void fmha_e5m2kv_scores_bf16_qt__scalar(size_t rows, size_t nk, size_t d, const uint32_t *qt, const void *k, size_t ldk,
                                        float *s, size_t lds, float scale) {
    scores_bf16_qt(fmha_fp8_e5m2_to_f32, rows, nk, d, qt, k, ldk, s, lds, scale);
}

void fmha_bf16kv_scores_bf16__scalar(size_t rows, size_t nk, size_t d, const uint32_t *q, size_t ldq, const void *k,
                                     size_t ldk, float *s, size_t lds, float scale) {
    scores_bf16(NULL, rows, nk, d, q, ldq, k, ldk, s, lds, scale);
}

void fmha_bf16kv_scores_bf16_qt__scalar(size_t rows, size_t nk, size_t d, const uint32_t *qt, const void *k, size_t ldk,
                                        float *s, size_t lds, float scale) {
    scores_bf16_qt(NULL, rows, nk, d, qt, k, ldk, s, lds, scale);
}

/* ---- P V on bf16 P (the specification of values_bf16) ----
 * V's element: a bf16, or a float8 byte through `value` (exact in bf16). */
FMHA_SCALAR_FMA_CLONES static void values_bf16(float (*value)(uint8_t), size_t rows, size_t nk, size_t dv,
                                               const float *p, size_t ldp, const void *const *v_rows, float *o,
                                               size_t ldo, const float *alpha) {
    for (size_t r = 0; r < rows; r++)
        for (size_t c = 0; c < dv; c++) {
            float acc = 0.0f;
            for (size_t j = 0; j < nk; j += 2) {
                if (j + 1 < nk)
                    acc += fmha_bf16_to_f32(fmha_f32_to_bf16(p[r * ldp + j + 1])) * key_value(value, v_rows[j + 1], c);
                acc += fmha_bf16_to_f32(fmha_f32_to_bf16(p[r * ldp + j])) * key_value(value, v_rows[j], c);
            }
            o[r * ldo + c] = fmaf(o[r * ldo + c], alpha[r], acc);
        }
}

void fmha_bf16kv_values_bf16__scalar(size_t rows, size_t nk, size_t dv, const float *p, size_t ldp,
                                     const void *const *v_rows, float *o, size_t ldo, const float *alpha) {
    values_bf16(NULL, rows, nk, dv, p, ldp, v_rows, o, ldo, alpha);
}

void fmha_e4m3kv_values_bf16__scalar(size_t rows, size_t nk, size_t dv, const float *p, size_t ldp,
                                     const void *const *v_rows, float *o, size_t ldo, const float *alpha) {
    values_bf16(fmha_fp8_e4m3_to_f32, rows, nk, dv, p, ldp, v_rows, o, ldo, alpha);
}

void fmha_e5m2kv_values_bf16__scalar(size_t rows, size_t nk, size_t dv, const float *p, size_t ldp,
                                     const void *const *v_rows, float *o, size_t ldo, const float *alpha) {
    values_bf16(fmha_fp8_e5m2_to_f32, rows, nk, dv, p, ldp, v_rows, o, ldo, alpha);
}
