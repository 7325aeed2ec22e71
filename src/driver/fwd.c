/* fwd.c: the forward pass, O = softmax(scale Q K^T, masked) V, for the
 * tiled and dense strategies. Tiles and threads live here; arithmetic lives
 * in the microkernels (uk/ukernel.h), and how operands are packed and
 * multiplied in the plan's operand path (operand.h): no dtype test here.
 * Scores are kept transposed, S^T [keys][NR queries], so the softmax runs
 * lane-wise and K and V are the GEMMs' broadcast operand (float32: K read
 * from the caller's memory, V too unless the path copies it).
 *
 * Tiled, per task (batch b, query head h, block of NR queries):
 *   Q^T = pack(Q_blk); m = -inf; l = 0; O^T = 0
 *   for each key tile the mask does not rule out:
 *     S^T = scale K_tile Q^T; epilogue; (m, l, alpha) = online softmax;
 *     O^T = O^T alpha + V_tile^T P^T
 *   O = (O^T / l)^T; lse = m + log l          (l == 0: O = 0, lse = -inf;
 *                                             a sink joins l: fmha_row_finish)
 * Dense, per task (b, h): all of the head's scores S^T [Skv][Sq] are
 * materialised, softmaxed exactly (one pass over all keys), then multiplied
 * by V: the O(S^2) strategy, the quickest when everything fits in cache.
 * Every output element is produced by exactly one task in a fixed order, so
 * results do not depend on the thread count. */
#include <math.h>
#include <string.h>

#include "core/attn.h"
#include "format/format.h"
#include "runtime/convert.h"
#include "runtime/pool.h"
#include "operand.h"

/* Scratch of one query block (each piece FMHA_ALIGN aligned):
 *   qt [panels] packed Q^T blocks (the path's format), st [panels][st_rows][NR],
 *   ot [Dv][NR], m/l/alpha [NR], pscratch (the value product's), mask [Bc][NR],
 *   seen [st_rows] (the guarded pass's lanes per key), orows [NR][Dv]
 *   (float32 rows of a bf16 or f16 output before narrowing) */
typedef struct fwd_block_scratch {
    char *qt;
    float *st, *ot, *m, *l, *alpha, *orows;
    void *pscratch;
    unsigned char *mask;
    uint64_t *seen;  /* bit i of key r: lane i's score is not -inf */
    size_t qt_bytes; /* bytes between panels of qt */
} fwd_block_scratch;

typedef struct fwd_ctx {
    const fmha_plan *plan;
    const fmha_operand_path *path;
    const void *q, *k, *v;
    void *o;
    float *lse;
    char *ws;
    /* K and V of every (b, kv head) as the path packs them (kv_unit bytes
     * each), in the shared workspace; NULL when read in place */
    char *kv_packed;
    size_t kv_unit;
    size_t q_blocks;  /* query blocks per head */
} fwd_ctx;

static size_t fwd_panels(const fmha_plan *plan) {
    size_t nr = plan->uk->tile.nr;
    return plan->strategy == FMHA_STRATEGY_DENSE ? ((size_t)plan->p.seq_q + nr - 1) / nr : 1;
}

/* Rows of st: block_kv (tiled) or Skv (dense: the whole head's scores). */
static size_t fwd_st_rows(const fmha_plan *plan) {
    return plan->strategy == FMHA_STRATEGY_DENSE ? (size_t)plan->p.seq_kv : plan->uk->tile.block_kv;
}

/* Carves (or measures, c->base NULL) one thread's scratch. */
static void fwd_carve(const fmha_plan *plan, fmha_carver *c, fwd_block_scratch *s) {
    size_t nr = plan->uk->tile.nr, panels = fwd_panels(plan), st_rows = fwd_st_rows(plan);
    s->qt_bytes = fmha_round_up(plan->path->q_bytes(plan), FMHA_ALIGN);
    s->qt = fmha_carve(c, s->qt_bytes * panels);
    s->st = fmha_carve(c, st_rows * nr * panels * sizeof(float));
    s->ot = fmha_carve(c, (size_t)plan->p.head_dim_v * nr * sizeof(float));
    s->m = fmha_carve(c, nr * sizeof(float));
    s->l = fmha_carve(c, nr * sizeof(float));
    s->alpha = fmha_carve(c, nr * sizeof(float));
    s->pscratch = fmha_carve(c, plan->path->p_bytes(plan, st_rows));
    s->mask = fmha_carve(c, fmha_mask_scratch_bytes(plan));
    s->seen = fmha_carve(c, st_rows * sizeof(uint64_t));
    s->orows = fmha_carve(c, plan->o_dtype == FMHA_DTYPE_F32 ? 0 : nr * (size_t)plan->p.head_dim_v * sizeof(float));
}

/* Shared: [Toeplitz bias vectors][packed K and V of every (b, kv head)]. */
static void fwd_carve_shared(const fmha_plan *plan, fmha_carver *c, char **bias, char **kv) {
    *bias = fmha_carve(c, fmha_bias_shared_bytes(plan));
    *kv = fmha_carve(c, (size_t)(plan->p.batch * plan->p.heads_kv) * plan->path->kv_unit_bytes(plan));
}

fmha_ws_size fmha_tiled_workspace(const fmha_plan *plan) {
    fmha_carver t = {0}, sh = {0};
    fwd_block_scratch s;
    char *bias, *kv;
    fwd_carve(plan, &t, &s);
    fwd_carve_shared(plan, &sh, &bias, &kv);
    return (fmha_ws_size){t.used, sh.used};
}

/* O[b, q0 + i, h, :] = ot[:, i] / l[i]; lse[b, h, q0 + i] = m + log l (with
 * the head's sink in l when there are sinks), for every row, or (only set)
 * the rows with only[i]. With `bad` it also marks the rows whose sum is
 * finite but whose output is not (a NaN or inf from V, seen or hidden: the
 * caller redoes them guarded) and returns how many. */
static size_t fwd_finish(const fmha_plan *plan, int64_t b, int64_t h, int64_t q0, int64_t nq,
                         const fwd_block_scratch *s, void *o, float *lse, const unsigned char *only,
                         unsigned char *bad) {
    const int64_t *os = plan->p.o_strides;
    size_t nr = plan->uk->tile.nr, n_bad = 0;
    int64_t Dv = plan->p.head_dim_v;
    const float *ot = s->ot;
    float *of = plan->o_dtype == FMHA_DTYPE_F32 ? o : NULL; /* float32: no conversion */
    if ((!of || os[3] == 1) && !only) { /* the kernel */
        float scale[FMHA_MAX_NR];
        for (int64_t i = 0; i < nq; i++) {
            float row_lse;
            fmha_row_finish(plan, h, s->m[i], s->l[i], &scale[i], &row_lse);
            if (lse) lse[(b * plan->p.heads_q + h) * plan->p.seq_q + q0 + i] = row_lse;
        }
        int64_t first = b * os[0] + q0 * os[1] + h * os[2];
        /* float32: straight into O; else float32 rows, then narrowed */
        uint64_t nonfinite = plan->uk->rows.finish((size_t)nq, (size_t)Dv, ot, nr, scale,
                                                  of ? of + first : s->orows, of ? (size_t)os[1] : (size_t)Dv);
        for (int64_t i = 0; !of && i < nq; i++)
            fmha_store_row_uk(plan->uk, o, plan->o_dtype, first + i * os[1], os[3], Dv,
                              s->orows + (size_t)i * (size_t)Dv, 1.0f);
        for (int64_t i = 0; bad && i < nq; i++) {
            bad[i] = (nonfinite >> i & 1) && isfinite(s->l[i]);
            n_bad += bad[i];
        }
        return n_bad;
    }
    for (int64_t i = 0; i < nq; i++) {
        if (bad) bad[i] = 0;
        if (only && !only[i]) continue;
        float inv, row_lse;
        fmha_row_finish(plan, h, s->m[i], s->l[i], &inv, &row_lse);
        int64_t row = b * os[0] + (q0 + i) * os[1] + h * os[2];
        float finite = 0.0f; /* x * 0 is 0 for finite x, NaN otherwise */
        for (int64_t c = 0; c < Dv; c++) {
            float x = ot[(size_t)c * nr + (size_t)i] * inv;
            finite += x * 0.0f;
            if (of) of[row + c * os[3]] = x;
            else fmha_store(o, plan->o_dtype, row + c * os[3], x);
        }
        if (lse) lse[(b * plan->p.heads_q + h) * plan->p.seq_q + q0 + i] = row_lse;
        if (bad && finite != 0.0f && isfinite(s->l[i])) {
            bad[i] = 1;
            n_bad++;
        }
    }
    return n_bad;
}

/* Pre-pass task (b, kv head, key tile): the path packs that tile's keys. */
static void fwd_kv_pack_task(void *vctx, size_t task, int thread) {
    const fwd_ctx *c = vctx;
    const fmha_plan *plan = c->plan;
    const fmha_problem *p = &plan->p;
    size_t bc = plan->uk->tile.block_kv, tiles = ((size_t)p->seq_kv + bc - 1) / bc;
    size_t unit = task / tiles;
    int64_t k0 = (int64_t)((task % tiles) * bc);
    int64_t nk = p->seq_kv - k0 < (int64_t)bc ? p->seq_kv - k0 : (int64_t)bc;
    c->path->kv_pack(plan, c->k, c->v, (int64_t)unit / p->heads_kv, (int64_t)unit % p->heads_kv, k0,
                     nk, c->kv_packed + unit * c->kv_unit);
}

/* K and V views of keys k0.. of (b, kv head hk). */
static void fwd_kv_views(const fwd_ctx *c, int64_t b, int64_t hk, int64_t k0, fmha_kv_view *kv,
                         fmha_kv_view *vv) {
    const char *unit = c->kv_packed ? c->kv_packed + (size_t)(b * c->plan->p.heads_kv + hk) * c->kv_unit
                                    : NULL;
    c->path->kv_views(c->plan, c->k, c->v, unit, b, hk, k0, kv, vv);
}

static void fwd_reset(size_t nr, int64_t Dv, fwd_block_scratch *s) {
    for (size_t i = 0; i < nr; i++) {
        s->m[i] = -INFINITY;
        s->l[i] = 0.0f;
    }
    memset(s->ot, 0, (size_t)Dv * nr * sizeof(float));
}

/* Task -> (b, h, query block), head-major: the query blocks of one head run
 * back to back (on every thread at once), so its K and V stay in cache
 * between them; block-major order streamed every head's K and V from memory
 * once per block (S = 2048 fwd 7-10% slower, S = 4096 13-17%). Causal heads
 * start with their longest rows. */
static void fwd_task_coords(const fwd_ctx *c, size_t task, int64_t *b, int64_t *h, int64_t *qb) {
    const fmha_problem *p = &c->plan->p;
    size_t blk = task % c->q_blocks, bh = task / c->q_blocks;
    if (p->causal != FMHA_CAUSAL_NONE) blk = c->q_blocks - 1 - blk;
    *b = (int64_t)(bh / (size_t)p->heads_q);
    *h = (int64_t)(bh % (size_t)p->heads_q);
    *qb = (int64_t)blk;
}

/* seen[r] = the lanes i whose score st[r][i] (before the softmax) is not
 * -inf: the keys lane i sees. */
static void fwd_seen(size_t nk, size_t nr, const float *st, uint64_t *seen) {
    for (size_t r = 0; r < nk; r++) {
        uint64_t bits = 0;
        for (size_t i = 0; i < nr; i++) bits |= (uint64_t)(st[r * nr + i] != -INFINITY) << i;
        seen[r] = bits;
    }
}

/* ot[c][i] = ot[c][i] alpha[i] + sum of P[r][i] V[r][c] over the keys lane
 * i sees (seen, fwd_seen), for the lanes i marked in `lanes`: the value
 * product without the 0 * V terms of hidden keys, read from the caller's V.
 * A seen key whose P underflowed to 0 still multiplies its V (0 x NaN is
 * NaN), as the unguarded product does. */
static void fwd_values_guarded(const fwd_ctx *c, int64_t b, int64_t hk, int64_t k0, int64_t nk,
                               const float *pt, const uint64_t *seen, const float *alpha,
                               const unsigned char *lanes, float *ot) {
    const fmha_problem *p = &c->plan->p;
    const int64_t *vs = p->v_strides;
    const fmha_cache_format *vf = fmha_cache_format_at(c->plan->v_format);
    size_t nr = c->plan->uk->tile.nr;
    for (size_t i = 0; i < nr; i++) {
        if (!lanes[i]) continue;
        for (int64_t col = 0; col < p->head_dim_v; col++) {
            float acc = ot[(size_t)col * nr + i] * alpha[i];
            for (int64_t r = 0; r < nk; r++) {
                float pr = pt[(size_t)r * nr + i];
                if (seen[r] >> i & 1) { /* rare (a NaN or inf row): V's scale fetched per key */
                    float v_sc;
                    fmha_kv_scales_of(p, 1, b, hk, k0 + r, 1, &v_sc);
                    acc += pr * v_sc * fmha_format_value(vf, c->v, b * vs[0] + (k0 + r) * vs[1] + hk * vs[2], col, vs[3]);
                }
            }
            ot[(size_t)col * nr + i] = acc;
        }
    }
}

/* One pass of query block (b, h, q0..q0+nq) over its key tiles into s
 * (ot, m, l). With `lanes` the value product runs guarded for those lanes
 * only (the others are left unfinished). Returns the tiles computed. */
static long long fwd_block_pass(const fwd_ctx *c, fwd_block_scratch *s, int64_t b, int64_t h, int64_t q0,
                                int64_t nq, int thread, const unsigned char *lanes) {
    const fmha_plan *plan = c->plan;
    const fmha_operand_path *path = c->path;
    const fmha_ukernels *uk = plan->uk;
    size_t nr = uk->tile.nr;
    int64_t bc = (int64_t)uk->tile.block_kv, hk = h / plan->group;
    fwd_reset(nr, plan->p.head_dim_v, s);
    /* Key tiles sit on the grid k0 = multiple of Bc, so every strategy and
     * pass shows a mask the same tiles. */
    fmha_tile_pos t = {b, h, q0, nq, 0, 0};
    int64_t kb, ke;
    long long computed = 0;
    fmha_mask_kv_range(plan, &t, &kb, &ke);
    for (int64_t k0 = kb / bc * bc; k0 < ke; k0 += bc) {
        /* the last tile ends at ke: keys no query of the block sees (past
         * its length, or past the band) are never read */
        t.k0 = k0;
        t.nk = ke - k0 < bc ? ke - k0 : bc;
        int cls = fmha_mask_classify(plan, &t, thread);
        if (cls == FMHA_TILE_EMPTY) continue;
        if (cls < 0) cls = FMHA_TILE_PARTIAL;
        computed++;
        fmha_kv_view kv, vv;
        fwd_kv_views(c, b, hk, k0, &kv, &vv);
        path->scores(plan, kv, t.nk, s->qt, s->st);
        if (cls == FMHA_TILE_PARTIAL || plan->has_bias)
            fmha_score_epilogue(plan, &t, (fmha_tile_class)cls, s->st, nr, NULL, s->mask, thread);
        if (plan->softmax_pairs && !lanes) { /* P straight into the value product's pairs */
            plan->softmax_pairs((size_t)t.nk, s->st, nr, s->m, s->l, s->alpha, s->pscratch);
            path->values_paired(plan, vv, t.nk, s->pscratch, s->ot, FMHA_UK_RESCALE, s->alpha);
            continue;
        }
        if (lanes) fwd_seen((size_t)t.nk, nr, s->st, s->seen);
        plan->softmax((size_t)t.nk, s->st, nr, s->m, s->l, s->alpha);
        if (plan->dropout) fmha_dropout_tile(plan, &t, s->st, nr); /* after l has summed P */
        if (lanes)
            fwd_values_guarded(c, b, hk, k0, t.nk, s->st, s->seen, s->alpha, lanes, s->ot);
        else
            path->values(plan, vv, t.nk, s->st, s->pscratch, s->ot, FMHA_UK_RESCALE, s->alpha);
    }
    return computed;
}

static void fwd_tiled_task(void *vctx, size_t task, int thread) {
    const fwd_ctx *c = vctx;
    const fmha_plan *plan = c->plan;
    size_t nr = plan->uk->tile.nr;
    int64_t b, h, qb;
    fwd_task_coords(c, task, &b, &h, &qb);
    int64_t q0 = qb * (int64_t)nr;
    int64_t nq = plan->p.seq_q - q0 < (int64_t)nr ? plan->p.seq_q - q0 : (int64_t)nr;

    fwd_block_scratch s;
    fmha_carver carver = {c->ws + (size_t)thread * plan->thread_bytes, 0};
    fwd_carve(plan, &carver, &s);
    c->path->q_pack(plan, c->q, b, h, q0, nq, s.qt);
    long long computed = fwd_block_pass(c, &s, b, h, q0, nq, thread, NULL);
    unsigned char lanes[FMHA_MAX_NR] = {0};
    if (fwd_finish(plan, b, h, q0, nq, &s, c->o, c->lse, NULL, lanes)) {
        /* rare: replay the block with the guarded value product for those
         * lanes (the same scores and softmax), then finish them again */
        fwd_block_pass(c, &s, b, h, q0, nq, thread, lanes);
        fwd_finish(plan, b, h, q0, nq, &s, c->o, c->lse, lanes, NULL);
    }
    fmha_tiles_count(computed);
}

/* Panel pi's scores (queries q0 = pi NR on) over keys [0, ke) into its part
 * of st [panels][Skv][NR], masked and biased tile by tile on the tiled grid. */
static void fwd_dense_scores(const fwd_ctx *c, fwd_block_scratch *s, fmha_kv_view kv, int64_t b, int64_t h,
                             size_t pi, int64_t ke, int thread) {
    const fmha_plan *plan = c->plan;
    const size_t nr = plan->uk->tile.nr;
    const int64_t bc = (int64_t)plan->uk->tile.block_kv, q0 = (int64_t)(pi * nr);
    const int64_t nq = plan->p.seq_q - q0 < (int64_t)nr ? plan->p.seq_q - q0 : (int64_t)nr;
    float *st = s->st + pi * (size_t)plan->p.seq_kv * nr;
    char *qt = s->qt + pi * s->qt_bytes;
    c->path->q_pack(plan, c->q, b, h, q0, nq, qt);
    c->path->scores(plan, kv, ke, qt, st);
    for (int64_t k0 = 0; k0 < ke; k0 += bc) {
        fmha_tile_pos t = {b, h, q0, nq, k0, ke - k0 < bc ? ke - k0 : bc};
        int cls = fmha_mask_classify(plan, &t, thread);
        if (cls < 0) cls = FMHA_TILE_PARTIAL;
        float *tile = st + (size_t)k0 * nr;
        if (cls == FMHA_TILE_EMPTY) {
            for (size_t e = 0; e < (size_t)t.nk * nr; e++) tile[e] = -INFINITY;
        } else if (cls == FMHA_TILE_PARTIAL || plan->has_bias) {
            fmha_score_epilogue(plan, &t, (fmha_tile_class)cls, tile, nr, NULL, s->mask, thread);
        }
    }
}

static void fwd_dense_task(void *vctx, size_t task, int thread) {
    const fwd_ctx *c = vctx;
    const fmha_plan *plan = c->plan;
    const fmha_operand_path *path = c->path;
    const fmha_ukernels *uk = plan->uk;
    size_t nr = uk->tile.nr, panels = c->q_blocks;
    int64_t skv = plan->p.seq_kv;
    int64_t b = (int64_t)task / plan->p.heads_q, h = (int64_t)task % plan->p.heads_q;
    int64_t hk = h / plan->group;

    /* qt [panels] blocks, st [panels][Skv][NR]: the whole head's scores */
    fwd_block_scratch s;
    fmha_carver carver = {c->ws + (size_t)thread * plan->thread_bytes, 0};
    fwd_carve(plan, &carver, &s);
    size_t st_panel = (size_t)skv * nr;
    fmha_kv_view kv, vv;
    fwd_kv_views(c, b, hk, 0, &kv, &vv);
    /* keys [0, ke): past ke no query of the head sees a key, and none is read */
    fmha_tile_pos head = {b, h, 0, plan->p.seq_q, 0, 0};
    int64_t kb, ke;
    fmha_mask_kv_range(plan, &head, &kb, &ke);
    if (ke == 0) { /* no key at all: every row is fully masked */
        for (size_t pi = 0; pi < panels; pi++) {
            int64_t q0 = (int64_t)(pi * nr);
            fwd_reset(nr, plan->p.head_dim_v, &s);
            fwd_finish(plan, b, h, q0, plan->p.seq_q - q0 < (int64_t)nr ? plan->p.seq_q - q0 : (int64_t)nr,
                       &s, c->o, c->lse, NULL, NULL);
        }
        return;
    }
    for (size_t pi = 0; pi < panels; pi++) fwd_dense_scores(c, &s, kv, b, h, pi, ke, thread);
    for (size_t pi = 0; pi < panels; pi++) {
        int64_t q0 = (int64_t)(pi * nr);
        int64_t nq = plan->p.seq_q - q0 < (int64_t)nr ? plan->p.seq_q - q0 : (int64_t)nr;
        fwd_reset(nr, 0, &s);
        plan->softmax((size_t)ke, s.st + pi * st_panel, nr, s.m, s.l, s.alpha);
        path->values(plan, vv, ke, s.st + pi * st_panel, s.pscratch, s.ot, FMHA_UK_STORE, NULL);
        unsigned char lanes[FMHA_MAX_NR] = {0};
        if (fwd_finish(plan, b, h, q0, nq, &s, c->o, c->lse, NULL, lanes)) {
            /* rare: the panel's scores again, the keys each lane sees, the
             * same softmax, then the guarded value product (fwd_tiled_task) */
            fwd_dense_scores(c, &s, kv, b, h, pi, ke, thread);
            fwd_seen((size_t)ke, nr, s.st + pi * st_panel, s.seen);
            fwd_reset(nr, 0, &s);
            plan->softmax((size_t)ke, s.st + pi * st_panel, nr, s.m, s.l, s.alpha);
            for (size_t i = 0; i < nr; i++)
                for (int64_t col = 0; lanes[i] && col < plan->p.head_dim_v; col++) s.ot[(size_t)col * nr + i] = 0.0f;
            fwd_values_guarded(c, b, hk, 0, ke, s.st + pi * st_panel, s.seen, s.alpha, lanes, s.ot);
            fwd_finish(plan, b, h, q0, nq, &s, c->o, c->lse, lanes, NULL);
        }
    }
}

void fmha_tiled_run(fmha_plan *run, const void *q, const void *k, const void *v, void *o, float *lse,
                    char *ws) {
    const fmha_problem *p = &run->p;
    fmha_carver sh = {ws + (size_t)run->threads * run->thread_bytes, 0};
    char *bias, *kv;
    fwd_carve_shared(run, &sh, &bias, &kv);
    fmha_bias_prepare(run, bias);
    size_t nr = run->uk->tile.nr;
    fwd_ctx c = {run, run->path, q, k, v, o, lse, ws, NULL, run->path->kv_unit_bytes(run),
                 ((size_t)p->seq_q + nr - 1) / nr};
    size_t heads = (size_t)(p->batch * p->heads_q);
    if (c.kv_unit) {
        c.kv_packed = kv;
        size_t bc = run->uk->tile.block_kv, tiles = ((size_t)p->seq_kv + bc - 1) / bc;
        fmha_run_parallel(run, (size_t)(p->batch * p->heads_kv) * tiles, fwd_kv_pack_task, &c);
    }
    if (run->strategy == FMHA_STRATEGY_DENSE)
        fmha_run_parallel(run, heads, fwd_dense_task, &c);
    else
        fmha_run_parallel(run, heads * c.q_blocks, fwd_tiled_task, &c);
}
