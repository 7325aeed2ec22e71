/* format.c: the cache formats' descriptors and their specifications. */
#include "format.h"

#include <string.h>

#include "convert.h"

static float dequant_f32(const void *x, int64_t idx) { return ((const float *)x)[idx]; }
static float dequant_bf16(const void *x, int64_t idx) { return fmha_bf16_to_f32(((const uint16_t *)x)[idx]); }
static float dequant_f16(const void *x, int64_t idx) { return fmha_f16_to_f32(((const uint16_t *)x)[idx]); }

static const fmha_cache_format formats[FMHA_FORMAT_COUNT] = {
    [FMHA_FORMAT_F32] = {FMHA_FORMAT_F32, "f32", 32, 1, FMHA_SCALES_NONE, dequant_f32, 0x7f800000u},
    [FMHA_FORMAT_BF16] = {FMHA_FORMAT_BF16, "bf16", 16, 1, FMHA_SCALES_NONE, dequant_bf16, 0x7f80u},
    [FMHA_FORMAT_F16] = {FMHA_FORMAT_F16, "f16", 16, 1, FMHA_SCALES_NONE, dequant_f16, 0x7c00u},
};

const fmha_cache_format *fmha_cache_format_at(fmha_cache_format_id id) { return &formats[id]; }

fmha_cache_format_id fmha_cache_format_of_dtype(fmha_dtype t) {
    switch (t) {
    case FMHA_DTYPE_F32: return FMHA_FORMAT_F32;
    case FMHA_DTYPE_BF16: return FMHA_FORMAT_BF16;
    case FMHA_DTYPE_F16: return FMHA_FORMAT_F16;
    }
    return FMHA_FORMAT_F32;
}

int fmha_format_rows_nonfinite(const fmha_cache_format *f, const void *x, int64_t first, int64_t rs, int64_t cs,
                               int64_t n, int64_t cols) {
    uint32_t hit = 0;
    const uint32_t exp = f->nonfinite_bits;
    if (!exp) return 0;
    if (f->element_bits == 32) {
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
    } else {
        const uint16_t *u = x, exp16 = (uint16_t)exp;
        for (int64_t i = 0; i < n; i++) {
            const uint16_t *row = u + first + i * rs;
            int64_t e = 0;
            if (cs == 1)
                for (; e + 32 <= cols; e += 32)
                    for (int j = 0; j < 32; j++) hit |= (uint32_t)((row[e + j] & exp16) == exp16);
            for (; e < cols; e++) hit |= (uint32_t)((row[e * cs] & exp16) == exp16);
        }
    }
    return hit != 0;
}
