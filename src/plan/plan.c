/* plan.c: planning and running. fmha_plan_init resolves a checked problem
 * into a plan (scale, microkernels, operand path, strategy, band, workspace
 * sizes); a run copies the plan, sets the per-run fields (threads, the
 * direction's workspace, gradients) and hands it to a driver. The one-shot
 * entry points run a plan on the stack; fmha_plan_create keeps one on the
 * heap with its own workspace, so repeated runs skip the planning and, after
 * the first run of each direction, every allocation. */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/attn.h"
#include "config/cpu.h"
#include "config/tuning.h"
#include "driver/operand.h"
#include "runtime/error.h"
#include "format/format.h"
#include "runtime/pool.h"

/* Dense materialises the scores of one head per thread. Measured with
 * fmha-bench (B = 1, 8 heads, D = 64, float32, 2 threads, AVX-512, one run,
 * median ms, dense / tiled): fwd S=64 0.058/0.064, S=128 0.167/0.143,
 * S=256 0.440/0.423, S=512 1.43/1.44, S=1024 5.49/5.45, S=2048 52/41;
 * fwdbwd within 2% of each other up to 1024 (one backward serves both).
 * Dense wins only below ~100 x 100 scores and needs O(S^2) memory, so auto
 * takes it there only: dense_max_scores' default, 96 x 96 (tuning.h), which
 * a tuning may move. */
static fmha_strategy resolve_strategy(const fmha_problem *p, const fmha_tuning *tuning) {
    const int64_t dense_max = tuning->dense_max_scores; /* default 96 x 96 (tuning.h) */
    if (p->dropout_p > 0.0f) return FMHA_STRATEGY_TILED; /* dropout lives in the tiled drivers */
    switch (p->strategy) {
    case FMHA_STRATEGY_DENSE: return FMHA_STRATEGY_DENSE;
    case FMHA_STRATEGY_AUTO:
        return p->seq_q * p->seq_kv <= dense_max ? FMHA_STRATEGY_DENSE
                                                                  : FMHA_STRATEGY_TILED;
    case FMHA_STRATEGY_TILED:
    case FMHA_STRATEGY_PORTABLE: return FMHA_STRATEGY_TILED;
    }
    return FMHA_STRATEGY_TILED;
}

/* The folded plan of a plan the fold serves (fold.c's rewrite, planned
 * on the plan's context); 0 when the rewrite does not apply or its plan
 * would decode again. */
static int plan_folded(const fmha_plan *plan, fmha_plan *folded) {
    fmha_problem f;
    if (!fmha_fold_rewrite(plan, &f) || fmha_plan_init_in(plan->ctx, &f, folded) != FMHA_OK) return 0;
    return folded->driver != &fmha_fwd_driver_decode;
}

/* The fold's run: the folded plan's forward, on this run's threads and workspace. */
static void fold_run(fmha_plan *run, const void *q, const void *k, const void *v, void *o, float *lse, char *ws) {
    fmha_plan folded;
    plan_folded(run, &folded); /* served at planning: the same answer */
    folded.threads = run->threads;
    folded.thread_bytes = folded.fwd_ws.thread_bytes;
    folded.shared_bytes = folded.fwd_ws.shared_bytes;
    fmha_fwd_run(&folded, q, k, v, o, lse, ws);
}

/* The fold is a rewrite of the problem inside the planner (fold.c), not a
 * driver of the list: planning and running it plan the folded problem. */
const fmha_fwd_driver fmha_fwd_driver_fold = {"fold", NULL, NULL, fold_run};

fmha_status fmha_plan_init(const fmha_problem *p_in, fmha_plan *plan) {
    return fmha_plan_init_in(fmha_context_default(), p_in, plan);
}

fmha_status fmha_plan_init_in(const fmha_context *ctx, const fmha_problem *p_in, fmha_plan *plan) {
    fmha_status st = fmha_problem_check(p_in);
    if (st != FMHA_OK) return st;
    *plan = (fmha_plan){0};
    plan->ctx = ctx;
    fmha_problem_load(p_in, &plan->p);
    fmha_problem_tame_unit_strides(&plan->p);
    const fmha_problem *p = &plan->p;
    const fmha_masks *mk = &p->masks;
    plan->band_lo = mk->window_left >= 0 ? -mk->window_left : INT64_MIN;
    plan->band_hi = mk->window_right >= 0 ? mk->window_right : INT64_MAX;
    if (p->causal != FMHA_CAUSAL_NONE && plan->band_hi > 0) plan->band_hi = 0;
    plan->has_mask = fmha_masks_active(p);
    plan->has_bias = fmha_biases_active(p);
    /* +0.0 by its bits: a compare would also take -0.0 and, on a thread
     * that treats subnormals as zero (XLA's), the subnormals for it */
    uint32_t scale_bits;
    memcpy(&scale_bits, &p->scale, sizeof scale_bits);
    plan->scale = scale_bits != 0 ? p->scale : (float)(1.0 / sqrt((double)p->head_dim));
    /* the portable strategy runs the specification, scalar */
    const fmha_context *run_ctx = p->strategy == FMHA_STRATEGY_PORTABLE ? fmha_cpu_context_for("scalar") : ctx;
    /* float32 in IEEE arithmetic: on the float32 tiles the tuning names */
    const int f32_ieee =
        p->dtype == FMHA_DTYPE_F32 && p->precision != FMHA_PRECISION_BF16X3 && p->precision != FMHA_PRECISION_BF16;
    plan->uk = f32_ieee ? run_ctx->f32 : run_ctx->uk;
    plan->kv_dtype = fmha_kv_dtype_of(p);
    plan->k_format = fmha_problem_format(p, 0);
    plan->v_format = fmha_problem_format(p, 1);
    /* K or V in a format of its own: widened once per call (tiled, dense);
     * the matrix driver, where it serves, runs its own tiles */
    plan->path = fmha_plan_kv_as_q(plan) ? fmha_operand_path_for(p->dtype, p->precision, plan->uk) : &fmha_path_widened;
    plan->precision = p->precision;
    if (p->dtype == FMHA_DTYPE_BF16 && p->precision == FMHA_PRECISION_BF16) plan->precision = FMHA_PRECISION_FAST;
    if (p->dtype == FMHA_DTYPE_BF16 && p->precision == FMHA_PRECISION_BF16X3) plan->precision = FMHA_PRECISION_ACCURATE;
    /* bf16 pairs, precision FAST: P (and in the backward dS) rounded to bf16
     * right after the exp, so exp to a few 1e-6 suffices (lse stays within 1e-5) */
    const int bf16_fast = plan->path == &fmha_path_bf16 && fmha_pairs_round_p(plan);
    plan->softmax = bf16_fast ? plan->uk->tile.softmax_lowp : plan->uk->tile.softmax;
    plan->exp_sub = bf16_fast ? plan->uk->tile.exp_sub_lowp : plan->uk->tile.exp_sub;
    plan->strategy = resolve_strategy(p, plan->uk->tuning);
    plan->threads = fmha_pool_threads();
    plan->o_dtype = p->dtype;
    plan->group = p->heads_q / p->heads_kv;
    plan->bottom_right = p->causal == FMHA_CAUSAL_BOTTOM_RIGHT || p->alignment == FMHA_ALIGN_BOTTOM_RIGHT;
    plan->causal_offset = plan->bottom_right ? p->seq_kv - p->seq_q : 0;
    fmha_dropout_plan(plan);
    /* and without dropout, P's pairs straight from the softmax step (tiled strategy) */
    plan->softmax_pairs = bf16_fast && !plan->dropout ? plan->uk->bf16.softmax_pairs
                                                                                     : NULL;
    st = fmha_mask_precheck(plan);
    if (st != FMHA_OK) return st;
    /* the forward's driver (a paged cache has only the decode driver's
     * addressing), after matrix_decode the fold where it serves */
    fmha_plan folded;
    st = fmha_fwd_driver_choose(plan);
    if (st != FMHA_OK) return st;
    if (plan->driver != &fmha_fwd_driver_matrix_decode && plan_folded(plan, &folded)) {
        plan->driver = &fmha_fwd_driver_fold;
        plan->fwd_ws = folded.fwd_ws;
    } else {
        plan->fwd_ws = fmha_fwd_workspace(plan);
    }
    return FMHA_OK;
}

/* Paged caches and K, V of another dtype than Q: forward only. */
static fmha_status backward_supported(const fmha_plan *plan) {
    if (plan->p.block_table)
        return fmha_fail(FMHA_ERR_UNSUPPORTED, "the backward does not read a paged cache (block_table is set)");
    if (!fmha_plan_kv_as_q(plan))
        return fmha_fail(FMHA_ERR_UNSUPPORTED, "the backward needs K and V of Q's dtype (K is %s, V %s)",
                         fmha_cache_format_at(plan->k_format)->name, fmha_cache_format_at(plan->v_format)->name);
    return FMHA_OK;
}

size_t fmha_ws_total(const fmha_plan *plan, fmha_ws_size ws) {
    return (size_t)plan->threads * ws.thread_bytes + ws.shared_bytes + FMHA_ALIGN;
}

/* The backward's workspace for gradients g, sized when a backward is
 * asked for (planning sizes the forward's only): the task split and the
 * bias accumulators depend on which are wanted. */
static fmha_ws_size bwd_ws_for(const fmha_plan *plan, const fmha_param_grads *g) {
    fmha_plan with = *plan;
    with.grads = g && (g->d_dense || g->d_alibi || g->d_rel_table) ? g : NULL;
    return fmha_bwd_workspace(&with);
}

/* A run's copy of the plan: the current thread count and one direction's
 * workspace. */
static fmha_plan run_of(const fmha_plan *plan, fmha_ws_size ws, const fmha_param_grads *g) {
    fmha_plan run = *plan;
    run.threads = fmha_pool_threads();
    run.thread_bytes = ws.thread_bytes;
    run.shared_bytes = ws.shared_bytes;
    run.grads = g;
    run.check_scales = run.bad_scales = 0;
    return run;
}

/* ---- workspace ---- */

/* A heap plan: the plan first, so the public pointer is the box's. */
typedef struct plan_box {
    fmha_plan plan;
    pthread_mutex_t lock;  /* one run at a time */
    void *block;           /* the workspace allocation */
    size_t bytes;          /* its size */
} plan_box;

/* The one-shot calls' own workspace, kept between calls: a fresh
 * allocation of megabytes comes back from the system as untouched pages,
 * and faulting them in cost 5-7% of a forward+backward at S = 1024 (every
 * call, as glibc returns large blocks on free). One call at a time holds it
 * (try-lock; a concurrent call, or a child forked while it was held,
 * allocates its own); blocks over ONESHOT_KEEP_MAX are freed after their
 * call. */
#define ONESHOT_KEEP_MAX ((size_t)64 << 20)
static pthread_mutex_t oneshot_lock = PTHREAD_MUTEX_INITIALIZER;
static void *oneshot_block;  /* guarded by oneshot_lock */
static size_t oneshot_bytes;
static char oneshot_marker;  /* *owned of a run on oneshot_block */

/* Where a run's workspace comes from: a plan's (grown to need), the caller's,
 * the kept one-shot block (*owned = &oneshot_marker), or a fresh allocation
 * (*owned, freed after the run); ws_give gives it back. */
static fmha_status ws_take(plan_box *box, void *user, size_t user_bytes, size_t need, char **aligned,
                           void **owned) {
    void *ws;
    *owned = NULL;
    if (box) {
        if (box->bytes < need) {
            void *grown = malloc(need);
            if (!grown)
                return fmha_fail(FMHA_ERR_OUT_OF_MEMORY, "the plan's workspace of %zu bytes could not be allocated", need);
            free(box->block);
            box->block = grown;
            box->bytes = need;
        }
        ws = box->block;
    } else if (user) {
        if (user_bytes < need)
            return fmha_fail(FMHA_ERR_WORKSPACE_TOO_SMALL, "workspace_bytes must be at least %zu, got %zu", need,
                             user_bytes);
        ws = user;
    } else if (need <= ONESHOT_KEEP_MAX && pthread_mutex_trylock(&oneshot_lock) == 0) {
        if (oneshot_bytes < need) {
            free(oneshot_block);
            oneshot_block = malloc(need);
            oneshot_bytes = oneshot_block ? need : 0;
            if (!oneshot_block) {
                pthread_mutex_unlock(&oneshot_lock);
                return fmha_fail(FMHA_ERR_OUT_OF_MEMORY, "a workspace of %zu bytes could not be allocated", need);
            }
        }
        ws = oneshot_block;
        *owned = &oneshot_marker;
    } else {
        ws = *owned = malloc(need);
        if (!ws) return fmha_fail(FMHA_ERR_OUT_OF_MEMORY, "a workspace of %zu bytes could not be allocated", need);
    }
    *aligned = (char *)ws + (FMHA_ALIGN - (uintptr_t)ws % FMHA_ALIGN) % FMHA_ALIGN;
    return FMHA_OK;
}

static void ws_give(void *owned) {
    if (owned == &oneshot_marker)
        pthread_mutex_unlock(&oneshot_lock);
    else
        free(owned);
}

/* ---- runs (plan checked; box NULL for the one-shot calls) ---- */

static fmha_status run_forward(const fmha_plan *plan, plan_box *box, const void *q, const void *k,
                               const void *v, void *o, float *lse, void *user_ws, size_t user_bytes) {
    fmha_status st = FMHA_CHECK_POINTERS("q, k, v, o", q, k, v, o);
    if (st != FMHA_OK) return st;
    fmha_tensors t = {.q = q, .k = k, .v = v, .o = o, .lse = lse};
    st = fmha_tensors_check(&plan->p, &t);
    /* the decode step checks the per-key scales as it reads them when it
     * reads them all: one pass over them, on every thread */
    const int in_step = st == FMHA_OK && plan->driver == &fmha_fwd_driver_decode && fmha_decode_reads_scales(plan);
    if (st == FMHA_OK && !in_step) st = fmha_kv_scales_check(&plan->p);
    if (st != FMHA_OK) return st;
    fmha_plan run = run_of(plan, plan->fwd_ws, NULL);
    run.check_scales = in_step;
    char *ws;
    void *owned;
    st = ws_take(box, user_ws, user_bytes, fmha_ws_total(&run, plan->fwd_ws), &ws, &owned);
    if (st != FMHA_OK) return st;
    fmha_fwd_run(&run, q, k, v, o, lse, ws);
    ws_give(owned);
    if (!run.bad_scales) return FMHA_OK;
    /* a bad scale: the step wrote nothing; the check names it (unless the
     * caller changed the scales during the call) */
    st = fmha_kv_scales_check(&plan->p);
    return st != FMHA_OK ? st : fmha_fail(FMHA_ERR_BAD_SCALE, "a k_scales or v_scales value was not finite and >= 0 "
                                                              "when read (the scales changed during the call)");
}

/* A backward or fused run's checks, in this order, once its pointers'
 * check (checked) passed; then its run plan and the backward's workspace. */
static fmha_status bwd_prepare(fmha_status checked, const fmha_plan *plan, const fmha_tensors *t,
                               fmha_ws_size *wss, fmha_plan *run) {
    fmha_status st = checked != FMHA_OK ? checked : backward_supported(plan);
    if (st == FMHA_OK) st = fmha_param_grads_check(&plan->p, t->grads);
    if (st == FMHA_OK) st = fmha_tensors_check(&plan->p, t);
    if (st != FMHA_OK) return st;
    *wss = bwd_ws_for(plan, t->grads);
    *run = run_of(plan, *wss, t->grads);
    return FMHA_OK;
}

static fmha_status run_backward(const fmha_plan *plan, plan_box *box, const void *q, const void *k,
                                const void *v, const void *o, const void *d_o, const float *lse,
                                void *dq, void *dk, void *dv, const fmha_param_grads *grads,
                                void *user_ws, size_t user_bytes) {
    fmha_tensors t = {.q = q, .k = k, .v = v, .o_in = o, .d_o = d_o, .lse_in = lse,
                      .dq = dq, .dk = dk, .dv = dv, .grads = grads};
    fmha_ws_size wss;
    fmha_plan run;
    fmha_status st =
        bwd_prepare(FMHA_CHECK_POINTERS("q, k, v, o, d_o, lse, dq, dk, dv", q, k, v, o, d_o, lse, dq, dk, dv), plan, &t, &wss, &run);
    if (st != FMHA_OK) return st;
    char *ws;
    void *owned;
    st = ws_take(box, user_ws, user_bytes, fmha_ws_total(&run, wss), &ws, &owned);
    if (st != FMHA_OK) return st;
    fmha_bwd_run(&run, q, k, v, o, d_o, lse, dq, dk, dv, ws);
    ws_give(owned);
    return FMHA_OK;
}

static size_t max_size(size_t a, size_t b) { return a > b ? a : b; }

static fmha_status run_fused(const fmha_plan *plan, plan_box *box, const void *q, const void *k,
                             const void *v, const void *d_o, void *o, float *lse, void *dq, void *dk,
                             void *dv, const fmha_param_grads *grads) {
    fmha_tensors t = {.q = q, .k = k, .v = v, .d_o = d_o, .o = o, .lse = lse,
                      .dq = dq, .dk = dk, .dv = dv, .grads = grads};
    fmha_ws_size wss;
    fmha_plan run;
    fmha_status st =
        bwd_prepare(FMHA_CHECK_POINTERS("q, k, v, d_o, o, lse, dq, dk, dv", q, k, v, d_o, o, lse, dq, dk, dv), plan, &t, &wss, &run);
    if (st != FMHA_OK) return st;
    /* [o32][one workspace that serves both directions] */
    size_t o32_bytes = fmha_fused_o32_bytes(plan);
    size_t need = o32_bytes + max_size(fmha_ws_total(&run, plan->fwd_ws), fmha_ws_total(&run, wss));
    char *ws;
    void *owned;
    st = ws_take(box, NULL, 0, need, &ws, &owned);
    if (st != FMHA_OK) return st;
    fmha_fused_run(&run, q, k, v, d_o, o, lse, dq, dk, dv, o32_bytes ? (float *)ws : NULL,
                   ws + o32_bytes);
    ws_give(owned);
    return FMHA_OK;
}

/* ---- one-shot entry points ---- */

/* A one-shot call's plan on ctx, once its arguments' check (checked) passed. */
static fmha_status oneshot_plan(fmha_status checked, const fmha_context *ctx, const fmha_problem *p,
                                fmha_plan *plan) {
    return checked != FMHA_OK ? checked : fmha_plan_init_in(ctx, p, plan);
}

fmha_status fmha_forward_workspace_size(const fmha_problem *p, size_t *bytes) {
    fmha_error_clear();
    fmha_plan plan;
    fmha_status st = oneshot_plan(FMHA_CHECK_POINTERS("bytes", bytes), fmha_context_default(), p, &plan);
    if (st != FMHA_OK) return st;
    *bytes = fmha_ws_total(&plan, plan.fwd_ws);
    return FMHA_OK;
}

fmha_status fmha_backward_workspace_size(const fmha_problem *p, size_t *bytes) {
    fmha_error_clear();
    fmha_plan plan;
    fmha_status st = oneshot_plan(FMHA_CHECK_POINTERS("bytes", bytes), fmha_context_default(), p, &plan);
    if (st != FMHA_OK) return st;
    st = backward_supported(&plan);
    if (st != FMHA_OK) return st;
    /* enough for any gradients the biases allow */
    fmha_param_grads all = {0};
    const fmha_biases *bs = &plan.p.biases;
    float probe;
    if (bs->dense) {
        all.d_dense = &probe;
        for (int i = 0; i < 4; i++) all.d_dense_strides[i] = bs->dense_strides[i];
    }
    if (bs->alibi_slopes) all.d_alibi = &probe;
    if (bs->rel_table) all.d_rel_table = &probe;
    *bytes = max_size(fmha_ws_total(&plan, bwd_ws_for(&plan, NULL)), fmha_ws_total(&plan, bwd_ws_for(&plan, &all)));
    return FMHA_OK;
}

fmha_status fmha_forward_in(const fmha_context *ctx, const fmha_problem *p, const void *q, const void *k,
                            const void *v, void *o, float *lse, void *workspace, size_t workspace_bytes) {
    fmha_error_clear();
    fmha_plan plan;
    fmha_status st = oneshot_plan(FMHA_CHECK_POINTERS("p, q, k, v, o", p, q, k, v, o), ctx, p, &plan);
    return st != FMHA_OK ? st : run_forward(&plan, NULL, q, k, v, o, lse, workspace, workspace_bytes);
}

fmha_status fmha_forward(const fmha_problem *p, const void *q, const void *k, const void *v,
                         void *o, float *lse, void *workspace, size_t workspace_bytes) {
    return fmha_forward_in(fmha_context_default(), p, q, k, v, o, lse, workspace, workspace_bytes);
}

fmha_status fmha_backward(const fmha_problem *p, const void *q, const void *k, const void *v,
                          const void *o, const void *d_o, const float *lse, void *dq, void *dk,
                          void *dv, const fmha_param_grads *grads, void *workspace,
                          size_t workspace_bytes) {
    fmha_error_clear();
    fmha_plan plan;
    fmha_status st = oneshot_plan(
        FMHA_CHECK_POINTERS("p, q, k, v, o, d_o, lse, dq, dk, dv", p, q, k, v, o, d_o, lse, dq, dk, dv),
        fmha_context_default(), p, &plan);
    return st != FMHA_OK ? st
                         : run_backward(&plan, NULL, q, k, v, o, d_o, lse, dq, dk, dv, grads, workspace,
                                        workspace_bytes);
}

fmha_status fmha_forward_backward_in(const fmha_context *ctx, const fmha_problem *p, const void *q, const void *k,
                                     const void *v, const void *d_o, void *o, float *lse, void *dq, void *dk,
                                     void *dv, const fmha_param_grads *grads) {
    fmha_error_clear();
    fmha_plan plan;
    fmha_status st = oneshot_plan(
        FMHA_CHECK_POINTERS("p, q, k, v, d_o, o, lse, dq, dk, dv", p, q, k, v, d_o, o, lse, dq, dk, dv), ctx, p,
        &plan);
    return st != FMHA_OK ? st : run_fused(&plan, NULL, q, k, v, d_o, o, lse, dq, dk, dv, grads);
}

fmha_status fmha_forward_backward(const fmha_problem *p, const void *q, const void *k,
                                  const void *v, const void *d_o, void *o, float *lse, void *dq,
                                  void *dk, void *dv, const fmha_param_grads *grads) {
    return fmha_forward_backward_in(fmha_context_default(), p, q, k, v, d_o, o, lse, dq, dk, dv, grads);
}

/* ---- plans ---- */

fmha_status fmha_plan_create(const fmha_problem *p, fmha_plan **out) {
    fmha_error_clear();
    fmha_status st = FMHA_CHECK_POINTERS("p, plan", p, out);
    if (st != FMHA_OK) return st;
    plan_box *box = calloc(1, sizeof *box);
    if (!box) return fmha_fail(FMHA_ERR_OUT_OF_MEMORY, "the plan could not be allocated");
    st = fmha_plan_init(p, &box->plan);
    if (st == FMHA_OK && pthread_mutex_init(&box->lock, NULL) != 0)
        st = fmha_fail(FMHA_ERR_OUT_OF_MEMORY, "the plan's lock could not be created");
    if (st != FMHA_OK) {
        free(box);
        return st;
    }
    *out = &box->plan;
    return FMHA_OK;
}

void fmha_plan_destroy(fmha_plan *plan) {
    if (!plan) return;
    plan_box *box = (plan_box *)plan;
    pthread_mutex_destroy(&box->lock);
    free(box->block);
    free(box);
}

const fmha_problem *fmha_plan_problem(const fmha_plan *plan) { return plan ? &plan->p : NULL; }

size_t fmha_plan_workspace_held(const fmha_plan *plan) {
    if (!plan) return 0;
    plan_box *box = (plan_box *)plan;
    pthread_mutex_lock(&box->lock);
    size_t bytes = box->bytes;
    pthread_mutex_unlock(&box->lock);
    return bytes;
}

/* The contents a plan cannot have checked for good, O(B + Hq): lengths,
 * block table entries, ALiBi slopes and sinks (finite). */
static fmha_status plan_recheck(const fmha_plan *plan) {
    fmha_status st = fmha_masks_check(&plan->p);
    return st == FMHA_OK ? fmha_biases_check(&plan->p) : st;
}

/* A plan run's start: the plan rechecked and, when it passes, its lock
 * taken (plan_leave gives it back). */
static fmha_status plan_enter(fmha_plan *plan) {
    fmha_error_clear();
    if (!plan) return fmha_fail(FMHA_ERR_NULL_POINTER, "plan must not be NULL");
    fmha_status st = plan_recheck(plan);
    if (st == FMHA_OK) pthread_mutex_lock(&((plan_box *)plan)->lock);
    return st;
}

static fmha_status plan_leave(fmha_plan *plan, fmha_status st) {
    pthread_mutex_unlock(&((plan_box *)plan)->lock);
    return st;
}

fmha_status fmha_plan_forward(fmha_plan *plan, const void *q, const void *k, const void *v, void *o,
                              float *lse) {
    fmha_status st = plan_enter(plan);
    return st != FMHA_OK ? st : plan_leave(plan, run_forward(plan, (plan_box *)plan, q, k, v, o, lse, NULL, 0));
}

fmha_status fmha_plan_backward(fmha_plan *plan, const void *q, const void *k, const void *v,
                               const void *o, const void *d_o, const float *lse, void *dq, void *dk,
                               void *dv, const fmha_param_grads *grads) {
    fmha_status st = plan_enter(plan);
    return st != FMHA_OK ? st : plan_leave(plan, run_backward(plan, (plan_box *)plan, q, k, v, o, d_o, lse, dq, dk, dv, grads, NULL, 0));
}

fmha_status fmha_plan_forward_backward(fmha_plan *plan, const void *q, const void *k, const void *v,
                                       const void *d_o, void *o, float *lse, void *dq, void *dk,
                                       void *dv, const fmha_param_grads *grads) {
    fmha_status st = plan_enter(plan);
    return st != FMHA_OK ? st : plan_leave(plan, run_fused(plan, (plan_box *)plan, q, k, v, d_o, o, lse, dq, dk, dv, grads));
}
