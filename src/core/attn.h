/* attn.h: the library's internal picture of one call. plan.c validates a
 * fmha_problem and resolves it into an fmha_plan (scale, kernels, operand
 * path, strategy, threads, workspace sizes); the drivers run plans. */
#ifndef FMHA_ATTN_H
#define FMHA_ATTN_H

#include <stdint.h>

#include "fmha.h"
#include "runtime/pool.h"
#include "runtime/strided.h"
#include "uk/ukernel.h"

#define FMHA_ALIGN 64
/* Most lanes (queries per block) of any microkernel table. */
#define FMHA_MAX_NR 64

typedef struct fmha_operand_path fmha_operand_path; /* driver/operand.h */

/* Workspace of one direction: a slice per thread plus a shared area, each a
 * multiple of FMHA_ALIGN. */
typedef struct fmha_ws_size {
    size_t thread_bytes, shared_bytes;
} fmha_ws_size;

/* A resolved problem (the public fmha_plan is this struct). What
 * planning fixes comes first; the last block is set per run on the
 * runner's own copy. */
struct fmha_plan {
    fmha_problem p;            /* the caller's problem, validated */
    const struct fmha_context *ctx; /* the context it was planned on (cpu.h) */
    float scale;               /* resolved: p.scale or 1/sqrt(D) */
    const fmha_ukernels *uk;   /* microkernels */
    const fmha_operand_path *path; /* how the products read Q, K, V, dO */
    fmha_f32_softmax_ukernel_fn softmax; /* the forward's softmax step (uk's, or its lowp one) */
    /* the forward's softmax step with P written as bf16 pair-rows for the
     * path's values_paired (bf16 FAST without dropout), else NULL */
    fmha_bf16_softmax_pairs_ukernel_fn softmax_pairs;
    /* the backward's P = exp(S - lse) (uk's exp_sub, or its lowp one for bf16 FAST) */
    fmha_f32_exp_sub_ukernel_fn exp_sub;
    fmha_strategy strategy;    /* FMHA_STRATEGY_TILED or _DENSE after resolution */
    /* p.precision as this dtype reads it: bf16 takes BF16 as FAST and
     * BF16X3 as ACCURATE; float32 and f16 keep it (only the matrix driver
     * reads it there) */
    fmha_precision precision;
    const struct fmha_fwd_driver *driver; /* the forward's driver (drivers.c) */
    int threads;               /* most threads a run uses (workspace is sized for it) */
    int64_t group;             /* Hq / Hkv */
    int bottom_right;          /* off = kv_len[b] - q_len[b]: causal's or fmha_problem.alignment's */
    int64_t causal_offset;     /* off: queries and keys meet at a = i + off - j (see fmha.h) */
    /* Band (causal and sliding window): key j visible from query i iff
     * band_lo <= j - (i + off) <= band_hi (INT64_MIN / INT64_MAX: unbounded). */
    int64_t band_lo, band_hi;
    int has_mask;              /* any mask besides the band (fmha_masks_active) */
    int has_bias;              /* any bias or softcap (fmha_biases_active) */
    /* Dropout (dropout.c): on when dropout_p > 0; keep iff the hash's high
     * word >= dropout_threshold; kept weights times dropout_scale. */
    int dropout;
    float dropout_scale;
    uint64_t dropout_threshold, dropout_seed_mix;
    fmha_dtype kv_dtype;       /* element type of K and V (fmha_kv_dtype_of) */
    fmha_cache_format_id k_format, v_format; /* K's and V's rows as cache formats (format.h) */
    fmha_ws_size fwd_ws;       /* the forward's workspace (the backward's is sized when one is asked for) */
    /* What the forward's driver fixed at planning, its own (the driver
     * that serves fills its member). */
    union {
        /* decode.c: a unit serves `heads` kv heads x `rows` rows of each
         * (rows of a kv head: group x Sq, in `units` units); keys in
         * `splits` chunks of `chunk` keys (split-KV); all from the shape.
         * prefetch: the driver asks for each head's K and V ahead of its
         * reads, prefetch_keys keys ahead (decode_prefetch_ahead_bytes),
         * when they pass the tuning's decode_prefetch_bytes (float32 K and
         * V its decode_prefetch_f32_bytes, bf16 or f16 its
         * decode_prefetch_h16_bytes). Precision
         * FAST: scores, how the scores are taken (fmha_dec_scores); vint,
         * P V in integers on 16-bit P (uk->cache[v_format].values_int);
         * vbf16, P V on bf16 P (values_bf16) for a bf16 cache or float8
         * values, where the precision rounds P (a bf16 problem at FAST, a
         * float32 one at BF16). */
        struct {
            int64_t heads, rows, units, chunk, splits, prefetch_keys;
            int prefetch, scores, vint, vbf16;
        } dec;
        /* matrix.c: how the matrix part reads the operands */
        struct fmha_matrix_mode {
            int src;          /* FMHA_MATRIX_SRC_*: Q's, K's and V's element format */
            int split_inputs; /* Q, K, V as bf16 hi + lo */
            int split_p;      /* P as bf16 hi + lo */
        } matrix;
    } drv;

    /* ---- per run ---- */
    size_t thread_bytes;       /* this run's direction: bytes per thread */
    size_t shared_bytes;       /* and shared */
    fmha_dtype o_dtype;        /* forward: element type O is stored in (p.dtype, or float32) */
    const float *dsum_o;       /* backward: float32 O (O's strides) for Dsum, or NULL: use o */
    /* forward, decode.c: check_scales (in) has the step check the per-key
     * scales as it reads them (fmha_decode_reads_scales), in place of
     * fmha_kv_scales_check's pass before the run; bad_scales (out): one
     * was bad, so the merge did not run and nothing was written;
     * bad_scales_at: the flag the tasks set, fmha_decode_run's own */
    int check_scales, bad_scales;
    int *bad_scales_at;
    const fmha_param_grads *grads; /* backward: bias gradients wanted, or NULL */
    /* ALiBi and relative-position biases depend only on a = i + off - j: both
     * are summed into one vector per head, toeplitz[h * toeplitz_len + a - a_min],
     * built per run in the shared workspace (NULL when neither is on). */
    float *toeplitz;
    int64_t toeplitz_len, a_min;
};

/* Workspace carving: the same function measures (base NULL: nothing is
 * written, pointers are NULL) and carves (base set), so a size query and the
 * layout it describes cannot diverge. Each piece is FMHA_ALIGN aligned. */
typedef struct fmha_carver {
    char *base;
    size_t used;
} fmha_carver;

static inline size_t fmha_round_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

static inline void *fmha_carve(fmha_carver *c, size_t bytes) {
    void *at = c->base ? c->base + c->used : NULL;
    c->used += fmha_round_up(bytes, FMHA_ALIGN);
    return at;
}

/* Validates *p and resolves it into *plan on context ctx (cpu.h; no
 * allocation, no pointer kept but the problem's own and ctx, which must
 * outlive the plan); fmha_plan_init plans on fmha_context_default(). */
fmha_status fmha_plan_init_in(const struct fmha_context *ctx, const fmha_problem *p, fmha_plan *plan);
fmha_status fmha_plan_init(const fmha_problem *p, fmha_plan *plan);
/* fmha_forward and fmha_forward_backward planned on context ctx (fmha_tune's trials). */
fmha_status fmha_forward_in(const struct fmha_context *ctx, const fmha_problem *p, const void *q, const void *k,
                            const void *v, void *o, float *lse, void *workspace, size_t workspace_bytes);
fmha_status fmha_forward_backward_in(const struct fmha_context *ctx, const fmha_problem *p, const void *q,
                                     const void *k, const void *v, const void *d_o, void *o, float *lse, void *dq,
                                     void *dk, void *dv, const fmha_param_grads *grads);

/* Strides above INT64_MAX / 8 on extent-1 dimensions become 0 (a plan's copy). */
void fmha_problem_tame_unit_strides(fmha_problem *p);
/* Copies a caller's problem of any known struct_size into *out. */
/* 1 when K and V are stored as Q's dtype (no format of their own). */
static inline int fmha_plan_kv_as_q(const fmha_plan *plan) {
    return plan->k_format == plan->v_format && (int)plan->k_format == (int)plan->p.dtype; /* F32, BF16, F16 ids */
}

/* Capabilities the drivers share, each checked here once. */
/* A row's keys are one range (causal band, window, lengths): no segment
 * ids, dense mask or mask callback. */
static inline int fmha_plan_keys_one_range(const fmha_plan *plan) {
    const fmha_masks *m = &plan->p.masks;
    return !m->q_segment_ids && !m->dense && !m->callback.fill;
}
/* K's and V's rows contiguous (head dim stride 1): read in place by rows. */
static inline int fmha_plan_rows_contiguous(const fmha_plan *plan) {
    return plan->p.k_strides[3] == 1 && plan->p.v_strides[3] == 1;
}
/* A decode step's shape: at most 16 queries, at least 8 keys each. */
enum { FMHA_DECODE_MAX_SQ = 16, FMHA_DECODE_MIN_KV_PER_Q = 8 };
static inline int fmha_plan_decode_shape(const fmha_plan *plan) {
    return plan->p.seq_q <= FMHA_DECODE_MAX_SQ && plan->p.seq_kv >= FMHA_DECODE_MIN_KV_PER_Q * plan->p.seq_q;
}

/* The element type of K and V: p->kv_dtype, or p->dtype when it is SAME. */
static inline fmha_dtype fmha_kv_dtype_of(const fmha_problem *p) {
    return p->kv_dtype == FMHA_KV_DTYPE_SAME ? p->dtype : (fmha_dtype)(p->kv_dtype - 1);
}

fmha_status fmha_problem_load(const fmha_problem *p, fmha_problem *out);

/* The tensors of a run, by name; NULL where the run has no such tensor. */
typedef struct fmha_tensors {
    const void *q, *k, *v, *o_in, *d_o; /* inputs */
    const float *lse_in;
    void *o, *dq, *dk, *dv;             /* outputs */
    float *lse;
    const fmha_param_grads *grads;
    float *d_sinks;                     /* output [Hq] of fmha_sinks_backward */
} fmha_tensors;

/* Outputs injective and disjoint from every other tensor (the problem's mask
 * and bias arrays included): FMHA_ERR_OVERLAP, _BAD_STRIDE or _BAD_SIZE. */
fmha_status fmha_tensors_check(const fmha_problem *p, const fmha_tensors *t);

/* Bias gradients against the biases they belong to. */
fmha_status fmha_param_grads_check(const fmha_problem *p, const fmha_param_grads *g);

/* Bytes of a workspace of one direction (per-thread slices + shared + alignment slack). */
size_t fmha_ws_total(const fmha_plan *plan, fmha_ws_size ws);

/* ---- masks and biases (mask.c, bias.c) ----
 * A score tile is S^T: row r = key k0 + r, lane i = query q0 + i (lanes >= nq
 * are padding and ignored), lds floats between rows. */
typedef enum { FMHA_TILE_EMPTY = 0, FMHA_TILE_FULL, FMHA_TILE_PARTIAL } fmha_tile_class;

typedef struct fmha_tile_pos {
    int64_t b, h, q0, nq, k0, nk;
} fmha_tile_pos;

/* Class of a tile under every mask (EMPTY: skip; FULL: no masking work).
 * Returns -1 if a mask callback answered an invalid class. */
int fmha_mask_classify(const fmha_plan *plan, const fmha_tile_pos *t, int thread);
/* Keys [*k_begin, *k_end) within [0, Skv] that queries [q_first, q_last] of
 * batch element b may see under the causal/window band alone (empty when
 * begin >= end): saturating arithmetic, any band edge. */
void fmha_band_kv_range(const fmha_plan *plan, int64_t b, int64_t q_first, int64_t q_last, int64_t *k_begin,
                        int64_t *k_end);
/* Keys [*k_begin, *k_end) any query of the tile's rows may see (band and
 * key lengths; empty when begin >= end). Only t->b, q0, nq are read. */
void fmha_mask_kv_range(const fmha_plan *plan, const fmha_tile_pos *t, int64_t *k_begin,
                        int64_t *k_end);
/* Queries [*q_begin, *q_end) of batch b that may see a key of [k0, k0 + nk)
 * (band and query lengths; empty when begin >= end). */
void fmha_mask_q_range(const fmha_plan *plan, int64_t b, int64_t k0, int64_t nk, int64_t *q_begin,
                       int64_t *q_end);
/* Sets the masked scores of a PARTIAL tile to -inf. `scratch` holds
 * FMHA_MASK_SCRATCH(plan) bytes for a mask callback. */
void fmha_mask_apply(const fmha_plan *plan, const fmha_tile_pos *t, float *st, size_t lds,
                     unsigned char *scratch, int thread);
/* Calls a mask callback's classify on every tile of the grid (query blocks of
 * NR x key blocks of block_kv) before anything is written; FMHA_ERR_CALLBACK
 * if one answer is invalid. FMHA_OK when there is no classify callback. */
fmha_status fmha_mask_precheck(const fmha_plan *plan);
/* Counts computed (non-EMPTY) tiles since the last reset: tests prove block
 * skipping with it. Drivers add a task's count once, at its end. */
void fmha_tiles_reset(void);
long long fmha_tiles_computed(void);
void fmha_tiles_count(long long n);

/* A dense [B, Hq, Sq, Skv] mask, bias or bias gradient's strides st, the
 * tensor called name in messages: none negative (FMHA_ERR_BAD_STRIDE), the
 * largest element offset within INT64_MAX / 8 (FMHA_ERR_BAD_SIZE). */
fmha_status fmha_dense_check(const fmha_problem *p, const int64_t st[4], const char *name);
/* Validates masks and biases (FMHA_ERR_BAD_MASK and friends). */
fmha_status fmha_masks_check(const fmha_problem *p);
/* Dropout: the plan's fields from the problem, and the mask on a score tile
 * S^T (rows = keys k0.., lanes = queries q0..) of (b, h). */
void fmha_dropout_plan(fmha_plan *plan);
void fmha_dropout_tile(const fmha_plan *plan, const fmha_tile_pos *t, float *st, size_t lds);
/* A paged cache's block table entries for the pages the lengths use. */
fmha_status fmha_pages_check(const fmha_problem *p);
/* 1 when any mask besides the causal/window band is on. */
int fmha_masks_active(const fmha_problem *p);
/* 1 when any bias or softcap is on (every computed tile takes the epilogue). */
int fmha_biases_active(const fmha_problem *p);
/* Bytes of the shared workspace the biases need (Toeplitz vectors). */
size_t fmha_bias_shared_bytes(const fmha_plan *plan);
/* Builds plan->toeplitz in `shared` (fmha_bias_shared_bytes of it). */
void fmha_bias_prepare(fmha_plan *plan, char *shared);
/* Score epilogue of a computed tile: softcap (raw scores are kept in `raw`
 * when it is non-NULL, for the backward), then every bias, then, for a
 * PARTIAL tile, every mask. */
void fmha_score_epilogue(const fmha_plan *plan, const fmha_tile_pos *t, fmha_tile_class cls,
                         float *st, size_t lds, float *raw, unsigned char *scratch, int thread);
/* Softcap, then ALiBi, on the scores row[0, nk) of query i, head h of batch
 * element b against keys k0..: the epilogue's definitions on one contiguous
 * row (the decode driver's; other biases are not applied here). */
void fmha_bias_row(const fmha_plan *plan, int64_t b, int64_t i, int64_t h, int64_t k0, int64_t nk, float *row);

/* ---- drivers ----
 * A run gets its own copy of the plan with the per-run fields set, and a
 * FMHA_ALIGN-aligned workspace of fmha_ws_total(plan, that direction's size). */
/* A forward driver (drivers.c): whether it serves a resolved plan (filling
 * its fields of the plan when it does), its workspace and its run. */
typedef struct fmha_fwd_driver {
    const char *name; /* "fold", "decode", "matrix", "dense", "tiled" */
    int (*serves)(fmha_plan *plan);
    fmha_ws_size (*workspace)(const fmha_plan *plan);
    void (*run)(fmha_plan *run, const void *q, const void *k, const void *v, void *o, float *lse, char *ws);
} fmha_fwd_driver;
extern const fmha_fwd_driver fmha_fwd_driver_fold, fmha_fwd_driver_decode, fmha_fwd_driver_matrix,
    fmha_fwd_driver_matrix_decode, fmha_fwd_driver_dense, fmha_fwd_driver_tiled;
/* Sets plan->driver to the first of matrix_decode, decode, matrix,
 * dense, tiled that serves the plan (the planner tries the fold after
 * matrix_decode); FMHA_ERR_UNSUPPORTED when none does (a
 * paged cache without decode kernels). */
fmha_status fmha_fwd_driver_choose(fmha_plan *plan);
/* Workspace of the forward (the plan's driver's); of the backward for plan->grads. */
fmha_ws_size fmha_fwd_workspace(const fmha_plan *plan);
/* The tiled and dense drivers (fwd.c; plan->strategy tells which). */
fmha_ws_size fmha_tiled_workspace(const fmha_plan *plan);
void fmha_tiled_run(fmha_plan *run, const void *q, const void *k, const void *v, void *o, float *lse, char *ws);
/* The fold (fold.c): many heads on one kv head, one query, rewritten as a
 * problem whose queries are the heads (1 and *f when plan's problem folds);
 * the planner plans and runs it (plan.c: fmha_fwd_driver_fold). */
int fmha_fold_rewrite(const fmha_plan *plan, fmha_problem *f);
/* Matrix driver (matrix.c): the table's matrix part, fused, for bf16;
 * queries per block and keys per step of its forward. */
enum { FMHA_MATRIX_BLOCK_Q = 32 };
int fmha_matrix_plan(fmha_plan *plan);
/* 1 when the table's matrix part takes the plan's dtype and precision
 * (bf16; f16; float32 at BF16X3 or BF16): its shape and masks aside. */
int fmha_matrix_takes(const fmha_plan *plan);
/* Decoding on a matrix engine (matrix.c): bf16 FAST, 8+ rows a kv head,
 * contiguous K and V read in place. */
int fmha_matrix_decode_plan(const fmha_plan *plan);
/* Its split of a unit's keys: *splits chunks of *chunk keys. */
void fmha_matrix_decode_split(const fmha_plan *plan, int64_t *splits, int64_t *chunk);
/* Kv heads a unit (a task's share of the cache) holds: all of a batch
 * element's when they lie side by side, else 1. */
int64_t fmha_matrix_decode_heads(const fmha_plan *plan);
fmha_ws_size fmha_matrix_decode_workspace(const fmha_plan *plan);
void fmha_matrix_decode_run(fmha_plan *run, const void *q, const void *k, const void *v, void *o, float *lse,
                            char *ws);
size_t fmha_matrix_block_kv(const fmha_plan *plan);
fmha_ws_size fmha_matrix_workspace(const fmha_plan *plan);
void fmha_matrix_run(fmha_plan *run, const void *q, const void *k, const void *v, void *o, float *lse, char *ws);
/* How a decode step takes its scores (plan->drv.dec.scores): the float32
 * query against the cache's values, or (precision FAST) the query
 * quantized as q8_0 once a call against int8, q8_0 or q4_0 keys in
 * integer dot products (uk->cache[k].scores_q8), or rounded to bf16
 * against float8 keys (scores_bf16), or in bf16 pairs against bf16 keys
 * (a bf16 problem at FAST, a float32 one at BF16: scores_bf16). */
typedef enum fmha_dec_scores {
    FMHA_DEC_SCORES_F32 = 0,
    FMHA_DEC_SCORES_Q8,
    FMHA_DEC_SCORES_BF16
} fmha_dec_scores;

/* Decode driver: fills the plan's dec_* fields and returns 1 when it serves
 * this (resolved) problem's forward. */
int fmha_decode_plan(fmha_plan *plan);
fmha_ws_size fmha_decode_workspace(const fmha_plan *plan);
void fmha_decode_run(fmha_plan *run, const void *q, const void *k, const void *v, void *o, float *lse,
                     char *ws);
/* 1 when a decode run of this plan (the decode driver's) reads every
 * per-key scale that fmha_kv_scales_check reads (each sequence's keys [0,
 * its length), every kv head), so that the step can check them as it
 * reads them (read from the problem's lengths: at run time); 0 when there
 * are none. */
int fmha_decode_reads_scales(const fmha_plan *plan);
/* The causal-alignment offset of batch element b: query i meets key j at
 * a = i + off - j (see fmha.h). */
int64_t fmha_causal_off(const fmha_plan *plan, int64_t b);
/* A backward driver (drivers.c's list: matrix, tiled): whether it serves
 * a plan, its workspace and its run, which returns 0 when it declines at
 * run time, having written nothing (the next in the list then runs). */
typedef struct fmha_bwd_driver {
    const char *name; /* "matrix", "tiled" */
    int (*serves)(const fmha_plan *plan);
    fmha_ws_size (*workspace)(const fmha_plan *plan);
    int (*run)(fmha_plan *run, const void *q, const void *k, const void *v, const void *o, const void *d_o,
               const float *lse, void *dq, void *dk, void *dv, char *ws);
} fmha_bwd_driver;
extern const fmha_bwd_driver fmha_bwd_driver_matrix, fmha_bwd_driver_tiled;
/* The first backward driver that serves a plan (fmha_plan_describe's backward=). */
const fmha_bwd_driver *fmha_bwd_driver_of(const fmha_plan *plan);
/* The backward's workspace: the largest of the drivers that may run. */
fmha_ws_size fmha_bwd_workspace(const fmha_plan *plan);
/* The drivers: tiled (bwd.c: every problem) and matrix (matrix_bwd.c:
 * bf16 FAST on a matrix engine; its run returns 0, having written
 * nothing, when K or V is not finite). */
fmha_ws_size fmha_tiled_bwd_workspace(const fmha_plan *plan);
/* Dsum = rowsum(dO * O) of the row at element `at` (O's strides) in
 * float64 in one fixed order (bwd.c), O from the fused call's float32 copy
 * (dsum_o) where there is one; rows not float32 of unit stride are widened
 * into o_tmp and do_tmp [Dv]. Both drivers' Dsum, so that they give the
 * same bits. */
float fmha_row_dsum(const fmha_plan *plan, const void *o, const void *d_o, int64_t at, float *o_tmp, float *do_tmp);
void fmha_tiled_bwd_run(fmha_plan *run, const void *q, const void *k, const void *v, const void *o,
                        const void *d_o, const float *lse, void *dq, void *dk, void *dv, char *ws);
int fmha_matrix_bwd_plan(const fmha_plan *plan);
fmha_ws_size fmha_matrix_bwd_workspace(const fmha_plan *plan);
int fmha_matrix_bwd_run(fmha_plan *run, const void *q, const void *k, const void *v, const void *o, const void *d_o,
                        const float *lse, void *dq, void *dk, void *dv, char *ws);
/* The forward on the plan's driver. */
void fmha_fwd_run(fmha_plan *run, const void *q, const void *k, const void *v, void *o, float *lse,
                  char *ws);
void fmha_bwd_run(fmha_plan *run, const void *q, const void *k, const void *v, const void *o,
                  const void *d_o, const float *lse, void *dq, void *dk, void *dv, char *ws);
/* Forward then backward (fused.c): bf16/f16 keep a float32 O for Dsum.
 * `o32` is fmha_fused_o32_bytes of memory for those dtypes (else NULL). */
size_t fmha_fused_o32_bytes(const fmha_plan *plan);
void fmha_fused_run(fmha_plan *run, const void *q, const void *k, const void *v, const void *d_o,
                    void *o, float *lse, void *dq, void *dk, void *dv, float *o32, char *ws);

/* After a caller's callback returned on this thread: the kernels' thread
 * state (if any) is set up again before their next use. */
static inline void fmha_after_callback(const fmha_plan *plan) {
    if (plan->uk->thread.foreign) plan->uk->thread.foreign();
}

/* A driver's parallel job on the run's threads, with its kernel table's
 * per-thread hooks around each thread's tasks. */
static inline void fmha_run_parallel(const fmha_plan *run, size_t n_tasks, fmha_task_fn fn, void *ctx) {
    fmha_parallel_for_hooked(n_tasks, run->threads, fn, ctx, run->uk->thread.begin, run->uk->thread.end);
}

fmha_status fmha_biases_check(const fmha_problem *p);
/* Backward: doubles of one task's Toeplitz gradient accumulator (0: none). */
size_t fmha_bias_grad_task_doubles(const fmha_plan *plan, size_t heads_per_task);
/* Backward: a dS tile's contribution to the bias gradients: the dense bias
 * gradient (in place, the task split keeps writers apart), the Toeplitz sums
 * (diag: scratch of NR + block_kv doubles; task_acc: this task's row for
 * head t->h, or NULL) and the callback's accumulate_grad. */
void fmha_bias_grad_tile(const fmha_plan *plan, const fmha_tile_pos *t, const float *ds, size_t lds,
                         double *diag, double *task_acc, int thread);
void fmha_softcap_grad(const fmha_plan *plan, const fmha_tile_pos *t, float *ds, size_t lds,
                       const float *raw);
void fmha_bias_grad_finish(const fmha_plan *plan, const double *task_acc, size_t n_tasks,
                           size_t heads_per_task, size_t task_stride,
                           int64_t (*task_head0)(const void *ctx, size_t task), const void *ctx,
                           double *bucket_acc);

/* The end of a row of the forward: its max m and sum l over the keys (l == 0:
 * it saw none) give the factor that scales the row's unnormalised output and
 * its lse, with the head's attention sink in the denominator when there are
 * sinks (fmha.h). Without sinks: 1 / l and m + log l (0 and -inf when l == 0). */
void fmha_row_finish(const fmha_plan *plan, int64_t h, float m, float l, float *o_scale, float *lse);

/* Bytes per thread for a mask callback's visibility tile (0 when none). */
size_t fmha_mask_scratch_bytes(const fmha_plan *plan);

/* fmha_load_row and fmha_store_row (convert.h, same contracts) with the
 * table's widening and narrowing kernels for unit-stride bf16 rows (and
 * f16 rows, widening): the same values (a signalling NaN may be read back
 * quiet), fewer instructions. Rows of any length. */
void fmha_load_row_uk(const fmha_ukernels *uk, const void *base, fmha_dtype t, int64_t first,
                      int64_t stride, int64_t n, float *dst);
void fmha_store_row_uk(const fmha_ukernels *uk, void *base, fmha_dtype t, int64_t first, int64_t stride,
                       int64_t n, const float *src, float scale);
/* A row as float32 of unit stride: a float32 row of unit stride where it
 * is, else fmha_load_row_uk's values in tmp [n]. */
const float *fmha_row_f32_uk(const fmha_ukernels *uk, const void *base, fmha_dtype t, int64_t first,
                             int64_t stride, int64_t n, float *tmp);

#endif /* FMHA_ATTN_H */
