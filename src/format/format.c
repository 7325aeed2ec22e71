/* format.c: the cache formats' descriptors and their specifications (the
 * scalar dequantisations every kernel is held to). */
#include "format/format.h"

#include <math.h>
#include <string.h>

#include "runtime/convert.h"
#include "runtime/error.h"

float fmha_fp8_e4m3_to_f32(uint8_t b) {
    const unsigned e = (b >> 3) & 0xfu, m = b & 7u;
    float mag;
    if (e == 15 && m == 7) mag = NAN; /* E4M3FN: S.1111.111 is the only NaN, no inf */
    else if (e == 0) mag = ldexpf((float)m, -9);
    else mag = ldexpf((float)(8 + m), (int)e - 10);
    return b & 0x80u ? -mag : mag;
}

float fmha_fp8_e5m2_to_f32(uint8_t b) { return fmha_f16_to_f32((uint16_t)(b << 8)); }

/* The half at p, little-endian as ggml stores it. */
static float block_scale(const uint8_t *p) { return fmha_f16_to_f32((uint16_t)(p[0] | p[1] << 8)); }

static float dequant_f32(const void *x, int64_t idx) { return ((const float *)x)[idx]; }
static float dequant_bf16(const void *x, int64_t idx) { return fmha_bf16_to_f32(((const uint16_t *)x)[idx]); }
static float dequant_f16(const void *x, int64_t idx) { return fmha_f16_to_f32(((const uint16_t *)x)[idx]); }
static float dequant_int8(const void *x, int64_t idx) { return (float)((const int8_t *)x)[idx]; }
static float dequant_e4m3(const void *x, int64_t idx) { return fmha_fp8_e4m3_to_f32(((const uint8_t *)x)[idx]); }
static float dequant_e5m2(const void *x, int64_t idx) { return fmha_fp8_e5m2_to_f32(((const uint8_t *)x)[idx]); }

/* block_q8_0: half d, int8 q[32]; value j = q[j] * d */
static float dequant_q8_0(const void *x, int64_t idx) {
    const uint8_t *blk = (const uint8_t *)x + idx / FMHA_GGUF_BLOCK * FMHA_Q8_0_BLOCK_BYTES;
    return (float)(int8_t)blk[FMHA_GGUF_VALUES_AT + idx % FMHA_GGUF_BLOCK] * block_scale(blk);
}

/* block_q4_0: half d, uint8 qs[16]; value j < 16 = (qs[j] & 15) - 8,
 * value j + 16 = (qs[j] >> 4) - 8, times d */
static float dequant_q4_0(const void *x, int64_t idx) {
    const uint8_t *blk = (const uint8_t *)x + idx / FMHA_GGUF_BLOCK * FMHA_Q4_0_BLOCK_BYTES;
    const int j = (int)(idx % FMHA_GGUF_BLOCK), byte = blk[FMHA_GGUF_VALUES_AT + j % 16];
    return (float)((j < 16 ? byte & 15 : byte >> 4) - 8) * block_scale(blk);
}

/* fast_integer, fast_bf16: the formats FAST reads in integer or bf16 dot
 * products (the errors behind them: fmha.h) */
static const fmha_cache_format formats[FMHA_FORMAT_COUNT] = {
    [FMHA_FORMAT_F32] = {FMHA_FORMAT_F32, "f32", 4, 1, 1, FMHA_SCALES_NONE, dequant_f32, 0x7f800000u, 0, 0},
    [FMHA_FORMAT_BF16] = {FMHA_FORMAT_BF16, "bf16", 2, 1, 1, FMHA_SCALES_NONE, dequant_bf16, 0x7f80u, 0, 0},
    [FMHA_FORMAT_F16] = {FMHA_FORMAT_F16, "f16", 2, 1, 1, FMHA_SCALES_NONE, dequant_f16, 0x7c00u, 0, 0},
    [FMHA_FORMAT_INT8] = {FMHA_FORMAT_INT8, "int8", 1, 1, 1, FMHA_SCALES_PER_KEY, dequant_int8, 0, 1, 0},
    [FMHA_FORMAT_FP8_E4M3] = {FMHA_FORMAT_FP8_E4M3, "fp8_e4m3", 1, 1, 1, FMHA_SCALES_PER_HEAD, dequant_e4m3, 0x7fu, 0, 1},
    [FMHA_FORMAT_FP8_E5M2] = {FMHA_FORMAT_FP8_E5M2, "fp8_e5m2", 1, 1, 1, FMHA_SCALES_PER_HEAD, dequant_e5m2, 0x7cu, 0, 1},
    [FMHA_FORMAT_Q8_0] = {FMHA_FORMAT_Q8_0, "q8_0", 1, FMHA_GGUF_BLOCK, FMHA_Q8_0_BLOCK_BYTES, FMHA_SCALES_IN_BLOCK,
                          dequant_q8_0, 0, 1, 0},
    [FMHA_FORMAT_Q4_0] = {FMHA_FORMAT_Q4_0, "q4_0", 1, FMHA_GGUF_BLOCK, FMHA_Q4_0_BLOCK_BYTES, FMHA_SCALES_IN_BLOCK,
                          dequant_q4_0, 0, 1, 0},
};

const fmha_cache_format *fmha_cache_format_at(fmha_cache_format_id id) { return &formats[id]; }

float fmha_q8_0_block(const float *x, int8_t *q) {
    float amax = 0.0f;
    for (int j = 0; j < 32; j++) amax = amax > fabsf(x[j]) ? amax : fabsf(x[j]); /* ggml's MAX(amax, |x|) */
    const float d = amax / 127;
    const float id = d ? 1.0f / d : 0.0f;
    for (int j = 0; j < 32; j++) q[j] = (int8_t)fmha_round_away(x[j] * id); /* |x id| <= 127 */
    return d;
}

int fmha_q8_quantize_row(const float *x, int64_t d, int8_t *q, float *qd, int32_t *sum) {
    float finite = 0.0f; /* x * 0: 0 for finite x, NaN otherwise */
    for (int64_t e = 0; e < d; e++) finite += x[e] * 0.0f;
    if (finite != 0.0f) return 0;
    for (int64_t b = 0; b < d / 32; b++) {
        qd[b] = fmha_q8_0_block(x + 32 * b, q + 32 * b);
        int32_t s = 0;
        for (int j = 0; j < 32; j++) s += q[32 * b + j];
        sum[b] = s;
    }
    return 1;
}

fmha_cache_format_id fmha_cache_format_of_dtype(fmha_dtype t) {
    switch (t) {
    case FMHA_DTYPE_F32: return FMHA_FORMAT_F32;
    case FMHA_DTYPE_BF16: return FMHA_FORMAT_BF16;
    case FMHA_DTYPE_F16: return FMHA_FORMAT_F16;
    }
    return FMHA_FORMAT_F32;
}

fmha_cache_format_id fmha_problem_format(const fmha_problem *p, int which) {
    int64_t f = which ? p->v_format : p->k_format;
    if (f == FMHA_KV_FORMAT_DTYPE) {
        fmha_dtype t = p->kv_dtype == FMHA_KV_DTYPE_SAME ? p->dtype : (fmha_dtype)(p->kv_dtype - 1);
        return fmha_cache_format_of_dtype(t);
    }
    return (fmha_cache_format_id)(f - FMHA_KV_FORMAT_F32);
}

int fmha_format_rows_nonfinite(const fmha_cache_format *f, const void *x, int64_t first, int64_t rs, int64_t cs,
                               int64_t n, int64_t cols) {
    uint32_t hit = 0;
    const uint32_t exp = f->nonfinite_bits;
    if (!exp) return 0;
    if (f->unit_bytes == 4) {
        const float *v = x;
        for (int64_t i = 0; i < n; i++) {
            const float *row = v + first + i * rs;
            int64_t e = 0;
            if (cs == 1) /* blocks of a fixed trip count: vectorised at -O2 */
                for (; e + 16 <= cols; e += 16)
                    for (int j = 0; j < 16; j++) {
                        uint32_t u; /* the float's bits */
                        memcpy(&u, row + e + j, sizeof u);
                        hit |= (u & exp) == exp;
                    }
            for (; e < cols; e++) {
                uint32_t u;
                memcpy(&u, row + e * cs, sizeof u);
                hit |= (u & exp) == exp;
            }
        }
    } else if (f->unit_bytes == 2) {
        const uint16_t *u = x, exp16 = (uint16_t)exp;
        for (int64_t i = 0; i < n; i++) {
            const uint16_t *row = u + first + i * rs;
            int64_t e = 0;
            if (cs == 1)
                for (; e + 32 <= cols; e += 32)
                    for (int j = 0; j < 32; j++) hit |= (uint32_t)((row[e + j] & exp16) == exp16);
            for (; e < cols; e++) hit |= (uint32_t)((row[e * cs] & exp16) == exp16);
        }
    } else { /* float8 elements */
        const uint8_t *u = x, exp8 = (uint8_t)exp;
        for (int64_t i = 0; i < n; i++)
            for (int64_t e = 0; e < cols; e++) hit |= (uint32_t)((u[first + i * rs + e * cs] & exp8) == exp8);
    }
    return hit != 0;
}

void fmha_kv_scales_of(const fmha_problem *p, int which, int64_t b, int64_t hk, int64_t k0, int64_t n, float *scales) {
    const fmha_cache_format *f = fmha_cache_format_at(fmha_problem_format(p, which));
    const float *sc = which ? p->v_scales : p->k_scales;
    const int64_t *ss = which ? p->v_scale_strides : p->k_scale_strides;
    if (f->scales == FMHA_SCALES_PER_KEY) {
        if (!p->block_table) { /* one stride apart */
            const float *first = sc + b * ss[0] + k0 * ss[1] + hk * ss[2];
            for (int64_t i = 0; i < n; i++) scales[i] = first[i * ss[1]];
            return;
        }
        for (int64_t i = 0; i < n;) {
            int64_t first;
            const int64_t run = fmha_kv_run_at(p, ss, b, k0 + i, n - i, &first);
            for (int64_t t = 0; t < run; t++, i++) scales[i] = sc[first + t * ss[1] + hk * ss[2]];
        }
        return;
    }
    const float one = f->scales == FMHA_SCALES_PER_HEAD && sc ? sc[hk * ss[2]] : 1.0f;
    for (int64_t i = 0; i < n; i++) scales[i] = one;
}

/* 1 when *x is not a scale (finite and >= 0, -0 a good one), on its bits:
 * past the largest finite float (inf, NaN, the sign set) but -0. */
static uint32_t scale_bad(const float *x) {
    uint32_t u;
    memcpy(&u, x, sizeof u);
    return (uint32_t)(u > 0x7F7FFFFFu) & (uint32_t)(u != 0x80000000u);
}

/* 1 when one of run[0..n) is a bad scale (scale_bad), in blocks of a
 * fixed trip count (vectorised at -O2). */
int fmha_kv_scales_bad(const float *run, int64_t n) {
    int64_t i = 0;
    uint32_t bad = 0;
    for (; i + 16 <= n; i += 16)
        for (int e = 0; e < 16; e++) bad |= scale_bad(run + i + e);
    for (; i < n; i++) bad |= scale_bad(run + i);
    return bad != 0;
}

fmha_status fmha_kv_scales_check(const fmha_problem *p) {
    for (int which = 0; which < 2; which++) {
        const fmha_cache_format *f = fmha_cache_format_at(fmha_problem_format(p, which));
        const float *sc = which ? p->v_scales : p->k_scales;
        const int64_t *ss = which ? p->v_scale_strides : p->k_scale_strides;
        const char *name = which ? "v_scales" : "k_scales";
        if (!sc || (f->scales != FMHA_SCALES_PER_KEY && f->scales != FMHA_SCALES_PER_HEAD)) continue;
        if (f->scales == FMHA_SCALES_PER_HEAD) {
            for (int64_t h = 0; h < p->heads_kv; h++)
                if (scale_bad(sc + h * ss[2]))
                    return fmha_fail(FMHA_ERR_BAD_SCALE, "%s[%lld] (kv head %lld) must be finite and >= 0, got %g", name,
                                     (long long)(h * ss[2]), (long long)h, (double)sc[h * ss[2]]);
            continue;
        }
        /* page run by page run (the whole sequence when not paged); a run
         * whose keys' scales are one block of floats (heads adjacent, keys
         * one row of heads apart) takes a vector pass first */
        const int blocks = ss[2] == 1 && ss[1] == p->heads_kv;
        /* pages of scales lie anywhere: the run SCALES_AHEAD pages on is
         * asked for while this one is checked (one page after another
         * waited on memory's latency each) */
        enum { SCALES_AHEAD = 4 };
        for (int64_t b = 0; b < p->batch; b++) {
            const int64_t keys = p->masks.kv_lengths ? p->masks.kv_lengths[b] : p->seq_kv;
            for (int64_t j0 = 0; j0 < keys;) {
                int64_t first;
                const int64_t run = fmha_kv_run_at(p, ss, b, j0, keys - j0, &first);
                const int64_t ahead = p->block_table ? j0 + SCALES_AHEAD * p->page_size : keys;
                if (blocks && ahead < keys) {
                    int64_t at;
                    const int64_t n = fmha_kv_run_at(p, ss, b, ahead, keys - ahead, &at) * p->heads_kv;
                    for (int64_t e = 0; e < n; e += 16) __builtin_prefetch(sc + at + e, 0, 1);
                }
                if (blocks && !fmha_kv_scales_bad(sc + first, run * p->heads_kv)) {
                    j0 += run;
                    continue;
                }
                for (int64_t j = j0; j < j0 + run; j++)
                    for (int64_t h = 0; h < p->heads_kv; h++) {
                        const float x = sc[first + (j - j0) * ss[1] + h * ss[2]];
                        if (scale_bad(&x))
                            return fmha_fail(FMHA_ERR_BAD_SCALE,
                                             "%s of batch element %lld, key %lld, kv head %lld must be finite and >= 0, got %g",
                                             name, (long long)b, (long long)j, (long long)h, (double)x);
                    }
                j0 += run;
            }
        }
    }
    return FMHA_OK;
}
