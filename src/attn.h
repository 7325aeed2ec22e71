/* attn.h: the library's internal picture of one call. api.c validates a
 * fmha_problem and resolves it into an fmha_plan (scale, kernels, strategy,
 * threads, workspace layout); the drivers run plans. */
#ifndef FMHA_ATTN_H
#define FMHA_ATTN_H

#include <stdint.h>

#include "fmha.h"
#include "uk/ukernel.h"

#define FMHA_ALIGN 64

typedef struct fmha_plan {
    fmha_problem p;            /* the caller's problem, sizes validated */
    float scale;               /* resolved (never 0 unless the caller asked for 0... see api.c) */
    const fmha_ukernels *uk;   /* microkernels of this call */
    fmha_strategy strategy;    /* FMHA_STRATEGY_TILED or _DENSE after resolution */
    int threads;               /* max threads of this call */
    int64_t group;             /* Hq / Hkv */
    int64_t causal_offset;     /* causal: key j visible from query i iff j - i <= offset */
    size_t thread_bytes;       /* workspace bytes per thread (multiple of FMHA_ALIGN) */
    size_t shared_bytes;       /* workspace bytes shared by all threads (multiple of FMHA_ALIGN) */
} fmha_plan;

/* Bytes of a workspace for plan (per-thread slices + shared + alignment slack). */
size_t fmha_plan_workspace_bytes(const fmha_plan *plan);

/* ---- mask: which tiles and scores a query may see ---- */
typedef enum { FMHA_TILE_EMPTY = 0, FMHA_TILE_FULL, FMHA_TILE_PARTIAL } fmha_tile_class;

/* Class of the tile of queries [q0, q0 + nq) x keys [k0, k0 + nk). */
fmha_tile_class fmha_mask_classify(const fmha_plan *plan, int64_t q0, int64_t nq, int64_t k0,
                                   int64_t nk);
/* Keys [*k_begin, *k_end) any query of [q0, q0 + nq) may see (empty: begin >= end). */
void fmha_mask_kv_range(const fmha_plan *plan, int64_t q0, int64_t nq, int64_t *k_begin,
                        int64_t *k_end);
/* Sets masked scores of an S^T tile (row r = key k0 + r, lane i = query q0 + i,
 * lanes >= nq ignored) to -inf. */
void fmha_mask_apply(const fmha_plan *plan, int64_t q0, int64_t nq, int64_t k0, int64_t nk,
                     float *st, size_t lds);

/* ---- drivers ---- */
/* Per-thread and shared workspace bytes of the forward for plan. */
void fmha_fwd_workspace(const fmha_plan *plan, size_t *thread_bytes, size_t *shared_bytes);
/* Runs the forward; ws is FMHA_ALIGN-aligned and plan-sized. Returns FMHA_OK. */
fmha_status fmha_fwd_run(const fmha_plan *plan, const float *q, const float *k, const float *v,
                         float *o, float *lse, char *ws);

void fmha_bwd_workspace(const fmha_plan *plan, size_t *thread_bytes, size_t *shared_bytes);
fmha_status fmha_bwd_run(const fmha_plan *plan, const float *q, const float *k, const float *v,
                         const float *o, const float *d_o, const float *lse, float *dq, float *dk,
                         float *dv, char *ws);

static inline size_t fmha_round_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

#endif /* FMHA_ATTN_H */
