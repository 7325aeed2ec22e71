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
    uint32_t *pt2;       /* [2][st_rows2][NR] P^T pairs, rounded and residual (bf16 fast path) */
    unsigned char *mask; /* [block_kv][NR] for a mask callback */
} fwd_block_scratch;

/* Rows [r][e] of K or V as the GEMM's broadcast operand: p[r * row + e * col]. */
typedef struct kv_view {
    const float *p;
    int64_t row, col;
} kv_view;

/* K and V of one key tile as the GEMMs read them: float32 views, or on the
 * bf16 fast path K pairs k2 [keys][D2] and V^T pairs v2 [Dv][v2_ld]. */
typedef struct kv_ops {
    kv_view k, v;
    const uint32_t *k2, *v2;
    size_t v2_ld;
} kv_ops;

typedef struct fwd_ctx {
    const fmha_plan *plan;
    const void *q, *k, *v;
    void *o;
    float *lse;
    char *ws;
    /* bf16/f16: K and V of every (b, kv head) packed once, in the shared
     * workspace: widened float32 kf [Skv][D], vf [Skv][Dv], or on the bf16
     * fast path k2 [Skv][D2] and v2 [Dv][Skv2] pairs. */
    char *kv_packed;
    size_t q_blocks;  /* query blocks per head */
    size_t st_rows;   /* rows of st: block_kv (tiled) or Skv (dense) */
} fwd_ctx;

static size_t floats_bytes(size_t n) { return fmha_round_up(n * sizeof(float), FMHA_ALIGN); }

/* Byte offsets of one block's scratch (dense: st_rows = Skv, panels = query
 * panels of the head); returns the total. */
static size_t fwd_layout(const fmha_plan *plan, size_t st_rows, size_t panels, size_t off[8]) {
    size_t nr = plan->uk->nr;
    /* qt holds Q^T pairs [D2][NR] on the bf16 fast path: D2 <= D */
    size_t sizes[7] = {(size_t)plan->p.head_dim * nr * panels, st_rows * nr * panels,
                       (size_t)plan->p.head_dim_v * nr, nr, nr, nr,
                       plan->bf16_fast ? 2 * ((st_rows + 1) / 2) * nr : 0};
    size_t total = 0;
    for (int i = 0; i < 7; i++) {
        off[i] = total;
        total += floats_bytes(sizes[i]);
    }
    off[7] = total;
    return total + fmha_mask_scratch_bytes(plan);
}

static void fwd_carve(const fmha_plan *plan, size_t st_rows, size_t panels, char *base,
                      fwd_block_scratch *s) {
    size_t off[8];
    fwd_layout(plan, st_rows, panels, off);
    s->qt = (float *)(base + off[0]);
    s->st = (float *)(base + off[1]);
    s->ot = (float *)(base + off[2]);
    s->m = (float *)(base + off[3]);
    s->l = (float *)(base + off[4]);
    s->alpha = (float *)(base + off[5]);
    s->pt2 = (uint32_t *)(base + off[6]);
    s->mask = (unsigned char *)(base + off[7]);
}

static size_t fwd_panels(const fmha_plan *plan) {
    size_t nr = plan->uk->nr;
    return plan->strategy == FMHA_STRATEGY_DENSE ? ((size_t)plan->p.seq_q + nr - 1) / nr : 1;
}

static size_t fwd_st_rows(const fmha_plan *plan) {
    return plan->strategy == FMHA_STRATEGY_DENSE ? (size_t)plan->p.seq_kv : plan->uk->block_kv;
}

/* Bytes of K and V packed for one (b, kv head), and the whole area. */
static size_t fwd_kv_unit_bytes(const fmha_plan *plan) {
    const fmha_problem *p = &plan->p;
    if (p->dtype == FMHA_DTYPE_F32) return 0;
    size_t skv = (size_t)p->seq_kv, D = (size_t)p->head_dim, Dv = (size_t)p->head_dim_v;
    if (plan->bf16_fast)
        return fmha_round_up(skv * ((D + 1) / 2) * 4, FMHA_ALIGN) +
               fmha_round_up(Dv * ((skv + 1) / 2) * 4, FMHA_ALIGN);
    return floats_bytes(skv * D) + floats_bytes(skv * Dv);
}

static size_t fwd_kv_packed_bytes(const fmha_plan *plan) {
    return (size_t)(plan->p.batch * plan->p.heads_kv) * fwd_kv_unit_bytes(plan);
}

void fmha_fwd_workspace(const fmha_plan *plan, size_t *thread_bytes, size_t *shared_bytes) {
    size_t off[8];
    *thread_bytes = fwd_layout(plan, fwd_st_rows(plan), fwd_panels(plan), off);
    *shared_bytes = fmha_bias_shared_bytes(plan) + fwd_kv_packed_bytes(plan);
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

/* st[r][*] = K row r . qt for r < nk (rows of keys, MR at a time). */
static void fwd_scores(const fmha_plan *plan, kv_view kv, int64_t nk, const float *qt, float *st) {
    const fmha_ukernels *uk = plan->uk;
    for (int64_t r = 0; r < nk; r += (int64_t)uk->mr) {
        size_t m = (size_t)(nk - r) < uk->mr ? (size_t)(nk - r) : uk->mr;
        uk->gemm_f32(m, (size_t)plan->p.head_dim, kv.p + r * kv.row, kv.row, kv.col, qt, uk->nr,
                     st + (size_t)r * uk->nr, uk->nr, FMHA_UK_STORE, NULL, 1.0f);
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
                     ot + (size_t)c * uk->nr, uk->nr, mode, alpha, 1.0f);
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
            fmha_store(o, plan->o_dtype, row + c * os[3], ot[(size_t)c * nr + (size_t)i] * inv);
        if (lse)
            lse[(b * plan->p.heads_q + h) * plan->p.seq_q + q0 + i] =
                l[i] > 0.0f ? m[i] + logf(l[i]) : -INFINITY;
    }
}

/* ---- the bf16 fast path: pair-packed operands for vdpbf16ps ---- */

/* qt2[p][i] = (Q[q0+i][2p], Q[q0+i][2p+1]) (unscaled; padding 0), D2 = ceil(D/2). */
static void fwd_pack_qt2(const fmha_plan *plan, const uint16_t *q, int64_t b, int64_t h, int64_t q0,
                         int64_t nq, uint32_t *qt2) {
    const int64_t *qs = plan->p.q_strides;
    size_t nr = plan->uk->nr;
    int64_t D = plan->p.head_dim, D2 = (D + 1) / 2;
    memset(qt2, 0, (size_t)D2 * nr * sizeof(uint32_t));
    for (int64_t i = 0; i < nq; i++) {
        int64_t row = b * qs[0] + (q0 + i) * qs[1] + h * qs[2];
        for (int64_t e = 0; e < D2; e++)
            qt2[(size_t)e * nr + (size_t)i] =
                fmha_bf16_pair(q, row + 2 * e * qs[3], row + (2 * e + 1) * qs[3], 2 * e + 1 < D);
    }
}

/* Pre-pass task (b, kv head, key tile): packs that tile's keys of K and V
 * into the unit's area: float32 rows (kf, vf), or bf16 pairs (k2 along d,
 * v2 along keys: word (c, p) = (V[2p][c], V[2p+1][c])). */
static void fwd_kv_pack_task(void *vctx, size_t task, int thread) {
    const fwd_ctx *c = vctx;
    const fmha_plan *plan = c->plan;
    const fmha_problem *p = &plan->p;
    size_t bc = plan->uk->block_kv, tiles = ((size_t)p->seq_kv + bc - 1) / bc;
    size_t unit = task / tiles;
    int64_t b = (int64_t)unit / p->heads_kv, hk = (int64_t)unit % p->heads_kv;
    int64_t k0 = (int64_t)((task % tiles) * bc), skv = p->seq_kv;
    int64_t nk = skv - k0 < (int64_t)bc ? skv - k0 : (int64_t)bc;
    const int64_t *ks = p->k_strides, *vs = p->v_strides;
    int64_t D = p->head_dim, Dv = p->head_dim_v, D2 = (D + 1) / 2, skv2 = (skv + 1) / 2;
    char *area = c->kv_packed + unit * fwd_kv_unit_bytes(plan);
    (void)thread;
    if (plan->bf16_fast) {
        const uint16_t *k = c->k, *v = c->v;
        uint32_t *k2 = (uint32_t *)area;
        uint32_t *v2 = (uint32_t *)(area + fmha_round_up((size_t)(skv * D2) * 4, FMHA_ALIGN));
        for (int64_t r = k0; r < k0 + nk; r++) {
            int64_t row = b * ks[0] + r * ks[1] + hk * ks[2];
            if (ks[3] == 1 && D % 2 == 0) { /* the row already is its pairs */
                memcpy(k2 + r * D2, k + row, (size_t)D * sizeof(uint16_t));
                continue;
            }
            for (int64_t e = 0; e < D2; e++)
                k2[r * D2 + e] = fmha_bf16_pair(k, row + 2 * e * ks[3], row + (2 * e + 1) * ks[3], 2 * e + 1 < D);
        }
        /* V^T pairs in blocks of 16 pairs: 32 source rows stay in L1 while
         * each destination row gets 16 consecutive words */
        int64_t pr_end = (k0 + nk + 1) / 2;
        for (int64_t pr0 = k0 / 2; pr0 < pr_end; pr0 += 16) {
            int64_t pr1 = pr0 + 16 < pr_end ? pr0 + 16 : pr_end;
            for (int64_t e = 0; e < Dv; e++)
                for (int64_t pr = pr0; pr < pr1; pr++) {
                    int64_t at = b * vs[0] + 2 * pr * vs[1] + hk * vs[2] + e * vs[3];
                    v2[e * skv2 + pr] = fmha_bf16_pair(v, at, at + vs[1], 2 * pr + 1 < skv);
                }
        }
    } else {
        float *kf = (float *)area, *vf = (float *)(area + floats_bytes((size_t)(skv * D)));
        for (int64_t r = k0; r < k0 + nk; r++) {
            int64_t krow = b * ks[0] + r * ks[1] + hk * ks[2], vrow = b * vs[0] + r * vs[1] + hk * vs[2];
            for (int64_t e = 0; e < D; e++) kf[r * D + e] = fmha_load(c->k, p->dtype, krow + e * ks[3]);
            for (int64_t e = 0; e < Dv; e++) vf[r * Dv + e] = fmha_load(c->v, p->dtype, vrow + e * vs[3]);
        }
    }
}

/* The operands of keys k0.. of (b, kv head hk). */
static kv_ops fwd_kv_ops(const fwd_ctx *c, int64_t b, int64_t hk, int64_t k0) {
    const fmha_plan *plan = c->plan;
    const fmha_problem *p = &plan->p;
    kv_ops ops = {0};
    if (p->dtype == FMHA_DTYPE_F32) {
        const int64_t *ks = p->k_strides, *vs = p->v_strides;
        ops.k = (kv_view){(const float *)c->k + b * ks[0] + k0 * ks[1] + hk * ks[2], ks[1], ks[3]};
        ops.v = (kv_view){(const float *)c->v + b * vs[0] + k0 * vs[1] + hk * vs[2], vs[1], vs[3]};
        return ops;
    }
    int64_t skv = p->seq_kv, D = p->head_dim, Dv = p->head_dim_v, D2 = (D + 1) / 2;
    char *area = c->kv_packed + (size_t)(b * p->heads_kv + hk) * fwd_kv_unit_bytes(plan);
    if (plan->bf16_fast) {
        ops.k2 = (const uint32_t *)area + k0 * D2;
        ops.v2_ld = (size_t)(skv + 1) / 2;
        ops.v2 = (const uint32_t *)(area + fmha_round_up((size_t)(skv * D2) * 4, FMHA_ALIGN)) + k0 / 2;
    } else {
        ops.k = (kv_view){(const float *)area + k0 * D, D, 1};
        ops.v = (kv_view){(const float *)(area + floats_bytes((size_t)(skv * D))) + k0 * Dv, Dv, 1};
    }
    return ops;
}

/* st = scale * K2 qt2 */
static void fwd_scores2(const fmha_plan *plan, const uint32_t *k2, int64_t nk, const uint32_t *qt2,
                        float *st) {
    const fmha_ukernels *uk = plan->uk;
    size_t D2 = (size_t)(plan->p.head_dim + 1) / 2;
    for (int64_t r = 0; r < nk; r += (int64_t)uk->mr) {
        size_t m = (size_t)(nk - r) < uk->mr ? (size_t)(nk - r) : uk->mr;
        uk->gemm_bf16(m, D2, k2 + (size_t)r * D2, (ptrdiff_t)D2, 1, qt2, uk->nr, st + (size_t)r * uk->nr,
                      uk->nr, FMHA_UK_STORE, NULL, plan->scale);
    }
}

/* ot = ot * alpha + V^T P^T (mode STORE ignores ot, alpha), with P^T as bf16
 * pairs plus (precision ACCURATE) the pairs of its rounding residual:
 * rounding P alone adds an error as large as rounding O itself. */
static void fwd_values2(const fmha_plan *plan, const uint32_t *v2, size_t ld2, int64_t nk,
                        const float *pt, uint32_t *pt2, float *ot, int mode, const float *alpha) {
    const fmha_ukernels *uk = plan->uk;
    size_t nr = uk->nr, kp = (size_t)(nk + 1) / 2;
    uint32_t *hi = pt2, *lo = pt2 + kp * nr;
    int split = plan->p.precision == FMHA_PRECISION_ACCURATE;
    for (size_t pr = 0; pr < kp; pr++) {
        const float *a = pt + 2 * pr * nr, *b = 2 * pr + 1 < (size_t)nk ? pt + (2 * pr + 1) * nr : NULL;
        if (split) uk->pair_rows_split_bf16(a, b, hi + pr * nr, lo + pr * nr);
        else uk->pair_rows_bf16(a, b, hi + pr * nr);
    }
    int64_t Dv = plan->p.head_dim_v;
    for (int64_t c = 0; c < Dv; c += (int64_t)uk->mr) {
        size_t m = (size_t)(Dv - c) < uk->mr ? (size_t)(Dv - c) : uk->mr;
        const uint32_t *a = v2 + (size_t)c * ld2;
        uk->gemm_bf16(m, kp, a, (ptrdiff_t)ld2, 1, hi, nr, ot + (size_t)c * nr, nr, mode, alpha, 1.0f);
        if (split)
            uk->gemm_bf16(m, kp, a, (ptrdiff_t)ld2, 1, lo, nr, ot + (size_t)c * nr, nr,
                          FMHA_UK_ACCUMULATE, NULL, 1.0f);
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
    if (plan->bf16_fast) fwd_pack_qt2(plan, c->q, b, h, q0, nq, (uint32_t *)s.qt);
    else fwd_pack_qt(plan, c->q, b, h, q0, nq, s.qt);
    fwd_reset(nr, plan->p.head_dim_v, &s);

    /* Key tiles sit on the grid k0 = multiple of Bc, so every strategy and
     * pass shows a mask the same tiles. */
    fmha_tile_pos t = {b, h, q0, nq, 0, 0};
    int64_t kb, ke;
    long long computed = 0;
    fmha_mask_kv_range(plan, &t, &kb, &ke);
    for (int64_t k0 = kb / bc * bc; k0 < ke; k0 += bc) {
        t.k0 = k0;
        t.nk = plan->p.seq_kv - k0 < bc ? plan->p.seq_kv - k0 : bc;
        int cls = fmha_mask_classify(plan, &t, thread);
        if (cls == FMHA_TILE_EMPTY) continue;
        if (cls < 0) cls = FMHA_TILE_PARTIAL;
        int64_t nk = t.nk;
        computed++;
        kv_ops ops = fwd_kv_ops(c, b, hk, k0);
        if (plan->bf16_fast) fwd_scores2(plan, ops.k2, nk, (uint32_t *)s.qt, s.st);
        else fwd_scores(plan, ops.k, nk, s.qt, s.st);
        if (cls == FMHA_TILE_PARTIAL || plan->has_bias)
            fmha_score_epilogue(plan, &t, (fmha_tile_class)cls, s.st, nr, NULL, s.mask, thread);
        uk->softmax_f32((size_t)nk, s.st, nr, s.m, s.l, s.alpha);
        if (plan->bf16_fast)
            fwd_values2(plan, ops.v2, ops.v2_ld, nk, s.st, s.pt2, s.ot, FMHA_UK_RESCALE, s.alpha);
        else
            fwd_values(plan, ops.v, nk, s.st, s.ot, FMHA_UK_RESCALE, s.alpha);
    }
    fwd_finish(plan, b, h, q0, nq, s.ot, s.m, s.l, c->o, c->lse);
    fmha_tiles_count(computed);
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
    kv_ops ops = fwd_kv_ops(c, b, hk, 0);
    for (size_t pi = 0; pi < panels; pi++) {
        int64_t q0 = (int64_t)(pi * nr);
        int64_t nq = plan->p.seq_q - q0 < (int64_t)nr ? plan->p.seq_q - q0 : (int64_t)nr;
        float *st = s.st + pi * st_panel;
        if (plan->bf16_fast) {
            uint32_t *qt2 = (uint32_t *)(s.qt + pi * qt_panel);
            fwd_pack_qt2(plan, c->q, b, h, q0, nq, qt2);
            fwd_scores2(plan, ops.k2, skv, qt2, st);
        } else {
            fwd_pack_qt(plan, c->q, b, h, q0, nq, s.qt + pi * qt_panel);
            fwd_scores(plan, ops.k, skv, s.qt + pi * qt_panel, st);
        }
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
        if (plan->bf16_fast)
            fwd_values2(plan, ops.v2, ops.v2_ld, skv, s.st + pi * st_panel, s.pt2, s.ot,
                        FMHA_UK_STORE, NULL);
        else
            fwd_values(plan, ops.v, skv, s.st + pi * st_panel, s.ot, FMHA_UK_STORE, NULL);
        fwd_finish(plan, b, h, q0, nq, s.ot, s.m, s.l, c->o, c->lse);
    }
}

fmha_status fmha_fwd_run(const fmha_plan *plan_in, const void *q, const void *k, const void *v,
                         void *o, float *lse, char *ws) {
    /* the shared workspace (after the threads' scratch) holds the bias vectors */
    fmha_plan local = *plan_in;
    const fmha_plan *plan = &local;
    const fmha_problem *p = &plan->p;
    char *shared = ws + (size_t)plan->threads * plan->thread_bytes;
    fmha_bias_prepare(&local, shared);
    size_t nr = plan->uk->nr;
    fwd_ctx c = {plan, q, k, v, o, lse, ws, shared + fmha_bias_shared_bytes(plan),
                 ((size_t)p->seq_q + nr - 1) / nr, fwd_st_rows(plan)};
    size_t heads = (size_t)(p->batch * p->heads_q);
    if (p->dtype != FMHA_DTYPE_F32) {
        size_t bc = plan->uk->block_kv, tiles = ((size_t)p->seq_kv + bc - 1) / bc;
        fmha_parallel_for((size_t)(p->batch * p->heads_kv) * tiles, plan->threads, fwd_kv_pack_task, &c);
    }
    if (plan->strategy == FMHA_STRATEGY_DENSE)
        fmha_parallel_for(heads, plan->threads, fwd_dense_task, &c);
    else
        fmha_parallel_for(heads * c.q_blocks, plan->threads, fwd_tiled_task, &c);
    return FMHA_OK;
}
