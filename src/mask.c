/* mask.c: which tiles and scores a query may see. Today the only mask is
 * causal (both alignments); every driver asks through these three calls, so
 * a tile the mask rules out is skipped, never computed and then masked. */
#include <math.h>

#include "attn.h"

/* Causal: key j visible from query i iff j - i <= causal_offset. */
fmha_tile_class fmha_mask_classify(const fmha_plan *plan, int64_t q0, int64_t nq, int64_t k0,
                                   int64_t nk) {
    if (plan->p.causal == FMHA_CAUSAL_NONE) return FMHA_TILE_FULL;
    int64_t off = plan->causal_offset;
    if (k0 - (q0 + nq - 1) > off) return FMHA_TILE_EMPTY; /* first key past the last query's reach */
    if ((k0 + nk - 1) - q0 <= off) return FMHA_TILE_FULL;  /* last key within the first query's reach */
    return FMHA_TILE_PARTIAL;
}

void fmha_mask_kv_range(const fmha_plan *plan, int64_t q0, int64_t nq, int64_t *k_begin,
                        int64_t *k_end) {
    int64_t end = plan->p.seq_kv;
    if (plan->p.causal != FMHA_CAUSAL_NONE) {
        int64_t reach = q0 + nq - 1 + plan->causal_offset + 1; /* one past the last visible key */
        if (reach < end) end = reach;
        if (end < 0) end = 0;
    }
    *k_begin = 0;
    *k_end = end;
}

void fmha_mask_apply(const fmha_plan *plan, int64_t q0, int64_t nq, int64_t k0, int64_t nk,
                     float *st, size_t lds) {
    if (plan->p.causal == FMHA_CAUSAL_NONE) return;
    int64_t off = plan->causal_offset;
    for (int64_t r = 0; r < nk; r++) {
        int64_t j = k0 + r;
        /* query i sees key j iff i >= j - off: lanes i < j - off - q0 are masked */
        int64_t first_visible = j - off - q0;
        int64_t stop = first_visible < nq ? first_visible : nq;
        for (int64_t i = 0; i < stop; i++) st[(size_t)r * lds + (size_t)i] = -INFINITY;
    }
}
