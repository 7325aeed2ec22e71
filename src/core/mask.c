/* mask.c: which tiles and scores a query may see. Every mask (the causal
 * and sliding-window band, key and query lengths, segment ids, a dense
 * boolean tensor, a user callback) answers through the same calls: classify
 * a tile (EMPTY: skipped, never computed; FULL: no masking work; PARTIAL),
 * the range of keys a block of queries may see, and apply to a PARTIAL tile.
 * Masks compose by AND: a tile is EMPTY if one mask empties it, FULL only if
 * every mask leaves it whole. */
#include <math.h>
#include <stdatomic.h>
#include <string.h>

#include "core/attn.h"
#include "runtime/checked.h"
#include "runtime/error.h"

static atomic_llong tiles_computed;
void fmha_tiles_reset(void) { atomic_store(&tiles_computed, 0); }
long long fmha_tiles_computed(void) { return atomic_load(&tiles_computed); }
void fmha_tiles_count(long long n) {
    if (n) atomic_fetch_add_explicit(&tiles_computed, n, memory_order_relaxed);
}

/* Largest element offset of a dense [B, Hq, Sq, Skv] tensor with strides st
 * (>= 0), or -1 when it exceeds INT64_MAX / 8 or a size is < 1 (computed
 * without overflow, for any sizes). */
static int64_t dense_span(const fmha_problem *p, const int64_t st[4]) {
    const int64_t ext[4] = {p->batch, p->heads_q, p->seq_q, p->seq_kv};
    int64_t span = 0, step;
    for (int i = 0; i < 4; i++)
        if (ext[i] < 1 || __builtin_mul_overflow(st[i], ext[i] - 1, &step) ||
            __builtin_add_overflow(span, step, &span) || span > INT64_MAX / 8)
            return -1;
    return span;
}

fmha_status fmha_dense_check(const fmha_problem *p, const int64_t st[4], const char *name) {
    for (int i = 0; i < 4; i++)
        if (st[i] < 0)
            return fmha_fail(FMHA_ERR_BAD_STRIDE, "%s_strides[%d] must not be negative, got %lld", name, i,
                             (long long)st[i]);
    if (dense_span(p, st) < 0) return fmha_fail(FMHA_ERR_BAD_SIZE, "%s spans more than 2^60 elements", name);
    return FMHA_OK;
}

fmha_status fmha_masks_check(const fmha_problem *p) {
    const fmha_masks *m = &p->masks;
    if (m->window_left < -1 || m->window_right < -1)
        return fmha_fail(FMHA_ERR_BAD_MASK, "masks.window_left and window_right must be -1 (unbounded) or >= 0, got %lld "
                         "and %lld", (long long)m->window_left, (long long)m->window_right);
    if (!m->q_segment_ids != !m->kv_segment_ids)
        return fmha_fail(FMHA_ERR_BAD_MASK, "masks.q_segment_ids and kv_segment_ids must be set together, got only %s",
                         m->q_segment_ids ? "q_segment_ids" : "kv_segment_ids");
    for (int64_t b = 0; (m->kv_lengths || m->q_lengths) && b < p->batch; b++) {
        if (m->kv_lengths && (m->kv_lengths[b] < 0 || m->kv_lengths[b] > p->seq_kv))
            return fmha_fail(FMHA_ERR_BAD_MASK, "masks.kv_lengths[%lld] must lie in 0..seq_kv = %lld, got %d",
                             (long long)b, (long long)p->seq_kv, (int)m->kv_lengths[b]);
        if (m->q_lengths && (m->q_lengths[b] < 0 || m->q_lengths[b] > p->seq_q))
            return fmha_fail(FMHA_ERR_BAD_MASK, "masks.q_lengths[%lld] must lie in 0..seq_q = %lld, got %d",
                             (long long)b, (long long)p->seq_q, (int)m->q_lengths[b]);
    }
    fmha_status st = m->dense ? fmha_dense_check(p, m->dense_strides, "masks.dense") : FMHA_OK;
    if (st != FMHA_OK) return st;
    if (m->callback.classify && !m->callback.fill)
        return fmha_fail(FMHA_ERR_BAD_MASK, "masks.callback.classify is set without callback.fill");
    return fmha_pages_check(p);
}

/* The block table entries of the pages each sequence's keys occupy (read at
 * every run, like the lengths): in [0, num_pages). */
fmha_status fmha_pages_check(const fmha_problem *p) {
    if (!p->block_table) return FMHA_OK;
    for (int64_t b = 0; b < p->batch; b++) {
        int64_t keys = p->masks.kv_lengths ? p->masks.kv_lengths[b] : p->seq_kv;
        const int32_t *row = p->block_table + b * p->block_table_stride;
        for (int64_t pg = 0; pg < (keys + p->page_size - 1) / p->page_size; pg++)
            if (row[pg] < 0 || row[pg] >= p->num_pages)
                return fmha_fail(FMHA_ERR_BAD_PAGE, "block_table[%lld][%lld] must lie in 0..num_pages - 1 = %lld, got %d",
                                 (long long)b, (long long)pg, (long long)p->num_pages - 1, (int)row[pg]);
    }
    return FMHA_OK;
}

int fmha_masks_active(const fmha_problem *p) {
    const fmha_masks *m = &p->masks;
    return m->kv_lengths || m->q_lengths || m->q_segment_ids || m->dense || m->callback.fill;
}

size_t fmha_mask_scratch_bytes(const fmha_plan *plan) {
    if (!plan->p.masks.callback.fill) return 0;
    /* every strategy applies masks on the tiled grid: block_kv keys a tile */
    return fmha_round_up(plan->uk->tile.block_kv * plan->uk->tile.nr, FMHA_ALIGN);
}

int64_t fmha_causal_off(const fmha_plan *plan, int64_t b) {
    const fmha_masks *m = &plan->p.masks;
    if (!plan->bottom_right || (!m->kv_lengths && !m->q_lengths))
        return plan->causal_offset;
    /* each sequence's own lengths: its last query meets its last key */
    int64_t kv = m->kv_lengths ? m->kv_lengths[b] : plan->p.seq_kv;
    int64_t q = m->q_lengths ? m->q_lengths[b] : plan->p.seq_q;
    return kv - q;
}

/* d = j - (i + off) over the tile: [d_min, d_max]. */
static void band_span(const fmha_plan *plan, const fmha_tile_pos *t, int64_t *d_min, int64_t *d_max) {
    int64_t off = fmha_causal_off(plan, t->b);
    *d_min = t->k0 - (t->q0 + t->nq - 1) - off;
    *d_max = t->k0 + t->nk - 1 - t->q0 - off;
}

static int classify_band(const fmha_plan *plan, const fmha_tile_pos *t) {
    int64_t d_min, d_max;
    band_span(plan, t, &d_min, &d_max);
    if (d_max < plan->band_lo || d_min > plan->band_hi) return FMHA_TILE_EMPTY;
    if (d_min >= plan->band_lo && d_max <= plan->band_hi) return FMHA_TILE_FULL;
    return FMHA_TILE_PARTIAL;
}

static int classify_lengths(const fmha_plan *plan, const fmha_tile_pos *t) {
    const fmha_masks *m = &plan->p.masks;
    int cls = FMHA_TILE_FULL;
    if (m->q_lengths) {
        int64_t n = m->q_lengths[t->b];
        if (t->q0 >= n) return FMHA_TILE_EMPTY;
        if (t->q0 + t->nq > n) cls = FMHA_TILE_PARTIAL;
    }
    if (m->kv_lengths) {
        int64_t n = m->kv_lengths[t->b];
        if (t->k0 >= n) return FMHA_TILE_EMPTY;
        if (t->k0 + t->nk > n) cls = FMHA_TILE_PARTIAL;
    }
    return cls;
}

static void id_range(const int32_t *ids, int64_t n, int32_t *lo, int32_t *hi) {
    *lo = *hi = ids[0];
    for (int64_t i = 1; i < n; i++) {
        if (ids[i] < *lo) *lo = ids[i];
        if (ids[i] > *hi) *hi = ids[i];
    }
}

static int classify_segments(const fmha_plan *plan, const fmha_tile_pos *t) {
    const fmha_masks *m = &plan->p.masks;
    int32_t qlo, qhi, klo, khi;
    id_range(m->q_segment_ids + t->b * plan->p.seq_q + t->q0, t->nq, &qlo, &qhi);
    id_range(m->kv_segment_ids + t->b * plan->p.seq_kv + t->k0, t->nk, &klo, &khi);
    if (qhi < klo || khi < qlo) return FMHA_TILE_EMPTY;
    if (qlo == qhi && klo == khi && qlo == klo) return FMHA_TILE_FULL;
    return FMHA_TILE_PARTIAL;
}

static const uint8_t *dense_at(const fmha_plan *plan, const fmha_tile_pos *t, int64_t i, int64_t r) {
    const int64_t *s = plan->p.masks.dense_strides;
    return plan->p.masks.dense + t->b * s[0] + t->h * s[1] + (t->q0 + i) * s[2] + (t->k0 + r) * s[3];
}

static int classify_dense(const fmha_plan *plan, const fmha_tile_pos *t) {
    int any_on = 0, any_off = 0;
    for (int64_t i = 0; i < t->nq && !(any_on && any_off); i++)
        for (int64_t r = 0; r < t->nk; r++) {
            if (*dense_at(plan, t, i, r)) any_on = 1;
            else any_off = 1;
        }
    return !any_on ? FMHA_TILE_EMPTY : any_off ? FMHA_TILE_PARTIAL : FMHA_TILE_FULL;
}

static fmha_tile public_tile(const fmha_tile_pos *t, size_t lds, int thread) {
    return (fmha_tile){t->b, t->h, t->q0, t->nq, t->k0, t->nk, 1, (ptrdiff_t)lds, thread};
}

static int classify_callback(const fmha_plan *plan, const fmha_tile_pos *t, int thread) {
    const fmha_mask_callback *cb = &plan->p.masks.callback;
    if (!cb->classify) return FMHA_TILE_PARTIAL;
    fmha_tile pt = public_tile(t, plan->uk->tile.nr, thread);
    int c = cb->classify(cb->ctx, &pt);
    fmha_after_callback(plan);
    if (c == FMHA_TILE_CLASS_EMPTY) return FMHA_TILE_EMPTY;
    if (c == FMHA_TILE_CLASS_FULL) return FMHA_TILE_FULL;
    if (c == FMHA_TILE_CLASS_PARTIAL) return FMHA_TILE_PARTIAL;
    return -1;
}

/* AND of classes: EMPTY wins, then PARTIAL, then FULL. */
static int class_and(int a, int b) {
    if (a < 0 || b < 0) return -1;
    if (a == FMHA_TILE_EMPTY || b == FMHA_TILE_EMPTY) return FMHA_TILE_EMPTY;
    return a == FMHA_TILE_PARTIAL || b == FMHA_TILE_PARTIAL ? FMHA_TILE_PARTIAL : FMHA_TILE_FULL;
}

int fmha_mask_classify(const fmha_plan *plan, const fmha_tile_pos *t, int thread) {
    int cls = classify_band(plan, t);
    if (cls == FMHA_TILE_EMPTY || !plan->has_mask) return cls;
    const fmha_masks *m = &plan->p.masks;
    if (m->q_lengths || m->kv_lengths) cls = class_and(cls, classify_lengths(plan, t));
    if (cls != FMHA_TILE_EMPTY && m->q_segment_ids) cls = class_and(cls, classify_segments(plan, t));
    if (cls != FMHA_TILE_EMPTY && m->dense) cls = class_and(cls, classify_dense(plan, t));
    if (cls != FMHA_TILE_EMPTY && m->callback.fill) cls = class_and(cls, classify_callback(plan, t, thread));
    return cls;
}

/* The band clamped to [-(Sq + Skv), Sq + Skv]: every d = j - (i + off) of the
 * problem lies strictly inside, so visibility is unchanged, and with Sq, Skv
 * <= 2^40 (fmha_problem_check) sums of a band edge and an index cannot
 * overflow whatever the window (INT64_MAX included). */
static void band_clamped(const fmha_plan *plan, int64_t *lo, int64_t *hi) {
    int64_t reach = plan->p.seq_q + plan->p.seq_kv;
    *lo = plan->band_lo < -reach ? -reach : plan->band_lo;
    *hi = plan->band_hi > reach ? reach : plan->band_hi;
}

void fmha_band_kv_range(const fmha_plan *plan, int64_t b, int64_t q_first, int64_t q_last, int64_t *k_begin,
                        int64_t *k_end) {
    int64_t lo = 0, hi = plan->p.seq_kv, off = fmha_causal_off(plan, b);
    /* i + off is within [-Sq, Sq + Skv]; only the band's edges can overflow */
    int64_t first = fmha_sat_add(q_first + off, plan->band_lo); /* first key of the first query */
    if (first > lo) lo = first;
    int64_t last = fmha_sat_add(q_last + off, plan->band_hi); /* last key of the last query */
    if (last < hi - 1) hi = last + 1;
    if (hi < lo) hi = lo;
    *k_begin = lo;
    *k_end = hi;
}

void fmha_mask_kv_range(const fmha_plan *plan, const fmha_tile_pos *t, int64_t *k_begin,
                        int64_t *k_end) {
    int64_t lo, hi;
    fmha_band_kv_range(plan, t->b, t->q0, t->q0 + t->nq - 1, &lo, &hi);
    if (plan->p.masks.kv_lengths && plan->p.masks.kv_lengths[t->b] < hi) hi = plan->p.masks.kv_lengths[t->b];
    if (hi < lo) hi = lo;
    *k_begin = lo;
    *k_end = hi;
}

void fmha_mask_q_range(const fmha_plan *plan, int64_t b, int64_t k0, int64_t nk, int64_t *q_begin,
                       int64_t *q_end) {
    int64_t lo = 0, hi = plan->p.seq_q, off = fmha_causal_off(plan, b), band_lo, band_hi;
    band_clamped(plan, &band_lo, &band_hi);
    /* query i sees some key of the block iff band_lo <= j - i - off <= band_hi for a j in it */
    if (k0 - off - band_hi > lo) lo = k0 - off - band_hi;
    if (k0 + nk - off - band_lo < hi) hi = k0 + nk - off - band_lo;
    if (plan->p.masks.q_lengths && plan->p.masks.q_lengths[b] < hi) hi = plan->p.masks.q_lengths[b];
    if (hi < lo) hi = lo;
    *q_begin = lo;
    *q_end = hi;
}

void fmha_mask_apply(const fmha_plan *plan, const fmha_tile_pos *t, float *st, size_t lds,
                     unsigned char *scratch, int thread) {
    const fmha_masks *m = &plan->p.masks;
    int64_t off = fmha_causal_off(plan, t->b), band_lo, band_hi;
    band_clamped(plan, &band_lo, &band_hi);
    for (int64_t r = 0; r < t->nk; r++) {
        int64_t j = t->k0 + r;
        float *row = st + (size_t)r * lds;
        /* band: visible lanes i with band_lo <= j - (q0 + i + off) <= band_hi */
        int64_t i_lo = 0, i_hi = t->nq; /* visible lanes [i_lo, i_hi) */
        int64_t v = j - t->q0 - off - band_hi; /* i >= v */
        if (v > i_lo) i_lo = v;
        v = j - t->q0 - off - band_lo + 1; /* i < v */
        if (v < i_hi) i_hi = v;
        if (m->q_lengths && m->q_lengths[t->b] - t->q0 < i_hi) i_hi = m->q_lengths[t->b] - t->q0;
        if (m->kv_lengths && j >= m->kv_lengths[t->b]) i_hi = i_lo;
        if (i_hi < i_lo) i_hi = i_lo;
        if (i_lo > t->nq) i_lo = i_hi = t->nq;
        for (int64_t i = 0; i < i_lo; i++) row[i] = -INFINITY;
        for (int64_t i = i_hi; i < t->nq; i++) row[i] = -INFINITY;
        if (m->q_segment_ids) {
            int32_t kid = m->kv_segment_ids[t->b * plan->p.seq_kv + j];
            const int32_t *qid = m->q_segment_ids + t->b * plan->p.seq_q + t->q0;
            for (int64_t i = i_lo; i < i_hi; i++)
                if (qid[i] != kid) row[i] = -INFINITY;
        }
        if (m->dense)
            for (int64_t i = i_lo; i < i_hi; i++)
                if (!*dense_at(plan, t, i, r)) row[i] = -INFINITY;
    }
    if (m->callback.fill) {
        size_t nr = plan->uk->tile.nr;
        memset(scratch, 1, (size_t)t->nk * nr);
        fmha_tile pt = public_tile(t, nr, thread);
        m->callback.fill(m->callback.ctx, &pt, scratch);
        fmha_after_callback(plan);
        for (int64_t r = 0; r < t->nk; r++)
            for (int64_t i = 0; i < t->nq; i++)
                if (!scratch[(size_t)r * nr + (size_t)i]) st[(size_t)r * lds + (size_t)i] = -INFINITY;
    }
}

fmha_status fmha_mask_precheck(const fmha_plan *plan) {
    if (!plan->p.masks.callback.classify) return FMHA_OK;
    const fmha_problem *p = &plan->p;
    int64_t nr = (int64_t)plan->uk->tile.nr, bc = (int64_t)plan->uk->tile.block_kv;
    for (int64_t b = 0; b < p->batch; b++)
        for (int64_t h = 0; h < p->heads_q; h++)
            for (int64_t q0 = 0; q0 < p->seq_q; q0 += nr)
                for (int64_t k0 = 0; k0 < p->seq_kv; k0 += bc) {
                    fmha_tile_pos t = {b, h, q0, p->seq_q - q0 < nr ? p->seq_q - q0 : nr, k0,
                                       p->seq_kv - k0 < bc ? p->seq_kv - k0 : bc};
                    if (classify_callback(plan, &t, 0) < 0)
                        return fmha_fail(FMHA_ERR_CALLBACK,
                                         "masks.callback.classify answered an invalid class for the tile of batch %lld, "
                                         "head %lld, queries from %lld, keys from %lld",
                                         (long long)b, (long long)h, (long long)q0, (long long)k0);
                }
    return FMHA_OK;
}
