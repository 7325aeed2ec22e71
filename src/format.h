/* format.h: cache formats, the ways K and V rows can be stored. A format is
 * a descriptor (bits per element, elements per scale block, where scales
 * live) with a scalar dequantisation that is its specification; each ISA
 * has per-format kernels (fmha_uk_cache in uk/ukernel.h), chosen once when
 * a call is planned, so the decode driver reads any format without a test
 * of its type. A new format is a row here, a load kernel in the scalar
 * part, and (for speed) scores/values kernels in an ISA's parts. */
#ifndef FMHA_FORMAT_H
#define FMHA_FORMAT_H

#include <stdint.h>

#include "fmha.h"
#include "uk/ukernel.h"

/* Where a format's scales live. */
typedef enum fmha_scale_place {
    FMHA_SCALES_NONE = 0, /* the elements are the values */
} fmha_scale_place;

typedef struct fmha_cache_format {
    fmha_cache_format_id id;
    const char *name;        /* "f32", "bf16", "f16" */
    unsigned element_bits;   /* bits of one stored element */
    unsigned block;          /* elements sharing one scale (1: no scale) */
    fmha_scale_place scales;
    /* the specification: element idx of the tensor at x as float32 */
    float (*dequant)(const void *x, int64_t idx);
    /* the exponent bits of an element (all ones: NaN or inf); 0 when the
     * format holds no NaN or inf */
    uint32_t nonfinite_bits;
} fmha_cache_format;

/* The descriptor of a format id (id < FMHA_FORMAT_COUNT). */
const fmha_cache_format *fmha_cache_format_at(fmha_cache_format_id id);

/* 1 when an element (i, e) at element first + i * rs + e * cs of x, i < n,
 * e < cols, is a NaN or inf (its exponent bits all ones). */
int fmha_format_rows_nonfinite(const fmha_cache_format *f, const void *x, int64_t first, int64_t rs, int64_t cs,
                               int64_t n, int64_t cols);

/* The format of rows of a tensor dtype. */
fmha_cache_format_id fmha_cache_format_of_dtype(fmha_dtype t);

#endif /* FMHA_FORMAT_H */
