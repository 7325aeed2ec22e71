/* sinks.c: the gradient of the attention sinks (fmha_sinks_backward).
 *
 * With a sink logit z_h joining the softmax denominator of every row of head
 * h, a visible key's weight is P_ij = exp(s_ij - lse_i) and the sink's own
 * weight is P_sink,i = exp(z_h - lse_i), lse_i = log(sum_j exp(s_ij) + exp(z_h)).
 * dlse_i/dz_h = P_sink,i, so dP_ij/dz_h = -P_ij P_sink,i and
 *   dO_i/dz_h = sum_j dP_ij/dz_h v_j = -P_sink,i O_i,
 *   dL/dz_h   = -sum_{b,i} P_sink,i <dO_i, O_i>.
 * It needs only O, dO and lse: O(B Hq Sq Dv) work apart from the backward.
 * Each head is one task summing (b, i) in order in double, so the result is
 * bitwise identical for every thread count. */
#include <math.h>

#include "core/attn.h"
#include "runtime/error.h"
#include "runtime/convert.h"
#include "runtime/pool.h"

typedef struct sinks_ctx {
    const fmha_problem *p;
    const void *o, *d_o;
    const float *lse; /* [B, Hq, Sq] */
    float *d_sinks;   /* [Hq] */
} sinks_ctx;

static void sinks_head_task(void *vctx, size_t task, int thread) {
    const sinks_ctx *c = vctx;
    const fmha_problem *p = c->p;
    const int64_t *os = p->o_strides;
    int64_t h = (int64_t)task;
    double sink = p->sinks[h], acc = 0.0;
    (void)thread;
    for (int64_t b = 0; b < p->batch; b++) {
        /* rows past the query length are not queries: no O, no sink weight */
        int64_t rows = p->masks.q_lengths ? p->masks.q_lengths[b] : p->seq_q;
        const float *lse = c->lse + (b * p->heads_q + h) * p->seq_q;
        for (int64_t i = 0; i < rows; i++) {
            int64_t row = b * os[0] + i * os[1] + h * os[2];
            double dot = 0.0;
            for (int64_t e = 0; e < p->head_dim_v; e++)
                dot += (double)fmha_load(c->d_o, p->dtype, row + e * os[3]) *
                       (double)fmha_load(c->o, p->dtype, row + e * os[3]);
            acc += exp(sink - (double)lse[i]) * dot;
        }
    }
    c->d_sinks[h] = (float)-acc;
}

fmha_status fmha_sinks_backward(const fmha_problem *p_in, const void *o, const void *d_o,
                                const float *lse, float *d_sinks) {
    fmha_error_clear();
    fmha_status st = FMHA_CHECK_POINTERS("p, o, d_o, lse, d_sinks", p_in, o, d_o, lse, d_sinks);
    if (st != FMHA_OK) return st;
    fmha_problem p;
    st = fmha_problem_check(p_in);
    if (st == FMHA_OK) st = fmha_problem_load(p_in, &p);
    if (st != FMHA_OK) return st;
    if (!p.sinks) return fmha_fail(FMHA_ERR_BAD_MASK, "the problem has no sinks to differentiate");
    fmha_tensors t = {.o_in = o, .d_o = d_o, .lse_in = lse, .d_sinks = d_sinks};
    st = fmha_tensors_check(&p, &t);
    if (st != FMHA_OK) return st;
    sinks_ctx c = {&p, o, d_o, lse, d_sinks};
    fmha_parallel_for((size_t)p.heads_q, fmha_pool_threads(), sinks_head_task, &c);
    return FMHA_OK;
}
