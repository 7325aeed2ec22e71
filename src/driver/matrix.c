/* matrix.c: the forward on a matrix engine, the table's matrix part (AMX
 * tiles): Q, K, V and P tile-shaped end to end (layouts and kernel
 * contract in uk/ukernel.h). This driver holds the threads and the
 * workspace; the part holds every tile instruction.
 *
 *   pre-pass, tasks (b, kv head, 256 keys): K and V of every (b, kv head)
 *     packed once into the tile layouts, in the shared workspace
 *   tasks (b, kv head, block of 32 rows): a unit's rows are its group's
 *     query heads' queries, head by head, so that a decode step's few
 *     queries of each head (GQA) fill the tiles together (causal: the
 *     longest blocks of a unit first):
 *     each row's visible keys [lo, hi) from the band and the lengths;
 *     Q block packed from its rows; the part's forward over keys
 *     [min lo, max hi);
 *     O = o / l and lse = m + log l per row (fmha_row_finish: sinks, rows
 *     that saw no key), stored in O's dtype.
 * Serves Q, K and V of one dtype with the causal/window band and query/key
 * lengths as the only masks, no bias, softcap or dropout, no block table,
 * the tiled strategy (asked for, or auto's past the dense crossover), in
 * the part's operands (fmha_matrix_takes):
 *   bf16     as they are; P as bf16 (FAST) or bf16 plus its residual
 *            (ACCURATE)
 *   float16  each element split exactly into bf16 hi + lo, P too: three
 *            products per GEMM (hi hi + hi lo + lo hi)
 *   float32  at precision BF16X3 split as float16 (to about 16 bits), at
 *            BF16 rounded to bf16; FAST and ACCURATE stay on the IEEE FMA
 *            path (the tiled driver)
 * Everything else runs on the dense or tiled drivers (whose bf16 GEMM is
 * on the tiles too).
 *
 * A row whose output is not finite while its sum is (a NaN or inf in V at a
 * key with P = 0, which the tile product still multiplies: 0 * NaN), and a
 * row of split inputs that came out NaN (an inf's residual is NaN), are
 * computed again here in float32 (matrix_row_guarded; rare, never on
 * finite inputs). Every output element comes from one task in a
 * fixed order: the bits do not depend on the thread count. */
#include <math.h>
#include <string.h>

#include "core/attn.h"
#include "runtime/convert.h"
#include "core/partials.h"
#include "runtime/pool.h"
#include "config/tuning.h"

enum { MATRIX_BQ = FMHA_MATRIX_BLOCK_Q, MATRIX_PACK_KEYS = 256 };

/* Keys per step of the forward: the tuning's matrix_block_kv (default 128). */
size_t fmha_matrix_block_kv(const fmha_plan *plan) { return (size_t)plan->uk->tuning->matrix_block_kv; }

/* How the part reads this plan's operands: worked out once, at planning,
 * into the plan's own slot (plan->drv.matrix). */
typedef struct fmha_matrix_mode matrix_mode;

static int matrix_mode_of(const fmha_plan *plan, matrix_mode *m) {
    if (!plan->uk->matrix.forward || !fmha_plan_kv_as_q(plan)) return 0;
    switch (plan->p.dtype) {
    case FMHA_DTYPE_BF16:
        *m = (matrix_mode){FMHA_MATRIX_SRC_BF16, 0, plan->precision == FMHA_PRECISION_ACCURATE};
        return 1;
    case FMHA_DTYPE_F16: *m = (matrix_mode){FMHA_MATRIX_SRC_F16, 1, 1}; return 1;
    case FMHA_DTYPE_F32:
        if (plan->precision != FMHA_PRECISION_BF16X3 && plan->precision != FMHA_PRECISION_BF16) return 0;
        *m = (matrix_mode){FMHA_MATRIX_SRC_F32, plan->precision == FMHA_PRECISION_BF16X3,
                           plan->precision == FMHA_PRECISION_BF16X3};
        return 1;
    }
    return 0;
}

int fmha_matrix_takes(const fmha_plan *plan) {
    matrix_mode m;
    return matrix_mode_of(plan, &m);
}

int fmha_matrix_plan(fmha_plan *plan) {
    const fmha_problem *p = &plan->p;
    if (!matrix_mode_of(plan, &plan->drv.matrix) || p->block_table || plan->has_bias || plan->dropout) return 0;
    /* the tiled strategy, asked for or auto's choice past the dense crossover */
    if (plan->strategy != FMHA_STRATEGY_TILED || p->strategy == FMHA_STRATEGY_PORTABLE) return 0;
    return fmha_plan_keys_one_range(plan);
}

/* Scratch of one query block: qp, qp_lo [dp / 16][32][16] packed Q (and
 * its residual), o [32][dvp], m, l [32], s [2][32][block_kv], p, p_lo
 * [2][32][block_kv] bf16, lo, hi [32] each row's keys. */
typedef struct matrix_scratch {
    uint32_t *qp, *qp_lo;
    float *o, *m, *l, *s;
    uint16_t *p, *p_lo;
    int64_t *lo, *hi;
} matrix_scratch;

static size_t matrix_k_words(const fmha_plan *plan) {
    return fmha_round_up((size_t)plan->p.seq_kv, 32) * fmha_matrix_dp((size_t)plan->p.head_dim);
}

static size_t matrix_v_words(const fmha_plan *plan) {
    return fmha_round_up((size_t)plan->p.seq_kv, 32) / 2 * fmha_matrix_dvp((size_t)plan->p.head_dim_v);
}

/* Words of one (b, kv head)'s packed unit: K, V, then (split) K_lo, V_lo. */
static size_t matrix_unit_words(const fmha_plan *plan, const matrix_mode *m) {
    return (matrix_k_words(plan) + matrix_v_words(plan)) * (m->split_inputs ? 2 : 1);
}

static void matrix_carve(const fmha_plan *plan, fmha_carver *c, matrix_scratch *s) {
    const size_t dp = fmha_matrix_dp((size_t)plan->p.head_dim), dvp = fmha_matrix_dvp((size_t)plan->p.head_dim_v);
    const size_t bk = fmha_matrix_block_kv(plan);
    const matrix_mode m = plan->drv.matrix;
    s->qp = fmha_carve(c, dp * MATRIX_BQ * sizeof(uint32_t));
    s->qp_lo = fmha_carve(c, m.split_inputs ? dp * MATRIX_BQ * sizeof(uint32_t) : 0);
    s->o = fmha_carve(c, MATRIX_BQ * dvp * sizeof(float));
    s->m = fmha_carve(c, MATRIX_BQ * sizeof(float));
    s->l = fmha_carve(c, MATRIX_BQ * sizeof(float));
    s->s = fmha_carve(c, 2 * MATRIX_BQ * bk * sizeof(float));
    s->p = fmha_carve(c, 2 * MATRIX_BQ * bk * sizeof(uint16_t));
    s->p_lo = fmha_carve(c, m.split_p ? 2 * MATRIX_BQ * bk * sizeof(uint16_t) : 0);
    s->lo = fmha_carve(c, MATRIX_BQ * sizeof(int64_t));
    s->hi = fmha_carve(c, MATRIX_BQ * sizeof(int64_t));
}

/* Shared: the packed units of every (b, kv head). */
static void matrix_carve_shared(const fmha_plan *plan, fmha_carver *c, uint32_t **kv) {
    const size_t units = (size_t)(plan->p.batch * plan->p.heads_kv);
    const matrix_mode m = plan->drv.matrix;
    *kv = fmha_carve(c, units * matrix_unit_words(plan, &m) * sizeof(uint32_t));
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
    matrix_mode mode;
    const char *q, *k, *v;
    void *o;
    float *lse;
    char *ws;
    uint32_t *kv;        /* per (b, kv head): K, V words, then (split) K_lo, V_lo */
    size_t unit_words;   /* words of a unit */
    size_t half_words;   /* words of K and V (the residuals' offset) */
    size_t k_words;      /* words of K (V's offset) */
    size_t q_blocks;     /* blocks of 32 rows of a unit (b, kv head): its group's heads' queries */
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
    const size_t es = fmha_dtype_size(p->dtype), halves = c->mode.split_inputs ? 2 : 1;
    const size_t k_words = fmha_round_up((size_t)nk, 32) * dp, v_words = fmha_round_up((size_t)nk, 32) / 2 * dvp;
    const size_t k_read = fmha_round_up((size_t)n_read, 32) * dp, v_read = fmha_round_up((size_t)n_read, 32) / 2 * dvp;
    const fmha_uk_matrix *mx = &c->plan->uk->matrix;
    uint32_t *unit_base = c->kv + unit * c->unit_words;
    /* K and V, and their residuals: each at its part's offset, from key k0 */
    uint32_t *kp[2], *vp[2];
    for (size_t h = 0; h < 2; h++) {
        kp[h] = h < halves ? unit_base + h * c->half_words + (size_t)k0 * dp : NULL;
        vp[h] = h < halves ? unit_base + h * c->half_words + c->k_words + (size_t)k0 / 2 * dvp : NULL;
    }
    if (n_read > 0) {
        mx->pack_k((size_t)n_read, (size_t)p->head_dim, c->k + (b * ks[0] + k0 * ks[1] + hk * ks[2]) * (int64_t)es,
                   c->mode.src, ks[1], ks[3], kp[0], kp[1]);
        mx->pack_v((size_t)n_read, (size_t)p->head_dim_v, c->v + (b * vs[0] + k0 * vs[1] + hk * vs[2]) * (int64_t)es,
                   c->mode.src, vs[1], vs[3], vp[0], vp[1]);
    }
    for (size_t h = 0; h < halves; h++) {
        memset(kp[h] + k_read, 0, (k_words - k_read) * sizeof(uint32_t));
        memset(vp[h] + v_read, 0, (v_words - v_read) * sizeof(uint32_t));
    }
}

/* The score of query row (b, h, i) and key j in float32, IEEE
 * throughout (sign * q . k, unscaled). */
static float matrix_score_f32(const matrix_ctx *c, int64_t b, int64_t h, int64_t i, int64_t j) {
    const fmha_problem *p = &c->plan->p;
    const int64_t hk = h / c->plan->group, *qs = p->q_strides, *ks = p->k_strides;
    float s = 0.0f;
    for (int64_t e = 0; e < p->head_dim; e++)
        s += fmha_load(c->q, p->dtype, b * qs[0] + i * qs[1] + h * qs[2] + e * qs[3]) *
             fmha_load(c->k, (fmha_dtype)c->plan->k_format, fmha_kv_row_at(p, ks, b, hk, j) + e * ks[3]);
    return c->plan->scale < 0.0f ? -s : s;
}

/* Row (b, h, i) again in float32 over its keys [lo, hi) (each one the row
 * sees, unless its score is -inf). Two cases reach it, both rare and never
 * on finite inputs:
 *   - the output is not finite while the sum is (a NaN or inf of V at a
 *     key whose P is 0 reached it through the tile product): m_raw, the
 *     tiles' max, and o_scale are kept (*lse is left alone);
 *   - exact (m_raw ignored): split inputs whose row came out NaN. A split
 *     x = hi + lo of an infinite x has lo = inf - inf = NaN, and hi x 0 is
 *     NaN in a product the IEEE score never forms, so the row's max, sum
 *     and lse are computed here too, as fmha.h's rule has them. */
static void matrix_row_guarded(const matrix_ctx *c, int64_t b, int64_t h, int64_t i, int64_t lo, int64_t hi,
                               float m_raw, float o_scale, int exact, float *lse) {
    const fmha_plan *plan = c->plan;
    const fmha_problem *p = &plan->p;
    const int64_t hk = h / plan->group, Dv = p->head_dim_v;
    const int64_t *vs = p->v_strides, *os = p->o_strides;
    const float scale = fabsf(plan->scale);
    if (exact) {
        m_raw = -INFINITY;
        for (int64_t j = lo; j < hi; j++) m_raw = fmha_partials_max(m_raw, matrix_score_f32(c, b, h, i, j));
    }
    const float m_use = m_raw == -INFINITY ? 0.0f : m_raw;
    float acc[FMHA_MAX_HEAD_DIM], l = 0.0f;
    for (int64_t e = 0; e < Dv; e++) acc[e] = 0.0f;
    for (int64_t j = lo; j < hi; j++) {
        const float sj = matrix_score_f32(c, b, h, i, j);
        if (sj == -INFINITY) continue; /* a -inf score hides its key */
        const float pr = expf((sj - m_use) * scale);
        l += pr; /* a P that underflows to 0 still multiplies V (0 x NaN is NaN) */
        for (int64_t e = 0; e < Dv; e++)
            acc[e] += pr * fmha_load(c->v, (fmha_dtype)plan->v_format, fmha_kv_row_at(p, vs, b, hk, j) + e * vs[3]);
    }
    if (exact) fmha_row_finish(plan, h, m_raw == -INFINITY ? -INFINITY : m_raw * scale, l, &o_scale, lse);
    fmha_store_row_uk(plan->uk, c->o, plan->o_dtype, b * os[0] + i * os[1] + h * os[2], os[3], Dv, acc, o_scale);
}

/* Row r of a unit (b, kv head hk): its query head and query. The unit's
 * rows are its group's heads' queries, head by head (r = g Sq + i), so a
 * block of 32 rows may hold two heads' queries and a decode step's few
 * queries of each head fill the tiles together. */
static void matrix_row(const fmha_plan *plan, int64_t hk, int64_t r, int64_t *h, int64_t *i) {
    *h = hk * plan->group + r / plan->p.seq_q;
    *i = r % plan->p.seq_q;
}

static void matrix_fwd_task(void *vctx, size_t task, int thread) {
    const matrix_ctx *c = vctx;
    const fmha_plan *plan = c->plan;
    const fmha_problem *p = &plan->p;
    size_t blk = task % c->q_blocks, unit = task / c->q_blocks;
    if (p->causal != FMHA_CAUSAL_NONE) blk = c->q_blocks - 1 - blk;
    const int64_t b = (int64_t)unit / p->heads_kv, hk = (int64_t)unit % p->heads_kv;
    const int64_t unit_rows = plan->group * p->seq_q, r0 = (int64_t)blk * MATRIX_BQ;
    const int64_t nq = unit_rows - r0 < MATRIX_BQ ? unit_rows - r0 : MATRIX_BQ;
    matrix_scratch s;
    fmha_carver carver = {c->ws + (size_t)thread * plan->thread_bytes, 0};
    matrix_carve(plan, &carver, &s);

    /* each row's head, query, keys and Q row; the block's span */
    const int64_t *qs = p->q_strides, *os = p->o_strides;
    const int64_t es = (int64_t)fmha_dtype_size(p->dtype);
    const int64_t q_len = p->masks.q_lengths ? p->masks.q_lengths[b] : p->seq_q;
    int64_t kb = p->seq_kv, ke = 0, heads[MATRIX_BQ], queries[MATRIX_BQ];
    const void *q_rows[MATRIX_BQ];
    for (int64_t r = 0; r < nq; r++) {
        int64_t h, i;
        matrix_row(plan, hk, r0 + r, &h, &i);
        heads[r] = h, queries[r] = i;
        q_rows[r] = c->q + (b * qs[0] + i * qs[1] + h * qs[2]) * es;
        fmha_tile_pos row = {b, h, i, 1, 0, 0};
        fmha_mask_kv_range(plan, &row, &s.lo[r], &s.hi[r]);
        if (i >= q_len) s.lo[r] = s.hi[r] = 0;
        if (s.hi[r] > s.lo[r]) {
            if (s.lo[r] < kb) kb = s.lo[r];
            if (s.hi[r] > ke) ke = s.hi[r];
        }
    }
    const fmha_uk_matrix *mx = &plan->uk->matrix;
    mx->pack_q((size_t)nq, (size_t)p->head_dim, q_rows, c->mode.src, qs[3], plan->scale < 0.0f, s.qp,
               c->mode.split_inputs ? s.qp_lo : NULL);
    const uint32_t *kp = c->kv + unit * c->unit_words;
    const uint32_t *kp_lo = c->mode.split_inputs ? kp + c->half_words : NULL;
    fmha_matrix_fwd_args a = {
        .nq = (size_t)nq, .dp = fmha_matrix_dp((size_t)p->head_dim), .dvp = fmha_matrix_dvp((size_t)p->head_dim_v),
        .block_kv = fmha_matrix_block_kv(plan), .qp = s.qp, .kp = kp, .vp = kp + c->k_words,
        .qp_lo = c->mode.split_inputs ? s.qp_lo : NULL, .kp_lo = kp_lo, .vp_lo = kp_lo ? kp_lo + c->k_words : NULL,
        .kb = kb < ke ? kb : 0,
        .ke = kb < ke ? ke : 0, .lo = s.lo, .hi = s.hi, .scale_log2 = fabsf(plan->scale) * (float)M_LOG2E,
        .rescale_log2 = (float)plan->uk->tuning->matrix_rescale_log2, .overlap = (int)plan->uk->tuning->matrix_overlap,
        .o = s.o, .m = s.m, .l = s.l, .s = s.s, .p = s.p, .p_lo = c->mode.split_p ? s.p_lo : NULL};
    mx->forward(&a);

    const float abs_scale = fabsf(plan->scale);
    for (int64_t r = 0; r < nq; r++) {
        const int64_t h = heads[r], i = queries[r];
        const float m_nat = s.m[r] == -INFINITY ? -INFINITY : s.m[r] * abs_scale;
        float o_scale, row_lse;
        fmha_row_finish(plan, h, m_nat, s.l[r], &o_scale, &row_lse);
        const float *orow = s.o + (size_t)r * a.dvp;
        const int exact = c->mode.split_inputs && (isnan(s.m[r]) || !isfinite(s.l[r]));
        if (exact || ((a.nonfinite >> r & 1) && isfinite(s.l[r])))
            matrix_row_guarded(c, b, h, i, s.lo[r], s.hi[r], s.m[r], o_scale, exact, &row_lse);
        else
            fmha_store_row_uk(plan->uk, c->o, plan->o_dtype, b * os[0] + i * os[1] + h * os[2], os[3],
                              p->head_dim_v, orow, o_scale);
        if (c->lse) c->lse[(b * p->heads_q + h) * p->seq_q + i] = row_lse;
    }
    fmha_tiles_count((long long)a.blocks);
}

void fmha_matrix_run(fmha_plan *run, const void *q, const void *k, const void *v, void *o, float *lse, char *ws) {
    const fmha_problem *p = &run->p;
    fmha_carver sh = {ws + (size_t)run->threads * run->thread_bytes, 0};
    uint32_t *kv;
    matrix_carve_shared(run, &sh, &kv);
    matrix_ctx c = {.plan = run, .q = q, .k = k, .v = v, .o = o, .lse = lse, .ws = ws, .kv = kv,
                    .k_words = matrix_k_words(run),
                    .q_blocks = ((size_t)(run->group * p->seq_q) + MATRIX_BQ - 1) / MATRIX_BQ};
    c.mode = run->drv.matrix;
    c.half_words = matrix_k_words(run) + matrix_v_words(run);
    c.unit_words = matrix_unit_words(run, &c.mode);
    const size_t chunks = ((size_t)p->seq_kv + MATRIX_PACK_KEYS - 1) / MATRIX_PACK_KEYS;
    fmha_run_parallel(run, (size_t)(p->batch * p->heads_kv) * chunks, matrix_pack_task, &c);
    fmha_run_parallel(run, (size_t)(p->batch * p->heads_kv) * c.q_blocks, matrix_fwd_task, &c);
}

/* ---- decoding on the tiles ----
 *
 * A decode step (few queries, many keys) reads every key once for a few
 * rows: packing K and V per call, as the forward does, would read and write
 * the cache twice. The part's decode reads them in place instead, and the
 * work is split over keys so that few units still fill the threads:
 *   tasks (b, kv head, chunk of keys): the unit's rows (its group's heads'
 *     queries, as matrix_row), in groups of FMHA_MATRIX_DEC_BLOCKS blocks
 *     of 32, each group over the chunk's visible keys (one call, or one a
 *     page of a paged cache, the kernel resuming the group's partials);
 *     partial O [dvp], m and l of every row and chunk to the shared
 *     workspace. Where a key's kv heads lie side by side ([B, S, H, D],
 *     paged or not) a task takes every kv head of its batch element
 *     instead (fmha_matrix_decode_heads) and runs them MDEC_SUB keys at a
 *     time (never across a page), head after head, so that the cache is
 *     read front to back: one head over the whole chunk reads 256 bytes of
 *     every 2 KiB (bf16, Hkv 8, D 128), a walk the hardware prefetchers
 *     follow badly
 *   tasks (b, kv head, block of 32 rows): each row's chunks merged,
 *     M = max_c m_c, w_c = 2^((m_c - M) |scale| log2 e), O = sum_c w_c O_c,
 *     l = sum_c w_c l_c,
 *   and finished as the forward does. Bits do not depend on the thread
 *   count: the chunks are fixed by the shape. */

enum { MDEC_TASKS = 64, MDEC_MIN_CHUNK = 256,
       MDEC_BK = 128,
       /* a paged cache's kernel calls go page by page: pages of fewer keys
        * stay on the decode driver */
       MDEC_MIN_PAGE = 128,
       /* keys of a head's turn when a task runs several kv heads */
       MDEC_SUB = 256,
       /* the most kv heads a task runs */
       MDEC_MAX_HEADS = 16 };

/* Kv heads a task runs (the comment above): every kv head of a batch
 * element (up to MDEC_MAX_HEADS) when K's and V's heads are adjacent in
 * memory and a unit's rows take one kernel call; else 1. */
int64_t fmha_matrix_decode_heads(const fmha_plan *plan) {
    const fmha_problem *p = &plan->p;
    const int64_t rows = plan->group * p->seq_q;
    if (p->heads_kv == 1 || p->heads_kv > MDEC_MAX_HEADS || rows > (int64_t)FMHA_MATRIX_DEC_BLOCKS * MATRIX_BQ)
        return 1;
    return p->k_strides[2] == p->head_dim && p->v_strides[2] == p->head_dim_v ? p->heads_kv : 1;
}

/* Chunks of keys a unit's keys split into, and keys a chunk (a multiple of
 * MDEC_BK): about MDEC_TASKS tasks, a chunk at least MDEC_MIN_CHUNK keys and
 * at least 8x its partials' bytes in K and V (MLA's 128 rows of 512 floats
 * a chunk cost as much memory traffic as 1000 keys of the cache). A paged
 * cache's chunks are whole pages, as many as that rule asks. */
void fmha_matrix_decode_split(const fmha_plan *plan, int64_t *splits, int64_t *chunk) {
    const fmha_problem *p = &plan->p;
    const int64_t units = p->batch * p->heads_kv / fmha_matrix_decode_heads(plan), rows = plan->group * p->seq_q;
    const int64_t partial_bytes = rows * (int64_t)fmha_matrix_dvp((size_t)p->head_dim_v) * 4;
    int64_t least = 8 * partial_bytes / ((p->head_dim + p->head_dim_v) * 2);
    if (least < MDEC_MIN_CHUNK) least = MDEC_MIN_CHUNK;
    int64_t n = (MDEC_TASKS + units - 1) / units, most = (p->seq_kv + least - 1) / least;
    if (n > most) n = most;
    if (n < 1) n = 1;
    int64_t c = (p->seq_kv + n - 1) / n;
    c = (c + MDEC_BK - 1) / MDEC_BK * MDEC_BK;
    if (p->block_table) c = (c + p->page_size - 1) / p->page_size * p->page_size;
    *chunk = c;
    *splits = (p->seq_kv + c - 1) / c;
}

int fmha_matrix_decode_plan(const fmha_plan *plan) {
    const fmha_problem *p = &plan->p;
    if (!plan->uk->matrix.decode || plan->k_format != FMHA_FORMAT_BF16 || plan->v_format != FMHA_FORMAT_BF16) return 0;
    /* a bf16 query at FAST, or a float32 one at BF16 (rounded to bf16 as it is packed) */
    const int bf16_q = p->dtype == FMHA_DTYPE_BF16 && plan->precision == FMHA_PRECISION_FAST;
    const int f32_q = p->dtype == FMHA_DTYPE_F32 && plan->precision == FMHA_PRECISION_BF16;
    if (!(bf16_q || f32_q) || (p->block_table && p->page_size < MDEC_MIN_PAGE)) return 0;
    /* a paged cache takes a decode driver whatever the strategy */
    if (p->strategy != FMHA_STRATEGY_AUTO && !p->block_table) return 0;
    if (p->head_dim % 32 || !fmha_plan_rows_contiguous(plan) || !fmha_plan_decode_shape(plan)) return 0;
    if (plan->has_bias || plan->dropout || !fmha_plan_keys_one_range(plan)) return 0;
    return plan->group * p->seq_q >= plan->uk->tuning->matrix_decode_rows; /* default 8 */
}

/* Scratch of a task, for up to NB = FMHA_MATRIX_DEC_BLOCKS row blocks of
 * each of its H = fmha_matrix_decode_heads kv heads: qt [H][NB][D / 32][2][16][16]
 * words; lo, hi [H][NB][32]; s [NB][128][32]; p
 * [NB][32][128] bf16; vb [4][dvp / 16][16][16] words; k_tail [32][D] bf16; o [dvp] (the
 * merge's row). */
typedef struct mdec_scratch {
    uint32_t *qt, *vb;
    float *o, *s;
    uint16_t *p, *k_tail;
    int64_t *lo, *hi;
} mdec_scratch;

static void mdec_carve(const fmha_plan *plan, fmha_carver *c, mdec_scratch *s) {
    const size_t d = (size_t)plan->p.head_dim, dvp = fmha_matrix_dvp((size_t)plan->p.head_dim_v);
    const size_t nb = FMHA_MATRIX_DEC_BLOCKS, heads = (size_t)fmha_matrix_decode_heads(plan);
    s->qt = fmha_carve(c, heads * nb * d / 32 * 512 * sizeof(uint32_t));
    s->vb = fmha_carve(c, MDEC_BK / 32 * dvp / 16 * 256 * sizeof(uint32_t));
    s->o = fmha_carve(c, dvp * sizeof(float));
    s->s = fmha_carve(c, nb * MDEC_BK * MATRIX_BQ * sizeof(float));
    s->p = fmha_carve(c, nb * MATRIX_BQ * MDEC_BK * sizeof(uint16_t));
    s->k_tail = fmha_carve(c, MATRIX_BQ * d * sizeof(uint16_t));
    s->lo = fmha_carve(c, heads * nb * MATRIX_BQ * sizeof(int64_t));
    s->hi = fmha_carve(c, heads * nb * MATRIX_BQ * sizeof(int64_t));
}

/* Shared: every (unit, chunk, row)'s partial O [dvp], m and l (the part's
 * outputs, written in place: a unit's rows are whole blocks). */
static size_t mdec_rows(const fmha_plan *plan) {
    return (size_t)fmha_round_up((size_t)(plan->group * plan->p.seq_q), MATRIX_BQ);
}

static void mdec_carve_shared(const fmha_plan *plan, fmha_carver *c, float **part_o, float **part_m,
                              float **part_l) {
    int64_t splits, chunk;
    fmha_matrix_decode_split(plan, &splits, &chunk);
    const size_t n = (size_t)(plan->p.batch * plan->p.heads_kv) * (size_t)splits * mdec_rows(plan);
    *part_o = fmha_carve(c, n * fmha_matrix_dvp((size_t)plan->p.head_dim_v) * sizeof(float));
    *part_m = fmha_carve(c, n * sizeof(float));
    *part_l = fmha_carve(c, n * sizeof(float));
}

fmha_ws_size fmha_matrix_decode_workspace(const fmha_plan *plan) {
    fmha_carver t = {0}, sh = {0};
    mdec_scratch s;
    float *o, *m, *l;
    mdec_carve(plan, &t, &s);
    mdec_carve_shared(plan, &sh, &o, &m, &l);
    return (fmha_ws_size){t.used, sh.used};
}

typedef struct mdec_ctx {
    matrix_ctx m;        /* plan, tensors, workspace (the guarded rows' reads) */
    int64_t splits, chunk;
    size_t rows;         /* rows of a unit, whole blocks */
    float *part_o, *part_m, *part_l;
} mdec_ctx;

/* The partials of (unit, chunk, row). */
static size_t mdec_at(const mdec_ctx *c, size_t unit, int64_t split, size_t row) {
    return (unit * (size_t)c->splits + (size_t)split) * c->rows + row;
}

/* The arguments for rows [g0, g0 + group) of unit (b, hk) against chunk
 * `split` ([c0, c1)), all but K's and V's rows: its rows' Q^T blocks packed
 * into qt, their key ranges into lo and hi, the keys [kb, ke) (the union
 * of the rows' ranges) and its partials' place. */
static fmha_matrix_dec_args mdec_call(const mdec_ctx *c, const mdec_scratch *s, int64_t b, int64_t hk, int64_t g0,
                                      int64_t split, uint32_t *qt, int64_t *lo_all, int64_t *hi_all) {
    const fmha_plan *plan = c->m.plan;
    const fmha_problem *p = &plan->p;
    const int64_t c0 = split * c->chunk, c1 = c0 + c->chunk < p->seq_kv ? c0 + c->chunk : p->seq_kv;
    /* Q's elements es bytes (bf16 or float32), K's and V's 2 (bf16) */
    const int64_t unit_rows = plan->group * p->seq_q, es = (int64_t)fmha_dtype_size(p->dtype), kv_es = 2;
    const int q_src = p->dtype == FMHA_DTYPE_F32 ? FMHA_MATRIX_SRC_F32 : FMHA_MATRIX_SRC_BF16;
    const int64_t *qs = p->q_strides, *ks = p->k_strides, *vs = p->v_strides;
    const size_t dvp = fmha_matrix_dvp((size_t)p->head_dim_v);
    const int64_t q_len = p->masks.q_lengths ? p->masks.q_lengths[b] : p->seq_q;
    const int64_t group_rows = (int64_t)FMHA_MATRIX_DEC_BLOCKS * MATRIX_BQ;
    const int64_t n_rows = unit_rows - g0 < group_rows ? unit_rows - g0 : group_rows;
    const size_t nb = (size_t)((n_rows + MATRIX_BQ - 1) / MATRIX_BQ);
    /* each row's visible keys within the chunk; the call's keys: their union */
    int64_t kb = c1, ke = c0;
    for (size_t blk = 0; blk < nb; blk++) {
        const int64_t r0 = g0 + (int64_t)blk * MATRIX_BQ;
        const int64_t nq = unit_rows - r0 < MATRIX_BQ ? unit_rows - r0 : MATRIX_BQ;
        const void *q_rows[MATRIX_BQ];
        int64_t *lo = lo_all + blk * MATRIX_BQ, *hi = hi_all + blk * MATRIX_BQ;
        for (int64_t r = 0; r < nq; r++) {
            int64_t h, i;
            matrix_row(plan, hk, r0 + r, &h, &i);
            q_rows[r] = c->m.q + (b * qs[0] + i * qs[1] + h * qs[2]) * es;
            fmha_tile_pos row = {b, h, i, 1, 0, 0};
            fmha_mask_kv_range(plan, &row, &lo[r], &hi[r]);
            if (i >= q_len) lo[r] = hi[r] = 0;
            if (lo[r] < c0) lo[r] = c0;
            if (hi[r] > c1) hi[r] = c1;
            if (hi[r] > lo[r]) {
                if (lo[r] < kb) kb = lo[r];
                if (hi[r] > ke) ke = hi[r];
            }
        }
        plan->uk->matrix.pack_qt((size_t)nq, (size_t)p->head_dim, q_rows, q_src, qs[3], plan->scale < 0.0f,
                                 qt + blk * (size_t)p->head_dim / 32 * 512);
    }
    if (ke < kb) ke = kb;
    const size_t at = mdec_at(c, (size_t)(b * p->heads_kv + hk), split, (size_t)g0);
    return (fmha_matrix_dec_args){
        .nb = nb, .nq = (size_t)(n_rows - (int64_t)(nb - 1) * MATRIX_BQ), .d = (size_t)p->head_dim,
        .dv = (size_t)p->head_dim_v, .dvp = dvp, .qt = qt, .k_rs = (ptrdiff_t)(ks[1] * kv_es),
        .v_rs = (ptrdiff_t)(vs[1] * kv_es), .kb = kb, .ke = ke, .lo = lo_all, .hi = hi_all,
        .scale_log2 = fabsf(plan->scale) * (float)M_LOG2E,
        .rescale_log2 = (float)plan->uk->tuning->matrix_rescale_log2, .o = c->part_o + at * dvp,
        .m = c->part_m + at, .l = c->part_l + at, .s = s->s, .p = s->p, .vb = s->vb, .k_tail = s->k_tail};
}

/* The end of a call's keys from a0: ke, or `turn` keys on, or the end of
 * a0's page, whichever comes first. */
static int64_t mdec_turn_end(const fmha_problem *p, int64_t a0, int64_t ke, int64_t turn) {
    int64_t a1 = ke - a0 < turn ? ke : a0 + turn;
    if (p->block_table && (a0 / p->page_size + 1) * p->page_size < a1) a1 = (a0 / p->page_size + 1) * p->page_size;
    return a1;
}

/* Task (unit of kv heads, chunk): each group of a head's rows over the
 * chunk's keys in calls that never cross a page (a contiguous run of
 * rows, based through the table), the kernel resuming the group's
 * partials; with several heads (fmha_matrix_decode_heads) the heads take
 * turns of MDEC_SUB keys, head after head, each call sending the next
 * call's first keys towards L2. */
static void mdec_task(void *vctx, size_t task, int thread) {
    const mdec_ctx *c = vctx;
    const fmha_plan *plan = c->m.plan;
    const fmha_problem *p = &plan->p;
    const int64_t heads = fmha_matrix_decode_heads(plan);
    const int64_t unit0 = (int64_t)(task / (size_t)c->splits) * heads;
    const int64_t split = (int64_t)(task % (size_t)c->splits);
    const int64_t b = unit0 / p->heads_kv, hk0 = unit0 % p->heads_kv;
    const int64_t unit_rows = plan->group * p->seq_q, kv_es = 2, turn = heads > 1 ? MDEC_SUB : INT64_MAX;
    const int64_t *ks = p->k_strides, *vs = p->v_strides;
    const size_t range = (size_t)FMHA_MATRIX_DEC_BLOCKS * MATRIX_BQ;
    const size_t qt_words = (size_t)FMHA_MATRIX_DEC_BLOCKS * (size_t)p->head_dim / 32 * 512;
    mdec_scratch s;
    fmha_carver carver = {c->m.ws + (size_t)thread * plan->thread_bytes, 0};
    mdec_carve(plan, &carver, &s);
    const fmha_uk_matrix *mx = &plan->uk->matrix;
    /* heads > 1 only where a head's rows are one group */
    for (int64_t g0 = 0; g0 < unit_rows; g0 += (int64_t)range) {
        fmha_matrix_dec_args call[MDEC_MAX_HEADS];
        int64_t next[MDEC_MAX_HEADS]; /* each head's next key */
        for (int64_t hh = 0; hh < heads; hh++) {
            call[hh] = mdec_call(c, &s, b, hk0 + hh, g0, split, s.qt + (size_t)hh * qt_words,
                                 s.lo + (size_t)hh * range, s.hi + (size_t)hh * range);
            next[hh] = call[hh].kb;
        }
        for (int first = 1, more = 1; more; first = 0) {
            more = 0;
            for (int64_t hh = 0; hh < heads; hh++) {
                fmha_matrix_dec_args a = call[hh];
                const int64_t a0 = next[hh], hk = hk0 + hh;
                if (!first && a0 >= a.ke) continue;
                const int64_t a1 = mdec_turn_end(p, a0, a.ke, turn);
                if (a1 > a0) {
                    a.k = c->m.k + fmha_kv_row_at(p, ks, b, hk, a0) * kv_es;
                    a.v = c->m.v + fmha_kv_row_at(p, vs, b, hk, a0) * kv_es;
                } else { /* no keys (the partials set to none): nothing read, no table entry either */
                    a.k = c->m.k, a.v = c->m.v;
                }
                a.kb = a0, a.ke = a1 > a0 ? a1 : a0;
                a.resume = a0 > call[hh].kb, a.unfinished = a1 < call[hh].ke;
                next[hh] = a1;
                /* the next call's keys: the next head's turn, or the first head's next one */
                const int64_t nh = hh + 1 < heads ? hh + 1 : 0, n0 = next[nh];
                if (n0 < call[nh].ke && (heads > 1 || a.unfinished)) {
                    a.next_k = c->m.k + fmha_kv_row_at(p, ks, b, hk0 + nh, n0) * kv_es;
                    a.next_v = c->m.v + fmha_kv_row_at(p, vs, b, hk0 + nh, n0) * kv_es;
                    a.next_n = (size_t)(mdec_turn_end(p, n0, call[nh].ke, turn) - n0);
                }
                mx->decode(&a);
                more |= a.unfinished;
            }
        }
    }
}

/* o += w x over n floats (restrict: the compiler's vectorizer takes it at -O2). */
static void mdec_axpy(float *restrict o, const float *restrict x, float w, size_t n) {
    for (size_t e = 0; e < n; e++) o[e] += w * x[e];
}

/* Task (unit, row block): each row's chunks merged in order, finished and stored. */
static void mdec_merge_task(void *vctx, size_t task, int thread) {
    const mdec_ctx *c = vctx;
    const fmha_plan *plan = c->m.plan;
    const fmha_problem *p = &plan->p;
    const size_t blocks = c->rows / MATRIX_BQ, unit = task / blocks;
    const int64_t b = (int64_t)unit / p->heads_kv, hk = (int64_t)unit % p->heads_kv;
    const int64_t r0 = (int64_t)(task % blocks) * MATRIX_BQ, unit_rows = plan->group * p->seq_q;
    const size_t dvp = fmha_matrix_dvp((size_t)p->head_dim_v);
    const int64_t *os = p->o_strides;
    const float abs_scale = fabsf(plan->scale), c1 = abs_scale * (float)M_LOG2E;
    mdec_scratch s;
    fmha_carver carver = {c->m.ws + (size_t)thread * plan->thread_bytes, 0};
    mdec_carve(plan, &carver, &s);
    float *o = s.o; /* one row [dvp] */
    for (int64_t r = r0; r < r0 + MATRIX_BQ && r < unit_rows; r++) {
        int64_t h, i;
        matrix_row(plan, hk, r, &h, &i);
        float m_max = -INFINITY;
        for (int64_t sp = 0; sp < c->splits; sp++)
            m_max = fmha_partials_max(m_max, c->part_m[mdec_at(c, unit, sp, (size_t)r)]);
        float l = 0.0f;
        int nonfinite = 0;
        memset(o, 0, dvp * sizeof(float));
        for (int64_t sp = 0; sp < c->splits; sp++) {
            const size_t at = mdec_at(c, unit, sp, (size_t)r);
            const float m = c->part_m[at];
            if (!fmha_partial_counts(m)) continue; /* a chunk this row saw no key of */
            const float w = m_max == -INFINITY ? 1.0f : exp2f((m - m_max) * c1);
            l += w * c->part_l[at];
            mdec_axpy(o, c->part_o + at * dvp, w, dvp);
        }
        for (int64_t e = 0; e < p->head_dim_v; e++) nonfinite |= !isfinite(o[e]);
        float o_scale, row_lse;
        fmha_row_finish(plan, h, m_max == -INFINITY ? -INFINITY : m_max * abs_scale, l, &o_scale, &row_lse);
        if (c->m.lse) c->m.lse[(b * p->heads_q + h) * p->seq_q + i] = row_lse;
        if (nonfinite && isfinite(l)) { /* a NaN or inf of V at a key with P = 0 */
            fmha_tile_pos row = {b, h, i, 1, 0, 0};
            int64_t lo, hi;
            fmha_mask_kv_range(plan, &row, &lo, &hi);
            matrix_row_guarded(&c->m, b, h, i, lo, hi, m_max, o_scale, 0, &row_lse);
        } else {
            fmha_store_row_uk(plan->uk, c->m.o, plan->o_dtype, b * os[0] + i * os[1] + h * os[2], os[3], p->head_dim_v,
                              o, o_scale);
        }
    }
}

void fmha_matrix_decode_run(fmha_plan *run, const void *q, const void *k, const void *v, void *o, float *lse,
                            char *ws) {
    const fmha_problem *p = &run->p;
    mdec_ctx c = {.m = {.plan = run, .q = q, .k = k, .v = v, .o = o, .lse = lse, .ws = ws}};
    fmha_matrix_decode_split(run, &c.splits, &c.chunk);
    c.rows = mdec_rows(run);
    fmha_carver sh = {ws + (size_t)run->threads * run->thread_bytes, 0};
    mdec_carve_shared(run, &sh, &c.part_o, &c.part_m, &c.part_l);
    const size_t units = (size_t)(p->batch * p->heads_kv);
    fmha_run_parallel(run, units / (size_t)fmha_matrix_decode_heads(run) * (size_t)c.splits, mdec_task, &c);
    fmha_run_parallel(run, units * (c.rows / MATRIX_BQ), mdec_merge_task, &c);
}
