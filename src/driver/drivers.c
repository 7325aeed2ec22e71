/* drivers.c: the forward drivers as an ordered list. Planning asks each in
 * turn whether it serves the resolved plan (a driver that does fills its
 * own fields of the plan) and the first that does is the plan's; the run
 * and the workspace are the chosen driver's. Most specialised first:
 *   matrix_decode  a decode step of 8+ rows a kv head (GQA x queries,
 *           MLA's heads) on a matrix engine, K and V read in place (matrix.c)
(after matrix_decode the planner tries the fold, a rewrite of a decode
 * step of many heads on one kv head: plan.c, fold.c)
 *   decode  few queries against many keys, paged caches (decode.c)
 *   matrix  bf16 on a matrix engine (AMX tiles), Q K V and P tile-shaped
 *           end to end (matrix.c)
 *   dense   small problems, scores materialised per head (fwd.c)
 *   tiled   everything else (fwd.c)
 * and the backward drivers likewise (matrix, tiled). */
#include "core/attn.h"
#include "runtime/error.h"

static int decode_serves(fmha_plan *plan) { return fmha_decode_plan(plan); }

/* auto's choice for small problems, or the caller's; never a paged cache */
/* bf16 on a matrix engine (AMX tiles), fused: matrix.c */
static int matrix_serves(fmha_plan *plan) { return fmha_matrix_plan(plan); }

/* a decode step of 8+ rows a kv head on a matrix engine, K and V read in place: matrix.c */
static int matrix_decode_serves(fmha_plan *plan) { return fmha_matrix_decode_plan(plan); }

static int dense_serves(fmha_plan *plan) { return !plan->p.block_table && plan->strategy == FMHA_STRATEGY_DENSE; }

static int tiled_serves(fmha_plan *plan) { return !plan->p.block_table; }

const fmha_fwd_driver fmha_fwd_driver_decode = {"decode", decode_serves, fmha_decode_workspace, fmha_decode_run};
const fmha_fwd_driver fmha_fwd_driver_matrix = {"matrix", matrix_serves, fmha_matrix_workspace, fmha_matrix_run};
const fmha_fwd_driver fmha_fwd_driver_matrix_decode = {"matrix_decode", matrix_decode_serves,
                                                       fmha_matrix_decode_workspace, fmha_matrix_decode_run};
const fmha_fwd_driver fmha_fwd_driver_dense = {"dense", dense_serves, fmha_tiled_workspace, fmha_tiled_run};
const fmha_fwd_driver fmha_fwd_driver_tiled = {"tiled", tiled_serves, fmha_tiled_workspace, fmha_tiled_run};

static const fmha_fwd_driver *const fwd_drivers[] = {&fmha_fwd_driver_matrix_decode, &fmha_fwd_driver_decode,
                                                     &fmha_fwd_driver_matrix, &fmha_fwd_driver_dense,
                                                     &fmha_fwd_driver_tiled};

fmha_status fmha_fwd_driver_choose(fmha_plan *plan) {
    for (size_t i = 0; i < sizeof fwd_drivers / sizeof fwd_drivers[0]; i++)
        if (fwd_drivers[i]->serves(plan)) {
            plan->driver = fwd_drivers[i];
            return FMHA_OK;
        }
    return fmha_fail(FMHA_ERR_UNSUPPORTED, "no driver serves this problem: a paged cache (block_table) is read by the "
                     "decode driver only, which needs contiguous head dims (k_strides[3] = v_strides[3] = 1) and no "
                     "dense mask or bias, segment ids, callbacks, relative-position table or dropout");
}

fmha_ws_size fmha_fwd_workspace(const fmha_plan *plan) { return plan->driver->workspace(plan); }

/* The backward drivers, an ordered list as the forward's: a run takes the
 * first that serves and completes. The matrix driver (matrix_bwd.c: bf16
 * FAST on a matrix engine) declines at run time, having written nothing,
 * when K or V is not finite, so the tiled backward (bwd.c), which serves
 * every problem, follows it; the workspace is the largest of those that
 * may run. */
static int tiled_bwd_serves(const fmha_plan *plan) { return 1; }

static int tiled_bwd_run(fmha_plan *run, const void *q, const void *k, const void *v, const void *o, const void *d_o,
                         const float *lse, void *dq, void *dk, void *dv, char *ws) {
    fmha_tiled_bwd_run(run, q, k, v, o, d_o, lse, dq, dk, dv, ws);
    return 1;
}

const fmha_bwd_driver fmha_bwd_driver_matrix = {"matrix", fmha_matrix_bwd_plan, fmha_matrix_bwd_workspace,
                                                fmha_matrix_bwd_run};
const fmha_bwd_driver fmha_bwd_driver_tiled = {"tiled", tiled_bwd_serves, fmha_tiled_bwd_workspace, tiled_bwd_run};

static const fmha_bwd_driver *const bwd_drivers[] = {&fmha_bwd_driver_matrix, &fmha_bwd_driver_tiled};
enum { BWD_DRIVERS = sizeof bwd_drivers / sizeof bwd_drivers[0] };

const fmha_bwd_driver *fmha_bwd_driver_of(const fmha_plan *plan) {
    for (size_t i = 0; i < BWD_DRIVERS; i++)
        if (bwd_drivers[i]->serves(plan)) return bwd_drivers[i];
    return &fmha_bwd_driver_tiled;
}

fmha_ws_size fmha_bwd_workspace(const fmha_plan *plan) {
    fmha_ws_size ws = {0, 0};
    for (size_t i = 0; i < BWD_DRIVERS; i++) {
        if (!bwd_drivers[i]->serves(plan)) continue;
        const fmha_ws_size d = bwd_drivers[i]->workspace(plan);
        if (d.thread_bytes > ws.thread_bytes) ws.thread_bytes = d.thread_bytes;
        if (d.shared_bytes > ws.shared_bytes) ws.shared_bytes = d.shared_bytes;
    }
    return ws;
}

void fmha_bwd_run(fmha_plan *run, const void *q, const void *k, const void *v, const void *o, const void *d_o,
                  const float *lse, void *dq, void *dk, void *dv, char *ws) {
    for (size_t i = 0; i < BWD_DRIVERS; i++)
        if (bwd_drivers[i]->serves(run) && bwd_drivers[i]->run(run, q, k, v, o, d_o, lse, dq, dk, dv, ws)) return;
}

void fmha_fwd_run(fmha_plan *run, const void *q, const void *k, const void *v, void *o, float *lse, char *ws) {
    run->driver->run(run, q, k, v, o, lse, ws);
}
