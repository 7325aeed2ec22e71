/* describe.c: fmha_plan_describe, one line saying what a plan runs (its
 * driver, the instruction set and operand path, the cache formats, block
 * sizes, threads and the CPU), so a user can tell which kernels serve a
 * call without a profiler. */
#include <stdio.h>

#include "core/attn.h"
#include "config/cpu.h"
#include "driver/operand.h"
#include "format/format.h"
#include "config/tuning.h"

/* The precision field: the matrix driver's operands, the bf16 pair path's
 * FAST or ACCURATE (bf16 for float32 rounded onto it), else float32. */
static const char *precision_name(const fmha_plan *plan) {
    const int matrix = plan->driver == &fmha_fwd_driver_matrix || plan->driver == &fmha_fwd_driver_matrix_decode;
    if (matrix && plan->p.dtype != FMHA_DTYPE_BF16)
        return plan->p.dtype == FMHA_DTYPE_F16 || plan->precision == FMHA_PRECISION_BF16X3 ? "bf16x3" : "bf16";
    if (plan->path == &fmha_path_bf16 && plan->p.dtype == FMHA_DTYPE_F32) return "bf16"; /* float32 rounded as packed */
    if (matrix || plan->path == &fmha_path_bf16) return plan->precision == FMHA_PRECISION_FAST ? "fast" : "accurate";
    return "float32";
}

size_t fmha_plan_describe(const fmha_plan *plan, char *buf, size_t buf_size) {
    char cpu[256];
    fmha_arch_describe(cpu, sizeof cpu);
    if (!plan) {
        int n = snprintf(buf, buf_size, "no plan; cpu=\"%s\"", cpu);
        return n < 0 ? 0 : (size_t)n;
    }
    const fmha_problem *p = &plan->p;
    const int bf16_pairs = plan->path == &fmha_path_bf16;
    char shape[160];
    if (plan->driver == &fmha_fwd_driver_decode)
        snprintf(shape, sizeof shape, "decode_units=%lld rows_per_unit=%lld heads_per_unit=%lld keys_per_split=%lld "
                 "splits=%lld",
                 (long long)plan->drv.dec.units, (long long)plan->drv.dec.rows, (long long)plan->drv.dec.heads,
                 (long long)plan->drv.dec.chunk, (long long)plan->drv.dec.splits);
    else if (plan->driver == &fmha_fwd_driver_matrix_decode) {
        int64_t splits, chunk;
        fmha_matrix_decode_split(plan, &splits, &chunk);
        const int64_t heads = fmha_matrix_decode_heads(plan);
        snprintf(shape, sizeof shape,
                 "decode_units=%lld rows_per_unit=%lld heads_per_unit=%lld keys_per_split=%lld splits=%lld",
                 (long long)(p->batch * p->heads_kv / heads), (long long)(plan->group * p->seq_q),
                 (long long)heads, (long long)chunk, (long long)splits);
    } else if (plan->driver == &fmha_fwd_driver_matrix)
        snprintf(shape, sizeof shape, "block_q=%d block_kv=%zu mr=16", FMHA_MATRIX_BLOCK_Q, fmha_matrix_block_kv(plan));
    else
        snprintf(shape, sizeof shape, "block_q=%zu block_kv=%zu mr=%zu", plan->uk->tile.nr,
                 plan->driver == &fmha_fwd_driver_dense ? (size_t)p->seq_kv : plan->uk->tile.block_kv,
                 bf16_pairs ? plan->uk->bf16.mr : plan->uk->tile.mr);
    const int decode = plan->driver == &fmha_fwd_driver_decode;
    /* a float32 query rounded to bf16 as matrix_decode packs it */
    const int bf16_query = plan->driver == &fmha_fwd_driver_matrix_decode && plan->p.dtype == FMHA_DTYPE_F32;
    int n = snprintf(buf, buf_size,
                     "driver=%s isa=%s path=%s precision=%s k_format=%s v_format=%s %s threads=%d cpu=\"%s\" tuning=%s "
                     "backward=%s scores=%s values=%s tuning_source=%s",
                     plan->driver->name, plan->uk->isa,
                     plan->driver == &fmha_fwd_driver_matrix || plan->driver == &fmha_fwd_driver_matrix_decode
                         ? "matrix"
                         : plan->path->name,
                     precision_name(plan),
                     fmha_cache_format_at(plan->k_format)->name, fmha_cache_format_at(plan->v_format)->name, shape,
                     fmha_pool_threads(), cpu, plan->uk->tuning->name, fmha_bwd_driver_of(plan)->name,
                     bf16_query ? "bf16"
                     : !decode  ? "float32"
                     : plan->drv.dec.scores == FMHA_DEC_SCORES_Q8 ? "integer"
                                         : plan->drv.dec.scores == FMHA_DEC_SCORES_BF16 ? "bf16" : "float32",
                     decode && plan->drv.dec.vint    ? "integer"
                     : decode && plan->drv.dec.vbf16 ? "bf16"
                                                     : "float32",
                     fmha_tuning_source_name(plan->uk->tuning->source));
    return n < 0 ? 0 : (size_t)n;
}
