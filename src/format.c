/* format.c: the cache formats' descriptors and their specifications. */
#include "format.h"

#include "convert.h"

static float dequant_f32(const void *row, int64_t e) { return ((const float *)row)[e]; }
static float dequant_bf16(const void *row, int64_t e) { return fmha_bf16_to_f32(((const uint16_t *)row)[e]); }
static float dequant_f16(const void *row, int64_t e) { return fmha_f16_to_f32(((const uint16_t *)row)[e]); }

static const fmha_cache_format formats[FMHA_FORMAT_COUNT] = {
    [FMHA_FORMAT_F32] = {FMHA_FORMAT_F32, "f32", 32, 1, FMHA_SCALES_NONE, dequant_f32},
    [FMHA_FORMAT_BF16] = {FMHA_FORMAT_BF16, "bf16", 16, 1, FMHA_SCALES_NONE, dequant_bf16},
    [FMHA_FORMAT_F16] = {FMHA_FORMAT_F16, "f16", 16, 1, FMHA_SCALES_NONE, dequant_f16},
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
