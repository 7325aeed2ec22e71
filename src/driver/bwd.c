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
 * and dK, dQ are scaled by `scale` once, when stored. On the bf16 fast path
 * S^T and dP^T run on pair-packed bf16 operands (vdpbf16ps); dV, dK and dQ
 * stay float32 GEMMs on float32 P and dS, because rounding P or dS to bf16
 * as a GEMM input leaves the gradients up to about 1.57x the error of
 * rounding the exact result to bf16 (measured), past the 1.5x we allow.
 *
 * Packing. Each query block's operands (Q^T, dO^T, Q and dO rows, lse,
 * Dsum) are packed once, in a pre-pass, into the shared workspace; each key
 * block's (K and V rows) once per task. Float32 Q and dO rows whose head dim
 * is a multiple of NR with unit stride are read in place.
 *
 * Workspace (linear in S): the packed query blocks (about the size of Q and
 * dO; twice that for bf16 and padded or strided float32 layouts), dQ_g
 * [G][B, Hq, Sq, D_pad] float32, plus per thread the tiles of one key block. */
#include <math.h>
#include <string.h>

#include "../attn.h"
#include "../convert.h"
#include "../pool.h"

/* Tasks the backward aims for, independent of the thread count. */
#define BWD_TARGET_TASKS 8

/* Operands of one query block, packed in the pre-pass (pointers into the
 * shared workspace): qt (scale Q)^T [D][NR] and dot dO^T [Dv][NR], or on the
 * bf16 fast path qt2 [D2][NR] and dot2 [Dv2][NR] pairs along the head dim;
 * qrows Q [NR][ld] and dorows dO [NR][ld] float32 (or the caller's rows). */
typedef struct bwd_qblock {
    const float *qt, *dot, *qrows, *dorows;
    size_t qrows_ld, dorows_ld;
    const uint32_t *qt2, *dot2;
    const float *lse, *dsum; /* [NR], padding lanes -inf and 0 */
} bwd_qblock;

/* Per-thread tiles of one key block. */
typedef struct bwd_tiles {
    float *pt;     /* [Bc][NR]      S^T then P^T */
    float *dpt;    /* [Bc][NR]      dP^T then dS^T */
    float *krows;  /* [Bc][D_pad]   K_j rows (float32 path) */
    float *vrows;  /* [Bc][Dv_pad]  V_j rows (float32 path) */
    float *dk;     /* [Bc][D_pad]   dK_j accumulator */
    float *dv;     /* [Bc][Dv_pad]  dV_j accumulator */
    float *raw;    /* [Bc][NR]      scores before softcap (softcap only) */
    float *diag;   /* [Bc + NR]     a tile's Toeplitz gradient sums */
    uint32_t *k2;  /* [Bc][D2]      K_j pairs along d (bf16) */
    uint32_t *v2;  /* [Bc][Dv2]     V_j pairs along dv (bf16) */
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

/* Sizes shared by the layout functions and the run. */
typedef struct bwd_dims {
    size_t nr, bc, D, Dv, D2, Dv2, d_pad, dv_pad;
    int fast, direct_rows;
} bwd_dims;

typedef struct bwd_ctx {
    const fmha_plan *plan;
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
    d.nr = plan->uk->nr;
    d.bc = plan->uk->block_kv;
    d.D = (size_t)p->head_dim;
    d.Dv = (size_t)p->head_dim_v;
    d.D2 = (d.D + 1) / 2;
    d.Dv2 = (d.Dv + 1) / 2;
    d.d_pad = fmha_round_up(d.D, d.nr);
    d.dv_pad = fmha_round_up(d.Dv, d.nr);
    d.fast = plan->bf16_fast;
    d.direct_rows = p->dtype == FMHA_DTYPE_F32 && p->q_strides[3] == 1 && p->o_strides[3] == 1 &&
                    d.D == d.d_pad && d.Dv == d.dv_pad;
    return d;
}

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

/* Byte offsets within one packed query block, in bwd_qblock order
 * (qt|qt2, dot|dot2, qrows|qb, dorows|dob, lse, dsum); returns its size. */
static size_t bwd_qblock_layout(const bwd_dims *d, size_t off[6]) {
    size_t n[6];
    if (d->fast) {
        n[0] = d->D2 * d->nr; n[1] = d->Dv2 * d->nr;
        n[2] = d->nr * d->d_pad; n[3] = d->nr * d->dv_pad;
    } else {
        n[0] = d->D * d->nr; n[1] = d->Dv * d->nr;
        n[2] = d->direct_rows ? 0 : d->nr * d->d_pad;
        n[3] = d->direct_rows ? 0 : d->nr * d->dv_pad;
    }
    n[4] = n[5] = d->nr;
    size_t total = 0;
    for (int i = 0; i < 6; i++) {
        off[i] = total;
        total += fbytes(n[i]); /* 32-bit words and floats alike */
    }
    return total;
}

/* Per-thread tile byte offsets, in bwd_tiles field order; returns the total. */
static size_t bwd_tile_layout(const fmha_plan *plan, size_t off[11]) {
    bwd_dims d = bwd_dims_of(plan);
    int f = d.fast;
    size_t n[10] = {d.bc * d.nr, d.bc * d.nr, d.bc * d.d_pad, f ? 0 : d.bc * d.dv_pad,
                    d.bc * d.d_pad, d.bc * d.dv_pad,
                    plan->p.biases.softcap != 0.0f ? d.bc * d.nr : 0, d.bc + d.nr,
                    f ? d.bc * d.D2 : 0, f ? d.bc * d.Dv2 : 0};
    size_t total = 0;
    for (int i = 0; i < 10; i++) {
        off[i] = total;
        total += fbytes(n[i]);
    }
    off[10] = total;
    return total + fmha_mask_scratch_bytes(plan);
}

static void bwd_carve(const fmha_plan *plan, char *base, bwd_tiles *t) {
    size_t off[11];
    bwd_tile_layout(plan, off);
    t->pt = (float *)(base + off[0]);
    t->dpt = (float *)(base + off[1]);
    t->krows = (float *)(base + off[2]);
    t->vrows = (float *)(base + off[3]);
    t->dk = (float *)(base + off[4]);
    t->dv = (float *)(base + off[5]);
    t->raw = (float *)(base + off[6]);
    t->diag = (float *)(base + off[7]);
    t->k2 = (uint32_t *)(base + off[8]);
    t->v2 = (uint32_t *)(base + off[9]);
    t->mask = (unsigned char *)(base + off[10]);
}

static size_t bwd_dq_floats(const fmha_plan *plan) {
    size_t d_pad = fmha_round_up((size_t)plan->p.head_dim, plan->uk->nr);
    return (size_t)(plan->p.batch * plan->p.heads_q * plan->p.seq_q) * d_pad;
}

/* Shared workspace: [query blocks][dQ_0 .. dQ_{G-1}][Toeplitz vectors][task
 * bias accumulators][bucket sums]. Byte offsets in off[0..4]; returns the total. */
static size_t bwd_shared_layout(const fmha_plan *plan, size_t off[5]) {
    bwd_dims d = bwd_dims_of(plan);
    bwd_split s = bwd_split_of(plan);
    size_t qoff[6];
    size_t n_qblocks = (size_t)(plan->p.batch * plan->p.heads_q) *
                       (((size_t)plan->p.seq_q + d.nr - 1) / d.nr);
    size_t task_doubles = fmha_bias_grad_task_doubles(plan, bwd_heads_per_task(plan, s));
    size_t sizes[5] = {n_qblocks * bwd_qblock_layout(&d, qoff), s.groups * fbytes(bwd_dq_floats(plan)),
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
    size_t off[11], soff[5];
    *thread_bytes = bwd_tile_layout(plan, off);
    *shared_bytes = bwd_shared_layout(plan, soff);
}

/* Query block (b, h, qb) of the packed area: pointers, and for the caller's
 * rows (float32, direct) the rows in place. */
static bwd_qblock bwd_qblock_at(const bwd_ctx *c, int64_t b, int64_t h, size_t qb) {
    const fmha_problem *p = &c->plan->p;
    const bwd_dims *d = &c->dm;
    size_t off[6];
    bwd_qblock_layout(d, off);
    size_t index = ((size_t)(b * p->heads_q + h)) * c->q_blocks + qb;
    char *base = c->qblocks + index * c->qblock_bytes;
    bwd_qblock q = {0};
    q.lse = (const float *)(base + off[4]);
    q.dsum = (const float *)(base + off[5]);
    if (d->fast) {
        q.qt2 = (const uint32_t *)(base + off[0]);
        q.dot2 = (const uint32_t *)(base + off[1]);
        q.qrows = (const float *)(base + off[2]);
        q.qrows_ld = d->d_pad;
        q.dorows = (const float *)(base + off[3]);
        q.dorows_ld = d->dv_pad;
        return q;
    }
    q.qt = (const float *)(base + off[0]);
    q.dot = (const float *)(base + off[1]);
    if (d->direct_rows) {
        int64_t q0 = (int64_t)(qb * d->nr);
        const int64_t *qs = p->q_strides, *os = p->o_strides;
        q.qrows = (const float *)c->q + b * qs[0] + q0 * qs[1] + h * qs[2];
        q.dorows = (const float *)c->d_o + b * os[0] + q0 * os[1] + h * os[2];
        q.qrows_ld = (size_t)qs[1];
        q.dorows_ld = (size_t)os[1];
    } else {
        q.qrows = (const float *)(base + off[2]);
        q.dorows = (const float *)(base + off[3]);
        q.qrows_ld = d->d_pad;
        q.dorows_ld = d->dv_pad;
    }
    return q;
}

/* Packs a [n x cols] block (element (i, e) at src[first + i*rs + e*cs]) as
 * float32: transpose tr[e][i] = mul * x ([cols][NR], zero lanes past n) and,
 * if rows, rows[i][e] = x ([NR][ld], zero padded). */
static void pack_f32(const void *src, fmha_dtype t, int64_t first, int64_t rs, int64_t cs, int64_t n,
                     int64_t cols, float mul, float *tr, size_t nr, float *rows, size_t ld) {
    memset(tr, 0, (size_t)cols * nr * sizeof(float));
    if (rows) memset(rows, 0, nr * ld * sizeof(float));
    for (int64_t i = 0; i < n; i++)
        for (int64_t e = 0; e < cols; e++) {
            float x = fmha_load(src, t, first + i * rs + e * cs);
            tr[(size_t)e * nr + (size_t)i] = mul * x;
            if (rows) rows[(size_t)i * ld + (size_t)e] = x;
        }
}

/* tr2[p][i] = (X[i][2p], X[i][2p+1]) for i < n, zero elsewhere ([cols2][NR]):
 * a bf16 block (element (i, e) at src[first + i*rs + e*cs]) as pairs along
 * its head dim. */
static void pack_bf16_transposed(const uint16_t *src, int64_t first, int64_t rs, int64_t cs,
                                 int64_t n, int64_t cols, size_t nr, uint32_t *tr2) {
    int64_t cols2 = (cols + 1) / 2;
    memset(tr2, 0, (size_t)cols2 * nr * sizeof(uint32_t));
    for (int64_t i = 0; i < n; i++) {
        int64_t row = first + i * rs;
        for (int64_t e = 0; e < cols2; e++)
            tr2[(size_t)e * nr + (size_t)i] = fmha_bf16_pair(src, row + 2 * e * cs, row + (2 * e + 1) * cs, 2 * e + 1 < cols);
    }
}

/* rows[i][e] = X[i][e] widened ([NR][ld], zero padded): the float32 rows the
 * bf16 fast path keeps for dV, dK and dQ. */
static void pack_rows_f32(const void *src, fmha_dtype t, int64_t first, int64_t rs, int64_t cs,
                          int64_t n, int64_t cols, size_t nr, float *rows, size_t ld) {
    memset(rows, 0, nr * ld * sizeof(float));
    for (int64_t i = 0; i < n; i++)
        for (int64_t e = 0; e < cols; e++) rows[(size_t)i * ld + (size_t)e] = fmha_load(src, t, first + i * rs + e * cs);
}

/* Pre-pass, per (b, h): Dsum = rowsum(dO * O), this head's rows of every
 * dQ_g zeroed, and every query block packed. */
static void bwd_prepare_task(void *vctx, size_t task, int thread) {
    const bwd_ctx *c = vctx;
    const fmha_plan *plan = c->plan;
    const fmha_problem *p = &plan->p;
    const bwd_dims *d = &c->dm;
    int64_t b = (int64_t)task / p->heads_q, h = (int64_t)task % p->heads_q;
    const int64_t *qs = p->q_strides, *os = p->o_strides;
    size_t rows = (size_t)p->seq_q;
    (void)thread;
    for (size_t g = 0; g < c->split.groups; g++)
        memset(c->dq_part + g * c->dq_group_floats + task * rows * d->d_pad, 0,
               rows * d->d_pad * sizeof(float));
    for (size_t qb = 0; qb < c->q_blocks; qb++) {
        int64_t q0 = (int64_t)(qb * d->nr);
        int64_t nq = p->seq_q - q0 < (int64_t)d->nr ? p->seq_q - q0 : (int64_t)d->nr;
        bwd_qblock blk = bwd_qblock_at(c, b, h, qb);
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
            double acc = 0.0;
            for (int64_t e = 0; e < p->head_dim_v; e++)
                acc += (double)(plan->dsum_o ? plan->dsum_o[row + e * os[3]]
                                             : fmha_load(c->o, p->dtype, row + e * os[3])) *
                       fmha_load(c->d_o, p->dtype, row + e * os[3]);
            dsum[i] = (float)acc;
        }
        int64_t qfirst = b * qs[0] + q0 * qs[1] + h * qs[2];
        int64_t ofirst = b * os[0] + q0 * os[1] + h * os[2];
        if (d->fast) {
            pack_bf16_transposed(c->q, qfirst, qs[1], qs[3], nq, (int64_t)d->D, d->nr, (uint32_t *)blk.qt2);
            pack_rows_f32(c->q, p->dtype, qfirst, qs[1], qs[3], nq, (int64_t)d->D, d->nr, (float *)blk.qrows,
                          d->d_pad);
            pack_bf16_transposed(c->d_o, ofirst, os[1], os[3], nq, (int64_t)d->Dv, d->nr, (uint32_t *)blk.dot2);
            pack_rows_f32(c->d_o, p->dtype, ofirst, os[1], os[3], nq, (int64_t)d->Dv, d->nr,
                          (float *)blk.dorows, d->dv_pad);
        } else {
            pack_f32(c->q, p->dtype, qfirst, qs[1], qs[3], nq, (int64_t)d->D, plan->scale,
                     (float *)blk.qt, d->nr, d->direct_rows ? NULL : (float *)blk.qrows, d->d_pad);
            pack_f32(c->d_o, p->dtype, ofirst, os[1], os[3], nq, (int64_t)d->Dv, 1.0f,
                     (float *)blk.dot, d->nr, d->direct_rows ? NULL : (float *)blk.dorows, d->dv_pad);
        }
    }
}

/* Packs key block [k0, k0 + nk) of (b, hk): float32 K rows and V rows, or
 * on the bf16 fast path K pairs along d (k2), V pairs along dv (v2) and
 * float32 K rows (for dQ). */
static void bwd_pack_keys(const bwd_ctx *c, bwd_tiles *t, int64_t b, int64_t hk, int64_t k0,
                          int64_t nk) {
    const fmha_problem *p = &c->plan->p;
    const bwd_dims *d = &c->dm;
    const int64_t *ks = p->k_strides, *vs = p->v_strides;
    int64_t kfirst = b * ks[0] + k0 * ks[1] + hk * ks[2], vfirst = b * vs[0] + k0 * vs[1] + hk * vs[2];
    if (d->fast) {
        const uint16_t *k = c->k, *v = c->v;
        for (int64_t r = 0; r < nk; r++) {
            for (size_t e = 0; e < d->D2; e++)
                t->k2[(size_t)r * d->D2 + e] = fmha_bf16_pair(k, kfirst + r * ks[1] + 2 * (int64_t)e * ks[3],
                                                         kfirst + r * ks[1] + (2 * (int64_t)e + 1) * ks[3],
                                                         2 * e + 1 < d->D);
            for (size_t e = 0; e < d->Dv2; e++)
                t->v2[(size_t)r * d->Dv2 + e] = fmha_bf16_pair(v, vfirst + r * vs[1] + 2 * (int64_t)e * vs[3],
                                                          vfirst + r * vs[1] + (2 * (int64_t)e + 1) * vs[3],
                                                          2 * e + 1 < d->Dv);
        }
    }
    memset(t->krows, 0, (size_t)nk * d->d_pad * sizeof(float));
    if (!d->fast) memset(t->vrows, 0, (size_t)nk * d->dv_pad * sizeof(float));
    for (int64_t r = 0; r < nk; r++) {
        for (size_t e = 0; e < d->D; e++)
            t->krows[(size_t)r * d->d_pad + e] = fmha_load(c->k, p->dtype, kfirst + r * ks[1] + (int64_t)e * ks[3]);
        if (!d->fast)
            for (size_t e = 0; e < d->Dv; e++)
                t->vrows[(size_t)r * d->dv_pad + e] = fmha_load(c->v, p->dtype, vfirst + r * vs[1] + (int64_t)e * vs[3]);
    }
}

/* C[rows][ncols_pad] (op)= A B over column panels of NR, MR rows at a time. */
static void gemm_panels_f32(const fmha_ukernels *uk, size_t rows, size_t k, const float *a,
                            ptrdiff_t a_rs, ptrdiff_t a_cs, const float *b, size_t ldb, float *c,
                            size_t ldc, size_t ncols_pad) {
    for (size_t c0 = 0; c0 < ncols_pad; c0 += uk->nr)
        for (size_t r = 0; r < rows; r += uk->mr) {
            size_t m = rows - r < uk->mr ? rows - r : uk->mr;
            uk->gemm_f32(m, k, a + (ptrdiff_t)r * a_rs, a_rs, a_cs, b + c0, ldb, c + r * ldc + c0,
                         ldc, FMHA_UK_ACCUMULATE, NULL, 1.0f);
        }
}

/* S^T and dP^T of a pair: the two products that read K_j and V_j rows. */
static void bwd_scores(const bwd_ctx *c, bwd_tiles *t, const bwd_qblock *q, int64_t nk) {
    const fmha_ukernels *uk = c->plan->uk;
    const bwd_dims *d = &c->dm;
    for (int64_t r = 0; r < nk; r += (int64_t)uk->mr) {
        size_t m = (size_t)(nk - r) < uk->mr ? (size_t)(nk - r) : uk->mr;
        float *pt = t->pt + (size_t)r * d->nr, *dpt = t->dpt + (size_t)r * d->nr;
        if (d->fast) {
            uk->gemm_bf16(m, d->D2, t->k2 + (size_t)r * d->D2, (ptrdiff_t)d->D2, 1, q->qt2, d->nr, pt,
                          d->nr, FMHA_UK_STORE, NULL, c->plan->scale);
            uk->gemm_bf16(m, d->Dv2, t->v2 + (size_t)r * d->Dv2, (ptrdiff_t)d->Dv2, 1, q->dot2, d->nr,
                          dpt, d->nr, FMHA_UK_STORE, NULL, 1.0f);
        } else {
            uk->gemm_f32(m, d->D, t->krows + (size_t)r * d->d_pad, (ptrdiff_t)d->d_pad, 1, q->qt, d->nr,
                         pt, d->nr, FMHA_UK_STORE, NULL, 1.0f);
            uk->gemm_f32(m, d->Dv, t->vrows + (size_t)r * d->dv_pad, (ptrdiff_t)d->dv_pad, 1, q->dot,
                         d->nr, dpt, d->nr, FMHA_UK_STORE, NULL, 1.0f);
        }
    }
}

/* One (query head, query block) against one key block: tile tp. */
static void bwd_pair(const bwd_ctx *c, bwd_tiles *t, const fmha_tile_pos *tp, const bwd_qblock *q,
                     fmha_tile_class cls, float *dq_g, double *bias_acc, int thread) {
    const fmha_plan *plan = c->plan;
    const fmha_problem *p = &plan->p;
    const fmha_ukernels *uk = plan->uk;
    const bwd_dims *d = &c->dm;
    size_t nr = d->nr, nq = (size_t)tp->nq, nk = (size_t)tp->nk;
    size_t row0 = ((size_t)tp->b * (size_t)p->heads_q + (size_t)tp->h) * (size_t)p->seq_q + (size_t)tp->q0;

    bwd_scores(c, t, q, tp->nk);
    /* softcap, biases, masks as in the forward; then P^T = exp(S^T - lse) */
    int softcap = p->biases.softcap != 0.0f;
    if (cls == FMHA_TILE_PARTIAL || plan->has_bias)
        fmha_score_epilogue(plan, tp, cls, t->pt, nr, softcap ? t->raw : NULL, t->mask, thread);
    uk->exp_sub_f32(nk, t->pt, nr, q->lse);

    /* dV_j += P^T dO_i */
    gemm_panels_f32(uk, nk, nq, t->pt, (ptrdiff_t)nr, 1, q->dorows, q->dorows_ld, t->dv, d->dv_pad,
                    d->dv_pad);
    /* dS^T = P^T (dP^T - Dsum): the gradient of the biased score */
    uk->ds_f32(nk, t->pt, t->dpt, nr, q->dsum);
    if (plan->grads || p->biases.callback.accumulate_grad)
        fmha_bias_grad_tile(plan, tp, t->dpt, nr, t->diag, bias_acc, thread);
    if (softcap) fmha_softcap_grad(plan, tp, t->dpt, nr, t->raw);

    /* dK_j += dS^T Q_i;  dQ_i += dS K_j  (A element (i, r) = dS^T[r][i]) */
    gemm_panels_f32(uk, nk, nq, t->dpt, (ptrdiff_t)nr, 1, q->qrows, q->qrows_ld, t->dk, d->d_pad,
                    d->d_pad);
    gemm_panels_f32(uk, nq, nk, t->dpt, 1, (ptrdiff_t)nr, t->krows, d->d_pad,
                    dq_g + row0 * d->d_pad, d->d_pad, d->d_pad);
}

/* Key block j of (b, hk): every query head of the group, every query block
 * the masks let see it; then dK_j, dV_j are stored. */
static void bwd_key_block(const bwd_ctx *c, bwd_tiles *t, int64_t b, int64_t hk, size_t j,
                          float *dq_g, double *task_acc, int64_t task_head0, int thread) {
    const fmha_plan *plan = c->plan;
    const fmha_problem *p = &plan->p;
    const bwd_dims *d = &c->dm;
    const int64_t *ks = p->k_strides, *vs = p->v_strides;
    int64_t k0 = (int64_t)(j * d->bc);
    int64_t nk = p->seq_kv - k0 < (int64_t)d->bc ? p->seq_kv - k0 : (int64_t)d->bc;
    int packed = 0;
    long long computed = 0;
    int64_t qv_begin, qv_end;
    fmha_mask_q_range(plan, b, k0, nk, &qv_begin, &qv_end);
    size_t qb_begin = (size_t)qv_begin / d->nr;
    size_t qb_end = qv_end > qv_begin ? ((size_t)qv_end + d->nr - 1) / d->nr : qb_begin;
    for (int64_t h = hk * plan->group; h < (hk + 1) * plan->group; h++)
        for (size_t qb = qb_begin; qb < qb_end; qb++) {
            int64_t q0 = (int64_t)(qb * d->nr);
            fmha_tile_pos tp = {b, h, q0, p->seq_q - q0 < (int64_t)d->nr ? p->seq_q - q0 : (int64_t)d->nr,
                                k0, nk};
            int cls = fmha_mask_classify(plan, &tp, thread);
            if (cls == FMHA_TILE_EMPTY) continue;
            if (cls < 0) cls = FMHA_TILE_PARTIAL;
            if (!packed) {
                bwd_pack_keys(c, t, b, hk, k0, nk);
                memset(t->dk, 0, (size_t)nk * d->d_pad * sizeof(float));
                memset(t->dv, 0, (size_t)nk * d->dv_pad * sizeof(float));
                packed = 1;
            }
            computed++;
            double *acc = task_acc ? task_acc + (size_t)(h - task_head0) * (size_t)plan->toeplitz_len : NULL;
            bwd_qblock q = bwd_qblock_at(c, b, h, qb);
            bwd_pair(c, t, &tp, &q, (fmha_tile_class)cls, dq_g, acc, thread);
        }
    fmha_tiles_count(computed);
    /* dK_j, dV_j are complete (zero when no query sees the block) */
    for (int64_t r = 0; r < nk; r++) {
        int64_t dkrow = b * ks[0] + (k0 + r) * ks[1] + hk * ks[2];
        int64_t dvrow = b * vs[0] + (k0 + r) * vs[1] + hk * vs[2];
        for (size_t e = 0; e < d->D; e++)
            fmha_store(c->dk, p->dtype, dkrow + (int64_t)e * ks[3],
                       packed ? c->store_scale * t->dk[(size_t)r * d->d_pad + e] : 0.0f);
        for (size_t e = 0; e < d->Dv; e++)
            fmha_store(c->dv, p->dtype, dvrow + (int64_t)e * vs[3],
                       packed ? t->dv[(size_t)r * d->dv_pad + e] : 0.0f);
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

/* After the key pass, per (b, h): dQ = dQ_0 + ... + dQ_{G-1}, in order. */
static void bwd_reduce_dq_task(void *vctx, size_t task, int thread) {
    const bwd_ctx *c = vctx;
    const fmha_problem *p = &c->plan->p;
    const int64_t *qs = p->q_strides;
    int64_t b = (int64_t)task / p->heads_q, h = (int64_t)task % p->heads_q;
    (void)thread;
    for (int64_t i = 0; i < p->seq_q; i++) {
        const float *src = c->dq_part + ((size_t)task * (size_t)p->seq_q + (size_t)i) * c->dm.d_pad;
        int64_t row = b * qs[0] + i * qs[1] + h * qs[2];
        for (int64_t e = 0; e < p->head_dim; e++) {
            float acc = src[e];
            for (size_t g = 1; g < c->split.groups; g++) acc += src[g * c->dq_group_floats + (size_t)e];
            fmha_store(c->dq, p->dtype, row + e * qs[3], c->store_scale * acc);
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
    bwd_ctx c = {0};
    c.plan = plan;
    c.dm = bwd_dims_of(plan);
    c.q = q; c.k = k; c.v = v; c.o = o; c.d_o = d_o; c.lse = lse;
    c.dq = dq; c.dk = dk; c.dv = dv;
    c.split = bwd_split_of(plan);
    c.q_blocks = ((size_t)p->seq_q + c.dm.nr - 1) / c.dm.nr;
    c.kv_blocks = ((size_t)p->seq_kv + c.dm.bc - 1) / c.dm.bc;
    c.dq_group_floats = fbytes(bwd_dq_floats(plan)) / sizeof(float);
    c.heads_per_task = bwd_heads_per_task(plan, c.split);
    c.bias_task_doubles = dbytes(fmha_bias_grad_task_doubles(plan, c.heads_per_task)) / sizeof(double);
    size_t qoff[6];
    c.qblock_bytes = bwd_qblock_layout(&c.dm, qoff);
    c.store_scale = plan->scale;
    c.thread_ws = ws;
    char *shared = ws + (size_t)plan->threads * plan->thread_bytes;
    size_t soff[5];
    bwd_shared_layout(plan, soff);
    c.qblocks = shared + soff[0];
    c.dq_part = (float *)(shared + soff[1]);
    fmha_bias_prepare(&local, shared + soff[2]);
    c.bias_acc = c.bias_task_doubles ? (double *)(shared + soff[3]) : NULL;
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
