/* quantize.c: fmha_kv_quantize, float32 rows written into a cache format,
 * rounding as each format's reference does (ggml's quantize_row_q8_0_ref
 * and quantize_row_q4_0_ref bit for bit for the GGUF blocks), so that a
 * quantized cache can be kept without another library. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/strided.h"
#include "runtime/convert.h"
#include "runtime/error.h"
#include "format/format.h"

size_t fmha_kv_format_row_bytes(fmha_kv_format format, int64_t dim) {
    if (format <= FMHA_KV_FORMAT_DTYPE || format > FMHA_KV_FORMAT_Q4_0 || dim < 1 || dim > ((int64_t)1 << 40)) return 0;
    const fmha_cache_format *f = fmha_cache_format_at((fmha_cache_format_id)(format - FMHA_KV_FORMAT_F32));
    if (dim % f->block) return 0;
    return (size_t)fmha_format_row_bytes(f, dim);
}

/* OCP float8 with m mantissa bits, exponent bias `bias`, largest finite
 * `top` (its bits `top_bits`), NaN bits `nan_bits`: y rounded to nearest
 * even on the format's grid, saturated to +-top. On the float's bits (no
 * libm call: a cache of a billion values quantizes in seconds); equal to
 * rint(|y| / quantum) * quantum on every float. */
static uint8_t f32_to_fp8(float y, int m, int bias, float top, uint8_t top_bits, uint8_t nan_bits) {
    uint32_t u;
    memcpy(&u, &y, sizeof u);
    const uint8_t sign = (uint8_t)(u >> 24 & 0x80u);
    u &= 0x7fffffffu; /* |y| */
    if (u > 0x7f800000u) return sign | nan_bits;
    float a;
    memcpy(&a, &u, sizeof a);
    if (a >= top) return sign | top_bits;
    const int emin = 1 - bias; /* exponent of the smallest normal */
    if (u < (uint32_t)(127 + emin) << 23) {
        /* subnormal or zero: a multiple of 2^(emin - m), to nearest even
         * (the scaling is exact; adding 2^23 rounds to an integer) */
        const float t = a * (float)(1u << (m - emin)), magic = 8388608.0f;
        return sign | (uint8_t)(int)((t + magic) - magic);
    }
    /* the mantissa rounded to m bits, to nearest even (a carry moves the exponent) */
    const int shift = 23 - m;
    u += (1u << (shift - 1)) - 1u + (u >> shift & 1u);
    const uint32_t e = (u >> 23) - 127u + (uint32_t)bias, mant = u >> shift & ((1u << m) - 1u);
    return sign | (uint8_t)(e << m | mant);
}

/* ggml's quantize_row_q8_0_ref on one block of 32 */
static void block_q8_0(const float *x, uint8_t *blk) {
    const uint16_t dh = fmha_f32_to_f16(fmha_q8_0_block(x, (int8_t *)(blk + 2)));
    blk[0] = (uint8_t)(dh & 0xff);
    blk[1] = (uint8_t)(dh >> 8);
}

/* ggml's quantize_row_q4_0_ref on one block of 32 */
static void block_q4_0(const float *x, uint8_t *blk) {
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < 32; j++)
        if (amax < fabsf(x[j])) {
            amax = fabsf(x[j]);
            max = x[j];
        }
    const float d = max / -8;
    const float id = d ? 1.0f / d : 0.0f;
    const uint16_t dh = fmha_f32_to_f16(d);
    blk[0] = (uint8_t)(dh & 0xff);
    blk[1] = (uint8_t)(dh >> 8);
    for (int j = 0; j < 16; j++) {
        const int8_t a = (int8_t)(x[j] * id + 8.5f), b = (int8_t)(x[16 + j] * id + 8.5f);
        const uint8_t lo = a < 15 ? (uint8_t)a : 15, hi = b < 15 ? (uint8_t)b : 15;
        blk[2 + j] = (uint8_t)(lo | hi << 4);
    }
}

/* Row `row` [dim] float32 into the format at out; *scale as the format
 * uses it (written for int8, read for fp8). */
static void quantize_row(fmha_cache_format_id id, const float *row, int64_t dim, void *out, float *scale) {
    switch (id) {
    case FMHA_FORMAT_F32: memcpy(out, row, (size_t)dim * sizeof(float)); return;
    case FMHA_FORMAT_BF16:
        for (int64_t e = 0; e < dim; e++) ((uint16_t *)out)[e] = fmha_f32_to_bf16(row[e]);
        return;
    case FMHA_FORMAT_F16:
        for (int64_t e = 0; e < dim; e++) ((uint16_t *)out)[e] = fmha_f32_to_f16(row[e]);
        return;
    case FMHA_FORMAT_INT8: {
        float amax = 0.0f;
        for (int64_t e = 0; e < dim; e++) amax = amax > fabsf(row[e]) ? amax : fabsf(row[e]);
        const float d = amax / 127, id8 = d ? 1.0f / d : 0.0f;
        for (int64_t e = 0; e < dim; e++) ((int8_t *)out)[e] = (int8_t)fmha_round_away(row[e] * id8); /* |.| <= 127 */
        *scale = d;
        return;
    }
    case FMHA_FORMAT_FP8_E4M3:
    case FMHA_FORMAT_FP8_E5M2: {
        const int e4m3 = id == FMHA_FORMAT_FP8_E4M3;
        /* a scale of 0 (allowed, as attention allows it) holds only 0: every
         * value but NaN stores 0 */
        const float inv = *scale > 0.0f ? 1.0f / *scale : 0.0f;
        for (int64_t e = 0; e < dim; e++) {
            const float v = *scale > 0.0f || isnan(row[e]) ? row[e] * inv : 0.0f;
            ((uint8_t *)out)[e] = e4m3 ? f32_to_fp8(v, 3, 7, 448.0f, 0x7e, 0x7f) : f32_to_fp8(v, 2, 15, 57344.0f, 0x7b, 0x7f);
        }
        return;
    }
    case FMHA_FORMAT_Q8_0:
        for (int64_t blk = 0; blk < dim / FMHA_GGUF_BLOCK; blk++)
            block_q8_0(row + blk * FMHA_GGUF_BLOCK, (uint8_t *)out + blk * FMHA_Q8_0_BLOCK_BYTES);
        return;
    case FMHA_FORMAT_Q4_0:
        for (int64_t blk = 0; blk < dim / FMHA_GGUF_BLOCK; blk++)
            block_q4_0(row + blk * FMHA_GGUF_BLOCK, (uint8_t *)out + blk * FMHA_Q4_0_BLOCK_BYTES);
        return;
    case FMHA_FORMAT_COUNT: return;
    }
}

enum { QUANT_MAX_DIM = 1 << 16 };

fmha_status fmha_kv_quantize(fmha_kv_format format, int64_t tokens, int64_t heads, int64_t dim, const float *x,
                             const int64_t x_strides[3], void *values, const int64_t values_strides[3], float *scales,
                             const int64_t scale_strides[2]) {
    fmha_error_clear();
    if (format <= FMHA_KV_FORMAT_DTYPE || format > FMHA_KV_FORMAT_Q4_0)
        return fmha_fail(FMHA_ERR_BAD_OPTION, "format must be a storage format (FMHA_KV_FORMAT_F32..Q4_0, %d..%d), got %d",
                         FMHA_KV_FORMAT_F32, FMHA_KV_FORMAT_Q4_0, (int)format);
    const fmha_cache_format_id id = (fmha_cache_format_id)(format - FMHA_KV_FORMAT_F32);
    const fmha_cache_format *f = fmha_cache_format_at(id);
    fmha_status st = FMHA_CHECK_POINTERS("x, x_strides, values, values_strides", x, x_strides, values, values_strides);
    if (st != FMHA_OK) return st;
    if (tokens < 1 || heads < 1 || tokens > ((int64_t)1 << 40) || heads > ((int64_t)1 << 20))
        return fmha_fail(FMHA_ERR_BAD_SIZE, "tokens must lie in 1..2^40 and heads in 1..2^20, got %lld and %lld",
                         (long long)tokens, (long long)heads);
    if (dim < 1 || dim > QUANT_MAX_DIM || dim % f->block)
        return fmha_fail(FMHA_ERR_BAD_HEAD_DIM, "dim must lie in 1..%d%s, got %lld", QUANT_MAX_DIM,
                         f->block > 1 ? " and be a multiple of 32 for a GGUF format" : "", (long long)dim);
    if (f->block > 1 && values_strides[2] != 1)
        return fmha_fail(FMHA_ERR_BAD_STRIDE, "values_strides[2] must be 1 for %s (whole blocks), got %lld", f->name,
                         (long long)values_strides[2]);
    const int writes_scales = f->scales == FMHA_SCALES_PER_KEY, reads_scales = f->scales == FMHA_SCALES_PER_HEAD;
    if (writes_scales && (!scales || !scale_strides))
        return fmha_fail(FMHA_ERR_NULL_POINTER, "scales and scale_strides must be given for %s (a scale per row is written)",
                         f->name);
    if (!writes_scales && !reads_scales && scales)
        return fmha_fail(FMHA_ERR_BAD_OPTION, "scales must be NULL for %s (%s)", f->name,
                         f->scales == FMHA_SCALES_IN_BLOCK ? "its scales are in its blocks" : "it has no scales");
    if (reads_scales && scales && !scale_strides)
        return fmha_fail(FMHA_ERR_NULL_POINTER, "scale_strides must be given with scales");
    for (int i = 0; i < 3; i++)
        if (x_strides[i] < 0 || values_strides[i] < 0 || (scales && i < 2 && scale_strides[i] < 0))
            return fmha_fail(FMHA_ERR_BAD_STRIDE, "strides must not be negative (x_strides, values_strides, scale_strides)");
    /* extents: x [tokens, heads, dim], values [tokens, heads, row units], scales [tokens, heads] */
    const int64_t row_units = fmha_format_row_units(f, dim);
    const int64_t x_ext[4] = {tokens, heads, dim, 1}, x_st[4] = {x_strides[0], x_strides[1], x_strides[2], 0};
    const int64_t v_ext[4] = {tokens, heads, row_units, 1},
                  v_st[4] = {values_strides[0], values_strides[1], values_strides[2], 0};
    const int64_t s_ext[4] = {tokens, heads, 1, 1},
                  s_st[4] = {scales ? scale_strides[0] : 0, scales ? scale_strides[1] : 0, 0, 0};
    const int64_t x_span = fmha_strided_span(x_ext, x_st), v_span = fmha_strided_span(v_ext, v_st),
                  s_span = fmha_strided_span(s_ext, s_st);
    if (x_span < 0 || v_span < 0 || s_span < 0)
        return fmha_fail(FMHA_ERR_BAD_SIZE, "x, values or scales spans more than 2^60 elements");
    if (!fmha_strided_injective(v_ext, v_st))
        return fmha_fail(FMHA_ERR_BAD_STRIDE, "values_strides make two of values' elements share memory");
    if (writes_scales && !fmha_strided_injective(s_ext, s_st))
        return fmha_fail(FMHA_ERR_BAD_STRIDE, "scale_strides make two rows' scales share memory");
    const uintptr_t x_lo = (uintptr_t)x, x_hi = x_lo + (uintptr_t)(x_span + 1) * sizeof(float);
    const uintptr_t v_lo = (uintptr_t)values, v_hi = v_lo + (uintptr_t)(v_span + 1) * f->unit_bytes;
    const uintptr_t s_lo = (uintptr_t)scales, s_hi = s_lo + (uintptr_t)(s_span + 1) * sizeof(float);
    if (v_lo < x_hi && x_lo < v_hi) return fmha_fail(FMHA_ERR_OVERLAP, "the output values overlaps the input x in memory");
    if (writes_scales && ((s_lo < x_hi && x_lo < s_hi) || (s_lo < v_hi && v_lo < s_hi)))
        return fmha_fail(FMHA_ERR_OVERLAP, "the output scales overlaps x or values in memory");
    /* values each format refuses, before anything is written */
    for (int64_t t = 0; t < tokens; t++)
        for (int64_t h = 0; h < heads; h++) {
            if (reads_scales && scales) {
                const float sc = scales[t * s_st[0] + h * s_st[1]];
                if (!(sc >= 0.0f && sc <= 3.40282347e38f))
                    return fmha_fail(FMHA_ERR_BAD_SCALE, "scales[token %lld, head %lld] must be finite and >= 0, got %g",
                                     (long long)t, (long long)h, (double)sc);
            }
            /* int8's row scale and a GGUF block's d come from max |x| */
            if (writes_scales || id == FMHA_FORMAT_Q8_0 || id == FMHA_FORMAT_Q4_0)
                for (int64_t e = 0; e < dim; e++) {
                    const float v = x[t * x_st[0] + h * x_st[1] + e * x_st[2]];
                    if (!isfinite(v))
                        return fmha_fail(FMHA_ERR_BAD_SCALE, "x[%lld, %lld, %lld] is %g: %s's scale would not be finite",
                                         (long long)t, (long long)h, (long long)e, (double)v, f->name);
                }
        }
    /* row [dim] float32 gathered, out [row units] the format's row before its scatter */
    const size_t unit = f->unit_bytes;
    float *row = malloc((size_t)dim * sizeof(float));
    unsigned char *out = malloc((size_t)row_units * unit);
    if (!row || !out) {
        free(row);
        free(out);
        return fmha_fail(FMHA_ERR_OUT_OF_MEMORY, "no memory for a row of %lld values", (long long)dim);
    }
    for (int64_t t = 0; t < tokens; t++)
        for (int64_t h = 0; h < heads; h++) {
            for (int64_t e = 0; e < dim; e++) row[e] = x[t * x_st[0] + h * x_st[1] + e * x_st[2]];
            float one = 1.0f, *sc = scales ? &scales[t * s_st[0] + h * s_st[1]] : &one;
            quantize_row(id, row, dim, out, sc);
            unsigned char *dst = (unsigned char *)values + (size_t)(t * v_st[0] + h * v_st[1]) * unit;
            if (v_st[2] == 1)
                memcpy(dst, out, (size_t)row_units * unit);
            else
                for (int64_t e = 0; e < row_units; e++) memcpy(dst + (size_t)(e * v_st[2]) * unit, out + e * unit, unit);
        }
    free(row);
    free(out);
    return FMHA_OK;
}
