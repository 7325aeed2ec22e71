/* merge.c: fmha_merge, the combination of two partial attention results
 * over disjoint key sets by their log-sum-exp (ring attention merges one
 * per key block) by the rule of partials.h, which the split-KV merges
 * share. Plain loops: it reads and writes each element once and is memory
 * bound. */
#include <math.h>

#include "runtime/error.h"
#include "fmha.h"
#include "core/partials.h"

fmha_status fmha_merge(int64_t batch, int64_t heads_q, int64_t seq_q, int64_t head_dim_v,
                       const int64_t o_strides[4], const float *o_a, const float *lse_a,
                       const float *o_b, const float *lse_b, float *o, float *lse) {
    fmha_error_clear();
    fmha_status st = FMHA_CHECK_POINTERS("o_strides, o_a, lse_a, o_b, lse_b, o, lse", o_strides, o_a, lse_a, o_b,
                                         lse_b, o, lse);
    if (st != FMHA_OK) return st;
    int64_t rows;
    if (batch < 1 || heads_q < 1 || seq_q < 1 || __builtin_mul_overflow(batch, heads_q, &rows) ||
        __builtin_mul_overflow(rows, seq_q, &rows) || rows > INT64_MAX / 8)
        return fmha_fail(FMHA_ERR_BAD_SIZE,
                         "batch, heads_q and seq_q must be at least 1 with a product of at most 2^60, got %lld, %lld, "
                         "%lld",
                         (long long)batch, (long long)heads_q, (long long)seq_q);
    if (head_dim_v < 1 || head_dim_v > FMHA_MAX_HEAD_DIM)
        return fmha_fail(FMHA_ERR_BAD_HEAD_DIM, "head_dim_v must lie in 1..%d, got %lld", FMHA_MAX_HEAD_DIM,
                         (long long)head_dim_v);
    const int64_t ext[4] = {batch, seq_q, heads_q, head_dim_v};
    int64_t span = 0, step;
    for (int i = 0; i < 4; i++)
        if (o_strides[i] < 0 || __builtin_mul_overflow(o_strides[i], ext[i] - 1, &step) ||
            __builtin_add_overflow(span, step, &span) || span > INT64_MAX / 8)
            return fmha_fail(FMHA_ERR_BAD_STRIDE,
                             "o_strides[%d] must be non-negative with a span of at most 2^60 elements, got %lld", i,
                             (long long)o_strides[i]);

    for (int64_t b = 0; b < batch; b++)
        for (int64_t h = 0; h < heads_q; h++)
            for (int64_t i = 0; i < seq_q; i++) {
                const int64_t row = (b * heads_q + h) * seq_q + i;
                const int64_t off = b * o_strides[0] + i * o_strides[1] + h * o_strides[2];
                const double la = lse_a[row], lb = lse_b[row];
                double l, wa = 0, wb = 0;
                if (isnan(la) || isnan(lb)) {
                    l = NAN;
                    wa = wb = NAN;
                } else if (la == -INFINITY && lb == -INFINITY) {
                    l = -INFINITY;
                } else {
                    const double m = la > lb ? la : lb;
                    l = m + log(exp(la - m) + exp(lb - m));
                    wa = la == -INFINITY ? 0 : exp(la - l);
                    wb = lb == -INFINITY ? 0 : exp(lb - l);
                }
                for (int64_t d = 0; d < head_dim_v; d++) {
                    const int64_t at = off + d * o_strides[3];
                    double x = 0;
                    if (fmha_partial_counts(la)) x += wa * o_a[at];
                    if (fmha_partial_counts(lb)) x += wb * o_b[at];
                    o[at] = (float)x;
                }
                lse[row] = (float)l;
            }
    return FMHA_OK;
}
