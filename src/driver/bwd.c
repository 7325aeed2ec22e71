/* bwd.c: the backward pass (FlashAttention-2 order, transposed tiles),
 * parallel over key blocks, deterministic, no atomics.
 *
 * Derivation. With S = scale Q K^T (masked), P = softmax_rows(S), O = P V and
 * L a loss with dO = dL/dO:
 *   dV = P^T dO                                    (O is linear in V)
 *   dP = dO V^T
 *   dS = P * (dP - Dsum),  Dsum_i = sum_j P_ij dP_ij = rowsum(dO * O)
 *                                                   (softmax Jacobian per row)
 *   dQ = scale dS K,  dK = scale dS^T Q            (S is bilinear in Q, K)
 * P is never stored: it is recomputed as exp(S - lse) from the forward's lse.
 *
 * Work split. Key blocks of Bc keys are dealt to G fixed groups (block j goes
 * to group j mod G; G depends only on the problem's shape). A task is
 * (batch b, kv head hk, group g): it walks its key blocks; for each it owns
 * dK_j, dV_j (summed over the query heads sharing hk) and, for every query
 * head of the group and every query block that the mask lets see block j,
 * runs the five products below. dQ goes into the group's own float32 buffer
 * dQ_g; a last pass sums dQ_0 + ... + dQ_{G-1} in that order. Every sum has a
 * fixed order, so the gradients are bitwise identical for any thread count.
 *
 * Per (key block j: nk keys, query block i: nq <= NR queries), with lanes
 * running over queries as in the forward:
 *   S^T  [nk][NR]  = K_j (scale Q_i)^T          gemm, A = K rows
 *   P^T            = exp(S^T - lse_i)           exp_sub
 *   dV_j [nk][Dv] += P^T dO_i                   gemm, A = P^T, B = dO_i rows
 *   dP^T [nk][NR]  = V_j dO_i^T                 gemm, A = V rows
 *   dS^T           = P^T * (dP^T - Dsum_i)      ds
 *   dK_j [nk][D]  += dS^T (scale Q_i)           gemm, A = dS^T, B = Q_i rows
 *   dQ_i [nq][D]  += dS K_j                     gemm, A = dS (= dS^T read
 *                                               transposed), B = K_j rows
 * and dQ is scaled by `scale` once, in the final reduction.
 *
 * Workspace: shared Dsum [B, Hq, Sq] and dQ_g [G][B, Hq, Sq, D_pad] float32
 * (linear in S), plus per thread the tiles of one (i, j) pair (below). */
#include <math.h>
#include <string.h>

#include "../attn.h"
#include "../convert.h"
#include "../pool.h"

/* Tasks the backward aims for, independent of the thread count. */
#define BWD_TARGET_TASKS 8

typedef struct bwd_tiles {
    float *qt;     /* [D][NR]       (scale Q_i)^T */
    float *qrows;  /* [NR][D_pad]   scale Q_i rows */
    float *dot;    /* [Dv][NR]      dO_i^T */
    float *dorows; /* [NR][Dv_pad]  dO_i rows */
    float *pt;     /* [Bc][NR]      S^T then P^T */
    float *dpt;    /* [Bc][NR]      dP^T then dS^T */
    float *krows;  /* [Bc][D_pad]   K_j rows */
    float *vrows;  /* [Bc][Dv_pad]  V_j rows */
    float *dk;     /* [Bc][D_pad]   dK_j accumulator */
    float *dv;     /* [Bc][Dv_pad]  dV_j accumulator */
    float *lse;    /* [NR]          lse_i (padding lanes -inf) */
    float *dsum;   /* [NR]          Dsum_i (padding lanes 0) */
    float *raw;    /* [Bc][NR]      scores before softcap (softcap only) */
    float *diag;   /* [Bc + NR]     a tile's Toeplitz gradient sums */
    unsigned char *mask; /* [Bc][NR] for a mask callback */
} bwd_tiles;

/* How tasks split the work. Normally a task is (b, hk, g): one kv head, the
 * key blocks j = g mod G. When a dense bias gradient broadcasts over batch or
 * heads, one task takes every (b, hk) of its key blocks, so each gradient
 * element has one writer; broadcast over keys also forces G = 1. */
typedef struct bwd_split {
    size_t units;      /* (b, hk) units: B * Hkv, or 1 */
    size_t groups;     /* G */
    size_t tasks;      /* units * G */
} bwd_split;

typedef struct bwd_ctx {
    const fmha_plan *plan;
    const void *q, *k, *v, *o, *d_o;
    const float *lse;
    void *dq, *dk, *dv;
    float *dsum;       /* [B, Hq, Sq] */
    float *dq_part;    /* [G][B, Hq, Sq, D_pad] */
    double *bias_acc;  /* [tasks][heads per task][toeplitz_len] or NULL */
    double *bucket_acc;/* [rel_num_buckets] */
    char *thread_ws;
    bwd_split split;
    size_t bc, q_blocks, kv_blocks, d_pad, dv_pad, heads_per_task, bias_task_doubles;
    size_t dq_group_floats; /* floats between dQ_g and dQ_{g+1} */
} bwd_ctx;

static size_t fbytes(size_t n) { return fmha_round_up(n * sizeof(float), FMHA_ALIGN); }
static size_t dbytes(size_t n) { return fmha_round_up(n * sizeof(double), FMHA_ALIGN); }

static bwd_split bwd_split_of(const fmha_plan *plan) {
    const fmha_problem *p = &plan->p;
    size_t bc = plan->uk->block_kv;
    size_t kv_blocks = ((size_t)p->seq_kv + bc - 1) / bc;
    bwd_split s = {(size_t)(p->batch * p->heads_kv), 0, 0};
    const fmha_param_grads *g = plan->grads;
    int serial_keys = 0;
    if (g && g->d_dense) {
        const int64_t *ds = g->d_dense_strides;
        if ((ds[0] == 0 && p->batch > 1) || (ds[1] == 0 && p->heads_q > 1)) s.units = 1;
        /* heads of one kv group share a task, so only a broadcast across
         * groups needs the single unit; keys broadcast across key blocks */
        serial_keys = ds[3] == 0 && p->seq_kv > 1;
    }
    size_t groups = (BWD_TARGET_TASKS + s.units - 1) / s.units;
    if (groups > kv_blocks) groups = kv_blocks;
    if (groups < 1 || serial_keys) groups = 1;
    s.groups = groups;
    s.tasks = s.units * groups;
    return s;
}

static size_t bwd_heads_per_task(const fmha_plan *plan, bwd_split s) {
    return s.units == 1 ? (size_t)plan->p.heads_q : (size_t)plan->group;
}

/* Per-thread tile byte offsets, in bwd_tiles field order; returns the total. */
static size_t bwd_tile_layout(const fmha_plan *plan, size_t off[15]) {
    size_t nr = plan->uk->nr, bc = plan->uk->block_kv;
    size_t D = (size_t)plan->p.head_dim, Dv = (size_t)plan->p.head_dim_v;
    size_t d_pad = fmha_round_up(D, nr), dv_pad = fmha_round_up(Dv, nr);
    size_t n[14] = {D * nr, nr * d_pad, Dv * nr, nr * dv_pad, bc * nr, bc * nr,
                    bc * d_pad, bc * dv_pad, bc * d_pad, bc * dv_pad, nr, nr,
                    plan->p.biases.softcap != 0.0f ? bc * nr : 0, bc + nr};
    size_t total = 0;
    for (int i = 0; i < 14; i++) {
        off[i] = total;
        total += fbytes(n[i]);
    }
    off[14] = total;
    return total + fmha_mask_scratch_bytes(plan);
}

static size_t bwd_dq_floats(const fmha_plan *plan) {
    size_t d_pad = fmha_round_up((size_t)plan->p.head_dim, plan->uk->nr);
    return (size_t)(plan->p.batch * plan->p.heads_q * plan->p.seq_q) * d_pad;
}

/* Shared workspace: [Dsum][dQ_0 .. dQ_{G-1}][Toeplitz vectors][task bias
 * accumulators][bucket sums]. Byte offsets in off[0..4]; returns the total. */
static size_t bwd_shared_layout(const fmha_plan *plan, size_t off[5]) {
    bwd_split s = bwd_split_of(plan);
    size_t rows = (size_t)(plan->p.batch * plan->p.heads_q * plan->p.seq_q);
    size_t task_doubles = fmha_bias_grad_task_doubles(plan, bwd_heads_per_task(plan, s));
    size_t sizes[5] = {fbytes(rows), s.groups * fbytes(bwd_dq_floats(plan)),
                       fmha_bias_shared_bytes(plan), s.tasks * dbytes(task_doubles),
                       task_doubles ? dbytes((size_t)plan->p.biases.rel_num_buckets) : 0};
    size_t total = 0;
    for (int i = 0; i < 5; i++) {
        off[i] = total;
        total += sizes[i];
    }
    return total;
}

void fmha_bwd_workspace(const fmha_plan *plan, size_t *thread_bytes, size_t *shared_bytes) {
    size_t off[15], soff[5];
    *thread_bytes = bwd_tile_layout(plan, off);
    *shared_bytes = bwd_shared_layout(plan, soff);
}

static void bwd_carve(const fmha_plan *plan, char *base, bwd_tiles *t) {
    size_t off[15];
    bwd_tile_layout(plan, off);
    float **f[14] = {&t->qt, &t->qrows, &t->dot, &t->dorows, &t->pt, &t->dpt, &t->krows,
                     &t->vrows, &t->dk, &t->dv, &t->lse, &t->dsum, &t->raw, &t->diag};
    for (int i = 0; i < 14; i++) *f[i] = (float *)(base + off[i]);
    t->mask = (unsigned char *)(base + off[14]);
}

/* Dsum[b, h, i] = sum_c dO[b, i, h, c] * O[b, i, h, c], one task per (b, h). */
static void bwd_dsum_task(void *vctx, size_t task, int thread) {
    const bwd_ctx *c = vctx;
    const fmha_problem *p = &c->plan->p;
    int64_t b = (int64_t)task / p->heads_q, h = (int64_t)task % p->heads_q;
    const int64_t *os = p->o_strides;
    for (int64_t i = 0; i < p->seq_q; i++) {
        int64_t row = b * os[0] + i * os[1] + h * os[2];
        double acc = 0.0;
        for (int64_t e = 0; e < p->head_dim_v; e++)
            acc += (double)fmha_load(c->o, p->dtype, row + e * os[3]) *
                   fmha_load(c->d_o, p->dtype, row + e * os[3]);
        c->dsum[(size_t)task * (size_t)p->seq_q + (size_t)i] = (float)acc;
    }
}

/* Packs rows [n][ld] (zero padded) and, if tr, the transpose [cols][NR]
 * (zero padded lanes) of the strided [n x cols] block at element `first` of
 * a tensor of dtype t, times mul, widened to float32. */
static void bwd_pack(const void *src, fmha_dtype t, int64_t first, int64_t row_stride,
                     int64_t col_stride, int64_t n, int64_t cols, float mul, float *rows, size_t ld,
                     float *tr, size_t nr) {
    if (rows) memset(rows, 0, (size_t)n * ld * sizeof(float));
    if (tr) memset(tr, 0, (size_t)cols * nr * sizeof(float));
    for (int64_t i = 0; i < n; i++)
        for (int64_t e = 0; e < cols; e++) {
            float x = mul * fmha_load(src, t, first + i * row_stride + e * col_stride);
            if (rows) rows[(size_t)i * ld + (size_t)e] = x;
            if (tr) tr[(size_t)e * nr + (size_t)i] = x;
        }
}

/* C[m rows of `rows` starting at 0][ncols] (op)= A B over column panels of NR. */
static void bwd_gemm_panels(const fmha_ukernels *uk, size_t rows, size_t k, const float *a,
                            ptrdiff_t a_rs, ptrdiff_t a_cs, const float *b, size_t ldb, float *c,
                            size_t ldc, size_t ncols_pad, int mode) {
    for (size_t c0 = 0; c0 < ncols_pad; c0 += uk->nr)
        for (size_t r = 0; r < rows; r += uk->mr) {
            size_t m = rows - r < uk->mr ? rows - r : uk->mr;
            uk->gemm_f32(m, k, a + (ptrdiff_t)r * a_rs, a_rs, a_cs, b + c0, ldb, c + r * ldc + c0,
                         ldc, mode, NULL);
        }
}

/* One (query head h, query block) against one key block: tile t. */
static void bwd_pair(const bwd_ctx *c, bwd_tiles *t, const fmha_tile_pos *tp, int64_t hk,
                     fmha_tile_class cls, float *dq_g, double *bias_acc, int thread) {
    const fmha_plan *plan = c->plan;
    const fmha_problem *p = &plan->p;
    const fmha_ukernels *uk = plan->uk;
    size_t nr = uk->nr;
    int64_t b = tp->b, h = tp->h, q0 = tp->q0, nq = tp->nq, nk = tp->nk;
    const int64_t *qs = p->q_strides, *os = p->o_strides;
    size_t D = (size_t)p->head_dim, Dv = (size_t)p->head_dim_v;

    bwd_pack(c->q, p->dtype, b * qs[0] + q0 * qs[1] + h * qs[2], qs[1], qs[3], nq, (int64_t)D,
             plan->scale, t->qrows, c->d_pad, t->qt, nr);
    bwd_pack(c->d_o, p->dtype, b * os[0] + q0 * os[1] + h * os[2], os[1], os[3], nq, (int64_t)Dv,
             1.0f, t->dorows, c->dv_pad, t->dot, nr);
    size_t row0 = ((size_t)b * (size_t)p->heads_q + (size_t)h) * (size_t)p->seq_q + (size_t)q0;
    for (size_t i = 0; i < nr; i++) {
        t->lse[i] = (int64_t)i < nq ? c->lse[row0 + i] : -INFINITY;
        t->dsum[i] = (int64_t)i < nq ? c->dsum[row0 + i] : 0.0f;
    }

    /* S^T = K_j (scale Q_i)^T and dP^T = V_j dO_i^T */
    for (int64_t r = 0; r < nk; r += (int64_t)uk->mr) {
        size_t m = (size_t)(nk - r) < uk->mr ? (size_t)(nk - r) : uk->mr;
        uk->gemm_f32(m, D, t->krows + (size_t)r * c->d_pad, (ptrdiff_t)c->d_pad, 1, t->qt, nr,
                     t->pt + (size_t)r * nr, nr, FMHA_UK_STORE, NULL);
        uk->gemm_f32(m, Dv, t->vrows + (size_t)r * c->dv_pad, (ptrdiff_t)c->dv_pad, 1, t->dot, nr,
                     t->dpt + (size_t)r * nr, nr, FMHA_UK_STORE, NULL);
    }
    /* softcap, biases, masks as in the forward; then P^T = exp(S^T - lse) */
    int softcap = p->biases.softcap != 0.0f;
    if (cls == FMHA_TILE_PARTIAL || plan->has_bias)
        fmha_score_epilogue(plan, tp, cls, t->pt, nr, softcap ? t->raw : NULL, t->mask, thread);
    uk->exp_sub_f32((size_t)nk, t->pt, nr, t->lse);

    /* dV_j += P^T dO_i */
    bwd_gemm_panels(uk, (size_t)nk, (size_t)nq, t->pt, (ptrdiff_t)nr, 1, t->dorows, c->dv_pad, t->dv,
                    c->dv_pad, c->dv_pad, FMHA_UK_ACCUMULATE);
    /* dS^T = P^T (dP^T - Dsum): the gradient of the biased score */
    uk->ds_f32((size_t)nk, t->pt, t->dpt, nr, t->dsum);
    if (plan->grads || p->biases.callback.accumulate_grad)
        fmha_bias_grad_tile(plan, tp, t->dpt, nr, t->raw, t->diag, bias_acc, thread);
    if (softcap) fmha_softcap_grad(plan, tp, t->dpt, nr, t->raw);
    /* dK_j += dS^T (scale Q_i) */
    bwd_gemm_panels(uk, (size_t)nk, (size_t)nq, t->dpt, (ptrdiff_t)nr, 1, t->qrows, c->d_pad, t->dk,
                    c->d_pad, c->d_pad, FMHA_UK_ACCUMULATE);
    /* dQ_i += dS K_j  (A element (i, r) = dS^T[r][i]) */
    bwd_gemm_panels(uk, (size_t)nq, (size_t)nk, t->dpt, 1, (ptrdiff_t)nr, t->krows, c->d_pad,
                    dq_g + row0 * c->d_pad, c->d_pad, c->d_pad, FMHA_UK_ACCUMULATE);
}

/* Key block j of (b, hk): every query head of the group, every query block
 * the masks let see it; then dK_j, dV_j are stored. */
static void bwd_key_block(const bwd_ctx *c, bwd_tiles *t, int64_t b, int64_t hk, size_t j,
                          float *dq_g, double *task_acc, int64_t task_head0, int thread) {
    const fmha_plan *plan = c->plan;
    const fmha_problem *p = &plan->p;
    const int64_t *ks = p->k_strides, *vs = p->v_strides;
    size_t nr = plan->uk->nr, D = (size_t)p->head_dim, Dv = (size_t)p->head_dim_v;
    int64_t k0 = (int64_t)(j * c->bc);
    int64_t nk = p->seq_kv - k0 < (int64_t)c->bc ? p->seq_kv - k0 : (int64_t)c->bc;
    int packed = 0;
    for (int64_t h = hk * plan->group; h < (hk + 1) * plan->group; h++)
        for (size_t qb = 0; qb < c->q_blocks; qb++) {
            int64_t q0 = (int64_t)(qb * nr);
            fmha_tile_pos tp = {b, h, q0, p->seq_q - q0 < (int64_t)nr ? p->seq_q - q0 : (int64_t)nr,
                                k0, nk};
            int cls = fmha_mask_classify(plan, &tp, thread);
            if (cls == FMHA_TILE_EMPTY) continue;
            if (cls < 0) cls = FMHA_TILE_PARTIAL;
            if (!packed) {
                bwd_pack(c->k, p->dtype, b * ks[0] + k0 * ks[1] + hk * ks[2], ks[1], ks[3], nk,
                         (int64_t)D, 1.0f, t->krows, c->d_pad, NULL, nr);
                bwd_pack(c->v, p->dtype, b * vs[0] + k0 * vs[1] + hk * vs[2], vs[1], vs[3], nk,
                         (int64_t)Dv, 1.0f, t->vrows, c->dv_pad, NULL, nr);
                memset(t->dk, 0, (size_t)nk * c->d_pad * sizeof(float));
                memset(t->dv, 0, (size_t)nk * c->dv_pad * sizeof(float));
                packed = 1;
            }
            fmha_tiles_count();
            double *acc = task_acc ? task_acc + (size_t)(h - task_head0) * (size_t)plan->toeplitz_len : NULL;
            bwd_pair(c, t, &tp, hk, (fmha_tile_class)cls, dq_g, acc, thread);
        }
    /* dK_j, dV_j are complete (zero when no query sees the block) */
    for (int64_t r = 0; r < nk; r++) {
        int64_t dkrow = b * ks[0] + (k0 + r) * ks[1] + hk * ks[2];
        int64_t dvrow = b * vs[0] + (k0 + r) * vs[1] + hk * vs[2];
        for (size_t e = 0; e < D; e++)
            fmha_store(c->dk, p->dtype, dkrow + (int64_t)e * ks[3],
                       packed ? t->dk[(size_t)r * c->d_pad + e] : 0.0f);
        for (size_t e = 0; e < Dv; e++)
            fmha_store(c->dv, p->dtype, dvrow + (int64_t)e * vs[3],
                       packed ? t->dv[(size_t)r * c->dv_pad + e] : 0.0f);
    }
}

/* First query head of a task's bias accumulator rows. */
static int64_t bwd_task_head0(const void *vctx, size_t task) {
    const bwd_ctx *c = vctx;
    if (c->split.units == 1) return 0;
    size_t unit = task / c->split.groups;
    return (int64_t)(unit % (size_t)c->plan->p.heads_kv) * c->plan->group;
}

/* Task (unit, g): the key blocks j = g, g + G, ... of the unit's (b, hk). */
static void bwd_kv_task(void *vctx, size_t task, int thread) {
    const bwd_ctx *c = vctx;
    const fmha_problem *p = &c->plan->p;
    size_t g = task % c->split.groups, unit = task / c->split.groups;
    bwd_tiles t;
    bwd_carve(c->plan, c->thread_ws + (size_t)thread * c->plan->thread_bytes, &t);
    float *dq_g = c->dq_part + g * c->dq_group_floats;
    double *task_acc = c->bias_acc ? c->bias_acc + task * c->bias_task_doubles : NULL;
    int64_t head0 = bwd_task_head0(c, task);
    if (task_acc) memset(task_acc, 0, c->bias_task_doubles * sizeof(double));
    size_t u_begin = c->split.units == 1 ? 0 : unit;
    size_t u_end = c->split.units == 1 ? (size_t)(p->batch * p->heads_kv) : unit + 1;
    for (size_t j = g; j < c->kv_blocks; j += c->split.groups)
        for (size_t u = u_begin; u < u_end; u++)
            bwd_key_block(c, &t, (int64_t)u / p->heads_kv, (int64_t)u % p->heads_kv, j, dq_g,
                          task_acc, head0, thread);
}

/* Before the key pass, per (b, h): Dsum, and this head's rows of every dQ_g zeroed. */
static void bwd_prepare_task(void *vctx, size_t task, int thread) {
    const bwd_ctx *c = vctx;
    bwd_dsum_task(vctx, task, thread);
    size_t rows = (size_t)c->plan->p.seq_q;
    for (size_t g = 0; g < c->split.groups; g++)
        memset(c->dq_part + g * c->dq_group_floats + task * rows * c->d_pad, 0,
               rows * c->d_pad * sizeof(float));
}

/* After the key pass, per (b, h): dQ = scale (dQ_0 + ... + dQ_{G-1}), in order. */
static void bwd_reduce_dq_task(void *vctx, size_t task, int thread) {
    const bwd_ctx *c = vctx;
    const fmha_plan *plan = c->plan;
    const fmha_problem *p = &plan->p;
    const int64_t *qs = p->q_strides;
    int64_t b = (int64_t)task / p->heads_q, h = (int64_t)task % p->heads_q;
    for (int64_t i = 0; i < p->seq_q; i++) {
        const float *src = c->dq_part + ((size_t)task * (size_t)p->seq_q + (size_t)i) * c->d_pad;
        int64_t row = b * qs[0] + i * qs[1] + h * qs[2];
        for (int64_t e = 0; e < p->head_dim; e++) {
            float acc = src[e];
            for (size_t g = 1; g < c->split.groups; g++) acc += src[g * c->dq_group_floats + (size_t)e];
            fmha_store(c->dq, p->dtype, row + e * qs[3], plan->scale * acc);
        }
    }
}

/* Zeroes the dense bias gradient over its own (broadcast) extent. */
static void bwd_zero_dense_grad(const fmha_plan *plan) {
    const fmha_param_grads *g = plan->grads;
    const int64_t *s = g->d_dense_strides;
    const fmha_problem *p = &plan->p;
    int64_t ext[4] = {s[0] ? p->batch : 1, s[1] ? p->heads_q : 1, s[2] ? p->seq_q : 1,
                      s[3] ? p->seq_kv : 1};
    for (int64_t b = 0; b < ext[0]; b++)
        for (int64_t h = 0; h < ext[1]; h++)
            for (int64_t i = 0; i < ext[2]; i++)
                for (int64_t j = 0; j < ext[3]; j++) g->d_dense[b * s[0] + h * s[1] + i * s[2] + j * s[3]] = 0.0f;
}

fmha_status fmha_bwd_run(const fmha_plan *plan_in, const void *q, const void *k, const void *v,
                         const void *o, const void *d_o, const float *lse, void *dq, void *dk,
                         void *dv, char *ws) {
    fmha_plan local = *plan_in;
    const fmha_plan *plan = &local;
    const fmha_problem *p = &plan->p;
    size_t nr = plan->uk->nr;
    bwd_ctx c = {0};
    c.plan = plan;
    c.q = q; c.k = k; c.v = v; c.o = o; c.d_o = d_o; c.lse = lse;
    c.dq = dq; c.dk = dk; c.dv = dv;
    c.bc = plan->uk->block_kv;
    c.split = bwd_split_of(plan);
    c.q_blocks = ((size_t)p->seq_q + nr - 1) / nr;
    c.kv_blocks = ((size_t)p->seq_kv + c.bc - 1) / c.bc;
    c.d_pad = fmha_round_up((size_t)p->head_dim, nr);
    c.dv_pad = fmha_round_up((size_t)p->head_dim_v, nr);
    c.dq_group_floats = fbytes(bwd_dq_floats(plan)) / sizeof(float);
    c.heads_per_task = bwd_heads_per_task(plan, c.split);
    c.bias_task_doubles = dbytes(fmha_bias_grad_task_doubles(plan, c.heads_per_task)) / sizeof(double);
    c.thread_ws = ws;
    char *shared = ws + (size_t)plan->threads * plan->thread_bytes;
    size_t soff[5];
    bwd_shared_layout(plan, soff);
    c.dsum = (float *)(shared + soff[0]);
    c.dq_part = (float *)(shared + soff[1]);
    c.bias_acc = c.bias_task_doubles ? (double *)(shared + soff[3]) : NULL;
    fmha_bias_prepare(&local, shared + soff[2]);
    c.bucket_acc = (double *)(shared + soff[4]);
    if (plan->grads && plan->grads->d_dense) bwd_zero_dense_grad(plan);

    size_t heads = (size_t)(p->batch * p->heads_q);
    fmha_parallel_for(heads, plan->threads, bwd_prepare_task, &c);
    fmha_parallel_for(c.split.tasks, plan->threads, bwd_kv_task, &c);
    fmha_parallel_for(heads, plan->threads, bwd_reduce_dq_task, &c);
    if (c.bias_acc)
        fmha_bias_grad_finish(plan, c.bias_acc, c.split.tasks, c.heads_per_task,
                              c.bias_task_doubles, bwd_task_head0, &c, c.bucket_acc);
    return FMHA_OK;
}
