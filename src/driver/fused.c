/* fused.c: forward then backward in one run (fmha_forward_backward).
 * float32 runs the two drivers back to back. bf16 and f16 keep the forward's
 * O in float32 (o32, O's element strides) and take the backward's
 * Dsum = rowsum(dO * O) from it: Dsum from the rounded O would carry O's
 * rounding error into every dS of the row. O is rounded into the caller's
 * tensor once, from o32. */
#include "core/attn.h"
#include "runtime/convert.h"

/* Elements from O's first to one past its last. */
static size_t o_span(const fmha_plan *plan) {
    const fmha_problem *p = &plan->p;
    const int64_t *os = p->o_strides;
    return (size_t)((p->batch - 1) * os[0] + (p->seq_q - 1) * os[1] + (p->heads_q - 1) * os[2] +
                    (p->head_dim_v - 1) * os[3]) + 1;
}

size_t fmha_fused_o32_bytes(const fmha_plan *plan) {
    switch (plan->p.dtype) {
    case FMHA_DTYPE_F32: return 0;
    case FMHA_DTYPE_BF16:
    case FMHA_DTYPE_F16: return fmha_round_up(o_span(plan) * sizeof(float), FMHA_ALIGN);
    }
    return 0;
}

/* o = o32 rounded, row by row: a unit-stride row of o32 is the row the
 * store reads; other rows element by element. */
static void store_o(const fmha_plan *plan, const float *o32, void *o) {
    const fmha_problem *p = &plan->p;
    const int64_t *os = p->o_strides;
    for (int64_t b = 0; b < p->batch; b++)
        for (int64_t i = 0; i < p->seq_q; i++)
            for (int64_t h = 0; h < p->heads_q; h++) {
                int64_t at = b * os[0] + i * os[1] + h * os[2];
                if (os[3] == 1)
                    fmha_store_row_uk(plan->uk, o, p->dtype, at, 1, p->head_dim_v, o32 + at, 1.0f);
                else
                    for (int64_t e = 0; e < p->head_dim_v; e++)
                        fmha_store(o, p->dtype, at + e * os[3], o32[at + e * os[3]]);
            }
}

void fmha_fused_run(fmha_plan *run, const void *q, const void *k, const void *v, const void *d_o,
                    void *o, float *lse, void *dq, void *dk, void *dv, float *o32, char *ws) {
    fmha_plan fwd = *run;
    fmha_ws_size fs = run->fwd_ws;
    fwd.thread_bytes = fs.thread_bytes;
    fwd.shared_bytes = fs.shared_bytes;
    fwd.grads = NULL;
    if (o32) {
        fwd.o_dtype = FMHA_DTYPE_F32;
        fmha_fwd_run(&fwd, q, k, v, o32, lse, ws);
        store_o(run, o32, o);
        run->dsum_o = o32;
    } else {
        fmha_fwd_run(&fwd, q, k, v, o, lse, ws);
    }
    fmha_bwd_run(run, q, k, v, o, d_o, lse, dq, dk, dv, ws);
}
