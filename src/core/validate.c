/* validate.c: validation of a problem and of a run's named tensors (nothing is written on error),
 * fmha_problem_check (sizes, options, strides, masks, biases), and the
 * tensor check of a run (every output against every other tensor, named).
 * plan.c resolves checked problems into plans and runs them. */
#include <math.h>
#include <stddef.h>
#include <string.h>
#include <stdint.h>
#include <stdlib.h>

#include "core/attn.h"
#include "runtime/convert.h"
#include "runtime/checked.h"
#include "runtime/error.h"
#include "format/format.h"
#include "config/cpu.h"
#include "runtime/pool.h"

const char *fmha_status_string(fmha_status status) {
    switch (status) {
    case FMHA_OK: return "success";
    case FMHA_ERR_NULL_POINTER: return "a required pointer is NULL";
    case FMHA_ERR_BAD_SIZE: return "batch, heads and sequence lengths must be >= 1 and the tensors must fit in memory";
    case FMHA_ERR_BAD_HEADS: return "heads_q must be a multiple of heads_kv";
    case FMHA_ERR_BAD_HEAD_DIM: return "head_dim and head_dim_v must be between 1 and 576";
    case FMHA_ERR_BAD_SCALE: return "a scale is NaN, infinite or negative";
    case FMHA_ERR_BAD_STRIDE: return "strides must be >= 0 and an output's elements must not overlap each other";
    case FMHA_ERR_OVERLAP: return "an output overlaps an input or another output";
    case FMHA_ERR_BAD_OPTION: return "unknown strategy, causal alignment, dtype or precision";
    case FMHA_ERR_UNSUPPORTED: return "this request is valid but not supported by this build";
    case FMHA_ERR_WORKSPACE_TOO_SMALL: return "the workspace is smaller than the size query returned (did the thread count change?)";
    case FMHA_ERR_OUT_OF_MEMORY: return "out of memory";
    case FMHA_ERR_BAD_THREAD_COUNT: return "the thread count must be between 0 (default) and 1024";
    case FMHA_ERR_BAD_MASK: return "a mask or bias argument is invalid";
    case FMHA_ERR_CALLBACK: return "a mask callback returned an invalid tile class";
    case FMHA_ERR_STRUCT_SIZE: return "problem->struct_size is unknown: fill the problem with fmha_problem_init";
    case FMHA_ERR_BAD_PAGE: return "a paged KV cache's page size, page count, block table width or a block table entry is invalid";
    case FMHA_ERR_BAD_FILE: return "the wisdom file holds something else than wisdom, or cannot be written";
    }
    return "unknown fmha status code";
}

const char *fmha_version_string(void) { return FMHA_VERSION_STRING; }

const char *fmha_isa_name(void) { return fmha_cpu_kernels()->isa; }

fmha_status fmha_set_num_threads(int n) {
    fmha_error_clear();
    if (fmha_pool_set_threads(n) != 0)
        return fmha_fail(FMHA_ERR_BAD_THREAD_COUNT, "the thread count must lie in 0..1024 (0: the default), got %d", n);
    return FMHA_OK;
}

int fmha_get_num_threads(void) { return fmha_pool_threads(); }


void fmha_problem_init(fmha_problem *p, int64_t batch, int64_t heads_q, int64_t heads_kv,
                       int64_t seq_q, int64_t seq_kv, int64_t head_dim, int64_t head_dim_v,
                       fmha_layout layout) {
    if (!p) return;
    *p = (fmha_problem){0};
    p->struct_size = sizeof(fmha_problem);
    p->dtype = FMHA_DTYPE_F32;
    p->batch = batch;
    p->heads_q = heads_q;
    p->heads_kv = heads_kv;
    p->seq_q = seq_q;
    p->seq_kv = seq_kv;
    p->head_dim = head_dim;
    p->head_dim_v = head_dim_v;
    p->causal = FMHA_CAUSAL_NONE;
    p->strategy = FMHA_STRATEGY_AUTO;
    p->precision = FMHA_PRECISION_FAST;
    p->masks.window_left = -1;
    p->masks.window_right = -1;
    /* scales [B, Skv, Hkv] ([B, Hkv, Skv] with BHSD), strides [batch, key, head] */
    for (int i = 0; i < 2; i++) {
        int64_t *ss = i ? p->v_scale_strides : p->k_scale_strides;
        ss[0] = fmha_sat_mul(seq_kv, heads_kv); /* saturated, as the tensors' strides below */
        ss[1] = layout == FMHA_LAYOUT_BHSD ? 1 : heads_kv;
        ss[2] = layout == FMHA_LAYOUT_BHSD ? seq_kv : 1;
    }
    struct { int64_t *st, s, h, d; } t[4] = {{p->q_strides, seq_q, heads_q, head_dim},
                                             {p->k_strides, seq_kv, heads_kv, head_dim},
                                             {p->v_strides, seq_kv, heads_kv, head_dim_v},
                                             {p->o_strides, seq_q, heads_q, head_dim_v}};
    /* sizes that overflow saturate, leaving strides fmha_problem_check rejects (FMHA_ERR_BAD_SIZE) */
    for (int i = 0; i < 4; i++) {
        int64_t *st = t[i].st;
        st[3] = 1;
        if (layout == FMHA_LAYOUT_BHSD) {
            st[1] = t[i].d;
            st[2] = fmha_sat_mul(t[i].s, t[i].d);
            st[0] = fmha_sat_mul(t[i].h, st[2]);
        } else {
            st[2] = t[i].d;
            st[1] = fmha_sat_mul(t[i].h, t[i].d);
            st[0] = fmha_sat_mul(t[i].s, st[1]);
        }
    }
}

/* ---- validation ---- */

/* Extents [batch, seq, head, dim] of the four tensors ([page, row, head,
 * dim] for K and V in page pools). */
static void tensor_extents(const fmha_problem *p, int which, int64_t ext[4]) {
    int q_side = which == 0 || which == 3;
    int pool = !q_side && p->block_table;
    ext[0] = pool ? p->num_pages : p->batch;
    ext[1] = q_side ? p->seq_q : pool ? p->page_size : p->seq_kv;
    ext[2] = q_side ? p->heads_q : p->heads_kv;
    ext[3] = which <= 1 ? p->head_dim : p->head_dim_v;
    if (!q_side) /* a row of K or V in its format's storage units */
        ext[3] = fmha_format_row_units(fmha_cache_format_at(fmha_problem_format(p, which - 1)), ext[3]);
}

static const int64_t *tensor_strides(const fmha_problem *p, int which) {
    return which == 0 ? p->q_strides : which == 1 ? p->k_strides : which == 2 ? p->v_strides : p->o_strides;
}

/* A kernel steps its operand pointer by every stride, even on a dimension of
 * extent 1 (one step past the end); a stride no larger dimension could have
 * (> INT64_MAX / 8) is replaced by 0 in a plan's copy so that step cannot wrap. */
void fmha_problem_tame_unit_strides(fmha_problem *p) {
    for (int t = 0; t < 4; t++) {
        int64_t ext[4];
        int64_t *st = (int64_t *)tensor_strides(p, t);
        tensor_extents(p, t, ext);
        for (int i = 0; i < 4; i++)
            if (ext[i] == 1 && st[i] > INT64_MAX / 8) st[i] = 0;
    }
}

fmha_status fmha_problem_load(const fmha_problem *p, fmha_problem *out) {
    if (!p) return fmha_fail(FMHA_ERR_NULL_POINTER, "the problem is NULL");
    /* every struct_size this library has shipped: the first (up to biases)
     * is read as the prefix of this one, the rest zero (off) */
    size_t first = offsetof(fmha_problem, sinks), second = offsetof(fmha_problem, block_table),
           third = offsetof(fmha_problem, dropout_p), fourth = offsetof(fmha_problem, kv_dtype),
           fifth = offsetof(fmha_problem, alignment), sixth = offsetof(fmha_problem, k_format);
    if (p->struct_size != sizeof(fmha_problem) && p->struct_size != first && p->struct_size != second &&
        p->struct_size != third && p->struct_size != fourth && p->struct_size != fifth && p->struct_size != sixth)
        return fmha_fail(FMHA_ERR_STRUCT_SIZE,
                         "struct_size must be sizeof(fmha_problem) = %zu (or an earlier release's %zu, %zu, %zu, %zu, "
                         "%zu, %zu), got %zu: fill the problem with fmha_problem_init",
                         sizeof(fmha_problem), first, second, third, fourth, fifth, sixth, (size_t)p->struct_size);
    memset(out, 0, sizeof *out);
    memcpy(out, p, p->struct_size);
    return FMHA_OK;
}

/* K's and V's formats and their scales' presence and strides (values are
 * read at every run: fmha_kv_scales_check). */
static fmha_status kv_formats_check(const fmha_problem *p) {
    for (int i = 0; i < 2; i++) {
        const char *t = i ? "v" : "k";
        const int64_t fmt = i ? p->v_format : p->k_format;
        if (fmt < FMHA_KV_FORMAT_DTYPE || fmt > FMHA_KV_FORMAT_Q4_0)
            return fmha_fail(FMHA_ERR_BAD_OPTION, "%s_format must be an fmha_kv_format (0..%d), got %lld", t,
                             FMHA_KV_FORMAT_Q4_0, (long long)fmt);
        const fmha_cache_format *f = fmha_cache_format_at(fmha_problem_format(p, i));
        const int64_t dim = i ? p->head_dim_v : p->head_dim, dim_stride = (i ? p->v_strides : p->k_strides)[3];
        const float *sc = i ? p->v_scales : p->k_scales;
        const int64_t *ss = i ? p->v_scale_strides : p->k_scale_strides;
        if (f->block > 1 && dim >= 1 && dim % f->block != 0)
            return fmha_fail(FMHA_ERR_BAD_HEAD_DIM, "%s must be a multiple of %u for %s_format %s, got %lld",
                             i ? "head_dim_v" : "head_dim", f->block, t, f->name, (long long)dim);
        if (f->block > 1 && dim_stride != 1)
            return fmha_fail(FMHA_ERR_BAD_STRIDE, "%s_strides[3] must be 1 for %s_format %s (whole blocks), got %lld", t,
                             t, f->name, (long long)dim_stride);
        if (f->scales == FMHA_SCALES_PER_KEY && !sc)
            return fmha_fail(FMHA_ERR_NULL_POINTER, "%s_scales must be given for %s_format %s (a scale per key and head)",
                             t, t, f->name);
        if ((f->scales == FMHA_SCALES_NONE || f->scales == FMHA_SCALES_IN_BLOCK) && sc)
            return fmha_fail(FMHA_ERR_BAD_OPTION, "%s_scales must be NULL for %s_format %s (%s)", t, t, f->name,
                             f->scales == FMHA_SCALES_NONE ? "it has no scales" : "its scales are in its blocks");
        for (int d = 0; sc && d < 3; d++)
            if (ss[d] < 0)
                return fmha_fail(FMHA_ERR_BAD_STRIDE, "%s_scale_strides[%d] must not be negative, got %lld", t, d,
                                 (long long)ss[d]);
    }
    return FMHA_OK;
}

fmha_status fmha_problem_check(const fmha_problem *p_in) {
    fmha_error_clear();
    fmha_status st;
    fmha_problem copy;
    st = fmha_problem_load(p_in, &copy);
    if (st != FMHA_OK) return st;
    const fmha_problem *p = &copy;
    if ((unsigned)p->dtype >= FMHA_DTYPE_COUNT_)
        return fmha_fail(FMHA_ERR_BAD_OPTION, "dtype must be an fmha_dtype (0..%d), got %d", FMHA_DTYPE_COUNT_ - 1,
                         (int)p->dtype);
    if ((unsigned)p->kv_dtype > FMHA_KV_DTYPE_F16)
        return fmha_fail(FMHA_ERR_BAD_OPTION, "kv_dtype must be an fmha_kv_dtype (0..%d), got %d", FMHA_KV_DTYPE_F16,
                         (int)p->kv_dtype);
    if ((unsigned)p->strategy > FMHA_STRATEGY_PORTABLE)
        return fmha_fail(FMHA_ERR_BAD_OPTION, "strategy must be an fmha_strategy (0..%d), got %d",
                         FMHA_STRATEGY_PORTABLE, (int)p->strategy);
    if ((unsigned)p->causal > FMHA_CAUSAL_BOTTOM_RIGHT)
        return fmha_fail(FMHA_ERR_BAD_OPTION, "causal must be an fmha_causal (0..%d), got %d", FMHA_CAUSAL_BOTTOM_RIGHT,
                         (int)p->causal);
    if (p->alignment < FMHA_ALIGN_CAUSAL || p->alignment > FMHA_ALIGN_BOTTOM_RIGHT)
        return fmha_fail(FMHA_ERR_BAD_OPTION, "alignment must be an fmha_alignment (0..%d), got %lld",
                         FMHA_ALIGN_BOTTOM_RIGHT, (long long)p->alignment);
    if ((p->causal == FMHA_CAUSAL_TOP_LEFT && p->alignment == FMHA_ALIGN_BOTTOM_RIGHT) ||
        (p->causal == FMHA_CAUSAL_BOTTOM_RIGHT && p->alignment == FMHA_ALIGN_TOP_LEFT))
        return fmha_fail(FMHA_ERR_BAD_OPTION, "alignment %s contradicts causal's %s alignment",
                         p->alignment == FMHA_ALIGN_TOP_LEFT ? "top-left" : "bottom-right",
                         p->causal == FMHA_CAUSAL_TOP_LEFT ? "top-left" : "bottom-right");
    if ((unsigned)p->precision > FMHA_PRECISION_BF16)
        return fmha_fail(FMHA_ERR_BAD_OPTION, "precision must be an fmha_precision (0..%d), got %d",
                         FMHA_PRECISION_BF16, (int)p->precision);
    {
        const char *names[5] = {"batch", "heads_q", "heads_kv", "seq_q", "seq_kv"};
        const int64_t sizes[5] = {p->batch, p->heads_q, p->heads_kv, p->seq_q, p->seq_kv};
        for (int i = 0; i < 5; i++)
            if (sizes[i] < 1)
                return fmha_fail(FMHA_ERR_BAD_SIZE, "%s must be at least 1, got %lld", names[i], (long long)sizes[i]);
    }
    if (p->heads_q % p->heads_kv != 0)
        return fmha_fail(FMHA_ERR_BAD_HEADS, "heads_q must be a multiple of heads_kv, got %lld and %lld",
                         (long long)p->heads_q, (long long)p->heads_kv);
    if (p->head_dim < 1 || p->head_dim > FMHA_MAX_HEAD_DIM)
        return fmha_fail(FMHA_ERR_BAD_HEAD_DIM, "head_dim must lie in 1..%d, got %lld", FMHA_MAX_HEAD_DIM,
                         (long long)p->head_dim);
    if (p->head_dim_v < 1 || p->head_dim_v > FMHA_MAX_HEAD_DIM)
        return fmha_fail(FMHA_ERR_BAD_HEAD_DIM, "head_dim_v must lie in 1..%d, got %lld", FMHA_MAX_HEAD_DIM,
                         (long long)p->head_dim_v);
    if (!isfinite(p->scale)) return fmha_fail(FMHA_ERR_BAD_SCALE, "scale must be finite, got %g", (double)p->scale);
    if (!(p->dropout_p >= 0.0f && p->dropout_p < 1.0f))
        return fmha_fail(FMHA_ERR_BAD_OPTION, "dropout_p must lie in [0, 1), got %g", (double)p->dropout_p);
    st = kv_formats_check(p);
    if (st != FMHA_OK) return st;
    /* a cache dtype of its own only beside float32 queries */
    if (p->k_format == FMHA_KV_FORMAT_DTYPE && p->v_format == FMHA_KV_FORMAT_DTYPE && fmha_kv_dtype_of(p) != p->dtype &&
        p->dtype != FMHA_DTYPE_F32)
        return fmha_fail(FMHA_ERR_UNSUPPORTED,
                         "kv_dtype differs from a %s problem's dtype: K and V of their own dtype need float32 Q",
                         p->dtype == FMHA_DTYPE_BF16 ? "bfloat16" : "float16");
    if (p->block_table) { /* the pool's shape before its strides are measured */
        const int64_t most = (int64_t)1 << 40;
        const char *names[3] = {"page_size", "num_pages", "block_table_stride"};
        const int64_t v[3] = {p->page_size, p->num_pages, p->block_table_stride};
        for (int i = 0; i < 3; i++)
            if (v[i] < 1 || v[i] > most)
                return fmha_fail(FMHA_ERR_BAD_PAGE, "%s must lie in 1..2^40 with a block table, got %lld", names[i],
                                 (long long)v[i]);
        /* pages a sequence of seq_kv keys spans, without overflow */
        int64_t pages = p->seq_kv / p->page_size + (p->seq_kv % p->page_size != 0);
        if (p->block_table_stride < pages)
            return fmha_fail(FMHA_ERR_BAD_PAGE,
                             "block_table_stride must be at least ceil(seq_kv / page_size) = %lld, got %lld",
                             (long long)pages, (long long)p->block_table_stride);
    }
    /* Sizes that cannot be indexed (or whose scratch cannot be sized) are
     * errors; products are checked, never overflowed. */
    const int64_t limit = (int64_t)1 << 40;
    int64_t heads_all, scores;
    if (p->batch > limit || p->heads_q > limit || p->seq_q > limit || p->seq_kv > limit ||
        __builtin_mul_overflow(p->batch, p->heads_q, &heads_all) || heads_all > limit ||
        __builtin_mul_overflow(p->seq_q, p->seq_kv, &scores) || scores > INT64_MAX / 8)
        return fmha_fail(FMHA_ERR_BAD_SIZE,
                         "batch, heads_q, seq_q and seq_kv must each be at most 2^40, batch x heads_q at most 2^40 "
                         "and seq_q x seq_kv at most 2^60, got %lld, %lld, %lld, %lld",
                         (long long)p->batch, (long long)p->heads_q, (long long)p->seq_q, (long long)p->seq_kv);
    static const char *const tensor_names[4] = {"q", "k", "v", "o"};
    for (int t = 0; t < 4; t++) {
        int64_t ext[4];
        const int64_t *st = tensor_strides(p, t);
        tensor_extents(p, t, ext);
        for (int i = 0; i < 4; i++)
            if (st[i] < 0)
                return fmha_fail(FMHA_ERR_BAD_STRIDE, "%s_strides[%d] must not be negative, got %lld", tensor_names[t],
                                 i, (long long)st[i]);
        if (fmha_strided_span(ext, st) < 0)
            return fmha_fail(FMHA_ERR_BAD_SIZE, "%s spans more than 2^60 elements (strides %lld, %lld, %lld, %lld)",
                             tensor_names[t], (long long)st[0], (long long)st[1], (long long)st[2], (long long)st[3]);
        if (t == 3 && !fmha_strided_injective(ext, st))
            return fmha_fail(FMHA_ERR_BAD_STRIDE,
                             "o_strides (%lld, %lld, %lld, %lld) make two elements of O share memory",
                             (long long)st[0], (long long)st[1], (long long)st[2], (long long)st[3]);
    }
    st = fmha_masks_check(p);
    if (st == FMHA_OK) st = fmha_biases_check(p);
    return st;
}

/* ---- the tensors of a run ----
 * Each tensor a run reads or writes is named with its byte range. Every
 * output must be injective (no two elements share memory) and overlap no
 * other tensor, input or output; inputs may share memory with each other. */

typedef struct tensor_ref {
    const char *name;
    uintptr_t lo, hi; /* bytes [lo, hi) */
    int output;
} tensor_ref;

enum { MAX_TENSORS = 24 };

typedef struct tensor_list {
    tensor_ref t[MAX_TENSORS];
    int n;
    fmha_status status; /* first error while adding */
} tensor_list;

/* Adds a strided tensor of extents ext[4] (elements of elem bytes). */
static void add_strided(tensor_list *l, const char *name, const void *ptr, const int64_t ext[4],
                        const int64_t st[4], size_t elem, int output) {
    if (!ptr || l->status != FMHA_OK) return;
    int64_t span = fmha_strided_span(ext, st);
    if (span < 0) {
        l->status = fmha_fail(FMHA_ERR_BAD_SIZE, "%s spans more than 2^60 elements", name);
        return;
    }
    if (output && !fmha_strided_injective(ext, st)) {
        l->status = fmha_fail(FMHA_ERR_BAD_STRIDE, "the strides of %s (an output) make two of its elements share memory",
                              name);
        return;
    }
    uintptr_t lo = (uintptr_t)ptr;
    l->t[l->n++] = (tensor_ref){name, lo, lo + (uintptr_t)(span + 1) * elem, output};
}

/* Adds a contiguous array of n0 * n1 elements. */
static void add_array(tensor_list *l, const char *name, const void *ptr, int64_t n0, int64_t n1,
                      size_t elem, int output) {
    int64_t n;
    if (!ptr || l->status != FMHA_OK) return;
    if (__builtin_mul_overflow(n0, n1, &n) || n > INT64_MAX / 8) {
        l->status = fmha_fail(FMHA_ERR_BAD_SIZE, "%s holds more than 2^60 elements (%lld x %lld)", name, (long long)n0,
                              (long long)n1);
        return;
    }
    uintptr_t lo = (uintptr_t)ptr;
    l->t[l->n++] = (tensor_ref){name, lo, lo + (uintptr_t)n * elem, output};
}

static void tensor_ext(const fmha_problem *p, int which, int64_t ext[4]) { tensor_extents(p, which, ext); }

/* Adds tensor `which` (0 q, 1 k, 2 v, 3 o) of the problem's dtype (K and V: kv_dtype's). */
static void add_qkvo(tensor_list *l, const fmha_problem *p, const char *name, int which,
                     const void *ptr, int output) {
    int64_t ext[4];
    tensor_ext(p, which, ext);
    size_t unit = which == 1 || which == 2 ? fmha_cache_format_at(fmha_problem_format(p, which - 1))->unit_bytes
                                           : fmha_dtype_size(p->dtype);
    add_strided(l, name, ptr, ext, tensor_strides(p, which), unit, output);
}

/* The mask and bias arrays a run reads. */
static void add_mask_bias_inputs(tensor_list *l, const fmha_problem *p) {
    const fmha_masks *m = &p->masks;
    const fmha_biases *bs = &p->biases;
    int64_t scores[4] = {p->batch, p->heads_q, p->seq_q, p->seq_kv};
    add_array(l, "kv_lengths", m->kv_lengths, p->batch, 1, sizeof(int32_t), 0);
    add_array(l, "q_lengths", m->q_lengths, p->batch, 1, sizeof(int32_t), 0);
    add_array(l, "q_segment_ids", m->q_segment_ids, p->batch, p->seq_q, sizeof(int32_t), 0);
    add_array(l, "kv_segment_ids", m->kv_segment_ids, p->batch, p->seq_kv, sizeof(int32_t), 0);
    add_strided(l, "dense mask", m->dense, scores, m->dense_strides, 1, 0);
    add_strided(l, "dense bias", bs->dense, scores, bs->dense_strides, sizeof(float), 0);
    add_array(l, "alibi_slopes", bs->alibi_slopes, p->heads_q, 1, sizeof(float), 0);
    add_array(l, "rel_table", bs->rel_table, p->heads_q, bs->rel_num_buckets, sizeof(float), 0);
    add_array(l, "sinks", p->sinks, p->heads_q, 1, sizeof(float), 0);
    add_array(l, "block_table", p->block_table, p->batch, p->block_table_stride, sizeof(int32_t), 0);
    for (int i = 0; i < 2; i++) { /* the cache's scales: per key [B or pages, S, Hkv], or per head [Hkv] */
        const float *sc = i ? p->v_scales : p->k_scales;
        if (!sc) continue;
        const int per_key = fmha_cache_format_at(fmha_problem_format(p, i))->scales == FMHA_SCALES_PER_KEY;
        int64_t ext[4] = {per_key ? (p->block_table ? p->num_pages : p->batch) : 1,
                          per_key ? (p->block_table ? p->page_size : p->seq_kv) : 1, p->heads_kv, 1};
        const int64_t *ss = i ? p->v_scale_strides : p->k_scale_strides;
        int64_t st[4] = {ss[0], ss[1], ss[2], 0};
        add_strided(l, i ? "v_scales" : "k_scales", sc, ext, st, sizeof(float), 0);
    }
}

/* Bias gradients: each needs its bias; the dense one broadcasts exactly where
 * the bias does and must not overlap itself. */
fmha_status fmha_param_grads_check(const fmha_problem *p, const fmha_param_grads *g) {
    if (!g) return FMHA_OK;
    const fmha_biases *bs = &p->biases;
    if (g->d_dense && !bs->dense)
        return fmha_fail(FMHA_ERR_BAD_MASK, "grads->d_dense is set but the problem has no dense bias");
    if (g->d_alibi && !bs->alibi_slopes)
        return fmha_fail(FMHA_ERR_BAD_MASK, "grads->d_alibi is set but the problem has no alibi_slopes");
    if (g->d_rel_table && !bs->rel_table)
        return fmha_fail(FMHA_ERR_BAD_MASK, "grads->d_rel_table is set but the problem has no rel_table");
    if (g->d_dense) {
        fmha_status st = fmha_dense_check(p, g->d_dense_strides, "grads->d_dense");
        if (st != FMHA_OK) return st;
        int64_t ext[4] = {p->batch, p->heads_q, p->seq_q, p->seq_kv};
        for (int i = 0; i < 4; i++)
            if (ext[i] > 1 && (g->d_dense_strides[i] == 0) != (bs->dense_strides[i] == 0))
                return fmha_fail(FMHA_ERR_BAD_STRIDE,
                                 "grads->d_dense_strides[%d] must broadcast where biases.dense_strides[%d] does "
                                 "(0 exactly when it is 0), got %lld against %lld",
                                 i, i, (long long)g->d_dense_strides[i], (long long)bs->dense_strides[i]);
    }
    return FMHA_OK;
}

static void add_param_grads(tensor_list *l, const fmha_problem *p, const fmha_param_grads *g) {
    if (!g) return;
    int64_t ext[4] = {p->batch, p->heads_q, p->seq_q, p->seq_kv};
    /* the gradient's own extent: 1 where it broadcasts */
    for (int i = 0; i < 4; i++)
        if (g->d_dense_strides[i] == 0) ext[i] = 1;
    add_strided(l, "d_dense", g->d_dense, ext, g->d_dense_strides, sizeof(float), 1);
    add_array(l, "d_alibi", g->d_alibi, p->heads_q, 1, sizeof(float), 1);
    add_array(l, "d_rel_table", g->d_rel_table, p->heads_q, p->biases.rel_num_buckets, sizeof(float), 1);
}

fmha_status fmha_tensors_check(const fmha_problem *p, const fmha_tensors *t) {
    tensor_list l;
    l.n = 0;
    l.status = FMHA_OK;
    add_qkvo(&l, p, "q", 0, t->q, 0);
    add_qkvo(&l, p, "k", 1, t->k, 0);
    add_qkvo(&l, p, "v", 2, t->v, 0);
    add_qkvo(&l, p, "o", 3, t->o_in, 0);
    add_qkvo(&l, p, "d_o", 3, t->d_o, 0);
    add_array(&l, "lse", t->lse_in, p->batch * p->heads_q, p->seq_q, sizeof(float), 0);
    add_mask_bias_inputs(&l, p);
    add_qkvo(&l, p, "o", 3, t->o, 1);
    add_array(&l, "lse", t->lse, p->batch * p->heads_q, p->seq_q, sizeof(float), 1);
    add_qkvo(&l, p, "dq", 0, t->dq, 1);
    add_qkvo(&l, p, "dk", 1, t->dk, 1);
    add_qkvo(&l, p, "dv", 2, t->dv, 1);
    add_param_grads(&l, p, t->grads);
    add_array(&l, "d_sinks", t->d_sinks, p->heads_q, 1, sizeof(float), 1);
    if (l.status != FMHA_OK) return l.status;
    for (int i = 0; i < l.n; i++) {
        if (!l.t[i].output) continue;
        for (int j = 0; j < l.n; j++)
            if (j != i && l.t[i].lo < l.t[j].hi && l.t[j].lo < l.t[i].hi)
                return fmha_fail(FMHA_ERR_OVERLAP, "the output %s overlaps %s %s in memory", l.t[i].name,
                                 l.t[j].output ? "the output" : "the input", l.t[j].name);
    }
    return FMHA_OK;
}
