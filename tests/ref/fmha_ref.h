/* fmha_ref.h: the float64 reference attention, the oracle of every test and
 * of fmha-bench's rel_err. Straightforward loops, no tiling, no cleverness:
 * scores in double, exact softmax, same masks and options as fmha_problem. */
#ifndef FMHA_REF_H
#define FMHA_REF_H

#include "fmha.h"

/* Forward. q, k, v use p's strides (float32 data). Outputs are contiguous
 * double: o [B, Sq, Hq, Dv], lse [B, Hq, Sq] (lse may be NULL). A fully
 * masked row gives o = 0, lse = -inf. Returns 0, or -1 if allocation failed. */
int fmha_ref_forward(const fmha_problem *p, const float *q, const float *k, const float *v,
                     double *o, double *lse);

/* Backward of L = sum(O * dO). d_o uses p->o_strides. Outputs contiguous
 * double: dq [B, Sq, Hq, D], dk [B, Skv, Hkv, D], dv [B, Skv, Hkv, Dv]
 * (dk, dv summed over the query heads of each group). Returns 0 or -1. */
int fmha_ref_backward(const fmha_problem *p, const float *q, const float *k, const float *v,
                      const float *d_o, double *dq, double *dk, double *dv);

/* The scale the library uses for p: p->scale, or 1/sqrt(D) when it is +0.0. */
double fmha_ref_scale(const fmha_problem *p);

/* 1 if query i may see key j under p's causal option, else 0. */
int fmha_ref_visible(const fmha_problem *p, int64_t i, int64_t j);

#endif /* FMHA_REF_H */
