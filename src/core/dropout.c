/* dropout.c: dropout on the attention weights without storing a mask.
 * Score (b, h, i, j) has the counter dropout_offset + ((b Hq + h) Sq + i) Skv + j;
 * the dropout kernel hashes it with the seed (ukernel.h), so the forward and
 * the backward draw the same mask from the indices alone, on any thread,
 * tile grid or ISA. The forward scales P by Z after the softmax has summed
 * it (lse stays P's); the backward applies Z to dP and, after dS, to P
 * before dV (derivation in bwd.c). */
#include <math.h>

#include "core/attn.h"

/* The seed, mixed so that seed 0 is no weaker than any other. */
static uint64_t seed_mix(uint64_t seed) { return fmha_dropout_mix64(seed + 0x9e3779b97f4a7c15ULL); }

static uint64_t threshold_of(float p) { return (uint64_t)floor((double)p * 4294967296.0); }

void fmha_dropout_plan(fmha_plan *plan) {
    const fmha_problem *p = &plan->p;
    plan->dropout = p->dropout_p > 0.0f;
    if (!plan->dropout) return;
    plan->dropout_scale = (float)(1.0 / (1.0 - (double)p->dropout_p));
    plan->dropout_threshold = threshold_of(p->dropout_p);
    plan->dropout_seed_mix = seed_mix(p->dropout_seed);
}

static uint64_t score_counter(const fmha_problem *p, int64_t b, int64_t h, int64_t i, int64_t j) {
    return p->dropout_offset +
           (((uint64_t)b * (uint64_t)p->heads_q + (uint64_t)h) * (uint64_t)p->seq_q + (uint64_t)i) *
               (uint64_t)p->seq_kv +
           (uint64_t)j;
}

void fmha_dropout_tile(const fmha_plan *plan, const fmha_tile_pos *t, float *st, size_t lds) {
    /* counter [NR]: each query lane's counter at key k0 (padding lanes repeat the last) */
    uint64_t counter[FMHA_MAX_NR];
    size_t nr = plan->uk->tile.nr;
    for (size_t i = 0; i < nr; i++) {
        int64_t q = t->q0 + ((int64_t)i < t->nq ? (int64_t)i : t->nq - 1);
        counter[i] = score_counter(&plan->p, t->b, t->h, q, t->k0);
    }
    plan->uk->rows.dropout((size_t)t->nk, nr, st, lds, counter, plan->dropout_seed_mix,
                          plan->dropout_threshold, plan->dropout_scale);
}

int fmha_dropout_keep(const fmha_problem *p, int64_t b, int64_t h, int64_t i, int64_t j) {
    if (!p || !(p->dropout_p > 0.0f)) return 1;
    uint64_t z = fmha_dropout_mix64(score_counter(p, b, h, i, j) ^ seed_mix(p->dropout_seed));
    return (z >> 32) >= threshold_of(p->dropout_p);
}
