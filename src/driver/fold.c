/* fold.c: the fold, a rewrite of one decode step of many query heads on one kv head (DeepSeek's
 * MLA latent head, MQA) as one attention problem whose queries are the
 * heads. With Hkv = 1 and Sq = 1, Q [B, 1, Hq, D] is Q' [B, Hq, 1, D] (the
 * head stride becomes the query stride) and O and lse likewise, and every
 * row sees the same keys, so the tiled forward serves the step: its GEMM
 * microkernels (bf16 pairs, AMX tiles) read the cache once per block of NR
 * heads instead of the decode kernels' FMAs with keys in the lanes, which a
 * step of 64-128 heads makes compute-bound (about 2 x Hq flops a cache
 * element). This file only rewrites the problem; the planner (plan.c)
 * plans the folded problem, at planning and afresh at each run
 * (validation and a choice, no allocation), so nothing of it is kept in
 * the plan. */
#include "core/attn.h"

/* Heads a step needs before folding pays (measured: decode.c's kernels
 * keep up with a few query rows, not with a GEMM's worth), and the blocks
 * of NR heads (tasks) it needs: a rule of the shape and the table only, so
 * that every thread count gets the same driver and the same bits. */
enum { FOLD_MIN_HEADS = 64, FOLD_MIN_BLOCKS = 2 };

/* 1 and *f the folded problem when plan's can be folded: Hkv = 1, Sq = 1,
 * the auto strategy, no block table, masks only key lengths and causal
 * (bottom-right: with one query it hides nothing the lengths do not), no
 * bias but softcap, no sinks (per head), dropout or query lengths, and at
 * least FOLD_MIN_BLOCKS blocks of NR heads (the tiled forward does not
 * split the keys: B = 1 with 128 heads keeps 2 threads busy, not 16). */
int fmha_fold_rewrite(const fmha_plan *plan, fmha_problem *f) {
    const fmha_problem *p = &plan->p;
    const fmha_masks *m = &p->masks;
    const fmha_biases *bs = &p->biases;
    if (p->strategy != FMHA_STRATEGY_AUTO || p->block_table || p->heads_kv != 1 || p->seq_q != 1 ||
        p->heads_q < FOLD_MIN_HEADS)
        return 0;
    if (p->causal == FMHA_CAUSAL_TOP_LEFT || m->window_left != -1 || m->window_right != -1 || m->q_lengths ||
        !fmha_plan_keys_one_range(plan))
        return 0;
    if (bs->dense || bs->alibi_slopes || bs->rel_table || bs->callback.fill || p->sinks || p->dropout_p != 0.0f)
        return 0;
    /* the folded problem's query blocks: the matrix driver's 32 rows where
     * it will serve (fmha_matrix_takes), else NR */
    const int64_t per_block = fmha_matrix_takes(plan) ? FMHA_MATRIX_BLOCK_Q : (int64_t)plan->uk->tile.nr;
    const int64_t blocks = p->batch * ((p->heads_q + per_block - 1) / per_block);
    if (blocks < FOLD_MIN_BLOCKS) return 0;
    *f = *p;
    f->seq_q = p->heads_q;
    f->heads_q = 1;
    f->causal = FMHA_CAUSAL_NONE;
    f->alignment = FMHA_ALIGN_CAUSAL;
    f->q_strides[1] = p->q_strides[2];
    f->o_strides[1] = p->o_strides[2];
    return 1;
}
