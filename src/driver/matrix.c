/* matrix.c: the forward on a matrix engine, the table's matrix part (AMX
 * tiles): Q, K, V and P tile-shaped end to end (layouts and kernel
 * contract in uk/ukernel.h). This driver holds the threads and the
 * workspace; the part holds every tile instruction.
 *
 *   pre-pass, tasks (b, kv head, 256 keys): K and V of every (b, kv head)
 *     packed once into the tile layouts, in the shared workspace
 *   tasks (b, query head, block of 32 queries), head-major (causal: the
 *     longest blocks of a head first):
 *     each row's visible keys [lo, hi) from the band and the lengths;
 *     Q block packed; the part's forward over keys [min lo, max hi);
 *     O = o / l and lse = m + log l per row (fmha_row_finish: sinks, rows
 *     that saw no key), stored in O's dtype.
 * Serves bf16 Q, K and V (K and V as Q's dtype) at precision FAST, with the
 * causal/window band and query/key lengths as the only masks, no bias,
 * softcap or dropout, no block table, the tiled strategy (asked for, or
 * auto's past the dense crossover). Everything else runs on the dense or
 * tiled drivers (whose bf16 GEMM is on the tiles too).
 *
 * A row whose output is not finite while its sum is (a NaN or inf in V at a
 * key with P = 0, which the tile product still multiplies: 0 * NaN) is
 * computed again here, in float32 over the keys with P != 0 only (rare;
 * never on finite inputs). Every output element comes from one task in a
 * fixed order: the bits do not depend on the thread count. */
#include <math.h>
#include <string.h>

#include "../attn.h"
#include "../convert.h"
#include "../pool.h"
#include "../tuning.h"

/* Keys per step of the forward unless the tuning says (matrix_block_kv). */
enum { MATRIX_BQ = FMHA_MATRIX_BLOCK_Q, MATRIX_PACK_KEYS = 256, MATRIX_BLOCK_KV = 128 };

size_t fmha_matrix_block_kv(const fmha_plan *plan) {
    const int64_t tuned = plan->uk->tuning ? plan->uk->tuning->matrix_block_kv : 0;
    return tuned ? (size_t)tuned : MATRIX_BLOCK_KV;
}

int fmha_matrix_plan(fmha_plan *plan) {
    const fmha_problem *p = &plan->p;
    const fmha_masks *m = &p->masks;
    if (!plan->uk->matrix.forward || p->block_table || p->dtype != FMHA_DTYPE_BF16 || !fmha_plan_kv_as_q(plan))
        return 0;
    if (p->precision != FMHA_PRECISION_FAST || plan->has_bias || plan->dropout) return 0;
    /* the tiled strategy, asked for or auto's choice past the dense crossover */
    if (plan->strategy != FMHA_STRATEGY_TILED || p->strategy == FMHA_STRATEGY_PORTABLE) return 0;
    if (m->q_segment_ids || m->dense || m->callback.fill) return 0;
    return 1;
}

typedef struct matrix_scratch {
    uint32_t *qp;
    float *o, *m, *l, *s;
    uint16_t *p;
    int64_t *lo, *hi;
} matrix_scratch;

static size_t matrix_k_words(const fmha_plan *plan) {
    return fmha_round_up((size_t)plan->p.seq_kv, 32) * fmha_matrix_dp((size_t)plan->p.head_dim);
}

static size_t matrix_v_words(const fmha_plan *plan) {
    return fmha_round_up((size_t)plan->p.seq_kv, 32) / 2 * fmha_matrix_dvp((size_t)plan->p.head_dim_v);
}

static void matrix_carve(const fmha_plan *plan, fmha_carver *c, matrix_scratch *s) {
    const size_t dp = fmha_matrix_dp((size_t)plan->p.head_dim), dvp = fmha_matrix_dvp((size_t)plan->p.head_dim_v);
    const size_t bk = fmha_matrix_block_kv(plan);
    s->qp = fmha_carve(c, dp * MATRIX_BQ * sizeof(uint32_t));
    s->o = fmha_carve(c, MATRIX_BQ * dvp * sizeof(float));
    s->m = fmha_carve(c, MATRIX_BQ * sizeof(float));
    s->l = fmha_carve(c, MATRIX_BQ * sizeof(float));
    s->s = fmha_carve(c, 2 * MATRIX_BQ * bk * sizeof(float));
    s->p = fmha_carve(c, 2 * MATRIX_BQ * bk * sizeof(uint16_t));
    s->lo = fmha_carve(c, MATRIX_BQ * sizeof(int64_t));
    s->hi = fmha_carve(c, MATRIX_BQ * sizeof(int64_t));
}

/* Shared: [Toeplitz bias vectors (none served)][packed K, V of every (b, kv head)]. */
static void matrix_carve_shared(const fmha_plan *plan, fmha_carver *c, uint32_t **kv) {
    const size_t units = (size_t)(plan->p.batch * plan->p.heads_kv);
    *kv = fmha_carve(c, units * (matrix_k_words(plan) + matrix_v_words(plan)) * sizeof(uint32_t));
}

fmha_ws_size fmha_matrix_workspace(const fmha_plan *plan) {
    fmha_carver t = {0}, sh = {0};
    matrix_scratch s;
    uint32_t *kv;
    matrix_carve(plan, &t, &s);
    matrix_carve_shared(plan, &sh, &kv);
    return (fmha_ws_size){t.used, sh.used};
}

typedef struct matrix_ctx {
    const fmha_plan *plan;
    const uint16_t *q, *k, *v;
    void *o;
    float *lse;
    char *ws;
    uint32_t *kv;        /* per (b, kv head): K words, then V words */
    size_t unit_words, k_words;
    size_t q_blocks;
} matrix_ctx;

static void matrix_pack_task(void *vctx, size_t task, int thread) {
    const matrix_ctx *c = vctx;
    const fmha_problem *p = &c->plan->p;
    const size_t chunks = ((size_t)p->seq_kv + MATRIX_PACK_KEYS - 1) / MATRIX_PACK_KEYS;
    const size_t unit = task / chunks;
    const int64_t b = (int64_t)unit / p->heads_kv, hk = (int64_t)unit % p->heads_kv;
    const int64_t k0 = (int64_t)(task % chunks) * MATRIX_PACK_KEYS;
    const int64_t nk = p->seq_kv - k0 < MATRIX_PACK_KEYS ? p->seq_kv - k0 : MATRIX_PACK_KEYS;
    /* keys past the batch element's length are zeros, never read */
    const int64_t kv_len = p->masks.kv_lengths ? p->masks.kv_lengths[b] : p->seq_kv;
    const int64_t n_read = kv_len - k0 < 0 ? 0 : kv_len - k0 < nk ? kv_len - k0 : nk;
    const int64_t *ks = p->k_strides, *vs = p->v_strides;
    const size_t dp = fmha_matrix_dp((size_t)p->head_dim), dvp = fmha_matrix_dvp((size_t)p->head_dim_v);
    uint32_t *kp = c->kv + unit * c->unit_words + (size_t)k0 * dp, *vp = c->kv + unit * c->unit_words + c->k_words +
                                                                       (size_t)k0 / 2 * dvp;
    const size_t k_words = fmha_round_up((size_t)nk, 32) * dp, v_words = fmha_round_up((size_t)nk, 32) / 2 * dvp;
    const size_t k_read = fmha_round_up((size_t)n_read, 32) * dp, v_read = fmha_round_up((size_t)n_read, 32) / 2 * dvp;
    const fmha_uk_matrix *mx = &c->plan->uk->matrix;
    if (n_read > 0) {
        mx->pack_k((size_t)n_read, (size_t)p->head_dim, c->k + b * ks[0] + k0 * ks[1] + hk * ks[2], ks[1], ks[3], kp);
        mx->pack_v((size_t)n_read, (size_t)p->head_dim_v, c->v + b * vs[0] + k0 * vs[1] + hk * vs[2], vs[1], vs[3], vp);
    }
    memset(kp + k_read, 0, (k_words - k_read) * sizeof(uint32_t));
    memset(vp + v_read, 0, (v_words - v_read) * sizeof(uint32_t));
}

/* Row i's output again in float32 over its keys with P != 0 (a NaN or inf
 * of V at a key whose P is 0 reached it through the tile product). */
static void matrix_row_guarded(const matrix_ctx *c, int64_t b, int64_t h, int64_t i, int64_t lo, int64_t hi,
                               float m_raw, float o_scale) {
    const fmha_plan *plan = c->plan;
    const fmha_problem *p = &plan->p;
    const int64_t hk = h / plan->group, D = p->head_dim, Dv = p->head_dim_v;
    const int64_t *qs = p->q_strides, *ks = p->k_strides, *vs = p->v_strides, *os = p->o_strides;
    const float scale = fabsf(plan->scale), sign = plan->scale < 0.0f ? -1.0f : 1.0f;
    const float m_use = m_raw == -INFINITY ? 0.0f : m_raw;
    float acc[FMHA_MAX_HEAD_DIM];
    for (int64_t e = 0; e < Dv; e++) acc[e] = 0.0f;
    for (int64_t j = lo; j < hi; j++) {
        float s = 0.0f;
        for (int64_t e = 0; e < D; e++)
            s += fmha_load(c->q, FMHA_DTYPE_BF16, b * qs[0] + i * qs[1] + h * qs[2] + e * qs[3]) *
                 fmha_load(c->k, FMHA_DTYPE_BF16, b * ks[0] + j * ks[1] + hk * ks[2] + e * ks[3]);
        const float pr = expf((sign * s - m_use) * scale);
        if (pr == 0.0f) continue;
        for (int64_t e = 0; e < Dv; e++)
            acc[e] += pr * fmha_load(c->v, FMHA_DTYPE_BF16, b * vs[0] + j * vs[1] + hk * vs[2] + e * vs[3]);
    }
    fmha_store_row_uk(plan->uk, c->o, plan->o_dtype, b * os[0] + i * os[1] + h * os[2], os[3], Dv, acc, o_scale);
}

static void matrix_fwd_task(void *vctx, size_t task, int thread) {
    const matrix_ctx *c = vctx;
    const fmha_plan *plan = c->plan;
    const fmha_problem *p = &plan->p;
    size_t blk = task % c->q_blocks, bh = task / c->q_blocks;
    if (p->causal != FMHA_CAUSAL_NONE) blk = c->q_blocks - 1 - blk;
    const int64_t b = (int64_t)(bh / (size_t)p->heads_q), h = (int64_t)(bh % (size_t)p->heads_q);
    const int64_t hk = h / plan->group, q0 = (int64_t)blk * MATRIX_BQ;
    const int64_t nq = p->seq_q - q0 < MATRIX_BQ ? p->seq_q - q0 : MATRIX_BQ;
    matrix_scratch s;
    fmha_carver carver = {c->ws + (size_t)thread * plan->thread_bytes, 0};
    matrix_carve(plan, &carver, &s);

    /* each row's keys; the block's span */
    int64_t kb = p->seq_kv, ke = 0;
    const int64_t q_len = p->masks.q_lengths ? p->masks.q_lengths[b] : p->seq_q;
    for (int64_t i = 0; i < nq; i++) {
        fmha_tile_pos row = {b, h, q0 + i, 1, 0, 0};
        fmha_mask_kv_range(plan, &row, &s.lo[i], &s.hi[i]);
        if (q0 + i >= q_len) s.lo[i] = s.hi[i] = 0;
        if (s.hi[i] > s.lo[i]) {
            if (s.lo[i] < kb) kb = s.lo[i];
            if (s.hi[i] > ke) ke = s.hi[i];
        }
    }
    const int64_t *qs = p->q_strides, *os = p->o_strides;
    const fmha_uk_matrix *mx = &plan->uk->matrix;
    mx->pack_q((size_t)nq, (size_t)p->head_dim, c->q + b * qs[0] + q0 * qs[1] + h * qs[2], qs[1], qs[3],
               plan->scale < 0.0f, s.qp);
    const uint32_t *kp = c->kv + (size_t)(b * p->heads_kv + hk) * c->unit_words;
    fmha_matrix_fwd_args a = {
        .nq = (size_t)nq, .dp = fmha_matrix_dp((size_t)p->head_dim), .dvp = fmha_matrix_dvp((size_t)p->head_dim_v),
        .block_kv = fmha_matrix_block_kv(plan), .qp = s.qp, .kp = kp, .vp = kp + c->k_words, .kb = kb < ke ? kb : 0,
        .ke = kb < ke ? ke : 0, .lo = s.lo, .hi = s.hi, .scale_log2 = fabsf(plan->scale) * (float)M_LOG2E,
        .rescale_log2 = (float)plan->uk->tuning->matrix_rescale_log2, .overlap = (int)plan->uk->tuning->matrix_overlap,
        .o = s.o, .m = s.m, .l = s.l, .s = s.s, .p = s.p};
    mx->forward(&a);

    const float abs_scale = fabsf(plan->scale);
    for (int64_t i = 0; i < nq; i++) {
        const float m_nat = s.m[i] == -INFINITY ? -INFINITY : s.m[i] * abs_scale;
        float o_scale, row_lse;
        fmha_row_finish(plan, h, m_nat, s.l[i], &o_scale, &row_lse);
        if (c->lse) c->lse[(b * p->heads_q + h) * p->seq_q + q0 + i] = row_lse;
        const float *orow = s.o + (size_t)i * a.dvp;
        if ((a.nonfinite >> i & 1) && isfinite(s.l[i]))
            matrix_row_guarded(c, b, h, q0 + i, s.lo[i], s.hi[i], s.m[i], o_scale);
        else
            fmha_store_row_uk(plan->uk, c->o, plan->o_dtype, b * os[0] + (q0 + i) * os[1] + h * os[2], os[3],
                              p->head_dim_v, orow, o_scale);
    }
    fmha_tiles_count((long long)a.blocks);
}

void fmha_matrix_run(fmha_plan *run, const void *q, const void *k, const void *v, void *o, float *lse, char *ws) {
    const fmha_problem *p = &run->p;
    fmha_carver sh = {ws + (size_t)run->threads * run->thread_bytes, 0};
    uint32_t *kv;
    matrix_carve_shared(run, &sh, &kv);
    matrix_ctx c = {run, q, k, v, o, lse, ws, kv, matrix_k_words(run) + matrix_v_words(run), matrix_k_words(run),
                    ((size_t)p->seq_q + MATRIX_BQ - 1) / MATRIX_BQ};
    const size_t chunks = ((size_t)p->seq_kv + MATRIX_PACK_KEYS - 1) / MATRIX_PACK_KEYS;
    fmha_run_parallel(run, (size_t)(p->batch * p->heads_kv) * chunks, matrix_pack_task, &c);
    fmha_run_parallel(run, (size_t)(p->batch * p->heads_q) * c.q_blocks, matrix_fwd_task, &c);
}
