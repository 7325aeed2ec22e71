/* fwd.c: the forward pass, O = softmax(scale Q K^T, masked) V, for the
 * tiled and dense strategies. Tiles and threads live here; arithmetic lives
 * in the microkernels (uk/ukernel.h). Scores are kept transposed, S^T
 * [keys][NR queries], so the softmax runs lane-wise and K and V are read
 * from the caller's memory as the broadcast operand, unpacked.
 *
 * Tiled, per task (batch b, query head h, block of NR queries):
 *   Q^T = scale * Q_blk^T; m = -inf; l = 0; O^T = 0
 *   for each key tile the mask does not rule out:
 *     S^T = K_tile Q^T; mask; (m, l, alpha) = online softmax; O^T = O^T alpha + V_tile^T P^T
 *   O = (O^T / l)^T; lse = m + log l          (l == 0: O = 0, lse = -inf)
 * Dense, per task (b, h): all of the head's scores S^T [Skv][Sq] are
 * materialised, softmaxed exactly (one pass over all keys), then multiplied
 * by V: the O(S^2) strategy, the quickest when everything fits in cache.
 * Every output element is produced by exactly one task in a fixed order, so
 * results do not depend on the thread count. */
#include <math.h>
#include <string.h>

#include "../attn.h"
#include "../convert.h"
#include "../pool.h"

/* Scratch of one query block (floats, each FMHA_ALIGN aligned):
 *   qt [D][NR], st [Skv_tile][NR], ot [Dv][NR], m/l/alpha [NR] */
typedef struct fwd_block_scratch {
    float *qt, *st, *ot, *m, *l, *alpha;
    float *kt, *vt;      /* [st_rows][D], [st_rows][Dv]: K, V widened to float32 (bf16/f16 only) */
    unsigned char *mask; /* [block_kv][NR] for a mask callback */
} fwd_block_scratch;

/* Rows [r][e] of K or V as the GEMM's broadcast operand: p[r * row + e * col]. */
typedef struct kv_view {
    const float *p;
    int64_t row, col;
} kv_view;

typedef struct fwd_ctx {
    const fmha_plan *plan;
    const void *q, *k, *v;
    void *o;
    float *lse;
    char *ws;
    size_t q_blocks;  /* query blocks per head */
    size_t st_rows;   /* rows of st: block_kv (tiled) or Skv (dense) */
} fwd_ctx;

static size_t floats_bytes(size_t n) { return fmha_round_up(n * sizeof(float), FMHA_ALIGN); }

/* Byte offsets of one block's scratch (dense: st_rows = Skv, panels = query
 * panels of the head); returns the total. */
static size_t fwd_layout(const fmha_plan *plan, size_t st_rows, size_t panels, size_t off[9]) {
    size_t nr = plan->uk->nr;
    int widen = plan->p.dtype != FMHA_DTYPE_F32;
    size_t sizes[8] = {(size_t)plan->p.head_dim * nr * panels, st_rows * nr * panels,
                       (size_t)plan->p.head_dim_v * nr, nr, nr, nr,
                       widen ? st_rows * (size_t)plan->p.head_dim : 0,
                       widen ? st_rows * (size_t)plan->p.head_dim_v : 0};
    size_t total = 0;
    for (int i = 0; i < 8; i++) {
        off[i] = total;
        total += floats_bytes(sizes[i]);
    }
    off[8] = total;
    return total + fmha_mask_scratch_bytes(plan);
}

static void fwd_carve(const fmha_plan *plan, size_t st_rows, size_t panels, char *base,
                      fwd_block_scratch *s) {
    size_t off[9];
    fwd_layout(plan, st_rows, panels, off);
    s->qt = (float *)(base + off[0]);
    s->st = (float *)(base + off[1]);
    s->ot = (float *)(base + off[2]);
    s->m = (float *)(base + off[3]);
    s->l = (float *)(base + off[4]);
    s->alpha = (float *)(base + off[5]);
    s->kt = (float *)(base + off[6]);
    s->vt = (float *)(base + off[7]);
    s->mask = (unsigned char *)(base + off[8]);
}

static size_t fwd_panels(const fmha_plan *plan) {
    size_t nr = plan->uk->nr;
    return plan->strategy == FMHA_STRATEGY_DENSE ? ((size_t)plan->p.seq_q + nr - 1) / nr : 1;
}

static size_t fwd_st_rows(const fmha_plan *plan) {
    return plan->strategy == FMHA_STRATEGY_DENSE ? (size_t)plan->p.seq_kv : plan->uk->block_kv;
}

void fmha_fwd_workspace(const fmha_plan *plan, size_t *thread_bytes, size_t *shared_bytes) {
    size_t off[9];
    *thread_bytes = fwd_layout(plan, fwd_st_rows(plan), fwd_panels(plan), off);
    *shared_bytes = fmha_bias_shared_bytes(plan);
}

/* qt[d][i] = scale * Q[b, q0 + i, h, d] for i < nq, 0 for nq <= i < NR. */
static void fwd_pack_qt(const fmha_plan *plan, const void *q, int64_t b, int64_t h, int64_t q0,
                        int64_t nq, float *qt) {
    const int64_t *qs = plan->p.q_strides;
    size_t nr = plan->uk->nr;
    int64_t D = plan->p.head_dim;
    fmha_dtype t = plan->p.dtype;
    memset(qt, 0, (size_t)D * nr * sizeof(float));
    for (int64_t i = 0; i < nq; i++) {
        int64_t row = b * qs[0] + (q0 + i) * qs[1] + h * qs[2];
        for (int64_t d = 0; d < D; d++)
            qt[(size_t)d * nr + (size_t)i] = plan->scale * fmha_load(q, t, row + d * qs[3]);
    }
}

/* Rows k0 .. k0 + nk of K or V (cols wide) for kv head hk: the caller's
 * memory for float32, else widened into `scratch` [nk][cols]. */
static kv_view fwd_kv_view(const fmha_plan *plan, const void *base, const int64_t *st, int64_t b,
                           int64_t hk, int64_t k0, int64_t nk, int64_t cols, float *scratch) {
    int64_t first = b * st[0] + k0 * st[1] + hk * st[2];
    if (plan->p.dtype == FMHA_DTYPE_F32) return (kv_view){(const float *)base + first, st[1], st[3]};
    for (int64_t r = 0; r < nk; r++)
        for (int64_t e = 0; e < cols; e++)
            scratch[r * cols + e] = fmha_load(base, plan->p.dtype, first + r * st[1] + e * st[3]);
    return (kv_view){scratch, cols, 1};
}

/* st[r][*] = K row r . qt for r < nk (rows of keys, MR at a time). */
static void fwd_scores(const fmha_plan *plan, kv_view kv, int64_t nk, const float *qt, float *st) {
    const fmha_ukernels *uk = plan->uk;
    for (int64_t r = 0; r < nk; r += (int64_t)uk->mr) {
        size_t m = (size_t)(nk - r) < uk->mr ? (size_t)(nk - r) : uk->mr;
        uk->gemm_f32(m, (size_t)plan->p.head_dim, kv.p + r * kv.row, kv.row, kv.col, qt, uk->nr,
                     st + (size_t)r * uk->nr, uk->nr, FMHA_UK_STORE, NULL);
    }
}

/* ot = ot * alpha + V_tile^T pt  (mode STORE ignores ot, alpha). */
static void fwd_values(const fmha_plan *plan, kv_view vv, int64_t nk, const float *pt, float *ot,
                       int mode, const float *alpha) {
    const fmha_ukernels *uk = plan->uk;
    int64_t Dv = plan->p.head_dim_v;
    for (int64_t c = 0; c < Dv; c += (int64_t)uk->mr) {
        size_t m = (size_t)(Dv - c) < uk->mr ? (size_t)(Dv - c) : uk->mr;
        uk->gemm_f32(m, (size_t)nk, vv.p + c * vv.col, vv.col, vv.row, pt, uk->nr,
                     ot + (size_t)c * uk->nr, uk->nr, mode, alpha);
    }
}

/* O[b, q0 + i, h, :] = ot[:, i] / l[i]; lse[b, h, q0 + i] = m + log l. */
static void fwd_finish(const fmha_plan *plan, int64_t b, int64_t h, int64_t q0, int64_t nq,
                       const float *ot, const float *m, const float *l, void *o, float *lse) {
    const int64_t *os = plan->p.o_strides;
    size_t nr = plan->uk->nr;
    int64_t Dv = plan->p.head_dim_v;
    for (int64_t i = 0; i < nq; i++) {
        float inv = l[i] > 0.0f ? 1.0f / l[i] : 0.0f;
        int64_t row = b * os[0] + (q0 + i) * os[1] + h * os[2];
        for (int64_t c = 0; c < Dv; c++)
            fmha_store(o, plan->p.dtype, row + c * os[3], ot[(size_t)c * nr + (size_t)i] * inv);
        if (lse)
            lse[(b * plan->p.heads_q + h) * plan->p.seq_q + q0 + i] =
                l[i] > 0.0f ? m[i] + logf(l[i]) : -INFINITY;
    }
}

static void fwd_reset(size_t nr, int64_t Dv, fwd_block_scratch *s) {
    for (size_t i = 0; i < nr; i++) {
        s->m[i] = -INFINITY;
        s->l[i] = 0.0f;
    }
    memset(s->ot, 0, (size_t)Dv * nr * sizeof(float));
}

/* Task -> (b, h, query block); causal problems start with the longest rows. */
static void fwd_task_coords(const fwd_ctx *c, size_t task, int64_t *b, int64_t *h, int64_t *qb) {
    const fmha_problem *p = &c->plan->p;
    size_t heads = (size_t)(p->batch * p->heads_q);
    size_t blk = task / heads, bh = task % heads;
    if (p->causal != FMHA_CAUSAL_NONE) blk = c->q_blocks - 1 - blk;
    *b = (int64_t)(bh / (size_t)p->heads_q);
    *h = (int64_t)(bh % (size_t)p->heads_q);
    *qb = (int64_t)blk;
}

static void fwd_tiled_task(void *vctx, size_t task, int thread) {
    const fwd_ctx *c = vctx;
    const fmha_plan *plan = c->plan;
    const fmha_ukernels *uk = plan->uk;
    size_t nr = uk->nr;
    int64_t bc = (int64_t)uk->block_kv;
    int64_t b, h, qb;
    fwd_task_coords(c, task, &b, &h, &qb);
    int64_t hk = h / plan->group;
    int64_t q0 = qb * (int64_t)nr;
    int64_t nq = plan->p.seq_q - q0 < (int64_t)nr ? plan->p.seq_q - q0 : (int64_t)nr;

    fwd_block_scratch s;
    fwd_carve(plan, uk->block_kv, 1, c->ws + (size_t)thread * plan->thread_bytes, &s);
    fwd_pack_qt(plan, c->q, b, h, q0, nq, s.qt);
    fwd_reset(nr, plan->p.head_dim_v, &s);

    /* Key tiles sit on the grid k0 = multiple of Bc, so every strategy and
     * pass shows a mask the same tiles. */
    fmha_tile_pos t = {b, h, q0, nq, 0, 0};
    int64_t kb, ke;
    fmha_mask_kv_range(plan, &t, &kb, &ke);
    for (int64_t k0 = kb / bc * bc; k0 < ke; k0 += bc) {
        t.k0 = k0;
        t.nk = plan->p.seq_kv - k0 < bc ? plan->p.seq_kv - k0 : bc;
        int cls = fmha_mask_classify(plan, &t, thread);
        if (cls == FMHA_TILE_EMPTY) continue;
        if (cls < 0) cls = FMHA_TILE_PARTIAL;
        int64_t nk = t.nk;
        fmha_tiles_count();
        kv_view kv = fwd_kv_view(plan, c->k, plan->p.k_strides, b, hk, k0, nk, plan->p.head_dim, s.kt);
        fwd_scores(plan, kv, nk, s.qt, s.st);
        if (cls == FMHA_TILE_PARTIAL || plan->has_bias)
            fmha_score_epilogue(plan, &t, (fmha_tile_class)cls, s.st, nr, NULL, s.mask, thread);
        uk->softmax_f32((size_t)nk, s.st, nr, s.m, s.l, s.alpha);
        kv_view vv = fwd_kv_view(plan, c->v, plan->p.v_strides, b, hk, k0, nk, plan->p.head_dim_v, s.vt);
        fwd_values(plan, vv, nk, s.st, s.ot, FMHA_UK_RESCALE, s.alpha);
    }
    fwd_finish(plan, b, h, q0, nq, s.ot, s.m, s.l, c->o, c->lse);
}

static void fwd_dense_task(void *vctx, size_t task, int thread) {
    const fwd_ctx *c = vctx;
    const fmha_plan *plan = c->plan;
    const fmha_ukernels *uk = plan->uk;
    size_t nr = uk->nr, panels = c->q_blocks;
    int64_t skv = plan->p.seq_kv;
    int64_t b = (int64_t)task / plan->p.heads_q, h = (int64_t)task % plan->p.heads_q;
    int64_t hk = h / plan->group;

    /* qt [panels][D][NR], st [panels][Skv][NR]: the whole head's scores */
    fwd_block_scratch s;
    fwd_carve(plan, (size_t)skv, panels, c->ws + (size_t)thread * plan->thread_bytes, &s);
    size_t qt_panel = (size_t)plan->p.head_dim * nr, st_panel = (size_t)skv * nr;
    kv_view kv = fwd_kv_view(plan, c->k, plan->p.k_strides, b, hk, 0, skv, plan->p.head_dim, s.kt);
    kv_view vv = fwd_kv_view(plan, c->v, plan->p.v_strides, b, hk, 0, skv, plan->p.head_dim_v, s.vt);
    for (size_t pi = 0; pi < panels; pi++) {
        int64_t q0 = (int64_t)(pi * nr);
        int64_t nq = plan->p.seq_q - q0 < (int64_t)nr ? plan->p.seq_q - q0 : (int64_t)nr;
        float *st = s.st + pi * st_panel;
        fwd_pack_qt(plan, c->q, b, h, q0, nq, s.qt + pi * qt_panel);
        fwd_scores(plan, kv, skv, s.qt + pi * qt_panel, st);
        /* the mask and bias epilogue, tile by tile on the tiled grid */
        int64_t bc = (int64_t)uk->block_kv;
        for (int64_t k0 = 0; k0 < skv; k0 += bc) {
            fmha_tile_pos t = {b, h, q0, nq, k0, skv - k0 < bc ? skv - k0 : bc};
            int cls = fmha_mask_classify(plan, &t, thread);
            if (cls < 0) cls = FMHA_TILE_PARTIAL;
            float *tile = st + (size_t)k0 * nr;
            if (cls == FMHA_TILE_EMPTY) {
                for (size_t e = 0; e < (size_t)t.nk * nr; e++) tile[e] = -INFINITY;
            } else if (cls == FMHA_TILE_PARTIAL || plan->has_bias) {
                fmha_score_epilogue(plan, &t, (fmha_tile_class)cls, tile, nr, NULL, s.mask, thread);
            }
        }
    }
    for (size_t pi = 0; pi < panels; pi++) {
        int64_t q0 = (int64_t)(pi * nr);
        int64_t nq = plan->p.seq_q - q0 < (int64_t)nr ? plan->p.seq_q - q0 : (int64_t)nr;
        fwd_reset(nr, 0, &s);
        uk->softmax_f32((size_t)skv, s.st + pi * st_panel, nr, s.m, s.l, s.alpha);
        fwd_values(plan, vv, skv, s.st + pi * st_panel, s.ot, FMHA_UK_STORE, NULL);
        fwd_finish(plan, b, h, q0, nq, s.ot, s.m, s.l, c->o, c->lse);
    }
}

fmha_status fmha_fwd_run(const fmha_plan *plan_in, const void *q, const void *k, const void *v,
                         void *o, float *lse, char *ws) {
    /* the shared workspace (after the threads' scratch) holds the bias vectors */
    fmha_plan local = *plan_in;
    const fmha_plan *plan = &local;
    const fmha_problem *p = &plan->p;
    fmha_bias_prepare(&local, ws + (size_t)plan->threads * plan->thread_bytes);
    size_t nr = plan->uk->nr;
    fwd_ctx c = {plan, q, k, v, o, lse, ws, ((size_t)p->seq_q + nr - 1) / nr, fwd_st_rows(plan)};
    size_t heads = (size_t)(p->batch * p->heads_q);
    if (plan->strategy == FMHA_STRATEGY_DENSE)
        fmha_parallel_for(heads, plan->threads, fwd_dense_task, &c);
    else
        fmha_parallel_for(heads * c.q_blocks, plan->threads, fwd_tiled_task, &c);
    return FMHA_OK;
}
