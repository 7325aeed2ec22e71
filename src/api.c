/* api.c: the public entry points. Validates every argument before anything
 * is written, resolves a fmha_problem into a plan (scale, kernels, strategy,
 * threads, workspace), and hands the plan to a driver. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "attn.h"
#include "convert.h"
#include "cpu.h"
#include "pool.h"

const char *fmha_status_string(fmha_status status) {
    switch (status) {
    case FMHA_OK: return "success";
    case FMHA_ERR_NULL_POINTER: return "a required pointer is NULL";
    case FMHA_ERR_BAD_SIZE: return "batch, heads and sequence lengths must be >= 1 and the tensors must fit in memory";
    case FMHA_ERR_BAD_HEADS: return "heads_q must be a multiple of heads_kv";
    case FMHA_ERR_BAD_HEAD_DIM: return "head_dim and head_dim_v must be between 1 and 256";
    case FMHA_ERR_BAD_SCALE: return "scale must be finite (0 selects 1/sqrt(head_dim))";
    case FMHA_ERR_BAD_STRIDE: return "strides must be >= 0 and an output's elements must not overlap each other";
    case FMHA_ERR_OVERLAP: return "an output overlaps an input or another output";
    case FMHA_ERR_BAD_OPTION: return "unknown strategy, causal alignment, dtype or precision";
    case FMHA_ERR_UNSUPPORTED: return "this request is valid but not supported by this build";
    case FMHA_ERR_WORKSPACE_TOO_SMALL: return "the workspace is smaller than the size query returned (did the thread count change?)";
    case FMHA_ERR_OUT_OF_MEMORY: return "out of memory";
    case FMHA_ERR_BAD_THREAD_COUNT: return "the thread count must be between 0 (default) and 1024";
    case FMHA_ERR_BAD_MASK: return "a mask or bias argument is invalid";
    case FMHA_ERR_CALLBACK: return "a mask callback returned an invalid tile class";
    }
    return "unknown fmha status code";
}

const char *fmha_version_string(void) { return "0.1.0"; }

const char *fmha_isa_name(void) { return fmha_cpu_kernels()->isa; }

fmha_status fmha_set_num_threads(int n) {
    return fmha_pool_set_threads(n) == 0 ? FMHA_OK : FMHA_ERR_BAD_THREAD_COUNT;
}

int fmha_get_num_threads(void) { return fmha_pool_threads(); }

/* a * b, saturated to INT64_MAX / INT64_MIN: sizes that overflow leave
 * strides that fmha_problem_check rejects (FMHA_ERR_BAD_SIZE). */
static int64_t sat_mul(int64_t a, int64_t b) {
    int64_t r;
    if (!__builtin_mul_overflow(a, b, &r)) return r;
    return (a < 0) != (b < 0) ? INT64_MIN : INT64_MAX;
}

void fmha_problem_init(fmha_problem *p, int64_t batch, int64_t heads_q, int64_t heads_kv,
                       int64_t seq_q, int64_t seq_kv, int64_t head_dim, int64_t head_dim_v,
                       fmha_layout layout) {
    if (!p) return;
    *p = (fmha_problem){0};
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
    p->precision = FMHA_PRECISION_ACCURATE;
    p->masks.window_left = -1;
    p->masks.window_right = -1;
    struct { int64_t *st, s, h, d; } t[4] = {{p->q_strides, seq_q, heads_q, head_dim},
                                             {p->k_strides, seq_kv, heads_kv, head_dim},
                                             {p->v_strides, seq_kv, heads_kv, head_dim_v},
                                             {p->o_strides, seq_q, heads_q, head_dim_v}};
    for (int i = 0; i < 4; i++) {
        int64_t *st = t[i].st;
        st[3] = 1;
        if (layout == FMHA_LAYOUT_BHSD) {
            st[1] = t[i].d;
            st[2] = sat_mul(t[i].s, t[i].d);
            st[0] = sat_mul(t[i].h, st[2]);
        } else {
            st[2] = t[i].d;
            st[1] = sat_mul(t[i].h, t[i].d);
            st[0] = sat_mul(t[i].s, st[1]);
        }
    }
}

/* ---- validation ---- */

/* Extents [batch, seq, head, dim] of the four tensors. */
static void tensor_extents(const fmha_problem *p, int which, int64_t ext[4]) {
    int q_side = which == 0 || which == 3;
    ext[0] = p->batch;
    ext[1] = q_side ? p->seq_q : p->seq_kv;
    ext[2] = q_side ? p->heads_q : p->heads_kv;
    ext[3] = which <= 1 ? p->head_dim : p->head_dim_v;
}

static const int64_t *tensor_strides(const fmha_problem *p, int which) {
    return which == 0 ? p->q_strides : which == 1 ? p->k_strides : which == 2 ? p->v_strides : p->o_strides;
}

/* Largest element offset of a tensor, or -1 on overflow. */
static int64_t tensor_span(const int64_t ext[4], const int64_t st[4]) {
    int64_t span = 0;
    for (int i = 0; i < 4; i++) {
        if (st[i] != 0 && ext[i] - 1 > (INT64_MAX / 8 - span) / st[i]) return -1;
        span += st[i] * (ext[i] - 1);
    }
    return span;
}

/* A dimension of extent 1 accepts any stride, but kernels still step a
 * pointer by it once past the end; a stride no larger dimension could have
 * (> INT64_MAX / 8) is replaced by 0 in the plan so that step cannot wrap. */
static void plan_tame_unit_strides(fmha_problem *p) {
    for (int t = 0; t < 4; t++) {
        int64_t ext[4];
        int64_t *st = (int64_t *)tensor_strides(p, t);
        tensor_extents(p, t, ext);
        for (int i = 0; i < 4; i++)
            if (ext[i] == 1 && st[i] > INT64_MAX / 8) st[i] = 0;
    }
}

/* 1 if distinct indices always map to distinct offsets in the nested sense:
 * dims sorted by stride, each stride exceeds the reach of the smaller ones. */
static int tensor_injective(const int64_t ext[4], const int64_t st[4]) {
    int order[4] = {0, 1, 2, 3};
    for (int i = 1; i < 4; i++)
        for (int j = i; j > 0 && st[order[j]] < st[order[j - 1]]; j--) {
            int t = order[j]; order[j] = order[j - 1]; order[j - 1] = t;
        }
    int64_t reach = 0;
    for (int i = 0; i < 4; i++) {
        int d = order[i];
        if (ext[d] == 1) continue;
        if (st[d] <= reach) return 0;
        reach += st[d] * (ext[d] - 1);
    }
    return 1;
}

fmha_status fmha_problem_check(const fmha_problem *p) {
    fmha_status st;
    if (!p) return FMHA_ERR_NULL_POINTER;
    if ((unsigned)p->dtype > FMHA_DTYPE_F16) return FMHA_ERR_BAD_OPTION;
    if ((unsigned)p->strategy > FMHA_STRATEGY_PORTABLE) return FMHA_ERR_BAD_OPTION;
    if ((unsigned)p->causal > FMHA_CAUSAL_BOTTOM_RIGHT) return FMHA_ERR_BAD_OPTION;
    if ((unsigned)p->precision > FMHA_PRECISION_FAST) return FMHA_ERR_BAD_OPTION;
    if (p->batch < 1 || p->heads_q < 1 || p->heads_kv < 1 || p->seq_q < 1 || p->seq_kv < 1)
        return FMHA_ERR_BAD_SIZE;
    if (p->heads_q % p->heads_kv != 0) return FMHA_ERR_BAD_HEADS;
    if (p->head_dim < 1 || p->head_dim > FMHA_MAX_HEAD_DIM || p->head_dim_v < 1 ||
        p->head_dim_v > FMHA_MAX_HEAD_DIM)
        return FMHA_ERR_BAD_HEAD_DIM;
    if (!isfinite(p->scale)) return FMHA_ERR_BAD_SCALE;
    /* Sizes that cannot be indexed (or whose scratch cannot be sized) are
     * errors; products are checked, never overflowed. */
    const int64_t limit = (int64_t)1 << 40;
    int64_t heads_all, scores;
    if (p->batch > limit || p->heads_q > limit || p->seq_q > limit || p->seq_kv > limit ||
        __builtin_mul_overflow(p->batch, p->heads_q, &heads_all) || heads_all > limit ||
        __builtin_mul_overflow(p->seq_q, p->seq_kv, &scores) || scores > INT64_MAX / 8)
        return FMHA_ERR_BAD_SIZE;
    for (int t = 0; t < 4; t++) {
        int64_t ext[4];
        const int64_t *st = tensor_strides(p, t);
        tensor_extents(p, t, ext);
        for (int i = 0; i < 4; i++)
            if (st[i] < 0) return FMHA_ERR_BAD_STRIDE;
        if (tensor_span(ext, st) < 0) return FMHA_ERR_BAD_SIZE;
        if (t == 3 && !tensor_injective(ext, st)) return FMHA_ERR_BAD_STRIDE;
    }
    st = fmha_masks_check(p);
    if (st == FMHA_OK) st = fmha_biases_check(p);
    return st;
}

/* Byte range [lo, hi) of a tensor. */
typedef struct byte_range { uintptr_t lo, hi; } byte_range;

static byte_range range_of_tensor(const fmha_problem *p, int which, const void *ptr) {
    int64_t ext[4];
    tensor_extents(p, which, ext);
    uintptr_t lo = (uintptr_t)ptr;
    size_t elem = fmha_dtype_size(p->dtype);
    return (byte_range){lo, lo + (uintptr_t)(tensor_span(ext, tensor_strides(p, which)) + 1) * elem};
}

static int ranges_overlap(byte_range a, byte_range b) { return a.lo < b.hi && b.lo < a.hi; }

static byte_range range_of_lse(const fmha_problem *p, const float *lse) {
    uintptr_t lo = (uintptr_t)lse;
    return (byte_range){lo, lo + (uintptr_t)(p->batch * p->heads_q * p->seq_q) * sizeof(float)};
}

/* ---- planning ---- */

/* Dense materialises the scores of one head per thread. Measured with
 * fmha-bench (B = 1, 8 heads, D = 64, float32, 2 threads, AVX-512, one run,
 * median ms, dense / tiled): fwd S=64 0.058/0.064, S=128 0.167/0.143,
 * S=256 0.440/0.423, S=512 1.43/1.44, S=1024 5.49/5.45, S=2048 52/41;
 * fwdbwd within 2% of each other up to 1024 (one backward serves both).
 * Dense wins only below ~100 x 100 scores and needs O(S^2) memory, so auto
 * takes it there only. */
#define FMHA_AUTO_DENSE_MAX_SCORES ((int64_t)96 * 96)

static fmha_strategy resolve_strategy(const fmha_problem *p) {
    switch (p->strategy) {
    case FMHA_STRATEGY_DENSE: return FMHA_STRATEGY_DENSE;
    case FMHA_STRATEGY_AUTO:
        return p->seq_q * p->seq_kv <= FMHA_AUTO_DENSE_MAX_SCORES ? FMHA_STRATEGY_DENSE
                                                                  : FMHA_STRATEGY_TILED;
    default: return FMHA_STRATEGY_TILED;
    }
}

typedef enum { PLAN_FORWARD, PLAN_BACKWARD } plan_kind;

static fmha_status plan_make(const fmha_problem *p, plan_kind kind,
                             const fmha_param_grads *grads, fmha_plan *plan) {
    fmha_status st = fmha_problem_check(p);
    if (st != FMHA_OK) return st;
    *plan = (fmha_plan){0};
    plan->p = *p;
    plan_tame_unit_strides(&plan->p);
    plan->grads = grads;
    const fmha_masks *mk = &p->masks;
    const fmha_biases *bs = &p->biases;
    plan->band_lo = mk->window_left >= 0 ? -mk->window_left : INT64_MIN;
    plan->band_hi = mk->window_right >= 0 ? mk->window_right : INT64_MAX;
    if (p->causal != FMHA_CAUSAL_NONE && plan->band_hi > 0) plan->band_hi = 0;
    plan->has_mask = mk->kv_lengths || mk->q_lengths || mk->q_segment_ids || mk->dense ||
                     mk->callback.fill;
    plan->has_bias = bs->dense || bs->alibi_slopes || bs->rel_table || bs->softcap != 0.0f ||
                     bs->callback.fill;
    plan->scale = p->scale != 0.0f ? p->scale : (float)(1.0 / sqrt((double)p->head_dim));
    plan->uk = p->strategy == FMHA_STRATEGY_PORTABLE ? &fmha_ukernels_scalar : fmha_cpu_kernels();
    plan->strategy = resolve_strategy(p);
    plan->bf16_fast = p->dtype == FMHA_DTYPE_BF16 && plan->uk->gemm_bf16 != NULL;
    plan->o_dtype = p->dtype;
    plan->threads = fmha_pool_threads();
    plan->group = p->heads_q / p->heads_kv;
    plan->causal_offset = p->causal == FMHA_CAUSAL_BOTTOM_RIGHT ? p->seq_kv - p->seq_q : 0;
    st = fmha_mask_precheck(plan);
    if (st != FMHA_OK) return st;
    if (kind == PLAN_FORWARD)
        fmha_fwd_workspace(plan, &plan->thread_bytes, &plan->shared_bytes);
    else
        fmha_bwd_workspace(plan, &plan->thread_bytes, &plan->shared_bytes);
    return FMHA_OK;
}

size_t fmha_plan_workspace_bytes(const fmha_plan *plan) {
    return (size_t)plan->threads * plan->thread_bytes + plan->shared_bytes + FMHA_ALIGN;
}

/* Aligns the caller's workspace or allocates one; *owned is what to free. */
static fmha_status workspace_take(const fmha_plan *plan, void *ws, size_t ws_bytes, char **aligned,
                                  void **owned) {
    size_t need = fmha_plan_workspace_bytes(plan);
    *owned = NULL;
    if (ws) {
        if (ws_bytes < need) return FMHA_ERR_WORKSPACE_TOO_SMALL;
    } else {
        ws = *owned = malloc(need);
        if (!ws) return FMHA_ERR_OUT_OF_MEMORY;
    }
    *aligned = (char *)ws + (FMHA_ALIGN - (uintptr_t)ws % FMHA_ALIGN) % FMHA_ALIGN;
    return FMHA_OK;
}

/* ---- forward ---- */

fmha_status fmha_forward_workspace_size(const fmha_problem *p, size_t *bytes) {
    if (!bytes) return FMHA_ERR_NULL_POINTER;
    fmha_plan plan;
    fmha_status st = plan_make(p, PLAN_FORWARD, NULL, &plan);
    if (st != FMHA_OK) return st;
    *bytes = fmha_plan_workspace_bytes(&plan);
    return FMHA_OK;
}

fmha_status fmha_forward(const fmha_problem *p, const void *q, const void *k, const void *v,
                         void *o, float *lse, void *workspace, size_t workspace_bytes) {
    if (!p || !q || !k || !v || !o) return FMHA_ERR_NULL_POINTER;
    fmha_plan plan;
    fmha_status st = plan_make(p, PLAN_FORWARD, NULL, &plan);
    if (st != FMHA_OK) return st;
    byte_range ro = range_of_tensor(p, 3, o);
    for (int t = 0; t < 3; t++)
        if (ranges_overlap(ro, range_of_tensor(p, t, t == 0 ? q : t == 1 ? k : v)))
            return FMHA_ERR_OVERLAP;
    if (lse) {
        byte_range rl = range_of_lse(p, lse);
        if (ranges_overlap(rl, ro)) return FMHA_ERR_OVERLAP;
        for (int t = 0; t < 3; t++)
            if (ranges_overlap(rl, range_of_tensor(p, t, t == 0 ? q : t == 1 ? k : v)))
                return FMHA_ERR_OVERLAP;
    }
    char *ws;
    void *owned;
    st = workspace_take(&plan, workspace, workspace_bytes, &ws, &owned);
    if (st != FMHA_OK) return st;
    st = fmha_fwd_run(&plan, q, k, v, o, lse, ws);
    free(owned);
    return st;
}

/* ---- backward ---- */

/* Bias gradients: each needs its bias; the dense one broadcasts exactly where
 * the bias does and must not overlap itself. */
static fmha_status param_grads_check(const fmha_problem *p, const fmha_param_grads *g) {
    if (!g) return FMHA_OK;
    const fmha_biases *bs = &p->biases;
    if ((g->d_dense && !bs->dense) || (g->d_alibi && !bs->alibi_slopes) ||
        (g->d_rel_table && !bs->rel_table))
        return FMHA_ERR_BAD_MASK;
    if (g->d_dense) {
        int64_t ext[4] = {p->batch, p->heads_q, p->seq_q, p->seq_kv};
        for (int i = 0; i < 4; i++) {
            if (g->d_dense_strides[i] < 0) return FMHA_ERR_BAD_STRIDE;
            if (ext[i] > 1 && (g->d_dense_strides[i] == 0) != (bs->dense_strides[i] == 0))
                return FMHA_ERR_BAD_STRIDE;
        }
        if (fmha_dense_span(p, g->d_dense_strides) < 0) return FMHA_ERR_BAD_SIZE;
        int64_t inner[4];
        for (int i = 0; i < 4; i++) inner[i] = g->d_dense_strides[i] ? ext[i] : 1;
        if (!tensor_injective(inner, g->d_dense_strides)) return FMHA_ERR_BAD_STRIDE;
    }
    return FMHA_OK;
}

fmha_status fmha_backward_workspace_size(const fmha_problem *p, size_t *bytes) {
    if (!bytes) return FMHA_ERR_NULL_POINTER;
    fmha_plan plan;
    fmha_status st = plan_make(p, PLAN_BACKWARD, NULL, &plan);
    if (st != FMHA_OK) return st;
    *bytes = fmha_plan_workspace_bytes(&plan);
    return FMHA_OK;
}

fmha_status fmha_backward(const fmha_problem *p, const void *q, const void *k, const void *v,
                          const void *o, const void *d_o, const float *lse, void *dq, void *dk,
                          void *dv, const fmha_param_grads *grads, void *workspace,
                          size_t workspace_bytes) {
    if (!p || !q || !k || !v || !o || !d_o || !lse || !dq || !dk || !dv)
        return FMHA_ERR_NULL_POINTER;
    fmha_status st = param_grads_check(p, grads);
    if (st != FMHA_OK) return st;
    fmha_plan plan;
    st = plan_make(p, PLAN_BACKWARD, grads, &plan);
    if (st != FMHA_OK) return st;
    /* Gradients use the strides of their primal: dq ~ q (0), dk ~ k (1), dv ~ v (2). */
    const void *inputs[5] = {q, k, v, o, d_o};
    const int input_kind[5] = {0, 1, 2, 3, 3};
    void *outputs[3] = {dq, dk, dv};
    byte_range rin[6], rout[3];
    for (int i = 0; i < 5; i++) rin[i] = range_of_tensor(p, input_kind[i], inputs[i]);
    rin[5] = range_of_lse(p, lse);
    for (int i = 0; i < 3; i++) {
        int64_t ext[4];
        tensor_extents(p, i, ext);
        if (!tensor_injective(ext, tensor_strides(p, i))) return FMHA_ERR_BAD_STRIDE;
        rout[i] = range_of_tensor(p, i, outputs[i]);
        for (int j = 0; j < 6; j++)
            if (ranges_overlap(rout[i], rin[j])) return FMHA_ERR_OVERLAP;
        for (int j = 0; j < i; j++)
            if (ranges_overlap(rout[i], rout[j])) return FMHA_ERR_OVERLAP;
    }
    char *ws;
    void *owned;
    st = workspace_take(&plan, workspace, workspace_bytes, &ws, &owned);
    if (st != FMHA_OK) return st;
    st = fmha_bwd_run(&plan, q, k, v, o, d_o, lse, dq, dk, dv, ws);
    free(owned);
    return st;
}

fmha_status fmha_forward_backward(const fmha_problem *p, const void *q, const void *k,
                                  const void *v, const void *d_o, void *o, float *lse, void *dq,
                                  void *dk, void *dv, const fmha_param_grads *grads) {
    if (!p || !q || !k || !v || !d_o || !o || !lse || !dq || !dk || !dv)
        return FMHA_ERR_NULL_POINTER;
    /* Validate the backward's outputs before the forward writes anything. */
    fmha_status st = fmha_problem_check(p);
    if (st != FMHA_OK) return st;
    st = param_grads_check(p, grads);
    if (st != FMHA_OK) return st;
    byte_range ro = range_of_tensor(p, 3, o), rl = range_of_lse(p, lse);
    void *outs[3] = {dq, dk, dv};
    const void *ins[4] = {q, k, v, d_o};
    for (int i = 0; i < 3; i++) {
        int64_t ext[4];
        tensor_extents(p, i, ext);
        if (!tensor_injective(ext, tensor_strides(p, i))) return FMHA_ERR_BAD_STRIDE;
        byte_range rg = range_of_tensor(p, i, outs[i]);
        if (ranges_overlap(rg, ro) || ranges_overlap(rg, rl)) return FMHA_ERR_OVERLAP;
        for (int j = 0; j < 4; j++)
            if (ranges_overlap(rg, range_of_tensor(p, j == 3 ? 3 : j, ins[j]))) return FMHA_ERR_OVERLAP;
        for (int j = 0; j < i; j++)
            if (ranges_overlap(rg, range_of_tensor(p, j, outs[j]))) return FMHA_ERR_OVERLAP;
    }
    if (ranges_overlap(ro, rl)) return FMHA_ERR_OVERLAP;
    for (int j = 0; j < 4; j++) {
        byte_range ri = range_of_tensor(p, j == 3 ? 3 : j, ins[j]);
        if (ranges_overlap(ro, ri) || ranges_overlap(rl, ri)) return FMHA_ERR_OVERLAP;
    }
    if (p->dtype == FMHA_DTYPE_F32) {
        st = fmha_forward(p, q, k, v, o, lse, NULL, 0);
        if (st != FMHA_OK) return st;
        return fmha_backward(p, q, k, v, o, d_o, lse, dq, dk, dv, grads, NULL, 0);
    }
    /* bf16/f16: the forward also leaves O in float32 (same element strides),
     * and the backward's Dsum = rowsum(dO * O) reads that one: Dsum from the
     * rounded O would carry O's rounding error into every dS of the row. */
    int64_t ext[4];
    tensor_extents(p, 3, ext);
    size_t span = (size_t)tensor_span(ext, p->o_strides) + 1;
    float *o32 = malloc(span * sizeof(float));
    if (!o32) return FMHA_ERR_OUT_OF_MEMORY;
    fmha_plan plan;
    char *ws;
    void *owned;
    st = plan_make(p, PLAN_FORWARD, NULL, &plan);
    if (st == FMHA_OK) st = workspace_take(&plan, NULL, 0, &ws, &owned);
    if (st == FMHA_OK) {
        plan.o_dtype = FMHA_DTYPE_F32;
        st = fmha_fwd_run(&plan, q, k, v, o32, lse, ws);
        free(owned);
    }
    if (st == FMHA_OK) st = plan_make(p, PLAN_BACKWARD, grads, &plan);
    if (st == FMHA_OK) st = workspace_take(&plan, NULL, 0, &ws, &owned);
    if (st == FMHA_OK) {
        const int64_t *os = p->o_strides;
        for (int64_t b = 0; b < ext[0]; b++)
            for (int64_t i = 0; i < ext[1]; i++)
                for (int64_t h = 0; h < ext[2]; h++)
                    for (int64_t e = 0; e < ext[3]; e++) {
                        int64_t at = b * os[0] + i * os[1] + h * os[2] + e * os[3];
                        fmha_store(o, p->dtype, at, o32[at]);
                    }
        plan.dsum_o = o32;
        st = fmha_bwd_run(&plan, q, k, v, o, d_o, lse, dq, dk, dv, ws);
        free(owned);
    }
    free(o32);
    return st;
}
