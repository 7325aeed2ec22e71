/* fmha_ref_masks.c: the float64 reference with every mask and bias (see
 * fmha_ref_masks.h). One query row at a time: each score is built from its
 * definition (softcap of the scaled dot product, plus every bias), each
 * mask is tested per element, then the exact softmax and its gradient. It
 * shares no tiles, classes or Toeplitz vectors with the library; only the T5
 * bucket function is the library's, since it is the definition. */
#include "fmha_ref_masks.h"

#include "fmha_ref.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

double fmha_ref_full_scale(const fmha_problem *p) { return fmha_ref_scale(p); }

/* Causal-alignment offset of batch element b: a = i + off - j. Bottom-right
 * aligns each sequence's last query with its last key: off = kv_len[b] -
 * q_len[b], the padded lengths standing in for absent length arrays. */
static int64_t align_off(const fmha_problem *p, int64_t b) {
    if (p->causal != FMHA_CAUSAL_BOTTOM_RIGHT && p->alignment != FMHA_ALIGN_BOTTOM_RIGHT) return 0;
    int64_t kv = p->masks.kv_lengths ? p->masks.kv_lengths[b] : p->seq_kv;
    int64_t q = p->masks.q_lengths ? p->masks.q_lengths[b] : p->seq_q;
    return kv - q;
}

/* The 1 x 1 tile (i, j) of (b, h), as callbacks see it. */
static fmha_tile unit_tile(int64_t b, int64_t h, int64_t i, int64_t j) {
    return (fmha_tile){b, h, i, 1, j, 1, 1, 1, 0};
}

int fmha_ref_full_visible(const fmha_problem *p, int64_t b, int64_t h, int64_t i, int64_t j) {
    const fmha_masks *m = &p->masks;
    const int64_t a = i + align_off(p, b) - j;
    if (p->causal != FMHA_CAUSAL_NONE && a < 0) return 0;
    if (m->window_left >= 0 && a > m->window_left) return 0;
    if (m->window_right >= 0 && a < -m->window_right) return 0;
    if (m->kv_lengths && j >= m->kv_lengths[b]) return 0;
    if (m->q_lengths && i >= m->q_lengths[b]) return 0;
    if (m->q_segment_ids && m->kv_segment_ids &&
        m->q_segment_ids[b * p->seq_q + i] != m->kv_segment_ids[b * p->seq_kv + j])
        return 0;
    if (m->dense) {
        const int64_t *s = m->dense_strides;
        if (!m->dense[b * s[0] + h * s[1] + i * s[2] + j * s[3]]) return 0;
    }
    if (m->callback.fill) {
        fmha_tile t = unit_tile(b, h, i, j);
        int cls = m->callback.classify ? m->callback.classify(m->callback.ctx, &t)
                                       : FMHA_TILE_CLASS_PARTIAL;
        if (cls == FMHA_TILE_CLASS_EMPTY) return 0;
        if (cls == FMHA_TILE_CLASS_PARTIAL) {
            uint8_t vis = 1;
            m->callback.fill(m->callback.ctx, &t, &vis);
            if (!vis) return 0;
        }
    }
    return 1;
}

double fmha_ref_full_bias(const fmha_problem *p, int64_t b, int64_t h, int64_t i, int64_t j) {
    const fmha_biases *bs = &p->biases;
    const int64_t a = i + align_off(p, b) - j;
    double bias = 0.0;
    if (bs->dense) {
        const int64_t *s = bs->dense_strides;
        bias += (double)bs->dense[b * s[0] + h * s[1] + i * s[2] + j * s[3]];
    }
    if (bs->alibi_slopes) bias += -(double)bs->alibi_slopes[h] * (double)(a < 0 ? -a : a);
    if (bs->rel_table)
        bias += (double)bs->rel_table[h * bs->rel_num_buckets +
                                      fmha_rel_bucket(-a, bs->rel_num_buckets, bs->rel_max_distance,
                                                      bs->rel_bidirectional)];
    if (bs->callback.fill) {
        fmha_tile t = unit_tile(b, h, i, j);
        float add = 0.0f;
        bs->callback.fill(bs->callback.ctx, &t, &add);
        bias += (double)add;
    }
    return bias;
}

/* Row (b, s, h) of a tensor with strides st [batch, seq, head, dim], as double. */
static void load_row(double *dst, const float *x, const int64_t st[4], int64_t b, int64_t s,
                     int64_t h, int64_t n) {
    const float *r = x + b * st[0] + s * st[1] + h * st[2];
    for (int64_t d = 0; d < n; d++) dst[d] = (double)r[d * st[3]];
}

/* Per-row scratch, each [Skv]: raw = scale q.k, prob = P (0 where masked),
 * vis = the masks' verdict; dp = dO . V. */
typedef struct ref_row {
    double *raw, *prob, *dp;
    unsigned char *vis; /* 0 masked, 1 seen, 2 visible with a -inf score (the backward's: nonzero) */
    double *q_row, *do_row, *kv_row; /* [D], [Dv], [max(D, Dv)] */
    double weight_floor; /* weights exp(s - max) below it are taken as 0 (0: none) */
} ref_row;

static int row_alloc(const fmha_problem *p, ref_row *r) {
    size_t skv = (size_t)p->seq_kv, dmax = (size_t)(p->head_dim > p->head_dim_v ? p->head_dim : p->head_dim_v);
    r->raw = malloc(skv * sizeof(double));
    r->prob = malloc(skv * sizeof(double));
    r->dp = malloc(skv * sizeof(double));
    r->vis = malloc(skv);
    r->q_row = malloc((size_t)p->head_dim * sizeof(double));
    r->do_row = malloc((size_t)p->head_dim_v * sizeof(double));
    r->kv_row = malloc(dmax * sizeof(double));
    r->weight_floor = 0.0;
    return r->raw && r->prob && r->dp && r->vis && r->q_row && r->do_row && r->kv_row ? 0 : -1;
}

static void row_free(ref_row *r) {
    free(r->raw), free(r->prob), free(r->dp), free(r->vis);
    free(r->q_row), free(r->do_row), free(r->kv_row);
}

/* Softmax row of query i of (b, h): fills r->vis, r->raw, r->prob. Score
 * s_j = softcap(raw_j) + bias_j, softcap(x) = cap tanh(x / cap). Returns lse,
 * or -inf (every prob 0) when no key is visible. q_row must hold query i. */
static double softmax_row(const fmha_problem *p, const float *k, int64_t b, int64_t h, int64_t i,
                          double scale, ref_row *r) {
    const int64_t skv = p->seq_kv, d_n = p->head_dim, hk = h / (p->heads_q / p->heads_kv);
    const double cap = (double)p->biases.softcap;
    double mx = -INFINITY;
    for (int64_t j = 0; j < skv; j++) {
        r->vis[j] = (unsigned char)fmha_ref_full_visible(p, b, h, i, j);
        r->prob[j] = -INFINITY;
        if (!r->vis[j]) continue;
        load_row(r->kv_row, k, p->k_strides, b, j, hk, d_n);
        double dot = 0.0;
        for (int64_t d = 0; d < d_n; d++) dot += r->q_row[d] * r->kv_row[d];
        r->raw[j] = scale * dot;
        double s = cap != 0.0 ? cap * tanh(r->raw[j] / cap) : r->raw[j];
        s += fmha_ref_full_bias(p, b, h, i, j);
        r->prob[j] = s;
        if (s == -INFINITY) r->vis[j] = 2; /* a -inf score hides its key from O (fmha.h) */
        if (s > mx || isnan(s)) mx = s; /* a NaN score makes the row NaN */
    }
    /* an attention sink adds exp(sink) to the denominator, no value row */
    const double sink = p->sinks ? (double)p->sinks[h] : -INFINITY;
    if (sink > mx) mx = sink;
    if (mx == -INFINITY) {
        for (int64_t j = 0; j < skv; j++) r->prob[j] = 0.0;
        return -INFINITY;
    }
    double l = p->sinks ? exp(sink - mx) : 0.0;
    for (int64_t j = 0; j < skv; j++) {
        r->prob[j] = r->vis[j] ? exp(r->prob[j] - mx) : 0.0;
        if (r->prob[j] < r->weight_floor) r->prob[j] = 0.0;
        l += r->prob[j];
    }
    for (int64_t j = 0; j < skv; j++) r->prob[j] /= l;
    return mx + log(l);
}

/* The dropout factor Z of score (b, h, i, j): 0 or 1 / (1 - p); 1 without
 * dropout. Which scores are kept is the library's hash (fmha_dropout_keep);
 * everything computed from Z here is the reference's own. */
static double dropout_factor(const fmha_problem *p, int64_t b, int64_t h, int64_t i, int64_t j) {
    if (!(p->dropout_p > 0.0f)) return 1.0;
    return fmha_dropout_keep(p, b, h, i, j) ? 1.0 / (1.0 - (double)p->dropout_p) : 0.0;
}

/* fmha_ref_forward_full, its weights below weight_floor taken as 0. */
static int forward_full(const fmha_problem *p, const float *q, const float *k, const float *v, double *o,
                        double *lse, double weight_floor) {
    const int64_t B = p->batch, hq = p->heads_q, sq = p->seq_q, skv = p->seq_kv;
    const int64_t dv_n = p->head_dim_v, group = hq / p->heads_kv;
    const double scale = fmha_ref_full_scale(p);
    ref_row r;
    if (row_alloc(p, &r) != 0) {
        row_free(&r);
        return -1;
    }
    r.weight_floor = weight_floor;
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < hq; h++)
            for (int64_t i = 0; i < sq; i++) {
                load_row(r.q_row, q, p->q_strides, b, i, h, p->head_dim);
                double row_lse = softmax_row(p, k, b, h, i, scale, &r);
                if (lse) lse[(b * hq + h) * sq + i] = row_lse;
                /* oi [Dv]: output row of (b, i, h) */
                double *oi = o + ((b * sq + i) * hq + h) * dv_n;
                for (int64_t c = 0; c < dv_n; c++) oi[c] = 0.0;
                for (int64_t j = 0; j < skv; j++) {
                    /* every key the row sees, even where P underflows to 0 (0 x NaN is NaN) */
                    if (r.vis[j] != 1) continue;
                    load_row(r.kv_row, v, p->v_strides, b, j, h / group, dv_n);
                    const double pz = r.prob[j] * dropout_factor(p, b, h, i, j); /* O = (P Z) V */
                    for (int64_t c = 0; c < dv_n; c++) oi[c] += pz * r.kv_row[c];
                }
            }
    row_free(&r);
    return 0;
}

int fmha_ref_forward_full(const fmha_problem *p, const float *q, const float *k, const float *v,
                          double *o, double *lse) {
    return forward_full(p, q, k, v, o, lse, 0.0);
}

int fmha_ref_forward_full_f32_weights(const fmha_problem *p, const float *q, const float *k, const float *v,
                                      double *o, double *lse) {
    return forward_full(p, q, k, v, o, lse, FLT_MIN);
}

/* Backward of L = sum_ic O_ic dO_ic, per query row i of one head:
 *   raw_ij = scale q_i . k_j,  t_ij = cap tanh(raw_ij / cap) (raw_ij without softcap)
 *   S_ij   = t_ij + bias_ij,  P = softmax_rows(S) over visible keys,  O_i = sum_j P_ij V_j
 *   dV_j  += P_ij dO_i,   dP_ij = dO_i . V_j
 *   dS_ij  = P_ij (dP_ij - sum_k P_ik dP_ik)            (softmax Jacobian)
 * Every bias enters S additively, so dL/dbias_ij = dS_ij:
 *   dense bias:  d bias[b, h, i, j] = dS_ij (summed over broadcast dims by the caller)
 *   ALiBi:       bias = -slope_h |a|, d slope_h = sum_ij dS_ij (-|a_ij|)
 *   T5 table:    d table[h][e] = sum of dS_ij over the (i, j) whose bucket is e
 * Softcap: dt/draw = 1 - tanh^2(raw / cap), so d raw_ij = dS_ij (1 - tanh^2(raw_ij / cap)).
 *   dQ_i += scale sum_j d raw_ij K_j,   dK_j += scale sum_i d raw_ij Q_i
 * Masked pairs have P = 0, hence dS = 0; a fully masked row contributes nothing.
 * Dropout, O_i = sum_j P_ij Z_ij V_j: dV_j += P_ij Z_ij dO_i and dP_ij = Z_ij dO_i . V_j;
 *   dS as above (sum_k P_ik dP_ik = dO_i . O_i).
 * GQA: dK, dV of kv head g sum over the query heads h with h / (Hq / Hkv) == g. */
int fmha_ref_backward_full(const fmha_problem *p, const float *q, const float *k, const float *v,
                           const float *d_o, double *dq, double *dk, double *dv,
                           double *d_bias_dense, double *d_alibi, double *d_rel_table) {
    return fmha_ref_backward_full_ex(p, q, k, v, d_o, dq, dk, dv, d_bias_dense, d_alibi,
                                     d_rel_table, NULL, NULL);
}

int fmha_ref_backward_full_ex(const fmha_problem *p, const float *q, const float *k,
                              const float *v, const float *d_o, double *dq, double *dk, double *dv,
                              double *d_bias_dense, double *d_alibi, double *d_rel_table,
                              double *ds_scale, double *rel_scale) {
    const int64_t B = p->batch, hq = p->heads_q, hkv = p->heads_kv, sq = p->seq_q;
    const int64_t skv = p->seq_kv, d_n = p->head_dim, dv_n = p->head_dim_v, group = hq / hkv;
    const double scale = fmha_ref_full_scale(p), cap = (double)p->biases.softcap;
    const fmha_biases *bs = &p->biases;
    if ((d_rel_table || rel_scale) && bs->rel_num_buckets < 1) return -1;
    ref_row r;
    if (row_alloc(p, &r) != 0) {
        row_free(&r);
        return -1;
    }
    memset(dq, 0, (size_t)(B * sq * hq * d_n) * sizeof(double));
    memset(dk, 0, (size_t)(B * skv * hkv * d_n) * sizeof(double));
    memset(dv, 0, (size_t)(B * skv * hkv * dv_n) * sizeof(double));
    if (d_bias_dense) memset(d_bias_dense, 0, (size_t)(B * hq * sq * skv) * sizeof(double));
    if (d_alibi) memset(d_alibi, 0, (size_t)hq * sizeof(double));
    if (d_rel_table) memset(d_rel_table, 0, (size_t)(hq * bs->rel_num_buckets) * sizeof(double));
    if (ds_scale) memset(ds_scale, 0, (size_t)(B * hq * sq * skv) * sizeof(double));
    if (rel_scale) memset(rel_scale, 0, (size_t)(hq * bs->rel_num_buckets) * sizeof(double));
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < hq; h++)
            for (int64_t i = 0; i < sq; i++) {
                const int64_t g = h / group;
                load_row(r.q_row, q, p->q_strides, b, i, h, d_n);
                if (softmax_row(p, k, b, h, i, scale, &r) == -INFINITY) continue;
                load_row(r.do_row, d_o, p->o_strides, b, i, h, dv_n);
                double delta = 0.0;
                for (int64_t j = 0; j < skv; j++) {
                    r.dp[j] = 0.0;
                    if (!r.vis[j]) continue;
                    load_row(r.kv_row, v, p->v_strides, b, j, g, dv_n);
                    double acc = 0.0;
                    for (int64_t c = 0; c < dv_n; c++) acc += r.do_row[c] * r.kv_row[c];
                    acc *= dropout_factor(p, b, h, i, j);
                    r.dp[j] = acc;
                    delta += r.prob[j] * acc;
                }
                double *dqi = dq + ((b * sq + i) * hq + h) * d_n;
                for (int64_t j = 0; j < skv; j++) {
                    if (!r.vis[j]) continue;
                    const double ds = r.prob[j] * (r.dp[j] - delta);
                    const int64_t a = i + align_off(p, b) - j;
                    if (d_bias_dense) d_bias_dense[((b * hq + h) * sq + i) * skv + j] = ds;
                    const double size = r.prob[j] * (fabs(r.dp[j]) + fabs(delta));
                    if (ds_scale) ds_scale[((b * hq + h) * sq + i) * skv + j] = size;
                    if (d_alibi) d_alibi[h] += ds * -(double)(a < 0 ? -a : a);
                    if (d_rel_table || rel_scale) {
                        const int64_t e = h * bs->rel_num_buckets +
                                          fmha_rel_bucket(-a, bs->rel_num_buckets, bs->rel_max_distance,
                                                          bs->rel_bidirectional);
                        if (d_rel_table) d_rel_table[e] += ds;
                        if (rel_scale) rel_scale[e] += size;
                    }
                    double draw = ds;
                    if (cap != 0.0) {
                        const double th = tanh(r.raw[j] / cap);
                        draw *= 1.0 - th * th;
                    }
                    double *dkj = dk + ((b * skv + j) * hkv + g) * d_n;
                    double *dvj = dv + ((b * skv + j) * hkv + g) * dv_n;
                    load_row(r.kv_row, k, p->k_strides, b, j, g, d_n);
                    for (int64_t d = 0; d < d_n; d++) {
                        dqi[d] += scale * draw * r.kv_row[d];
                        dkj[d] += scale * draw * r.q_row[d];
                    }
                    const double pz = r.prob[j] * dropout_factor(p, b, h, i, j);
                    for (int64_t c = 0; c < dv_n; c++) dvj[c] += pz * r.do_row[c];
                }
            }
    row_free(&r);
    return 0;
}
