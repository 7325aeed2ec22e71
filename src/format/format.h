/* format.h: cache formats, the ways K and V rows can be stored. A format is
 * a descriptor (storage unit, values per block and bytes per block, where
 * its scales live) with a scalar dequantisation that is its specification;
 * each ISA has per-format kernels (fmha_uk_cache in uk/ukernel.h), chosen
 * once when a call is planned, so the decode driver reads any format without
 * a test of its type. A new format is a row here, a load kernel in the
 * scalar part, and (for speed) scores/values kernels in an ISA's parts. */
#ifndef FMHA_FORMAT_H
#define FMHA_FORMAT_H

#include <stdint.h>

#include <stddef.h>

#include "fmha.h"

/* Cache formats of K and V (their descriptors below). */
typedef enum fmha_cache_format_id {
    FMHA_FORMAT_F32 = 0,
    FMHA_FORMAT_BF16,
    FMHA_FORMAT_F16,
    FMHA_FORMAT_INT8,     /* int8, a scale per (key, kv head) beside the rows */
    FMHA_FORMAT_FP8_E4M3, /* OCP E4M3FN bits, a scale per kv head */
    FMHA_FORMAT_FP8_E5M2, /* OCP E5M2 bits, a scale per kv head */
    FMHA_FORMAT_Q8_0,     /* GGUF block_q8_0: blocks of 32, 34 bytes */
    FMHA_FORMAT_Q4_0,     /* GGUF block_q4_0: blocks of 32, 18 bytes */
    FMHA_FORMAT_COUNT
} fmha_cache_format_id;
_Static_assert(FMHA_FORMAT_COUNT == 8, "FMHA_CACHE_PARTS lists every format");

/* The GGUF blocks, as ggml's type traits size them (blck_size, type_size):
 * a half scale d, then the values. format.c's descriptors and every kernel
 * take them from here. */
enum {
    FMHA_GGUF_BLOCK = 32,          /* values a block holds (QK8_0, QK4_0) */
    FMHA_GGUF_VALUES_AT = 2,       /* bytes before the values: d */
    FMHA_Q8_0_BLOCK_BYTES = 34,    /* d, int8 q[32] */
    FMHA_Q4_0_BLOCK_BYTES = 18     /* d, uint8 qs[16]: values j and j + 16 in byte j */
};

/* Bytes of a stored block of FMHA_GGUF_BLOCK values of an integer format
 * (int8: the values alone; q8_0, q4_0), and the offset of its first value. */
static inline size_t fmha_int_block_bytes(fmha_cache_format_id f) {
    return f == FMHA_FORMAT_Q8_0   ? FMHA_Q8_0_BLOCK_BYTES
           : f == FMHA_FORMAT_Q4_0 ? FMHA_Q4_0_BLOCK_BYTES
                                   : FMHA_GGUF_BLOCK;
}
static inline size_t fmha_int_block_values_at(fmha_cache_format_id f) {
    return f == FMHA_FORMAT_INT8 ? 0 : FMHA_GGUF_VALUES_AT;
}



/* Where a format's scales live. */
typedef enum fmha_scale_place {
    FMHA_SCALES_NONE = 0, /* the elements are the values */
    FMHA_SCALES_PER_KEY,  /* one float32 per (key, kv head), beside the rows (int8) */
    FMHA_SCALES_PER_HEAD, /* one float32 per kv head (fp8) */
    FMHA_SCALES_IN_BLOCK  /* inside each block (GGUF q8_0, q4_0): the kernels' */
} fmha_scale_place;

typedef struct fmha_cache_format {
    fmha_cache_format_id id;
    const char *name;        /* "f32", "bf16", "f16", "int8", ... */
    unsigned unit_bytes;     /* bytes of the storage unit strides count (4, 2 or 1) */
    unsigned block;          /* values a block holds (1: element formats; 32: GGUF) */
    unsigned block_units;    /* storage units of a block (1, or a GGUF block's bytes: above) */
    fmha_scale_place scales;
    /* the specification: value idx of a run of elements (element formats:
     * element idx of the tensor at x; block formats: x at a block, value
     * idx of the blocks that follow), as float32, before external scales */
    float (*dequant)(const void *x, int64_t idx);
    /* the bits that are all ones in a NaN or inf element (0: the format
     * holds none, or only in a block's scale) */
    uint32_t nonfinite_bits;
    /* 1: under precision FAST its rows may take integer dot products:
     * keys against the query quantized as q8_0 (uk->cache[id].scores_q8),
     * whose error is no more than llama.cpp's own arithmetic makes on a
     * q8_0 cache, and values against P quantized to 16 bits (values_int),
     * which adds next to none (the table in fmha.h, fmha_precision) */
    int fast_integer;
    /* 1: under precision FAST its keys may meet the query rounded to bf16
     * in bf16 dot products (scores_bf16): every float8 value is a bf16
     * value, and a bf16 query errs less than a q8_0 one (fmha.h) */
    int fast_bf16;
} fmha_cache_format;

/* The descriptor of a format id (id < FMHA_FORMAT_COUNT). */
const fmha_cache_format *fmha_cache_format_at(fmha_cache_format_id id);

/* Storage units of a row of len values (len a multiple of the block). */
static inline int64_t fmha_format_row_units(const fmha_cache_format *f, int64_t len) {
    return len / f->block * f->block_units;
}

/* Bytes of a row of len values as stored. */
static inline int64_t fmha_format_row_bytes(const fmha_cache_format *f, int64_t len) {
    return fmha_format_row_units(f, len) * (int64_t)f->unit_bytes;
}

/* Value e of the row at storage unit `at` of x, elements cs units apart
 * (block formats: cs is 1), before external scales. */
static inline float fmha_format_value(const fmha_cache_format *f, const void *x, int64_t at, int64_t e, int64_t cs) {
    return f->dequant((const char *)x + at * (int64_t)f->unit_bytes, e * cs);
}

/* 1 when an element (i, e) at element first + i * rs + e * cs of x, i < n,
 * e < cols, is a NaN or inf (its nonfinite bits all ones). */
int fmha_format_rows_nonfinite(const fmha_cache_format *f, const void *x, int64_t first, int64_t rs, int64_t cs,
                               int64_t n, int64_t cols);

/* The format of rows of a tensor dtype. */
fmha_cache_format_id fmha_cache_format_of_dtype(fmha_dtype t);

/* The format of a problem's K (which 0) or V (1): k_format / v_format, or
 * kv_dtype's when 0. The caller checked the values. */
fmha_cache_format_id fmha_problem_format(const fmha_problem *p, int which);

/* Element offset of key j's row (kv head hk, batch element b) in K, V or
 * their scales, of strides st: [B, Skv, Hkv] order, or in a page pool
 * ([page, row in page, head]) row j % page_size of the page the block
 * table names for it. */
static inline int64_t fmha_kv_row_at(const fmha_problem *p, const int64_t *st, int64_t b, int64_t hk, int64_t j) {
    if (!p->block_table) return b * st[0] + j * st[1] + hk * st[2];
    const int64_t page = p->block_table[b * p->block_table_stride + j / p->page_size];
    return page * st[0] + (j % p->page_size) * st[1] + hk * st[2];
}

/* Keys [j, j + n) of batch element b as runs inside one page: *row gets the
 * offset of key j's row at kv head 0 (fmha_kv_row_at), and the run's keys
 * (returned, at most n) lie st[1] apart from it. One division a run, not
 * one a key. */
static inline int64_t fmha_kv_run_at(const fmha_problem *p, const int64_t *st, int64_t b, int64_t j, int64_t n,
                                     int64_t *row) {
    if (!p->block_table) {
        *row = b * st[0] + j * st[1];
        return n;
    }
    const int64_t in_page = j % p->page_size, left = p->page_size - in_page;
    *row = p->block_table[b * p->block_table_stride + j / p->page_size] * st[0] + in_page * st[1];
    return left < n ? left : n;
}

/* scales[i] (i < n) = the scales kept beside K's (which 0) or V's (1) rows
 * of keys [k0, k0 + n), kv head hk, batch element b (through the block
 * table when paged): per key, or the head's one repeated, or 1 when the
 * format keeps none beside its rows. */
void fmha_kv_scales_of(const fmha_problem *p, int which, int64_t b, int64_t hk, int64_t k0, int64_t n, float *scales);

/* Every scale a forward reads (the keys below each sequence's length, each
 * kv head) is finite and >= 0: FMHA_ERR_BAD_SCALE naming the first that is
 * not. */
fmha_status fmha_kv_scales_check(const fmha_problem *p);

/* 1 when one of x[0..n) breaks that rule (NaN, an infinity, below 0; -0
 * is a good scale). */
int fmha_kv_scales_bad(const float *x, int64_t n);

/* roundf(y) as an integer, |y| < 2^30, in steps that vectorise: the
 * truncation, then one away from zero when the (exact) fraction is at
 * least a half. */
static inline int32_t fmha_round_away(float y) {
    const int32_t t = (int32_t)y;
    const float frac = y - (float)t;
    return t + (frac >= 0.5f) - (frac <= -0.5f);
}

/* One block of 32 values as ggml's quantize_row_q8_0_ref quantizes it:
 * d = max |x| / 127, q[j] = round(x[j] / d) (x times 1 / d, rounded half
 * away from zero; all 0 when d is 0). Returns d, in float32 (a q8_0 block
 * stores it rounded to a half). x finite. */
float fmha_q8_0_block(const float *x, int8_t *q);

/* A query row x [d] (d a multiple of 32) quantized for the integer scores
 * (fmha_q8_rows, uk/ukernel.h): q [d], and per block of 32 its scale
 * qd [d / 32] and the sum of its q, sum [d / 32]. Returns 0, with nothing
 * meaningful written, when x holds a NaN or an infinity (the float32
 * query's kernels then serve, so that it propagates as IEEE says). */
int fmha_q8_quantize_row(const float *x, int64_t d, int8_t *q, float *qd, int32_t *sum);

/* OCP float8 bits to float32, exactly (the specifications). */
float fmha_fp8_e4m3_to_f32(uint8_t b);
float fmha_fp8_e5m2_to_f32(uint8_t b);

#endif /* FMHA_FORMAT_H */
