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
 *   dK_j [nk][D]  += dS^T Q_i                   gemm, A = dS^T, B = Q_i rows
 *   dQ_i [nq][D]  += dS K_j                     gemm, A = dS (= dS^T read
 *                                               transposed), B = K_j rows
 * and dK, dQ are scaled by `scale` once, when stored. S^T and dP^T run in
 * the plan's operand path (operand.h: float32, or bf16 pairs on vdpbf16ps),
 * and so do dV, dK and dQ (float32 GEMMs on float32 P, dS and rows, or with
 * bf16 precision FAST pairs of P, dS rounded per tile); the guarded dQ of a
 * tile with non-finite keys stays float32.
 *
 * Packing. Each query block's operands (the path's Q^T and dO^T, float32 Q
 * and dO rows, lse, Dsum) are packed once, in a pre-pass, into the shared
 * workspace; each key block's once per task. The float32 path reads Q and
 * dO rows in place when their head dims fill whole panels at unit stride and
 * rows are not a whole even number of cache lines apart.
 *
 * Workspace (linear in S): the packed query blocks (about the size of Q and
 * dO; twice that for bf16 and padded or strided float32 layouts), dQ_g
 * [G][B, Hq, Sq, D_pad] float32, plus per thread the tiles of one key block. */
#include <math.h>
#include <string.h>

#include "core/attn.h"
#include "runtime/convert.h"
#include "format/format.h"
#include "runtime/pool.h"
#include "operand.h"

/* Tasks the backward aims for, independent of the thread count. */
#define BWD_TARGET_TASKS 8

/* Per-thread tiles of one key block. */
typedef struct bwd_tiles {
    float *pt;     /* [Bc][NR]      S^T then P^T */
    float *dpt;    /* [Bc][NR]      dP^T then dS^T */
    fmha_bwd_keys keys; /* K_j, V_j as the path's products read them; K_j rows */
    float *dk;     /* [Bc][D_pad]   dK_j accumulator */
    float *dv;     /* [Bc][Dv_pad]  dV_j accumulator */
    float *raw;    /* [Bc][NR]      scores before softcap (softcap only) */
    double *diag;  /* [Bc + NR]     a tile's Toeplitz gradient sums */
    unsigned char *mask; /* [Bc][NR] for a mask callback */
    float *o_row, *do_row; /* [Dv] each: O and dO rows of Dsum (pre-pass) */
    float *dq_sum; /* [D]           a dQ row summed over the groups (last pass) */
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

/* Sizes shared by the layout functions and the run. */
typedef struct bwd_dims {
    size_t nr, bc, D, Dv, d_pad, dv_pad;
} bwd_dims;

typedef struct bwd_ctx {
    const fmha_plan *plan;
    const fmha_operand_path *path;
    bwd_dims dm;
    const void *q, *k, *v, *o, *d_o;
    const float *lse;
    void *dq, *dk, *dv;
    char *qblocks;     /* packed query blocks, qblock_bytes each, (b, h, qb) order */
    float *dq_part;    /* [G][B, Hq, Sq, D_pad] */
    double *bias_acc;  /* [tasks][heads per task][toeplitz_len] or NULL */
    double *bucket_acc;/* [rel_num_buckets] */
    char *thread_ws;
    bwd_split split;
    size_t q_blocks, kv_blocks, heads_per_task, bias_task_doubles, qblock_bytes;
    size_t dq_group_floats; /* floats between dQ_g and dQ_{g+1} */
    float store_scale;      /* factor of dK and dQ when stored: scale */
} bwd_ctx;

static size_t fbytes(size_t n) { return fmha_round_up(n * sizeof(float), FMHA_ALIGN); }
static size_t dbytes(size_t n) { return fmha_round_up(n * sizeof(double), FMHA_ALIGN); }

static bwd_dims bwd_dims_of(const fmha_plan *plan) {
    const fmha_problem *p = &plan->p;
    bwd_dims d;
    d.nr = plan->uk->tile.nr;
    d.bc = plan->uk->tile.block_kv;
    d.D = (size_t)p->head_dim;
    d.Dv = (size_t)p->head_dim_v;
    d.d_pad = fmha_pad_nr(plan, p->head_dim);
    d.dv_pad = fmha_pad_nr(plan, p->head_dim_v);
    return d;
}

static bwd_split bwd_split_of(const fmha_plan *plan) {
    const fmha_problem *p = &plan->p;
    size_t bc = plan->uk->tile.block_kv;
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

/* Carves query block (b, h, q0) at c: the path's operands, then lse and
 * Dsum [NR]. With c->base NULL it only measures (the block's size). */
static void bwd_qblock_carve(const bwd_ctx *c, fmha_carver *cv, int64_t b, int64_t h, int64_t q0,
                             fmha_bwd_qblock *blk) {
    c->path->bwd_qblock_carve(c->plan, cv, c->q, c->d_o, b, h, q0, blk);
    blk->lse = fmha_carve(cv, c->dm.nr * sizeof(float));
    blk->dsum = fmha_carve(cv, c->dm.nr * sizeof(float));
}

/* Carves (or measures) one thread's tiles. */
static void bwd_carve(const fmha_plan *plan, fmha_carver *c, bwd_tiles *t) {
    bwd_dims d = bwd_dims_of(plan);
    t->pt = fmha_carve(c, d.bc * d.nr * sizeof(float));
    t->dpt = fmha_carve(c, d.bc * d.nr * sizeof(float));
    plan->path->bwd_keys_carve(plan, c, &t->keys);
    t->dk = fmha_carve(c, d.bc * d.d_pad * sizeof(float));
    t->dv = fmha_carve(c, d.bc * d.dv_pad * sizeof(float));
    t->raw = fmha_carve(c, plan->p.biases.softcap != 0.0f ? d.bc * d.nr * sizeof(float) : 0);
    t->diag = fmha_carve(c, (d.bc + d.nr) * sizeof(double));
    t->mask = fmha_carve(c, fmha_mask_scratch_bytes(plan));
    t->o_row = fmha_carve(c, d.Dv * sizeof(float));
    t->do_row = fmha_carve(c, d.Dv * sizeof(float));
    t->dq_sum = fmha_carve(c, d.D * sizeof(float));
}

static size_t bwd_dq_floats(const fmha_plan *plan) {
    return (size_t)(plan->p.batch * plan->p.heads_q * plan->p.seq_q) * fmha_pad_nr(plan, plan->p.head_dim);
}

/* Shared workspace: [query blocks][dQ_0 .. dQ_{G-1}][Toeplitz vectors][task
 * bias accumulators][bucket sums]; c's qblock_bytes must be set. */
static void bwd_carve_shared(bwd_ctx *c, fmha_carver *cv, char **bias) {
    const fmha_plan *plan = c->plan;
    size_t n_qblocks = (size_t)(plan->p.batch * plan->p.heads_q) * c->q_blocks;
    c->qblocks = fmha_carve(cv, n_qblocks * c->qblock_bytes);
    c->dq_part = fmha_carve(cv, c->split.groups * fbytes(bwd_dq_floats(plan)));
    *bias = fmha_carve(cv, fmha_bias_shared_bytes(plan));
    c->bias_acc = fmha_carve(cv, c->split.tasks * c->bias_task_doubles * sizeof(double));
    c->bucket_acc = fmha_carve(cv, c->bias_task_doubles ? dbytes((size_t)plan->p.biases.rel_num_buckets) : 0);
    if (!c->bias_task_doubles) c->bias_acc = NULL;
}

/* The layout numbers of a run (everything but pointers). */
static void bwd_ctx_init(bwd_ctx *c, const fmha_plan *plan) {
    const fmha_problem *p = &plan->p;
    *c = (bwd_ctx){0};
    c->plan = plan;
    c->path = plan->path;
    c->dm = bwd_dims_of(plan);
    c->split = bwd_split_of(plan);
    c->q_blocks = ((size_t)p->seq_q + c->dm.nr - 1) / c->dm.nr;
    c->kv_blocks = ((size_t)p->seq_kv + c->dm.bc - 1) / c->dm.bc;
    c->dq_group_floats = fbytes(bwd_dq_floats(plan)) / sizeof(float);
    c->heads_per_task = bwd_heads_per_task(plan, c->split);
    c->bias_task_doubles = dbytes(fmha_bias_grad_task_doubles(plan, c->heads_per_task)) / sizeof(double);
    fmha_carver measure = {0};
    fmha_bwd_qblock blk;
    bwd_qblock_carve(c, &measure, 0, 0, 0, &blk);
    c->qblock_bytes = measure.used;
    c->store_scale = plan->scale;
}

fmha_ws_size fmha_tiled_bwd_workspace(const fmha_plan *plan) {
    bwd_ctx c;
    bwd_ctx_init(&c, plan);
    fmha_carver t = {0}, sh = {0};
    bwd_tiles tiles;
    char *bias;
    bwd_carve(plan, &t, &tiles);
    bwd_carve_shared(&c, &sh, &bias);
    return (fmha_ws_size){t.used, sh.used};
}

/* Query block (b, h, qb) of the packed area. */
static fmha_bwd_qblock bwd_qblock_at(const bwd_ctx *c, int64_t b, int64_t h, size_t qb) {
    size_t index = ((size_t)(b * c->plan->p.heads_q + h)) * c->q_blocks + qb;
    fmha_carver cv = {c->qblocks + index * c->qblock_bytes, 0};
    fmha_bwd_qblock blk;
    bwd_qblock_carve(c, &cv, b, h, (int64_t)(qb * c->dm.nr), &blk);
    return blk;
}

/* sum_e x[e] y[e] in float64, e < n: four running sums (four add chains
 * instead of one) over blocks of four, added pairwise, then the tail; a
 * fixed order. */
static double dot_f64(int64_t n, const float *x, const float *y) {
    double a0 = 0.0, a1 = 0.0, a2 = 0.0, a3 = 0.0;
    int64_t e = 0;
    for (; e + 4 <= n; e += 4) {
        a0 += (double)x[e] * (double)y[e];
        a1 += (double)x[e + 1] * (double)y[e + 1];
        a2 += (double)x[e + 2] * (double)y[e + 2];
        a3 += (double)x[e + 3] * (double)y[e + 3];
    }
    double acc = (a0 + a1) + (a2 + a3);
    for (; e < n; e++) acc += (double)x[e] * (double)y[e];
    return acc;
}

float fmha_row_dsum(const fmha_plan *plan, const void *o, const void *d_o, int64_t at, float *o_tmp, float *do_tmp) {
    const fmha_problem *p = &plan->p;
    const int64_t s = p->o_strides[3], n = p->head_dim_v;
    const void *o_src = plan->dsum_o ? (const void *)plan->dsum_o : o;
    const fmha_dtype o_dtype = plan->dsum_o ? FMHA_DTYPE_F32 : p->dtype;
    return (float)dot_f64(n, fmha_row_f32_uk(plan->uk, o_src, o_dtype, at, s, n, o_tmp),
                          fmha_row_f32_uk(plan->uk, d_o, p->dtype, at, s, n, do_tmp));
}

/* Pre-pass, per (b, h): Dsum = rowsum(dO * O), this head's rows of every
 * dQ_g zeroed, and every query block packed. */
static void bwd_prepare_task(void *vctx, size_t task, int thread) {
    const bwd_ctx *c = vctx;
    const fmha_plan *plan = c->plan;
    const fmha_problem *p = &plan->p;
    const bwd_dims *d = &c->dm;
    int64_t b = (int64_t)task / p->heads_q, h = (int64_t)task % p->heads_q;
    const int64_t *os = p->o_strides;
    size_t rows = (size_t)p->seq_q;
    bwd_tiles t;
    fmha_carver cv = {c->thread_ws + (size_t)thread * plan->thread_bytes, 0};
    bwd_carve(plan, &cv, &t);
    float *o_row = t.o_row, *do_row = t.do_row;
    for (size_t g = 0; g < c->split.groups; g++)
        memset(c->dq_part + g * c->dq_group_floats + task * rows * d->d_pad, 0,
               rows * d->d_pad * sizeof(float));
    for (size_t qb = 0; qb < c->q_blocks; qb++) {
        int64_t q0 = (int64_t)(qb * d->nr);
        int64_t nq = p->seq_q - q0 < (int64_t)d->nr ? p->seq_q - q0 : (int64_t)d->nr;
        fmha_bwd_qblock blk = bwd_qblock_at(c, b, h, qb);
        float *lse = (float *)blk.lse, *dsum = (float *)blk.dsum;
        for (size_t i = 0; i < d->nr; i++) {
            int64_t qi = q0 + (int64_t)i;
            if ((int64_t)i >= nq) {
                lse[i] = -INFINITY;
                dsum[i] = 0.0f;
                continue;
            }
            lse[i] = c->lse[(b * p->heads_q + h) * p->seq_q + qi];
            int64_t row = b * os[0] + qi * os[1] + h * os[2];
            if (qi + 8 < p->seq_q && os[3] == 1) /* rows a stride apart: ask for them early */
                for (int64_t e = 0; e < p->head_dim_v; e += 16) {
                    int64_t ahead = row + 8 * os[1] + e;
                    __builtin_prefetch(plan->dsum_o ? (const void *)(plan->dsum_o + ahead)
                                                    : (const char *)c->o + ahead * (int64_t)fmha_dtype_size(p->dtype));
                    __builtin_prefetch((const char *)c->d_o + ahead * (int64_t)fmha_dtype_size(p->dtype));
                }
            dsum[i] = fmha_row_dsum(plan, c->o, c->d_o, row, o_row, do_row);
        }
        c->path->bwd_qblock_pack(plan, c->q, c->d_o, b, h, q0, nq, &blk);
    }
}

/* 1 when n rows of cols elements of x (format fmt) from element first, rs
 * and cs apart, hold a NaN or inf: float32 rows of unit stride through
 * the table's vector check (the format's scalar walk took 3% of a float32
 * fwd+bwd's library samples at S 128), the rest through the format's. */
static int bwd_rows_nonfinite(const fmha_plan *plan, fmha_cache_format_id fmt, const void *x, int64_t first,
                              int64_t rs, int64_t cs, int64_t n, int64_t cols) {
    if (fmt == FMHA_FORMAT_F32 && cs == 1 && rs >= 0)
        return plan->uk->rows.nonfinite((size_t)n, (size_t)cols, (const float *)x + first, (size_t)rs);
    return fmha_format_rows_nonfinite(fmha_cache_format_at(fmt), x, first, rs, cs, n, cols);
}

/* 1 when K or V rows [k0, k0 + nk) of (b, hk) hold a NaN or inf. */
static int bwd_keys_nonfinite(const bwd_ctx *c, int64_t b, int64_t hk, int64_t k0, int64_t nk) {
    const fmha_plan *plan = c->plan;
    const fmha_problem *p = &plan->p;
    const int64_t *ks = p->k_strides, *vs = p->v_strides;
    return bwd_rows_nonfinite(plan, plan->k_format, c->k, b * ks[0] + k0 * ks[1] + hk * ks[2], ks[1], ks[3], nk,
                              p->head_dim) ||
           bwd_rows_nonfinite(plan, plan->v_format, c->v, b * vs[0] + k0 * vs[1] + hk * vs[2], vs[1], vs[3], nk,
                              p->head_dim_v);
}

/* Asks for the K and V rows of key block j of (b, hk) ahead of it: rows a
 * stride apart, first read by the non-finite check, otherwise wait on the
 * cache misses there (2% of a causal fwd+bwd). */
static void bwd_keys_prefetch(const bwd_ctx *c, int64_t b, int64_t hk, int64_t j) {
    const fmha_problem *p = &c->plan->p;
    const int64_t *ks = p->k_strides, *vs = p->v_strides;
    const int64_t bc = (int64_t)c->dm.bc, k0 = j * bc, nk = p->seq_kv - k0 < bc ? p->seq_kv - k0 : bc;
    int64_t es = (int64_t)fmha_dtype_size(p->dtype), line = 64 / es;
    if (ks[3] != 1 || vs[3] != 1) return;
    for (int64_t r = 0; r < nk; r++) {
        const char *kr = (const char *)c->k + (b * ks[0] + (k0 + r) * ks[1] + hk * ks[2]) * es;
        const char *vr = (const char *)c->v + (b * vs[0] + (k0 + r) * vs[1] + hk * vs[2]) * es;
        for (int64_t e = 0; e < p->head_dim; e += line) __builtin_prefetch(kr + e * es);
        for (int64_t e = 0; e < p->head_dim_v; e += line) __builtin_prefetch(vr + e * es);
    }
}

/* dS = 0 wherever P = 0: a hidden key's dP (dO . V) or raw score may be NaN. */
static void bwd_zero_hidden(size_t nk, const float *pt, float *dpt, size_t nr) {
    for (size_t e = 0; e < nk * nr; e++)
        if (pt[e] == 0.0f) dpt[e] = 0.0f;
}

/* dQ_i += dS K_j over the entries with dS != 0: a NaN K row of a hidden key
 * stays out of the rows it is hidden from. */
static void bwd_dq_guarded(const bwd_dims *d, size_t nq, size_t nk, const float *dpt, const float *krows,
                           float *dq) {
    for (size_t i = 0; i < nq; i++)
        for (size_t e = 0; e < d->D; e++) {
            float acc = 0.0f;
            for (size_t r = 0; r < nk; r++) {
                float ds = dpt[r * d->nr + i];
                if (ds != 0.0f) acc += ds * krows[r * d->d_pad + e];
            }
            dq[i * d->d_pad + e] += acc;
        }
}

/* One (query head, query block) against one key block: tile tp.
 * guard: the key block holds a NaN or inf, and the tile hides some keys
 * from some rows: hidden entries are kept out of every gradient. */
static void bwd_pair(const bwd_ctx *c, bwd_tiles *t, const fmha_tile_pos *tp, const fmha_bwd_qblock *q,
                     fmha_tile_class cls, float *dq_g, double *bias_acc, int guard, int thread) {
    const fmha_plan *plan = c->plan;
    const fmha_problem *p = &plan->p;
    const fmha_ukernels *uk = plan->uk;
    const bwd_dims *d = &c->dm;
    size_t nr = d->nr, nq = (size_t)tp->nq, nk = (size_t)tp->nk;
    size_t row0 = ((size_t)tp->b * (size_t)p->heads_q + (size_t)tp->h) * (size_t)p->seq_q + (size_t)tp->q0;

    c->path->bwd_scores(plan, &t->keys, q, tp->nk, t->pt, t->dpt);
    /* softcap, biases, masks as in the forward; then P^T = exp(S^T - lse) */
    int softcap = p->biases.softcap != 0.0f;
    if (cls == FMHA_TILE_PARTIAL || plan->has_bias)
        fmha_score_epilogue(plan, tp, cls, t->pt, nr, softcap ? t->raw : NULL, t->mask, thread);
    plan->exp_sub(nk, t->pt, nr, q->lse);

    /* Dropout, O = (P * Z) V with Z = mask / (1 - p) (dropout.c): the
     * product above is dO V^T = dL/d(P * Z), so dP = (dO V^T) * Z, and
     * Dsum_i = sum_j P_ij dP_ij = dO_i . O_i still; dV = (P * Z)^T dO. */
    if (plan->dropout) fmha_dropout_tile(plan, tp, t->dpt, nr);
    /* dS^T = P^T (dP^T - Dsum): the gradient of the biased score */
    uk->tile.ds(nk, t->pt, t->dpt, nr, q->dsum);
    if (guard) bwd_zero_hidden(nk, t->pt, t->dpt, nr);
    if (plan->grads || p->biases.callback.accumulate_grad)
        fmha_bias_grad_tile(plan, tp, t->dpt, nr, t->diag, bias_acc, thread);
    if (softcap) fmha_softcap_grad(plan, tp, t->dpt, nr, t->raw);
    if (guard && softcap) bwd_zero_hidden(nk, t->pt, t->dpt, nr);

    /* dV_j += (P Z)^T dO_i (P alone without dropout), dK_j += dS^T Q_i,
     * dQ_i += dS K_j */
    if (plan->dropout) fmha_dropout_tile(plan, tp, t->pt, nr);
    float *dq = dq_g + row0 * d->d_pad;
    c->path->bwd_grads(plan, &t->keys, q, nq, nk, t->pt, t->dpt, t->dv, t->dk, guard ? NULL : dq);
    if (guard) bwd_dq_guarded(d, nq, nk, t->dpt, t->keys.krows, dq);
}

/* Key block j of (b, hk): every query head of the group, every query block
 * the masks let see it; then dK_j, dV_j are stored. */
static void bwd_key_block(const bwd_ctx *c, bwd_tiles *t, int64_t b, int64_t hk, size_t j,
                          float *dq_g, double *task_acc, int64_t task_head0, const int64_t *next,
                          int thread) {
    const fmha_plan *plan = c->plan;
    const fmha_problem *p = &plan->p;
    const bwd_dims *d = &c->dm;
    const int64_t *ks = p->k_strides, *vs = p->v_strides;
    int64_t k0 = (int64_t)(j * d->bc);
    int64_t nk_all = p->seq_kv - k0 < (int64_t)d->bc ? p->seq_kv - k0 : (int64_t)d->bc;
    /* keys [k0, k0 + nk): the block ends where the last query's view ends
     * (length, band), so keys no query sees are never read; their dK and
     * dV are stored as 0 */
    fmha_tile_pos all = {b, 0, 0, p->seq_q, 0, 0};
    int64_t kv_begin, kv_end;
    fmha_mask_kv_range(plan, &all, &kv_begin, &kv_end);
    int64_t nk = kv_end - k0 < nk_all ? kv_end - k0 : nk_all;
    if (nk < 0) nk = 0;
    int packed = 0, nonfinite = 0;
    long long computed = 0;
    int64_t qv_begin, qv_end;
    fmha_mask_q_range(plan, b, k0, nk, &qv_begin, &qv_end);
    if (nk == 0) qv_end = qv_begin;
    size_t qb_begin = (size_t)qv_begin / d->nr;
    size_t qb_end = qv_end > qv_begin ? ((size_t)qv_end + d->nr - 1) / d->nr : qb_begin;
    for (int64_t h = hk * plan->group; h < (hk + 1) * plan->group; h++)
        for (size_t qb = qb_begin; qb < qb_end; qb++) {
            int64_t q0 = (int64_t)(qb * d->nr);
            fmha_tile_pos tp = {b, h, q0, p->seq_q - q0 < (int64_t)d->nr ? p->seq_q - q0 : (int64_t)d->nr,
                                k0, nk};
            /* the pair's keys end where this query block's view ends (the
             * block's first query block on a causal diagonal sees half),
             * rounded up to whole key pairs: the bf16 products pair keys,
             * and a key past the view stays inside a PARTIAL tile */
            int64_t pair_begin, pair_end;
            fmha_mask_kv_range(plan, &tp, &pair_begin, &pair_end);
            int64_t pair_nk = pair_end - k0 + ((pair_end - k0) & 1);
            if (pair_nk < tp.nk) tp.nk = pair_nk;
            if (tp.nk <= 0) continue;
            int cls = fmha_mask_classify(plan, &tp, thread);
            if (cls == FMHA_TILE_EMPTY) continue;
            if (cls < 0) cls = FMHA_TILE_PARTIAL;
            if (!packed) {
                nonfinite = bwd_keys_nonfinite(c, b, hk, k0, nk);
                c->path->bwd_keys_pack(plan, c->k, c->v, b, hk, k0, nk, nonfinite, &t->keys);
                memset(t->dk, 0, (size_t)nk * d->d_pad * sizeof(float));
                memset(t->dv, 0, (size_t)nk * d->dv_pad * sizeof(float));
                packed = 1;
            }
            computed++;
            /* the task's next key block: its rows arrive during this last pair */
            if (next && h == (hk + 1) * plan->group - 1 && qb + 1 == qb_end)
                bwd_keys_prefetch(c, next[0], next[1], next[2]);
            double *acc = task_acc ? task_acc + (size_t)(h - task_head0) * (size_t)plan->toeplitz_len : NULL;
            fmha_bwd_qblock q = bwd_qblock_at(c, b, h, qb);
            bwd_pair(c, t, &tp, &q, (fmha_tile_class)cls, dq_g, acc,
                     nonfinite && cls == FMHA_TILE_PARTIAL, thread);
        }
    fmha_tiles_count(computed);
    /* dK_j, dV_j are complete (zero when no query sees the block) */
    for (int64_t r = 0; r < nk_all; r++) {
        int keep = packed && r < nk;
        int64_t dkrow = b * ks[0] + (k0 + r) * ks[1] + hk * ks[2];
        int64_t dvrow = b * vs[0] + (k0 + r) * vs[1] + hk * vs[2];
        fmha_store_row_uk(plan->uk, c->dk, p->dtype, dkrow, ks[3], (int64_t)d->D,
                          keep ? t->dk + (size_t)r * d->d_pad : NULL, c->store_scale);
        fmha_store_row_uk(plan->uk, c->dv, p->dtype, dvrow, vs[3], (int64_t)d->Dv,
                          keep ? t->dv + (size_t)r * d->dv_pad : NULL, 1.0f);
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
    fmha_carver cv = {c->thread_ws + (size_t)thread * c->plan->thread_bytes, 0};
    bwd_carve(c->plan, &cv, &t);
    float *dq_g = c->dq_part + g * c->dq_group_floats;
    double *task_acc = c->bias_acc ? c->bias_acc + task * c->bias_task_doubles : NULL;
    int64_t head0 = bwd_task_head0(c, task);
    if (task_acc) memset(task_acc, 0, c->bias_task_doubles * sizeof(double));
    size_t u_begin = c->split.units == 1 ? 0 : unit;
    size_t u_end = c->split.units == 1 ? (size_t)(p->batch * p->heads_kv) : unit + 1;
    for (size_t j = g; j < c->kv_blocks; j += c->split.groups)
        for (size_t u = u_begin; u < u_end; u++) {
            size_t nu = u + 1 < u_end ? u + 1 : u_begin, nj = u + 1 < u_end ? j : j + c->split.groups;
            int64_t next[3] = {(int64_t)nu / p->heads_kv, (int64_t)nu % p->heads_kv, (int64_t)nj};
            bwd_key_block(c, &t, (int64_t)u / p->heads_kv, (int64_t)u % p->heads_kv, j, dq_g,
                          task_acc, head0, nj < c->kv_blocks ? next : NULL, thread);
        }
}

/* After the key pass, per (b, h): dQ = dQ_0 + ... + dQ_{G-1}, in order. */
static void bwd_reduce_dq_task(void *vctx, size_t task, int thread) {
    const bwd_ctx *c = vctx;
    const fmha_problem *p = &c->plan->p;
    const int64_t *qs = p->q_strides;
    int64_t b = (int64_t)task / p->heads_q, h = (int64_t)task % p->heads_q;
    bwd_tiles t;
    fmha_carver cv = {c->thread_ws + (size_t)thread * c->plan->thread_bytes, 0};
    bwd_carve(c->plan, &cv, &t);
    float *sum = t.dq_sum;
    for (int64_t i = 0; i < p->seq_q; i++) {
        const float *src = c->dq_part + ((size_t)task * (size_t)p->seq_q + (size_t)i) * c->dm.d_pad;
        int64_t row = b * qs[0] + i * qs[1] + h * qs[2];
        /* sum[e] = src_0[e] + src_1[e] + ... in group order, a row at a time
         * (the inner loop over e vectorises) */
        memcpy(sum, src, (size_t)p->head_dim * sizeof(float));
        for (size_t g = 1; g < c->split.groups; g++) {
            const float *part = src + g * c->dq_group_floats;
            for (int64_t e = 0; e < p->head_dim; e++) sum[e] += part[e];
        }
        fmha_store_row_uk(c->plan->uk, c->dq, p->dtype, row, qs[3], p->head_dim, sum, c->store_scale);
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

void fmha_tiled_bwd_run(fmha_plan *run, const void *q, const void *k, const void *v, const void *o,
                        const void *d_o, const float *lse, void *dq, void *dk, void *dv, char *ws) {
    const fmha_problem *p = &run->p;
    bwd_ctx c;
    bwd_ctx_init(&c, run);
    c.q = q; c.k = k; c.v = v; c.o = o; c.d_o = d_o; c.lse = lse;
    c.dq = dq; c.dk = dk; c.dv = dv;
    c.thread_ws = ws;
    fmha_carver sh = {ws + (size_t)run->threads * run->thread_bytes, 0};
    char *bias;
    bwd_carve_shared(&c, &sh, &bias);
    fmha_bias_prepare(run, bias);
    if (run->grads && run->grads->d_dense) bwd_zero_dense_grad(run);

    size_t heads = (size_t)(p->batch * p->heads_q);
    fmha_run_parallel(run, heads, bwd_prepare_task, &c);
    fmha_run_parallel(run, c.split.tasks, bwd_kv_task, &c);
    fmha_run_parallel(run, heads, bwd_reduce_dq_task, &c);
    if (c.bias_acc)
        fmha_bias_grad_finish(run, c.bias_acc, c.split.tasks, c.heads_per_task,
                              c.bias_task_doubles, bwd_task_head0, &c, c.bucket_acc);
}
