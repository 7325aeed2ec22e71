/* convert.h: element types at the library's edges. Inputs of any dtype are
 * widened to float32 when tiles are packed, results are narrowed once when
 * stored (round to nearest even), so all arithmetic runs in float32. */
#ifndef FMHA_CONVERT_H
#define FMHA_CONVERT_H

#include <stdint.h>
#include <string.h>

#include "fmha.h"

/* One past the last fmha_dtype: the bound of range checks. Every switch
 * over fmha_dtype lists each value and has no default, so -Wswitch names
 * the sites a new dtype must handle. */
enum { FMHA_DTYPE_COUNT_ = FMHA_DTYPE_F16 + 1 };

static inline size_t fmha_dtype_size(fmha_dtype t) {
    switch (t) {
    case FMHA_DTYPE_F32: return 4;
    case FMHA_DTYPE_BF16:
    case FMHA_DTYPE_F16: return 2;
    }
    return 0;
}

/* A float32's bits, and the float32 of bits. */
static inline uint32_t fmha_f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static inline float fmha_f32_of_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline float fmha_bf16_to_f32(uint16_t h) { return fmha_f32_of_bits((uint32_t)h << 16); }

static inline uint16_t fmha_f32_to_bf16(float f) {
    uint32_t u = fmha_f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest even */
    return (uint16_t)(u >> 16);
}

static inline float fmha_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, u;
    if (exp == 0x1f) {
        u = sign | 0x7f800000u | (man << 13);
    } else if (exp != 0) {
        u = sign | ((exp + 112u) << 23) | (man << 13);
    } else if (man == 0) {
        u = sign;
    } else { /* subnormal: normalise */
        int e = -1;
        do { man <<= 1; e++; } while (!(man & 0x400u));
        u = sign | ((uint32_t)(112 - e) << 23) | ((man & 0x3ffu) << 13);
    }
    return fmha_f32_of_bits(u);
}

static inline uint16_t fmha_f32_to_f16(float f) {
    const uint32_t u = fmha_f32_bits(f);
    uint32_t sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);            /* NaN */
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);           /* rounds to inf */
    if (a >= 0x38800000u) {                                            /* normal half */
        uint32_t r = a - 0x38000000u;                                  /* rebias 127 -> 15 */
        r += 0xfffu + ((r >> 13) & 1u);
        return (uint16_t)(sign | (r >> 13));
    }
    if (a < 0x33000000u) return (uint16_t)sign;                        /* below half of min subnormal */
    /* subnormal half: shift the 24-bit significand, round to nearest even */
    uint32_t e = a >> 23, man = (a & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126u - e; /* 14..24 */
    uint32_t q = man >> shift, rem = man & ((1u << shift) - 1u), half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (q & 1u))) q++;
    return (uint16_t)(sign | q);
}

/* Element idx of a tensor of dtype t, widened. */
static inline float fmha_load(const void *base, fmha_dtype t, int64_t idx) {
    switch (t) {
    case FMHA_DTYPE_F32: return ((const float *)base)[idx];
    case FMHA_DTYPE_BF16: return fmha_bf16_to_f32(((const uint16_t *)base)[idx]);
    case FMHA_DTYPE_F16: return fmha_f16_to_f32(((const uint16_t *)base)[idx]);
    }
    return 0.0f;
}

/* Stores x as element idx of a tensor of dtype t (rounded to nearest even). */
static inline void fmha_store(void *base, fmha_dtype t, int64_t idx, float x) {
    switch (t) {
    case FMHA_DTYPE_F32: ((float *)base)[idx] = x; return;
    case FMHA_DTYPE_BF16: ((uint16_t *)base)[idx] = fmha_f32_to_bf16(x); return;
    case FMHA_DTYPE_F16: ((uint16_t *)base)[idx] = fmha_f32_to_f16(x); return;
    }
}

/* dst[e] = element first + e * stride of a tensor of dtype t, widened, e < n:
 * one dtype test per row instead of one per element. */
static inline void fmha_load_row(const void *base, fmha_dtype t, int64_t first, int64_t stride,
                                 int64_t n, float *dst) {
    switch (t) {
    case FMHA_DTYPE_F32: {
        const float *x = (const float *)base + first;
        for (int64_t e = 0; e < n; e++) dst[e] = x[e * stride];
        return;
    }
    case FMHA_DTYPE_BF16:
    case FMHA_DTYPE_F16:
        for (int64_t e = 0; e < n; e++) dst[e] = fmha_load(base, t, first + e * stride);
        return;
    }
}

/* Element first + e * stride of a tensor of dtype t = scale * src[e] (0 when
 * src is NULL), rounded to nearest even, e < n. */
static inline void fmha_store_row(void *base, fmha_dtype t, int64_t first, int64_t stride, int64_t n,
                                  const float *src, float scale) {
    switch (t) {
    case FMHA_DTYPE_F32: {
        float *x = (float *)base + first;
        for (int64_t e = 0; e < n; e++) x[e * stride] = src ? scale * src[e] : 0.0f;
        return;
    }
    case FMHA_DTYPE_BF16:
    case FMHA_DTYPE_F16:
        for (int64_t e = 0; e < n; e++) fmha_store(base, t, first + e * stride, src ? scale * src[e] : 0.0f);
        return;
    }
}

/* The 32-bit word (base[lo], base[hi]) of two bf16 elements (lo in the low
 * half), the pair layout of vdpbf16ps; hi is replaced by 0 when !has_hi. */
static inline uint32_t fmha_bf16_pair(const uint16_t *base, int64_t lo, int64_t hi, int has_hi) {
    return (uint32_t)base[lo] | (has_hi ? (uint32_t)base[hi] << 16 : 0u);
}

#endif /* FMHA_CONVERT_H */
