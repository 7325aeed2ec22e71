/* rows.c: a tensor row in or out of float32 through the kernel table's
 * conversion kernels (fmha_load_row_uk, fmha_store_row_uk in attn.h): the
 * drivers' per-row loads and stores of bf16 and f16 tensors (Dsum's dO, the
 * gradients, the fused call's O) without a conversion per element in C, and
 * of float32 rows with unit stride by memcpy (a scaled store vectorised). */
#include <string.h>

#include "core/attn.h"
#include "runtime/convert.h"
#include "format/format.h"

void fmha_load_row_uk(const fmha_ukernels *uk, const void *base, fmha_dtype t, int64_t first,
                      int64_t stride, int64_t n, float *dst) {
    if (stride == 1) { /* the format's load kernel (float32: a copy) */
        uk->cache[fmha_cache_format_of_dtype(t)].load((size_t)n, (const char *)base + (size_t)first * fmha_dtype_size(t),
                                                      dst);
        return;
    }
    fmha_load_row(base, t, first, stride, n, dst);
}

const float *fmha_row_f32_uk(const fmha_ukernels *uk, const void *base, fmha_dtype t, int64_t first,
                             int64_t stride, int64_t n, float *tmp) {
    if (t == FMHA_DTYPE_F32 && stride == 1) return (const float *)base + first;
    fmha_load_row_uk(uk, base, t, first, stride, n, tmp);
    return tmp;
}

/* dst[e] = scale * src[e], e < n: blocks of a fixed trip count, which -O2
 * vectorises (restrict: its cheap cost model adds no overlap check, and
 * without one left the loop scalar), then the tail. */
static void scale_row(int64_t n, const float *restrict src, float scale, float *restrict dst) {
    int64_t e = 0;
    for (; e + 16 <= n; e += 16)
        for (int j = 0; j < 16; j++) dst[e + j] = scale * src[e + j];
    for (; e < n; e++) dst[e] = scale * src[e];
}

void fmha_store_row_uk(const fmha_ukernels *uk, void *base, fmha_dtype t, int64_t first, int64_t stride,
                       int64_t n, const float *src, float scale) {
    if (t == FMHA_DTYPE_F32 && stride == 1) {
        float *x = (float *)base + first;
        if (!src)
            memset(x, 0, (size_t)n * sizeof(float));
        else if (scale == 1.0f)
            memcpy(x, src, (size_t)n * sizeof(float));
        else
            scale_row(n, src, scale, x);
        return;
    }
    if (t == FMHA_DTYPE_BF16 && stride == 1 && src) {
        if (scale == 1.0f) {
            uk->rows.to_bf16((size_t)n, src, (uint16_t *)base + first);
            return;
        }
        /* scaled ROWS_CHUNK elements at a time (rounding is per element) */
        enum { ROWS_CHUNK = 256 };
        float scaled[ROWS_CHUNK];
        for (int64_t e = 0; e < n; e += ROWS_CHUNK) {
            int64_t m = n - e < ROWS_CHUNK ? n - e : ROWS_CHUNK;
            scale_row(m, src + e, scale, scaled);
            uk->rows.to_bf16((size_t)m, scaled, (uint16_t *)base + first + e);
        }
        return;
    }
    fmha_store_row(base, t, first, stride, n, src, scale);
}
