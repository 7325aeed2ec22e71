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
    float *dk;     /* [Bc][D_pad]   dK_j accumulator */
    float *dv;     /* [Bc][Dv_pad]  dV_j accumulator */
    float *lse;    /* [NR]          lse_i (padding lanes -inf) */
    float *dsum;   /* [NR]          Dsum_i (padding lanes 0) */
} bwd_tiles;

typedef struct bwd_ctx {
    const fmha_plan *plan;
    const float *q, *k, *v, *o, *d_o, *lse;
    float *dq, *dk, *dv;
    float *dsum;     /* [B, Hq, Sq] */
    float *dq_part;  /* [G][B, Hq, Sq, D_pad] */
    char *thread_ws;
    size_t bc, groups, q_blocks, kv_blocks, d_pad, dv_pad;
    size_t dq_group_floats; /* floats between dQ_g and dQ_{g+1} */
} bwd_ctx;

static size_t fbytes(size_t n) { return fmha_round_up(n * sizeof(float), FMHA_ALIGN); }

static size_t bwd_block_kv(const fmha_plan *plan) {
    return plan->strategy == FMHA_STRATEGY_DENSE ? (size_t)plan->p.seq_kv : plan->uk->block_kv;
}

static size_t bwd_groups(const fmha_plan *plan) {
    size_t bc = bwd_block_kv(plan);
    size_t kv_blocks = ((size_t)plan->p.seq_kv + bc - 1) / bc;
    size_t heads = (size_t)(plan->p.batch * plan->p.heads_kv);
    size_t g = (BWD_TARGET_TASKS + heads - 1) / heads;
    return g < 1 ? 1 : g > kv_blocks ? kv_blocks : g;
}

/* Per-thread tile sizes in floats, in bwd_tiles field order. */
static size_t bwd_tile_layout(const fmha_plan *plan, size_t off[11]) {
    size_t nr = plan->uk->nr, bc = bwd_block_kv(plan);
    size_t D = (size_t)plan->p.head_dim, Dv = (size_t)plan->p.head_dim_v;
    size_t d_pad = fmha_round_up(D, nr), dv_pad = fmha_round_up(Dv, nr);
    size_t n[11] = {D * nr, nr * d_pad, Dv * nr, nr * dv_pad, bc * nr, bc * nr,
                    bc * d_pad, bc * d_pad, bc * dv_pad, nr, nr};
    size_t total = 0;
    for (int i = 0; i < 11; i++) {
        off[i] = total;
        total += fbytes(n[i]);
    }
    return total;
}

static size_t bwd_dq_floats(const fmha_plan *plan) {
    size_t d_pad = fmha_round_up((size_t)plan->p.head_dim, plan->uk->nr);
    return (size_t)(plan->p.batch * plan->p.heads_q * plan->p.seq_q) * d_pad;
}

void fmha_bwd_workspace(const fmha_plan *plan, size_t *thread_bytes, size_t *shared_bytes) {
    size_t off[11];
    *thread_bytes = bwd_tile_layout(plan, off);
    *shared_bytes = fbytes((size_t)(plan->p.batch * plan->p.heads_q * plan->p.seq_q)) +
                    bwd_groups(plan) * fbytes(bwd_dq_floats(plan));
}

static void bwd_carve(const fmha_plan *plan, char *base, bwd_tiles *t) {
    size_t off[11];
    bwd_tile_layout(plan, off);
    float **f[11] = {&t->qt, &t->qrows, &t->dot, &t->dorows, &t->pt, &t->dpt,
                     &t->krows, &t->dk, &t->dv, &t->lse, &t->dsum};
    for (int i = 0; i < 11; i++) *f[i] = (float *)(base + off[i]);
}

/* Dsum[b, h, i] = sum_c dO[b, i, h, c] * O[b, i, h, c], one task per (b, h). */
static void bwd_dsum_task(void *vctx, size_t task, int thread) {
    const bwd_ctx *c = vctx;
    const fmha_problem *p = &c->plan->p;
    int64_t b = (int64_t)task / p->heads_q, h = (int64_t)task % p->heads_q;
    const int64_t *os = p->o_strides;
    for (int64_t i = 0; i < p->seq_q; i++) {
        const float *orow = c->o + b * os[0] + i * os[1] + h * os[2];
        const float *drow = c->d_o + b * os[0] + i * os[1] + h * os[2];
        double acc = 0.0;
        for (int64_t e = 0; e < p->head_dim_v; e++) acc += (double)orow[e * os[3]] * drow[e * os[3]];
        c->dsum[(size_t)task * (size_t)p->seq_q + (size_t)i] = (float)acc;
    }
}

/* Packs rows [n][ld] (zero padded) and, if tr, the transpose [cols][NR]
 * (zero padded lanes) of a strided [n x cols] block times mul. */
static void bwd_pack(const float *src, int64_t row_stride, int64_t col_stride, int64_t n,
                     int64_t cols, float mul, float *rows, size_t ld, float *tr, size_t nr) {
    if (rows) memset(rows, 0, (size_t)n * ld * sizeof(float));
    if (tr) memset(tr, 0, (size_t)cols * nr * sizeof(float));
    for (int64_t i = 0; i < n; i++)
        for (int64_t e = 0; e < cols; e++) {
            float x = mul * src[i * row_stride + e * col_stride];
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

/* One (query head h, query block qb) against key block [k0, k0 + nk). */
static void bwd_pair(const bwd_ctx *c, bwd_tiles *t, int64_t b, int64_t h, int64_t hk, int64_t qb,
                     int64_t k0, int64_t nk, fmha_tile_class cls, float *dq_g) {
    const fmha_plan *plan = c->plan;
    const fmha_problem *p = &plan->p;
    const fmha_ukernels *uk = plan->uk;
    size_t nr = uk->nr;
    int64_t q0 = qb * (int64_t)nr;
    int64_t nq = p->seq_q - q0 < (int64_t)nr ? p->seq_q - q0 : (int64_t)nr;
    const int64_t *qs = p->q_strides, *ks = p->k_strides, *vs = p->v_strides, *os = p->o_strides;
    size_t D = (size_t)p->head_dim, Dv = (size_t)p->head_dim_v;

    bwd_pack(c->q + b * qs[0] + q0 * qs[1] + h * qs[2], qs[1], qs[3], nq, (int64_t)D, plan->scale,
             t->qrows, c->d_pad, t->qt, nr);
    bwd_pack(c->d_o + b * os[0] + q0 * os[1] + h * os[2], os[1], os[3], nq, (int64_t)Dv, 1.0f,
             t->dorows, c->dv_pad, t->dot, nr);
    size_t row0 = ((size_t)b * (size_t)p->heads_q + (size_t)h) * (size_t)p->seq_q + (size_t)q0;
    for (size_t i = 0; i < nr; i++) {
        t->lse[i] = (int64_t)i < nq ? c->lse[row0 + i] : -INFINITY;
        t->dsum[i] = (int64_t)i < nq ? c->dsum[row0 + i] : 0.0f;
    }

    /* S^T = K_j (scale Q_i)^T, masked, then P^T = exp(S^T - lse) */
    const float *kbase = c->k + b * ks[0] + k0 * ks[1] + hk * ks[2];
    const float *vbase = c->v + b * vs[0] + k0 * vs[1] + hk * vs[2];
    for (int64_t r = 0; r < nk; r += (int64_t)uk->mr) {
        size_t m = (size_t)(nk - r) < uk->mr ? (size_t)(nk - r) : uk->mr;
        uk->gemm_f32(m, D, kbase + r * ks[1], ks[1], ks[3], t->qt, nr, t->pt + (size_t)r * nr, nr,
                     FMHA_UK_STORE, NULL);
        uk->gemm_f32(m, Dv, vbase + r * vs[1], vs[1], vs[3], t->dot, nr, t->dpt + (size_t)r * nr,
                     nr, FMHA_UK_STORE, NULL);
    }
    if (cls == FMHA_TILE_PARTIAL) fmha_mask_apply(plan, q0, nq, k0, nk, t->pt, nr);
    uk->exp_sub_f32((size_t)nk, t->pt, nr, t->lse);

    /* dV_j += P^T dO_i */
    bwd_gemm_panels(uk, (size_t)nk, (size_t)nq, t->pt, (ptrdiff_t)nr, 1, t->dorows, c->dv_pad, t->dv,
                    c->dv_pad, c->dv_pad, FMHA_UK_ACCUMULATE);
    /* dS^T = P^T (dP^T - Dsum) */
    uk->ds_f32((size_t)nk, t->pt, t->dpt, nr, t->dsum);
    /* dK_j += dS^T (scale Q_i) */
    bwd_gemm_panels(uk, (size_t)nk, (size_t)nq, t->dpt, (ptrdiff_t)nr, 1, t->qrows, c->d_pad, t->dk,
                    c->d_pad, c->d_pad, FMHA_UK_ACCUMULATE);
    /* dQ_i += dS K_j  (A element (i, r) = dS^T[r][i]) */
    bwd_gemm_panels(uk, (size_t)nq, (size_t)nk, t->dpt, 1, (ptrdiff_t)nr, t->krows, c->d_pad,
                    dq_g + row0 * c->d_pad, c->d_pad, c->d_pad, FMHA_UK_ACCUMULATE);
}

/* Task (b, hk, g): the key blocks j = g, g + G, ... of kv head hk. */
static void bwd_kv_task(void *vctx, size_t task, int thread) {
    const bwd_ctx *c = vctx;
    const fmha_plan *plan = c->plan;
    const fmha_problem *p = &plan->p;
    size_t nr = plan->uk->nr;
    size_t g = task % c->groups, bh = task / c->groups;
    int64_t b = (int64_t)bh / p->heads_kv, hk = (int64_t)bh % p->heads_kv;
    const int64_t *ks = p->k_strides, *vs = p->v_strides;
    size_t D = (size_t)p->head_dim, Dv = (size_t)p->head_dim_v;
    bwd_tiles t;
    bwd_carve(plan, c->thread_ws + (size_t)thread * plan->thread_bytes, &t);
    float *dq_g = c->dq_part + g * c->dq_group_floats;

    for (size_t j = g; j < c->kv_blocks; j += c->groups) {
        int64_t k0 = (int64_t)(j * c->bc);
        int64_t nk = p->seq_kv - k0 < (int64_t)c->bc ? p->seq_kv - k0 : (int64_t)c->bc;
        bwd_pack(c->k + b * ks[0] + k0 * ks[1] + hk * ks[2], ks[1], ks[3], nk, (int64_t)D, 1.0f,
                 t.krows, c->d_pad, NULL, nr);
        memset(t.dk, 0, (size_t)nk * c->d_pad * sizeof(float));
        memset(t.dv, 0, (size_t)nk * c->dv_pad * sizeof(float));
        for (int64_t h = hk * plan->group; h < (hk + 1) * plan->group; h++)
            for (size_t qb = 0; qb < c->q_blocks; qb++) {
                int64_t q0 = (int64_t)(qb * nr);
                int64_t nq = p->seq_q - q0 < (int64_t)nr ? p->seq_q - q0 : (int64_t)nr;
                fmha_tile_class cls = fmha_mask_classify(plan, q0, nq, k0, nk);
                if (cls != FMHA_TILE_EMPTY) bwd_pair(c, &t, b, h, hk, (int64_t)qb, k0, nk, cls, dq_g);
            }
        /* dK_j, dV_j are complete: store them with the caller's strides */
        for (int64_t r = 0; r < nk; r++) {
            float *dkrow = c->dk + b * ks[0] + (k0 + r) * ks[1] + hk * ks[2];
            float *dvrow = c->dv + b * vs[0] + (k0 + r) * vs[1] + hk * vs[2];
            for (size_t e = 0; e < D; e++) dkrow[(int64_t)e * ks[3]] = t.dk[(size_t)r * c->d_pad + e];
            for (size_t e = 0; e < Dv; e++) dvrow[(int64_t)e * vs[3]] = t.dv[(size_t)r * c->dv_pad + e];
        }
    }
}

/* Before the key pass, per (b, h): Dsum, and this head's rows of every dQ_g zeroed. */
static void bwd_prepare_task(void *vctx, size_t task, int thread) {
    const bwd_ctx *c = vctx;
    bwd_dsum_task(vctx, task, thread);
    size_t rows = (size_t)c->plan->p.seq_q;
    for (size_t g = 0; g < c->groups; g++)
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
        float *row = c->dq + b * qs[0] + i * qs[1] + h * qs[2];
        for (int64_t e = 0; e < p->head_dim; e++) {
            float acc = src[e];
            for (size_t g = 1; g < c->groups; g++) acc += src[g * c->dq_group_floats + (size_t)e];
            row[e * qs[3]] = plan->scale * acc;
        }
    }
}

fmha_status fmha_bwd_run(const fmha_plan *plan, const float *q, const float *k, const float *v,
                         const float *o, const float *d_o, const float *lse, float *dq, float *dk,
                         float *dv, char *ws) {
    const fmha_problem *p = &plan->p;
    size_t nr = plan->uk->nr;
    bwd_ctx c = {0};
    c.plan = plan;
    c.q = q; c.k = k; c.v = v; c.o = o; c.d_o = d_o; c.lse = lse;
    c.dq = dq; c.dk = dk; c.dv = dv;
    c.bc = bwd_block_kv(plan);
    c.groups = bwd_groups(plan);
    c.q_blocks = ((size_t)p->seq_q + nr - 1) / nr;
    c.kv_blocks = ((size_t)p->seq_kv + c.bc - 1) / c.bc;
    c.d_pad = fmha_round_up((size_t)p->head_dim, nr);
    c.dv_pad = fmha_round_up((size_t)p->head_dim_v, nr);
    c.dq_group_floats = fbytes(bwd_dq_floats(plan)) / sizeof(float);
    /* workspace: [threads x tiles][Dsum][dQ_0 .. dQ_{G-1}] */
    c.thread_ws = ws;
    char *shared = ws + (size_t)plan->threads * plan->thread_bytes;
    size_t rows = (size_t)(p->batch * p->heads_q * p->seq_q);
    c.dsum = (float *)shared;
    c.dq_part = (float *)(shared + fbytes(rows));

    size_t heads = (size_t)(p->batch * p->heads_q);
    fmha_parallel_for(heads, plan->threads, bwd_prepare_task, &c);
    fmha_parallel_for((size_t)(p->batch * p->heads_kv) * c.groups, plan->threads, bwd_kv_task, &c);
    fmha_parallel_for(heads, plan->threads, bwd_reduce_dq_task, &c);
    return FMHA_OK;
}
