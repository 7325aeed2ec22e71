/* bias.c: the additive score terms and their gradients. Forward epilogue of
 * a computed S^T tile: softcap, then the dense bias, ALiBi and the relative-
 * position table, then a bias callback. ALiBi and the table depend only on
 * a = i + off - j, so per call they are folded into one vector per head (a
 * Toeplitz row) and a tile row is a contiguous slice of it; the decode
 * driver's rows take softcap and ALiBi from the same definitions
 * (fmha_bias_row). The backward
 * turns dS tiles into the gradients of these parameters with fixed-order
 * sums: float32 within a tile, float64 across tiles. */
#include <math.h>
#include <string.h>

#include "core/attn.h"
#include "runtime/error.h"

int32_t fmha_rel_bucket(int64_t rel, int32_t num_buckets, int32_t max_distance, int bidirectional) {
    if (num_buckets < 1) return -1; /* no bucket */
    int32_t base = 0, nb = num_buckets;
    int64_t n = rel == INT64_MIN ? INT64_MAX : -rel; /* distance looking back, saturated */
    if (bidirectional) {
        nb /= 2;
        if (n < 0) base = nb;
        n = n < 0 ? -n : n;
    } else if (n < 0) {
        n = 0;
    }
    if (nb <= 1) return base < num_buckets ? base : num_buckets - 1;
    int32_t max_exact = nb / 2;
    if (n < max_exact) return base + (int32_t)n;
    int64_t large = nb - 1;
    if (max_distance > max_exact) {
        /* log-spaced buckets; +1e-9 puts mathematically exact boundaries in
         * the upper bucket whatever the rounding of log */
        double v = max_exact + log((double)n / max_exact) / log((double)max_distance / max_exact) *
                                   (nb - max_exact) + 1e-9;
        if (v < (double)large) large = (int64_t)v;
    }
    return base + (int32_t)large;
}

fmha_status fmha_biases_check(const fmha_problem *p) {
    const fmha_biases *bs = &p->biases;
    fmha_status st = bs->dense ? fmha_dense_check(p, bs->dense_strides, "biases.dense") : FMHA_OK;
    if (st != FMHA_OK) return st;
    if (bs->rel_table && (bs->rel_num_buckets < 1 || bs->rel_max_distance < 1))
        return fmha_fail(FMHA_ERR_BAD_MASK,
                         "biases.rel_num_buckets and rel_max_distance must be at least 1 with a rel_table, got %lld "
                         "and %lld",
                         (long long)bs->rel_num_buckets, (long long)bs->rel_max_distance);
    if (bs->softcap != 0.0f && !(bs->softcap > 0.0f && isfinite(bs->softcap)))
        return fmha_fail(FMHA_ERR_BAD_MASK, "biases.softcap must be 0 (off) or positive and finite, got %g",
                         (double)bs->softcap);
    if (bs->callback.accumulate_grad && !bs->callback.fill)
        return fmha_fail(FMHA_ERR_BAD_MASK, "biases.callback.accumulate_grad is set without callback.fill");
    if (bs->alibi_slopes)
        for (int64_t h = 0; h < p->heads_q; h++)
            if (!isfinite(bs->alibi_slopes[h]))
                return fmha_fail(FMHA_ERR_BAD_MASK, "biases.alibi_slopes[%lld] must be finite, got %g", (long long)h,
                                 (double)bs->alibi_slopes[h]);
    if (p->sinks)
        for (int64_t h = 0; h < p->heads_q; h++)
            if (!isfinite(p->sinks[h]))
                return fmha_fail(FMHA_ERR_BAD_MASK, "sinks[%lld] must be finite, got %g", (long long)h,
                                 (double)p->sinks[h]);
    return FMHA_OK;
}

int fmha_biases_active(const fmha_problem *p) {
    const fmha_biases *bs = &p->biases;
    return bs->dense || bs->alibi_slopes || bs->rel_table || bs->softcap != 0.0f || bs->callback.fill;
}

void fmha_row_finish(const fmha_plan *plan, int64_t h, float m, float l, float *o_scale, float *lse) {
    if (!plan->p.sinks) {
        /* l == 0 only for a row that saw no key (its best score contributes
         * exp(0) = 1 otherwise); a NaN l (a NaN or +inf score) stays NaN */
        *o_scale = l != 0.0f ? 1.0f / l : 0.0f;
        *lse = l != 0.0f ? m + logf(l) : -INFINITY;
        return;
    }
    const float sink = plan->p.sinks[h];
    if (l == 0.0f) { /* only the sink: no value row */
        *o_scale = 0.0f;
        *lse = sink;
        return;
    }
    /* denominator exp(mx) (l exp(m - mx) + exp(sink - mx)), mx = max(m, sink):
     * no term overflows whichever is larger */
    const float mx = fmaxf(m, sink), a = expf(m - mx), denom = fmaf(l, a, expf(sink - mx));
    *o_scale = a / denom;
    *lse = mx + logf(denom);
}

/* a = i + off - j ranges over [a_min, a_max]; lanes past nq reach NR - 1 further.
 * With per-sequence alignment (bottom-right with lengths) off = kv_len[b] -
 * q_len[b] may take any value the lengths allow (they can change between
 * runs of a plan): kv_len in [0, Skv] where given, q_len in [0, Sq]. */
static void toeplitz_extent(const fmha_plan *plan, int64_t *a_min, int64_t *len) {
    const fmha_problem *p = &plan->p;
    int64_t off_lo = plan->causal_offset, off_hi = plan->causal_offset;
    if (plan->bottom_right) {
        off_lo = (p->masks.kv_lengths ? 0 : p->seq_kv) - p->seq_q;
        off_hi = p->seq_kv - (p->masks.q_lengths ? 0 : p->seq_q);
    }
    *a_min = off_lo - (p->seq_kv - 1);
    *len = (p->seq_q - 1 + off_hi) - *a_min + 1 + (int64_t)plan->uk->tile.nr;
}

size_t fmha_bias_shared_bytes(const fmha_plan *plan) {
    if (!plan->p.biases.alibi_slopes && !plan->p.biases.rel_table) return 0;
    int64_t a_min, len;
    toeplitz_extent(plan, &a_min, &len);
    return fmha_round_up((size_t)(plan->p.heads_q * len) * sizeof(float), FMHA_ALIGN);
}

/* x = cap * tanh(x / cap), x < n: the softcap of every path. */
static void softcap_row(float cap, size_t n, float *x) {
    float inv = 1.0f / cap;
    for (size_t i = 0; i < n; i++) x[i] = cap * tanhf(x[i] * inv);
}

/* ALiBi's bias at a = i + off - j: -slope |a|. */
static inline float alibi_at(float slope, int64_t a) { return -slope * (float)(a < 0 ? -a : a); }

void fmha_bias_prepare(fmha_plan *plan, char *shared) {
    const fmha_biases *bs = &plan->p.biases;
    plan->toeplitz = NULL;
    if (!bs->alibi_slopes && !bs->rel_table) return;
    int64_t a_min, len;
    toeplitz_extent(plan, &a_min, &len);
    plan->toeplitz = (float *)shared;
    plan->toeplitz_len = len;
    plan->a_min = a_min;
    for (int64_t h = 0; h < plan->p.heads_q; h++) {
        float *row = plan->toeplitz + h * len;
        for (int64_t x = 0; x < len; x++) {
            int64_t a = a_min + x;
            float v = 0.0f;
            if (bs->alibi_slopes) v += alibi_at(bs->alibi_slopes[h], a);
            if (bs->rel_table)
                v += bs->rel_table[h * bs->rel_num_buckets +
                                   fmha_rel_bucket(-a, bs->rel_num_buckets, bs->rel_max_distance,
                                                   bs->rel_bidirectional)];
            row[x] = v;
        }
    }
}

/* dst[i] += src[i], i < n (n a multiple of 8): restrict and the 8-wide body
 * let the compiler use vector adds on the baseline ISA. */
static void add_lanes(float *restrict dst, const float *restrict src, size_t n) {
    for (size_t i = 0; i < n; i += 8)
        for (size_t j = 0; j < 8; j++) dst[i + j] += src[i + j];
}

/* st[r][i] += src[i * q_stride + r * k_stride] for r < nk, i < nq, reading the
 * source along its denser axis (keys in the usual [.., Sq, Skv] layout), so
 * each of its cache lines is read once; the score tile stays in L1. */
static void add_transposed(float *restrict st, size_t lds, const float *restrict src,
                           int64_t q_stride, int64_t k_stride, size_t nq, size_t nk) {
    if (k_stride <= q_stride) {
        for (size_t i = 0; i < nq; i++) {
            const float *srow = src + (int64_t)i * q_stride;
            for (size_t r = 0; r < nk; r++) st[r * lds + i] += srow[(int64_t)r * k_stride];
        }
    } else {
        for (size_t r = 0; r < nk; r++)
            for (size_t i = 0; i < nq; i++) st[r * lds + i] += src[(int64_t)i * q_stride + (int64_t)r * k_stride];
    }
}

static fmha_tile bias_tile(const fmha_tile_pos *t, size_t lds, int thread) {
    return (fmha_tile){t->b, t->h, t->q0, t->nq, t->k0, t->nk, 1, (ptrdiff_t)lds, thread};
}

void fmha_score_epilogue(const fmha_plan *plan, const fmha_tile_pos *t, fmha_tile_class cls,
                         float *st, size_t lds, float *raw, unsigned char *scratch, int thread) {
    const fmha_biases *bs = &plan->p.biases;
    if (plan->has_bias) {
        size_t nq = (size_t)t->nq;
        if (bs->softcap != 0.0f)
            for (int64_t r = 0; r < t->nk; r++) {
                float *row = st + (size_t)r * lds;
                if (raw) memcpy(raw + (size_t)r * lds, row, nq * sizeof(float));
                softcap_row(bs->softcap, nq, row);
            }
        if (bs->dense) {
            const int64_t *s = bs->dense_strides;
            const float *base = bs->dense + t->b * s[0] + t->h * s[1] + t->q0 * s[2] + t->k0 * s[3];
            if (s[3] == 1)
                plan->uk->rows.add_transposed((size_t)t->nk, nq, base, (ptrdiff_t)s[2], st, lds);
            else
                add_transposed(st, lds, base, s[2], s[3], nq, (size_t)t->nk);
        }
        if (plan->toeplitz) {
            /* row r, lane i: a = q0 + i + off - k0 - r; every NR lane is added
             * (the vector is padded by NR), so the loop is whole vectors */
            const float *tz = plan->toeplitz + t->h * plan->toeplitz_len +
                              (t->q0 + fmha_causal_off(plan, t->b) - t->k0 - plan->a_min);
            for (int64_t r = 0; r < t->nk; r++) add_lanes(st + (size_t)r * lds, tz - r, plan->uk->tile.nr);
        }
        if (bs->callback.fill) {
            fmha_tile pt = bias_tile(t, lds, thread);
            bs->callback.fill(bs->callback.ctx, &pt, st);
            fmha_after_callback(plan);
        }
    }
    if (cls == FMHA_TILE_PARTIAL) fmha_mask_apply(plan, t, st, lds, scratch, thread);
}

/* ---- backward ---- */

size_t fmha_bias_grad_task_doubles(const fmha_plan *plan, size_t heads_per_task) {
    const fmha_param_grads *g = plan->grads;
    if (!g || !(g->d_alibi || g->d_rel_table)) return 0;
    int64_t a_min, len;
    toeplitz_extent(plan, &a_min, &len);
    return heads_per_task * (size_t)len;
}

void fmha_bias_grad_tile(const fmha_plan *plan, const fmha_tile_pos *t, const float *ds, size_t lds,
                         double *diag, double *task_acc, int thread) {
    const fmha_biases *bs = &plan->p.biases;
    const fmha_param_grads *g = plan->grads;
    size_t nq = (size_t)t->nq;
    if (g && g->d_dense) {
        const int64_t *s = g->d_dense_strides;
        float *base = g->d_dense + t->b * s[0] + t->h * s[1] + t->q0 * s[2] + t->k0 * s[3];
        /* walk the caller's tensor along its denser axis: keys when its key
         * stride is the smaller one (the usual [.., Sq, Skv] layout) */
        if (s[3] <= s[2]) {
            for (size_t i = 0; i < nq; i++) {
                float *brow = base + (int64_t)i * s[2];
                for (int64_t r = 0; r < t->nk; r++) brow[r * s[3]] += ds[(size_t)r * lds + i];
            }
        } else {
            for (int64_t r = 0; r < t->nk; r++)
                for (size_t i = 0; i < nq; i++) base[(int64_t)i * s[2] + r * s[3]] += ds[(size_t)r * lds + i];
        }
    }
    if (task_acc) {
        /* diag[i - r + nk - 1] = float64 sum of the tile's diagonal */
        size_t n = nq + (size_t)t->nk - 1;
        memset(diag, 0, n * sizeof(double));
        for (int64_t r = 0; r < t->nk; r++) {
            const float *row = ds + (size_t)r * lds;
            double *dst = diag + (t->nk - 1 - r);
            for (size_t i = 0; i < nq; i++) dst[i] += row[i];
        }
        /* x = 0 is a = q0 + off - k0 - (nk - 1) */
        double *acc = task_acc + (t->q0 + fmha_causal_off(plan, t->b) - t->k0 - (t->nk - 1) - plan->a_min);
        for (size_t x = 0; x < n; x++) acc[x] += diag[x];
    }
    if (bs->callback.accumulate_grad) {
        fmha_tile pt = bias_tile(t, lds, thread);
        bs->callback.accumulate_grad(bs->callback.ctx, &pt, ds);
        fmha_after_callback(plan);
    }
}

void fmha_bias_row(const fmha_plan *plan, int64_t b, int64_t i, int64_t h, int64_t k0, int64_t nk, float *row) {
    const fmha_biases *bs = &plan->p.biases;
    if (bs->softcap != 0.0f) softcap_row(bs->softcap, (size_t)nk, row);
    if (bs->alibi_slopes) {
        int64_t a0 = i + fmha_causal_off(plan, b) - k0; /* a of key k0 */
        for (int64_t j = 0; j < nk; j++) row[j] += alibi_at(bs->alibi_slopes[h], a0 - j);
    }
}

/* dS with respect to the raw (pre-softcap) score: dS * (1 - tanh^2(raw / cap)). */
void fmha_softcap_grad(const fmha_plan *plan, const fmha_tile_pos *t, float *ds, size_t lds,
                       const float *raw) {
    float inv = 1.0f / plan->p.biases.softcap;
    for (int64_t r = 0; r < t->nk; r++)
        for (int64_t i = 0; i < t->nq; i++) {
            float th = tanhf(raw[(size_t)r * lds + (size_t)i] * inv);
            ds[(size_t)r * lds + (size_t)i] *= 1.0f - th * th;
        }
}

/* Sums the tasks' Toeplitz gradients (fixed task order, float64) into the
 * caller's d_alibi [Hq] and d_rel_table [Hq, buckets]. task_acc holds
 * n_tasks blocks of task_stride doubles, each heads_per_task rows; task t
 * covers query heads task_head0(ctx, t) .. + heads_per_task. bucket_acc:
 * rel_num_buckets doubles. */
void fmha_bias_grad_finish(const fmha_plan *plan, const double *task_acc, size_t n_tasks,
                           size_t heads_per_task, size_t task_stride,
                           int64_t (*task_head0)(const void *ctx, size_t task), const void *ctx,
                           double *bucket_acc) {
    const fmha_param_grads *g = plan->grads;
    const fmha_biases *bs = &plan->p.biases;
    if (!task_acc) return;
    size_t len = (size_t)plan->toeplitz_len;
    int32_t nb = bs->rel_num_buckets;
    for (int64_t h = 0; h < plan->p.heads_q; h++) {
        double alibi = 0.0;
        if (g->d_rel_table)
            for (int32_t e = 0; e < nb; e++) bucket_acc[e] = 0.0;
        for (size_t x = 0; x < len; x++) {
            double total = 0.0;
            for (size_t t = 0; t < n_tasks; t++) {
                int64_t hl = h - task_head0(ctx, t);
                if (hl >= 0 && hl < (int64_t)heads_per_task)
                    total += task_acc[t * task_stride + (size_t)hl * len + x];
            }
            int64_t a = plan->a_min + (int64_t)x;
            if (g->d_alibi) alibi += -(double)(a < 0 ? -a : a) * total;
            if (g->d_rel_table)
                bucket_acc[fmha_rel_bucket(-a, nb, bs->rel_max_distance, bs->rel_bidirectional)] += total;
        }
        if (g->d_alibi) g->d_alibi[h] = (float)alibi;
        if (g->d_rel_table)
            for (int32_t e = 0; e < nb; e++) g->d_rel_table[h * nb + e] = (float)bucket_acc[e];
    }
}
