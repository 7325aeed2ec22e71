/* fmha_ref.c: the float64 reference attention (see fmha_ref.h), the oracle
 * of the tests. One query row at a time: scores in double, the exact softmax
 * with the row max subtracted, then the products. No tiling and no online
 * softmax, so that it shares no idea (and no bug) with the library. Of
 * fmha_problem's masks and biases it honours the causal option only; the
 * others have their own reference, fmha_ref_masks.c. */
#include "fmha_ref.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

double fmha_ref_scale(const fmha_problem *p) {
    /* +0.0 (by its bits) selects the default; -0.0 and subnormals are scales */
    return p->scale != 0.0f || signbit(p->scale) ? (double)p->scale : 1.0 / sqrt((double)p->head_dim);
}

int fmha_ref_visible(const fmha_problem *p, int64_t i, int64_t j) {
    switch (p->causal) {
    case FMHA_CAUSAL_TOP_LEFT: return j <= i;
    case FMHA_CAUSAL_BOTTOM_RIGHT: return j <= i + (p->seq_kv - p->seq_q);
    default: return 1;
    }
}

/* Start of row (b, s, h) of a tensor with strides st [batch, seq, head, dim]. */
static const float *row_at(const float *x, const int64_t st[4], int64_t b, int64_t s, int64_t h) {
    return x + b * st[0] + s * st[1] + h * st[2];
}

/* Softmax row of query i of head h (batch b) into p_row [Skv]: P_ij, -0 where
 * masked or the score is -inf (+0 only where a seen key's P underflows). q_row [D] holds the query in double. Returns the natural-log row
 * sum lse, or -inf (and all P 0) when no key is visible. */
static double softmax_row(const fmha_problem *p, const double *q_row, const float *k, int64_t b,
                          int64_t h, int64_t i, double scale, double *p_row) {
    const int64_t skv = p->seq_kv, d_n = p->head_dim, kd = p->k_strides[3];
    const int64_t hk = h / (p->heads_q / p->heads_kv);
    double m = -INFINITY;
    for (int64_t j = 0; j < skv; j++) {
        if (!fmha_ref_visible(p, i, j)) {
            p_row[j] = -INFINITY;
            continue;
        }
        const float *kj = row_at(k, p->k_strides, b, j, hk);
        double acc = 0.0;
        for (int64_t d = 0; d < d_n; d++) acc += q_row[d] * (double)kj[d * kd];
        p_row[j] = scale * acc;
        if (p_row[j] > m || isnan(p_row[j])) m = p_row[j]; /* a NaN score makes the row NaN */
    }
    if (m == -INFINITY) {
        for (int64_t j = 0; j < skv; j++) p_row[j] = -0.0;
        return -INFINITY;
    }
    double l = 0.0;
    for (int64_t j = 0; j < skv; j++) {
        p_row[j] = p_row[j] == -INFINITY ? -0.0 : exp(p_row[j] - m); /* -0: hidden (masked or a -inf score) */
        l += p_row[j];
    }
    for (int64_t j = 0; j < skv; j++) p_row[j] /= l;
    return m + log(l);
}

/* Copies row (b, s, h) of a float tensor into dst [n] as double. */
static void load_row(double *dst, const float *x, const int64_t st[4], int64_t b, int64_t s,
                     int64_t h, int64_t n) {
    const float *r = row_at(x, st, b, s, h);
    for (int64_t d = 0; d < n; d++) dst[d] = (double)r[d * st[3]];
}

int fmha_ref_forward(const fmha_problem *p, const float *q, const float *k, const float *v,
                     double *o, double *lse) {
    const int64_t B = p->batch, hq = p->heads_q, sq = p->seq_q, skv = p->seq_kv;
    const int64_t d_n = p->head_dim, dv_n = p->head_dim_v, group = hq / p->heads_kv;
    const double scale = fmha_ref_scale(p);
    /* p_row [Skv]: one row of P; q_row [D]: the query in double */
    double *p_row = malloc((size_t)skv * sizeof(double));
    double *q_row = malloc((size_t)d_n * sizeof(double));
    if (!p_row || !q_row) {
        free(p_row);
        free(q_row);
        return -1;
    }
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < hq; h++)
            for (int64_t i = 0; i < sq; i++) {
                load_row(q_row, q, p->q_strides, b, i, h, d_n);
                double row_lse = softmax_row(p, q_row, k, b, h, i, scale, p_row);
                if (lse) lse[(b * hq + h) * sq + i] = row_lse;
                double *oi = o + ((b * sq + i) * hq + h) * dv_n;
                for (int64_t c = 0; c < dv_n; c++) oi[c] = 0.0;
                for (int64_t j = 0; j < skv; j++) {
                    /* every key the row sees, even where P underflows to +0 (0 x NaN is NaN) */
                    if (p_row[j] == 0.0 && signbit(p_row[j])) continue;
                    const float *vj = row_at(v, p->v_strides, b, j, h / group);
                    for (int64_t c = 0; c < dv_n; c++)
                        oi[c] += p_row[j] * (double)vj[c * p->v_strides[3]];
                }
            }
    free(p_row);
    free(q_row);
    return 0;
}

/* Backward of L = sum_ic O_ic dO_ic, per query row i (of one head):
 *   S_ij = scale q_i . k_j,  P_ij = exp(S_ij) / sum_k exp(S_ik),  O_i = sum_j P_ij V_j
 *   dL/dV_j  = sum_i P_ij dO_i                    (dV = P^T dO)
 *   dP_ij    = dL/dP_ij = dO_i . V_j              (dP = dO V^T)
 *   dP_ik/dS_ij = P_ik (delta_kj - P_ij), hence
 *   dS_ij    = P_ij (dP_ij - sum_k P_ik dP_ik),  and sum_k P_ik dP_ik = dO_i . O_i
 *              (the rowsum of dO * O), computed here from P and dP in double
 *   dQ_i     = scale sum_j dS_ij K_j,   dK_j = scale sum_i dS_ij Q_i
 * GQA/MQA: key/value head g serves query heads h with h / (Hq/Hkv) == g, so
 * dK and dV of g sum over those heads. A masked pair has P = 0 and dS = 0; a
 * fully masked row contributes nothing. */
int fmha_ref_backward(const fmha_problem *p, const float *q, const float *k, const float *v,
                      const float *d_o, double *dq, double *dk, double *dv) {
    const int64_t B = p->batch, hq = p->heads_q, hkv = p->heads_kv, sq = p->seq_q;
    const int64_t skv = p->seq_kv, d_n = p->head_dim, dv_n = p->head_dim_v, group = hq / hkv;
    const double scale = fmha_ref_scale(p);
    /* p_row, dp_row [Skv]; q_row [D]; do_row [Dv] */
    double *p_row = malloc((size_t)skv * sizeof(double));
    double *dp_row = malloc((size_t)skv * sizeof(double));
    double *q_row = malloc((size_t)d_n * sizeof(double));
    double *do_row = malloc((size_t)dv_n * sizeof(double));
    if (!p_row || !dp_row || !q_row || !do_row) {
        free(p_row);
        free(dp_row);
        free(q_row);
        free(do_row);
        return -1;
    }
    memset(dq, 0, (size_t)(B * sq * hq * d_n) * sizeof(double));
    memset(dk, 0, (size_t)(B * skv * hkv * d_n) * sizeof(double));
    memset(dv, 0, (size_t)(B * skv * hkv * dv_n) * sizeof(double));
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < hq; h++)
            for (int64_t i = 0; i < sq; i++) {
                const int64_t g = h / group;
                load_row(q_row, q, p->q_strides, b, i, h, d_n);
                if (softmax_row(p, q_row, k, b, h, i, scale, p_row) == -INFINITY) continue;
                load_row(do_row, d_o, p->o_strides, b, i, h, dv_n);
                double delta = 0.0;
                for (int64_t j = 0; j < skv; j++) {
                    dp_row[j] = 0.0;
                    if (p_row[j] == 0.0) continue;
                    const float *vj = row_at(v, p->v_strides, b, j, g);
                    double acc = 0.0;
                    for (int64_t c = 0; c < dv_n; c++)
                        acc += do_row[c] * (double)vj[c * p->v_strides[3]];
                    dp_row[j] = acc;
                    delta += p_row[j] * acc;
                }
                double *dqi = dq + ((b * sq + i) * hq + h) * d_n;
                for (int64_t j = 0; j < skv; j++) {
                    if (p_row[j] == 0.0) continue;
                    const double ds = scale * p_row[j] * (dp_row[j] - delta);
                    const float *kj = row_at(k, p->k_strides, b, j, g);
                    double *dkj = dk + ((b * skv + j) * hkv + g) * d_n;
                    double *dvj = dv + ((b * skv + j) * hkv + g) * dv_n;
                    for (int64_t d = 0; d < d_n; d++) {
                        dqi[d] += ds * (double)kj[d * p->k_strides[3]];
                        dkj[d] += ds * q_row[d];
                    }
                    for (int64_t c = 0; c < dv_n; c++) dvj[c] += p_row[j] * do_row[c];
                }
            }
    free(p_row);
    free(dp_row);
    free(q_row);
    free(do_row);
    return 0;
}
