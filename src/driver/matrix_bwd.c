/* matrix_bwd.c: the backward on a matrix engine, the table's matrix part
 * (AMX tiles; kernel and layouts in uk/ukernel.h, derivation in
 * uk/amx/attn_bwd.c). This driver holds the threads, the work split and
 * the workspace; the part holds every tile instruction.
 *
 * Serves bf16 Q, K, V (and O, dO) at precision FAST (P and dS rounded to
 * bf16) and ACCURATE (each also as its bf16 residual), float16 at any
 * precision and float32 at BF16X3 (every operand split into bf16 hi + lo
 * at packing, P and dS too: three terms a product, as the forward) and
 * float32 at BF16 (every operand rounded to bf16) with the causal/window
 * band and query/key lengths as the only masks, no bias, softcap or
 * dropout (fmha_matrix_bwd_plan); the tiled backward (bwd.c) serves the
 * rest, and a call whose K or V holds a NaN or an infinity (its guarded
 * products keep hidden keys out of the gradients; checked by the part
 * before anything is written).
 *
 * Work split as bwd.c's, so the bits do not depend on the thread count:
 * key blocks of MATRIX_BWD_BK keys dealt to G fixed groups (block j to
 * group j mod G); a task (b, kv head, g) owns dK, dV of its blocks and
 * adds dQ into the group's float32 buffer; a last pass sums the groups in
 * order and scales.
 *   pre-pass, (b, query head): lse, Dsum = rowsum(dO O) in float64, and
 *     every query block packed: Q (negated for a negative scale) and dO as
 *     the forward packs Q, Q^T and dO^T as X^T blocks, each row's keys;
 *   task: per key block, K (as the forward's), V (as K) and K (as V)
 *     packed, dV^T and dK^T zeroed, every query block of the group's heads
 *     that sees the block through the part 4 at a time, then
 *     dK = scale dK^T^T and dV = dV^T^T stored as rows. */
#include <math.h>
#include <string.h>

#include "core/attn.h"
#include "runtime/convert.h"
#include "runtime/pool.h"
#include "config/tuning.h"

enum { MBWD_BQ = FMHA_MATRIX_BLOCK_Q, MBWD_BK = 128, MBWD_GROUP_QB = 4, MBWD_TARGET_TASKS = 8 };

/* How the operands reach the tiles: their format (FMHA_MATRIX_SRC_*), split
 * (each operand as bf16 hi + lo, three terms a product), and P's and dS's
 * residuals (split, and bf16 at ACCURATE); 0 when the tiles do not serve. */
typedef struct mbwd_mode {
    int src, split, residual;
    size_t bytes; /* an element's */
} mbwd_mode;

static int mbwd_mode_of(const fmha_plan *plan, mbwd_mode *m) {
    switch (plan->p.dtype) {
    case FMHA_DTYPE_BF16:
        if (plan->precision != FMHA_PRECISION_FAST && plan->precision != FMHA_PRECISION_ACCURATE) return 0;
        if (plan->precision == FMHA_PRECISION_ACCURATE && !plan->uk->tuning->matrix_backward_accurate) return 0;
        *m = (mbwd_mode){FMHA_MATRIX_SRC_BF16, 0, plan->precision == FMHA_PRECISION_ACCURATE, 2};
        return 1;
    case FMHA_DTYPE_F16:
        if (!plan->uk->tuning->matrix_backward_split) return 0;
        *m = (mbwd_mode){FMHA_MATRIX_SRC_F16, 1, 1, 2};
        return 1;
    case FMHA_DTYPE_F32:
        if (plan->precision != FMHA_PRECISION_BF16X3 && plan->precision != FMHA_PRECISION_BF16) return 0;
        if (!plan->uk->tuning->matrix_backward_split) return 0;
        *m = (mbwd_mode){FMHA_MATRIX_SRC_F32, plan->precision == FMHA_PRECISION_BF16X3,
                         plan->precision == FMHA_PRECISION_BF16X3, 4};
        return 1;
    }
    return 0;
}

int fmha_matrix_bwd_plan(const fmha_plan *plan) {
    const fmha_problem *p = &plan->p;
    const fmha_masks *m = &p->masks;
    mbwd_mode mode;
    if (!plan->uk->matrix.backward || !mbwd_mode_of(plan, &mode) || !fmha_plan_kv_as_q(plan)) return 0;
    if (p->strategy == FMHA_STRATEGY_PORTABLE) return 0;
    if (p->block_table || plan->has_bias || plan->dropout || p->sinks) return 0;
    return !(m->q_segment_ids || m->dense || m->callback.fill);
}

/* Sizes of the run. */
typedef struct mbwd_dims {
    size_t dp, dpv, dvp, dr;     /* fmha_matrix_dp(D), _dp(Dv), _dvp(Dv), _dvp(D) */
    size_t q_blocks, kv_blocks, groups, units;
    mbwd_mode mode;
} mbwd_dims;

static mbwd_dims mbwd_dims_of(const fmha_plan *plan) {
    const fmha_problem *p = &plan->p;
    mbwd_dims d;
    d.dp = fmha_matrix_dp((size_t)p->head_dim);
    d.dpv = fmha_matrix_dp((size_t)p->head_dim_v);
    d.dvp = fmha_matrix_dvp((size_t)p->head_dim_v);
    d.dr = fmha_matrix_dvp((size_t)p->head_dim);
    d.q_blocks = ((size_t)p->seq_q + MBWD_BQ - 1) / MBWD_BQ;
    d.kv_blocks = ((size_t)p->seq_kv + MBWD_BK - 1) / MBWD_BK;
    d.units = (size_t)(p->batch * p->heads_kv);
    d.groups = (MBWD_TARGET_TASKS + d.units - 1) / d.units;
    if (d.groups > d.kv_blocks) d.groups = d.kv_blocks;
    if (d.groups < 1) d.groups = 1;
    d.mode = (mbwd_mode){FMHA_MATRIX_SRC_BF16, 0, 0, 2}; /* a plan the tiles do not serve: no buffers past bf16's */
    mbwd_mode_of(plan, &d.mode);
    return d;
}

/* A packed query block: its four operands (and their residuals for split
 * operands, else NULL), lse, Dsum and each row's keys. */
typedef struct mbwd_qblock {
    uint32_t *q, *d_o, *qt, *d_ot;       /* Q, dO: [steps][32][16]; Q^T, dO^T: [rows / 16][16][16] */
    uint32_t *q_lo, *d_o_lo, *qt_lo, *d_ot_lo;
    float *lse, *dsum;
    int64_t *lo, *hi;
} mbwd_qblock;

/* bytes carved when `on`, else nothing and NULL: the buffers only split
 * operands or residuals use. */
static void *mbwd_carve_if(fmha_carver *c, int on, size_t bytes) { return on ? fmha_carve(c, bytes) : NULL; }

static void mbwd_qblock_carve(const mbwd_dims *d, fmha_carver *c, mbwd_qblock *b) {
    b->q = fmha_carve(c, d->dp * MBWD_BQ * sizeof(uint32_t));
    b->d_o = fmha_carve(c, d->dpv * MBWD_BQ * sizeof(uint32_t));
    b->qt = fmha_carve(c, d->dr * 16 * sizeof(uint32_t));
    b->d_ot = fmha_carve(c, d->dvp * 16 * sizeof(uint32_t));
    const int lo = d->mode.split;
    b->q_lo = mbwd_carve_if(c, lo, d->dp * MBWD_BQ * sizeof(uint32_t));
    b->d_o_lo = mbwd_carve_if(c, lo, d->dpv * MBWD_BQ * sizeof(uint32_t));
    b->qt_lo = mbwd_carve_if(c, lo, d->dr * 16 * sizeof(uint32_t));
    b->d_ot_lo = mbwd_carve_if(c, lo, d->dvp * 16 * sizeof(uint32_t));
    b->lse = fmha_carve(c, MBWD_BQ * sizeof(float));
    b->dsum = fmha_carve(c, MBWD_BQ * sizeof(float));
    b->lo = fmha_carve(c, MBWD_BQ * sizeof(int64_t));
    b->hi = fmha_carve(c, MBWD_BQ * sizeof(int64_t));
}

static size_t mbwd_qblock_bytes(const mbwd_dims *d) {
    fmha_carver c = {0};
    mbwd_qblock b;
    mbwd_qblock_carve(d, &c, &b);
    return c.used;
}

/* Per thread: one key block's operands and accumulators, the part's
 * scratch for 4 query blocks, a transposed row block, a Dsum row pair. */
typedef struct mbwd_scratch {
    uint32_t *kp, *vk, *kv;      /* [BK dp], [BK dpv], [BK / 2 dr] words */
    uint32_t *kp_lo, *vk_lo, *kv_lo; /* split operands: their residuals alike, else NULL */
    float *dvt, *dkt;            /* [dvp][BK], [dr][BK] */
    float *s, *dp;               /* [4][32][BK] */
    uint32_t *p_pairs, *ds_pairs;/* [4][16][BK] */
    uint16_t *ds;                /* [4][32][BK] */
    uint32_t *p_lo_pairs, *ds_lo_pairs; /* [4][16][BK] with residuals (mode.residual): P's and dS's pairs */
    uint16_t *ds_lo;             /* [4][32][BK] with residuals: dS's residual rows */
    float *rows;                 /* [BK][max(dr, dvp)]: dK or dV as rows */
    float *o_row, *do_row;       /* [Dv] */
} mbwd_scratch;

static void mbwd_carve(const fmha_plan *plan, const mbwd_dims *d, fmha_carver *c, mbwd_scratch *s) {
    const size_t bk = MBWD_BK, g = MBWD_GROUP_QB, wide = d->dr > d->dvp ? d->dr : d->dvp;
    s->kp = fmha_carve(c, bk * d->dp * sizeof(uint32_t));
    s->vk = fmha_carve(c, bk * d->dpv * sizeof(uint32_t));
    s->kv = fmha_carve(c, bk / 2 * d->dr * sizeof(uint32_t));
    const int split = d->mode.split;
    s->kp_lo = mbwd_carve_if(c, split, bk * d->dp * sizeof(uint32_t));
    s->vk_lo = mbwd_carve_if(c, split, bk * d->dpv * sizeof(uint32_t));
    s->kv_lo = mbwd_carve_if(c, split, bk / 2 * d->dr * sizeof(uint32_t));
    s->dvt = fmha_carve(c, d->dvp * bk * sizeof(float));
    s->dkt = fmha_carve(c, d->dr * bk * sizeof(float));
    s->s = fmha_carve(c, g * MBWD_BQ * bk * sizeof(float));
    s->dp = fmha_carve(c, g * MBWD_BQ * bk * sizeof(float));
    s->p_pairs = fmha_carve(c, g * 16 * bk * sizeof(uint32_t));
    s->ds_pairs = fmha_carve(c, g * 16 * bk * sizeof(uint32_t));
    s->ds = fmha_carve(c, g * MBWD_BQ * bk * sizeof(uint16_t));
    const int lo = d->mode.residual; /* the residuals' buffers */
    s->p_lo_pairs = mbwd_carve_if(c, lo, g * 16 * bk * sizeof(uint32_t));
    s->ds_lo_pairs = mbwd_carve_if(c, lo, g * 16 * bk * sizeof(uint32_t));
    s->ds_lo = mbwd_carve_if(c, lo, g * MBWD_BQ * bk * sizeof(uint16_t));
    s->rows = fmha_carve(c, bk * wide * sizeof(float));
    s->o_row = fmha_carve(c, (size_t)plan->p.head_dim_v * sizeof(float));
    s->do_row = fmha_carve(c, (size_t)plan->p.head_dim_v * sizeof(float));
}

/* A group's dQ: [B, Hq, q_blocks * 32, dr] (whole query blocks: the tiles
 * store 32 rows). */
static size_t mbwd_dq_floats(const fmha_plan *plan, const mbwd_dims *d) {
    return (size_t)(plan->p.batch * plan->p.heads_q) * d->q_blocks * MBWD_BQ * d->dr;
}

/* Shared: [packed query blocks][dQ_0 .. dQ_{G-1}][a flag: K or V not finite]. */
static void mbwd_carve_shared(const fmha_plan *plan, const mbwd_dims *d, fmha_carver *c, char **qblocks,
                              float **dq_part, int **nonfinite) {
    const size_t n_qb = (size_t)(plan->p.batch * plan->p.heads_q) * d->q_blocks;
    *qblocks = fmha_carve(c, n_qb * mbwd_qblock_bytes(d));
    *dq_part = fmha_carve(c, d->groups * fmha_round_up(mbwd_dq_floats(plan, d) * sizeof(float), FMHA_ALIGN));
    *nonfinite = fmha_carve(c, d->units * sizeof(int));
}

fmha_ws_size fmha_matrix_bwd_workspace(const fmha_plan *plan) {
    const mbwd_dims d = mbwd_dims_of(plan);
    fmha_carver t = {0}, sh = {0};
    mbwd_scratch s;
    char *qb;
    float *dq;
    int *nf;
    mbwd_carve(plan, &d, &t, &s);
    mbwd_carve_shared(plan, &d, &sh, &qb, &dq, &nf);
    return (fmha_ws_size){t.used, sh.used};
}

typedef struct mbwd_ctx {
    const fmha_plan *plan;
    mbwd_dims d;
    const char *q, *k, *v, *o, *d_o;
    const float *lse;
    void *dq, *dk, *dv;
    char *ws, *qblocks;
    float *dq_part;
    size_t dq_group_floats, qblock_bytes;
    int *nonfinite;
} mbwd_ctx;

static mbwd_qblock mbwd_qblock_at(const mbwd_ctx *c, int64_t b, int64_t h, size_t qb) {
    const size_t index = ((size_t)(b * c->plan->p.heads_q + h)) * c->d.q_blocks + qb;
    fmha_carver cv = {c->qblocks + index * c->qblock_bytes, 0};
    mbwd_qblock blk;
    mbwd_qblock_carve(&c->d, &cv, &blk);
    return blk;
}

static mbwd_scratch mbwd_scratch_of(const mbwd_ctx *c, int thread) {
    fmha_carver cv = {c->ws + (size_t)thread * c->plan->thread_bytes, 0};
    mbwd_scratch s;
    mbwd_carve(c->plan, &c->d, &cv, &s);
    return s;
}

/* Task (b, kv head): 1 in nonfinite[unit] when its K or V holds a NaN or
 * an infinity (as bf16: a float32 past bf16's range counts), or, for split
 * operands, the Q or dO rows of its heads (an infinity's residual is NaN). */
static void mbwd_check_task(void *vctx, size_t task, int thread) {
    const mbwd_ctx *c = vctx;
    const fmha_problem *p = &c->plan->p;
    const int64_t b = (int64_t)task / p->heads_kv, hk = (int64_t)task % p->heads_kv;
    const int64_t *ks = p->k_strides, *vs = p->v_strides, *qs = p->q_strides, *os = p->o_strides;
    const int64_t es = (int64_t)c->d.mode.bytes, src = c->d.mode.src;
    const int64_t kv_len = p->masks.kv_lengths ? p->masks.kv_lengths[b] : p->seq_kv; /* past it: never read */
    const fmha_uk_matrix *mx = &c->plan->uk->matrix;
    int bad = mx->nonfinite((size_t)kv_len, (size_t)p->head_dim, c->k + (b * ks[0] + hk * ks[2]) * es, (int)src,
                            ks[1], ks[3]) ||
              mx->nonfinite((size_t)kv_len, (size_t)p->head_dim_v, c->v + (b * vs[0] + hk * vs[2]) * es, (int)src,
                            vs[1], vs[3]);
    const int64_t q_len = p->masks.q_lengths ? p->masks.q_lengths[b] : p->seq_q;
    for (int64_t h = hk * c->plan->group; c->d.mode.split && !bad && h < (hk + 1) * c->plan->group; h++)
        bad = mx->nonfinite((size_t)q_len, (size_t)p->head_dim, c->q + (b * qs[0] + h * qs[2]) * es, (int)src, qs[1],
                            qs[3]) ||
              mx->nonfinite((size_t)q_len, (size_t)p->head_dim_v, c->d_o + (b * os[0] + h * os[2]) * es, (int)src,
                            os[1], os[3]);
    c->nonfinite[task] = bad;
}

/* Pre-pass (b, h): every query block packed, with lse, Dsum and its rows'
 * keys; this head's rows of every dQ_g zeroed. */
static void mbwd_prepare_task(void *vctx, size_t task, int thread) {
    const mbwd_ctx *c = vctx;
    const fmha_plan *plan = c->plan;
    const fmha_problem *p = &plan->p;
    const int64_t b = (int64_t)task / p->heads_q, h = (int64_t)task % p->heads_q;
    const int64_t *qs = p->q_strides, *os = p->o_strides, es = (int64_t)c->d.mode.bytes;
    const int src = c->d.mode.src;
    const fmha_uk_matrix *mx = &plan->uk->matrix;
    mbwd_scratch s = mbwd_scratch_of(c, thread);
    const size_t rows = c->d.q_blocks * MBWD_BQ;
    for (size_t g = 0; g < c->d.groups; g++)
        memset(c->dq_part + g * c->dq_group_floats + task * rows * c->d.dr, 0, rows * c->d.dr * sizeof(float));
    const int64_t q_len = p->masks.q_lengths ? p->masks.q_lengths[b] : p->seq_q;
    for (size_t qb = 0; qb < c->d.q_blocks; qb++) {
        const int64_t q0 = (int64_t)qb * MBWD_BQ, nq = p->seq_q - q0 < MBWD_BQ ? p->seq_q - q0 : MBWD_BQ;
        mbwd_qblock blk = mbwd_qblock_at(c, b, h, qb);
        const char *qrow = c->q + (b * qs[0] + q0 * qs[1] + h * qs[2]) * es;
        const char *dorow = c->d_o + (b * os[0] + q0 * os[1] + h * os[2]) * es;
        const void *q_rows[MBWD_BQ], *do_rows[MBWD_BQ];
        for (int64_t i = 0; i < nq; i++) q_rows[i] = qrow + i * qs[1] * es, do_rows[i] = dorow + i * os[1] * es;
        mx->pack_q((size_t)nq, (size_t)p->head_dim, q_rows, src, qs[3], plan->scale < 0.0f, blk.q, blk.q_lo);
        mx->pack_q((size_t)nq, (size_t)p->head_dim_v, do_rows, src, os[3], 0, blk.d_o, blk.d_o_lo);
        mx->pack_t((size_t)nq, (size_t)p->head_dim, qrow, src, qs[1], qs[3], blk.qt, blk.qt_lo);
        mx->pack_t((size_t)nq, (size_t)p->head_dim_v, dorow, src, os[1], os[3], blk.d_ot, blk.d_ot_lo);
        for (int64_t i = 0; i < MBWD_BQ; i++) {
            blk.lo[i] = blk.hi[i] = 0;
            blk.lse[i] = 0.0f;
            blk.dsum[i] = 0.0f;
            if (i >= nq) continue;
            const int64_t qi = q0 + i;
            blk.lse[i] = c->lse[(b * p->heads_q + h) * p->seq_q + qi];
            fmha_tile_pos row = {b, h, qi, 1, 0, 0};
            if (qi < q_len) fmha_mask_kv_range(plan, &row, &blk.lo[i], &blk.hi[i]);
            const int64_t at = b * os[0] + qi * os[1] + h * os[2];
            blk.dsum[i] = fmha_row_dsum(plan, c->o, c->d_o, at, s.o_row, s.do_row);
        }
    }
}

/* dK (scaled) or dV rows k0 .. k0 + nk_all of (b, hk) from acc [rows][BK]
 * (zeros past nk, the keys that were packed). */
static void mbwd_store(const mbwd_ctx *c, const mbwd_scratch *s, const float *acc, size_t rows, int64_t b, int64_t hk,
                       int64_t k0, int64_t nk, int64_t nk_all, int key_grad) {
    const fmha_plan *plan = c->plan;
    const fmha_problem *p = &plan->p;
    const int64_t *st = key_grad ? p->k_strides : p->v_strides;
    const int64_t width = key_grad ? p->head_dim : p->head_dim_v;
    plan->uk->rows.transpose(rows, MBWD_BK, acc, MBWD_BK, s->rows, rows);
    for (int64_t r = 0; r < nk_all; r++)
        fmha_store_row_uk(plan->uk, key_grad ? c->dk : c->dv, p->dtype, b * st[0] + (k0 + r) * st[1] + hk * st[2],
                          st[3], width, r < nk ? s->rows + (size_t)r * rows : NULL, key_grad ? plan->scale : 1.0f);
}

/* Task (unit, g): the key blocks j = g, g + G, ... of (b, hk). */
static void mbwd_kv_task(void *vctx, size_t task, int thread) {
    const mbwd_ctx *c = vctx;
    const fmha_plan *plan = c->plan;
    const fmha_problem *p = &plan->p;
    const mbwd_dims *d = &c->d;
    const size_t g = task % d->groups, unit = task / d->groups;
    const int64_t b = (int64_t)unit / p->heads_kv, hk = (int64_t)unit % p->heads_kv;
    const int64_t *ks = p->k_strides, *vs = p->v_strides, es = (int64_t)d->mode.bytes;
    const int src = d->mode.src;
    const fmha_uk_matrix *mx = &plan->uk->matrix;
    mbwd_scratch s = mbwd_scratch_of(c, thread);
    float *dq_g = c->dq_part + g * c->dq_group_floats;
    const int64_t kv_len = p->masks.kv_lengths ? p->masks.kv_lengths[b] : p->seq_kv;
    for (size_t j = g; j < d->kv_blocks; j += d->groups) {
        const int64_t k0 = (int64_t)j * MBWD_BK;
        const int64_t nk_all = p->seq_kv - k0 < MBWD_BK ? p->seq_kv - k0 : MBWD_BK;
        /* keys any query sees: the band's and the lengths' */
        fmha_tile_pos all = {b, 0, 0, p->seq_q, 0, 0};
        int64_t kv_begin, kv_end;
        fmha_mask_kv_range(plan, &all, &kv_begin, &kv_end);
        int64_t nk = kv_end - k0 < nk_all ? kv_end - k0 : nk_all;
        if (kv_len - k0 < nk) nk = kv_len - k0;
        if (nk < 0) nk = 0;
        int64_t qv_begin = 0, qv_end = 0;
        if (nk > 0) fmha_mask_q_range(plan, b, k0, nk, &qv_begin, &qv_end);
        const size_t qb_begin = (size_t)qv_begin / MBWD_BQ;
        const size_t qb_end = qv_end > qv_begin ? ((size_t)qv_end + MBWD_BQ - 1) / MBWD_BQ : qb_begin;
        const size_t n = (size_t)fmha_round_up((size_t)(nk > 0 ? nk : 1), 32);
        memset(s.dvt, 0, d->dvp * MBWD_BK * sizeof(float));
        memset(s.dkt, 0, d->dr * MBWD_BK * sizeof(float));
        long long computed = 0;
        if (qb_end > qb_begin) {
            /* the block's keys in three layouts, and split their residuals' (zeros past nk) */
            uint32_t *const layout[6] = {s.kp, s.vk, s.kv, s.kp_lo, s.vk_lo, s.kv_lo};
            const size_t words[3] = {MBWD_BK * d->dp, MBWD_BK * d->dpv, MBWD_BK / 2 * d->dr};
            for (int l = 0; l < (d->mode.split ? 6 : 3); l++) memset(layout[l], 0, words[l % 3] * sizeof(uint32_t));
            const char *krow = c->k + (b * ks[0] + k0 * ks[1] + hk * ks[2]) * es;
            const char *vrow = c->v + (b * vs[0] + k0 * vs[1] + hk * vs[2]) * es;
            mx->pack_k((size_t)nk, (size_t)p->head_dim, krow, src, ks[1], ks[3], s.kp, s.kp_lo);
            mx->pack_k((size_t)nk, (size_t)p->head_dim_v, vrow, src, vs[1], vs[3], s.vk, s.vk_lo);
            mx->pack_v((size_t)nk, (size_t)p->head_dim, krow, src, ks[1], ks[3], s.kv, s.kv_lo);
            fmha_matrix_bwd_qblock qbs[MBWD_GROUP_QB];
            fmha_matrix_bwd_args a = {.dp = d->dp, .dpv = d->dpv, .dvp = d->dvp, .dr = d->dr, .n = n, .k0 = k0,
                                      .kp = s.kp, .vk = s.vk, .kv = s.kv, .kp_lo = s.kp_lo, .vk_lo = s.vk_lo,
                                      .kv_lo = s.kv_lo, .qb = qbs, .ldq = d->dr,
                                      .abs_scale = fabsf(plan->scale), .scale_log2 = fabsf(plan->scale) * (float)M_LOG2E,
                                      .dvt = s.dvt, .dkt = s.dkt, .ldt = MBWD_BK, .s = s.s, .dp_buf = s.dp, .p_pairs = s.p_pairs,
                                      .ds_pairs = s.ds_pairs, .ds = s.ds,
                                      .residual = d->mode.residual,
                                      .p_lo_pairs = s.p_lo_pairs, .ds_lo_pairs = s.ds_lo_pairs, .ds_lo = s.ds_lo};
            size_t nqb = 0;
            for (int64_t h = hk * plan->group; h < (hk + 1) * plan->group; h++)
                for (size_t qb = qb_begin; qb < qb_end; qb++) {
                    const mbwd_qblock blk = mbwd_qblock_at(c, b, h, qb);
                    float *dq_rows = dq_g + (((size_t)(b * p->heads_q + h)) * d->q_blocks + qb) * MBWD_BQ * d->dr;
                    qbs[nqb++] = (fmha_matrix_bwd_qblock){blk.q,     blk.d_o,    blk.qt,  blk.d_ot, blk.q_lo,
                                                          blk.d_o_lo, blk.qt_lo, blk.d_ot_lo, blk.lse, blk.dsum,
                                                          blk.lo,    blk.hi,     dq_rows};
                    computed++;
                    const int last = h == (hk + 1) * plan->group - 1 && qb + 1 == qb_end;
                    if (nqb == MBWD_GROUP_QB || last) {
                        a.nqb = nqb;
                        mx->backward(&a);
                        nqb = 0;
                    }
                }
        }
        fmha_tiles_count(computed);
        mbwd_store(c, &s, s.dkt, d->dr, b, hk, k0, nk > 0 ? nk : 0, nk_all, 1);
        mbwd_store(c, &s, s.dvt, d->dvp, b, hk, k0, nk > 0 ? nk : 0, nk_all, 0);
    }
}

/* After the key blocks, per (b, h): dQ = scale (dQ_0 + ... + dQ_{G-1}). */
static void mbwd_reduce_task(void *vctx, size_t task, int thread) {
    const mbwd_ctx *c = vctx;
    const fmha_plan *plan = c->plan;
    const fmha_problem *p = &plan->p;
    const int64_t *qs = p->q_strides;
    const int64_t b = (int64_t)task / p->heads_q, h = (int64_t)task % p->heads_q;
    mbwd_scratch s = mbwd_scratch_of(c, thread);
    float *sum = s.rows;
    for (int64_t i = 0; i < p->seq_q; i++) {
        const float *src = c->dq_part + ((size_t)task * c->d.q_blocks * MBWD_BQ + (size_t)i) * c->d.dr;
        memcpy(sum, src, (size_t)p->head_dim * sizeof(float));
        for (size_t g = 1; g < c->d.groups; g++) {
            const float *part = src + g * c->dq_group_floats;
            for (int64_t e = 0; e < p->head_dim; e++) sum[e] += part[e];
        }
        fmha_store_row_uk(plan->uk, c->dq, p->dtype, b * qs[0] + i * qs[1] + h * qs[2], qs[3], p->head_dim, sum,
                          plan->scale);
    }
}

int fmha_matrix_bwd_run(fmha_plan *run, const void *q, const void *k, const void *v, const void *o, const void *d_o,
                        const float *lse, void *dq, void *dk, void *dv, char *ws) {
    const fmha_problem *p = &run->p;
    mbwd_ctx c = {.plan = run, .d = mbwd_dims_of(run), .q = q, .k = k, .v = v, .o = o, .d_o = d_o, .lse = lse,
                  .dq = dq, .dk = dk, .dv = dv, .ws = ws};
    fmha_carver sh = {ws + (size_t)run->threads * run->thread_bytes, 0};
    mbwd_carve_shared(run, &c.d, &sh, &c.qblocks, &c.dq_part, &c.nonfinite);
    c.dq_group_floats = fmha_round_up(mbwd_dq_floats(run, &c.d) * sizeof(float), FMHA_ALIGN) / sizeof(float);
    c.qblock_bytes = mbwd_qblock_bytes(&c.d);
    fmha_run_parallel(run, c.d.units, mbwd_check_task, &c);
    for (size_t u = 0; u < c.d.units; u++)
        if (c.nonfinite[u]) return 0; /* the tiled backward keeps hidden keys' NaN out: it serves */
    const size_t heads = (size_t)(p->batch * p->heads_q);
    fmha_run_parallel(run, heads, mbwd_prepare_task, &c);
    fmha_run_parallel(run, c.d.units * c.d.groups, mbwd_kv_task, &c);
    fmha_run_parallel(run, heads, mbwd_reduce_task, &c);
    return 1;
}
